#!/usr/bin/env bash
# `make test`: every crate's own tests first (fast, no cluster), then the local
# control plane, the manifests check, and the integration tests against it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

echo "== set-up: every requirement met (tests/setup.sh --check), README's list matches it"
# `make test` ran tests/setup.sh first; a requirement still missing here, or a
# README list that names other things, means the set-up step is incomplete.
bash tests/setup.sh --check
bash tests/setup.sh --check-readme README.md
# ... and a missing piece is caught: jq hidden from PATH, as root and not.
bash tests/setup-test.sh

if [ "${1:-}" != "--integration-only" ]; then
  echo "== unit and crate tests (no cluster)"
  cargo test --workspace --exclude nmo-tests
fi

echo "== local control plane"
bash tests/cluster/up.sh

echo "== companions: cert-manager, kube-state-metrics and Prometheus from their Go modules, against the plane (make companions)"
bash tests/companions/up.sh

echo "== alert rules: promtool check rules, promtool test rules (every alert firing and silent)"
bash tests/monitoring/rules-test.sh

echo "== manifests render (kustomize base and every variant)"
KUBECTL="$root/.cluster/bin/kubectl" bash manifests/check.sh

echo "== OLM bundle: drift against manifests/base, operator-verify validation"
KUBECTL="$root/.cluster/bin/kubectl" bash tests/release/check-bundle.sh

echo "== images (the integration tests run the services from them), built twice: same digests (index and each platform's manifest)"
bash tests/release/images.sh
digests="${CARGO_TARGET_DIR:-$root/target}/images/digests.txt"
first="$(cat "$digests")"
bash tests/release/images.sh >/dev/null
if [ "$(cat "$digests")" != "$first" ]; then
  echo "images are not reproducible: a second make images gave other digests" >&2
  diff <(echo "$first") "$digests" >&2 || true
  exit 1
fi
echo "images reproducible: $(awk '{print $1 "@" $3}' "$digests" | tr '\n' ' ')"

echo "== services that make demo / make deploy-local left on this plane"
# Their webhook would judge and their controller reconcile the tests' objects
# (and hold the leader election Lease the tests hold themselves): stopped
# here (make undeploy-local); make demo or make deploy-local starts them again.
K() { "$root/.cluster/bin/kubectl" --kubeconfig "$root/.cluster/kubeconfig" "$@"; }
if compgen -G "$root/.cluster/pids/webhook.pid" >/dev/null || compgen -G "$root/.cluster/pids/controller.pid" >/dev/null ||
  K get validatingwebhookconfiguration nmo-webhook >/dev/null 2>&1; then
  echo "found: stopping them (make undeploy-local) before the integration tests; make demo starts them again"
  bash tests/deploy/deploy-local.sh --stop
else
  echo "none"
fi
# What the tests leave is swept away at the end (tests/cluster/sweep.sh):
# the NodeMaintenances here now are left as they are.
before_nms="$(mktemp)"
trap 'rm -f "$before_nms"' EXIT
bash tests/cluster/sweep.sh --record "$before_nms"

# The linux/arm64 images (built above, in the same image indexes) run here,
# under qemu-aarch64: tests/arm64.sh (make test-arm64) says what it shows.
arm64_rc=0
bash tests/arm64.sh || arm64_rc=$?

echo "== integration tests against the local control plane"
# Each service runs as its manifest's Deployment, out of its unpacked image
# (tests/src/deployment.rs). NMO_TEST_BINARIES=cargo runs cargo's debug
# binaries instead, for a quick local loop only.
if [ "${NMO_TEST_BINARIES:-}" = cargo ]; then cargo build --workspace --bins; fi
# The integration tests are one binary, a module per suite
# (tests/tests/integration/main.rs). Suites run one at a time, each suite's
# tests in parallel: some suites share cluster-wide objects (main.rs says
# which), and each ran as a binary of its own, one after the other.
suites() { # the binary's suites (modules), sorted; fails when it does not build
  local list
  list="$(cargo test -q -p nmo-tests --test integration -- --list --format terse)" || return 1
  sed -n 's/^\([a-z0-9_]*\)::.*: test$/\1/p' <<<"$list" | LC_ALL=C sort -u
}
# run_suites SUITE...: each suite's tests not #[ignore]d, suite after suite.
run_suites() {
  local s status=0
  for s in $(printf '%s\n' "$@" | LC_ALL=C sort -u); do
    cargo test -p nmo-tests --test integration -- --test-threads="${NMO_TEST_THREADS:-4}" "$s::" || status=$?
  done
  return "$status"
}
# The RBAC audit below reads the API server's audit log from this moment on.
audit_since="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
rc=$arm64_rc
cargo test -p nmo-tests --no-fail-fast --lib -- --test-threads="${NMO_TEST_THREADS:-4}" || rc=$?
# The companions' suites print what they measured: their own stage below.
companion_suites="cert_manager prometheus"
# Suite arm64 (all #[ignore]d) runs the linux/arm64 images: a stage of its own;
# so does real_node (all #[ignore]d), in tests/node/stage.sh at the end.
own_stage_suites="$companion_suites arm64 real_node"
if all_suites="$(suites)" && [ -n "$all_suites" ]; then
  # shellcheck disable=SC2046 # one word a suite
  run_suites $(grep -vxF -f <(tr ' ' '\n' <<<"$own_stage_suites") <<<"$all_suites") || rc=$?
else
  echo "the integration tests did not build, or list no suite" >&2
  rc=1
fi

echo "== cert-manager: manifests/overlays/cert-manager issued, injected, served; leaf and CA renewal under load"
# The failed-admission counts are printed (--nocapture). Run twice: with
# cainjector as v1.21.2 ships it (merging the caBundle), and replacing it as
# cert-manager did before CAInjectorMerging became the default.
cargo test -p nmo-tests --test integration -- cert_manager:: --nocapture || rc=$?
echo "-- again with a cainjector that replaces the caBundle (CAInjectorMerging=false)"
if NMO_CAINJECTOR_FEATURE_GATES=CAInjectorMerging=false bash tests/companions/up.sh cert-manager; then
  cargo test -p nmo-tests --test integration -- cert_manager:: --nocapture || rc=$?
else
  rc=1
fi
bash tests/companions/up.sh cert-manager || rc=$?

echo "== Prometheus, live: both targets scraped as the ServiceMonitors say, alerts fire, every dashboard query answers"
# One test at a time: they share the scrape jobs' target files and the alerts.
cargo test -p nmo-tests --test integration -- prometheus:: --nocapture --test-threads=1 || rc=$?

echo "== Prometheus verifying the metrics certificate cert-manager issued (manifests/monitoring/tls/cert-manager)"
if NMO_PROMETHEUS_MONITORING=tests/monitoring/cert-manager bash tests/companions/up.sh prometheus; then
  cargo test -p nmo-tests --test integration -- --ignored --exact \
    prometheus::verifies_the_metrics_certificate_cert_manager_issued --nocapture || rc=$?
else
  rc=1
fi
bash tests/companions/up.sh prometheus || rc=$?

echo "== RBAC audit: what each service did (API server audit log) against what manifests/ grants"
# Fails on a forbidden answer, a request the manifests do not grant, an unused
# grant (tests/cluster/rbac-audit-allow.yaml names the few that cannot show),
# and a cluster-wide grant used in one namespace only. Runs after failing tests
# too: a forbidden answer often explains them (but then unused grants are noise).
# The tests run controllers in private copies of nmo-system (nmo-system-<test>)
# holding the manifests' Roles of nmo-system: requests there count for it.
KUBECTL="$root/.cluster/bin/kubectl" cargo run -q -p nmo-tools --bin rbac-audit -- \
  --kustomize manifests/base --kustomize manifests/overlays/openshift --kustomize tests/cluster/force-drain \
  --audit-log "${NMO_CLUSTER_DIR:-$root/.cluster}/audit/audit.log" --since "$audit_since" \
  --allow tests/cluster/rbac-audit-allow.yaml \
  --namespace-copy 'nmo-system-*=nmo-system' || rc=$?

echo "== RBAC audit of the OLM bundle: the same requests against what the CSV grants"
# Sufficient: every request of the suite is granted by the CSV (plus the
# documented force-drain grant). No wider than OLM forces: each grant the
# suite leaves unused, or uses in one namespace only, is listed with the OLM
# reason in tests/cluster/rbac-audit-allow-olm.yaml.
KUBECTL="$root/.cluster/bin/kubectl" cargo run -q -p nmo-tools --bin rbac-audit -- \
  --csv bundle/manifests/node-maintenance-operator-rs.clusterserviceversion.yaml \
  --manifests manifests/components/force-drain/rbac.yaml \
  --audit-log "${NMO_CLUSTER_DIR:-$root/.cluster}/audit/audit.log" --since "$audit_since" \
  --allow tests/cluster/rbac-audit-allow.yaml --allow tests/cluster/rbac-audit-allow-olm.yaml \
  --allow tests/cluster/rbac-audit-allow-olm-main-suite.yaml \
  --namespace-copy 'nmo-system-*=nmo-system' || rc=$?

echo "== the services under the OLM bundle's RBAC: part of the suite run again, and audited"
# NMO_TEST_RBAC=bundle: the tests give the operator's ServiceAccounts what
# the CSV grants (as OLM installs it, tests/src/olm.rs) instead of
# manifests/' RBAC, whose bindings they remove. Namespace medik8s-leases is
# deleted first (a bundle does not ship it): the first maintenance's
# controller must create it. These suites together use every grant of
# the bundle; the audit fails on a forbidden answer and on a grant unused or
# wider than its use unless tests/cluster/rbac-audit-allow-olm.yaml gives
# the reason OLM forces it.
csv=bundle/manifests/node-maintenance-operator-rs.clusterserviceversion.yaml
K delete namespace medik8s-leases --ignore-not-found --wait=true --timeout=120s
bundle_since="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
export NMO_TEST_RBAC=bundle
cargo test -p nmo-tests --test integration -- --exact controller::full_cycle_drains_the_node_and_restores_it_exactly || rc=$?
run_suites controller lease webhook webhook_warnings drain_timeout drain_parity kubevirt \
  metrics_auth deployments || rc=$?
unset NMO_TEST_RBAC
KUBECTL="$root/.cluster/bin/kubectl" cargo run -q -p nmo-tools --bin rbac-audit -- \
  --csv "$csv" --manifests manifests/components/force-drain/rbac.yaml \
  --audit-log "${NMO_CLUSTER_DIR:-$root/.cluster}/audit/audit.log" --since "$bundle_since" \
  --allow tests/cluster/rbac-audit-allow.yaml --allow tests/cluster/rbac-audit-allow-olm.yaml \
  --namespace-copy 'nmo-system-*=nmo-system' || rc=$?
# The bundle's bindings go (the tests remove them too when they install
# manifests/' RBAC): make demo's services get manifests/' grants only.
for sa in $(sed -n 's/^ *\(- \)\{0,1\}serviceAccountName: *//p' "$csv" | sort -u); do
  K delete clusterrolebinding "nmo-olm-$sa" --ignore-not-found >/dev/null
  K -n nmo-system delete rolebinding "nmo-olm-$sa" --ignore-not-found >/dev/null
done

echo "== restart tests: kube-apiserver and etcd SIGKILLed and started again under the services"
# Suite restarts (tests/tests/integration/restarts.rs) restarts the shared
# plane, so its tests are #[ignore]d (the runs above skip them) and run here:
# last, after the RBAC audit has judged the suite's requests, alone and one at
# a time.
cargo test -p nmo-tests --test integration -- --ignored --test-threads=1 restarts:: || rc=$?

echo "== cleanup: what the tests left on the plane (tests/cluster/sweep.sh)"
# The plane keeps running for the next run (make cluster-down stops it).
bash tests/cluster/sweep.sh "$before_nms" || rc=$?

echo "== real node: the base install run by a real kubelet and containerd (tests/node/stage.sh, make real-node-test)"
# Last: it adds a Node (real-1) the other suites would count, installs
# manifests/base as rendered (its webhook judges every NodeMaintenance while
# installed) and uninstalls it, then removes the node and checks that nothing
# is left running, mounted or in a cgroup.
NMO_DEPLOY_SKIP_IMAGES=1 bash tests/node/stage.sh || rc=$? # the images built above
exit "$rc"
