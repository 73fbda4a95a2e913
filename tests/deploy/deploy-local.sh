#!/usr/bin/env bash
# make deploy-local: run the webhook (release build) against the local control
# plane exactly as the API server will call it in a cluster.
#
#   tests/deploy/deploy-local.sh          build, (re)start, register; returns once ready
#   tests/deploy/deploy-local.sh --stop   stop it and remove its webhook configuration
#
# Steps: build release binaries; start (or reuse) the local control plane
# (tests/cluster/up.sh); create the CA once (.cluster/certs/ca, kept across runs)
# and a fresh serving certificate for 127.0.0.1 / localhost /
# nmo-webhook.nmo-system.svc in the kubelet Secret layout (.cluster/certs/webhook);
# apply the CRD, namespace nmo-system and the webhook's read-only RBAC
# (manifests/webhook/); mint a token for the nmo-webhook ServiceAccount so the
# webhook runs with exactly that RBAC (.cluster/webhook.kubeconfig); (re)start
# the webhook in the background and wait for /readyz; then register the
# ValidatingWebhookConfiguration "nmo-webhook" (URL on 127.0.0.1, caBundle from
# the CA, failurePolicy Fail).
#
# Then the controller is (re)started by tests/deploy/controller-local.sh (its own
# pid, log and ports). NMO_DEPLOY_WEBHOOK_ONLY=1 builds and starts the webhook
# only (the webhook bench uses it, so a controller in mid-change cannot block it).
#
# Files: pid .cluster/pids/webhook.pid, log .cluster/logs/webhook.log (the previous
# run's log in .cluster/logs/previous/). Ports (override with the env variables):
# TLS 9443 [NMO_WEBHOOK_PORT], metrics 18080 [NMO_WEBHOOK_METRICS_PORT], probes
# 18081 [NMO_WEBHOOK_PROBE_PORT]. Serving threads: NMO_WEBHOOK_WORKER_THREADS
# (default 0: one per usable CPU).
#
# The token lives 24 h: run this again to refresh it. While the webhook restarts
# the API server rejects NodeMaintenance creates and updates (failurePolicy Fail),
# exactly as in a cluster with a single webhook replica.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_DIR="${NMO_CLUSTER_DIR:-$REPO_ROOT/.cluster}"
KUBECTL="$CLUSTER_DIR/bin/kubectl"
ADMIN_KUBECONFIG="$CLUSTER_DIR/kubeconfig"
WEBHOOK_KUBECONFIG="$CLUSTER_DIR/webhook.kubeconfig"
CERTS="$CLUSTER_DIR/certs"
PIDS="$CLUSTER_DIR/pids"
LOGS="$CLUSTER_DIR/logs"
PID_FILE="$PIDS/webhook.pid"
LOG_FILE="$LOGS/webhook.log"
RELEASE_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"

WEBHOOK_PORT="${NMO_WEBHOOK_PORT:-9443}"
METRICS_PORT="${NMO_WEBHOOK_METRICS_PORT:-18080}"
PROBE_PORT="${NMO_WEBHOOK_PROBE_PORT:-18081}"
READY_TIMEOUT="${NMO_WEBHOOK_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${NMO_WEBHOOK_STOP_TIMEOUT:-15}"
NAMESPACE=nmo-system
SERVICE_ACCOUNT=nmo-webhook
VWC_NAME=nmo-webhook
WEBHOOK_PATH=/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance

log() { printf '[deploy %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[deploy] ERROR: %s\n' "$*" >&2; exit 1; }
kc() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# Local processes talk to 127.0.0.1; an inherited proxy must not intercept that.
for v in NO_PROXY no_proxy; do
  case ",${!v:-}," in *,127.0.0.1,*) ;; *) export "$v=${!v:+${!v},}127.0.0.1,localhost" ;; esac
done

# webhook_pid: the recorded pid, if that process is alive and is our webhook
# (its command line names our cluster dir), never a recycled pid.
webhook_pid() {
  [ -f "$PID_FILE" ] || return 1
  local pid
  pid="$(cat "$PID_FILE")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/cmdline" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "nmo-webhook .*$CLUSTER_DIR/" || return 1
  echo "$pid"
}

stop_webhook() {
  local pid
  if ! pid="$(webhook_pid)"; then
    rm -f "$PID_FILE"
    return 0
  fi
  log "stopping webhook (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while webhook_pid >/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if webhook_pid >/dev/null; then
    log "webhook pid $pid ignored SIGTERM for ${STOP_TIMEOUT} s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while webhook_pid >/dev/null; do sleep 0.1; done
  fi
  rm -f "$PID_FILE"
}

CONTROLLER_SCRIPT="$REPO_ROOT/tests/deploy/controller-local.sh"
WEBHOOK_ONLY="${NMO_DEPLOY_WEBHOOK_ONLY:-}"

if [ "${1:-}" = "--stop" ]; then
  if [ -f "$CONTROLLER_SCRIPT" ]; then
    bash "$CONTROLLER_SCRIPT" --stop || log "WARNING: stopping the controller failed (see above)"
  fi
  stop_webhook
  if [ -x "$KUBECTL" ] && [ -f "$ADMIN_KUBECONFIG" ]; then
    # Without its webhook the configuration would make every create fail.
    kc delete validatingwebhookconfiguration "$VWC_NAME" --ignore-not-found >/dev/null 2>&1 || true
  fi
  log "webhook stopped and unregistered"
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1' (use no argument to deploy, --stop to stop)"

# ---- build
# One build of every binary with the workspace's feature set, the same command
# make bench and make test use (release), so no script rebuilds what another
# built with other features. NMO_DEPLOY_WEBHOOK_ONLY falls back to building the
# webhook alone when the workspace does not build (a controller in mid-change).
log "building release binaries (cargo build --release --workspace --bins)"
if ! (cd "$REPO_ROOT" && cargo build --release --workspace --bins); then
  [ -n "$WEBHOOK_ONLY" ] ||
    die "cargo build --release --workspace --bins failed (see above); NMO_DEPLOY_WEBHOOK_ONLY=1 deploys the webhook alone"
  log "the workspace does not build; building nmo-webhook and nmo-certs alone"
  (cd "$REPO_ROOT" && cargo build --release -p nmo-webhook -p nmo-certs) ||
    die "cargo build --release -p nmo-webhook -p nmo-certs failed (see above)"
fi
[ -x "$RELEASE_DIR/nmo-webhook" ] || die "$RELEASE_DIR/nmo-webhook missing after the build"
[ -x "$RELEASE_DIR/nmo-certs" ] || die "$RELEASE_DIR/nmo-certs missing after the build"
[ -n "$WEBHOOK_ONLY" ] || [ -x "$RELEASE_DIR/nmo-controller" ] ||
  die "$RELEASE_DIR/nmo-controller missing after the build"

# ---- cluster
bash "$REPO_ROOT/tests/cluster/up.sh" || die "tests/cluster/up.sh failed (see above)"
{ [ -x "$KUBECTL" ] && [ -f "$ADMIN_KUBECONFIG" ]; } || die "up.sh did not leave $KUBECTL and $ADMIN_KUBECONFIG"

# ---- certificates: the CA survives redeploys (so does the caBundle); the
# serving certificate is re-issued each time, as a Secret update would.
mkdir -p "$CERTS" "$PIDS" "$LOGS"
"$RELEASE_DIR/nmo-certs" ca --out "$CERTS/ca" >/dev/null
"$RELEASE_DIR/nmo-certs" serving --ca-dir "$CERTS/ca" --out "$CERTS/webhook" --layout kubelet \
  --dns localhost --dns "nmo-webhook.$NAMESPACE.svc" --ip 127.0.0.1 >/dev/null ||
  die "issuing the serving certificate into $CERTS/webhook failed"
CA_BUNDLE="$("$RELEASE_DIR/nmo-certs" ca-bundle --ca-dir "$CERTS/ca")"

# ---- API objects the webhook needs
log "applying the CRD, namespace $NAMESPACE and the webhook's RBAC"
# Server-side apply: no last-applied annotation, no conflict with the tests' applies.
ssa() { kc apply --server-side --force-conflicts --field-manager=nmo-deploy-local "$@" >/dev/null; }
ssa -f "$REPO_ROOT/manifests/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"
kc wait --for=condition=Established --timeout=60s crd/nodemaintenances.nodemaintenance.medik8s.io >/dev/null ||
  die "the NodeMaintenance CRD did not become Established within 60 s"
kc create namespace "$NAMESPACE" --dry-run=client -o yaml | ssa -f -
ssa -k "$REPO_ROOT/manifests/webhook/"

# ---- a kubeconfig that authenticates as the webhook's ServiceAccount
token="$(kc create token "$SERVICE_ACCOUNT" -n "$NAMESPACE" --duration=24h)" ||
  die "cannot mint a token for serviceaccount $NAMESPACE/$SERVICE_ACCOUNT"
server="$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
ca_data="$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
{ [ -n "$server" ] && [ -n "$ca_data" ]; } || die "cannot read server and CA from $ADMIN_KUBECONFIG"
umask 077
cat >"$WEBHOOK_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $server
    certificate-authority-data: $ca_data
users:
- name: $SERVICE_ACCOUNT
  user:
    token: $token
contexts:
- name: $SERVICE_ACCOUNT
  context:
    cluster: local
    user: $SERVICE_ACCOUNT
current-context: $SERVICE_ACCOUNT
EOF
umask 022

# ---- (re)start the webhook
stop_webhook
if [ -f "$LOG_FILE" ]; then
  mkdir -p "$LOGS/previous"
  mv -f "$LOG_FILE" "$LOGS/previous/webhook.log"
fi
for port in "$WEBHOOK_PORT" "$METRICS_PORT" "$PROBE_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port on 127.0.0.1 is taken by another process; free it or set NMO_WEBHOOK_PORT / NMO_WEBHOOK_METRICS_PORT / NMO_WEBHOOK_PROBE_PORT"
  fi
done
cmd=(
  "$RELEASE_DIR/nmo-webhook"
  --webhook-bind-address "127.0.0.1:$WEBHOOK_PORT"
  --metrics-bind-address "127.0.0.1:$METRICS_PORT"
  --health-probe-bind-address "127.0.0.1:$PROBE_PORT"
  --cert-dir "$CERTS/webhook"
  --kubeconfig "$WEBHOOK_KUBECONFIG"
  --openshift "${NMO_WEBHOOK_OPENSHIFT:-auto}"
  --worker-threads "${NMO_WEBHOOK_WORKER_THREADS:-0}"
)
printf '%q ' "${cmd[@]}" >"$PIDS/webhook.cmd"
log "starting the webhook on https://127.0.0.1:$WEBHOOK_PORT (log: $LOG_FILE)"
# Detached from this script's session and immune to SIGHUP so it outlives `make`.
setsid nohup "${cmd[@]}" </dev/null >"$LOG_FILE" 2>&1 &
echo "$!" >"$PID_FILE"

deadline=$((SECONDS + READY_TIMEOUT))
until curl -fsS --max-time 2 "http://127.0.0.1:$PROBE_PORT/readyz" >/dev/null 2>&1; do
  if ! webhook_pid >/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
    {
      if webhook_pid >/dev/null; then
        echo "[deploy] ERROR: the webhook is not ready after ${READY_TIMEOUT} s"
        echo "  /readyz says: $(curl -sS --max-time 2 "http://127.0.0.1:$PROBE_PORT/readyz" 2>&1)"
      else
        echo "[deploy] ERROR: the webhook exited during start-up"
      fi
      echo "  command: $(cat "$PIDS/webhook.cmd")"
      echo "  last lines of $LOG_FILE:"
      tail -n 30 "$LOG_FILE" | sed 's/^/    /'
    } >&2
    exit 1
  fi
  sleep 0.2
done

# ---- register it with the API server (after it is ready, so no create fails
# for lack of a webhook that is merely starting)
ssa -f - <<EOF
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: $VWC_NAME
  labels:
    app.kubernetes.io/name: node-maintenance-operator
    app.kubernetes.io/component: webhook
webhooks:
  - name: vnodemaintenance.kb.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig:
      url: https://127.0.0.1:$WEBHOOK_PORT$WEBHOOK_PATH
      caBundle: $CA_BUNDLE
    # Objects of the integration tests (label nmo-test/group) are judged by the
    # tests' own webhooks only: some tests create invalid objects on purpose.
    objectSelector:
      matchExpressions:
        - {key: nmo-test/group, operator: DoesNotExist}
    rules:
      - apiGroups: ["nodemaintenance.medik8s.io"]
        apiVersions: ["v1beta1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["nodemaintenances"]
EOF
log "webhook ready (pid $(cat "$PID_FILE")): https://127.0.0.1:$WEBHOOK_PORT$WEBHOOK_PATH," \
  "metrics http://127.0.0.1:$METRICS_PORT/metrics, probes http://127.0.0.1:$PROBE_PORT/readyz"

# ---- the controller
if [ -n "$WEBHOOK_ONLY" ]; then
  log "NMO_DEPLOY_WEBHOOK_ONLY set: not starting the controller"
elif [ -f "$CONTROLLER_SCRIPT" ]; then
  bash "$CONTROLLER_SCRIPT" || die "starting the controller failed (see above); the webhook is running"
else
  log "WARNING: $CONTROLLER_SCRIPT not found: the controller was not started"
fi
