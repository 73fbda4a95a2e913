//! Shed traffic first (beyond upstream, opt-in: `--exclude-from-load-balancers`):
//! a node taken by a maintenance gets the label
//! `node.kubernetes.io/exclude-from-external-load-balancers` in the same
//! patch as its cordon, and the drain waits `--load-balancer-drain-delay`
//! before its first eviction, so the load balancers stop sending new
//! connections and the open ones end before pods go.
//!
//! Our annotation [`EXCLUDED_AT_ANNOTATION`] (its value: when the label went
//! on) marks that we put the label there: the give-back removes both, and
//! only then; a label that was there before (an admin's) is left alone, as
//! a prior cordon is. The time lives on the node, so a restart or a failover
//! keeps the wait. Pure: the patch operations and the wait.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use shared::serve::drain_flags::EXCLUDE_FROM_LB_LABEL;

/// On a node whose exclusion label we added: when (RFC 3339).
pub const EXCLUDED_AT_ANNOTATION: &str =
    "nodemaintenance.medik8s.io/excluded-from-load-balancers-at";

fn pointer_key(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn label(node: &Node) -> Option<&String> {
    node.metadata.labels.as_ref()?.get(EXCLUDE_FROM_LB_LABEL)
}

fn excluded_at(node: &Node) -> Option<&String> {
    node.metadata
        .annotations
        .as_ref()?
        .get(EXCLUDED_AT_ANNOTATION)
}

/// The operations that exclude `node` from external load balancers at
/// `now`, appended to a patch whose earlier operations create the labels
/// or annotations map when `labels`/`annotations` say the node lacks it.
/// Empty when the node carries the label already (ours or not).
pub fn exclude_ops(node: &Node, now: Timestamp, maps: (bool, bool)) -> Vec<Value> {
    if label(node).is_some() {
        return Vec::new();
    }
    let (labels, annotations) = maps;
    let add = |exists: bool, map: &str, key: &str, value: &str| {
        if exists {
            json!({"op": "add", "path": format!("/metadata/{map}/{}", pointer_key(key)), "value": value})
        } else {
            json!({"op": "add", "path": format!("/metadata/{map}"), "value": {key: value}})
        }
    };
    vec![
        add(labels, "labels", EXCLUDE_FROM_LB_LABEL, "true"),
        add(
            annotations,
            "annotations",
            EXCLUDED_AT_ANNOTATION,
            &now.to_string(),
        ),
    ]
}

/// The operations that give the exclusion back: the label and our
/// annotation, only when the annotation says we put the label there.
pub fn give_back_ops(node: &Node) -> Vec<Value> {
    if excluded_at(node).is_none() {
        return Vec::new();
    }
    let remove = |map: &str, key: &str| json!({"op": "remove", "path": format!("/metadata/{map}/{}", pointer_key(key))});
    let mut ops = Vec::new();
    if label(node).is_some() {
        ops.push(remove("labels", EXCLUDE_FROM_LB_LABEL));
    }
    ops.push(remove("annotations", EXCLUDED_AT_ANNOTATION));
    ops
}

/// How long the drain still waits before its first eviction: `delay`
/// after the label went on (our annotation's time; `now` when it goes on
/// in this pass), None once that has passed or when the label is not ours.
pub fn drain_wait(
    node: &Node,
    delay: Duration,
    now: Timestamp,
    added_now: bool,
) -> Option<Duration> {
    let since = if added_now {
        now
    } else {
        excluded_at(node)?.parse::<Timestamp>().ok()?
    };
    let until = since.saturating_add(delay).ok()?;
    let left = Duration::try_from(now.duration_until(until)).ok()?;
    (!left.is_zero()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let map = |p: &[(&str, &str)]| {
            (!p.is_empty()).then(|| {
                p.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
        };
        let mut n = Node::default();
        n.metadata.name = Some("w1".into());
        n.metadata.labels = map(labels);
        n.metadata.annotations = map(annotations);
        n
    }

    fn apply(n: &Node, ops: Vec<Value>) -> Node {
        let mut doc = serde_json::to_value(n).expect("node");
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).expect("patch");
        json_patch::patch(&mut doc, &patch).expect("applies");
        serde_json::from_value(doc).expect("node")
    }

    const NOW: &str = "2026-12-06T16:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().expect("time")
    }

    #[test]
    fn excluded_then_given_back_exactly() {
        // (case, node before, label after exclude, label after give-back)
        let cases = [
            ("plain node", node(&[("zone", "a")], &[]), true, false),
            (
                "no labels or annotations at all",
                node(&[], &[]),
                true,
                false,
            ),
            (
                "label there before: kept",
                node(&[(EXCLUDE_FROM_LB_LABEL, "")], &[]),
                true,
                true,
            ),
        ];
        for (name, before, excluded, after) in cases {
            let maps = (
                before.metadata.labels.is_some(),
                before.metadata.annotations.is_some(),
            );
            let taken = apply(&before, exclude_ops(&before, now(), maps));
            assert_eq!(label(&taken).is_some(), excluded, "{name}");
            let back = apply(&taken, give_back_ops(&taken));
            assert_eq!(label(&back).is_some(), after, "{name}");
            assert!(excluded_at(&back).is_none(), "{name}: our annotation goes");
            assert_eq!(
                back.metadata.labels.unwrap_or_default().len(),
                before.metadata.labels.clone().unwrap_or_default().len(),
                "{name}: other labels untouched"
            );
        }
    }

    #[test]
    fn the_wait_counts_from_the_label() {
        let delay = Duration::from_secs(30);
        let at = |t: &str| {
            node(
                &[(EXCLUDE_FROM_LB_LABEL, "true")],
                &[(EXCLUDED_AT_ANNOTATION, t)],
            )
        };
        // (case, node, added in this pass, wait left)
        let cases = [
            ("added now", node(&[], &[]), true, Some(delay)),
            (
                "added 10 s ago",
                at("2026-12-06T15:59:50Z"),
                false,
                Some(Duration::from_secs(20)),
            ),
            (
                "added a minute ago",
                at("2026-12-06T15:59:00Z"),
                false,
                None,
            ),
            (
                "not ours",
                node(&[(EXCLUDE_FROM_LB_LABEL, "")], &[]),
                false,
                None,
            ),
            ("unreadable time: no wait", at("soon"), false, None),
        ];
        for (name, n, added, want) in cases {
            assert_eq!(drain_wait(&n, delay, now(), added), want, "{name}");
        }
    }
}
