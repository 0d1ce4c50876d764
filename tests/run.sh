#!/usr/bin/env bash
# The test suite: unit tests, then the end-to-end suite against the in-process S3 server and a
# real Garage (installed on first use; that takes ~11 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-garage.sh
export HYDRATOR_REQUIRE_GARAGE=1
cargo test --locked --all-targets
