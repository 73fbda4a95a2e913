//! The decision of one reconcile pass: from what it observed ([`Observed`])
//! to what it does ([`Plan`]) and what it writes ([`Record`]). Pure: the
//! reconciler observes, calls [`next`], applies the plan in a fixed order
//! and writes one status.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use shared::slots::SlotDecision;
use shared::{DrainTimeoutAction, MaintenancePhase, NodeMaintenance, PodReference};
use shared::{NodeMaintenanceStatus as Status, consts::FINALIZER};

use super::{
    Admission, Deadline, LeaseOutcome, Lifecycle, REQUEUE_PENDING, Round, admit, after_round,
    begin, deadline, lifecycle, node_missing, timed_out, touched_node,
};
use crate::conditions::{self, Cause};
use crate::node;

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
    /// The slot decision, for a maintenance being carried on.
    pub slot: Option<SlotDecision>,
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

    /// Whether this pass needs the node: an admitted maintenance, or the
    /// cleanup of one that touched it.
    pub fn needs_node(&self) -> bool {
        match self.lifecycle {
            Lifecycle::Cleanup => touched_node(self.nm.phase()),
            Lifecycle::Apply => matches!(self.admission(), Admission::Proceed { .. }),
            _ => false,
        }
    }

    fn admission(&self) -> Admission {
        match &self.slot {
            Some(slot) => admit(
                &self.status(),
                slot,
                &self.nm.name_any(),
                &self.nm.spec.node_name,
            ),
            None => Admission::Final,
        }
    }
}

/// What one pass does, applied in this order: metadata (finalizer, owner
/// reference), lease, node, drain, then the one status write.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Nothing,
    /// New: add the finalizer and say BeginMaintenance.
    AddFinalizer,
    /// Write only (waiting for a slot, a duplicate, a vanished node that
    /// was never touched).
    Write(Record),
    /// The maintenance ends for its node: undo what was done to the node
    /// (if it is there), release the lease, then write.
    GiveBack(Record),
    /// First sight: the owner reference, then the starting point from a
    /// list of the node's pods ([`first_sight`]), before anything moves (a
    /// write that loses to a newer version evicts nothing on stale counts).
    Begin {
        owner_refs: Option<Vec<OwnerReference>>,
        cordoned: bool,
    },
    /// Lease, node into maintenance, one drain round (and, past a Force
    /// deadline, deletions); what to write follows from their outcomes
    /// ([`after_lease_step`], [`after_drain`]).
    Maintain {
        owner_refs: Option<Vec<OwnerReference>>,
        deadline: Deadline,
    },
    /// Deleted: give the node back if this maintenance touched it, then
    /// remove the finalizer (RemovedMaintenance).
    Cleanup {
        give_back: bool,
    },
}

/// Come back at once: the first sight's write is followed by the drain.
pub const REQUEUE_NOW: Duration = Duration::ZERO;

/// The plan for what was observed. `allow_force`: `--allow-force-drain`.
pub fn next(seen: &Observed, allow_force: bool) -> Plan {
    match seen.lifecycle {
        Lifecycle::AddFinalizer => Plan::AddFinalizer,
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

fn next_apply(seen: &Observed, allow_force: bool) -> Plan {
    let status = seen.status();
    let first_sight = match seen.admission() {
        Admission::Final => return Plan::Nothing,
        Admission::Fail(st) => {
            return Plan::Write(write(
                st,
                Why::new(Cause::DuplicateMaintenance, false),
                None,
            ));
        }
        Admission::Wait(st) => {
            let why = Why::new(Cause::WaitingForSlot, false);
            return Plan::Write(write(st, why, Some(REQUEUE_PENDING)));
        }
        Admission::Proceed { first_sight } => first_sight,
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
    if first_sight {
        let cordoned = node::is_in_maintenance(node);
        return Plan::Begin {
            owner_refs,
            cordoned,
        };
    }
    // The optional drain deadline (beyond upstream), counted from the
    // cordon, judged before anything touches the node.
    let deadline = drain_deadline(&seen.nm, allow_force, seen.now);
    match (deadline, drain_timeout(&seen.nm)) {
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
        },
    }
}

/// What the first sight writes: upstream's starting bookkeeping ([`begin`])
/// from `total` pods on the node and those that `must_leave`; the drain
/// follows at once.
pub fn first_sight(
    status: &Status,
    total: usize,
    must_leave: Vec<PodReference>,
    cordoned: bool,
) -> Record {
    let why = Why::new(Cause::Progress, cordoned);
    write(begin(status, total, must_leave), why, Some(REQUEUE_NOW))
}

/// The owner references `nm` should carry for `node` (a non-controlling
/// reference, replacing one to an older Node of the same name), or None
/// when it has it already.
pub fn owner_refs(nm: &NodeMaintenance, node: &Node) -> Option<Vec<OwnerReference>> {
    let wanted = OwnerReference {
        controller: Some(false),
        block_owner_deletion: Some(false),
        ..shared::nodes::owner_reference(node)
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
/// `allow_force`: `--allow-force-drain`; without it Force acts as Fail.
pub fn drain_deadline(nm: &NodeMaintenance, allow_force: bool, now: Timestamp) -> Deadline {
    let st = nm.status.clone().unwrap_or_default();
    if st.phase != Some(MaintenancePhase::Running) {
        return Deadline::Unbounded;
    }
    let action = match nm.spec.drain_timeout_action.unwrap_or_default() {
        DrainTimeoutAction::Force if !allow_force => DrainTimeoutAction::Fail,
        action => action,
    };
    let since = conditions::true_since(&st.conditions, conditions::CORDONED).map(|t| t.0);
    deadline(drain_timeout(nm), action, since, now)
}

/// `spec.drainTimeout`, if set and valid (the CRD's pattern admits only Go
/// durations; anything else is logged and ignored, i.e. no deadline).
pub fn drain_timeout(nm: &NodeMaintenance) -> Option<Duration> {
    let text = nm.spec.drain_timeout.as_deref()?;
    match shared::duration::parse(text) {
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
    let cause = if round.blocker.is_some() {
        Cause::EvictionBlocked
    } else {
        Cause::Progress
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
