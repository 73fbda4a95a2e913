# shellcheck shell=bash
# Shared by tests/deploy/deploy-local.sh and tests/deploy/controller-local.sh.
# Sourced, never run.
#
# Both services run as the integration tests run them (tests/src/deployment.rs),
# through tests/tools/src/bin/local-pod.rs: the binary out of the built image
# (target/images/<service>.oci.tar, unpacked under .cluster/images/), with the
# command, arguments, environment, ServiceAccount, certificate mount and
# readiness probe of the rendered manifests/base Deployment, every
# --*-bind-address mapped to a fixed 127.0.0.1 port, as the image's user 65532
# when run as root.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# local-pod, like the tests, reads the control plane of <repo>/.cluster.
CLUSTER_DIR="$REPO_ROOT/.cluster"
KUBECTL="$CLUSTER_DIR/bin/kubectl"
ADMIN_KUBECONFIG="$CLUSTER_DIR/kubeconfig"
PIDS="$CLUSTER_DIR/pids"
LOGS="$CLUSTER_DIR/logs"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
LOCAL_POD="$TARGET_DIR/debug/local-pod"
NMO_CERTS="$TARGET_DIR/debug/nmo-certs"
NAMESPACE=nmo-system
# A ServiceAccount bound to ClusterRole nmo-metrics-reader, for scraping the
# secure metrics endpoints by hand (created here; not part of manifests/).
METRICS_READER_SA=nmo-local-metrics-reader

if [ -n "${NMO_CLUSTER_DIR:-}" ] && [ "$NMO_CLUSTER_DIR" != "$CLUSTER_DIR" ]; then
  printf '[deploy] ERROR: NMO_CLUSTER_DIR=%s is not supported here: local-pod, like the integration tests, uses %s; unset it\n' \
    "$NMO_CLUSTER_DIR" "$CLUSTER_DIR" >&2
  exit 1
fi
# Always the image's binary (NMO_TEST_BINARIES=cargo is the tests' quick loop only).
unset NMO_TEST_BINARIES

# Local processes talk to 127.0.0.1; an inherited proxy must not intercept that.
for v in NO_PROXY no_proxy; do
  case ",${!v:-}," in *,127.0.0.1,*) ;; *) export "$v=${!v:+${!v},}127.0.0.1,localhost" ;; esac
done

kc() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# add_extra_args VAR: append the words of environment variable VAR
# (NMO_CONTROLLER_EXTRA_ARGS, NMO_WEBHOOK_EXTRA_ARGS) to the array `extra`,
# split as a shell splits them: quotes respected
# ("--maintenance-window='0 2 * * 6 4h UTC'" stays one word), no globbing and
# no expansion of any kind (xargs' quoting, words handed back NUL-separated).
# An unbalanced quote is an error naming the variable.
add_extra_args() {
  local var="$1" tmp words=()
  [ -n "${!var:-}" ] || return 0
  tmp="$(mktemp)"
  if ! printf '%s' "${!var}" | xargs -r printf '%s\0' >"$tmp" 2>"$tmp.err"; then
    local why
    why="$(cat "$tmp.err")"
    rm -f "$tmp" "$tmp.err"
    die "$var cannot be split into words ($why): quote a value with spaces as in a shell, e.g. $var=\"--maintenance-window='0 2 * * 6 4h UTC'\""
  fi
  mapfile -d '' words <"$tmp"
  rm -f "$tmp" "$tmp.err"
  extra+=(${words[@]+"${words[@]}"})
  log "$var: ${#words[@]} extra argument(s) after the manifest's: ${words[*]}"
}
# Server-side apply: no last-applied annotation, no conflict with the tests' applies.
ssa() { kc apply --server-side --force-conflicts --field-manager=nmo-deploy-local "$@" >/dev/null; }

# build_all: the images (make images) and the two dev tools, local-pod and
# nmo-certs (debug builds of the tests crate, as make images and make test
# build it). Once per deploy: the scripts export _NMO_DEPLOY_BUILT=1 to each
# other. NMO_DEPLOY_SKIP_IMAGES=1 runs the archives in target/images as they are.
build_all() {
  [ -z "${_NMO_DEPLOY_BUILT:-}" ] || return 0
  if [ -n "${NMO_DEPLOY_SKIP_IMAGES:-}" ]; then
    log "NMO_DEPLOY_SKIP_IMAGES set: running target/images as they are (not rebuilt)"
  else
    # Only this machine's platform: the services run here (make images
    # and make test build every platform).
    local host
    case "$(uname -m)" in x86_64) host=linux/amd64 ;; aarch64 | arm64) host=linux/arm64 ;; *) host="linux/$(uname -m)" ;; esac
    log "building the images for $host (make images: bash tests/release/images.sh, with IMAGE_PLATFORMS=$host)"
    IMAGE_PLATFORMS="${IMAGE_PLATFORMS:-$host}" bash "$REPO_ROOT/tests/release/images.sh" >/dev/null ||
      die "make images (bash tests/release/images.sh) failed (see above); NMO_DEPLOY_SKIP_IMAGES=1 runs the images already in $TARGET_DIR/images"
  fi
  local svc
  for svc in nmo-webhook nmo-controller; do
    [ -f "$TARGET_DIR/images/$svc.oci.tar" ] ||
      die "$TARGET_DIR/images/$svc.oci.tar is missing: run 'make images'"
  done
  log "building local-pod and nmo-certs (cargo build -p nmo-tools -p nmo-certs)"
  (cd "$REPO_ROOT" && cargo build -q -p nmo-tools -p nmo-certs --bin local-pod --bin nmo-certs) ||
    die "cargo build -p nmo-tools -p nmo-certs --bin local-pod --bin nmo-certs failed (see above)"
  export _NMO_DEPLOY_BUILT=1
}

# apply_prereqs: what both services need before they start: the CRD, the
# namespace, both RBAC dirs (the webhook's metrics binding names a ClusterRole
# of manifests/controller), and the metrics reader ServiceAccount. Once per deploy.
apply_prereqs() {
  [ -z "${_NMO_DEPLOY_APPLIED:-}" ] || return 0
  log "applying the CRDs, namespace $NAMESPACE, manifests/controller and manifests/webhook (server-side)"
  ssa -k "$REPO_ROOT/manifests/crd/" ||
    die "applying the CRDs of manifests/crd (NodeMaintenance, NodeDrainRule) failed"
  kc wait --for=condition=Established --timeout=60s crd/nodemaintenances.nodemaintenance.medik8s.io \
    crd/nodedrainrules.nodemaintenance.medik8s.io >/dev/null ||
    die "the NodeMaintenance and NodeDrainRule CRDs did not become Established within 60 s"
  kc create namespace "$NAMESPACE" --dry-run=client -o yaml | ssa -f - ||
    die "creating namespace $NAMESPACE failed"
  ssa -k "$REPO_ROOT/manifests/controller/" || die "applying manifests/controller failed"
  ssa -k "$REPO_ROOT/manifests/webhook/" || die "applying manifests/webhook failed"
  ssa -f - <<EOF || die "creating ServiceAccount $NAMESPACE/$METRICS_READER_SA and its binding to nmo-metrics-reader failed"
apiVersion: v1
kind: ServiceAccount
metadata: {name: $METRICS_READER_SA, namespace: $NAMESPACE}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $METRICS_READER_SA}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nmo-metrics-reader}
subjects: [{kind: ServiceAccount, name: $METRICS_READER_SA, namespace: $NAMESPACE}]
EOF
  export _NMO_DEPLOY_APPLIED=1
}

# scrape_hint PORT: how to read a secure /metrics endpoint by hand.
scrape_hint() {
  printf '  curl -sk -H "Authorization: Bearer $(%s --kubeconfig %s -n %s create token %s)" https://127.0.0.1:%s/metrics\n' \
    "$KUBECTL" "$ADMIN_KUBECONFIG" "$NAMESPACE" "$METRICS_READER_SA" "$1"
}

# Files of service nmo-<name>: $PIDS/<name>.pid, $LOGS/<name>.log.

# pod_pid SERVICE: the pid in $PIDS/<name>.pid if that process is alive and
# runs our binary from this clone (the image unpacked under .cluster/images/),
# never a recycled pid.
pod_pid() {
  local svc=$1 pid argv0
  [ -f "$PIDS/${svc#nmo-}.pid" ] || return 1
  pid="$(cat "$PIDS/${svc#nmo-}.pid")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  argv0="$(tr '\0' '\n' <"/proc/$pid/cmdline" | head -n 1)"
  [[ "$argv0" == "$REPO_ROOT"/*/"$svc" ]] || return 1
  echo "$pid"
}

# stop_pod SERVICE TIMEOUT: SIGTERM, SIGKILL after TIMEOUT seconds.
stop_pod() {
  local svc=$1 timeout=$2 pid
  if ! pid="$(pod_pid "$svc")"; then
    rm -f "$PIDS/${svc#nmo-}.pid"
    return 0
  fi
  log "stopping $svc (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + timeout))
  while pod_pid "$svc" >/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if pod_pid "$svc" >/dev/null; then
    log "$svc (pid $pid) ignored SIGTERM for $timeout s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while pod_pid "$svc" >/dev/null; do sleep 0.1; done
  fi
  rm -f "$PIDS/${svc#nmo-}.pid"
}

# check_ports_free HINT PORT...: die naming HINT (the env variables) if a port is taken.
check_ports_free() {
  local hint=$1 port
  shift
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port on 127.0.0.1 is taken by another process; free it or set $hint"
    fi
  done
}

# start_pod SERVICE LOCAL_POD_ARGS...: start SERVICE's pod with local-pod, its
# log in $LOGS/<name>.log (the previous run's in $LOGS/previous/), its pid in
# $PIDS/<name>.pid; returns once the manifest's readiness probe passes.
start_pod() {
  local svc=$1 out pid
  shift
  local name=${svc#nmo-}
  mkdir -p "$PIDS" "$LOGS"
  if [ -f "$LOGS/$name.log" ]; then
    mkdir -p "$LOGS/previous"
    mv -f "$LOGS/$name.log" "$LOGS/previous/$name.log"
  fi
  log "starting $svc from its image (log: $LOGS/$name.log)"
  out="$("$LOCAL_POD" --overlay base --deployment "$svc" --log "$LOGS/$name.log" "$@")" ||
    die "$svc did not start or did not become ready (local-pod's message above; log: $LOGS/$name.log)"
  pid="$(sed -n 's/^pid=//p' <<<"$out")"
  [[ "$pid" =~ ^[0-9]+$ ]] || die "local-pod printed no pid for $svc: $out"
  echo "$pid" >"$PIDS/$name.pid"
}
