#!/usr/bin/env bash
# Installs nmo-rs on the real node (tests/node/up.sh) as a user installs it,
# the manifests as rendered plus only tests/node/local-images (images never
# pulled, pods on the real node):
#
#   tests/node/install.sh base        manifests/base; the serving Secret and the
#                                     caBundle made as manifests/README.md says
#   tests/node/install.sh cert-manager  manifests/overlays/cert-manager; the real
#                                     cert-manager (make companions) issues and injects
#   tests/node/install.sh --uninstall everything the install made, the CRD last
#                                     (no NodeMaintenance may be left)
#
# Waits for both Deployments to roll out (their pods Ready through their own
# probes) and prints the pods with their node and restart counts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/lib.sh
source "$here/../cluster/lib.sh"
# shellcheck source=lib.sh
source "$here/lib.sh"
[ -f "$STATE_FILE" ] || die "no local plane is running: make cluster-up first"
# shellcheck disable=SC1090
source "$STATE_FILE"
ROLLOUT_TIMEOUT="${ROLLOUT_TIMEOUT:-180}"
out="$CLUSTER_DIR/real-node-install"

uninstall() {
  [ -f "$out/rendered.yaml" ] || { log "nothing installed on the real node"; return 0; }
  log "uninstalling (kubectl delete of the rendered install)"
  # While the controller still runs: it removes their finalizers; the CRD
  # cannot be deleted before them.
  if ! kc delete nodemaintenances --all --wait=true --timeout=60s >/dev/null 2>&1; then
    die "NodeMaintenances still there 60 s after their deletion: $(kc get nodemaintenances -o name 2>/dev/null | tr '\n' ' ')
the controller could not remove their finalizers: see its log, and whether a validating webhook refuses the update (kubectl get validatingwebhookconfigurations; one left by an aborted test run: tests/cluster/sweep.sh removes it)"
  fi
  kc delete -f "$out/rendered.yaml" --ignore-not-found --wait=true --timeout=120s >/dev/null
  rm -rf "$out"
}

# clean_slate: what a previous install left under the manifests' fixed names
# goes first (namespace nmo-system with its Certificates, Issuers and
# Secrets, the webhook configuration), as on a cluster it was never
# installed on: a cert-manager Certificate left behind would keep issuing
# over the base install's Secret, and cainjector would keep rewriting the
# caBundle.
clean_slate() {
  local found=""
  kc get namespace nmo-system >/dev/null 2>&1 && found+="namespace nmo-system ($(kc -n nmo-system get certificates.cert-manager.io,issuers.cert-manager.io,deployments -o name 2>/dev/null | tr '\n' ' ')) "
  kc get validatingwebhookconfiguration nmo-validating-webhook >/dev/null 2>&1 && found+="validatingwebhookconfiguration nmo-validating-webhook"
  [ -n "$found" ] || return 0
  log "removing what an earlier install left: $found"
  kc delete validatingwebhookconfiguration nmo-validating-webhook --ignore-not-found >/dev/null
  kc delete namespace nmo-system --ignore-not-found --wait=true --timeout=120s >/dev/null ||
    die "namespace nmo-system was not deleted within 120 s: $(kc get namespace nmo-system -o jsonpath='{.status}' 2>&1)"
}

install_base() {
  node_init_pid >/dev/null || die "the real node is not running: make real-node"
  clean_slate
  mkdir -p "$out"
  kc kustomize "$here/install/base" >"$out/rendered.yaml"
  log "applying manifests/base as rendered (+ tests/node/local-images): $(grep -c '^kind:' "$out/rendered.yaml") objects"
  kc apply --server-side -f "$out/rendered.yaml" >/dev/null
  # The serving certificate, as manifests/README.md tells a plain install.
  local certs="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/nmo-certs"
  cargo build -q --locked -p nmo-certs
  "$certs" serving --ca-dir "$out/ca" --out "$out/cert" --layout plain \
    --dns nmo-webhook-service.nmo-system.svc,nmo-webhook-service.nmo-system.svc.cluster.local >/dev/null
  kc -n nmo-system create secret tls nmo-webhook-cert --cert "$out/cert/tls.crt" --key "$out/cert/tls.key" \
    --dry-run=client -o yaml | kc apply -f - >/dev/null
  local ca_bundle
  ca_bundle="$("$certs" ca-bundle --ca-dir "$out/ca")" && [ -n "$ca_bundle" ] || die "nmo-certs ca-bundle gave nothing"
  kc patch validatingwebhookconfiguration nmo-validating-webhook --type json -p \
    "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$ca_bundle\"}]" >/dev/null
  rollout
}

# install_cert_manager: manifests/overlays/cert-manager as rendered; the real
# cert-manager (make companions) issues the CA and the serving certificate,
# cainjector fills the caBundle, the kubelet projects the Secret.
install_cert_manager() {
  node_init_pid >/dev/null || die "the real node is not running: make real-node"
  pid_of cert-manager-controller >/dev/null && pid_of cert-manager-cainjector >/dev/null ||
    die "cert-manager is not running on the plane: make companions (or bash tests/companions/up.sh cert-manager)"
  clean_slate
  mkdir -p "$out"
  kc kustomize "$here/install/cert-manager" >"$out/rendered.yaml"
  log "applying manifests/overlays/cert-manager as rendered (+ tests/node/local-images): $(grep -c '^kind:' "$out/rendered.yaml") objects"
  kc apply --server-side -f "$out/rendered.yaml" >/dev/null
  local c
  for c in nmo-webhook-ca nmo-webhook-cert nmo-metrics-cert; do
    kc -n nmo-system wait --for=condition=Ready "certificate/$c" --timeout=120s >/dev/null ||
      die "cert-manager did not issue Certificate nmo-system/$c within 120 s: $(kc -n nmo-system describe certificate "$c" 2>&1 | tail -20)"
  done
  local deadline=$((SECONDS + 60))
  until [ -n "$(kc get validatingwebhookconfiguration nmo-validating-webhook -o jsonpath='{.webhooks[0].clientConfig.caBundle}')" ]; do
    [ "$SECONDS" -lt "$deadline" ] || die "cainjector did not fill the caBundle of nmo-validating-webhook within 60 s"
    sleep 0.5
  done
  log "issued: nmo-webhook-ca, nmo-webhook-cert, nmo-metrics-cert; caBundle injected"
  rollout
}

rollout() {
  local d
  for d in nmo-webhook nmo-controller; do
    log "waiting for deployment/$d to roll out (its pods Ready through their probes)"
    if ! kc -n nmo-system rollout status "deployment/$d" --timeout="${ROLLOUT_TIMEOUT}s" >&2; then
      kc -n nmo-system get pods -o wide >&2 || true
      kc -n nmo-system describe pods >&2 || true
      die "deployment/$d did not roll out within ${ROLLOUT_TIMEOUT} s (pods and their events above; kubelet log: $LOGS/kubelet.log)"
    fi
  done
  kc -n nmo-system get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,READY:.status.containerStatuses[0].ready,RESTARTS:.status.containerStatuses[0].restartCount,IP:.status.podIP'
}

case "${1:-}" in
  base) install_base ;;
  cert-manager) install_cert_manager ;;
  --uninstall) uninstall ;;
  *) die "usage: tests/node/install.sh base | cert-manager | --uninstall" ;;
esac
