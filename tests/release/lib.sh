# shellcheck shell=bash
# Shared helpers of tests/release/*.sh. Sourced, never run.

RELEASE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$RELEASE_DIR/../.." && pwd)"
MUSL_TARGET=x86_64-unknown-linux-musl
# Cargo's output directory (CARGO_TARGET_DIR is honoured).
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
# Where `make images` puts the archives: target/images/<name>.oci.tar
# ($CARGO_TARGET_DIR/images when that is set).
IMAGES_DIR="$TARGET_DIR/images"
# Registry and repository prefix of the image names (the manifests' default).
IMAGE_REGISTRY="${IMAGE_REGISTRY:-quay.io/nmo-rs}"
SERVICES=(controller webhook)

_step="setup"
log() { printf '[release %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# step NAME: names the step that a later `die` reports.
step() { _step="$1"; log "== $1"; }
die() { printf '[release] ERROR in step "%s": %s\n' "$_step" "$*" >&2; exit 1; }

# workspace_version: [workspace.package] version of Cargo.toml.
workspace_version() {
  awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/,"",$0); sub(/^version=/,"",$0); print; exit}' \
    "$REPO_ROOT/Cargo.toml"
}

# check_release_version V: V must be MAJOR.MINOR.PATCH[-PRERELEASE] (semver.org;
# build metadata "+..." is refused: an image tag cannot carry '+'), never
# "latest" nor a leading "v".
check_release_version() {
  local v=$1 num='(0|[1-9][0-9]*)' pre='(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)'
  [ "$v" != latest ] || die "VERSION=latest: a release needs a fixed version (MAJOR.MINOR.PATCH), e.g. make release VERSION=$(workspace_version)"
  [[ "$v" =~ ^$num\.$num\.$num(-$pre(\.$pre)*)?$ ]] ||
    die "VERSION=$v is not MAJOR.MINOR.PATCH[-PRERELEASE] (semver.org, without a leading 'v' and without '+build' metadata, which an image tag cannot carry); e.g. VERSION=1.2.3 or VERSION=1.2.3-rc.1"
}

# git_revision: the commit, with "-dirty" when the work tree has changes
# (tracked or untracked, outside .gitignore): such a build is not the commit's.
git_revision() {
  local rev
  rev="$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null)" || { echo unknown; return; }
  if [ -n "$(git -C "$REPO_ROOT" status --porcelain 2>/dev/null)" ]; then
    rev="$rev-dirty"
  fi
  printf '%s' "$rev"
}

# source_date_epoch: SOURCE_DATE_EPOCH, else the commit's time, else 0.
source_date_epoch() {
  if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    printf '%s' "$SOURCE_DATE_EPOCH"
  else
    git -C "$REPO_ROOT" log -1 --format=%ct 2>/dev/null || printf 0
  fi
}

# shellcheck source=../cluster/run-logged.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster/run-logged.sh"

# kubectl_bin: KUBECTL, else the local control plane's, else kubectl on PATH.
kubectl_bin() {
  if [ -n "${KUBECTL:-}" ]; then
    printf '%s' "$KUBECTL"
  elif [ -x "$REPO_ROOT/.cluster/bin/kubectl" ]; then
    printf '%s' "$REPO_ROOT/.cluster/bin/kubectl"
  elif command -v kubectl >/dev/null; then
    command -v kubectl
  else
    die "no kubectl: run 'make cluster-up' (builds one into .cluster/bin), or set KUBECTL=/path/to/kubectl"
  fi
}
