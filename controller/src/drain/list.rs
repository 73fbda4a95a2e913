//! The node's pods, sorted the way the drain needs: every pod (for
//! `totalpods`), those that must leave, and those the drain rules keep
//! (`shared::rules::drain`: each leaving pod carries its behaviour and order
//! group). Whether a DaemonSet's pod stays
//! depends on its DaemonSet still existing (kubectl's orphan rule, see
//! `classify`): each round looks up, by name, the DaemonSet of every
//! unfinished DaemonSet pod on the node (metadata only), answers kept for a
//! few seconds.

use shared::rules::sync::LockExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Api, Client, ResourceExt};
use shared::PodReference;
use shared::kube::partial::PodView;
use shared::rules::drain::{DecidedBy, DrainBehavior, NodeRules, PodDrain, PodLabels};
use shared::rules::ttl::TtlCache;

use crate::classify::{classify, daemonset_to_look_up, is_finished};
use shared::kube::drain_rules::{DrainRules, NotSynced};

/// DaemonSet lookups under way at once in one round.
const DAEMONSET_LOOKUPS: usize = 8;

/// The pods on a node, split the way the drain needs.
#[derive(Debug, Default)]
pub struct NodePods {
    /// Every pod on the node (`totalpods`).
    pub total: usize,
    /// Pods that must leave, in name order (upstream's drain: those a
    /// `WaitCompleted` rule waits for included).
    pub must_leave: Vec<LeavingPod>,
    /// Pods upstream's drain would evict that a drain rule keeps (`Skip`),
    /// with who decided.
    pub kept: Vec<(PodReference, DecidedBy)>,
    /// The list's resourceVersion (a pod watch of the node starts there).
    pub listed_at: Option<String>,
}

/// A pod that must leave the node, as the drain keeps it from the list to
/// its eviction: its metadata (name, uid, labels, deletion time,
/// finalizers), which is all the eviction, the events and the status read.
/// Not a whole `Pod`: that struct is some 2 KiB even with an empty spec, and
/// 100 drains at once hold 3,000 of these.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeavingPod {
    pub metadata: ObjectMeta,
    /// Its behaviour and order group (upstream's: Drain, 0, with no rule).
    pub drain: PodDrain,
    /// Phase Succeeded or Failed.
    pub finished: bool,
}

/// A pod's (namespace, name), borrowed.
fn sort_key(p: &LeavingPod) -> (&str, &str) {
    let m = &p.metadata;
    (
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
    )
}

impl LeavingPod {
    pub fn namespace(&self) -> String {
        self.metadata.namespace.clone().unwrap_or_default()
    }

    pub fn name(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    pub fn reference(&self) -> PodReference {
        PodReference {
            namespace: self.namespace(),
            name: self.name(),
        }
    }
}

/// Why the pods of a node could not be sorted out this round (retried).
#[derive(Debug, thiserror::Error)]
pub enum ListPodsError {
    #[error("failed to list the pods on node {node}: {source}")]
    List {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "failed to look up DaemonSet {namespace}/{name}, the controller of pod {namespace}/{pod} on node {node}: {source}; \
         a DaemonSet's pod leaves the node only once the DaemonSet is gone, so the drain waits and retries \
         (the controller needs get on apps/daemonsets)"
    )]
    DaemonSet {
        node: String,
        namespace: String,
        name: String,
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot drain node {node} yet: {source}")]
    RulesNotRead {
        node: String,
        #[source]
        source: NotSynced,
    },
}

/// List the pods of `node` (`shared::kube::partial::list_node_pods`): 100 drains at
/// once hold their pods' names and owners, not their specs.
pub(super) async fn list_node_pods(
    client: &Client,
    answers: &DaemonSetAnswers,
    rules: &DrainRules,
    node: &Node,
) -> Result<NodePods, ListPodsError> {
    let node_name = node.name_any();
    let current = rules
        .current()
        .await
        .map_err(|source| ListPodsError::RulesNotRead {
            node: node_name.clone(),
            source,
        })?;
    let node_rules = current.for_node(node.labels());
    let (pods, listed_at) = shared::kube::partial::list_node_pod_views(client, &node_name)
        .await
        .map_err(|source| ListPodsError::List {
            node: node_name.clone(),
            source,
        })?;
    let total = pods.len();
    let Sorted {
        wanted,
        candidates,
        kept,
    } = sort_pods(pods, &node_rules, rules, current.is_empty());
    let live = live_daemonsets(client, answers, &node_name, wanted).await?;
    let mut must_leave: Vec<LeavingPod> = candidates
        .into_iter()
        .filter(|(_, ds)| ds.as_ref().is_none_or(|key| !live.contains(key)))
        .map(|(p, _)| p)
        .collect();
    // By namespace, then name (compared in place: no copies per comparison).
    must_leave.sort_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    Ok(NodePods {
        total,
        must_leave,
        kept,
        listed_at,
    })
}

/// The node's pods sorted before the DaemonSet lookups.
#[derive(Default)]
struct Sorted {
    /// The DaemonSets to look up, each with one of its pods (for errors).
    wanted: BTreeMap<(String, String), String>,
    /// Pods that leave unless their DaemonSet exists.
    candidates: Vec<(LeavingPod, Option<(String, String)>)>,
    /// Pods a drain rule keeps.
    kept: Vec<(PodReference, DecidedBy)>,
}

/// One whole `Pod` at a time (the rules read that type), never the node's.
/// Whether a pod leaves can hang only on its DaemonSet still existing,
/// which is looked up once the node's pods are sorted.
fn sort_pods(
    pods: Vec<PodView>,
    node_rules: &NodeRules,
    rules: &DrainRules,
    no_rules: bool,
) -> Sorted {
    let mut out = Sorted::default();
    for p in pods.into_iter().map(PodView::into_pod) {
        if !classify(&p, |_| false).must_leave() {
            continue;
        }
        let drain = decide(node_rules, rules, &p, no_rules);
        if drain.behavior == DrainBehavior::Skip {
            out.kept.push((pod_reference(&p), drain.by));
            continue;
        }
        let ds =
            daemonset_to_look_up(&p).map(|ds| (p.namespace().unwrap_or_default(), ds.to_string()));
        if let Some(key) = &ds {
            out.wanted.insert(key.clone(), p.name_any());
        }
        let finished = is_finished(&p);
        let pod = LeavingPod {
            metadata: p.metadata,
            drain,
            finished,
        };
        out.candidates.push((pod, ds));
    }
    out
}

/// The pod's behaviour under the rules (upstream's with none, and no label).
fn decide(node_rules: &NodeRules, rules: &DrainRules, p: &Pod, no_rules: bool) -> PodDrain {
    let labels = &p.metadata.labels;
    let annotations = &p.metadata.annotations;
    let plain = no_rules
        && labels
            .as_ref()
            .is_none_or(|l| !l.contains_key(shared::rules::drain::DRAIN_LABEL))
        && annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(shared::rules::drain::DRAIN_ORDER_ANNOTATION));
    if plain {
        return PodDrain::default();
    }
    let empty = BTreeMap::new();
    let namespace_labels = if no_rules {
        BTreeMap::new()
    } else {
        rules.namespace_labels(p.metadata.namespace.as_deref().unwrap_or_default())
    };
    node_rules.decide(PodLabels {
        labels: labels.as_ref().unwrap_or(&empty),
        annotations: annotations.as_ref().unwrap_or(&empty),
        namespace_labels: &namespace_labels,
    })
}

fn pod_reference(p: &Pod) -> PodReference {
    PodReference {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
    }
}

/// How long an answer to "does DaemonSet ns/name exist" is trusted. Every
/// drain round of every maintenance asks about the DaemonSets of its node's
/// pods, mostly the same few cluster-wide ones (CNI, log agents): 100 nodes
/// draining at once ask once per DaemonSet, not 100 times per round. A
/// DaemonSet deleted meanwhile has its pods garbage-collected anyway; the
/// orphan rule (kubectl's) only needs the answer to be recent.
const DAEMONSET_ANSWER_TTL: Duration = Duration::from_secs(10);

/// DaemonSets remembered at most (a cluster has a few dozen).
const DAEMONSET_ANSWERS_KEPT: usize = 4096;

/// Recent answers to "does DaemonSet (namespace, name) exist"; owned by the
/// [`super::Drainer`].
pub(super) struct DaemonSetAnswers {
    answers: Mutex<TtlCache<(String, String), bool>>,
}

impl Default for DaemonSetAnswers {
    fn default() -> Self {
        DaemonSetAnswers {
            answers: Mutex::new(TtlCache::new(DAEMONSET_ANSWERS_KEPT)),
        }
    }
}

impl DaemonSetAnswers {
    fn entries(&self) -> std::sync::MutexGuard<'_, TtlCache<(String, String), bool>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.answers.locked()
    }

    /// The answer for `key` given less than [`DAEMONSET_ANSWER_TTL`] ago.
    fn recent(&self, key: &(String, String)) -> Option<bool> {
        self.entries().get(key, Instant::now()).copied()
    }

    fn remember(&self, key: (String, String), exists: bool) {
        self.entries()
            .insert(key, exists, DAEMONSET_ANSWER_TTL, Instant::now());
    }
}

/// `(namespace, name)` of the DaemonSets that exist among `wanted` (those the
/// pods' classification needs, see `classify::daemonset_to_look_up`, each with
/// one of its pods on the node for the error text).
async fn live_daemonsets(
    client: &Client,
    answers: &DaemonSetAnswers,
    node: &str,
    wanted: BTreeMap<(String, String), String>,
) -> Result<BTreeSet<(String, String)>, ListPodsError> {
    // One lookup per DaemonSet not answered recently.
    let mut live = BTreeSet::new();
    let wanted: BTreeMap<(String, String), String> = wanted
        .into_iter()
        .filter(|(key, _)| match answers.recent(key) {
            Some(true) => {
                live.insert(key.clone());
                false
            }
            Some(false) => false,
            None => true,
        })
        .collect();
    let found: Vec<_> = futures::stream::iter(wanted)
        .map(|((namespace, name), pod)| async move {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
            let answer = api.get_metadata_opt(&name).await;
            (namespace, name, pod, answer)
        })
        .buffer_unordered(DAEMONSET_LOOKUPS)
        .collect()
        .await;
    for (namespace, name, pod, answer) in found {
        if let Ok(found) = &answer {
            answers.remember((namespace.clone(), name.clone()), found.is_some());
        }
        match answer {
            Ok(Some(_)) => {
                live.insert((namespace, name));
            }
            Ok(None) => {
                tracing::debug!(daemonset = %format!("{namespace}/{name}"), %pod, %node,
                    "DaemonSet gone: its pod is an orphan and leaves the node");
            }
            Err(source) => {
                return Err(ListPodsError::DaemonSet {
                    node: node.to_string(),
                    namespace,
                    name,
                    pod,
                    source,
                });
            }
        }
    }
    Ok(live)
}

pub fn references(pods: &[LeavingPod]) -> Vec<PodReference> {
    pods.iter().map(LeavingPod::reference).collect()
}
