//! A controller test's world: its own kwok nodes, namespace and controller
//! process (from the base Deployment's image, selecting only this test's
//! NodeMaintenances), its private copy of nmo-system for leader election, and
//! the waits and lookups the controller tests share.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use shared::api::consts::LEADER_ELECTION_LEASE_NAME;
use shared::{MaintenancePhase, NodeMaintenance};

use crate::deployment::{Launch, Pod};
use crate::fixtures::{ControllerBed, GROUP_KEY, TestBed, teardown_controller_test};
use crate::wait::{Poll, until};

pub const LONG: Duration = Duration::from_secs(60);

pub struct ControllerEnv {
    pub bed: TestBed,
    /// The test's private copy of nmo-system, home of its leader election Lease.
    pub operator_ns: String,
    pub ctrl: Option<Pod>,
    pub kubeconfig: std::path::PathBuf,
    pub max: usize,
    /// The kustomize directory (under manifests/) whose Deployment runs.
    pub overlay: &'static str,
    /// Host directories standing in for the Deployment's Secret volumes.
    pub volumes: Vec<(String, std::path::PathBuf)>,
    /// Flags every controller of this environment gets (after the manifest's).
    pub flags: Vec<String>,
}

/// manifests/base with the force-drain component (`drainTimeoutAction: Force`
/// allowed, delete on pods granted), as tests/cluster/force-drain renders it.
pub const FORCE_DRAIN_OVERLAY: &str = "../tests/cluster/force-drain";

impl ControllerEnv {
    pub async fn new(prefix: &str, max: usize) -> ControllerEnv {
        Self::new_in(prefix, max, "base").await
    }

    /// A controller from the manifests with the force-drain component, its
    /// extra grant installed.
    pub async fn with_force_drain(prefix: &str, max: usize) -> ControllerEnv {
        let client = crate::admin_client().await.expect("local control plane");
        crate::manifests::install_prereqs(&client, &["manifests/components/force-drain/rbac.yaml"])
            .await
            .expect("the force-drain component's RBAC");
        Self::new_in(prefix, max, FORCE_DRAIN_OVERLAY).await
    }

    /// A controller from the Deployment of `manifests/<overlay>`, its Secret
    /// volumes standing at `volumes`.
    pub async fn with_overlay(
        prefix: &str,
        max: usize,
        overlay: &'static str,
        volumes: Vec<(String, std::path::PathBuf)>,
    ) -> ControllerEnv {
        Self::new_with(prefix, max, overlay, volumes).await
    }

    async fn new_in(prefix: &str, max: usize, overlay: &'static str) -> ControllerEnv {
        Self::new_with(prefix, max, overlay, Vec::new()).await
    }

    async fn new_with(
        prefix: &str,
        max: usize,
        overlay: &'static str,
        volumes: Vec<(String, std::path::PathBuf)>,
    ) -> ControllerEnv {
        Self::new_with_flags(prefix, max, overlay, volumes, Vec::new()).await
    }

    async fn new_with_flags(
        prefix: &str,
        max: usize,
        overlay: &'static str,
        volumes: Vec<(String, std::path::PathBuf)>,
        flags: Vec<String>,
    ) -> ControllerEnv {
        let ControllerBed {
            bed,
            operator_ns,
            kubeconfig,
        } = ControllerBed::new(prefix).await;
        let mut env = ControllerEnv {
            bed,
            operator_ns,
            ctrl: None,
            kubeconfig,
            max,
            overlay,
            volumes,
            flags,
        };
        env.start_controller().await;
        env
    }

    /// A controller from the base Deployment with the fleet gate `flags`,
    /// counting only this test's nodes (`--fleet-node-selector`), so tests
    /// side by side keep out of each other's budgets. No slot limit.
    pub async fn gated(prefix: &str, flags: &[&str]) -> ControllerEnv {
        let ControllerBed {
            bed,
            operator_ns,
            kubeconfig,
        } = ControllerBed::new(prefix).await;
        let mut flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
        flags.push(format!("--fleet-node-selector={GROUP_KEY}={}", bed.group));
        let mut env = ControllerEnv {
            bed,
            operator_ns,
            ctrl: None,
            kubeconfig,
            max: 0,
            overlay: "base",
            volumes: Vec::new(),
            flags,
        };
        env.start_controller().await;
        env
    }

    /// A node of this test (`suffix`) with label `key=value`, cordoned or not.
    pub async fn labelled_node(
        &self,
        suffix: &str,
        cordoned: bool,
        key: &str,
        value: &str,
    ) -> String {
        let name = self
            .bed
            .node(suffix, cordoned)
            .await
            .expect("node")
            .name_any();
        self.nodes()
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
            )
            .await
            .expect("node labelled");
        name
    }

    /// Wait until NodeMaintenance `name` is Pending and held by gate `reason`.
    pub async fn wait_held(&self, name: &str, reason: &str) -> NodeMaintenance {
        self.wait_nm(name, &format!("Pending, Queued {reason}"), |nm| {
            nm.phase() == Some(&MaintenancePhase::Pending)
                && nm.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Queued" && c.status == "True" && c.reason == reason)
                })
        })
        .await
    }

    /// A controller from the base Deployment with `flags` after the manifest's
    /// (and those of every controller this environment starts).
    pub async fn with_flags(prefix: &str, max: usize, flags: &[String]) -> ControllerEnv {
        Self::new_with_flags(prefix, max, "base", Vec::new(), flags.to_vec()).await
    }

    /// Start one more controller pod (the base Deployment, from its image) for
    /// this test's NodeMaintenances, with extra flags after the manifest's.
    /// Its leader election in the test's copy of nmo-system keeps parallel
    /// tests apart.
    pub async fn spawn_controller(&self, extra: &[String]) -> Pod {
        let mut args = vec![
            format!("--nodemaintenance-selector={GROUP_KEY}={}", self.bed.group),
            format!("--max-concurrent-maintenances={}", self.max),
            format!("--leader-election-namespace={}", self.operator_ns),
            "--zap-log-level=debug".to_string(),
        ];
        args.extend_from_slice(&self.flags);
        args.extend_from_slice(extra);
        let mut launch = Launch::new(self.overlay, "nmo-controller");
        for (name, path) in &self.volumes {
            launch = launch.volume(name, path);
        }
        let pod = launch
            .extra_args(args)
            .kubeconfig(&self.kubeconfig)
            .start(&self.bed.client)
            .await
            .expect("controller starts");
        pod.wait_ready(LONG).await.expect("controller Ready");
        pod
    }

    /// Replace the environment's controller with one serving /metrics over
    /// plain HTTP (the secure default is tested in metrics_auth.rs), with
    /// `extra` flags; returns the local metrics port. Torn down (its log
    /// shown on failure) with the environment.
    pub async fn plain_metrics_controller(&mut self, extra: &[&str]) -> u16 {
        if let Some(mut c) = self.ctrl.take() {
            c.proc.kill();
        }
        let mut args = vec!["--metrics-secure=false".to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        let pod = self.spawn_controller(&args).await;
        let port = pod.flag_port("metrics-bind-address").expect("metrics port");
        self.ctrl = Some(pod);
        port
    }

    pub async fn start_controller(&mut self) {
        self.ctrl = Some(self.spawn_controller(&[]).await);
    }

    /// A fresh Ready node of this test, by name.
    pub async fn target(&self) -> String {
        self.bed
            .node("target", false)
            .await
            .expect("target node")
            .name_any()
    }

    /// A target node already in maintenance under NodeMaintenance "a" (Succeeded).
    pub async fn node_in_maintenance(&self) -> String {
        let target = self.target().await;
        self.create_nm(&self.n("a"), &target).await;
        self.wait_phase(&self.n("a"), MaintenancePhase::Succeeded)
            .await;
        target
    }

    /// A NodeMaintenance name unique to this test run.
    pub fn n(&self, short: &str) -> String {
        format!("{}-{short}", self.bed.group)
    }

    pub fn client(&self) -> Client {
        self.bed.client.clone()
    }

    pub fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.client())
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client())
    }

    pub async fn create_nm(&self, name: &str, node: &str) -> NodeMaintenance {
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {GROUP_KEY: self.bed.group}},
            "spec": {"nodeName": node, "reason": "integration test"}
        }))
        .expect("nm json");
        self.nms()
            .create(&PostParams::default(), &nm)
            .await
            .expect("NodeMaintenance created")
    }

    /// A node of this test (`suffix`) drained by NodeMaintenance `short`
    /// (phase Succeeded): (its full name, the node's).
    pub async fn drained(&self, suffix: &str, short: &str) -> (String, String) {
        let node = self.bed.node(suffix, false).await.expect("node").name_any();
        let nm = self.n(short);
        self.create_nm(&nm, &node).await;
        self.wait_phase(&nm, MaintenancePhase::Succeeded).await;
        (nm, node)
    }

    /// Wait until the NodeMaintenance satisfies `ok`, printing its status when it never does.
    pub async fn wait_nm(
        &self,
        name: &str,
        what: &str,
        ok: impl Fn(&NodeMaintenance) -> bool,
    ) -> NodeMaintenance {
        self.wait_nm_within(name, what, LONG, ok).await
    }

    /// [`ControllerEnv::wait_nm`] with a deadline of its own.
    pub async fn wait_nm_within(
        &self,
        name: &str,
        what: &str,
        within: Duration,
        ok: impl Fn(&NodeMaintenance) -> bool,
    ) -> NodeMaintenance {
        let api = self.nms();
        let res = until(what, within, || {
            let api = api.clone();
            let ok = &ok;
            async move {
                let nm = api.get(name).await?;
                Ok(if ok(&nm) {
                    Poll::Ready(nm)
                } else {
                    Poll::Pending(format!("status {}", serde_json::to_string(&nm.status)?))
                })
            }
        })
        .await;
        match res {
            Ok(nm) => nm,
            Err(e) => panic!("{e:#}\n{}", crate::component_log_tails(10)),
        }
    }

    pub async fn wait_phase(&self, name: &str, phase: MaintenancePhase) -> NodeMaintenance {
        self.wait_nm(
            name,
            &format!("NodeMaintenance {name} phase {phase}"),
            |nm| nm.phase() == Some(&phase),
        )
        .await
    }

    pub async fn wait_gone(&self, name: &str) {
        let api = self.nms();
        until(
            &format!("NodeMaintenance {name} to be deleted"),
            LONG,
            || {
                let api = api.clone();
                async move {
                    Ok(match api.get_opt(name).await? {
                        None => Poll::Ready(()),
                        Some(nm) => Poll::Pending(format!(
                            "still there, finalizers {:?}, status {}",
                            nm.finalizers(),
                            serde_json::to_string(&nm.status)?
                        )),
                    })
                }
            },
        )
        .await
        .expect("NodeMaintenance deleted");
    }

    pub async fn wait_pods<F>(&self, what: &str, ok: F)
    where
        F: Fn(&BTreeMap<String, Vec<k8s_openapi::api::core::v1::Pod>>) -> bool,
    {
        until(what, LONG, || {
            let ok = &ok;
            async move {
                let by_node = self.bed.pods_by_node().await?;
                Ok(if ok(&by_node) {
                    Poll::Ready(())
                } else {
                    Poll::Pending(describe_pods(&by_node))
                })
            }
        })
        .await
        .expect("pods reach the expected placement");
    }

    pub async fn lease(&self, node: &str) -> Option<Lease> {
        Api::<Lease>::namespaced(self.client(), "medik8s-leases")
            .get_opt(&format!("node-{node}"))
            .await
            .expect("lease lookup")
    }

    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        Api::<Event>::namespaced(self.client(), "default")
            .list(&lp)
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| {
                e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("NodeMaintenance")
            })
            .filter_map(|e| e.reason)
            .collect()
    }

    pub async fn wait_event(&self, object: &str, reason: &str) {
        until(
            &format!("event {reason} on {object}"),
            LONG,
            || async move {
                let seen = self.event_reasons(object).await;
                Ok(if seen.iter().any(|r| r == reason) {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("events {seen:?}"))
                })
            },
        )
        .await
        .expect("event recorded");
    }

    /// NodeMaintenance "a" on a fresh node with two bare pods, one of them
    /// ("guarded") held by PodDisruptionBudget "guard": Running, progress 50.
    pub async fn blocked_maintenance(&self) -> NodeMaintenance {
        let bed = &self.bed;
        let target = bed.node("target", false).await.expect("node").name_any();
        bed.node("spare", false).await.expect("spare");
        bed.bare_pod("guarded", &target).await.expect("guarded pod");
        bed.bare_pod("free", &target).await.expect("free pod");
        bed.pdb("guard", "guarded", 1).await.expect("pdb");
        // The PDB controller must have computed status before evictions are judged.
        bed.wait_pdb_status("guard", 1, LONG)
            .await
            .expect("pdb status");
        self.create_nm(&self.n("a"), &target).await;
        self.wait_nm(&self.n("a"), "free pod gone, guarded pod pending", |nm| {
            nm.status.as_ref().is_some_and(|s| {
                s.pending_pods == vec!["guarded".to_string()] && s.last_error.contains("guarded")
            })
        })
        .await
    }

    /// Lift the PodDisruptionBudget of [`ControllerEnv::blocked_maintenance`].
    pub async fn lift_pdb(&self) {
        Api::<PodDisruptionBudget>::namespaced(self.client(), &self.bed.namespace)
            .delete("guard", &DeleteParams::default())
            .await
            .expect("lift the PDB");
    }

    pub async fn teardown(mut self) {
        let ctrl = self.ctrl.as_mut().map(|c| &mut c.proc);
        teardown_controller_test(&self.bed, &self.operator_ns, ctrl).await;
    }
}

pub fn describe_pods(by_node: &BTreeMap<String, Vec<k8s_openapi::api::core::v1::Pod>>) -> String {
    by_node
        .iter()
        .map(|(n, pods)| {
            let names: Vec<String> = pods
                .iter()
                .map(|p| {
                    format!(
                        "{}({})",
                        p.name_any(),
                        p.status
                            .as_ref()
                            .and_then(|s| s.phase.clone())
                            .unwrap_or_default()
                    )
                })
                .collect();
            format!(
                "{}: [{}]",
                if n.is_empty() { "<unscheduled>" } else { n },
                names.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn node_taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

pub fn running_on(
    by_node: &BTreeMap<String, Vec<k8s_openapi::api::core::v1::Pod>>,
    node: &str,
    prefix: &str,
) -> usize {
    by_node
        .get(node)
        .map(|v| {
            v.iter()
                .filter(|p| {
                    p.name_any().starts_with(prefix) && p.metadata.deletion_timestamp.is_none()
                })
                .filter(|p| crate::fixtures::is_ready(p))
                .count()
        })
        .unwrap_or(0)
}

/// One controller replica of an HA test: its pod and where its plain metrics are.
pub struct Replica {
    pub pod: Pod,
    pub metrics: u16,
}

impl ControllerEnv {
    /// A replica of the base Deployment (leader election on, as the manifest has it).
    pub async fn replica(&self) -> Replica {
        let pod = self
            .spawn_controller(&["--metrics-secure=false".to_string()])
            .await;
        let metrics = pod.flag_port("metrics-bind-address").expect("metrics port");
        Replica { pod, metrics }
    }

    /// The leader election Lease of this test (in its copy of nmo-system).
    pub async fn leader_lease(&self) -> Option<Lease> {
        Api::<Lease>::namespaced(self.client(), &self.operator_ns)
            .get_opt(LEADER_ELECTION_LEASE_NAME)
            .await
            .expect("read the leader Lease")
    }

    pub async fn holder(&self) -> Option<String> {
        self.leader_lease()
            .await
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty())
    }

    /// Wait until one of `replicas` holds the Lease; returns its index.
    pub async fn wait_leader(&self, replicas: &[&Replica]) -> usize {
        until("one replica to hold the leader Lease", LONG, || async {
            let h = self.holder().await;
            Ok(
                match replicas
                    .iter()
                    .position(|r| Some(&r.pod.name) == h.as_ref())
                {
                    Some(i) => Poll::Ready(i),
                    None => Poll::Pending(format!("holder {h:?}")),
                },
            )
        })
        .await
        .expect("a leader")
    }
}

impl Replica {
    /// leader_election_master_status of this replica for the test's Lease.
    pub async fn master_status(&self, lease: &str) -> anyhow::Result<String> {
        let text = crate::process::http_get_local(self.metrics, "/metrics").await?;
        let prefix = format!("leader_election_master_status{{name=\"{lease}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no {prefix}series"))
    }

    pub async fn wait_master_status(&self, lease: &str, want: &str) {
        until(
            &format!("{} to report master status {want}", self.pod.name),
            LONG,
            || async {
                Ok(match self.master_status(lease).await {
                    Ok(v) if v == want => Poll::Ready(()),
                    Ok(v) => Poll::Pending(v),
                    Err(e) => Poll::Pending(format!("{e:#}")),
                })
            },
        )
        .await
        .expect("leader_election_master_status");
    }

    pub async fn ready(&self) -> bool {
        let port = self.pod.port("health").expect("health port");
        matches!(
            crate::process::http_status_local(port, "/readyz").await,
            Ok((200, _))
        )
    }
}

/// (type, reason, message) of the events the controller wrote about `object`.
pub async fn events_of(client: &Client, object: &str) -> Vec<(String, String, String)> {
    let lp = ListParams::default().fields(&format!("involvedObject.name={object}"));
    let mut seen: Vec<_> = Api::<Event>::namespaced(client.clone(), "default")
        .list(&lp)
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("NodeMaintenance")
        })
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect();
    seen.sort();
    seen
}

pub fn ev(type_: &str, reason: &str, message: &str) -> (String, String, String) {
    (type_.into(), reason.into(), message.into())
}

/// A pod on `node` in namespace `ns`, labelled app=<name>, like the test bed's.
pub async fn pod_in(env: &ControllerEnv, ns: &str, name: &str, node: &str) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": GROUP_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/fake:1"}]
        }
    }))
    .expect("pod json");
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
}

/// PDB `name` (minAvailable 1 over app=<app>) in `ns`, once the disruption
/// controller has counted its one pod (evictions are judged on that).
pub async fn pdb_in(env: &ControllerEnv, ns: &str, name: &str, app: &str) {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client(), ns);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}
    }))
    .expect("pdb json");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("PDB created");
    until(
        &format!("PDB {ns}/{name} status computed"),
        LONG,
        || async {
            let st = pdbs.get(name).await?.status.unwrap_or_default();
            Ok(
                if st.observed_generation.is_some() && st.expected_pods == 1 {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{st:?}"))
                },
            )
        },
    )
    .await
    .expect("PDB status");
}

/// A second namespace of the test (`<group>-b`), for what must be seen in two
/// namespaces; the caller deletes it.
pub async fn second_namespace(env: &ControllerEnv) -> String {
    use k8s_openapi::api::core::v1::Namespace;
    let name = format!("{}-b", env.bed.group);
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace JSON");
    Api::<Namespace>::all(env.client())
        .create(&PostParams::default(), &ns)
        .await
        .expect("second namespace");
    name
}
