# shellcheck shell=bash
# Shared helpers of tests/release/*.sh. Sourced, never run.

RELEASE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$RELEASE_DIR/../.." && pwd)"
# The images' platforms (one image index per service, one image per platform)
# and the Rust target that builds each platform's static binaries.
# IMAGE_PLATFORMS (space-separated) narrows them for a local run: make demo
# and deploy-local build only this machine's (the arm64 half is about 5 min
# cold); make images, make test and make release build both.
declare -A RUST_TARGET_OF=([linux/amd64]=x86_64-unknown-linux-musl [linux/arm64]=aarch64-unknown-linux-musl)
read -r -a PLATFORMS <<<"${IMAGE_PLATFORMS:-linux/amd64 linux/arm64}"
for _p in "${PLATFORMS[@]}"; do
  [ -n "${RUST_TARGET_OF[$_p]:-}" ] || {
    printf 'IMAGE_PLATFORMS names %s; the images are built for linux/amd64 and linux/arm64 only\n' "$_p" >&2
    exit 1
  }
done
unset _p
# What `file` says of each platform's binaries.
declare -A FILE_ARCH_OF=([linux/amd64]=x86-64 [linux/arm64]="ARM aarch64")
# Cargo's output directory (CARGO_TARGET_DIR is honoured).
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
# Where `make images` puts the archives: target/images/<name>.oci.tar
# ($CARGO_TARGET_DIR/images when that is set).
IMAGES_DIR="$TARGET_DIR/images"
# Registry and repository prefix of the image names (the manifests' default).
IMAGE_REGISTRY="${IMAGE_REGISTRY:-quay.io/nmo-rs}"
SERVICES=(controller webhook)

# host_platform: this machine's platform (linux/amd64, linux/arm64, ...).
host_platform() {
  case "$(uname -m)" in
    x86_64) echo linux/amd64 ;;
    aarch64 | arm64) echo linux/arm64 ;;
    *) echo "linux/$(uname -m)" ;;
  esac
}

# runner_of PLATFORM: the command that runs that platform's binaries here:
# nothing on the platform itself, else the qemu user-mode emulator (run
# explicitly: binfmt_misc may not be registered).
runner_of() {
  if [ "$1" = "$(host_platform)" ]; then
    return 0
  fi
  case "$1" in
    linux/arm64) echo qemu-aarch64 ;;
    linux/amd64) echo qemu-x86_64 ;;
    *) die "no emulator known for platform $1" ;;
  esac
}

# cross_env TARGET: NAME=VALUE lines (for env) naming the C compiler, archiver
# and linker of a Rust target that is not built by the host's own: ring
# compiles C and assembly for it. x86_64 musl uses musl-gcc (cc-rs finds it).
cross_env() {
  case "$1" in
    aarch64-unknown-linux-musl)
      echo CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
      echo AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
      echo CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc ;;
  esac
}

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

# workspace_repository: [workspace.package] repository of Cargo.toml.
workspace_repository() {
  awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^repository *=/{sub(/^repository *= */,"",$0); gsub(/"/,"",$0); print; exit}' \
    "$REPO_ROOT/Cargo.toml"
}

# The troubleshooting guide, which the alerts' runbook_urls point into.
GUIDE_PATH=docs/troubleshooting.md

# runbook_base REPOSITORY REF: the guide's address at REF (a branch or a tag).
runbook_base() { printf '%s/blob/%s/%s' "${1%/}" "$2" "$GUIDE_PATH"; }

# check_runbook_repository URL: the repository the released alerts link to
# must be a real https address, not the workspace's placeholder.
check_runbook_repository() {
  local url=$1 host
  [[ "$url" == https://?*/?* ]] ||
    die "the repository for the alerts' runbook links is '$url': set [workspace.package] repository in Cargo.toml (or RELEASE_REPOSITORY) to the project's https address"
  host=${url#https://}
  host=${host%%/*}
  case "$host" in
    example.invalid | *.invalid | example.com | example.org | localhost | 127.*)
      die "the repository for the alerts' runbook links is '$url', a placeholder: the released alerts would link nowhere; set [workspace.package] repository in Cargo.toml to the project's public address (or RELEASE_REPOSITORY=https://... for this release)" ;;
  esac
}

# pin_runbooks FROM TO: rendered alert rules on stdin to stdout, with the
# guide's address FROM (the committed base, .../blob/main/...) replaced by TO
# (the release's, .../blob/vX.Y.Z/...). Fails, naming them, when any
# runbook_url or the base annotation does not then start with TO.
pin_runbooks() {
  local from=$1 to=$2 line out bad
  out=$(while IFS= read -r line || [ -n "$line" ]; do printf '%s\n' "${line//"$from"/"$to"}"; done)
  grep -qE '^ *runbook_url: ' <<<"$out" || die "pin_runbooks: no runbook_url in the rendered alert rules"
  bad=$(grep -E '^ *runbook_url: ' <<<"$out" | sed -E 's/^ *runbook_url: *"?//; s/"$//' | awk -v p="$to#" 'index($0, p) != 1' || true)
  [ -z "$bad" ] || die "pin_runbooks: runbook_url(s) not pointing at $to (the committed base must be $from: the annotation nmo.medik8s.io/runbook-base of manifests/monitoring/prometheusrule.yaml): $bad"
  grep -qF "nmo.medik8s.io/runbook-base: $to" <<<"$out" ||
    die "pin_runbooks: the annotation nmo.medik8s.io/runbook-base is not $from in the rendered rules: it must be Cargo.toml's repository + /blob/main/$GUIDE_PATH"
  printf '%s\n' "$out"
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
