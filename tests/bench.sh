#!/usr/bin/env bash
# `make bench`: performance figures on the local control plane, printed (not
# asserted): controller drain time / API requests / RSS, webhook throughput.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
echo "== building release binaries"
cargo build --release --workspace --bins
bash tests/cluster/up.sh
echo "== controller"
NMO_BIN_PROFILE=release ./target/release/controller-bench
echo "== webhook"
bash tests/deploy/bench-webhook.sh
