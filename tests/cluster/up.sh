#!/usr/bin/env bash
# Starts a one-node Kubernetes on this machine from the programs install.sh built: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd (Debian's) and a kubelet
# registered as node hydrator-node, pods on a CNI bridge (10.88.0.0/16), the images imported
# into containerd. State, logs and pids in /var/tmp/hydrator-cluster (down.sh removes it);
# kubectl: `source tests/cluster/lib.sh; kube get nodes`. Prints the time it took.
#
# A test rig, not a production control plane: static tokens, the kubelet's API open to the
# API server without client certificates, no kube-proxy and no cluster DNS (pods reach the
# host's MinIO at the bridge's gateway; the API server sends webhooks and aggregated APIs, as
# Kueue's, to their Services' endpoints), no CNI network policy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/lib.sh"
start=$SECONDS
installed || { echo "cluster: not installed (bash tests/cluster/install.sh)" >&2; exit 1; }
if [[ -f "$STATE/pids" ]]; then
    echo "cluster: already up ($STATE); tests/cluster/down.sh first" >&2
    exit 1
fi
mkdir -p "$STATE"/{pki,logs,etcd,containerd} /etc/cni/net.d /var/lib/kubelet
node_ip=$(host_ip)

# Certificates: one CA for the API server's serving certificate, the service account keys.
pki=$STATE/pki
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=hydrator-cluster-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout "$pki/apiserver.key" \
    -out "$pki/apiserver.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n' \
    "$node_ip" >"$pki/san.ext"
openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
# The aggregation layer's client certificate and its CA, which aggregated API servers (Kueue's
# visibility API) trust through kube-system/extension-apiserver-authentication.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=hydrator-front-proxy-ca" \
    -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout "$pki/front-proxy.key" \
    -out "$pki/front-proxy.csr" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' >"$pki/front-proxy.ext"
openssl x509 -req -in "$pki/front-proxy.csr" -CA "$pki/front-proxy-ca.crt" -CAkey "$pki/front-proxy-ca.key" \
    -CAcreateserial -days 2 -extfile "$pki/front-proxy.ext" -out "$pki/front-proxy.crt" 2>/dev/null
admin_token=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
node_token=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
cat >"$pki/tokens.csv" <<TOKENS
$admin_token,admin,admin,system:masters
$node_token,system:node:$NODE,kubelet,system:nodes
TOKENS
kubeconfig() { # file token
    cat >"$1" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
  - name: hydrator
    cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$pki/ca.crt"}
users:
  - name: user
    user: {token: "$2"}
contexts:
  - name: hydrator
    context: {cluster: hydrator, user: user}
current-context: hydrator
KUBECONFIG
}
kubeconfig "$STATE/admin.kubeconfig" "$admin_token"
kubeconfig "$STATE/kubelet.kubeconfig" "$node_token"

launch() { # name command...
    local name=$1; shift
    setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
    echo "$name $!" >>"$STATE/pids"
}

launch etcd "$BIN/etcd" --data-dir "$STATE/etcd" --name hydrator \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "hydrator=http://127.0.0.1:$((ETCD_PORT + 1))"
launch kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --secure-port "$API_PORT" --advertise-address "$node_ip" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --service-cluster-ip-range 10.96.0.0/16 \
    --kubelet-preferred-address-types InternalIP \
    --enable-aggregator-routing=true \
    --requestheader-client-ca-file "$pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy.crt" --proxy-client-key-file "$pki/front-proxy.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key"
wait_for "the API server" 120 kube get --raw /readyz
launch kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$STATE/admin.kubeconfig" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0
launch kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$STATE/admin.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 0

# containerd: its own config (cgroupfs, the local pause image, Debian's CNI plugins).
cat >"$STATE/containerd/config.toml" <<TOML
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # The kubelet asks for OOM scores below containerd's own (-998 for a sandbox), which needs a
  # privilege this machine withholds: runc would fail every pod. Kept at containerd's instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
TOML
cat >/etc/cni/net.d/10-hydrator-bridge.conflist <<JSON
{
  "cniVersion": "1.0.0",
  "name": "hydrator-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$HOST_ON_BRIDGE"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
JSON
launch containerd containerd --config "$STATE/containerd/config.toml"
wait_for containerd 30 ctr --address /run/containerd/containerd.sock version
for archive in "$IMAGES"/*.tar; do
    ctr -n k8s.io images import --all-platforms "$archive" >/dev/null
done

cat >"$STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
resolvConf: /etc/resolv.conf
featureGates:
  CSIVolumeHealth: true
# Volume stats (and so volume health events) every 10 s instead of every minute.
volumeStatsAggPeriod: 10s
# A test machine with little disk to spare must not evict the tests' pods nor remove the
# imported images (nothing can be pulled back).
evictionHard: {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
YAML
launch kubelet "$BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --hostname-override "$NODE" --node-ip "$node_ip" --root-dir /var/lib/kubelet
wait_for "node $NODE Ready" 180 kube wait --for=condition=Ready "node/$NODE" --timeout=1s
kube label node "$NODE" hydrator.dev/cache=true --overwrite >/dev/null
echo "cluster: up in $((SECONDS - start)) s (node $NODE at $node_ip; state in $STATE)"
