//! Apply: carry a [`Plan`] out against the API server, in one fixed order
//! (metadata, lease, node, drain), and hand back what to write.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::json;
use shared::api::consts::{
    EVENT_BEGIN_MAINTENANCE, EVENT_REMOVED_MAINTENANCE, EVENT_UNCORDON_NODE, FINALIZER,
    PRIOR_CORDON_ANNOTATION,
};
use shared::{DrainTimeoutAction, NodeMaintenance, NodeMaintenanceStatus, PodReference};

use super::writes::{patch_metadata, patch_node, set_finalizers};
use super::{
    Ctx, EVENT_CORDON_KEPT, EVENT_LOAD_BALANCERS_EXCLUDED, EVENT_NODE_WAS_CORDONED,
    EVENT_POD_FORCE_DELETED, Error,
};
use crate::conditions::Cause;
use crate::drain::{self, LeavingPod, NodePods, PodOutcome};
use crate::load_balancers;
use crate::node;
use crate::node_lease::LeaseError;
use crate::plan::node_conditions::{self, Stage};
use crate::plan::{self, Deadline, LeaseOutcome, LeaseStep, NodeSeen, Observed, Plan, Record, Why};

/// What a pass carried out: the status to record (if the plan writes one)
/// and the stage the node reached, for its lifecycle conditions.
pub(super) struct Applied {
    pub write: Option<Record>,
    pub stage: Option<Stage>,
}

/// Carry `plan` out; `seen.nm` follows every write.
pub(super) async fn apply(plan: Plan, seen: &mut Observed, ctx: &Ctx) -> Result<Applied, Error> {
    let pending = seen.nm.phase() == Some(&shared::MaintenancePhase::Pending);
    let intent = node_conditions::Intent::of(&plan, pending);
    let write = carry_out(plan, seen, ctx).await?;
    let stage = node_conditions::stage(intent, write.as_ref());
    Ok(Applied { write, stage })
}

/// The plan's steps in their fixed order; the status to record, if any.
async fn carry_out(plan: Plan, seen: &mut Observed, ctx: &Ctx) -> Result<Option<Record>, Error> {
    let node = match &seen.node {
        NodeSeen::Present(node) => Some(node.as_ref()),
        _ => None,
    };
    match plan {
        Plan::Nothing => Ok(None),
        Plan::AddFinalizer { owner_refs } => {
            let mut finalizers = seen.nm.finalizers().to_vec();
            finalizers.push(FINALIZER.to_string());
            let mut fields = json!({ "finalizers": finalizers });
            if let Some(refs) = owner_refs {
                fields["ownerReferences"] = json!(refs);
            }
            let nm = patch_metadata(ctx, &seen.nm, fields, "add the finalizer to").await?;
            ctx.events.on(&nm, EVENT_BEGIN_MAINTENANCE).await;
            // The finalizer change comes back through the watch.
            Ok(None)
        }
        Plan::Write(record) => Ok(Some(record)),
        Plan::GiveBack(record) => {
            give_back(ctx, &seen.nm.spec.node_name, node).await?;
            Ok(Some(record))
        }
        Plan::Maintain {
            owner_refs,
            deadline,
            first_sight,
        } => {
            set_owner_refs(ctx, &mut seen.nm, owner_refs).await?;
            match node {
                Some(node) => maintain(ctx, &mut seen.nm, node, deadline, first_sight)
                    .await
                    .map(Some),
                None => Ok(None),
            }
        }
        Plan::Cleanup { give_back } => {
            cleanup(ctx, &seen.nm, give_back.then_some(node)).await?;
            Ok(None)
        }
    }
}

async fn set_owner_refs(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    refs: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
) -> Result<(), Error> {
    if let Some(refs) = refs {
        let field = json!({ "ownerReferences": refs });
        *nm = patch_metadata(ctx, nm, field, "set the Node owner reference of").await?;
    }
    Ok(())
}

/// An admitted maintenance on an existing node: the lease, the node's
/// state, one drain round (and past a Force deadline, deletions). On first
/// sight, upstream's starting point is written once the node is in
/// maintenance, before the first eviction.
async fn maintain(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    node: &Node,
    deadline: Deadline,
    first_sight: bool,
) -> Result<Record, Error> {
    let node_name = node.name_any();
    let in_maintenance = node::enter_patch(node).is_none();
    let (status, listed) = match taken(ctx, nm, node, first_sight, in_maintenance).await? {
        Ok(taken) => taken,
        Err(record) => return Ok(*record),
    };
    let undone = node::undone(node);
    if plan::left_to_hand(status.phase.as_ref(), &undone) {
        tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, undone = ?undone,
            "node changed by hand after its drain finished: left as it is");
        return Ok(plan::left_to_hand_record(&status, &node_name, &undone));
    }
    let entered = enter(ctx, nm, node, &node_name).await;
    if first_sight {
        // Upstream's starting point, before the first eviction; under a
        // refused cordon it stands too (phase Running), with the error the
        // failed pass records on top.
        let why = Why::new(Cause::Progress, entered.is_ok());
        super::record::write_status(ctx, nm, status.clone(), why).await?;
    }
    if let Some(left) = shed_traffic_wait(ctx, nm, node, entered?) {
        return Ok(Record {
            status,
            why: Why::new(Cause::Progress, true),
            requeue: Some(left),
        });
    }
    let pods = match listed {
        Some(pods) => pods,
        None => ctx.drainer.list(node).await?,
    };
    let before_cordon = first_sight && !in_maintenance;
    let (round, left) = drain_round(ctx, &node_name, pods, before_cordon).await?;
    let mut forced = Vec::new();
    if deadline == Deadline::Passed(DrainTimeoutAction::Force) {
        // A VM being live-migrated is left to finish: deleting its pod
        // would kill the VM.
        let due: Vec<_> = left
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none() && !round.migrating.contains(&p.reference())
            })
            .collect();
        forced = force_delete(ctx, nm, &node_name, &due).await;
    }
    Ok(plan::after_drain(
        &status,
        round,
        forced,
        deadline,
        ctx.blocked_retry,
    ))
}

/// How long the first eviction still waits for the load balancers
/// (`--exclude-from-load-balancers`); `excluded_now`: the label went on in
/// this pass.
fn shed_traffic_wait(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    node: &Node,
    excluded_now: bool,
) -> Option<Duration> {
    let left = load_balancers::drain_wait(node, ctx.shed_traffic?, ctx.clock.now(), excluded_now)?;
    tracing::debug!(nodemaintenance = %nm.name_any(), node = %node.name_any(),
        wait_ms = left.as_millis() as u64, "waiting for the load balancers before the first eviction");
    Some(left)
}

/// The lease, before anything touches the node, and the node's pods
/// listed beside it when the list needs no cordon first (first sight, for
/// upstream's starting point; a node in maintenance already): the status
/// to go on from and the pods, or the record of a lease not (or no longer)
/// ours.
async fn taken(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    node: &Node,
    first_sight: bool,
    in_maintenance: bool,
) -> Result<Result<(NodeMaintenanceStatus, Option<NodePods>), Box<Record>>, Error> {
    let node_name = node.name_any();
    let (outcome, listed) = if first_sight || in_maintenance {
        let (outcome, listed) = tokio::join!(request_lease(ctx, nm, node), ctx.drainer.list(node));
        (outcome, Some(listed?))
    } else {
        (request_lease(ctx, nm, node).await, None)
    };
    let mut status = nm.status.clone().unwrap_or_default();
    if let (true, Some(pods)) = (first_sight, &listed) {
        status = plan::begin(&status, pods.total, drain::references(&pods.must_leave));
    }
    let cause = plan::lease_cause(&outcome);
    let step = plan::after_lease(&status, outcome);
    if let LeaseStep::GiveUp { status, cause } = &step {
        tracing::error!(nodemaintenance = %nm.name_any(), node = %node_name, error = %status.last_error,
            last_lease_error = %cause, "lease lost for good: giving the node back");
        give_back(ctx, &node_name, Some(node)).await?;
    }
    let cordoned = node::is_in_maintenance(node);
    Ok(plan::after_lease_step(step, cause, cordoned, ctx.blocked_retry).map(|st| (st, listed)))
}

/// Put `node` into maintenance when anything of it is missing, noting a
/// cordon that was there before; with `--exclude-from-load-balancers`, the
/// exclusion label in the same patch. True when that label went on now.
async fn enter(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    node: &Node,
    node_name: &str,
) -> Result<bool, Error> {
    let enter_ops = node::enter_patch(node).unwrap_or_default();
    let lb_ops = match ctx.shed_traffic {
        Some(_) => {
            // A map the enter patch creates exists for the operations after it.
            let has = |map: &str, present: bool| {
                present
                    || enter_ops
                        .iter()
                        .any(|o| o["path"] == format!("/metadata/{map}"))
            };
            let maps = (
                has("labels", node.metadata.labels.is_some()),
                has("annotations", node.metadata.annotations.is_some()),
            );
            load_balancers::exclude_ops(node, ctx.clock.now(), maps)
        }
        None => Vec::new(),
    };
    let (entering, excluded) = (!enter_ops.is_empty(), !lb_ops.is_empty());
    let ops = [enter_ops, lb_ops].concat();
    if ops.is_empty() {
        return Ok(false);
    }
    let prior = entering && node::notes_prior_cordon(node);
    patch_node(ctx, node_name, ops, "put into maintenance").await?;
    if entering {
        tracing::info!(nodemaintenance = %nm.name_any(), node = %node_name, prior_cordon = prior,
            "node cordoned, tainted and excluded from remediation");
    }
    if prior {
        let msg = format!(
            "node {node_name} was already unschedulable before NodeMaintenance {}; it stays \
             cordoned when the maintenance ends (annotation {PRIOR_CORDON_ANNOTATION} on the node)",
            nm.name_any()
        );
        ctx.events.note(nm, EVENT_NODE_WAS_CORDONED, &msg).await;
    }
    if excluded {
        excluded_event(ctx, nm, node_name).await;
    }
    Ok(excluded)
}

/// LoadBalancersExcluded, and the log line, when the exclusion label went on.
async fn excluded_event(ctx: &Ctx, nm: &NodeMaintenance, node_name: &str) {
    let delay = shared::rules::duration::format(ctx.shed_traffic.unwrap_or_default());
    let msg = format!(
        "node {node_name} labelled {} (--exclude-from-load-balancers); the first eviction waits \
         {delay} (--load-balancer-drain-delay) so the load balancers stop sending it traffic",
        shared::serve::drain_flags::EXCLUDE_FROM_LB_LABEL
    );
    tracing::info!(nodemaintenance = %nm.name_any(), node = %node_name, delay = %delay,
        "node excluded from external load balancers");
    ctx.events
        .note(nm, EVENT_LOAD_BALANCERS_EXCLUDED, &msg)
        .await;
}

/// Take or renew the node's medik8s lease, and say (in the log) what
/// stands in the way.
async fn request_lease(ctx: &Ctx, nm: &NodeMaintenance, node: &Node) -> LeaseOutcome {
    let node_name = node.name_any();
    // Named in the log only when something stands in the way.
    let lease = || {
        format!(
            "{}/{}",
            ctx.leases.namespace(),
            shared::api::consts::lease_name(&node_name)
        )
    };
    let status = nm.status.as_ref();
    match ctx.leases.request(node).await {
        Ok(()) => LeaseOutcome::Held,
        Err(LeaseError::HeldByOther(holder)) => {
            // Counted (a warning) once draining started; before, only waited for.
            if status.is_some_and(|s| s.drain_progress > 0) {
                tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, lease = %lease(), %holder,
                    "lease held by another operator after draining started: counted, retried");
            } else {
                tracing::info!(nodemaintenance = %nm.name_any(), node = %node_name, lease = %lease(), %holder,
                    "lease held by another operator: waiting for it");
            }
            LeaseOutcome::HeldByOther(holder)
        }
        Err(e) => {
            tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, lease = %lease(), error = %e,
                attempts = status.map_or(0, |s| s.error_on_lease_count).saturating_add(1), "lease error: counted, retried");
            LeaseOutcome::Failed(e.to_string())
        }
    }
}

/// Evict what must leave of the node's `pods` (concurrently, bounded) and
/// report what is still there and why.
async fn drain_round(
    ctx: &Ctx,
    node_name: &str,
    pods: NodePods,
    listed_before_cordon: bool,
) -> Result<(plan::Round, Vec<LeavingPod>), Error> {
    // The node's pod watch starts from this list, before the evictions: it
    // sees every departure they cause.
    let watched = if pods.must_leave.is_empty() {
        ctx.departures_watched.contains(node_name)
    } else {
        ctx.departures_watched
            .drain_listed(node_name, pods.listed_at.as_deref())
    };
    let budget = tokio::time::Instant::now() + drain::EVICTION_BUDGET;
    let outcomes = ctx.drainer.evict(&pods.must_leave, budget).await;
    // A pod waited for until it completes wakes the drain when it changes.
    let waited = (outcomes.iter())
        .filter(|(_, o)| matches!(o, PodOutcome::WaitingForCompletion(_)))
        .map(|(r, _)| (r.namespace.clone(), r.name.clone()))
        .collect();
    ctx.departures_watched.waiting_for(node_name, waited);
    for o in outcomes.values() {
        // A terminating pod got no eviction request this round, nor did one
        // a drain rule holds back.
        if !matches!(
            o,
            PodOutcome::Terminating(_)
                | PodOutcome::Stuck { .. }
                | PodOutcome::WaitingForCompletion(_)
                | PodOutcome::AfterGroup { .. }
                | PodOutcome::Kept(_)
        ) {
            ctx.metrics.eviction(drain::outcome_label(o));
        }
    }
    let left: Vec<_> = pods
        .must_leave
        .into_iter()
        .filter(|p| outcomes.get(&p.reference()) != Some(&PodOutcome::Gone))
        .collect();
    let on_their_way = left.iter().all(|p| {
        matches!(
            outcomes.get(&p.reference()),
            Some(PodOutcome::Evicted | PodOutcome::Terminating(_))
        )
    });
    let round = plan::Round {
        remaining: drain::references(&left),
        blocker: ctx.drainer.blocker_summary(node_name, &outcomes),
        waits_only: ctx.drainer.waits_only(&outcomes),
        migrating: drain::migrating(&outcomes),
        departures_watched: !left.is_empty() && on_their_way && watched,
        listed_before_cordon,
    };
    Ok((round, left))
}

/// The deadline passed and the object asked for Force: delete the pods
/// still on the node without eviction (PodDisruptionBudgets bypassed, each
/// pod's own grace period kept), each named in a Warning event; returns
/// those deleted (for `status.forceDeletedPods`). The uid precondition
/// never deletes a pod recreated under the same name elsewhere.
async fn force_delete(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    node: &str,
    pods: &[LeavingPod],
) -> Vec<PodReference> {
    let mut deleted = Vec::new();
    for pod in pods {
        let (ns, name) = (pod.namespace(), pod.name());
        let params = DeleteParams {
            preconditions: pod.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        match api.delete(&name, &params).await {
            Ok(_) => {
                let msg = format!(
                    "deleted pod {ns}/{name} from node {node} without eviction: spec.drainTimeout {} passed (drainTimeoutAction: Force)",
                    nm.spec.drain_timeout.as_deref().unwrap_or_default()
                );
                tracing::warn!(nodemaintenance = %nm.name_any(), pod = %format!("{ns}/{name}"), "{msg}");
                ctx.events.warn(nm, EVENT_POD_FORCE_DELETED, &msg).await;
                deleted.push(pod.reference());
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(nodemaintenance = %nm.name_any(), pod = %format!("{ns}/{name}"), error = %e,
                "force deletion failed; retrying next round. Check the controller may delete pods")
            }
        }
    }
    deleted
}

/// The one way a maintenance ends for its node (drain deadline, lease lost,
/// node gone, deletion, a panic): undo what we did to the node, if it still
/// exists, and release its medik8s lease, side by side (one round trip off
/// a zone's hand-over). Safe in either order: until the node patch lands
/// the node keeps the exclude-from-remediation label, so no remediator
/// takes it; a failed patch is retried and the release is idempotent.
pub(super) async fn give_back(
    ctx: &Ctx,
    node_name: &str,
    node: Option<&Node>,
) -> Result<(), Error> {
    let undo = async {
        match node {
            Some(node) => undo_on_node(ctx, node_name, node).await,
            None => Ok(()),
        }
    };
    let (undone, released) = tokio::join!(undo, ctx.leases.release(node_name));
    undone?;
    released?;
    Ok(())
}

/// Take off the node what the maintenance put on it (with the
/// load-balancer exclusion we added). Says UncordonNode only when that
/// changed something (a retried cleanup finds the node already given back
/// and says nothing).
async fn undo_on_node(ctx: &Ctx, node_name: &str, node: &Node) -> Result<(), Error> {
    let exit = node::exit_patch(node);
    let gives_back = exit.is_some();
    let mut ops = exit.unwrap_or_default();
    ops.extend(load_balancers::give_back_ops(node));
    if ops.is_empty() {
        return Ok(());
    }
    let keep = node::keeps_cordon(node);
    patch_node(ctx, &node.name_any(), ops, "give back").await?;
    if !gives_back {
        return Ok(());
    }
    if keep {
        let msg = format!(
            "node {node_name} given back but left unschedulable: it was cordoned before its \
             maintenance. Uncordon it (kubectl uncordon {node_name}) when it may take pods again"
        );
        tracing::info!(node = %node_name, "node given back, its prior cordon kept");
        ctx.events.note(node, EVENT_CORDON_KEPT, &msg).await;
    } else {
        ctx.events.on(node, EVENT_UNCORDON_NODE).await;
    }
    Ok(())
}

/// A deleted NodeMaintenance: give the node back (`node`: Some when this
/// one had it; Some(None) when the node is gone), then remove the
/// finalizer; RemovedMaintenance once that worked. A finalizer that cannot
/// be removed (e.g. the webhook is down) is retried without repeating
/// events: the node is already given back by then.
async fn cleanup(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    node: Option<Option<&Node>>,
) -> Result<(), Error> {
    let (name, node_name) = (nm.name_any(), nm.spec.node_name.clone());
    if let Some(node) = node {
        if node.is_none() {
            tracing::info!(nodemaintenance = %name, node = %node_name, "node already gone");
        }
        give_back(ctx, &node_name, node).await?;
        tracing::info!(nodemaintenance = %name, node = %node_name, "maintenance ended: node given back, lease released");
    }
    let rest: Vec<String> = nm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let nm = set_finalizers(ctx, nm, rest).await?;
    // The object goes now: nothing of ours to remember about it.
    ctx.own_writes.forget(&name);
    if node.is_some() {
        ctx.node_cache.retire(&node_name);
    }
    ctx.events.on(&nm, EVENT_REMOVED_MAINTENANCE).await;
    Ok(())
}
