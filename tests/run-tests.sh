#!/usr/bin/env bash
# `make test`: unit tests first (fast, no cluster), then the local control plane
# and the integration tests in tests/ against it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

if [ "${1:-}" != "--integration-only" ]; then
  echo "== unit tests"
  cargo test --workspace --lib --bins
  cargo test -p nmo-shared -p nmo-certs --tests
fi

echo "== local control plane"
bash tests/cluster/up.sh

echo "== integration tests (against $(cat .cluster/kubeconfig | awk '/server:/ {print $2; exit}'))"
# The binaries under test are spawned by the tests: build them first.
cargo build --workspace --bins
cargo test -p nmo-tests -- --test-threads="${NMO_TEST_THREADS:-4}"
