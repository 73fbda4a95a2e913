#!/usr/bin/env bash
# `make images`: one OCI image archive per service, without a container daemon,
# reproducibly (same commit => same digests, from any clone directory).
#
#   1. cargo build --release for x86_64-unknown-linux-musl (static binaries;
#      paths remapped so the clone directory and CARGO_HOME never leak in)
#   2. tests/tools/src/bin/oci-image.rs reads controller/Containerfile and
#      webhook/Containerfile and writes target/images/nmo-<svc>.oci.tar
#      (FROM scratch, the binary, USER 65532:65532, OCI labels; every
#      timestamp = SOURCE_DATE_EPOCH = the commit's time)
#   3. checks each archive: blob digests, config (user, entrypoint, labels), a
#      statically linked binary that runs `--version` and `--help` as 65532
#
# Environment: VERSION (default: Cargo.toml's workspace version),
# IMAGE_REGISTRY (default quay.io/nmo-rs), IMAGES_OUT (default target/images),
# SOURCE_DATE_EPOCH (default: the commit's time).
# Prints "<name> <reference> <manifest digest>" per image; the same lines go to
# $IMAGES_OUT/digests.txt.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"
start=$SECONDS

step "preconditions"
VERSION="${VERSION:-$(workspace_version)}"
check_release_version "$VERSION"
out="${IMAGES_OUT:-$IMAGES_DIR}"
command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain (rustup)"
# (captured, not piped into grep -q: SIGPIPE under pipefail)
[[ "$(rustup target list --installed 2>/dev/null)" == *"$MUSL_TARGET"* ]] ||
  die "the Rust target $MUSL_TARGET is not installed: run 'rustup target add $MUSL_TARGET'"
command -v musl-gcc >/dev/null ||
  die "musl-gcc not found (ring compiles C for $MUSL_TARGET): run 'apt-get install musl-tools'"
for t in jq file setpriv; do
  command -v "$t" >/dev/null || die "$t not found (used to check the images): run 'apt-get install jq file util-linux'"
done
revision="$(git_revision)"
epoch="$(source_date_epoch)"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
[[ "$revision" != *-dirty ]] ||
  log "WARNING: the work tree has uncommitted changes: revision label '$revision'; these images are not reproducible from a commit"
log "version $VERSION, revision $revision, created $created (SOURCE_DATE_EPOCH=$epoch), registry $IMAGE_REGISTRY"

step "musl release build"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
# CARGO_ENCODED_RUSTFLAGS (0x1f-separated) survives spaces in paths. With
# --target these flags reach only the target's crates, not build scripts, so
# the host build cache is left alone.
sep=$'\x1f'
# The last matching prefix wins: the target dir (build scripts' OUT_DIR) may
# sit inside the clone.
rustflags="--remap-path-prefix=$REPO_ROOT=/nmo-rs$sep--remap-path-prefix=$cargo_home=/cargo$sep--remap-path-prefix=$TARGET_DIR=/target"
cflags="-ffile-prefix-map=$REPO_ROOT=/nmo-rs -ffile-prefix-map=$cargo_home=/cargo -ffile-prefix-map=$TARGET_DIR=/target"
logs="$TARGET_DIR/release-logs"
mkdir -p "$out" "$logs"
log "cargo build --release --locked --target $MUSL_TARGET -p nmo-controller -p nmo-webhook (cold: 5-15 min on 2 cores)"
run_logged "cargo build ($MUSL_TARGET)" "$logs/musl-build.log" \
  env CARGO_ENCODED_RUSTFLAGS="$rustflags" \
  CFLAGS_x86_64_unknown_linux_musl="$cflags" \
  NMO_GIT_REVISION="$revision" SOURCE_DATE_EPOCH="$epoch" CARGO_TERM_PROGRESS_WHEN=never \
  cargo build --release --locked --target "$MUSL_TARGET" -p nmo-controller -p nmo-webhook
bindir="$TARGET_DIR/$MUSL_TARGET/release"

step "image writer"
# A debug host tool; built without the musl RUSTFLAGS above.
run_logged "cargo build --bin oci-image" "$logs/oci-image-build.log" \
  cargo build --locked -q -p nmo-tools --bin oci-image
oci_image="$TARGET_DIR/debug/oci-image"

: >"$out/digests.txt.partial"
for svc in "${SERVICES[@]}"; do
  name="nmo-$svc"
  ref="$IMAGE_REGISTRY/$name:$VERSION"
  archive="$out/$name.oci.tar"

  step "image $name"
  bin="$bindir/$name"
  file_out="$(file -b "$bin")"
  [[ "$file_out" == *"statically linked"* || "$file_out" == *"static-pie linked"* ]] ||
    die "$bin is not statically linked ('file' says: $file_out); it would not run in a FROM scratch image"
  digest="$("$oci_image" --containerfile "$svc/Containerfile" --context "$bindir" \
    --build-arg "VERSION=$VERSION" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
    --created-epoch "$epoch" --ref "$ref" --out "$archive")" ||
    die "'oci-image --containerfile $svc/Containerfile --context $bindir ...' failed (message above)"

  step "check $name"
  # Under /tmp: uid 65532 must be able to reach the unpacked binary.
  check="$(mktemp -d "${TMPDIR:-/tmp}/nmo-image-check.XXXXXX")"
  mkdir -p "$check/layout" "$check/rootfs"
  tar -xf "$archive" -C "$check/layout" || die "'tar -xf $archive' failed: not a tar archive"
  for blob in "$check/layout/blobs/sha256/"*; do
    [ "$(sha256sum "$blob" | cut -d' ' -f1)" = "$(basename "$blob")" ] || die "blob $(basename "$blob") of $archive does not match its digest"
  done
  [ "$(jq -r '.manifests[0].digest' "$check/layout/index.json")" = "$digest" ] || die "index.json of $archive does not point at manifest $digest"
  manifest="$check/layout/blobs/sha256/${digest#sha256:}"
  config="$check/layout/blobs/sha256/$(jq -r '.config.digest' "$manifest" | cut -d: -f2)"
  [ "$(jq -r '.config.User' "$config")" = "65532:65532" ] || die "$name: config User is not 65532:65532"
  [ "$(jq -c '.config.Entrypoint' "$config")" = "[\"/$name\"]" ] || die "$name: config Entrypoint is not [\"/$name\"]"
  for l in title description version revision source licenses created; do
    [ -n "$(jq -r --arg k "org.opencontainers.image.$l" '.config.Labels[$k] // empty' "$config")" ] ||
      die "$name: label org.opencontainers.image.$l missing"
  done
  [ "$(jq -r '.config.Labels["org.opencontainers.image.version"]' "$config")" = "$VERSION" ] || die "$name: version label is not $VERSION"
  for layer in $(jq -r '.layers[].digest' "$manifest"); do
    tar -xzf "$check/layout/blobs/sha256/${layer#sha256:}" -C "$check/rootfs" || die "$name: layer $layer does not unpack"
  done
  files="$(cd "$check/rootfs" && find . -mindepth 1 | sort | tr '\n' ' ')"
  [ "$files" = "./$name " ] || die "$name: the image should hold only /$name, it holds: $files"
  run_as=()
  [ "$(id -u)" -ne 0 ] || run_as=(setpriv --reuid=65532 --regid=65532 --clear-groups)
  chmod 755 "$check" "$check/rootfs"
  v="$("${run_as[@]}" "$check/rootfs/$name" --version 2>&1)" || die "$name: '/$name --version' from the unpacked image failed: $v"
  "${run_as[@]}" "$check/rootfs/$name" --help >/dev/null 2>&1 || die "$name: '/$name --help' from the unpacked image failed"
  if command -v skopeo >/dev/null; then
    skopeo inspect "oci-archive:$archive" >/dev/null 2>"$check/skopeo.err" ||
      die "$name: 'skopeo inspect oci-archive:$archive' cannot read the archive: $(cat "$check/skopeo.err")"
  fi
  rm -rf "$check"
  log "$name: $ref $digest ($(du -h "$archive" | cut -f1), '$v')"
  echo "$name $ref $digest" >>"$out/digests.txt.partial"
done
mv "$out/digests.txt.partial" "$out/digests.txt"
log "images written to $out in $((SECONDS - start)) s (digests: $out/digests.txt)"
cat "$out/digests.txt"
