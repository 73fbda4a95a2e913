#!/usr/bin/env bash
# The arm64 stage of `make test` (alone: `make test-arm64`): the services'
# linux/arm64 images against the local control plane. Each binary comes out of
# its image index (target/images/nmo-<service>.oci.tar, the arm64 manifest)
# and runs as its Deployment would, under qemu-aarch64 on an amd64 machine
# (tests/src/deployment.rs): suite arm64 (tests/tests/integration/arm64.rs,
# #[ignore]d in every other stage) shows the arm64 webhook admitting a
# NodeMaintenance and denying a duplicate, and the arm64 controller taking one
# to Succeeded and giving the node back once it is deleted.
#
#   bash tests/arm64.sh    the plane up (make cluster-up); builds the images
#                          first when an archive is missing (make images)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"
start=$SECONDS

cluster="${NMO_CLUSTER_DIR:-$root/.cluster}"
[ -f "$cluster/kubeconfig" ] || {
  echo "arm64: no local control plane ($cluster/kubeconfig is missing): run 'make cluster-up' first" >&2
  exit 1
}
command -v qemu-aarch64 >/dev/null || [ "$(uname -m)" = aarch64 ] || {
  echo "arm64: qemu-aarch64 not found (runs the arm64 binaries on this $(uname -m) machine): run 'apt-get install qemu-user' (or 'bash tests/setup.sh' as root)" >&2
  exit 1
}
images="${CARGO_TARGET_DIR:-$root/target}/images"
for svc in controller webhook; do
  if [ ! -f "$images/nmo-$svc.oci.tar" ]; then
    echo "arm64: $images/nmo-$svc.oci.tar is missing: building the images (make images; cold: 10-15 min on 2 cores)"
    bash tests/release/images.sh >/dev/null
    break
  fi
done
if ! grep -q "^nmo-webhook/linux/arm64 " "$images/digests.txt" 2>/dev/null; then
  echo "arm64: $images/digests.txt lists no linux/arm64 image: rebuild the images with 'make images'" >&2
  exit 1
fi

echo "== arm64: the linux/arm64 webhook and controller (under qemu-aarch64 here) against the local plane"
grep '/linux/arm64 ' "$images/digests.txt" | awk '{print "   " $1 " " $3}'
# Both tests at once: each has its own group, nodes and processes.
NMO_TEST_IMAGE_PLATFORM=linux/arm64 \
  cargo test -p nmo-tests --test integration -- --ignored --test-threads=2 --nocapture arm64::
echo "arm64 stage passed in $((SECONDS - start)) s"
