#!/usr/bin/env bash
# Builds (or reuses from the cache) the Operator Framework's bundle validators
# from the Go module github.com/operator-framework/api:
#   operator-verify        the module's own CLI (`operator-verify manifests <dir>`)
#   nmo-bundle-validate    tests/release/bundle-validate/main.go: the same library,
#                          plus the optional validators, with an exit code
# Prints the bin directory on the last line of stdout. Cache, outside the clone:
#   ${NMO_CACHE:-$HOME/.cache/nmo-rs}/tools/operator-verify-<version>/
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OPERATOR_API_VERSION=v0.30.0

cache="${NMO_CACHE:-$HOME/.cache/nmo-rs}/tools/operator-verify-$OPERATOR_API_VERSION"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf '[tools] ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "the Go toolchain is needed to build operator-verify; install Go (1.23 or newer) and retry"
mkdir -p "$cache/src/bundle-validate" "$cache/bin"

# Parallel callers (make bundle + make test) build once.
exec 9>"$cache/.lock"
flock 9

src_sum="$(sha256sum "$here/bundle-validate/main.go" | cut -d' ' -f1)"
ov_ok() { [ -x "$cache/bin/operator-verify" ] && "$cache/bin/operator-verify" manifests --help >/dev/null 2>&1; }
bv_ok() {
  [ -x "$cache/bin/nmo-bundle-validate" ] &&
    [ "$(cat "$cache/bin/nmo-bundle-validate.src-sha256" 2>/dev/null)" = "$src_sum" ]
}
if ov_ok && bv_ok; then
  log "operator-verify $OPERATOR_API_VERSION: cached in $cache/bin"
  echo "$cache/bin"
  exit 0
fi

start=$SECONDS
cd "$cache/src"
if [ ! -f go.sum ] || ! grep -q "github.com/operator-framework/api $OPERATOR_API_VERSION" go.mod 2>/dev/null; then
  log "fetching github.com/operator-framework/api@$OPERATOR_API_VERSION and its dependencies (Go module proxy)"
  rm -f go.mod go.sum
  printf 'module nmo-rs/operator-verify-build\n\ngo 1.23\n' >go.mod
  go get "github.com/operator-framework/api@$OPERATOR_API_VERSION" >"$cache/get.log" 2>&1 ||
    { tail -n 20 "$cache/get.log" >&2
      die "step 'fetch': 'go get github.com/operator-framework/api@$OPERATOR_API_VERSION' failed (log: $cache/get.log); check that the Go module proxy is reachable (go env GOPROXY)"; }
fi
cp "$here/bundle-validate/main.go" bundle-validate/main.go

log "building operator-verify and nmo-bundle-validate (cold: about a minute on 2 cores)"
if ! go build -mod=mod -trimpath -o "$cache/bin/operator-verify" \
  "github.com/operator-framework/api/cmd/operator-verify" >"$cache/build.log" 2>&1; then
  tail -n 30 "$cache/build.log" >&2
  die "step 'build': 'go build github.com/operator-framework/api/cmd/operator-verify' failed in $cache/src (log: $cache/build.log)"
fi
if ! go build -mod=mod -trimpath -o "$cache/bin/nmo-bundle-validate" ./bundle-validate >>"$cache/build.log" 2>&1; then
  tail -n 30 "$cache/build.log" >&2
  die "step 'build': 'go build ./bundle-validate' (from tests/release/bundle-validate/main.go) failed in $cache/src (log: $cache/build.log)"
fi
echo "$src_sum" >"$cache/bin/nmo-bundle-validate.src-sha256"
ov_ok || die "built $cache/bin/operator-verify does not run ('operator-verify manifests --help')"
log "built in $((SECONDS - start)) s into $cache/bin"
echo "$cache/bin"
