//! The fleet gates' part of the admission warnings (issue 31): whether an
//! allowed create will be held by a gate, decided by the controller's own
//! rule (`shared::rules::gates::may_start`) over what the webhook can see
//! within `--warnings-timeout`.
//!
//! The gates read more than the admission decision does, so that part is
//! looked up here, for the warnings only, and only when a flag needs it:
//! - the nodes (Ready, cordoned, zone) when `--max-unavailable` or
//!   `--max-concurrent-per-zone` is set: a paged LIST decoded lean
//!   (`shared::kube::partial::NodeView`). The admission path's node
//!   cache stays metadata-only: watching whole nodes would cost every
//!   replica memory and every node status update a decode, for a warning.
//! - the firing alerts when `--block-on-alerts-url` is set
//!   (`shared::serve::alert_source`); a failed read is `AlertsSeen::Failed`,
//!   which the gate (and so the controller) treats as blocking.
//!
//! Each answer is kept for [`FRESH_FOR`] and fetched by one task at a time,
//! bounded by [`FETCH_BOUND`], not by one create's budget: a storm of creates
//! asks once, and an answer slower than `--warnings-timeout` still serves
//! the creates after it. What did not answer in time drops its gates from
//! the decision and is named as not checked.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};
use shared::kube::partial::NodeView as WatchedNode;
use shared::rules::gates::{
    self, AlertsSeen, FleetNode, GateDecision, GateInputs, GateReason, Gates,
};
use shared::rules::slots::{self, Entry, SlotDecision};
use shared::serve::alert_source::AlertSource;
use shared::serve::gate_flags::GateFlags;
use shared::serve::recent::RecentAnswer;
use tokio::time::Instant as Deadline;

/// How long a fetched answer (the nodes, the alerts) is used: the
/// controller's, so both decide on answers of the same age.
pub const FRESH_FOR: Duration = gates::ANSWER_FRESH_FOR;
/// Bound of one fetch (the alert source bounds its query by the same).
pub const FETCH_BOUND: Duration = shared::serve::alert_source::QUERY_TIMEOUT;
/// Nodes per LIST page: memory stays bounded whatever the cluster's size.
const NODE_PAGE: u32 = 100;
/// The gates that need the nodes, as the "not checked" line names them.
const NODE_GATES: &str = "--max-unavailable and --max-concurrent-per-zone";

/// What the gate warnings need from the flags.
#[derive(Clone, Default)]
pub struct GateSettings {
    gates: Gates,
    /// Set exactly when `gates.alerts` is.
    alerts: Option<AlertSource>,
}

impl GateSettings {
    /// The gates of `flags`; an unusable `--block-on-alerts-url` is an error
    /// naming it (the webhook does not start, as the controller would not).
    pub fn of(flags: &GateFlags) -> Result<GateSettings, String> {
        let gates = flags.gates();
        let alerts = gates
            .alerts
            .as_ref()
            .map(|a| AlertSource::new(&a.url))
            .transpose()?;
        Ok(GateSettings { gates, alerts })
    }

    /// Whether any gate is set (none: nothing to look up or say).
    pub fn any(&self) -> bool {
        self.gates.any()
    }
}

impl fmt::Debug for GateSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateSettings")
            .field("gates", &self.gates)
            .field("alerts", &self.alerts.as_ref().map(AlertSource::url))
            .finish()
    }
}

/// The queue's verdict for one create: the controller's own decision
/// (`shared::rules::slots::turn`) over what the webhook sees.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueFacts {
    /// When it will wait for a slot: the NodeMaintenances ahead of it.
    pub slot_ahead: Option<Vec<String>>,
    /// The gate it will wait for, with the gate's message.
    pub wait: Option<(GateReason, String)>,
    /// What could not be checked, one line each.
    pub unchecked: Vec<String>,
}

/// What was observed for the gates: `None` where no gate needs it; `Err`
/// holds the "not checked" line of a lookup that did not answer.
#[derive(Debug, Default)]
pub struct Seen {
    pub nodes: Option<Result<Arc<Vec<FleetNode>>, String>>,
    pub alerts: Option<Result<Arc<AlertsSeen>, String>>,
}

/// What `me` will wait for, by the controller's decision
/// ([`slots::turn`] with [`gates::may_start`] as the gate) over `all` and
/// `max` (--max-concurrent-maintenances). A lookup that did not answer
/// leaves its gates out of the decision and is named in `unchecked`: a
/// warning says what it knows, and never guesses a wait.
pub fn decide(
    me: &Entry,
    all: &[Entry],
    max: usize,
    gates: &Gates,
    seen: Seen,
    now: Timestamp,
) -> QueueFacts {
    let mut gates = gates.clone();
    let mut unchecked = Vec::new();
    let nodes = match seen.nodes {
        Some(Ok(nodes)) => nodes,
        Some(Err(line)) => {
            unchecked.push(line);
            gates.max_unavailable = None;
            gates.max_per_zone = 0;
            Arc::default()
        }
        None => Arc::default(),
    };
    let alerts = match seen.alerts {
        Some(Ok(alerts)) => alerts,
        Some(Err(line)) => {
            unchecked.push(line);
            gates.alerts = None;
            Arc::new(AlertsSeen::NotRead)
        }
        None => Arc::new(AlertsSeen::NotRead),
    };
    let observed = GateInputs {
        nodes: nodes.as_slice(),
        // A lookup that answered is a whole list (paged to its end).
        nodes_listed: true,
        now,
        alerts: &alerts,
    };
    let gate = |e: &Entry, all: &[Entry]| match gates::may_start(e, all, &observed, &gates) {
        GateDecision::Start => None,
        GateDecision::Wait { reason, message } => Some((reason, message)),
    };
    let turn = slots::turn(me, all, max, gate);
    let (slot_ahead, wait) = match turn.decision {
        Ok(SlotDecision::Wait { .. }) => (Some(turn.ahead), None),
        Ok(_) => (None, None),
        Err(wait) => (None, Some(wait)),
    };
    QueueFacts {
        slot_ahead,
        wait,
        unchecked,
    }
}

/// The gates' lookups, each answer kept for [`FRESH_FOR`].
pub(crate) struct GateLookups {
    client: Client,
    settings: GateSettings,
    /// --warnings-timeout, for the "not checked" lines.
    budget: Duration,
    nodes: Arc<RecentAnswer<Result<Arc<Vec<FleetNode>>, String>>>,
    alerts: Arc<RecentAnswer<Arc<AlertsSeen>>>,
}

impl GateLookups {
    pub fn new(client: Client, settings: GateSettings, budget: Duration) -> Self {
        GateLookups {
            client,
            settings,
            budget,
            nodes: Arc::new(RecentAnswer::new(FRESH_FOR)),
            alerts: Arc::new(RecentAnswer::new(FRESH_FOR)),
        }
    }

    pub fn any(&self) -> bool {
        self.settings.any()
    }

    /// What a create of `me` will wait for at `now` (`max`: its slots),
    /// the gates' inputs looked up by `deadline` (only those a gate needs).
    pub async fn decide_queue(
        &self,
        me: &Entry,
        all: &[Entry],
        max: usize,
        deadline: Deadline,
        now: Timestamp,
    ) -> QueueFacts {
        let (nodes, alerts) = tokio::join!(self.nodes(deadline), self.alerts(deadline));
        let seen = Seen { nodes, alerts };
        decide(me, all, max, &self.settings.gates, seen, now)
    }

    /// Every node as the gates see it, when a node budget is set.
    async fn nodes(&self, deadline: Deadline) -> Option<Result<Arc<Vec<FleetNode>>, String>> {
        if !self.settings.gates.needs_nodes() {
            return None;
        }
        let list = list_node_views(self.client.clone(), &self.settings.gates);
        let fetch = async move {
            tokio::time::timeout(FETCH_BOUND, list)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {FETCH_BOUND:?}")))
        };
        Some(match self.nodes.get(deadline, fetch).await {
            Some(Ok(views)) => Ok(views),
            Some(Err(e)) => Err(format!("{NODE_GATES} not checked: listing the nodes: {e}")),
            None => Err(format!(
                "{NODE_GATES} not checked: the nodes were not listed within --warnings-timeout {:?}",
                self.budget
            )),
        })
    }

    /// The alerts as last read, when the alert gate is set.
    async fn alerts(&self, deadline: Deadline) -> Option<Result<Arc<AlertsSeen>, String>> {
        let source = self.settings.alerts.clone()?;
        let url = source.url().to_string();
        let fetch = async move {
            Arc::new(match source.alerts().await {
                Ok(alerts) => AlertsSeen::Read(alerts),
                Err(e) => AlertsSeen::Failed(e),
            })
        };
        Some(self.alerts.get(deadline, fetch).await.ok_or_else(|| {
            format!(
                "--block-on-alerts-url not checked: {url} did not answer within \
                 --warnings-timeout {:?}",
                self.budget
            )
        }))
    }
}

/// Every node the budgets count (`--fleet-node-selector`), [`NODE_PAGE`] at
/// a time, each page decoded lean and turned into the gates' views before
/// the next is read.
fn list_node_views(
    client: Client,
    gates: &Gates,
) -> impl Future<Output = Result<Arc<Vec<FleetNode>>, String>> + use<> {
    let zone_label = gates.zone_label.clone();
    let selector: Vec<String> = gates
        .node_selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    list_selected(client, zone_label, selector.join(","))
}

async fn list_selected(
    client: Client,
    zone_label: String,
    selector: String,
) -> Result<Arc<Vec<FleetNode>>, String> {
    let api = Api::<WatchedNode>::all(client);
    let mut params = ListParams::default().limit(NODE_PAGE).labels(&selector);
    let mut views = Vec::new();
    loop {
        let page = api.list(&params).await.map_err(|e| e.to_string())?;
        views.extend(page.items.into_iter().map(|n| n.gate_view(&zone_label)));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(Arc::new(views)),
        }
    }
}

#[cfg(test)]
mod tests;
