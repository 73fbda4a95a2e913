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

echo "== images (the integration tests run the services from them)"
bash tests/release/images.sh

echo "== integration tests against the local control plane"
# Each service runs as its manifest's Deployment, out of its unpacked image
# (tests/src/deployment.rs). NMO_TEST_BINARIES=cargo runs cargo's debug
# binaries instead, for a quick local loop only.
if [ "${NMO_TEST_BINARIES:-}" = cargo ]; then cargo build --workspace --bins; fi
cargo test -p nmo-tests -- --test-threads="${NMO_TEST_THREADS:-4}"
