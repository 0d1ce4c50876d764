#!/usr/bin/env bash
# Installs Podman, runc (crun fails on this cgroup setup) and the CA bundle the image ships,
# from Debian when missing, for the container test. Needs root, as CI and the development
# machines run.
set -euo pipefail
if command -v podman >/dev/null && command -v runc >/dev/null && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q podman runc ca-certificates
