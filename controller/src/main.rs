//! nmo-controller: wires flags, telemetry, endpoints, clients, leadership and
//! the NodeMaintenance controller together, and runs until SIGTERM.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use futures::channel::mpsc::UnboundedReceiver;
use futures::{Stream, StreamExt};
use kube::Client;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, controller, watcher};
use shared::NodeMaintenance;
use shared::serve::probes::{Gate, Readiness};

use nmo_controller::config::Config;
use nmo_controller::drain::DrainRules;
use nmo_controller::reconcile::{Ctx, MAX_CONCURRENT_RECONCILES, error_policy, reconcile};
use nmo_controller::{drain_wakes, fleet, leadership, metrics, serving, watches};

#[tokio::main]
async fn main() {
    let cfg = Config::parse_from(shared::serve::goflags::normalize(std::env::args_os()));
    let mut log = shared::serve::telemetry::init_logging(&cfg.runtime.log);
    if let Err(e) = run(cfg).await {
        tracing::error!(error = format!("{e:#}"), "nmo-controller stopped");
        log.finish(); // process::exit skips destructors
        std::process::exit(1);
    }
}

/// The readiness gate of the NodeMaintenance cache.
const NM_CACHE_GATE: &str = "NodeMaintenance cache";

/// Resolves when shutdown is requested while the NodeMaintenance cache is
/// still being filled. kube-runtime holds every reconcile until the cache is
/// ready, and a graceful shutdown stops the watch that would fill it: it
/// would wait forever (seen: a standby SIGTERMed 25 ms after its start hung
/// until killed). Nothing can be running then, so the process stops.
async fn stopped_before_sync(signals: &shared::serve::shutdown::Signals, readiness: &Readiness) {
    signals.requested().await;
    if !readiness.waiting_for().iter().any(|g| g == NM_CACHE_GATE) {
        std::future::pending::<()>().await;
    }
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    if cfg.gates.settle_after.is_some() && !cfg.node_lifecycle_conditions {
        anyhow::bail!(
            "--settle-after reads when the node before was given back from its \
             MaintenanceInProgress condition, which --node-lifecycle-conditions=false turns off: \
             turn the conditions on (the default) or leave --settle-after unset"
        );
    }
    let fleet = fleet::Fleet::new(cfg.gates.gates()).map_err(anyhow::Error::msg)?;
    let signals =
        shared::serve::shutdown::Signals::install().context("installing signal handlers")?;
    let readiness = Readiness::default();
    // Registered before the probes answer: until the cache is filled,
    // /readyz says so (a rolling update must not count this pod Ready yet).
    let gate = readiness.gate(NM_CACHE_GATE);
    let metrics = metrics::Metrics::new().context("registering metrics")?;
    serving::probes(&cfg, &readiness).await?;
    let clients = serving::clients(&metrics).await?;
    let client = clients.api.clone();
    serving::metrics(&cfg, &metrics, &client).await?;
    // Every replica watches (and so is Ready); only the leader reconciles.
    let (leadership, election) =
        leadership::Leadership::start(client.clone(), &cfg, &metrics).await?;
    let (store, writer) = reflector::store();
    // The drain rules' caches: a drain round waits until they have listed.
    let (drain_rules, fill_drain_rules) = DrainRules::watch(&client);
    tokio::spawn(fill_drain_rules);
    let ctx = Arc::new(Ctx::new(
        &cfg,
        clients,
        store.clone(),
        metrics,
        &leadership,
        fleet,
        drain_rules,
    ));
    let selector = &cfg.nodemaintenance_selector;
    let nms = watch_maintenances(&ctx, client.clone(), selector, writer, gate);
    register_kept_entries(&ctx)?;
    let stop = readiness.fail_after(signals.requested());
    let controller = controller(ctx.clone(), client, store, nms, &leadership, stop);
    // A leader that loses the Lease exits (as controller-runtime does), so it
    // never writes alongside the new leader.
    tokio::select! {
        () = controller => {}
        () = stopped_before_sync(&signals, &readiness) => {
            tracing::info!("shutdown requested before the NodeMaintenance cache was filled: nothing was running");
        }
        lost = leadership.lost() => return Err(lost.into()),
    }
    if let Some(election) = election {
        election.release().await;
    }
    tracing::info!("nmo-controller stopped cleanly");
    Ok(())
}

/// The NodeMaintenance watch filling `writer`'s store (see
/// `watches::nodemaintenances`), telling `ctx` what the cache saw and which
/// maintenance is gone. Also: the receivers that fire on a re-list and when
/// a maintenance left the cache.
fn watch_maintenances(
    ctx: &Arc<Ctx>,
    client: Client,
    selector: &str,
    writer: reflector::store::Writer<NodeMaintenance>,
    gate: Gate,
) -> Maintenances<impl Stream<Item = Result<NodeMaintenance, watcher::Error>> + Send + 'static> {
    let saw = Arc::downgrade(ctx);
    let gone = Arc::downgrade(ctx);
    let (departed, departures) = futures::channel::mpsc::unbounded::<()>();
    let (stream, relisted) = watches::nodemaintenances(
        client,
        selector,
        writer,
        gate,
        ctx.metrics.clone(),
        move |nm: &NodeMaintenance| {
            if let Some(ctx) = saw.upgrade() {
                ctx.cache_saw(nm);
            }
        },
        move |name: &str| {
            if let Some(ctx) = gone.upgrade() {
                ctx.forget_maintenance(name);
            }
            let _ = departed.unbounded_send(());
        },
    );
    Maintenances {
        stream,
        relisted,
        departures,
    }
}

/// The NodeMaintenance watch and what it signals.
struct Maintenances<S> {
    stream: S,
    /// A full re-list (the watch had lost track).
    relisted: UnboundedReceiver<()>,
    /// A maintenance left the cache.
    departures: UnboundedReceiver<()>,
}

/// `nmo_controller_kept_entries`, sampled from `ctx` at each scrape.
fn register_kept_entries(ctx: &Arc<Ctx>) -> anyhow::Result<()> {
    let kept = Arc::downgrade(ctx);
    ctx.metrics
        .register_kept_entries(move || {
            kept.upgrade()
                .map(|c| c.kept_entries().to_vec())
                .unwrap_or_default()
        })
        .context("registering nmo_controller_kept_entries")?;
    let waiting = Arc::downgrade(ctx);
    ctx.metrics
        .register_waiting(move || waiting.upgrade().map(|c| c.waiting()).unwrap_or_default())
        .context("registering nmo_nodemaintenance_waiting")
}

/// The node watch (its changes map to the maintenances that name the node),
/// and a tick each time a node the fleet budgets count changed (Ready,
/// cordon, zone, came or left): that frees or takes a budget, so the
/// waiters look again at once, as on a departure.
fn node_watch(
    ctx: &Arc<Ctx>,
    client: Client,
) -> (
    impl Stream<Item = Result<shared::kube::partial::NodeView, watcher::Error>> + Send + 'static,
    impl Stream<Item = ()> + Send + 'static,
) {
    let (fleet_changed, fleet_changes) = futures::channel::mpsc::unbounded::<()>();
    let fleet_ctx = Arc::downgrade(ctx);
    let nodes = watches::nodes(client, ctx.node_cache.clone(), move |event| {
        if let Some(ctx) = fleet_ctx.upgrade()
            && ctx.fleet.observe(event)
        {
            let _ = fleet_changed.unbounded_send(());
        }
    });
    (nodes, fleet_changes)
}

/// The NodeMaintenance controller, reconciling on the watch `nms`, on node
/// changes, on drain wakes, and everything when this replica wins the Lease
/// or the watch re-listed; it ends once `stop` resolved and the reconciles
/// in flight are done.
fn controller(
    ctx: Arc<Ctx>,
    client: Client,
    store: Store<NodeMaintenance>,
    nms: Maintenances<impl Stream<Item = Result<NodeMaintenance, watcher::Error>> + Send + 'static>,
    leadership: &leadership::Leadership,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> {
    let (queue, limit) = (ctx.metrics.queue.clone(), MAX_CONCURRENT_RECONCILES);
    ctx.metrics.set_max_concurrent_reconciles(limit.into());
    // Won the Lease, or the NodeMaintenance watch listed again: reconcile all.
    let Maintenances {
        stream: nms,
        relisted,
        departures,
    } = nms;
    let everything = futures::stream::select(leadership.acquired(ctx.metrics.clone()), relisted);
    let (nodes, fleet_changes) = node_watch(&ctx, client.clone());
    let released = futures::stream::select(departures, fleet_changes);
    let woken = watches::waiters_woken(released, store.clone(), queue.clone());
    let everything = watches::reconcile_all(everything, store.clone(), queue.clone());
    let unblocked = drain_wakes::wakes(
        client.clone(),
        store.clone(),
        queue.clone(),
        ctx.departures_watched.clone(),
    );
    let node_cache = ctx.node_cache.clone();
    Controller::for_stream(nms, store.clone())
        .with_config(controller::Config::default().concurrency(limit))
        // The watches back off on their own and hand over no errors
        // (watches.rs): a pause here would hold every trigger, drain wakes
        // included. Kept short should an error ever get through.
        .trigger_backoff(shared::kube::watch::reconnect_backoff())
        .watches_stream(nodes, move |n| {
            watches::maintenances_of(&store, &n, &queue, &node_cache)
        })
        .reconcile_all_on(everything)
        .reconcile_on(unblocked)
        .reconcile_on(woken)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(move |r| {
            // Gone (deleted before its turn, or its finalizer removed by
            // someone else): no longer queued, nothing kept for it.
            if let Err(controller::Error::ObjectNotFound(o)) = r {
                ctx.metrics.queue.forget(&o.name);
                ctx.forget_maintenance(&o.name);
            }
            std::future::ready(())
        })
}
