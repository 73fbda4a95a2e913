# shellcheck shell=bash disable=SC2034  # (variables are used by the scripts sourcing this)
# The real node's layout, shared by tests/node/up.sh and down.sh. Sourced after
# tests/cluster/lib.sh (CLUSTER_DIR, PIDS, LOGS, log, die, start_component).
#
# The node is one set of namespaces, as kind's node container is one
# container: a pid, mount and network namespace whose init is the static
# pause binary (it reaps what is reparented to it). containerd, the kubelet,
# kube-proxy, the CNI plugins, runc's shims, the pods' sandboxes and the
# bridges' inner ends all run in it, started with nsenter. So:
# - every mount the node makes (overlay root filesystems, Secret volumes'
#   tmpfs, the /run tmpfs) is in its mount namespace only, and goes with it;
# - the pod network (bridge cni0, 10.244.0.0/24), the node's address
#   ($NODE_IP on a veth end) and kube-proxy's iptables rules exist in its
#   network namespace only; the machine's own namespace gets no address, no
#   route and no rule;
# - killing the init kills every process in it (the kernel does, shims too).
# What outlives it on the machine's side is only cgroups (down.sh removes
# them) and files under $NODE_DIR.
#
# The node talks to the machine through unix sockets only (files cross
# namespaces, addresses do not):
#   api.sock     in the node, 0.0.0.0:$API_PORT (so 127.0.0.1:$API_PORT for the
#                kubelet and kube-proxy, $NODE_IP:$API_PORT behind the
#                `kubernetes` Service for pods) -> socat -> api.sock -> socat
#                on the machine -> 127.0.0.1:$API_PORT, the plane's API server
#   egress.sock  the API server's "cluster" egress (tests/cluster/up.sh) ->
#                connect-proxy in the node -> a Service's ClusterIP or the
#                kubelet ($NODE_IP:10250)
#   containerd.sock  crictl and ctr from the machine
# and the egress has a loopback end too, 127.0.0.1:$EGRESS_PROXY_PORT (socat,
# state file EGRESS_PROXY_URL), for a client that speaks CONNECT over TCP
# only: Prometheus scrapes the pods through it (its proxy_url).

log() { printf '[real-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[real-node] ERROR: %s\n' "$*" >&2; exit 1; }

NODE_NAME="${NMO_REAL_NODE_NAME:-real-1}"
NODE_DIR="$CLUSTER_DIR/$NODE_NAME"
NODE_STATE="$NODE_DIR/state.env"
NODE_SOCKETS="$CLUSTER_DIR/sockets"
NODE_API_SOCKET="$NODE_SOCKETS/api.sock"
CONTAINERD_SOCKET="$NODE_DIR/containerd.sock"
NODE_LOGS="$LOGS/$NODE_NAME"
NODE_IP=10.250.0.2
POD_SUBNET=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
# The node's label and taint: only pods that tolerate it and select it land on
# the real node (manifests/overlays/local-images does both); kwok's nodes keep
# every other test's pods.
NODE_LABEL=nmo-rs.medik8s.io/real-node
# Every cgroup of the node's pods hangs below this one, in each hierarchy.
NODE_CGROUP_ROOT="/nmo-rs-$(printf '%s' "$CLUSTER_DIR" | sha256sum | cut -c1-8)-$NODE_NAME"
# The node's processes, in start order: init first (down.sh stops in reverse).
NODE_COMPONENTS=(real-node-init real-node-api-bridge real-node-api-inner real-node-egress real-node-egress-tcp containerd kubelet kube-proxy)

# node_init_pid: the init's pid (pid 1 inside the node), alive and ours.
node_init_pid() {
  local pid
  [ -f "$NODE_STATE" ] || return 1
  pid="$(sed -n 's/^NODE_INIT_PID=//p' "$NODE_STATE")"
  [[ "$pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/ns/pid")" = "$(sed -n 's/^NODE_PID_NS=//p' "$NODE_STATE")" ] || return 1
  echo "$pid"
}

# in_node CMD...: runs CMD inside the node's namespaces (pid, mount, network).
in_node() {
  local init
  init="$(node_init_pid)" || die "the real node $NODE_NAME is not running (make real-node)"
  nsenter --target "$init" --pid --mount --net -- "$@"
}

# node_processes NS: pids of the processes whose pid namespace is NS
# ("pid:[inode]"), the node's init included.
node_processes() {
  local p ns
  for p in /proc/[0-9]*; do
    ns="$(readlink "$p/ns/pid" 2>/dev/null)" || continue
    [ "$ns" = "$1" ] && echo "${p#/proc/}"
  done
  return 0
}

# node_cgroup_dirs: the node's cgroup directories left in any hierarchy.
node_cgroup_dirs() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h${NODE_CGROUP_ROOT#/}" ] && echo "$h${NODE_CGROUP_ROOT#/}"
  done
  return 0
}
