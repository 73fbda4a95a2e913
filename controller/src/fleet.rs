//! What the fleet gates read beyond the NodeMaintenances
//! (`shared::rules::gates`): every node as a small view, kept from the node
//! watch only when a node gate is set (`--max-unavailable`,
//! `--max-concurrent-per-zone`), and the firing alerts, read at most every
//! [`ALERTS_TTL`] and only when `--block-on-alerts-url` is set. The decision
//! itself stays pure; this only gathers its inputs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use shared::kube::partial;
use shared::rules::gates::{self, AlertsSeen, FleetNode, GateDecision, Gates};
use shared::rules::slots::Entry;
use shared::rules::sync::LockExt;
use shared::serve::alert_source::{AlertSource, QUERY_TIMEOUT};
use shared::serve::recent::RecentAnswer;

/// How long an answer about the alerts is used (the rules' one age for
/// both services; also how often a maintenance held by them looks again).
pub const ALERTS_TTL: Duration = gates::ANSWER_FRESH_FOR;

pub struct Fleet {
    pub gates: Gates,
    nodes: Mutex<Nodes>,
    /// True once the node watch listed every node (its first InitDone):
    /// until then the budgets would count an empty or partial fleet.
    listed: tokio::sync::watch::Sender<bool>,
    alerts: Option<Alerts>,
}

/// How long a decision waits for the first node list before it reports the
/// wait (and looks again after [`crate::plan::REQUEUE_PENDING`]).
const NODES_LISTED_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Nodes {
    live: BTreeMap<String, FleetNode>,
    /// A re-list in progress: replaces `live` once complete.
    relist: Option<BTreeMap<String, FleetNode>>,
    /// `live` as the decisions read it, built once per change of a view (a
    /// kubelet heartbeat changes none): the decisions of a waiting queue
    /// share it instead of copying every node each.
    snapshot: Option<Arc<Vec<FleetNode>>>,
}

struct Alerts {
    source: AlertSource,
    /// The last answer, read by one task at a time (as the webhook's).
    last: Arc<RecentAnswer<AlertsSeen>>,
}

impl Fleet {
    /// The gates and what they need. An unusable `--block-on-alerts-url`
    /// is an error naming the flag.
    pub fn new(gates: Gates) -> Result<Fleet, String> {
        let alerts = match &gates.alerts {
            Some(gate) => Some(Alerts {
                source: AlertSource::new(&gate.url)?,
                last: Arc::new(RecentAnswer::new(ALERTS_TTL)),
            }),
            None => None,
        };
        Ok(Fleet {
            gates,
            nodes: Mutex::default(),
            listed: tokio::sync::watch::Sender::new(false),
            alerts,
        })
    }

    /// A node watch event (every node), kept only when a node gate is set.
    /// True when the budgets' view of the fleet changed (a counted node
    /// appeared, left, or changed Ready, cordon or zone; a re-list
    /// completed): the maintenances waiting on a budget should look again.
    pub fn observe(&self, event: &watcher::Event<partial::NodeView>) -> bool {
        if !self.gates.needs_nodes() {
            return false;
        }
        let view = |n: &partial::NodeView| n.gate_view(&self.gates.zone_label);
        let counts = |n: &partial::NodeView| self.gates.counts_node(n.metadata.labels.as_ref());
        let mut nodes = self.nodes.locked();
        let changed = match event {
            watcher::Event::Init => {
                nodes.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(n) if counts(n) => {
                let v = view(n);
                if let Some(relist) = nodes.relist.as_mut() {
                    relist.insert(v.name.clone(), v);
                }
                false
            }
            watcher::Event::InitApply(_) => false,
            watcher::Event::InitDone => nodes.relist.take().is_some_and(|relist| {
                nodes.live = relist;
                self.listed.send_replace(true);
                true
            }),
            watcher::Event::Apply(n) if counts(n) => {
                let v = view(n);
                nodes.live.get(&v.name) != Some(&v) && {
                    nodes.live.insert(v.name.clone(), v);
                    true
                }
            }
            // A node that no longer carries the selector's labels leaves.
            watcher::Event::Apply(n) | watcher::Event::Delete(n) => n
                .metadata
                .name
                .as_deref()
                .is_some_and(|name| nodes.live.remove(name).is_some()),
        };
        if changed {
            nodes.snapshot = None;
        }
        changed
    }

    /// Nodes known (0 unless a node gate is set).
    pub fn nodes_len(&self) -> usize {
        self.nodes.locked().live.len()
    }

    /// Whether the budgets may decide: no node gate is set, or the node
    /// watch has listed every node. Waits up to [`NODES_LISTED_WAIT`] for
    /// that first list (a controller that just started, or restarted,
    /// decides nothing on a fleet it has not seen).
    pub async fn nodes_listed(&self) -> bool {
        if !self.gates.needs_nodes() {
            return true;
        }
        let mut listed = self.listed.subscribe();
        tokio::time::timeout(NODES_LISTED_WAIT, listed.wait_for(|l| *l))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The alerts for a decision: `NotRead` when the gate is off, else the
    /// last answer if younger than [`ALERTS_TTL`], else a fresh read.
    pub async fn alerts(&self) -> AlertsSeen {
        let Some(alerts) = &self.alerts else {
            return AlertsSeen::NotRead;
        };
        let source = alerts.source.clone();
        let fetch = async move {
            match source.alerts().await {
                Ok(list) => AlertsSeen::Read(list),
                Err(e) => {
                    tracing::warn!(url = %source.url(), error = %e, "could not read the alerts: no maintenance starts until they can be read (--block-on-alerts-url)");
                    AlertsSeen::Failed(e)
                }
            }
        };
        // The fetch is bounded by the source's own query timeout; this only
        // keeps a decision from waiting on a fetch that never ends.
        let deadline = tokio::time::Instant::now() + 2 * QUERY_TIMEOUT;
        alerts.last.get(deadline, fetch).await.unwrap_or_else(|| {
            AlertsSeen::Failed(format!(
                "{}: no answer within {:?}",
                alerts.source.url(),
                2 * QUERY_TIMEOUT
            ))
        })
    }

    /// A judge of one decision: the nodes as watched now (`listed`: the
    /// watch listed them once), `alerts` as read, the time `now`.
    pub fn judge<'a>(&'a self, alerts: &'a AlertsSeen, now: Timestamp, listed: bool) -> Judge<'a> {
        let nodes = if self.gates.needs_nodes() {
            let mut nodes = self.nodes.locked();
            let Nodes { live, snapshot, .. } = &mut *nodes;
            snapshot
                .get_or_insert_with(|| Arc::new(live.values().cloned().collect()))
                .clone()
        } else {
            Arc::default()
        };
        Judge {
            gates: &self.gates,
            nodes,
            listed,
            alerts,
            now,
        }
    }
}

/// What one decision judges by (see [`Fleet::judge`]).
pub struct Judge<'a> {
    gates: &'a Gates,
    nodes: Arc<Vec<FleetNode>>,
    listed: bool,
    alerts: &'a AlertsSeen,
    now: Timestamp,
}

impl Judge<'_> {
    /// The gates' answer for `me` among `all`: `None` may start, else why
    /// it waits and when to look again.
    pub fn hold(&self, me: &Entry, all: &[Entry]) -> Option<Held> {
        let observed = gates::GateInputs {
            nodes: &self.nodes,
            nodes_listed: self.listed,
            now: self.now,
            alerts: self.alerts,
        };
        match gates::may_start(me, all, &observed, self.gates) {
            GateDecision::Start => None,
            GateDecision::Wait { reason, message } => Some(Held {
                requeue: recheck_after(self.gates, reason, self.now),
                reason,
                message,
            }),
        }
    }
}

/// A maintenance a gate holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub reason: gates::GateReason,
    pub message: String,
    pub requeue: Duration,
}

/// When a maintenance held for `reason` looks again (the rule's
/// [`gates::look_again_after`], with a slot wait's look as the backstop).
pub fn recheck_after(gates: &Gates, reason: gates::GateReason, now: Timestamp) -> Duration {
    gates::look_again_after(gates, reason, now, crate::plan::REQUEUE_PENDING)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gates::GateReason::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    #[test]
    fn when_a_held_maintenance_looks_again() {
        let gates = Gates {
            windows: vec!["0 2 * * * 1h UTC".parse().expect("window")],
            ..Gates::default()
        };
        let cases = [
            (
                "window in 30 min",
                OutsideWindow,
                "2026-12-05T01:30:00Z",
                1_800_100,
            ),
            (
                "window in 23 h: an hour",
                OutsideWindow,
                "2026-12-05T03:00:00Z",
                3_600_000,
            ),
            ("alerts", AlertsFiring, "2026-12-05T03:00:00Z", 5000),
            ("zone", ZoneBudget, "2026-12-05T03:00:00Z", 2000),
            (
                "max unavailable",
                MaxUnavailable,
                "2026-12-05T03:00:00Z",
                2000,
            ),
            ("paused", PausedAfterFailure, "2026-12-05T03:00:00Z", 2000),
        ];
        for (case, reason, now, ms) in cases {
            assert_eq!(
                recheck_after(&gates, reason, at(now)),
                Duration::from_millis(ms),
                "{case}"
            );
        }
    }

    const ZONE: &str = "topology.kubernetes.io/zone";

    /// A fleet with a node gate (one per zone), so it keeps node views.
    fn zone_fleet() -> Fleet {
        Fleet::new(Gates {
            max_per_zone: 1,
            ..Gates::default()
        })
        .expect("fleet")
    }

    fn node(name: &str, ready: &str) -> partial::NodeView {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .expect("node")
    }

    #[test]
    fn node_views_follow_the_watch_and_a_relist_replaces_them() {
        let fleet = zone_fleet();
        fleet.observe(&watcher::Event::Apply(node("n1", "True")));
        fleet.observe(&watcher::Event::Apply(node("n2", "False")));
        assert_eq!(fleet.nodes_len(), 2);
        fleet.observe(&watcher::Event::Delete(node("n1", "True")));
        assert_eq!(fleet.nodes_len(), 1);
        let mut relabelled = node("n2", "False");
        relabelled.metadata.labels = None;
        let selective = Fleet::new(Gates {
            max_per_zone: 1,
            node_selector: [(ZONE.to_string(), "a".to_string())].into(),
            ..Gates::default()
        })
        .expect("fleet");
        selective.observe(&watcher::Event::Apply(node("n2", "False")));
        assert_eq!(selective.nodes_len(), 1, "selected");
        selective.observe(&watcher::Event::Apply(relabelled));
        assert_eq!(selective.nodes_len(), 0, "no longer selected: left");
        fleet.observe(&watcher::Event::Init);
        fleet.observe(&watcher::Event::InitApply(node("n3", "True")));
        assert_eq!(
            fleet.nodes_len(),
            1,
            "the old list stays until the new one is complete"
        );
        fleet.observe(&watcher::Event::InitDone);
        let live: Vec<(String, bool)> = fleet
            .nodes
            .locked()
            .live
            .values()
            .map(|v| (v.name.clone(), v.ready))
            .collect();
        assert_eq!(live, vec![("n3".to_string(), true)]);
    }

    /// Which node events wake the waiters: a change of what the budgets
    /// count, not a heartbeat, an uncounted node or a list in progress.
    #[test]
    fn a_counted_node_change_wakes_the_waiters() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let fleet = zone_fleet();
        let cordoned = {
            let mut n = node("n1", "True");
            n.spec = Some(
                serde_json::from_value(serde_json::json!({"unschedulable": true})).expect("spec"),
            );
            n
        };
        let mut rezoned = node("n1", "True");
        rezoned.metadata.labels = Some([(ZONE.to_string(), "b".to_string())].into());
        let cases = [
            ("a node appears", Apply(node("n1", "True")), true),
            (
                "a heartbeat (nothing counted changed)",
                Apply(node("n1", "True")),
                false,
            ),
            ("it becomes NotReady", Apply(node("n1", "False")), true),
            ("Ready again", Apply(node("n1", "True")), true),
            ("cordoned", Apply(cordoned), true),
            ("uncordoned", Apply(node("n1", "True")), true),
            ("another zone", Apply(rezoned), true),
            ("it leaves", Delete(node("n1", "True")), true),
            ("an unknown node leaves", Delete(node("n9", "True")), false),
            ("a re-list starts", Init, false),
            (
                "a node of the re-list",
                InitApply(node("n2", "True")),
                false,
            ),
            ("the re-list is complete", InitDone, true),
        ];
        for (case, event, wakes) in cases {
            assert_eq!(fleet.observe(&event), wakes, "{case}");
        }
        let unguarded = Fleet::new(Gates::default()).expect("fleet");
        assert!(
            !unguarded.observe(&Apply(node("n1", "False"))),
            "no node gate: nothing to wake"
        );
    }

    #[test]
    fn a_heartbeat_keeps_the_shared_snapshot() {
        let fleet = zone_fleet();
        let alerts = AlertsSeen::NotRead;
        fleet.observe(&watcher::Event::Apply(node("n1", "True")));
        let first = fleet.judge(&alerts, Timestamp::UNIX_EPOCH, true).nodes;
        fleet.observe(&watcher::Event::Apply(node("n1", "True")));
        assert!(Arc::ptr_eq(
            &first,
            &fleet.judge(&alerts, Timestamp::UNIX_EPOCH, true).nodes
        ));
        fleet.observe(&watcher::Event::Apply(node("n1", "False")));
        let after = fleet.judge(&alerts, Timestamp::UNIX_EPOCH, true).nodes;
        assert!(
            !Arc::ptr_eq(&first, &after) && !after[0].ready,
            "a change rebuilds it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_budgets_wait_for_the_first_node_list() {
        let fleet = zone_fleet();
        fleet.observe(&watcher::Event::Init);
        fleet.observe(&watcher::Event::InitApply(node("n1", "True")));
        assert!(
            !fleet.nodes_listed().await,
            "a partial list decides nothing"
        );
        fleet.observe(&watcher::Event::InitDone);
        assert!(fleet.nodes_listed().await);
        // A later re-list keeps the old list meanwhile: still listed.
        fleet.observe(&watcher::Event::Init);
        assert!(fleet.nodes_listed().await);
        let ungated = Fleet::new(Gates::default()).expect("fleet");
        assert!(
            ungated.nodes_listed().await,
            "no node gate: nothing to wait for"
        );
    }

    #[test]
    fn no_node_gate_keeps_no_nodes() {
        let fleet = Fleet::new(Gates::default()).expect("fleet");
        fleet.observe(&watcher::Event::Apply(node("n1", "True")));
        assert_eq!(fleet.nodes_len(), 0);
    }

    #[test]
    fn a_bad_alerts_url_names_the_flag() {
        let gates = Gates {
            alerts: Some(gates::AlertGate {
                url: "https://prometheus:9090".into(),
                filter: gates::AlertFilter::default(),
            }),
            ..Gates::default()
        };
        let err = Fleet::new(gates).err().unwrap_or_default();
        assert!(err.contains("--block-on-alerts-url"), "{err}");
    }
}
