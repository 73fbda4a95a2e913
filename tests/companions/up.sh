#!/usr/bin/env bash
# make companions: what users run beside nmo-rs, for real, against the local
# control plane (started or reused first): cert-manager (controller and
# cainjector, from cert-manager's Go module), kube-state-metrics and
# Prometheus 3 (each from its Go module), each a local process with its pid and log in .cluster/ like the
# plane's components; tests/cluster/down.sh stops them with the plane.
#
#   tests/companions/up.sh [cert-manager|kube-state-metrics|prometheus]...   (default: all)
#
# cert-manager: its CRDs (same module version) applied server-side, namespace
# cert-manager (where ClusterIssuers keep their Secrets), then a throwaway
# self-signed Certificate in that namespace must become Ready: that proves
# the issuing loops and the approver run.
#
# Prometheus: its configuration is manifests/monitoring as rendered, turned
# into a plain Prometheus configuration the way the Prometheus Operator does
# (tests/tools/src/bin/prometheus-config.rs): each ServiceMonitor endpoint a
# scrape job with its scheme, path, token file and TLS settings, the
# PrometheusRule's groups a rule file. The token is a ServiceAccount's that
# the rendered nmo-metrics-reader binding names (created here: namespace and
# ServiceAccount, plus the binding itself, as the manifest has it). Targets
# come from files in .cluster/prometheus/targets/ (NAMESPACE_SERVICE.json),
# written by whoever runs that Service's pods locally (the tests,
# make deploy-local). For a test to see alerts fire in seconds, this
# Prometheus scrapes and evaluates every NMO_PROMETHEUS_INTERVAL (2s) and
# holds every alert's `for:` at NMO_PROMETHEUS_RULE_FOR (5s); promtool's rule
# tests (tests/monitoring/rules-test.sh) check the manifest's own durations.
# NMO_PROMETHEUS_MONITORING names another kustomization to set it up from
# (e.g. tests/monitoring/cert-manager: the ServiceMonitors verifying the
# metrics certificate cert-manager issued). NMO_PROMETHEUS_PROXY_URL sends
# the ServiceMonitors' scrapes through that HTTP CONNECT proxy (the real
# node's pods: tests/node/stage.sh). Its base URL goes to
# .cluster/prometheus.url.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../cluster/lib.sh
source "$root/tests/cluster/lib.sh"
# shellcheck source=versions.env
source "$here/versions.env"
clog() { printf '[companions %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
COMPONENT_TIMEOUT="${COMPONENT_TIMEOUT:-120}"
fix_no_proxy

[ $# -gt 0 ] || set -- cert-manager kube-state-metrics prometheus
for c in "$@"; do
  case "$c" in
    cert-manager | kube-state-metrics | prometheus) ;;
    *) die "unknown companion '$c' (cert-manager, kube-state-metrics or prometheus)" ;;
  esac
done

clog "local control plane (tests/cluster/up.sh)"
bash "$root/tests/cluster/up.sh" >&2
# shellcheck disable=SC1090
source "$STATE_FILE"

clog "building (cached) $*"
declare -A built
while IFS='=' read -r k v; do built[$k]=$v; done < <(bash "$here/build.sh" "$@")

exec 9>"$CLUSTER_DIR/.lock"
flock 9

# ---- cert-manager
cert_manager_up() {
  local want="${built[CERT_MANAGER_CONTROLLER]} ${NMO_CAINJECTOR_FEATURE_GATES:-}"
  if pid_of cert-manager-controller >/dev/null && pid_of cert-manager-cainjector >/dev/null &&
    [ "$(cat "$CLUSTER_DIR/cert-manager.bin" 2>/dev/null)" = "$want" ]; then
    clog "cert-manager: running (reused)"
    return 0
  fi
  local c
  for c in cert-manager-controller cert-manager-cainjector; do
    if pid="$(pid_of "$c")"; then
      clog "cert-manager: stopping the running $c (pid $pid): other binary or flags"
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 100); do is_ours "$pid" || break; sleep 0.1; done
      ! is_ours "$pid" || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  clog "cert-manager: CRDs ($CERT_MANAGER_VERSION, from its module)"
  kc apply --server-side --force-conflicts -f "${built[CERT_MANAGER_CRDS]}" >/dev/null
  kc wait --for=condition=Established --timeout=60s crd/certificates.cert-manager.io \
    crd/issuers.cert-manager.io crd/certificaterequests.cert-manager.io >/dev/null
  kc create namespace cert-manager --dry-run=client -o yaml | kc apply -f - >/dev/null
  # The processes take the admin kubeconfig: cert-manager's own RBAC is the
  # Helm chart's business, not what these tests prove.
  start_component cert-manager-controller "${built[CERT_MANAGER_CONTROLLER]}" controller \
    --kubeconfig "$KUBECONFIG_ADMIN" --cluster-resource-namespace cert-manager
  # NMO_CAINJECTOR_FEATURE_GATES: e.g. CAInjectorMerging=false, to see how an
  # older cainjector (replacing the caBundle, not merging) rotates.
  start_component cert-manager-cainjector "${built[CERT_MANAGER_CAINJECTOR]}" cainjector \
    --kubeconfig "$KUBECONFIG_ADMIN" ${NMO_CAINJECTOR_FEATURE_GATES:+--feature-gates "$NMO_CAINJECTOR_FEATURE_GATES"}
  echo "$want" >"$CLUSTER_DIR/cert-manager.bin"
  clog "cert-manager: a throwaway self-signed Certificate must become Ready"
  kc apply -f - >/dev/null <<'EOF'
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: companions-smoke, namespace: cert-manager}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: companions-smoke, namespace: cert-manager}
spec:
  secretName: companions-smoke
  commonName: companions-smoke
  issuerRef: {kind: Issuer, name: companions-smoke}
EOF
  cert_ready() { [ "$(kc -n cert-manager get certificate companions-smoke -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
  wait_healthy cert-manager-controller cert_ready
  starting_alive cert-manager-cainjector || component_failed cert-manager-cainjector "exited during startup"
  kc -n cert-manager delete certificate/companions-smoke issuer/companions-smoke secret/companions-smoke \
    --ignore-not-found >/dev/null
  clog "cert-manager $CERT_MANAGER_VERSION: controller and cainjector running (logs: $LOGS/cert-manager-*.log)"
}

# ---- kube-state-metrics: Deployments and Pods, what the Down alerts consult
# (kube_deployment_status_replicas_available), on a port of its own.
KSM_PORT_FILE="$CLUSTER_DIR/kube-state-metrics.addr"
kube_state_metrics_up() {
  if pid_of kube-state-metrics >/dev/null && [ -s "$KSM_PORT_FILE" ]; then
    clog "kube-state-metrics: running (reused) at $(cat "$KSM_PORT_FILE")"
    return 0
  fi
  # 29100 and up: clear of make deploy-local's fixed ports (18080, 28080, ...).
  local port=29100
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$((port + 1))") 2>/dev/null; do
    port=$((port + 2))
  done
  start_component kube-state-metrics "${built[KUBE_STATE_METRICS_BIN]}" --kubeconfig "$KUBECONFIG_ADMIN" \
    --host 127.0.0.1 --port "$port" --telemetry-host 127.0.0.1 --telemetry-port "$((port + 1))" \
    --resources deployments,pods
  ksm_ready() { curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$port/metrics" 2>/dev/null; }
  wait_healthy kube-state-metrics ksm_ready
  echo "127.0.0.1:$port" >"$KSM_PORT_FILE"
  clog "kube-state-metrics $KUBE_STATE_METRICS_VERSION: http://127.0.0.1:$port/metrics (log: $LOGS/kube-state-metrics.log)"
}

# ---- Prometheus
PROM_DIR="$CLUSTER_DIR/prometheus"
prometheus_up() {
  local interval="${NMO_PROMETHEUS_INTERVAL:-2s}" rule_for="${NMO_PROMETHEUS_RULE_FOR:-5s}" ksm=""
  # kube-state-metrics, when it runs, is scraped too (job kube-state-metrics).
  if pid_of kube-state-metrics >/dev/null && [ -s "$KSM_PORT_FILE" ]; then ksm="$(cat "$KSM_PORT_FILE")"; fi
  mkdir -p "$PROM_DIR/targets" "$PROM_DIR/data"
  local monitoring="${NMO_PROMETHEUS_MONITORING:-manifests/monitoring}"
  kc kustomize "$root/$monitoring" >"$PROM_DIR/monitoring.yaml"
  kc kustomize "$root/manifests/base" >"$PROM_DIR/base.yaml"
  # The scraper's identity: the ServiceAccount the rendered binding names.
  local binding sa_ns sa_name
  binding="$(awk 'BEGIN{RS="---\n"} /kind: ClusterRoleBinding/ && /name: nmo-metrics-reader/' "$PROM_DIR/monitoring.yaml")"
  [ -n "$binding" ] || die "manifests/monitoring renders no ClusterRoleBinding to nmo-metrics-reader"
  sa_name="$(sed -n '/subjects:/,$ s/^ *name: *//p' <<<"$binding" | head -n 1)"
  sa_ns="$(sed -n '/subjects:/,$ s/^ *namespace: *//p' <<<"$binding" | head -n 1)"
  [ -n "$sa_name" ] && [ -n "$sa_ns" ] || die "could not read the subject of the nmo-metrics-reader binding in manifests/monitoring"
  kc create namespace "$sa_ns" --dry-run=client -o yaml | kc apply -f - >/dev/null
  kc -n "$sa_ns" create serviceaccount "$sa_name" --dry-run=client -o yaml | kc apply -f - >/dev/null
  # ClusterRole nmo-metrics-reader itself is manifests/controller's (in the
  # namespace manifests/base makes).
  kc apply -f "$root/manifests/base/namespace.yaml" --server-side --force-conflicts >/dev/null
  kc apply -k "$root/manifests/controller" --server-side --force-conflicts >/dev/null
  kc apply -f - <<<"$binding" >/dev/null
  kc -n "$sa_ns" create token "$sa_name" --duration=24h >"$PROM_DIR/token"
  chmod 600 "$PROM_DIR/token"
  clog "prometheus: scrapes as ServiceAccount $sa_ns/$sa_name (bound to nmo-metrics-reader by manifests/monitoring)"
  cargo build -q -p nmo-tools --bin prometheus-config
  mkdir -p "$PROM_DIR/secrets"
  local refs
  refs="$("${CARGO_TARGET_DIR:-$root/target}/debug/prometheus-config" \
    --monitoring "$PROM_DIR/monitoring.yaml" --services "$PROM_DIR/base.yaml" \
    --out "$PROM_DIR" --targets "$PROM_DIR/targets" --secrets-dir "$PROM_DIR/secrets" \
    --file "/var/run/secrets/kubernetes.io/serviceaccount/token=$PROM_DIR/token" \
    --interval "$interval" --rule-for "$rule_for" --evaluation-interval "$interval" \
    ${ksm:+--static-job "kube-state-metrics=$ksm"} \
    ${NMO_PROMETHEUS_PROXY_URL:+--proxy-url "$NMO_PROMETHEUS_PROXY_URL"})"
  # Secret keys the ServiceMonitors read (a CA to verify the services by), as
  # the Prometheus Operator mounts them: from the cluster when the Secret is
  # there; until then a placeholder CA that verifies nothing (Prometheus
  # re-reads the file at every scrape, so whoever issues the Secret later
  # writes it here: the prometheus suite does).
  local _word id path ns name key
  while read -r _word id path; do
    [ -n "$id" ] || continue
    IFS=/ read -r ns name key <<<"$id"
    if kc -n "$ns" get secret "$name" -o "jsonpath={.data.${key//./\\.}}" 2>/dev/null | base64 -d >"$path.tmp" 2>/dev/null && [ -s "$path.tmp" ]; then
      mv "$path.tmp" "$path"
      clog "prometheus: $id from the cluster -> $path"
    else
      rm -f "$path.tmp"
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout /dev/null \
        -subj "/CN=nmo-rs placeholder CA" -days 1 -out "$path" 2>/dev/null
      clog "prometheus: $id not issued yet: a placeholder CA in $path until then"
    fi
  done <<<"$refs"
  clog "prometheus: scrape jobs from $monitoring"
  "${built[PROMTOOL_BIN]}" check config "$PROM_DIR/prometheus.yml" >&2

  if pid="$(pid_of prometheus)"; then
    clog "prometheus: running; reloading its configuration"
    curl -fsS -X POST "$(cat "$CLUSTER_DIR/prometheus.url")/-/reload" >/dev/null ||
      die "prometheus (pid $pid) did not take the new configuration (log: $LOGS/prometheus.log)"
    return 0
  fi
  local port=29090
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  start_component prometheus "${built[PROMETHEUS_BIN]}" \
    --config.file="$PROM_DIR/prometheus.yml" --storage.tsdb.path="$PROM_DIR/data" \
    --web.listen-address="127.0.0.1:$port" --web.enable-lifecycle \
    --storage.tsdb.retention.time=1d --log.level=warn
  prom_ready() { curl -fsS --max-time 2 "http://127.0.0.1:$port/-/ready" >/dev/null 2>&1; }
  wait_healthy prometheus prom_ready
  echo "http://127.0.0.1:$port" >"$CLUSTER_DIR/prometheus.url"
  clog "prometheus ($PROMETHEUS_VERSION): http://127.0.0.1:$port (in .cluster/prometheus.url; log: $LOGS/prometheus.log)"
}

for c in "$@"; do
  case "$c" in
    cert-manager) cert_manager_up ;;
    kube-state-metrics) kube_state_metrics_up ;;
    prometheus) prometheus_up ;;
  esac
done
