//! The NodeMaintenance reconciler. One pass has five stages:
//!
//! 1. **observe** ([`observe`]): the maintenance, its turn ([`admit`]: the
//!    slots and fleet gates decided together by `shared::rules::slots::turn`
//!    over the caches, an admission recorded) and its node, read once into
//!    a [`plan::Observed`] stamped with the context's clock;
//! 2. **decide** ([`plan::next`]): a pure function from that to a
//!    [`plan::Plan`];
//! 3. **apply** ([`apply`]): the plan carried out in one fixed order
//!    (metadata, lease, node, drain), handing back what to write;
//! 4. **record** ([`record`]): one status write, and its events;
//! 5. **node lifecycle** ([`node_lifecycle`]): the KEP-5683 conditions on
//!    the node, for the stage the pass reached (`plan::node_conditions`
//!    decides; a failed write never holds the maintenance back).
//!
//! Around a pass: leadership (a standby acts on nothing), a timeout, a
//! panic caught and recorded on the object, and a pass that lost to a newer
//! version of the object decided again on a fresh read.

mod admit;
mod apply;
mod ctx;
mod error;
mod node_lifecycle;
mod observe;
mod record;
mod writes;

#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use shared::NodeMaintenance;

pub use ctx::Ctx;
pub use error::Error;
pub use node_lifecycle::NodeSignals;

use crate::metrics::ReconcileResult;
use crate::own_writes::Current;
use crate::plan;

/// When to reconcile again: `None` waits for a change (kube's
/// `Action::await_change`), `Some(d)` comes back after `d`.
type Requeue = Option<Duration>;

/// Reconciles running at once (kube's default is unlimited; upstream's
/// controller-runtime runs one). Each is short and bounded by
/// RECONCILE_TIMEOUT, so many maintenances progress side by side.
pub const MAX_CONCURRENT_RECONCILES: u16 = 32;

/// Upper bound of one reconcile (upstream bounds one drain attempt by 30 s).
const RECONCILE_TIMEOUT: Duration =
    Duration::from_secs(shared::api::consts::DRAIN_ATTEMPT_TIMEOUT_SECS);

/// DrainBlocked (Warning): the pods in the way changed (not on every retry).
const EVENT_DRAIN_BLOCKED: &str = "DrainBlocked";
/// DrainWaitingForCompletion (Normal): the pods a drain rule waits for
/// until they complete (behavior WaitCompleted) changed.
const EVENT_DRAIN_WAITING_FOR_COMPLETION: &str = "DrainWaitingForCompletion";
/// LoadBalancersExcluded (Normal): the node was labelled out of the
/// external load balancers; the first eviction waits the drain delay.
const EVENT_LOAD_BALANCERS_EXCLUDED: &str = "LoadBalancersExcluded";
/// PodForceDeleted (Warning): a pod deleted without eviction (drainTimeoutAction: Force).
const EVENT_POD_FORCE_DELETED: &str = "PodForceDeleted";
/// ReconcilePanicked (Warning): the cleanup of a deleted maintenance panicked (a bug).
const EVENT_RECONCILE_PANICKED: &str = "ReconcilePanicked";
/// NodeWasCordoned (Normal, on the NodeMaintenance): its node was
/// unschedulable before the maintenance took it, and will stay so after.
const EVENT_NODE_WAS_CORDONED: &str = "NodeWasCordoned";
/// CordonKept (Normal, on the Node): given back but left cordoned, as it
/// was before its maintenance (in place of UncordonNode).
const EVENT_CORDON_KEPT: &str = "CordonKept";
/// NodeChangedByHand (Warning): a person changed the node (uncordoned it,
/// say) after its drain finished; the maintenance leaves it so.
const EVENT_NODE_CHANGED_BY_HAND: &str = "NodeChangedByHand";
/// NodeUpdateRefused (Warning): the API server refused the controller's node
/// patch (admission policy or webhook); once per refusal, not per retry.
const EVENT_NODE_UPDATE_REFUSED: &str = "NodeUpdateRefused";

pub async fn reconcile(nm: Arc<NodeMaintenance>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // A standby keeps its caches warm and touches nothing; winning the Lease
    // reconciles everything in the cache (see leadership.rs).
    let name = nm.name_any();
    if !ctx.leadership.is_leading() {
        ctx.metrics.queue.forget(&name);
        return Ok(Action::await_change());
    }
    let timer = ctx.metrics.reconcile_started(&name);
    let result = match guarded(&nm, &ctx).await {
        // Gone under us: nothing to retry, and what this pass kept for it
        // (a node it just patched) goes now.
        Err(e) if e.is_gone() => {
            tracing::info!(nodemaintenance = %name, node = %nm.spec.node_name, error = %e,
                "NodeMaintenance gone while reconciled (its finalizer removed by someone else): nothing more to do");
            ctx.forget_maintenance(&name);
            Ok(None)
        }
        other => other,
    };
    if !matches!(&result, Err(e) if e.is_conflict()) {
        ctx.conflicts.clear(&name);
    }
    let seconds = timer.finish(match &result {
        Ok(None) => ReconcileResult::Success,
        Ok(Some(after)) => ReconcileResult::RequeueAfter(*after),
        Err(Error::Panicked(_)) => ReconcileResult::Panic,
        Err(_) => ReconcileResult::Error,
    });
    tracing::debug!(
        nodemaintenance = %name, node = %nm.spec.node_name, ok = result.is_ok(),
        requeue_ms = result.as_ref().ok().copied().flatten().map(|d| d.as_millis() as u64),
        elapsed_ms = (seconds * 1000.0) as u64, "reconciled"
    );
    result.map(|next| next.map_or_else(Action::await_change, Action::requeue))
}

/// One pass, bounded and guarded. kube's client waits up to 295 s on a
/// request (sized for watches); one hung request must not hold this
/// NodeMaintenance for minutes. Every step is idempotent and every write is
/// version-checked, so cutting a pass short and retrying is safe. A panic
/// (a bug) is caught here: kube-runtime would re-raise it and end the
/// process, and a restarted one would meet the same object again.
async fn guarded(nm: &NodeMaintenance, ctx: &Ctx) -> Result<Requeue, Error> {
    let pass = std::panic::AssertUnwindSafe(pass(nm, ctx)).catch_unwind();
    match tokio::time::timeout(RECONCILE_TIMEOUT, pass).await {
        Err(_) => Err(Error::Timeout(RECONCILE_TIMEOUT)),
        Ok(Ok(result)) => result,
        Ok(Err(payload)) => {
            let name = nm.name_any();
            let deleting = nm.metadata.deletion_timestamp.is_some();
            let text = plan::msg_internal_error(
                &name,
                shared::serve::panic_log::payload_text(payload.as_ref()),
                deleting,
            );
            tracing::error!(nodemaintenance = %name, node = %nm.spec.node_name, error = %text,
                "reconcile panicked: recording it on the object");
            record::record_panic(ctx, nm, &text).await;
            Err(Error::Panicked(text))
        }
    }
}

/// A pass on the newest copy we know of; one that lost to a newer version
/// (the watch cache lags, e.g. while a watch reconnects after an API server
/// restart) is decided again at once on the live object, rather than retried
/// on the same stale copy until the cache catches up.
async fn pass(nm: &NodeMaintenance, ctx: &Ctx) -> Result<Requeue, Error> {
    let name = nm.name_any();
    // Never act on a cached copy older than our own last write.
    let current = match ctx
        .own_writes
        .current(&name, nm.metadata.resource_version.as_deref())
    {
        Current::Cached => nm.clone(),
        Current::Ours(latest) => *latest,
        Current::ReadLive => match ctx.read_live(&name).await? {
            Some(live) => live,
            None => return Ok(None),
        },
    };
    match step(current, ctx).await {
        Err(e) if e.is_conflict() => match ctx.read_live(&name).await? {
            Some(live) => {
                tracing::debug!(nodemaintenance = %name, "stale NodeMaintenance in cache; deciding again on a fresh read");
                step(live, ctx).await
            }
            None => Ok(None),
        },
        other => other,
    }
}

/// Observe, decide, apply, record.
async fn step(nm: NodeMaintenance, ctx: &Ctx) -> Result<Requeue, Error> {
    // The panic of the unit test `a_panic_is_recorded_and_the_controller_goes_on`.
    #[cfg(test)]
    if nm.spec.reason == tests::PANIC_REASON {
        panic!("injected by the test");
    }
    let mut seen = observe::observe(nm, ctx).await?;
    let plan = plan::next(&seen, ctx.allow_force_drain);
    let carried_on = seen.lifecycle == plan::Lifecycle::Apply;
    match apply::apply(plan, &mut seen, ctx).await {
        Ok(applied) => {
            let requeue = match applied.write {
                Some(write) => record::record(ctx, &mut seen.nm, write).await?,
                None => None,
            };
            node_lifecycle::sync(ctx, &seen.nm, applied.stage).await;
            Ok(requeue)
        }
        // A conflict is no news for the user: the pass is decided again.
        Err(e) if e.is_conflict() || !carried_on => Err(e),
        Err(e) => {
            record::record_error(ctx, &mut seen, &e).await;
            Err(e)
        }
    }
}

pub fn error_policy(nm: Arc<NodeMaintenance>, err: &Error, ctx: Arc<Ctx>) -> Action {
    if err.is_conflict() {
        // Even the fresh read lost to a newer version: someone else is writing
        // this object right now. Back off instead of spinning.
        let wait = ctx.conflicts.record(&nm.name_any());
        ctx.metrics.requeued(&nm.name_any(), wait);
        tracing::debug!(nodemaintenance = %nm.name_any(), retry_in_ms = wait.as_millis() as u64,
            "NodeMaintenance changed again under a fresh read; retrying");
        return Action::requeue(wait);
    }
    tracing::warn!(
        nodemaintenance = %nm.name_any(), node = %nm.spec.node_name,
        error = %err, kind = err.kind(), "reconcile failed; retrying"
    );
    ctx.metrics.requeued(&nm.name_any(), ctx.blocked_retry);
    Action::requeue(ctx.blocked_retry)
}
