# shellcheck shell=bash disable=SC2034  # (variables are used by the scripts sourcing this)
# Shared helpers for up.sh, down.sh, restart.sh and add-nodes.sh. Sourced, never run.
#
# State layout (all under $CLUSTER_DIR, default <repo>/.cluster, git-ignored):
#   state.env         ports and bin dir of the running plane (sourced by the scripts)
#   env               `source .cluster/env` sets KUBECONFIG and PATH for a shell
#   kubeconfig        admin kubeconfig (client cert in group system:masters)
#   bin/kubectl       link to the kubectl matching the API server version
#   pki/              CA, serving/client certs, service-account key pair, per-component kubeconfigs
#   data/etcd/        etcd data directory
#   pids/<c>.pid      pid of each component, pids/<c>.cmd its command line (for error messages)
#   logs/<c>.log      each component's output; kept by down.sh for post-mortems
#   .lock             flock taken by up.sh / down.sh so parallel callers do not race

CLUSTER_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$CLUSTER_LIB_DIR/versions.env"
REPO_ROOT="$(cd "$CLUSTER_LIB_DIR/../.." && pwd)"
CLUSTER_DIR="${NMO_CLUSTER_DIR:-$REPO_ROOT/.cluster}"
PKI="$CLUSTER_DIR/pki"
PIDS="$CLUSTER_DIR/pids"
LOGS="$CLUSTER_DIR/logs"
KUBECONFIG_ADMIN="$CLUSTER_DIR/kubeconfig"
STATE_FILE="$CLUSTER_DIR/state.env"
# The API server's "cluster" egress (up.sh): served by the real node (tests/node).
EGRESS_SOCKET="$CLUSTER_DIR/sockets/egress.sock"

# Start order; down.sh stops in the reverse order so clients go before the API
# server and the API server before etcd (no noisy reconnect loops in the logs).
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
# What users run beside us, started on request by tests/companions/up.sh
# (make companions) with the same pid and log layout; stopped first.
# (kube-state-metrics' process name is cut to 15 characters: stray_pids
# compares that much.)
COMPANIONS=(cert-manager-controller cert-manager-cainjector kube-state-metrics prometheus)

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# Processes started here talk to 127.0.0.1; an inherited proxy setting would send
# those requests (and kubectl's, and the operator's) to the proxy instead.
fix_no_proxy() {
  if [ -n "${http_proxy:-}${https_proxy:-}${HTTP_PROXY:-}${HTTPS_PROXY:-}${all_proxy:-}${ALL_PROXY:-}" ]; then
    local v
    for v in NO_PROXY no_proxy; do
      case ",${!v:-}," in
        *,127.0.0.1,*) ;;
        *) export "$v=${!v:+${!v},}127.0.0.1,localhost" ;;
      esac
    done
  fi
}

# need_cmd CMD DEBIAN_PACKAGE: installs the package when CMD is missing, so a
# fresh machine needs nothing done by hand.
need_cmd() {
  command -v "$1" >/dev/null && return 0
  log "$1 not found; installing Debian package $2"
  command -v apt-get >/dev/null || die "$1 is missing and apt-get is not available; install $2"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -qq "$2" >/dev/null 2>&1 ||
    { $sudo apt-get update -qq >/dev/null && $sudo apt-get install -y -qq "$2" >/dev/null; } ||
    die "could not install $2 (needed for $1)"
  command -v "$1" >/dev/null || die "$1 still missing after installing $2"
}

# pid_of COMPONENT: prints the recorded pid if that process is alive AND is ours.
# "Ours" = its command line mentions $CLUSTER_DIR (every component gets a path
# under it), which guards against a recycled pid belonging to something else.
pid_of() {
  local f="$PIDS/$1.pid" pid
  [ -f "$f" ] || return 1
  pid="$(cat "$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  is_ours "$pid" || return 1
  echo "$pid"
}

is_ours() {
  [ -r "/proc/$1/cmdline" ] || return 1
  # zombies keep a cmdline-less /proc entry; treat them as dead
  [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ] || return 1
  # (captured, not piped into grep -q: that can fail on SIGPIPE under pipefail)
  local cmd
  cmd="$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline")" || return 1
  [[ "$cmd" == *"$CLUSTER_DIR/"* ]]
}

# stray_pids COMPONENT: processes of that component whose pid file is gone (e.g.
# .cluster/pids was deleted). Found by their own binary name plus the unique state
# path in their command line, never by name alone.
stray_pids() {
  local p comm
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    # comm is the binary name cut to 15 characters; `read` keeps this fork-free
    read -r comm 2>/dev/null <"/proc/$p/comm" || continue
    [ "$comm" = "${1:0:15}" ] && is_ours "$p" && echo "$p"
  done
  return 0
}

# stop_all: TERM every component (reverse start order), KILL what is still alive
# after STOP_TIMEOUT seconds, and remove the pid files. Safe to run repeatedly.
stop_all() {
  local timeout="${STOP_TIMEOUT:-15}" c pid i pids=() these all=("${COMPONENTS[@]}" "${COMPANIONS[@]}")
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do
    c="${all[$i]}"
    these=()
    if pid="$(pid_of "$c")"; then
      log "stopping $c (pid $pid)"
      these+=("$pid")
    fi
    for pid in $(stray_pids "$c"); do
      [ "${these[0]:-}" = "$pid" ] && continue
      log "stopping $c (stray pid $pid, no pid file)"
      these+=("$pid")
    done
    for pid in "${these[@]}"; do
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      # let the clients go before the API server, and the API server before etcd
      for _ in $(seq 20); do is_ours "$pid" || break; sleep 0.1; done
    done
  done
  local deadline=$((SECONDS + timeout))
  for pid in "${pids[@]}"; do
    while is_ours "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if is_ours "$pid"; then
      log "pid $pid ignored TERM for ${timeout} s; sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 50); do is_ours "$pid" || break; sleep 0.1; done
    fi
  done
  # The components were re-parented to init when up.sh exited, so it reaps them;
  # give it a moment so `pgrep` right after down.sh does not list <defunct> ones.
  deadline=$((SECONDS + 5))
  for pid in "${pids[@]}"; do
    while [ -e "/proc/$pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  done
  rm -f "$PIDS"/*.pid 2>/dev/null || true
}

# wipe_state: everything but logs/ and the lock file.
wipe_state() {
  rm -rf "${CLUSTER_DIR:?}/data" "${CLUSTER_DIR:?}/pki" "${CLUSTER_DIR:?}/pids" \
    "${CLUSTER_DIR:?}/bin" "${CLUSTER_DIR:?}/state.env" "${CLUSTER_DIR:?}/env" \
    "${CLUSTER_DIR:?}/kubeconfig"
}

# ---- starting one component (up.sh starts them all; restart.sh one again)

# start_component NAME CMD...: detached from this script's session (setsid) and
# immune to SIGHUP (nohup) so it outlives `make cluster-up`. Every inherited
# descriptor above 2 is closed first: our lock (fd 9) must not be held by a daemon,
# and a caller's pipe (CI capturing output, make's jobserver) must not be kept open
# by one, or whoever waits for EOF on it would hang. The subshell execs, so $! is
# the component's own pid.
start_component() {
  local name=$1; shift
  printf '%q ' "$@" >"$PIDS/$name.cmd"
  log "starting $name (log: $LOGS/$name.log)"
  (
    for fd in /proc/"$BASHPID"/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done
    exec setsid nohup "$@" </dev/null >"$LOGS/$name.log" 2>&1
  ) &
  echo "$!" >"$PIDS/$name.pid"
}

# starting_alive NAME: the component this script just started is still running.
# Right after start_component its pid may still be the forked subshell that has
# not yet exec'd the binary (its command line is this script's, so is_ours says
# no); a child of ours that is not a zombie counts as alive too. A loaded CI
# machine once took long enough there to fail kube-controller-manager's start
# with an empty log.
starting_alive() {
  pid_of "$1" >/dev/null && return 0
  local f="$PIDS/$1.pid" pid stat state ppid
  [ -f "$f" ] || return 1
  pid="$(cat "$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
  # fields after the "(comm)": state, ppid
  stat="${stat##*) }"
  read -r state ppid _ <<<"$stat"
  [ "$state" != Z ] && [ "$ppid" = "$$" ]
}

component_failed() {
  local name=$1 why=$2
  {
    echo "[cluster] ERROR: $name $why"
    echo "  command: $(cat "$PIDS/$name.cmd" 2>/dev/null)"
    echo "  log:     $LOGS/$name.log"
    echo "  last lines of the log:"
    tail -n 40 "$LOGS/$name.log" 2>/dev/null | sed 's/^/    /'
  } >&2
  exit 1
}

# wait_healthy NAME CHECK...: polls CHECK until it succeeds, failing fast if the
# process died and after COMPONENT_TIMEOUT seconds otherwise.
wait_healthy() {
  local name=$1; shift
  local t0=$SECONDS next=$((SECONDS + 5))
  until "$@"; do
    starting_alive "$name" || component_failed "$name" "exited during startup"
    [ "$SECONDS" -lt $((t0 + COMPONENT_TIMEOUT)) ] ||
      component_failed "$name" "not healthy after $COMPONENT_TIMEOUT s (check: $*)"
    if [ "$SECONDS" -ge "$next" ]; then
      log "  $name: still waiting ($((SECONDS - t0)) s)"
      next=$((SECONDS + 5))
    fi
    sleep 0.2
  done
  log "$name healthy after $((SECONDS - t0)) s"
}

etcd_ok() { [[ "$(curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null)" == *'"health":"true"'* ]]; }
https_healthz() { [ "$(curl -fsSk --max-time 2 "https://127.0.0.1:$1/healthz" 2>/dev/null)" = ok ]; }
kwok_ok() { curl -fsS --max-time 2 "http://127.0.0.1:$KWOK_PORT/healthz" >/dev/null 2>&1; }

# kubectl against the admin kubeconfig
kc() { "$CLUSTER_DIR/bin/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

apiserver_ready() {
  [ "$(curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$API_PORT/readyz" 2>/dev/null)" = ok ]
}

# node_manifest NAME ROLE(control-plane|worker) [POOL]: a Node kwok manages
# (annotation kwok.x-k8s.io/node=fake), labelled nmo-rs/node-pool=POOL when
# given (workloads of the scale bench select their nodes by it). Status is kept
# on create, so the capacity set here is what the scheduler sees.
node_manifest() {
  local name=$1 role=$2 pool=${3:-}
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
EOF
  [ -z "$pool" ] || echo "    nmo-rs/node-pool: $pool"
  if [ "$role" = control-plane ]; then
    cat <<EOF
    node-role.kubernetes.io/control-plane: ""
    node-role.kubernetes.io/master: ""
spec:
  taints:
  - key: node-role.kubernetes.io/control-plane
    effect: NoSchedule
EOF
  else
    echo "spec: {}"
  fi
  cat <<EOF
status:
  addresses:
  - {type: Hostname, address: $name}
  allocatable: {cpu: "32", memory: 256Gi, pods: "110", ephemeral-storage: 1Ti}
  capacity: {cpu: "32", memory: 256Gi, pods: "110", ephemeral-storage: 1Ti}
  nodeInfo:
    architecture: amd64
    operatingSystem: linux
    kubeletVersion: $K8S_VERSION
    kubeProxyVersion: $K8S_VERSION
---
EOF
}

# create_nodes ROLE NAME...: creates the named nodes that do not exist yet (existing
# ones are left alone, so a reused cluster keeps whatever cordons/taints tests set).
# NODE_POOL, when set, labels them nmo-rs/node-pool=NODE_POOL.
create_nodes() {
  local role=$1; shift
  local existing missing=() n
  existing=" $(kc get nodes -o jsonpath='{.items[*].metadata.name}') "
  for n in "$@"; do
    [[ "$existing" == *" $n "* ]] || missing+=("$n")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ ${#missing[@]} -le 10 ]; then
    log "creating $role nodes: ${missing[*]}"
  else
    log "creating ${#missing[@]} $role nodes: ${missing[0]} ... ${missing[${#missing[@]} - 1]}"
  fi
  for n in "${missing[@]}"; do node_manifest "$n" "$role" "${NODE_POOL:-}"; done | kc create -f - >/dev/null
}

# wait_nodes_ready TIMEOUT NAME...: waits for Ready=True (set by kwok) and for the
# node lifecycle controller to lift the not-ready taint, after which the scheduler
# will place pods there.
wait_nodes_ready() {
  local timeout=$1; shift
  local deadline=$((SECONDS + timeout)) start=$SECONDS rows pending last_report=-10
  local want
  want="$(printf '%s\n' "$@")"
  while :; do
    # all nodes, filtered here: `get nodes ONE-NAME` returns an object, not a List
    rows="$(kc get nodes -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.status.conditions[?(@.type=="Ready")].status}{" "}{.spec.taints[*].key}{"\n"}{end}' 2>/dev/null)" || rows=""
    # One pass over both lists (a grep per node took seconds at 1,000 nodes):
    # the wanted nodes not yet Ready, or still tainted not-ready/unreachable.
    pending="$(awk 'NR == FNR { if ($1 != "") want[$1] = 1; next }
      $1 in want && $2 == "True" && $0 !~ /node\.kubernetes\.io\/(not-ready|unreachable)/ { delete want[$1] }
      END { for (n in want) print n }' <(printf '%s\n' "$want") <(printf '%s\n' "$rows") | sort)"
    [ -z "$pending" ] && return 0
    local left
    left="$(wc -l <<<"$pending")"
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$left of $# nodes not Ready (or still tainted not-ready) after ${timeout} s: $(head -n 20 <<<"$pending" | tr '\n' ' ')"
      kc get nodes -o wide 2>&1 | head -n 40 >&2 || true
      printf 'last lines of %s:\n' "$LOGS/kwok.log" >&2
      tail -n 20 "$LOGS/kwok.log" >&2 || true
      return 1
    fi
    if [ $((SECONDS - last_report)) -ge 5 ]; then
      if [ "$left" -le 10 ]; then
        log "waiting for nodes to be Ready: $(tr '\n' ' ' <<<"$pending")"
      else
        log "nodes Ready: $(($# - left)) of $# after $((SECONDS - start)) s (timeout ${timeout} s)"
      fi
      last_report=$SECONDS
    fi
    sleep 0.5
  done
}

# ---- identities (up.sh for the plane, tests/node/up.sh for the real node)

# issue NAME SUBJECT USAGE [SAN]: an EC P-256 key and a certificate signed by our CA.
issue() {
  local name=$1 subj=$2 usage=$3 san=${4:-}
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$usage"
    [ -z "$san" ] || echo "subjectAltName=$san"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -sha256 \
    -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# write_kubeconfig FILE CERT_NAME
write_kubeconfig() {
  local file=$1 name=$2
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nmo-rs
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 <"$PKI/$name.crt")
    client-key-data: $(base64 -w0 <"$PKI/$name.key")
contexts:
- name: nmo-rs
  context:
    cluster: nmo-rs
    user: $name
current-context: nmo-rs
EOF
  chmod 600 "$file"
}
