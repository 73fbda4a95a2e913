//! The fleet gates' flags (issue 31), taken by both binaries: the
//! controller decides with them, the webhook warns with them, so both
//! Deployments carry the same values (as for `--max-concurrent-maintenances`).
//! Every flag also comes from the environment. Defaults gate nothing.

use std::collections::BTreeMap;

use clap::Args;

use crate::rules::gates::{AlertFilter, AlertGate, DEFAULT_ZONE_LABEL, Gates, MaxUnavailable};
use crate::rules::window::Window;
use crate::serve::goflags::GoBoolFlag as _;

#[derive(Args, Debug, Clone)]
pub struct GateFlags {
    /// A maintenance starts only if the nodes unavailable after it (in
    /// maintenance, NotReady, or cordoned by anyone) stay within N, or P% of
    /// the nodes (rounded down, at least 1). Unset: no limit.
    #[arg(long, env = "MAX_UNAVAILABLE", value_name = "N|P%")]
    pub max_unavailable: Option<MaxUnavailable>,

    /// At most N maintenances running per zone (the value of --zone-label;
    /// nodes without it form one zone). 0: no limit.
    #[arg(long, env = "MAX_CONCURRENT_PER_ZONE", default_value_t = 0)]
    pub max_concurrent_per_zone: usize,

    /// The node label whose value is a node's zone.
    #[arg(long, env = "ZONE_LABEL", default_value = DEFAULT_ZONE_LABEL)]
    pub zone_label: String,

    /// A maintenance starts only inside a window: "<cron, 5 fields>
    /// <duration> [<IANA time zone>]", e.g. "0 2 * * 6 4h Europe/Berlin".
    /// Repeatable; in the environment, windows are separated by ';'. One
    /// that started runs to its end.
    #[arg(
        long,
        env = "MAINTENANCE_WINDOW",
        value_delimiter = ';',
        value_name = "WINDOW"
    )]
    pub maintenance_window: Vec<Window>,

    /// While a NodeMaintenance is Failed, no other starts, until it is deleted.
    #[arg(long, env = "PAUSE_AFTER_FAILURE", go_bool_default = false)]
    pub pause_after_failure: bool,

    /// A Prometheus (or Alertmanager) base URL, http://: while an alert
    /// matching --block-on-alerts-filter fires, no maintenance starts. Not
    /// reachable: none starts either (fail closed).
    #[arg(long, env = "BLOCK_ON_ALERTS_URL", value_name = "URL")]
    pub block_on_alerts_url: Option<String>,

    /// Prometheus label matchers an alert must match to block, e.g.
    /// severity="critical",alertname!="Watchdog". Empty: every firing alert.
    #[arg(
        long,
        env = "BLOCK_ON_ALERTS_FILTER",
        default_value = "",
        value_name = "MATCHERS",
        requires = "block_on_alerts_url"
    )]
    pub block_on_alerts_filter: AlertFilter,

    /// The nodes the budgets count (--max-unavailable's total and
    /// unavailable ones, the zones): those carrying every label of
    /// "key=value[,key=value]". Empty: every node. For one node pool, or
    /// to leave out nodes another team runs.
    #[arg(long, env = "FLEET_NODE_SELECTOR", default_value = "", value_name = "LABELS", value_parser = equality_selector)]
    pub fleet_node_selector: Selector,

    /// A pause between nodes: a maintenance starts only this long (a Go
    /// duration: 10m, 1h30m) after the node before it (in its zone, with
    /// --max-concurrent-per-zone) was given back, and once that node is
    /// Ready; it waits meanwhile with reason Settling. Read from the nodes'
    /// MaintenanceInProgress condition: needs --node-lifecycle-conditions
    /// on the controller. Unset: no pause.
    #[arg(long, env = "SETTLE_AFTER", value_name = "DURATION", value_parser = settle_duration)]
    pub settle_after: Option<std::time::Duration>,
}

/// `--settle-after`: a Go duration above zero.
fn settle_duration(text: &str) -> Result<std::time::Duration, String> {
    match crate::rules::duration::parse(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("0 pauses nothing: leave --settle-after unset instead".into()),
        Err(e) => Err(format!("invalid --settle-after {text:?}: {e}")),
    }
}

/// A parsed `--fleet-node-selector`.
#[derive(Debug, Clone, Default)]
pub struct Selector(pub BTreeMap<String, String>);

impl Selector {
    /// Whether `labels` carry every key=value of the selector.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        crate::rules::nodes::labels_match(&self.0, labels)
    }
}

/// "key=value[,key=value]" (equality only); empty selects everything.
pub fn equality_selector(text: &str) -> Result<Selector, String> {
    let mut labels = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .filter(|(k, v)| !k.trim().is_empty() && !v.contains(['=', '!']) && !k.contains('!'))
            .ok_or_else(|| {
                format!("invalid label selector {text:?}: {part:?} is not key=value (e.g. node-role.kubernetes.io/worker=,pool=blue)")
            })?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(Selector(labels))
}

impl GateFlags {
    /// The gates these flags set.
    pub fn gates(&self) -> Gates {
        Gates {
            max_unavailable: self.max_unavailable,
            max_per_zone: self.max_concurrent_per_zone,
            zone_label: self.zone_label.clone(),
            windows: self.maintenance_window.clone(),
            pause_after_failure: self.pause_after_failure,
            alerts: self
                .block_on_alerts_url
                .as_ref()
                .filter(|u| !u.is_empty())
                .map(|url| AlertGate {
                    url: url.clone(),
                    filter: self.block_on_alerts_filter.clone(),
                }),
            node_selector: self.fleet_node_selector.0.clone(),
            settle_after: self.settle_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::goflags::normalize;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        gates: GateFlags,
    }

    fn parse(args: &[&str]) -> Result<Gates, String> {
        let mut full = vec!["bin"];
        full.extend_from_slice(args);
        Cli::try_parse_from(normalize(full))
            .map(|c| c.gates.gates())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_gate_nothing() {
        let g = parse(&[]).expect("defaults");
        assert!(!g.needs_nodes() && !g.needs_alerts());
        assert!(g.windows.is_empty() && !g.pause_after_failure);
        assert_eq!(g.zone_label, DEFAULT_ZONE_LABEL);
    }

    #[test]
    fn every_flag_parses() {
        let g = parse(&[
            "--max-unavailable=10%",
            "--max-concurrent-per-zone=1",
            "--zone-label=example.com/rack",
            "--maintenance-window=0 2 * * 6 4h Europe/Berlin",
            "--maintenance-window",
            "30 22 * * 1-5 1h30m",
            "--pause-after-failure",
            "--block-on-alerts-url=http://prometheus:9090",
            "--block-on-alerts-filter=severity=\"critical\"",
            "--fleet-node-selector=pool=blue, node-role.kubernetes.io/worker=",
        ])
        .expect("all gates");
        assert_eq!(
            g.node_selector,
            BTreeMap::from([
                ("pool".to_string(), "blue".to_string()),
                ("node-role.kubernetes.io/worker".to_string(), String::new())
            ])
        );
        assert_eq!(g.max_unavailable, Some("10%".parse().expect("10%")));
        assert_eq!(g.max_per_zone, 1);
        assert_eq!(g.zone_label, "example.com/rack");
        assert_eq!(g.windows.len(), 2);
        assert!(g.pause_after_failure);
        let alerts = g.alerts.expect("alert gate");
        assert_eq!(alerts.url, "http://prometheus:9090");
        assert!(g.max_unavailable.is_some());
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (args, flag) in [
            (&["--max-unavailable=ten"][..], "--max-unavailable"),
            (
                &["--max-concurrent-per-zone=-1"][..],
                "--max-concurrent-per-zone",
            ),
            (
                &["--maintenance-window=0 2 * * 6"][..],
                "--maintenance-window",
            ),
            (
                &["--maintenance-window=0 2 * * 6 4h Mars/Olympus"][..],
                "--maintenance-window",
            ),
            (&["--pause-after-failure=yes"][..], "--pause-after-failure"),
            (
                &[
                    "--block-on-alerts-url=http://p:9090",
                    "--block-on-alerts-filter=severity",
                ][..],
                "--block-on-alerts-filter",
            ),
            (
                &["--block-on-alerts-filter=severity=\"critical\""][..],
                "--block-on-alerts-url",
            ),
            (
                &["--fleet-node-selector=pool!=blue"][..],
                "--fleet-node-selector",
            ),
            (&["--fleet-node-selector=pool"][..], "--fleet-node-selector"),
        ] {
            let err = parse(args).expect_err(&format!("{args:?}"));
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }
}
