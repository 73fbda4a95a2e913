//! The NodeMaintenance reconciler: routes apply and cleanup through the
//! finalizer, takes a slot, the lease, puts the node into maintenance, runs
//! one non-blocking drain round, writes status, and asks to come back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use shared::consts::{
    EVENT_BEGIN_MAINTENANCE, EVENT_FAILED_MAINTENANCE, EVENT_REMOVED_MAINTENANCE,
    EVENT_SUCCEED_MAINTENANCE, EVENT_UNCORDON_NODE, FINALIZER,
    MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE, msg_lease_failed, msg_node_missing,
};
use shared::{MaintenancePhase, NodeMaintenance, NodeMaintenanceStatus};

use crate::conflicts::ConflictStreaks;
use crate::drain::{self, PodOutcome};
use crate::events::Events;
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use crate::node;
use crate::node_lease::{LeaseError, NodeLeases};
use crate::slots::{self, SlotDecision};

/// How soon to come back while pods are leaving on their own.
const REQUEUE_TERMINATING: Duration = Duration::from_millis(500);
/// How soon to come back when something blocks (PDB, foreign lease): upstream's 5 s.
const REQUEUE_BLOCKED: Duration = Duration::from_secs(shared::consts::DRAIN_REQUEUE_SECS);
/// How often a waiting NodeMaintenance re-checks for a free slot (reads the cache only).
const REQUEUE_PENDING: Duration = Duration::from_secs(2);
/// Upper bound of one reconcile (upstream bounds one drain attempt by 30 s).
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(shared::consts::DRAIN_ATTEMPT_TIMEOUT_SECS);
/// How often a finished maintenance renews its one-hour lease and re-checks the node.
const REQUEUE_HOLD: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to {action} node {node}: {source}")]
    Node {
        action: &'static str,
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "node {node} changed while we patched it (someone updated its taints at the same time); retrying with a fresh copy"
    )]
    NodeChanged { node: String },
    #[error("failed to read or write NodeMaintenance {name}: {source}")]
    NodeMaintenance {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Pods(#[from] drain::ListPodsError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(
        "reconcile took longer than {0:?} (the API server is slow or a request hung); retrying"
    )]
    Timeout(Duration),
    #[error("finalizer {FINALIZER}: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// A write refused because our copy of the object was outdated (HTTP 409).
    pub fn is_conflict(&self) -> bool {
        let api_code = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
        match self {
            Error::NodeMaintenance { source, .. } => api_code(source),
            Error::NodeChanged { .. } => true,
            Error::Finalizer(f) => match f.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.is_conflict(),
                _ => false,
            },
            _ => false,
        }
    }

    /// Label for the error metric and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Node { .. } => "node",
            Error::NodeChanged { .. } => "node_changed",
            Error::NodeMaintenance { .. } => "nodemaintenance",
            Error::Pods(_) => "pods",
            Error::Lease(_) => "lease",
            Error::Finalizer(_) => "finalizer",
            Error::Timeout(_) => "timeout",
        }
    }
}

pub struct Ctx {
    pub client: Client,
    /// Same credentials, without the client's own 429 retries (see main).
    pub evict_client: Client,
    pub store: Store<NodeMaintenance>,
    pub events: Events,
    pub metrics: Metrics,
    pub leases: NodeLeases,
    pub max_concurrent_maintenances: usize,
    pub max_concurrent_evictions: usize,
    pub leadership: Leadership,
    /// Conflicts in a row per NodeMaintenance (see `error_policy`).
    pub conflicts: ConflictStreaks,
}

pub async fn reconcile(nm: Arc<NodeMaintenance>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // A standby keeps its caches warm and touches nothing; winning the Lease
    // reconciles everything in the cache (see leadership.rs).
    if !ctx.leadership.is_leading() {
        return Ok(Action::await_change());
    }
    let started = Instant::now();
    let api: Api<NodeMaintenance> = Api::all(ctx.client.clone());
    let name = nm.name_any();
    // kube's client waits up to 295 s on a request (sized for watches); one
    // hung request must not hold this NodeMaintenance for minutes. Every step
    // is idempotent and status writes are version-checked, so cutting a
    // reconcile short and retrying is safe.
    let bounded = tokio::time::timeout(RECONCILE_TIMEOUT, async {
        match route(&api, nm.clone(), &ctx).await {
            // Our copy came from the watch cache and the API server holds a
            // newer one (the cache lags, e.g. while a watch reconnects after
            // an API server restart): decide again on the live object now,
            // rather than retrying on the same stale copy until the cache
            // catches up.
            Err(e) if e.is_conflict() => match api.get_opt(&name).await {
                Ok(Some(live)) => {
                    tracing::debug!(nodemaintenance = %name, "stale NodeMaintenance in cache; deciding again on a fresh read");
                    route(&api, Arc::new(live), &ctx).await
                }
                Ok(None) => Ok(Action::await_change()),
                Err(source) => Err(Error::NodeMaintenance { name: name.clone(), source }),
            },
            other => other,
        }
    })
    .await;
    let result = bounded.unwrap_or(Err(Error::Timeout(RECONCILE_TIMEOUT)));
    if !matches!(&result, Err(e) if e.is_conflict()) {
        ctx.conflicts.clear(&name);
    }
    let label = match &result {
        Ok(a) if *a == Action::await_change() => "success",
        Ok(_) => "requeue_after",
        Err(_) => "error",
    };
    ctx.metrics
        .reconciled(label, started.elapsed().as_secs_f64());
    tracing::debug!(
        nodemaintenance = %nm.name_any(), node = %nm.spec.node_name, result = label,
        elapsed_ms = started.elapsed().as_millis() as u64, "reconciled"
    );
    result
}

/// Apply or clean up `nm`, through the finalizer.
async fn route(
    api: &Api<NodeMaintenance>,
    nm: Arc<NodeMaintenance>,
    ctx: &Ctx,
) -> Result<Action, Error> {
    finalizer(api, FINALIZER, nm, |event| async {
        match event {
            FinalizerEvent::Apply(nm) => apply(&nm, ctx).await,
            FinalizerEvent::Cleanup(nm) => cleanup(&nm, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

pub fn error_policy(nm: Arc<NodeMaintenance>, err: &Error, ctx: Arc<Ctx>) -> Action {
    if err.is_conflict() {
        // Even the fresh read lost to a newer version: someone else is writing
        // this object right now. Back off instead of spinning.
        let wait = ctx.conflicts.record(&nm.name_any());
        tracing::debug!(nodemaintenance = %nm.name_any(), retry_in_ms = wait.as_millis() as u64,
            "NodeMaintenance changed again under a fresh read; retrying");
        return Action::requeue(wait);
    }
    tracing::warn!(
        nodemaintenance = %nm.name_any(), node = %nm.spec.node_name,
        error = %err, kind = err.kind(), "reconcile failed; retrying"
    );
    Action::requeue(REQUEUE_BLOCKED)
}

fn status_of(nm: &NodeMaintenance) -> NodeMaintenanceStatus {
    nm.status.clone().unwrap_or_default()
}

/// Write `new` as the status if it differs from what the object has (lastUpdate aside).
/// Cleared fields are sent as null so a merge patch really removes them. The
/// patch carries the resourceVersion we read: if the cache handed us a stale
/// object the API server answers 409 and we come back, instead of writing
/// bookkeeping computed from old state. Events of the contract are tied to the
/// phase transitions written here, so a retried reconcile never repeats them.
async fn write_status(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    mut new: NodeMaintenanceStatus,
) -> Result<(), Error> {
    let old = status_of(nm);
    let mut cmp = new.clone();
    cmp.last_update = old.last_update.clone();
    if cmp == old {
        return Ok(());
    }
    new.last_update = Some(Time(Timestamp::now()));
    let mut body = serde_json::to_value(&new).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut body {
        for field in [
            "phase",
            "drainProgress",
            "lastUpdate",
            "lastError",
            "pendingPods",
            "pendingPodsRefs",
            "totalpods",
            "evictionPods",
            "errorOnLeaseCount",
        ] {
            map.entry(field).or_insert(Value::Null);
        }
    }
    let name = nm.name_any();
    let updated = Api::<NodeMaintenance>::all(ctx.client.clone())
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": nm.metadata.resource_version},
                "status": body
            })),
        )
        .await
        .map_err(|source| Error::NodeMaintenance { name, source })?;
    *nm = updated;
    if old.phase.is_none() && new.phase.is_some() {
        ctx.events.on(nm, EVENT_BEGIN_MAINTENANCE).await;
    }
    if old.phase != new.phase {
        match new.phase {
            Some(MaintenancePhase::Succeeded) => ctx.events.on(nm, EVENT_SUCCEED_MAINTENANCE).await,
            Some(MaintenancePhase::Failed) => ctx.events.on(nm, EVENT_FAILED_MAINTENANCE).await,
            _ => {}
        }
    }
    if let Some(phase) = &new.phase {
        ctx.metrics.observe(
            &nm.name_any(),
            &nm.spec.node_name,
            phase,
            new.drain_progress,
            new.pending_pods.len(),
        );
    }
    Ok(())
}

fn slot_entries(store: &Store<NodeMaintenance>) -> Vec<slots::Entry> {
    store
        .state()
        .iter()
        .map(|o| slots::Entry {
            name: o.name_any(),
            node: o.spec.node_name.clone(),
            created: o
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            phase: o.phase().cloned(),
            deleting: o.metadata.deletion_timestamp.is_some(),
        })
        .collect()
}

async fn fail(ctx: &Ctx, nm: &mut NodeMaintenance, message: String) -> Result<Action, Error> {
    let mut st = status_of(nm);
    st.phase = Some(MaintenancePhase::Failed);
    st.last_error = message;
    write_status(ctx, nm, st).await?;
    Ok(Action::await_change())
}

async fn apply(nm: &NodeMaintenance, ctx: &Ctx) -> Result<Action, Error> {
    let mut nm = nm.clone();
    let nm = &mut nm;
    let name = nm.name_any();
    let node_name = nm.spec.node_name.clone();
    let status = status_of(nm);
    // Failed is final: the node was given back; delete and recreate to retry.
    if status.phase == Some(MaintenancePhase::Failed) {
        return Ok(Action::await_change());
    }

    let me = slots::Entry {
        name: name.clone(),
        node: node_name.clone(),
        created: nm
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        phase: status.phase.clone(),
        deleting: false,
    };
    match slots::decide(
        &me,
        &slot_entries(&ctx.store),
        ctx.max_concurrent_maintenances,
    ) {
        SlotDecision::Admitted => {}
        SlotDecision::Duplicate { owner } => {
            let msg = format!(
                "NodeMaintenance {owner} already maintains node {node_name}; this one never touches \
                 the node: delete NodeMaintenance {name}"
            );
            return fail(ctx, nm, msg).await;
        }
        SlotDecision::Wait {
            position,
            holders,
            max,
        } => {
            let mut st = status.clone();
            st.phase = Some(MaintenancePhase::Pending);
            st.last_error = slots::wait_message(position, &holders, max);
            write_status(ctx, nm, st).await?;
            return Ok(Action::requeue(REQUEUE_PENDING));
        }
    }
    match apply_admitted(nm, ctx, status.clone()).await {
        Ok(action) => Ok(action),
        // A conflict is no news for the user: reconcile retries on a fresh read.
        Err(e) if e.is_conflict() => Err(e),
        Err(e) => {
            // Keep the reason visible on the object, as upstream does.
            let mut st = status;
            st.last_error = e.to_string();
            if let Err(we) = write_status(ctx, nm, st).await {
                tracing::warn!(nodemaintenance = %name, error = %we, "could not record lastError");
            }
            Err(e)
        }
    }
}

async fn apply_admitted(
    nm: &mut NodeMaintenance,
    ctx: &Ctx,
    mut st: NodeMaintenanceStatus,
) -> Result<Action, Error> {
    let name = nm.name_any();
    let node_name = nm.spec.node_name.clone();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = match nodes.get_opt(&node_name).await {
        Ok(Some(n)) => n,
        Ok(None) => {
            tracing::warn!(nodemaintenance = %name, node = %node_name, "node not found: maintenance failed");
            return fail(ctx, nm, msg_node_missing(&node_name)).await;
        }
        Err(source) => {
            return Err(Error::Node {
                action: "read",
                node: node_name,
                source,
            });
        }
    };
    ensure_owner_reference(ctx, nm, &node).await?;

    let first_sight = !matches!(
        st.phase,
        Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
    );
    if first_sight {
        // Upstream's initial bookkeeping: what is on the node before anything moves.
        let pods = drain::list_node_pods(&ctx.client, &node_name).await?;
        st.phase = Some(MaintenancePhase::Running);
        st.eviction_pods = pods.must_leave.len() as i64;
        st.total_pods = pods.total as i64;
        st.pending_pods = pods.must_leave.iter().map(|p| p.name_any()).collect();
        st.pending_pods_refs = drain::references(&pods.must_leave);
        st.drain_progress = 0;
        st.last_error.clear();
        // Persist the starting point before anything moves: if this write loses
        // to a newer object version, nothing has been evicted on stale counts.
        write_status(ctx, nm, st.clone()).await?;
    }

    // The lease comes before anything touches the node.
    match ctx.leases.request(&node).await {
        Ok(()) => st.error_on_lease_count = 0,
        Err(LeaseError::HeldByOther(holder)) if st.drain_progress == 0 => {
            // Someone else (e.g. Self Node Remediation) owns the node and we have
            // not started: wait without counting.
            st.last_error = shared::consts::msg_lease_held_by_other(&holder);
            write_status(ctx, nm, st).await?;
            return Ok(Action::requeue(REQUEUE_BLOCKED));
        }
        Err(e) => {
            st.error_on_lease_count += 1;
            if st.error_on_lease_count > MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE {
                tracing::error!(nodemaintenance = %name, node = %node_name, error = %e,
                    "lease lost for good: giving the node back");
                restore_node(ctx, &node).await?;
                ctx.leases.release(&node_name).await?;
                return fail(ctx, nm, msg_lease_failed(st.error_on_lease_count)).await;
            }
            st.last_error = e.to_string();
            write_status(ctx, nm, st).await?;
            return Ok(Action::requeue(REQUEUE_BLOCKED));
        }
    }

    if let Some(ops) = node::enter_patch(&node) {
        patch_node(ctx, &node_name, ops, "put into maintenance").await?;
        tracing::info!(nodemaintenance = %name, node = %node_name, "node cordoned, tainted and excluded from remediation");
    }

    // One drain round.
    let pods = drain::list_node_pods(&ctx.client, &node_name).await?;
    let outcomes = drain::evict_all(
        &ctx.evict_client,
        pods.must_leave.clone(),
        ctx.max_concurrent_evictions,
    )
    .await;
    for o in outcomes.values() {
        match o {
            PodOutcome::Evicted => ctx.metrics.eviction("evicted"),
            PodOutcome::Gone => ctx.metrics.eviction("gone"),
            PodOutcome::Blocked(_) => ctx.metrics.eviction("blocked"),
            PodOutcome::Failed(_) => ctx.metrics.eviction("failed"),
            PodOutcome::Terminating(_) => {}
        }
    }
    let still_there: Vec<_> = pods
        .must_leave
        .iter()
        .filter(|p| {
            let r = drain::references(std::slice::from_ref(p));
            r.first()
                .and_then(|r| outcomes.get(r))
                .is_none_or(|o| *o != PodOutcome::Gone)
        })
        .cloned()
        .collect();

    if still_there.is_empty() {
        let newly = st.phase != Some(MaintenancePhase::Succeeded);
        st.phase = Some(MaintenancePhase::Succeeded);
        st.drain_progress = 100;
        st.pending_pods.clear();
        st.pending_pods_refs.clear();
        st.last_error.clear();
        write_status(ctx, nm, st).await?;
        if newly {
            tracing::info!(nodemaintenance = %name, node = %node_name, "node drained: maintenance succeeded");
        }
        return Ok(Action::requeue(REQUEUE_HOLD));
    }

    st.pending_pods = still_there.iter().map(|p| p.name_any()).collect();
    st.pending_pods_refs = drain::references(&still_there);
    st.drain_progress = crate::classify::drain_progress(st.eviction_pods, still_there.len() as i64);
    let blocked = drain::blocker_summary(&node_name, &outcomes);
    let requeue = if blocked.is_some() {
        REQUEUE_BLOCKED
    } else {
        REQUEUE_TERMINATING
    };
    st.last_error = blocked.unwrap_or_default();
    write_status(ctx, nm, st).await?;
    Ok(Action::requeue(requeue))
}

async fn ensure_owner_reference(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    node: &Node,
) -> Result<(), Error> {
    let uid = node.metadata.uid.clone().unwrap_or_default();
    let mut refs = nm.metadata.owner_references.clone().unwrap_or_default();
    if refs.iter().any(|r| r.kind == "Node" && r.uid == uid) {
        return Ok(());
    }
    refs.retain(|r| r.kind != "Node");
    refs.push(OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.name_any(),
        uid,
        controller: Some(false),
        block_owner_deletion: Some(false),
    });
    let name = nm.name_any();
    Api::<NodeMaintenance>::all(ctx.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "ownerReferences": refs,
                "resourceVersion": nm.metadata.resource_version
            }})),
        )
        .await
        .map(|updated| *nm = updated)
        .map_err(|source| Error::NodeMaintenance { name, source })
}

async fn patch_node(
    ctx: &Ctx,
    node: &str,
    ops: Vec<Value>,
    action: &'static str,
) -> Result<(), Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(|e| Error::Node {
            action,
            node: node.to_string(),
            source: kube::Error::SerdeError(e),
        })?;
    Api::<Node>::all(ctx.client.clone())
        .patch(node, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
        .map_err(|source| match &source {
            // The patch opens with a `test` of the taints we read: 422 (or a
            // 409) means the node moved on since, not that the request was wrong.
            kube::Error::Api(s) if s.code == 422 || s.code == 409 => Error::NodeChanged {
                node: node.to_string(),
            },
            _ => Error::Node {
                action,
                node: node.to_string(),
                source,
            },
        })
}

/// Take our taints, cordon and label off the node and say so on the Node.
async fn restore_node(ctx: &Ctx, node: &Node) -> Result<(), Error> {
    if let Some(ops) = node::exit_patch(node) {
        patch_node(ctx, &node.name_any(), ops, "give back").await?;
    }
    ctx.events.on(node, EVENT_UNCORDON_NODE).await;
    Ok(())
}

async fn cleanup(nm: &NodeMaintenance, ctx: &Ctx) -> Result<Action, Error> {
    let name = nm.name_any();
    let node_name = nm.spec.node_name.clone();
    // The cache can hand us an object whose cleanup already finished (our own
    // node patch re-queues it): check the live object so events are not doubled.
    match Api::<NodeMaintenance>::all(ctx.client.clone())
        .get_opt(&name)
        .await
    {
        Ok(Some(live)) if live.finalizers().iter().any(|f| f == FINALIZER) => {}
        Ok(_) => return Ok(Action::await_change()),
        Err(source) => return Err(Error::NodeMaintenance { name, source }),
    }
    // Only an admitted maintenance touched the node; Pending, duplicate and
    // failed ones (already restored) leave it alone.
    let touched = matches!(
        nm.phase(),
        Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
    );
    if touched {
        match Api::<Node>::all(ctx.client.clone())
            .get_opt(&node_name)
            .await
        {
            Ok(Some(node)) => restore_node(ctx, &node).await?,
            Ok(None) => {
                tracing::info!(nodemaintenance = %name, node = %node_name, "node already gone")
            }
            Err(source) => {
                return Err(Error::Node {
                    action: "read",
                    node: node_name,
                    source,
                });
            }
        }
        ctx.leases.release(&node_name).await?;
        tracing::info!(nodemaintenance = %name, node = %node_name, "maintenance ended: node given back, lease released");
    }
    ctx.metrics.forget(&name, &node_name);
    ctx.events.on(nm, EVENT_REMOVED_MAINTENANCE).await;
    Ok(Action::await_change())
}
