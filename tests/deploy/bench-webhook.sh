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

bench() {
  "$RELEASE_DIR/webhook-bench" \
    --addr "127.0.0.1:${NMO_WEBHOOK_PORT:-9443}" \
    --ca-file "$CLUSTER_DIR/certs/ca/ca.crt" \
    --server-name localhost \
    --node "${BENCH_NODE:-worker-1}" \
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
echo "-- closed loop: each connection sends its next review as soon as the last is answered"
bench --concurrency 1 --concurrency 32
echo "-- open loop: ${BENCH_RATE:-5000} reviews/s offered over 32 connections"
bench --concurrency 32 --rate "${BENCH_RATE:-5000}" --cpu-probe 0s
