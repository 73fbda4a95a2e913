//! Draining a node: list its pods, evict those that must leave
//! (concurrently, bounded), and say what is still there and why.
//!
//! A round never waits for pods to terminate; the reconciler comes back soon
//! and lists again. A pod counts as gone once the node's pod list no longer
//! has it (deleted, or recreated elsewhere under a new uid).
//!
//! - [`list`]: the node's pods, sorted into those that must leave (kubectl's
//!   rules, with the DaemonSet orphan rule's lookups).
//! - [`evict`]: eviction requests under the process-wide in-flight limit,
//!   and what each answer means.
//! - [`kubevirt`]: KubeVirt's live-migration answers and their ages.
//! - [`outcome`]: what happened to each pod, in words (the blocker text).
//! - the drain rules' caches (`shared::kube::drain_rules`: NodeDrainRules,
//!   namespace labels); what a rule means is `shared::rules::drain`'s decision. A
//!   round evicts only the pods whose step is "evict now": the others wait
//!   for their order group or for their completion.
//!
//! The [`Drainer`] owns what outlives one round (eviction slots, migration
//! clocks, recent DaemonSet answers); the reconciler's context owns the
//! Drainer, so nothing of it is process-global.

mod evict;
mod kubevirt;
mod list;
mod outcome;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use shared::PodReference;
use shared::rules::drain::{PodStep, current_group, step};

pub use evict::{EVICTION_ANSWER_TIMEOUT, EVICTION_BUDGET, IN_FLIGHT};
pub use kubevirt::{DEFAULT_MIGRATION_WARNING_AFTER, is_virt_launcher};
pub use list::{LeavingPod, ListPodsError, NodePods, references};
pub use outcome::{PodOutcome, STUCK_AFTER, migrating, outcome_label};
pub use shared::kube::drain_rules::{DrainRules, NotSynced};

/// What the drains of this process share across rounds and maintenances.
pub struct Drainer {
    /// Lists pods and looks up DaemonSets.
    client: Client,
    /// Sends evictions (without the client's own 429 retries, see serving.rs).
    evict_client: Client,
    /// Evictions of one round at once (`--max-concurrent-evictions`).
    concurrency: usize,
    /// Evictions waiting for their answer at once, across every drain
    /// ([`IN_FLIGHT`]). FIFO: the drains are served in turn.
    slots: tokio::sync::Semaphore,
    /// `--migration-warning-after`.
    migration_warning_after: Duration,
    migrations: kubevirt::Migrations,
    /// Evictions accepted lately (a stale list does not evict them again).
    accepted: evict::Accepted,
    daemonsets: list::DaemonSetAnswers,
    /// The NodeDrainRules and namespace labels (`rules`).
    rules: DrainRules,
    /// The time terminating pods are judged by (set by unit tests).
    pub(crate) clock: crate::clock::Clock,
}

impl Drainer {
    pub fn new(
        client: Client,
        evict_client: Client,
        concurrency: usize,
        migration_warning_after: Duration,
        rules: DrainRules,
    ) -> Drainer {
        Drainer {
            client,
            evict_client,
            concurrency,
            slots: tokio::sync::Semaphore::new(IN_FLIGHT),
            migration_warning_after,
            migrations: kubevirt::Migrations::default(),
            accepted: evict::Accepted::default(),
            daemonsets: list::DaemonSetAnswers::default(),
            rules,
            clock: crate::clock::Clock::system(),
        }
    }

    /// The pods on `node`, which of them must leave, and which the drain
    /// rules keep.
    pub async fn list(&self, node: &Node) -> Result<NodePods, ListPodsError> {
        list::list_node_pods(&self.client, &self.daemonsets, &self.rules, node).await
    }

    /// Evict the pods in `pods` whose step is "now" (the lowest order group,
    /// finished pods, those already terminating); the others are told why
    /// they wait. Those that got no eviction slot by `deadline` are
    /// [`PodOutcome::Deferred`].
    pub async fn evict(
        &self,
        pods: &[LeavingPod],
        deadline: tokio::time::Instant,
    ) -> BTreeMap<PodReference, PodOutcome> {
        let current = current_group(pods.iter().map(|p| (&p.drain, p.finished)));
        let mut held = BTreeMap::new();
        for p in pods {
            if p.metadata.deletion_timestamp.is_some() {
                continue; // on its way out: watched as any other
            }
            let outcome = match step(&p.drain, p.finished, current) {
                PodStep::Evict => continue,
                PodStep::AfterGroup { group, current } => PodOutcome::AfterGroup { group, current },
                PodStep::WaitCompletion => PodOutcome::WaitingForCompletion(p.drain.by.to_string()),
                // Never listed as leaving (`list`); kept if it were.
                PodStep::Keep => PodOutcome::Kept(p.drain.by.to_string()),
            };
            held.insert(p.reference(), outcome);
        }
        if held.is_empty() {
            return evict::evict_all(self, pods, deadline).await;
        }
        let now: Vec<LeavingPod> = (pods.iter())
            .filter(|p| !held.contains_key(&p.reference()))
            .cloned()
            .collect();
        let mut outcomes = evict::evict_all(self, &now, deadline).await;
        outcomes.extend(held);
        outcomes
    }

    /// Whether the only pods in the way are waited for until they complete.
    pub fn waits_only(&self, outcomes: &BTreeMap<PodReference, PodOutcome>) -> bool {
        outcome::waits_only(outcomes, self.migration_warning_after)
    }

    /// The `lastError` text for a round that left pods on the node, or None
    /// when nothing is in the way.
    pub fn blocker_summary(
        &self,
        node: &str,
        outcomes: &BTreeMap<PodReference, PodOutcome>,
    ) -> Option<String> {
        outcome::blocker_summary(node, outcomes, self.migration_warning_after)
    }
}
