#!/usr/bin/env bash
# `make release VERSION=x.y.z`: everything a release publishes, in dist/:
#   nmo-controller.oci.tar, nmo-webhook.oci.tar   the images (tests/release/images.sh)
#   nmo-bundle.oci.tar, bundle/                   the OLM bundle for VERSION, images by digest
#   install-base.yaml, install-cert-manager.yaml, install-openshift.yaml
#                                                 `kubectl kustomize` of each variant, images by digest
#   install-monitoring.yaml                       manifests/monitoring, its alerts' runbook_urls
#                                                 pointing at docs/troubleshooting.md of tag vVERSION
#   digests.txt                                   "<name> <reference> <index digest>" per service image
#                                                 (what the YAMLs and the bundle pin), "<name>/<os>/<arch>
#                                                 <reference> <manifest digest>" per platform, and
#                                                 "nmo-bundle <reference> <manifest digest>"
#   SHA256SUMS                                    of every other file (sha256sum -c SHA256SUMS)
# The committed bundle/ and manifests stay at the workspace version.
#
# Environment: IMAGE_REGISTRY (default quay.io/nmo-rs), KUBECTL,
# RELEASE_REPOSITORY (the runbook links' repository; default: Cargo.toml's,
# which must not be a placeholder such as example.invalid),
# ALLOW_DIRTY=1 to release from a work tree with uncommitted changes (the
# images are then not reproducible from any commit; their revision label says
# "-dirty").
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS

step "preconditions"
VERSION="${1:-${VERSION:-}}"
[ -n "$VERSION" ] || die "no version: run 'make release VERSION=x.y.z' (the workspace version is $(workspace_version))"
check_release_version "$VERSION"
repository="${RELEASE_REPOSITORY:-$(workspace_repository)}"
check_runbook_repository "$repository"
ws_version="$(workspace_version)"
if [ "$VERSION" != "$ws_version" ]; then
  log "WARNING: VERSION=$VERSION but Cargo.toml says $ws_version: the binaries' --version reports $ws_version;"
  log "WARNING: for a real release set [workspace.package] version = \"$VERSION\", the image tags in manifests/base, run 'make bundle', commit, then release"
fi
revision="$(git_revision)"
if [[ "$revision" == *-dirty ]] && [ "${ALLOW_DIRTY:-}" != 1 ]; then
  git status --short >&2
  die "the work tree has uncommitted changes (above): a release must be built from a commit; commit or stash them, or set ALLOW_DIRTY=1 for a test release"
fi
kubectl="$(kubectl_bin)"
epoch="$(source_date_epoch)"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
dist="$REPO_ROOT/dist"
rm -rf "$dist"
mkdir -p "$dist"
log "release $VERSION of revision $revision into $dist (registry $IMAGE_REGISTRY)"

step "images"
VERSION="$VERSION" IMAGES_OUT="$dist" bash "$RELEASE_DIR/images.sh" >/dev/null ||
  die "'VERSION=$VERSION IMAGES_OUT=$dist bash tests/release/images.sh' failed (message above)"
declare -A digest_of ref_of
while read -r name ref digest; do
  digest_of[$name]="$digest"
  ref_of[$name]="${ref%:*}@$digest"
done <"$dist/digests.txt"
for svc in "${SERVICES[@]}"; do
  [ -n "${digest_of[nmo-$svc]:-}" ] || die "no digest for nmo-$svc in $dist/digests.txt"
  # What gets pinned is the image index (every platform), never one platform's manifest.
  top="$(tar -xOf "$dist/nmo-$svc.oci.tar" index.json | jq -r '.manifests[0] | .mediaType + " " + .digest')" ||
    die "cannot read index.json of $dist/nmo-$svc.oci.tar"
  [ "$top" = "application/vnd.oci.image.index.v1+json ${digest_of[nmo-$svc]}" ] ||
    die "digests.txt pins nmo-$svc at ${digest_of[nmo-$svc]}, but the archive's index.json names '$top', not that image index: rebuild with 'make images'"
done

step "OLM bundle for $VERSION"
image_args=()
for svc in "${SERVICES[@]}"; do image_args+=(--image "nmo-$svc=${ref_of[nmo-$svc]}"); done
bash "$RELEASE_DIR/bundle.sh" --out "$dist/bundle" --version "$VERSION" --created-at "$created" "${image_args[@]}" >/dev/null ||
  die "generating the bundle into $dist/bundle failed (message above)"
bash "$RELEASE_DIR/check-bundle.sh" "$dist/bundle" ||
  die "the release bundle in $dist/bundle does not validate (message above)"
bundle_digest="$("$TARGET_DIR/debug/oci-image" --containerfile "$dist/bundle/bundle.Containerfile" --context "$dist/bundle" \
  --build-arg "REVISION=$revision" --build-arg "CREATED=$created" --created-epoch "$epoch" \
  --ref "$IMAGE_REGISTRY/nmo-bundle:$VERSION" --out "$dist/nmo-bundle.oci.tar")" ||
  die "'oci-image --containerfile $dist/bundle/bundle.Containerfile' failed (message above)"
echo "nmo-bundle $IMAGE_REGISTRY/nmo-bundle:$VERSION $bundle_digest" >>"$dist/digests.txt"

step "install manifests pinned by digest"
# kustomize only loads bases by relative path, and only from inside a tree it
# may read: the temporary kustomizations live in target/.
work="$REPO_ROOT/target/release-kustomize"
rm -rf "$work"
for variant in base overlays/cert-manager overlays/openshift; do
  name="${variant#overlays/}"
  dir="$work/$name"
  mkdir -p "$dir"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "  - $(realpath --relative-to="$dir" "$REPO_ROOT/manifests/$variant")"
    echo "images:"
    for svc in "${SERVICES[@]}"; do
      # The base names its images quay.io/nmo-rs/nmo-<svc>:<workspace version>.
      echo "  - name: quay.io/nmo-rs/nmo-$svc"
      echo "    newName: $IMAGE_REGISTRY/nmo-$svc"
      echo "    newTag: \"$VERSION\""
      echo "    digest: ${digest_of[nmo-$svc]}"
    done
  } >"$dir/kustomization.yaml"
  out="$dist/install-$name.yaml"
  "$kubectl" kustomize "$dir" >"$out" ||
    die "'$kubectl kustomize $dir' (manifests/$variant with the release images) failed (message above)"
  for svc in "${SERVICES[@]}"; do
    want="$IMAGE_REGISTRY/nmo-$svc:$VERSION@${digest_of[nmo-$svc]}"
    grep -qF "image: $want" "$out" || die "$out does not use $want"
  done
  unpinned="$(grep -E '^ *image: ' "$out" | grep -v '@sha256:' || true)"
  [ -z "$unpinned" ] || die "$out has images not pinned by digest: $unpinned"
  log "$out"
done
rm -rf "$work"

step "alert rules linking to the guide of v$VERSION"
from="$(runbook_base "$(workspace_repository)" main)"
to="$(runbook_base "$repository" "v$VERSION")"
"$kubectl" kustomize "$REPO_ROOT/manifests/monitoring" | pin_runbooks "$from" "$to" >"$dist/install-monitoring.yaml" ||
  die "rendering manifests/monitoring with its runbook links at $to failed (message above)"
log "$dist/install-monitoring.yaml (runbooks: $to)"

step "SHA256SUMS"
(cd "$dist" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum >SHA256SUMS)
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || die "SHA256SUMS does not verify"

log "release $VERSION done in $((SECONDS - start)) s:"
(cd "$dist" && ls -l --time-style=+ | tail -n +2 >&2)
cat "$dist/digests.txt"
