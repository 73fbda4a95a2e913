//! One watched store of the webhook and the readiness gate that opens on its
//! first complete list: `spawn_cache` runs the reflector, `Cached` hands the
//! store out only once that list is in (else says which cache is not ready).
//! `cache` (the decision's lookups) and `warning_lookups` (the warnings')
//! both read through it.

use futures::StreamExt;
use kube::Resource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use shared::serve::probes::{Gate, Readiness};

use crate::metrics::Metrics;
use crate::validate::Unavailable;

/// Objects per page of a cache's full list (kube's default is 500): the
/// page's JSON is held whole while it is decoded.
const LIST_PAGE: u32 = 100;

/// A cluster-wide cache's watch: full lists in pages of [`LIST_PAGE`].
pub(crate) fn paged() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
}

/// A reflector store plus the gate that says it has its first full list.
pub(crate) struct Cached<K: kube::runtime::reflector::Lookup + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: Store<K>,
    ready: Gate,
    name: &'static str,
}

impl<K> Cached<K>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    pub(crate) fn ready_store(&self) -> Result<&Store<K>, Unavailable> {
        if self.ready.is_open() {
            Ok(&self.store)
        } else {
            Err(Unavailable(format!(
                "the webhook's {} cache has not received its first complete list from the API \
                 server yet (the webhook is starting, or cannot reach the API server; see its log)",
                self.name
            )))
        }
    }
}

/// Run one reflector in the background; open its gate on the first full list.
pub(crate) fn spawn_cache<K, S>(
    name: &'static str,
    needs: &'static str,
    stream: S,
    slim: impl FnMut(&mut K) + Send + 'static,
    readiness: &Readiness,
    metrics: &Metrics,
) -> Cached<K>
where
    K: Resource
        + kube::runtime::reflector::Lookup
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    <K as kube::runtime::reflector::Lookup>::DynamicType:
        Default + std::hash::Hash + Eq + Clone + Send + Sync,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let ready = readiness.gate(name);
    let gauge = metrics.cache_ready.with_label_values(&[name]);
    gauge.set(0);

    tokio::spawn(async move {
        let mut events = std::pin::pin!(reflector::reflector(
            writer,
            shared::kube::watch::reconnecting(stream).modify(slim)
        ));
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                // The backoff keeps retrying (shared::kube::watch); say what is wrong and how to fix it.
                tracing::warn!(
                    cache = name,
                    error = %e,
                    "watch failed, retrying with backoff; check the API server is reachable and the \
                     webhook's ClusterRole grants {needs}"
                );
            }
        }
        tracing::error!(
            cache = name,
            "watch stream ended; the cache will no longer be updated"
        );
    });

    let gate = ready.clone();
    let reader = store.clone();
    tokio::spawn(async move {
        if reader.wait_until_ready().await.is_ok() {
            gate.set(true);
            gauge.set(1);
            tracing::info!(cache = name, objects = reader.len(), "cache synced");
        }
    });
    Cached { store, ready, name }
}
