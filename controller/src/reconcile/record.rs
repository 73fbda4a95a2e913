//! Record: the one status write of a pass (skipped when nothing changed),
//! the events of what it says, and the records of failures: lastError of a
//! failed pass, and a panic's final status.

use futures::FutureExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use shared::{MaintenancePhase, NodeMaintenance, NodeMaintenanceStatus};

use super::apply::give_back;
use super::{
    Ctx, EVENT_DRAIN_BLOCKED, EVENT_DRAIN_WAITING_FOR_COMPLETION, EVENT_NODE_CHANGED_BY_HAND,
    EVENT_NODE_UPDATE_REFUSED, EVENT_RECONCILE_PANICKED,
};
use super::{Error, Requeue};
use crate::conditions::{self, Cause};
use crate::plan::{self, NodeSeen, Observed, Record, Why};

/// Write what the pass decided and say when to come back.
pub(super) async fn record(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    record: Record,
) -> Result<Requeue, Error> {
    let before = nm.phase().cloned();
    write_status(ctx, nm, record.status, record.why).await?;
    let after = nm.phase().cloned();
    if before != after {
        let (name, node) = (nm.name_any(), nm.spec.node_name.clone());
        match after {
            Some(MaintenancePhase::Succeeded) => {
                tracing::info!(nodemaintenance = %name, %node, "node drained: maintenance succeeded")
            }
            Some(MaintenancePhase::Failed) => {
                let error = nm
                    .status
                    .as_ref()
                    .map(|s| s.last_error.as_str())
                    .unwrap_or_default();
                tracing::warn!(nodemaintenance = %name, %node, %error, "maintenance failed");
            }
            _ => {}
        }
    }
    Ok(record.requeue)
}

/// A pass failed (not a conflict): keep the reason visible on the object,
/// as upstream does, on top of the latest status written this pass. A
/// refused node patch is a standing refusal: lastUpdate shows the retries
/// go on, and one Warning says so when the refusal is new or its words
/// change.
pub(super) async fn record_error(ctx: &Ctx, seen: &mut Observed, e: &Error) {
    let nm = &mut seen.nm;
    let mut st = nm.status.clone().unwrap_or_default();
    st.last_error = e.to_string();
    let cordoned = matches!(&seen.node, NodeSeen::Present(n) if crate::node::is_in_maintenance(n));
    let refused = matches!(e, Error::NodeRefused { .. });
    let why = if refused {
        Why::new(Cause::NodeUpdateRefused, cordoned).refreshed()
    } else {
        Why::new(Cause::ReconcileError, cordoned)
    };
    let before = st.conditions.clone();
    match write_status(ctx, nm, st, why).await {
        Ok(()) if refused => {
            let after = nm.status.clone().unwrap_or_default().conditions;
            if let Some(msg) = conditions::blocked_news(&before, &after, Cause::NodeUpdateRefused) {
                ctx.events.warn(nm, EVENT_NODE_UPDATE_REFUSED, msg).await;
            }
        }
        Ok(()) => {}
        Err(we) => {
            tracing::warn!(nodemaintenance = %nm.name_any(), error = %we, "could not record lastError");
        }
    }
}

/// Write `new` as the status when [`plan::needs_write`] says so, with a
/// fresh lastUpdate. The patch carries the resourceVersion we read: if the
/// cache handed us a stale object the API server answers 409 and we decide
/// again, instead of writing bookkeeping computed from old state. The events
/// of a change follow the write, so a retried pass never repeats them.
pub(super) async fn write_status(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    mut new: NodeMaintenanceStatus,
    why: Why,
) -> Result<(), Error> {
    let old = nm.status.clone().unwrap_or_default();
    let now = Time(ctx.clock.now());
    new.conditions = conditions::conditions(
        &old.conditions,
        &new,
        why.cause,
        why.cordoned,
        why.migrating,
        nm.metadata.generation,
        &now,
    );
    if let Some(message) = &why.by_hand {
        let generation = nm.metadata.generation;
        conditions::changed_by_hand(
            &mut new.conditions,
            &old.conditions,
            message,
            generation,
            &now,
        );
    }
    if let Some(cause) = &why.failure_cause {
        conditions::add_failure_cause(&mut new.conditions, cause);
    }
    if !plan::needs_write(&old, &new, why.refresh) {
        return Ok(());
    }
    new.last_update = Some(now);
    let name = nm.name_any();
    let based_on = nm.metadata.resource_version.clone();
    let body = json!({
        "metadata": {"resourceVersion": based_on},
        "status": status_body(&new)
    });
    *nm = ctx
        .nms()
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .map_err(|source| Error::NodeMaintenance {
            action: "write the status of",
            name,
            source,
        })?;
    shared::kube::partial::forget_managed_fields(&mut nm.metadata);
    ctx.wrote(&nm.name_any(), based_on.as_deref(), nm);
    announce(ctx, nm, &old, &new).await;
    Ok(())
}

/// The status as a merge patch: cleared fields are sent as null so the
/// patch really removes them.
fn status_body(new: &NodeMaintenanceStatus) -> Value {
    let mut body = serde_json::to_value(new).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut body {
        for field in shared::api::crd::STATUS_FIELDS {
            map.entry(field).or_insert(Value::Null);
        }
    }
    body
}

/// After a status write from `old` to `new`: the transition's event, a
/// DrainBlocked when the pods in the way changed, a Normal event named
/// after the gate when a fleet gate starts holding it, and a failed
/// maintenance's node cache entry retired (Failed is final and the node was
/// given back). The per-maintenance gauges follow the watch (watches.rs).
async fn announce(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    old: &NodeMaintenanceStatus,
    new: &NodeMaintenanceStatus,
) {
    let failed = Some(MaintenancePhase::Failed);
    if new.phase == failed && old.phase != failed {
        ctx.node_cache.retire(&nm.spec.node_name);
    }
    if let Some(event) = plan::transition_event(old, new) {
        ctx.events.on(nm, event).await;
    }
    if let Some(blockers) = conditions::drain_blocked_news(&old.conditions, &new.conditions) {
        ctx.events.warn(nm, EVENT_DRAIN_BLOCKED, blockers).await;
    }
    if let Some(waited) = conditions::waiting_news(&old.conditions, &new.conditions) {
        ctx.events
            .note(nm, EVENT_DRAIN_WAITING_FOR_COMPLETION, waited)
            .await;
    }
    if let Some(message) = conditions::by_hand_news(&old.conditions, &new.conditions) {
        ctx.events
            .warn(nm, EVENT_NODE_CHANGED_BY_HAND, message)
            .await;
    }
    if let Some((gate, message)) = conditions::gate_news(&old.conditions, &new.conditions) {
        ctx.events.note(nm, gate.as_str(), message).await;
    }
}

/// After a panic: a maintenance that is not being deleted fails for good
/// (phase Failed, lastError, the Failed condition with reason InternalError,
/// FailedMaintenance), its node given back and its lease released, as any
/// other final failure; one being deleted keeps retrying its cleanup, with
/// lastError and a Warning event saying why. Best effort: a failure or
/// panic here is only logged.
pub(super) async fn record_panic(ctx: &Ctx, nm: &NodeMaintenance, text: &str) {
    let name = nm.name_any();
    let record = std::panic::AssertUnwindSafe(async {
        match ctx.read_live(&name).await {
            Ok(Some(live)) => panic_on(ctx, live, text).await,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(nodemaintenance = %name, error = %e, "could not read it to record the panic")
            }
        }
    })
    .catch_unwind();
    if record.await.is_err() {
        tracing::error!(nodemaintenance = %name, "recording the panic panicked as well");
    }
}

async fn panic_on(ctx: &Ctx, mut live: NodeMaintenance, text: &str) {
    let name = live.name_any();
    let status = live.status.clone().unwrap_or_default();
    let deleting = live.metadata.deletion_timestamp.is_some();
    if deleting {
        ctx.events.warn(&live, EVENT_RECONCILE_PANICKED, text).await;
    } else if status.phase == Some(MaintenancePhase::Failed) {
        return;
    } else if plan::touched_node(status.phase.as_ref()) {
        let node_name = live.spec.node_name.clone();
        let node = match ctx.nodes().get_opt(&node_name).await {
            Ok(node) => node,
            Err(e) => {
                tracing::warn!(nodemaintenance = %name, node = %node_name, error = %e, "could not read the node to give it back after the panic");
                None
            }
        };
        if let Err(e) = give_back(ctx, &node_name, node.as_ref()).await {
            tracing::warn!(nodemaintenance = %name, node = %node_name, error = %e, "could not give the node back after the panic");
        }
    }
    let st = if deleting {
        NodeMaintenanceStatus {
            last_error: text.to_string(),
            ..status
        }
    } else {
        plan::failed(&status, text.to_string())
    };
    let why = Why::new(Cause::InternalError, false);
    if let Err(e) = write_status(ctx, &mut live, st, why).await {
        tracing::warn!(nodemaintenance = %name, error = %e, "could not record the panic");
    }
}
