#!/usr/bin/env bash
# Installs Dragonfly's peer daemon `dfdaemon` and `dfget` (the crate dragonfly-client from
# crates.io) for the fleet test (tests/fleet.sh), when they are missing. The build needs Debian's
# protobuf-compiler and libclang-dev and takes most of an hour on 2 cores, so it runs at the
# lowest CPU priority; the fleet test prints a SKIP line until it is done.
set -euo pipefail

version=1.5.10
bin="${CARGO_HOME:-$HOME/.cargo}/bin"

if [[ -x "$bin/dfdaemon" && -x "$bin/dfget" ]]; then
    echo "dfdaemon: $("$bin/dfdaemon" --version 2>/dev/null | head -1)"
    exit 0
fi
if ! command -v protoc >/dev/null || ! dpkg -s libclang-dev >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler libclang-dev >/dev/null
fi
echo "installing dragonfly-client $version (dfdaemon, dfget): most of an hour on 2 cores"
nice -n 19 cargo install dragonfly-client --version "$version" --locked --bin dfdaemon --bin dfget
