//! What the controller watches, and what wakes a reconcile: NodeMaintenance
//! changes that matter (spec, finalizers, deletion; not our own status
//! writes), a full re-list after the watch lost track, and changes of a node
//! that a NodeMaintenance names (not the echo of our own node patch).
//!
//! Each watch backs off on its own after an error (logged here) and hands
//! the Controller only what it saw: an error reaching the Controller would
//! pause every trigger at once (kube's `trigger_backoff` wraps them all),
//! and a drain wake arriving just after an API server restart would wait
//! out the NodeMaintenance watch's pause.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use shared::NodeMaintenance;
use shared::kube::partial::NodeView;
use shared::rules::slots;
use shared::serve::probes::Gate;

use crate::metrics::Metrics;
use crate::node_cache::NodeCache;
use crate::queue_metrics::WorkQueue;

/// Objects per page of a watch's full list (kube's default is 500): the
/// page's JSON is held whole while it is decoded.
pub const LIST_PAGE: u32 = 100;

/// The NodeMaintenance watch feeding `store`: Ready (`synced`) once the first
/// full list is in the cache. A later full list means the watch had lost track
/// (410 Gone after an API server restart, or a failed watch): once the store
/// holds it, the returned receiver fires so every NodeMaintenance is
/// reconciled, as an informer's re-list does upstream, and a round that failed
/// while the API server was away is not left waiting for its requeue.
pub fn nodemaintenances(
    client: Client,
    selector: &str,
    writer: reflector::store::Writer<NodeMaintenance>,
    synced: Gate,
    metrics: Metrics,
    saw: impl Fn(&NodeMaintenance) + Send + Sync + 'static,
    gone: impl Fn(&str) + Send + Sync + 'static,
) -> (
    impl Stream<Item = Result<NodeMaintenance, watcher::Error>> + Send + 'static,
    UnboundedReceiver<()>,
) {
    let mut wc = watcher::Config::default().page_size(LIST_PAGE);
    if !selector.is_empty() {
        wc = wc.labels(selector);
    }
    let (relisted_tx, relisted) = unbounded::<()>();
    let store = writer.as_reader();
    let queue = metrics.queue.clone();
    let stream =
        shared::kube::watch::reconnecting(watcher(Api::<NodeMaintenance>::all(client), wc))
            .modify(|nm| shared::kube::partial::forget_managed_fields(&mut nm.metadata))
            .reflect(writer)
            .inspect(move |event| {
                on_nodemaintenance_event(event, &synced, &relisted_tx);
                gauges_follow(event, &store, &metrics);
                // What the reconciler kept until the cache caught up ends here
                // too: status-only changes trigger no reconcile (the predicate
                // below), so none would read them.
                match event {
                    Ok(watcher::Event::Apply(nm) | watcher::Event::InitApply(nm)) => saw(nm),
                    // Gone, whoever removed its finalizer: nothing kept for it.
                    Ok(watcher::Event::Delete(nm)) => gone(&nm.name_any()),
                    _ => {}
                }
            })
            .applied_objects()
            .predicate_filter(
                |nm: &NodeMaintenance| {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    predicates::generation(nm).hash(&mut h);
                    predicates::finalizers(nm).hash(&mut h);
                    nm.metadata.deletion_timestamp.is_some().hash(&mut h);
                    Some(h.finish())
                },
                Default::default(),
            )
            .inspect(move |nm| {
                if let Ok(nm) = nm {
                    queue.added(&nm.name_any(), Duration::ZERO);
                }
            })
            .filter(|r| std::future::ready(r.is_ok()));
    (stream, relisted)
}

fn on_nodemaintenance_event(
    event: &Result<watcher::Event<NodeMaintenance>, watcher::Error>,
    synced: &Gate,
    relisted: &UnboundedSender<()>,
) {
    match event {
        Ok(watcher::Event::InitDone) if !synced.is_open() => {
            synced.set(true);
            tracing::info!("NodeMaintenance cache synced");
        }
        Ok(watcher::Event::InitDone) => {
            tracing::info!(
                "NodeMaintenance watch listed everything again (it had lost track); reconciling every NodeMaintenance"
            );
            let _ = relisted.unbounded_send(());
        }
        Err(e) => log_watch_error("nodemaintenances.nodemaintenance.medik8s.io", e),
        Ok(_) => {}
    }
}

/// The per-maintenance gauges follow the cache on every replica, leader or
/// not: a restart or a failover never blanks them, so alerts with a `for:`
/// keep their history. Written after the reflector, so a full re-list
/// (InitDone) also drops the series of objects deleted meanwhile.
fn gauges_follow(
    event: &Result<watcher::Event<NodeMaintenance>, watcher::Error>,
    store: &Store<NodeMaintenance>,
    metrics: &Metrics,
) {
    match event {
        Ok(watcher::Event::Apply(nm) | watcher::Event::InitApply(nm)) => show(metrics, nm),
        Ok(watcher::Event::Delete(nm)) => metrics.forget(&nm.name_any(), &nm.spec.node_name),
        Ok(watcher::Event::InitDone) => metrics.rebuild(&store.state()),
        Ok(watcher::Event::Init) | Err(_) => {}
    }
}

fn show(metrics: &Metrics, nm: &NodeMaintenance) {
    let Some(status) = &nm.status else { return };
    if let Some(phase) = &status.phase {
        let pending = status.pending_pods.len();
        let (name, node) = (nm.name_any(), &nm.spec.node_name);
        metrics.observe(&name, node, phase, status.drain_progress, pending);
    }
}

/// Node changes that matter to a maintenance (cordon, taints, labels, a node
/// recreated under the same name), as a stream of nodes, each decoded to
/// just those fields (`shared::kube::partial`: a thousand nodes cost their names,
/// labels, taints and condition statuses, not their status). Listed 100 at a
/// time, so the first list never holds more than a small page of JSON.
/// `also` sees every event first (the fleet gates' node views).
pub fn nodes(
    client: Client,
    cache: NodeCache,
    also: impl Fn(&watcher::Event<NodeView>) + Send + 'static,
) -> impl Stream<Item = Result<NodeView, watcher::Error>> + Send + 'static {
    shared::kube::watch::reconnecting(watcher(
        Api::<NodeView>::all(client),
        watcher::Config::default().page_size(LIST_PAGE),
    ))
    .inspect(move |event| match event {
        Ok(event) => {
            cache.observe(event);
            also(event);
        }
        Err(e) => log_watch_error("nodes", e),
    })
    .applied_objects()
    .predicate_filter(
        |n: &NodeView| {
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
    )
    .filter(|r| std::future::ready(r.is_ok()))
}

/// The NodeMaintenances (from the cache) that name `node`, each queued;
/// none when the change is the echo of our own patch.
pub fn maintenances_of(
    store: &Store<NodeMaintenance>,
    node: &NodeView,
    queue: &WorkQueue,
    cache: &NodeCache,
) -> Vec<ObjectRef<NodeMaintenance>> {
    if cache.is_own_echo(node) {
        return Vec::new();
    }
    let name = node.name_any();
    store
        .state()
        .iter()
        .filter(|nm| nm.spec.node_name == name)
        .inspect(|nm| queue.added(&nm.name_any(), Duration::ZERO))
        .map(|nm| ObjectRef::from_obj(nm.as_ref()))
        .collect()
}

/// `trigger` (leadership won, a re-list) queues every cached NodeMaintenance.
pub fn reconcile_all<S: Stream<Item = ()> + Send + 'static>(
    trigger: S,
    store: Store<NodeMaintenance>,
    queue: WorkQueue,
) -> impl Stream<Item = ()> + Send + 'static {
    trigger.inspect(move |()| {
        for nm in store.state() {
            queue.added(&nm.name_any(), Duration::ZERO);
        }
    })
}

/// `released` (a NodeMaintenance left the cache, or a node the budgets
/// count changed; a burst counts once) queues the waiting ones at once
/// ([`slots::woken_by_departure`]) instead of at their next look (2 s):
/// the next of a zone or a slot starts as soon as the node before it was
/// given back, or a node that held a budget is Ready and schedulable again.
pub fn waiters_woken<S: Stream<Item = ()> + Send + 'static>(
    released: S,
    store: Store<NodeMaintenance>,
    queue: WorkQueue,
) -> impl Stream<Item = ObjectRef<NodeMaintenance>> + Send + 'static {
    released.ready_chunks(256).flat_map(move |_| {
        let all: Vec<slots::Entry> = store
            .state()
            .iter()
            .map(|nm| slots::Entry::of(nm))
            .collect();
        let woken: Vec<ObjectRef<NodeMaintenance>> = slots::woken_by_departure(&all)
            .into_iter()
            .inspect(|name| queue.added(name, Duration::ZERO))
            .map(|name| ObjectRef::new(&name))
            .collect();
        futures::stream::iter(woken)
    })
}

/// A watch failed; it reconnects on its own (see `shared::kube::watch`).
pub(crate) fn log_watch_error(resource: &str, e: &watcher::Error) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn nm(name: &str, node: &str, created: &str, phase: Option<&str>) -> NodeMaintenance {
        serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": node, "reason": "test"},
            "status": phase.map(|p| json!({"phase": p}))
        }))
        .expect("nm json")
    }

    #[tokio::test]
    async fn a_burst_of_departures_queues_the_waiters_once() {
        let (store, mut writer) = reflector::store::<NodeMaintenance>();
        writer.apply_watcher_event(&Event::Init);
        for o in [
            nm("running", "n1", "2026-12-05T10:00:00Z", Some("Running")),
            nm("second", "n3", "2026-12-05T10:00:02Z", Some("Pending")),
            nm("first", "n2", "2026-12-05T10:00:01Z", None),
        ] {
            writer.apply_watcher_event(&Event::InitApply(o));
        }
        writer.apply_watcher_event(&Event::InitDone);
        let queue = WorkQueue::new("test").expect("queue");
        // Three departures at once: one wake of each waiter, in order.
        let departures = futures::stream::iter([(), (), ()]);
        let woken: Vec<String> = waiters_woken(departures, store, queue)
            .map(|r| r.name)
            .collect()
            .await;
        assert_eq!(woken, ["first", "second"]);
    }
}
