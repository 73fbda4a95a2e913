#!/usr/bin/env bash
# Builds (or reuses from the cache) what the real node runs besides Debian's
# containerd, runc and CNI plugins: the kubelet and kube-proxy (from the
# plane's own k8s.io/kubernetes module and version), crictl (cri-tools' Go
# module) and the pause binary (pause.c, static). Prints `NAME=PATH` lines on
# stdout; progress goes to stderr. The cache lives outside the clone, keyed by
# version:
#   ${NMO_CACHE:-$HOME/.cache/nmo-rs}/node/{kubernetes-<v>,cri-tools-<v>,pause-<hash>}/
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/versions.env
source "$here/../cluster/versions.env"
# shellcheck source=versions.env
source "$here/versions.env"

root="${NMO_CACHE:-$HOME/.cache/nmo-rs}"
cache="$root/node"
mkdir -p "$cache"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

log() { printf '[node-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[node-build] ERROR: %s\n' "$*" >&2; exit 1; }
command -v go >/dev/null || die "the Go toolchain builds the kubelet and kube-proxy (Go 1.26 expected); install it and retry"
command -v musl-gcc >/dev/null || die "musl-gcc builds the static pause binary: run 'apt-get install musl-tools' (or 'bash tests/setup.sh' as root)"

exec 9>"$cache/.lock"
flock 9
# shellcheck source=../cluster/run-logged.sh
source "$here/../cluster/run-logged.sh"
# shellcheck source=../cluster/k8s-module.sh
source "$here/../cluster/k8s-module.sh"

# ---- kubelet and kube-proxy
k8s_dir="$cache/kubernetes-$K8S_VERSION"
k8s_bins=(kubelet kube-proxy)
k8s_ok() {
  local b
  for b in "${k8s_bins[@]}"; do
    [[ "$("$k8s_dir/bin/$b" --version 2>/dev/null)" == *"$K8S_VERSION"* ]] || return 1
  done
}
if k8s_ok; then
  log "kubelet, kube-proxy $K8S_VERSION: cached in $k8s_dir/bin"
else
  log "kubelet, kube-proxy $K8S_VERSION: cold build (under a minute after the plane's, which shares Go's build cache; about 9 min alone)"
  k8s_build "$k8s_dir" "${k8s_bins[@]}"
  k8s_ok || die "the binaries in $k8s_dir/bin do not report $K8S_VERSION"
fi

# ---- crictl (cri-tools): to look at the node's pods and containers
cri_dir="$cache/cri-tools-$CRI_TOOLS_VERSION"
cri_ok() { [[ "$("$cri_dir/bin/crictl" --version 2>/dev/null)" == *"${CRI_TOOLS_VERSION#v}"* ]]; }
if cri_ok; then
  log "crictl $CRI_TOOLS_VERSION: cached"
else
  log "crictl $CRI_TOOLS_VERSION: cold build (about a minute)"
  mkdir -p "$cri_dir/bin"
  run_logged "crictl $CRI_TOOLS_VERSION" "$cri_dir/build.log" \
    env GOBIN="$cri_dir/bin" go install -trimpath \
    -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION"
  cri_ok || die "built crictl in $cri_dir/bin does not report $CRI_TOOLS_VERSION"
fi

# ---- pause (static; the sandbox image and the node's init)
pause_dir="$cache/pause-$(sha256sum "$here/pause.c" | cut -c1-12)"
if [ -x "$pause_dir/pause" ] && [ "$("$pause_dir/pause" -v)" = "nmo-rs pause 3.10" ]; then
  log "pause: cached"
else
  mkdir -p "$pause_dir"
  musl-gcc -static -Os -Wall -Werror -o "$pause_dir/pause.tmp" "$here/pause.c" ||
    die "musl-gcc could not build $here/pause.c"
  mv "$pause_dir/pause.tmp" "$pause_dir/pause"
  log "pause: built"
fi

echo "KUBELET=$k8s_dir/bin/kubelet"
echo "KUBE_PROXY=$k8s_dir/bin/kube-proxy"
echo "CRICTL=$cri_dir/bin/crictl"
echo "PAUSE=$pause_dir/pause"
