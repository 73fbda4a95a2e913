#!/usr/bin/env bash
# Diagnostics bundle for nmo-rs (upstream's "must-gather"): Nodes, the
# NodeMaintenance CRD and objects, operator pods and their logs, events, the
# medik8s leases, PodDisruptionBudgets and node resource usage, written to a
# timestamped directory and packed into a tarball next to it.
#
# Read-only: it only runs get/describe/logs/top. Secrets are never collected
# (only the public part of the webhook's serving certificate is summarised).
#
# Environment:
#   KUBECTL          kubectl command to use (default: kubectl); e.g.
#                    KUBECTL="kubectl --kubeconfig /path/kubeconfig" or KUBECTL=oc
#   NMO_NAMESPACE    namespace of nmo-controller and nmo-webhook (default: nmo-system)
#   LEASE_NAMESPACE  namespace of the per-node medik8s leases (default: medik8s-leases)
#   OUT_DIR          where to write the bundle (default: current directory)
#   REQUEST_TIMEOUT  per-request timeout for kubectl (default: 30s)
#
# Usage: manifests/must-gather.sh    (exit status 0 even when single items fail;
# failures are listed in errors.txt inside the bundle and at the end.)
set -uo pipefail

KUBECTL=${KUBECTL:-kubectl}
NS=${NMO_NAMESPACE:-nmo-system}
LEASE_NS=${LEASE_NAMESPACE:-medik8s-leases}
OUT_DIR=${OUT_DIR:-.}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-30s}
CRD=nodemaintenances.nodemaintenance.medik8s.io

stamp=$(date -u +%Y%m%d-%H%M%S)
name="nmo-must-gather-${stamp}"
dir="${OUT_DIR%/}/${name}"
mkdir -p "$dir" || { echo "must-gather: cannot create $dir" >&2; exit 1; }
errors="$dir/errors.txt"
: >"$errors"
failures=0

# KUBECTL may hold extra words (flags, "oc"): split it on purpose.
# shellcheck disable=SC2086
k() { $KUBECTL --request-timeout="$REQUEST_TIMEOUT" "$@"; }

step() { printf '[must-gather] %s\n' "$*"; }

# collect FILE CMD...: run CMD, stdout to FILE, stderr kept in errors.txt.
collect() {
    local file="$dir/$1"
    shift
    mkdir -p "$(dirname "$file")"
    if ! "$@" >"$file" 2>"$file.err"; then
        failures=$((failures + 1))
        { printf '%s: ' "${file#"$dir"/}"; tr '\n' ' ' <"$file.err"; echo; } >>"$errors"
        [ -s "$file" ] || rm -f "$file"
    fi
    rm -f "$file.err"
}

step "writing to $dir"
step "cluster: $(k config current-context 2>/dev/null || echo '?')"
if ! k version >"$dir/version.txt" 2>&1; then
    step "cannot reach the API server (see $dir/version.txt); aborting"
    exit 1
fi
{
    echo "collected_at: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kubectl: $KUBECTL"
    echo "operator_namespace: $NS"
    echo "lease_namespace: $LEASE_NS"
} >"$dir/summary.txt"

step "nodes"
collect cluster/nodes.txt k get nodes -o wide --show-labels
collect cluster/nodes.yaml k get nodes -o yaml
collect cluster/nodes-describe.txt k describe nodes

step "node resource usage (kubectl top)"
collect cluster/top-nodes.txt k top nodes
collect cluster/top-pods-operator.txt k top pods -n "$NS" --containers

step "NodeMaintenance CRD and objects"
collect nodemaintenance/crd.yaml k get crd "$CRD" -o yaml
collect nodemaintenance/nodemaintenances.txt k get nodemaintenances -o wide
collect nodemaintenance/nodemaintenances.yaml k get nodemaintenances -o yaml
collect nodemaintenance/status.txt k get nodemaintenances -o \
    'custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,PROGRESS:.status.drainProgress,PENDING:.status.pendingPods,LEASE_ERRORS:.status.errorOnLeaseCount,DELETING:.metadata.deletionTimestamp,ERROR:.status.lastError'

# The pods still on each node in maintenance and every PDB: what blocks a drain.
step "pods on nodes in maintenance, PodDisruptionBudgets"
nodes=$(k get nodemaintenances -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' 2>/dev/null | sort -u)
for node in $nodes; do
    collect "nodemaintenance/pods-on-node-${node}.txt" k get pods -A -o wide --field-selector "spec.nodeName=${node}"
done
collect cluster/poddisruptionbudgets.txt k get pdb -A -o wide
collect cluster/poddisruptionbudgets.yaml k get pdb -A -o yaml

# OpenShift: the etcd quorum guard the webhook asks before a control-plane
# node may enter maintenance (the PDB and the guard pods it selects).
if k get namespace openshift-etcd >/dev/null 2>&1; then
    step "openshift-etcd: etcd quorum guard PodDisruptionBudgets and pods"
    collect openshift-etcd/poddisruptionbudgets.yaml k get pdb -n openshift-etcd -o yaml
    collect openshift-etcd/pods.txt k get pods -n openshift-etcd -o wide --show-labels
fi

step "events for NodeMaintenances and uncordoned Nodes"
collect events/nodemaintenances.txt k get events -A --sort-by=.lastTimestamp \
    --field-selector involvedObject.kind=NodeMaintenance
collect events/nodes-uncordon.txt k get events -A --sort-by=.lastTimestamp \
    --field-selector involvedObject.kind=Node,reason=UncordonNode

step "medik8s leases in $LEASE_NS"
collect leases/medik8s-leases.txt k get leases -n "$LEASE_NS" -o wide
collect leases/medik8s-leases.yaml k get leases -n "$LEASE_NS" -o yaml

step "operator namespace $NS: workloads, services, leader election, events"
collect "operator/resources.txt" k get deployments,replicasets,pods,services,endpoints,poddisruptionbudgets,serviceaccounts -n "$NS" -o wide
collect "operator/deployments.yaml" k get deployments -n "$NS" -o yaml
collect "operator/pods.yaml" k get pods -n "$NS" -o yaml
collect "operator/pods-describe.txt" k describe pods -n "$NS"
collect "operator/services.yaml" k get services,endpoints -n "$NS" -o yaml
collect "operator/leases.yaml" k get leases -n "$NS" -o yaml
collect "operator/events.txt" k get events -n "$NS" --sort-by=.lastTimestamp
# The webhook configuration by the webhook it holds: nmo-validating-webhook
# on the kustomize installs, vnodemaintenance.kb.io-<suffix> under OLM.
vwc_names() {
    k get validatingwebhookconfigurations -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.webhooks[*].name}{"\n"}{end}' |
        awk '{for (i = 2; i <= NF; i++) if ($i == "vnodemaintenance.kb.io") {print $1; break}}'
}
vwc="$(vwc_names 2>/dev/null | tr '\n' ' ')"
if [ -n "$vwc" ]; then
    # shellcheck disable=SC2086 # one argument per name
    collect "operator/validatingwebhookconfiguration.yaml" k get validatingwebhookconfiguration $vwc -o yaml
else
    echo "operator/validatingwebhookconfiguration.yaml: no ValidatingWebhookConfiguration holds webhook vnodemaintenance.kb.io (deleted, or not readable)" >>"$errors"
    failures=$((failures + 1))
fi
collect "operator/rbac.yaml" k get clusterroles,clusterrolebindings nmo-controller nmo-webhook -o yaml

# The serving certificate: subject, SANs and validity only, never the key.
# Secret nmo-webhook-cert on the kustomize installs, OLM's nmo-webhook-service-cert.
cert=""
for secret in nmo-webhook-cert nmo-webhook-service-cert; do
    cert=$(k get secret -n "$NS" "$secret" -o 'jsonpath={.data.tls\.crt}' 2>/dev/null) || cert=""
    [ -z "$cert" ] || break
done
if [ -n "$cert" ]; then
    if command -v openssl >/dev/null 2>&1; then
        printf '%s' "$cert" | base64 -d 2>/dev/null |
            openssl x509 -noout -subject -issuer -dates -ext subjectAltName >"$dir/operator/webhook-certificate.txt" 2>&1
    else
        echo "openssl not found: certificate not decoded" >"$dir/operator/webhook-certificate.txt"
    fi
else
    echo "neither Secret $NS/nmo-webhook-cert (kustomize installs) nor $NS/nmo-webhook-service-cert (OLM) found with a tls.crt" >"$dir/operator/webhook-certificate.txt"
fi
# cert-manager's view when it is installed (missing CRDs are not an error).
if k get crd certificates.cert-manager.io >/dev/null 2>&1; then
    collect "operator/cert-manager.yaml" k get certificates,certificaterequests,issuers -n "$NS" -o yaml
fi

step "operator pod logs (all containers, --previous where a container restarted)"
# One line per pod: name, then its containers with their restart counts.
pods=$(k get pods -n "$NS" -o jsonpath='{range .items[*]}{.metadata.name}{range .status.initContainerStatuses[*]}{" "}{.name}{":"}{.restartCount}{end}{range .status.containerStatuses[*]}{" "}{.name}{":"}{.restartCount}{end}{"\n"}{end}' 2>>"$errors")
if [ -z "$pods" ]; then
    step "  no pods in namespace $NS"
fi
while read -r pod containers; do
    [ -n "$pod" ] || continue
    for entry in $containers; do
        c=${entry%%:*}
        restarts=${entry##*:}
        step "  $pod/$c"
        collect "logs/${pod}/${c}.log" k logs -n "$NS" "$pod" -c "$c" --timestamps
        if [ "${restarts:-0}" != "0" ]; then
            collect "logs/${pod}/${c}.previous.log" k logs -n "$NS" "$pod" -c "$c" --timestamps --previous
        fi
    done
    # A metrics snapshot through the API server's pod proxy (best effort: needs
    # pods/proxy permission; the series are the ones the alerts use). The proxy
    # forwards no token, so with secure metrics (the default) this records a
    # 401; it works for pods run with --metrics-secure=false.
    collect "metrics/${pod}.txt" k get --raw "/api/v1/namespaces/${NS}/pods/https:${pod}:8443/proxy/metrics"
done <<<"$pods"

[ -s "$errors" ] || rm -f "$errors"
echo "items_failed: $failures" >>"$dir/summary.txt"

step "packing ${dir}.tar.gz"
if tar -C "$(dirname "$dir")" -czf "${dir}.tar.gz" "$name"; then
    step "done: ${dir}.tar.gz"
else
    step "tar failed; the bundle is in $dir"
fi
if [ "$failures" -gt 0 ]; then
    step "$failures item(s) could not be collected (often expected: 'top' without metrics-server, metrics without pods/proxy permission); see $dir/errors.txt"
fi
