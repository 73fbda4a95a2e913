//! What a maintenance adds to a node, and how it is taken off again.
//!
//! Both directions are one JSON patch each, so a node is never left half
//! changed: the taints, the cordon and the exclude-from-remediation label go
//! on and come off together. The patch starts with a `test` of the taint list
//! we read, so a concurrent writer makes it fail (and we retry on the next
//! reconcile) instead of being overwritten. Taints and labels that others put
//! on the node are never touched.
//!
//! As upstream (node-maintenance-operator `AddOrRemoveTaint`), the new taint
//! list is the two maintenance taints first, then the node's other taints in
//! their order. A node without taints has no `spec.taints` at all (the API
//! server stores no empty list); the `test` then compares with null, which
//! the API server's JSON patch accepts for a missing path, as upstream's
//! `test` of its marshalled nil list relies on. (Strict RFC 6902 would fail
//! a `test` of a missing path, and `[]` fails there on the API server too.)
//!
//! A cordon kept (beyond upstream): a node already unschedulable when its
//! maintenance takes it gets [`PRIOR_CORDON_ANNOTATION`] in the same patch,
//! and giving it back then keeps the cordon (and the unschedulable taint
//! that goes with it). The fact lives on the node, so a restart or a
//! failover mid-maintenance keeps it. A give-back acts only on a node that
//! carries a mark of a maintenance (the drain taint, the label, the
//! annotation): a node that was never taken keeps whatever cordon it has.

use k8s_openapi::api::core::v1::{Node, Taint};
use serde_json::{Value, json};
use shared::api::consts::{
    EXCLUDE_FROM_REMEDIATION_LABEL, EXCLUDE_FROM_REMEDIATION_VALUE, PRIOR_CORDON_ANNOTATION,
    TAINT_DRAIN_KEY, TAINT_EFFECT, TAINT_UNSCHEDULABLE_KEY,
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
    // No taints: the stored node has no list, so test for null, never `[]`.
    let taints = taints_of(node).filter(|t| !t.is_empty());
    json!({"op": "test", "path": "/spec/taints", "value": taints})
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
    undone(node).is_empty()
}

/// What was taken off `node` of what its maintenance puts on (each as
/// words for the event): empty when it carries everything.
pub fn undone(node: &Node) -> Vec<&'static str> {
    let taints = taints_of(node).map(Vec::as_slice).unwrap_or_default();
    let has = |key: &str| {
        taints
            .iter()
            .any(|t| t.key == key && t.effect == TAINT_EFFECT)
    };
    let mut out = Vec::new();
    if !is_cordoned(node) {
        out.push("uncordoned");
    }
    if !has(TAINT_DRAIN_KEY) {
        out.push("taint medik8s.io/drain:NoSchedule removed");
    }
    if !has(TAINT_UNSCHEDULABLE_KEY) {
        out.push("taint node.kubernetes.io/unschedulable:NoSchedule removed");
    }
    if !has_label(node) {
        out.push("label remediation.medik8s.io/exclude-from-remediation removed");
    }
    out
}

/// The node's prior-cordon annotation says "true".
pub fn had_prior_cordon(node: &Node) -> bool {
    annotation(node).is_some_and(|v| v == "true")
}

fn annotation(node: &Node) -> Option<&String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PRIOR_CORDON_ANNOTATION))
}

/// The node was taken by a maintenance (ours, or upstream's during a
/// handover): it carries the drain taint, which nothing else writes. (The
/// label is shared with the other medik8s operators and admins; the
/// annotation alone is not one either: upstream, taking over
/// mid-maintenance, gives the node back without knowing it.)
fn taken(node: &Node) -> bool {
    taints_of(node).is_some_and(|t| {
        t.iter()
            .any(|t| t.key == TAINT_DRAIN_KEY && t.effect == TAINT_EFFECT)
    })
}

/// Whether giving `node` back keeps its cordon (it was cordoned before).
pub fn keeps_cordon(node: &Node) -> bool {
    had_prior_cordon(node) && is_cordoned(node)
}

/// Whether taking `node` now notes a cordon that was there before: it is
/// unschedulable and no maintenance has taken it.
pub fn notes_prior_cordon(node: &Node) -> bool {
    !taken(node) && is_cordoned(node)
}

/// An `add` of `key: value` to the map at `/metadata/<map>`, creating the map when absent.
fn add_to_map(exists: bool, map: &str, key: &str, value: &str) -> Value {
    if exists {
        json!({"op": "add", "path": format!("/metadata/{map}/{}", pointer_key(key)), "value": value})
    } else {
        json!({"op": "add", "path": format!("/metadata/{map}"), "value": {key: value}})
    }
}

/// The patch that puts the node into maintenance, or None when nothing is missing.
pub fn enter_patch(node: &Node) -> Option<Vec<Value>> {
    if is_in_maintenance(node) {
        return None;
    }
    // Ours first (a taint of ours already there keeps its value and
    // timeAdded), then the others in their order.
    let existing: &[Taint] = taints_of(node).map(Vec::as_slice).unwrap_or_default();
    let mut taints: Vec<Taint> = maintenance_taints()
        .into_iter()
        .map(|m| {
            existing
                .iter()
                .find(|t| t.key == m.key && t.effect == m.effect)
                .cloned()
                .unwrap_or(m)
        })
        .collect();
    taints.extend(existing.iter().filter(|t| !is_ours(t)).cloned());
    let mut ops = vec![
        test_taints_op(node),
        json!({"op": "add", "path": "/spec/taints", "value": taints}),
        json!({"op": "add", "path": "/spec/unschedulable", "value": true}),
    ];
    if !has_label(node) {
        let labels = node.metadata.labels.is_some();
        ops.push(add_to_map(
            labels,
            "labels",
            EXCLUDE_FROM_REMEDIATION_LABEL,
            EXCLUDE_FROM_REMEDIATION_VALUE,
        ));
    }
    // Taken afresh: the annotation says whether it was cordoned (one left
    // from an earlier maintenance says nothing about now).
    if !taken(node) {
        if notes_prior_cordon(node) && !had_prior_cordon(node) {
            let annotations = node.metadata.annotations.is_some();
            ops.push(add_to_map(
                annotations,
                "annotations",
                PRIOR_CORDON_ANNOTATION,
                "true",
            ));
        } else if !is_cordoned(node) && annotation(node).is_some() {
            ops.push(remove_annotation());
        }
    }
    Some(ops)
}

fn remove_annotation() -> Value {
    json!({"op": "remove", "path": format!("/metadata/annotations/{}", pointer_key(PRIOR_CORDON_ANNOTATION))})
}

/// The patch that gives the node back: removes exactly what the
/// maintenance added (its taints, the cordon, the label, the annotation);
/// with a prior cordon the cordon and its unschedulable taint stay. None
/// when the node carries no mark of a maintenance (never taken, or given
/// back already: a retried give-back never uncordons a kept cordon).
pub fn exit_patch(node: &Node) -> Option<Vec<Value>> {
    let label = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_FROM_REMEDIATION_LABEL));
    if !taken(node) && !label && annotation(node).is_none() {
        return None;
    }
    let keep_cordon = keeps_cordon(node);
    let taints: Vec<Taint> = taints_of(node).cloned().unwrap_or_default();
    let kept: Vec<&Taint> = taints
        .iter()
        .filter(|t| !is_ours(t) || (keep_cordon && t.key == TAINT_UNSCHEDULABLE_KEY))
        .collect();
    let mut ops = vec![test_taints_op(node)];
    if kept.len() != taints.len() {
        ops.push(json!({"op": "add", "path": "/spec/taints", "value": kept}));
    }
    if is_cordoned(node) && !keep_cordon {
        ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": false}));
    }
    if label {
        ops.push(json!({
            "op": "remove",
            "path": format!("/metadata/labels/{}", pointer_key(EXCLUDE_FROM_REMEDIATION_LABEL))
        }));
    }
    if annotation(node).is_some() {
        ops.push(remove_annotation());
    }
    Some(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::ResourceExt as _;

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

    /// A JSON patch as the API server applies it (evanphx/json-patch): RFC
    /// 6902, except that `test` with null passes on a missing path (checked
    /// against the real API server by tests/tests/integration/drain_parity.rs). The
    /// result is stored as the API server stores a node: no empty taint list,
    /// label map or false `unschedulable`.
    fn api_server_patch(node: &Node, ops: Vec<Value>) -> Result<Node, String> {
        let mut doc = serde_json::to_value(node).map_err(|e| e.to_string())?;
        for op in ops {
            if op["op"] == "test" && op["value"].is_null() {
                let path = op["path"].as_str().unwrap_or_default();
                match doc.pointer(path) {
                    None | Some(Value::Null) => continue,
                    Some(v) => return Err(format!("test of {path}: found {v}")),
                }
            }
            let patch: json_patch::Patch =
                serde_json::from_value(Value::Array(vec![op])).map_err(|e| e.to_string())?;
            json_patch::patch(&mut doc, &patch).map_err(|e| e.to_string())?;
        }
        let mut n: Node = serde_json::from_value(doc).map_err(|e| e.to_string())?;
        if let Some(spec) = n.spec.as_mut() {
            spec.taints = spec.taints.take().filter(|t| !t.is_empty());
            spec.unschedulable = spec.unschedulable.filter(|u| *u);
        }
        n.metadata.labels = n.metadata.labels.take().filter(|l| !l.is_empty());
        Ok(n)
    }

    fn apply(node: &Node, ops: Vec<Value>) -> Node {
        api_server_patch(node, ops).expect("patch applies")
    }

    fn foreign_taint() -> Taint {
        Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }
    }

    fn keys(n: &Node) -> Vec<String> {
        taints_of(n)
            .map(|t| t.iter().map(|t| t.key.clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn enter_then_exit_restores_node_exactly() {
        let before = node(Some(vec![foreign_taint()]), Some(vec![("team", "a")]));
        let during = apply(&before, enter_patch(&before).expect("changes"));
        assert!(is_in_maintenance(&during));
        assert_eq!(
            keys(&during),
            [TAINT_UNSCHEDULABLE_KEY, TAINT_DRAIN_KEY, "dedicated"],
            "ours first, then the others, as upstream"
        );
        assert_eq!(
            taints_of(&during).and_then(|t| t.last()),
            Some(&foreign_taint()),
            "foreign taint unchanged"
        );
        assert_eq!(
            during.metadata.labels.as_ref().expect("labels").get("team"),
            Some(&"a".to_string())
        );
        assert!(enter_patch(&during).is_none(), "idempotent");
        let after = apply(&during, exit_patch(&during).expect("changes"));
        assert_eq!(after, before, "node exactly as before");
        assert!(exit_patch(&after).is_none(), "idempotent");
    }

    #[test]
    fn taint_of_ours_already_there_moves_first_and_keeps_its_data() {
        // The node lifecycle controller taints a cordoned node itself.
        let lifecycle = Taint {
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            ..maintenance_taints()[0].clone()
        };
        let before = node(Some(vec![foreign_taint(), lifecycle.clone()]), None);
        let during = apply(&before, enter_patch(&before).expect("changes"));
        let taints = taints_of(&during).expect("taints");
        assert_eq!(taints[0], lifecycle);
        assert_eq!(
            keys(&during),
            [TAINT_UNSCHEDULABLE_KEY, TAINT_DRAIN_KEY, "dedicated"]
        );
    }

    #[test]
    fn node_without_taints_or_labels() {
        // spec.taints absent, as the API server stores a node without taints.
        let before = node(None, None);
        let ops = enter_patch(&before).expect("changes");
        assert_eq!(ops[0]["op"], "test", "the guard comes first");
        assert_eq!(ops[0]["value"], Value::Null, "tests the list is absent");
        let during = apply(&before, ops);
        assert!(is_in_maintenance(&during));
        assert_eq!(keys(&during), [TAINT_UNSCHEDULABLE_KEY, TAINT_DRAIN_KEY]);
        let after = apply(&during, exit_patch(&during).expect("changes"));
        assert_eq!(
            after, before,
            "node exactly as before: no taints, no labels"
        );
    }

    #[test]
    fn empty_taint_list_tests_as_absent() {
        // A `test` of [] fails on the API server against the absent list it
        // stores for a node without taints.
        let ops = enter_patch(&node(Some(vec![]), None)).expect("changes");
        assert_eq!(ops[0]["value"], Value::Null);
    }

    #[test]
    fn concurrent_taint_change_makes_patch_fail() {
        // Read with no taints at all; someone adds one before our patch lands.
        for seen in [node(None, None), node(Some(vec![]), Some(vec![]))] {
            let ops = enter_patch(&seen).expect("changes");
            let changed = node(Some(vec![foreign_taint()]), None);
            let err = api_server_patch(&changed, ops).expect_err("guard trips");
            assert!(err.contains("/spec/taints"), "{err}");
        }
        // Read with a taint; it is gone (or another added) by the time we patch.
        let seen = node(Some(vec![foreign_taint()]), None);
        let during = apply(&seen, enter_patch(&seen).expect("changes"));
        for changed in [node(None, None), node(Some(vec![]), None)] {
            assert!(api_server_patch(&changed, enter_patch(&seen).expect("ops")).is_err());
        }
        let mut changed = during.clone();
        if let Some(t) = changed.spec.as_mut().and_then(|s| s.taints.as_mut()) {
            t.push(Taint {
                key: "late".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            });
        }
        assert!(api_server_patch(&changed, exit_patch(&during).expect("ops")).is_err());
    }

    fn cordoned(mut n: Node) -> Node {
        if let Some(spec) = n.spec.as_mut() {
            spec.unschedulable = Some(true);
        }
        n
    }

    fn annotated(n: &Node) -> Option<String> {
        n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(PRIOR_CORDON_ANNOTATION))
            .cloned()
    }

    #[test]
    fn a_prior_cordon_is_noted_and_kept() {
        // As kube-controller-manager leaves a cordoned node: the
        // unschedulable taint with its timeAdded.
        let lifecycle = Taint {
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            ..maintenance_taints()[0].clone()
        };
        let before = cordoned(node(Some(vec![foreign_taint(), lifecycle.clone()]), None));
        assert!(notes_prior_cordon(&before));
        let during = apply(&before, enter_patch(&before).expect("changes"));
        assert!(is_in_maintenance(&during));
        assert_eq!(annotated(&during).as_deref(), Some("true"));
        assert!(!notes_prior_cordon(&during), "taken: nothing more to note");
        assert!(keeps_cordon(&during));
        let after = apply(&during, exit_patch(&during).expect("changes"));
        assert!(is_cordoned(&after), "still cordoned, as before");
        let mut taints = taints_of(&after).cloned().unwrap_or_default();
        taints.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            taints,
            [foreign_taint(), lifecycle],
            "the cordon's taint stays, ours goes"
        );
        assert_eq!(
            annotated(&after),
            None,
            "the note goes with the maintenance"
        );
        assert!(after.metadata.labels.is_none(), "label gone");
        assert!(
            exit_patch(&after).is_none(),
            "a retried give-back never uncordons it"
        );
    }

    #[test]
    fn a_cordoned_node_with_someone_elses_label_is_noted() {
        // The label is shared (admins, other medik8s operators): not a sign
        // of a maintenance; only the drain taint is.
        for value in ["false", "true"] {
            let before = cordoned(node(
                None,
                Some(vec![(EXCLUDE_FROM_REMEDIATION_LABEL, value)]),
            ));
            assert!(notes_prior_cordon(&before), "{value:?}");
            let during = apply(&before, enter_patch(&before).expect("changes"));
            assert_eq!(annotated(&during).as_deref(), Some("true"), "{value:?}");
            let after = apply(&during, exit_patch(&during).expect("changes"));
            assert!(is_cordoned(&after), "{value:?}");
        }
    }

    #[test]
    fn a_node_never_taken_keeps_its_cordon() {
        // A maintenance that failed before taking the node gives nothing back.
        let n = cordoned(node(Some(vec![maintenance_taints()[0].clone()]), None));
        assert!(exit_patch(&n).is_none());
    }

    #[test]
    fn a_stale_note_on_a_schedulable_node_is_dropped() {
        // Left by an earlier maintenance that upstream gave back.
        let mut before = node(None, None);
        before.metadata.annotations =
            Some([(PRIOR_CORDON_ANNOTATION.to_string(), "true".to_string())].into());
        assert!(!notes_prior_cordon(&before));
        let during = apply(&before, enter_patch(&before).expect("changes"));
        assert_eq!(annotated(&during), None);
        assert!(!keeps_cordon(&during));
        let after = apply(&during, exit_patch(&during).expect("changes"));
        assert!(!is_cordoned(&after));
    }

    #[test]
    fn a_node_taken_over_from_upstream_is_uncordoned() {
        // Upstream's marks, no note: the cordon is the maintenance's.
        let before = node(None, None);
        let mut upstream = apply(&before, enter_patch(&before).expect("changes"));
        upstream.metadata.annotations = None;
        assert!(enter_patch(&upstream).is_none());
        let after = apply(&upstream, exit_patch(&upstream).expect("changes"));
        assert_eq!(after, before);
    }

    #[test]
    fn exclude_from_remediation_is_exactly_true() {
        // Node Health Check skips a node only for the value "true".
        for value in ["false", "True", "TRUE", "yes", "", "1"] {
            let before = node(None, Some(vec![(EXCLUDE_FROM_REMEDIATION_LABEL, value)]));
            let during = apply(&before, enter_patch(&before).expect("changes"));
            assert_eq!(
                during
                    .labels()
                    .get(EXCLUDE_FROM_REMEDIATION_LABEL)
                    .map(String::as_str),
                Some("true"),
                "label value {value:?} replaced"
            );
            assert!(is_in_maintenance(&during), "{value:?}");
            assert!(
                !is_in_maintenance(&cordoned(before.clone())),
                "{value:?} is not ours"
            );
        }
        assert_eq!(EXCLUDE_FROM_REMEDIATION_VALUE, "true");
    }

    #[test]
    fn label_key_is_pointer_escaped() {
        assert_eq!(
            pointer_key(EXCLUDE_FROM_REMEDIATION_LABEL),
            "remediation.medik8s.io~1exclude-from-remediation"
        );
    }
}

#[cfg(test)]
mod undone_tests {
    use super::*;
    use crate::plan::left_to_hand;
    use shared::MaintenancePhase::{Pending, Running, Succeeded};

    /// A node in maintenance, then each of a person's steps in turn (seed
    /// 003's emergency steps): what is reported undone, and whether a
    /// finished maintenance leaves the node to them.
    #[test]
    fn each_step_by_hand_is_named_and_a_finished_maintenance_leaves_it() {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.spec = Some(Default::default());
        let taken = enter_patch(&n).expect("a patch");
        let mut doc = serde_json::to_value(&n).expect("node json");
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(taken[1..].to_vec())).expect("ops");
        json_patch::patch(&mut doc, &patch).expect("applies");
        let mut n: Node = serde_json::from_value(doc).expect("node");
        assert!(undone(&n).is_empty(), "in maintenance: nothing undone");
        let spec = n.spec.get_or_insert_with(Default::default);
        spec.unschedulable = Some(false);
        assert_eq!(undone(&n), ["uncordoned"]);
        let spec = n.spec.get_or_insert_with(Default::default);
        spec.taints = None;
        if let Some(l) = n.metadata.labels.as_mut() {
            l.clear();
        }
        assert_eq!(
            undone(&n),
            [
                "uncordoned",
                "taint medik8s.io/drain:NoSchedule removed",
                "taint node.kubernetes.io/unschedulable:NoSchedule removed",
                "label remediation.medik8s.io/exclude-from-remediation removed"
            ]
        );
        let some = ["uncordoned"];
        for (phase, left) in [
            (Some(Succeeded), true),
            (Some(Running), false),
            (Some(Pending), false),
            (None, false),
        ] {
            assert_eq!(left_to_hand(phase.as_ref(), &some), left, "{phase:?}");
            assert!(
                !left_to_hand(phase.as_ref(), &[]),
                "{phase:?}: nothing undone"
            );
        }
    }
}
