#!/usr/bin/env bash
# Builds MinIO (the customer's store) and its client `mc` from the Go module proxy into
# $HOME/.cache/hydrator-tests/minio/bin, when they are not there yet. The tests
# (tests/e2e/support/minio.rs) and benches/compare.py look there, or at $HYDRATOR_MINIO_BIN and
# $HYDRATOR_MC_BIN. Both are AGPLv3: external test programs only, never linked into hydrator.
#
# Versions: the proxy here refuses MinIO's RELEASE.* tags and bare commit hashes (403), so the
# pins are the pseudo-versions `@latest` resolved to: minio at its last community commit
# (2026-02-12, "no longer maintained"), mc at 2025-03-13. About 4 minutes on 2 cores, cold.
set -euo pipefail

minio_version=v0.0.0-20260212201848-7aac2a2c5b7c
mc_version=v0.0.0-20250313080218-cf909e1063a9
dir="$HOME/.cache/hydrator-tests/minio/bin"

build() { # name module version
    local name=$1 module=$2 version=$3
    if [[ -x "$dir/$name" && "$(cat "$dir/$name.version" 2>/dev/null)" == "$version" ]]; then
        return
    fi
    echo "building $name $version from the Go module proxy (minutes, once)"
    local start=$SECONDS
    GOBIN="$dir" GOFLAGS=-mod=mod go install "$module@$version"
    printf '%s\n' "$version" >"$dir/$name.version"
    echo "$name built in $((SECONDS - start)) s"
}

command -v go >/dev/null || { echo "go is not installed: MinIO and mc are built with it" >&2; exit 1; }
mkdir -p "$dir"
build minio github.com/minio/minio "$minio_version"
build mc github.com/minio/mc "$mc_version"
echo "using $dir/minio ($minio_version) and $dir/mc ($mc_version)"
