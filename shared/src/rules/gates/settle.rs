//! `--settle-after`: a pause between one node given back and the next one
//! taken, so the cluster settles (pods rescheduled, caches warm) before the
//! next disruption.
//!
//! "The node before" a maintenance is the node given back last among the
//! nodes the budgets count (`--fleet-node-selector`), in the maintenance's
//! zone when `--max-concurrent-per-zone` is set: the one whose
//! `MaintenanceInProgress` condition (ours) turned False with reason
//! `NodeMaintenanceEnded` last, at its lastTransitionTime. A node whose
//! condition still says in progress while no started maintenance holds it
//! is being given back right now: it counts as given back now. A
//! maintenance starts once `--settle-after` has passed since then and that
//! node is Ready.

use std::collections::HashSet;
use std::time::Duration;

use jiff::Timestamp;

use super::{FleetNode, GateDecision, GateInputs, GateReason, Gates, Maintained};
use crate::rules::duration;
use crate::rules::slots::Entry;

/// The settle gate's verdict on `me`: `None` lets it start.
pub(super) fn check(
    me: &Entry,
    all: &[Entry],
    observed: &GateInputs,
    gates: &Gates,
) -> Option<GateDecision> {
    let settle = gates.settle_after?;
    let zone_of = |name: &str| {
        (observed.nodes.iter())
            .find(|n| n.name == name)
            .and_then(|n| n.zone.as_deref())
    };
    let scope = (gates.max_per_zone > 0).then(|| zone_of(&me.node));
    let held: HashSet<&str> = (all.iter())
        .filter(|e| e.started())
        .map(|e| e.node.as_str())
        .collect();
    let (node, at) = last_given_back(observed.nodes, &me.node, scope, &held, observed.now)?;
    let flag = format!("--settle-after={}", duration::format(settle));
    let settled = at.saturating_add(settle).unwrap_or(Timestamp::MAX);
    let ago = duration::format(since(at, observed.now));
    if observed.now < settled {
        let left = since(observed.now, settled);
        return GateDecision::wait(
            GateReason::Settling,
            format!(
                "waits for node {} to settle: given back {ago} ago, {} left before the next node{} \
                 is taken ({flag})",
                node.name,
                duration::format(left),
                scope_text(scope, &gates.zone_label),
            ),
        );
    }
    if !node.ready {
        return GateDecision::wait(
            GateReason::Settling,
            format!(
                "waits for node {}, given back {ago} ago, to be Ready before the next node{} is \
                 taken ({flag})",
                node.name,
                scope_text(scope, &gates.zone_label),
            ),
        );
    }
    None
}

/// The node given back last in `scope` (a zone, or every counted node),
/// other than `me`'s, with when.
fn last_given_back<'a>(
    nodes: &'a [FleetNode],
    me: &str,
    scope: Option<Option<&str>>,
    held: &HashSet<&str>,
    now: Timestamp,
) -> Option<(&'a FleetNode, Timestamp)> {
    nodes
        .iter()
        .filter(|n| n.name != me && scope.is_none_or(|z| n.zone.as_deref() == z))
        .filter_map(|n| match n.maintained {
            Maintained::EndedAt(at) => Some((n, at.min(now))),
            Maintained::InProgress if !held.contains(n.name.as_str()) => Some((n, now)),
            _ => None,
        })
        .max_by(|(a, at), (b, bt)| at.cmp(bt).then_with(|| b.name.cmp(&a.name)))
}

/// `to - from` as a whole-second duration (zero when negative).
fn since(from: Timestamp, to: Timestamp) -> Duration {
    let secs = to.duration_since(from).as_secs().max(0);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

fn scope_text(scope: Option<Option<&str>>, label: &str) -> String {
    match scope {
        None => String::new(),
        Some(Some(z)) => format!(" of zone {z:?}"),
        Some(None) => format!(" of the nodes without label {label}"),
    }
}
