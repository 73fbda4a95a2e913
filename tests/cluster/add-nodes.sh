#!/usr/bin/env bash
# Adds N kwok worker nodes to the running local cluster and waits until they are
# Ready and schedulable.
#
#   tests/cluster/add-nodes.sh N [PREFIX]     # PREFIX defaults to "worker"
#
# Waits 120 s + N/2 s at most (NODE_TIMEOUT=S overrides), printing progress
# every 5 s.
#
# Names continue after the highest existing PREFIX-<k> (worker-4, worker-5, ...),
# so running it twice adds 2N nodes. Each is labelled nmo-rs/node-pool=PREFIX.
# Prints the new node names, one per line.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

count="${1:-}"
prefix="${2:-worker}"
[[ "$count" =~ ^[0-9]+$ ]] || die "usage: $0 N [PREFIX]  (N = number of worker nodes to add)"
[[ "$prefix" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "PREFIX '$prefix' is not a valid node name prefix"
[ "$count" -gt 0 ] || exit 0

fix_no_proxy
if [ ! -f "$STATE_FILE" ] || [ ! -x "$CLUSTER_DIR/bin/kubectl" ]; then
  die "no local cluster in $CLUSTER_DIR; run tests/cluster/up.sh first"
fi
# shellcheck disable=SC1090
source "$STATE_FILE"
apiserver_ready || die "the API server at https://127.0.0.1:$API_PORT is not ready; run tests/cluster/up.sh"

max=0
for n in $(kc get nodes -o jsonpath='{.items[*].metadata.name}'); do
  if [[ "$n" =~ ^${prefix}-([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -gt "$max" ]; then
    max="${BASH_REMATCH[1]}"
  fi
done
names=()
for ((i = max + 1; i <= max + count; i++)); do names+=("$prefix-$i"); done

NODE_POOL="$prefix" create_nodes worker "${names[@]}"
# The wait grows with the count: kwok and the node lifecycle controller take
# a few minutes for a thousand nodes on two cores (NODE_TIMEOUT overrides).
timeout="${NODE_TIMEOUT:-$((120 + count / 2))}"
wait_nodes_ready "$timeout" "${names[@]}" || die "new nodes did not become Ready within ${timeout} s (NODE_TIMEOUT)"
printf '%s\n' "${names[@]}"
