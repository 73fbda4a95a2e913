#!/usr/bin/env bash
# promtool (built from Prometheus' Go module, cached: tests/companions/build.sh)
# on the alert rules as users install them: manifests/monitoring rendered,
# the PrometheusRule's groups written as a Prometheus rule file
# (tests/tools/src/bin/prometheus-config.rs), then
#   promtool check rules   (syntax, PromQL, templates)
#   promtool test rules    (tests/monitoring/alerts.test.yaml: each alert
#                           firing and silent, with the manifest's for:)
# Needs the local plane's kubectl (kustomize): make cluster-up.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kubectl="${KUBECTL:-$root/.cluster/bin/kubectl}"
[ -x "$kubectl" ] || { echo "rules-test: $kubectl not found; run make cluster-up first (or set KUBECTL)" >&2; exit 1; }
promtool="$(bash "$root/tests/companions/build.sh" prometheus | sed -n 's/^PROMTOOL_BIN=//p')"
[ -x "$promtool" ] || { echo "rules-test: promtool was not built" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$kubectl" kustomize "$root/manifests/monitoring" >"$work/monitoring.yaml"
"$kubectl" kustomize "$root/manifests/base" >"$work/base.yaml"
cargo build -q -p nmo-tools --bin prometheus-config
"${CARGO_TARGET_DIR:-$root/target}/debug/prometheus-config" --monitoring "$work/monitoring.yaml" \
  --services "$work/base.yaml" --out "$work" --targets "$work/targets" \
  --file "/var/run/secrets/kubernetes.io/serviceaccount/token=/dev/null" >/dev/null
cp "$root/tests/monitoring/alerts.test.yaml" "$work/"
"$promtool" check rules "$work/rules.yaml"
# Every alert of the rule file has a case where it fires (exp_alerts lists
# it) and one where it stays silent (exp_alerts: []).
cases="$(awk '/alertname:/ { a = $2 } /exp_alerts: *\[\]/ { print a, "silent"; a = "" }
  /exp_alerts: *$/ { print a, "firing"; a = "" }' "$work/alerts.test.yaml")"
missing=""
for a in $(sed -n 's/^ *- alert: *//p' "$work/rules.yaml"); do
  for want in firing silent; do
    grep -qx "$a $want" <<<"$cases" || missing+=" $a ($want)"
  done
done
[ -z "$missing" ] || { echo "rules-test: no promtool case for:$missing (tests/monitoring/alerts.test.yaml)" >&2; exit 1; }
echo "rules-test: every alert has a firing and a silent case ($(wc -l <<<"$cases") cases)"
(cd "$work" && "$promtool" test rules alerts.test.yaml)
