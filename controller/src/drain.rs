//! One drain round: list the node's pods, evict those that must leave
//! (concurrently, bounded), and report what is still there and why.
//!
//! A round never waits for pods to terminate; the reconciler comes back soon
//! and lists again. A pod counts as gone once the node's pod list no longer
//! has it (deleted, or recreated elsewhere under a new uid).

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{EvictParams, ListParams};
use kube::{Api, Client, ResourceExt};
use shared::PodReference;

use crate::classify::{PodAction, classify};

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

#[derive(Debug, thiserror::Error)]
#[error("failed to list the pods on node {node}: {source}")]
pub struct ListPodsError {
    pub node: String,
    #[source]
    pub source: kube::Error,
}

/// List the pods of `node` (field selector, served from the API server's watch cache).
pub async fn list_node_pods(client: &Client, node: &str) -> Result<NodePods, ListPodsError> {
    let lp = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .match_any();
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|source| ListPodsError {
            node: node.to_string(),
            source,
        })?;
    let total = pods.items.len();
    let mut must_leave: Vec<Pod> = pods
        .items
        .into_iter()
        .filter(|p| classify(p).must_leave())
        .collect();
    must_leave.sort_by_key(|p| (p.namespace(), p.name_any()));
    Ok(NodePods { total, must_leave })
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
    if classify(&pod) == PodAction::AwaitTermination {
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
