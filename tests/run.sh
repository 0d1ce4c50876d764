#!/usr/bin/env bash
# The test suite: unit tests, then the end-to-end suite against the in-process S3 server, a
# real Garage (installed on first use; that takes ~11 minutes on 2 cores) and moto's server with
# a versioned bucket (installed into a virtualenv on first use, ~40 s), HTTPS through nginx and
# the container image under Podman (both installed from Debian when missing), and the
# Kubernetes manifests rendered and validated against the Kubernetes schemas, then applied to a
# one-node Kubernetes where one is installed; then the fleet test where dfdaemon is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-garage.sh
bash tests/install-podman.sh
bash tests/install-moto.sh
bash tests/install-nginx.sh
bash tests/install-minio.sh # MinIO and mc from the Go module proxy: ~4 minutes, once
bash tests/install-csi-sanity.sh # the CSI plugin under csi-sanity: built on first use, ~1 minute
export HYDRATOR_REQUIRE_GARAGE=1 HYDRATOR_REQUIRE_PODMAN=1 HYDRATOR_REQUIRE_MOTO=1 HYDRATOR_REQUIRE_NGINX=1
export HYDRATOR_REQUIRE_MINIO=1 HYDRATOR_REQUIRE_CSI_SANITY=1
cargo test --locked --all-targets
bash k8s/validate.sh
# The one-node Kubernetes built from source (tests/cluster/): runs where it is installed
# (bash tests/cluster/install.sh, ~25 min once), and prints a SKIP line elsewhere.
bash tests/cluster/test.sh
# The fleet test (8 real dfdaemons, ~2 minutes) runs where dfdaemon is installed; installing it
# takes most of an hour, so the suite does not: bash tests/install-dragonfly.sh does.
if [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/dfdaemon" ]; then
    bash tests/fleet.sh
else
    echo "SKIP fleet: dfdaemon is not installed (bash tests/install-dragonfly.sh, most of an hour)"
fi
