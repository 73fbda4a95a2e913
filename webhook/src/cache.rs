//! Watch caches the decisions are served from (never a LIST per request):
//! NodeMaintenances, Node metadata and, on OpenShift only, the PodDisruptionBudgets
//! and pods of `openshift-etcd`. Each cache opens its readiness gate once it
//! holds its first complete list.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodStatus};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use shared::NodeMaintenance;
use shared::consts::{ETCD_NAMESPACE, OPENSHIFT_CONFIG_GROUP, OPENSHIFT_CONFIG_VERSION};
use shared::nodes::is_control_plane;
use shared::probes::{Gate, Readiness};

use crate::config::OpenShiftMode;
use crate::etcd;
use crate::metrics::Metrics;
use crate::validate::{EtcdGuard, Lookups, NodeFacts, Unavailable};

/// Cache names, used for readiness gates, the `cache` metric label and logs.
const NODES: &str = "nodes";
const MAINTENANCES: &str = "nodemaintenances";
const ETCD_PDBS: &str = "openshift-etcd poddisruptionbudgets";
const ETCD_PODS: &str = "openshift-etcd pods";
const OPENSHIFT_DETECTION: &str = "openshift detection";

/// A reflector store plus the gate that says it has its first full list.
struct Cached<K: kube::runtime::reflector::Lookup + Clone + 'static>
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
    fn ready_store(&self) -> Result<&Store<K>, Unavailable> {
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

struct EtcdCaches {
    pdbs: Cached<PodDisruptionBudget>,
    pods: Cached<Pod>,
}

/// The caches behind [`Lookups`].
pub struct Caches {
    client: Client,
    nodes: Cached<PartialObjectMeta<Node>>,
    maintenances: Cached<NodeMaintenance>,
    /// Set once OpenShift detection finished: `Some` on OpenShift.
    etcd: OnceLock<Option<EtcdCaches>>,
}

impl Caches {
    /// Start every watch in the background and return the caches at once;
    /// lookups answer "please try again" until each cache has synced.
    pub fn start(
        client: Client,
        mode: OpenShiftMode,
        readiness: &Readiness,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let detection_gate = readiness.gate(OPENSHIFT_DETECTION);
        let nodes = spawn_cache(
            NODES,
            "get, list and watch on nodes",
            // Metadata-only requests: the labels are all the rules need.
            watcher(
                Api::<PartialObjectMeta<Node>>::all(client.clone()),
                watcher::Config::default(),
            ),
            |n: &mut PartialObjectMeta<Node>| {
                // Only the name and the role labels matter; node annotations can be large.
                n.managed_fields_mut().clear();
                n.annotations_mut().clear();
            },
            readiness,
            metrics,
        );
        let maintenances = spawn_cache(
            MAINTENANCES,
            "get, list and watch on nodemaintenances.nodemaintenance.medik8s.io",
            watcher(
                Api::<NodeMaintenance>::all(client.clone()),
                watcher::Config::default(),
            ),
            |nm: &mut NodeMaintenance| {
                nm.managed_fields_mut().clear();
                nm.annotations_mut().clear();
                nm.status = None;
            },
            readiness,
            metrics,
        );
        let caches = Arc::new(Caches {
            client: client.clone(),
            nodes,
            maintenances,
            etcd: OnceLock::new(),
        });

        let task_caches = caches.clone();
        let readiness = readiness.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let openshift = match mode {
                OpenShiftMode::True => true,
                OpenShiftMode::False => false,
                OpenShiftMode::Auto => detect_openshift_until_known(&client).await,
            };
            metrics.openshift.set(i64::from(openshift));
            tracing::info!(openshift, mode = ?mode, "etcd quorum rule {}", if openshift { "applies" } else { "does not apply" });
            let etcd = openshift.then(|| EtcdCaches {
                pdbs: spawn_cache(
                    ETCD_PDBS,
                    "get, list and watch on poddisruptionbudgets in openshift-etcd",
                    watcher(
                        Api::<PodDisruptionBudget>::namespaced(client.clone(), ETCD_NAMESPACE),
                        watcher::Config::default(),
                    ),
                    |p: &mut PodDisruptionBudget| p.managed_fields_mut().clear(),
                    &readiness,
                    &metrics,
                ),
                pods: spawn_cache(
                    ETCD_PODS,
                    "get, list and watch on pods in openshift-etcd",
                    watcher(
                        Api::<Pod>::namespaced(client.clone(), ETCD_NAMESPACE),
                        watcher::Config::default(),
                    ),
                    slim_pod,
                    &readiness,
                    &metrics,
                ),
            });
            // The etcd gates exist before detection reports done, so /readyz
            // never turns green between the two.
            let _ = task_caches.etcd.set(etcd);
            detection_gate.set(true);
        });
        caches
    }
}

/// Keep only what the quorum rule reads: labels, node and the Ready condition.
fn slim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.annotations_mut().clear();
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec {
        node_name,
        ..Default::default()
    });
    let conditions = pod.status.as_ref().and_then(|s| {
        s.conditions
            .as_ref()
            .map(|cs| cs.iter().filter(|c| c.type_ == "Ready").cloned().collect())
    });
    pod.status = Some(PodStatus {
        conditions,
        ..Default::default()
    });
}

/// Run one reflector in the background; open its gate on the first full list.
fn spawn_cache<K, S>(
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
            stream
                .backoff(shared::watch::reconnect_backoff())
                .modify(slim)
        ));
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                // The backoff keeps retrying (shared::watch); say what is wrong and how to fix it.
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

/// Ask discovery whether `config.openshift.io/v1` is served, retrying until the
/// API server answers (the webhook stays unready meanwhile).
async fn detect_openshift_until_known(client: &Client) -> bool {
    let mut delay = Duration::from_millis(500);
    loop {
        match client.list_api_groups().await {
            Ok(groups) => {
                return groups.groups.iter().any(|g| {
                    g.name == OPENSHIFT_CONFIG_GROUP
                        && g.versions
                            .iter()
                            .any(|v| v.version == OPENSHIFT_CONFIG_VERSION)
                });
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    retry_in_ms = delay.as_millis() as u64,
                    "OpenShift detection (API discovery of config.openshift.io/v1) failed; retrying. \
                     Pass --openshift=true or --openshift=false to skip detection"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

impl Lookups for Caches {
    fn confirm_node(&self, name: &str) -> futures::future::BoxFuture<'_, Option<NodeFacts>> {
        let api = Api::<Node>::all(self.client.clone());
        let name = name.to_string();
        Box::pin(async move {
            match api.get_metadata_opt(&name).await {
                Ok(found) => found.map(|n| NodeFacts {
                    control_plane: is_control_plane(n.metadata.labels.as_ref()),
                }),
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "could not confirm a node missing from the cache");
                    None
                }
            }
        })
    }

    fn node(&self, name: &str) -> Result<Option<NodeFacts>, Unavailable> {
        let store = self.nodes.ready_store()?;
        Ok(store.get(&ObjectRef::new(name)).map(|n| NodeFacts {
            control_plane: is_control_plane(n.metadata.labels.as_ref()),
        }))
    }

    fn maintenance_exists_for(&self, node: &str) -> Result<bool, Unavailable> {
        let store = self.maintenances.ready_store()?;
        Ok(store.find(|nm| nm.spec.node_name == node).is_some())
    }

    fn is_openshift(&self) -> Result<bool, Unavailable> {
        match self.etcd.get() {
            Some(etcd) => Ok(etcd.is_some()),
            None => Err(Unavailable(
                "OpenShift detection by API discovery has not finished yet (see the webhook log)"
                    .into(),
            )),
        }
    }

    fn etcd_guard(&self, node: &str) -> Result<EtcdGuard, Unavailable> {
        let Some(Some(etcd)) = self.etcd.get() else {
            return Err(Unavailable("the etcd guard caches are not running".into()));
        };
        let pdb_store = etcd.pdbs.ready_store()?;
        let pod_store = etcd.pods.ready_store()?;
        let pdbs = pdb_store.state();
        let guard_pod = match pdbs.as_slice() {
            [pdb] => {
                let pods = pod_store.state();
                etcd::guard_pod_readiness(pdb, pods.iter().map(|p| p.as_ref()), node)
                    .map_err(|e| Unavailable(e.to_string()))?
            }
            // None or several PDBs: the rule denies without looking at pods.
            _ => None,
        };
        Ok(EtcdGuard {
            pdbs: etcd::guard_pdbs(pdbs.iter().map(|p| p.as_ref())),
            guard_pod,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::tests::mk_pod;
    use k8s_openapi::api::core::v1::{Container, PodCondition};

    #[test]
    fn slim_pod_keeps_what_the_quorum_rule_reads() {
        let mut pod = mk_pod("guard", "guard", "cp-1", Some("False"));
        pod.metadata.annotations = Some([("big".to_string(), "x".repeat(1000))].into());
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers = vec![Container {
                name: "c".into(),
                ..Default::default()
            }];
        }
        if let Some(conds) = pod.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conds.push(PodCondition {
                type_: "Initialized".into(),
                status: "True".into(),
                ..Default::default()
            });
        }
        slim_pod(&mut pod);
        assert_eq!(
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str),
            Some("guard")
        );
        assert!(
            pod.metadata
                .annotations
                .as_ref()
                .is_none_or(|a| a.is_empty())
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("cp-1"));
        assert!(spec.containers.is_empty());
        let conds = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .expect("conditions");
        assert_eq!(conds.len(), 1);
        assert_eq!(
            (conds[0].type_.as_str(), conds[0].status.as_str()),
            ("Ready", "False")
        );
    }
}
