#!/usr/bin/env bash
# Run nmo-controller against the local control plane as the manifests/base
# Deployment nmo-controller describes it, from the built image, exactly as the
# integration tests run it: tests/tools/src/bin/local-pod.rs takes the command,
# arguments (--leader-elect, ...), environment (OPERATOR_NAMESPACE, POD_NAME)
# and readiness probe from the rendered manifest, the binary from
# target/images/nmo-controller.oci.tar, mints a 24 h token of the Deployment's
# ServiceAccount (.cluster/controller.kubeconfig, so the RBAC of
# manifests/controller is real), runs it as the image's user 65532 when we are
# root, detached in its own process group, and waits for the readiness probe.
# Called by deploy-local.sh (which builds the images first); run alone it builds
# them itself (make images; NMO_DEPLOY_SKIP_IMAGES=1 skips that) and applies
# the CRD, namespace and RBAC (server-side).
#
#   tests/deploy/controller-local.sh          (re)start; returns once ready
#   tests/deploy/controller-local.sh --stop   stop it
#
# Files: pid .cluster/pids/controller.pid, log .cluster/logs/controller.log (the
# previous run's in .cluster/logs/previous/). Ports: metrics 28080
# [NMO_CONTROLLER_METRICS_PORT] (container port 8443, HTTPS with
# TokenReview/SubjectAccessReview as in the manifest: the scrape command is
# printed), probes 28081 [NMO_CONTROLLER_PROBE_PORT] (container port 8081).
# NMO_CONTROLLER_LOG_LEVEL, when set, adds --zap-level.
set -euo pipefail

log() { printf '[controller %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[controller] ERROR: %s\n' "$*" >&2; exit 1; }
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

METRICS_PORT="${NMO_CONTROLLER_METRICS_PORT:-28080}"
PROBE_PORT="${NMO_CONTROLLER_PROBE_PORT:-28081}"
READY_TIMEOUT="${NMO_CONTROLLER_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${NMO_CONTROLLER_STOP_TIMEOUT:-15}"

if [ "${1:-}" = "--stop" ]; then
  stop_pod nmo-controller "$STOP_TIMEOUT"
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1' (use no argument to start, --stop to stop)"

[ -f "$ADMIN_KUBECONFIG" ] || die "no local cluster ($ADMIN_KUBECONFIG missing): run 'make cluster-up'"
build_all
apply_prereqs

stop_pod nmo-controller "$STOP_TIMEOUT"
check_ports_free "NMO_CONTROLLER_METRICS_PORT / NMO_CONTROLLER_PROBE_PORT" "$METRICS_PORT" "$PROBE_PORT"
# Dev-only flags after the manifest's (the last one wins):
# --nodemaintenance-selector: leave NodeMaintenances labelled nmo-test/group to
# the integration tests' own controllers, so this one never touches their objects.
extra=('--nodemaintenance-selector=!nmo-test/group')
[ -z "${NMO_CONTROLLER_LOG_LEVEL:-}" ] || extra+=("--zap-level=$NMO_CONTROLLER_LOG_LEVEL")
add_extra_args NMO_CONTROLLER_EXTRA_ARGS
start_pod nmo-controller \
  --port "8443=$METRICS_PORT" --port "8081=$PROBE_PORT" \
  --mint-kubeconfig "$CLUSTER_DIR/controller.kubeconfig" --token-hours 24 \
  --pod-name nmo-controller-local --ready-timeout "$READY_TIMEOUT" \
  -- "${extra[@]}"
log "controller ready (pid $(cat "$PIDS/controller.pid")); probes http://127.0.0.1:$PROBE_PORT/readyz; metrics (HTTPS, a token allowed to get /metrics):"
scrape_hint "$METRICS_PORT" >&2
