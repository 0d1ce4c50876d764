#!/usr/bin/env bash
# Renders every Kustomize tree under k8s/ and validates each resource against the Kubernetes
# schemas with kubernetes-validate (PyPI, installed when missing), strictly: unknown fields are
# errors. The ServiceMonitor is a Prometheus Operator custom resource, whose schema is not
# bundled: it is reported and rendered, not schema-checked. Every pod in a namespace that
# enforces the Restricted Pod Security level is checked against that profile, and the CSI
# example must be one of them, reading its dataset from a csi volume.
set -euo pipefail
cd "$(dirname "$0")"
KUBERNETES_VERSION=1.32.0
if ! command -v kubectl >/dev/null; then
  echo "k8s/validate.sh: kubectl (with its built-in kustomize) is needed to render k8s/" >&2
  exit 1
fi
if ! command -v kubernetes-validate >/dev/null; then
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate
fi
rendered=$(mktemp -d)
trap 'rm -rf "$rendered"' EXIT
for tree in . overlays/io-uring; do
  out="$rendered/$(echo "$tree" | tr './' '_-').yaml"
  kubectl kustomize "$tree" > "$out"
  echo "k8s/validate.sh: rendered $tree: $(grep -c '^kind:' "$out") resources"
done
kubernetes-validate --strict --quiet -k "$KUBERNETES_VERSION" "$rendered"/*.yaml
python3 - components/io-uring-seccomp/hydrator-io-uring.json <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
allowed = {n for s in profile["syscalls"] if s["action"] == "SCMP_ACT_ALLOW" for n in s["names"]}
missing = {"io_uring_setup", "io_uring_enter", "io_uring_register"} - allowed
sys.exit(f"{sys.argv[1]}: io_uring syscalls not allowed: {sorted(missing)}" if missing else 0)
PY
python3 - "$rendered/_.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
restricted = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"
              and d["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") == "restricted"}
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
def pod_spec(doc):
    spec = doc.get("spec", {})
    if doc["kind"] == "Pod":
        return spec
    if doc["kind"] == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("spec")
problems, checked, csi_readers = [], 0, 0
for doc in docs:
    pod = pod_spec(doc)
    if pod is None or doc["metadata"].get("namespace") not in restricted:
        continue
    checked += 1
    name = f'{doc["kind"]}/{doc["metadata"]["name"]}'
    pod_ctx = pod.get("securityContext", {})
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"{name}: volume {volume['name']} is {sorted(kinds)}")
        if volume.get("csi", {}).get("driver") == "cache.hydrator.dev":
            csi_readers += volume["csi"].get("readOnly") is True
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"{name}: {key}")
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        ctx = c.get("securityContext", {})
        where = f"{name} container {c['name']}"
        if ctx.get("privileged"):
            problems.append(f"{where}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if "ALL" not in ctx.get("capabilities", {}).get("drop", []):
            problems.append(f"{where}: capabilities not dropped (ALL)")
        if set(ctx.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            problems.append(f"{where}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            problems.append(f"{where}: runs as uid 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccomp profile {seccomp}")
        if any("hostPort" in p for p in c.get("ports", [])):
            problems.append(f"{where}: hostPort")
if not checked or not csi_readers:
    problems.append(f"no pod of a restricted namespace reads a read-only hydrator csi volume ({checked} pods checked)")
for p in problems:
    print(f"k8s/validate.sh: Restricted profile: {p}", file=sys.stderr)
print(f"k8s/validate.sh: {checked} pods in restricted namespaces meet the Restricted profile" if not problems else "", end="\n" if not problems else "")
sys.exit(1 if problems else 0)
PY
echo "k8s/validate.sh: every manifest is valid against Kubernetes $KUBERNETES_VERSION"
