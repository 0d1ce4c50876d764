#!/usr/bin/env bash
# Installs moto's S3 server (PyPI `moto[server]`), the second real S3 implementation the tests
# start (tests/e2e/support/moto.rs) and the one with versioned buckets, when no Python with moto
# is found. Same lookup order as the tests: $HYDRATOR_MOTO_PYTHON, the virtualenv below, python3.
# Installs into its own virtualenv, never into the system's Python. Quick once installed.
set -euo pipefail

version=5.2.1
venv="$HOME/.cache/hydrator-tests/moto"

has_moto() { "$1" -c 'import moto.server' >/dev/null 2>&1; }

if [[ -n "${HYDRATOR_MOTO_PYTHON:-}" ]]; then
    has_moto "$HYDRATOR_MOTO_PYTHON" || {
        echo "HYDRATOR_MOTO_PYTHON=$HYDRATOR_MOTO_PYTHON cannot import moto.server" >&2
        exit 1
    }
    python="$HYDRATOR_MOTO_PYTHON"
elif has_moto "$venv/bin/python"; then
    python="$venv/bin/python"
elif has_moto python3; then
    python="$(command -v python3)"
else
    echo "moto not found: installing moto[server]==$version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$version"
    python="$venv/bin/python"
fi
echo "using $python: moto $("$python" -c 'import moto; print(moto.__version__)')"
