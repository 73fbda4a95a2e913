//! Drain rules (beyond upstream, opt-in): for each pod a drain would
//! evict, which behaviour and order group it gets, and what the drain does
//! with it this round. Pure; the controller's drain and the webhook's
//! pre-flight warnings both ask these functions, so they cannot disagree.
//!
//! Precedence, first that applies:
//! 1. the pod's label `nodemaintenance.medik8s.io/drain` (`skip`,
//!    `wait-completed` or `drain`; any other value is ignored and reported);
//! 2. the first `NodeDrainRule`, by name in ascending (byte) order, whose
//!    nodes match the node and whose pods match the pod and its namespace;
//! 3. `Drain` in group 0: upstream's drain.
//!
//! The order group of a `Drain` pod is the pod's annotation
//! `nodemaintenance.medik8s.io/drain-order` (an integer) if set, else the
//! deciding rule's `order`, else 0. Groups leave in ascending order: a group
//! is evicted once no pod of a lower group is on the node. A `WaitCompleted`
//! pod is never evicted while it runs (the drain waits for it to finish or
//! go, in every group); once finished it leaves as finished pods do. `Skip`
//! pods stay, as DaemonSet pods do. The selection of DaemonSet and mirror
//! pods (kubectl's rules, see the controller's `classify`) comes first: the
//! rules only ever narrow what upstream's drain would evict.

mod selector;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use self::selector::{FieldError, Selector};
pub use crate::api::drain_rule::DrainBehavior;
use crate::api::drain_rule::NodeDrainRuleSpec;

/// The pod label by which a pod's owner overrides every rule.
pub const DRAIN_LABEL: &str = "nodemaintenance.medik8s.io/drain";
/// The pod annotation giving a drained pod its order group (an integer).
pub const DRAIN_ORDER_ANNOTATION: &str = "nodemaintenance.medik8s.io/drain-order";

/// A `NodeDrainRule`, checked and ready to match.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub behavior: DrainBehavior,
    pub order: i32,
    nodes: Vec<Selector>,
    /// (pod selector, namespace selector) pairs.
    pods: Vec<(Selector, Selector)>,
}

impl Rule {
    /// Checks the rule `name`; every mistake is named by its field path.
    pub fn compile(name: &str, spec: &NodeDrainRuleSpec) -> Result<Rule, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut keep = |r: Result<Selector, Vec<FieldError>>| match r {
            Ok(s) => s,
            Err(e) => {
                errors.extend(e);
                Selector::default()
            }
        };
        let nodes: Vec<Selector> = (spec.nodes.iter().enumerate())
            .map(|(i, n)| {
                keep(Selector::parse(
                    n.selector.as_ref(),
                    &format!("spec.nodes[{i}].selector"),
                ))
            })
            .collect();
        let pods: Vec<(Selector, Selector)> = (spec.pods.iter().enumerate())
            .map(|(i, p)| {
                let pod = keep(Selector::parse(
                    p.selector.as_ref(),
                    &format!("spec.pods[{i}].selector"),
                ));
                let ns = keep(Selector::parse(
                    p.namespace_selector.as_ref(),
                    &format!("spec.pods[{i}].namespaceSelector"),
                ));
                (pod, ns)
            })
            .collect();
        let behavior = spec.drain.behavior;
        if spec.drain.order.is_some() && behavior != DrainBehavior::Drain {
            errors.push(FieldError {
                field: "spec.drain.order".into(),
                why: format!(
                    "an order is for behavior Drain only; this rule's behavior is {}: remove the order",
                    behavior.as_str()
                ),
            });
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Rule {
            name: name.to_string(),
            behavior,
            order: spec.drain.order.unwrap_or(0),
            nodes,
            pods,
        })
    }

    fn is_for_node(&self, node_labels: &BTreeMap<String, String>) -> bool {
        self.nodes.is_empty() || self.nodes.iter().any(|s| s.matches(node_labels))
    }

    fn is_for_pod(&self, pod: &PodLabels) -> bool {
        self.pods.is_empty()
            || (self.pods.iter())
                .any(|(p, ns)| p.matches(pod.labels) && ns.matches(pod.namespace_labels))
    }
}

/// Every rule, sorted by name (the precedence among rules).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules(Vec<Rule>);

impl Rules {
    pub fn new(mut rules: Vec<Rule>) -> Rules {
        rules.sort_by(|a, b| a.name.cmp(&b.name));
        Rules(rules)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rules for one node, picked once per drain round.
    pub fn for_node(&self, node_labels: &BTreeMap<String, String>) -> NodeRules<'_> {
        NodeRules(
            self.0
                .iter()
                .filter(|r| r.is_for_node(node_labels))
                .collect(),
        )
    }
}

/// The rules that apply to one node, in precedence order.
#[derive(Debug, Default)]
pub struct NodeRules<'a>(Vec<&'a Rule>);

/// What the rules read of a pod: its labels and annotations, and its
/// namespace's labels (empty when the namespace is not known).
#[derive(Debug, Clone, Copy)]
pub struct PodLabels<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    pub namespace_labels: &'a BTreeMap<String, String>,
}

/// Who decided a pod's behaviour.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DecidedBy {
    /// No label, no rule: upstream's drain.
    #[default]
    Default,
    /// The pod's own label.
    PodLabel,
    /// The named `NodeDrainRule`.
    Rule(String),
}

impl std::fmt::Display for DecidedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecidedBy::Default => f.write_str("the default"),
            DecidedBy::PodLabel => write!(f, "pod label {DRAIN_LABEL}"),
            DecidedBy::Rule(name) => write!(f, "NodeDrainRule {name}"),
        }
    }
}

/// A pod's behaviour and order group, and why; the default is upstream's
/// drain (evicted, group 0).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDrain {
    pub behavior: DrainBehavior,
    /// The order group (meaningful for `Drain`).
    pub order: i32,
    pub by: DecidedBy,
    /// A label or annotation value that was ignored, in words.
    pub ignored: Option<String>,
}

impl NodeRules<'_> {
    /// The behaviour and order group of a pod (the precedence of the module doc).
    pub fn decide(&self, pod: PodLabels) -> PodDrain {
        let mut ignored = None;
        let label = pod.labels.get(DRAIN_LABEL).map(String::as_str);
        let from_label = match label {
            Some("skip") => Some(DrainBehavior::Skip),
            Some("wait-completed") => Some(DrainBehavior::WaitCompleted),
            Some("drain") => Some(DrainBehavior::Drain),
            Some(other) => {
                ignored = Some(format!(
                    "label {DRAIN_LABEL}={other:?} is none of skip, wait-completed, drain: ignored"
                ));
                None
            }
            None => None,
        };
        let rule = self.0.iter().find(|r| r.is_for_pod(&pod));
        let (behavior, by, rule_order) = match (from_label, rule) {
            (Some(b), _) => (b, DecidedBy::PodLabel, 0),
            (None, Some(r)) => (r.behavior, DecidedBy::Rule(r.name.clone()), r.order),
            (None, None) => (DrainBehavior::Drain, DecidedBy::Default, 0),
        };
        let order = match pod.annotations.get(DRAIN_ORDER_ANNOTATION) {
            None => rule_order,
            Some(text) => text.trim().parse::<i32>().unwrap_or_else(|_| {
                ignored.get_or_insert(format!(
                    "annotation {DRAIN_ORDER_ANNOTATION}={text:?} is not a whole number: ignored"
                ));
                rule_order
            }),
        };
        PodDrain {
            behavior,
            order: if behavior == DrainBehavior::Drain {
                order
            } else {
                0
            },
            by,
            ignored,
        }
    }
}

/// What the drain does with one pod that upstream's drain would evict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStep {
    /// Evict it now.
    Evict,
    /// Its order group comes later: `current` must leave first.
    AfterGroup { group: i32, current: i32 },
    /// Wait for it to finish (`WaitCompleted`, still running).
    WaitCompletion,
    /// Keep it on the node (`Skip`).
    Keep,
}

/// The order group being drained: the lowest group of the `Drain` pods not
/// finished (a finished pod leaves at once and holds no group back).
pub fn current_group<'a>(pods: impl IntoIterator<Item = (&'a PodDrain, bool)>) -> Option<i32> {
    pods.into_iter()
        .filter(|(d, finished)| d.behavior == DrainBehavior::Drain && !finished)
        .map(|(d, _)| d.order)
        .min()
}

/// The step for one pod: `finished` is its phase (Succeeded or Failed),
/// `current` the group being drained ([`current_group`]).
pub fn step(drain: &PodDrain, finished: bool, current: Option<i32>) -> PodStep {
    match drain.behavior {
        DrainBehavior::Skip => PodStep::Keep,
        _ if finished => PodStep::Evict,
        DrainBehavior::WaitCompleted => PodStep::WaitCompletion,
        DrainBehavior::Drain => match current {
            Some(c) if drain.order > c => PodStep::AfterGroup {
                group: drain.order,
                current: c,
            },
            _ => PodStep::Evict,
        },
    }
}

/// What the rules will do on a node, for the pre-flight warnings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preview {
    /// Pods kept on the node, with who decided.
    pub kept: Vec<(String, DecidedBy)>,
    /// Pods waited for until they finish, with who decided.
    pub waited: Vec<(String, DecidedBy)>,
    /// Order group -> how many pods, when there is more than one group.
    pub groups: BTreeMap<i32, usize>,
    /// Ignored labels and annotations, per pod.
    pub ignored: Vec<(String, String)>,
}

/// The preview of `pods` (a name, its decision, whether it has finished).
pub fn preview<'a>(pods: impl IntoIterator<Item = (&'a str, &'a PodDrain, bool)>) -> Preview {
    let mut out = Preview::default();
    for (name, d, finished) in pods {
        if let Some(why) = &d.ignored {
            out.ignored.push((name.to_string(), why.clone()));
        }
        match (d.behavior, finished) {
            (DrainBehavior::Skip, _) => out.kept.push((name.to_string(), d.by.clone())),
            (_, true) => {}
            (DrainBehavior::WaitCompleted, false) => {
                out.waited.push((name.to_string(), d.by.clone()))
            }
            (DrainBehavior::Drain, false) => *out.groups.entry(d.order).or_default() += 1,
        }
    }
    if out.groups.len() < 2 {
        out.groups.clear();
    }
    out
}
