#!/usr/bin/env bash
# `make images`: one OCI image index per service, holding one image per
# platform (linux/amd64, linux/arm64), without a container daemon,
# reproducibly (same commit => same digests, both platforms and the index,
# from any clone directory).
#
#   1. cargo build --release for each platform's musl target
#      (x86_64-unknown-linux-musl, aarch64-unknown-linux-musl: static
#      binaries; the arm64 one cross-compiled with aarch64-linux-gnu-gcc for
#      ring's C; paths remapped so the clone directory and CARGO_HOME never
#      leak in)
#   2. tests/tools/src/bin/oci-image.rs reads controller/Containerfile and
#      webhook/Containerfile and writes target/images/nmo-<svc>.oci.tar: an
#      OCI layout whose index.json names an image index listing each
#      platform's manifest (own config: architecture, os) (FROM scratch, the
#      binary, USER 65532:65532, OCI labels; every timestamp =
#      SOURCE_DATE_EPOCH = the commit's time)
#   3. checks each archive: blob digests, index entries' platforms against the
#      configs, config (user, entrypoint, labels), a statically linked binary
#      of the platform's architecture that runs `--version` and `--help` as
#      65532 (the arm64 one under qemu-aarch64)
#
# Environment: VERSION (default: Cargo.toml's workspace version),
# IMAGE_REGISTRY (default quay.io/nmo-rs), IMAGES_OUT (default target/images),
# SOURCE_DATE_EPOCH (default: the commit's time).
# Prints, per service, "<name> <reference> <index digest>" (the digest to pin)
# and "<name>/<os>/<arch> <reference> <manifest digest>" per platform; the same
# lines go to $IMAGES_OUT/digests.txt.
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
installed_targets="$(rustup target list --installed 2>/dev/null)"
for platform in "${PLATFORMS[@]}"; do
  target="${RUST_TARGET_OF[$platform]}"
  [[ "$installed_targets" == *"$target"* ]] ||
    die "the Rust target $target ($platform image) is not installed: run 'rustup target add $target' (or 'bash tests/setup.sh' as root)"
done
command -v musl-gcc >/dev/null ||
  die "musl-gcc not found (ring compiles C for x86_64-unknown-linux-musl): run 'apt-get install musl-tools'"
for t in aarch64-linux-gnu-gcc aarch64-linux-gnu-ar; do
  command -v "$t" >/dev/null ||
    die "$t not found (ring compiles C for aarch64-unknown-linux-musl, and the arm64 binaries link with it): run 'apt-get install gcc-aarch64-linux-gnu'"
done
[ -f /usr/aarch64-linux-gnu/include/stdint.h ] ||
  die "/usr/aarch64-linux-gnu/include/stdint.h not found (ring's C includes it for aarch64-unknown-linux-musl): run 'apt-get install libc6-dev-arm64-cross'"
for platform in "${PLATFORMS[@]}"; do
  runner="$(runner_of "$platform")"
  [ -z "$runner" ] || command -v "$runner" >/dev/null ||
    die "$runner not found (runs the $platform binaries to check them on this $(host_platform) machine): run 'apt-get install qemu-user'"
done
for t in jq file setpriv; do
  command -v "$t" >/dev/null || die "$t not found (used to check the images): run 'apt-get install jq file util-linux'"
done
revision="$(git_revision)"
epoch="$(source_date_epoch)"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
[[ "$revision" != *-dirty ]] ||
  log "WARNING: the work tree has uncommitted changes: revision label '$revision'; these images are not reproducible from a commit"
log "version $VERSION, revision $revision, created $created (SOURCE_DATE_EPOCH=$epoch), registry $IMAGE_REGISTRY, platforms ${PLATFORMS[*]}"

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
# Measured cold on 2 cores (docs/performance.md): x86_64 470 s, then aarch64
# 294 s (the host's build scripts already built); warm, seconds, or about 3
# min each after a commit (the revision is compiled in, and release builds
# use fat LTO).
declare -A cold_estimate=([linux/amd64]="about 8 min" [linux/arm64]="about 5 min more")
for platform in "${PLATFORMS[@]}"; do
  target="${RUST_TARGET_OF[$platform]}"
  step "musl release build for $platform ($target)"
  log "cargo build --release --locked --target $target -p nmo-controller -p nmo-webhook (cold: ${cold_estimate[$platform]} on 2 cores; warm: seconds)"
  mapfile -t cross < <(cross_env "$target")
  run_logged "cargo build ($target)" "$logs/musl-build-$target.log" \
    env CARGO_ENCODED_RUSTFLAGS="$rustflags" \
    "CFLAGS_${target//-/_}=$cflags" ${cross[@]+"${cross[@]}"} \
    NMO_GIT_REVISION="$revision" SOURCE_DATE_EPOCH="$epoch" CARGO_TERM_PROGRESS_WHEN=never \
    cargo build --release --locked --target "$target" -p nmo-controller -p nmo-webhook
done

step "image writer"
# A debug host tool; built without the musl RUSTFLAGS above.
run_logged "cargo build --bin oci-image" "$logs/oci-image-build.log" \
  cargo build --locked -q -p nmo-tools --bin oci-image
oci_image="$TARGET_DIR/debug/oci-image"

# check_platform_image NAME LAYOUT PLATFORM MANIFEST_DIGEST CHECKDIR: the image
# of PLATFORM in the unpacked LAYOUT: its config (platform, user, entrypoint,
# labels), a root holding only /NAME, a static binary of the platform's
# architecture that runs --version and --help as 65532. Prints the version line.
check_platform_image() {
  local name=$1 layout=$2 platform=$3 digest=$4 check=$5
  local manifest config rootfs layer files file_out runner v l
  local what="$name ($platform, manifest $digest)"
  manifest="$layout/blobs/sha256/${digest#sha256:}"
  [ -f "$manifest" ] || die "$what: the index names a manifest the archive does not hold"
  config="$layout/blobs/sha256/$(jq -r '.config.digest' "$manifest" | cut -d: -f2)"
  [ "$(jq -r '.os + "/" + .architecture' "$config")" = "$platform" ] ||
    die "$what: the config says $(jq -r '.os + "/" + .architecture' "$config"), the index says $platform"
  [ "$(jq -r '.config.User' "$config")" = "65532:65532" ] || die "$what: config User is not 65532:65532"
  [ "$(jq -c '.config.Entrypoint' "$config")" = "[\"/$name\"]" ] || die "$what: config Entrypoint is not [\"/$name\"]"
  for l in title description version revision source licenses created; do
    [ -n "$(jq -r --arg k "org.opencontainers.image.$l" '.config.Labels[$k] // empty' "$config")" ] ||
      die "$what: label org.opencontainers.image.$l missing"
  done
  [ "$(jq -r '.config.Labels["org.opencontainers.image.version"]' "$config")" = "$VERSION" ] || die "$what: version label is not $VERSION"
  rootfs="$check/rootfs-${platform//\//-}"
  mkdir -p "$rootfs"
  for layer in $(jq -r '.layers[].digest' "$manifest"); do
    tar -xzf "$layout/blobs/sha256/${layer#sha256:}" -C "$rootfs" || die "$what: layer $layer does not unpack"
  done
  files="$(cd "$rootfs" && find . -mindepth 1 | sort | tr '\n' ' ')"
  [ "$files" = "./$name " ] || die "$what: the image should hold only /$name, it holds: $files"
  file_out="$(file -b "$rootfs/$name")"
  [[ "$file_out" == *"statically linked"* || "$file_out" == *"static-pie linked"* ]] ||
    die "$what: /$name is not statically linked ('file' says: $file_out); it would not run in a FROM scratch image"
  [[ "$file_out" == *"${FILE_ARCH_OF[$platform]}"* ]] ||
    die "$what: /$name is not a ${FILE_ARCH_OF[$platform]} binary ('file' says: $file_out)"
  local run=()
  [ "$(id -u)" -ne 0 ] || run=(setpriv --reuid=65532 --regid=65532 --clear-groups)
  runner="$(runner_of "$platform")"
  [ -z "$runner" ] || run+=("$(command -v "$runner")")
  chmod 755 "$check" "$rootfs"
  v="$("${run[@]}" "$rootfs/$name" --version 2>&1)" || die "$what: '${run[*]} /$name --version' from the unpacked image failed: $v"
  "${run[@]}" "$rootfs/$name" --help >/dev/null 2>&1 || die "$what: '${run[*]} /$name --help' from the unpacked image failed"
  printf '%s' "$v"
}

# check_archive NAME ARCHIVE INDEX_DIGEST: the layout's blobs match their
# digests, index.json names the image index INDEX_DIGEST, which lists exactly
# PLATFORMS; each platform's image passes check_platform_image.
check_archive() {
  local name=$1 archive=$2 index_digest=$3
  local check layout blob index platform digest v
  # Under /tmp: uid 65532 must be able to reach the unpacked binaries.
  check="$(mktemp -d "${TMPDIR:-/tmp}/nmo-image-check.XXXXXX")"
  layout="$check/layout"
  mkdir -p "$layout"
  tar -xf "$archive" -C "$layout" || die "'tar -xf $archive' failed: not a tar archive"
  for blob in "$layout/blobs/sha256/"*; do
    [ "$(sha256sum "$blob" | cut -d' ' -f1)" = "$(basename "$blob")" ] || die "blob $(basename "$blob") of $archive does not match its digest"
  done
  [ "$(jq -r '.manifests | length' "$layout/index.json")" = 1 ] || die "index.json of $archive should name one image index"
  [ "$(jq -r '.manifests[0].digest' "$layout/index.json")" = "$index_digest" ] || die "index.json of $archive does not point at image index $index_digest"
  [ "$(jq -r '.manifests[0].mediaType' "$layout/index.json")" = application/vnd.oci.image.index.v1+json ] ||
    die "index.json of $archive does not name an image index"
  index="$layout/blobs/sha256/${index_digest#sha256:}"
  [ "$(jq -r '[.manifests[].platform | .os + "/" + .architecture] | join(" ")' "$index")" = "${PLATFORMS[*]}" ] ||
    die "$name: the image index lists $(jq -c '[.manifests[].platform]' "$index"), expected ${PLATFORMS[*]}"
  for platform in "${PLATFORMS[@]}"; do
    digest="$(jq -r --arg p "$platform" '.manifests[] | select(.platform.os + "/" + .platform.architecture == $p) | .digest' "$index")"
    v="$(check_platform_image "$name" "$layout" "$platform" "$digest" "$check")"
    log "$name $platform: $digest ('$v')"
  done
  if command -v skopeo >/dev/null; then
    for platform in "${PLATFORMS[@]}"; do
      skopeo --override-os "${platform%/*}" --override-arch "${platform#*/}" inspect "oci-archive:$archive" >"$check/skopeo.json" 2>"$check/skopeo.err" ||
        die "$name: 'skopeo inspect oci-archive:$archive' ($platform) cannot read the archive: $(cat "$check/skopeo.err")"
      [ "$(jq -r '.Os + "/" + .Architecture' "$check/skopeo.json")" = "$platform" ] ||
        die "$name: skopeo picks $(jq -r '.Os + "/" + .Architecture' "$check/skopeo.json") from the index for $platform"
    done
  fi
  rm -rf "$check"
}

: >"$out/digests.txt.partial"
platform_args=()
for platform in "${PLATFORMS[@]}"; do
  platform_args+=(--platform "$platform=$TARGET_DIR/${RUST_TARGET_OF[$platform]}/release")
done
for svc in "${SERVICES[@]}"; do
  name="nmo-$svc"
  ref="$IMAGE_REGISTRY/$name:$VERSION"
  archive="$out/$name.oci.tar"

  step "image $name (${PLATFORMS[*]})"
  # First line: the image index; then "<platform> <manifest digest>" each.
  digests="$("$oci_image" --containerfile "$svc/Containerfile" "${platform_args[@]}" \
    --build-arg "VERSION=$VERSION" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
    --created-epoch "$epoch" --ref "$ref" --out "$archive")" ||
    die "'oci-image --containerfile $svc/Containerfile ${platform_args[*]} ...' failed (message above)"
  index_digest="$(head -n 1 <<<"$digests")"

  step "check $name"
  check_archive "$name" "$archive" "$index_digest"
  log "$name: $ref $index_digest (image index, $(du -h "$archive" | cut -f1))"
  echo "$name $ref $index_digest" >>"$out/digests.txt.partial"
  while read -r platform digest; do
    echo "$name/$platform $ref $digest" >>"$out/digests.txt.partial"
  done < <(tail -n +2 <<<"$digests")
done
mv "$out/digests.txt.partial" "$out/digests.txt"
log "images written to $out in $((SECONDS - start)) s (digests: $out/digests.txt)"
cat "$out/digests.txt"
