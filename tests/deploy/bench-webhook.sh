#!/usr/bin/env bash
# Webhook figures for `make bench`: (re)deploys the release webhook on the local
# control plane (tests/deploy/deploy-local.sh), then sends AdmissionReviews to it
# directly over TLS with keep-alive at concurrency 1 and 32, and prints
# reviews/s, latency percentiles and the webhook's memory.
#
#   tests/deploy/bench-webhook.sh                # 10 s per level
#   BENCH_DURATION=30s tests/deploy/bench-webhook.sh
#   NMO_BENCH_SKIP_DEPLOY=1 tests/deploy/bench-webhook.sh   # reuse the running webhook
#
# Target on a 2-core machine: >= 5000 reviews/s, p99 <= 2 ms. Client and webhook
# share the machine (the client uses one thread), so the figures are a lower bound.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CLUSTER_DIR="${NMO_CLUSTER_DIR:-$REPO_ROOT/.cluster}"
RELEASE_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

if [ -z "${NMO_BENCH_SKIP_DEPLOY:-}" ]; then
  NMO_DEPLOY_WEBHOOK_ONLY=1 bash "$REPO_ROOT/tests/deploy/deploy-local.sh"
fi
pid_file="$CLUSTER_DIR/pids/webhook.pid"
[ -f "$pid_file" ] || { echo "[bench] ERROR: no webhook running ($pid_file missing); run make deploy-local" >&2; exit 1; }
(cd "$REPO_ROOT" && cargo build --release -p nmo-webhook --bin webhook-bench) ||
  { echo "[bench] ERROR: building webhook-bench failed (see above)" >&2; exit 1; }

bench() {
  "$RELEASE_DIR/webhook-bench" \
    --addr "127.0.0.1:${NMO_WEBHOOK_PORT:-9443}" \
    --ca-file "$CLUSTER_DIR/certs/ca/ca.crt" \
    --server-name localhost \
    --node "${BENCH_NODE:-worker-1}" \
    --pid "$(cat "$pid_file")" \
    --duration "${BENCH_DURATION:-10s}" \
    --warmup "${BENCH_WARMUP:-2s}" \
    "$@"
}
echo "== webhook: direct AdmissionReview load (release build, TLS, keep-alive)"
echo "-- closed loop: each connection sends its next review as soon as the last is answered"
bench --concurrency 1 --concurrency 32
echo "-- open loop: ${BENCH_RATE:-5000} reviews/s offered over 32 connections"
bench --concurrency 32 --rate "${BENCH_RATE:-5000}"
