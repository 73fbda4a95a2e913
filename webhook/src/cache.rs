//! Watch caches the decisions are served from (never a LIST per request):
//! NodeMaintenances, Node metadata and, on OpenShift only, the PodDisruptionBudgets
//! and pods of `openshift-etcd`. Each cache opens its readiness gate once it
//! holds its first complete list.
//!
//! The admission warnings (`warnings`) read a cluster-wide PodDisruptionBudget
//! cache (few objects; it never gates readiness: warnings must not stop
//! admissions) and, per allowed create, LIST the pods of the node (field
//! selector `spec.nodeName`, served from the API server's watch cache) and GET
//! the VirtualMachineInstances of its virt-launcher pods, within
//! `--warnings-timeout`. Pods are never cached: memory stays flat whatever the
//! cluster's size.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodStatus};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use shared::consts::{ETCD_NAMESPACE, OPENSHIFT_CONFIG_GROUP, OPENSHIFT_CONFIG_VERSION};
use shared::lean::{NodeMeta, forget_managed_fields};
use shared::nodes::is_control_plane;
use shared::probes::{Gate, Readiness};
use shared::slots;
use shared::{NodeMaintenance, NodeMaintenanceStatus};

use crate::config::OpenShiftMode;
use crate::etcd;
use crate::metrics::Metrics;
use crate::validate::{EtcdGuard, Lookups, NodeFacts, Unavailable};
use crate::warnings::{self, Facts, PdbFacts, PodFacts};

/// Objects per page of a cache's full list (kube's default is 500): the
/// page's JSON is held whole while it is decoded.
const LIST_PAGE: u32 = 100;

/// Cache names, used for readiness gates, the `cache` metric label and logs.
const NODES: &str = "nodes";
const MAINTENANCES: &str = "nodemaintenances";
const ETCD_PDBS: &str = "openshift-etcd poddisruptionbudgets";
const ETCD_PODS: &str = "openshift-etcd pods";
const OPENSHIFT_DETECTION: &str = "openshift detection";
const PDBS: &str = "poddisruptionbudgets";

/// KubeVirt's VirtualMachineInstance, read only when discovery says it is served.
const KUBEVIRT_GROUP_VERSION: &str = "kubevirt.io/v1";
const VMI_KIND: &str = "VirtualMachineInstance";
const VMI_PLURAL: &str = "virtualmachineinstances";
/// How long a discovery answer about KubeVirt is trusted.
const KUBEVIRT_DISCOVERY_TTL: Duration = Duration::from_secs(60);

/// What the admission warnings need from the flags.
#[derive(Debug, Clone, Copy)]
pub struct WarningSettings {
    /// --max-concurrent-maintenances, as the controller's (0 = no limit).
    pub max_concurrent_maintenances: usize,
    /// --warnings-timeout: the lookups' budget per review (0 = no warnings).
    pub timeout: Duration,
}

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
    nodes: Cached<NodeMeta>,
    maintenances: Cached<NodeMaintenance>,
    /// Set once OpenShift detection finished: `Some` on OpenShift.
    etcd: OnceLock<Option<EtcdCaches>>,
    /// Every PodDisruptionBudget, for the warnings only (no readiness gate).
    pdbs: Cached<PodDisruptionBudget>,
    warning_settings: WarningSettings,
    /// Last discovery answer to "is kubevirt.io/v1 VirtualMachineInstance served".
    kubevirt: Mutex<Option<(Instant, bool)>>,
    /// Warning lookups under way at once (at most [`WARNING_LOOKUPS`]).
    warning_lookups: tokio::sync::Semaphore,
}

/// Creates whose warnings are looked up at once; others wait within their
/// --warnings-timeout, then go without the pod warnings (and say so).
const WARNING_LOOKUPS: usize = 4;

impl Caches {
    /// Start every watch in the background and return the caches at once;
    /// lookups answer "please try again" until each cache has synced.
    pub fn start(
        client: Client,
        mode: OpenShiftMode,
        warning_settings: WarningSettings,
        readiness: &Readiness,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let detection_gate = readiness.gate(OPENSHIFT_DETECTION);
        let nodes = spawn_cache(
            NODES,
            "get, list and watch on nodes",
            // Metadata-only requests, decoded to name and labels (the roles,
            // all the rules read; shared::lean), 100 nodes per list page.
            watcher(
                Api::<NodeMeta>::all(client.clone()),
                watcher::Config::default().page_size(LIST_PAGE),
            ),
            |_: &mut NodeMeta| {},
            readiness,
            metrics,
        );
        let maintenances = spawn_cache(
            MAINTENANCES,
            "get, list and watch on nodemaintenances.nodemaintenance.medik8s.io",
            watcher(
                Api::<NodeMaintenance>::all(client.clone()),
                watcher::Config::default().page_size(LIST_PAGE),
            ),
            |nm: &mut NodeMaintenance| {
                forget_managed_fields(&mut nm.metadata);
                nm.annotations_mut().clear();
                // The phase only: it says who holds a maintenance slot.
                let phase = nm.status.take().and_then(|s| s.phase);
                nm.status = phase.map(|phase| NodeMaintenanceStatus {
                    phase: Some(phase),
                    ..Default::default()
                });
            },
            readiness,
            metrics,
        );
        // Its gate lives in a Readiness of its own: /readyz never waits for
        // the warnings' cache.
        let pdbs = spawn_cache(
            PDBS,
            "list and watch on poddisruptionbudgets (for admission warnings only)",
            watcher(
                Api::<PodDisruptionBudget>::all(client.clone()),
                watcher::Config::default().page_size(LIST_PAGE),
            ),
            slim_pdb,
            &Readiness::default(),
            metrics,
        );
        let caches = Arc::new(Caches {
            client: client.clone(),
            nodes,
            maintenances,
            etcd: OnceLock::new(),
            pdbs,
            warning_settings,
            kubevirt: Mutex::new(None),
            warning_lookups: tokio::sync::Semaphore::new(WARNING_LOOKUPS),
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
                    |p: &mut PodDisruptionBudget| forget_managed_fields(&mut p.metadata),
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

/// Keep only what the warnings read: name, namespace, selector, disruptionsAllowed.
fn slim_pdb(pdb: &mut PodDisruptionBudget) {
    forget_managed_fields(&mut pdb.metadata);
    pdb.annotations_mut().clear();
    pdb.labels_mut().clear();
    if let Some(st) = pdb.status.as_mut() {
        st.conditions = None;
        st.disrupted_pods = None;
    }
}

/// Keep only what the quorum rule reads: labels, node and the Ready condition.
fn slim_pod(pod: &mut Pod) {
    forget_managed_fields(&mut pod.metadata);
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

impl Caches {
    /// The NodeMaintenances ahead of `nm` when it will wait for a slot, by
    /// the controller's rules (`shared::slots`).
    fn slot_ahead(&self, nm: &NodeMaintenance) -> Result<Option<Vec<String>>, Unavailable> {
        let max = self.warning_settings.max_concurrent_maintenances;
        if max == 0 {
            return Ok(None);
        }
        let store = self.maintenances.ready_store()?;
        let mut me = slots::Entry::of(nm);
        if me.created.is_empty() {
            // Not stamped yet: it is the newest anyway ('~' sorts after digits).
            me.created = "~".to_string();
        }
        let mut all: Vec<slots::Entry> = store
            .state()
            .iter()
            .map(|o| slots::Entry::of(o))
            .filter(|e| e.name != me.name)
            .collect();
        all.push(me.clone());
        Ok(slots::ahead(&me, &all, max))
    }

    /// Does the API server serve kubevirt.io/v1 VirtualMachineInstances?
    /// Asked only when the node runs virt-launcher pods; the answer is kept
    /// for a minute.
    async fn kubevirt_served(&self) -> Result<bool, String> {
        if let Ok(known) = self.kubevirt.lock() {
            if let Some((at, served)) = *known {
                if at.elapsed() < KUBEVIRT_DISCOVERY_TTL {
                    return Ok(served);
                }
            }
        }
        let served = match self
            .client
            .list_api_group_resources(KUBEVIRT_GROUP_VERSION)
            .await
        {
            Ok(list) => list.resources.iter().any(|r| r.name == VMI_PLURAL),
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            Err(e) => return Err(e.to_string()),
        };
        if let Ok(mut known) = self.kubevirt.lock() {
            *known = Some((Instant::now(), served));
        }
        Ok(served)
    }

    /// The facts behind the warnings for `nm`, each lookup bounded by `deadline`;
    /// what did not answer in time is named in `unchecked`.
    async fn warning_facts(&self, nm: &NodeMaintenance, deadline: tokio::time::Instant) -> Facts {
        let node = nm.spec.node_name.clone();
        let budget = self.warning_settings.timeout;
        let mut facts = Facts {
            node: node.clone(),
            ..Default::default()
        };
        match self.slot_ahead(nm) {
            Ok(ahead) => facts.slot_ahead = ahead,
            Err(e) => facts
                .unchecked
                .push(format!("maintenance slots not checked: {e}")),
        }

        // A storm of creates (GitOps applying a hundred at once) looks up a
        // few nodes at a time: each lookup holds a node's pod list in memory.
        let Ok(Ok(_permit)) =
            tokio::time::timeout_at(deadline, self.warning_lookups.acquire()).await
        else {
            facts.unchecked.push(format!(
                "pods of node {node} not checked: {WARNING_LOOKUPS} other creates were being checked \
                 and --warnings-timeout {budget:?} passed"
            ));
            return facts;
        };
        let pods = shared::lean::list_node_pods(&self.client, &node);
        match tokio::time::timeout_at(deadline, pods).await {
            Ok(Ok(pods)) => facts.pods = pods.iter().map(PodFacts::of).collect(),
            Ok(Err(e)) => {
                facts
                    .unchecked
                    .push(format!("pods of node {node} not checked: {e}"));
                return facts;
            }
            Err(_) => {
                facts.unchecked.push(format!(
                    "pods of node {node} not checked: no answer within --warnings-timeout {budget:?}"
                ));
                return facts;
            }
        }

        if facts.pods.is_empty() {
            return facts;
        }
        match self.pdbs.ready_store() {
            Ok(store) => {
                facts.pdbs = store
                    .state()
                    .iter()
                    .filter(|b| {
                        let ns = b.metadata.namespace.as_deref().unwrap_or_default();
                        facts.pods.iter().any(|p| p.namespace == ns)
                    })
                    .map(|b| PdbFacts::of(b))
                    .collect();
            }
            Err(e) => facts
                .unchecked
                .push(format!("PodDisruptionBudgets not checked: {e}")),
        }

        let mut vmis: Vec<(String, String)> = facts
            .pods
            .iter()
            .filter_map(|p| p.vmi.clone().map(|v| (p.namespace.clone(), v)))
            .collect();
        vmis.sort();
        vmis.dedup();
        if vmis.is_empty() {
            return facts;
        }
        match tokio::time::timeout_at(deadline, self.kubevirt_served()).await {
            Ok(Ok(true)) => {}
            // Not a KubeVirt cluster: nothing to say.
            Ok(Ok(false)) => return facts,
            Ok(Err(e)) => {
                facts.unchecked.push(format!(
                    "VirtualMachineInstances of node {node} not checked: discovery of \
                     {KUBEVIRT_GROUP_VERSION} failed: {e}"
                ));
                return facts;
            }
            Err(_) => {
                facts.unchecked.push(format!(
                    "VirtualMachineInstances of node {node} not checked: no answer within \
                     --warnings-timeout {budget:?}"
                ));
                return facts;
            }
        }
        let ar = ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("kubevirt.io", "v1", VMI_KIND),
            VMI_PLURAL,
        );
        let gets = vmis.into_iter().map(|(ns, name)| {
            let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &ns, &ar);
            async move {
                let got = tokio::time::timeout_at(deadline, api.get_opt(&name)).await;
                (ns, name, got)
            }
        });
        for (ns, name, got) in futures::future::join_all(gets).await {
            match got {
                Ok(Ok(Some(vmi))) => {
                    if let Some(n) = warnings::vmi_not_migratable(&vmi.data) {
                        facts.not_migratable.insert((ns, name), n);
                    }
                }
                // Gone meanwhile: nothing to migrate.
                Ok(Ok(None)) => {}
                Ok(Err(e)) => facts.unchecked.push(format!(
                    "VirtualMachineInstance {ns}/{name} not checked: {e}"
                )),
                Err(_) => facts.unchecked.push(format!(
                    "VirtualMachineInstance {ns}/{name} not checked: no answer within \
                     --warnings-timeout {budget:?}"
                )),
            }
        }
        facts
    }
}

impl Lookups for Caches {
    fn warnings<'a>(
        &'a self,
        nm: &'a NodeMaintenance,
    ) -> futures::future::BoxFuture<'a, Vec<String>> {
        let budget = self.warning_settings.timeout;
        Box::pin(async move {
            if budget.is_zero() {
                return Vec::new();
            }
            let deadline = tokio::time::Instant::now() + budget;
            warnings::build(&self.warning_facts(nm, deadline).await)
        })
    }

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

    /// An API server that never answers: the warnings still come back
    /// within --warnings-timeout, saying what was not checked.
    #[tokio::test]
    async fn warnings_keep_their_time_budget() {
        let silent = tower::service_fn(|_req: axum::http::Request<kube::client::Body>| async {
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(axum::http::Response::new(axum::body::Body::empty()))
        });
        let client = Client::new(silent, "default");
        let metrics = Metrics::new().expect("metrics");
        let budget = Duration::from_millis(150);
        let caches = Caches::start(
            client,
            OpenShiftMode::False,
            WarningSettings {
                max_concurrent_maintenances: 1,
                timeout: budget,
            },
            &Readiness::default(),
            &metrics,
        );
        let nm: NodeMaintenance = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nm-1"}, "spec": {"nodeName": "worker-1", "reason": "r"}
        }))
        .expect("nm");
        let began = Instant::now();
        let warnings = caches.warnings(&nm).await;
        let took = began.elapsed();
        assert!(took >= budget && took < budget * 3, "took {took:?}");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0]
                .starts_with("maintenance slots not checked: the webhook's nodemaintenances cache"),
            "{warnings:?}"
        );
        assert_eq!(
            warnings[1],
            "pods of node worker-1 not checked: no answer within --warnings-timeout 150ms"
        );

        let off = Caches::start(
            Client::new(
                tower::service_fn(|_req: axum::http::Request<kube::client::Body>| async {
                    std::future::pending::<()>().await;
                    Ok::<_, std::convert::Infallible>(axum::http::Response::new(
                        axum::body::Body::empty(),
                    ))
                }),
                "default",
            ),
            OpenShiftMode::False,
            WarningSettings {
                max_concurrent_maintenances: 1,
                timeout: Duration::ZERO,
            },
            &Readiness::default(),
            &metrics,
        );
        assert!(
            off.warnings(&nm).await.is_empty(),
            "--warnings-timeout=0: off"
        );
    }
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
