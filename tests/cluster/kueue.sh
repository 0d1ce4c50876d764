# shellcheck shell=bash
# Kueue on the one-node cluster: functions only, sourced after lib.sh (a running cluster, up.sh;
# Kueue installed, tests/install-kueue.sh). Nothing runs when sourced.
#   kueue_up       imports Kueue's image, applies its Configuration and its manifests, waits
#                  until the manager is Available, its webhooks answer and its visibility API
#                  is served; prints the time it took.
#   kueue_metrics  prints the manager's Prometheus metrics (text).
#
# The Configuration (config.kueue.x-k8s.io/v1beta2) is kueue_configuration's below, or the file
# named by $KUEUE_CONFIGURATION. In v1beta2 waitForPodsReady has no `enable`: the section's
# presence enables it (an `enable:` key is an unknown field, and Kueue decodes strictly).
# The manager reads it through a subPath mount, which never updates: after a change,
# `kube -n kueue-system rollout restart deploy/kueue-controller-manager`.

kueue_configuration() {
    if [[ -n "${KUEUE_CONFIGURATION:-}" ]]; then
        cat "$KUEUE_CONFIGURATION"
        return
    fi
    cat <<'YAML'
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
metrics:
  bindAddress: :8443
webhook:
  port: 9443
leaderElection:
  leaderElect: true
  resourceName: c1f6bfd2.kueue.x-k8s.io
controller:
  groupKindConcurrency:
    Job.batch: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 50
  burst: 100
# A workload admitted whose pods are not all ready within the timeout is evicted and requeued.
waitForPodsReady:
  timeout: 120s
  blockAdmission: false
integrations:
  frameworks:
    - batch/job
YAML
}

# A Job labelled with a queue, created in a server-side dry run: Kueue's mutating webhook
# answers by suspending it.
kueue_webhooks_answer() {
    local suspended
    suspended=$(kube -n default create --dry-run=server -o jsonpath='{.spec.suspend}' -f - <<'YAML'
apiVersion: batch/v1
kind: Job
metadata:
  name: kueue-webhook-probe
  labels: {kueue.x-k8s.io/queue-name: probe}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: probe, image: probe}]
YAML
    ) && [[ "$suspended" == true ]]
}

kueue_up() {
    local start=$SECONDS
    kueue_installed || { echo "kueue: not installed (bash tests/install-kueue.sh)" >&2; return 1; }
    if ! ctr -n k8s.io images ls -q | grep -qxF "$KUEUE_IMAGE"; then
        ctr -n k8s.io images import "$KUEUE_DIR/kueue.tar" >/dev/null
    fi
    # The ConfigMaps first, as the Deployment's pod reads them when it starts.
    kube create namespace kueue-system --dry-run=client -o yaml | kube apply --server-side -f - >/dev/null
    # No kube-proxy: the manager dials the API server where the kubelet does; the kubernetes
    # Service's 10.96.0.1 is not routed to it (it leaves by the default route).
    kube -n kueue-system create configmap kueue-api-server --from-literal=host="$(host_ip)" \
        --from-literal=port="$API_PORT" --dry-run=client -o yaml \
        | kube apply --server-side --force-conflicts -f - >/dev/null
    kueue_configuration | kube -n kueue-system create configmap kueue-manager-config \
        --from-file=controller_manager_config.yaml=/dev/stdin --dry-run=client -o yaml \
        | kube apply --server-side --force-conflicts -f - >/dev/null
    # Server-side: the CRDs are too big for a client-side apply's last-applied annotation.
    kube apply --server-side --force-conflicts -f "$KUEUE_DIR/manifests.yaml" >/dev/null
    kube -n kueue-system wait --for=condition=Available deploy/kueue-controller-manager --timeout=300s >/dev/null \
        || { echo "kueue: the controller manager is not Available" >&2; return 1; }
    wait_for "Kueue's webhooks" 120 kueue_webhooks_answer || return 1
    local version
    for version in v1beta1 v1beta2; do
        kube wait --for=condition=Available "apiservice/$version.visibility.kueue.x-k8s.io" --timeout=120s >/dev/null \
            || { echo "kueue: the visibility API $version is not served" >&2; return 1; }
    done
    echo "kueue: up in $((SECONDS - start)) s ($KUEUE_IMAGE)"
}

# The metrics endpoint (:8443 on the manager's pod, TLS with a self-signed certificate) asks the
# API server to review the bearer token and authorize GET /metrics: the admin's static token
# passes both. The pod's IP is reached on the CNI bridge (no kube-proxy, no cluster DNS).
kueue_metrics() {
    local ip token
    ip=$(kube -n kueue-system get pods -l control-plane=controller-manager \
        --field-selector=status.phase=Running -o jsonpath='{.items[0].status.podIP}') || return 1
    [[ -n "$ip" ]] || { echo "kueue: no running controller manager" >&2; return 1; }
    token=$(kube config view --raw -o jsonpath='{.users[0].user.token}')
    curl -sSfk --header @<(printf 'Authorization: Bearer %s\n' "$token") "https://$ip:8443/metrics"
}
