#!/usr/bin/env bash
# Stops the one-node cluster up.sh started: removes its pods' containers, stops every process
# it launched, unmounts what the kubelet left under /var/lib/kubelet, removes its state and
# the node cache's directories.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
[[ -f "$STATE/pids" ]] || { echo "cluster: not up"; exit 0; }
# The pods first, while the kubelet and the runtime can still tear them down.
kube delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1
tac "$STATE/pids" | while read -r name pid; do
    kill "$pid" 2>/dev/null && for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null
done
# The shims outlive containerd; their containers with them.
pkill -9 -f containerd-shim-runc-v2 2>/dev/null
# The kubelet bind-mounts its own directory onto itself (shared, for mount propagation).
grep -o ' /var/lib/kubelet[^ ]*' /proc/mounts | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null
done
grep -o ' /run/containerd/[^ ]*' /proc/mounts | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null
done
ip link delete cni0 2>/dev/null
rm -rf "$STATE" /var/lib/kubelet /var/lib/cni/networks/hydrator-pods /etc/cni/net.d/10-hydrator-bridge.conflist
rm -rf /var/lib/containerd /run/containerd
# The node cache's hostPaths (k8s/node-cache/daemonset.yaml): a next cluster starts cold.
rm -rf /var/cache/hydrator /run/hydrator /var/lib/hydrator-csi
echo "cluster: down"
