#!/usr/bin/env bash
# Builds (or reuses from the cache) the companions users run beside nmo-rs:
# cert-manager (its controller and cainjector loops, through our small main in
# cert-manager/main.go), kube-state-metrics, and Prometheus with promtool,
# each from its own Go module. Prints `NAME=PATH` lines on stdout (the binaries, cert-manager's
# CRDs); progress goes to stderr. The cache lives outside the clone:
#   ${NMO_CACHE:-$HOME/.cache/nmo-rs}/companions/<component>-<version>[-<main hash>]/
#
#   tests/companions/build.sh [cert-manager|kube-state-metrics|prometheus]...   (default: all)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache="${NMO_CACHE:-$HOME/.cache/nmo-rs}/companions"
mkdir -p "$cache"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

log() { printf '[companions %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[companions] ERROR: %s\n' "$*" >&2; exit 1; }
command -v go >/dev/null || die "the Go toolchain builds cert-manager and Prometheus (Go 1.26 expected); install it and retry"

exec 9>"$cache/.lock"
flock 9

# shellcheck source=../cluster/run-logged.sh
source "$here/../cluster/run-logged.sh"

# ---- cert-manager: cert-manager's loops, our main (see cert-manager/main.go)
build_cert_manager() {
  local main_hash dir
  main_hash="$(sha256sum "$here/cert-manager/main.go" | cut -c1-12)"
  dir="$cache/cert-manager-$CERT_MANAGER_VERSION-$main_hash"
  if [ -x "$dir/bin/cert-manager-local" ] && [ -s "$dir/crds.yaml" ]; then
    log "cert-manager $CERT_MANAGER_VERSION: cached in $dir"
  else
    log "cert-manager $CERT_MANAGER_VERSION: cold build of its controller and cainjector (minutes on 2 cores)"
    rm -rf "$dir" && mkdir -p "$dir/src" "$dir/bin"
    cp "$here/cert-manager/main.go" "$dir/src/main.go"
    printf 'module nmo-rs/cert-manager-local\n\ngo 1.26.0\n' >"$dir/src/go.mod"
    (cd "$dir/src" && run_logged "cert-manager $CERT_MANAGER_VERSION: go get" "$dir/get.log" \
      go get "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
    (cd "$dir/src" && run_logged "cert-manager $CERT_MANAGER_VERSION: go mod tidy" "$dir/tidy.log" go mod tidy)
    (cd "$dir/src" && run_logged "cert-manager $CERT_MANAGER_VERSION" "$dir/build.log" \
      go build -trimpath -o "$dir/bin/cert-manager-local" .)
    # The CRDs of the same module version, as users install them.
    local mod
    mod="$(cd "$dir/src" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"
    for f in "$mod"/deploy/crds/*.yaml; do
      # the chart's template guards ({{- if ... }}) are not YAML: keep the objects
      grep -v '^{{' "$f"
      echo '---'
    done >"$dir/crds.yaml"
    grep -q 'kind: CustomResourceDefinition' "$dir/crds.yaml" || die "no CRD found in $mod/deploy/crds"
  fi
  # One binary, two names: each process's name (comm) says which it is, and
  # tests/cluster/down.sh finds a stray one by it.
  ln -sfn cert-manager-local "$dir/bin/cert-manager-controller"
  ln -sfn cert-manager-local "$dir/bin/cert-manager-cainjector"
  echo "CERT_MANAGER_CONTROLLER=$dir/bin/cert-manager-controller"
  echo "CERT_MANAGER_CAINJECTOR=$dir/bin/cert-manager-cainjector"
  echo "CERT_MANAGER_CRDS=$dir/crds.yaml"
}

# ---- Prometheus 3.x and promtool. remove_all_sd: no service-discovery
# plugins (the scrape targets come from files; the cloud SDKs would triple the
# build). The web UI's assets are not in the module: the API and the rule and
# alert pages' JSON are what the tests use.
build_prometheus() {
  local dir="$cache/prometheus-$PROMETHEUS_VERSION"
  ok() { [ -x "$dir/bin/prometheus" ] && [ -x "$dir/bin/promtool" ] &&
    "$dir/bin/promtool" --version >/dev/null 2>&1; }
  if ok; then
    log "prometheus $PROMETHEUS_VERSION: cached in $dir"
  else
    log "prometheus $PROMETHEUS_VERSION: cold build of prometheus and promtool (minutes on 2 cores)"
    rm -rf "$dir" && mkdir -p "$dir/src" "$dir/bin"
    printf 'module nmo-rs/prometheus-build\n\ngo 1.26.7\n' >"$dir/src/go.mod"
    echo 'package main' >"$dir/src/main.go"
    (cd "$dir/src" && run_logged "prometheus $PROMETHEUS_VERSION: go get" "$dir/get.log" \
      go get "github.com/prometheus/prometheus@$PROMETHEUS_VERSION")
    local v="${PROMETHEUS_VERSION#v0.}" ldflags=""
    # v0.316.0 -> 3.16.0: the version Prometheus reports (build info, /api/v1/status/buildinfo)
    v="3.${v%%.*}.${v#*.}"; v="${v%.*}.0"
    ldflags="-X github.com/prometheus/common/version.Version=$v -X github.com/prometheus/common/version.Branch=module"
    (cd "$dir/src" && run_logged "prometheus $PROMETHEUS_VERSION" "$dir/build.log" \
      go build -mod=mod -trimpath -tags remove_all_sd -ldflags "$ldflags" -o "$dir/bin/" \
      github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
    ok || die "the built promtool in $dir/bin does not run"
  fi
  echo "PROMETHEUS_BIN=$dir/bin/prometheus"
  echo "PROMTOOL_BIN=$dir/bin/promtool"
}

# ---- kube-state-metrics (its root module builds as it is)
build_kube_state_metrics() {
  local dir="$cache/kube-state-metrics-$KUBE_STATE_METRICS_VERSION"
  if [ -x "$dir/bin/kube-state-metrics" ] && "$dir/bin/kube-state-metrics" version >/dev/null 2>&1; then
    log "kube-state-metrics $KUBE_STATE_METRICS_VERSION: cached in $dir"
  else
    log "kube-state-metrics $KUBE_STATE_METRICS_VERSION: cold build (minutes on 2 cores)"
    rm -rf "$dir" && mkdir -p "$dir/bin"
    run_logged "kube-state-metrics $KUBE_STATE_METRICS_VERSION" "$dir/build.log" \
      env GOBIN="$dir/bin" go install -trimpath "k8s.io/kube-state-metrics/v2@$KUBE_STATE_METRICS_VERSION"
    mv "$dir/bin/v2" "$dir/bin/kube-state-metrics" 2>/dev/null || true
    "$dir/bin/kube-state-metrics" version >/dev/null 2>&1 || die "the built kube-state-metrics in $dir/bin does not run"
  fi
  echo "KUBE_STATE_METRICS_BIN=$dir/bin/kube-state-metrics"
}

[ $# -gt 0 ] || set -- cert-manager kube-state-metrics prometheus
for c in "$@"; do
  case "$c" in
    cert-manager) build_cert_manager ;;
    prometheus) build_prometheus ;;
    kube-state-metrics) build_kube_state_metrics ;;
    *) die "unknown companion '$c' (cert-manager, kube-state-metrics or prometheus)" ;;
  esac
done
