//! The API calls the webhook makes besides its watches: the lookups behind
//! the admission warnings (`warnings`), and OpenShift detection at start.
//!
//! Per allowed create, the warnings read two caches (NodeMaintenances for the
//! maintenance slots and the fleet gates, the cluster-wide
//! PodDisruptionBudgets), look up what a set gate needs (`gate_lookups`:
//! the nodes, the alerts, each kept for a few seconds), LIST the pods of
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
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client};
use shared::api::consts::{OPENSHIFT_CONFIG_GROUP, OPENSHIFT_CONFIG_VERSION};
use shared::kube::drain_rules::DrainRules;
use shared::kube::partial::NodeMeta;
use shared::rules::drain::PodLabels;
use shared::rules::ttl::TtlCache;
use shared::serve::gate_flags::Selector;
use shared::{NodeMaintenance, rules::slots};
use tokio::time::Instant as Deadline;

use crate::cached::Cached;
use crate::gate_lookups::{GateLookups, GateSettings, QueueFacts};
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
#[derive(Debug, Clone)]
pub struct WarningSettings {
    /// --max-concurrent-maintenances, as the controller's (0 = no limit).
    pub max_concurrent_maintenances: usize,
    /// --warnings-timeout: the lookups' budget per review (0 = no warnings).
    pub timeout: Duration,
    /// The fleet gates, as the controller's flags set them.
    pub gates: GateSettings,
    /// --nodemaintenance-selector: the NodeMaintenances the queue counts.
    pub selector: Selector,
    /// --exclude-from-load-balancers: the drain's wait before its first
    /// eviction (--load-balancer-drain-delay), as the controller's.
    pub shed_traffic: Option<Duration>,
}

/// The caches the warnings read; neither gates readiness.
pub(crate) struct WarningCaches<'a> {
    pub maintenances: &'a Cached<NodeMaintenance>,
    pub pdbs: &'a Cached<PodDisruptionBudget>,
    /// The node's labels (the drain rules' node selectors).
    pub nodes: &'a Cached<NodeMeta>,
    pub drain_rules: &'a DrainRules,
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
    /// What the fleet gates need, for the "will not start yet" line.
    gates: GateLookups,
}

impl WarningLookups {
    pub fn new(client: Client, settings: WarningSettings) -> Self {
        let gates = GateLookups::new(client.clone(), settings.gates.clone(), settings.timeout);
        WarningLookups {
            client,
            settings,
            kubevirt: Mutex::new(TtlCache::new(1)),
            permits: tokio::sync::Semaphore::new(WARNING_LOOKUPS),
            gates,
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
    /// what did not answer in time is named in `unchecked`. The queue's part
    /// (slots, gates) and the node's part (pods, PDBs, VMIs) run side by side.
    async fn facts(
        &self,
        nm: &NodeMaintenance,
        caches: WarningCaches<'_>,
        deadline: Deadline,
    ) -> Facts {
        let mut facts = Facts {
            node: nm.spec.node_name.clone(),
            ..Default::default()
        };
        let queue = self.queue_facts(caches.maintenances, nm, deadline);
        let node = self.node_facts(&mut facts, &caches, deadline);
        let (queue, ()) = tokio::join!(queue, node);
        facts.shed_traffic = self.settings.shed_traffic.map(|delay| {
            let labelled = node_labels(&caches, &facts.node)
                .contains_key(shared::serve::drain_flags::EXCLUDE_FROM_LB_LABEL);
            (delay, labelled)
        });
        facts.slot_ahead = queue.slot_ahead;
        facts.gate = queue.wait;
        let node_unchecked = std::mem::take(&mut facts.unchecked);
        facts.unchecked = queue.unchecked;
        facts.unchecked.extend(node_unchecked);
        facts
    }

    /// Whether `nm` waits for a slot (--max-concurrent-maintenances) or a
    /// fleet gate, from the NodeMaintenances cache and the gates' lookups.
    async fn queue_facts(
        &self,
        maintenances: &Cached<NodeMaintenance>,
        nm: &NodeMaintenance,
        deadline: Deadline,
    ) -> QueueFacts {
        let max = self.settings.max_concurrent_maintenances;
        let gated = self.gates.any();
        if max == 0 && !gated {
            return QueueFacts::default();
        }
        if !self.settings.selector.matches(nm.metadata.labels.as_ref()) {
            return QueueFacts::default();
        }
        let (me, all) = match entries(maintenances, nm, &self.settings.selector) {
            Ok(entries) => entries,
            Err(e) => {
                let what = match (max > 0, gated) {
                    (true, true) => "maintenance slots and fleet gates",
                    (true, false) => "maintenance slots",
                    (false, _) => "fleet gates",
                };
                return QueueFacts {
                    unchecked: vec![format!("{what} not checked: {e}")],
                    ..QueueFacts::default()
                };
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        self.gates.decide_queue(&me, &all, max, deadline, now).await
    }

    /// The node's part of the facts: its pods, the PodDisruptionBudgets of
    /// their namespaces and the VMIs of its virt-launcher pods.
    async fn node_facts(&self, facts: &mut Facts, caches: &WarningCaches<'_>, deadline: Deadline) {
        let node = facts.node.clone();
        let budget = self.settings.timeout;
        // A storm of creates (GitOps applying a hundred at once) looks up a
        // few nodes at a time: each lookup holds a node's pod list in memory.
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.permits.acquire()).await
        else {
            facts.unchecked.push(format!(
                "pods of node {node} not checked: {WARNING_LOOKUPS} other creates were being checked \
                 and --warnings-timeout {budget:?} passed"
            ));
            return;
        };
        match self.node_pods(&node, caches, deadline).await {
            Ok(pods) => facts.pods = pods,
            Err(unchecked) => {
                facts.unchecked.push(unchecked);
                return;
            }
        }
        if facts.pods.is_empty() {
            return;
        }
        match caches.pdbs.ready_store() {
            Ok(store) => facts.pdbs = pdbs_of_pods(&store.state(), &facts.pods),
            Err(e) => facts
                .unchecked
                .push(format!("PodDisruptionBudgets not checked: {e}")),
        }
        self.add_vmis(facts, deadline).await;
    }

    /// The pods of `node`, or the line saying they were not checked.
    async fn node_pods(
        &self,
        node: &str,
        caches: &WarningCaches<'_>,
        deadline: Deadline,
    ) -> Result<Vec<PodFacts>, String> {
        let budget = self.settings.timeout;
        let pods = shared::kube::partial::list_node_pods(&self.client, node);
        let pods = match tokio::time::timeout_at(deadline, pods).await {
            Ok(Ok(pods)) => pods,
            Ok(Err(e)) => return Err(format!("pods of node {node} not checked: {e}")),
            Err(_) => {
                return Err(format!(
                    "pods of node {node} not checked: no answer within --warnings-timeout {budget:?}"
                ));
            }
        };
        let mut facts: Vec<PodFacts> = pods.iter().map(PodFacts::of).collect();
        // What the drain rules will do with each (the controller's decision).
        let rules = match tokio::time::timeout_at(deadline, caches.drain_rules.current()).await {
            Ok(Ok(rules)) => rules,
            Ok(Err(e)) => return Err(format!("drain rules for node {node} not checked: {e}")),
            Err(_) => {
                return Err(format!(
                    "drain rules for node {node} not checked: no answer within --warnings-timeout {budget:?}"
                ));
            }
        };
        let node_labels = node_labels(caches, node);
        let node_rules = rules.for_node(&node_labels);
        for (f, pod) in facts.iter_mut().zip(&pods) {
            let empty = std::collections::BTreeMap::new();
            let ns = caches.drain_rules.namespace_labels(&f.namespace);
            f.drain = node_rules.decide(PodLabels {
                labels: pod.metadata.labels.as_ref().unwrap_or(&empty),
                annotations: pod.metadata.annotations.as_ref().unwrap_or(&empty),
                namespace_labels: &ns,
            });
        }
        Ok(facts)
    }

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

/// `nm` and every other NodeMaintenance as the slots and the gates count
/// them: `me` last in `all`, stamped the newest when not stamped yet.
/// Only those `selector` matches count (--nodemaintenance-selector).
fn entries(
    maintenances: &Cached<NodeMaintenance>,
    nm: &NodeMaintenance,
    selector: &Selector,
) -> Result<(slots::Entry, Vec<slots::Entry>), Unavailable> {
    let store = maintenances.ready_store()?;
    let mut me = slots::Entry::of(nm);
    if me.created.is_empty() {
        // Not stamped yet: it is the newest anyway ('~' sorts after digits).
        me.created = "~".to_string();
    }
    let mut all: Vec<slots::Entry> = store
        .state()
        .iter()
        .filter(|o| selector.matches(o.metadata.labels.as_ref()))
        .map(|o| slots::Entry::of(o))
        .filter(|e| e.name != me.name)
        .collect();
    all.push(me.clone());
    Ok((me, all))
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

/// The labels of `node` in the node cache (empty when not known).
fn node_labels(
    caches: &WarningCaches<'_>,
    node: &str,
) -> std::collections::BTreeMap<String, String> {
    (caches.nodes.ready_store().ok())
        .and_then(|s| s.get(&ObjectRef::new(node)))
        .and_then(|n| n.metadata.labels.clone())
        .unwrap_or_default()
}
