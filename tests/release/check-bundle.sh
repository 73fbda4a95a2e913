#!/usr/bin/env bash
# Checks the committed OLM bundle (bundle/):
#   1. the base manifests' image tags are the workspace version (Cargo.toml)
#   2. drift: bundle/ is exactly what `make bundle` generates from manifests/overlays/openshift
#   3. the Operator Framework's validators accept it: `operator-verify manifests`
#      (github.com/operator-framework/api, with --object_validate) and
#      nmo-bundle-validate (same library, plus OperatorHub v2, capabilities,
#      categories, good practices, removed APIs at the CSV's minKubeVersion);
#      any error or warning fails the check.
# The validators are built once (tests/release/tools.sh) and cached.
#   tests/release/check-bundle.sh [BUNDLE_DIR]   (default bundle/; a directory
#   other than bundle/ skips the drift check, e.g. a release's dist/bundle)
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS
bundle="${1:-$REPO_ROOT/bundle}"
[ -d "$bundle/manifests" ] || die "$bundle/manifests does not exist: run 'make bundle'"

step "validator tools"
tools="$(bash "$RELEASE_DIR/tools.sh" | tail -n 1)" ||
  die "'bash tests/release/tools.sh' failed (message above)"

version="$(workspace_version)"
if [ "$(cd "$bundle" && pwd)" = "$REPO_ROOT/bundle" ]; then
  step "image tags = workspace version $version"
  kubectl="$(kubectl_bin)"
  images="$("$kubectl" kustomize manifests/base | sed -n 's/^ *image: *//p' | sort -u)" ||
    die "'$kubectl kustomize manifests/base' failed"
  [ -n "$images" ] || die "no image: lines in the rendered manifests/base"
  while read -r img; do
    [ "${img##*:}" = "$version" ] ||
      die "image $img in manifests/base is not tagged with the workspace version $version: set newTag: $version in manifests/base/kustomization.yaml and the image: lines of manifests/base/*-deployment.yaml"
  done <<<"$images"

  step "drift: bundle/ against a fresh generation"
  fresh="$(mktemp -d)"
  trap 'rm -rf "$fresh"' EXIT
  bash "$RELEASE_DIR/bundle.sh" --out "$fresh" >/dev/null
  if ! diff -ru "$bundle" "$fresh" >"$fresh.diff" 2>&1; then
    cat "$fresh.diff" >&2
    rm -f "$fresh.diff"
    die "bundle/ differs from what the manifests and tests/tools/src/bin/bundle-gen.rs generate (diff above: - committed, + generated); run 'make bundle' and commit bundle/"
  fi
  rm -f "$fresh.diff"
  log "bundle/ is up to date"
fi

step "operator-verify manifests --object_validate $bundle"
# operator-verify logs errors but always exits 0: judge its output.
ov_out="$("$tools/operator-verify" manifests --object_validate "$bundle" 2>&1)" || true
[ -z "$ov_out" ] || printf '%s\n' "$ov_out" >&2
if grep -qE 'level=(error|fatal)' <<<"$ov_out"; then
  die "operator-verify reports errors (above) for $bundle"
fi
if grep -q 'level=warning' <<<"$ov_out"; then
  die "operator-verify reports warnings (above) for $bundle; fix them in the manifests or tests/tools/src/bin/bundle-gen.rs"
fi
log "operator-verify: no errors, no warnings"

min_kube="$(sed -n 's/^  minKubeVersion: *//p' "$bundle"/manifests/*.clusterserviceversion.yaml | tr -d "'\"")"
step "nmo-bundle-validate -k8s-version $min_kube -strict $bundle"
"$tools/nmo-bundle-validate" -k8s-version "$min_kube" -strict "$bundle" >&2 ||
  die "the Operator Framework validators report problems (above) for $bundle; fix them in the manifests or tests/tools/src/bin/bundle-gen.rs"
log "bundle checked in $((SECONDS - start)) s"
