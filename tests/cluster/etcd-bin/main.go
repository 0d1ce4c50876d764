// etcd v3.6 for the one-node cluster, built from the Go module proxy: go.etcd.io/etcd/server/v3
// replaces its sibling modules with local directories, so it cannot be `go install`ed; this main is
// the one etcd ships (server/main.go).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
