#!/usr/bin/env bash
# Renders every kustomize variant under manifests/ with `kubectl kustomize` (the
# same engine `kubectl apply -k` uses) and fails on the first error, then checks
# a few facts of the contract in the output. With --server it also server-side
# dry-runs the variants whose kinds a plain cluster knows (base, openshift)
# against KUBECONFIG: nothing is changed on the cluster.
#
# Environment: KUBECTL (default: .cluster/bin/kubectl, else the cached build
# under ~/.cache/nmo-rs/controlplane, else kubectl on PATH), KUBECONFIG (--server).
# Usage: manifests/check.sh [--server]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
server=false
case "${1:-}" in
    --server) server=true ;;
    "") ;;
    *) echo "usage: $0 [--server]" >&2; exit 2 ;;
esac

if [ -z "${KUBECTL:-}" ]; then
    if [ -x "$repo/.cluster/bin/kubectl" ]; then
        KUBECTL=$repo/.cluster/bin/kubectl
    else
        KUBECTL=
        for k in "$HOME"/.cache/nmo-rs/controlplane/kubernetes-*/bin/kubectl; do
            [ -x "$k" ] && KUBECTL=$k # glob order: the last is the newest version
        done
        [ -n "$KUBECTL" ] || KUBECTL=$(command -v kubectl || true)
    fi
fi
if [ -z "$KUBECTL" ] || ! $KUBECTL version --client >/dev/null 2>&1; then
    echo "check: no working kubectl (set KUBECTL)" >&2
    exit 1
fi

fail() { echo "check: FAIL: $*" >&2; exit 1; }

# kustomize loads files outside a kustomization root only through another
# kustomization, so base needs one in each directory it includes.
for d in crd controller webhook networkpolicy; do
    [ -f "$here/$d/kustomization.yaml" ] ||
        fail "manifests/$d/kustomization.yaml is missing: manifests/base includes ../$d (a kustomization listing the directory's YAML files)"
done

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

variants=(base overlays/cert-manager overlays/openshift monitoring)
for v in "${variants[@]}"; do
    f="$out/${v//\//_}.yaml"
    if ! $KUBECTL kustomize "$here/$v" >"$f" 2>"$f.err"; then
        cat "$f.err" >&2
        fail "kubectl kustomize manifests/$v"
    fi
    [ -s "$f" ] || fail "manifests/$v renders to nothing"
    echo "ok   manifests/$v ($(grep -c '^kind:' "$f") objects)"
done

# has FILE REGEX WHAT: the rendered variant must contain REGEX.
has() { grep -Eq -- "$2" "$1" || fail "$3"; }
hasnt() { ! grep -Eq -- "$2" "$1" || fail "$3"; }
b=$out/base.yaml cm=$out/overlays_cert-manager.yaml os=$out/overlays_openshift.yaml mon=$out/monitoring.yaml
for f in "$b" "$cm" "$os"; do
    n=$(basename "$f" .yaml)
    has "$f" '^  name: nodemaintenances.nodemaintenance.medik8s.io$' "$n: the CRD is missing"
    has "$f" 'path: /validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance$' "$n: webhook path differs from upstream's"
    has "$f" '^  name: vnodemaintenance.kb.io$' "$n: webhook name differs from upstream's"
    has "$f" '^  name: nodedrainrules.nodemaintenance.medik8s.io$' "$n: the NodeDrainRule CRD is missing"
    has "$f" 'path: /validate-nodemaintenance-medik8s-io-v1alpha1-nodedrainrule$' "$n: the NodeDrainRule webhook is missing"
    has "$f" 'failurePolicy: Fail$' "$n: failurePolicy is not Fail"
    has "$f" '^  name: nmo-controller$' "$n: nmo-controller is missing"
    has "$f" '^  name: nmo-webhook$' "$n: nmo-webhook is missing"
    has "$f" 'secretName: nmo-webhook-cert$' "$n: webhook does not mount Secret nmo-webhook-cert"
done
hasnt "$b" 'caBundle:' "base: caBundle must stay empty in base"
# Upstream's controller arguments, secure metrics on 8443 and the RBAC it needs.
ctrl=$out/controller-deployment.yaml
awk 'BEGIN{RS="\n---\n"} /kind: Deployment/ && /\n  name: nmo-controller\n/' "$b" >"$ctrl"
[ -s "$ctrl" ] || fail "base: no nmo-controller Deployment found"
[ "$(sed -n '/^ *- args:$/,/^ *command:/p' "$ctrl" | grep -c '^ *- --')" = 4 ] ||
    fail "base: nmo-controller must run with exactly upstream's four arguments"
for a in --leader-elect --enable-http2=false --metrics-bind-address=:8443 --health-probe-bind-address=:8081; do
    has "$ctrl" "^ +- $a\$" "base: nmo-controller argument $a (upstream's list) missing"
done
hasnt "$b" 'metrics-secure=false' "base: metrics must be served securely (no --metrics-secure=false)"
has "$b" 'containerPort: 8443$' "base: metrics container port 8443 missing"
has "$b" 'name: OPERATOR_NAMESPACE$' "base: OPERATOR_NAMESPACE env missing"
has "$b" 'nonResourceURLs:$' "base: ClusterRole nmo-metrics-reader (nonResourceURLs /metrics) missing"
has "$b" '- tokenreviews$' "base: create on tokenreviews (secure metrics) missing"
has "$b" '- subjectaccessreviews$' "base: create on subjectaccessreviews (secure metrics) missing"
has "$b" '^  name: nmo-metrics-auth$' "base: ClusterRole nmo-metrics-auth missing"
# Least privilege (issue 13): namespaced Roles where the namespace is known;
# the full proof is the audit check after the integration tests
# (tests/tools/src/bin/rbac-audit.rs).
# docs FILE KIND: the documents of that kind, separated by NUL.
docs() { awk -v k="$2" 'BEGIN{RS="\n---\n"; ORS="\0"} $0 ~ "(^|\n)kind: " k "\n" {print}' "$1"; }
# Namespaces themselves are cluster-scoped: a ClusterRole may read them (the
# drain rules' namespaceSelector: list, watch), never write them.
while IFS= read -r -d '' d; do
    ! grep -Eq -- '- (leases|events|secrets|configmaps)$' <<<"$d" ||
        fail "base: a ClusterRole grants leases, events, secrets or configmaps cluster-wide; these are Roles in their namespace:
$d"
    ! awk '/^- apiGroups:/{if (ns && bad) found=1; ns=0; bad=0}
           /^  - namespaces$/{ns=1}
           /^  - (create|update|patch|delete|deletecollection|\*)$/{bad=1}
           END{if (ns && bad) found=1; exit !found}' <<<"$d" ||
        fail "base: a ClusterRole may write namespaces; only list and watch are granted:
$d"
done < <(docs "$b" ClusterRole)
has "$b" '^  name: medik8s-leases$' "base: Namespace medik8s-leases (home of the per-node leases and their Role) missing"
for r in nmo-controller-node-leases nmo-controller-leader-election nmo-controller-events; do
    [ "$(docs "$b" Role | tr '\0' '\n' | grep -c "^  name: $r\$")" = 1 ] || fail "base: Role $r missing"
done
# Forcing pods past their PodDisruptionBudgets is the cluster admin's choice
# (issue 22): no variant grants delete on pods or turns Force on; only the
# force-drain component does, rendered here over base.
for f in "$b" "$cm" "$os"; do
    while IFS= read -r -d '' d; do
        # One rule at a time: "- apiGroups:" opens each.
        rule=$(awk 'BEGIN{RS="\n- apiGroups:"} /\n  - pods\n/ && /\n  - delete(\n|$)/ {print}' <<<"$d")
        [ -z "$rule" ] || fail "$(basename "$f" .yaml): a ClusterRole grants delete on pods; that belongs in manifests/components/force-drain only:
$d"
    done < <(docs "$f" ClusterRole)
    hasnt "$f" 'ALLOW_FORCE_DRAIN' "$(basename "$f" .yaml): ALLOW_FORCE_DRAIN belongs in manifests/components/force-drain only"
done
fd=$out/force-drain.yaml
$KUBECTL kustomize "$repo/tests/cluster/force-drain" >"$fd" 2>"$fd.err" || { cat "$fd.err" >&2; fail "kubectl kustomize of base with components/force-drain (tests/cluster/force-drain)"; }
[ "$(grep -c 'name: ALLOW_FORCE_DRAIN$' "$fd")" = 2 ] || fail "components/force-drain: ALLOW_FORCE_DRAIN must be set on both Deployments"
has "$fd" '^  name: nmo-controller-force-drain$' "components/force-drain: ClusterRole nmo-controller-force-drain missing"
echo "ok   manifests/components/force-drain over base ($(grep -c '^kind:' "$fd") objects)"
has "$os" '^  name: nmo-webhook-etcd-quorum$' "openshift: the webhook's Role in openshift-etcd is missing"
hasnt "$b" '^  namespace: openshift-etcd$' "base: objects in openshift-etcd belong in overlays/openshift (the namespace exists only on OpenShift)"
for f in "$b" "$cm" "$os"; do
    [ "$(grep -c '^kind: NetworkPolicy$' "$f")" = 2 ] || fail "$(basename "$f" .yaml): the two NetworkPolicies (manifests/networkpolicy) are missing"
done
has "$mon" 'scheme: https$' "monitoring: ServiceMonitors must scrape https"
hasnt "$mon" 'scheme: http$' "monitoring: a ServiceMonitor still scrapes plain http"
has "$mon" '^  name: nmo-metrics-reader$' "monitoring: ClusterRoleBinding to nmo-metrics-reader missing"
has "$cm" 'cert-manager.io/inject-ca-from: nmo-system/nmo-webhook-cert$' "cert-manager: CA injection annotation missing"
has "$cm" '^kind: Certificate$' "cert-manager: Certificate missing"
has "$os" 'service.beta.openshift.io/serving-cert-secret-name: nmo-webhook-cert$' "openshift: serving-cert annotation missing"
has "$os" "service.beta.openshift.io/inject-cabundle: \"true\"$" "openshift: inject-cabundle annotation missing"
hasnt "$os" 'runAsUser:' "openshift: a fixed runAsUser breaks the restricted-v2 SCC"
for a in NodeMaintenanceFailed NodeMaintenanceStuck NodeMaintenanceWebhookDown WebhookCertificateExpiringSoon NodeMaintenanceReconcileErrors; do
    has "$mon" "alert: $a$" "monitoring: alert $a missing"
done
has "$mon" 'grafana_dashboard: "1"$' "monitoring: dashboard ConfigMap label missing"

# The reader bindings for the stacks people run (monitoring/readers/*): each
# component, used as its comment says, binds nmo-metrics-reader to that
# stack's Prometheus ServiceAccount(s).
for r in openshift-monitoring:prometheus-k8s:openshift-monitoring \
    openshift-monitoring:prometheus-user-workload:openshift-user-workload-monitoring \
    kube-prometheus-stack:kube-prometheus-stack-prometheus:monitoring; do
    IFS=: read -r comp sa ns <<<"$r"
    k="$out/reader-$comp"
    mkdir -p "$k"
    printf 'resources: [%s]\ncomponents: [%s]\n' "$(realpath --relative-to="$k" "$here/monitoring")" \
        "$(realpath --relative-to="$k" "$here/monitoring/readers/$comp")" >"$k/kustomization.yaml"
    $KUBECTL kustomize --load-restrictor LoadRestrictionsNone "$k" >"$k/out.yaml" 2>"$k/err" ||
        { cat "$k/err" >&2; fail "monitoring/readers/$comp does not render with manifests/monitoring"; }
    grep -qE "name: $sa, namespace: $ns|name: $sa\$" "$k/out.yaml" && grep -q "namespace: $ns" "$k/out.yaml" ||
        fail "monitoring/readers/$comp: ServiceAccount $ns/$sa is not bound to nmo-metrics-reader"
    echo "ok   manifests/monitoring/readers/$comp binds $ns/$sa"
done
# The runbook links: the annotation's base in front of every anchor (the
# replacement of monitoring/kustomization.yaml), as make release pins them.
runbook_base=$(sed -nE 's/^ *nmo.medik8s.io\/runbook-base: *//p' "$mon")
[ -n "$runbook_base" ] || fail "monitoring: the PrometheusRule has no nmo.medik8s.io/runbook-base annotation"
unlinked=$(grep -E '^ *runbook_url: ' "$mon" | sed -E 's/^ *runbook_url: *"?//; s/"$//' | awk -v p="$runbook_base#" 'index($0, p) != 1' || true)
[ -z "$unlinked" ] || fail "monitoring: runbook_url(s) not starting with the annotation's $runbook_base# (the replacement in monitoring/kustomization.yaml): $unlinked"
[ "$(grep -cE '^ *runbook_url: ' "$mon")" = "$(grep -cE '^ *- alert: ' "$mon")" ] || fail "monitoring: an alert has no runbook_url"
if command -v python3 >/dev/null 2>&1; then
    python3 -m json.tool "$here/monitoring/nmo-dashboard.json" >/dev/null || fail "monitoring/nmo-dashboard.json is not valid JSON"
fi
bash -n "$here/must-gather.sh" || fail "must-gather.sh has a syntax error"
echo "ok   contract checks"

if $server; then
    [ -n "${KUBECONFIG:-}" ] || fail "--server needs KUBECONFIG"
    # A dry-run cannot judge objects in a namespace the server does not have
    # (openshift-etcd off OpenShift; nmo-system before the first install):
    # those are left out, and said so.
    have_ns=" $($KUBECTL get namespaces -o jsonpath='{.items[*].metadata.name}') "
    for v in base overlays/openshift; do
        f="$out/${v//\//_}.yaml"
        awk -v have="$have_ns" -v dropped="$out/dropped" '
            BEGIN { RS = "\n---\n" }
            {
                ns = ""; inmeta = 0; n = split($0, l, "\n")
                for (i = 1; i <= n; i++) {
                    if (l[i] ~ /^metadata:/) { inmeta = 1; continue }
                    if (inmeta && l[i] ~ /^[^ ]/) inmeta = 0
                    if (inmeta && l[i] ~ /^  namespace: /) ns = substr(l[i], 14)
                }
                if (ns != "" && index(have, " " ns " ") == 0) { print ns >dropped; next }
                printf "%s\n---\n", $0
            }' "$f" >"$out/dry.yaml"
        if ! $KUBECTL apply -f "$out/dry.yaml" --dry-run=server >"$out/dry.out" 2>&1; then
            cat "$out/dry.out" >&2
            fail "server-side dry-run of manifests/$v"
        fi
        skipped=""
        if [ -s "$out/dropped" ]; then
            skipped=" (not judged: $(sort "$out/dropped" | uniq -c | awk '{printf "%s%d in namespace %s", sep, $1, $2; sep=", "}'), absent on this server)"
            rm -f "$out/dropped"
        fi
        echo "ok   manifests/$v (server-side dry-run)$skipped"
    done
fi
