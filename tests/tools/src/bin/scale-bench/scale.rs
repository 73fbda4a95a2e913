//! The scale plane of `make bench-scale`: its workloads and a census of its
//! pods. The nodes (`scale-1` ... `scale-N`, label `nmo-rs/node-pool=scale`)
//! come from tests/cluster/add-nodes.sh; here every one of them gets
//! [`PODS_PER_NODE`] pods, a mix of the three kinds a drain treats apart:
//!
//! - one pod of DaemonSet `agent` (stays: DaemonSet pods are not drained);
//! - [`PER_DEPLOYMENT_PER_NODE`] pods of each of the Deployments `web-1` ...
//!   `web-<DEPLOYMENTS>`, placed exactly by a topology spread constraint
//!   (replicas = nodes x per node, maxSkew 1); tainted nodes are not counted
//!   (`nodeTaintsPolicy: Honor`), so pods evicted from a cordoned node are
//!   placed again on the others, as the drain expects;
//! - [`BARE_PER_NODE`] pods without a controller, bound to the node by
//!   `spec.nodeName` (evicted and gone for good).
//!
//! Everything lives in namespace [`NAMESPACE`]; creating it again is a no-op,
//! so a kept plane (`BENCH_SCALE_KEEP=1`) is reused as it is.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

pub const NAMESPACE: &str = "nmo-scale";
pub const POOL_LABEL: &str = "nmo-rs/node-pool";
pub const POOL: &str = "scale";
pub const DEPLOYMENTS: usize = 7;
pub const PER_DEPLOYMENT_PER_NODE: usize = 2;
pub const BARE_PER_NODE: usize = 15;
/// One DaemonSet pod, the Deployments' and the bare ones.
pub const PODS_PER_NODE: usize = 1 + DEPLOYMENTS * PER_DEPLOYMENT_PER_NODE + BARE_PER_NODE;
/// Label of the pods the soak stage churns (kept out of the fill's counts).
pub const CHURN_LABEL: &str = "nmo-rs/churn";

/// What owns a pod, as far as a drain cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    DaemonSet,
    Deployment,
    Bare,
    Churn,
}

#[derive(Debug, Clone)]
struct Facts {
    node: Option<String>,
    ready: bool,
    kind: Kind,
    /// Its `app` label (the Deployment it belongs to).
    app: String,
}

/// The namespace's pods as one watch sees them (names, node, Ready, kind):
/// the bench's own view, never a LIST of 30,000 pods per look.
#[derive(Clone, Default)]
pub struct Census {
    pods: Arc<Mutex<HashMap<String, Facts>>>,
    synced: Arc<AtomicBool>,
}

/// Totals of a [`Census`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub pods: usize,
    pub ready: usize,
    pub ready_by_kind: BTreeMap<&'static str, usize>,
}

impl Census {
    /// Start the watch in the background.
    pub fn start(client: Client) -> Census {
        let census = Census::default();
        let (pods, synced) = (census.pods.clone(), census.synced.clone());
        let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
        tokio::spawn(async move {
            // With a backoff: an API server restart (the fleet soak) must not
            // turn the reconnects into a busy loop.
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            let mut listing: Option<HashMap<String, Facts>> = None;
            while let Some(event) = stream.next().await {
                let Ok(mut map) = pods.lock() else { return };
                match event {
                    Ok(watcher::Event::Init) => listing = Some(HashMap::new()),
                    Ok(watcher::Event::InitApply(p)) => {
                        if let Some(l) = &mut listing {
                            l.insert(p.name_any(), facts(&p));
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        *map = listing.take().unwrap_or_default();
                        synced.store(true, Ordering::SeqCst);
                    }
                    Ok(watcher::Event::Apply(p)) => {
                        if p.metadata.deletion_timestamp.is_some() {
                            map.remove(&p.name_any());
                        } else {
                            map.insert(p.name_any(), facts(&p));
                        }
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        map.remove(&p.name_any());
                    }
                    Err(e) => eprintln!("[scale] pod watch of {NAMESPACE}: {e} (reconnecting)"),
                }
            }
        });
        census
    }

    /// Wait for the watch's first full list.
    pub async fn synced(&self, deadline: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while !self.synced.load(Ordering::SeqCst) {
            anyhow::ensure!(
                start.elapsed() < deadline,
                "the pod watch of namespace {NAMESPACE} listed nothing within {deadline:?}: is the API server of the scale plane up?"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        if let Ok(map) = self.pods.lock() {
            for f in map.values().filter(|f| f.kind != Kind::Churn) {
                c.pods += 1;
                if f.ready {
                    c.ready += 1;
                    *c.ready_by_kind.entry(kind_name(f.kind)).or_default() += 1;
                }
            }
        }
        c
    }

    /// Pods (of every kind, Ready or not) per node.
    pub fn per_node(&self) -> BTreeMap<String, usize> {
        self.per_node_where(|_| true)
    }

    fn per_node_where(&self, keep: impl Fn(&Facts) -> bool) -> BTreeMap<String, usize> {
        let mut by_node = BTreeMap::new();
        if let Ok(map) = self.pods.lock() {
            for f in map.values().filter(|f| keep(f)) {
                if let Some(node) = &f.node {
                    *by_node.entry(node.clone()).or_default() += 1;
                }
            }
        }
        by_node
    }

    /// The pods on `nodes` a drain evicts (all but the DaemonSet's), by name.
    pub fn evictable_on(&self, nodes: &[String]) -> Vec<String> {
        let wanted: std::collections::HashSet<&String> = nodes.iter().collect();
        let Ok(map) = self.pods.lock() else {
            return vec![];
        };
        map.iter()
            .filter(|(_, f)| f.kind != Kind::DaemonSet)
            .filter(|(_, f)| f.node.as_ref().is_some_and(|n| wanted.contains(n)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Nodes of `nodes` without exactly [`PODS_PER_NODE`] Ready pods, with their count.
    fn off_target(&self, nodes: &[String]) -> Vec<(String, usize)> {
        let ready = self.per_node_where(|f| f.ready && f.kind != Kind::Churn);
        nodes
            .iter()
            .map(|n| (n.clone(), ready.get(n).copied().unwrap_or(0)))
            .filter(|(_, c)| *c != PODS_PER_NODE)
            .collect()
    }

    /// Deployment pods beyond [`PER_DEPLOYMENT_PER_NODE`] of their
    /// Deployment on one node: where earlier drains put them.
    fn surplus(&self) -> Vec<String> {
        let Ok(map) = self.pods.lock() else {
            return vec![];
        };
        let mut seen: HashMap<(String, String), usize> = HashMap::new();
        let mut names: Vec<(&String, &Facts)> = map
            .iter()
            .filter(|(_, f)| f.kind == Kind::Deployment)
            .collect();
        names.sort_by_key(|(n, _)| *n);
        names
            .into_iter()
            .filter(|(_, f)| {
                let Some(node) = &f.node else { return false };
                let n = seen.entry((node.clone(), f.app.clone())).or_default();
                *n += 1;
                *n > PER_DEPLOYMENT_PER_NODE
            })
            .map(|(name, _)| name.clone())
            .collect()
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::DaemonSet => "DaemonSet",
        Kind::Deployment => "Deployment",
        Kind::Bare => "bare",
        Kind::Churn => "churn",
    }
}

fn facts(p: &Pod) -> Facts {
    let owner = p.owner_references().first().map(|o| o.kind.as_str());
    let kind = if p.labels().contains_key(CHURN_LABEL) {
        Kind::Churn
    } else {
        match owner {
            Some("DaemonSet") => Kind::DaemonSet,
            Some("ReplicaSet") => Kind::Deployment,
            _ => Kind::Bare,
        }
    };
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Facts {
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready,
        kind,
        app: p.labels().get("app").cloned().unwrap_or_default(),
    }
}

/// The pod template every workload here shares: on the scale pool, gone at
/// once when deleted (kwok has no containers to stop).
fn pod_spec() -> serde_json::Value {
    json!({
        "nodeSelector": {POOL_LABEL: POOL},
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "registry.invalid/scale:1"}]
    })
}

/// A bare pod named `name` bound to `node`, with `labels`.
pub fn bare_pod(name: &str, node: &str, labels: serde_json::Value) -> anyhow::Result<Pod> {
    let mut spec = pod_spec();
    spec["nodeName"] = json!(node);
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": spec
    }))?)
}

/// Create `obj`; one that exists already is fine (a kept plane).
async fn create_once<K>(api: &Api<K>, obj: &K) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {} in {NAMESPACE}", obj.name_any())),
    }
}

/// Every pod of the plane, as [`Census::counts`] should count it once filled.
pub fn wanted(nodes: usize) -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("DaemonSet", nodes),
        ("Deployment", nodes * DEPLOYMENTS * PER_DEPLOYMENT_PER_NODE),
        ("bare", nodes * BARE_PER_NODE),
    ])
}

/// Create the workloads for `nodes` and wait until every pod is Ready,
/// printing progress every 5 s. Returns how long the pods took.
pub async fn fill(
    client: &Client,
    nodes: &[String],
    census: &Census,
    deadline: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    create_once(&Api::all(client.clone()), &ns).await?;
    wait_default_service_account(client).await?;
    let n = nodes.len();
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": pod_spec()}
        }
    }))?;
    create_once(&daemonsets, &ds).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    for d in 1..=DEPLOYMENTS {
        let app = format!("web-{d}");
        let mut spec = pod_spec();
        spec["topologySpreadConstraints"] = json!([{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "nodeTaintsPolicy": "Honor",
            "labelSelector": {"matchLabels": {"app": app}}
        }]);
        let dep: Deployment = serde_json::from_value(json!({
            "metadata": {"name": app},
            "spec": {
                "replicas": n * PER_DEPLOYMENT_PER_NODE,
                "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": {"app": app}}, "spec": spec}
            }
        }))?;
        create_once(&deployments, &dep).await?;
        // A kept plane given more nodes: its Deployments follow the count.
        let replicas = json!({"spec": {"replicas": n * PER_DEPLOYMENT_PER_NODE}});
        deployments
            .patch(&app, &PatchParams::default(), &Patch::Merge(&replicas))
            .await
            .with_context(|| format!("scaling Deployment {NAMESPACE}/{app} to {n} nodes"))?;
    }
    println!(
        "fill: DaemonSet agent and {DEPLOYMENTS} Deployments created ({} replicas each); creating {} bare pods",
        n * PER_DEPLOYMENT_PER_NODE,
        n * BARE_PER_NODE
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let bare: Vec<(String, String)> = nodes
        .iter()
        .flat_map(|node| (1..=BARE_PER_NODE).map(move |i| (format!("b-{node}-{i}"), node.clone())))
        .collect();
    let creating = {
        let pods = pods.clone();
        async move {
            futures::stream::iter(bare)
                .map(|(name, node)| {
                    let pods = pods.clone();
                    async move {
                        let pod = bare_pod(&name, &node, json!({"app": "bare"}))?;
                        create_once(&pods, &pod).await
                    }
                })
                .buffer_unordered(32)
                .try_collect::<Vec<()>>()
                .await
        }
    };
    // A kept plane: the Deployment pods that earlier drains moved go back
    // where the spread puts them (their replacements land on the nodes short
    // of them), the bare pods they evicted are created again above.
    let surplus = census.surplus();
    if !surplus.is_empty() {
        println!(
            "fill: {} Deployment pods stand where earlier drains put them; deleting them so the spread places them again",
            surplus.len()
        );
        futures::stream::iter(surplus)
            .map(|name| {
                let pods = pods.clone();
                async move {
                    match pods.delete(&name, &Default::default()).await {
                        Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
                        Err(e) => {
                            Err(anyhow::Error::from(e).context(format!("deleting pod {name}")))
                        }
                    }
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<()>>()
            .await?;
    }
    let want = wanted(n);
    let total: usize = want.values().sum();
    let waiting = async {
        let mut last = Instant::now();
        loop {
            let c = census.counts();
            let off = census.off_target(nodes);
            if off.is_empty() && c.pods == total {
                return Ok::<_, anyhow::Error>(start.elapsed());
            }
            if start.elapsed() > deadline {
                anyhow::bail!(
                    "the scale plane's pods were not all Ready within {deadline:?}: {} of {total} exist, {} Ready ({:?}; wanted {want:?}); {} nodes without {PODS_PER_NODE} Ready pods, e.g. {:?}; see the kube-controller-manager, kube-scheduler and kwok logs under $NMO_CLUSTER_DIR/logs",
                    c.pods,
                    c.ready,
                    c.ready_by_kind,
                    off.len(),
                    off.first()
                );
            }
            if last.elapsed() >= Duration::from_secs(5) {
                println!(
                    "fill: {:>6} of {total} pods exist, {:>6} Ready {:?} after {:.0} s",
                    c.pods,
                    c.ready,
                    c.ready_by_kind,
                    start.elapsed().as_secs_f64()
                );
                last = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let (created, took) = futures::join!(creating, waiting);
    created?;
    took
}

/// Pods of a new namespace are refused until its ServiceAccount exists.
async fn wait_default_service_account(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    nmo_tests::wait::until(
        &format!("ServiceAccount {NAMESPACE}/default"),
        Duration::from_secs(60),
        || async {
            Ok(match api.get_opt("default").await? {
                Some(_) => nmo_tests::wait::Poll::Ready(()),
                None => nmo_tests::wait::Poll::Pending("not created yet".into()),
            })
        },
    )
    .await
}
