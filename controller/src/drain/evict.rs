//! Eviction requests: at most [`IN_FLIGHT`] waiting for their answer across
//! every drain of the process, each answer sorted into a [`PodOutcome`].

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::EvictParams;
use shared::PodReference;
use shared::rules::sync::LockExt;

use super::kubevirt::{is_kubevirt_evacuation, is_virt_launcher};
use super::{Drainer, LeavingPod, PodOutcome, STUCK_AFTER};

/// How long one round waits for a free eviction slot (see [`IN_FLIGHT`]) per
/// pod. Pods still waiting then are [`PodOutcome::Deferred`] and the round
/// ends, writing what it learnt: a reconcile cut short by its timeout would
/// write nothing at all. When 100 nodes drain at once on a busy API server,
/// every round gets its share.
pub const EVICTION_BUDGET: Duration = Duration::from_secs(12);

/// How long a sent eviction may take to be answered. An eviction is never
/// abandoned for the round's budget once sent: cancelling it wastes the API
/// server's work on it (it answers 504 "context canceled") and sends it again
/// next round. Only a request this slow is given up (and deferred).
pub const EVICTION_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Evictions waiting for their answer at once, across every drain of the
/// process: the eviction client's own limit (`serving::clients`), taken here
/// before a request is sent so that a request is queued, and deferred, only
/// while it is not yet on the wire. FIFO: the drains are served in turn.
/// 128: four maintenances' worth of `--max-concurrent-evictions`. With 32,
/// ten zones draining at once shared what one drain may use, and a fleet of
/// 100 over 10 zones took 2.29x the plane's floor (1.57x with 128, both
/// with the waiters' rewrites held back; 30 at once 1.13x then 1.09x:
/// docs/performance.md, run p).
pub const IN_FLIGHT: usize = 128;

/// How long an accepted eviction answers for its pod: a pod whose eviction
/// we saw accepted within this time, listed again without its deletion
/// mark (a list served from the API server's watch cache can trail the
/// eviction), is on its way out and gets no second request (which would be
/// answered 404, or take an eviction slot for nothing).
pub const ACCEPTED_FRESH: Duration = Duration::from_secs(30);

/// The evictions accepted lately, by pod uid.
#[derive(Default)]
pub(super) struct Accepted(std::sync::Mutex<std::collections::HashMap<String, Timestamp>>);

impl Accepted {
    /// The eviction of pod `uid` was accepted at `now`; older entries go.
    fn note(&self, uid: &str, now: Timestamp) {
        let mut m = self.0.locked();
        m.retain(|_, at| fresh(*at, now));
        m.insert(uid.to_string(), now);
    }

    /// Whether the eviction of pod `uid` was accepted within [`ACCEPTED_FRESH`] of `now`.
    fn lately(&self, uid: &str, now: Timestamp) -> bool {
        self.0.locked().get(uid).is_some_and(|at| fresh(*at, now))
    }

    fn forget(&self, uid: &str) {
        self.0.locked().remove(uid);
    }
}

/// An eviction accepted `at` still answers for its pod at `now`.
fn fresh(at: Timestamp, now: Timestamp) -> bool {
    let age = now.duration_since(at);
    !age.is_negative() && age.unsigned_abs() < ACCEPTED_FRESH
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

/// The cause type (`reason` in JSON) the API server puts on every 429 of its
/// PodDisruptionBudget check (policy/v1 `DisruptionBudgetCause`).
const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";

/// How an eviction request that did not go through is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// 429 from KubeVirt: the VM is being live-migrated away.
    Evacuation(String),
    /// A 429 of the API server's PodDisruptionBudget check (its causes say
    /// DisruptionBudget).
    Budget(String),
    /// Any other 429 (a webhook saying "not now", throttling).
    NotNow(String),
    /// Anything else.
    Failed(String),
}

pub(super) fn refusal(e: &kube::Error, virt_launcher: bool) -> Refusal {
    let message = api_message(e);
    match e {
        kube::Error::Api(s) if s.code == 429 => {
            let budget = s
                .details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.reason == DISRUPTION_BUDGET_CAUSE));
            if is_kubevirt_evacuation(virt_launcher, &message) {
                Refusal::Evacuation(message)
            } else if budget {
                Refusal::Budget(message)
            } else {
                Refusal::NotNow(message)
            }
        }
        _ => Refusal::Failed(message),
    }
}

async fn evict_one(
    drainer: &Drainer,
    pod: &LeavingPod,
    deadline: tokio::time::Instant,
) -> (PodReference, PodOutcome) {
    let r = pod.reference();
    let uid = pod
        .metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", r.namespace, r.name));
    // Only pods that must leave get here: terminating means awaited.
    if let Some(deleted) = &pod.metadata.deletion_timestamp {
        drainer.migrations.forget(&uid);
        let since = drainer
            .clock
            .now()
            .duration_since(deleted.0)
            .as_secs()
            .max(0);
        if since > STUCK_AFTER.as_secs() as i64 {
            let finalizers = pod.metadata.finalizers.clone().unwrap_or_default();
            return (r, PodOutcome::Stuck { finalizers });
        }
        return (r, PodOutcome::Terminating(since));
    }
    if drainer.accepted.lately(&uid, drainer.clock.now()) {
        return (r, PodOutcome::Evicted);
    }
    // Past the deadline nothing new is sent, even with slots free: the round
    // must end in time to write what it learnt.
    if tokio::time::Instant::now() >= deadline {
        return (r, PodOutcome::Deferred);
    }
    let Ok(Ok(slot)) = tokio::time::timeout_at(deadline, drainer.slots.acquire()).await else {
        return (r, PodOutcome::Deferred);
    };
    // Boxed: when 100 nodes drain at once, thousands of these wait for a
    // slot; only the few holding one carry a request's state.
    let virt_launcher = is_virt_launcher(&pod.metadata);
    let outcome = Box::pin(request_eviction(drainer, &r, &uid, virt_launcher)).await;
    drop(slot);
    (r, outcome)
}

/// Send the eviction of `r` and sort its answer (the caller holds a slot).
async fn request_eviction(
    drainer: &Drainer,
    r: &PodReference,
    uid: &str,
    virt_launcher: bool,
) -> PodOutcome {
    let api: Api<Pod> = Api::namespaced(drainer.evict_client.clone(), &r.namespace);
    tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), "requesting eviction");
    // No delete options: each pod's own grace period applies, as upstream.
    let answer = tokio::time::timeout(
        EVICTION_ANSWER_TIMEOUT,
        api.evict(&r.name, &EvictParams::default()),
    )
    .await;
    let Ok(answer) = answer else {
        tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), "eviction not answered in time");
        return PodOutcome::Deferred;
    };
    let outcome = match answer {
        Ok(_) => PodOutcome::Evicted,
        Err(kube::Error::Api(s)) if s.code == 404 => PodOutcome::Gone,
        Err(e) => match refusal(&e, virt_launcher) {
            Refusal::Evacuation(message) => {
                let since = drainer.migrations.observe(uid, Instant::now());
                if since.is_zero() {
                    tracing::info!(pod = %format!("{}/{}", r.namespace, r.name), %message,
                        "KubeVirt is live-migrating the pod's VM away; the pod leaves when the migration completes");
                }
                PodOutcome::Migrating {
                    since_secs: since.as_secs(),
                    message,
                }
            }
            Refusal::Budget(m) => PodOutcome::Blocked(m),
            Refusal::NotNow(m) => PodOutcome::NotNow(m),
            Refusal::Failed(m) => PodOutcome::Failed(m),
        },
    };
    if !matches!(outcome, PodOutcome::Migrating { .. }) {
        drainer.migrations.forget(uid);
    }
    match outcome {
        PodOutcome::Evicted => drainer.accepted.note(uid, drainer.clock.now()),
        _ => drainer.accepted.forget(uid),
    }
    tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), outcome = ?outcome, "eviction answered");
    outcome
}

/// Evict every pod in `pods`, `--max-concurrent-evictions` at a time; those
/// that got no eviction slot by `deadline` are [`PodOutcome::Deferred`].
pub(super) async fn evict_all(
    drainer: &Drainer,
    pods: &[LeavingPod],
    deadline: tokio::time::Instant,
) -> BTreeMap<PodReference, PodOutcome> {
    // By index: a closure taking `&LeavingPod` makes the future fail the
    // compiler's Send check (higher-ranked lifetimes); one taking an index
    // borrows the slice as a whole.
    futures::stream::iter(0..pods.len())
        .map(|i| evict_one(drainer, &pods[i], deadline))
        .buffer_unordered(drainer.concurrency.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("a valid time")
    }

    #[test]
    fn an_accepted_eviction_answers_for_its_pod_for_a_while() {
        let accepted = Accepted::default();
        accepted.note("u-1", at(0));
        for (now, want, case) in [
            (at(0), true, "just accepted"),
            (at(29), true, "within the window"),
            (at(30), false, "the window is over: asked again"),
            (at(-1), false, "a clock that went back judges nothing fresh"),
        ] {
            assert_eq!(accepted.lately("u-1", now), want, "{case}");
        }
        assert!(
            !accepted.lately("u-2", at(0)),
            "another pod (or the same name, new uid)"
        );
        accepted.note("u-2", at(40));
        assert_eq!(
            accepted.0.locked().len(),
            1,
            "stale entries go on the next note"
        );
        accepted.forget("u-2");
        assert!(
            !accepted.lately("u-2", at(40)),
            "a later refusal or 404 forgets it"
        );
    }
}
