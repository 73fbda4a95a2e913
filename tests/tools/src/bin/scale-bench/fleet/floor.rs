//! The plane's floor for the fleet scenario, measured: the bench drains as
//! many other untouched nodes itself, from a plain client and with no
//! controller, under the same constraint as the gates: one node per zone at
//! a time, at most `limits.total` at once. Per node: cordon, evict every pod
//! but the DaemonSet's through the Eviction API, wait until the pod watch
//! (the census) sees none left, uncordon; then the zone's next node. The
//! time runs from the start to the moment the last node's pods were gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use tokio::sync::Semaphore;

use super::PROGRESS;
use super::watch::Limits;
use crate::scale::{Census, NAMESPACE};

/// Evictions in flight per node (the controller's drain sends as many).
const EVICTIONS_PER_NODE: usize = 32;
/// Evict again what is still there after this long (a 429 or a lost request).
const EVICT_AGAIN: Duration = Duration::from_secs(10);
const NODE_DEADLINE: Duration = Duration::from_secs(300);

pub struct Floor {
    pub evictions: usize,
    pub took: Duration,
    /// How it was found, for the output.
    pub what: String,
}

/// Drain `nodes` as described above.
pub async fn run(
    client: &Client,
    census: &Census,
    nodes: &[String],
    zones: &HashMap<String, String>,
    limits: Limits,
) -> anyhow::Result<Floor> {
    let mut by_zone: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for n in nodes {
        by_zone
            .entry(zones[n].as_str())
            .or_default()
            .push(n.clone());
    }
    // At most one node per zone and `limits.total` nodes at once.
    let at_most = by_zone.len().min(limits.total).max(1);
    let rounds = by_zone
        .values()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .max(nodes.len().div_ceil(at_most));
    println!(
        "== fleet: the plane's floor: the bench drains {} other nodes itself (cordon, Eviction API, pods gone, uncordon), one per zone at a time, at most {} at once, no controller",
        nodes.len(),
        limits.total
    );
    // An eviction's 429 is an answer, not something to retry for minutes.
    let mut config = nmo_tests::admin_config().await?;
    config.default_retry = false;
    let pods: Api<Pod> = Api::namespaced(Client::try_from(config)?, NAMESPACE);
    let node_api: Api<Node> = Api::all(client.clone());
    let at_once = Arc::new(Semaphore::new(limits.total.max(1)));
    let (drained, evicted) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let start = Instant::now();
    let last_gone = Arc::new(std::sync::Mutex::new(start));
    let zone_workers = by_zone.into_values().map(|zone_nodes| {
        let (pods, node_api, at_once) = (pods.clone(), node_api.clone(), at_once.clone());
        let (drained, evicted, last_gone) = (&drained, &evicted, last_gone.clone());
        async move {
            for node in zone_nodes {
                let _slot = at_once.acquire().await?;
                let n = drain(&node_api, &pods, census, &node, &last_gone).await?;
                evicted.fetch_add(n, Ordering::SeqCst);
                drained.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    let all = futures::future::try_join_all(zone_workers);
    tokio::pin!(all);
    loop {
        tokio::select! {
            r = &mut all => { r?; break; }
            () = tokio::time::sleep(PROGRESS) => println!(
                "  floor: {} of {} nodes drained after {:.0} s",
                drained.load(Ordering::SeqCst),
                nodes.len(),
                start.elapsed().as_secs_f64()
            ),
        }
    }
    let took = last_gone
        .lock()
        .map_or(start.elapsed(), |t| t.duration_since(start));
    let evictions = evicted.load(Ordering::SeqCst);
    println!(
        "  floor: {evictions} evictions from {} nodes, at most {at_most} at once ({rounds} rounds at the least): the last pods gone {:.2} s after the start",
        nodes.len(),
        took.as_secs_f64()
    );
    Ok(Floor {
        evictions,
        took,
        what: format!(
            "measured: the bench drained {} other nodes itself, one per zone at a time, at most {} at once",
            nodes.len(),
            limits.total
        ),
    })
}

/// One node: cordon, evict, wait for its pods to be gone, uncordon; the
/// number of pods evicted. `last_gone` keeps the latest moment pods were gone.
async fn drain(
    node_api: &Api<Node>,
    pods: &Api<Pod>,
    census: &Census,
    node: &str,
    last_gone: &std::sync::Mutex<Instant>,
) -> anyhow::Result<usize> {
    cordon(node_api, node, true).await?;
    let one = [node.to_string()];
    let doomed = census.evictable_on(&one);
    let mut evicted_at: Option<Instant> = None;
    until(
        &format!("the pods of node {node} to be gone"),
        NODE_DEADLINE,
        || {
            let left = census.evictable_on(&one);
            let again = !left.is_empty() && evicted_at.is_none_or(|t| t.elapsed() >= EVICT_AGAIN);
            if again {
                evicted_at = Some(Instant::now());
            }
            async move {
                if left.is_empty() {
                    return Ok(Poll::Ready(()));
                }
                if again {
                    evict(pods, &left).await?;
                }
                Ok(Poll::Pending(format!(
                    "{} pods still on {node}",
                    left.len()
                )))
            }
        },
    )
    .await?;
    if let Ok(mut t) = last_gone.lock() {
        *t = (*t).max(Instant::now());
    }
    cordon(node_api, node, false).await?;
    Ok(doomed.len())
}

async fn evict(pods: &Api<Pod>, names: &[String]) -> anyhow::Result<()> {
    futures::stream::iter(names.iter().cloned())
        .map(|name| async move {
            match pods.evict(&name, &Default::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
                Err(e) => {
                    Err(anyhow::Error::from(e).context(format!("evicting pod {NAMESPACE}/{name}")))
                }
            }
        })
        .buffer_unordered(EVICTIONS_PER_NODE)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
}

async fn cordon(api: &Api<Node>, node: &str, on: bool) -> anyhow::Result<()> {
    let patch = Patch::Merge(json!({"spec": {"unschedulable": on}}));
    api.patch(node, &PatchParams::default(), &patch)
        .await
        .with_context(|| format!("setting spec.unschedulable={on} on node {node}"))
        .map(drop)
}
