# shellcheck shell=bash
# The Kueue part of the cluster test: sourced by test.sh, whose helpers (kube, fail, ok, logs,
# hashes, wait_for) and state ($work, $minio_bin, MinIO running) it uses. Nothing runs when
# sourced; test.sh calls kueue_tests last.
#
# Kueue built from source (tests/install-kueue.sh) runs with waitForPodsReady at 20 s; hydrator's
# admission controller (k8s/components/kueue-admission) serves the AdmissionCheck
# hydrator-prewarm of the example's ClusterQueue `research` (k8s/examples/kueue-job), with a
# warm-up budget of one node and a hold of 45 s. The node cache hydrates at 4 MiB/s (the test
# catalog), so kinetics (128 MiB) warms in ~32 s and laion (192 MiB) in ~48 s. It shows:
#  1. the controller sets its AdmissionCheck Active, and the ClusterQueue that names it is active;
#  2. the example as shipped, on a dataset already warm: admitted at once, READY at start;
#  3. two jobs on cold datasets at once: each stays suspended (no pod) until its check is Ready,
#     then starts with READY already there and reads its dataset byte for byte; the budget lets
#     one node fetch at a time (the second waits, saying so); the second, not warm within the
#     hold, gives its quota back (Retry) and is admitted once Kueue reserves for it again;
#  4. a second job on a warm dataset is admitted at once;
#  5. a job naming a dataset no catalog has is Rejected with the reason;
#  6. nodes say what they hold (warm.hydrator.dev/ labels, hydrator.dev/snapshots); Nodes added
#     as API objects, with the flavor's labels but no daemon, are never chosen;
#  7. no job through the check is evicted by waitForPodsReady, while a job on a cold dataset in
#     a ClusterQueue without the check is (the control: the timeout bites);
#  8. with Topology-Aware Scheduling (a Topology of hostnames), the check warms exactly the node
#     Kueue assigned and adds no node selector;
#  9. kueue_admission_checks_wait_time_seconds carries the warm-ups.
# Prints the time from each Job's creation to its pod running, warm and cold.

# Kueue's test Configuration (kueue.sh) with waitForPodsReady's timeout at 20 s: shorter than a
# cold warm-up here, so a job that waited for its data after admission would be evicted.
kueue_configuration_file() {
    kueue_configuration | sed 's/^  timeout: .*/  timeout: 20s/'
}

queued_job() { # name dataset queue [pod template annotations, as a YAML flow map]
    kube -n ml-queued apply -f - >/dev/null <<YAML
apiVersion: batch/v1
kind: Job
metadata:
  name: $1
  labels: {kueue.x-k8s.io/queue-name: $3}
spec:
  suspend: true
  backoffLimit: 0
  template:
    metadata: {annotations: ${4:-{\}}}
    spec:
      restartPolicy: Never
      nodeSelector: {hydrator.dev/cache: "true"}
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      terminationGracePeriodSeconds: 1
      containers:
        - name: trainer
          image: $TRAINER_IMAGE
          command: ["sh", "-c"]
          args:
            - |
              if test -f /data/.hydrator/READY; then echo "start: READY"; else echo "start: not READY"; exit 1; fi
              cd /data && find . -type f ! -path './.hydrator/*' | sort | xargs sha256sum
          resources: {requests: {cpu: 50m, memory: 32Mi, nvidia.com/gpu: 1}, limits: {nvidia.com/gpu: 1}}
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: ["ALL"]}}
          volumeMounts: [{name: data, mountPath: /data, readOnly: true}]
      volumes:
        - name: data
          csi: {driver: cache.hydrator.dev, readOnly: true, volumeAttributes: {dataset: $2}}
YAML
}

queue() { # name flavor spec-line: a ClusterQueue of 8 CPUs, 16 GiB and 4 GPUs of the flavor
    # in the cohort gpu-shared, with the spec's line added, and its LocalQueue in ml-queued
    kube apply -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: $1}
spec:
  namespaceSelector: {}
  cohortName: gpu-shared
  resourceGroups:
    - coveredResources: ["cpu", "memory", "nvidia.com/gpu"]
      flavors:
        - name: $2
          resources:
            - {name: "cpu", nominalQuota: 8}
            - {name: "memory", nominalQuota: 16Gi}
            - {name: "nvidia.com/gpu", nominalQuota: 4}
  $3
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: $1, namespace: ml-queued}
spec: {clusterQueue: $1}
YAML
}

workload_of() { # job: its Workload's name
    kube -n ml-queued get workloads -o jsonpath="{.items[?(@.metadata.ownerReferences[0].name=='$1')].metadata.name}"
}
check_field() { # job jsonpath-field-of-the-check
    local wl
    wl=$(workload_of "$1")
    [[ -n "$wl" ]] || return 0
    kube -n ml-queued get workload "$wl" \
        -o jsonpath="{.status.admissionChecks[?(@.name=='hydrator-prewarm')].$2}" 2>/dev/null || true
}
check_state() { check_field "$1" state; }
check_is() { [[ "$(check_state "$1")" == "$2" ]]; } # job state
job_complete() { [[ "$(kube -n ml-queued get job "$1" -o jsonpath='{.status.succeeded}')" == 1 ]]; }
job_pods() { kube -n ml-queued get pods -l "job-name=$1" -o name 2>/dev/null | wc -l; }
evicted_for_pods_ready() { # job: whether Kueue evicted its workload for PodsReadyTimeout
    local wl
    wl=$(workload_of "$1")
    [[ -n "$wl" ]] && kube -n ml-queued get workload "$wl" \
        -o jsonpath='{.status.conditions[?(@.type=="Evicted")].reason}' | grep -q PodsReadyTimeout
}
rejection() { # job: the message of Kueue's AdmissionCheckRejected event on its workload
    kube -n ml-queued get events \
        --field-selector "reason=AdmissionCheckRejected,involvedObject.name=$(workload_of "$1")" \
        -o jsonpath='{.items[*].message}'
}
rejected() { [[ -n "$(rejection "$1")" ]]; }
pod_of() { kube -n ml-queued get pods -l "job-name=$1" -o jsonpath='{.items[0].metadata.name}'; }
started_after() { # job: seconds from its creation to its container's start
    local created started
    created=$(kube -n ml-queued get job "$1" -o jsonpath='{.metadata.creationTimestamp}')
    started=$(kube -n ml-queued get pod "$(pod_of "$1")" \
        -o jsonpath='{.status.containerStatuses[0].state.terminated.startedAt}{.status.containerStatuses[0].state.running.startedAt}')
    echo $(($(date -d "$started" +%s) - $(date -d "$created" +%s)))
}
hydrating_now() { # how many hydrations the node's daemon runs
    curl -sf --unix-socket /run/hydrator/hydrator.sock http://daemon/v1/datasets | jq '[.[] | select(.state == "hydrating")] | length'
}
check_job_read() { # job dataset
    local pod
    pod=$(pod_of "$1")
    logs "$pod" ml-queued | grep -qx "start: READY" || fail "kueue: job $1 started without READY: $(logs "$pod" ml-queued | head -2)"
    diff <(hashes "$pod" ml-queued) "$work/$2.sha" >/dev/null || fail "kueue: job $1 read $2 unlike MinIO's"
}

kueue_tests() {
    if ! kueue_installed; then
        echo "SKIP kueue: not installed (bash tests/install-kueue.sh, 5 min)"
        return 0
    fi
    source "$here/kueue.sh"
    local part_started=$SECONDS dataset size i
    for dataset in kinetics:8 laion:12 ade20k:8 mapillary:4; do
        size=${dataset#*:} dataset=${dataset%:*}
        mkdir -p "$work/seed/$dataset"
        for i in $(seq 1 "$size"); do
            head -c $((16 << 20)) /dev/urandom >"$work/seed/$dataset/shard-$i.tar"
        done
        "$minio_bin/mc" cp --quiet --recursive "$work/seed/$dataset/" "store/datasets/$dataset/" >/dev/null
        (cd "$work/seed/$dataset" && find . -type f | sort | xargs sha256sum) >"$work/$dataset.sha"
    done

    kueue_configuration_file >"$work/kueue-configuration.yaml"
    KUEUE_CONFIGURATION="$work/kueue-configuration.yaml" kueue_up
    # Four stand-in GPUs on the node (Kubernetes' "advertise extended resources for a node").
    kube patch node "$NODE" --subresource=status --type=json \
        -p '[{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "4"}]' >/dev/null
    # Nodes as API objects only: the flavor's label, no kubelet, no daemon.
    for i in 1 2; do
        kube apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: fake-gpu-$i
  labels: {hydrator.dev/cache: "true", kubernetes.io/hostname: fake-gpu-$i}
YAML
    done

    # 1. The controller, its AdmissionCheck Active, the example's ClusterQueue active.
    kube -n hydrator-system create configmap api-server --from-literal=host="$(host_ip)" \
        --from-literal=port="$API_PORT" >/dev/null
    kube apply -k "$here/overlays/kueue-admission" >/dev/null
    kube -n hydrator-system rollout status deploy/hydrator-admission --timeout=120s >/dev/null \
        || fail "kueue: the admission controller did not start: $(kube -n hydrator-system logs deploy/hydrator-admission | tail -3)"
    wait_for "AdmissionCheck hydrator-prewarm Active" 60 \
        kube wait --for=condition=Active admissioncheck/hydrator-prewarm --timeout=1s \
        || fail "kueue: the controller did not set its AdmissionCheck Active"
    local warm_created=$SECONDS
    kube apply -k "$here/overlays/kueue-job" >/dev/null
    wait_for "ClusterQueue research active" 60 kube wait --for=condition=Active clusterqueue/research --timeout=1s \
        || fail "kueue: ClusterQueue research is not active: $(kube get clusterqueue research -o jsonpath='{.status.conditions}')"
    ok "kueue: the controller set AdmissionCheck hydrator-prewarm Active; ClusterQueue research (with the check) is active"

    # 2. The example as shipped: imagenet is warm already (the parts above read it).
    kube -n ml-queued wait --for=condition=complete job/train-imagenet-queued --timeout=120s >/dev/null \
        || fail "kueue: the example's job did not complete: $(check_field train-imagenet-queued message)"
    check_job_read train-imagenet-queued imagenet
    local warm_start
    warm_start=$(started_after train-imagenet-queued)
    ok "kueue: the example's job on a warm dataset: admitted and running $warm_start s after its creation, READY at start, imagenet byte for byte ($((SECONDS - warm_created)) s to complete)"

    # 3. Two jobs on cold datasets at once, sampled every second.
    queued_job train-kinetics kinetics research
    queued_job train-laion laion research
    local samples="$work/kueue-samples"
    (
        while :; do
            for job in train-kinetics train-laion; do
                printf '%s %s %s %s %s\n' "$job" \
                    "$(kube -n ml-queued get job "$job" -o jsonpath='{.spec.suspend}')" \
                    "$(check_state "$job")" "$(job_pods "$job")" "$(hydrating_now)"
            done
            sleep 1
        done
    ) >"$samples" 2>/dev/null &
    local sampler=$!
    local laion_message=""
    until job_complete train-kinetics && job_complete train-laion; do
        ((SECONDS - part_started < 600)) || { kill "$sampler"; fail "kueue: the cold jobs did not complete: kinetics $(check_field train-kinetics message); laion $(check_field train-laion message)"; }
        [[ $(check_field train-laion message) == *"warm-up budget"* ]] && laion_message=budget
        sleep 1
    done
    kill "$sampler"
    local cold_kinetics cold_laion
    cold_kinetics=$(started_after train-kinetics)
    cold_laion=$(started_after train-laion)
    check_job_read train-kinetics kinetics
    check_job_read train-laion laion
    # While a check is not Ready, its job is suspended and has no pod.
    local early
    early=$(awk '$3 != "Ready" && $3 != "" && ($2 != "true" || $4 != 0)' "$samples" | head -3)
    [[ -z "$early" ]] || fail "kueue: a job ran before its check was Ready: $early"
    grep -q '^train-kinetics true Pending 0' "$samples" || fail "kueue: train-kinetics was never seen suspended with its check Pending"
    local most
    most=$(awk '{print $5}' "$samples" | sort -n | tail -1)
    ((most <= 1)) || fail "kueue: $most nodes fetched from the store at once; the budget is 1"
    [[ $laion_message == budget ]] || fail "kueue: train-laion never waited for the warm-up budget"
    # Kueue resets a Retry to Pending as it evicts, counting it in retryCount.
    local retries
    retries=$(check_field train-laion retryCount)
    ((${retries:-0} >= 1)) || fail "kueue: train-laion's warm-up outlasted the hold but its check never said Retry"
    ok "kueue: cold jobs: suspended with no pod until Ready, then READY at start and byte for byte; kinetics running $cold_kinetics s after creation, laion (waited for the budget of 1, Retry at the 45 s hold, reserved again) $cold_laion s; at most $most hydration at a time"

    # 4. A second job on a warm dataset.
    local again_created=$SECONDS
    queued_job train-kinetics-again kinetics research
    wait_for "train-kinetics-again's check Ready" 30 check_is train-kinetics-again Ready \
        || fail "kueue: a job on a warm dataset was not admitted at once: $(check_field train-kinetics-again message)"
    local ready_in=$((SECONDS - again_created))
    kube -n ml-queued wait --for=condition=complete job/train-kinetics-again --timeout=120s >/dev/null \
        || fail "kueue: train-kinetics-again did not complete"
    ok "kueue: a second job on kinetics: check Ready within $ready_in s, running $(started_after train-kinetics-again) s after creation"

    # 5. An unknown dataset. Kueue deactivates a workload whose check is Rejected and then sets
    # the check back to Pending: the event keeps the check's message.
    queued_job train-nosuch nosuch research
    wait_for "train-nosuch's rejection" 60 rejected train-nosuch || true
    local why
    why=$(rejection train-nosuch)
    [[ $why == *"is not in the node cache's catalog"* ]] \
        || fail "kueue: a job on an unknown dataset was not Rejected with its reason: ${why:-no event}; check $(check_state train-nosuch)"
    [[ $(kube -n ml-queued get workload "$(workload_of train-nosuch)" -o jsonpath='{.spec.active}') == false ]] \
        || fail "kueue: the rejected workload is still active"
    [[ $(job_pods train-nosuch) == 0 ]] || fail "kueue: the rejected job has pods"
    ok "kueue: a job on an unknown dataset is Rejected and deactivated: $why"

    # 6. What the nodes say, and the nodes without a daemon.
    local labels snapshots selector fakes
    labels=$(kube get node "$NODE" -o json | jq -c '.metadata.labels | with_entries(select(.key | startswith("warm.hydrator.dev/")))')
    for dataset in imagenet kinetics laion; do
        jq -e --arg k "warm.hydrator.dev/$dataset" '.[$k] == "ready"' <<<"$labels" >/dev/null \
            || fail "kueue: node $NODE does not say it holds $dataset: $labels"
    done
    snapshots=$(kube get node "$NODE" -o jsonpath='{.metadata.annotations.hydrator\.dev/snapshots}')
    jq -e '.kinetics | length == 64' <<<"$snapshots" >/dev/null || fail "kueue: no kinetics digest in $snapshots"
    fakes=$(kube get nodes fake-gpu-1 fake-gpu-2 -o json | jq -c '[.items[].metadata.labels | keys[] | select(startswith("warm.hydrator.dev/"))]')
    [[ $fakes == "[]" ]] || fail "kueue: nodes without a daemon say they hold $fakes"
    selector=$(check_field train-kinetics podSetUpdates)
    [[ $selector == *'"warm.hydrator.dev/kinetics":"ready"'* ]] || fail "kueue: train-kinetics got no warm node selector: $selector"
    [[ $(check_field train-kinetics message) == *"kinetics on $NODE"* ]] || fail "kueue: train-kinetics was not warmed on $NODE: $(check_field train-kinetics message)"
    ok "kueue: $NODE says $labels; the nodes without a daemon (flavor's labels, no kubelet) say nothing and were never chosen"

    # 7. waitForPodsReady: none of the jobs above was evicted; the control is.
    for job in train-imagenet-queued train-kinetics train-laion train-kinetics-again; do
        evicted_for_pods_ready "$job" && fail "kueue: waitForPodsReady evicted $job"
    done
    queue control h100-sxm ""
    queued_job train-control ade20k control
    wait_for "the control's eviction" 90 evicted_for_pods_ready train-control \
        || fail "kueue: the control job (no check, a cold dataset) was not evicted by waitForPodsReady: the test cannot tell"
    ok "kueue: no job through the check was evicted by waitForPodsReady (20 s); the control without the check on a cold dataset was"

    # 8. With Topology-Aware Scheduling: Kueue names the node before the check runs, and the
    # check warms exactly that node, adding no node selector.
    kube apply -f - >/dev/null <<YAML
apiVersion: kueue.x-k8s.io/v1beta2
kind: Topology
metadata: {name: hosts}
spec:
  levels: [{nodeLabel: kubernetes.io/hostname}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: tas-hosts}
spec:
  nodeLabels: {hydrator.dev/cache: "true"}
  topologyName: hosts
YAML
    queue tas tas-hosts "admissionChecksStrategy: {admissionChecks: [{name: hydrator-prewarm}]}"
    wait_for "ClusterQueue tas active" 60 kube wait --for=condition=Active clusterqueue/tas --timeout=1s \
        || fail "kueue: ClusterQueue tas is not active: $(kube get clusterqueue tas -o jsonpath='{.status.conditions}')"
    queued_job train-tas mapillary tas '{kueue.x-k8s.io/podset-required-topology: kubernetes.io/hostname}'
    kube -n ml-queued wait --for=condition=complete job/train-tas --timeout=180s >/dev/null \
        || fail "kueue: the TAS job did not complete: $(check_state train-tas): $(check_field train-tas message)"
    check_job_read train-tas mapillary
    local assigned
    assigned=$(kube -n ml-queued get workload "$(workload_of train-tas)" \
        -o jsonpath='{.status.admission.podSetAssignments[0].topologyAssignment}')
    [[ $assigned == *"$NODE"* ]] || fail "kueue: the TAS job's workload has no topology assignment to $NODE: $assigned"
    [[ $(check_field train-tas message) == *"mapillary on $NODE"* ]] \
        || fail "kueue: the TAS job was not warmed on its assigned node: $(check_field train-tas message)"
    [[ -z $(check_field train-tas podSetUpdates) ]] || fail "kueue: the TAS job got a node selector: $(check_field train-tas podSetUpdates)"
    ok "kueue: with TAS, the check warmed the assigned node ($assigned), added no selector; READY at start, mapillary byte for byte, running $(started_after train-tas) s after creation"

    # 9. Kueue's own measure of the warm-ups.
    local metrics count sum
    metrics=$(kueue_metrics) || fail "kueue: no metrics"
    count=$(awk '/^kueue_admission_checks_wait_time_seconds_count\{.*cluster_queue="research"/ {print $2}' <<<"$metrics")
    sum=$(awk '/^kueue_admission_checks_wait_time_seconds_sum\{.*cluster_queue="research"/ {print $2}' <<<"$metrics")
    if [[ -z "$count" ]] || ((${count%.*} < 4)); then
        fail "kueue: kueue_admission_checks_wait_time_seconds counts ${count:-nothing} admissions in research"
    fi
    ok "kueue: kueue_admission_checks_wait_time_seconds{cluster_queue=research}: $count admissions, $sum s in all"
    echo "kueue figures: job creation to pod running: warm $warm_start s (example), $(started_after train-kinetics-again) s (kinetics again); cold kinetics $cold_kinetics s, cold laion $cold_laion s; admission checks wait $sum s over $count admissions; part took $((SECONDS - part_started)) s"

    kube delete namespace ml-queued --wait=false >/dev/null
    kube delete node fake-gpu-1 fake-gpu-2 >/dev/null
}
