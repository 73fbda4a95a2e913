//! Beyond upstream: the `NodeDrainRule` custom resource
//! (`nodemaintenance.medik8s.io/v1alpha1`, cluster-scoped), written once by a
//! cluster admin to say how a drain treats some pods: evict them (`Drain`,
//! the default, in ascending `order` groups), keep them on the node
//! (`Skip`), or wait until they have finished (`WaitCompleted`). Modelled on
//! Cluster API's `MachineDrainRule`.
//!
//! What a rule means is decided in `rules::drain` (pure); this file is the
//! wire shape only. With no rule the drain is upstream's.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The webhook path that validates NodeDrainRules (beside upstream's
/// NodeMaintenance path, on the same server).
pub const DRAIN_RULE_WEBHOOK_PATH: &str =
    "/validate-nodemaintenance-medik8s-io-v1alpha1-nodedrainrule";

/// Which pods on which nodes a rule is for, and what the drain does with them.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "nodemaintenance.medik8s.io",
    version = "v1alpha1",
    kind = "NodeDrainRule",
    plural = "nodedrainrules",
    singular = "nodedrainrule",
    shortname = "ndr",
    doc = "NodeDrainRule says how a node maintenance's drain treats the pods it matches: Drain (in order groups), Skip or WaitCompleted.",
    printcolumn = r#"{"name":"Behavior","type":"string","jsonPath":".spec.drain.behavior","description":"Drain, Skip or WaitCompleted"}"#,
    printcolumn = r#"{"name":"Order","type":"integer","jsonPath":".spec.drain.order","description":"Order group of the pods drained (ascending)"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeDrainRuleSpec {
    /// What the drain does with the matched pods.
    pub drain: DrainPolicy,
    /// The nodes the rule is for: any node matched by one entry. Empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeSelection>,
    /// The pods the rule is for: any pod matched by one entry. Empty: every
    /// pod of the nodes (DaemonSet and mirror pods always stay, as upstream).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodSelection>,
}

/// The behaviour, and the order group for `Drain`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainPolicy {
    pub behavior: DrainBehavior,
    /// `Drain` only: the order group (default 0). Groups leave in ascending
    /// order; a group is evicted once every pod of the lower groups has left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i32>,
}

/// What a drain does with a pod.
#[derive(
    Deserialize,
    Serialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    JsonSchema,
)]
pub enum DrainBehavior {
    /// Evicted through the Eviction API, in its order group (upstream's drain).
    #[default]
    Drain,
    /// Never evicted: stays on the node through the maintenance.
    Skip,
    /// Not evicted: the drain waits until the pod has finished (phase
    /// Succeeded or Failed) or is gone. `drainTimeout` still bounds it.
    WaitCompleted,
}

impl DrainBehavior {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainBehavior::Drain => "Drain",
            DrainBehavior::Skip => "Skip",
            DrainBehavior::WaitCompleted => "WaitCompleted",
        }
    }
}

/// Nodes by their labels.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelection {
    /// A label selector over the node's labels; absent matches every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// Pods by their labels and their namespace's labels (both must match).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSelection {
    /// A label selector over the pod's labels; absent matches every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// A label selector over the labels of the pod's namespace; absent
    /// matches every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// The CRD as YAML (`crdgen nodedrainrules`; manifests/crd holds the output).
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&NodeDrainRule::crd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_rule_reads_and_writes_back_unchanged() {
        let wire = json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1alpha1",
            "kind": "NodeDrainRule",
            "metadata": {"name": "storage-last"},
            "spec": {
                "drain": {"behavior": "Drain", "order": 10},
                "nodes": [{"selector": {"matchLabels": {"pool": "storage"}}}],
                "pods": [{
                    "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["ceph-osd"]}]},
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rook-ceph"}}
                }]
            }
        });
        let rule: NodeDrainRule = serde_json::from_value(wire.clone()).expect("reads");
        assert_eq!(rule.spec.drain.behavior, DrainBehavior::Drain);
        assert_eq!(rule.spec.drain.order, Some(10));
        assert_eq!(serde_json::to_value(&rule).expect("writes"), wire);
    }

    #[test]
    fn manifests_crd_matches_crdgen() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/crd/nodemaintenance.medik8s.io_nodedrainrules.yaml"
        );
        let committed = std::fs::read_to_string(path).expect("manifests CRD exists");
        assert!(
            committed == crd_yaml().expect("crd yaml"),
            "{path} differs from crdgen output: run `make crds` and commit the result"
        );
    }

    #[test]
    fn the_crd_is_cluster_scoped_in_our_group() {
        use kube::CustomResourceExt;
        let crd = NodeDrainRule::crd();
        assert_eq!(crd.spec.group, "nodemaintenance.medik8s.io");
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["ndr".to_string()]));
    }
}
