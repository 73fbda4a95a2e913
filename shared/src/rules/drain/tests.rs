use super::*;
use crate::api::drain_rule::{DrainPolicy, NodeSelection, PodSelection};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sel(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(map(pairs)),
        match_expressions: None,
    })
}

/// A rule: behaviour, order, node labels, pod labels, namespace labels
/// (an empty list leaves that selector out).
fn rule(
    name: &str,
    behavior: DrainBehavior,
    order: Option<i32>,
    node: &[(&str, &str)],
    pod: &[(&str, &str)],
    ns: &[(&str, &str)],
) -> Rule {
    let spec = NodeDrainRuleSpec {
        drain: DrainPolicy { behavior, order },
        nodes: if node.is_empty() {
            vec![]
        } else {
            vec![NodeSelection {
                selector: sel(node),
            }]
        },
        pods: vec![PodSelection {
            selector: if pod.is_empty() { None } else { sel(pod) },
            namespace_selector: if ns.is_empty() { None } else { sel(ns) },
        }],
    };
    Rule::compile(name, &spec).unwrap_or_else(|e| panic!("{name}: {e:?}"))
}

use DrainBehavior::{Drain, Skip, WaitCompleted};

fn fleet_rules() -> Rules {
    Rules::new(vec![
        // Deliberately out of name order: Rules sorts them.
        rule(
            "b-storage-last",
            Drain,
            Some(10),
            &[("pool", "storage")],
            &[("app", "osd")],
            &[],
        ),
        rule("a-logs-stay", Skip, None, &[], &[("app", "fluent")], &[]),
        rule(
            "c-batch-finishes",
            WaitCompleted,
            None,
            &[],
            &[],
            &[("team", "batch")],
        ),
        rule("d-osd-skip", Skip, None, &[], &[("app", "osd")], &[]),
    ])
}

struct Case {
    name: &'static str,
    node: &'static [(&'static str, &'static str)],
    pod: &'static [(&'static str, &'static str)],
    annotations: &'static [(&'static str, &'static str)],
    ns: &'static [(&'static str, &'static str)],
    want: (DrainBehavior, i32, &'static str),
    ignored: Option<&'static str>,
}

const STORAGE: &[(&str, &str)] = &[("pool", "storage")];

#[test]
fn decide_follows_the_documented_precedence() {
    let c = |name, node, pod, annotations, ns, want, ignored| Case {
        name,
        node,
        pod,
        annotations,
        ns,
        want,
        ignored,
    };
    let cases = [
        c(
            "no rule matches: upstream",
            STORAGE,
            &[("app", "web")],
            &[],
            &[],
            (Drain, 0, "the default"),
            None,
        ),
        c(
            "a rule matches",
            &[],
            &[("app", "fluent")],
            &[],
            &[],
            (Skip, 0, "NodeDrainRule a-logs-stay"),
            None,
        ),
        c(
            "the first by name wins",
            STORAGE,
            &[("app", "osd")],
            &[],
            &[],
            (Drain, 10, "NodeDrainRule b-storage-last"),
            None,
        ),
        c(
            "a rule's node selector",
            &[("pool", "web")],
            &[("app", "osd")],
            &[],
            &[],
            (Skip, 0, "NodeDrainRule d-osd-skip"),
            None,
        ),
        c(
            "a namespace selector",
            &[],
            &[],
            &[],
            &[("team", "batch")],
            (WaitCompleted, 0, "NodeDrainRule c-batch-finishes"),
            None,
        ),
        c(
            "the pod label over rules",
            &[],
            &[("app", "fluent"), (DRAIN_LABEL, "drain")],
            &[],
            &[],
            (Drain, 0, "pod label"),
            None,
        ),
        c(
            "label skip",
            &[],
            &[(DRAIN_LABEL, "skip")],
            &[],
            &[],
            (Skip, 0, "pod label"),
            None,
        ),
        c(
            "label wait-completed",
            &[],
            &[(DRAIN_LABEL, "wait-completed")],
            &[],
            &[("team", "batch")],
            (WaitCompleted, 0, "pod label"),
            None,
        ),
        c(
            "an unknown label value is ignored",
            &[],
            &[("app", "fluent"), (DRAIN_LABEL, "Skip")],
            &[],
            &[],
            (Skip, 0, "NodeDrainRule a-logs-stay"),
            Some("none of skip"),
        ),
        c(
            "the order annotation",
            STORAGE,
            &[("app", "osd")],
            &[(DRAIN_ORDER_ANNOTATION, " -5 ")],
            &[],
            (Drain, -5, "NodeDrainRule b-storage-last"),
            None,
        ),
        c(
            "the annotation without a rule",
            &[],
            &[],
            &[(DRAIN_ORDER_ANNOTATION, "3")],
            &[],
            (Drain, 3, "the default"),
            None,
        ),
        c(
            "a bad annotation keeps the rule's order",
            STORAGE,
            &[("app", "osd")],
            &[(DRAIN_ORDER_ANNOTATION, "late")],
            &[],
            (Drain, 10, "NodeDrainRule b-storage-last"),
            Some("not a whole number"),
        ),
        c(
            "no order for Skip",
            &[],
            &[(DRAIN_LABEL, "skip")],
            &[(DRAIN_ORDER_ANNOTATION, "3")],
            &[],
            (Skip, 0, "pod label"),
            None,
        ),
    ];
    let rules = fleet_rules();
    for case in cases {
        let node = map(case.node);
        let (labels, annotations, ns) = (map(case.pod), map(case.annotations), map(case.ns));
        let got = rules.for_node(&node).decide(PodLabels {
            labels: &labels,
            annotations: &annotations,
            namespace_labels: &ns,
        });
        let (behavior, order, by) = case.want;
        assert_eq!(
            (got.behavior, got.order),
            (behavior, order),
            "{}: {got:?}",
            case.name
        );
        assert!(got.by.to_string().contains(by), "{}: {got:?}", case.name);
        match (case.ignored, &got.ignored) {
            (None, None) => {}
            (Some(w), Some(text)) => assert!(text.contains(w), "{}: {text}", case.name),
            (want, got) => panic!("{}: ignored {got:?}, want {want:?}", case.name),
        }
    }
}

#[test]
fn no_rules_no_label_is_upstream() {
    let empty = BTreeMap::new();
    let got = Rules::default().for_node(&empty).decide(PodLabels {
        labels: &empty,
        annotations: &empty,
        namespace_labels: &empty,
    });
    assert_eq!(got, PodDrain::default());
}

fn drain(behavior: DrainBehavior, order: i32) -> PodDrain {
    PodDrain {
        behavior,
        order,
        ..PodDrain::default()
    }
}

#[test]
fn steps_follow_the_groups() {
    // (case, pod, finished, current group, step)
    let cases = [
        (
            "upstream: every pod now",
            drain(Drain, 0),
            false,
            Some(0),
            PodStep::Evict,
        ),
        (
            "the current group",
            drain(Drain, 5),
            false,
            Some(5),
            PodStep::Evict,
        ),
        (
            "a later group waits",
            drain(Drain, 10),
            false,
            Some(5),
            PodStep::AfterGroup {
                group: 10,
                current: 5,
            },
        ),
        (
            "a finished pod leaves in any group",
            drain(Drain, 10),
            true,
            Some(5),
            PodStep::Evict,
        ),
        (
            "WaitCompleted running",
            drain(WaitCompleted, 0),
            false,
            Some(0),
            PodStep::WaitCompletion,
        ),
        (
            "WaitCompleted finished",
            drain(WaitCompleted, 0),
            true,
            None,
            PodStep::Evict,
        ),
        ("Skip stays", drain(Skip, 0), false, None, PodStep::Keep),
        (
            "Skip stays, finished too",
            drain(Skip, 0),
            true,
            None,
            PodStep::Keep,
        ),
    ];
    for (name, pod, finished, current, want) in cases {
        assert_eq!(step(&pod, finished, current), want, "{name}");
    }
}

#[test]
fn the_current_group_is_the_lowest_running_drain_group() {
    let pods = [
        (drain(Drain, 10), false),
        (drain(Drain, -1), true),
        (drain(WaitCompleted, 0), false),
        (drain(Drain, 3), false),
    ];
    assert_eq!(current_group(pods.iter().map(|(d, f)| (d, *f))), Some(3));
    assert_eq!(current_group([(&drain(Skip, 0), false)]), None);
}

#[test]
fn a_bad_rule_names_each_field() {
    let spec = NodeDrainRuleSpec {
        drain: DrainPolicy {
            behavior: Skip,
            order: Some(3),
        },
        nodes: vec![NodeSelection {
            selector: sel(&[("bad key!", "x")]),
        }],
        pods: vec![],
    };
    let errors = Rule::compile("r", &spec).expect_err("bad");
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.nodes[0].selector.matchLabels[\"bad key!\"]",
            "spec.drain.order"
        ]
    );
    assert!(errors[1].why.contains("behavior is Skip"), "{errors:?}");
}

#[test]
fn the_preview_names_kept_and_waited_pods_and_the_groups() {
    let by_rule = |b, o| PodDrain {
        by: DecidedBy::Rule("r".into()),
        ..drain(b, o)
    };
    let pods = [
        ("web", drain(Drain, 0), false),
        ("osd", by_rule(Drain, 10), false),
        ("fluent", by_rule(Skip, 0), false),
        ("train", by_rule(WaitCompleted, 0), false),
        ("done", by_rule(WaitCompleted, 0), true),
    ];
    let p = preview(pods.iter().map(|(n, d, f)| (*n, d, *f)));
    assert_eq!(
        p.kept,
        [("fluent".to_string(), DecidedBy::Rule("r".into()))]
    );
    assert_eq!(
        p.waited,
        [("train".to_string(), DecidedBy::Rule("r".into()))]
    );
    assert_eq!(p.groups, BTreeMap::from([(0, 1), (10, 1)]));
    let one_group = preview([("web", &drain(Drain, 0), false)]);
    assert!(
        one_group.groups.is_empty(),
        "one group is upstream's drain: {one_group:?}"
    );
}
