//! Watch caches the decisions are served from (never a LIST per request):
//! NodeMaintenances, Node metadata and, on OpenShift only, the PodDisruptionBudgets
//! and pods of `openshift-etcd`. Each cache opens its readiness gate once it
//! holds its first complete list. `Caches` answers the decision's
//! [`Lookups`] from them; its one call outside a cache is the GET that
//! confirms a node the node cache has not seen yet (`confirm_node`).
//!
//! The admission warnings read a cluster-wide PodDisruptionBudget cache (few
//! objects) and the drain rules' caches (NodeDrainRules, namespace labels);
//! neither gates readiness: warnings must not stop admissions;
//! their other lookups, and OpenShift detection, are `warning_lookups`'.

use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodStatus};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use shared::api::consts::ETCD_NAMESPACE;
use shared::kube::drain_rules::DrainRules;
use shared::kube::partial::{NodeMeta, forget_managed_fields};
use shared::rules::nodes::is_control_plane;
use shared::serve::probes::{Gate, Readiness};
use shared::{NodeMaintenance, NodeMaintenanceStatus};

use crate::cached::{Cached, paged, spawn_cache};
use crate::config::OpenShiftMode;
use crate::etcd;
use crate::metrics::Metrics;
use crate::validate::{EtcdGuard, Lookups, NodeFacts, Unavailable};
pub use crate::warning_lookups::WarningSettings;
use crate::warning_lookups::{self, WarningCaches, WarningLookups};

/// Cache names, used for readiness gates, the `cache` metric label and logs.
const NODES: &str = "nodes";
const MAINTENANCES: &str = "nodemaintenances";
const ETCD_PDBS: &str = "openshift-etcd poddisruptionbudgets";
const ETCD_PODS: &str = "openshift-etcd pods";
const OPENSHIFT_DETECTION: &str = "openshift detection";
const PDBS: &str = "poddisruptionbudgets";

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
    /// The warnings' own lookups (pods, KubeVirt), bounded per create.
    warning_lookups: WarningLookups,
    /// The NodeDrainRules and namespace labels, for the warnings only.
    drain_rules: DrainRules,
}

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
            // all the rules read; shared::kube::partial), 100 nodes per list page.
            watcher(Api::<NodeMeta>::all(client.clone()), paged()),
            |_: &mut NodeMeta| {},
            readiness,
            metrics,
        );
        let maintenances = spawn_cache(
            MAINTENANCES,
            "get, list and watch on nodemaintenances.nodemaintenance.medik8s.io",
            watcher(Api::<NodeMaintenance>::all(client.clone()), paged()),
            slim_maintenance,
            readiness,
            metrics,
        );
        // Its gate lives in a Readiness of its own: /readyz never waits for
        // the warnings' cache.
        let pdbs = spawn_cache(
            PDBS,
            "list and watch on poddisruptionbudgets (for admission warnings only)",
            watcher(Api::<PodDisruptionBudget>::all(client.clone()), paged()),
            slim_pdb,
            &Readiness::default(),
            metrics,
        );
        let (drain_rules, fill_drain_rules) = DrainRules::watch(&client);
        tokio::spawn(fill_drain_rules);
        let caches = Arc::new(Caches {
            client: client.clone(),
            nodes,
            maintenances,
            etcd: OnceLock::new(),
            pdbs,
            drain_rules,
            warning_lookups: WarningLookups::new(client.clone(), warning_settings),
        });
        tokio::spawn(caches.clone().start_etcd_caches(
            client,
            mode,
            detection_gate,
            readiness.clone(),
            metrics.clone(),
        ));
        caches
    }

    /// Detect OpenShift unless `mode` says, then start the etcd caches there
    /// and open the detection gate.
    async fn start_etcd_caches(
        self: Arc<Self>,
        client: Client,
        mode: OpenShiftMode,
        detection_gate: Gate,
        readiness: Readiness,
        metrics: Metrics,
    ) {
        let openshift = match mode {
            OpenShiftMode::True => true,
            OpenShiftMode::False => false,
            OpenShiftMode::Auto => warning_lookups::detect_openshift_until_known(&client).await,
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
        let _ = self.etcd.set(etcd);
        detection_gate.set(true);
    }
}

/// Keep only what the rules read: no managed fields, no annotations, and of
/// the status the phase only (it says who holds a maintenance slot).
fn slim_maintenance(nm: &mut NodeMaintenance) {
    forget_managed_fields(&mut nm.metadata);
    nm.annotations_mut().clear();
    let phase = nm.status.take().and_then(|s| s.phase);
    nm.status = phase.map(|phase| NodeMaintenanceStatus {
        phase: Some(phase),
        ..Default::default()
    });
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

impl Lookups for Caches {
    fn warnings<'a>(
        &'a self,
        nm: &'a NodeMaintenance,
    ) -> futures::future::BoxFuture<'a, Vec<String>> {
        let caches = WarningCaches {
            maintenances: &self.maintenances,
            pdbs: &self.pdbs,
            nodes: &self.nodes,
            drain_rules: &self.drain_rules,
        };
        Box::pin(self.warning_lookups.warnings(nm, caches))
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
pub(crate) mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    use crate::etcd::tests::mk_pod;
    use crate::gate_lookups::GateSettings;
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

    /// A client of an API server that never answers.
    pub(crate) fn silent_client() -> Client {
        let silent = tower::service_fn(|_req: axum::http::Request<kube::client::Body>| async {
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(axum::http::Response::new(axum::body::Body::empty()))
        });
        Client::new(silent, "default")
    }

    /// `nm-1`, for node `worker-1`.
    fn maintenance_of_worker_1() -> NodeMaintenance {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nm-1"}, "spec": {"nodeName": "worker-1", "reason": "r"}
        }))
        .expect("nm")
    }

    /// An API server that never answers: the warnings still come back
    /// within --warnings-timeout, saying what was not checked.
    #[tokio::test]
    async fn warnings_keep_their_time_budget() {
        let client = silent_client();
        let metrics = Metrics::new().expect("metrics");
        let budget = Duration::from_millis(150);
        let caches = Caches::start(
            client,
            OpenShiftMode::False,
            WarningSettings {
                max_concurrent_maintenances: 1,
                timeout: budget,
                gates: GateSettings::default(),
                selector: Default::default(),
                shed_traffic: None,
            },
            &Readiness::default(),
            &metrics,
        );
        let nm = maintenance_of_worker_1();
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
            silent_client(),
            OpenShiftMode::False,
            WarningSettings {
                max_concurrent_maintenances: 1,
                timeout: Duration::ZERO,
                gates: GateSettings::default(),
                selector: Default::default(),
                shed_traffic: None,
            },
            &Readiness::default(),
            &metrics,
        );
        assert!(
            off.warnings(&nm).await.is_empty(),
            "--warnings-timeout=0: off"
        );
    }

    /// A gate set while the NodeMaintenances cache syncs: named as not
    /// checked with the slots, never guessed.
    #[tokio::test]
    async fn gates_are_named_when_the_queue_is_unknown() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            gates: shared::serve::gate_flags::GateFlags,
        }
        let cli = Cli::try_parse_from(["nmo-webhook", "--pause-after-failure"]).expect("flags");
        let settings = WarningSettings {
            max_concurrent_maintenances: 1,
            timeout: Duration::from_millis(50),
            gates: GateSettings::of(&cli.gates).expect("gates"),
            selector: Default::default(),
            shed_traffic: None,
        };
        let metrics = Metrics::new().expect("metrics");
        let caches = Caches::start(
            silent_client(),
            OpenShiftMode::False,
            settings,
            &Readiness::default(),
            &metrics,
        );
        let nm = maintenance_of_worker_1();
        let warnings = caches.warnings(&nm).await;
        assert!(
            warnings[0].starts_with(
                "maintenance slots and fleet gates not checked: the webhook's nodemaintenances cache"
            ),
            "{warnings:?}"
        );
    }
}
