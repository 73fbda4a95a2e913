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

use kube::Client;
use shared::PodReference;

pub use evict::{EVICTION_ANSWER_TIMEOUT, EVICTION_BUDGET, IN_FLIGHT};
pub use kubevirt::{DEFAULT_MIGRATION_WARNING_AFTER, is_virt_launcher};
pub use list::{LeavingPod, ListPodsError, NodePods, references};
pub use outcome::{PodOutcome, STUCK_AFTER, migrating, outcome_label};

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
    /// The time terminating pods are judged by (set by unit tests).
    pub(crate) clock: crate::clock::Clock,
}

impl Drainer {
    pub fn new(
        client: Client,
        evict_client: Client,
        concurrency: usize,
        migration_warning_after: Duration,
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
            clock: crate::clock::Clock::system(),
        }
    }

    /// The pods on `node`, and which of them must leave.
    pub async fn list(&self, node: &str) -> Result<NodePods, ListPodsError> {
        list::list_node_pods(&self.client, &self.daemonsets, node).await
    }

    /// Evict every pod in `pods`; those that got no eviction slot by
    /// `deadline` are [`PodOutcome::Deferred`].
    pub async fn evict(
        &self,
        pods: &[LeavingPod],
        deadline: tokio::time::Instant,
    ) -> BTreeMap<PodReference, PodOutcome> {
        evict::evict_all(self, pods, deadline).await
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
