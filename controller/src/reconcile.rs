//! The NodeMaintenance reconciler: fetches what a decision needs, asks
//! `plan` what to do, and carries it out against the API server. The
//! decisions themselves (lifecycle, admission, lease rule, drain bookkeeping,
//! events) are pure functions in plan.rs.

use std::sync::Arc;

use futures::FutureExt as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use shared::consts::{
    EVENT_BEGIN_MAINTENANCE, EVENT_REMOVED_MAINTENANCE, EVENT_UNCORDON_NODE, FINALIZER,
};
use shared::{DrainTimeoutAction, NodeMaintenance, NodeMaintenanceStatus};

use crate::conditions::{self, Cause};
use crate::conflicts::ConflictStreaks;
use crate::drain::{self, PodOutcome};
use crate::drain_wakes::WatchedNodes;
use crate::events::Events;
use crate::leadership::Leadership;
use crate::metrics::{Metrics, ReconcileResult};
use crate::node;
use crate::node_cache::NodeCache;
use crate::node_lease::{LeaseError, NodeLeases};
use crate::own_writes::{Current, OwnWrites};
use crate::plan::{self, Admission, LeaseOutcome, LeaseStep, Lifecycle};
use shared::slots;

/// When to reconcile again: `None` waits for a change (kube's
/// `Action::await_change`), `Some(d)` comes back after `d`.
type Requeue = Option<Duration>;

/// Reconciles running at once (kube's default is unlimited; upstream's
/// controller-runtime runs one). Each is short and bounded by
/// RECONCILE_TIMEOUT, so many maintenances progress side by side.
pub const MAX_CONCURRENT_RECONCILES: u16 = 32;

/// Upper bound of one reconcile (upstream bounds one drain attempt by 30 s).
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(shared::consts::DRAIN_ATTEMPT_TIMEOUT_SECS);

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
    /// The API server refused the node patch itself (not a conflict): a
    /// ValidatingAdmissionPolicy, an admission webhook or the node's
    /// validation. Reported on the object (lastError, Blocked, a Warning
    /// event) and retried.
    #[error(
        "the API server refused the controller's patch of node {node} ({action}): {message}; \
         an admission policy or webhook refusing updates of this node is the usual cause: \
         let the controller's node patches through (the controller retries until one is accepted)"
    )]
    NodeRefused {
        action: &'static str,
        node: String,
        /// The API server's words.
        message: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to {action} NodeMaintenance {name}: {source}")]
    NodeMaintenance {
        action: &'static str,
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
    /// A bug: the reconcile panicked. Recorded on the object (see
    /// [`record_panic`]); the process and the other maintenances go on.
    #[error("{0}")]
    Panicked(String),
}

impl Error {
    /// A write refused because our copy of the object was outdated (HTTP 409).
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::NodeMaintenance { source, .. } => {
                matches!(source, kube::Error::Api(s) if s.code == 409)
            }
            Error::NodeChanged { .. } => true,
            _ => false,
        }
    }

    /// The NodeMaintenance itself is gone (HTTP 404 on it): someone removed
    /// its finalizer while we worked on it.
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::NodeMaintenance { source: kube::Error::Api(s), .. } if s.code == 404)
    }

    /// Label for the error metric and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Node { .. } => "node",
            Error::NodeChanged { .. } => "node_changed",
            Error::NodeRefused { .. } => "node_refused",
            Error::NodeMaintenance { .. } => "nodemaintenance",
            Error::Pods(_) => "pods",
            Error::Lease(_) => "lease",
            Error::Timeout(_) => "timeout",
            Error::Panicked(_) => "panic",
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
    /// Our last write of each NodeMaintenance (read-your-writes).
    pub own_writes: OwnWrites,
    /// When to look again while something blocks (--blocked-retry-interval).
    pub blocked_retry: Duration,
    /// The nodes of the maintenances, as the node watch sees them.
    pub node_cache: NodeCache,
    /// The nodes whose pods' departures are watched (`drain_wakes`).
    pub departures_watched: WatchedNodes,
    /// `--allow-force-drain`: whether drainTimeoutAction Force may delete pods.
    pub allow_force_drain: bool,
    /// Slot admissions decided here that the cache may not show yet.
    pub admissions: slots::Admissions,
}

impl Ctx {
    /// NodeMaintenance `name` is gone (whoever removed its finalizer): drop
    /// what was kept for it, and the cached nodes no maintenance names.
    pub fn forget_maintenance(&self, name: &str) {
        self.own_writes.forget(name);
        self.conflicts.clear(name);
        self.admissions.forget(name);
        let named: std::collections::HashSet<String> = self
            .store
            .state()
            .iter()
            .map(|nm| nm.spec.node_name.clone())
            .collect();
        self.node_cache.retire_unnamed(&named);
        self.leases.forget_unnamed(&named);
    }

    pub fn new(
        cfg: &crate::config::Config,
        clients: crate::serving::Clients,
        store: Store<NodeMaintenance>,
        metrics: Metrics,
        leadership: &Leadership,
    ) -> Ctx {
        drain::set_migration_warning_after(cfg.migration_warning_after);
        let client = clients.api;
        Ctx {
            events: Events::new(client.clone(), crate::leadership::instance_name()),
            leases: NodeLeases::new(client.clone(), cfg.lease_namespace.clone()),
            client,
            evict_client: clients.evict,
            store,
            metrics,
            max_concurrent_maintenances: cfg.max_concurrent_maintenances,
            max_concurrent_evictions: cfg.max_concurrent_evictions,
            leadership: leadership.clone(),
            conflicts: ConflictStreaks::default(),
            own_writes: OwnWrites::default(),
            blocked_retry: cfg.blocked_retry_interval,
            node_cache: NodeCache::default(),
            departures_watched: WatchedNodes::default(),
            allow_force_drain: cfg.allow_force_drain,
            admissions: slots::Admissions::default(),
        }
    }

    /// We wrote NodeMaintenance `name` from version `based_on` and got
    /// `written` back. The watch may have delivered it already (then
    /// [`Ctx::cache_saw`] found nothing to drop): the cache decides.
    fn wrote(&self, name: &str, based_on: Option<&str>, written: &NodeMaintenance) {
        self.own_writes.wrote(name, based_on, written);
        if let Some(cached) = self
            .store
            .get(&kube::runtime::reflector::ObjectRef::new(name))
        {
            self.own_writes.seen(&cached);
        }
    }

    /// The NodeMaintenance watch delivered `nm` (the cache holds it now):
    /// drop what only bridged the cache's lag.
    pub fn cache_saw(&self, nm: &NodeMaintenance) {
        self.own_writes.seen(nm);
        self.admissions.seen(
            &nm.name_any(),
            nm.status.as_ref().and_then(|s| s.phase.as_ref()),
        );
    }

    /// What this process keeps in memory per maintenance or node, by store
    /// (`nmo_controller_kept_entries`): each goes back to 0 once no
    /// maintenance of this controller is left.
    pub fn kept_entries(&self) -> [(&'static str, usize); 6] {
        [
            ("node_cache", self.node_cache.len()),
            ("own_writes", self.own_writes.len()),
            ("conflict_streaks", self.conflicts.len()),
            ("node_leases", self.leases.kept()),
            ("departures_watched", self.departures_watched.len()),
            ("admissions", self.admissions.len()),
        ]
    }

    /// NodeMaintenance `name` as the API server has it now (None: gone).
    async fn read_live(&self, name: &str) -> Result<Option<NodeMaintenance>, Error> {
        self.nms()
            .get_opt(name)
            .await
            .map_err(|source| Error::NodeMaintenance {
                action: "read",
                name: name.to_string(),
                source,
            })
    }

    fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.client.clone())
    }
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
}

pub async fn reconcile(nm: Arc<NodeMaintenance>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // A standby keeps its caches warm and touches nothing; winning the Lease
    // reconciles everything in the cache (see leadership.rs).
    let name = nm.name_any();
    if !ctx.leadership.is_leading() {
        ctx.metrics.queue.forget(&name);
        return Ok(Action::await_change());
    }
    let timer = ctx.metrics.reconcile_started(&name);
    // kube's client waits up to 295 s on a request (sized for watches); one
    // hung request must not hold this NodeMaintenance for minutes. Every step
    // is idempotent and every write is version-checked, so cutting a
    // reconcile short and retrying is safe.
    // A panic (a bug) is caught here: kube-runtime would re-raise it and end
    // the process, and a restarted one would meet the same object again.
    let guarded = std::panic::AssertUnwindSafe(async {
        // Never act on a cached copy older than our own last write.
        let current = match ctx
            .own_writes
            .current(&name, nm.metadata.resource_version.as_deref())
        {
            Current::Cached => (*nm).clone(),
            Current::Ours(latest) => *latest,
            Current::ReadLive => match ctx.read_live(&name).await? {
                Some(live) => live,
                None => return Ok(None),
            },
        };
        match step(current, &ctx).await {
            // Our copy came from the watch cache and the API server holds a
            // newer one (the cache lags, e.g. while a watch reconnects after
            // an API server restart): decide again on the live object now,
            // rather than retrying on the same stale copy until the cache
            // catches up.
            Err(e) if e.is_conflict() => match ctx.read_live(&name).await? {
                Some(live) => {
                    tracing::debug!(nodemaintenance = %name, "stale NodeMaintenance in cache; deciding again on a fresh read");
                    step(live, &ctx).await
                }
                None => Ok(None),
            },
            other => other,
        }
    })
    .catch_unwind();
    let result = match tokio::time::timeout(RECONCILE_TIMEOUT, guarded).await {
        Err(_) => Err(Error::Timeout(RECONCILE_TIMEOUT)),
        Ok(Ok(result)) => result,
        Ok(Err(payload)) => {
            let deleting = nm.metadata.deletion_timestamp.is_some();
            let text = plan::msg_internal_error(&name, &panic_message(payload.as_ref()), deleting);
            tracing::error!(nodemaintenance = %name, node = %nm.spec.node_name, error = %text,
                "reconcile panicked: recording it on the object");
            record_panic(&ctx, &nm, &text).await;
            Err(Error::Panicked(text))
        }
    };
    let result = match result {
        // Gone under us: nothing to retry, and what this reconcile kept for
        // it (a node it just patched) goes now.
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

/// The text of a panic's payload (`panic!` with a message gives a `&str`
/// or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// After a panic: a maintenance that is not being deleted fails for good
/// (phase Failed, lastError, the Failed condition with reason InternalError,
/// FailedMaintenance), its node given back and its lease released, as any
/// other final failure; one being deleted keeps retrying its cleanup, with
/// lastError and a Warning event saying why. Best effort: a failure or
/// panic here is only logged.
async fn record_panic(ctx: &Ctx, nm: &NodeMaintenance, text: &str) {
    let record = std::panic::AssertUnwindSafe(async {
        let name = nm.name_any();
        let mut live = match ctx.nms().get_opt(&name).await {
            Ok(Some(live)) => live,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(nodemaintenance = %name, error = %e, "could not read it to record the panic");
                return;
            }
        };
        let status = status_of(&live);
        if live.metadata.deletion_timestamp.is_some() {
            ctx.events.warn(&live, EVENT_RECONCILE_PANICKED, text).await;
            let mut st = status.clone();
            st.last_error = text.to_string();
            let why = Why::new(Cause::InternalError, false);
            if let Err(e) = write_status(ctx, &mut live, st, why).await {
                tracing::warn!(nodemaintenance = %name, error = %e, "could not record the panic");
            }
            return;
        }
        if status.phase == Some(shared::MaintenancePhase::Failed) {
            return;
        }
        let node_name = live.spec.node_name.clone();
        if plan::touched_node(status.phase.as_ref()) {
            match ctx.nodes().get_opt(&node_name).await {
                Ok(Some(node)) => {
                    if let Err(e) = restore_node(ctx, &node).await {
                        tracing::warn!(nodemaintenance = %name, node = %node_name, error = %e, "could not give the node back after the panic");
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(nodemaintenance = %name, node = %node_name, error = %e, "could not read the node to give it back after the panic");
                }
            }
            if let Err(e) = ctx.leases.release(&node_name).await {
                tracing::warn!(nodemaintenance = %name, node = %node_name, error = %e, "could not release the lease after the panic");
            }
        }
        let st = plan::failed(&status, text.to_string());
        if let Err(e) = write_status(ctx, &mut live, st, Why::new(Cause::InternalError, false)).await {
            tracing::warn!(nodemaintenance = %name, error = %e, "could not record the panic");
        }
    })
    .catch_unwind();
    if record.await.is_err() {
        tracing::error!(nodemaintenance = %nm.name_any(), "recording the panic panicked as well");
    }
}

/// One reconcile of `nm`, by where it is in its life.
async fn step(mut nm: NodeMaintenance, ctx: &Ctx) -> Result<Requeue, Error> {
    // The panic of the unit test `a_panic_is_recorded_and_the_controller_goes_on`.
    #[cfg(test)]
    if nm.spec.reason == tests::PANIC_REASON {
        panic!("injected by the test");
    }
    // A live read carries them; the copy is held for the whole round.
    shared::lean::forget_managed_fields(&mut nm.metadata);
    let has_finalizer = nm.finalizers().iter().any(|f| f == FINALIZER);
    match plan::lifecycle(has_finalizer, nm.metadata.deletion_timestamp.is_some()) {
        Lifecycle::AddFinalizer => {
            let mut finalizers = nm.finalizers().to_vec();
            finalizers.push(FINALIZER.to_string());
            let nm = set_finalizers(ctx, &nm, finalizers).await?;
            ctx.events.on(&nm, EVENT_BEGIN_MAINTENANCE).await;
            // The finalizer change comes back through the watch.
            Ok(None)
        }
        Lifecycle::Apply => apply(nm, ctx).await,
        Lifecycle::Cleanup => cleanup(nm, ctx).await,
        Lifecycle::Done => Ok(None),
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

fn status_of(nm: &NodeMaintenance) -> NodeMaintenanceStatus {
    nm.status.clone().unwrap_or_default()
}

/// Why a status is written, for its conditions: the cause, whether the node
/// is in maintenance, and whether lastUpdate must move even if nothing else
/// did (a blocked retry: runbooks watch its freshness).
#[derive(Debug, Clone)]
struct Why {
    cause: Cause,
    /// What made the maintenance fail, for the Failed condition's message
    /// (the last lease error; lastError keeps upstream's text).
    failure_cause: Option<String>,
    cordoned: bool,
    /// Pods KubeVirt is live-migrating away (named in Drained's message).
    migrating: usize,
    refresh: bool,
}

impl Why {
    fn new(cause: Cause, cordoned: bool) -> Why {
        Why {
            cause,
            failure_cause: None,
            cordoned,
            migrating: 0,
            refresh: false,
        }
    }
    fn refreshed(self) -> Why {
        Why {
            refresh: true,
            ..self
        }
    }
}

/// DrainBlocked (Warning): the pods in the way changed (not on every retry).
const EVENT_DRAIN_BLOCKED: &str = "DrainBlocked";
/// PodForceDeleted (Warning): a pod deleted without eviction (drainTimeoutAction: Force).
const EVENT_POD_FORCE_DELETED: &str = "PodForceDeleted";
/// ReconcilePanicked (Warning): the cleanup of a deleted maintenance panicked (a bug).
const EVENT_RECONCILE_PANICKED: &str = "ReconcilePanicked";
/// NodeUpdateRefused (Warning): the API server refused the controller's node
/// patch (admission policy or webhook); once per refusal, not per retry.
const EVENT_NODE_UPDATE_REFUSED: &str = "NodeUpdateRefused";

/// Write the finalizer list, checked against the version we read.
async fn set_finalizers(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    finalizers: Vec<String>,
) -> Result<NodeMaintenance, Error> {
    let field = json!({ "finalizers": finalizers });
    patch_metadata(ctx, nm, field, "update the finalizer of").await
}

/// Merge `fields` into the metadata of `nm`, checked against the version we
/// read (a stale copy gets 409 and is decided again), and remember the
/// version written (read-your-writes).
async fn patch_metadata(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    mut fields: Value,
    action: &'static str,
) -> Result<NodeMaintenance, Error> {
    let name = nm.name_any();
    let based_on = nm.metadata.resource_version.clone();
    fields["resourceVersion"] = json!(based_on);
    let mut written = ctx
        .nms()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": fields })),
        )
        .await
        .map_err(|source| Error::NodeMaintenance {
            action,
            name: name.clone(),
            source,
        })?;
    shared::lean::forget_managed_fields(&mut written.metadata);
    ctx.wrote(&name, based_on.as_deref(), &written);
    Ok(written)
}

/// Write `new` as the status when [`plan::needs_write`] says so, with a fresh
/// lastUpdate. Cleared fields are sent as null so a merge patch really removes
/// them. The patch carries the resourceVersion we read: if the cache handed us
/// a stale object the API server answers 409 and we decide again, instead of
/// writing bookkeeping computed from old state. The event of a phase
/// transition follows the write, so a retried reconcile never repeats it.
async fn write_status(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    mut new: NodeMaintenanceStatus,
    why: Why,
) -> Result<(), Error> {
    let old = status_of(nm);
    let now = Time(Timestamp::now());
    new.conditions = conditions::conditions(
        &old.conditions,
        &new,
        why.cause,
        why.cordoned,
        why.migrating,
        nm.metadata.generation,
        &now,
    );
    if let Some(cause) = &why.failure_cause {
        conditions::add_failure_cause(&mut new.conditions, cause);
    }
    if !plan::needs_write(&old, &new, why.refresh) {
        return Ok(());
    }
    new.last_update = Some(now);
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
            "forceDeletedPods",
            "conditions",
        ] {
            map.entry(field).or_insert(Value::Null);
        }
    }
    let name = nm.name_any();
    let based_on = nm.metadata.resource_version.clone();
    *nm = ctx
        .nms()
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": nm.metadata.resource_version},
                "status": body
            })),
        )
        .await
        .map_err(|source| Error::NodeMaintenance {
            action: "write the status of",
            name,
            source,
        })?;
    shared::lean::forget_managed_fields(&mut nm.metadata);
    ctx.wrote(&nm.name_any(), based_on.as_deref(), nm);
    if new.phase == Some(shared::MaintenancePhase::Failed)
        && old.phase != Some(shared::MaintenancePhase::Failed)
    {
        // Failed is final and the node was given back: its cache entry goes.
        ctx.node_cache.retire(&nm.spec.node_name);
    }
    if let Some(event) = plan::transition_event(&old, &new) {
        ctx.events.on(nm, event).await;
    }
    if let Some(blockers) = conditions::drain_blocked_news(&old.conditions, &new.conditions) {
        ctx.events.warn(nm, EVENT_DRAIN_BLOCKED, blockers).await;
    }
    // The per-maintenance gauges follow the watch (watches.rs).
    Ok(())
}

fn slot_entries(store: &Store<NodeMaintenance>) -> Vec<slots::Entry> {
    store.state().iter().map(|o| slots::Entry::of(o)).collect()
}

async fn apply(mut nm: NodeMaintenance, ctx: &Ctx) -> Result<Requeue, Error> {
    let status = status_of(&nm);
    let slot = ctx.admissions.decide(
        &slots::Entry::of(&nm),
        &slot_entries(&ctx.store),
        ctx.max_concurrent_maintenances,
    );
    let node_name = nm.spec.node_name.clone();
    let first_sight = match plan::admit(&status, &slot, &nm.name_any(), &node_name) {
        Admission::Final => return Ok(None),
        Admission::Fail(st) => {
            tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, error = %st.last_error, "maintenance failed");
            let why = Why::new(Cause::DuplicateMaintenance, false);
            write_status(ctx, &mut nm, st, why).await?;
            return Ok(None);
        }
        Admission::Wait(st) => {
            let why = Why::new(Cause::WaitingForSlot, false);
            write_status(ctx, &mut nm, st, why).await?;
            return Ok(Some(plan::REQUEUE_PENDING));
        }
        Admission::Proceed { first_sight } => first_sight,
    };
    // The node is looked up only once admitted: a queue of waiting
    // maintenances costs no API requests.
    let Some(node) = read_node(ctx, &node_name).await? else {
        // The node went away under a maintenance that held it: nothing to
        // restore, but its lease is ours to give back (Failed is final).
        if plan::touched_node(status.phase.as_ref()) {
            give_back(ctx, &node_name, None).await?;
        }
        let st = plan::node_missing(&status, &node_name);
        tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, "node not found: maintenance failed");
        write_status(ctx, &mut nm, st, Why::new(Cause::NodeNotFound, false)).await?;
        return Ok(None);
    };
    match maintain(&mut nm, &node, first_sight, ctx).await {
        Ok(action) => Ok(action),
        // A conflict is no news for the user: reconcile decides again on a fresh read.
        Err(e) if e.is_conflict() => Err(e),
        Err(e) => {
            // Keep the reason visible on the object, as upstream does, on top
            // of the latest status written this round (never an older copy).
            let mut st = status_of(&nm);
            st.last_error = e.to_string();
            let cordoned = node::is_in_maintenance(&node);
            let refused = matches!(e, Error::NodeRefused { .. });
            let why = if refused {
                // A standing refusal: lastUpdate shows the retries go on.
                Why::new(Cause::NodeUpdateRefused, cordoned).refreshed()
            } else {
                Why::new(Cause::ReconcileError, cordoned)
            };
            let before = status_of(&nm).conditions;
            match write_status(ctx, &mut nm, st, why).await {
                Ok(()) if refused => {
                    // One Warning when the refusal is new or its words change.
                    let after = status_of(&nm).conditions;
                    if let Some(msg) =
                        conditions::blocked_news(&before, &after, Cause::NodeUpdateRefused)
                    {
                        ctx.events.warn(&nm, EVENT_NODE_UPDATE_REFUSED, msg).await;
                    }
                }
                Ok(()) => {}
                Err(we) => {
                    tracing::warn!(nodemaintenance = %nm.name_any(), error = %we, "could not record lastError");
                }
            }
            Err(e)
        }
    }
}

/// The node, from the node cache when a reconcile read it before (the watch
/// keeps it current), else live. Only a live read says a node is gone.
async fn read_node(ctx: &Ctx, name: &str) -> Result<Option<Node>, Error> {
    if let Some(node) = ctx.node_cache.get(name) {
        return Ok(Some(node));
    }
    let node = ctx
        .nodes()
        .get_opt(name)
        .await
        .map_err(|source| Error::Node {
            action: "read",
            node: name.to_string(),
            source,
        })?;
    if let Some(node) = &node {
        ctx.node_cache.put(node);
    }
    Ok(node)
}

/// An admitted maintenance on an existing node: the starting point, the
/// lease, the node's state, one drain round. `nm` follows every write.
async fn maintain(
    nm: &mut NodeMaintenance,
    node: &Node,
    first_sight: bool,
    ctx: &Ctx,
) -> Result<Requeue, Error> {
    let node_name = node.name_any();
    ensure_owner_reference(ctx, nm, node).await?;
    let mut listed = None;
    if first_sight {
        // Persist the starting point before anything moves: if this write
        // loses to a newer object version, nothing was evicted on stale counts.
        let pods = drain::list_node_pods(&ctx.client, &node_name).await?;
        let st = plan::begin(
            &status_of(nm),
            pods.total,
            drain::references(&pods.must_leave),
        );
        let why = Why::new(Cause::Progress, node::is_in_maintenance(node));
        write_status(ctx, nm, st, why).await?;
        listed = Some(pods);
    }

    // The optional drain deadline (beyond upstream), counted from the cordon,
    // only while draining; judged before anything touches the node, on the
    // node as read, so giving it back undoes exactly what is there.
    let deadline = drain_deadline(nm, ctx.allow_force_drain);
    if let (plan::Deadline::Passed(DrainTimeoutAction::Fail), Some(t)) =
        (deadline, drain_timeout(nm))
    {
        let mut st = plan::timed_out(&status_of(nm), t, &node_name);
        if nm.spec.drain_timeout_action == Some(DrainTimeoutAction::Force) {
            st.last_error.push_str(plan::FORCE_NOT_ALLOWED_NOTE);
        }
        tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, error = %st.last_error,
            "drain deadline passed: giving the node back");
        give_back(ctx, &node_name, Some(node)).await?;
        write_status(ctx, nm, st, Why::new(Cause::DrainTimeout, false)).await?;
        return Ok(None);
    }

    // The lease comes before anything touches the node.
    let (outcome, cause) = match ctx.leases.request(node).await {
        Ok(()) => (LeaseOutcome::Held, Cause::Progress),
        Err(LeaseError::HeldByOther(holder)) => {
            // Counted (a warning) once draining started; before, only waited for.
            let lease = format!(
                "{}/{}",
                ctx.leases.namespace(),
                shared::consts::lease_name(&node_name)
            );
            if status_of(nm).drain_progress > 0 {
                tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, %lease, %holder,
                    "lease held by another operator after draining started: counted, retried");
            } else {
                tracing::info!(nodemaintenance = %nm.name_any(), node = %node_name, %lease, %holder,
                    "lease held by another operator: waiting for it");
            }
            (LeaseOutcome::HeldByOther(holder), Cause::LeaseHeldByOther)
        }
        Err(e) => {
            let lease = format!(
                "{}/{}",
                ctx.leases.namespace(),
                shared::consts::lease_name(&node_name)
            );
            tracing::warn!(nodemaintenance = %nm.name_any(), node = %node_name, %lease, error = %e, attempts = status_of(nm).error_on_lease_count.saturating_add(1),
                "lease error: counted, retried");
            (LeaseOutcome::Failed(e.to_string()), Cause::LeaseError)
        }
    };
    let st = match plan::after_lease(&status_of(nm), outcome) {
        LeaseStep::Proceed(st) => st,
        LeaseStep::Retry(st) => {
            let why = Why::new(cause, node::is_in_maintenance(node)).refreshed();
            write_status(ctx, nm, st, why).await?;
            return Ok(Some(ctx.blocked_retry));
        }
        LeaseStep::GiveUp { status: st, cause } => {
            tracing::error!(nodemaintenance = %nm.name_any(), node = %node_name, error = %st.last_error,
                last_lease_error = %cause, "lease lost for good: giving the node back");
            give_back(ctx, &node_name, Some(node)).await?;
            let why = Why {
                failure_cause: Some(cause),
                ..Why::new(Cause::LeaseLost, false)
            };
            write_status(ctx, nm, st, why).await?;
            return Ok(None);
        }
    };

    if let Some(ops) = node::enter_patch(node) {
        patch_node(ctx, &node_name, ops, "put into maintenance").await?;
        tracing::info!(nodemaintenance = %nm.name_any(), node = %node_name, "node cordoned, tainted and excluded from remediation");
    }

    let (round, mut left) = drain_round(ctx, &node_name, listed).await?;
    let mut st = st;
    if deadline == plan::Deadline::Passed(DrainTimeoutAction::Force) {
        // A VM being live-migrated is left to finish: deleting its pod
        // would kill the VM.
        left.retain(|p| {
            p.metadata.deletion_timestamp.is_none() && !round.migrating.contains(&p.reference())
        });
        force_delete(ctx, nm, &node_name, &left, &mut st).await;
    }
    let cause = if round.blocker.is_some() {
        Cause::EvictionBlocked
    } else {
        Cause::Progress
    };
    let migrating = round.migrating.len();
    let next = plan::after_round(&st, round, ctx.blocked_retry);
    let done = next.status.phase == Some(shared::MaintenancePhase::Succeeded)
        && st.phase != Some(shared::MaintenancePhase::Succeeded);
    let mut why = Why::new(cause, true);
    why.refresh = next.refresh;
    why.migrating = migrating;
    write_status(ctx, nm, next.status, why).await?;
    if done {
        tracing::info!(nodemaintenance = %nm.name_any(), node = %node_name, "node drained: maintenance succeeded");
    }
    let requeue = match deadline {
        plan::Deadline::Ahead(left) => next.requeue.min(left),
        _ => next.requeue,
    };
    Ok(Some(requeue))
}

/// Where a Running maintenance stands against its `spec.drainTimeout`
/// (counted from the Cordoned condition); anything else is unbounded.
/// `allow_force`: `--allow-force-drain`; without it Force acts as Fail.
fn drain_deadline(nm: &NodeMaintenance, allow_force: bool) -> plan::Deadline {
    let st = status_of(nm);
    if st.phase != Some(shared::MaintenancePhase::Running) {
        return plan::Deadline::Unbounded;
    }
    let action = match nm.spec.drain_timeout_action.unwrap_or_default() {
        DrainTimeoutAction::Force if !allow_force => DrainTimeoutAction::Fail,
        action => action,
    };
    let since = conditions::true_since(&st.conditions, conditions::CORDONED).map(|t| t.0);
    plan::deadline(drain_timeout(nm), action, since, Timestamp::now())
}

/// `spec.drainTimeout`, if set and valid (the CRD's pattern admits only Go
/// durations; anything else is logged and ignored, i.e. no deadline).
fn drain_timeout(nm: &NodeMaintenance) -> Option<Duration> {
    let text = nm.spec.drain_timeout.as_deref()?;
    match shared::duration::parse(text) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!(nodemaintenance = %nm.name_any(), error = %e, "spec.drainTimeout ignored");
            None
        }
    }
}

/// The deadline passed and the object asked for Force: delete the pods
/// still on the node without eviction (PodDisruptionBudgets bypassed, each
/// pod's own grace period kept), each named in a Warning event and in
/// `status.forceDeletedPods`. The uid precondition never deletes a pod
/// recreated under the same name elsewhere.
async fn force_delete(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    node: &str,
    pods: &[drain::LeavingPod],
    st: &mut NodeMaintenanceStatus,
) {
    for pod in pods {
        let ns = pod.namespace();
        let name = pod.name();
        let params = DeleteParams {
            preconditions: pod.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), &ns);
        match api.delete(&name, &params).await {
            Ok(_) => {
                let msg = format!(
                    "deleted pod {ns}/{name} from node {node} without eviction: spec.drainTimeout {} passed (drainTimeoutAction: Force)",
                    nm.spec.drain_timeout.as_deref().unwrap_or_default()
                );
                tracing::warn!(nodemaintenance = %nm.name_any(), pod = %format!("{ns}/{name}"), "{msg}");
                ctx.events.warn(nm, EVENT_POD_FORCE_DELETED, &msg).await;
                let r = shared::PodReference {
                    namespace: ns.clone(),
                    name: name.clone(),
                };
                if !st.force_deleted_pods.contains(&r) {
                    st.force_deleted_pods.push(r);
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                tracing::warn!(nodemaintenance = %nm.name_any(), pod = %format!("{ns}/{name}"), error = %e,
                "force deletion failed; retrying next round. Check the controller may delete pods")
            }
        }
    }
}

/// Evict what must leave the node (concurrently, bounded) and report what is
/// still there and why. `listed`: the pods as the first sight of this
/// maintenance listed them moments ago (before the cordon), evicted without
/// listing again; a round that would find nothing left on that list lists
/// again, so Succeeded always rests on a list taken after the cordon.
async fn drain_round(
    ctx: &Ctx,
    node_name: &str,
    listed: Option<drain::NodePods>,
) -> Result<(plan::Round, Vec<drain::LeavingPod>), Error> {
    let mut listed = listed.filter(|p| !p.must_leave.is_empty());
    loop {
        let reused = listed.is_some();
        let pods = match listed.take() {
            Some(pods) => pods,
            None => drain::list_node_pods(&ctx.client, node_name).await?,
        };
        let outcomes = drain::evict_all(
            &ctx.evict_client,
            &pods.must_leave,
            ctx.max_concurrent_evictions,
            tokio::time::Instant::now() + drain::EVICTION_BUDGET,
        )
        .await;
        for o in outcomes.values() {
            // A terminating pod got no eviction request this round.
            if !matches!(o, PodOutcome::Terminating(_) | PodOutcome::Stuck { .. }) {
                ctx.metrics.eviction(drain::outcome_label(o));
            }
        }
        let left: Vec<_> = pods
            .must_leave
            .into_iter()
            .filter(|p| outcomes.get(&p.reference()) != Some(&PodOutcome::Gone))
            .collect();
        if reused && left.is_empty() {
            continue; // "nothing left" needs a list taken after the cordon
        }
        let on_their_way = left.iter().all(|p| {
            matches!(
                outcomes.get(&p.reference()),
                Some(PodOutcome::Evicted | PodOutcome::Terminating(_))
            )
        });
        let round = plan::Round {
            remaining: drain::references(&left),
            blocker: drain::blocker_summary(node_name, &outcomes),
            migrating: drain::migrating(&outcomes),
            departures_watched: !left.is_empty()
                && on_their_way
                && ctx.departures_watched.contains(node_name),
        };
        return Ok((round, left));
    }
}

async fn ensure_owner_reference(
    ctx: &Ctx,
    nm: &mut NodeMaintenance,
    node: &Node,
) -> Result<(), Error> {
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
        return Ok(());
    }
    refs.retain(|r| r.kind != "Node");
    refs.push(wanted);
    let field = json!({ "ownerReferences": refs });
    *nm = patch_metadata(ctx, nm, field, "set the Node owner reference of").await?;
    Ok(())
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
    let result = ctx
        .nodes()
        .patch(node, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await;
    match &result {
        Ok(written) => ctx.node_cache.wrote(written),
        // Whatever went wrong, the next attempt starts from a live read.
        Err(_) => ctx.node_cache.forget(node),
    }
    result
        .map(|_| ())
        .map_err(|source| node_patch_error(node, action, source))
}

/// What the API server says when a JSON patch cannot be applied to the
/// stored object, a failed `test` operation included: apiserver's
/// patch.go answers `NewGenericServerResponse(422, ...)`, which drops the
/// patch library's own words ("testing value /spec/taints failed") and
/// leaves this text, reason Invalid, no details.
const JSON_PATCH_NOT_APPLICABLE: &str =
    "the server rejected our request due to an error in our request";

/// Whether the answer to a node JSON patch says the node moved on since we
/// read it: a 409, or the 422 of a patch that no longer applies (our patch
/// opens with a `test` of the taints we read). Any other 422 is a refusal:
/// a ValidatingAdmissionPolicy (`nodes "x" is forbidden:
/// ValidatingAdmissionPolicy '...' with binding '...' denied request: ...`)
/// or the node's validation (`Node "x" is invalid: ...`) answer 422 with
/// reason Invalid too, but with their own message and details.
fn node_moved_on(s: &kube::core::Status) -> bool {
    s.code == 409
        || (s.code == 422
            && s.message == JSON_PATCH_NOT_APPLICABLE
            && s.details.as_ref().is_none_or(|d| d.causes.is_empty()))
}

/// The error of a failed node patch: a conflict (decided again on a fresh
/// read), a refusal (400: an admission webhook's default; 403: a policy or
/// webhook answering Forbidden, or RBAC; 422: a policy or the node's
/// validation), or anything else (the API server unreachable, busy, ...).
fn node_patch_error(node: &str, action: &'static str, source: kube::Error) -> Error {
    match &source {
        kube::Error::Api(s) if node_moved_on(s) => Error::NodeChanged {
            node: node.to_string(),
        },
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => Error::NodeRefused {
            action,
            node: node.to_string(),
            message: s.message.clone(),
            source,
        },
        _ => Error::Node {
            action,
            node: node.to_string(),
            source,
        },
    }
}

/// Take our taints, cordon and label off the node; say UncordonNode on the
/// Node only when that changed something (a retried cleanup finds the node
/// already given back and says nothing).
/// The one way a maintenance ends for its node (drain deadline, lease lost,
/// node gone, deletion): undo what we did to the node, if it still exists,
/// then release its medik8s lease.
async fn give_back(ctx: &Ctx, node_name: &str, node: Option<&Node>) -> Result<(), Error> {
    if let Some(node) = node {
        restore_node(ctx, node).await?;
    }
    ctx.leases.release(node_name).await?;
    Ok(())
}

async fn restore_node(ctx: &Ctx, node: &Node) -> Result<(), Error> {
    if let Some(ops) = node::exit_patch(node) {
        patch_node(ctx, &node.name_any(), ops, "give back").await?;
        ctx.events.on(node, EVENT_UNCORDON_NODE).await;
    }
    Ok(())
}

/// A deleted NodeMaintenance: give the node back (if this one had it), release
/// the lease, then remove the finalizer; RemovedMaintenance once that worked.
/// A finalizer that cannot be removed (e.g. the webhook is down) is retried
/// without repeating events: the node is already given back by then.
async fn cleanup(nm: NodeMaintenance, ctx: &Ctx) -> Result<Requeue, Error> {
    let name = nm.name_any();
    let node_name = nm.spec.node_name.clone();
    // The cache can hand us an object whose cleanup already finished (our own
    // node patch re-queues it); a later maintenance of the same node may hold
    // it by now. Only the live object says whether this cleanup is still due.
    let nm = match ctx.read_live(&name).await? {
        Some(live)
            if live.metadata.uid == nm.metadata.uid
                && live.finalizers().iter().any(|f| f == FINALIZER) =>
        {
            live
        }
        _ => return Ok(None),
    };
    if plan::touched_node(nm.phase()) {
        let node = read_node(ctx, &node_name).await?;
        if node.is_none() {
            tracing::info!(nodemaintenance = %name, node = %node_name, "node already gone");
        }
        give_back(ctx, &node_name, node.as_ref()).await?;
        tracing::info!(nodemaintenance = %name, node = %node_name, "maintenance ended: node given back, lease released");
    }
    let rest: Vec<String> = nm
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let nm = set_finalizers(ctx, &nm, rest).await?;
    // The object goes now: nothing of ours to remember about it.
    ctx.own_writes.forget(&name);
    if plan::touched_node(nm.phase()) {
        ctx.node_cache.retire(&node_name);
    }
    ctx.events.on(&nm, EVENT_REMOVED_MAINTENANCE).await;
    Ok(None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;

    /// `spec.reason` that makes `step` panic (test builds only).
    pub const PANIC_REASON: &str = "nmo-test: panic in step";

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// A context whose client is the mock's; leader election off (leading).
    async fn mock_ctx() -> (Arc<Ctx>, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let cfg = <crate::config::Config as clap::Parser>::parse_from(["nmo-controller"]);
        let metrics = Metrics::new().expect("metrics");
        let (leadership, _) = Leadership::start(client.clone(), &cfg, &metrics)
            .await
            .expect("leading without an election");
        let (store, _writer) = kube::runtime::reflector::store();
        let clients = crate::serving::Clients {
            api: client.clone(),
            evict: client,
        };
        let ctx = Ctx::new(&cfg, clients, store, metrics, &leadership);
        (Arc::new(ctx), handle)
    }

    fn nm(reason: &str) -> NodeMaintenance {
        serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": "nm-1", "uid": "u-1", "resourceVersion": "7",
                "finalizers": [FINALIZER]},
            "spec": {"nodeName": "worker-1", "reason": reason}
        }))
        .expect("NodeMaintenance JSON")
    }

    fn ok(body: Value) -> Response<Body> {
        Response::builder()
            .status(200)
            .body(Body::from(body.to_string().into_bytes()))
            .expect("response")
    }

    /// Answer every request as an API server holding `nm` would, recording
    /// (method, path, body) of each.
    fn serve(
        mut handle: Handle,
        nm: NodeMaintenance,
    ) -> tokio::task::JoinHandle<Vec<(String, String, Value)>> {
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut current = serde_json::to_value(&nm).expect("nm JSON");
            while let Some((req, reply)) = handle.next_request().await {
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.expect("request body");
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let path = parts.uri.path().to_string();
                let answer = if path.ends_with("/status") {
                    json_patch::merge(&mut current, &body);
                    current["metadata"]["resourceVersion"] = json!("8");
                    current.clone()
                } else if parts.method == http::Method::GET {
                    current.clone()
                } else {
                    body.clone()
                };
                seen.push((parts.method.to_string(), path, body));
                reply.send_response(ok(answer));
            }
            seen
        })
    }

    #[tokio::test]
    async fn a_panic_is_recorded_and_the_controller_goes_on() {
        let (ctx, handle) = mock_ctx().await;
        let obj = nm(PANIC_REASON);
        let api = serve(handle, obj.clone());
        let result = reconcile(Arc::new(obj), ctx.clone()).await;
        let Err(Error::Panicked(text)) = &result else {
            panic!("a panic comes back as Error::Panicked: {result:?}");
        };
        assert!(text.contains("injected by the test"), "{text}");
        // error_policy handles it like any error: retry later, no exit.
        let _ = error_policy(
            Arc::new(nm(PANIC_REASON)),
            result.as_ref().expect_err("err"),
            ctx.clone(),
        );
        let mut metrics = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&ctx.metrics.registry.gather(), &mut metrics)
            .expect("metrics text");
        assert!(
            metrics.contains(
                "controller_runtime_reconcile_panics_total{controller=\"nodemaintenance\"} 1"
            ),
            "{metrics}"
        );
        drop(ctx);
        let seen = api.await.expect("mock API");
        let calls: Vec<(&str, &str)> = seen
            .iter()
            .map(|(m, p, _)| (m.as_str(), p.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                (
                    "GET",
                    "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances/nm-1"
                ),
                (
                    "PATCH",
                    "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances/nm-1/status"
                ),
                ("POST", "/api/v1/namespaces/default/events"),
            ],
            "{seen:#?}"
        );
        let status = &seen[1].2["status"];
        assert_eq!(status["phase"], "Failed", "{status}");
        assert_eq!(status["lastError"].as_str(), Some(text.as_str()));
        let failed = status["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Failed"))
            .unwrap_or_else(|| panic!("a Failed condition: {status}"));
        assert_eq!(
            (failed["status"].as_str(), failed["reason"].as_str()),
            (Some("True"), Some("InternalError"))
        );
        let event = &seen[2].2;
        assert_eq!(
            (event["type"].as_str(), event["reason"].as_str()),
            (Some("Warning"), Some("FailedMaintenance"))
        );
    }

    /// Answers of kube-apiserver v1.34.4 (the local plane) to a node JSON
    /// patch, captured with `kubectl patch node ... --type=json -v=8`.
    mod answers {
        /// `[{"op":"test","path":"/spec/taints","value":[]}, ...]` on a node
        /// with a taint: the failed `test` (patch.go drops the patch
        /// library's words).
        pub const TEST_OP_FAILED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}"#;
        /// A ValidatingAdmissionPolicy (validationActions [Deny], no
        /// `reason`, so Invalid) freezing the node's spec.
        pub const VAP_DENIED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes \"refusal-probe-23922\" is forbidden: ValidatingAdmissionPolicy 'refusal-probe-23922' with binding 'refusal-probe-23922' denied request: node refusal-probe-23922 is frozen by policy refusal-probe-23922: its spec may not change","reason":"Invalid","details":{"name":"refusal-probe-23922","kind":"nodes","causes":[{"message":"ValidatingAdmissionPolicy 'refusal-probe-23922' with binding 'refusal-probe-23922' denied request: node refusal-probe-23922 is frozen by policy refusal-probe-23922: its spec may not change"}]},"code":422}"#;
        /// The node's own validation (a taint with effect "Bogus").
        pub const NODE_INVALID: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Node \"refusal-probe-23922\" is invalid: metadata.taints[0].effect: Unsupported value: \"Bogus\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"","reason":"Invalid","details":{"name":"refusal-probe-23922","kind":"Node","causes":[{"reason":"FieldValueNotSupported","message":"Unsupported value: \"Bogus\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"","field":"metadata.taints[0].effect"},{"reason":"FieldValueNotSupported","message":"Unsupported value: \"Bogus\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"","field":"metadata.taints[0].effect"}]},"code":422}"#;
        /// Not captured: an update against an outdated resourceVersion, as
        /// apimachinery's NewConflict words it.
        pub const CONFLICT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on nodes \"worker-1\": the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","details":{"name":"worker-1","kind":"nodes"},"code":409}"#;
        /// Not captured: an admission webhook's denial without a code
        /// (apiserver's ToStatusErr makes it 400).
        pub const WEBHOOK_DENIED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"admission webhook \"nodes.example.com\" denied the request: nodes are frozen","code":400}"#;
    }

    fn api_error(body: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_str(body).expect("a Status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn a_failed_test_op_or_409_is_a_conflict() {
        for body in [answers::TEST_OP_FAILED, answers::CONFLICT] {
            let e = node_patch_error("worker-1", "put into maintenance", api_error(body));
            assert!(
                matches!(&e, Error::NodeChanged { node } if node == "worker-1"),
                "{body}: {e:?}"
            );
            assert!(e.is_conflict());
        }
    }

    #[test]
    fn a_refused_node_patch_is_reported_not_retried_as_a_conflict() {
        let cases = [
            (
                answers::VAP_DENIED,
                "ValidatingAdmissionPolicy 'refusal-probe-23922' with binding 'refusal-probe-23922' denied request: node refusal-probe-23922 is frozen",
            ),
            (
                answers::NODE_INVALID,
                "Node \"refusal-probe-23922\" is invalid",
            ),
            (
                answers::WEBHOOK_DENIED,
                "admission webhook \"nodes.example.com\" denied the request",
            ),
        ];
        for (body, words) in cases {
            let e = node_patch_error("worker-1", "put into maintenance", api_error(body));
            assert!(matches!(e, Error::NodeRefused { .. }), "{body}: {e:?}");
            assert!(!e.is_conflict(), "{body}");
            assert_eq!(e.kind(), "node_refused");
            let text = e.to_string();
            for want in [
                "node worker-1 (put into maintenance)",
                words,
                "admission policy or webhook",
                "the controller retries",
            ] {
                assert!(text.contains(want), "{want:?} in {text}");
            }
        }
    }

    #[test]
    fn other_node_patch_failures_stay_plain_errors() {
        let busy = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server is currently unable to handle the request","reason":"ServiceUnavailable","code":503}"#;
        let e = node_patch_error("worker-1", "give back", api_error(busy));
        assert!(matches!(e, Error::Node { .. }), "{e:?}");
        assert!(!e.is_conflict());
    }
}
