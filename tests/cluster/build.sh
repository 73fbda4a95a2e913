#!/usr/bin/env bash
# Builds (or reuses from the cache) etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl and kwok from their Go modules. Prints the bin directory
# on the last line of stdout. The cache lives outside the clone, keyed by version:
#   ${NMO_CACHE:-$HOME/.cache/nmo-rs}/controlplane/<component>-<version>/
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${NMO_CACHE:-$HOME/.cache/nmo-rs}/controlplane"
mkdir -p "$cache"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[build] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the Go toolchain is needed to build the control plane (Go 1.26 expected); install it and retry"

# A build runs under a lock so parallel callers (make test + make demo) do not race.
exec 9>"$cache/.lock"
flock 9

# shellcheck source=run-logged.sh
source "$here/run-logged.sh"
# shellcheck source=k8s-module.sh
source "$here/k8s-module.sh"

# ---- Kubernetes: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
k8s_dir="$cache/kubernetes-$K8S_VERSION"
k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
k8s_ok() {
  for b in "${k8s_bins[@]}"; do [ -x "$k8s_dir/bin/$b" ] || return 1; done
  # Compare captured output: `cmd | grep -q` fails at random under pipefail when
  # grep exits before cmd has written its last line (SIGPIPE).
  [[ "$("$k8s_dir/bin/kubectl" version --client 2>/dev/null)" == *"$K8S_VERSION"* ]] &&
    [[ "$("$k8s_dir/bin/kube-apiserver" --version 2>/dev/null)" == *"$K8S_VERSION"* ]]
}
if k8s_ok; then
  log "kubernetes $K8S_VERSION: cached in $k8s_dir/bin"
else
  log "kubernetes $K8S_VERSION: cold build of ${k8s_bins[*]} (several minutes on 2 cores)"
  k8s_build "$k8s_dir" "${k8s_bins[@]}"
  k8s_ok || die "kubernetes binaries in $k8s_dir/bin do not report $K8S_VERSION"
fi

# ---- etcd (a wrapper module: etcd's own replace directives break 'go install')
etcd_dir="$cache/etcd-$ETCD_VERSION"
etcd_ok() { [[ "$("$etcd_dir/bin/etcd" --version 2>/dev/null)" == *"${ETCD_VERSION#v}"* ]]; }
if etcd_ok; then
  log "etcd $ETCD_VERSION: cached"
else
  log "etcd $ETCD_VERSION: cold build"
  mkdir -p "$etcd_dir/src" "$etcd_dir/bin"
  (cd "$etcd_dir/src" && rm -f go.mod go.sum &&
    printf 'module nmo-rs/etcd-build\n\ngo 1.26\n' >go.mod &&
    echo 'package main' >main.go &&
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >"$etcd_dir/get.log" 2>&1 ||
    die "go get go.etcd.io/etcd/server/v3@$ETCD_VERSION failed (log: $etcd_dir/get.log)")
  (cd "$etcd_dir/src" &&
    run_logged "etcd $ETCD_VERSION" "$etcd_dir/build.log" \
      go build -mod=mod -trimpath -o "$etcd_dir/bin/etcd" go.etcd.io/etcd/server/v3)
  etcd_ok || die "built etcd in $etcd_dir/bin does not report $ETCD_VERSION"
fi

# ---- kwok (fake kubelets)
kwok_dir="$cache/kwok-$KWOK_VERSION"
kwok_ok() { [ -x "$kwok_dir/bin/kwok" ] && "$kwok_dir/bin/kwok" --help >/dev/null 2>&1; }
if kwok_ok; then
  log "kwok $KWOK_VERSION: cached"
else
  log "kwok $KWOK_VERSION: cold build"
  mkdir -p "$kwok_dir/bin"
  run_logged "kwok $KWOK_VERSION" "$kwok_dir/build.log" \
    env GOBIN="$kwok_dir/bin" go install -trimpath "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  kwok_ok || die "built kwok in $kwok_dir/bin does not run"
fi

# One bin directory with links to every component, for callers.
bin="$cache/bin-$K8S_VERSION-etcd$ETCD_VERSION-kwok$KWOK_VERSION"
mkdir -p "$bin"
for b in "${k8s_bins[@]}"; do ln -sfn "$k8s_dir/bin/$b" "$bin/$b"; done
ln -sfn "$etcd_dir/bin/etcd" "$bin/etcd"
ln -sfn "$kwok_dir/bin/kwok" "$bin/kwok"
echo "$bin"
