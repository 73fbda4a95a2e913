#!/usr/bin/env bash
# `make bench-scale` (and the last stage of `make bench`): both services at
# scale. Starts a control plane of its own in .cluster-scale/ (beside the dev
# plane of .cluster/, on the next free ports), adds 1,000 kwok nodes with
# tests/cluster/add-nodes.sh, then runs target/release/scale-bench
# (tests/tools/src/bin/scale-bench/main.rs): 30,000 pods, the services from their
# images, the figures against the targets. Then the fleet gates
# (scale-bench/fleet/): the nodes labelled into 10 zones
# (topology.kubernetes.io/zone=zone-0..9), the controller started again with
# --max-concurrent-per-zone=1 --max-unavailable=10% --fleet-node-selector=
# nmo-rs/node-pool=scale, 200 NodeMaintenances at once (each deleted once
# Succeeded) against the plane's floor for the same drains (measured: the bench
# drains as many other nodes itself, one per zone at a time), and a 30-min soak
# of maintenances through the gates with the controller SIGKILLed every 2-6 min
# and this plane's kube-apiserver restarted once per 10 min. Takes some 60-85
# minutes on 2 cores: 25-45 for the fill and the first stages, about 5 for the
# fleet scenario, the soak and its wind-down; progress is printed throughout
# (a line at least every 30 s).
#
#   BENCH_SCALE_NODES=1000          nodes of pool "scale"
#   BENCH_SCALE_MAINTENANCES=100    NodeMaintenances created at once
#   BENCH_SCALE_SOAK=3m             churn stage (0s skips it)
#   BENCH_SCALE_FLEET_MAINTENANCES=200
#                                   the fleet scenario's NodeMaintenances, on
#                                   nodes no earlier stage drained (0 skips it)
#   BENCH_SCALE_FLEET_SOAK=30m      the fleet soak (0s skips it)
#   BENCH_SCALE_FLEET_KILL_EVERY=2m-6m
#                                   the soak SIGKILLs the controller after a
#                                   random time in this range, again and again
#   BENCH_SCALE_KEEP=1              leave the scale plane running (a rerun then
#                                   reuses its nodes and pods); by default it
#                                   is stopped and its state removed
#   NMO_TEST_BINARIES=cargo         run the services from cargo's release
#                                   binaries instead of the images (a quick
#                                   loop: skips the two-platform musl builds;
#                                   memory figures are then not the images')
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
nodes="${BENCH_SCALE_NODES:-1000}"
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_SCALE_NODES must be a positive integer, got '$nodes'" >&2; exit 2; }

# The services run from their images; only the bench's own tools are built here.
if [ "${NMO_TEST_BINARIES:-}" = cargo ]; then
  echo "== building the bench and the services (release; NMO_TEST_BINARIES=cargo: no images)"
  # Each --bin names its binary: a bare -p beside them would build only the
  # named bins of every package, and the services would run stale.
  cargo build --release -p nmo-tools -p nmo-controller -p nmo-webhook \
    --bin scale-bench --bin webhook-bench --bin nmo-controller --bin nmo-webhook
else
  echo "== building the bench (release) and the images"
  cargo build --release -p nmo-tools --bin scale-bench --bin webhook-bench
  bash tests/release/images.sh >/dev/null
fi

# A plane of its own: the dev plane (make test, make demo) keeps its few nodes.
# Its profile "scale" (tests/cluster/up.sh) raises the controller manager's and
# the scheduler's request rates and slows kwok's node heartbeats, so that two
# cores can play 1,000 kubelets.
export NMO_CLUSTER_DIR="$root/.cluster-scale"
stop_plane() {
  if [ -n "${BENCH_SCALE_KEEP:-}" ]; then
    echo "== scale plane left running (BENCH_SCALE_KEEP): NMO_CLUSTER_DIR=$NMO_CLUSTER_DIR; stop it with NMO_CLUSTER_DIR=$NMO_CLUSTER_DIR bash tests/cluster/down.sh"
  else
    echo "== stopping the scale plane"
    bash tests/cluster/down.sh >/dev/null 2>&1 || echo "stopping the scale plane failed: run NMO_CLUSTER_DIR=$NMO_CLUSTER_DIR bash tests/cluster/down.sh" >&2
  fi
}
trap stop_plane EXIT
echo "== scale plane in $NMO_CLUSTER_DIR"
PLANE_PROFILE=scale CONTROL_PLANES=3 WORKERS=0 bash tests/cluster/up.sh
kubectl=("$NMO_CLUSTER_DIR/bin/kubectl" --kubeconfig "$NMO_CLUSTER_DIR/kubeconfig")
have="$("${kubectl[@]}" get nodes -l nmo-rs/node-pool=scale -o name | wc -l)"
if [ "$have" -lt "$nodes" ]; then
  echo "== adding $((nodes - have)) kwok nodes (pool scale; $have there already)"
  t0=$SECONDS
  bash tests/cluster/add-nodes.sh "$((nodes - have))" scale >/dev/null
  echo "nodes: $nodes Ready after $((SECONDS - t0)) s"
fi
BENCH_SCALE_NODES="$nodes" NMO_BIN_PROFILE=release "${CARGO_TARGET_DIR:-target}/release/scale-bench"
