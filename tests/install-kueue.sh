#!/usr/bin/env bash
# Installs Kueue v0.17.0 for the one-node cluster (tests/cluster), once (each step is skipped
# when its output exists), into ~/.cache/hydrator-tests/kueue-v0.17.0:
# - bin/kueue: Kueue's manager (sigs.k8s.io/kueue/cmd/kueue), a static binary (CGO_ENABLED=0)
#   built by `go install` from the Go module proxy (its go.mod replaces nothing, so no wrapper
#   module is needed);
# - kueue.tar: the image localhost/kueue:v0.17.0, FROM scratch with that binary as /manager
#   (user 65532, as Kueue's own image), built with Podman and saved as a docker-archive that
#   tests/cluster/kueue.sh imports into containerd;
# - manifests.yaml: `kubectl kustomize` of the module's own config/default (CRDs, RBAC, the
#   webhooks, the visibility APIService, the Deployment; its certificates come from Kueue's
#   internal cert management, neither cert-manager nor prometheus-operator is used), with the
#   local image (IfNotPresent, nothing can be pulled), the manager's requests down to
#   100m/128Mi, the API server's address taken from a ConfigMap when there is one (no
#   kube-proxy: the kubernetes Service's IP is not routed to the API server), and without the
#   manager's ConfigMap: tests/cluster/kueue.sh applies its own Configuration
#   (waitForPodsReady, batch/job) before the rest.
# Cold (empty Go build and module caches): 292 s on 2 cores, measured: 287 s the Go build (its
# modules downloaded from the proxy), 3 s the image, 2 s the manifests.
# Prints the time it took.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/cluster/lib.sh"
start=$SECONDS
command -v go >/dev/null || { echo "kueue install: go is not installed" >&2; exit 1; }
[[ -x "$BIN/kubectl" ]] || { echo "kueue install: no kubectl (bash tests/cluster/install.sh)" >&2; exit 1; }
bash "$here/install-podman.sh" >/dev/null
mkdir -p "$KUEUE_DIR/bin"
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

if [[ ! -x "$KUEUE_DIR/bin/kueue" ]]; then
    echo "kueue install: building Kueue $KUEUE_VERSION from the Go module proxy (minutes, once)"
    step=$SECONDS
    CGO_ENABLED=0 GOBIN="$KUEUE_DIR/bin" go install -ldflags "-s -w \
        -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
        "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
    echo "kueue install: manager built in $((SECONDS - step)) s"
fi

if [[ ! -f "$KUEUE_DIR/kueue.tar" ]]; then
    step=$SECONDS
    mkdir "$work/image"
    cp "$KUEUE_DIR/bin/kueue" "$work/image/manager"
    cat >"$work/image/Containerfile" <<'CONTAINERFILE'
FROM scratch
COPY manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
CONTAINERFILE
    podman --storage-driver vfs build --quiet -f "$work/image/Containerfile" -t "$KUEUE_IMAGE" \
        "$work/image" >/dev/null
    podman --storage-driver vfs save --quiet --format docker-archive -o "$KUEUE_DIR/kueue.tar.new" \
        "$KUEUE_IMAGE"
    mv "$KUEUE_DIR/kueue.tar.new" "$KUEUE_DIR/kueue.tar"
    echo "kueue install: image $KUEUE_IMAGE saved in $((SECONDS - step)) s"
fi

if [[ ! -f "$KUEUE_DIR/manifests.yaml" ]]; then
    step=$SECONDS
    module=$(cd "$work" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    [[ -d "$module/config/default" ]] || { echo "kueue install: no config/default in '$module'" >&2; exit 1; }
    # kustomize takes no absolute path to a base: a copy, beside an overlay of its own.
    cp -r "$module/config" "$work/config"
    mkdir "$work/overlay"
    cat >"$work/overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../config/default
images:
  - name: us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue
    newName: ${KUEUE_IMAGE%:*}
    newTag: ${KUEUE_IMAGE##*:}
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: kueue-controller-manager, namespace: kueue-system}
      spec:
        template:
          spec:
            containers:
              - name: manager
                imagePullPolicy: IfNotPresent
                resources:
                  requests: {cpu: 100m, memory: 128Mi}
                # The API server's address, from a ConfigMap tests/cluster/kueue.sh writes
                # (none elsewhere: then the kubernetes Service's, as usual).
                env:
                  - name: KUBERNETES_SERVICE_HOST
                    valueFrom: {configMapKeyRef: {name: kueue-api-server, key: host, optional: true}}
                  - name: KUBERNETES_SERVICE_PORT
                    valueFrom: {configMapKeyRef: {name: kueue-api-server, key: port, optional: true}}
            # The base names it through its ConfigMap, deleted below.
            volumes:
              - name: manager-config
                configMap: {name: kueue-manager-config}
  - patch: |-
      \$patch: delete
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: kueue-manager-config, namespace: kueue-system}
YAML
    "$BIN/kubectl" kustomize "$work/overlay" >"$work/manifests.yaml"
    grep -q "image: $KUEUE_IMAGE\$" "$work/manifests.yaml" \
        || { echo "kueue install: the rendered Deployment does not run $KUEUE_IMAGE" >&2; exit 1; }
    if grep -q '^apiVersion: \(cert-manager.io\|monitoring.coreos.com\)/' "$work/manifests.yaml"; then
        echo "kueue install: the rendered manifests need cert-manager or prometheus-operator" >&2
        exit 1
    fi
    mv "$work/manifests.yaml" "$KUEUE_DIR/manifests.yaml"
    echo "kueue install: manifests rendered from config/default in $((SECONDS - step)) s"
fi
echo "kueue install: ready in $((SECONDS - start)) s ($KUEUE_DIR)"
