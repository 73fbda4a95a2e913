#!/usr/bin/env bash
# What the integration tests leave on the local plane, removed: `make test`
# runs this last, so the plane is as the run found it (make demo's objects
# and anything that was there before are left alone).
#
#   tests/cluster/sweep.sh --record FILE   before the suite: note the NodeMaintenances there now
#   tests/cluster/sweep.sh FILE            after it: remove what the tests left
#
# After the suite: the tests' webhook configurations (label nmo-test/group;
# their webhooks are gone, and with failurePolicy Fail they would refuse every
# later NodeMaintenance update), then every NodeMaintenance not in FILE. One
# that does not go within 20 s keeps its finalizer for want of a controller
# (the tests' controllers have stopped): the sweep undoes on its node what a
# maintenance put there (cordon, the two taints, the exclude-from-remediation
# label, the node-maintenance lease: the emergency cleanup of
# docs/troubleshooting.md) and removes the finalizer. Last, the tests' nodes
# (label nmo-test/group). Exits 1 if a NodeMaintenance of the tests remains.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${NMO_CLUSTER_DIR:-$here/../../.cluster}"
K() { "$dir/bin/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }
log() { printf '[sweep] %s\n' "$*" >&2; }
lease_ns="${LEASE_NAMESPACE:-medik8s-leases}"

nms() { K get nodemaintenances -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null | sort; }

if [ "${1:-}" = --record ]; then
  file="${2:?--record needs a file}"
  if K get crd nodemaintenances.nodemaintenance.medik8s.io >/dev/null 2>&1; then nms >"$file"; else : >"$file"; fi
  exit 0
fi
before="${1:?usage: sweep.sh --record FILE | sweep.sh FILE}"
K get crd nodemaintenances.nodemaintenance.medik8s.io >/dev/null 2>&1 || exit 0

vwcs=$(K get validatingwebhookconfigurations -l nmo-test/group -o name 2>/dev/null || true)
if [ -n "$vwcs" ]; then
  log "deleting $(wc -l <<<"$vwcs") webhook configuration(s) of the tests"
  # shellcheck disable=SC2086
  K delete $vwcs --ignore-not-found --wait=false >/dev/null
fi

left=$(comm -13 "$before" <(nms))
if [ -n "$left" ]; then
  log "$(wc -l <<<"$left") NodeMaintenance(s) created by the tests are still there: deleting them"
  # shellcheck disable=SC2086
  K delete nodemaintenances $left --ignore-not-found --wait=false >/dev/null
  deadline=$((SECONDS + 20))
  while [ $SECONDS -lt $deadline ] && [ -n "$(comm -12 <(echo "$left") <(nms))" ]; do sleep 1; done
  stuck=$(comm -12 <(echo "$left") <(nms))
  for nm in $stuck; do
    node=$(K get nodemaintenance "$nm" -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)
    if [ -n "$node" ] && K get node "$node" >/dev/null 2>&1; then
      # Only what a maintenance adds; other labels and taints stay.
      taints=$(K get node "$node" -o json | jq -c '[.spec.taints // [] | .[] |
        select(.key != "medik8s.io/drain" and .key != "node.kubernetes.io/unschedulable")]')
      K patch node "$node" --type=merge -p "{\"spec\":{\"unschedulable\":false,\"taints\":$taints}}" >/dev/null || true
      K label node "$node" remediation.medik8s.io/exclude-from-remediation- >/dev/null 2>&1 || true
      holder=$(K get lease -n "$lease_ns" "node-$node" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
      [ "$holder" != node-maintenance ] || K delete lease -n "$lease_ns" "node-$node" --ignore-not-found >/dev/null
    fi
    K patch nodemaintenance "$nm" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
  [ -z "$stuck" ] || log "$(wc -w <<<"$stuck") of them kept their finalizer (no controller runs now): node given back, finalizer removed: $(echo $stuck)"
fi

nodes=$(K get nodes -l nmo-test/group -o name 2>/dev/null || true)
if [ -n "$nodes" ]; then
  log "deleting $(wc -l <<<"$nodes") node(s) of the tests"
  # shellcheck disable=SC2086
  K delete $nodes --ignore-not-found --wait=false >/dev/null
fi
after=$(comm -13 "$before" <(nms))
if [ -n "$after" ]; then
  log "ERROR: NodeMaintenance(s) the tests created are still there: $(echo $after)"
  exit 1
fi
log "the plane holds the NodeMaintenances it held before the tests ($(wc -l <"$before"))"
