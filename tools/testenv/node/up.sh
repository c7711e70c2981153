#!/bin/bash
# node/up.sh: starts a real one-node Kubernetes for tests: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler (built by ../build-kube.sh --node), containerd 1.6 (CRI, runc, cgroupfs), a CNI bridge, the kubelet
# and kube-proxy (iptables). Prints the run directory; $RUN/env.sh holds what tests read; node/down.sh RUN undoes
# everything (processes, mounts, network namespaces, the bridge, iptables chains, sysctls), recorded in $RUN.
# Ports and addresses differ from tools/testenv/up.sh's, so both environments can run at once.
# Why these choices (issue 26): runc and cgroupfs because this kind of machine has cgroup v1 and no systemd;
# restrict_oom_score_adj because root here lacks CAP_SYS_RESOURCE; the API and the kubelet listen on the bridge's
# gateway address only (not 0.0.0.0) so pods reach the API through the `kubernetes` Service and nothing else can.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)

ETCD_PORT=${SR_NODE_ETCD_PORT:-22379}
ETCD_PEER_PORT=${SR_NODE_ETCD_PEER_PORT:-22380}
KUBE_PORT=${SR_NODE_KUBE_PORT:-26443}
KUBELET_PORT=${SR_NODE_KUBELET_PORT:-20250}
KUBELET_HEALTHZ_PORT=${SR_NODE_KUBELET_HEALTHZ_PORT:-20248}
PROXY_METRICS_PORT=${SR_NODE_PROXY_METRICS_PORT:-20249}
PROXY_HEALTHZ_PORT=${SR_NODE_PROXY_HEALTHZ_PORT:-20256}
CM_PORT=${SR_NODE_CM_PORT:-20257}
SCHED_PORT=${SR_NODE_SCHED_PORT:-20259}
BRIDGE=${SR_NODE_BRIDGE:-srnode0}
POD_CIDR=${SR_NODE_POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=${SR_NODE_SERVICE_CIDR:-10.97.0.0/24}
NODE_NAME=${SR_NODE_NAME:-sr-node-1}
# containerd's image store outlives a run (the project's images are imported once per content, see images.sh)
STORE=${SR_NODE_STORE:-/var/lib/sr-gateway-node}
PREFIX=${POD_CIDR%.*}                 # 10.244.0
NODE_IP=$PREFIX.1                     # the bridge's gateway address: the node's InternalIP
SERVICE_IP=${SERVICE_CIDR%.*}.1       # the `kubernetes` Service

"$HERE/../install.sh" --node >&2
BIN=$("$HERE/../build-kube.sh" --node)

[ -e "/sys/class/net/$BRIDGE" ] && { echo "node: bridge $BRIDGE exists (another node running? node/down.sh it)" >&2; exit 1; }
for port in "$ETCD_PORT" "$ETCD_PEER_PORT" "$KUBE_PORT" "$KUBELET_PORT" "$KUBELET_HEALTHZ_PORT" \
            "$PROXY_METRICS_PORT" "$PROXY_HEALTHZ_PORT" "$CM_PORT" "$SCHED_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "node: port $port on 127.0.0.1 is already in use" >&2; exit 1
  fi
done

RUN=$(mktemp -d /tmp/sr-node.XXXXXX)
chmod 700 "$RUN"   # keys and the admin token
: > "$RUN/pids"
echo "$BRIDGE" > "$RUN/bridge"
fail() { echo "node: $*" >&2; "$HERE/down.sh" "$RUN" >&2 || true; exit 1; }
trap 'fail "interrupted"' INT TERM
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$what not ready; see $RUN/*.log"
    sleep 0.5
  done
}
start() {  # start NAME COMMAND...: run in the background, log to $RUN/NAME.log, record the PID for down.sh
  local name=$1; shift
  "$@" >"$RUN/$name.log" 2>&1 &
  echo "$name $!" >> "$RUN/pids"
}

# --- what down.sh must put back: sysctls the kubelet, kube-proxy and the bridge change; the host's state before ---
"$HERE/hoststate.sh" record "$RUN" || fail "could not record the host's state"

# --- certificates: one CA, a certificate per component (the apiserver's Node and RBAC authorizers know them by CN/O) --
mkdir -p "$RUN/certs"
cert() {  # cert NAME SUBJECT EXTENSIONS
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
  printf '%s\n' "$3" > "$1.cnf"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 30 -extfile "$1.cnf"
}
(
  cd "$RUN/certs"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj /CN=sr-node-ca
  cert apiserver /CN=kube-apiserver "subjectAltName=IP:$NODE_IP,IP:$SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
extendedKeyUsage=serverAuth"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME
extendedKeyUsage=serverAuth,clientAuth"
  cert kube-proxy /CN=system:kube-proxy "extendedKeyUsage=clientAuth"
  cert controller-manager /CN=system:kube-controller-manager "extendedKeyUsage=clientAuth"
  cert scheduler /CN=system:kube-scheduler "extendedKeyUsage=clientAuth"
  cert admin "/O=system:masters/CN=sr-node-admin" "extendedKeyUsage=clientAuth"
  openssl genrsa -out sa.key 2048
  openssl rsa -in sa.key -pubout -out sa.pub
) >"$RUN/certs.log" 2>&1 || fail "certificate generation failed"
kubeconfig() {  # kubeconfig NAME: a kubeconfig with the client certificate certs/NAME.crt
  cat > "$RUN/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: node, cluster: {server: "https://$NODE_IP:$KUBE_PORT", certificate-authority: "$RUN/certs/ca.crt"}}]
users: [{name: $1, user: {client-certificate: "$RUN/certs/$1.crt", client-key: "$RUN/certs/$1.key"}}]
contexts: [{name: node, context: {cluster: node, user: $1}}]
current-context: node
KC
}
for c in admin kubelet kube-proxy controller-manager scheduler; do kubeconfig "$c"; done

# --- the bridge first: the API and the kubelet listen on its address; the CNI bridge plugin adopts it ---------------
ip link add "$BRIDGE" type bridge || fail "cannot create bridge $BRIDGE"
ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
ip link set "$BRIDGE" up
# routing for pods and Services (the CNI bridge would turn forwarding on at the first pod anyway), and netfilter on
# bridged traffic so a pod reaching a Service whose pod sits on the same bridge gets its reply de-NATed
sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 >/dev/null || fail "cannot set forwarding"

# --- cluster DNS: no CoreDNS image offline; dnsmasq on the bridge answers the API's in-cluster name (the control
# plane's kubeconfig says https://kubernetes.default.svc) and forwards the rest to the host's resolver -------------
start dns dnsmasq --keep-in-foreground --conf-file=/dev/null --no-hosts --pid-file= --bind-interfaces \
  --listen-address="$NODE_IP" --port=53 --address="/kubernetes.default.svc/$SERVICE_IP" \
  --address="/kubernetes.default.svc.cluster.local/$SERVICE_IP" --log-facility=-

# --- etcd, kube-apiserver ----------------------------------------------------------------------------------------
start etcd etcd --name node --data-dir "$RUN/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "node=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync
wait_for 30 etcd curl -m 1 -sf "http://127.0.0.1:$ETCD_PORT/health"

C=$RUN/certs
start apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port="$KUBE_PORT" --insecure-port=0 \
  --tls-cert-file="$C/apiserver.crt" --tls-private-key-file="$C/apiserver.key" --client-ca-file="$C/ca.crt" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$C/sa.pub" \
  --service-account-signing-key-file="$C/sa.key" --api-audiences=https://kubernetes.default.svc \
  --service-cluster-ip-range="$SERVICE_CIDR" --allow-privileged=false \
  --kubelet-preferred-address-types=InternalIP --kubelet-certificate-authority="$C/ca.crt" \
  --kubelet-client-certificate="$C/apiserver-kubelet-client.crt" --kubelet-client-key="$C/apiserver-kubelet-client.key"
echo "$BIN/kubectl" > "$RUN/kubectl.bin"   # the cluster's own version (v1.20), for down.sh too
KUBECTL=("$BIN/kubectl" --kubeconfig "$RUN/admin.kubeconfig" --request-timeout=20s)
wait_for 90 kube-apiserver "${KUBECTL[@]}" get --raw /readyz

start controller-manager "$BIN/kube-controller-manager" --kubeconfig="$RUN/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$CM_PORT" --port=0 --leader-elect=false \
  --use-service-account-credentials=true --service-account-private-key-file="$C/sa.key" --root-ca-file="$C/ca.crt" \
  --allocate-node-cidrs=false --controllers='*,-nodeipam,-cloud-node-lifecycle'
start scheduler "$BIN/kube-scheduler" --kubeconfig="$RUN/scheduler.kubeconfig" \
  --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --port=0 --leader-elect=false

# --- containerd: its own socket and state in RUN; images in STORE ----------------------------------------------------
mkdir -p "$RUN/containerd" "$RUN/cni" "$STORE/containerd"
cat > "$RUN/containerd/config.toml" <<TOML
version = 2
root = "$STORE/containerd"
state = "$RUN/containerd/state"
[grpc]
  address = "$RUN/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/sr-node-pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$RUN/cni"
TOML
cat > "$RUN/cni/10-srnode.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "srnode", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$RUN/cni-ipam", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
JSON
echo "$RUN/containerd/containerd.sock" > "$RUN/containerd.sock"
start containerd containerd --config "$RUN/containerd/config.toml"
CTR=(ctr --address "$RUN/containerd/containerd.sock" -n k8s.io)
wait_for 30 containerd "${CTR[@]}" version
"$HERE/images.sh" "$RUN" pause busybox >"$RUN/images.log" 2>&1 || { tail -20 "$RUN/images.log" >&2; fail "images"; }

# --- kubelet --------------------------------------------------------------------------------------------------------
cat > "$RUN/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $C/kubelet.crt
tlsPrivateKeyFile: $C/kubelet.key
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $C/ca.crt}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
clusterDomain: cluster.local
clusterDNS: [$NODE_IP]
resolvConf: /etc/resolv.conf
maxPods: 40
serializeImagePulls: false
# the node's disk is shared with the build caches: evict on nothing but real exhaustion, never collect our images
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
start kubelet "$BIN/kubelet" --config="$RUN/kubelet.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
  --container-runtime=remote --container-runtime-endpoint="unix://$RUN/containerd/containerd.sock" \
  --pod-infra-container-image=localhost/sr-node-pause:1 --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet-pki" \
  --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" --v=1
wait_for 120 "kubelet (node $NODE_NAME Ready)" \
  "${KUBECTL[@]}" wait --for=condition=Ready --timeout=2s "node/$NODE_NAME"

# --- kube-proxy (iptables): Services route to pods, from the host and from pods ----------------------------------
cat > "$RUN/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $RUN/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
# leave the host's conntrack limits alone
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
echo "$BIN/kube-proxy --config=$RUN/kube-proxy.yaml" > "$RUN/kube-proxy.cmd"
start kube-proxy "$BIN/kube-proxy" --config="$RUN/kube-proxy.yaml"
wait_for 60 kube-proxy curl -m 1 -sf "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz"
# the default ServiceAccount exists once the controller-manager runs: pods can be created from here on
wait_for 60 "default ServiceAccount" "${KUBECTL[@]}" -n default get serviceaccount default

trap - INT TERM
cat > "$RUN/env.sh" <<ENV
export SR_NODE_DIR=$RUN
export KUBECONFIG=$RUN/admin.kubeconfig
export SR_NODE_KUBECTL=$BIN/kubectl
export SR_NODE_NAME=$NODE_NAME
export SR_NODE_IP=$NODE_IP
export SR_NODE_CONTAINERD=$RUN/containerd/containerd.sock
ENV
echo "$RUN"
