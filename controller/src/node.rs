//! What a maintenance adds to a node, and how it is taken off again.
//!
//! Both directions are one JSON patch each, so a node is never left half
//! changed: the taints, the cordon and the exclude-from-remediation label go
//! on and come off together. The patch starts with a `test` of the taint list
//! we read, so a concurrent writer makes it fail (and we retry on the next
//! reconcile) instead of being overwritten. Taints and labels that others put
//! on the node are never touched.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Value, json};
use shared::consts::{
    EXCLUDE_FROM_REMEDIATION_LABEL, EXCLUDE_FROM_REMEDIATION_VALUE, TAINT_DRAIN_KEY, TAINT_EFFECT,
    TAINT_UNSCHEDULABLE_KEY,
};

/// The two taints of a maintenance.
pub fn maintenance_taints() -> [Taint; 2] {
    [TAINT_UNSCHEDULABLE_KEY, TAINT_DRAIN_KEY].map(|key| Taint {
        key: key.to_string(),
        effect: TAINT_EFFECT.to_string(),
        ..Default::default()
    })
}

fn is_ours(t: &Taint) -> bool {
    (t.key == TAINT_UNSCHEDULABLE_KEY || t.key == TAINT_DRAIN_KEY) && t.effect == TAINT_EFFECT
}

/// JSON pointer escaping (RFC 6901) for a map key.
fn pointer_key(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn taints_of(node: &Node) -> Option<&Vec<Taint>> {
    node.spec.as_ref().and_then(|s| s.taints.as_ref())
}

fn test_taints_op(node: &Node) -> Value {
    // A missing list tests as null, which the API server's JSON patch accepts.
    json!({"op": "test", "path": "/spec/taints", "value": taints_of(node)})
}

fn has_label(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(EXCLUDE_FROM_REMEDIATION_LABEL))
        .is_some_and(|v| v == EXCLUDE_FROM_REMEDIATION_VALUE)
}

fn is_cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// True when the node carries everything a maintenance puts on it.
pub fn is_in_maintenance(node: &Node) -> bool {
    let taints = taints_of(node).map(Vec::as_slice).unwrap_or_default();
    maintenance_taints().iter().all(|m| {
        taints
            .iter()
            .any(|t| t.key == m.key && t.effect == m.effect)
    }) && is_cordoned(node)
        && has_label(node)
}

/// The patch that puts the node into maintenance, or None when nothing is missing.
pub fn enter_patch(node: &Node) -> Option<Vec<Value>> {
    if is_in_maintenance(node) {
        return None;
    }
    let mut taints: Vec<Taint> = taints_of(node).cloned().unwrap_or_default();
    for m in maintenance_taints() {
        if !taints
            .iter()
            .any(|t| t.key == m.key && t.effect == m.effect)
        {
            taints.push(m);
        }
    }
    let mut ops = vec![
        test_taints_op(node),
        json!({"op": "add", "path": "/spec/taints", "value": taints}),
        json!({"op": "add", "path": "/spec/unschedulable", "value": true}),
    ];
    if !has_label(node) {
        if node.metadata.labels.is_some() {
            ops.push(json!({
                "op": "add",
                "path": format!("/metadata/labels/{}", pointer_key(EXCLUDE_FROM_REMEDIATION_LABEL)),
                "value": EXCLUDE_FROM_REMEDIATION_VALUE
            }));
        } else {
            ops.push(json!({
                "op": "add",
                "path": "/metadata/labels",
                "value": {EXCLUDE_FROM_REMEDIATION_LABEL: EXCLUDE_FROM_REMEDIATION_VALUE}
            }));
        }
    }
    Some(ops)
}

/// The patch that gives the node back: removes exactly our taints, the
/// cordon and the label. None when none of them is there.
pub fn exit_patch(node: &Node) -> Option<Vec<Value>> {
    let taints: Vec<Taint> = taints_of(node).cloned().unwrap_or_default();
    let kept: Vec<&Taint> = taints.iter().filter(|t| !is_ours(t)).collect();
    let label = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_REMEDIATION_LABEL));
    if kept.len() == taints.len() && !is_cordoned(node) && !label {
        return None;
    }
    let mut ops = vec![test_taints_op(node)];
    if kept.len() != taints.len() {
        ops.push(json!({"op": "add", "path": "/spec/taints", "value": kept}));
    }
    if is_cordoned(node) {
        ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": false}));
    }
    if label {
        ops.push(json!({
            "op": "remove",
            "path": format!("/metadata/labels/{}", pointer_key(EXCLUDE_FROM_REMEDIATION_LABEL))
        }));
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(taints: Option<Vec<Taint>>, labels: Option<Vec<(&str, &str)>>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.labels = labels.map(|l| {
            l.into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        n.spec = Some(NodeSpec {
            taints,
            ..Default::default()
        });
        n
    }

    fn apply(node: &Node, mut ops: Vec<Value>) -> Node {
        // The API server's JSON patch accepts `test` with null on a missing
        // path (checked by the integration tests); the json-patch crate does
        // not, so that one op is left out of this model.
        ops.retain(|op| !(op["op"] == "test" && op["value"].is_null()));
        let mut doc = serde_json::to_value(node).expect("node json");
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("patch");
        json_patch::patch(&mut doc, &patch).expect("patch applies");
        serde_json::from_value(doc).expect("node back")
    }

    fn foreign_taint() -> Taint {
        Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }
    }

    #[test]
    fn enter_then_exit_restores_node_exactly() {
        let before = node(Some(vec![foreign_taint()]), Some(vec![("team", "a")]));
        let during = apply(&before, enter_patch(&before).expect("changes"));
        assert!(is_in_maintenance(&during));
        let taints = taints_of(&during).expect("taints");
        assert_eq!(taints.len(), 3);
        assert_eq!(taints[0], foreign_taint(), "foreign taint kept first");
        assert_eq!(
            during.metadata.labels.as_ref().expect("labels").get("team"),
            Some(&"a".to_string())
        );
        assert!(enter_patch(&during).is_none(), "idempotent");
        let after = apply(&during, exit_patch(&during).expect("changes"));
        assert_eq!(taints_of(&after), Some(&vec![foreign_taint()]));
        assert_eq!(after.metadata.labels, before.metadata.labels);
        assert_eq!(
            after.spec.as_ref().and_then(|s| s.unschedulable),
            Some(false)
        );
        assert!(exit_patch(&after).is_none(), "idempotent");
    }

    #[test]
    fn node_without_taints_or_labels() {
        let before = node(None, None);
        let ops = enter_patch(&before).expect("changes");
        assert_eq!(
            ops[0]["value"],
            Value::Null,
            "test op checks the list is absent"
        );
        let during = apply(&before, ops);
        assert!(is_in_maintenance(&during));
        let after = apply(&during, exit_patch(&during).expect("changes"));
        assert_eq!(taints_of(&after), Some(&vec![]));
        assert_eq!(after.metadata.labels, Some(Default::default()));
    }

    #[test]
    fn concurrent_taint_change_makes_patch_fail() {
        let seen = node(Some(vec![]), Some(vec![]));
        let ops = enter_patch(&seen).expect("changes");
        let changed = node(Some(vec![foreign_taint()]), Some(vec![]));
        let mut doc = serde_json::to_value(&changed).expect("json");
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("patch");
        assert!(json_patch::patch(&mut doc, &patch).is_err());
    }

    #[test]
    fn label_key_is_pointer_escaped() {
        assert_eq!(
            pointer_key(EXCLUDE_FROM_REMEDIATION_LABEL),
            "remediation.medik8s.io~1exclude-from-remediation"
        );
    }
}
