//! What happened to each pod in a round, and the words for it: the
//! blocker text of `lastError`, the Blocked condition and DrainBlocked.

use std::collections::BTreeMap;
use std::time::Duration;

use shared::PodReference;

use super::evict::{EVICTION_ANSWER_TIMEOUT, EVICTION_BUDGET, IN_FLIGHT};

/// How long past the end of its grace period a terminating pod may still be
/// there before it counts as stuck (a blocker naming its finalizers).
pub const STUCK_AFTER: Duration = Duration::from_secs(30);

/// What happened to one pod this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// The eviction was accepted; the pod is terminating.
    Evicted,
    /// Already gone (404).
    Gone,
    /// Already terminating (since the given number of seconds).
    Terminating(i64),
    /// Still there more than [`STUCK_AFTER`] past the end of its grace period:
    /// something holds it (its finalizers, named here, or a node that no
    /// longer runs it). A blocker.
    Stuck { finalizers: Vec<String> },
    /// A PodDisruptionBudget said "not now" (429 with a DisruptionBudget
    /// cause): the API server's message.
    Blocked(String),
    /// Something else said "not now" (429 without a DisruptionBudget cause:
    /// an admission webhook on pods/eviction, or the API server throttling
    /// us): its message. A blocker like [`PodOutcome::Blocked`].
    NotNow(String),
    /// KubeVirt said "not now, the VM is being live-migrated away" (429, see
    /// [`is_kubevirt_evacuation`]): the pod leaves when the migration
    /// completes. Not a blocker until it has run `--migration-warning-after`.
    Migrating {
        /// Since KubeVirt first answered so for this pod (see [`Migrations`]).
        since_secs: u64,
        /// The API server's message (KubeVirt's words).
        message: String,
    },
    /// Any other refusal or failure (eviction webhook, several PDBs, network).
    Failed(String),
    /// Not evicted: a drain rule (`WaitCompleted`, decided by the words
    /// here) waits until it has finished or gone. A blocker of its own kind
    /// (not a PodDisruptionBudget): the Blocked condition's reason is
    /// WaitingForCompletion when nothing else is in the way.
    WaitingForCompletion(String),
    /// Not evicted yet: its order group comes after `current`, which has
    /// not left yet. Progress, not a blocker.
    AfterGroup { group: i32, current: i32 },
    /// Kept on the node by a drain rule (`Skip`, decided by the words here).
    Kept(String),
    /// Not sent within the round's [`EVICTION_BUDGET`] (many drains queue for
    /// the [`IN_FLIGHT`] slots), or sent and not answered within
    /// [`EVICTION_ANSWER_TIMEOUT`] (the API server is busy): the next round asks again.
    /// Progress, not a blocker.
    Deferred,
}

impl PodOutcome {
    pub fn describe(&self) -> String {
        match self {
            PodOutcome::Evicted => "eviction accepted, terminating".into(),
            PodOutcome::Gone => "gone".into(),
            PodOutcome::Terminating(s) => format!("terminating for {s}s"),
            PodOutcome::Stuck { finalizers } if finalizers.is_empty() => {
                "still there long after its grace period ended (is its node running it?)".into()
            }
            PodOutcome::Stuck { finalizers } => format!(
                "still there long after its grace period ended, held by finalizers {}",
                finalizers.join(", ")
            ),
            PodOutcome::Blocked(m) => format!("eviction blocked by a PodDisruptionBudget: {m}"),
            PodOutcome::NotNow(m) => format!(
                "eviction refused for now, not by a PodDisruptionBudget (HTTP 429 from an \
                 admission webhook on pods/eviction, or API server throttling): {m}"
            ),
            PodOutcome::Migrating {
                since_secs,
                message,
            } => format!(
                "VM live migration running for {} ({message})",
                human(Duration::from_secs(*since_secs))
            ),
            PodOutcome::Failed(m) => format!("eviction failed: {m}"),
            PodOutcome::WaitingForCompletion(by) => format!(
                "not evicted: waits until it completes ({by}, behavior WaitCompleted), \
                 not a PodDisruptionBudget"
            ),
            PodOutcome::AfterGroup { group, current } => {
                format!("not evicted yet: its order group {group} leaves after group {current}")
            }
            PodOutcome::Kept(by) => format!("kept on the node ({by}, behavior Skip)"),
            PodOutcome::Deferred => format!(
                "eviction not sent within {} ({IN_FLIGHT} others were waiting for the API server) \
                 or not answered within {}; asked again next round",
                human(EVICTION_BUDGET),
                human(EVICTION_ANSWER_TIMEOUT)
            ),
        }
    }

    /// The blocker line of this outcome, if it is one: a refusal, or a live
    /// migration running longer than `warn_after`.
    pub(super) fn problem(&self, warn_after: Duration) -> Option<String> {
        match self {
            PodOutcome::Blocked(_)
            | PodOutcome::NotNow(_)
            | PodOutcome::Failed(_)
            | PodOutcome::WaitingForCompletion(_)
            | PodOutcome::Stuck { .. } => Some(self.describe()),
            PodOutcome::Migrating {
                since_secs,
                message,
            } if Duration::from_secs(*since_secs) >= warn_after => Some(format!(
                "VM live migration running for {}, longer than --migration-warning-after ({}); \
                 last answer: {message}",
                human(Duration::from_secs(*since_secs)),
                human(warn_after)
            )),
            _ => None,
        }
    }
}

/// The `result` label of `nmo_evictions_total` for one outcome: evicted,
/// gone, blocked, migrating, failed, deferred; "terminating" when no eviction was
/// requested (the pod was already terminating: not counted).
pub fn outcome_label(outcome: &PodOutcome) -> &'static str {
    match outcome {
        PodOutcome::Evicted => "evicted",
        PodOutcome::Gone => "gone",
        PodOutcome::Terminating(_) | PodOutcome::Stuck { .. } => "terminating",
        PodOutcome::WaitingForCompletion(_)
        | PodOutcome::AfterGroup { .. }
        | PodOutcome::Kept(_) => "held",
        PodOutcome::Blocked(_) | PodOutcome::NotNow(_) => "blocked",
        PodOutcome::Migrating { .. } => "migrating",
        PodOutcome::Failed(_) => "failed",
        PodOutcome::Deferred => "deferred",
    }
}

/// The pods whose VM KubeVirt is live-migrating away, in name order.
pub fn migrating(outcomes: &BTreeMap<PodReference, PodOutcome>) -> Vec<PodReference> {
    outcomes
        .iter()
        .filter(|(_, o)| matches!(o, PodOutcome::Migrating { .. }))
        .map(|(r, _)| r.clone())
        .collect()
}

/// Whether the pods in the way are only pods waited for until they
/// complete (the Blocked condition's reason is then WaitingForCompletion).
pub fn waits_only(outcomes: &BTreeMap<PodReference, PodOutcome>, warn_after: Duration) -> bool {
    let mut problems = outcomes
        .values()
        .filter(|o| o.problem(warn_after).is_some());
    let mut any = false;
    let all = problems.all(|o| {
        any = true;
        matches!(o, PodOutcome::WaitingForCompletion(_))
    });
    any && all
}

/// "45s", "12m", "1h5m": minutes are enough for a migration's age.
pub(super) fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        _ if (s % 3600) / 60 == 0 => format!("{}h", s / 3600),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

/// The `lastError` text for a round that left pods on the node, or None when
/// nothing is in the way (pods only terminating, or VMs live-migrating for
/// less than `warn_after`, `--migration-warning-after`).
pub fn blocker_summary(
    node: &str,
    outcomes: &BTreeMap<PodReference, PodOutcome>,
    warn_after: Duration,
) -> Option<String> {
    const SHOWN: usize = 5;
    let problems: Vec<String> = outcomes
        .iter()
        .filter_map(|(r, o)| {
            o.problem(warn_after)
                .map(|p| format!("{}/{}: {p}", r.namespace, r.name))
        })
        .collect();
    if problems.is_empty() {
        return None;
    }
    let more = problems.len().saturating_sub(SHOWN);
    let waits = waits_only(outcomes, warn_after);
    let mut text = format!(
        "{} {node}, {} {}: {}",
        if waits {
            "waiting for pods to complete on node"
        } else {
            "not all pods evicted from node"
        },
        problems.len(),
        if waits { "waited for" } else { "blocked" },
        problems
            .into_iter()
            .take(SHOWN)
            .collect::<Vec<_>>()
            .join("; ")
    );
    if more > 0 {
        text.push_str(&format!("; and {more} more"));
    }
    text.push_str(if waits {
        "; the drain goes on once they have finished or gone (spec.drainTimeout, if set, still bounds it)"
    } else {
        "; the drain retries automatically once the blocker is lifted"
    });
    Some(text)
}
