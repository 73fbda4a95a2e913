//! Fleet gates (issue 31): whether a NodeMaintenance that the slots would
//! admit may start now, or waits, and why. One pure decision,
//! [`may_start`], shared by the controller (the `Queued` condition, the
//! event, the metric) and the webhook (its warnings).
//!
//! # What the caller gathers ([`GateInputs`])
//! - The NodeMaintenances as [`Entry`]s (as for the slots), with this
//!   process's own admissions counted: call through
//!   [`Admissions::decide_gated`](crate::rules::slots::Admissions::decide_gated)
//!   so a gate and the admission record happen under one lock.
//! - Only when [`Gates::needs_nodes`]: every Node as a [`FleetNode`]
//!   ([`FleetNode::of`] with [`Gates::zone_label`]): name, zone label
//!   value, Ready, cordoned (`spec.unschedulable`). The node count for
//!   `--max-unavailable=P%` is the number of views.
//! - Only when [`Gates::needs_alerts`]: the firing alerts, or why they could
//!   not be read ([`AlertsSeen`]; `shared::serve::alert_source` reads
//!   them from Prometheus or Alertmanager). Fetch with a short timeout, and
//!   cache the answer for a few seconds across reconciles; a failure blocks.
//! - The time, `now`.
//!
//! Requeue a waiting maintenance: at the next window's start for
//! `OutsideWindow` (the message has it; [`next_window_start`] gives it as a
//! time), at once when a NodeMaintenance leaves or a counted node changes
//! (Ready, cordon, zone, arrival, departure) for the budgets and the pause,
//! with a look every 2 s as a backstop, and every fetch interval for
//! `AlertsFiring`.
//!
//! # Order of the gates
//! Pause after a failure, firing alerts, the window, max-unavailable, the
//! zone budget, then the pause between nodes (`--settle-after`: it matters
//! only once the budgets would let the maintenance start); the first that
//! blocks names the wait. The three global
//! gates come first: they hold every maintenance alike, and the first two
//! ask a human to look at something broken. The budgets come last, as they
//! depend on the queue. A maintenance that started (Running, Succeeded)
//! passes every gate: it runs to its end.
//!
//! # Creation order
//! A global gate holds all alike. For the budgets the queue (as the slots
//! see it: not started, not failed, not being deleted, first per node, in
//! creation order) is walked up to `me`: each earlier one that passes both
//! budgets counts as started; one that waits for max-unavailable makes
//! every later one wait for it too; one that waits for its zone makes later
//! ones of the same zone wait too. A later maintenance may pass an earlier
//! one only when that one waits for another gate (its zone, say).

mod alerts;
mod budgets;
mod settle;

pub use alerts::{Alert, AlertFilter, AlertGate, AlertsSeen};
pub use budgets::MaxUnavailable;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use crate::rules::slots::Entry;
use crate::rules::window::{self, Window};

/// The zone label when `--zone-label` is not given.
pub const DEFAULT_ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The parsed gate flags. [`Gates::default`] gates nothing (today's
/// behaviour).
#[derive(Debug, Clone)]
pub struct Gates {
    /// `--max-unavailable`; `None`: no limit.
    pub max_unavailable: Option<MaxUnavailable>,
    /// `--max-concurrent-per-zone`; 0: no limit (as
    /// `--max-concurrent-maintenances`).
    pub max_per_zone: usize,
    /// `--zone-label`.
    pub zone_label: String,
    /// `--maintenance-window`, repeatable; empty: any time.
    pub windows: Vec<Window>,
    /// `--pause-after-failure`.
    pub pause_after_failure: bool,
    /// `--block-on-alerts-url` with `--block-on-alerts-filter`.
    pub alerts: Option<AlertGate>,
    /// `--fleet-node-selector`: the labels (all of them) a node must carry
    /// to count for the budgets; empty: every node.
    pub node_selector: BTreeMap<String, String>,
    /// `--settle-after`: a maintenance starts only this long after the node
    /// before it (in its zone, with `--max-concurrent-per-zone`) was given
    /// back, and once that node is Ready. `None`: no pause.
    pub settle_after: Option<std::time::Duration>,
}

impl Default for Gates {
    fn default() -> Self {
        Gates {
            max_unavailable: None,
            max_per_zone: 0,
            zone_label: DEFAULT_ZONE_LABEL.to_string(),
            windows: Vec::new(),
            pause_after_failure: false,
            alerts: None,
            node_selector: BTreeMap::new(),
            settle_after: None,
        }
    }
}

impl Gates {
    /// Whether [`GateInputs::nodes`] must be gathered.
    pub fn needs_nodes(&self) -> bool {
        self.max_unavailable.is_some() || self.max_per_zone > 0 || self.settle_after.is_some()
    }

    /// Whether a node with `labels` counts for the budgets
    /// (`--fleet-node-selector`).
    pub fn counts_node(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        crate::rules::nodes::labels_match(&self.node_selector, labels)
    }

    /// Whether any gate is set (none: every maintenance the slots admit starts).
    pub fn any(&self) -> bool {
        self.needs_nodes()
            || self.needs_alerts()
            || !self.windows.is_empty()
            || self.pause_after_failure
    }

    /// Whether [`GateInputs::alerts`] must be gathered.
    pub fn needs_alerts(&self) -> bool {
        self.alerts.is_some()
    }
}

/// What the gates need to know about one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetNode {
    pub name: String,
    /// The zone label's value; nodes without it form one zone.
    pub zone: Option<String>,
    /// Condition Ready is True (False, Unknown or missing: not ready).
    pub ready: bool,
    /// `spec.unschedulable`, by anyone.
    pub cordoned: bool,
    /// What our `MaintenanceInProgress` node condition says (the settle gate).
    pub maintained: Maintained,
}

/// A node's maintenance as its `MaintenanceInProgress` condition (ours:
/// reason `NodeMaintenance...`) tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Maintained {
    /// No condition of ours.
    #[default]
    No,
    /// A maintenance has the node.
    InProgress,
    /// Given back at this time.
    EndedAt(Timestamp),
}

impl Maintained {
    /// From the condition's status, reason and lastTransitionTime.
    pub fn of(status: &str, reason: Option<&str>, since: Option<Timestamp>) -> Maintained {
        use crate::api::consts::{NODE_CONDITION_REASON_ENDED, NODE_CONDITION_REASON_PREFIX};
        match (status, reason, since) {
            (_, Some(r), _) if !r.starts_with(NODE_CONDITION_REASON_PREFIX) => Maintained::No,
            ("True", Some(_), _) => Maintained::InProgress,
            ("False", Some(r), Some(at)) if r == NODE_CONDITION_REASON_ENDED => {
                Maintained::EndedAt(at)
            }
            _ => Maintained::No,
        }
    }
}

impl FleetNode {
    /// A Node as a view.
    pub fn of(node: &Node, zone_label: &str) -> FleetNode {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable);
        let maintained = (node.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == crate::api::consts::NODE_CONDITION_MAINTENANCE_IN_PROGRESS)
            })
            .map_or(Maintained::No, |c| {
                let since = c.last_transition_time.as_ref().map(|t| t.0);
                Maintained::of(&c.status, c.reason.as_deref(), since)
            });
        FleetNode {
            maintained,
            ..FleetNode::from_parts(&node.metadata, ready, unschedulable, zone_label)
        }
    }

    /// A view from a node's metadata, Ready, `spec.unschedulable` and the
    /// zone label's name (the watch's lean node converts itself with it:
    /// `shared::kube::partial::NodeView::gate_view`).
    pub fn from_parts(
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        ready: bool,
        unschedulable: Option<bool>,
        zone_label: &str,
    ) -> FleetNode {
        FleetNode {
            name: meta.name.clone().unwrap_or_default(),
            zone: meta
                .labels
                .as_ref()
                .and_then(|l| l.get(zone_label).cloned()),
            ready,
            cordoned: unschedulable.unwrap_or(false),
            maintained: Maintained::No,
        }
    }
}

/// What the controller observed for one decision.
#[derive(Debug, Clone, Copy)]
pub struct GateInputs<'a> {
    /// Every Node (empty unless [`Gates::needs_nodes`]).
    pub nodes: &'a [FleetNode],
    /// Whether `nodes` is the whole fleet (the node watch listed it once):
    /// until then the budgets hold every start (they would count a partial
    /// fleet).
    pub nodes_listed: bool,
    pub now: Timestamp,
    pub alerts: &'a AlertsSeen,
}

/// Why a maintenance waits: one per gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GateReason {
    OutsideWindow,
    ZoneBudget,
    MaxUnavailable,
    PausedAfterFailure,
    AlertsFiring,
    Settling,
}

impl GateReason {
    /// Every reason, for metrics set up before the first wait.
    pub const ALL: [GateReason; 6] = [
        GateReason::PausedAfterFailure,
        GateReason::AlertsFiring,
        GateReason::OutsideWindow,
        GateReason::MaxUnavailable,
        GateReason::ZoneBudget,
        GateReason::Settling,
    ];

    /// The `Queued` condition's reason (and the event's).
    pub fn as_str(self) -> &'static str {
        match self {
            GateReason::OutsideWindow => "OutsideWindow",
            GateReason::ZoneBudget => "ZoneBudget",
            GateReason::MaxUnavailable => "MaxUnavailable",
            GateReason::PausedAfterFailure => "PausedAfterFailure",
            GateReason::AlertsFiring => "AlertsFiring",
            GateReason::Settling => "Settling",
        }
    }

    /// The value of a metric's `reason` label (Prometheus style).
    pub fn metric_label(self) -> &'static str {
        match self {
            GateReason::OutsideWindow => "outside_window",
            GateReason::ZoneBudget => "zone_budget",
            GateReason::MaxUnavailable => "max_unavailable",
            GateReason::PausedAfterFailure => "paused_after_failure",
            GateReason::AlertsFiring => "alerts_firing",
            GateReason::Settling => "settling",
        }
    }
}

impl std::fmt::Display for GateReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateDecision {
    /// Every gate lets it start (or it started already).
    Start,
    /// Phase Pending, condition `Queued` with `reason`; `message` names
    /// what blocks and the flag behind it.
    Wait { reason: GateReason, message: String },
}

impl GateDecision {
    fn wait(reason: GateReason, message: String) -> Option<GateDecision> {
        Some(GateDecision::Wait { reason, message })
    }
}

/// May `me` start now? `all` holds every NodeMaintenance (`me` among them
/// or not). Gates in the order the module doc gives.
pub fn may_start(me: &Entry, all: &[Entry], observed: &GateInputs, gates: &Gates) -> GateDecision {
    if me.started() {
        return GateDecision::Start;
    }
    paused(me, all, gates)
        .or_else(|| alerts::check(observed.alerts, gates.alerts.as_ref()))
        .or_else(|| outside_window(observed.now, &gates.windows))
        .or_else(|| unlisted(observed, gates))
        .or_else(|| budgets::check(me, all, observed, gates))
        .or_else(|| settle::check(me, all, observed, gates))
        .unwrap_or(GateDecision::Start)
}

/// `--pause-after-failure`: a Failed NodeMaintenance holds every start
/// until it is gone (its deletion finished).
fn paused(me: &Entry, all: &[Entry], gates: &Gates) -> Option<GateDecision> {
    if !gates.pause_after_failure {
        return None;
    }
    let mut failed: Vec<&Entry> = all
        .iter()
        .filter(|e| e.failed() && e.name != me.name)
        .collect();
    failed.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    let names: Vec<String> = failed
        .iter()
        .map(|e| format!("{} (node {})", e.name, e.node))
        .collect();
    if names.is_empty() {
        return None;
    }
    GateDecision::wait(
        GateReason::PausedAfterFailure,
        format!(
            "waits: NodeMaintenance {} failed; no maintenance starts until it is deleted \
             (--pause-after-failure)",
            names.join(", ")
        ),
    )
}

/// The budgets need the whole fleet: until the nodes are listed, a wait
/// named after the budget that needs them (max-unavailable first, the
/// order of the gates).
fn unlisted(observed: &GateInputs, gates: &Gates) -> Option<GateDecision> {
    if observed.nodes_listed || !gates.needs_nodes() {
        return None;
    }
    let (reason, flag) = match (gates.max_unavailable, gates.max_per_zone) {
        (Some(_), _) => (GateReason::MaxUnavailable, "--max-unavailable"),
        (None, 1..) => (GateReason::ZoneBudget, "--max-concurrent-per-zone"),
        (None, 0) => (GateReason::Settling, "--settle-after"),
    };
    GateDecision::wait(
        reason,
        format!(
            "waits for the node list: {flag} counts the nodes, and this controller has not \
             listed them yet (it started or reconnected just now); if this lasts, check that \
             it may list and watch nodes (its ClusterRole) and its log for the nodes watch"
        ),
    )
}

/// `--maintenance-window`: outside every window, wait for the next.
fn outside_window(now: Timestamp, windows: &[Window]) -> Option<GateDecision> {
    if windows.is_empty() || windows.iter().any(|w| w.contains(now)) {
        return None;
    }
    let message = match window::next_opening(windows, now) {
        Some((at, w)) => format!(
            "waits for the maintenance window: next window starts {} (--maintenance-window {:?})",
            w.local_time(at),
            w.spec()
        ),
        None => "waits for the maintenance window: no window opens again \
                 (--maintenance-window)"
            .to_string(),
    };
    GateDecision::wait(GateReason::OutsideWindow, message)
}

/// How long an answer about the alerts (and, for the webhook's warnings,
/// the node list) is used before it is read again, in both services; also
/// how often a maintenance held by firing alerts looks again.
pub const ANSWER_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// The longest a maintenance outside every window sleeps before it looks
/// again (the clock or the flags may have changed meanwhile).
pub const WINDOW_RECHECK_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// When a maintenance held for `reason` looks again: just after the next
/// window opens (at most [`WINDOW_RECHECK_MAX`] away), after
/// [`ANSWER_FRESH_FOR`] for the alerts, and after `backstop` (the slot
/// wait's look) for the budgets and the pause, which a departure or a
/// counted node's change also wakes at once.
pub fn look_again_after(
    gates: &Gates,
    reason: GateReason,
    now: Timestamp,
    backstop: std::time::Duration,
) -> std::time::Duration {
    use std::time::Duration;
    match reason {
        GateReason::OutsideWindow => next_window_start(gates, now)
            .and_then(|at| Duration::try_from(at.duration_since(now)).ok())
            .map_or(WINDOW_RECHECK_MAX, |d| {
                (d + Duration::from_millis(100)).min(WINDOW_RECHECK_MAX)
            }),
        GateReason::AlertsFiring => ANSWER_FRESH_FOR,
        _ => backstop,
    }
}

/// When the next window opens, for requeueing an `OutsideWindow` wait;
/// `None` when no window is set (or one is open now).
pub fn next_window_start(gates: &Gates, now: Timestamp) -> Option<Timestamp> {
    if gates.windows.iter().any(|w| w.contains(now)) {
        return None;
    }
    window::next_opening(&gates.windows, now).map(|(at, _)| at)
}

#[cfg(test)]
mod tests;
