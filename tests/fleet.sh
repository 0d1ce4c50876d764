#!/usr/bin/env bash
# The fleet test (tests/e2e/fleet.rs): 8 simulated nodes on loopback addresses, each a real
# dfdaemon and a real hydrator daemon, Dragonfly's scheduler, and the in-process store counting
# what it serves. Installs dfdaemon first when it is missing (tests/install-dragonfly.sh: most of
# an hour on 2 cores). The scheduler is Dragonfly's own where tests/install-dragonfly-scheduler.sh
# built it (~21 minutes on 2 cores), else a stand-in, with a SKIP line saying so;
# HYDRATOR_FLEET_SCHEDULER=stand-in picks the stand-in. The last line gives the figures:
#   fleet: 8 nodes ready; store GET bytes B of D (R×); HEAD H; LIST L; scheduler S
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/install-dragonfly.sh
# A killed run leaves its dfdaemons (and scheduler) holding their ports.
pkill -f 'hydrator-fleet-[^/]*/node[0-9]/dfdaemon.yaml' || true
pkill -f 'hydrator-fleet-[^/]*/scheduler/scheduler.yaml' || true
log=$(mktemp)
trap 'rm -f "$log"' EXIT
HYDRATOR_FLEET=1 cargo test --locked --test e2e fleet -- --nocapture 2>&1 | tee "$log"
grep '^fleet: ' "$log" | tail -1
