#!/usr/bin/env bash
# Starts a real Kubernetes control plane on 127.0.0.1 as plain background
# processes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) plus
# kwok as the fake kubelet of every node, then creates the default node topology.
#
#   tests/cluster/up.sh                       # 3 control-plane + 3 worker nodes
#   CONTROL_PLANES=1 WORKERS=5 tests/cluster/up.sh
#
# Afterwards: `source .cluster/env` (KUBECONFIG + kubectl on PATH), or
# `.cluster/bin/kubectl --kubeconfig .cluster/kubeconfig get nodes`.
#
# Idempotent: a healthy running plane (every pid alive, /readyz ok, same binaries)
# is reused (only missing topology nodes are created). A partly dead one is stopped
# and replaced by a fresh one. The processes outlive this script (setsid + nohup);
# tests/cluster/down.sh stops them.
#
# Ports: the first free port at or above each base, so two clones can run side by
# side. Bases (override with the env variable in brackets):
#   etcd client 22379 [NMO_ETCD_PORT], etcd peer 22380 [NMO_ETCD_PEER_PORT],
#   kube-apiserver 26443 [NMO_API_PORT], kube-controller-manager 20257 [NMO_KCM_PORT],
#   kube-scheduler 20259 [NMO_SCHED_PORT], kwok health 20247 [NMO_KWOK_PORT].
# All are below the Linux ephemeral range (32768+) so outgoing connections cannot
# grab them between the check and the start. The chosen ones are in .cluster/state.env.
#
# Other knobs: COMPONENT_TIMEOUT (s per component, default 120), NODE_TIMEOUT
# (default 120), NMO_CLUSTER_DIR (state dir, default <repo>/.cluster),
# PLANE_PROFILE (default, or scale: see below). A running plane of another
# profile is replaced.
#
# PLANE_PROFILE=scale tunes the plane for 1,000 fake nodes on two cores (the
# scale bench, tests/bench-scale.sh):
# - kube-controller-manager and kube-scheduler may send 500 requests/s (burst
#   1000): at their defaults (20 and 50) creating and placing 30,000 pods
#   takes over half an hour;
# - kwok renews each node's Lease every 60 s (nodeLeaseDurationSeconds 240; a
#   kubelet renews every 10 s) and plays stages with 16 workers: at 10 s,
#   1,000 nodes are 100 renewals/s, kwok falls behind, and it leaves alone the
#   pods of every node whose Lease it no longer holds (they never get Ready);
# - so the node lifecycle controller waits 360 s for a heartbeat before it
#   marks a node NotReady.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

t_start=$SECONDS
CONTROL_PLANES="${CONTROL_PLANES:-3}"
WORKERS="${WORKERS:-3}"
COMPONENT_TIMEOUT="${COMPONENT_TIMEOUT:-120}"
NODE_TIMEOUT="${NODE_TIMEOUT:-120}"
SERVICE_CIDR="10.96.0.0/12"
SERVICE_API_IP="10.96.0.1" # first address of SERVICE_CIDR: the 'kubernetes' Service
[[ "$CONTROL_PLANES" =~ ^[0-9]+$ && "$WORKERS" =~ ^[0-9]+$ ]] ||
  die "CONTROL_PLANES and WORKERS must be non-negative integers (got '$CONTROL_PLANES', '$WORKERS')"
PLANE_PROFILE="${PLANE_PROFILE:-default}"
KCM_TUNING=() SCHED_TUNING=() KWOK_TUNING=()
KWOK_CONFIG="$CLUSTER_LIB_DIR/kwok.yaml"
case "$PLANE_PROFILE" in
  default) ;;
  scale)
    KCM_TUNING=(--kube-api-qps=500 --kube-api-burst=1000 --node-monitor-grace-period=360s)
    SCHED_TUNING=(--kube-api-qps=500 --kube-api-burst=1000)
    KWOK_TUNING=(--node-lease-duration-seconds=240)
    # Written again on every fresh start (fresh_start), from kwok.yaml.
    KWOK_CONFIG="$CLUSTER_DIR/kwok-scale.yaml"
    ;;
  *) die "PLANE_PROFILE must be 'default' or 'scale', got '$PLANE_PROFILE'" ;;
esac

fix_no_proxy
need_cmd curl curl
need_cmd openssl openssl
need_cmd setsid util-linux
need_cmd flock util-linux

# ---- binaries (cached; a cold build takes minutes and prints its own progress)
BIN="$("$CLUSTER_LIB_DIR/build.sh" | tail -n 1)"
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
  [ -x "$BIN/$b" ] || die "build.sh returned '$BIN' but $b is not there"
done

mkdir -p "$CLUSTER_DIR"
# One up/down at a time per state dir (e.g. `make test` and `make demo` in parallel).
exec 9>"$CLUSTER_DIR/.lock"
flock 9

# ---- audit log of the operator's ServiceAccounts
# The API server writes every request of nmo-system's nmo-controller and
# nmo-webhook at Metadata level (who, verb, resource, namespace, name, response
# code; no bodies), nothing of anyone else (tests/cluster/audit-policy.yaml), as
# JSON lines to $AUDIT_DIR/audit.log (rotated at 100 MB into audit-<time>.log).
# After the integration tests, tests/tools/src/bin/rbac-audit.rs compares them with
# the manifests' RBAC (tests/run-tests.sh). OwnerReferencesPermissionEnforcement
# (on in OpenShift) makes the RBAC behind ownerReference changes part of what
# the tests prove. A plane started without these flags or with another policy
# is replaced (once) by a fresh one.
AUDIT_DIR="$CLUSTER_DIR/audit"
AUDIT_POLICY="$AUDIT_DIR/policy.yaml"
APISERVER_AUDIT_FLAGS=(
  --audit-policy-file="$AUDIT_POLICY"
  --audit-log-path="$AUDIT_DIR/audit.log"
  --audit-log-format=json
  --audit-log-maxsize=100
  --audit-log-maxbackup=3
  --enable-admission-plugins=OwnerReferencesPermissionEnforcement
)
# ---- the real node's way in (tests/node/up.sh, make real-node)
# The API server reaches a node's kubelet (logs, exec) and a webhook named by
# its Service (clientConfig.service: the Service's ClusterIP) through the
# "cluster" egress: an HTTP CONNECT proxy on a unix socket, served from inside
# the real node's network namespace, where those addresses exist. Nothing
# here dials a pod, node or Service address from the machine's own network
# namespace; with no real node up, such calls fail at the socket. Webhooks
# given by URL (the tests' 127.0.0.1 ones) are "controlplane" traffic: direct.
EGRESS_CONFIG="$CLUSTER_DIR/egress-selector.yaml"
APISERVER_NODE_FLAGS=(
  --egress-selector-config-file="$EGRESS_CONFIG"
  --kubelet-client-certificate="$PKI/kube-apiserver-kubelet-client.crt"
  --kubelet-client-key="$PKI/kube-apiserver-kubelet-client.key"
  # The node's address, not its name: nothing resolves real-1.
  --kubelet-preferred-address-types=InternalIP
)
write_egress_config() {
  mkdir -p "$(dirname "$EGRESS_SOCKET")"
  cat >"$EGRESS_CONFIG" <<EOF
apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: $EGRESS_SOCKET
EOF
}

# audit_config_current: the running API server got every flag above (audit
# and the real node's) and read the policy that tests/cluster/audit-policy.yaml is now.
audit_config_current() {
  local cmd f
  cmd="$(cat "$PIDS/kube-apiserver.cmd" 2>/dev/null)" || return 1
  for f in "${APISERVER_AUDIT_FLAGS[@]}" "${APISERVER_NODE_FLAGS[@]}"; do
    [[ " $cmd " == *" $(printf '%q' "$f") "* ]] || return 1
  done
  [ -f "$EGRESS_CONFIG" ] || return 1
  cmp -s "$CLUSTER_LIB_DIR/audit-policy.yaml" "$AUDIT_POLICY"
}
# install_audit_policy: the API server reads its own copy, so editing the
# source shows up as a changed configuration (audit_config_current).
install_audit_policy() {
  mkdir -p "$AUDIT_DIR"
  cp "$CLUSTER_LIB_DIR/audit-policy.yaml" "$AUDIT_POLICY"
}

# ---- the API server's own /etc/hosts
# A webhook configuration that names a Service (nmo-webhook-service.nmo-system.svc)
# is called by the API server at that DNS name when it is given as a URL. The
# API server runs in a mount namespace of its own (root only: unshare needs
# CAP_SYS_ADMIN) with $CLUSTER_DIR/hosts bind-mounted over /etc/hosts, so a
# test can map a Service name to 127.0.0.1 for the API server alone by adding
# a line to that file (in place: the bind mount follows the inode). Nothing
# else on the machine sees those names. As another user the API server reads
# the machine's /etc/hosts and the tests that need a name say so.
HOSTS_FILE="$CLUSTER_DIR/hosts"
APISERVER_WRAP=()
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null; then
  # shellcheck disable=SC2016 # expanded by the inner sh
  APISERVER_WRAP=(unshare --mount --propagation private -- sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$HOSTS_FILE")
fi
# write_hosts: the machine's /etc/hosts, then a marker under which tests add
# their names (tests/companions/lib.sh route_service_name).
write_hosts() {
  { cat /etc/hosts 2>/dev/null; echo "# nmo-rs: names the local API server resolves (tests add lines below)"; } >"$HOSTS_FILE"
}
hosts_config_current() {
  [ ${#APISERVER_WRAP[@]} -eq 0 ] && return 0
  [ -f "$HOSTS_FILE" ] && [[ "$(cat "$PIDS/kube-apiserver.cmd" 2>/dev/null)" == unshare\ * ]]
}

# ---- reuse a healthy plane
plane_healthy() {
  [ -f "$STATE_FILE" ] || return 1
  # shellcheck disable=SC1090
  source "$STATE_FILE"
  if [ "${STATE_BIN:-}" != "$BIN" ]; then
    log "running plane uses other binaries ($STATE_BIN); replacing it"
    return 1
  fi
  local c
  for c in "${COMPONENTS[@]}"; do
    if ! pid_of "$c" >/dev/null; then
      log "$c of the previous plane is not running; replacing the plane"
      return 1
    fi
  done
  [ -x "$CLUSTER_DIR/bin/kubectl" ] && [ -f "$KUBECONFIG_ADMIN" ] || return 1
  apiserver_ready || { log "API server of the previous plane is not ready; replacing the plane"; return 1; }
  hosts_config_current || {
    log "API server of the previous plane does not read $HOSTS_FILE as its /etc/hosts; replacing the plane"
    return 1
  }
  audit_config_current || {
    log "API server of the previous plane lacks the audit log or real-node flags or policy of this up.sh; replacing the plane"
    return 1
  }
  [ "${STATE_PROFILE:-default}" = "$PLANE_PROFILE" ] || {
    log "the running plane has profile '${STATE_PROFILE:-default}', PLANE_PROFILE asks for '$PLANE_PROFILE'; replacing the plane"
    return 1
  }
}

# ---- fresh start helpers
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# pick_port VAR BASE: the first port at or above BASE that is free and not
# picked already in this run, into VAR (no subshell, so `picked` persists).
picked=" "
pick_port() {
  local var=$1 p=$2
  while port_in_use "$p" || [[ "$picked" == *" $p "* ]]; do
    p=$((p + 1))
    [ "$p" -lt $(($2 + 200)) ] || die "no free port in $2..$p"
  done
  picked+="$p "
  printf -v "$var" '%s' "$p"
}

gen_pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -sha256 -days 3650 -subj "/CN=nmo-rs-test-ca" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,digitalSignature,keyCertSign,cRLSign" -out "$PKI/ca.crt"
  # Service-account token signing pair (RSA, as kubeadm makes it).
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
  openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
  issue kube-apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$SERVICE_API_IP"
  # Client identities. The controller manager and scheduler use the names the
  # RBAC bootstrap policy binds; kwok and the admin are in system:masters (kwok
  # writes nodes, leases and pod status, as kwokctl sets it up).
  issue admin "/O=system:masters/CN=nmo-rs-admin" clientAuth
  issue kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
  issue kube-scheduler "/CN=system:kube-scheduler" clientAuth
  issue kwok "/O=system:masters/CN=kwok-controller" clientAuth
  # The API server's identity towards kubelets (logs, exec, port-forward): the
  # real node's kubelet authorizes it by SubjectAccessReview.
  issue kube-apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  chmod 600 "$PKI"/*.key
}

starting=0
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$starting" = 1 ]; then
    log "up.sh failed; stopping the components it started (logs kept in $LOGS)"
    stop_all
  fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

fresh_start() {
  starting=1
  stop_all # leftovers of a partly dead plane, and strays without pid files
  wipe_state
  # keep the previous run's logs one generation, for post-mortems
  if compgen -G "$LOGS/*.log" >/dev/null; then
    rm -rf "$LOGS/previous"
    mkdir -p "$LOGS/previous"
    mv "$LOGS"/*.log "$LOGS/previous/"
  fi
  mkdir -p "$CLUSTER_DIR/data" "$PIDS" "$LOGS" "$CLUSTER_DIR/bin"
  ln -sfn "$BIN/kubectl" "$CLUSTER_DIR/bin/kubectl"

  pick_port ETCD_PORT "${NMO_ETCD_PORT:-22379}"
  pick_port ETCD_PEER_PORT "${NMO_ETCD_PEER_PORT:-22380}"
  pick_port API_PORT "${NMO_API_PORT:-26443}"
  pick_port KCM_PORT "${NMO_KCM_PORT:-20257}"
  pick_port SCHED_PORT "${NMO_SCHED_PORT:-20259}"
  pick_port KWOK_PORT "${NMO_KWOK_PORT:-20247}"
  log "ports: etcd $ETCD_PORT (peer $ETCD_PEER_PORT), kube-apiserver $API_PORT," \
    "kube-controller-manager $KCM_PORT, kube-scheduler $SCHED_PORT, kwok $KWOK_PORT"

  log "generating PKI in $PKI"
  gen_pki
  write_kubeconfig "$KUBECONFIG_ADMIN" admin
  for c in kube-controller-manager kube-scheduler kwok; do
    write_kubeconfig "$PKI/$c.kubeconfig" "$c"
  done

  # --unsafe-no-fsync: throwaway test data; fsync latency dominates on slow disks.
  start_component etcd "$BIN/etcd" --name=nmo-rs --data-dir="$CLUSTER_DIR/data/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="nmo-rs=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level=warn
  wait_healthy etcd etcd_ok

  # --advertise-address: with a loopback bind address the API server would
  # otherwise look for a host interface (and fail where there is no default route).
  # --endpoint-reconciler-type=none: Endpoints may not hold loopback addresses, so
  # the reconciler of the 'kubernetes' Service would only log errors. The real
  # node (tests/node/up.sh) writes the Service's EndpointSlice itself: its
  # address in the node's network namespace, bridged to this API server.
  # Default admission plugins stay on (ServiceAccount, NamespaceLifecycle, ...);
  # audit log and OwnerReferencesPermissionEnforcement: APISERVER_AUDIT_FLAGS.
  install_audit_policy
  write_hosts
  write_egress_config
  start_component kube-apiserver "${APISERVER_WRAP[@]}" "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --tls-cert-file="$PKI/kube-apiserver.crt" --tls-private-key-file="$PKI/kube-apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --allow-privileged=true \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --endpoint-reconciler-type=none \
    "${APISERVER_AUDIT_FLAGS[@]}" "${APISERVER_NODE_FLAGS[@]}"
  wait_healthy kube-apiserver apiserver_ready

  # No --authentication/--authorization-kubeconfig for the controller manager and
  # scheduler: their delegated authn would want a requestheader CA the API server
  # does not have (and log an error every few seconds); /healthz is always allowed.
  # The controller manager computes PDB status and runs ReplicaSets, DaemonSets,
  # node lifecycle (lifts the not-ready taint) and GC; leader election is pointless
  # with one instance and only delays startup. --node-monitor-period=1s (default 5s):
  # a new kwok node loses its not-ready taint within a second, not five.
  start_component kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$PKI/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
    --leader-elect=false \
    --node-monitor-period=1s \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --use-service-account-credentials=true \
    ${KCM_TUNING[@]+"${KCM_TUNING[@]}"}
  start_component kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$PKI/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
    --leader-elect=false \
    ${SCHED_TUNING[@]+"${SCHED_TUNING[@]}"}
  # kwok.yaml pins kwok's configuration, so a ~/.kwok/kwok.yaml on a developer's
  # machine cannot change the behaviour (kwok reads it by default).
  if [ "$PLANE_PROFILE" = scale ]; then
    sed -E 's/^(  (nodeLease|nodePlayStage|podPlayStage)Parallelism:) [0-9]+$/\1 16/; s/^(  podsOnNodeSyncParallelism:) [0-9]+$/\1 4/' \
      "$CLUSTER_LIB_DIR/kwok.yaml" >"$KWOK_CONFIG"
  fi
  start_component kwok "$BIN/kwok" \
    --kubeconfig="$PKI/kwok.kubeconfig" \
    --config="$KWOK_CONFIG" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --server-address="127.0.0.1:$KWOK_PORT" \
    ${KWOK_TUNING[@]+"${KWOK_TUNING[@]}"}
  wait_healthy kube-controller-manager https_healthz "$KCM_PORT"
  wait_healthy kube-scheduler https_healthz "$SCHED_PORT"
  wait_healthy kwok kwok_ok

  cat >"$STATE_FILE" <<EOF
# written by tests/cluster/up.sh; read by up.sh, add-nodes.sh and tests
STATE_BIN=$BIN
STATE_PROFILE=$PLANE_PROFILE
K8S_VERSION=$K8S_VERSION
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
API_PORT=$API_PORT
KCM_PORT=$KCM_PORT
SCHED_PORT=$SCHED_PORT
KWOK_PORT=$KWOK_PORT
ADMIN_KUBECONFIG=$KUBECONFIG_ADMIN
EOF
  cat >"$CLUSTER_DIR/env" <<EOF
# source this file: kubectl and KUBECONFIG for the local test cluster
export KUBECONFIG="$KUBECONFIG_ADMIN"
export PATH="$CLUSTER_DIR/bin:\$PATH"
EOF
}

if plane_healthy; then
  log "reusing the running control plane (API server https://127.0.0.1:$API_PORT)"
  fresh=0
else
  if [ -f "$STATE_FILE" ] || compgen -G "$PIDS/*.pid" >/dev/null; then
    log "previous plane is unhealthy or incomplete; stopping its leftovers and starting fresh"
  fi
  fresh_start
  fresh=1
fi

# ---- topology: kwok nodes (only the missing ones are created)
cps=() workers=()
for ((i = 1; i <= CONTROL_PLANES; i++)); do cps+=("cp-$i"); done
for ((i = 1; i <= WORKERS; i++)); do workers+=("worker-$i"); done
[ ${#cps[@]} -eq 0 ] || create_nodes control-plane "${cps[@]}"
[ ${#workers[@]} -eq 0 ] || create_nodes worker "${workers[@]}"
if [ $((${#cps[@]} + ${#workers[@]})) -gt 0 ]; then
  wait_nodes_ready "$NODE_TIMEOUT" "${cps[@]}" "${workers[@]}" ||
    die "nodes did not become Ready (kwok log: $LOGS/kwok.log)"
fi

# Pods can only be admitted once the controller manager has made the namespace's
# 'default' ServiceAccount (ServiceAccount admission); tests use 'default' first.
t0=$SECONDS
until kc get serviceaccount default -n default >/dev/null 2>&1; do
  [ $((SECONDS - t0)) -lt "$COMPONENT_TIMEOUT" ] ||
    die "ServiceAccount default/default never appeared (log: $LOGS/kube-controller-manager.log)"
  sleep 0.3
done

starting=0
log "nodes: ${#cps[@]} control-plane, ${#workers[@]} worker (all Ready)"
log "kubeconfig: $KUBECONFIG_ADMIN   kubectl: $CLUSTER_DIR/bin/kubectl   (or: source $CLUSTER_DIR/env)"
if [ "$fresh" = 1 ]; then
  echo "control plane ready in $((SECONDS - t_start)) s"
else
  echo "control plane ready in $((SECONDS - t_start)) s (reused the running one)"
fi
