#!/usr/bin/env bash
# Installs Garage 2.5.0, the real S3 server the tests start (tests/support/garage.rs), when no
# garage binary is found. Same lookup order as the tests: $HYDRATOR_GARAGE_BIN, `garage` on PATH,
# $HOME/.cargo/bin/garage. Quick and idempotent once installed.
set -euo pipefail

version=2.5.0

find_garage() {
    if [[ -n "${HYDRATOR_GARAGE_BIN:-}" ]]; then
        printf '%s\n' "$HYDRATOR_GARAGE_BIN"
    elif command -v garage >/dev/null 2>&1; then
        command -v garage
    elif [[ -x "$HOME/.cargo/bin/garage" ]]; then
        printf '%s\n' "$HOME/.cargo/bin/garage"
    fi
}

bin="$(find_garage)"
if [[ -n "${HYDRATOR_GARAGE_BIN:-}" && ! -x "$bin" ]]; then
    echo "HYDRATOR_GARAGE_BIN=$bin is not an executable file" >&2
    exit 1
fi
if [[ -z "$bin" ]]; then
    echo "garage not found: running cargo install garage --version $version --locked" \
        "(takes ~11 minutes on 2 cores)"
    cargo install garage --version "$version" --locked
    bin="$(find_garage)"
    if [[ -z "$bin" ]]; then
        echo "garage was installed but is not found on PATH nor in $HOME/.cargo/bin" >&2
        exit 1
    fi
fi

echo "using $bin: $("$bin" --version)"
