//! One drain round: list the node's pods, evict those that must leave
//! (concurrently, bounded), and report what is still there and why.
//!
//! A round never waits for pods to terminate; the reconciler comes back soon
//! and lists again. A pod counts as gone once the node's pod list no longer
//! has it (deleted, or recreated elsewhere under a new uid).
//!
//! Whether a DaemonSet's pod stays depends on its DaemonSet still existing
//! (kubectl's orphan rule, see `classify`): each round looks up, by name, the
//! DaemonSet of every unfinished DaemonSet pod on the node (metadata only).

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{EvictParams, ListParams};
use kube::{Api, Client, ResourceExt};
use shared::PodReference;

use crate::classify::{classify, daemonset_to_look_up};

/// DaemonSet lookups under way at once in one round.
const DAEMONSET_LOOKUPS: usize = 8;

/// The pods on a node, split the way the drain needs.
#[derive(Debug, Default)]
pub struct NodePods {
    /// Every pod on the node (`totalpods`).
    pub total: usize,
    /// Pods that must leave, in name order.
    pub must_leave: Vec<Pod>,
}

/// What happened to one pod this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// The eviction was accepted; the pod is terminating.
    Evicted,
    /// Already gone (404).
    Gone,
    /// Already terminating (since the given number of seconds).
    Terminating(i64),
    /// A PodDisruptionBudget said "not now" (429): the API server's message.
    Blocked(String),
    /// Any other refusal or failure (eviction webhook, several PDBs, network).
    Failed(String),
}

impl PodOutcome {
    pub fn describe(&self) -> String {
        match self {
            PodOutcome::Evicted => "eviction accepted, terminating".into(),
            PodOutcome::Gone => "gone".into(),
            PodOutcome::Terminating(s) => format!("terminating for {s}s"),
            PodOutcome::Blocked(m) => format!("eviction blocked by a PodDisruptionBudget: {m}"),
            PodOutcome::Failed(m) => format!("eviction failed: {m}"),
        }
    }
    fn is_problem(&self) -> bool {
        matches!(self, PodOutcome::Blocked(_) | PodOutcome::Failed(_))
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
}

/// List the pods of `node` (field selector, served from the API server's watch cache).
pub async fn list_node_pods(client: &Client, node: &str) -> Result<NodePods, ListPodsError> {
    let lp = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .match_any();
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|source| ListPodsError::List {
            node: node.to_string(),
            source,
        })?;
    let live = live_daemonsets(client, node, &pods.items).await?;
    let total = pods.items.len();
    let mut must_leave: Vec<Pod> = pods
        .items
        .into_iter()
        .filter(|p| {
            let ns = p.namespace().unwrap_or_default();
            classify(p, |ds| live.contains(&(ns, ds.to_string()))).must_leave()
        })
        .collect();
    must_leave.sort_by_key(|p| (p.namespace(), p.name_any()));
    Ok(NodePods { total, must_leave })
}

/// `(namespace, name)` of the DaemonSets that exist among those the pods'
/// classification needs (see `classify::daemonset_to_look_up`).
async fn live_daemonsets(
    client: &Client,
    node: &str,
    pods: &[Pod],
) -> Result<BTreeSet<(String, String)>, ListPodsError> {
    // One lookup per DaemonSet, remembering one of its pods for the error text.
    let wanted: BTreeMap<(String, String), String> = pods
        .iter()
        .filter_map(|p| {
            daemonset_to_look_up(p).map(|ds| {
                (
                    (p.namespace().unwrap_or_default(), ds.to_string()),
                    p.name_any(),
                )
            })
        })
        .collect();
    let answers: Vec<_> = futures::stream::iter(wanted)
        .map(|((namespace, name), pod)| async move {
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
            let answer = api.get_metadata_opt(&name).await;
            (namespace, name, pod, answer)
        })
        .buffer_unordered(DAEMONSET_LOOKUPS)
        .collect()
        .await;
    let mut live = BTreeSet::new();
    for (namespace, name, pod, answer) in answers {
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

pub fn references(pods: &[Pod]) -> Vec<PodReference> {
    pods.iter()
        .map(|p| PodReference {
            namespace: p.namespace().unwrap_or_default(),
            name: p.name_any(),
        })
        .collect()
}

fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            // The causes carry the PDB's own words ("The disruption budget web
            // needs 2 healthy pods and has 2 currently").
            let causes: Vec<String> = s
                .details
                .as_ref()
                .map(|d| d.causes.iter().map(|c| c.message.clone()).collect())
                .unwrap_or_default();
            if causes.is_empty() {
                s.message.clone()
            } else {
                format!("{} ({})", s.message, causes.join("; "))
            }
        }
        other => other.to_string(),
    }
}

async fn evict_one(client: Client, pod: Pod) -> (PodReference, PodOutcome) {
    let r = PodReference {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    };
    // Only pods that must leave get here: terminating means awaited.
    if pod.metadata.deletion_timestamp.is_some() {
        let since = pod
            .metadata
            .deletion_timestamp
            .as_ref()
            .map(|t| Timestamp::now().duration_since(t.0).as_secs())
            .unwrap_or(0)
            .max(0);
        return (r, PodOutcome::Terminating(since));
    }
    let api: Api<Pod> = Api::namespaced(client, &r.namespace);
    tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), "requesting eviction");
    // No delete options: each pod's own grace period applies, as upstream.
    let outcome = match api.evict(&r.name, &EvictParams::default()).await {
        Ok(_) => PodOutcome::Evicted,
        Err(kube::Error::Api(s)) if s.code == 404 => PodOutcome::Gone,
        Err(e @ kube::Error::Api(_)) if matches!(&e, kube::Error::Api(s) if s.code == 429) => {
            PodOutcome::Blocked(api_message(&e))
        }
        Err(e) => PodOutcome::Failed(api_message(&e)),
    };
    tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), outcome = ?outcome, "eviction answered");
    (r, outcome)
}

/// Evict every pod in `pods` at most `concurrency` at a time.
pub async fn evict_all(
    client: &Client,
    pods: Vec<Pod>,
    concurrency: usize,
) -> BTreeMap<PodReference, PodOutcome> {
    futures::stream::iter(pods)
        .map(|p| evict_one(client.clone(), p))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// The `lastError` text for a round that left pods on the node, or None when
/// nothing is in the way (pods only terminating).
pub fn blocker_summary(
    node: &str,
    outcomes: &BTreeMap<PodReference, PodOutcome>,
) -> Option<String> {
    const SHOWN: usize = 5;
    let problems: Vec<String> = outcomes
        .iter()
        .filter(|(_, o)| o.is_problem())
        .map(|(r, o)| format!("{}/{}: {}", r.namespace, r.name, o.describe()))
        .collect();
    if problems.is_empty() {
        return None;
    }
    let more = problems.len().saturating_sub(SHOWN);
    let mut text = format!(
        "not all pods evicted from node {node}, {} blocked: {}",
        problems.len(),
        problems
            .into_iter()
            .take(SHOWN)
            .collect::<Vec<_>>()
            .join("; ")
    );
    if more > 0 {
        text.push_str(&format!("; and {more} more"));
    }
    text.push_str("; the drain retries automatically once the blocker is lifted");
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: &str) -> PodReference {
        PodReference {
            namespace: "shop".into(),
            name: n.into(),
        }
    }

    #[test]
    fn summary_names_blocked_pods_only() {
        let mut o = BTreeMap::new();
        o.insert(r("a"), PodOutcome::Evicted);
        o.insert(r("b"), PodOutcome::Blocked("Cannot evict pod".into()));
        o.insert(r("c"), PodOutcome::Terminating(3));
        let s = blocker_summary("w1", &o).expect("blocked");
        assert!(s.contains("node w1, 1 blocked"), "{s}");
        assert!(
            s.contains("shop/b: eviction blocked by a PodDisruptionBudget"),
            "{s}"
        );
        assert!(!s.contains("shop/a"), "{s}");
    }

    #[test]
    fn no_summary_when_only_terminating() {
        let mut o = BTreeMap::new();
        o.insert(r("a"), PodOutcome::Evicted);
        o.insert(r("c"), PodOutcome::Terminating(1));
        assert_eq!(blocker_summary("w1", &o), None);
    }

    #[test]
    fn summary_is_bounded() {
        let o: BTreeMap<_, _> = (0..9)
            .map(|i| (r(&format!("p{i}")), PodOutcome::Failed("denied".into())))
            .collect();
        let s = blocker_summary("w1", &o).expect("blocked");
        assert!(s.contains("9 blocked"), "{s}");
        assert!(s.contains("and 4 more"), "{s}");
    }
}
