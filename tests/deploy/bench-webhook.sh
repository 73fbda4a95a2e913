#!/usr/bin/env bash
# Webhook figures for `make bench`: (re)deploys the webhook on the local control
# plane from its image, as its manifests/base Deployment runs it
# (tests/deploy/deploy-local.sh), then sends AdmissionReviews to it
# directly over TLS with keep-alive at concurrency 1 and 32, and prints
# reviews/s, latency percentiles and the webhook's memory.
#
#   tests/deploy/bench-webhook.sh                # 10 s per level
#   BENCH_DURATION=30s tests/deploy/bench-webhook.sh
#   NMO_BENCH_SKIP_DEPLOY=1 tests/deploy/bench-webhook.sh   # reuse the running webhook
#
# Two kinds of review: allowed creates for BENCH_NODE (worker-1), which list the
# node's pods for the warnings (one API request each), and denied creates for
# BENCH_DENIED_NODE (nmo-bench-denied, a bare Node made here that gets a
# NodeMaintenance first), answered from the webhook's caches alone: the
# CPU-bound path, the one the release profile choice rests on
# (docs/performance.md, "Release profile per service").
#
# Target on a 2-core machine: >= 5000 reviews/s, p99 <= 2 ms. Client and webhook
# share the machine (the client uses one thread), so the figures are a lower bound.
# The webhook serves on one thread here (BENCH_WEBHOOK_WORKER_THREADS), as it does
# in its Deployment: a 200m CPU limit gives one usable CPU. Besides the client's
# end-to-end latency, each level prints the time spent inside the webhook (from
# its nmo_webhook_review_duration_seconds histogram), and the run starts with a
# probe of how steady the host CPU is: hosts that take the CPU away for tens of
# milliseconds set the latency tail, whatever the webhook does.
# webhook-bench reads that histogram over plain HTTP, so this deployment adds
# --metrics-secure=false to the manifest's arguments (NMO_WEBHOOK_METRICS_SECURE);
# a webhook reused with NMO_BENCH_SKIP_DEPLOY=1 from a plain `make deploy-local`
# serves HTTPS metrics, and the in-webhook figures are then left out.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_DIR="${NMO_CLUSTER_DIR:-$REPO_ROOT/.cluster}"
RELEASE_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

if [ -z "${NMO_BENCH_SKIP_DEPLOY:-}" ]; then
  NMO_DEPLOY_WEBHOOK_ONLY=1 NMO_WEBHOOK_WORKER_THREADS="${BENCH_WEBHOOK_WORKER_THREADS:-1}" \
    NMO_WEBHOOK_METRICS_SECURE=false bash "$REPO_ROOT/tests/deploy/deploy-local.sh"
fi
pid_file="$CLUSTER_DIR/pids/webhook.pid"
[ -f "$pid_file" ] || { echo "[bench] ERROR: no webhook running ($pid_file missing); run make deploy-local" >&2; exit 1; }
# The load generator (webhook-bench): the same command as make bench (one
# feature set, nothing rebuilt).
(cd "$REPO_ROOT" && cargo build --release --workspace --bins) ||
  { echo "[bench] ERROR: cargo build --release --workspace --bins failed (see above)" >&2; exit 1; }

# bench NODE [webhook-bench flags...]
bench() {
  local node="$1"
  shift
  "$RELEASE_DIR/webhook-bench" \
    --addr "127.0.0.1:${NMO_WEBHOOK_PORT:-9443}" \
    --ca-file "$CLUSTER_DIR/certs/ca/ca.crt" \
    --server-name localhost \
    --node "$node" \
    --pid "$(cat "$pid_file")" \
    --duration "${BENCH_DURATION:-10s}" \
    --warmup "${BENCH_WARMUP:-2s}" \
    --metrics-url "$metrics_url" \
    "$@"
}
metrics_url="http://127.0.0.1:${NMO_WEBHOOK_METRICS_PORT:-18080}/metrics"
curl -fsS --max-time 2 -o /dev/null "$metrics_url" 2>/dev/null ||
  echo "[bench] WARNING: $metrics_url does not answer plain HTTP (a webhook with secure metrics?): the in-webhook figures are left out; run without NMO_BENCH_SKIP_DEPLOY" >&2
echo "== webhook: direct AdmissionReview load (the image's binary, TLS, keep-alive)"
allowed_node="${BENCH_NODE:-worker-1}"
echo "-- allowed creates for $allowed_node (each lists the node's pods for its warnings: one API request)"
echo "-- closed loop: each connection sends its next review as soon as the last is answered"
bench "$allowed_node" --concurrency 1 --concurrency 32
echo "-- open loop: ${BENCH_RATE:-5000} reviews/s offered over 32 connections"
bench "$allowed_node" --concurrency 32 --rate "${BENCH_RATE:-5000}" --cpu-probe 0s

# ---- denied creates: a node that already has a NodeMaintenance
denied_node="${BENCH_DENIED_NODE:-nmo-bench-denied}"
kc() { "$CLUSTER_DIR/bin/kubectl" --kubeconfig "$CLUSTER_DIR/kubeconfig" "$@"; }
remove_denied() {
  # No finalizer unless a controller runs; with one, it gives the node back
  # (or finds it gone) on its own.
  kc delete nodemaintenance "$denied_node" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kc delete node "$denied_node" --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
trap remove_denied EXIT
nm_yaml() { # nm_yaml NAME REASON
  printf 'apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: %s\nspec:\n  nodeName: %s\n  reason: %s\n' "$1" "$denied_node" "$2"
}
{ printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: %s\n---\n' "$denied_node"; nm_yaml "$denied_node" "webhook bench"; } |
  kc apply -f - >/dev/null ||
  { echo "[bench] ERROR: could not create Node and NodeMaintenance $denied_node (see above)" >&2; exit 1; }
# The webhook must know that NodeMaintenance before the load: a second one for
# the same node, sent through the API server (dry run), is refused once it does.
deadline=$((SECONDS + 30))
until out="$(nm_yaml "$denied_node-second" "readiness check" | kc create --dry-run=server -o name -f - 2>&1)"; [[ "$out" == *"denied the request"* ]]; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "[bench] ERROR: after 30 s the webhook still allows a second NodeMaintenance for $denied_node; last answer: $out" >&2
    exit 1
  fi
  sleep 0.5 # poll interval of the wait above, not a synchronisation
done
echo "-- denied creates for $denied_node, which has a NodeMaintenance (answered from the caches, no API request)"
bench "$denied_node" --concurrency 1 --concurrency 32 --cpu-probe 0s
