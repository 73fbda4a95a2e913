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
//!
//! KubeVirt answers the eviction of a live-migratable VM's virt-launcher pod
//! with 429 and starts a live migration; the pod leaves once the VM runs
//! elsewhere. Such a pod is [`PodOutcome::Migrating`], progress rather than a
//! blocker, until the migration has run longer than
//! `--migration-warning-after` (see [`Migrations`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::EvictParams;
use kube::{Api, Client, ResourceExt};
use shared::PodReference;
use shared::lean::PodView;

use crate::classify::{classify, daemonset_to_look_up};

/// DaemonSet lookups under way at once in one round.
const DAEMONSET_LOOKUPS: usize = 8;

/// The pods on a node, split the way the drain needs.
#[derive(Debug, Default)]
pub struct NodePods {
    /// Every pod on the node (`totalpods`).
    pub total: usize,
    /// Pods that must leave, in name order.
    pub must_leave: Vec<LeavingPod>,
}

/// A pod that must leave the node, as the drain keeps it from the list to
/// its eviction: its metadata (name, uid, labels, deletion time,
/// finalizers), which is all the eviction, the events and the status read.
/// Not a whole `Pod`: that struct is some 2 KiB even with an empty spec, and
/// 100 drains at once hold 3,000 of these.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeavingPod {
    pub metadata: ObjectMeta,
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
    /// Not sent within the round's [`EVICTION_BUDGET`] (many drains queue for
    /// the [`IN_FLIGHT`] slots), or sent and not answered within
    /// [`EVICTION_ANSWER_TIMEOUT`] (the API server is busy): the next round asks again.
    /// Progress, not a blocker.
    Deferred,
}

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
pub const IN_FLIGHT: usize = 32;
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(IN_FLIGHT);

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
    fn problem(&self, warn_after: Duration) -> Option<String> {
        match self {
            PodOutcome::Blocked(_)
            | PodOutcome::NotNow(_)
            | PodOutcome::Failed(_)
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

/// Label KubeVirt puts on the pod that runs a VM.
const VIRT_LAUNCHER_LABEL: (&str, &str) = ("kubevirt.io", "virt-launcher");

/// KubeVirt's eviction webhook (virt-api, pod-eviction-admitter) answers 429
/// with `Eviction triggered evacuation of VMI "<ns>/<name>"` when it starts a
/// live migration, and with `Evacuation in progress: ` before the same words
/// while it runs. The API server wraps either as `admission webhook
/// "virt-launcher-eviction-interceptor.kubevirt.io" denied the request: ...`.
const KUBEVIRT_EVACUATION: &str = "Eviction triggered evacuation of VMI";
const KUBEVIRT_EVACUATION_IN_PROGRESS: &str = "Evacuation in progress";
/// Its 429 for a virt-launcher pod on another node than its VM: the target
/// pod of a live migration under way.
const KUBEVIRT_MIGRATION_TARGET: &str = "Eviction request for target Pod";
/// KubeVirt's own PodDisruptionBudgets (generateName) guard a VM while it
/// migrates; older KubeVirt lets the eviction through its webhook once the
/// migration is started and leaves the "not now" to them.
const KUBEVIRT_PDB: &str = "kubevirt-disruption-budget-";

/// Whether the pod runs a KubeVirt VM (label `kubevirt.io=virt-launcher`).
pub fn is_virt_launcher(pod: &ObjectMeta) -> bool {
    pod.labels
        .as_ref()
        .and_then(|l| l.get(VIRT_LAUNCHER_LABEL.0))
        .map(String::as_str)
        == Some(VIRT_LAUNCHER_LABEL.1)
}

/// Whether a 429 with `message` (the API server's message and causes) to the
/// eviction of a pod is KubeVirt live-migrating the pod's VM away: KubeVirt's
/// own words, or, for a virt-launcher pod, its "in progress" and migration
/// target answers or one of its PodDisruptionBudgets.
pub fn is_kubevirt_evacuation(virt_launcher: bool, message: &str) -> bool {
    message.contains(KUBEVIRT_EVACUATION)
        || (virt_launcher
            && [
                KUBEVIRT_EVACUATION_IN_PROGRESS,
                KUBEVIRT_MIGRATION_TARGET,
                KUBEVIRT_PDB,
            ]
            .iter()
            .any(|w| message.contains(w)))
}

/// `nmo-controller --migration-warning-after`'s default.
pub const DEFAULT_MIGRATION_WARNING_AFTER: Duration = Duration::from_secs(10 * 60);

static MIGRATION_WARNING_AFTER_MS: AtomicU64 =
    AtomicU64::new(DEFAULT_MIGRATION_WARNING_AFTER.as_millis() as u64);

/// Set `--migration-warning-after` for [`blocker_summary`] (once, at start).
pub fn set_migration_warning_after(after: Duration) {
    let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    MIGRATION_WARNING_AFTER_MS.store(ms, Ordering::Relaxed);
}

/// The current `--migration-warning-after`.
pub fn migration_warning_after() -> Duration {
    Duration::from_millis(MIGRATION_WARNING_AFTER_MS.load(Ordering::Relaxed))
}

/// Since when KubeVirt has been migrating each pod's VM, as seen by this
/// process: the time of its first evacuation answer for the pod, by pod uid.
///
/// Neither the pod nor the eviction answer says when the migration began
/// (that is on KubeVirt's VirtualMachineInstanceMigration, which the
/// controller is not allowed to read), so the drain remembers it across
/// rounds. An entry goes when the pod's eviction is answered otherwise
/// (accepted, gone, terminating, a real blocker) and, for a pod that went
/// away (its uid is never seen again), after [`Migrations::STALE`] without a
/// round asking. A restarted or new leader starts the clock again: a warning
/// may come late, never early.
#[derive(Debug, Default)]
pub struct Migrations {
    seen: Mutex<HashMap<String, Seen>>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    first: Instant,
    last: Instant,
}

impl Migrations {
    /// Entries no round asked about for this long are dropped.
    pub const STALE: Duration = Duration::from_secs(60 * 60);

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// KubeVirt answered "evacuation" for pod `uid` at `now`: how long since
    /// its first such answer (zero the first time).
    pub fn observe(&self, uid: &str, now: Instant) -> Duration {
        let mut seen = self.entries();
        seen.retain(|_, s| now.saturating_duration_since(s.last) < Self::STALE);
        let entry = seen.entry(uid.to_string()).or_insert(Seen {
            first: now,
            last: now,
        });
        entry.last = now;
        now.saturating_duration_since(entry.first)
    }

    /// The pod's eviction was answered otherwise: its migration is over.
    pub fn forget(&self, uid: &str) {
        self.entries().remove(uid);
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The migrations of this process (one controller per process).
static MIGRATIONS: LazyLock<Migrations> = LazyLock::new(Migrations::default);

/// "45s", "12m", "1h5m": minutes are enough for a migration's age.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        _ if (s % 3600) / 60 == 0 => format!("{}h", s / 3600),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
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

/// List the pods of `node` (`shared::lean::list_node_pods`): 100 drains at
/// once hold their pods' names and owners, not their specs.
pub async fn list_node_pods(client: &Client, node: &str) -> Result<NodePods, ListPodsError> {
    let pods = shared::lean::list_node_pod_views(client, node)
        .await
        .map_err(|source| ListPodsError::List {
            node: node.to_string(),
            source,
        })?;
    let total = pods.len();
    // One whole `Pod` at a time (the rules read that type), never the node's.
    // Whether a pod leaves can hang only on its DaemonSet still existing,
    // which is looked up once the node's pods are sorted.
    let mut wanted = BTreeMap::new();
    let mut candidates = Vec::new();
    for p in pods.into_iter().map(PodView::into_pod) {
        if !classify(&p, |_| false).must_leave() {
            continue;
        }
        let ds =
            daemonset_to_look_up(&p).map(|ds| (p.namespace().unwrap_or_default(), ds.to_string()));
        if let Some(key) = &ds {
            wanted.insert(key.clone(), p.name_any());
        }
        candidates.push((
            LeavingPod {
                metadata: p.metadata,
            },
            ds,
        ));
    }
    let live = live_daemonsets(client, node, wanted).await?;
    let mut must_leave: Vec<LeavingPod> = candidates
        .into_iter()
        .filter(|(_, ds)| ds.as_ref().is_none_or(|key| !live.contains(key)))
        .map(|(p, _)| p)
        .collect();
    must_leave.sort_by_key(|p| (p.namespace(), p.name()));
    Ok(NodePods { total, must_leave })
}

/// How long an answer to "does DaemonSet ns/name exist" is trusted. Every
/// drain round of every maintenance asks about the DaemonSets of its node's
/// pods, mostly the same few cluster-wide ones (CNI, log agents): 100 nodes
/// draining at once ask once per DaemonSet, not 100 times per round. A
/// DaemonSet deleted meanwhile has its pods garbage-collected anyway; the
/// orphan rule (kubectl's) only needs the answer to be recent.
const DAEMONSET_ANSWER_TTL: Duration = Duration::from_secs(10);

/// Recent answers: (namespace, name) -> (exists, when asked).
type DaemonSetAnswers = HashMap<(String, String), (bool, Instant)>;
static DAEMONSETS: LazyLock<Mutex<DaemonSetAnswers>> = LazyLock::new(Default::default);

fn recent_answer(key: &(String, String)) -> Option<bool> {
    let mut m = DAEMONSETS.lock().unwrap_or_else(|e| e.into_inner());
    m.retain(|_, (_, at)| at.elapsed() < DAEMONSET_ANSWER_TTL);
    m.get(key).map(|(exists, _)| *exists)
}

fn remember_answer(key: (String, String), exists: bool) {
    DAEMONSETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (exists, Instant::now()));
}

/// `(namespace, name)` of the DaemonSets that exist among `wanted` (those the
/// pods' classification needs, see `classify::daemonset_to_look_up`, each with
/// one of its pods on the node for the error text).
async fn live_daemonsets(
    client: &Client,
    node: &str,
    wanted: BTreeMap<(String, String), String>,
) -> Result<BTreeSet<(String, String)>, ListPodsError> {
    // One lookup per DaemonSet not answered recently.
    let mut live = BTreeSet::new();
    let wanted: BTreeMap<(String, String), String> = wanted
        .into_iter()
        .filter(|(key, _)| match recent_answer(key) {
            Some(true) => {
                live.insert(key.clone());
                false
            }
            Some(false) => false,
            None => true,
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
    for (namespace, name, pod, answer) in answers {
        if let Ok(found) = &answer {
            remember_answer((namespace.clone(), name.clone()), found.is_some());
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
enum Refusal {
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

fn refusal(e: &kube::Error, virt_launcher: bool) -> Refusal {
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
    client: &Client,
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
        MIGRATIONS.forget(&uid);
        let since = Timestamp::now().duration_since(deleted.0).as_secs().max(0);
        if since > STUCK_AFTER.as_secs() as i64 {
            let finalizers = pod.metadata.finalizers.clone().unwrap_or_default();
            return (r, PodOutcome::Stuck { finalizers });
        }
        return (r, PodOutcome::Terminating(since));
    }
    // Past the deadline nothing new is sent, even with slots free: the round
    // must end in time to write what it learnt.
    if tokio::time::Instant::now() >= deadline {
        return (r, PodOutcome::Deferred);
    }
    let Ok(Ok(slot)) = tokio::time::timeout_at(deadline, SLOTS.acquire()).await else {
        return (r, PodOutcome::Deferred);
    };
    // Boxed: when 100 nodes drain at once, thousands of these wait for a
    // slot; only the few holding one carry a request's state.
    let virt_launcher = is_virt_launcher(&pod.metadata);
    let outcome = Box::pin(request_eviction(client, &r, &uid, virt_launcher)).await;
    drop(slot);
    (r, outcome)
}

/// Send the eviction of `r` and sort its answer (the caller holds a slot).
async fn request_eviction(
    client: &Client,
    r: &PodReference,
    uid: &str,
    virt_launcher: bool,
) -> PodOutcome {
    let api: Api<Pod> = Api::namespaced(client.clone(), &r.namespace);
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
                let since = MIGRATIONS.observe(uid, Instant::now());
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
        MIGRATIONS.forget(uid);
    }
    tracing::debug!(pod = %format!("{}/{}", r.namespace, r.name), outcome = ?outcome, "eviction answered");
    outcome
}

/// Evict every pod in `pods` at most `concurrency` at a time; those that
/// got no eviction slot by `deadline` are [`PodOutcome::Deferred`].
pub async fn evict_all(
    client: &Client,
    pods: &[LeavingPod],
    concurrency: usize,
    deadline: tokio::time::Instant,
) -> BTreeMap<PodReference, PodOutcome> {
    // By index: a closure taking `&LeavingPod` makes the future fail the
    // compiler's Send check (higher-ranked lifetimes); one taking an index
    // borrows the slice as a whole.
    futures::stream::iter(0..pods.len())
        .map(|i| evict_one(client, &pods[i], deadline))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// The `lastError` text for a round that left pods on the node, or None when
/// nothing is in the way (pods only terminating, or VMs live-migrating for
/// less than `--migration-warning-after`).
pub fn blocker_summary(
    node: &str,
    outcomes: &BTreeMap<PodReference, PodOutcome>,
) -> Option<String> {
    blocker_summary_with(node, outcomes, migration_warning_after())
}

/// [`blocker_summary`] with a live migration reported once it has run `warn_after`.
pub fn blocker_summary_with(
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
    fn a_pod_stuck_terminating_is_a_blocker_naming_its_finalizers() {
        let mut o = BTreeMap::new();
        o.insert(r("a"), PodOutcome::Terminating(5));
        o.insert(
            r("b"),
            PodOutcome::Stuck {
                finalizers: vec!["example.com/backup".into()],
            },
        );
        let text = blocker_summary_with("n1", &o, Duration::from_secs(600)).expect("a blocker");
        assert!(
            text.contains("shop/b: still there long after its grace period ended, held by finalizers example.com/backup"),
            "{text}"
        );
        assert!(
            !text.contains("shop/a"),
            "terminating in time is no blocker: {text}"
        );
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

    fn status_429(message: &str, causes: &[&str]) -> kube::Error {
        let causes: Vec<_> = causes
            .iter()
            .map(|m| serde_json::json!({"reason": "DisruptionBudget", "message": m}))
            .collect();
        let s: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 429, "message": message, "reason": "TooManyRequests",
            "details": {"causes": causes}
        }))
        .expect("Status JSON");
        kube::Error::Api(Box::new(s))
    }

    /// KubeVirt's two answers (virt-api pod-eviction-admitter), as the API
    /// server relays them.
    const KUBEVIRT_FIRST: &str = "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" \
        denied the request: Eviction triggered evacuation of VMI \"shop/vm1\"";
    const KUBEVIRT_AGAIN: &str = "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" \
        denied the request: Evacuation in progress: Eviction triggered evacuation of VMI \"shop/vm1\"";
    const PDB: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

    #[test]
    fn kubevirt_429_is_a_migration() {
        for launcher in [true, false] {
            for m in [KUBEVIRT_FIRST, KUBEVIRT_AGAIN] {
                assert_eq!(
                    refusal(&status_429(m, &[]), launcher),
                    Refusal::Evacuation(m.to_string()),
                    "launcher {launcher}: {m}"
                );
            }
        }
        // KubeVirt's other answers count only for a virt-launcher pod.
        let target = "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" \
            denied the request: Eviction request for target Pod";
        let kubevirt_pdb = "The disruption budget kubevirt-disruption-budget-x7k2p needs 1 healthy pods and has 1 currently";
        assert!(matches!(
            refusal(&status_429(target, &[]), true),
            Refusal::Evacuation(_)
        ));
        assert!(matches!(
            refusal(&status_429(target, &[]), false),
            Refusal::NotNow(_)
        ));
        assert!(matches!(
            refusal(&status_429(PDB, &[kubevirt_pdb]), true),
            Refusal::Evacuation(m) if m.contains(kubevirt_pdb)
        ));
        assert!(matches!(
            refusal(&status_429(PDB, &[kubevirt_pdb]), false),
            Refusal::Budget(_)
        ));
        assert!(matches!(
            refusal(&status_429("Evacuation in progress", &[]), false),
            Refusal::NotNow(_)
        ));
    }

    /// Issue 22: a 429 of a webhook on pods/eviction (or throttling) was
    /// worded as a PodDisruptionBudget. Only the API server's PDB check puts
    /// a DisruptionBudget cause on its 429.
    #[test]
    fn only_a_disruption_budget_cause_is_worded_as_a_budget() {
        let webhook = "admission webhook \"freeze.example.com\" denied the request: change freeze";
        let outcome = match refusal(&status_429(webhook, &[]), false) {
            Refusal::NotNow(m) => PodOutcome::NotNow(m),
            other => panic!("a webhook's 429 is no budget: {other:?}"),
        };
        let text = outcome.describe();
        assert!(!text.contains("by a PodDisruptionBudget:"), "{text}");
        assert!(
            text.contains("not by a PodDisruptionBudget") && text.contains(webhook),
            "{text}"
        );
        assert!(
            outcome.problem(Duration::from_secs(60)).is_some(),
            "still a blocker"
        );
        assert_eq!(outcome_label(&outcome), "blocked");
        let throttled =
            "the server has received too many requests and has asked us to try again later";
        assert!(matches!(
            refusal(&status_429(throttled, &[]), false),
            Refusal::NotNow(_)
        ));
    }

    #[test]
    fn other_refusals_as_before() {
        let users_pdb = "The disruption budget web needs 2 healthy pods and has 2 currently";
        for launcher in [true, false] {
            assert_eq!(
                refusal(&status_429(PDB, &[users_pdb]), launcher),
                Refusal::Budget(format!("{PDB} ({users_pdb})")),
                "a PDB of the user's holds even a VM's pod"
            );
            assert!(matches!(
                refusal(
                    &status_429(
                        "admission webhook \"x.example.com\" denied the request: later",
                        &[]
                    ),
                    launcher
                ),
                Refusal::NotNow(_)
            ));
        }
        let forbidden: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "Eviction triggered evacuation of VMI \"shop/vm1\"",
        }))
        .expect("Status JSON");
        assert!(matches!(
            refusal(&kube::Error::Api(Box::new(forbidden)), true),
            Refusal::Failed(_)
        ));
    }

    fn migrating_for(since_secs: u64) -> PodOutcome {
        PodOutcome::Migrating {
            since_secs,
            message: KUBEVIRT_AGAIN.into(),
        }
    }

    #[test]
    fn migration_is_no_blocker_until_it_runs_too_long() {
        let ten_min = Duration::from_secs(600);
        let mut o = BTreeMap::new();
        o.insert(r("virt-launcher-vm1-x"), migrating_for(599));
        o.insert(r("web"), PodOutcome::Evicted);
        assert_eq!(blocker_summary_with("w1", &o, ten_min), None);
        assert_eq!(migrating(&o), vec![r("virt-launcher-vm1-x")]);

        o.insert(r("virt-launcher-vm1-x"), migrating_for(12 * 60 + 5));
        let s = blocker_summary_with("w1", &o, ten_min).expect("overdue");
        assert!(
            s.contains(
                "node w1, 1 blocked: shop/virt-launcher-vm1-x: VM live migration running for 12m, \
                 longer than --migration-warning-after (10m)"
            ),
            "{s}"
        );
        assert!(s.contains("Evacuation in progress"), "{s}");

        // A real blocker next to a young migration: only the blocker is named.
        o.insert(r("virt-launcher-vm1-x"), migrating_for(5));
        o.insert(r("db"), PodOutcome::Blocked("Cannot evict pod".into()));
        let s = blocker_summary_with("w1", &o, ten_min).expect("blocked");
        assert!(s.contains("1 blocked: shop/db:"), "{s}");
        assert!(!s.contains("virt-launcher"), "{s}");
    }

    #[test]
    fn outcome_labels() {
        let labels: Vec<_> = [
            PodOutcome::Evicted,
            PodOutcome::Gone,
            PodOutcome::Terminating(1),
            PodOutcome::Blocked("pdb".into()),
            migrating_for(1),
            PodOutcome::Failed("x".into()),
        ]
        .iter()
        .map(outcome_label)
        .collect();
        assert_eq!(
            labels,
            [
                "evicted",
                "gone",
                "terminating",
                "blocked",
                "migrating",
                "failed"
            ]
        );
    }

    #[test]
    fn migrations_remember_the_first_answer() {
        let m = Migrations::default();
        let t0 = Instant::now();
        assert_eq!(m.observe("u1", t0), Duration::ZERO);
        let later = t0 + Duration::from_secs(90);
        assert_eq!(m.observe("u1", later), Duration::from_secs(90));
        assert_eq!(m.observe("u2", later), Duration::ZERO);
        m.forget("u1");
        assert_eq!(m.observe("u1", later), Duration::ZERO, "a new migration");
        // Pods nobody asks about any more (gone) are dropped.
        let much_later = later + Migrations::STALE + Duration::from_secs(1);
        assert_eq!(m.observe("u3", much_later), Duration::ZERO);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn ages_read_as_people_write_them() {
        let h = |s| human(Duration::from_secs(s));
        assert_eq!(
            [h(0), h(45), h(60), h(12 * 60 + 59), h(3600), h(3900)],
            ["0s", "45s", "1m", "12m", "1h", "1h5m"]
        );
    }

    #[test]
    fn virt_launcher_by_label() {
        let pod = |labels: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "labels": labels}}))
                .expect("pod")
        };
        assert!(is_virt_launcher(
            &pod(serde_json::json!({"kubevirt.io": "virt-launcher"})).metadata
        ));
        assert!(!is_virt_launcher(
            &pod(serde_json::json!({"kubevirt.io": "hotplug-disk"})).metadata
        ));
        assert!(!is_virt_launcher(&pod(serde_json::json!({})).metadata));
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
