//go:build tools

// The scheduler the fleet test runs; this file only pins it as a dependency of the module.
package dragonflyscheduler

import _ "d7y.io/dragonfly/v2/cmd/scheduler"
