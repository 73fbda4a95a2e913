#!/usr/bin/env bash
# `make test`: every crate's own tests first (fast, no cluster), then the local
# control plane, the manifests check, and the integration tests against it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

if [ "${1:-}" != "--integration-only" ]; then
  echo "== unit and crate tests (no cluster)"
  cargo test --workspace --exclude nmo-tests
fi

echo "== local control plane"
bash tests/cluster/up.sh

echo "== manifests render (kustomize base and every variant)"
KUBECTL="$root/.cluster/bin/kubectl" bash manifests/check.sh

echo "== OLM bundle: drift against manifests/base, operator-verify validation"
KUBECTL="$root/.cluster/bin/kubectl" bash tests/release/check-bundle.sh

echo "== integration tests against the local control plane"
# The tests spawn the operator's binaries: build them first.
cargo build --workspace --bins
cargo test -p nmo-tests -- --test-threads="${NMO_TEST_THREADS:-4}"
