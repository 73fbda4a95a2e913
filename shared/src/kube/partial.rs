//! Watch types that decode only what a decision reads. A kwok node is 2-3 KB
//! of JSON, a real one 10-50 KB (images, managedFields); decoded into
//! k8s-openapi's `Node` each becomes several times that in memory, and a
//! list page of 500 nodes is decoded at once. These types take the few fields
//! the services use and let serde skip the rest while parsing, so a thousand
//! nodes cost what their names, labels and taints cost.
//!
//! Each type is a [`kube::Resource`] of the real kind, so `Api`, watchers and
//! reflector stores work with it as with the full type; types marked
//! metadata-only also ask the API server for metadata only (kube's
//! `PartialObjectMetadata` Accept header), so spec and status never travel.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, PodSpec, PodStatus, Taint, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// Annotations some decision reads; every other one is skipped unread.
const KEPT_ANNOTATIONS: &[&str] = &[
    MIRROR_POD_ANNOTATION,
    crate::api::consts::PRIOR_CORDON_ANNOTATION,
    crate::rules::drain::DRAIN_ORDER_ANNOTATION,
    crate::serve::drain_flags::EXCLUDED_AT_ANNOTATION,
];

/// Marks the API mirror of a static pod (the drain leaves those).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The metadata fields any decision here reads; managedFields and all but
/// [`KEPT_ANNOTATIONS`] (the bulk of an object's metadata) are skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "kept_annotations")]
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
    deletion_timestamp: Option<Time>,
}

/// Drop an object's managedFields before it is kept: no decision reads them,
/// and on a NodeMaintenance the status writer's entries outweigh the rest of
/// its metadata. Writing the object back without them (an update or a patch)
/// leaves the API server's record as it is.
pub fn forget_managed_fields(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
}

/// Deserialize `metadata` keeping only the fields of `LeanMeta`.
pub fn meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = LeanMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references,
        finalizers: m.finalizers,
        deletion_timestamp: m.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

/// The annotations among [`KEPT_ANNOTATIONS`]; the values of the others are
/// skipped without being copied (None when none is kept).
fn kept_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Kept;
    impl<'de> Visitor<'de> for Kept {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of annotations")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
            let mut kept = BTreeMap::new();
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if KEPT_ANNOTATIONS.contains(&key.as_ref()) {
                    kept.insert(key.into_owned(), map.next_value::<String>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok((!kept.is_empty()).then_some(kept))
        }
    }
    d.deserialize_option(Kept)
}

/// Implements [`kube::Resource`] for a partial type of a built-in kind.
macro_rules! lean_resource {
    ($ty:ty, $scope:ty, $group:literal, $version:literal, $kind:literal, $plural:literal, metadata_only: $meta_only:literal) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;
            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($group)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($version)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn metadata_api() -> bool {
                $meta_only
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A Node as the controller watches it: name, uid, labels, cordon, taints,
/// and the status of its conditions (Ready, for the fleet gates).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeView {
    #[serde(deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<NodeSpecView>,
    #[serde(default)]
    pub status: Option<NodeStatusView>,
}

impl NodeView {
    /// This node as the fleet gates see it (`--zone-label` names the zone).
    pub fn gate_view(&self, zone_label: &str) -> crate::rules::gates::FleetNode {
        let unschedulable = self.spec.as_ref().and_then(|s| s.unschedulable);
        let mut view = crate::rules::gates::FleetNode::from_parts(
            &self.metadata,
            self.ready(),
            unschedulable,
            zone_label,
        );
        view.maintained = self.maintained();
        view
    }

    /// What our `MaintenanceInProgress` condition says of the node.
    pub fn maintained(&self) -> crate::rules::gates::Maintained {
        let ours = (self.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == crate::api::consts::NODE_CONDITION_MAINTENANCE_IN_PROGRESS)
            });
        match ours {
            Some(c) => crate::rules::gates::Maintained::of(
                &c.status,
                c.reason.as_deref(),
                c.last_transition_time.as_ref().map(|t| t.0),
            ),
            None => crate::rules::gates::Maintained::No,
        }
    }

    /// Condition Ready is True (False, Unknown or missing: not ready).
    pub fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True")
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct NodeStatusView {
    /// Type and status of each condition only (no messages, no heartbeats).
    #[serde(default)]
    pub conditions: Option<Vec<NodeConditionView>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    /// Read for our own condition (the settle gate); a few bytes a node.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct NodeSpecView {
    #[serde(default)]
    pub unschedulable: Option<bool>,
    /// Whole (timeAdded included), so a patch computed from the watched node
    /// tests the taint list exactly as stored.
    #[serde(default)]
    pub taints: Option<Vec<Taint>>,
}

lean_resource!(NodeView, ClusterResourceScope, "", "v1", "Node", "nodes", metadata_only: false);

/// A Node's metadata only (requested metadata-only): name, uid and labels
/// (the roles), which is all the webhook's rules read.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeMeta {
    #[serde(deserialize_with = "meta")]
    pub metadata: ObjectMeta,
}

lean_resource!(NodeMeta, ClusterResourceScope, "", "v1", "Node", "nodes", metadata_only: true);

/// A Pod's metadata only (requested metadata-only): namespace, name, uid,
/// labels; what a watch for pods leaving a node needs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMeta {
    #[serde(deserialize_with = "meta")]
    pub metadata: ObjectMeta,
}

lean_resource!(PodMeta, NamespaceResourceScope, "", "v1", "Pod", "pods", metadata_only: true);

/// A Pod as the drain and the admission warnings read it: metadata (owners,
/// finalizers, labels, the mirror annotation, deletion), the emptyDir
/// volumes by name, the phase. Turned into a k8s-openapi [`Pod`] holding just
/// those ([`PodView::into_pod`]), so the code reading it keeps one type.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodView {
    #[serde(deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PodSpecView>,
    #[serde(default)]
    pub status: Option<PodStatusView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecView {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub volumes: Option<Vec<VolumeView>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeView {
    pub name: String,
    /// Present for an emptyDir volume (its settings are not read).
    #[serde(default)]
    pub empty_dir: Option<IgnoredAny>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodStatusView {
    #[serde(default)]
    pub phase: Option<String>,
}

/// The pods of `node` (field selector `spec.nodeName`, served from the API
/// server's watch cache), each decoded as a [`PodView`]: what the drain and
/// the admission warnings read, without holding whole pod specs.
pub async fn list_node_pods(client: &kube::Client, node: &str) -> kube::Result<Vec<Pod>> {
    let (views, _) = list_node_pod_views(client, node).await?;
    Ok(views.into_iter().map(PodView::into_pod).collect())
}

/// [`list_node_pods`] as the views themselves: a caller converting one at a
/// time (`PodView::into_pod`) never holds the node's pods as whole `Pod`s, a
/// struct of some 2 KiB each even with an almost empty spec.
/// Also the list's resourceVersion: a watch of the node's pods can start
/// from it without a list of its own.
pub async fn list_node_pod_views(
    client: &kube::Client,
    node: &str,
) -> kube::Result<(Vec<PodView>, Option<String>)> {
    let lp = kube::api::ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .match_any();
    let list = kube::Api::<PodView>::all(client.clone()).list(&lp).await?;
    Ok((list.items, list.metadata.resource_version))
}

impl PodView {
    pub fn into_pod(self) -> Pod {
        let spec = self.spec.unwrap_or_default();
        let volumes = spec.volumes.map(|vs| {
            vs.into_iter()
                .map(|v| Volume {
                    empty_dir: v.empty_dir.map(|_| EmptyDirVolumeSource::default()),
                    name: v.name,
                    ..Volume::default()
                })
                .collect()
        });
        Pod {
            metadata: self.metadata,
            spec: Some(PodSpec {
                node_name: spec.node_name,
                volumes,
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: self.status.and_then(|s| s.phase),
                ..PodStatus::default()
            }),
        }
    }
}

lean_resource!(PodView, NamespaceResourceScope, "", "v1", "Pod", "pods", metadata_only: false);

/// A PodDisruptionBudget as the controller's blocker watch needs it: its
/// generation (spec changes) and whether it allows a disruption.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PdbView {
    #[serde(deserialize_with = "meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<PdbStatusView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdbStatusView {
    #[serde(default)]
    pub disruptions_allowed: i32,
}

lean_resource!(
    PdbView,
    NamespaceResourceScope,
    "policy",
    "v1",
    "PodDisruptionBudget",
    "poddisruptionbudgets",
    metadata_only: false
);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    #[test]
    fn a_kept_object_forgets_its_managed_fields_only() {
        let mut meta: ObjectMeta = serde_json::from_value(json!({
            "name": "nm-1", "resourceVersion": "9", "finalizers": ["f"],
            "managedFields": [{"manager": "nmo-controller", "operation": "Update",
                               "fieldsV1": {"f:status": {"f:phase": {}}}}]
        }))
        .expect("metadata");
        forget_managed_fields(&mut meta);
        assert!(meta.managed_fields.is_none());
        assert_eq!(meta.name.as_deref(), Some("nm-1"));
        assert_eq!(meta.resource_version.as_deref(), Some("9"));
        assert_eq!(meta.finalizers, Some(vec!["f".to_string()]));
        // Written back without them: the field is left out, not sent empty
        // (which the API server would ignore anyway).
        let sent = serde_json::to_value(&meta).expect("serialize");
        assert!(sent.get("managedFields").is_none(), "{sent}");
    }

    #[test]
    fn a_node_decodes_to_its_names_labels_and_taints_only() {
        let node: NodeView = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "worker-1", "uid": "u1", "resourceVersion": "7",
                "labels": {"node-role.kubernetes.io/worker": ""},
                "annotations": {"big": "x".repeat(10_000)},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24",
                     "taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]},
            "status": {"images": [{"names": ["a"], "sizeBytes": 1}], "capacity": {"cpu": "4"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": "2026-12-05T10:00:00Z"}]}
        }))
        .expect("node");
        assert!(node.ready());
        assert_eq!(
            node.status.as_ref().and_then(|s| s.conditions.clone()),
            Some(vec![NodeConditionView {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                last_transition_time: None,
            }]),
            "type, status, reason and transition time only"
        );
        assert_eq!(node.metadata.name.as_deref(), Some("worker-1"));
        assert_eq!(node.metadata.uid.as_deref(), Some("u1"));
        assert!(node.metadata.annotations.is_none());
        assert!(node.metadata.managed_fields.is_none());
        let spec = node.spec.expect("spec");
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.expect("taints")[0].key, "medik8s.io/drain");
        assert_eq!(NodeView::plural(&()), "nodes");
        assert!(!NodeView::metadata_api());
        assert!(NodeMeta::metadata_api());
        assert_eq!(NodeView::url_path(&(), None), "/api/v1/nodes");
    }

    #[test]
    fn a_pod_keeps_what_the_drain_and_the_warnings_read() {
        let pod: PodView = serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u",
                "labels": {"kubevirt.io": "virt-launcher"},
                "annotations": {"kubernetes.io/config.mirror": "abc", "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(5000)},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r", "controller": true}],
                "finalizers": ["example.com/hold"],
                "deletionTimestamp": "2026-12-01T10:00:00Z",
                "managedFields": [{"manager": "kubelet"}]
            },
            "spec": {"nodeName": "worker-1", "containers": [{"name": "c", "image": "i"}],
                     "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
                                 {"name": "cfg", "configMap": {"name": "c"}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("pod");
        let pod = pod.into_pod();
        let m = &pod.metadata;
        assert_eq!(
            m.annotations.as_ref().map(|a| a.len()),
            Some(1),
            "only the mirror annotation"
        );
        assert_eq!(
            m.owner_references.as_ref().expect("owners")[0].kind,
            "ReplicaSet"
        );
        assert_eq!(
            m.finalizers.as_deref(),
            Some(&["example.com/hold".to_string()][..])
        );
        assert!(m.deletion_timestamp.is_some() && m.managed_fields.is_none());
        let spec = pod.spec.expect("spec");
        let volumes = spec.volumes.expect("volumes");
        assert!(volumes[0].empty_dir.is_some() && volumes[1].empty_dir.is_none());
        assert!(spec.containers.is_empty());
        assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));
        let bare: PodView =
            serde_json::from_value(json!({"metadata": {"name": "p", "annotations": null}}))
                .expect("minimal pod");
        assert!(bare.metadata.annotations.is_none());
    }

    #[test]
    fn metadata_only_answers_and_pdbs_decode() {
        let node: NodeMeta = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "cp-1", "labels": {"node-role.kubernetes.io/master": ""}}
        }))
        .expect("partial object metadata");
        assert!(
            node.metadata
                .labels
                .expect("labels")
                .contains_key("node-role.kubernetes.io/master")
        );
        let pdb: PdbView = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "generation": 2},
            "spec": {"maxUnavailable": 1},
            "status": {"disruptionsAllowed": 1, "currentHealthy": 3, "conditions": []}
        }))
        .expect("pdb");
        assert_eq!(pdb.metadata.generation, Some(2));
        assert_eq!(pdb.status.expect("status").disruptions_allowed, 1);
        assert_eq!(
            PdbView::url_path(&(), Some("shop")),
            "/apis/policy/v1/namespaces/shop/poddisruptionbudgets"
        );
    }
}
