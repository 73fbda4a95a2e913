//! Objects the tests create: kwok nodes private to one test (tainted so no
//! other test's pods land there), and workloads pinned to them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Label and taint key that tie a test's nodes and workloads together.
pub const GROUP_KEY: &str = "nmo-test/group";

/// A test's private world: a namespace, and nodes labelled and tainted with its group.
pub struct TestBed {
    pub client: Client,
    pub group: String,
    pub namespace: String,
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("fixture JSON matches the Kubernetes type")
}

impl TestBed {
    pub async fn new(client: Client, prefix: &str) -> anyhow::Result<TestBed> {
        let group = crate::unique(prefix);
        let ns: Namespace = from_json(json!({"metadata": {"name": group}}));
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(TestBed {
            client,
            namespace: group.clone(),
            group,
        })
    }

    /// A Ready kwok node named `<group>-<suffix>`, optionally cordoned.
    pub async fn node(&self, suffix: &str, cordoned: bool) -> anyhow::Result<Node> {
        let name = format!("{}-{suffix}", self.group);
        let node: Node = from_json(json!({
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    GROUP_KEY: self.group,
                }
            },
            "spec": {
                "unschedulable": cordoned,
                "taints": [{"key": GROUP_KEY, "value": self.group, "effect": "NoSchedule"}]
            },
            "status": {
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}
            }
        }));
        let api: Api<Node> = Api::all(self.client.clone());
        let created = api.create(&PostParams::default(), &node).await?;
        Ok(created)
    }

    fn pod_template(&self, app: &str) -> serde_json::Value {
        json!({
            "metadata": {"labels": {"app": app}},
            "spec": {
                "nodeSelector": {GROUP_KEY: self.group},
                "tolerations": [{"key": GROUP_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "registry.invalid/fake:1"}]
            }
        })
    }

    pub async fn deployment(&self, name: &str, replicas: i32) -> anyhow::Result<Deployment> {
        let d: Deployment = from_json(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": self.pod_template(name)
            }
        }));
        Ok(Api::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &d)
            .await?)
    }

    pub async fn daemonset(&self, name: &str) -> anyhow::Result<DaemonSet> {
        let d: DaemonSet = from_json(json!({
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": self.pod_template(name)
            }
        }));
        Ok(Api::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &d)
            .await?)
    }

    /// A pod placed directly on `node`; `extra` is merged into the pod JSON.
    pub async fn pod_on(
        &self,
        name: &str,
        node: &str,
        extra: serde_json::Value,
    ) -> anyhow::Result<Pod> {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": self.pod_template(name)["spec"].clone()
        });
        v["spec"]["nodeName"] = json!(node);
        merge(&mut v, extra);
        let pod: Pod = from_json(v);
        Ok(Api::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pod)
            .await?)
    }

    /// A bare pod (no controller).
    pub async fn bare_pod(&self, name: &str, node: &str) -> anyhow::Result<Pod> {
        self.pod_on(name, node, json!({})).await
    }

    /// A pod with an emptyDir volume.
    pub async fn emptydir_pod(&self, name: &str, node: &str) -> anyhow::Result<Pod> {
        self.pod_on(
            name,
            node,
            json!({"spec": {
                "volumes": [{"name": "scratch", "emptyDir": {}}],
                "containers": [{"name": "c", "image": "registry.invalid/fake:1",
                                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]
            }}),
        )
        .await
    }

    /// The API mirror of a static pod (annotation kubernetes.io/config.mirror).
    pub async fn mirror_pod(&self, name: &str, node: &str) -> anyhow::Result<Pod> {
        self.pod_on(
            name,
            node,
            json!({"metadata": {"annotations": {
                "kubernetes.io/config.mirror": "mirror-hash",
                "kubernetes.io/config.source": "file"
            }}}),
        )
        .await
    }

    /// A finished pod: created on the node, then its status set to Succeeded.
    pub async fn completed_pod(&self, name: &str, node: &str) -> anyhow::Result<Pod> {
        self.pod_on(name, node, json!({"spec": {"restartPolicy": "Never"}}))
            .await?;
        self.finish_pod(name).await
    }

    /// A PodDisruptionBudget over pods labelled app=<app> with minAvailable.
    pub async fn pdb(
        &self,
        name: &str,
        app: &str,
        min_available: i32,
    ) -> anyhow::Result<PodDisruptionBudget> {
        let p: PodDisruptionBudget = from_json(json!({
            "metadata": {"name": name},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}
        }));
        Ok(Api::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &p)
            .await?)
    }

    /// Wait until kube-controller-manager has computed the status of PDB
    /// `name` over `expected_pods` pods (evictions are judged on it).
    pub async fn wait_pdb_status(
        &self,
        name: &str,
        expected_pods: i32,
        deadline: std::time::Duration,
    ) -> anyhow::Result<()> {
        use crate::wait::{Poll, until};
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &self.namespace);
        until(&format!("PDB {name} status computed"), deadline, || async {
            let st = pdbs.get(name).await?.status.unwrap_or_default();
            Ok(
                if st.observed_generation.is_some() && st.expected_pods == expected_pods {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{st:?}"))
                },
            )
        })
        .await
    }

    /// Pods of this test's namespace, by node name.
    pub async fn pods_by_node(&self) -> anyhow::Result<BTreeMap<String, Vec<Pod>>> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&Default::default())
            .await?;
        let mut out: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
        for p in pods.items {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            out.entry(node).or_default().push(p);
        }
        Ok(out)
    }

    /// Delete the namespace and every node of the group (best effort).
    pub async fn teardown(&self) {
        let dp = DeleteParams::default();
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &dp)
            .await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let lp = kube::api::ListParams::default().labels(&format!("{GROUP_KEY}={}", self.group));
        if let Ok(list) = nodes.list(&lp).await {
            for n in list.items {
                if let Some(name) = n.metadata.name {
                    let _ = nodes.delete(&name, &dp).await;
                }
            }
        }
    }
}

/// What a controller test starts from: the CRD and the controller's RBAC
/// installed, its [`TestBed`], its private copy of nmo-system (home of its
/// leader election Lease, see [`crate::manifests::operator_namespace_copy`])
/// and a kubeconfig of the nmo-controller ServiceAccount.
pub struct ControllerBed {
    pub bed: TestBed,
    pub operator_ns: String,
    pub kubeconfig: std::path::PathBuf,
}

impl ControllerBed {
    pub async fn new(prefix: &str) -> ControllerBed {
        let client = crate::admin_client().await.expect("local control plane");
        crate::manifests::install_controller_prereqs(&client)
            .await
            .expect("CRD and RBAC installed");
        let bed = TestBed::new(client.clone(), prefix)
            .await
            .expect("test namespace");
        let operator_ns = crate::manifests::operator_namespace_copy(&client, &bed.group)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let dir = crate::repo_root().join(".cluster/test-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let kubeconfig = dir.join(format!("{}.kubeconfig", bed.group));
        crate::process::service_account_kubeconfig(
            &client,
            "nmo-system",
            "nmo-controller",
            &kubeconfig,
        )
        .await
        .expect("controller kubeconfig");
        ControllerBed {
            bed,
            operator_ns,
            kubeconfig,
        }
    }
}

/// Undo a controller test (best effort): its NodeMaintenances are deleted
/// while its controller still runs, then its namespace and nodes go; the
/// controller is stopped before its copy of nmo-system goes (a leader renewing
/// its Lease there meanwhile would be answered "forbidden").
pub async fn teardown_controller_test(
    bed: &TestBed,
    operator_ns: &str,
    controller: Option<&mut crate::process::Running>,
) {
    let nms: Api<shared::NodeMaintenance> = Api::all(bed.client.clone());
    let lp = kube::api::ListParams::default().labels(&format!("{GROUP_KEY}={}", bed.group));
    if let Ok(list) = nms.list(&lp).await {
        for nm in list.items {
            if let Some(name) = nm.metadata.name {
                let _ = nms.delete(&name, &DeleteParams::default()).await;
            }
        }
    }
    // The controller removes their finalizers: wait (bounded) before it is
    // stopped, or they stay Terminating with nobody to finish them.
    if controller.is_some() {
        let gone = crate::wait::until(
            "the test's NodeMaintenances to be gone before its controller stops",
            std::time::Duration::from_secs(30),
            || async {
                let left = nms.list(&lp).await.map(|l| l.items.len()).unwrap_or(0);
                Ok(if left == 0 {
                    crate::wait::Poll::Ready(())
                } else {
                    crate::wait::Poll::Pending(format!("{left} left"))
                })
            },
        )
        .await;
        if let Err(e) = gone {
            eprintln!("teardown: {e:#} (tests/cluster/sweep.sh removes them after the suite)");
        }
    }
    bed.teardown().await;
    if let Some(c) = controller {
        c.kill();
    }
    crate::manifests::delete_operator_namespace_copy(&bed.client, operator_ns).await;
}

/// Merge JSON `extra` into `base` (objects merged recursively, everything else replaced).
pub fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

/// Whether a pod's Ready condition is True.
pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Owner reference API version of [`TestBed::daemonset_pod`]: apps/v1beta2,
/// no longer served, so the garbage collector cannot resolve the owner and
/// leaves the pod alone.
pub const UNSERVED_DAEMONSET_API_VERSION: &str = "apps/v1beta2";

impl TestBed {
    /// A Ready kwok node with no taints at all (`spec.taints` absent): [`TestBed::node`]
    /// without its group taint. Pods of other tests keep off it only by their
    /// node selectors.
    pub async fn node_without_taints(&self, suffix: &str) -> anyhow::Result<Node> {
        let node = self.node(suffix, false).await?;
        let name = node.metadata.name.clone().unwrap_or_default();
        let api: Api<Node> = Api::all(self.client.clone());
        Ok(api
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await?)
    }

    /// A pod on `node` whose controller is DaemonSet `daemonset` as kubectl
    /// drain judges it: by kind and name (existing or not). In a live cluster
    /// such a pod of a missing DaemonSet is soon deleted by the garbage
    /// collector, and a finished one by its DaemonSet controller; so that the
    /// drain alone decides here, the reference names the owner under an API
    /// version the garbage collector cannot resolve
    /// ([`UNSERVED_DAEMONSET_API_VERSION`]) and a uid no DaemonSet has, which
    /// the DaemonSet controller ignores.
    pub async fn daemonset_pod(
        &self,
        name: &str,
        node: &str,
        daemonset: &str,
    ) -> anyhow::Result<Pod> {
        self.pod_on(
            name,
            node,
            json!({"metadata": {"ownerReferences": [{
                "apiVersion": UNSERVED_DAEMONSET_API_VERSION,
                "kind": "DaemonSet",
                "name": daemonset,
                "uid": "00000000-0000-0000-0000-0000000000d5",
                "controller": true
            }]}}),
        )
        .await
    }

    /// Set pod `name` to phase Succeeded (Ready False), as its kubelet reports
    /// a finished pod. Call it once kwok has marked the pod Running: kwok only
    /// writes the status of Pending pods, so it will not undo this.
    pub async fn finish_pod(&self, name: &str) -> anyhow::Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let patch = json!({"status": {"phase": "Succeeded", "conditions": [
            {"type": "Ready", "status": "False", "reason": "PodCompleted"}]}});
        Ok(api
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await?)
    }
}

/// Label of the pod that runs a KubeVirt VM (virt-controller sets it).
pub const VIRT_LAUNCHER_LABEL: (&str, &str) = ("kubevirt.io", "virt-launcher");
/// Annotation of a virt-launcher pod naming its VirtualMachineInstance.
pub const KUBEVIRT_DOMAIN_ANNOTATION: &str = "kubevirt.io/domain";

impl TestBed {
    /// A virt-launcher pod of VM `vm` as virt-controller creates it: labelled
    /// `kubevirt.io=virt-launcher`, annotated with its VMI's name, an emptyDir
    /// for the VM's runtime files. No owner reference: its owner would be the
    /// VirtualMachineInstance, and the garbage collector deletes pods whose
    /// owner does not exist.
    pub async fn virt_launcher_pod(&self, name: &str, node: &str, vm: &str) -> anyhow::Result<Pod> {
        self.pod_on(
            name,
            node,
            json!({
                "metadata": {
                    "labels": {VIRT_LAUNCHER_LABEL.0: VIRT_LAUNCHER_LABEL.1, "vm.kubevirt.io/name": vm},
                    "annotations": {KUBEVIRT_DOMAIN_ANNOTATION: vm}
                },
                "spec": {
                    "volumes": [{"name": "private", "emptyDir": {}}],
                    "containers": [{"name": "compute", "image": "registry.invalid/virt-launcher:1",
                                    "volumeMounts": [{"name": "private", "mountPath": "/var/run/kubevirt-private"}]}]
                }
            }),
        )
        .await
    }
}

/// An admin client that takes a 429 as the answer it is (kube's client retries
/// 429 by default, for minutes): for eviction requests.
pub async fn no_retry_client() -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::read_from(crate::kubeconfig_path())?;
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    cfg.default_retry = false;
    Ok(Client::try_from(cfg)?)
}
