#!/usr/bin/env bash
# `make real-node`: one real node, real-1, joined to the local plane beside
# the kwok nodes: containerd (Debian's, with runc and the CNI plugins), the
# kubelet and kube-proxy (built from the plane's k8s.io/kubernetes module,
# cached), the pause image built here, and our images imported from
# target/images/. The namespaces and the sockets that join it to the machine
# are described in tests/node/lib.sh.
#
# Idempotent: a node whose every process is alive and whose Node is Ready is
# reused. Needs root (namespaces, cgroups, mounts) and a running plane (make
# cluster-up). tests/node/down.sh (also run by make cluster-down) removes it.
#
# Environment: NODE_TIMEOUT (s for the Node to become Ready, default 120).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/lib.sh
source "$here/../cluster/lib.sh"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=lib.sh
source "$here/lib.sh"

t_start=$SECONDS
NODE_TIMEOUT="${NODE_TIMEOUT:-120}"
[ "$(id -u)" -eq 0 ] ||
  die "the real node needs root (network, mount and pid namespaces, cgroups); run make real-node as root"
fix_no_proxy
for c in containerd:containerd ctr:containerd runc:runc socat:socat iptables:iptables \
  conntrack:conntrack ip:iproute2 nsenter:util-linux unshare:util-linux; do
  need_cmd "${c%%:*}" "${c#*:}"
done
[ -x /usr/lib/cni/bridge ] || need_cmd /usr/lib/cni/bridge containernetworking-plugins

# ---- the plane must be up (its API server carries the node's flags)
[ -f "$STATE_FILE" ] || die "no local plane is running: make cluster-up first"
# shellcheck disable=SC1090
source "$STATE_FILE"
apiserver_ready || die "the local plane's API server (https://127.0.0.1:$API_PORT) is not ready: make cluster-up"
grep -q -- "--egress-selector-config-file" "$PIDS/kube-apiserver.cmd" ||
  die "the running plane predates the real node (its API server has no egress selector): make cluster-down && make cluster-up"

# ---- binaries: built and cached (tests/node/build.sh), plus our connect-proxy
eval "$("$here/build.sh")"
log "building connect-proxy (tests/tools)"
cargo build -q --locked -p nmo-tools --bin connect-proxy
CONNECT_PROXY="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/connect-proxy"
images="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/images"
case "$(uname -m)" in x86_64) platform=linux/amd64 ;; aarch64 | arm64) platform=linux/arm64 ;; *) platform="linux/$(uname -m)" ;; esac
# Built from the tree every time (cargo builds only what changed), so the
# node never runs images older than the code being tested; make test built
# them already (NMO_DEPLOY_SKIP_IMAGES=1), as may a developer who wants
# target/images as they are.
if [ -n "${NMO_DEPLOY_SKIP_IMAGES:-}" ] && [ -f "$images/nmo-controller.oci.tar" ] && [ -f "$images/nmo-webhook.oci.tar" ]; then
  log "NMO_DEPLOY_SKIP_IMAGES set: importing $images as they are (not rebuilt)"
else
  log "building the images for $platform from this tree (make images, IMAGE_PLATFORMS=$platform)"
  IMAGE_PLATFORMS="$platform" bash "$REPO_ROOT/tests/release/images.sh" >/dev/null ||
    die "make images (bash tests/release/images.sh) failed (see above)"
fi

exec 9>"$CLUSTER_DIR/.node.lock"
flock 9

node_healthy() {
  node_init_pid >/dev/null || return 1
  local c
  for c in "${NODE_COMPONENTS[@]:1}"; do pid_of "$c" >/dev/null || return 1; done
  [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
if node_healthy; then
  log "reusing the running real node $NODE_NAME"
  echo "real node $NODE_NAME ready in $((SECONDS - t_start)) s (reused the running one)"
  exit 0
fi
if [ -d "$NODE_DIR" ] || compgen -G "$PIDS/real-node-*.pid" >/dev/null; then
  log "a previous real node is incomplete; removing it first"
  "$here/down.sh"
fi

starting=1
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$starting" = 1 ]; then
    log "up failed; removing what it started (logs kept in $NODE_LOGS)"
    "$here/down.sh" >&2 || true
  fi
}
trap on_exit EXIT

mkdir -p "$NODE_DIR/bin" "$NODE_DIR/cni" "$NODE_SOCKETS" "$NODE_LOGS/pods" "$PIDS"
# The node's binaries run from $NODE_DIR/bin, so their command lines name this
# clone's state (pid_of / is_ours tell them from anyone else's).
for b in "$KUBELET" "$KUBE_PROXY" "$CRICTL" "$PAUSE" "$CONNECT_PROXY"; do
  cp "$b" "$NODE_DIR/bin/"
done

# ---- identities: the kubelet (group system:nodes) and kube-proxy, signed by
# the plane's CA (in its pki/, named after the node)
issue "$NODE_NAME-kubelet" "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
issue "$NODE_NAME-kube-proxy" "/CN=system:kube-proxy" clientAuth
chmod 600 "$PKI/$NODE_NAME"-*.key
write_kubeconfig "$NODE_DIR/kubelet.kubeconfig" "$NODE_NAME-kubelet"
write_kubeconfig "$NODE_DIR/kube-proxy.kubeconfig" "$NODE_NAME-kube-proxy"

# started_child NAME WRAPPER [EXE]: the pid of the process that component
# NAME's WRAPPER (unshare, nsenter: it forks into the namespaces and waits)
# started, once WRAPPER runs and, given EXE, once that child has exec'd EXE.
started_child() {
  local name=$1 wrapper=$2 exe=${3:-} outer child deadline=$((SECONDS + 10))
  outer="$(cat "$PIDS/$name.pid")"
  while :; do
    child="$(cat "/proc/$outer/task/$outer/children" 2>/dev/null || true)"
    child="${child%% *}"
    if [ -n "$child" ] && [ "$(cat "/proc/$outer/comm" 2>/dev/null)" = "$wrapper" ] &&
      { [ -z "$exe" ] || [ "$(readlink "/proc/$child/exe" 2>/dev/null)" = "$exe" ]; }; then
      echo "$child"
      return 0
    fi
    [ -d "/proc/$outer" ] || component_failed "$name" "exited at once"
    [ "$SECONDS" -lt "$deadline" ] || component_failed "$name" "did not start within 10 s"
    sleep 0.05
  done
}

# ---- the node's namespaces: init = pause as pid 1
log "creating the node's pid, mount and network namespaces (init: pause)"
start_component real-node-init unshare --pid --fork --mount --net --mount-proc \
  --propagation private --kill-child -- "$NODE_DIR/bin/pause"
# The init's pid once pause runs (unshare has mounted the new /proc by then).
init="$(started_child real-node-init unshare "$NODE_DIR/bin/pause")"
cat >"$NODE_STATE" <<EOF
# written by tests/node/up.sh; read by down.sh and the tests
NODE_NAME=$NODE_NAME
NODE_INIT_PID=$init
NODE_PID_NS=$(readlink "/proc/$init/ns/pid")
NODE_NET_NS=$(readlink "/proc/$init/ns/net")
NODE_MNT_NS=$(readlink "/proc/$init/ns/mnt")
NODE_IP=$NODE_IP
NODE_CGROUP_ROOT=$NODE_CGROUP_ROOT
CONTAINERD_SOCKET=$CONTAINERD_SOCKET
CRICTL=$NODE_DIR/bin/crictl
EOF

# Inside: tmpfs over the runtime's scratch directories (they go with the
# namespace), the sysctls the kubelet insists on shown to it with the values
# it wants (so it never writes the machine's kernel.panic, panic_on_oops and
# overcommit settings: kernel-wide, not per namespace), loopback, the node's
# address and the per-namespace network sysctls a bridge and kube-proxy need.
mkdir -p /var/lib/cni
in_node bash -euo pipefail -c '
  node_dir=$1 node_ip=$2
  mount -t tmpfs -o mode=755 nmo-run /run
  mount -t tmpfs -o mode=755 nmo-cni /var/lib/cni
  mount -t tmpfs -o mode=755 nmo-log /var/log
  mkdir -p "$node_dir/sysctl"
  for kv in kernel/panic=10 kernel/panic_on_oops=1 vm/overcommit_memory=1 vm/panic_on_oom=0 \
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
    key=${kv%%=*} want=${kv#*=}
    [ "$(cat /proc/sys/$key)" = "$want" ] && continue
    f="$node_dir/sysctl/${key//\//.}"
    echo "$want" >"$f"
    mount --bind -o ro "$f" "/proc/sys/$key"
  done
  ip link set lo up
  # The node address sits on one end of a veth pair whose other end leads
  # nowhere (this kernel has no dummy device): the default route points there,
  # so a ClusterIP has a route before kube-proxy rewrites it, and anything
  # else is dropped inside the namespace.
  ip link add real0 type veth peer name real0-end
  ip addr add "$node_ip/32" dev real0
  ip link set real0 up
  ip link set real0-end up
  ip route add default dev real0
  echo 1 >/proc/sys/net/ipv4/ip_forward
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
' node-setup "$NODE_DIR" "$NODE_IP"

# node_start NAME CMD...: CMD inside the node, detached like every component.
# nsenter forks CMD into the pid namespace and waits for it without passing
# signals on, so the pid file is switched to CMD's own process.
node_start() {
  local name=$1 child
  shift
  start_component "$name" nsenter --target "$init" --pid --mount --net -- "$@"
  child="$(started_child "$name" nsenter)"
  echo "$child" >"$PIDS/$name.pid"
}
# wait_for WHAT TIMEOUT CMD...: CMD succeeds within TIMEOUT s, else die with WHAT.
wait_for() {
  local what=$1 timeout=$2 deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what within $timeout s"
    sleep 0.2
  done
}

# ---- sockets to the machine: the API server in, the egress out
rm -f "$NODE_API_SOCKET" "$EGRESS_SOCKET"
start_component real-node-api-bridge socat \
  "UNIX-LISTEN:$NODE_API_SOCKET,fork,mode=600" "TCP:127.0.0.1:$API_PORT"
wait_for "the API bridge socket $NODE_API_SOCKET did not appear (log: $LOGS/real-node-api-bridge.log)" 10 \
  test -S "$NODE_API_SOCKET"
node_start real-node-api-inner socat "TCP-LISTEN:$API_PORT,fork,reuseaddr" "UNIX-CONNECT:$NODE_API_SOCKET"
wait_for "the API server was not reachable from inside the node (logs: $LOGS/real-node-api-*.log)" 10 \
  in_node curl -sk --max-time 2 "https://$NODE_IP:$API_PORT/readyz"
node_start real-node-egress "$NODE_DIR/bin/connect-proxy" --listen "$EGRESS_SOCKET"
wait_for "the egress socket $EGRESS_SOCKET did not appear (log: $LOGS/real-node-egress.log)" 10 \
  test -S "$EGRESS_SOCKET"
# Its loopback end, for Prometheus (proxy_url speaks TCP only).
egress_port=23128
while (exec 3<>"/dev/tcp/127.0.0.1/$egress_port") 2>/dev/null; do egress_port=$((egress_port + 1)); done
start_component real-node-egress-tcp socat \
  "TCP-LISTEN:$egress_port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$EGRESS_SOCKET"
echo "EGRESS_PROXY_URL=http://127.0.0.1:$egress_port" >>"$NODE_STATE"

# ---- cgroups: the node's root in every hierarchy (cpuset needs its cpus and mems)
for h in /sys/fs/cgroup/*/; do
  [ -f "$h/cgroup.procs" ] || continue
  mkdir -p "$h${NODE_CGROUP_ROOT#/}"
  if [ -f "$h/cpuset.cpus" ]; then
    cat "$h/cpuset.cpus" >"$h${NODE_CGROUP_ROOT#/}/cpuset.cpus"
    cat "$h/cpuset.mems" >"$h${NODE_CGROUP_ROOT#/}/cpuset.mems"
  fi
done

# ---- containerd and the pod network
cat >"$NODE_DIR/cni/10-nmo-real.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "nmo-real",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }],
        "dataDir": "/var/lib/cni/networks"
      }
    }
  ]
}
EOF
cat >"$NODE_DIR/containerd.toml" <<EOF
# The real node's containerd (tests/node/up.sh).
version = 2
root = "$NODE_DIR/containerd/root"
state = "$NODE_DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCKET"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: a pod's oom_score_adj may not go below containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni"
EOF
node_start containerd containerd --config "$NODE_DIR/containerd.toml"
ctr_() { ctr --address "$CONTAINERD_SOCKET" --namespace k8s.io "$@"; }
wait_for "containerd did not answer on $CONTAINERD_SOCKET (log: $LOGS/containerd.log)" 30 ctr_ version

# ---- images: pause (built here) and ours (make images), never pulled
pause_ctx="$NODE_DIR/pause-image"
mkdir -p "$pause_ctx"
cp "$PAUSE" "$pause_ctx/pause"
cargo build -q --locked -p nmo-tools --bin oci-image
"${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/oci-image" --containerfile "$here/Containerfile.pause" \
  --context "$pause_ctx" --platform-of "$platform" --ref "$PAUSE_IMAGE" --created-epoch 0 \
  --out "$NODE_DIR/pause.oci.tar" >/dev/null 2>"$NODE_LOGS/pause-image.log" ||
  die "building the pause image failed (log: $NODE_LOGS/pause-image.log)"
ctr_ images import --platform "$platform" "$NODE_DIR/pause.oci.tar" >/dev/null
for svc in controller webhook; do
  ctr_ images import --platform "$platform" "$images/nmo-$svc.oci.tar" >/dev/null
done
log "images in the node: $(ctr_ images list -q | grep -v '^sha256:' | tr '\n' ' ')"

# ---- the kubelet
cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: $NODE_CGROUP_ROOT
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
failSwapOn: false
# No CAP_SYS_RESOURCE: the kubelet cannot lower its own OOM score.
oomScoreAdj: 0
protectKernelDefaults: false
registerWithTaints:
  - {key: $NODE_LABEL, value: "true", effect: NoSchedule}
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# A mounted Secret's update reaches the pod within syncFrequency (+ the
# watch's delay): 10 s here (the default is 1 min), so a renewal test takes seconds.
syncFrequency: 10s
podLogsDir: $NODE_LOGS/pods
serializeImagePulls: false
maxPods: 30
clusterDomain: cluster.local
EOF
node_start kubelet "$NODE_DIR/bin/kubelet" --config="$NODE_DIR/kubelet.yaml" \
  --kubeconfig="$NODE_DIR/kubelet.kubeconfig" --hostname-override="$NODE_NAME" \
  --node-ip="$NODE_IP" --root-dir="$NODE_DIR/kubelet" --cert-dir="$NODE_DIR/kubelet/pki" \
  --node-labels="$NODE_LABEL=true" --v=1

# ---- kube-proxy (iptables, in the node's namespace)
cat >"$NODE_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE_DIR/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $CLUSTER_CIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# The conntrack table size is the machine's, not the namespace's: left alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
node_start kube-proxy "$NODE_DIR/bin/kube-proxy" --config="$NODE_DIR/kube-proxy.yaml"

# ---- the `kubernetes` Service's endpoint: the node's end of the API bridge
kc apply -f - >/dev/null <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels:
    kubernetes.io/service-name: kubernetes
    endpointslice.kubernetes.io/managed-by: real-node.nmo-rs.medik8s.io
addressType: IPv4
endpoints:
  - addresses: ["$NODE_IP"]
    conditions: {ready: true}
ports:
  - {name: https, port: $API_PORT, protocol: TCP}
EOF

node_ready() {
  [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
deadline=$((SECONDS + NODE_TIMEOUT))
until node_ready; do
  for c in containerd kubelet kube-proxy; do
    pid_of "$c" >/dev/null || component_failed "$c" "exited"
  done
  [ "$SECONDS" -lt "$deadline" ] || die "node $NODE_NAME not Ready within $NODE_TIMEOUT s (kubelet log: $LOGS/kubelet.log): $(kc get node "$NODE_NAME" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.message}; {end}' 2>&1)"
  sleep 0.5
done
starting=0
log "crictl: $NODE_DIR/bin/crictl --runtime-endpoint unix://$CONTAINERD_SOCKET ps"
echo "real node $NODE_NAME ready in $((SECONDS - t_start)) s"
