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
