#!/usr/bin/env bash
# Renders every Kustomize tree under k8s/ on its own (each directory with a kustomization.yaml
# that is not a Component: the node cache `.`, node-cache, each example, each overlay, so each
# component through the overlay that uses it) and checks each render:
# - against the Kubernetes schemas with kubernetes-validate (PyPI, installed when missing),
#   strictly: unknown fields are errors, and so is a kind without a bundled schema, except the
#   ServiceMonitor (a Prometheus Operator custom resource), which is checked here against the
#   Service it selects instead, and Kueue's kinds (kueue.x-k8s.io), which the cluster test
#   applies to a cluster with Kueue's own CRDs (tests/cluster/test.sh) and which are checked
#   here against the controller that serves them;
# - every namespace an object names is created by a Namespace object of the same render (or is
#   default or kube-system), and every namespaced object names one: each tree applies on its
#   own to a fresh cluster;
# - the node cache (`kubectl apply -k k8s/`) holds no Job, Pod, CronJob nor ServiceMonitor;
# - every pod in a namespace that enforces the Restricted Pod Security level meets that
#   profile, no pod with a hostPath volume is in a Baseline or Restricted namespace, and the
#   CSI example (examples/csi-job) is such a pod reading its dataset from a read-only csi volume;
# - every pod that uses the node cache (the daemon's socket or cache by hostPath, or a csi
#   volume of cache.hydrator.dev) selects the nodes the DaemonSet runs on;
# - every tree meant to be applied (all but node-cache, the base the others share) sets
#   hydrator's image with an `images:` entry;
# - every Secret referenced is one of the documented ones, and the kustomization's comment
#   creates it in that namespace after the namespace and before `kubectl apply -k`;
# - the io_uring seccomp profile allows io_uring, and overlays/io-uring gives it to the daemon.
set -euo pipefail
cd "$(dirname "$0")"
KUBERNETES_VERSION=1.32.0
# The renders are made with this kustomize (the one kubectl 1.32 carries): kubectl's own where
# it is this version, else the standalone CLI, installed by tests/install-kustomize.sh.
KUSTOMIZE_VERSION=v5.5.0
if kubectl version --client 2>/dev/null | grep -qx "Kustomize Version: $KUSTOMIZE_VERSION"; then
  kustomize=(kubectl kustomize)
else
  bash ../tests/install-kustomize.sh
  kustomize=("$HOME/.cache/hydrator-tests/kustomize/bin/kustomize" build)
fi
if ! command -v kubernetes-validate >/dev/null; then
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate
fi
rendered=$(mktemp -d)
trap 'rm -rf "$rendered"' EXIT
trees=()
while IFS= read -r dir; do
  grep -q '^kind: *Component' "$dir/kustomization.yaml" || trees+=("$dir")
done < <(find . -name kustomization.yaml -printf '%h\n' | sed 's|^\./||' | sort)
renders=()
for tree in "${trees[@]}"; do
  out="$rendered/k8s$([ "$tree" = . ] || echo "/$tree" | tr '/' '+').yaml"
  "${kustomize[@]}" "$tree" > "$out"
  renders+=("$tree=$out")
  echo "k8s/validate.sh: rendered $tree: $(grep -c '^kind:' "$out") resources"
done
# Schemas: every render without its ServiceMonitors, and no kind may go unchecked.
mkdir "$rendered/schema"
python3 - "$rendered/schema" "$rendered"/*.yaml <<'PY'
import os, sys, yaml
for path in sys.argv[2:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    with open(os.path.join(sys.argv[1], os.path.basename(path)), "w") as out:
        yaml.safe_dump_all([d for d in docs if d["kind"] != "ServiceMonitor"
                            and not d["apiVersion"].startswith("kueue.x-k8s.io/")], out)
PY
# Applied with `kubectl apply -f` beside a render (overlays/p2p's comment says when).
cp overlays/p2p/dragonfly-networkpolicy.yaml "$rendered/schema/"
report=$(kubernetes-validate --strict --quiet -k "$KUBERNETES_VERSION" "$rendered"/schema/*.yaml 2>&1) || {
  echo "$report" >&2
  exit 1
}
if grep -q "Couldn't find schema" <<<"$report"; then
  echo "$report" >&2
  echo "k8s/validate.sh: a kind above has no bundled schema; only ServiceMonitor and Kueue's kinds may skip the schema check" >&2
  exit 1
fi
[ -z "$report" ] || echo "$report"
python3 - components/io-uring-seccomp/hydrator-io-uring.json <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
allowed = {n for s in profile["syscalls"] if s["action"] == "SCMP_ACT_ALLOW" for n in s["names"]}
missing = {"io_uring_setup", "io_uring_enter", "io_uring_register"} - allowed
sys.exit(f"{sys.argv[1]}: io_uring syscalls not allowed: {sorted(missing)}" if missing else 0)
PY
python3 - "${renders[@]}" <<'PY'
import os, re, sys, tomllib, yaml

# The Secrets the manifests may reference, each documented in docs/kubernetes.md and created by
# the commands in the comment of the kustomization that applies it.
SECRETS = {"hydrator-s3-credentials", "hydrator-api-token"}
WELL_KNOWN_NAMESPACES = {"default", "kube-system"}
CLUSTER_SCOPED = {"Namespace", "CSIDriver", "ClusterRole", "ClusterRoleBinding", "StorageClass",
                  "PriorityClass", "CustomResourceDefinition", "RuntimeClass",
                  "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
                  "PersistentVolume", "VolumeSnapshotClass", "AdmissionCheck", "ClusterQueue",
                  "ResourceFlavor", "Topology"}
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
CACHE_PATHS = ("/run/hydrator", "/var/cache/hydrator")
CSI_DRIVER = "cache.hydrator.dev"
PROFILE = "profiles/hydrator-io-uring.json"

renders = {}
for arg in sys.argv[1:]:
    tree, path = arg.split("=", 1)
    renders[tree] = [d for d in yaml.safe_load_all(open(path)) if d]
problems = []
def problem(tree, text):
    problems.append(f"{tree}: {text}")
def ident(doc):
    return f'{doc["kind"]}/{doc["metadata"]["name"]}'
def pod_spec(doc):
    spec = doc.get("spec", {})
    if doc["kind"] == "Pod":
        return spec
    if doc["kind"] == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    return spec.get("template", {}).get("spec")
def containers(pod):
    return pod.get("initContainers", []) + pod.get("containers", [])

for required in (".", "examples/init-container", "examples/warm-job", "examples/csi-job",
                 "overlays/io-uring", "overlays/prometheus", "overlays/p2p", "overlays/kueue",
                 "examples/kueue-job", "overlays/cache-path"):
    if required not in renders:
        problem(required, "no kustomization.yaml: this tree is expected")

# The nodes the node cache runs on.
daemonsets = [d for d in renders.get(".", []) if d["kind"] == "DaemonSet"]
cache_nodes = daemonsets[0]["spec"]["template"]["spec"].get("nodeSelector", {}) if daemonsets else {}
if not cache_nodes:
    problem(".", "the DaemonSet selects no nodes (nodeSelector): the node label is its contract")

# The cache's directory: the node's side is the hostPath of the DaemonSet's `cache` volume and
# nothing else; the containers' side is the catalog's cache.root in every render.
def cache_sides(docs):
    node, inside, root = set(), set(), set()
    for doc in docs:
        if doc["kind"] == "ConfigMap" and "catalog.toml" in doc.get("data", {}):
            root.add(tomllib.loads(doc["data"]["catalog.toml"])["cache"]["root"])
        if doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == "hydrator":
            pod = pod_spec(doc)
            node |= {v["hostPath"]["path"] for v in pod["volumes"] if v["name"] == "cache"}
            inside |= {m["mountPath"] for c in containers(pod) for m in c.get("volumeMounts", [])
                       if m["name"] == "cache"}
    return node, inside, root
sides = {tree: cache_sides(docs) for tree, docs in renders.items()}
for tree, (node, inside, root) in sides.items():
    if node and inside != root:
        problem(tree, f"the cache is mounted at {sorted(inside)} in the containers, but the "
                      f"catalog's cache.root is {sorted(root)}")
    if len(node) > 1:
        problem(tree, f"the DaemonSet's cache volume names several node directories: {sorted(node)}")
moved = sides.get("overlays/cache-path", (set(),))[0]
if moved & set(CACHE_PATHS) or not moved:
    problem("overlays/cache-path", f"the cache's node directory is {sorted(moved)}: the overlay "
                                   f"must move it off {CACHE_PATHS[1]}")

restricted_pods, csi_readers = 0, {}
for tree, docs in renders.items():
    node_cache_paths = set(CACHE_PATHS) | sides[tree][0]
    # Namespaces: created in this render, or well known.
    created = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    enforced = {d["metadata"]["name"]: d["metadata"].get("labels", {}).get(
        "pod-security.kubernetes.io/enforce") for d in docs if d["kind"] == "Namespace"}
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        if ns is None and doc["kind"] not in CLUSTER_SCOPED:
            problem(tree, f"{ident(doc)} names no namespace: it would land in kubectl's current one")
        elif ns is not None and ns not in created | WELL_KNOWN_NAMESPACES:
            problem(tree, f"{ident(doc)} is in namespace {ns}, which no Namespace object of this "
                          f"render creates: the tree does not apply on its own to a fresh cluster")
    if tree == ".":
        for doc in docs:
            if doc["kind"] in ("Job", "CronJob", "Pod", "ServiceMonitor"):
                problem(tree, f"{ident(doc)} is in the node cache (`kubectl apply -k k8s/`): "
                              f"examples and the ServiceMonitor are optional")
    # ServiceMonitors (no bundled schema): they must select a Service of the render by its
    # labels and name one of its ports.
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":
            continue
        selector = doc.get("spec", {}).get("selector", {}).get("matchLabels", {})
        services = [s for s in docs if s["kind"] == "Service"
                    and s["metadata"].get("namespace") == doc["metadata"].get("namespace")
                    and selector and selector.items() <= s["metadata"].get("labels", {}).items()]
        ports = {p.get("name") for s in services for p in s["spec"].get("ports", [])}
        if doc.get("apiVersion") != "monitoring.coreos.com/v1" or not services:
            problem(tree, f"{ident(doc)} selects no Service of its namespace")
        for endpoint in doc.get("spec", {}).get("endpoints", []):
            if endpoint.get("port") not in ports:
                problem(tree, f"{ident(doc)}: port {endpoint.get('port')} is not a port of the Service")
    # Kueue: every AdmissionCheck of hydrator's controller name is served by a controller of
    # the same render, and every ClusterQueue names only checks the render or the Kueue
    # overlay defines.
    controllers = set()
    for doc in docs:
        pod = pod_spec(doc)
        for c in containers(pod) if pod else []:
            args = c.get("args", [])
            if args[:1] == ["admission"]:
                named = [a.split("=", 1)[1] for a in args if a.startswith("--controller-name=")]
                controllers.add(named[0] if named else "hydrator.dev/prewarm")
    for doc in docs:
        if doc["kind"] == "AdmissionCheck":
            name = doc["spec"].get("controllerName")
            if name.startswith("hydrator.dev/") and name not in controllers:
                problem(tree, f"{ident(doc)}: no `hydrator admission` of this render serves controllerName {name}")
    checks = {d["metadata"]["name"] for r in renders.values() for d in r if d["kind"] == "AdmissionCheck"}
    for doc in docs:
        if doc["kind"] == "ClusterQueue":
            named = doc["spec"].get("admissionChecksStrategy", {}).get("admissionChecks", [])
            for check in named:
                if check["name"] not in checks:
                    problem(tree, f"{ident(doc)} names AdmissionCheck {check['name']}, which no tree defines")
    # Images: every tree that is applied sets hydrator's image (node-cache/ is the base the
    # others share, not applied on its own).
    if tree != "node-cache":
        for doc in docs:
            pod = pod_spec(doc)
            for c in containers(pod) if pod else []:
                if re.split(r"[:@]", c["image"])[0] == "hydrator":
                    problem(tree, f"{ident(doc)} container {c['name']}: image {c['image']} is not "
                                  f"set: the kustomization needs an `images:` entry for hydrator")
    secret_commands = open("kustomization.yaml" if not tree.startswith("examples/")
                           else os.path.join(tree, "kustomization.yaml")).read()
    for doc in docs:
        pod = pod_spec(doc)
        if pod is None:
            continue
        name, ns = ident(doc), doc["metadata"].get("namespace")
        volumes = pod.get("volumes", [])
        # Secrets: documented names, created in the documented order.
        refs = set()
        for volume in volumes:
            if "secret" in volume:
                refs.add(volume["secret"].get("secretName"))
            for source in volume.get("projected", {}).get("sources", []):
                refs.add(source.get("secret", {}).get("name"))
        for c in containers(pod):
            for env in c.get("env", []):
                refs.add(env.get("valueFrom", {}).get("secretKeyRef", {}).get("name"))
            for env in c.get("envFrom", []):
                refs.add(env.get("secretRef", {}).get("name"))
        for secret in sorted(refs - {None}):
            if secret not in SECRETS:
                problem(tree, f"{name} uses Secret {secret}, not one of {sorted(SECRETS)}")
            create = re.search(rf"-n {re.escape(ns)} create secret generic {re.escape(secret)}\b",
                               secret_commands)
            namespace_first = re.search(rf"apply -f \S*namespace\.yaml|create namespace {re.escape(ns)}\b",
                                        secret_commands)
            if not (create and namespace_first and namespace_first.start() < create.start()
                    and "kubectl apply -k" in secret_commands[create.end():]):
                problem(tree, f"{name} uses Secret {secret}: the kustomization's comment must create "
                              f"namespace {ns}, then `kubectl -n {ns} create secret generic {secret}`, "
                              f"then `kubectl apply -k`")
        # ConfigMaps: generated by the render, or created by the kustomization's comment.
        generated = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
        for volume in volumes:
            config_map = volume.get("configMap", {}).get("name")
            commands = secret_commands + open(os.path.join(tree, "kustomization.yaml")).read()
            if config_map and config_map not in generated and not re.search(
                    rf"-n {re.escape(ns)} create configmap {re.escape(config_map)}\b", commands):
                problem(tree, f"{name} uses ConfigMap {config_map}, which neither the render nor "
                              f"the kustomization's comment creates")
        # Pods of the node cache's users run where the cache is.
        uses_cache = any(v.get("hostPath", {}).get("path") in node_cache_paths for v in volumes) or any(
            v.get("csi", {}).get("driver") == CSI_DRIVER for v in volumes)
        if uses_cache and doc["kind"] != "DaemonSet" and not (
                cache_nodes and cache_nodes.items() <= pod.get("nodeSelector", {}).items()):
            problem(tree, f"{name} uses the node cache but does not select the DaemonSet's nodes "
                          f"(nodeSelector {cache_nodes})")
        # Pod Security: hostPath only in privileged (or unlabelled) namespaces.
        if enforced.get(ns) in ("baseline", "restricted") and any("hostPath" in v for v in volumes):
            problem(tree, f"{name}: hostPath volume in namespace {ns}, which enforces {enforced[ns]}")
        if enforced.get(ns) != "restricted":
            continue
        restricted_pods += 1
        pod_ctx = pod.get("securityContext", {})
        for volume in volumes:
            kinds = set(volume) - {"name"}
            if not kinds <= ALLOWED_VOLUMES:
                problem(tree, f"Restricted profile: {name}: volume {volume['name']} is {sorted(kinds)}")
            if volume.get("csi", {}).get("driver") == CSI_DRIVER and volume["csi"].get("readOnly") is True:
                csi_readers[tree] = csi_readers.get(tree, 0) + 1
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.get(key):
                problem(tree, f"Restricted profile: {name}: {key}")
        for c in containers(pod):
            ctx = c.get("securityContext", {})
            where = f"Restricted profile: {name} container {c['name']}"
            if ctx.get("privileged"):
                problem(tree, f"{where}: privileged")
            if ctx.get("allowPrivilegeEscalation") is not False:
                problem(tree, f"{where}: allowPrivilegeEscalation is not false")
            if "ALL" not in ctx.get("capabilities", {}).get("drop", []):
                problem(tree, f"{where}: capabilities not dropped (ALL)")
            if set(ctx.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
                problem(tree, f"{where}: adds capabilities")
            if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
                problem(tree, f"{where}: runAsNonRoot is not true")
            if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
                problem(tree, f"{where}: runs as uid 0")
            seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                problem(tree, f"{where}: seccomp profile {seccomp}")
            if any("hostPort" in p for p in c.get("ports", [])):
                problem(tree, f"{where}: hostPort")
if "examples/csi-job" in renders and not csi_readers.get("examples/csi-job"):
    problem("examples/csi-job", "no pod of a restricted namespace reads a read-only "
                                f"{CSI_DRIVER} csi volume")
# overlays/io-uring gives the daemon the io_uring profile.
for doc in renders.get("overlays/io-uring", []):
    if doc["kind"] == "DaemonSet" and doc["metadata"]["name"] == "hydrator":
        daemon = doc["spec"]["template"]["spec"]["containers"][0]
        if daemon.get("securityContext", {}).get("seccompProfile", {}).get("localhostProfile") != PROFILE:
            problem("overlays/io-uring", f"the daemon's container has no Localhost profile {PROFILE}")
for p in problems:
    print(f"k8s/validate.sh: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"k8s/validate.sh: {len(renders)} trees each create the namespaces they use; "
      f"{restricted_pods} pods in restricted namespaces meet the Restricted profile; "
      f"the cache's users select {cache_nodes}")
PY
echo "k8s/validate.sh: every manifest is valid against Kubernetes $KUBERNETES_VERSION"
