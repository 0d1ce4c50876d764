#!/usr/bin/env bash
# Builds Dragonfly's scheduler from the Go module proxy into
# $HOME/.cache/hydrator-tests/dragonfly/bin, when it is not there yet. The fleet test
# (tests/e2e/fleet.rs, through tests/fleet.sh) runs it standalone (no manager: a local dynconfig
# file; no Redis) where it is installed, or $HYDRATOR_DRAGONFLY_SCHEDULER_BIN, and a stand-in
# otherwise.
#
# Versions: dfdaemon 1.5.10 (tests/install-dragonfly.sh) pins the crate dragonfly-api =2.3.8,
# the Rust side of d7y.io/api/v2 v2.3.8. No release of d7y.io/dragonfly/v2 that the proxy serves
# requires d7y.io/api/v2 v2.3.x: the newest, v2.5.1, requires v2.2.32 (main moved to v2.3.0 after
# it, untagged, and the proxy here refuses pseudo-versions of it). The wrapper module
# tests/dragonfly-scheduler builds v2.5.1's cmd/scheduler with d7y.io/api/v2 raised to v2.3.8,
# the protocol dfdaemon 1.5.10 speaks. 1240 s on 2 cores, cold (measured while other builds ran).
set -euo pipefail

build="v2.5.1+api-v2.3.8"
bin="$HOME/.cache/hydrator-tests/dragonfly/bin/scheduler"

if [[ "$(cat "$bin.version" 2>/dev/null)" != "$build" || ! -x "$bin" ]]; then
    command -v go >/dev/null || { echo "go is not installed: the scheduler is built with it" >&2; exit 1; }
    echo "building Dragonfly's scheduler $build from the Go module proxy (about 20 minutes, once)"
    began=$SECONDS
    mkdir -p "$(dirname "$bin")"
    (cd "$(dirname "$0")/dragonfly-scheduler" &&
        go build -trimpath -ldflags "-s -w" -o "$bin" d7y.io/dragonfly/v2/cmd/scheduler)
    echo "$build" >"$bin.version"
    echo "scheduler built in $((SECONDS - began)) s"
fi
echo "using $bin ($build)"
