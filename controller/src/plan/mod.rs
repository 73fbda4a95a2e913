//! What the reconciler does next, as pure functions of what it observed.
//!
//! The reconciler (controller/src/reconcile/) reads the NodeMaintenance,
//! its slot and gates, the node, the lease outcome and one drain round,
//! calls these with the time of its clock, and carries out the answer. Every
//! rule of the contract that decides something lives here, tested below as a
//! table of cases named after the contract.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use shared::api::consts::{
    DRAIN_REQUEUE_SECS, EVENT_FAILED_MAINTENANCE, EVENT_SUCCEED_MAINTENANCE, EventSpec,
    MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE, msg_lease_failed, msg_lease_held_by_other,
    msg_node_missing,
};
use shared::{DrainTimeoutAction, MaintenancePhase, NodeMaintenanceStatus as Status, PodReference};

use shared::rules::gates::GateReason;
use shared::rules::slots::{self, SlotDecision};

mod next;
pub mod node_conditions;
pub use next::{
    NodeSeen, Observed, Plan, REQUEUE_NOW, Record, Why, after_drain, after_lease_step,
    drain_deadline, drain_timeout, lease_cause, left_to_hand, left_to_hand_record, next,
    owner_refs,
};

/// How soon to come back while pods are leaving on their own.
pub const REQUEUE_TERMINATING: Duration = Duration::from_millis(500);
/// How soon to come back when something blocks (PDB, foreign lease): upstream's
/// 5 s, the default of --blocked-retry-interval.
pub const REQUEUE_BLOCKED: Duration = Duration::from_secs(DRAIN_REQUEUE_SECS);
/// How often a waiting NodeMaintenance (for a slot, a budget or the pause)
/// looks again on its own (reads the caches only); a departure or a counted
/// node's change wakes it at once.
pub const REQUEUE_PENDING: Duration = Duration::from_secs(2);
/// How often a finished maintenance renews its one-hour lease and re-checks the node.
pub const REQUEUE_HOLD: Duration = Duration::from_secs(30 * 60);

/// Where a NodeMaintenance is in its life, from its finalizer and deletion mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// New: add the finalizer (and say BeginMaintenance) before anything else.
    AddFinalizer,
    /// Carry the maintenance on.
    Apply,
    /// Deleted: give the node back, then remove the finalizer (RemovedMaintenance).
    Cleanup,
    /// Deleted and our finalizer already gone: nothing left to do.
    Done,
}

pub fn lifecycle(has_finalizer: bool, deleting: bool) -> Lifecycle {
    match (deleting, has_finalizer) {
        (false, false) => Lifecycle::AddFinalizer,
        (false, true) => Lifecycle::Apply,
        (true, true) => Lifecycle::Cleanup,
        (true, false) => Lifecycle::Done,
    }
}

/// Whether a maintenance in `phase` has touched its node (lease, label,
/// cordon, taints): only those are given back on deletion. Pending,
/// duplicate and failed ones (a lease failure restored the node already)
/// leave it alone.
pub fn touched_node(phase: Option<&MaintenancePhase>) -> bool {
    matches!(
        phase,
        Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
    )
}

/// The first decision of a reconcile: may this maintenance go on?
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Failed is final: the node was given back; delete and recreate to retry.
    Final,
    /// Write this status (phase Failed) and stop, never touching the node.
    Fail(Status),
    /// Write this status (phase Pending, why it waits) and check again soon.
    Wait(Status),
    /// A fleet gate holds it: write this status (phase Pending, the gate's
    /// message) with the gate's reason, and check again in `requeue`.
    Gated {
        status: Status,
        reason: GateReason,
        requeue: Duration,
    },
    /// Go on. `first_sight`: record the starting point (see [`begin`]) too.
    Proceed { first_sight: bool },
}

/// Decide from the status and the slot decision. An admitted maintenance
/// then needs its node: see [`node_missing`].
pub fn admit(status: &Status, slot: &SlotDecision, name: &str, node: &str) -> Admission {
    if status.phase == Some(MaintenancePhase::Failed) {
        return Admission::Final;
    }
    match slot {
        SlotDecision::Duplicate { owner } => {
            return Admission::Fail(failed(
                status,
                format!(
                    "NodeMaintenance {owner} already maintains node {node}; this one never touches \
                     the node: delete NodeMaintenance {name}"
                ),
            ));
        }
        SlotDecision::Wait {
            position,
            holders,
            max,
        } => {
            let mut st = status.clone();
            st.phase = Some(MaintenancePhase::Pending);
            st.last_error = slots::wait_message(*position, holders, *max);
            return Admission::Wait(st);
        }
        SlotDecision::Admitted => {}
    }
    Admission::Proceed {
        first_sight: !touched_node(status.phase.as_ref()),
    }
}

/// A maintenance the slots would admit but a fleet gate holds: phase
/// Pending with the gate's message (Failed stays final).
pub fn gated(status: &Status, reason: GateReason, message: String, requeue: Duration) -> Admission {
    if status.phase == Some(MaintenancePhase::Failed) {
        return Admission::Final;
    }
    let mut st = status.clone();
    st.phase = Some(MaintenancePhase::Pending);
    st.last_error = message;
    Admission::Gated {
        status: st,
        reason,
        requeue,
    }
}

/// An admitted maintenance whose node does not exist (never did, or was
/// deleted meanwhile): Failed with `nodes "<node>" not found`, no retry.
pub fn node_missing(status: &Status, node: &str) -> Status {
    failed(status, msg_node_missing(node))
}

/// lastError after a panic in the reconcile of `name` (a bug of ours).
/// `deleting`: the panic was in the cleanup of a deleted maintenance, which
/// is retried; otherwise the maintenance is stopped and its node given back.
pub fn msg_internal_error(name: &str, panic: &str, deleting: bool) -> String {
    let then = if deleting {
        "its cleanup is retried; if it keeps failing, give the node back by hand \
         (docs/troubleshooting.md, emergency cleanup)"
    } else {
        "the maintenance is stopped and its node given back; delete and recreate the \
         NodeMaintenance to try again"
    };
    format!(
        "internal error: the controller panicked reconciling NodeMaintenance {name} ({panic}); \
         {then}; please report this bug with the controller's log"
    )
}

/// `status` with phase Failed and `message` as lastError, the rest kept.
pub fn failed(status: &Status, message: String) -> Status {
    let mut st = status.clone();
    st.phase = Some(MaintenancePhase::Failed);
    st.last_error = message;
    st
}

/// Upstream's starting bookkeeping, before anything moves: phase Running,
/// `totalpods` = every pod on the node, `evictionPods` and the pending lists =
/// the pods that must leave, progress 0.
pub fn begin(status: &Status, total_pods: usize, must_leave: Vec<PodReference>) -> Status {
    let mut st = status.clone();
    st.phase = Some(MaintenancePhase::Running);
    st.total_pods = count(total_pods);
    st.eviction_pods = count(must_leave.len());
    st.pending_pods = must_leave.iter().map(|p| p.name.clone()).collect();
    st.pending_pods_refs = must_leave;
    st.drain_progress = 0;
    st.last_error.clear();
    st
}

/// What requesting the node's lease came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    Held,
    /// Another operator (NHC, SNR) holds a valid lease.
    HeldByOther(String),
    /// Any other failure, as text for lastError.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum LeaseStep {
    /// Ours: go on with this status (the error count reset).
    Proceed(Status),
    /// Not now: write this status and try again in [`REQUEUE_BLOCKED`].
    Retry(Status),
    /// Too many failures: give the node back, release the lease, write this
    /// status (phase Failed; lastError upstream's text) and stop. `cause`:
    /// the last lease error, for the Failed condition's message.
    GiveUp { status: Status, cause: String },
}

/// The lease rule of the contract: a foreign lease before draining started
/// is waited for without counting; a foreign lease later, or any other
/// error, counts; above [`MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE`] the
/// maintenance fails. Getting the lease resets the count.
pub fn after_lease(status: &Status, outcome: LeaseOutcome) -> LeaseStep {
    let mut st = status.clone();
    match outcome {
        LeaseOutcome::Held => {
            st.error_on_lease_count = 0;
            LeaseStep::Proceed(st)
        }
        LeaseOutcome::HeldByOther(holder) if st.drain_progress == 0 => {
            st.last_error = msg_lease_held_by_other(&holder);
            LeaseStep::Retry(st)
        }
        other => {
            st.error_on_lease_count = st.error_on_lease_count.saturating_add(1);
            let cause = match other {
                LeaseOutcome::HeldByOther(holder) => msg_lease_held_by_other(&holder),
                LeaseOutcome::Failed(e) => e,
                LeaseOutcome::Held => String::new(),
            };
            if st.error_on_lease_count > MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE {
                let msg = msg_lease_failed(st.error_on_lease_count);
                return LeaseStep::GiveUp {
                    status: failed(&st, msg),
                    cause,
                };
            }
            st.last_error = cause;
            LeaseStep::Retry(st)
        }
    }
}

/// What one drain round left on the node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Round {
    /// Pods that must leave and are still there.
    pub remaining: Vec<PodReference>,
    /// Why some of them are stuck (PDB, eviction webhook), if any is.
    pub blocker: Option<String>,
    /// The blocker names only pods a drain rule waits for until they
    /// complete (the Blocked reason is then WaitingForCompletion).
    pub waits_only: bool,
    /// Virt-launcher pods whose VM KubeVirt is live-migrating away: progress,
    /// not a blocker (until it runs too long: then `blocker` names it).
    pub migrating: Vec<PodReference>,
    /// Every remaining pod is on its way out (its eviction accepted, or
    /// already terminating) and the node's pod watch will wake the
    /// maintenance when the last of them has gone (`drain_wakes`): the poll
    /// is then only a backstop.
    pub departures_watched: bool,
    /// The pods were listed before this pass cordoned the node (the first
    /// round lists beside the lease request): such a list cannot say the
    /// node is empty, as a pod may have been scheduled in between.
    pub listed_before_cordon: bool,
}

/// The status to write after a round, and when to come back.
#[derive(Debug, Clone, PartialEq)]
pub struct Next {
    pub status: Status,
    pub requeue: Duration,
    /// Write even if nothing but lastUpdate changed: while a drain is
    /// blocked, runbooks watch lastUpdate to see the operator is still trying.
    pub refresh: bool,
}

/// `blocked_retry`: when to look again while something is in the way
/// (`--blocked-retry-interval`, upstream's 5 s by default; watches of PDBs
/// and pods usually wake the drain much sooner).
pub fn after_round(status: &Status, round: Round, blocked_retry: Duration) -> Next {
    let mut st = status.clone();
    if round.remaining.is_empty() {
        st.drain_progress = 100;
        st.pending_pods.clear();
        st.pending_pods_refs.clear();
        st.last_error.clear();
        // A list taken before the cordon says nothing of pods scheduled
        // since: listed again at once, after it.
        let requeue = if round.listed_before_cordon {
            REQUEUE_NOW
        } else {
            st.phase = Some(MaintenancePhase::Succeeded);
            REQUEUE_HOLD
        };
        return Next {
            status: st,
            requeue,
            refresh: false,
        };
    }
    if st.phase == Some(MaintenancePhase::Succeeded) {
        // A pod that arrived after the drain finished (a late scheduling, a
        // static pod replaced): it is evicted like the others, but the
        // finished drain is not rewound (phase, 100 %, empty pending lists
        // stay; SucceedMaintenance was said once). A blocker still shows in
        // lastError and the Blocked condition.
        st.drain_progress = 100;
        st.pending_pods.clear();
        st.pending_pods_refs.clear();
    } else {
        st.drain_progress =
            crate::classify::drain_progress(st.eviction_pods, count(round.remaining.len()));
        st.pending_pods = round.remaining.iter().map(|p| p.name.clone()).collect();
        st.pending_pods_refs = round.remaining;
    }
    let blocked = round.blocker.is_some();
    // A migration takes its time: asking KubeVirt twice a second changes
    // nothing, so come back as for a blocker (the pod's exit wakes us too).
    let waiting = blocked || !round.migrating.is_empty();
    st.last_error = round.blocker.unwrap_or_default();
    Next {
        status: st,
        requeue: if waiting || round.departures_watched {
            blocked_retry
        } else {
            REQUEUE_TERMINATING
        },
        refresh: waiting,
    }
}

/// Where a maintenance stands against its optional `spec.drainTimeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No deadline asked for, or the drain has not started (node not cordoned).
    Unbounded,
    /// Time left before it passes.
    Ahead(Duration),
    /// It passed: do what the object asks.
    Passed(DrainTimeoutAction),
}

/// The deadline counts from the node's cordon (`since`), so time spent
/// waiting for a slot or a foreign lease does not count.
pub fn deadline(
    timeout: Option<Duration>,
    action: DrainTimeoutAction,
    since: Option<Timestamp>,
    now: Timestamp,
) -> Deadline {
    let (Some(timeout), Some(since)) = (timeout, since) else {
        return Deadline::Unbounded;
    };
    let elapsed = now.duration_since(since);
    let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
    match timeout.checked_sub(elapsed) {
        Some(left) if !left.is_zero() => Deadline::Ahead(left),
        _ => Deadline::Passed(action),
    }
}

/// Appended to lastError when a maintenance asked for Force but the
/// controller runs without `--allow-force-drain`, so it failed as with Fail.
pub const FORCE_NOT_ALLOWED_NOTE: &str = "; drainTimeoutAction Force is not enabled on this \
     controller (a cluster admin enables it with manifests/components/force-drain, which sets \
     ALLOW_FORCE_DRAIN=true and grants delete on pods), so it failed as with Fail";

/// The status of a maintenance whose drain deadline passed with
/// `drainTimeoutAction: Fail`: Failed, naming what was still on the node.
pub fn timed_out(status: &Status, timeout: Duration, node: &str) -> Status {
    const SHOWN: usize = 5;
    let pods = &status.pending_pods_refs;
    let mut names: Vec<String> = pods
        .iter()
        .take(SHOWN)
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    if pods.len() > SHOWN {
        names.push(format!("and {} more", pods.len() - SHOWN));
    }
    failed(
        status,
        format!(
            "drain did not finish within {} (spec.drainTimeout): {} pods still on node {node}: {}; \
             the node was given back (set drainTimeoutAction: Force to delete them instead)",
            shared::rules::duration::format(timeout),
            pods.len(),
            names.join(", ")
        ),
    )
}

/// Whether `new` must be written over `old`: it differs in anything but
/// lastUpdate, or `refresh` asks for a fresh lastUpdate.
pub fn needs_write(old: &Status, new: &Status, refresh: bool) -> bool {
    if refresh {
        return true;
    }
    let mut cmp = new.clone();
    cmp.last_update = old.last_update.clone();
    cmp != *old
}

/// The event a status change says, if any: each phase transition is written
/// once (the write is version-checked), so its event is emitted once.
pub fn transition_event(old: &Status, new: &Status) -> Option<EventSpec> {
    if old.phase == new.phase {
        return None;
    }
    match new.phase {
        Some(MaintenancePhase::Succeeded) => Some(EVENT_SUCCEED_MAINTENANCE),
        Some(MaintenancePhase::Failed) => Some(EVENT_FAILED_MAINTENANCE),
        _ => None,
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn pod(name: &str) -> PodReference {
        PodReference {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn with_phase(phase: MaintenancePhase) -> Status {
        Status {
            phase: Some(phase),
            ..Default::default()
        }
    }

    fn running(eviction: i64, pending: &[&str], progress: i64) -> Status {
        Status {
            phase: Some(MaintenancePhase::Running),
            eviction_pods: eviction,
            total_pods: eviction + 1,
            pending_pods: pending.iter().map(|s| s.to_string()).collect(),
            pending_pods_refs: pending.iter().map(|s| pod(s)).collect(),
            drain_progress: progress,
            ..Default::default()
        }
    }

    #[test]
    fn lifecycle_follows_finalizer_and_deletion() {
        for (has, deleting, want) in [
            (false, false, Lifecycle::AddFinalizer),
            (true, false, Lifecycle::Apply),
            (true, true, Lifecycle::Cleanup),
            (false, true, Lifecycle::Done),
        ] {
            assert_eq!(
                lifecycle(has, deleting),
                want,
                "finalizer {has}, deleting {deleting}"
            );
        }
    }

    #[test]
    fn only_running_or_succeeded_maintenances_touched_the_node() {
        use MaintenancePhase::*;
        for (phase, want) in [
            (None, false),
            (Some(Pending), false),
            (Some(Running), true),
            (Some(Succeeded), true),
            (Some(Failed), false),
        ] {
            assert_eq!(touched_node(phase.as_ref()), want, "{phase:?}");
        }
    }

    #[test]
    fn admission_table() {
        use MaintenancePhase::*;
        let admitted = SlotDecision::Admitted;
        let dup = SlotDecision::Duplicate {
            owner: "first".into(),
        };
        let wait = SlotDecision::Wait {
            position: 2,
            holders: vec!["busy".into()],
            max: 1,
        };
        let cases: Vec<(&str, Status, &SlotDecision, Admission)> = vec![
            (
                "failed is final: nothing happens until it is deleted",
                with_phase(Failed),
                &admitted,
                Admission::Final,
            ),
            (
                "failed stays final even when a slot frees up",
                with_phase(Failed),
                &wait,
                Admission::Final,
            ),
            (
                "a second maintenance for a node fails and never touches it",
                Status::default(),
                &dup,
                Admission::Fail(failed(
                    &Status::default(),
                    "NodeMaintenance first already maintains node n1; this one never touches \
                     the node: delete NodeMaintenance nm"
                        .into(),
                )),
            ),
            (
                "no free slot: Pending, saying what it waits for",
                Status::default(),
                &wait,
                Admission::Wait(Status {
                    phase: Some(Pending),
                    last_error: slots::wait_message(2, &["busy".to_string()], 1),
                    ..Default::default()
                }),
            ),
            (
                "first sight: record the starting point",
                Status::default(),
                &admitted,
                Admission::Proceed { first_sight: true },
            ),
            (
                "admitted after waiting: first sight",
                with_phase(Pending),
                &admitted,
                Admission::Proceed { first_sight: true },
            ),
            (
                "running: carry on",
                with_phase(Running),
                &admitted,
                Admission::Proceed { first_sight: false },
            ),
            (
                "succeeded: carry on (lease renewal, node re-check)",
                with_phase(Succeeded),
                &admitted,
                Admission::Proceed { first_sight: false },
            ),
        ];
        for (name, status, slot, want) in cases {
            assert_eq!(admit(&status, slot, "nm", "n1"), want, "{name}");
        }
    }

    #[test]
    fn a_missing_node_fails_the_maintenance_without_retry() {
        // Never there, or deleted while the drain ran: the counts stay.
        for status in [Status::default(), running(2, &["a"], 50)] {
            let st = node_missing(&status, "n1");
            assert_eq!(st.phase, Some(MaintenancePhase::Failed));
            assert_eq!(st.last_error, "nodes \"n1\" not found");
            assert_eq!(
                (st.eviction_pods, st.drain_progress),
                (status.eviction_pods, status.drain_progress)
            );
        }
    }

    #[test]
    fn first_sight_bookkeeping_is_upstreams() {
        let old = Status {
            phase: Some(MaintenancePhase::Pending),
            last_error: "waiting for a maintenance slot".into(),
            ..Default::default()
        };
        let st = begin(&old, 5, vec![pod("a"), pod("b")]);
        assert_eq!(st.phase, Some(MaintenancePhase::Running));
        assert_eq!((st.total_pods, st.eviction_pods), (5, 2));
        assert_eq!(st.pending_pods, vec!["a", "b"]);
        assert_eq!(st.pending_pods_refs, vec![pod("a"), pod("b")]);
        assert_eq!(st.drain_progress, 0);
        assert_eq!(st.last_error, "");
    }

    #[test]
    fn lease_table() {
        let other = || LeaseOutcome::HeldByOther("snr".into());
        let err = || LeaseOutcome::Failed("lease write refused".into());
        let at = |progress: i64, count: i64| Status {
            error_on_lease_count: count,
            ..running(4, &["a"], progress)
        };
        let with = |mut st: Status, count: i64, err: &str| {
            st.error_on_lease_count = count;
            st.last_error = err.to_string();
            st
        };
        let cases: Vec<(&str, Status, LeaseOutcome, LeaseStep)> = vec![
            (
                "ours: go on",
                at(0, 0),
                LeaseOutcome::Held,
                LeaseStep::Proceed(at(0, 0)),
            ),
            (
                "getting the lease back resets the count",
                at(50, 3),
                LeaseOutcome::Held,
                LeaseStep::Proceed(at(50, 0)),
            ),
            (
                "foreign lease while drainProgress is 0: retried, not counted",
                at(0, 0),
                other(),
                LeaseStep::Retry(with(at(0, 0), 0, &msg_lease_held_by_other("snr"))),
            ),
            (
                "foreign lease after draining started: counted",
                at(50, 0),
                other(),
                LeaseStep::Retry(with(at(50, 0), 1, &msg_lease_held_by_other("snr"))),
            ),
            (
                "any other lease error: counted even before draining",
                at(0, 2),
                err(),
                LeaseStep::Retry(with(at(0, 2), 3, "lease write refused")),
            ),
            (
                "above 3: the maintenance fails after 4 attempts",
                at(50, 3),
                err(),
                LeaseStep::GiveUp {
                    status: failed(&with(at(50, 3), 4, ""), msg_lease_failed(4)),
                    cause: "lease write refused".into(),
                },
            ),
            (
                "a foreign lease after draining started can fail it too",
                at(25, 3),
                other(),
                LeaseStep::GiveUp {
                    status: failed(&with(at(25, 3), 4, ""), msg_lease_failed(4)),
                    cause: msg_lease_held_by_other("snr"),
                },
            ),
        ];
        for (name, status, outcome, want) in cases {
            assert_eq!(after_lease(&status, outcome), want, "{name}");
        }
        assert_eq!(
            msg_lease_failed(4),
            "maintenance failed: lease could not be extended after 4 attempts"
        );
    }

    /// Issue 22: a pod arriving on a drained node set drainProgress below
    /// 100 and pendingPods while the phase stayed Succeeded.
    #[test]
    fn a_pod_arriving_after_success_does_not_rewind_the_drain() {
        use MaintenancePhase::Succeeded;
        let done = Status {
            phase: Some(Succeeded),
            drain_progress: 100,
            eviction_pods: 0,
            ..Default::default()
        };
        let late = Round {
            remaining: vec![pod("late")],
            ..Default::default()
        };
        let next = after_round(&done, late, Duration::from_secs(5));
        assert_eq!(next.status.phase, Some(Succeeded));
        assert_eq!(next.status.drain_progress, 100);
        assert!(next.status.pending_pods.is_empty() && next.status.pending_pods_refs.is_empty());
        assert_eq!(
            next.requeue, REQUEUE_TERMINATING,
            "it is still evicted, soon"
        );
        assert_eq!(
            transition_event(&done, &next.status),
            None,
            "no second event"
        );
        let blocked = Round {
            remaining: vec![pod("late")],
            blocker: Some("pod ns/late: PDB".into()),
            ..Default::default()
        };
        let next = after_round(&done, blocked, Duration::from_secs(5));
        assert_eq!(
            next.status.last_error, "pod ns/late: PDB",
            "a blocker still shows"
        );
        assert_eq!(next.status.drain_progress, 100);
    }

    #[test]
    fn round_table() {
        let blocked = |pods: &[&str]| Round {
            remaining: pods.iter().map(|p| pod(p)).collect(),
            blocker: Some("pod ns/a: eviction blocked by a PodDisruptionBudget".into()),
            migrating: vec![],
            departures_watched: false,
            listed_before_cordon: false,
            waits_only: false,
        };
        let leaving = |pods: &[&str]| Round {
            remaining: pods.iter().map(|p| pod(p)).collect(),
            blocker: None,
            migrating: vec![],
            departures_watched: false,
            listed_before_cordon: false,
            waits_only: false,
        };
        let leaving_watched = |pods: &[&str]| Round {
            departures_watched: true,
            ..leaving(pods)
        };
        let migrating = |pods: &[&str]| Round {
            remaining: pods.iter().map(|p| pod(p)).collect(),
            blocker: None,
            migrating: pods.iter().map(|p| pod(p)).collect(),
            departures_watched: false,
            listed_before_cordon: false,
            waits_only: false,
        };
        let with_error = |mut st: Status, e: &str| {
            st.last_error = e.into();
            st
        };
        let cases: Vec<(&str, Status, Round, Next)> = vec![
            (
                "nothing left in a list taken before the cordon: listed again at once",
                running(2, &["a", "b"], 0),
                Round {
                    listed_before_cordon: true,
                    ..Round::default()
                },
                Next {
                    status: running(2, &[], 100),
                    requeue: REQUEUE_NOW,
                    refresh: false,
                },
            ),
            (
                "nothing left: Succeeded, 100, lists cleared",
                running(2, &["a", "b"], 0),
                Round::default(),
                Next {
                    status: Status {
                        phase: Some(MaintenancePhase::Succeeded),
                        drain_progress: 100,
                        eviction_pods: 2,
                        total_pods: 3,
                        ..Default::default()
                    },
                    requeue: REQUEUE_HOLD,
                    refresh: false,
                },
            ),
            (
                "blocked by a PDB: progress (4-1)*100/4, the blocker in lastError, retry in 5 s, lastUpdate refreshed",
                running(4, &["a", "b"], 50),
                blocked(&["a"]),
                Next {
                    status: with_error(
                        running(4, &["a"], 75),
                        "pod ns/a: eviction blocked by a PodDisruptionBudget",
                    ),
                    requeue: REQUEUE_BLOCKED,
                    refresh: true,
                },
            ),
            (
                "pods terminating on their own: back in 500 ms, no forced write",
                running(3, &["a", "b", "c"], 0),
                leaving(&["a", "b"]),
                Next {
                    status: running(3, &["a", "b"], 33),
                    requeue: REQUEUE_TERMINATING,
                    refresh: false,
                },
            ),
            (
                "pods terminating, their departure watched: the watch wakes us, the poll waits 5 s",
                running(3, &["a", "b", "c"], 0),
                leaving_watched(&["a", "b"]),
                Next {
                    status: running(3, &["a", "b"], 33),
                    requeue: REQUEUE_BLOCKED,
                    refresh: false,
                },
            ),
            (
                "a VM live-migrating away: progress, no blocker, asked again in 5 s",
                running(2, &["vm", "b"], 0),
                migrating(&["vm"]),
                Next {
                    status: running(2, &["vm"], 50),
                    requeue: REQUEUE_BLOCKED,
                    refresh: true,
                },
            ),
            (
                "an old blocker is cleared once nothing blocks",
                with_error(running(2, &["a"], 50), "old blocker"),
                leaving(&["a"]),
                Next {
                    status: running(2, &["a"], 50),
                    requeue: REQUEUE_TERMINATING,
                    refresh: false,
                },
            ),
        ];
        for (name, status, round, want) in cases {
            assert_eq!(after_round(&status, round, REQUEUE_BLOCKED), want, "{name}");
        }
    }

    #[test]
    fn deadline_table() {
        use DrainTimeoutAction::*;
        let t0 = Timestamp::from_second(1_700_000_000).expect("time");
        let at = |s: i64| {
            t0.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .expect("time")
        };
        let min30 = Some(Duration::from_secs(1800));
        for (name, timeout, action, since, now, want) in [
            (
                "no deadline: wait forever, as upstream",
                None,
                Fail,
                Some(t0),
                at(99_999),
                Deadline::Unbounded,
            ),
            (
                "not cordoned yet: the clock has not started",
                min30,
                Fail,
                None,
                at(99_999),
                Deadline::Unbounded,
            ),
            (
                "time left",
                min30,
                Fail,
                Some(t0),
                at(600),
                Deadline::Ahead(Duration::from_secs(1200)),
            ),
            (
                "exactly at the deadline: passed",
                min30,
                Fail,
                Some(t0),
                at(1800),
                Deadline::Passed(Fail),
            ),
            (
                "passed, Force asked",
                min30,
                Force,
                Some(t0),
                at(4000),
                Deadline::Passed(Force),
            ),
            (
                "clock behind the cordon: full time left",
                min30,
                Fail,
                Some(at(10)),
                t0,
                Deadline::Ahead(Duration::from_secs(1800)),
            ),
        ] {
            assert_eq!(deadline(timeout, action, since, now), want, "{name}");
        }
    }

    #[test]
    fn timing_out_fails_and_names_what_was_left() {
        let st = running(3, &["a", "b"], 33);
        let failed = timed_out(&st, Duration::from_secs(1800), "n1");
        assert_eq!(failed.phase, Some(MaintenancePhase::Failed));
        assert_eq!(
            failed.last_error,
            "drain did not finish within 30m (spec.drainTimeout): 2 pods still on node n1: ns/a, ns/b; \
             the node was given back (set drainTimeoutAction: Force to delete them instead)"
        );
        assert_eq!(failed.eviction_pods, 3, "counts kept");
    }

    #[test]
    fn writes_only_changes_unless_refreshing() {
        let old = Status {
            last_update: Some(Time(Timestamp::UNIX_EPOCH)),
            ..running(2, &["a"], 50)
        };
        let same = running(2, &["a"], 50);
        assert!(
            !needs_write(&old, &same, false),
            "lastUpdate alone is no change"
        );
        assert!(
            needs_write(&old, &same, true),
            "a blocked retry refreshes lastUpdate"
        );
        assert!(needs_write(&old, &running(2, &[], 100), false));
    }

    #[test]
    fn events_of_transitions_once() {
        use MaintenancePhase::*;
        let cases = [
            (None, Some(Running), None),
            (Some(Running), Some(Running), None),
            (
                Some(Running),
                Some(Succeeded),
                Some(EVENT_SUCCEED_MAINTENANCE),
            ),
            (Some(Succeeded), Some(Succeeded), None),
            (Some(Running), Some(Failed), Some(EVENT_FAILED_MAINTENANCE)),
            (None, Some(Failed), Some(EVENT_FAILED_MAINTENANCE)),
            (Some(Failed), Some(Failed), None),
            (None, Some(Pending), None),
        ];
        for (old, new, want) in cases {
            let o = Status {
                phase: old.clone(),
                ..Default::default()
            };
            let n = Status {
                phase: new.clone(),
                ..Default::default()
            };
            assert_eq!(
                transition_event(&o, &n).map(|e| e.reason),
                want.map(|e| e.reason),
                "{old:?} -> {new:?}"
            );
        }
    }
}
