//! Facts about nodes that both services derive from labels.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::api::consts::{ROLE_CONTROL_PLANE_LABEL, ROLE_MASTER_LABEL};

/// Whether `labels` carry every key=value of `selector` (an equality label
/// selector; empty selects everything): `--fleet-node-selector` and the
/// webhook's `--nodemaintenance-selector` both match with it.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// An owner reference to `node` (apiVersion v1, kind Node, name, uid), so
/// deleting the Node garbage-collects the owned object. The node lease
/// carries it as it is (as the medik8s library writes it); the
/// NodeMaintenance adds `controller: false, blockOwnerDeletion: false`.
pub fn owner_reference(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.metadata.name.clone().unwrap_or_default(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// A node is control plane when it carries either role label (any value).
pub fn is_control_plane(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| {
        l.contains_key(ROLE_MASTER_LABEL) || l.contains_key(ROLE_CONTROL_PLANE_LABEL)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        let mut l = BTreeMap::new();
        assert!(!is_control_plane(None));
        assert!(!is_control_plane(Some(&l)));
        l.insert(ROLE_MASTER_LABEL.to_string(), String::new());
        assert!(is_control_plane(Some(&l)));
        l.clear();
        l.insert(ROLE_CONTROL_PLANE_LABEL.to_string(), "true".into());
        assert!(is_control_plane(Some(&l)));
        l.clear();
        l.insert("node-role.kubernetes.io/worker".into(), String::new());
        assert!(!is_control_plane(Some(&l)));
    }
}
