#!/usr/bin/env bash
# `make demo`: a guided planned maintenance on the local control plane.
# Brings up the cluster and both services (tests/deploy/deploy-local.sh: from
# their images, as their manifests/base Deployments run them), puts a workload
# on a node, creates a NodeMaintenance, prints the drain as it happens, shows
# what the node carries and the events, then deletes the NodeMaintenance and
# shows the node given back. DEMO_ON=real-node (make demo-real-node) runs the
# services as pods of manifests/base on the real node (tests/node/) instead.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"
K() { .cluster/bin/kubectl --kubeconfig .cluster/kubeconfig "$@"; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '\033[36m$ kubectl %s\033[0m\n' "$*"; K "$@"; }
fail() { printf 'demo failed: %s\n' "$*" >&2; exit 1; }

NODE="${DEMO_NODE:-worker-1}"
NM="maintain-$NODE"

if [ "${DEMO_ON:-}" = real-node ]; then
  # make demo-real-node: the same maintenance, the services run as a cluster
  # runs them: manifests/base rolled out by a real kubelet (tests/node/).
  say "Starting the local control plane, the real node real-1 and manifests/base on it (first run builds Kubernetes and the kubelet: minutes)"
  bash tests/deploy/deploy-local.sh --stop >/dev/null 2>&1 || true
  bash tests/cluster/up.sh
  bash tests/node/up.sh
  bash tests/node/install.sh base
  logs_hint="kubectl -n nmo-system logs deploy/nmo-controller (and deploy/nmo-webhook)"
  stop_hint="bash tests/node/install.sh --uninstall; make cluster-down"
else
  say "Starting the local control plane and both services (first run builds Kubernetes: minutes)"
  bash tests/node/install.sh --uninstall >/dev/null 2>&1 || true # a make demo-real-node install would judge and reconcile too
  bash tests/deploy/deploy-local.sh
  [ -f .cluster/pids/controller.pid ] || bash tests/deploy/controller-local.sh
  logs_hint=".cluster/logs/{controller,webhook}.log"
  stop_hint="make undeploy-local cluster-down"
fi

say "A workload: 6 web replicas spread over the workers, guarded by a PodDisruptionBudget"
K create namespace demo --dry-run=client -o yaml | K apply -f - >/dev/null
cat <<YAML | K apply -f - >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      topologySpreadConstraints:
        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: web}}}
      containers: [{name: web, image: registry.example/web:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: demo}
spec: {maxUnavailable: 1, selector: {matchLabels: {app: web}}}
YAML
K rollout status -n demo deployment/web --timeout=90s >/dev/null || fail "the demo Deployment did not become ready"
run get pods -n demo -o wide

say "Put $NODE into maintenance"
# Shown on stdout, then applied. Not `tee /dev/stderr`: that reopens the
# file behind stderr, and with `make demo > demo.log 2>&1` truncates the log.
nm_yaml="apiVersion: nodemaintenance.medik8s.io/v1beta1
kind: NodeMaintenance
metadata: {name: $NM}
spec:
  nodeName: $NODE
  reason: \"demo: kernel security patch\""
printf '%s\n' "$nm_yaml"
printf '%s\n' "$nm_yaml" | K apply -f - >/dev/null

say "Drain progress (the PDB lets one web pod go at a time)"
deadline=$((SECONDS + 120)); last=""
while :; do
  # drainProgress 0 is omitted from status (omitempty, as upstream): show it as 0.
  # jsonpath prints no final newline, and read fails (set -e) without one: add it.
  IFS='|' read -r phase progress pending lasterr < <(K get nm "$NM" -o \
    jsonpath='{.status.phase}|{.status.drainProgress}|{.status.pendingPods}|{.status.lastError}' 2>/dev/null || true; echo)
  line="${phase:-<no status yet>} ${progress:-0}% pending=${pending:-[]} ${lasterr}"
  if [ "$line" != "$last" ]; then printf '  %s  %s\n' "$(date +%T)" "$line"; last="$line"; fi
  case "$line" in Succeeded*) break ;; Failed*) fail "maintenance failed: $line" ;; esac
  [ $SECONDS -lt $deadline ] || fail "maintenance did not finish within 120 s; last status: $line"
  sleep 0.5
done
run get nm "$NM"

say "What the node carries now"
run get node "$NODE" -o jsonpath='{"unschedulable: "}{.spec.unschedulable}{"\ntaints: "}{.spec.taints}{"\nexclude-from-remediation label: "}{.metadata.labels.remediation\.medik8s\.io/exclude-from-remediation}{"\n"}'
run get lease -n medik8s-leases "node-$NODE" -o jsonpath='{"lease holder: "}{.spec.holderIdentity}{", duration: "}{.spec.leaseDurationSeconds}{"s\n"}'
run get pods -n demo -o wide
say "Events"
run get events -A --field-selector "involvedObject.name=$NM" -o custom-columns=REASON:.reason,MESSAGE:.message,FROM:.source.component

say "Maintenance done: delete the NodeMaintenance and the node is given back"
run delete nm "$NM" --wait=true
run get node "$NODE" -o jsonpath='{"unschedulable: "}{.spec.unschedulable}{"\ntaints: "}{.spec.taints}{"\n"}'
K get lease -n medik8s-leases "node-$NODE" >/dev/null 2>&1 && fail "lease node-$NODE still exists" || echo "lease node-$NODE released"
run get events -A --field-selector "involvedObject.name=$NODE,reason=UncordonNode" -o custom-columns=REASON:.reason,MESSAGE:.message,OBJECT:.involvedObject.name
K delete namespace demo --wait=false >/dev/null

say "Done. Logs: $logs_hint   Stop everything: $stop_hint"
