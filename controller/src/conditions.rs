//! `status.conditions` (beyond upstream, additions only): standard
//! `metav1.Condition`s saying where a maintenance stands and why, for
//! `kubectl get nm` (the State column), `kubectl wait --for=condition=Drained`
//! and dashboards. Pure: from the status about to be written, why it was
//! written and whether the node is in maintenance.
//!
//! - `Queued`: waiting for a maintenance slot (`--max-concurrent-maintenances`,
//!   reason WaitingForSlot) or held by a fleet gate (reason OutsideWindow,
//!   ZoneBudget, MaxUnavailable, PausedAfterFailure, AlertsFiring or
//!   Settling).
//! - `Cordoned`: the node is cordoned, tainted and excluded from remediation
//!   (False with reason ChangedByHand once a person changed that after the
//!   drain finished: the maintenance leaves the node as they left it).
//! - `Drained`: every pod that had to leave has left.
//! - `Blocked`: the drain cannot go on now; the message names every pod in
//!   the way and why (PDB, eviction webhook denial, a drain rule waiting for
//!   the pod to complete: reason WaitingForCompletion), the lease holder, or
//!   the admission policy or webhook refusing the controller's node patch.
//! - `Failed`: the maintenance failed for good (node missing, lease lost,
//!   another maintenance owns the node).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use shared::rules::gates::GateReason;
use shared::{MaintenancePhase, NodeMaintenanceStatus as Status};

pub const QUEUED: &str = "Queued";
pub const CORDONED: &str = "Cordoned";
pub const DRAINED: &str = "Drained";
pub const BLOCKED: &str = "Blocked";
pub const FAILED: &str = "Failed";

/// Why a status is written: the cause behind its conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Progress as usual (nothing in the way).
    Progress,
    /// Waiting for a slot.
    WaitingForSlot,
    /// Held by a fleet gate (`shared::rules::gates`); `lastError` says why.
    Gate(GateReason),
    /// Evictions refused (PDB, eviction webhook); `lastError` says which.
    EvictionBlocked,
    /// Pods a drain rule waits for until they complete (`WaitCompleted`),
    /// and nothing else in the way; `lastError` names them.
    WaitingForCompletion,
    /// Another operator holds the node's lease.
    LeaseHeldByOther,
    /// Taking or renewing the lease failed; retried.
    LeaseError,
    /// A request failed; retried.
    ReconcileError,
    /// The API server refused the controller's node patch (an admission
    /// policy or webhook, or the node's validation); retried. `lastError`
    /// carries the API server's words.
    NodeUpdateRefused,
    /// Failed for good: the node does not exist.
    NodeNotFound,
    /// Failed for good: the lease could not be kept.
    LeaseLost,
    /// Failed for good: another NodeMaintenance owns the node.
    DuplicateMaintenance,
    /// Failed for good: spec.drainTimeout passed (drainTimeoutAction Fail).
    DrainTimeout,
    /// Failed for good: the controller panicked on this maintenance (a bug).
    InternalError,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Progress => "Progress",
            Cause::WaitingForSlot => "WaitingForSlot",
            Cause::Gate(reason) => reason.as_str(),
            Cause::EvictionBlocked => "EvictionBlocked",
            Cause::WaitingForCompletion => "WaitingForCompletion",
            Cause::LeaseHeldByOther => "LeaseHeldByOther",
            Cause::LeaseError => "LeaseError",
            Cause::ReconcileError => "ReconcileError",
            Cause::NodeUpdateRefused => "NodeUpdateRefused",
            Cause::NodeNotFound => "NodeNotFound",
            Cause::LeaseLost => "LeaseLost",
            Cause::DuplicateMaintenance => "DuplicateMaintenance",
            Cause::DrainTimeout => "DrainTimeout",
            Cause::InternalError => "InternalError",
        }
    }

    fn blocks(self) -> bool {
        matches!(
            self,
            Cause::EvictionBlocked
                | Cause::WaitingForCompletion
                | Cause::LeaseHeldByOther
                | Cause::LeaseError
                | Cause::ReconcileError
                | Cause::NodeUpdateRefused
        )
    }
}

/// The conditions for `status`, written because of `cause`, with the node
/// in maintenance or not and `migrating` of its pods VMs live-migrating
/// away. A condition keeps its lastTransitionTime while its status stays
/// (taken from `old`); `now` stamps the ones that change.
/// Ordered so the most telling comes first (`kubectl get` shows True reasons
/// in this order).
pub fn conditions(
    old: &[Condition],
    status: &Status,
    cause: Cause,
    cordoned: bool,
    migrating: usize,
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let phase = status.phase.as_ref();
    let failed = phase == Some(&MaintenancePhase::Failed);
    let queued = phase == Some(&MaintenancePhase::Pending);
    let blocked = !failed && !queued && cause.blocks();
    let queued_reason = match cause {
        Cause::Gate(reason) => reason.as_str(),
        _ => "WaitingForSlot",
    };
    let mut out = Vec::with_capacity(5);
    let mut push = |type_: &str, on: bool, reason: &str, message: String| {
        out.push(condition(old, type_, on, reason, message, generation, now));
    };
    // True with lastError as the message, or False with their "Not" reason.
    for (type_, on, reason, off_reason) in [
        (FAILED, failed, cause.as_str(), "NotFailed"),
        (BLOCKED, blocked, cause.as_str(), "NotBlocked"),
        (QUEUED, queued, queued_reason, "NotQueued"),
    ] {
        if on {
            push(type_, true, reason, status.last_error.clone());
        } else {
            push(type_, false, off_reason, String::new());
        }
    }
    let (on, reason, message) = drained(status, cordoned, migrating);
    push(DRAINED, on, reason, message);
    if cordoned {
        push(
            CORDONED,
            true,
            "NodeCordoned",
            "cordoned, tainted and excluded from remediation".into(),
        );
    } else {
        push(CORDONED, false, "NodeSchedulable", String::new());
    }
    out
}

/// The Cordoned condition's reason for a node changed by hand after its
/// drain finished (the maintenance leaves it so).
pub const CHANGED_BY_HAND: &str = "ChangedByHand";

/// A node changed by hand after its drain finished: Cordoned turns False
/// with reason [`CHANGED_BY_HAND`] and `message` (see [`conditions`] for
/// `old`, `generation` and `now`).
pub fn changed_by_hand(
    conditions: &mut [Condition],
    old: &[Condition],
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    let by_hand = condition(
        old,
        CORDONED,
        false,
        CHANGED_BY_HAND,
        message.to_string(),
        generation,
        now,
    );
    for c in conditions.iter_mut().filter(|c| c.type_ == CORDONED) {
        *c = by_hand.clone();
    }
}

/// The message of a Cordoned condition that just became ChangedByHand, or
/// changed its words (the person changed something else): the Warning
/// event's; none otherwise.
pub fn by_hand_news<'a>(old: &[Condition], new: &'a [Condition]) -> Option<&'a str> {
    let by_hand = |c: &Condition| c.type_ == CORDONED && c.reason == CHANGED_BY_HAND;
    let now = new.iter().find(|c| by_hand(c))?;
    let before = old.iter().find(|c| by_hand(c)).map(|c| c.message.as_str());
    (before != Some(now.message.as_str())).then_some(now.message.as_str())
}

/// The Drained condition's status (True once the phase is Succeeded),
/// reason and message.
fn drained(status: &Status, cordoned: bool, migrating: usize) -> (bool, &'static str, String) {
    if status.phase == Some(MaintenancePhase::Succeeded) {
        let message = format!(
            "all {} pods that had to leave have left",
            status.eviction_pods
        );
        (true, "DrainComplete", message)
    } else if cordoned {
        let left = status.pending_pods.len();
        let message = draining_message(left, status.eviction_pods, migrating);
        (false, "Draining", message)
    } else {
        (false, "NotStarted", String::new())
    }
}

fn draining_message(left: usize, of: i64, migrating: usize) -> String {
    let mut message = format!("{left} of {of} pods still to leave");
    if migrating > 0 {
        message.push_str(&format!(
            ", {migrating} of them KubeVirt VMs live-migrating away"
        ));
    }
    message
}

fn condition(
    old: &[Condition],
    type_: &str,
    on: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if on { "True" } else { "False" };
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since,
        observed_generation: generation,
    }
}

/// Add what made the maintenance fail to a True `Failed` condition's
/// message: `status.lastError` keeps upstream's text ("lease could not be
/// extended after N attempts"), the condition names the cause as well.
pub fn add_failure_cause(conditions: &mut [Condition], cause: &str) {
    if cause.is_empty() {
        return;
    }
    if let Some(c) = conditions
        .iter_mut()
        .find(|c| c.type_ == FAILED && c.status == "True")
    {
        c.message = format!("{}; last lease error: {cause}", c.message);
    }
}

/// Since when condition `type_` holds (its lastTransitionTime while True).
pub fn true_since(conditions: &[Condition], type_: &str) -> Option<Time> {
    conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| c.last_transition_time.clone())
}

/// The message of a True `Blocked` condition, if any.
pub fn blocked_message(conditions: &[Condition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| c.type_ == BLOCKED && c.status == "True")
        .map(|c| c.message.as_str())
}

/// Whether a `DrainBlocked` warning is due: the drain is blocked now and the
/// blockers differ from the last write's (not on every retry).
pub fn drain_blocked_news<'a>(old: &[Condition], new: &'a [Condition]) -> Option<&'a str> {
    blocked_news(old, new, Cause::EvictionBlocked)
}

/// Whether a `DrainWaitingForCompletion` event is due: pods are waited for
/// now and the set named differs from the last write's.
pub fn waiting_news<'a>(old: &[Condition], new: &'a [Condition]) -> Option<&'a str> {
    blocked_news(old, new, Cause::WaitingForCompletion)
}

/// Whether a warning about `cause` is due: the maintenance is blocked by it
/// now and the Blocked message differs from the last write's (one event
/// when what blocks changes, not on every retry).
pub fn blocked_news<'a>(old: &[Condition], new: &'a [Condition], cause: Cause) -> Option<&'a str> {
    let now = new
        .iter()
        .find(|c| c.type_ == BLOCKED && c.status == "True" && c.reason == cause.as_str())?;
    (blocked_message(old) != Some(now.message.as_str())).then_some(now.message.as_str())
}

/// The `reason` label of `nmo_nodemaintenance_waiting` for each way to
/// wait, in the order they are exposed.
pub const WAITING_LABELS: [&str; 7] = [
    "waiting_for_slot",
    "paused_after_failure",
    "alerts_firing",
    "outside_window",
    "max_unavailable",
    "zone_budget",
    "settling",
];

/// The `nmo_nodemaintenance_waiting` label of a maintenance whose `Queued`
/// condition holds (None: not waiting).
pub fn waiting_label(conditions: &[Condition]) -> Option<&'static str> {
    let queued = conditions
        .iter()
        .find(|c| c.type_ == QUEUED && c.status == "True")?;
    Some(
        GateReason::ALL
            .into_iter()
            .find(|r| r.as_str() == queued.reason)
            .map_or(WAITING_LABELS[0], GateReason::metric_label),
    )
}

/// After a write from `old` to `new` conditions: the gate now holding the
/// maintenance and its message, when `Queued` turned True with a gate's
/// reason or moved to another gate (one event per new wait, none per
/// re-check).
pub fn gate_news<'a>(old: &[Condition], new: &'a [Condition]) -> Option<(GateReason, &'a str)> {
    let queued = |c: &[Condition]| {
        c.iter()
            .find(|c| c.type_ == QUEUED && c.status == "True")
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let now = new
        .iter()
        .find(|c| c.type_ == QUEUED && c.status == "True")?;
    let reason = GateReason::ALL
        .into_iter()
        .find(|r| r.as_str() == now.reason)?;
    let before = queued(old).map(|(reason, _)| reason);
    (before.as_deref() != Some(reason.as_str())).then_some((reason, now.message.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(1_700_000_000 + secs).expect("time"))
    }

    fn status(phase: MaintenancePhase, pending: usize, err: &str) -> Status {
        Status {
            phase: Some(phase),
            eviction_pods: 4,
            pending_pods: (0..pending).map(|i| format!("p{i}")).collect(),
            last_error: err.into(),
            ..Default::default()
        }
    }

    /// (type, status, reason) of each condition, in order.
    fn summary(c: &[Condition]) -> Vec<(String, String, String)> {
        c.iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn true_reasons(c: &[Condition]) -> Vec<&str> {
        c.iter()
            .filter(|c| c.status == "True")
            .map(|c| c.reason.as_str())
            .collect()
    }

    #[test]
    fn lifecycle_table() {
        use MaintenancePhase::*;
        let cases: Vec<(&str, Status, Cause, bool, Vec<&str>)> = vec![
            (
                "waiting for a slot: Queued",
                status(Pending, 0, "waiting for a maintenance slot"),
                Cause::WaitingForSlot,
                false,
                vec!["WaitingForSlot"],
            ),
            (
                "held by a gate: Queued names the gate",
                status(Pending, 0, "waits for the maintenance window"),
                Cause::Gate(GateReason::OutsideWindow),
                false,
                vec!["OutsideWindow"],
            ),
            (
                "held by the zone budget",
                status(Pending, 0, "waits: zone a"),
                Cause::Gate(GateReason::ZoneBudget),
                false,
                vec!["ZoneBudget"],
            ),
            (
                "first sight, before the node is touched",
                status(Running, 4, ""),
                Cause::Progress,
                false,
                vec![],
            ),
            (
                "foreign lease before the node is touched: Blocked",
                status(Running, 4, "held by different owner: snr"),
                Cause::LeaseHeldByOther,
                false,
                vec!["LeaseHeldByOther"],
            ),
            (
                "draining, pods leaving",
                status(Running, 2, ""),
                Cause::Progress,
                true,
                vec!["NodeCordoned"],
            ),
            (
                "a PDB blocks: Blocked names it",
                status(Running, 1, "pod shop/a: eviction blocked"),
                Cause::EvictionBlocked,
                true,
                vec!["EvictionBlocked", "NodeCordoned"],
            ),
            (
                "drained",
                status(Succeeded, 0, ""),
                Cause::Progress,
                true,
                vec!["DrainComplete", "NodeCordoned"],
            ),
            (
                "lease lost for good: Failed, node given back",
                status(
                    Failed,
                    1,
                    "maintenance failed: lease could not be extended after 4 attempts",
                ),
                Cause::LeaseLost,
                false,
                vec!["LeaseLost"],
            ),
            (
                "missing node: Failed",
                status(Failed, 0, "nodes \"n1\" not found"),
                Cause::NodeNotFound,
                false,
                vec!["NodeNotFound"],
            ),
        ];
        for (name, st, cause, cordoned, want) in cases {
            let c = conditions(&[], &st, cause, cordoned, 0, Some(1), &at(0));
            assert_eq!(true_reasons(&c), want, "{name}: {:?}", summary(&c));
            assert_eq!(c.len(), 5, "{name}: every type present");
        }
    }

    #[test]
    fn blocked_message_is_last_error_and_drained_counts_pods() {
        let st = status(
            MaintenancePhase::Running,
            1,
            "pod shop/a: blocked by PDB guard",
        );
        let c = conditions(&[], &st, Cause::EvictionBlocked, true, 0, None, &at(0));
        assert_eq!(
            blocked_message(&c),
            Some("pod shop/a: blocked by PDB guard")
        );
        let drained = c.iter().find(|c| c.type_ == DRAINED).expect("Drained");
        assert_eq!(drained.message, "1 of 4 pods still to leave");
    }

    #[test]
    fn migrating_vms_are_named_as_draining_not_blocked() {
        let st = status(MaintenancePhase::Running, 2, "");
        let c = conditions(&[], &st, Cause::Progress, true, 1, None, &at(0));
        let drained = c.iter().find(|c| c.type_ == DRAINED).expect("Drained");
        assert_eq!(
            drained.message,
            "2 of 4 pods still to leave, 1 of them KubeVirt VMs live-migrating away"
        );
        assert_eq!(blocked_message(&c), None);
    }

    #[test]
    fn transition_time_moves_only_when_the_status_does() {
        let running = status(MaintenancePhase::Running, 2, "");
        let first = conditions(&[], &running, Cause::Progress, true, 0, None, &at(0));
        let again = conditions(&first, &running, Cause::Progress, true, 0, None, &at(10));
        assert_eq!(first, again, "same state, same conditions");
        let blocked = status(MaintenancePhase::Running, 1, "pod shop/a: blocked");
        let later = conditions(
            &again,
            &blocked,
            Cause::EvictionBlocked,
            true,
            0,
            None,
            &at(20),
        );
        let t = |c: &[Condition], ty: &str| {
            c.iter()
                .find(|c| c.type_ == ty)
                .map(|c| c.last_transition_time.clone())
                .expect("present")
        };
        assert_eq!(t(&later, BLOCKED), at(20), "Blocked turned True");
        assert_eq!(t(&later, CORDONED), at(0), "Cordoned unchanged");
    }

    #[test]
    fn drain_blocked_is_news_only_when_the_blockers_change() {
        let st = |e: &str| status(MaintenancePhase::Running, 1, e);
        let c1 = conditions(
            &[],
            &st("pod shop/a: PDB guard"),
            Cause::EvictionBlocked,
            true,
            0,
            None,
            &at(0),
        );
        assert_eq!(drain_blocked_news(&[], &c1), Some("pod shop/a: PDB guard"));
        let c2 = conditions(
            &c1,
            &st("pod shop/a: PDB guard"),
            Cause::EvictionBlocked,
            true,
            0,
            None,
            &at(5),
        );
        assert_eq!(
            drain_blocked_news(&c1, &c2),
            None,
            "a retry with the same blockers"
        );
        let c3 = conditions(
            &c2,
            &st("pod shop/b: webhook says no"),
            Cause::EvictionBlocked,
            true,
            0,
            None,
            &at(10),
        );
        assert_eq!(
            drain_blocked_news(&c2, &c3),
            Some("pod shop/b: webhook says no")
        );
        let c4 = conditions(&c3, &st(""), Cause::Progress, true, 0, None, &at(15));
        assert_eq!(drain_blocked_news(&c3, &c4), None, "no longer blocked");
        let lease = conditions(
            &[],
            &st("held by snr"),
            Cause::LeaseHeldByOther,
            false,
            0,
            None,
            &at(0),
        );
        assert_eq!(
            drain_blocked_news(&[], &lease),
            None,
            "a lease wait is no drain blocker"
        );
    }

    #[test]
    fn a_refused_node_update_blocks_and_is_news_once_per_refusal() {
        let st = |e: &str| status(MaintenancePhase::Running, 2, e);
        let refused = "policy says no";
        let c1 = conditions(
            &[],
            &st(refused),
            Cause::NodeUpdateRefused,
            false,
            0,
            None,
            &at(0),
        );
        assert_eq!(true_reasons(&c1), vec!["NodeUpdateRefused"]);
        assert_eq!(blocked_message(&c1), Some(refused));
        assert_eq!(
            blocked_news(&[], &c1, Cause::NodeUpdateRefused),
            Some(refused)
        );
        assert_eq!(drain_blocked_news(&[], &c1), None, "no drain blocker");
        let c2 = conditions(
            &c1,
            &st(refused),
            Cause::NodeUpdateRefused,
            false,
            0,
            None,
            &at(5),
        );
        assert_eq!(
            blocked_news(&c1, &c2, Cause::NodeUpdateRefused),
            None,
            "a retry"
        );
        let c3 = conditions(
            &c2,
            &st("another policy says no"),
            Cause::NodeUpdateRefused,
            false,
            0,
            None,
            &at(9),
        );
        assert_eq!(
            blocked_news(&c2, &c3, Cause::NodeUpdateRefused),
            Some("another policy says no")
        );
    }

    #[test]
    fn a_lost_lease_names_its_cause_in_the_failed_condition() {
        let lost = status(
            MaintenancePhase::Failed,
            1,
            "maintenance failed: lease could not be extended after 4 attempts",
        );
        let mut c = conditions(&[], &lost, Cause::LeaseLost, false, 0, None, &at(0));
        add_failure_cause(
            &mut c,
            "can't update or invalidate the lease because it is held by different owner: snr",
        );
        let failed = c.iter().find(|c| c.type_ == FAILED).expect("Failed");
        assert_eq!(failed.reason, "LeaseLost");
        assert_eq!(
            failed.message,
            "maintenance failed: lease could not be extended after 4 attempts; last lease error: \
             can't update or invalidate the lease because it is held by different owner: snr"
        );
        // Nothing else carries it; an empty cause adds nothing.
        assert!(
            c.iter()
                .filter(|c| c.type_ != FAILED)
                .all(|c| !c.message.contains("last lease error"))
        );
        let mut again = c.clone();
        add_failure_cause(&mut again, "");
        assert_eq!(again, c);
    }

    #[test]
    fn a_gate_wait_is_news_when_it_starts_or_moves_to_another_gate() {
        let pending = |cause: Cause| {
            conditions(
                &[],
                &status(MaintenancePhase::Pending, 0, "why"),
                cause,
                false,
                0,
                None,
                &at(0),
            )
        };
        let running = conditions(
            &[],
            &status(MaintenancePhase::Running, 1, ""),
            Cause::Progress,
            true,
            0,
            None,
            &at(0),
        );
        let window = pending(Cause::Gate(GateReason::OutsideWindow));
        let zone = pending(Cause::Gate(GateReason::ZoneBudget));
        let slot = pending(Cause::WaitingForSlot);
        type Case<'a> = (
            &'a str,
            &'a [Condition],
            &'a [Condition],
            Option<GateReason>,
        );
        let cases: Vec<Case> = vec![
            ("first wait", &[], &window, Some(GateReason::OutsideWindow)),
            (
                "from a slot wait",
                &slot,
                &window,
                Some(GateReason::OutsideWindow),
            ),
            ("the same gate again", &window, &window, None),
            ("another gate", &window, &zone, Some(GateReason::ZoneBudget)),
            ("a slot wait is not a gate", &[], &slot, None),
            ("started", &window, &running, None),
        ];
        for (case, old, new, want) in cases {
            let got = gate_news(old, new);
            assert_eq!(got.map(|(r, _)| r), want, "{case}");
            if let Some((_, message)) = got {
                assert_eq!(message, "why", "{case}");
            }
        }
        assert_eq!(waiting_label(&window), Some("outside_window"));
        assert_eq!(waiting_label(&zone), Some("zone_budget"));
        assert_eq!(waiting_label(&slot), Some("waiting_for_slot"));
        assert_eq!(waiting_label(&running), None);
        for r in GateReason::ALL {
            assert!(WAITING_LABELS.contains(&r.metric_label()), "{r}");
        }
    }
}
