//! The `NodeMaintenance` custom resource, wire-compatible with upstream
//! `nodemaintenance.medik8s.io/v1beta1`.
//!
//! Field names follow upstream's JSON exactly (note `totalpods`). Integer and
//! list fields are omitted when zero or empty, as Go's `omitempty` does, so an
//! object written by upstream reads back and writes out unchanged. Unknown
//! fields are ignored on read, so a newer controller's status never breaks an
//! older webhook.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Desired state: which node to put into maintenance, and why.
#[derive(
    CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema,
)]
#[kube(
    group = "nodemaintenance.medik8s.io",
    version = "v1beta1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    singular = "nodemaintenance",
    shortname = "nm",
    status = "NodeMaintenanceStatus",
    doc = "NodeMaintenance puts one node into planned maintenance: cordon, taint, drain, and give it back when deleted.",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName","description":"Node in maintenance"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Maintenance phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"integer","jsonPath":".status.drainProgress","description":"Drain progress in percent"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.evictionPods","priority":1,"description":"Pods to evict at start"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason","priority":1,"description":"Why the node is maintained"}"#,
    printcolumn = r#"{"name":"Last Error","type":"string","jsonPath":".status.lastError","priority":1,"description":"Last error seen"}"#,
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.conditions[?(@.status==\"True\")].reason","description":"Reasons of the conditions that hold (Queued, Blocked, Drained, Cordoned, Failed)"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// Name of the node to put into maintenance. Cannot be changed once set.
    #[schemars(length(min = 1))]
    pub node_name: String,
    /// Why the node is being maintained (free text, shown to operators).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Beyond upstream (optional): how long the drain may take, as a Go
    /// duration ("30m", "1h30m"), counted from the node's cordon. Absent:
    /// wait forever, as upstream. What happens then: `drainTimeoutAction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(crate::rules::duration::GO_DURATION_PATTERN))]
    pub drain_timeout: Option<String>,
    /// Beyond upstream: `Fail` (default: phase Failed, the node given back)
    /// or `Force` (the pods still on the node are deleted without eviction,
    /// each named in an event and in `status.forceDeletedPods`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_action: Option<DrainTimeoutAction>,
}

/// What a passed `drainTimeout` does.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DrainTimeoutAction {
    /// Give up: phase Failed, the node given back, FailedMaintenance.
    #[default]
    Fail,
    /// Delete the pods still on the node without eviction (PDBs bypassed).
    Force,
}

/// Every field of [`NodeMaintenanceStatus`] by its JSON name: a status
/// merge patch sends the cleared ones as null so they are really removed.
pub const STATUS_FIELDS: [&str; 11] = [
    "phase",
    "drainProgress",
    "lastUpdate",
    "lastError",
    "pendingPods",
    "pendingPodsRefs",
    "totalpods",
    "evictionPods",
    "errorOnLeaseCount",
    "forceDeletedPods",
    "conditions",
];

/// Observed state, as the controller reports it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    /// Running, Succeeded or Failed (upstream); Pending while waiting for a slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MaintenancePhase>,
    /// Percentage of evictable pods that have left the node.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drain_progress: i64,
    /// When the status was last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update: Option<Time>,
    /// The latest error, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    /// Names of pods still waiting to be evicted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_pods: Vec<String>,
    /// Namespaced references of pods still waiting to be evicted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_pods_refs: Vec<PodReference>,
    /// All pods on the node when the maintenance started (lower-case `p` as upstream).
    #[serde(default, rename = "totalpods", skip_serializing_if = "is_zero")]
    pub total_pods: i64,
    /// Pods that had to be evicted when the maintenance started.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub eviction_pods: i64,
    /// Consecutive failures to take or renew the node lease.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub error_on_lease_count: i64,
    /// Beyond upstream: pods deleted without eviction because
    /// `spec.drainTimeout` passed with `drainTimeoutAction: Force`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub force_deleted_pods: Vec<PodReference>,
    /// Beyond upstream (an addition): standard conditions Queued, Cordoned,
    /// Drained, Blocked and Failed, with reasons and messages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// A pod by namespace and name.
#[derive(
    Deserialize, Serialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema,
)]
pub struct PodReference {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// Phase of a maintenance. Any value this build does not know is kept as
/// written, so status from a newer controller survives a read-modify-write.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MaintenancePhase {
    /// Beyond upstream: waiting for a free maintenance slot.
    Pending,
    Running,
    Succeeded,
    Failed,
    Other(String),
}

impl MaintenancePhase {
    pub fn as_str(&self) -> &str {
        match self {
            MaintenancePhase::Pending => "Pending",
            MaintenancePhase::Running => "Running",
            MaintenancePhase::Succeeded => "Succeeded",
            MaintenancePhase::Failed => "Failed",
            MaintenancePhase::Other(s) => s,
        }
    }
}

impl From<&str> for MaintenancePhase {
    fn from(s: &str) -> Self {
        match s {
            "Pending" => MaintenancePhase::Pending,
            "Running" => MaintenancePhase::Running,
            "Succeeded" => MaintenancePhase::Succeeded,
            "Failed" => MaintenancePhase::Failed,
            other => MaintenancePhase::Other(other.to_string()),
        }
    }
}

impl std::fmt::Display for MaintenancePhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for MaintenancePhase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for MaintenancePhase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(MaintenancePhase::from(s.as_str()))
    }
}

impl JsonSchema for MaintenancePhase {
    fn schema_name() -> Cow<'static, str> {
        "MaintenancePhase".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // A plain string, not an enum: newer phases must not be rejected by an older CRD.
        json_schema!({
            "type": "string",
            "description": "Running, Succeeded or Failed; Pending while waiting for a maintenance slot."
        })
    }
}

impl NodeMaintenance {
    /// The phase, or None before the controller first wrote status.
    pub fn phase(&self) -> Option<&MaintenancePhase> {
        self.status.as_ref().and_then(|s| s.phase.as_ref())
    }
}

/// The CRD as YAML, exactly what `crdgen` prints and `manifests/` holds.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&NodeMaintenance::crd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// An object as upstream writes it, with every status field set.
    fn upstream_object() -> serde_json::Value {
        json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {
                "name": "nodemaintenance-worker-1",
                "finalizers": ["foregroundDeleteNodeMaintenance"],
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": "worker-1",
                    "uid": "0b1e9d4c-1111-2222-3333-444455556666",
                    "controller": false, "blockOwnerDeletion": false
                }]
            },
            "spec": {"nodeName": "worker-1", "reason": "kernel CVE patch"},
            "status": {
                "phase": "Running",
                "drainProgress": 40,
                "lastUpdate": "2024-05-01T10:11:12Z",
                "lastError": "Cannot evict pod as it would violate the pod's disruption budget.",
                "pendingPods": ["web-1", "db-0"],
                "pendingPodsRefs": [
                    {"namespace": "shop", "name": "web-1"},
                    {"namespace": "shop", "name": "db-0"}
                ],
                "totalpods": 7,
                "evictionPods": 5,
                "errorOnLeaseCount": 1
            }
        })
    }

    #[test]
    fn upstream_object_round_trips_unchanged() {
        let input = upstream_object();
        let nm: NodeMaintenance = serde_json::from_value(input.clone()).expect("parses");
        let status = nm.status.clone().expect("status");
        assert_eq!(status.total_pods, 7);
        assert_eq!(status.eviction_pods, 5);
        assert_eq!(status.phase, Some(MaintenancePhase::Running));
        assert_eq!(status.pending_pods_refs[1].name, "db-0");
        let output = serde_json::to_value(&nm).expect("serializes");
        assert_eq!(output, input);
    }

    #[test]
    fn unknown_fields_and_phases_are_tolerated() {
        let mut input = upstream_object();
        input["status"]["phase"] = json!("Quiescing");
        input["status"]["someFutureField"] = json!({"a": 1});
        input["spec"]["futureKnob"] = json!(true);
        let nm: NodeMaintenance = serde_json::from_value(input).expect("parses");
        assert_eq!(
            nm.phase(),
            Some(&MaintenancePhase::Other("Quiescing".to_string()))
        );
        let out = serde_json::to_value(&nm).expect("serializes");
        assert_eq!(out["status"]["phase"], json!("Quiescing"));
    }

    #[test]
    fn zero_values_are_omitted_like_go_omitempty() {
        let nm = NodeMaintenance::new(
            "nm",
            NodeMaintenanceSpec {
                node_name: "n".into(),
                ..Default::default()
            },
        );
        let v = serde_json::to_value(&nm).expect("serializes");
        assert_eq!(v["spec"], json!({"nodeName": "n"}));
        let s = serde_json::to_value(NodeMaintenanceStatus::default()).expect("serializes");
        assert_eq!(s, json!({}));
    }

    #[test]
    fn crd_has_contract_shape() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(NodeMaintenance::crd()).expect("crd");
        assert_eq!(
            crd["metadata"]["name"],
            "nodemaintenances.nodemaintenance.medik8s.io"
        );
        assert_eq!(crd["spec"]["scope"], "Cluster");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["nm"]));
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], "v1beta1");
        assert_eq!(v["subresources"]["status"], json!({}));
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["required"], json!(["nodeName"]));
        assert_eq!(spec["properties"]["nodeName"]["minLength"], json!(1));
        let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        for f in STATUS_FIELDS {
            assert!(status.get(f).is_some(), "status field {f} missing from CRD");
        }
        let cols: Vec<_> = v["additionalPrinterColumns"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| c["name"].as_str().unwrap_or_default().to_string())
            .collect();
        for c in ["Node", "Phase", "Progress", "Age"] {
            assert!(cols.contains(&c.to_string()), "printer column {c} missing");
        }
    }

    #[test]
    fn manifests_crd_matches_crdgen() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml"
        );
        let committed = std::fs::read_to_string(path).expect("manifests CRD exists");
        let generated = crd_yaml().expect("crd yaml");
        assert!(
            committed == generated,
            "{path} differs from crdgen output: run `make crds` and commit the result"
        );
    }
}
