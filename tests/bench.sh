#!/usr/bin/env bash
# `make bench`: performance figures on the local control plane, printed (not
# asserted): controller drain time / API requests / RSS, how soon a drain
# blocked by a PodDisruptionBudget finishes once the PDB is deleted, webhook throughput,
# how soon after a kube-apiserver restart the controller finishes its work.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
echo "== building release binaries"
cargo build --release --workspace --bins
bash tests/cluster/up.sh
echo "== controller"
NMO_BIN_PROFILE=release "${CARGO_TARGET_DIR:-target}/release/controller-bench"
echo "== webhook"
bash tests/deploy/bench-webhook.sh
echo "== recovery from a kube-apiserver restart (SIGKILL, down 8 s; tests/tests/integration/restarts.rs)"
# The restart tests themselves, on the release binaries; each prints a
# "restart figure:" line. They restart the plane's API server four times.
log="$(mktemp)"
# (--ignored: suite restarts is the binary's only #[ignore]d one.)
if NMO_TEST_BINARIES=cargo NMO_BIN_PROFILE=release cargo test -q -p nmo-tests --test integration -- \
  --ignored --test-threads=1 --nocapture apiserver_restart >"$log" 2>&1; then
  sed -n 's/^restart figure: /  /p' "$log"
  rm -f "$log"
else
  tail -n 60 "$log"
  echo "restart tests failed; full output in $log" >&2
  exit 1
fi
