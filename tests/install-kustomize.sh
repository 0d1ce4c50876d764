#!/usr/bin/env bash
# Installs kustomize v5.5.0 (the version kubectl 1.32 carries), with which k8s/validate.sh
# renders the trees where kubectl's own kustomize is another version. Built from the Go module
# proxy into ~/.cache/hydrator-tests/kustomize/bin (~2 minutes on 2 cores, once).
set -euo pipefail
version=v5.5.0
dir="$HOME/.cache/hydrator-tests/kustomize/bin"
# `go install` leaves `kustomize version` saying "(devel)": the module's version is read instead.
is_pinned() {
    [[ -x "$dir/kustomize" ]] &&
        go version -m "$dir/kustomize" | grep -qP "^\tmod\tsigs.k8s.io/kustomize/kustomize/v5\t$version\t"
}
if is_pinned; then
    exit 0
fi
echo "kustomize $version not found: go install sigs.k8s.io/kustomize/kustomize/v5@$version" \
    "(~2 minutes on 2 cores)"
mkdir -p "$dir"
GOBIN="$dir" go install "sigs.k8s.io/kustomize/kustomize/v5@$version"
is_pinned || {
    echo "tests/install-kustomize.sh: $dir/kustomize is not $version" >&2
    exit 1
}
