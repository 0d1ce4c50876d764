#!/usr/bin/env bash
# Renders every Kustomize tree under k8s/ and validates each resource against the Kubernetes
# schemas with kubernetes-validate (PyPI, installed when missing), strictly: unknown fields are
# errors. The ServiceMonitor is a Prometheus Operator custom resource, whose schema is not
# bundled: it is reported and rendered, not schema-checked.
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
echo "k8s/validate.sh: every manifest is valid against Kubernetes $KUBERNETES_VERSION"
