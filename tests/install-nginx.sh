#!/usr/bin/env bash
# Installs nginx from Debian when missing: the TLS terminator the HTTPS tests put in front of
# the test servers, as on-prem MinIO and Ceph RGW are served. Needs root, as CI runs.
set -euo pipefail
if command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q nginx-light
