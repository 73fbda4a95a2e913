#!/usr/bin/env bash
# make deploy-local: run the webhook and the controller against the local
# control plane as their manifests/base Deployments describe them, from the
# built images, exactly as the integration tests run them.
#
#   tests/deploy/deploy-local.sh          build, (re)start, register; returns once ready
#   tests/deploy/deploy-local.sh --stop   stop both and remove the webhook configuration
#
# Steps: build the images (make images = tests/release/images.sh) and the dev
# tools local-pod and nmo-certs (cargo, debug); start (or reuse) the local
# control plane (tests/cluster/up.sh); create the CA once (.cluster/certs/ca,
# kept across runs) and a fresh serving certificate for 127.0.0.1 / localhost /
# nmo-webhook.nmo-system.svc in the kubelet Secret layout
# (.cluster/certs/webhook); apply the CRD, namespace nmo-system and both RBAC
# dirs (manifests/controller, manifests/webhook) server-side, plus a
# ServiceAccount nmo-local-metrics-reader bound to ClusterRole
# nmo-metrics-reader for scraping; then (re)start the webhook with
# tests/tools/src/bin/local-pod.rs: the binary out of target/images/nmo-webhook.oci.tar,
# the container's command, arguments, environment and readiness probe from the
# rendered manifests/base Deployment nmo-webhook, its "cert" volume mapped to
# .cluster/certs/webhook, a 24 h token of the Deployment's ServiceAccount
# (.cluster/webhook.kubeconfig), run as the image's user 65532 when we are root,
# detached in its own process group; wait for its readiness probe; then register
# the ValidatingWebhookConfiguration "nmo-webhook" (URL on 127.0.0.1, caBundle
# from the CA, failurePolicy Fail).
#
# Then the controller is (re)started by tests/deploy/controller-local.sh the same
# way (its own pid, log and ports). NMO_DEPLOY_WEBHOOK_ONLY=1 starts the webhook
# only (the webhook bench uses it). NMO_DEPLOY_SKIP_IMAGES=1 runs the image
# archives in target/images as they are (e.g. while the workspace does not build).
#
# Files: pid .cluster/pids/webhook.pid, log .cluster/logs/webhook.log (the
# previous run's log in .cluster/logs/previous/). Ports (override with the env
# variables): TLS 9443 [NMO_WEBHOOK_PORT], metrics 18080 [NMO_WEBHOOK_METRICS_PORT]
# (container port 8443), probes 18081 [NMO_WEBHOOK_PROBE_PORT] (container port 8081).
# Flags added after the manifest's, only when the variable is set:
# NMO_WEBHOOK_OPENSHIFT (--openshift), NMO_WEBHOOK_WORKER_THREADS
# (--worker-threads), NMO_WEBHOOK_METRICS_SECURE (--metrics-secure; the
# manifest's default is HTTPS with TokenReview/SubjectAccessReview; the webhook
# bench sets false, see tests/deploy/bench-webhook.sh).
# NMO_WEBHOOK_EXTRA_ARGS and NMO_CONTROLLER_EXTRA_ARGS: any further flags, split
# into words as a shell does (quotes kept, nothing expanded), e.g.
# NMO_CONTROLLER_EXTRA_ARGS="--max-concurrent-maintenances=2 --zap-log-level=debug".
#
# The token lives 24 h: run this again to refresh it. While the webhook restarts
# the API server rejects NodeMaintenance creates and updates (failurePolicy Fail),
# exactly as in a cluster with a single webhook replica.
set -euo pipefail

log() { printf '[deploy %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[deploy] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

CERTS="$CLUSTER_DIR/certs"
WEBHOOK_PORT="${NMO_WEBHOOK_PORT:-9443}"
METRICS_PORT="${NMO_WEBHOOK_METRICS_PORT:-18080}"
PROBE_PORT="${NMO_WEBHOOK_PROBE_PORT:-18081}"
READY_TIMEOUT="${NMO_WEBHOOK_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${NMO_WEBHOOK_STOP_TIMEOUT:-15}"
VWC_NAME=nmo-webhook
WEBHOOK_PATH=/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance
# The NodeDrainRule path, as manifests/base/validating-webhook.yaml has it.
DRAIN_RULE_WEBHOOK_PATH=$(grep -o '/validate-[a-z0-9-]*-nodedrainrule' "$REPO_ROOT/manifests/base/validating-webhook.yaml" | head -1)
[ -n "$DRAIN_RULE_WEBHOOK_PATH" ] || die "no NodeDrainRule webhook path in manifests/base/validating-webhook.yaml"
CONTROLLER_SCRIPT="$REPO_ROOT/tests/deploy/controller-local.sh"
WEBHOOK_ONLY="${NMO_DEPLOY_WEBHOOK_ONLY:-}"

if [ "${1:-}" = "--stop" ]; then
  bash "$CONTROLLER_SCRIPT" --stop || log "WARNING: stopping the controller failed (see above)"
  stop_pod nmo-webhook "$STOP_TIMEOUT"
  if [ -x "$KUBECTL" ] && [ -f "$ADMIN_KUBECONFIG" ]; then
    # Without its webhook the configuration would make every create fail.
    kc delete validatingwebhookconfiguration "$VWC_NAME" --ignore-not-found >/dev/null 2>&1 || true
  fi
  log "webhook stopped and unregistered"
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1' (use no argument to deploy, --stop to stop)"

build_all

# ---- cluster
bash "$REPO_ROOT/tests/cluster/up.sh" || die "tests/cluster/up.sh failed (see above)"
{ [ -x "$KUBECTL" ] && [ -f "$ADMIN_KUBECONFIG" ]; } || die "up.sh did not leave $KUBECTL and $ADMIN_KUBECONFIG"

# ---- certificates: the CA survives redeploys (so does the caBundle); the
# serving certificate is re-issued each time, as a Secret update would.
mkdir -p "$CERTS" "$PIDS" "$LOGS"
"$NMO_CERTS" ca --out "$CERTS/ca" >/dev/null || die "creating the CA in $CERTS/ca failed"
"$NMO_CERTS" serving --ca-dir "$CERTS/ca" --out "$CERTS/webhook" --layout kubelet \
  --dns localhost --dns "nmo-webhook.$NAMESPACE.svc" --ip 127.0.0.1 >/dev/null ||
  die "issuing the serving certificate into $CERTS/webhook failed"
CA_BUNDLE="$("$NMO_CERTS" ca-bundle --ca-dir "$CERTS/ca")" || die "reading the CA bundle of $CERTS/ca failed"

apply_prereqs

# ---- (re)start the webhook
stop_pod nmo-webhook "$STOP_TIMEOUT"
rm -f "$PIDS/webhook.cmd" # written by the cargo-built era of this script
check_ports_free "NMO_WEBHOOK_PORT / NMO_WEBHOOK_METRICS_PORT / NMO_WEBHOOK_PROBE_PORT" \
  "$WEBHOOK_PORT" "$METRICS_PORT" "$PROBE_PORT"
# Dev-only flags after the manifest's (the last one wins), only when asked for:
# --openshift (default auto-detects; set NMO_WEBHOOK_OPENSHIFT=true to try the
# OpenShift checks here), --worker-threads (the bench pins one serving thread),
# --metrics-secure=false (the bench's webhook-bench reads /metrics over plain HTTP).
extra=()
[ -z "${NMO_WEBHOOK_OPENSHIFT:-}" ] || extra+=("--openshift=$NMO_WEBHOOK_OPENSHIFT")
[ -z "${NMO_WEBHOOK_WORKER_THREADS:-}" ] || extra+=("--worker-threads=$NMO_WEBHOOK_WORKER_THREADS")
[ -z "${NMO_WEBHOOK_METRICS_SECURE:-}" ] || extra+=("--metrics-secure=$NMO_WEBHOOK_METRICS_SECURE")
add_extra_args NMO_WEBHOOK_EXTRA_ARGS
start_pod nmo-webhook \
  --volume "cert=$CERTS/webhook" \
  --port "9443=$WEBHOOK_PORT" --port "8443=$METRICS_PORT" --port "8081=$PROBE_PORT" \
  --mint-kubeconfig "$CLUSTER_DIR/webhook.kubeconfig" --token-hours 24 \
  --pod-name nmo-webhook-local --ready-timeout "$READY_TIMEOUT" \
  -- ${extra[@]+"${extra[@]}"}

# ---- register it with the API server (after it is ready, so no create fails
# for lack of a webhook that is merely starting)
ssa -f - <<EOF || die "registering ValidatingWebhookConfiguration $VWC_NAME failed"
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
  - name: vnodedrainrule.nmo.medik8s.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    failurePolicy: Fail
    timeoutSeconds: 10
    clientConfig:
      url: https://127.0.0.1:$WEBHOOK_PORT$DRAIN_RULE_WEBHOOK_PATH
      caBundle: $CA_BUNDLE
    objectSelector:
      matchExpressions:
        - {key: nmo-test/group, operator: DoesNotExist}
    rules:
      - apiGroups: ["nodemaintenance.medik8s.io"]
        apiVersions: ["v1alpha1"]
        operations: ["CREATE", "UPDATE"]
        resources: ["nodedrainrules"]
EOF
log "webhook ready (pid $(cat "$PIDS/webhook.pid")): https://127.0.0.1:$WEBHOOK_PORT$WEBHOOK_PATH, probes http://127.0.0.1:$PROBE_PORT/readyz"
case "${NMO_WEBHOOK_METRICS_SECURE:-true}" in
  false | 0 | f | F | FALSE | False) log "webhook metrics (plain HTTP): http://127.0.0.1:$METRICS_PORT/metrics" ;;
  *) log "webhook metrics (HTTPS, a token allowed to get /metrics):"; scrape_hint "$METRICS_PORT" >&2 ;;
esac

# ---- the controller
if [ -n "$WEBHOOK_ONLY" ]; then
  log "NMO_DEPLOY_WEBHOOK_ONLY set: not starting the controller"
else
  bash "$CONTROLLER_SCRIPT" || die "starting the controller failed (see above); the webhook is running"
fi

# ---- the local Prometheus of make companions, if it runs, scrapes them
targets="$CLUSTER_DIR/prometheus/targets"
if [ -d "$targets" ] && [ -s "$CLUSTER_DIR/prometheus.url" ]; then
  prom_targets() { # SERVICE PORT: the scrape job's targets file, as tests/src/companions.rs writes it
    printf '[{"targets": ["127.0.0.1:%s"], "labels": {"job": "%s", "namespace": "%s", "service": "%s", "endpoint": "https"}}]\n' \
      "$2" "$1" "$NAMESPACE" "$1" >"$targets/${NAMESPACE}_$1.json.tmp" &&
      mv "$targets/${NAMESPACE}_$1.json.tmp" "$targets/${NAMESPACE}_$1.json"
  }
  prom_targets nmo-webhook-metrics "$METRICS_PORT"
  [ -n "$WEBHOOK_ONLY" ] || prom_targets nmo-controller-metrics "${NMO_CONTROLLER_METRICS_PORT:-28080}"
  log "the local Prometheus ($(cat "$CLUSTER_DIR/prometheus.url")) scrapes them (make companions)"
fi
