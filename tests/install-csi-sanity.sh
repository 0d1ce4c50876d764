#!/usr/bin/env bash
# Builds csi-sanity, the CSI conformance suite of kubernetes-csi/csi-test, from the Go module
# proxy into $HOME/.cache/hydrator-tests/csi-sanity/bin, when it is not there yet. The e2e test
# csi::csi_sanity (tests/e2e/csi.rs) looks there, or at $HYDRATOR_CSI_SANITY_BIN, and prints a
# SKIP line when it is missing. The module has no replace directives, so `go install` builds it.
# 56 s on 2 cores, cold (measured while another build ran).
set -euo pipefail

version=v5.6.0
dir="$HOME/.cache/hydrator-tests/csi-sanity/bin"

if [[ -x "$dir/csi-sanity" && "$(cat "$dir/csi-sanity.version" 2>/dev/null)" == "$version" ]]; then
    echo "using $dir/csi-sanity ($version)"
    exit 0
fi
command -v go >/dev/null || { echo "go is not installed: csi-sanity is built with it" >&2; exit 1; }
mkdir -p "$dir"
echo "building csi-sanity $version from the Go module proxy (a minute or two, once)"
start=$SECONDS
GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$version"
printf '%s\n' "$version" >"$dir/csi-sanity.version"
echo "csi-sanity built in $((SECONDS - start)) s; using $dir/csi-sanity ($version)"
