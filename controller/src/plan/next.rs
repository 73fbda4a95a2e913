//! The decision of one reconcile pass: from what it observed ([`Observed`])
//! to what it does ([`Plan`]) and what it writes ([`Record`]). Pure: the
//! reconciler observes, calls [`next`], applies the plan in a fixed order
//! and writes one status.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use shared::rules::gates::GateReason;
use shared::rules::slots::SlotDecision;
use shared::{DrainTimeoutAction, MaintenancePhase, NodeMaintenance, PodReference};
use shared::{NodeMaintenanceStatus as Status, api::consts::FINALIZER};

use super::{
    Admission, Deadline, LeaseOutcome, Lifecycle, REQUEUE_PENDING, Round, admit, after_round,
    deadline, lifecycle, node_missing, timed_out, touched_node,
};
use crate::conditions::{self, Cause};

/// Why a status is written, for its conditions: the cause, whether the node
/// is in maintenance, and whether lastUpdate must move even if nothing else
/// did (a blocked retry: runbooks watch its freshness).
#[derive(Debug, Clone, PartialEq)]
pub struct Why {
    pub cause: Cause,
    /// What made the maintenance fail, for the Failed condition's message
    /// (the last lease error; lastError keeps upstream's text).
    pub failure_cause: Option<String>,
    pub cordoned: bool,
    /// A person changed the node after the drain finished: the Cordoned
    /// condition's message (reason ChangedByHand) saying what.
    pub by_hand: Option<String>,
    /// Pods KubeVirt is live-migrating away (named in Drained's message).
    pub migrating: usize,
    pub refresh: bool,
}

impl Why {
    pub fn new(cause: Cause, cordoned: bool) -> Why {
        Why {
            cause,
            failure_cause: None,
            cordoned,
            by_hand: None,
            migrating: 0,
            refresh: false,
        }
    }

    pub fn refreshed(self) -> Why {
        Why {
            refresh: true,
            ..self
        }
    }
}

/// What a pass writes (one status write, skipped when nothing changed) and
/// when to come back (`None`: on the next change).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub status: Status,
    pub why: Why,
    pub requeue: Option<Duration>,
}

/// The node as one pass read it.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeSeen {
    /// Not needed by this pass (waiting, final, not touched).
    NotRead,
    Gone,
    Present(Box<Node>),
}

/// Everything one pass decides on.
#[derive(Debug, Clone)]
pub struct Observed {
    /// The maintenance (never older than our own last write of it).
    pub nm: NodeMaintenance,
    /// A cleanup no longer due (the live object says it finished) is `Done`.
    pub lifecycle: Lifecycle,
    /// Its admission (from its slot decision) when it is being carried on;
    /// `Final` otherwise.
    pub admission: Admission,
    pub node: NodeSeen,
    pub now: Timestamp,
}

impl Observed {
    pub fn status(&self) -> Status {
        self.nm.status.clone().unwrap_or_default()
    }

    /// The lifecycle of `nm` from its finalizer and deletion mark.
    pub fn lifecycle_of(nm: &NodeMaintenance) -> Lifecycle {
        let has_finalizer = nm.finalizers().iter().any(|f| f == FINALIZER);
        lifecycle(has_finalizer, nm.metadata.deletion_timestamp.is_some())
    }

    /// Whether this pass needs the node: a new maintenance (its owner
    /// reference goes with the finalizer), an admitted one, or the cleanup
    /// of one that touched it.
    pub fn needs_node(&self) -> bool {
        match self.lifecycle {
            Lifecycle::AddFinalizer => true,
            Lifecycle::Cleanup => touched_node(self.nm.phase()),
            Lifecycle::Apply => matches!(self.admission, Admission::Proceed { .. }),
            _ => false,
        }
    }

    /// `self` with the admission its `slot` decision gives.
    pub fn admitted(self, slot: &SlotDecision) -> Observed {
        let admission = admit(
            &self.status(),
            slot,
            &self.nm.name_any(),
            &self.nm.spec.node_name,
        );
        Observed { admission, ..self }
    }

    /// `self` held by a fleet gate: `reason`, `message`, look again in `requeue`.
    pub fn gated(self, reason: GateReason, message: String, requeue: Duration) -> Observed {
        let admission = super::gated(&self.status(), reason, message, requeue);
        Observed { admission, ..self }
    }
}

/// What one pass does, applied in this order: metadata (finalizer, owner
/// reference), lease, node, drain, then the one status write.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Nothing,
    /// New: add the finalizer and say BeginMaintenance; the Node owner
    /// reference goes in the same write when the node is there.
    AddFinalizer {
        owner_refs: Option<Vec<OwnerReference>>,
    },
    /// Write only (waiting for a slot, a duplicate, a vanished node that
    /// was never touched).
    Write(Record),
    /// The maintenance ends for its node: undo what was done to the node
    /// (if it is there), release the lease, then write.
    GiveBack(Record),
    /// Lease, node into maintenance, one drain round (and, past a Force
    /// deadline, deletions); what to write follows from their outcomes
    /// ([`after_lease_step`], [`after_drain`]). On `first_sight` the
    /// node's pods are listed beside the lease request for upstream's
    /// starting point ([`begin`](super::begin)), written once the node is
    /// in maintenance and before the first eviction (a write that loses to
    /// a newer version of the object evicts nothing on stale counts).
    Maintain {
        owner_refs: Option<Vec<OwnerReference>>,
        deadline: Deadline,
        first_sight: bool,
    },
    /// Deleted: give the node back if this maintenance touched it, then
    /// remove the finalizer (RemovedMaintenance).
    Cleanup {
        give_back: bool,
    },
}

/// Come back at once: a round that listed the node's pods before its
/// cordon is followed by one that lists after it.
pub const REQUEUE_NOW: Duration = Duration::ZERO;

/// The plan for what was observed. `allow_force`: `--allow-force-drain`.
pub fn next(seen: &Observed, allow_force: bool) -> Plan {
    match seen.lifecycle {
        Lifecycle::AddFinalizer => Plan::AddFinalizer {
            owner_refs: match &seen.node {
                NodeSeen::Present(node) => owner_refs(&seen.nm, node),
                _ => None,
            },
        },
        Lifecycle::Done => Plan::Nothing,
        Lifecycle::Cleanup => Plan::Cleanup {
            give_back: touched_node(seen.nm.phase()),
        },
        Lifecycle::Apply => next_apply(seen, allow_force),
    }
}

fn write(status: Status, why: Why, requeue: Option<Duration>) -> Record {
    Record {
        status,
        why,
        requeue,
    }
}

/// The admission's answer: go on (with whether this is the first sight),
/// or the plan that ends this pass (final, a failure, a wait).
fn admitted(admission: &Admission) -> Result<bool, Box<Plan>> {
    match admission {
        Admission::Final => Err(Box::new(Plan::Nothing)),
        Admission::Fail(st) => {
            let why = Why::new(Cause::DuplicateMaintenance, false);
            Err(Box::new(Plan::Write(write(st.clone(), why, None))))
        }
        Admission::Wait(st) => {
            let why = Why::new(Cause::WaitingForSlot, false);
            Err(Box::new(Plan::Write(write(
                st.clone(),
                why,
                Some(REQUEUE_PENDING),
            ))))
        }
        Admission::Gated {
            status,
            reason,
            requeue,
        } => {
            let why = Why::new(Cause::Gate(*reason), false);
            Err(Box::new(Plan::Write(write(
                status.clone(),
                why,
                Some(*requeue),
            ))))
        }
        Admission::Proceed { first_sight } => Ok(*first_sight),
    }
}

fn next_apply(seen: &Observed, allow_force: bool) -> Plan {
    let status = seen.status();
    let first_sight = match admitted(&seen.admission) {
        Ok(first_sight) => first_sight,
        Err(plan) => return *plan,
    };
    let node = match &seen.node {
        NodeSeen::Present(node) => node,
        NodeSeen::Gone | NodeSeen::NotRead => {
            // Nothing to restore, but a lease taken is ours to give back
            // (Failed is final).
            let st = node_missing(&status, &seen.nm.spec.node_name);
            let record = write(st, Why::new(Cause::NodeNotFound, false), None);
            return if touched_node(status.phase.as_ref()) {
                Plan::GiveBack(record)
            } else {
                Plan::Write(record)
            };
        }
    };
    let owner_refs = owner_refs(&seen.nm, node);
    // The optional drain deadline (beyond upstream), counted from the
    // cordon, judged before anything touches the node.
    let timeout = drain_timeout(&seen.nm);
    let deadline = drain_deadline(&seen.nm, timeout, allow_force, seen.now);
    match (deadline, timeout) {
        (Deadline::Passed(DrainTimeoutAction::Fail), Some(t)) => {
            let mut st = timed_out(&status, t, &seen.nm.spec.node_name);
            if seen.nm.spec.drain_timeout_action == Some(DrainTimeoutAction::Force) {
                st.last_error.push_str(super::FORCE_NOT_ALLOWED_NOTE);
            }
            Plan::GiveBack(write(st, Why::new(Cause::DrainTimeout, false), None))
        }
        _ => Plan::Maintain {
            owner_refs,
            deadline,
            first_sight,
        },
    }
}

/// The owner references `nm` should carry for `node` (a non-controlling
/// reference, replacing one to an older Node of the same name), or None
/// when it has it already.
pub fn owner_refs(nm: &NodeMaintenance, node: &Node) -> Option<Vec<OwnerReference>> {
    let wanted = OwnerReference {
        controller: Some(false),
        block_owner_deletion: Some(false),
        ..shared::rules::nodes::owner_reference(node)
    };
    let mut refs = nm.metadata.owner_references.clone().unwrap_or_default();
    if refs
        .iter()
        .any(|r| r.kind == wanted.kind && r.uid == wanted.uid)
    {
        return None;
    }
    refs.retain(|r| r.kind != "Node");
    refs.push(wanted);
    Some(refs)
}

/// Where a Running maintenance stands against its `spec.drainTimeout`
/// (counted from the Cordoned condition); anything else is unbounded.
/// `timeout`: its [`drain_timeout`]; `allow_force`: `--allow-force-drain`;
/// without it Force acts as Fail.
pub fn drain_deadline(
    nm: &NodeMaintenance,
    timeout: Option<Duration>,
    allow_force: bool,
    now: Timestamp,
) -> Deadline {
    let Some(st) = nm
        .status
        .as_ref()
        .filter(|s| s.phase == Some(MaintenancePhase::Running))
    else {
        return Deadline::Unbounded;
    };
    let action = match nm.spec.drain_timeout_action.unwrap_or_default() {
        DrainTimeoutAction::Force if !allow_force => DrainTimeoutAction::Fail,
        action => action,
    };
    let since = conditions::true_since(&st.conditions, conditions::CORDONED).map(|t| t.0);
    deadline(timeout, action, since, now)
}

/// `spec.drainTimeout`, if set and valid (the CRD's pattern admits only Go
/// durations; anything else is logged and ignored, i.e. no deadline).
pub fn drain_timeout(nm: &NodeMaintenance) -> Option<Duration> {
    let text = nm.spec.drain_timeout.as_deref()?;
    match shared::rules::duration::parse(text) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(nodemaintenance = %nm.name_any(), error = %e, "spec.drainTimeout ignored");
            None
        }
    }
}

/// The cause a lease outcome gives the conditions when it does not proceed.
pub fn lease_cause(outcome: &LeaseOutcome) -> Cause {
    match outcome {
        LeaseOutcome::Held => Cause::Progress,
        LeaseOutcome::HeldByOther(_) => Cause::LeaseHeldByOther,
        LeaseOutcome::Failed(_) => Cause::LeaseError,
    }
}

/// What to write after a lease step that did not proceed: retry (refreshed,
/// come back after `blocked_retry`) or give up (Failed; the caller gave the
/// node back).
pub fn after_lease_step(
    step: super::LeaseStep,
    cause: Cause,
    cordoned: bool,
    blocked_retry: Duration,
) -> Result<Status, Box<Record>> {
    match step {
        super::LeaseStep::Proceed(st) => Ok(st),
        super::LeaseStep::Retry(st) => Err(Box::new(write(
            st,
            Why::new(cause, cordoned).refreshed(),
            Some(blocked_retry),
        ))),
        super::LeaseStep::GiveUp { status, cause } => {
            let why = Why {
                failure_cause: Some(cause),
                ..Why::new(Cause::LeaseLost, false)
            };
            Err(Box::new(write(status, why, None)))
        }
    }
}

/// Whether a maintenance in `phase` leaves its node to the person who took
/// `undone` off it ([`crate::node::undone`]): once the drain is done
/// (Succeeded), a change by hand is reported, not undone, and no pod that
/// comes back is drained. While it drains, the node is put back into
/// maintenance, as upstream does on each reconcile.
pub fn left_to_hand(phase: Option<&MaintenancePhase>, undone: &[&str]) -> bool {
    phase == Some(&MaintenancePhase::Succeeded) && !undone.is_empty()
}

/// The record of a finished maintenance left to a person's hands: the
/// status as it is, Cordoned False saying what changed, a look again after
/// [`super::REQUEUE_HOLD`] (a node change looks sooner).
pub fn left_to_hand_record(status: &Status, node: &str, undone: &[&str]) -> Record {
    let message = format!(
        "node {node} was changed by hand after its drain finished ({}); the maintenance no \
         longer puts the cordon, taints or label back nor drains pods that return; delete the \
         NodeMaintenance to end it (its give-back removes only what is still on the node)",
        undone.join(", ")
    );
    let why = Why {
        by_hand: Some(message),
        ..Why::new(Cause::Progress, false)
    };
    write(status.clone(), why, Some(super::REQUEUE_HOLD))
}

/// What to write after a drain round: `status` (the lease step's), the
/// round, the pods deleted past a Force deadline; when to come back (no
/// later than the deadline).
pub fn after_drain(
    status: &Status,
    round: Round,
    forced: Vec<PodReference>,
    deadline: Deadline,
    blocked_retry: Duration,
) -> Record {
    let mut st = status.clone();
    for r in forced {
        if !st.force_deleted_pods.contains(&r) {
            st.force_deleted_pods.push(r);
        }
    }
    let cause = match (&round.blocker, round.waits_only) {
        (Some(_), true) => Cause::WaitingForCompletion,
        (Some(_), false) => Cause::EvictionBlocked,
        (None, _) => Cause::Progress,
    };
    let migrating = round.migrating.len();
    let next = after_round(&st, round, blocked_retry);
    let why = Why {
        migrating,
        refresh: next.refresh,
        ..Why::new(cause, true)
    };
    let requeue = match deadline {
        Deadline::Ahead(left) => next.requeue.min(left),
        _ => next.requeue,
    };
    write(next.status, why, Some(requeue))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::REQUEUE_PENDING;
    use serde_json::json;

    fn nm(status: serde_json::Value, spec_extra: serde_json::Value) -> NodeMaintenance {
        let mut spec = json!({"nodeName": "w1", "reason": "r"});
        if let (Some(s), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            s.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": "nm-1", "uid": "u-1", "finalizers": [FINALIZER]},
            "spec": spec, "status": status
        }))
        .expect("NodeMaintenance")
    }

    fn node(cordoned: bool) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "w1", "uid": "n-1"},
            "spec": {"unschedulable": cordoned}}))
        .expect("Node")
    }

    /// The time of every observation here (a set clock, never the wall's).
    const NOW: Timestamp = Timestamp::constant(1_796_434_200, 0);

    fn seen(nm: NodeMaintenance, slot: SlotDecision, node: NodeSeen) -> Observed {
        Observed {
            lifecycle: Observed::lifecycle_of(&nm),
            nm,
            admission: Admission::Final,
            node,
            now: NOW,
        }
        .admitted(&slot)
    }

    fn present() -> NodeSeen {
        NodeSeen::Present(Box::new(node(false)))
    }

    /// Running, cordoned `minutes` ago.
    fn running_since(minutes: i64) -> serde_json::Value {
        let since = NOW - k8s_openapi::jiff::SignedDuration::from_mins(minutes);
        json!({"phase": "Running", "pendingPodsRefs": [{"namespace": "ns", "name": "p"}],
            "conditions": [{"type": "Cordoned", "status": "True", "reason": "Cordoned",
                "message": "", "lastTransitionTime": since.to_string()}]})
    }

    #[test]
    fn waiting_and_duplicates_only_write() {
        let wait = SlotDecision::Wait {
            position: 1,
            holders: vec!["other".into()],
            max: 1,
        };
        let Plan::Write(r) = next(
            &seen(nm(json!({}), json!({})), wait, NodeSeen::NotRead),
            false,
        ) else {
            panic!("a waiting maintenance only writes");
        };
        assert_eq!(
            (r.why.cause, r.requeue),
            (Cause::WaitingForSlot, Some(REQUEUE_PENDING))
        );
        let dup = SlotDecision::Duplicate {
            owner: "first".into(),
        };
        let Plan::Write(r) = next(
            &seen(nm(json!({}), json!({})), dup, NodeSeen::NotRead),
            false,
        ) else {
            panic!("a duplicate only writes");
        };
        assert_eq!(r.status.phase, Some(MaintenancePhase::Failed));
        assert_eq!(r.why.cause, Cause::DuplicateMaintenance);
    }

    #[test]
    fn a_missing_node_is_given_back_only_if_it_was_touched() {
        let fresh = nm(json!({}), json!({}));
        let plan = next(&seen(fresh, SlotDecision::Admitted, NodeSeen::Gone), false);
        assert!(
            matches!(&plan, Plan::Write(r) if r.why.cause == Cause::NodeNotFound),
            "{plan:?}"
        );
        let touched = nm(json!({"phase": "Running"}), json!({}));
        let plan = next(
            &seen(touched, SlotDecision::Admitted, NodeSeen::Gone),
            false,
        );
        assert!(
            matches!(&plan, Plan::GiveBack(r) if r.why.cause == Cause::NodeNotFound),
            "{plan:?}"
        );
    }

    #[test]
    fn the_owner_reference_goes_with_the_finalizer_and_first_sight_maintains() {
        let new = nm(json!({}), json!({}));
        let mut fresh = seen(new.clone(), SlotDecision::Admitted, present());
        fresh.lifecycle = Lifecycle::AddFinalizer;
        let Plan::AddFinalizer {
            owner_refs: Some(refs),
        } = next(&fresh, false)
        else {
            panic!("a new maintenance: {:?}", next(&fresh, false));
        };
        assert_eq!(
            (refs[0].kind.as_str(), refs[0].uid.as_str()),
            ("Node", "n-1")
        );
        fresh.node = NodeSeen::Gone;
        assert_eq!(
            next(&fresh, false),
            Plan::AddFinalizer { owner_refs: None },
            "a node not there yet: the finalizer alone"
        );
        let plan = next(&seen(new, SlotDecision::Admitted, present()), false);
        assert!(
            matches!(
                plan,
                Plan::Maintain {
                    owner_refs: Some(_),
                    first_sight: true,
                    ..
                }
            ),
            "first sight: {plan:?}"
        );
    }

    #[test]
    fn a_passed_deadline_gives_the_node_back_unless_force_is_allowed() {
        let spec = json!({"drainTimeout": "10m", "drainTimeoutAction": "Force"});
        let late = || nm(running_since(11), spec.clone());
        let plan = next(&seen(late(), SlotDecision::Admitted, present()), false);
        let Plan::GiveBack(r) = &plan else {
            panic!("Force not allowed acts as Fail: {plan:?}");
        };
        assert_eq!(r.why.cause, Cause::DrainTimeout);
        assert!(
            r.status
                .last_error
                .ends_with(super::super::FORCE_NOT_ALLOWED_NOTE)
        );
        let plan = next(&seen(late(), SlotDecision::Admitted, present()), true);
        assert!(
            matches!(
                plan,
                Plan::Maintain {
                    deadline: Deadline::Passed(DrainTimeoutAction::Force),
                    ..
                }
            ),
            "{plan:?}"
        );
        let early = nm(running_since(1), spec);
        let plan = next(&seen(early, SlotDecision::Admitted, present()), false);
        assert!(
            matches!(
                plan,
                Plan::Maintain {
                    deadline: Deadline::Ahead(_),
                    ..
                }
            ),
            "{plan:?}"
        );
    }

    #[test]
    fn the_lease_step_retries_or_gives_up() {
        let retry = super::super::LeaseStep::Retry(Status::default());
        let r = after_lease_step(retry, Cause::LeaseHeldByOther, true, Duration::from_secs(5))
            .expect_err("a retry writes");
        assert!(r.why.refresh && r.why.cordoned);
        assert_eq!(r.requeue, Some(Duration::from_secs(5)));
        let give_up = super::super::LeaseStep::GiveUp {
            status: Status::default(),
            cause: "held by NHC".into(),
        };
        let r = after_lease_step(give_up, Cause::LeaseError, true, Duration::from_secs(5))
            .expect_err("giving up writes");
        assert_eq!(
            (r.why.cause, r.why.cordoned, r.requeue),
            (Cause::LeaseLost, false, None)
        );
        assert_eq!(r.why.failure_cause.as_deref(), Some("held by NHC"));
    }

    #[test]
    fn a_drain_never_comes_back_later_than_its_deadline() {
        let round = Round {
            remaining: vec![PodReference {
                namespace: "ns".into(),
                name: "p".into(),
            }],
            blocker: Some("blocked".into()),
            ..Round::default()
        };
        let soon = Duration::from_secs(2);
        let r = after_drain(
            &Status::default(),
            round,
            vec![],
            Deadline::Ahead(soon),
            Duration::from_secs(5),
        );
        assert_eq!(
            (r.requeue, r.why.cause),
            (Some(soon), Cause::EvictionBlocked)
        );
    }
}
