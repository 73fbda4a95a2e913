#!/usr/bin/env bash
# The one set-up step of this repository: installs what `make demo`, `make
# test`, `make lint` and `make images` need on a Debian/Ubuntu machine that has
# Rust (rustup) and Go. The Makefile runs it before those targets, and .ci/run
# runs it too, so CI takes the same path as a newcomer.
#
#   bash tests/setup.sh            install what is missing (as root), else say what
#   bash tests/setup.sh --check    report each requirement and whether it is met; installs
#                                  nothing; exit 1 when one is missing
#   bash tests/setup.sh --list     the requirement names, one per line (README's list must match)
#   bash tests/setup.sh --check-readme FILE
#                                  fail unless FILE's "### Requirements" list names exactly these
#
# As root it installs with apt-get and rustup, one line per step saying what
# and why. As another user it installs nothing: it stops (exit 1) before any
# build with one message naming every missing piece and the one command that
# installs them all. Go and Rust themselves are not installed here (Debian's
# Go is too old for the control plane's modules): it names where to get them.
set -euo pipefail

say() { printf '[setup] %s\n' "$*" >&2; }

MUSL_TARGET=x86_64-unknown-linux-musl
ARM64_TARGET=aarch64-unknown-linux-musl

# The requirements: KIND NAME PROBE WHY. KIND apt = a Debian package (PROBE: a
# command it provides), target = a rustup target, component = a rustup
# component, cargo = a crate's binary (cargo install --locked), tool =
# installed by hand (PROBE: its command).
REQS=(
  "tool|go|go|builds the local control plane (etcd, kube-apiserver, kwok, ...) from its Go modules; Go 1.26"
  "tool|rustup|rustup|the Rust toolchain manager (cargo, rustc, the musl target)"
  "target|$MUSL_TARGET|-|static binaries for the two images (make images), linux/amd64"
  "target|$ARM64_TARGET|-|static binaries for the two images (make images), linux/arm64"
  "component|clippy|cargo-clippy|make lint"
  "component|rustfmt|rustfmt|make lint"
  "cargo|cargo-machete|cargo-machete|make lint: no dependency declared and unused"
  "apt|musl-tools|musl-gcc|the C compiler ring needs for the musl target"
  "apt|gcc-aarch64-linux-gnu|aarch64-linux-gnu-gcc|the C compiler ring needs for the arm64 musl target, and its linker"
  "apt|libc6-dev-arm64-cross|/usr/aarch64-linux-gnu/include/stdint.h|the C headers ring's C includes for the arm64 target (apt does not pull them in without recommends)"
  "apt|qemu-user|qemu-aarch64|runs the arm64 binaries here: the image check and the arm64 stage of make test"
  "apt|jq|jq|reads JSON in the image and cluster scripts"
  "apt|file|file|checks the images' binaries are static"
  "apt|util-linux|setpriv|flock (one plane build at a time) and setpriv (runs the images' binaries as uid 65532)"
  "apt|openssl|openssl|the local plane's certificates and service-account keys"
  "apt|curl|curl|health checks of the local plane"
  "apt|make|make|the Makefile"
  "apt|git|git|image labels and reproducible timestamps from the commit"
  "apt|ca-certificates|/etc/ssl/certs/ca-certificates.crt|TLS to crates.io and the Go module proxy"
  "apt|containerd|containerd|the real node's container runtime (make real-node; its ctr imports our images)"
  "apt|runc|runc|the real node's OCI runtime, under containerd"
  "apt|containernetworking-plugins|/usr/lib/cni/bridge|the real node's pod network (bridge, host-local, loopback)"
  "apt|iptables|iptables|kube-proxy's Service rules inside the real node's network namespace"
  "apt|conntrack|conntrack|kube-proxy clears stale Service connections with it"
  "apt|iproute2|ip|the real node's network namespace: its address and routes"
  "apt|socat|socat|joins the real node to the plane's API server through a unix socket"
)

field() { local IFS='|'; read -r -a f <<<"$1"; printf '%s' "${f[$2]}"; }

# met REQ: whether the requirement holds on this machine.
met() {
  local kind name probe
  kind=$(field "$1" 0); name=$(field "$1" 1); probe=$(field "$1" 2)
  case "$kind" in
    target) command -v rustup >/dev/null && [[ "$(rustup target list --installed 2>/dev/null)" == *"$name"* ]] ;;
    component) command -v rustup >/dev/null && [[ "$(rustup component list --installed 2>/dev/null)" == *"$name"* ]] ;;
    *) if [[ "$probe" == /* ]]; then [ -e "$probe" ]; else command -v "$probe" >/dev/null; fi ;;
  esac
}

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --list) mode=list ;;
  --check-readme) mode=readme; readme="${2:?--check-readme needs the README path}" ;;
  *) say "unknown argument '$1' (none, --check, --list or --check-readme FILE)"; exit 2 ;;
esac

if [ "$mode" = list ]; then
  for r in "${REQS[@]}"; do field "$r" 1; echo; done
  exit 0
fi

if [ "$mode" = readme ]; then
  # The README's "### Requirements" section: bullets starting "- `name`" (a
  # bullet may name several, "- `clippy`, `rustfmt` ...").
  listed=$(awk '/^### Requirements/ {on = 1; next} on && /^#/ {exit} on && /^- `/ {print}' "$readme" |
    sed -E 's/^- //; s/ *\(.*$//; s/:.*$//' | grep -oE '`[^`]+`' | tr -d '`' | sort -u)
  wanted=$(bash "$0" --list | sort -u)
  if [ "$listed" != "$wanted" ]; then
    say "$readme's \"### Requirements\" list does not match tests/setup.sh:"
    diff <(echo "$wanted") <(echo "$listed") | sed -n 's/^< /  missing from the README: /p; s/^> /  in the README but not in tests\/setup.sh: /p' >&2
    exit 1
  fi
  say "$readme's requirements list matches tests/setup.sh ($(wc -l <<<"$wanted") items)"
  exit 0
fi

missing=()
for r in "${REQS[@]}"; do
  if met "$r"; then
    [ "$mode" = check ] && printf '  ok       %-28s %s\n' "$(field "$r" 1)" "$(field "$r" 3)"
  else
    missing+=("$r")
    [ "$mode" = check ] && printf '  MISSING  %-28s %s\n' "$(field "$r" 1)" "$(field "$r" 3)"
  fi
done
# The Go version: the control plane's modules need Go 1.26 or newer.
go_ok=1
if command -v go >/dev/null; then
  gov=$(go env GOVERSION 2>/dev/null || true)
  gov=${gov#go}
  if ! printf '%s\n%s\n' 1.26 "${gov%%[!0-9.]*}" | sort -V -C; then
    go_ok=0
    [ "$mode" = check ] && printf '  MISSING  %-28s %s\n' "go >= 1.26" "found go $gov"
  fi
fi

apt_pkgs=() rust_cmds=() hand=()
for r in ${missing[@]+"${missing[@]}"}; do
  name=$(field "$r" 1)
  case "$(field "$r" 0)" in
    apt) apt_pkgs+=("$name") ;;
    target) rust_cmds+=("rustup target add $name") ;;
    component) rust_cmds+=("rustup component add $name") ;;
    cargo) rust_cmds+=("cargo install --locked $name") ;;
    tool) case "$name" in
        go) hand+=("Go 1.26 from https://go.dev/dl (Debian's golang package is too old)") ;;
        rustup) hand+=("Rust with rustup from https://rustup.rs") ;;
      esac ;;
  esac
done
[ "$go_ok" = 1 ] || hand+=("Go 1.26 or newer from https://go.dev/dl (found go $gov)")

if [ "$mode" = check ]; then
  n=$((${#apt_pkgs[@]} + ${#rust_cmds[@]} + ${#hand[@]}))
  if [ "$n" -eq 0 ]; then
    say "check: every requirement is met; bash tests/setup.sh would install nothing"
  else
    say "check: bash tests/setup.sh would install: ${apt_pkgs[*]:-} ${rust_cmds[*]:+(${rust_cmds[*]})}"
    [ ${#hand[@]} -eq 0 ] || say "check: and needs by hand: ${hand[*]}"
    exit 1
  fi
  exit 0
fi

if [ ${#hand[@]} -gt 0 ]; then
  say "ERROR: this repository needs, installed by hand first:"
  for h in "${hand[@]}"; do say "  - $h"; done
  exit 1
fi
if [ ${#apt_pkgs[@]} -eq 0 ] && [ ${#rust_cmds[@]} -eq 0 ]; then
  exit 0 # everything in place: silent, so every make target can call this
fi

if [ "${NMO_SETUP_AS_USER:-$(id -u)}" != 0 ]; then
  # One command for all of it: apt needs root, rustup belongs to this user.
  cmd=""
  [ ${#apt_pkgs[@]} -eq 0 ] || cmd="sudo apt-get update && sudo apt-get install -y ${apt_pkgs[*]}"
  for c in ${rust_cmds[@]+"${rust_cmds[@]}"}; do cmd="${cmd:+$cmd && }$c"; done
  say "ERROR: missing before anything can be built:"
  for r in ${missing[@]+"${missing[@]}"}; do say "  - $(field "$r" 1): $(field "$r" 3)"; done
  say "install them all with:"
  say "  $cmd"
  say "(as root, 'bash tests/setup.sh' installs them itself)"
  exit 1
fi

if [ ${#apt_pkgs[@]} -gt 0 ]; then
  for r in "${missing[@]}"; do
    [ "$(field "$r" 0)" = apt ] && say "apt-get install $(field "$r" 1): $(field "$r" 3)"
  done
  aptlog=$(mktemp)
  say "apt-get update (package lists, once; output in $aptlog)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$aptlog" 2>&1 ||
    ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >>"$aptlog" 2>&1; then
    tail -n 20 "$aptlog" >&2
    say "ERROR: apt-get install ${apt_pkgs[*]} failed (output above, all of it in $aptlog)"
    exit 1
  fi
  rm -f "$aptlog"
fi
for r in ${missing[@]+"${missing[@]}"}; do
  case "$(field "$r" 0)" in
    target) say "rustup target add $(field "$r" 1): $(field "$r" 3)"
      rustup target add "$(field "$r" 1)" 2>&1 | sed 's/^/[setup]   /' >&2 ;;
    component) say "rustup component add $(field "$r" 1): $(field "$r" 3)"
      rustup component add "$(field "$r" 1)" 2>&1 | sed 's/^/[setup]   /' >&2 ;;
    cargo) say "cargo install --locked $(field "$r" 1): $(field "$r" 3) (builds it: a minute or two)"
      cargo install --locked --quiet "$(field "$r" 1)" 2>&1 | sed 's/^/[setup]   /' >&2 ;;
  esac
done
still=()
for r in "${missing[@]}"; do met "$r" || still+=("$(field "$r" 1)"); done
if [ ${#still[@]} -gt 0 ]; then
  say "ERROR: still missing after installing: ${still[*]}"
  exit 1
fi
say "set-up done: ${#missing[@]} requirement(s) installed"
