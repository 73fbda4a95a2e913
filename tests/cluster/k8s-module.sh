# shellcheck shell=bash
# k8s_build DIR BIN...: builds k8s.io/kubernetes/cmd/BIN... at $K8S_VERSION
# into DIR/bin, from a small module of our own in DIR/src: it requires
# k8s.io/kubernetes and replaces each staging module k8s.io/<name> with its
# published v0.<minor>.<patch> (the published go.mod requires them at v0.0.0,
# which no proxy serves), with kubernetes' own go and godebug lines; the
# version ldflags make `--version` and /version report $K8S_VERSION.
# Sourced by tests/cluster/build.sh (the plane) and tests/node/build.sh (the
# kubelet, kube-proxy), after run-logged.sh; they define log and die.
k8s_build() {
  local dir=$1 minor staging_version modfile ldflags p s b
  shift
  mkdir -p "$dir/src" "$dir/bin"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  staging_version="v0.${K8S_VERSION#v1.}"
  local staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
    cloud-provider cluster-bootstrap code-generator component-base component-helpers
    controller-manager cri-api cri-client csi-translation-lib dynamic-resource-allocation
    endpointslice externaljwt kms kube-aggregator kube-controller-manager kube-proxy
    kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
    sample-apiserver sample-cli-plugin sample-controller)
  # Copy kubernetes' own go and godebug lines from its published go.mod.
  modfile="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod"
  if [ ! -f "$modfile" ]; then
    (cd "$dir/src" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null) ||
      die "could not fetch k8s.io/kubernetes@$K8S_VERSION from the Go module proxy"
  fi
  {
    echo "module nmo-rs/controlplane-build"
    grep -E '^(go|godebug) ' "$modfile"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    for s in "${staging[@]}"; do echo "replace k8s.io/$s => k8s.io/$s $staging_version"; done
  } >"$dir/src/go.mod"
  echo 'package main' >"$dir/src/main.go"
  ldflags=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  local pkgs=()
  for b in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$dir/src" &&
    run_logged "$* $K8S_VERSION" "$dir/build.log" \
      go build -mod=mod -trimpath -ldflags "$ldflags" -o "$dir/bin/" "${pkgs[@]}")
}
