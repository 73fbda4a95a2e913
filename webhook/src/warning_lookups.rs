//! The API calls the webhook makes besides its watches: the lookups behind
//! the admission warnings (`warnings`), and OpenShift detection at start.
//!
//! Per allowed create, the warnings read two caches (NodeMaintenances for the
//! maintenance slots, the cluster-wide PodDisruptionBudgets), LIST the pods of
//! the node (field selector `spec.nodeName`, served from the API server's
//! watch cache), ask discovery whether KubeVirt is served (the answer is kept
//! for a minute) and GET the VirtualMachineInstances of its virt-launcher
//! pods, all within `--warnings-timeout`. Pods are never cached: memory stays
//! flat whatever the cluster's size. A few creates are looked up at once.
//!
//! OpenShift detection asks discovery whether `config.openshift.io/v1` is
//! served, retrying until the API server answers; `cache` starts the etcd
//! caches on its answer.

use std::sync::Mutex;

use shared::rules::sync::LockExt;
use std::time::{Duration, Instant};

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};
use shared::api::consts::{OPENSHIFT_CONFIG_GROUP, OPENSHIFT_CONFIG_VERSION};
use shared::rules::ttl::TtlCache;
use shared::{NodeMaintenance, rules::slots};
use tokio::time::Instant as Deadline;

use crate::cache::Cached;
use crate::validate::Unavailable;
use crate::warnings::{self, Facts, PdbFacts, PodFacts};

/// KubeVirt's VirtualMachineInstance, read only when discovery says it is served.
const KUBEVIRT_GROUP_VERSION: &str = "kubevirt.io/v1";
const VMI_KIND: &str = "VirtualMachineInstance";
const VMI_PLURAL: &str = "virtualmachineinstances";
/// How long a discovery answer about KubeVirt is trusted.
const KUBEVIRT_DISCOVERY_TTL: Duration = Duration::from_secs(60);

/// Creates whose warnings are looked up at once; others wait within their
/// --warnings-timeout, then go without the pod warnings (and say so).
const WARNING_LOOKUPS: usize = 4;

/// What the admission warnings need from the flags.
#[derive(Debug, Clone, Copy)]
pub struct WarningSettings {
    /// --max-concurrent-maintenances, as the controller's (0 = no limit).
    pub max_concurrent_maintenances: usize,
    /// --warnings-timeout: the lookups' budget per review (0 = no warnings).
    pub timeout: Duration,
}

/// The caches the warnings read; neither gates readiness.
pub(crate) struct WarningCaches<'a> {
    pub maintenances: &'a Cached<NodeMaintenance>,
    pub pdbs: &'a Cached<PodDisruptionBudget>,
}

/// The warnings' lookups: their settings, the KubeVirt discovery answer and
/// the limit on creates looked up at once.
pub(crate) struct WarningLookups {
    client: Client,
    settings: WarningSettings,
    /// Last discovery answer to "is kubevirt.io/v1 VirtualMachineInstance
    /// served", trusted for [`KUBEVIRT_DISCOVERY_TTL`] (one entry, key `()`).
    kubevirt: Mutex<TtlCache<(), bool>>,
    /// Warning lookups under way at once (at most [`WARNING_LOOKUPS`]).
    permits: tokio::sync::Semaphore,
}

impl WarningLookups {
    pub fn new(client: Client, settings: WarningSettings) -> Self {
        WarningLookups {
            client,
            settings,
            kubevirt: Mutex::new(TtlCache::new(1)),
            permits: tokio::sync::Semaphore::new(WARNING_LOOKUPS),
        }
    }

    /// The warnings for an allowed create of `nm`, within --warnings-timeout
    /// (none at all when it is 0).
    pub async fn warnings(&self, nm: &NodeMaintenance, caches: WarningCaches<'_>) -> Vec<String> {
        let budget = self.settings.timeout;
        if budget.is_zero() {
            return Vec::new();
        }
        let deadline = Deadline::now() + budget;
        warnings::build(&self.facts(nm, caches, deadline).await)
    }

    /// The facts behind the warnings for `nm`, each lookup bounded by `deadline`;
    /// what did not answer in time is named in `unchecked`.
    async fn facts(
        &self,
        nm: &NodeMaintenance,
        caches: WarningCaches<'_>,
        deadline: Deadline,
    ) -> Facts {
        let node = nm.spec.node_name.clone();
        let budget = self.settings.timeout;
        let mut facts = Facts {
            node: node.clone(),
            ..Default::default()
        };
        match slot_ahead(
            caches.maintenances,
            nm,
            self.settings.max_concurrent_maintenances,
        ) {
            Ok(ahead) => facts.slot_ahead = ahead,
            Err(e) => facts
                .unchecked
                .push(format!("maintenance slots not checked: {e}")),
        }

        // A storm of creates (GitOps applying a hundred at once) looks up a
        // few nodes at a time: each lookup holds a node's pod list in memory.
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.permits.acquire()).await
        else {
            facts.unchecked.push(format!(
                "pods of node {node} not checked: {WARNING_LOOKUPS} other creates were being checked \
                 and --warnings-timeout {budget:?} passed"
            ));
            return facts;
        };
        match self.node_pods(&node, deadline).await {
            Ok(pods) => facts.pods = pods,
            Err(unchecked) => {
                facts.unchecked.push(unchecked);
                return facts;
            }
        }
        if facts.pods.is_empty() {
            return facts;
        }
        match caches.pdbs.ready_store() {
            Ok(store) => facts.pdbs = pdbs_of_pods(&store.state(), &facts.pods),
            Err(e) => facts
                .unchecked
                .push(format!("PodDisruptionBudgets not checked: {e}")),
        }
        self.add_vmis(&mut facts, deadline).await;
        facts
    }

    /// The pods of `node`, or the line saying they were not checked.
    async fn node_pods(&self, node: &str, deadline: Deadline) -> Result<Vec<PodFacts>, String> {
        let budget = self.settings.timeout;
        let pods = shared::kube::partial::list_node_pods(&self.client, node);
        match tokio::time::timeout_at(deadline, pods).await {
            Ok(Ok(pods)) => Ok(pods.iter().map(PodFacts::of).collect()),
            Ok(Err(e)) => Err(format!("pods of node {node} not checked: {e}")),
            Err(_) => Err(format!(
                "pods of node {node} not checked: no answer within --warnings-timeout {budget:?}"
            )),
        }
    }

    /// Which VirtualMachineInstances of the node's virt-launcher pods cannot
    /// live-migrate: asked only on a cluster that serves KubeVirt.
    async fn add_vmis(&self, facts: &mut Facts, deadline: Deadline) {
        let mut vmis: Vec<(String, String)> = facts
            .pods
            .iter()
            .filter_map(|p| p.vmi.clone().map(|v| (p.namespace.clone(), v)))
            .collect();
        vmis.sort();
        vmis.dedup();
        if vmis.is_empty() {
            return;
        }
        match self.kubevirt_served_by(&facts.node, deadline).await {
            Ok(true) => {}
            // Not a KubeVirt cluster: nothing to say.
            Ok(false) => return,
            Err(unchecked) => {
                facts.unchecked.push(unchecked);
                return;
            }
        }
        let budget = self.settings.timeout;
        for (ns, name, got) in self.get_vmis(vmis, deadline).await {
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
    }

    /// [`Self::kubevirt_served`] by `deadline`, or the line saying the VMIs
    /// of `node` were not checked.
    async fn kubevirt_served_by(&self, node: &str, deadline: Deadline) -> Result<bool, String> {
        let budget = self.settings.timeout;
        match tokio::time::timeout_at(deadline, self.kubevirt_served()).await {
            Ok(Ok(served)) => Ok(served),
            Ok(Err(e)) => Err(format!(
                "VirtualMachineInstances of node {node} not checked: discovery of \
                 {KUBEVIRT_GROUP_VERSION} failed: {e}"
            )),
            Err(_) => Err(format!(
                "VirtualMachineInstances of node {node} not checked: no answer within \
                 --warnings-timeout {budget:?}"
            )),
        }
    }

    /// Does the API server serve kubevirt.io/v1 VirtualMachineInstances?
    /// Asked only when the node runs virt-launcher pods; the answer is kept
    /// for a minute.
    async fn kubevirt_served(&self) -> Result<bool, String> {
        if let Some(&served) = self.kubevirt.locked().get(&(), Instant::now()) {
            return Ok(served);
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
        self.kubevirt
            .locked()
            .insert((), served, KUBEVIRT_DISCOVERY_TTL, Instant::now());
        Ok(served)
    }

    /// GET each (namespace, name) VirtualMachineInstance at once, each
    /// bounded by `deadline`.
    async fn get_vmis(&self, vmis: Vec<(String, String)>, deadline: Deadline) -> Vec<VmiAnswer> {
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
        futures::future::join_all(gets).await
    }
}

/// A VMI's namespace, name and GET answer (or the deadline passing).
type VmiAnswer = (
    String,
    String,
    Result<kube::Result<Option<DynamicObject>>, tokio::time::error::Elapsed>,
);

/// The NodeMaintenances ahead of `nm` when it will wait for a slot, by
/// the controller's rules (`shared::rules::slots`); `max` 0 is no limit.
fn slot_ahead(
    maintenances: &Cached<NodeMaintenance>,
    nm: &NodeMaintenance,
    max: usize,
) -> Result<Option<Vec<String>>, Unavailable> {
    if max == 0 {
        return Ok(None);
    }
    let store = maintenances.ready_store()?;
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

/// The PodDisruptionBudgets in the namespaces of `pods`.
fn pdbs_of_pods(pdbs: &[std::sync::Arc<PodDisruptionBudget>], pods: &[PodFacts]) -> Vec<PdbFacts> {
    pdbs.iter()
        .filter(|b| {
            let ns = b.metadata.namespace.as_deref().unwrap_or_default();
            pods.iter().any(|p| p.namespace == ns)
        })
        .map(|b| PdbFacts::of(b))
        .collect()
}

/// Ask discovery whether `config.openshift.io/v1` is served, retrying until the
/// API server answers (the webhook stays unready meanwhile).
pub(crate) async fn detect_openshift_until_known(client: &Client) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Caches;
    use crate::config::OpenShiftMode;
    use crate::metrics::Metrics;
    use crate::validate::Lookups;
    use shared::serve::probes::Readiness;

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
}
