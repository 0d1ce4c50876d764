# Shared by tests/cluster/*.sh: versions, where the built programs are cached, where a running
# cluster keeps its state, and kubectl bound to it. Sourced, never run.

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
CACHE="${HYDRATOR_TESTS_CACHE:-$HOME/.cache/hydrator-tests}"
BIN="$CACHE/k8s-$K8S_VERSION/bin"
IMAGES="$CACHE/cluster-images"
# A running cluster's certificates, tokens, logs and pids; removed by down.sh.
STATE="${HYDRATOR_CLUSTER_STATE:-/var/tmp/hydrator-cluster}"
NODE=hydrator-node
# Ports of their own, so a cluster can run beside the suite's servers.
ETCD_PORT=12379
API_PORT=16443
# The pods' bridge (cni0) and its gateway: pods reach the host's MinIO there.
POD_CIDR=10.88.0.0/16
HOST_ON_BRIDGE=10.88.0.1
MINIO_PORT=19000
# The images the tests import into containerd (nothing can be pulled).
PAUSE_IMAGE=localhost/pause:3.10
TRAINER_IMAGE=localhost/trainer:busybox
HYDRATOR_IMAGE=localhost/hydrator:cluster
# Kueue, built from source by tests/install-kueue.sh; tests/cluster/kueue.sh starts it.
KUEUE_VERSION=v0.17.0
KUEUE_DIR="$CACHE/kueue-$KUEUE_VERSION"
KUEUE_IMAGE=localhost/kueue:$KUEUE_VERSION

kube() { "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

installed() { [[ -x "$BIN/kubelet" && -x "$BIN/etcd" && -x "$BIN/kubectl" && -x "$BIN/kube-apiserver" ]] \
    && command -v containerd >/dev/null && [[ -f "$IMAGES/pause.tar" && -f "$IMAGES/trainer.tar" ]]; }

kueue_installed() { [[ -x "$KUEUE_DIR/bin/kueue" && -f "$KUEUE_DIR/kueue.tar" && -f "$KUEUE_DIR/manifests.yaml" ]]; }

# The host's own address (what the kubelet registers as the node's InternalIP).
host_ip() { ip -4 -o route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p'; }

wait_for() { # what seconds command...
    local what=$1 limit=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "cluster: $what not within ${limit} s" >&2
            return 1
        fi
        sleep 1
    done
}
