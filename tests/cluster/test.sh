#!/usr/bin/env bash
# The tests on a one-node Kubernetes built from source (install.sh, up.sh), against MinIO:
#  1. `kubectl apply -k` of the node cache (tests/cluster/overlays/node-cache: k8s/ with the
#     image built from this tree and a catalog naming the host's MinIO): the DaemonSet's pod
#     runs the daemon and the CSI plugin, and the plugin registers with the kubelet;
#  2. a pod with an inline csi volume (`start: ready`) reads its dataset byte for byte; deleting
#     it unpublishes the volume and releases the lease;
#  3. a pod on a lazy volume starts before the dataset is READY and reads it whole;
#  4. while a pod reads a ready volume and another a lazy one (still hydrating): a kill -9 of
#     the CSI plugin, a rollout of the DaemonSet (new image) and a catalog edit (which rolls
#     nothing: the ConfigMap keeps its name, the same pod reloads the catalog); both pods read
#     on with no failed read, the lazy one its dataset byte for byte (the keeper holds its view);
#  5. volume health: a lazy view ended on purpose (the keeper and the plugin killed together)
#     shows in the pod's events;
#  6. every example under k8s/examples/ runs to completion (tests/cluster/overlays/EXAMPLE),
#     its trainer's hashes equal to MinIO's, init-container and csi-job in namespaces that
#     enforce the Restricted Pod Security level; csi-job again with `start: lazy` on a dataset
#     still hydrating, its trainer starting on .hydrator/LAZY;
#  7. where Kueue is installed (tests/install-kueue.sh), its admission check served by
#     `hydrator admission` (kueue-test.sh).
# It builds hydrator's image (container/build.sh), brings the cluster up and down (unless
# HYDRATOR_CLUSTER_KEEP=1, which leaves it up), and prints the figures: the cluster's start
# time, and the time from `kubectl apply` to a pod reading its dataset.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
source "$here/lib.sh"
source "$here/kueue-test.sh"
minio_bin="$CACHE/minio/bin"

if ! installed; then
    echo "SKIP cluster: not installed (bash tests/cluster/install.sh, ~25 min)"
    echo "SKIP kueue: the cluster is not installed (then bash tests/install-kueue.sh, 5 min)"
    exit 0
fi
if [[ ! -x "$minio_bin/minio" || ! -x "$minio_bin/mc" ]]; then
    echo "SKIP cluster: MinIO not installed (bash tests/install-minio.sh, ~4 min)"
    exit 0
fi

work=$(mktemp -d)
minio_pid=
finish() {
    local code=$?
    if ((code != 0)); then
        echo "--- cluster test failed; the node cache's pods and events:" >&2
        kube get pods -A -o wide >&2 2>/dev/null || true
        kube get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -30 >&2 || true
        for log in kubelet containerd; do
            echo "--- last lines of $log.log" >&2
            tail -15 "$STATE/logs/$log.log" >&2 2>/dev/null || true
        done
    fi
    [[ -n "$minio_pid" ]] && kill "$minio_pid" 2>/dev/null
    if [[ "${HYDRATOR_CLUSTER_KEEP:-}" != 1 ]]; then
        bash "$here/down.sh" >/dev/null
    fi
    rm -rf "$work"
    exit "$code"
}
trap finish EXIT
fail() { echo "cluster test FAILED: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
# What the waits below ask, again and again.
registered() {
    kube get csinode "$NODE" -o jsonpath='{.spec.drivers[*].name}' | grep -qw cache.hydrator.dev
}
logs() { kube -n "${2:-cluster-tests}" logs "$1" -c trainer 2>/dev/null || true; }
logged() { logs "$1" | grep -q "$2"; } # POD PATTERN
daemon_pod() { kube -n hydrator-system get pods -l app.kubernetes.io/name=hydrator -o jsonpath='{.items[*].metadata.uid}'; }
reloaded() { kube -n hydrator-system logs ds/hydrator -c daemon 2>/dev/null | grep -q 'catalog reloaded'; }
leases() { curl -sf --unix-socket /run/hydrator/hydrator.sock http://daemon/v1/leases; }
lease_gone() { local held; held=$(leases) && ! grep -q "$1" <<<"$held"; } # a daemon that answers
abnormal() { # POD: the message of its VolumeConditionAbnormal event, if any
    kube -n cluster-tests get events --field-selector "involvedObject.name=$1,reason=VolumeConditionAbnormal" \
        -o jsonpath='{.items[*].message}' 2>/dev/null
}
reported_abnormal() { [[ -n "$(abnormal "$1")" ]]; }

# The image built from this tree, saved for containerd.
step=$SECONDS
bash "$repo/container/build.sh" "$HYDRATOR_IMAGE" >/dev/null
podman --storage-driver vfs save --quiet --format docker-archive -o "$work/hydrator.tar" "$HYDRATOR_IMAGE"
echo "image: built and saved in $((SECONDS - step)) s"

if [[ -f "$STATE/pids" ]]; then
    echo "cluster: already up, using it"
else
    bash "$here/up.sh"
fi
ctr -n k8s.io images import "$work/hydrator.tar" >/dev/null

# MinIO on the host, where pods reach it through the bridge's gateway; three datasets:
# `imagenet` (many small files and one multipart object), and three lazy ones hydrated slowly
# by the test catalog (4 MiB/s): `coco` (96 MiB), `places` (384 MiB) and `sun` (128 MiB).
mkdir -p "$work/minio" "$work/seed/imagenet" "$work/seed/coco" "$work/seed/places" "$work/seed/sun" \
    "$work/seed/openimages"
export MINIO_ROOT_USER=hydrator-cluster MINIO_ROOT_PASSWORD=cluster-secret-key-0001
setsid "$minio_bin/minio" server "$work/minio" --address "0.0.0.0:$MINIO_PORT" \
    --console-address 127.0.0.1:$((MINIO_PORT + 1)) >"$work/minio.log" 2>&1 &
minio_pid=$!
export MC_CONFIG_DIR="$work/mc"
wait_for MinIO 60 "$minio_bin/mc" alias set store "http://127.0.0.1:$MINIO_PORT" \
    "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
for i in $(seq -w 1 40); do
    head -c $((RANDOM * 8 + 10#$i)) /dev/urandom >"$work/seed/imagenet/n$i.jpeg"
done
mkdir -p "$work/seed/imagenet/val"
head -c $((24 << 20)) /dev/urandom >"$work/seed/imagenet/val/shard-0000.tar"
for i in $(seq 0 5); do
    head -c $((16 << 20)) /dev/urandom >"$work/seed/coco/shard-$i.tar"
done
for i in $(seq -w 0 23); do
    head -c $((16 << 20)) /dev/urandom >"$work/seed/places/shard-$i.tar"
done
for i in $(seq 0 7); do
    head -c $((16 << 20)) /dev/urandom >"$work/seed/sun/shard-$i.tar"
done
for i in $(seq 0 5); do
    head -c $((16 << 20)) /dev/urandom >"$work/seed/openimages/shard-$i.tar"
done
"$minio_bin/mc" mb --quiet store/datasets >/dev/null
"$minio_bin/mc" cp --quiet --recursive "$work/seed/imagenet/" store/datasets/imagenet/train/ >/dev/null
"$minio_bin/mc" cp --quiet --recursive "$work/seed/coco/" store/datasets/coco-2017/ >/dev/null
"$minio_bin/mc" cp --quiet --recursive "$work/seed/places/" store/datasets/places365/ >/dev/null
"$minio_bin/mc" cp --quiet --recursive "$work/seed/sun/" store/datasets/sun397/ >/dev/null
"$minio_bin/mc" cp --quiet --recursive "$work/seed/openimages/" store/datasets/openimages/ >/dev/null
(cd "$work/seed/imagenet" && find . -type f | sort | xargs sha256sum) >"$work/imagenet.sha"
(cd "$work/seed/coco" && find . -type f | sort | xargs sha256sum) >"$work/coco.sha"
(cd "$work/seed/places" && find . -type f | sort | xargs sha256sum) >"$work/places.sha"
(cd "$work/seed/openimages" && find . -type f | sort | xargs sha256sum) >"$work/openimages.sha"

# 1. The node cache, applied as a platform team would.
kube apply -f "$repo/k8s/node-cache/namespace.yaml" >/dev/null
kube -n hydrator-system create secret generic hydrator-s3-credentials \
    --from-literal=access-key="$MINIO_ROOT_USER" --from-literal=secret-key="$MINIO_ROOT_PASSWORD" >/dev/null
kube -n hydrator-system create secret generic hydrator-api-token \
    --from-literal=token="$(head -c 24 /dev/urandom | base64)" \
    --from-literal=csi="$(head -c 24 /dev/urandom | base64)" \
    --from-literal=admission="$(head -c 24 /dev/urandom | base64)" >/dev/null
applied_at=$SECONDS
kube apply -k "$here/overlays/node-cache" >/dev/null
kube -n hydrator-system rollout status ds/hydrator --timeout=180s >/dev/null \
    || fail "the DaemonSet's pod did not become ready"
ok "kubectl apply -k: the DaemonSet's pod runs the daemon and the CSI plugin, ready in $((SECONDS - applied_at)) s"
wait_for "the CSI driver's registration with the kubelet" 60 \
    registered || fail "the kubelet did not register cache.hydrator.dev"
ok "the plugin registered with the kubelet: CSINode $NODE lists cache.hydrator.dev"

# Pods of the tests: a namespace enforcing Restricted, a trainer that hashes its dataset and
# then reads it again every second, saying whether each pass succeeded.
kube create namespace cluster-tests >/dev/null
kube label namespace cluster-tests pod-security.kubernetes.io/enforce=restricted >/dev/null
pod() { # name dataset [start]
    local attributes="dataset: $2"
    [[ -n "${3:-}" ]] && attributes="$attributes, start: $3"
    kube -n cluster-tests apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeSelector: {hydrator.dev/cache: "true"}
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  terminationGracePeriodSeconds: 1
  containers:
    - name: trainer
      image: $TRAINER_IMAGE
      command: ["sh", "-c"]
      args:
        - |
          if test -f /data/.hydrator/READY; then echo "start: READY"; else echo "start: not READY"; fi
          cd /data && find . -type f ! -path './.hydrator/*' | sort | xargs sha256sum
          echo "hashed"
          while sleep 1; do
            if files=\$(find . -type f ! -path './.hydrator/*' 2>&1) && test -n "\$files" \\
                && err=\$(cat \$files 2>&1 >/dev/null); then
              echo "read: ok"
            else
              echo "read: failed: \$(echo \$files \$err | head -c 200)"
            fi
          done
      resources: {requests: {cpu: 50m, memory: 32Mi}}
      securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: ["ALL"]}}
      volumeMounts: [{name: data, mountPath: /data, readOnly: true, mountPropagation: HostToContainer}]
  volumes:
    - name: data
      csi: {driver: cache.hydrator.dev, readOnly: true, volumeAttributes: {$attributes}}
YAML
}
hashes() { logs "$1" "${2:-cluster-tests}" | grep -E '^[0-9a-f]{64}  \./' || true; }

# 2. A ready volume.
started=$SECONDS
pod ready-reader imagenet
wait_for "ready-reader's hashes" 240 logged ready-reader '^hashed' || fail "ready-reader never hashed its dataset"
apply_to_reading=$((SECONDS - started))
diff <(hashes ready-reader) "$work/imagenet.sha" >/dev/null \
    || fail "ready-reader's dataset differs from MinIO's: $(diff <(hashes ready-reader) "$work/imagenet.sha" | head -5)"
logs ready-reader | grep -qx "start: READY" || fail "a ready volume started without READY"
ok "a start: ready csi volume: the pod read imagenet from MinIO byte for byte, $apply_to_reading s after its apply"
reader_uid=$(kube -n cluster-tests get pod ready-reader -o jsonpath='{.metadata.uid}')
leases | grep -q "$reader_uid" || fail "no lease held for ready-reader ($reader_uid): $(leases)"

# 3. A lazy volume: the pod starts while coco hydrates.
pod lazy-reader coco lazy
wait_for "lazy-reader's start" 120 logged lazy-reader '^start:' || fail "lazy-reader did not start"
logs lazy-reader | grep -qx "start: not READY" \
    || fail "the lazy pod started only once the dataset was READY: $(logs lazy-reader | head -3)"
wait_for "lazy-reader's hashes" 240 logged lazy-reader '^hashed' || fail "lazy-reader never hashed its dataset"
diff <(hashes lazy-reader) "$work/coco.sha" >/dev/null || fail "lazy-reader's dataset differs from MinIO's"
ok "a start: lazy csi volume: the pod started before READY and read coco byte for byte"

# 2b. Deleting the ready pod unpublishes its volume and releases its lease.
kube -n cluster-tests delete pod ready-reader --wait=true --timeout=120s >/dev/null
wait_for "ready-reader's lease released" 60 lease_gone "$reader_uid" || fail "the lease outlived its pod: $(leases)"
grep -q "/var/lib/kubelet/pods/$reader_uid/" /proc/mounts && fail "ready-reader's volume is still mounted"
ok "deleting the pod unpublished its volume and released its lease"

# 4. Disruptions while pods read: a ready volume (a bind mount) and a lazy one (places, still
# hydrating, its view served by the plugin and held by the keeper). Each pod must read on with
# no failed read: the lazy pod hashes places as it arrives, through all three.
pod ready-reader imagenet
pod rollout-reader places lazy
for reader in ready-reader rollout-reader; do
    wait_for "$reader's first read" 120 logged "$reader" '^start:' || fail "$reader did not start"
done
logs rollout-reader | grep -qx "start: not READY" || fail "places was READY before the disruptions"
failed_reads() { # POD FROM-LINE: failed passes and failed hashes since that line
    logs "$1" | tail -n +$(($2 + 1)) | grep -c -e '^read: failed' -e '^sha256sum:' || true
}
disrupt() { # what command...
    local what=$1 before_ready before_lazy
    shift
    before_ready=$(logs ready-reader | wc -l)
    before_lazy=$(logs rollout-reader | wc -l)
    "$@"
    kube -n hydrator-system rollout status ds/hydrator --timeout=180s >/dev/null || fail "$what: the DaemonSet did not come back"
    sleep 10
    local ready_failed lazy_failed
    ready_failed=$(failed_reads ready-reader "$before_ready")
    lazy_failed=$(failed_reads rollout-reader "$before_lazy")
    echo "$what: pod on a ready volume: $ready_failed failed reads; pod on a lazy volume: $lazy_failed failed reads"
    ((ready_failed == 0)) || fail "$what: a pod on a ready volume failed to read: $(logs ready-reader | grep failed | tail -1)"
    ((lazy_failed == 0)) || fail "$what: a pod on a lazy volume failed to read: $(logs rollout-reader | grep -e failed -e sha256sum: | tail -1)"
}
# The processes of the node's containers, as the host sees them.
plugin_pid() { pgrep -f -- ' csi --endpoint=' | head -1; }
keeper_pid() { pgrep -f -- 'csi-keeper --socket' | head -1; }
served_again() { kube -n hydrator-system logs ds/hydrator -c csi 2>/dev/null | grep -q 'serving again the lazy view'; }
plugin_replaced() { local now; now=$(plugin_pid) && [[ -n "$now" && "$now" != "$1" ]]; }
kill_plugin() {
    local pid
    pid=$(plugin_pid) || fail "no CSI plugin process on the host"
    kill -9 "$pid"
    wait_for "the plugin's restart by the kubelet" 120 plugin_replaced "$pid" || fail "the kubelet did not restart the plugin"
    wait_for "the restarted plugin serving the view again" 60 served_again \
        || fail "the restarted plugin did not serve the lazy view again: $(kube -n hydrator-system logs ds/hydrator -c csi | tail -3)"
}
disrupt "kill -9 of the CSI plugin" kill_plugin
new_image() {
    ctr -n k8s.io images tag "$HYDRATOR_IMAGE" "${HYDRATOR_IMAGE}-2" >/dev/null
    kube -n hydrator-system set image ds/hydrator "daemon=${HYDRATOR_IMAGE}-2" "csi=${HYDRATOR_IMAGE}-2" >/dev/null
    kube -n hydrator-system rollout status ds/hydrator --timeout=180s >/dev/null || fail "the rollout did not finish"
    wait_for "the new plugin serving the view again" 60 served_again || fail "the new plugin did not serve the lazy view again"
}
disrupt "rollout (new image)" new_image
# The catalog edit as a platform team makes it: the file changes, `kubectl apply -k` again.
# A copy keeps the overlay's relative path to k8s/ (kustomize takes no absolute one). The
# ConfigMap keeps its name, so the DaemonSet is unchanged: the same pod goes on, and its daemon
# reloads the file once the kubelet has refreshed it (a minute or so).
edited="$work/edited/tests/cluster/overlays/node-cache"
mkdir -p "$(dirname "$edited")"
cp -r "$repo/k8s" "$work/edited/k8s"
cp -r "$here/overlays/node-cache" "$edited"
sed -i 's/newTag: cluster$/newTag: cluster-2/' "$edited/kustomization.yaml"
sed -i 's/^default_lease_ttl_seconds = 3600/default_lease_ttl_seconds = 1800/' "$edited/catalog.toml"
pod_before=$(daemon_pod)
edit_catalog() {
    kube apply -k "$edited" >/dev/null
    wait_for "the daemon's reload of the edited catalog" 180 reloaded \
        || fail "the daemon did not reload the edited catalog"
}
disrupt "catalog edit" edit_catalog
[[ $(daemon_pod) == "$pod_before" ]] || fail "the catalog edit replaced the DaemonSet's pod"
ok "catalog edit: no rollout, the same pod reloaded the catalog"
wait_for "rollout-reader's hashes" 300 logged rollout-reader '^hashed' || fail "rollout-reader never hashed places"
diff <(hashes rollout-reader) "$work/places.sha" >/dev/null \
    || fail "the lazy pod's places differs from MinIO's: $(diff <(hashes rollout-reader) "$work/places.sha" | head -3)"
ok "a lazy volume through a kill -9 of the plugin, a rollout and a catalog edit: no failed read, places byte for byte"

# 5. Volume health: a lazy view that ends (the keeper and the plugin killed together) is
# reported abnormal in the pod's events (the kubelet's CSIVolumeHealth, from NodeGetVolumeStats).
pod ended-reader sun lazy
wait_for "ended-reader's start" 120 logged ended-reader '^start:' || fail "ended-reader did not start"
logs ended-reader | grep -qx "start: not READY" || fail "sun was READY before ended-reader started"
kill -9 "$(keeper_pid)" "$(plugin_pid)"
wait_for "a VolumeConditionAbnormal event on ended-reader" 180 reported_abnormal ended-reader \
    || fail "the lazy volume whose view ended shows no VolumeConditionAbnormal event"
ok "volume health: the pod's events say: $(abnormal ended-reader)"
kube delete namespace cluster-tests --wait=true --timeout=120s >/dev/null

# 6. The examples, each as shipped (overlays/EXAMPLE says what the test changes).
example() { # name namespace job pod-security-level [dataset]
    local name=$1 namespace=$2 job=$3 level=$4 dataset=${5:-imagenet} started=$SECONDS
    kube apply -f "$repo/k8s/examples/${name%-lazy}/namespace.yaml" >/dev/null
    if [[ $name == init-container ]]; then
        kube -n "$namespace" create secret generic hydrator-s3-credentials \
            --from-literal=access-key="$MINIO_ROOT_USER" --from-literal=secret-key="$MINIO_ROOT_PASSWORD" >/dev/null
    fi
    kube apply -k "$here/overlays/$name" >/dev/null
    kube -n "$namespace" wait --for=condition=complete "job/$job" --timeout=300s >/dev/null \
        || fail "example $name: job $job did not complete: $(kube -n "$namespace" describe job "$job" | tail -5)"
    local pod_name
    pod_name=$(kube -n "$namespace" get pods -l "job-name=$job" -o jsonpath='{.items[0].metadata.name}')
    diff <(hashes "$pod_name" "$namespace") "$work/$dataset.sha" >/dev/null \
        || fail "example $name: the trainer's dataset differs from MinIO's"
    if [[ $name == *-lazy ]]; then
        logs "$pod_name" "$namespace" | grep -q "^lazy view: dataset=$dataset\$" \
            || fail "example $name: the trainer did not start on the lazy view: $(logs "$pod_name" "$namespace" | head -3)"
    fi
    local enforced
    enforced=$(kube get namespace "$namespace" -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')
    [[ "$enforced" == "$level" ]] || fail "example $name: namespace $namespace enforces '$enforced', not $level"
    ok "example $name: job completed in $((SECONDS - started)) s, dataset byte for byte, namespace enforcing $enforced"
    kube delete namespace "$namespace" --wait=false >/dev/null
}
example init-container ml-training train-imagenet restricted
example csi-job ml-restricted train-imagenet-csi restricted
# The same example with `start: lazy`, on a dataset still hydrating: its trainer starts on
# .hydrator/LAZY and reads every shard (two 8 MiB parts each) while it downloads.
kube wait --for=delete namespace/ml-restricted --timeout=120s >/dev/null 2>&1 || true
example csi-job-lazy ml-restricted train-imagenet-csi restricted openimages
# Its pods mount the daemon's socket and the cache by hostPath, which only a privileged
# namespace admits (examples/warm-job/namespace.yaml says so).
example warm-job ml-node-cache train-imagenet-cached privileged

# 7. Kueue (built from source where tests/install-kueue.sh installed it) with hydrator's
# admission check: kueue-test.sh says what it shows.
kueue_tests

echo "cluster figures: apply to a pod reading its dataset ${apply_to_reading} s; the examples above"
