#!/usr/bin/env bash
# The long soak of the node daemon and the CSI plugin: the same test that runs for two minutes
# in every CI run (tests/e2e/soak.rs), for the given seconds of chaos (default 1800: half an
# hour).
#
# 200 simulated pods publish, read, hold and unpublish volumes through the real `hydrator csi`
# beside the real `hydrator daemon`, while the store's objects change, the store has outages
# and the daemon and the plugin are killed with SIGKILL and restarted. Every invariant (a
# mounted snapshot never changes or goes under its reader, leases match the mounts, nothing
# comes back after an unpublish, the state file survives every crash, no call outlasts the
# kubelet's two minutes, fds and memory do not grow) is checked all along; the report at the
# end gives the figures.
#
# Runs as root (real bind mounts). HYDRATOR_SOAK_SEED=N picks another course of events.
#
# Usage: tests/soak/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
HYDRATOR_SOAK_SECONDS=${1:-1800} cargo test --locked --test e2e soak -- --nocapture
