#!/usr/bin/env bash
# Kueue v0.17.0 on the one-node cluster, with an AdmissionCheck whose controller this script
# plays by hand (controllerName hydrator.dev/prewarm), as the prewarm controller will:
#  1. kueue_up (tests/cluster/kueue.sh); 4 fake GPUs advertised on node hydrator-node (its
#     status capacity patched, as for any extended resource); a ResourceFlavor, a ClusterQueue
#     `team-a` in cohort `gpu-pool` (cpu, memory, nvidia.com/gpu) that requires the check
#     `prewarm`, the AdmissionCheck `prewarm`, a LocalQueue `team-a` in namespace team-a;
#  2. the ClusterQueue stays inactive while the check has no Active condition;
#  3. once the check's status says Active=True: a Job on queue team-a is suspended by Kueue's
#     webhook, its Workload gets QuotaReserved and its check `prewarm` Pending;
#  4. the check set Ready (server-side apply of the Workload's status, with a podSetUpdate
#     adding a nodeSelector): the Workload is admitted, the Job unsuspended, its pod runs with
#     that nodeSelector to completion;
#  5. kueue_admission_checks_wait_time_seconds shows in Kueue's metrics.
# Brings the cluster up unless it is (and down at the end unless HYDRATOR_CLUSTER_KEEP=1);
# prints the timings. Needs tests/cluster/install.sh and tests/install-kueue.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
source "$here/kueue.sh"

if ! installed; then
    echo "SKIP kueue smoke: cluster not installed (bash tests/cluster/install.sh, ~25 min)"
    exit 0
fi
if ! kueue_installed; then
    echo "SKIP kueue smoke: Kueue not installed (bash tests/install-kueue.sh, ~5 min)"
    exit 0
fi

finish() {
    local code=$?
    if ((code != 0)); then
        echo "--- kueue smoke failed; Kueue's objects, pods, events and last log lines:" >&2
        kube get clusterqueues,admissionchecks,workloads -A -o wide >&2 2>/dev/null || true
        kube get pods -A -o wide >&2 2>/dev/null || true
        kube get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -20 >&2 || true
        kube -n kueue-system logs deploy/kueue-controller-manager 2>/dev/null | tail -20 >&2 || true
    fi
    if [[ "${HYDRATOR_CLUSTER_KEEP:-}" != 1 ]]; then
        bash "$here/down.sh" >/dev/null
    fi
    exit "$code"
}
fail() { echo "kueue smoke FAILED: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
ms() { date +%s%3N; }
elapsed() { echo "$((($(ms) - $1) / 100))" | sed 's/\(.\)$/.\1/; s/^\./0./'; } # since MS, in s

trap finish EXIT
if [[ -f "$STATE/pids" ]]; then
    echo "cluster: already up, using it"
else
    bash "$here/up.sh"
fi
kueue_up
# A kept cluster's objects of an earlier run: the check would already be Active.
kube delete namespace team-a --ignore-not-found --wait=true --timeout=120s >/dev/null
kube delete clusterqueue/team-a admissioncheck/prewarm resourceflavor/default-flavor --ignore-not-found \
    --wait=true --timeout=60s >/dev/null

# 1. Four fake GPUs: the node's status capacity, as for any extended resource; the kubelet
# copies it into allocatable.
kube patch node "$NODE" --subresource=status --type=json \
    -p '[{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "4"}]' >/dev/null
gpus() { kube get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
four_gpus() { [[ "$(gpus)" == 4 ]]; }
wait_for "4 allocatable GPUs on $NODE" 60 four_gpus || fail "node $NODE does not advertise 4 GPUs: '$(gpus)'"
ok "node $NODE advertises nvidia.com/gpu: 4 (capacity and allocatable)"

kube apply --server-side -f - >/dev/null <<'YAML'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: AdmissionCheck
metadata: {name: prewarm}
spec:
  controllerName: hydrator.dev/prewarm
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: team-a}
spec:
  cohortName: gpu-pool
  namespaceSelector: {}
  resourceGroups:
    - coveredResources: [cpu, memory, nvidia.com/gpu]
      flavors:
        - name: default-flavor
          resources:
            - {name: cpu, nominalQuota: "1"}
            - {name: memory, nominalQuota: 1Gi}
            - {name: nvidia.com/gpu, nominalQuota: "4"}
  admissionChecksStrategy:
    admissionChecks:
      - name: prewarm
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team-a, namespace: team-a}
spec:
  clusterQueue: team-a
YAML
ok "ResourceFlavor default-flavor, ClusterQueue team-a (cohort gpu-pool), AdmissionCheck prewarm, LocalQueue team-a/team-a"

# 2. No Active condition on the check: the ClusterQueue is inactive.
cq_active() { kube get clusterqueue team-a -o jsonpath='{.status.conditions[?(@.type=="Active")].status}'; }
cq_inactive() { [[ "$(cq_active)" == False ]]; }
wait_for "ClusterQueue team-a's Active=False" 30 cq_inactive || fail "ClusterQueue team-a is not inactive: '$(cq_active)'"
ok "ClusterQueue team-a inactive while the check has no Active condition: $(kube get clusterqueue team-a \
    -o jsonpath='{.status.conditions[?(@.type=="Active")].reason}: {.status.conditions[?(@.type=="Active")].message}')"

# 3. The check's controller says Active (its status, as a controller writes it).
started=$(ms)
kube apply --server-side --subresource=status --field-manager=hydrator-prewarm -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: AdmissionCheck
metadata: {name: prewarm}
status:
  conditions:
    - type: Active
      status: "True"
      reason: Active
      message: the prewarm controller is ready
      lastTransitionTime: "$(now)"
YAML
cq_is_active() { [[ "$(cq_active)" == True ]]; }
wait_for "ClusterQueue team-a's Active=True" 30 cq_is_active || fail "ClusterQueue team-a did not become active"
ok "AdmissionCheck prewarm Active=True: ClusterQueue team-a active $(elapsed "$started") s later"

created=$(ms)
kube apply --server-side -f - >/dev/null <<YAML
apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: team-a
  labels: {kueue.x-k8s.io/queue-name: team-a}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
        - name: trainer
          image: $TRAINER_IMAGE
          command: ["sh", "-c", "echo training on \$(cat /etc/hostname); sleep 2; echo trained"]
          resources:
            requests: {cpu: 100m, memory: 64Mi}
            limits: {nvidia.com/gpu: "1"}
YAML
[[ "$(kube -n team-a get job train -o jsonpath='{.spec.suspend}')" == true ]] \
    || fail "Kueue's webhook did not suspend job train"
ok "job train created suspended (Kueue's webhook)"
job_uid=$(kube -n team-a get job train -o jsonpath='{.metadata.uid}')
workload() { kube -n team-a get workloads -l "kueue.x-k8s.io/job-uid=$job_uid" -o jsonpath='{.items[0].metadata.name}'; }
has_workload() { [[ -n "$(workload)" ]]; }
wait_for "job train's Workload" 30 has_workload || fail "no Workload for job train"
wl=$(workload)
wl_get() { kube -n team-a get workload "$wl" -o jsonpath="$1"; }
wl_condition() { wl_get "{.status.conditions[?(@.type==\"$1\")].status}"; }
check_state() { wl_get '{.status.admissionChecks[?(@.name=="prewarm")].state}'; }
reserved_pending() { [[ "$(wl_condition QuotaReserved)" == True && "$(check_state)" == Pending ]]; }
wait_for "QuotaReserved and prewarm Pending on $wl" 60 reserved_pending \
    || fail "Workload $wl: QuotaReserved '$(wl_condition QuotaReserved)', prewarm '$(check_state)'"
reserved_after=$(elapsed "$created")
[[ "$(kube -n team-a get job train -o jsonpath='{.spec.suspend}')" == true ]] || fail "job train ran before the check was Ready"
ok "Workload $wl: QuotaReserved $reserved_after s after the job's creation, check prewarm Pending, job still suspended"
echo "  podSetAssignments: $(wl_get '{.status.admission.podSetAssignments}')"
echo "  admissionChecks:   $(wl_get '{.status.admissionChecks}')"

# 4. The check Ready, with a nodeSelector for the job's pods (the podSet of a batch Job is `main`).
ready_at=$(ms)
kube apply --server-side --subresource=status --force-conflicts --field-manager=test -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata: {name: $wl, namespace: team-a}
status:
  admissionChecks:
    - name: prewarm
      state: Ready
      message: datasets warm on the selected nodes
      lastTransitionTime: "$(now)"
      podSetUpdates:
        - name: main
          nodeSelector: {hydrator.dev/cache: "true"}
YAML
admitted() { [[ "$(wl_condition Admitted)" == True ]]; }
wait_for "Workload $wl Admitted" 60 admitted || fail "Workload $wl not admitted after its check was Ready"
admitted_after=$(elapsed "$ready_at")
unsuspended() { [[ "$(kube -n team-a get job train -o jsonpath='{.spec.suspend}')" == false ]]; }
wait_for "job train unsuspended" 60 unsuspended || fail "job train still suspended"
unsuspended_after=$(elapsed "$ready_at")
ok "check prewarm Ready: Workload admitted $admitted_after s later, job unsuspended $unsuspended_after s later"
pod_name() { kube -n team-a get pods -l batch.kubernetes.io/job-name=train -o jsonpath='{.items[0].metadata.name}'; }
has_pod() { [[ -n "$(pod_name)" ]]; }
wait_for "job train's pod" 60 has_pod || fail "job train has no pod"
selector=$(kube -n team-a get pod "$(pod_name)" -o jsonpath='{.spec.nodeSelector}')
[[ "$selector" == *'"hydrator.dev/cache":"true"'* ]] || fail "the pod's nodeSelector lacks the podSetUpdate: $selector"
ok "pod $(pod_name): nodeSelector $selector (from the check's podSetUpdates)"
kube -n team-a wait --for=condition=Complete job/train --timeout=120s >/dev/null \
    || fail "job train did not complete: $(kube -n team-a describe job train | tail -5)"
completed_after=$(elapsed "$ready_at")
ok "job train completed $completed_after s after the check was Ready: $(kube -n team-a logs job/train | tr '\n' ' ')"
finished() { [[ "$(wl_condition Finished)" == True ]]; }
wait_for "Workload $wl Finished" 30 finished || fail "Workload $wl not Finished"
ok "Workload $wl: PodsReady=$(wl_condition PodsReady) (waitForPodsReady), Finished=True"

# 5. The wait on the check, as Kueue measured it.
waited=$(kueue_metrics | grep '^kueue_admission_checks_wait_time_seconds_\(count\|sum\)' || true)
[[ "$waited" == *'cluster_queue="team-a"'* ]] || fail "no kueue_admission_checks_wait_time_seconds for team-a in the metrics"
ok "kueue_admission_checks_wait_time_seconds in Kueue's metrics:"
echo "  ${waited//$'\n'/$'\n'  }"
echo "kueue smoke figures: quota reserved ${reserved_after} s after the job's creation; after the check's Ready:" \
    "admitted ${admitted_after} s, unsuspended ${unsuspended_after} s, completed ${completed_after} s"
