#!/usr/bin/env bash
# The real-node stage of make test (and `make real-node-test`): nmo-rs run by a
# real kubelet and container runtime, as a cluster runs it.
#   1. make real-node: real-1 joins the plane (tests/node/up.sh)
#   2. the base install as rendered (tests/node/install.sh base): both
#      Deployments roll out on real-1, pods Ready through their own probes
#   3. a NodeMaintenance on a kwok node, admitted by the webhook pod (a second
#      one for the same node denied with upstream's message), Succeeded, and
#      its deletion gives the node back
#   4. the controller at two replicas: one leads (the Lease names it), the
#      other is Ready and waits
#   5. 20 maintenances more, then each pod's memory as the kubelet's cgroups
#      report it (the kubelet's stats summary, through the API server), idle
#      and after, beside the manifests' limits; no pod restarted
#   5b. the local Prometheus (make companions) scrapes both Deployments' pods
#      through the metrics Services' endpoints, as the ServiceMonitors say
#      (its scrapes sent through the node's egress: proxy_url)
#   (2 also reads from the kernel what each pod's process runs with: user,
#   seccomp, no_new_privs, capabilities, read-only root, memory limit)
#   6. suite real_node (tests/tests/integration/real_node.rs): the webhook's
#      rolling upgrade under a stream of creates (0 failed admissions), the
#      controller's while a PodDisruptionBudget holds a drain, and its leading
#      pod deleted mid-drain: the next leader finishes, nothing done twice
#   6b. upstream's own e2e suite (its Go module, v0.17.0) black-box against
#      this install; three specs skipped (upstream-e2e.sh says why)
#   6c. the API server down 12 s mid-drain: the leader gives its Lease up at
#      its 10 s renew deadline and exits, the kubelet restarts it, the drain
#      finishes, each event once (suite real_node, alone: it restarts the plane)
#   7. manifests/overlays/cert-manager on the node with the real cert-manager
#      (make companions): a leaf renewal, then a CA renewal and the leaf's,
#      under a stream of creates: failed admissions (none allowed) and the
#      time until both webhook pods serve the new certificate, the Secret
#      projected by the kubelet
#   8. uninstall, remove the node, and check nothing is left running or mounted
# Prints one line per check; exit 1 at the first that fails, with what was seen.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/lib.sh
source "$here/../cluster/lib.sh"
# shellcheck source=lib.sh
source "$here/lib.sh"
say() { printf '[real-node-stage %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[real-node-stage] FAILED: %s\n' "$*" >&2; exit 1; }
# shellcheck disable=SC1090
source "$STATE_FILE"
t0=$SECONDS

# until_ok WHAT TIMEOUT CMD...: CMD succeeds within TIMEOUT s; else fail,
# printing what CMD printed the last time.
until_ok() {
  local what=$1 timeout=$2 deadline last
  shift 2
  deadline=$((SECONDS + timeout))
  until last="$("$@" 2>&1)"; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what within $timeout s; last seen: $last"
    sleep 0.2
  done
}
jp() { kc get "$@" 2>&1; }
phase_is() { [ "$(jp nodemaintenance "$1" -o jsonpath='{.status.phase}')" = "$2" ] || { jp nodemaintenance "$1" -o jsonpath='{.status}'; return 1; }; }
schedulable() { [ -z "$(jp node "$1" -o jsonpath='{.spec.unschedulable}')" ] || { echo "node $1 still unschedulable"; return 1; }; }
gone() { ! kc get "$@" >/dev/null 2>&1 || { echo "$* still exists"; return 1; }; }
nm() { printf 'apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata: {name: %s}\nspec: {nodeName: %s, reason: "real-node stage"}\n' "$1" "$2"; }
# Apply NodeMaintenance $1 of node $2, its manifest made anew on each try (a
# here-string given to until_ok is read by the first try only: every retry
# then applied nothing and said so, hiding the first try's error).
apply_nm() { nm "$1" "$2" | kc apply -f -; }

cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    say "pods in nmo-system when it failed:"
    kc -n nmo-system get pods -o wide 2>&1 || true
    say "kubelet log tail ($LOGS/kubelet.log):"
    tail -n 30 "$LOGS/kubelet.log" 2>&1 || true
  fi
  bash "$here/install.sh" --uninstall || true
}
trap cleanup EXIT

say "1. the real node"
bash "$here/up.sh"
kc get node "$NODE_NAME" -o wide

say "2. the base install (manifests/base as rendered + tests/node/local-images)"
bash "$here/install.sh" base
pods_line() { # the pods of one component: name node ready restarts
  kc -n nmo-system get pods -l "app.kubernetes.io/component=$1" \
    -o jsonpath='{range .items[*]}{.metadata.name} on {.spec.nodeName} ready={.status.containerStatuses[0].ready} restarts={.status.containerStatuses[0].restartCount}; {end}'
}
for c in webhook controller; do say "   $c pods: $(pods_line "$c")"; done
[ "$(kc -n nmo-system get pods -o jsonpath='{.items[*].spec.nodeName}' | tr ' ' '\n' | sort -u)" = "$NODE_NAME" ] ||
  die "a pod of nmo-system is not on $NODE_NAME: $(kc -n nmo-system get pods -o wide)"

# container_pid POD_UID: the pid (as the machine sees it) of the pod's
# container process (not its pause), found by the pod's memory cgroup.
container_pid() {
  local p comm
  for p in /proc/[0-9]*; do
    grep -q "memory:.*/pod$1/" "$p/cgroup" 2>/dev/null || continue
    read -r comm <"$p/comm" 2>/dev/null || continue
    [ "$comm" = pause ] || { echo "${p#/proc/}"; return 0; }
  done
  return 1
}
# What each pod's process runs with, read from the kernel: the manifests ask
# for uid 65532, seccomp RuntimeDefault (filter mode 2), no privilege
# escalation (NoNewPrivs), every capability dropped, a read-only root and a
# 100Mi memory limit (the cgroup's).
security_line() {
  local pod=$1 uid pid st root limit
  uid="$(kc -n nmo-system get pod "$pod" -o jsonpath='{.metadata.uid}')"
  pid="$(container_pid "$uid")" || { echo "no process found for pod $pod (uid $uid)"; return 1; }
  st="$(cat "/proc/$pid/status")"
  root="$(awk '$5 == "/" {split($6, o, ","); print o[1]}' "/proc/$pid/mountinfo")"
  limit="$(cat "/sys/fs/cgroup/memory$(sed -n 's/^[0-9]*:memory://p' "/proc/$pid/cgroup")/memory.limit_in_bytes")"
  local got="uid=$(awk '/^Uid:/ {print $2}' <<<"$st") seccomp=$(awk '/^Seccomp:/ {print $2}' <<<"$st") nonewprivs=$(awk '/^NoNewPrivs:/ {print $2}' <<<"$st") capeff=$(awk '/^CapEff:/ {print $2}' <<<"$st") root=$root memlimit=$((limit / 1048576))Mi"
  echo "$pod: $got"
  [ "$got" = "uid=65532 seccomp=2 nonewprivs=1 capeff=0000000000000000 root=ro memlimit=100Mi" ]
}
say "   what the pods run with (from the kernel, per container process):"
for pod in $(kc -n nmo-system get pods -o jsonpath='{.items[*].metadata.name}'); do
  line="$(security_line "$pod")" || die "pod $pod does not run as its manifest's securityContext and limits say: $line"
  say "     $line"
done

say "3. a NodeMaintenance through the webhook pod"
target=worker-1
first="real-node-$target"
until_ok "the webhook pod admitted NodeMaintenance $first" 60 apply_nm "$first" "$target"
denied="$(kc apply -f - <<<"$(nm "$first-again" "$target")" 2>&1)" && die "a second NodeMaintenance for $target was admitted: $denied"
[[ "$denied" == *"invalid nodeName, a NodeMaintenance for node $target already exists"* ]] ||
  die "the second NodeMaintenance for $target was refused, but not by the webhook's rule: $denied"
say "   the webhook pod denied a second one: ${denied##*: }"
t=$SECONDS
until_ok "NodeMaintenance $first Succeeded" 120 phase_is "$first" Succeeded
say "   $first Succeeded in $((SECONDS - t)) s (node $target: unschedulable=$(jp node "$target" -o jsonpath='{.spec.unschedulable}'))"
kc delete nodemaintenance "$first" --wait=false >/dev/null
until_ok "NodeMaintenance $first deleted" 60 gone nodemaintenance "$first"
until_ok "node $target given back (schedulable)" 30 schedulable "$target"
say "   deleted: $target given back (schedulable, no drain taint)"

say "4. the controller at two replicas: one leads, the other waits Ready"
kc -n nmo-system scale deployment/nmo-controller --replicas=2 >/dev/null
kc -n nmo-system rollout status deployment/nmo-controller --timeout=120s >/dev/null ||
  die "the controller did not reach 2 Ready replicas: $(kc -n nmo-system get pods -o wide)"
leader="$(jp lease -n nmo-system 135b1886.medik8s.io -o jsonpath='{.spec.holderIdentity}')"
pods="$(kc -n nmo-system get pods -l app.kubernetes.io/component=controller -o jsonpath='{.items[*].metadata.name}')"
[[ " $pods " == *" ${leader%%_*} "* ]] || die "the leader election Lease names '$leader', not one of the controller pods ($pods)"
say "   controller pods: $(pods_line controller)"
say "   leader: $leader"

# memory: per nmo-system pod, the working set the kubelet reports (its
# cgroup's charge: what the limit is enforced on) and the process's RSS
# (which also counts the binary's pages: the page cache is charged to the
# cgroup that first read them, containerd's when it unpacked the image).
memory() {
  local summary pod ws uid pid rss
  summary="$(kc get --raw "/api/v1/nodes/$NODE_NAME/proxy/stats/summary")"
  while read -r pod ws; do
    uid="$(kc -n nmo-system get pod "$pod" -o jsonpath='{.metadata.uid}')"
    rss="?"
    if pid="$(container_pid "$uid")"; then rss="$(awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status")"; fi
    printf '%s working set %s MiB (RSS %s MiB); ' "$pod" "$ws" "$rss"
  done < <(jq -r '.pods[] | select(.podRef.namespace == "nmo-system") |
      "\(.podRef.name) \(((.containers[0].memory.workingSetBytes // 0) / 1048576 * 10 | floor) / 10)"' <<<"$summary" | sort)
}
limit_of() { kc -n nmo-system get deployment "$1" -o jsonpath='{.spec.template.spec.containers[0].resources.limits.memory}'; }
say "5. memory as the kubelet's cgroups report it (working set), beside the limits (webhook $(limit_of nmo-webhook), controller $(limit_of nmo-controller))"
stats_listed() { # the stats summary has a working set for all four pods
  local n
  n="$(kc get --raw "/api/v1/nodes/$NODE_NAME/proxy/stats/summary" |
    jq '[.pods[] | select(.podRef.namespace == "nmo-system") | .containers[0].memory.workingSetBytes // empty] | length')" || return 1
  [ "$n" -ge 4 ] || { echo "$n of 4 nmo-system pods have a working set"; return 1; }
}
until_ok "the kubelet's stats summary lists the nmo-system pods" 60 stats_listed
say "   idle: $(memory)"
for i in $(seq 1 20); do
  node="worker-$(( (i - 1) % 3 + 1 ))"
  name="real-node-load-$i"
  until_ok "NodeMaintenance $name admitted" 30 apply_nm "$name" "$node"
  until_ok "NodeMaintenance $name Succeeded" 60 phase_is "$name" Succeeded
  kc delete nodemaintenance "$name" --wait=false >/dev/null
  until_ok "NodeMaintenance $name deleted" 60 gone nodemaintenance "$name"
done
workers_back() { schedulable worker-1 && schedulable worker-2 && schedulable worker-3; }
until_ok "worker-1..3 given back" 30 workers_back
say "   after 20 maintenances: $(memory)"
restarts="$(kc -n nmo-system get pods -o jsonpath='{range .items[*]}{.status.containerStatuses[0].restartCount}{"\n"}{end}' | sort -u | tr '\n' ' ')"
[ "$restarts" = "0 " ] || die "a pod restarted: $(kc -n nmo-system get pods -o wide)"
say "   restarts: none"

say "5b. Prometheus scrapes the pods through the Services' endpoints, as manifests/monitoring's ServiceMonitors say"
# The local Prometheus (make companions) on the machine, its scrapes sent
# through the node's egress (proxy_url): the targets are the metrics
# Services' EndpointSlices as kube-proxy sees them, the pods' addresses.
prom_url="$(cat "$CLUSTER_DIR/prometheus.url" 2>/dev/null || true)"
if [ -z "$prom_url" ] || ! pid_of prometheus >/dev/null; then
  bash "$REPO_ROOT/tests/companions/up.sh" prometheus
  prom_url="$(cat "$CLUSTER_DIR/prometheus.url")"
fi
proxy="$(sed -n 's/^EGRESS_PROXY_URL=//p' "$NODE_DIR/state.env")"
metrics_services=(nmo-webhook-metrics nmo-controller-metrics)
for svc in "${metrics_services[@]}"; do
  kc -n nmo-system get endpointslices -l "kubernetes.io/service-name=$svc" -o json |
    jq --arg svc "$svc" '[.items[] | .ports[0].port as $port | .endpoints[] | select(.conditions.ready) |
      {targets: ["\(.addresses[0]):\($port)"], labels: {job: $svc, namespace: "nmo-system", service: $svc,
       endpoint: "https", pod: .targetRef.name}}]' >"$CLUSTER_DIR/prometheus/targets/nmo-system_$svc.json"
done
NMO_PROMETHEUS_PROXY_URL="$proxy" bash "$REPO_ROOT/tests/companions/up.sh" prometheus 2>&1 | tail -n 1
targets_up() { # every target of both jobs up: one line each, else what is not
  local t want got
  t="$(curl -fsS "$prom_url/api/v1/targets?state=active")" || return 1
  want=$(jq -s 'map(length) | add' "$CLUSTER_DIR"/prometheus/targets/nmo-system_nmo-{webhook,controller}-metrics.json)
  got="$(jq -r '.data.activeTargets[] | select(.labels.job == "nmo-webhook-metrics" or .labels.job == "nmo-controller-metrics") |
    "\(.labels.job) \(.scrapeUrl) \(.health) \(.lastError)"' <<<"$t")"
  [ "$(grep -c ' up ' <<<"$got")" -eq "$want" ] || { echo "want $want targets up: $got"; return 1; }
  echo "$got"
}
until_ok "Prometheus to scrape every nmo pod through the node (proxy $proxy)" 60 targets_up
targets_up | while read -r job url health _; do say "   $job: $url $health"; done
for svc in "${metrics_services[@]}"; do rm -f "$CLUSTER_DIR/prometheus/targets/nmo-system_$svc.json"; done
bash "$REPO_ROOT/tests/companions/up.sh" prometheus >/dev/null 2>&1 # its configuration without the proxy again

say "6. rolling upgrades and a deleted leader, under load (suite real_node, one test at a time)"
# The webhook's rolling upgrade under a stream of creates (failed admissions
# counted, none allowed); the controller's, while a PodDisruptionBudget holds
# a drain, then its leading pod deleted while another is held: the next
# leader finishes each, each event once.
(cd "$REPO_ROOT" && cargo test -q -p nmo-tests --test integration -- --ignored --test-threads=1 --nocapture \
  real_node:: --skip real_node::cert_manager --skip real_node::apiserver_restart) ||
  die "suite real_node failed (its output above)"

say "6b. upstream's own e2e suite, black-box against this install (tests/node/upstream-e2e.sh)"
e2e_log="$LOGS/real-node-upstream-e2e.log"
if bash "$here/upstream-e2e.sh" >"$e2e_log" 2>&1; then e2e_rc=0; else e2e_rc=$?; fi
grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!|\[FAIL\])' "$e2e_log" | sed 's/^/   /' || true
[ "$e2e_rc" -eq 0 ] || { tail -n 60 "$e2e_log"; die "upstream's e2e suite failed against nmo-rs (log: $e2e_log)"; }

say "6c. the API server down 12 s mid-drain: the leader exits at its renew deadline, the kubelet restarts it"
(cd "$REPO_ROOT" && cargo test -q -p nmo-tests --test integration -- --ignored --exact --nocapture \
  real_node::apiserver_restart_mid_drain_the_kubelet_restarts_the_leader_and_it_finishes) ||
  die "the API server restart on the real node failed (its output above)"
bash "$here/install.sh" --uninstall

say "7. the cert-manager install: the real cert-manager issues, the kubelet projects, renewals under load"
bash "$REPO_ROOT/tests/companions/up.sh" cert-manager
bash "$here/install.sh" cert-manager
(cd "$REPO_ROOT" && cargo test -q -p nmo-tests --test integration -- --ignored --exact --nocapture \
  real_node::cert_manager_renewals_refuse_no_admission) || die "the renewals on the real node failed (output above)"
bash "$here/install.sh" --uninstall

say "8. remove the node, nothing left"
bash "$here/down.sh"
say "real node stage passed in $((SECONDS - t0)) s"
