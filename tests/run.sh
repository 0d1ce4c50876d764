#!/usr/bin/env bash
# The test suite: unit tests, then the end-to-end suite against the in-process S3 server, a
# real Garage (installed on first use; that takes ~11 minutes on 2 cores) and moto's server with
# a versioned bucket (installed into a virtualenv on first use, ~40 s), the container image
# under Podman (installed from Debian when missing), and the Kubernetes manifests rendered and
# validated against the Kubernetes schemas.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-garage.sh
bash tests/install-podman.sh
bash tests/install-moto.sh
export HYDRATOR_REQUIRE_GARAGE=1 HYDRATOR_REQUIRE_PODMAN=1 HYDRATOR_REQUIRE_MOTO=1
echo "SKIP fleet: tests/e2e/fleet.rs runs only through bash tests/fleet.sh" \
    "(8 real dfdaemons; it installs dfdaemon first, most of an hour)"
cargo test --locked --all-targets
bash k8s/validate.sh
