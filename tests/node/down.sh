#!/usr/bin/env bash
# Removes the real node (tests/node/up.sh), also run by make cluster-down:
# the Node and the `kubernetes` EndpointSlice when the plane still answers,
# then the kubelet and kube-proxy (TERM), then every process of the node at
# once (its init is killed: the kernel kills the rest of its pid namespace,
# runc's shims and the pods included), the machine's end of the API bridge,
# and the node's cgroups. Its mounts and network namespace go with its last
# process. Then it checks, and says, that nothing is left: no process in the
# node's namespaces, no mount, no cgroup, no process naming the node's
# directory; exit 1 naming what is left otherwise. Logs are kept in
# .cluster/logs/real-1/. Running it with no node is fine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/lib.sh
source "$here/../cluster/lib.sh"
# shellcheck source=lib.sh
source "$here/lib.sh"

if [ ! -d "$NODE_DIR" ] && ! compgen -G "$PIDS/real-node-*.pid" >/dev/null; then
  exit 0
fi
[ "$(id -u)" -eq 0 ] || die "removing the real node needs root (its cgroups); run as root"
pid_ns="" net_ns="" mnt_ns=""
if [ -f "$NODE_STATE" ]; then
  pid_ns="$(sed -n 's/^NODE_PID_NS=//p' "$NODE_STATE")"
  net_ns="$(sed -n 's/^NODE_NET_NS=//p' "$NODE_STATE")"
  mnt_ns="$(sed -n 's/^NODE_MNT_NS=//p' "$NODE_STATE")"
fi

# ---- the Node object and our endpoint, while the plane answers
# shellcheck disable=SC1090
[ ! -f "$STATE_FILE" ] || source "$STATE_FILE"
if [ -n "${API_PORT:-}" ] && [ -x "$CLUSTER_DIR/bin/kubectl" ] && apiserver_ready 2>/dev/null; then
  kc delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kc delete endpointslice kubernetes -n default --ignore-not-found --wait=false >/dev/null 2>&1 || true
fi

# ---- the agents first (the kubelet stops its pod workers), then everything
stop_pid() { # NAME: TERM, then KILL after 10 s
  local pid
  pid="$(pid_of "$1")" || return 0
  log "stopping $1 (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do is_ours "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
stop_pid kube-proxy
stop_pid kubelet
if init="$(node_init_pid)"; then
  log "stopping every process of the node (init pid $init: the kernel ends its pid namespace)"
  kill -KILL "$init" 2>/dev/null || true
fi
stop_pid real-node-init # unshare, waiting for its init
stop_pid real-node-api-bridge
stop_pid real-node-egress-tcp
if [ -n "$pid_ns" ]; then
  deadline=$((SECONDS + 15))
  while [ -n "$(node_processes "$pid_ns")" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
fi
rm -f "$PIDS"/real-node-*.pid "$PIDS"/{containerd,kubelet,kube-proxy}.pid

# ---- cgroups: empty now; removed leaves first
deadline=$((SECONDS + 15))
while [ -n "$(node_cgroup_dirs)" ] && [ "$SECONDS" -lt "$deadline" ]; do
  for d in $(node_cgroup_dirs); do
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  [ -z "$(node_cgroup_dirs)" ] || sleep 0.2
done
rmdir /var/lib/cni 2>/dev/null || true # made by up.sh as a mount point; only if empty

# ---- nothing left?
left=()
if [ -n "$pid_ns" ]; then
  p="$(node_processes "$pid_ns" | tr '\n' ' ')"
  [ -z "$p" ] || left+=("processes in the node's pid namespace: $p")
fi
for ns in "$net_ns" "$mnt_ns"; do
  [ -n "$ns" ] || continue
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/ns/${ns%%:*}" 2>/dev/null)" = "$ns" ]; then
      left+=("process ${p#/proc/} still in the node's ${ns%%:*} namespace $ns")
    fi
  done
done
m="$(grep -F -- "$NODE_DIR" /proc/self/mountinfo || true)"
[ -z "$m" ] || left+=("mounts under $NODE_DIR: $m")
c="$(node_cgroup_dirs | tr '\n' ' ')"
[ -z "$c" ] || left+=("cgroups: $c")
for p in /proc/[0-9]*; do
  cmd="$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)" || continue
  [[ "$cmd" == *"$NODE_DIR/"* || "$cmd" == *"$NODE_SOCKETS/"* ]] && left+=("process ${p#/proc/}: $cmd")
done
if [ ${#left[@]} -gt 0 ]; then
  printf '[real-node] ERROR: left behind by the real node %s:\n' "$NODE_NAME" >&2
  printf '  %s\n' "${left[@]}" >&2
  exit 1
fi
rm -rf "${NODE_DIR:?}" "$NODE_API_SOCKET" "$EGRESS_SOCKET"
log "real node $NODE_NAME removed: no process, mount, namespace or cgroup left (logs kept in $NODE_LOGS)"
