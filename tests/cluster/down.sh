#!/usr/bin/env bash
# Stops the local control plane started by tests/cluster/up.sh, the real node of
# tests/node/up.sh (its own down.sh, first) and the companions
# of tests/companions/up.sh (cert-manager, Prometheus): every component by
# its recorded pid (TERM, then KILL after STOP_TIMEOUT seconds, default 15), plus
# any component process whose pid file was lost but whose command line points into
# this clone's .cluster/ (never by process name alone).
#
# Then removes the state (etcd data, PKI, kubeconfig, pid files, bin link), so the
# next up.sh starts from an empty cluster. Kept: .cluster/logs/ (for post-mortems
# of a failed test run; up.sh rotates it to logs/previous/) and the lock file.
# Running it twice, or with nothing running, is fine.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

if [ -d "$CLUSTER_DIR" ]; then
  exec 9>"$CLUSTER_DIR/.lock"
  flock 9
fi

# The real node first (tests/node/down.sh): it removes its Node while the
# API server still answers, and checks it left nothing behind.
node_rc=0
bash "$CLUSTER_LIB_DIR/../node/down.sh" || node_rc=$?

stop_all

left="$(for c in "${COMPONENTS[@]}" "${COMPANIONS[@]}"; do stray_pids "$c"; done)"
[ -z "$left" ] || die "component processes still alive after KILL: $left"

if [ -d "$CLUSTER_DIR" ]; then
  wipe_state
fi
log "control plane stopped; state removed (logs kept in $LOGS)"
[ "$node_rc" -eq 0 ] || die "the real node left something behind (message above)"
