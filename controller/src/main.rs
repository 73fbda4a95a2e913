//! nmo-controller: parse flags, start telemetry and probes, win leadership
//! (when asked to), run the NodeMaintenance controller until SIGTERM.

mod classify;
mod config;
mod conflicts;
mod drain;
mod events;
mod leadership;
mod metrics;
mod node;
mod node_lease;
mod queue_metrics;
mod reconcile;
mod slots;

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, predicates, reflector, watcher};
use kube::{Api, ResourceExt};
use shared::NodeMaintenance;
use shared::probes::{Readiness, bind_and_serve, probe_router};
use shared::telemetry::{init_logging, parse_bind_address};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::reconcile::{Ctx, error_policy, reconcile};

#[tokio::main]
async fn main() {
    let cfg = Config::parse_from(shared::goflags::normalize(std::env::args_os()));
    let mut log = init_logging(&cfg.runtime.log);
    if let Err(e) = run(cfg).await {
        tracing::error!(error = format!("{e:#}"), "nmo-controller stopped");
        // process::exit skips destructors: write the queued lines first.
        log.finish();
        std::process::exit(1);
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}

/// A watch failed; it reconnects on its own (see `shared::watch`).
fn log_watch_error(resource: &str, e: &watcher::Error) {
    if matches!(e, watcher::Error::WatchError(s) if s.code == 410) {
        tracing::info!(
            error = %e,
            "watch of {resource} expired (the API server no longer holds its position, e.g. after a restart); listing it again"
        );
        return;
    }
    tracing::warn!(
        error = %e,
        "watch of {resource} failed; reconnecting within 2 s. If this repeats, check that the API \
         server is reachable and that the controller's ClusterRole grants list and watch on {resource}"
    );
}

fn instance_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("nmo-controller-{}", std::process::id()))
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let readiness = Readiness::default();
    let cache_gate = readiness.gate("NodeMaintenance cache");
    let metrics = metrics::Metrics::new().context("registering metrics")?;

    // Probes first, so a slow API server still shows liveness.
    let mut servers = Vec::new();
    if let Some(addr) = parse_bind_address(
        "--health-probe-bind-address",
        &cfg.runtime.health_probe_bind_address,
    )? {
        let s = shutdown.clone();
        let fut = bind_and_serve(
            "probes",
            addr,
            probe_router(readiness.clone()),
            async move { s.cancelled().await },
        )
        .await?;
        servers.push(tokio::spawn(fut));
    }

    let mut kube_config = kube::Config::infer().await.context(
        "loading the Kubernetes client configuration (in-cluster or KUBECONFIG); check the service account or kubeconfig",
    )?;
    let client = metrics.counted_client(kube_config.clone())?;
    // Evictions get a client that does not retry 429 by itself: for the Eviction
    // API a 429 is the answer ("a PodDisruptionBudget says not now"), and the
    // drain must record it and move on, not sit in a multi-minute backoff.
    kube_config.default_retry = false;
    let evict_client = metrics.counted_client(kube_config)?;

    // Metrics once a client exists: the secure port asks the API server who calls.
    if let Some(serving) = shared::metrics_server::MetricsServing::from_flags(
        &cfg.runtime,
        vec![format!(
            "nmo-controller-metrics.{}.svc",
            cfg.leader_election_namespace
        )],
    )? {
        let s = shutdown.clone();
        let fut = shared::metrics_server::serve(
            serving,
            metrics.registry.clone(),
            client.clone(),
            async move { s.cancelled().await },
        )
        .await?;
        servers.push(tokio::spawn(async move {
            fut.await;
            Ok::<(), std::io::Error>(())
        }));
    }

    {
        let s = shutdown.clone();
        let r = readiness.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutdown requested: finishing in-flight reconciles");
            r.begin_shutdown();
            s.cancel();
        });
    }

    // Leader election: every replica watches (and so is Ready); only the
    // leader reconciles and writes.
    let (leadership, election) = leadership::Leadership::start(
        client.clone(),
        leadership::Settings {
            enabled: cfg.leader_elect,
            namespace: cfg.leader_election_namespace.clone(),
            name: cfg.leader_election_id.clone(),
            identity: instance_name(),
        },
        &metrics,
    )
    .await?;

    let nm_api: Api<NodeMaintenance> = Api::all(client.clone());
    let mut wc = watcher::Config::default();
    if !cfg.nodemaintenance_selector.is_empty() {
        wc = wc.labels(&cfg.nodemaintenance_selector);
    }
    let (store, writer) = reflector::store();
    // Reconcile on what matters (spec, finalizers, deletion), not on our own
    // status writes: the drain schedules its own next round.
    // Ready once the first full list of NodeMaintenances is in the cache. A
    // later full list means the watch had lost track (410 Gone after an API
    // server restart, or a failed watch): once the store holds it, every
    // NodeMaintenance is reconciled, as an informer's re-list does upstream, so
    // a round that failed while the API server was away is not left waiting
    // for its requeue.
    let synced = cache_gate.clone();
    let (relisted_tx, relisted) = futures::channel::mpsc::unbounded::<()>();
    let nm_stream = watcher(nm_api, wc)
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::InitDone) if !synced.is_open() => {
                synced.set(true);
                tracing::info!("NodeMaintenance cache synced");
            }
            Ok(watcher::Event::InitDone) => {
                tracing::info!(
                    "NodeMaintenance watch listed everything again (it had lost track); reconciling every NodeMaintenance"
                );
                let _ = relisted_tx.unbounded_send(());
            }
            Err(e) => log_watch_error("nodemaintenances.nodemaintenance.medik8s.io", e),
            Ok(_) => {}
        })
        .applied_objects()
        .predicate_filter(
            |nm: &NodeMaintenance| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                predicates::generation(nm).hash(&mut h);
                predicates::finalizers(nm).hash(&mut h);
                nm.metadata.deletion_timestamp.is_some().hash(&mut h);
                Some(h.finish())
            },
            Default::default(),
        );

    let ctx = Arc::new(Ctx {
        client: client.clone(),
        evict_client,
        store: store.clone(),
        events: events::Events::new(client.clone(), instance_name()),
        metrics,
        leases: node_lease::NodeLeases::new(client.clone(), cfg.lease_namespace.clone()),
        max_concurrent_maintenances: cfg.max_concurrent_maintenances,
        max_concurrent_evictions: cfg.max_concurrent_evictions,
        leadership: leadership.clone(),
        conflicts: conflicts::ConflictStreaks::default(),
    });

    // A node change (someone uncordons it, removes a taint) reaches the
    // NodeMaintenance that names it.
    let node_store = store.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    let node_watch = watcher(nodes, watcher::Config::default())
        .inspect(|event| {
            if let Err(e) = event {
                log_watch_error("nodes", e);
            }
        })
        .applied_objects()
        .predicate_filter(
            |n: &Node| {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                if let Some(spec) = &n.spec {
                    spec.unschedulable.hash(&mut h);
                    if let Some(t) = &spec.taints {
                        for t in t {
                            (&t.key, &t.effect).hash(&mut h);
                        }
                    }
                }
                n.metadata.labels.hash(&mut h);
                n.metadata.uid.hash(&mut h);
                Some(h.finish())
            },
            Default::default(),
        );

    // After an error from either watch the Controller pauses both before it
    // polls them again (which reconnects them); its default pause is
    // client-go's, growing to 30 s: the half minute of blindness after an API
    // server restart. Ours retries within 0.1-2 s (shared::watch).
    let controller = Controller::for_stream(nm_stream, store)
        .trigger_backoff(shared::watch::reconnect_backoff())
        .watches_stream(node_watch, move |node: Node| {
            let name = node.name_any();
            node_store
                .state()
                .iter()
                .filter(|nm| nm.spec.node_name == name)
                .map(|nm| ObjectRef::from_obj(nm.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_all_on(leadership.acquired(ctx.metrics.clone()))
        .reconcile_all_on(relisted)
        .graceful_shutdown_on({
            let s = shutdown.clone();
            async move { s.cancelled().await }
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile request failed");
            }
        });

    // A leader that loses the Lease exits (as controller-runtime does) so it
    // can never write alongside the new leader.
    let lost = tokio::select! {
        _ = controller => None,
        lost = leadership.lost() => Some(lost),
    };
    if let Some(lost) = lost {
        return Err(lost.into());
    }
    if let Some(election) = election {
        election.release().await;
    }

    shutdown.cancel();
    for s in servers {
        let _ = s.await;
    }
    tracing::info!("nmo-controller stopped cleanly");
    Ok(())
}
