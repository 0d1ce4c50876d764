#!/usr/bin/env bash
# Installs what the one-node cluster needs, once (each step is skipped when its output exists):
# - Kubernetes v1.36.3's kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
#   kubectl, built from the Go module proxy in one `go build` through the wrapper module
#   k8s-bins/ (they share the build cache), and etcd v3.6.16 through etcd-bin/; into
#   ~/.cache/hydrator-tests/k8s-v1.36.3/bin. ~25 min on 2 cores, cold.
# - containerd, runc, the CNI plugins and a static busybox from Debian.
# - the pause image (a static C program) and the trainer stand-in (busybox), built with Podman
#   and saved as archives that up.sh imports into containerd, as nothing can be pulled.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start=$SECONDS

packages=()
command -v containerd >/dev/null || packages+=(containerd)
command -v runc >/dev/null || packages+=(runc)
[[ -x /usr/lib/cni/bridge ]] || packages+=(containernetworking-plugins)
[[ -x /bin/busybox ]] && /bin/busybox --help 2>&1 | grep -q static || packages+=(busybox-static)
command -v iptables >/dev/null || packages+=(iptables)
if ((${#packages[@]})); then
    echo "cluster install: ${packages[*]} from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi
bash "$here/../install-podman.sh" >/dev/null

mkdir -p "$BIN" "$IMAGES"
if [[ ! -x "$BIN/kubelet" || ! -x "$BIN/kubectl" || ! -x "$BIN/kube-apiserver" \
      || ! -x "$BIN/kube-controller-manager" || ! -x "$BIN/kube-scheduler" ]]; then
    echo "cluster install: building Kubernetes $K8S_VERSION from the Go module proxy (~25 min, once)"
    step=$SECONDS
    minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
    (cd "$here/k8s-bins" && go build -o "$BIN/" -ldflags "-s -w \
        -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
        -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
        k8s.io/kubernetes/cmd/kubelet)
    echo "cluster install: Kubernetes built in $((SECONDS - step)) s"
fi
if [[ ! -x "$BIN/etcd" ]]; then
    echo "cluster install: building etcd $ETCD_VERSION"
    step=$SECONDS
    (cd "$here/etcd-bin" && go build -o "$BIN/etcd" -ldflags "-s -w" .)
    echo "cluster install: etcd built in $((SECONDS - step)) s"
fi

build_image() { # name tag context-files...
    local name=$1 tag=$2; shift 2
    [[ -f "$IMAGES/$name.tar" ]] && return
    local context
    context=$(mktemp -d)
    cp "$@" "$context/"
    podman --storage-driver vfs build --quiet -f "$here/images/Containerfile.$name" -t "$tag" \
        "$context" >/dev/null
    podman --storage-driver vfs save --quiet --format docker-archive -o "$IMAGES/$name.tar.new" "$tag"
    mv "$IMAGES/$name.tar.new" "$IMAGES/$name.tar"
    rm -rf "$context"
    echo "cluster install: image $tag saved"
}
if [[ ! -f "$IMAGES/pause.tar" ]]; then
    gcc -static -Os -o "$IMAGES/pause" "$here/images/pause.c"
    build_image pause "$PAUSE_IMAGE" "$IMAGES/pause"
fi
build_image trainer "$TRAINER_IMAGE" /bin/busybox
echo "cluster install: ready in $((SECONDS - start)) s ($BIN)"
