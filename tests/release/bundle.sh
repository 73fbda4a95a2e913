#!/usr/bin/env bash
# `make bundle`: (re)writes the OLM bundle from the rendered manifests of
# overlays/openshift: base plus the webhook's Role in openshift-etcd (the etcd
# quorum rule needs it on OpenShift, OLM's home); bundle-gen drops what differs
# otherwise (certificate annotations: OLM serves the webhook certificate).
#
#   tests/release/bundle.sh [--out DIR] [--manifests DIR] [bundle-gen options...]
#
# --out defaults to bundle/ (committed; for the workspace version), --manifests
# to manifests/overlays/openshift. Other options go to bundle-gen (tests/tools/src/bin/bundle-gen.rs):
# --version V, --image DEPLOYMENT=IMAGE, --created-at TIME.
# KUBECTL: the kubectl that renders (default: the local control plane's).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

out="$REPO_ROOT/bundle"
manifests="manifests/overlays/openshift"
gen_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --manifests) manifests="$2"; shift 2 ;;
    *) gen_args+=("$1"); shift ;;
  esac
done

step "render $manifests"
kubectl="$(kubectl_bin)"
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
"$kubectl" kustomize "$manifests" >"$rendered" ||
  die "'$kubectl kustomize $manifests' failed (message above); fix the manifests, or check with 'bash manifests/check.sh'"

step "bundle-gen"
cargo build --locked -q -p nmo-tools --bin bundle-gen ||
  die "'cargo build -p nmo-tools --bin bundle-gen' failed (compiler output above)"
"$TARGET_DIR/debug/bundle-gen" --manifests "$rendered" --out "$out" "${gen_args[@]}" ||
  die "'bundle-gen --manifests <kubectl kustomize $manifests> --out $out ${gen_args[*]}' failed (message above)"
