#!/usr/bin/env bash
# Run nmo-controller (release build) against the local control plane, under
# its ServiceAccount and the RBAC of manifests/controller/, with leader
# election on, as it runs in a cluster. Called by deploy-local.sh. It leaves
# NodeMaintenances labelled nmo-test/group alone: the integration tests run
# their own controllers for those.
#
#   tests/deploy/controller-local.sh          (re)start; returns once /readyz is green
#   tests/deploy/controller-local.sh --stop   stop it
#
# Files: pid .cluster/pids/controller.pid, log .cluster/logs/controller.log.
# Ports: metrics 28080 [NMO_CONTROLLER_METRICS_PORT], probes 28081 [NMO_CONTROLLER_PROBE_PORT].
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_DIR="${NMO_CLUSTER_DIR:-$REPO_ROOT/.cluster}"
KUBECTL="$CLUSTER_DIR/bin/kubectl"
ADMIN_KUBECONFIG="$CLUSTER_DIR/kubeconfig"
CTRL_KUBECONFIG="$CLUSTER_DIR/controller.kubeconfig"
PID_FILE="$CLUSTER_DIR/pids/controller.pid"
LOG_FILE="$CLUSTER_DIR/logs/controller.log"
BIN="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/nmo-controller"
METRICS_PORT="${NMO_CONTROLLER_METRICS_PORT:-28080}"
PROBE_PORT="${NMO_CONTROLLER_PROBE_PORT:-28081}"
READY_TIMEOUT="${NMO_CONTROLLER_READY_TIMEOUT:-60}"

log() { printf '[controller %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[controller] ERROR: %s\n' "$*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

stop() {
  [ -f "$PID_FILE" ] || return 0
  local pid
  pid="$(cat "$PID_FILE")"
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q nmo-controller; then
    log "stopping controller (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { log "controller did not stop in 15 s: SIGKILL"; kill -KILL "$pid"; }
  fi
  rm -f "$PID_FILE"
}

if [ "${1:-}" = "--stop" ]; then
  stop
  exit 0
fi

[ -x "$BIN" ] || die "$BIN is missing: run 'cargo build --release --workspace --bins' (make deploy-local does)"
[ -f "$ADMIN_KUBECONFIG" ] || die "no local cluster ($ADMIN_KUBECONFIG missing): run 'make cluster-up'"
mkdir -p "$(dirname "$PID_FILE")" "$(dirname "$LOG_FILE")"

kc apply --server-side --force-conflicts --field-manager=nmo-deploy-local -f "$REPO_ROOT/manifests/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml" >/dev/null
kc create namespace nmo-system --dry-run=client -o yaml | kc apply --server-side --force-conflicts --field-manager=nmo-deploy-local -f - >/dev/null
kc apply --server-side --force-conflicts --field-manager=nmo-deploy-local -f "$REPO_ROOT/manifests/controller/rbac.yaml" >/dev/null

# A kubeconfig that authenticates as the ServiceAccount, so RBAC is real.
token="$(kc create token nmo-controller -n nmo-system --duration=24h)" ||
  die "could not mint a token for ServiceAccount nmo-system/nmo-controller"
server="$(kc config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca="$(kc config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
umask 077
cat >"$CTRL_KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: nmo-controller, user: {token: "$token"}}]
contexts: [{name: nmo-controller, context: {cluster: local, user: nmo-controller}}]
current-context: nmo-controller
KC

stop
[ -f "$LOG_FILE" ] && mv "$LOG_FILE" "$LOG_FILE.previous"
log "starting $BIN (log: $LOG_FILE)"
KUBECONFIG="$CTRL_KUBECONFIG" POD_NAMESPACE=nmo-system POD_NAME="nmo-controller-local" \
  setsid nohup "$BIN" --leader-elect \
  --nodemaintenance-selector='!nmo-test/group' \
  --metrics-bind-address="127.0.0.1:$METRICS_PORT" \
  --health-probe-bind-address="127.0.0.1:$PROBE_PORT" \
  --zap-level="${NMO_CONTROLLER_LOG_LEVEL:-info}" \
  </dev/null >"$LOG_FILE" 2>&1 &
echo $! >"$PID_FILE"

deadline=$((SECONDS + READY_TIMEOUT))
until curl -fsS "http://127.0.0.1:$PROBE_PORT/readyz" >/dev/null 2>&1; do
  if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
    tail -n 30 "$LOG_FILE" >&2 || true
    die "controller not ready within ${READY_TIMEOUT}s (command: $BIN --leader-elect ...; log: $LOG_FILE)"
  fi
  sleep 0.2
done
log "controller ready (pid $(cat "$PID_FILE"); metrics http://127.0.0.1:$METRICS_PORT/metrics)"
