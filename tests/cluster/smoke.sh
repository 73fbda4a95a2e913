#!/usr/bin/env bash
# Proves the running local cluster is a real one (see shared docs/test-cluster.md,
# "Checks that it is real"). Run after up.sh; leaves nothing behind on success.
#   - every default node is Ready; the server reports the version we built
#   - a 3-replica Deployment gets 3 Running+Ready pods, all on workers
#   - with a PDB minAvailable=3 an eviction answers 429 (and kubectl drain is refused)
#   - without the PDB an eviction answers 201, kwok removes the pod and the
#     ReplicaSet replaces it
#   - the API server log has no watch-progress "not supported" errors
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
fix_no_proxy
[ -f "$STATE_FILE" ] || die "no local cluster; run tests/cluster/up.sh first"
# shellcheck disable=SC1090
source "$STATE_FILE"

ns="nmo-smoke-$$"
ok() { printf '[smoke] ok: %s\n' "$*"; }
fail() { printf '[smoke] FAILED: %s\n' "$*" >&2; exit 1; }
cleanup() {
  [ -z "${node:-}" ] || kc uncordon "$node" >/dev/null 2>&1 || true
  kc delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT

# evict POD: prints the HTTP status of a policy/v1 eviction
evict() {
  curl -sS -o /dev/null -w '%{http_code}' --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    -H 'Content-Type: application/json' -X POST \
    -d "{\"apiVersion\":\"policy/v1\",\"kind\":\"Eviction\",\"metadata\":{\"name\":\"$1\",\"namespace\":\"$ns\"}}" \
    "https://127.0.0.1:$API_PORT/api/v1/namespaces/$ns/pods/$1/eviction"
}
running_pods() {
  kc -n "$ns" get pods -l app=web -o jsonpath='{range .items[?(@.status.phase=="Running")]}{.metadata.name}{" "}{.spec.nodeName}{" "}{.metadata.deletionTimestamp}{"\n"}{end}'
}
wait_until() { # wait_until SECONDS DESCRIPTION CMD...
  local t=$1 what=$2; shift 2
  local deadline=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "timed out after $t s waiting for: $what"
    sleep 0.5
  done
}

ready="$(kc get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True)"
[ "$ready" -ge 6 ] || fail "expected at least 6 Ready nodes, got $ready"
ok "$ready nodes Ready"

server="$(kc version -o json | grep -A8 serverVersion | grep gitVersion | cut -d'"' -f4)"
[ "$server" = "$K8S_VERSION" ] || fail "server version '$server', expected $K8S_VERSION"
ok "server version $server"

kc create namespace "$ns" >/dev/null
wait_until 30 "default ServiceAccount in $ns" kc -n "$ns" get serviceaccount default
kc -n "$ns" create deployment web --image=registry.k8s.io/pause:3.10 --replicas=3 >/dev/null
kc -n "$ns" rollout status deployment/web --timeout=60s >/dev/null || fail "deployment web not rolled out"
three_running() { [ "$(running_pods | grep -c .)" -eq 3 ]; }
wait_until 30 "3 Running pods" three_running
while read -r pod node _; do
  [[ "$node" == worker-* ]] || fail "pod $pod landed on $node (not a worker)"
done < <(running_pods)
ok "3 pods Running+Ready on workers: $(running_pods | awk '{print $2}' | sort | tr '\n' ' ')"

kc -n "$ns" create poddisruptionbudget web --selector=app=web --min-available=3 >/dev/null
pdb_settled() {
  [ "$(kc -n "$ns" get pdb web -o jsonpath='{.status.currentHealthy}/{.status.disruptionsAllowed}')" = "3/0" ]
}
wait_until 30 "PDB status currentHealthy=3 disruptionsAllowed=0" pdb_settled
pods="$(running_pods)" # captured: `kubectl | head` can die of SIGPIPE under pipefail
victim="$(awk 'NR==1 {print $1}' <<<"$pods")"
code="$(evict "$victim")"
[ "$code" = 429 ] || fail "eviction of $victim under the PDB answered $code, expected 429"
ok "eviction blocked by PDB: HTTP $code"

node="$(awk 'NR==1 {print $2}' <<<"$pods")"
if out="$(kc drain "$node" --ignore-daemonsets --delete-emptydir-data --timeout=5s 2>&1)"; then
  fail "kubectl drain $node succeeded despite the PDB"
fi
grep -q "disruption budget" <<<"$out" || fail "kubectl drain failed for another reason: $out"
kc uncordon "$node" >/dev/null
ok "kubectl drain $node refused by the PDB"

kc -n "$ns" delete pdb web >/dev/null
code="$(evict "$victim")"
[ "$code" = 201 ] || fail "eviction of $victim without a PDB answered $code, expected 201"
victim_gone() { ! kc -n "$ns" get pod "$victim" >/dev/null 2>&1; }
wait_until 30 "evicted pod $victim to be removed by kwok" victim_gone
wait_until 30 "replacement pod Running" three_running
ok "eviction without PDB: HTTP 201, pod removed, replacement Running"

kc delete namespace "$ns" --timeout=60s >/dev/null || fail "namespace $ns not deleted"
ok "namespace deleted (pods with deletionTimestamp removed by kwok)"

if grep -iE "RequestWatchProgress|watch progress.*not supported" "$LOGS/kube-apiserver.log"; then
  fail "the API server log mentions unsupported watch progress requests (etcd too old?)"
fi
ok "no watch-progress errors in the API server log"
echo "[smoke] all checks passed"
