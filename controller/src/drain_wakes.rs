//! What holds a drain back, watched, so that a blocked drain retries the
//! moment its blocker clears instead of on its next poll (upstream polls every
//! 5 s, `plan::REQUEUE_BLOCKED`; that poll stays as the backstop for whatever
//! is not watched here: an eviction webhook, a missed event).
//!
//! A wake-up is a NodeMaintenance fed to the Controller (`reconcile_on`) and
//! counted as a workqueue add, like every other trigger (see `watches`).
//!
//! - **PodDisruptionBudgets**: one cluster-wide watch. PDBs are few (one per
//!   workload at most) and kube's `metadata_watcher` would not do: what
//!   matters is `status.disruptionsAllowed`, so each is decoded to just that
//!   and its generation (`shared::kube::partial::PdbView`). No cache: two facts per PDB are
//!   kept (its generation, whether it allows a disruption). A PDB that allows a
//!   disruption where it did not, whose spec changed (its selector may no
//!   longer pick the pod), or that was deleted, wakes every Running
//!   maintenance with a pending pod (`status.pendingPodsRefs`) in its
//!   namespace.
//! - **Pods**: no cluster-wide pod watch, cached or not: at 30,000 pods every
//!   pod change of the cluster would be sent and decoded, to keep a handful.
//!   Instead, one metadata-only watch per node under maintenance (field
//!   selector `spec.nodeName=<node>`), started once its NodeMaintenance is
//!   Running and stopped once it no longer is (Succeeded, Failed, deleted),
//!   keeping nothing. A pod deleted there (evicted and terminated, or deleted
//!   by someone) that the maintenance still waits for wakes it. Memory grows
//!   with the nodes being drained at once (1 by default), not with the
//!   cluster; at most [`MAX_POD_WATCHES`] such watches run, further nodes rely
//!   on the poll. Which nodes are under maintenance is read from the
//!   NodeMaintenance cache once a second (no request), so a node's watch
//!   starts within a second of its maintenance becoming Running; the drain's
//!   own requeues cover that second.
//! - **Lost track**: a watch that had to list again (410 Gone, a failed
//!   watch) may have missed a deletion: a re-listed PDB watch wakes the
//!   namespaces of the PDBs that vanished meanwhile, a re-listed pod watch
//!   wakes its node's maintenance. While the PDB watch reconnects, the PDBs
//!   are listed every 0.2 s instead (see [`deaf`]): a restarted API server
//!   answers lists a second or more before it resumes watches.

use shared::rules::sync::LockExt;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{AbortHandle, BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use shared::kube::partial::{PdbView, PodMeta};
use shared::{MaintenancePhase, NodeMaintenance};

mod deaf;

use crate::queue_metrics::WorkQueue;
use crate::watches::log_watch_error;

/// Nodes whose pods are watched at once; maintenances beyond rely on the poll.
pub const MAX_POD_WATCHES: usize = 64;

/// How often the set of watched nodes follows the NodeMaintenance cache.
const FOLLOW_MAINTENANCES: Duration = Duration::from_secs(1);

type WatchEvent<K> = Result<watcher::Event<K>, watcher::Error>;

/// The nodes whose pod watch is up (its first list done, or started from
/// a drain round's list): the departure of the last pod a maintenance there
/// waits for wakes it, so a drain round whose pods are all on their way out
/// needs no quick poll. Shared with the reconciler, which says where each
/// drain listed its node's pods ([`WatchedNodes::drain_listed`]).
#[derive(Clone, Default)]
pub struct WatchedNodes(Arc<Watched>);

#[derive(Default)]
struct Watched {
    up: Mutex<HashSet<String>>,
    /// Per node, the resourceVersion of its drain's last pod list, and when
    /// it was said.
    listed_at: Mutex<HashMap<String, (String, std::time::Instant)>>,
    /// Per node, the pods its drain waits for until they complete (a drain
    /// rule's WaitCompleted): any change of one wakes the drain (a pod that
    /// finished leaves at once, not on the blocked retry).
    waited: Mutex<HashMap<String, HashSet<(String, String)>>>,
    nudge: tokio::sync::Notify,
}

/// How long a drain's word (see [`WatchedNodes::drain_listed`]) makes its
/// node wanted before the NodeMaintenance cache shows it Running.
const LISTED_WORD_KEPT: Duration = Duration::from_secs(2);

impl WatchedNodes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.up.locked()
    }
    pub fn contains(&self, node: &str) -> bool {
        self.lock().contains(node)
    }
    /// How many nodes' pod departures are watched.
    pub fn len(&self) -> usize {
        self.lock().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn set(&self, node: &str, watched: bool) {
        if watched {
            self.lock().insert(node.to_string());
        } else {
            self.lock().remove(node);
            self.0.waited.locked().remove(node);
        }
    }

    /// The pods (namespace, name) the drain of `node` waits for until they
    /// complete, as its last round found them (empty: none).
    pub fn waiting_for(&self, node: &str, pods: HashSet<(String, String)>) {
        let mut waited = self.0.waited.locked();
        if pods.is_empty() {
            waited.remove(node);
        } else {
            waited.insert(node.to_string(), pods);
        }
    }

    /// Whether the drain of `node` waits for pod `ns`/`name` to complete.
    fn waits_for(&self, node: &str, ns: &str, name: &str) -> bool {
        self.0
            .waited
            .locked()
            .get(node)
            .is_some_and(|p| p.contains(&(ns.to_string(), name.to_string())))
    }

    /// A drain round on `node` listed its pods at resourceVersion `at` and
    /// left pods on their way out: the node's pod watch starts now (not on
    /// the next look at the cache), from `at` (no list of its own). True
    /// when it is (or will be) watched: no departure since `at` is missed.
    pub fn drain_listed(&self, node: &str, at: Option<&str>) -> bool {
        let watched = self.contains(node);
        let starts = at.is_some() && self.len() < MAX_POD_WATCHES;
        if let (Some(at), false) = (at, watched) {
            let now = std::time::Instant::now();
            self.listed_words(now)
                .insert(node.to_string(), (at.to_string(), now));
            self.0.nudge.notify_one();
        }
        watched || starts
    }

    /// The drains' words still kept at `now` (older ones dropped).
    fn listed_words(
        &self,
        now: std::time::Instant,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (String, std::time::Instant)>> {
        let mut m = self.0.listed_at.locked();
        m.retain(|_, (_, said)| now.duration_since(*said) < LISTED_WORD_KEPT);
        m
    }

    /// The nodes whose drain listed lately, each with where.
    fn listed_lately(&self) -> HashMap<String, String> {
        let words = self.listed_words(std::time::Instant::now());
        words
            .iter()
            .map(|(n, (at, _))| (n.clone(), at.clone()))
            .collect()
    }

    async fn nudged(&self) {
        self.0.nudge.notified().await;
    }
}

/// The NodeMaintenances to reconcile now because what blocked their drain
/// may have cleared (see the module docs). Each is counted in `queue`.
pub fn wakes(
    client: Client,
    store: Store<NodeMaintenance>,
    queue: WorkQueue,
    up: WatchedNodes,
) -> impl Stream<Item = ObjectRef<NodeMaintenance>> + Send + 'static {
    let pdbs = shared::kube::watch::reconnecting(watcher(
        Api::<PdbView>::all(client.clone()),
        watcher::Config::default().page_size(crate::watches::LIST_PAGE),
    ))
    .boxed();
    let state = Blockers {
        client,
        store,
        queue,
        pdbs,
        pdb_facts: Pdbs::default(),
        deaf: deaf::DeafPoll::default(),
        pods: SelectAll::new(),
        watched: BTreeMap::new(),
        over_limit_logged: false,
        ready: VecDeque::new(),
        up,
    };
    futures::stream::unfold((state, None::<Ticks>), |(mut s, ticks)| async move {
        let mut ticks = ticks.unwrap_or_else(Ticks::new);
        let up = s.up.clone();
        loop {
            if let Some(nm) = s.ready.pop_front() {
                return Some((nm, (s, Some(ticks))));
            }
            let deaf = s.deaf.deaf();
            let listing = s.deaf.listing();
            tokio::select! {
                _ = ticks.follow.tick() => s.follow_maintenances(),
                () = up.nudged() => s.follow_maintenances(),
                _ = ticks.deaf.tick(), if deaf => s.poll_pdbs(),
                Some(listed) = s.deaf.listed(), if listing => s.on_pdb_list(listed),
                Some(e) = s.pdbs.next() => s.on_pdb(e),
                Some((node, e)) = s.pods.next(), if !s.pods.is_empty() => s.on_pod(&node, e),
            }
        }
    })
}

/// The loop's clocks: following the maintenances, polling deaf PDBs.
struct Ticks {
    follow: tokio::time::Interval,
    deaf: tokio::time::Interval,
}

impl Ticks {
    fn new() -> Ticks {
        let every = |period| {
            let mut t = tokio::time::interval(period);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        };
        Ticks {
            follow: every(FOLLOW_MAINTENANCES),
            deaf: every(deaf::POLL_EVERY),
        }
    }
}

struct Blockers {
    client: Client,
    store: Store<NodeMaintenance>,
    queue: WorkQueue,
    pdbs: BoxStream<'static, WatchEvent<PdbView>>,
    pdb_facts: Pdbs,
    /// Lists of the PDBs while their watch reconnects.
    deaf: deaf::DeafPoll,
    /// The pod watches of the nodes in `watched`, each event with its node.
    pods: SelectAll<BoxStream<'static, (String, WatchEvent<PodMeta>)>>,
    watched: BTreeMap<String, PodWatch>,
    over_limit_logged: bool,
    ready: VecDeque<ObjectRef<NodeMaintenance>>,
    /// The nodes of `watched` whose watch listed (shared with the reconciler).
    up: WatchedNodes,
}

struct PodWatch {
    stop: AbortHandle,
    /// Its first full list is done: a later one means it had lost track.
    listed: bool,
    /// The pods of that first list, while it runs: a pending pod missing from
    /// it left the node before the watch began (it starts up to a second
    /// after the maintenance does), and its departure was never seen.
    first_list: BTreeSet<(String, String)>,
    /// What this watch knows of the node's pods (see [`Departures`]).
    pods: Departures,
}

impl Blockers {
    fn wake(&mut self, nm: &NodeMaintenance, why: &str) {
        let name = nm.name_any();
        tracing::debug!(nodemaintenance = %name, node = %nm.spec.node_name, "{why}: retrying the drain now");
        self.queue.added(&name, Duration::ZERO);
        self.ready.push_back(ObjectRef::from_obj(nm));
    }

    fn on_pdb(&mut self, event: WatchEvent<PdbView>) {
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                self.deaf.watch_failed(tokio::time::Instant::now());
                return log_watch_error("poddisruptionbudgets.policy", &e);
            }
        };
        self.deaf.watch_delivered();
        let cleared = self.pdb_facts.on_event(event);
        self.wake_cleared(cleared);
    }

    /// While the PDB watch reconnects: list them, if a drain waits for a pod.
    fn poll_pdbs(&mut self) {
        let waits = draining(&self.store.state()).any(|nm| !pending(nm).is_empty());
        self.deaf
            .tick(tokio::time::Instant::now(), waits, &self.client);
    }

    fn on_pdb_list(&mut self, listed: kube::Result<Vec<PdbView>>) {
        match listed {
            Ok(pdbs) => {
                let cleared = self.pdb_facts.polled(pdbs);
                self.wake_cleared(cleared);
            }
            Err(e) => {
                tracing::debug!(error = %e, "listing the PodDisruptionBudgets while their watch reconnects failed; trying again")
            }
        }
    }

    fn wake_cleared(&mut self, cleared: Vec<Cleared>) {
        for cleared in cleared {
            let why = format!(
                "PodDisruptionBudget {}/{} {}",
                cleared.namespace, cleared.name, cleared.what
            );
            for nm in waiting_in_namespace(&self.store.state(), &cleared.namespace) {
                self.wake(&nm, &why);
            }
        }
    }

    fn on_pod(&mut self, node: &str, event: WatchEvent<PodMeta>) {
        match event {
            Ok(watcher::Event::Delete(pod)) => {
                let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
                let Some(w) = self.watched.get_mut(node) else {
                    return;
                };
                let nms = self.store.state();
                let woken = w.pods.left(&nms, node, (ns.clone(), name.clone()));
                let why = format!(
                    "pod {ns}/{name} left node {node}, and no other pod it waits for is terminating"
                );
                for nm in woken {
                    self.wake(&nm, &why);
                }
            }
            Ok(watcher::Event::Apply(pod)) => {
                let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
                if let Some(w) = self.watched.get_mut(node) {
                    w.pods.seen(&pod);
                }
                if self.up.waits_for(node, &ns, &name) {
                    let why = format!("pod {ns}/{name}, waited for until it completes, changed");
                    let nms = self.store.state();
                    for nm in nms.iter().filter(|nm| nm.spec.node_name == node) {
                        self.wake(nm, &why);
                    }
                }
            }
            Ok(watcher::Event::Init) => {
                // A full list follows: it says again which pods are terminating.
                if let Some(w) = self.watched.get_mut(node) {
                    w.pods.terminating.clear();
                }
            }
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(w) = self.watched.get_mut(node) {
                    w.pods.seen(&pod);
                    if !w.listed {
                        w.first_list
                            .insert((pod.namespace().unwrap_or_default(), pod.name_any()));
                    }
                }
            }
            Ok(watcher::Event::InitDone) => self.pods_listed(node),
            Err(e) => log_watch_error(&format!("pods (spec.nodeName={node})"), &e),
        }
    }

    /// The pod watch of `node` finished a full list. The first one: the
    /// watch is up, and the maintenances waiting for a pod that was not in
    /// it (it left before the watch began) retry now. A later one: the watch
    /// had lost track, every maintenance of the node retries.
    fn pods_listed(&mut self, node: &str) {
        let Some(w) = self.watched.get_mut(node) else {
            return;
        };
        if !std::mem::replace(&mut w.listed, true) {
            tracing::debug!(%node, "watching the pods of node {node} under maintenance");
            self.up.set(node, true);
            let present = std::mem::take(&mut w.first_list);
            let why = format!("a pending pod left node {node} before its pod watch began");
            let gone: Vec<_> = draining(&self.store.state())
                .filter(|nm| nm.spec.node_name == node)
                .filter(|nm| {
                    pending(nm)
                        .iter()
                        .any(|p| !present.contains(&(p.namespace.clone(), p.name.clone())))
                })
                .cloned()
                .collect();
            for nm in gone {
                self.wake(&nm, &why);
            }
            return;
        }
        let why = format!("the pod watch of node {node} listed again (it had lost track)");
        for nm in draining(&self.store.state()).filter(|nm| nm.spec.node_name == node) {
            self.wake(nm, &why);
        }
    }

    /// Start the pod watch of each node that came under maintenance, stop
    /// those of nodes whose maintenance ended.
    fn follow_maintenances(&mut self) {
        let lately = self.up.listed_lately();
        let mut want: BTreeSet<String> = draining(&self.store.state())
            .map(|nm| nm.spec.node_name.clone())
            .collect();
        want.extend(lately.keys().cloned());
        let up = &self.up;
        self.watched.retain(|node, w| {
            let keep = want.contains(node);
            if !keep {
                w.stop.abort();
                up.set(node, false);
                tracing::debug!(%node, "no maintenance drains node {node} any more: its pod watch stops");
            }
            keep
        });
        for node in want {
            if self.watched.contains_key(&node) {
                continue;
            }
            if self.watched.len() >= MAX_POD_WATCHES {
                if !std::mem::replace(&mut self.over_limit_logged, true) {
                    tracing::info!(%node, "pods already watched on {MAX_POD_WATCHES} nodes under maintenance; node {node} and further ones retry blocked drains on their poll only");
                }
                return;
            }
            let from = lately.get(&node).cloned();
            self.watch_pods(node, from);
        }
        self.over_limit_logged = false;
    }

    /// Start the pod watch of `node`: from `from` (the resourceVersion of
    /// its drain's pod list: up at once, nothing missed since that list),
    /// else with a list of its own (up once that list is done).
    fn watch_pods(&mut self, node: String, from: Option<String>) {
        let listed = from.is_some();
        let (pods, stop) = futures::stream::abortable(pod_events(&self.client, &node, from));
        let of = node.clone();
        self.pods.push(pods.map(move |e| (of.clone(), e)).boxed());
        if listed {
            tracing::debug!(%node, "watching the pods of node {node} under maintenance from its drain's list");
            self.up.set(&node, true);
        }
        self.watched.insert(
            node,
            PodWatch {
                stop,
                listed,
                first_list: BTreeSet::new(),
                pods: Departures::default(),
            },
        );
    }
}

/// The pod events of `node`: from resourceVersion `from` when given, until
/// that watch ends (its timeout, a 410 Gone, an error), then those of a
/// reconnecting watcher, which lists first (a later list: the node's
/// maintenances look again).
fn pod_events(
    client: &Client,
    node: &str,
    from: Option<String>,
) -> BoxStream<'static, WatchEvent<PodMeta>> {
    let fields = format!("spec.nodeName={node}");
    let api = Api::<PodMeta>::all(client.clone());
    let listed = shared::kube::watch::reconnecting(watcher(
        api.clone(),
        watcher::Config::default().fields(&fields),
    ));
    let Some(from) = from else {
        return listed.boxed();
    };
    let wp = kube::api::WatchParams::default().fields(&fields);
    let started = futures::stream::once(async move { api.watch(&wp, &from).await })
        .filter_map(|r| std::future::ready(r.ok()))
        .flatten();
    let resumed = started
        .take_while(|e| {
            std::future::ready(
                matches!(e, Ok(ev) if !matches!(ev, kube::api::WatchEvent::Error(_))),
            )
        })
        .filter_map(|e| {
            std::future::ready(match e {
                Ok(kube::api::WatchEvent::Added(p) | kube::api::WatchEvent::Modified(p)) => {
                    Some(Ok(watcher::Event::Apply(p)))
                }
                Ok(kube::api::WatchEvent::Deleted(p)) => Some(Ok(watcher::Event::Delete(p))),
                _ => None,
            })
        });
    resumed.chain(listed).boxed()
}

/// Maintenances whose drain is under way: Running, not being deleted.
fn draining(nms: &[Arc<NodeMaintenance>]) -> impl Iterator<Item = &Arc<NodeMaintenance>> {
    nms.iter().filter(|nm| {
        nm.metadata.deletion_timestamp.is_none() && nm.phase() == Some(&MaintenancePhase::Running)
    })
}

fn pending(nm: &NodeMaintenance) -> &[shared::PodReference] {
    nm.status
        .as_ref()
        .map_or(&[], |s| s.pending_pods_refs.as_slice())
}

/// Draining maintenances with a pending pod in `namespace`.
fn waiting_in_namespace(
    nms: &[Arc<NodeMaintenance>],
    namespace: &str,
) -> Vec<Arc<NodeMaintenance>> {
    draining(nms)
        .filter(|nm| pending(nm).iter().any(|p| p.namespace == namespace))
        .cloned()
        .collect()
}

/// The pods of one node under maintenance as its watch saw them: which are
/// terminating, and which pending ones have left. A pod leaving wakes the
/// maintenances that waited for it unless another pod they wait for is
/// still terminating: that one's departure comes next and wakes them then.
/// So a drain of 30 pods is woken once, when the last has gone, instead of
/// running a round per departure; a pending pod that is not terminating
/// (held by a PodDisruptionBudget) does not hold the wake back, so a drain
/// reports at once that the others have left.
#[derive(Default)]
struct Departures {
    terminating: BTreeSet<(String, String)>,
    departed: BTreeSet<(String, String)>,
}

impl Departures {
    fn seen(&mut self, pod: &PodMeta) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        if pod.metadata.deletion_timestamp.is_some() {
            self.terminating.insert(key);
        } else {
            self.terminating.remove(&key);
        }
    }

    /// Pod `gone` left `node`: the draining maintenances of the node to wake.
    fn left(
        &mut self,
        nms: &[Arc<NodeMaintenance>],
        node: &str,
        gone: (String, String),
    ) -> Vec<Arc<NodeMaintenance>> {
        self.terminating.remove(&gone);
        let key = |p: &shared::PodReference| (p.namespace.clone(), p.name.clone());
        let on_node: Vec<&Arc<NodeMaintenance>> = draining(nms)
            .filter(|nm| nm.spec.node_name == node)
            .collect();
        if !on_node
            .iter()
            .any(|nm| pending(nm).iter().any(|p| key(p) == gone))
        {
            return vec![];
        }
        self.departed.insert(gone.clone());
        let still_pending: BTreeSet<_> = on_node
            .iter()
            .flat_map(|nm| pending(nm).iter().map(key))
            .collect();
        self.departed.retain(|d| still_pending.contains(d));
        on_node
            .into_iter()
            .filter(|nm| {
                let p = pending(nm);
                p.iter().any(|r| key(r) == gone)
                    && !p.iter().any(|r| {
                        let k = key(r);
                        !self.departed.contains(&k) && self.terminating.contains(&k)
                    })
            })
            .cloned()
            .collect()
    }
}

/// What is kept of one PodDisruptionBudget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PdbFacts {
    generation: Option<i64>,
    allows: bool,
}

impl PdbFacts {
    fn of(pdb: &PdbView) -> PdbFacts {
        PdbFacts {
            generation: pdb.metadata.generation,
            allows: pdb
                .status
                .as_ref()
                .is_some_and(|s| s.disruptions_allowed > 0),
        }
    }
}

/// A PodDisruptionBudget that may no longer block an eviction.
#[derive(Debug, PartialEq, Eq)]
struct Cleared {
    namespace: String,
    name: String,
    what: &'static str,
}

/// The PDB watch's memory: [`PdbFacts`] by (namespace, name).
#[derive(Default)]
struct Pdbs {
    known: HashMap<(String, String), PdbFacts>,
    /// During a full list: the PDBs it has shown so far.
    listing: Option<HashSet<(String, String)>>,
}

impl Pdbs {
    fn on_event(&mut self, event: watcher::Event<PdbView>) -> Vec<Cleared> {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                vec![]
            }
            watcher::Event::InitApply(pdb) => {
                let key = key(&pdb);
                if let Some(seen) = &mut self.listing {
                    seen.insert(key.clone());
                }
                self.applied(key, PdbFacts::of(&pdb))
            }
            watcher::Event::Apply(pdb) => self.applied(key(&pdb), PdbFacts::of(&pdb)),
            watcher::Event::Delete(pdb) => {
                let key = key(&pdb);
                self.known.remove(&key);
                vec![cleared(key, "was deleted")]
            }
            watcher::Event::InitDone => {
                let seen = self.listing.take().unwrap_or_default();
                self.forget_unseen(&seen, "was deleted (seen on a new full list)")
            }
        }
    }

    /// A list made while the watch reconnects: compared as a new full list.
    fn polled(&mut self, pdbs: Vec<PdbView>) -> Vec<Cleared> {
        let seen: HashSet<(String, String)> = pdbs.iter().map(key).collect();
        let mut out: Vec<Cleared> = pdbs
            .iter()
            .flat_map(|pdb| self.applied(key(pdb), PdbFacts::of(pdb)))
            .collect();
        out.extend(self.forget_unseen(
            &seen,
            "was deleted (seen on a list while its watch reconnects)",
        ));
        out
    }

    /// The known PDBs a full list did not show: deleted meanwhile.
    fn forget_unseen(
        &mut self,
        seen: &HashSet<(String, String)>,
        what: &'static str,
    ) -> Vec<Cleared> {
        let gone: Vec<_> = self
            .known
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.into_iter()
            .map(|k| {
                self.known.remove(&k);
                cleared(k, what)
            })
            .collect()
    }

    /// A PDB seen for the first time blocks nothing new; a known one clears
    /// the way when it starts allowing a disruption or its spec changes.
    fn applied(&mut self, key: (String, String), now: PdbFacts) -> Vec<Cleared> {
        let what = match self.known.insert(key.clone(), now) {
            Some(before) if now.allows && !before.allows => "allows a disruption now",
            Some(before) if now.generation != before.generation => "changed its spec",
            _ => return vec![],
        };
        vec![cleared(key, what)]
    }
}

fn key(pdb: &PdbView) -> (String, String) {
    (pdb.namespace().unwrap_or_default(), pdb.name_any())
}

fn cleared((namespace, name): (String, String), what: &'static str) -> Cleared {
    Cleared {
        namespace,
        name,
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use watcher::Event;

    fn pdb(ns: &str, name: &str, generation: i64, allowed: i32) -> PdbView {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "generation": generation},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}
        }))
        .expect("pdb json")
    }

    fn what(v: Vec<Cleared>) -> Vec<String> {
        v.into_iter()
            .map(|c| format!("{}/{} {}", c.namespace, c.name, c.what))
            .collect()
    }

    #[test]
    fn a_drain_that_listed_its_pods_gets_its_watch_from_that_list() {
        let w = WatchedNodes::default();
        assert!(
            !w.drain_listed("n1", None),
            "no resourceVersion, no watch yet: the quick poll stays"
        );
        assert!(w.listed_lately().is_empty());
        assert!(
            w.drain_listed("n1", Some("42")),
            "watched from the list's version on"
        );
        assert_eq!(w.listed_lately().get("n1").map(String::as_str), Some("42"));
        w.set("n2", true);
        assert!(w.drain_listed("n2", Some("43")), "watched already");
        assert!(
            !w.listed_lately().contains_key("n2"),
            "a running watch is not started again"
        );
    }

    #[test]
    fn a_pdb_clears_the_way_when_it_starts_allowing_changes_or_goes() {
        let mut p = Pdbs::default();
        let listed = [
            Event::Init,
            Event::InitApply(pdb("a", "web", 1, 0)),
            Event::InitApply(pdb("b", "db", 1, 1)),
            Event::InitDone,
        ];
        for e in listed {
            assert!(p.on_event(e).is_empty(), "a first list wakes nothing");
        }
        // Status churn that still allows nothing, or still allows: nothing new.
        assert!(p.on_event(Event::Apply(pdb("a", "web", 1, 0))).is_empty());
        assert!(p.on_event(Event::Apply(pdb("b", "db", 1, 2))).is_empty());
        assert_eq!(
            what(p.on_event(Event::Apply(pdb("a", "web", 1, 1)))),
            ["a/web allows a disruption now"]
        );
        assert!(p.on_event(Event::Apply(pdb("a", "web", 1, 0))).is_empty());
        assert_eq!(
            what(p.on_event(Event::Apply(pdb("a", "web", 2, 0)))),
            ["a/web changed its spec"]
        );
        assert_eq!(
            what(p.on_event(Event::Delete(pdb("b", "db", 1, 2)))),
            ["b/db was deleted"]
        );
        // A new PDB only adds a constraint.
        assert!(p.on_event(Event::Apply(pdb("c", "new", 1, 0))).is_empty());
    }

    #[test]
    fn a_new_full_list_names_the_pdbs_deleted_meanwhile() {
        let mut p = Pdbs::default();
        for e in [
            Event::Init,
            Event::InitApply(pdb("a", "web", 1, 0)),
            Event::InitApply(pdb("b", "db", 1, 0)),
            Event::InitDone,
        ] {
            p.on_event(e);
        }
        let mut woken = vec![];
        for e in [
            Event::Init,
            Event::InitApply(pdb("a", "web", 1, 1)),
            Event::InitDone,
        ] {
            woken.extend(what(p.on_event(e)));
        }
        assert_eq!(
            woken,
            [
                "a/web allows a disruption now",
                "b/db was deleted (seen on a new full list)"
            ]
        );
        assert_eq!(p.known.len(), 1);
    }

    #[test]
    fn a_list_while_the_watch_reconnects_names_what_cleared() {
        let mut p = Pdbs::default();
        for e in [
            Event::Init,
            Event::InitApply(pdb("a", "web", 1, 0)),
            Event::InitApply(pdb("b", "db", 1, 0)),
            Event::InitApply(pdb("c", "queue", 1, 0)),
            Event::InitDone,
        ] {
            p.on_event(e);
        }
        let listed = vec![
            pdb("a", "web", 1, 0),
            pdb("c", "queue", 1, 1),
            pdb("d", "new", 1, 0),
        ];
        assert_eq!(
            what(p.polled(listed.clone())),
            [
                "c/queue allows a disruption now",
                "b/db was deleted (seen on a list while its watch reconnects)"
            ]
        );
        assert!(
            p.polled(listed).is_empty(),
            "the same list again: nothing new"
        );
        // The watch's own full list afterwards agrees: nothing wakes twice.
        let mut again = vec![];
        for e in [
            Event::Init,
            Event::InitApply(pdb("a", "web", 1, 0)),
            Event::InitApply(pdb("c", "queue", 1, 1)),
            Event::InitApply(pdb("d", "new", 1, 0)),
            Event::InitDone,
        ] {
            again.extend(what(p.on_event(e)));
        }
        assert!(again.is_empty(), "{again:?}");
    }

    fn nm(name: &str, node: &str, phase: &str, pending: &[(&str, &str)]) -> Arc<NodeMaintenance> {
        let refs: Vec<_> = pending
            .iter()
            .map(|(ns, n)| json!({"namespace": ns, "name": n}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
                "kind": "NodeMaintenance",
                "metadata": {"name": name},
                "spec": {"nodeName": node},
                "status": {"phase": phase, "pendingPodsRefs": refs}
            }))
            .expect("nm json"),
        )
    }

    fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        // Any instant: only its presence counts here.
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::constant(1_796_434_200, 0),
        )
    }

    /// A pod's metadata in namespace `ns`, terminating or not.
    fn pod(ns: &str, name: &str, terminating: bool) -> PodMeta {
        let mut p = PodMeta::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        if terminating {
            p.metadata.deletion_timestamp = Some(now());
        }
        p
    }

    fn names(v: Vec<Arc<NodeMaintenance>>) -> Vec<String> {
        v.iter().map(|nm| nm.name_any()).collect()
    }

    #[test]
    fn events_map_to_the_draining_maintenances_they_concern() {
        let mut deleting = (*nm("d", "w4", "Running", &[("shop", "x")])).clone();
        deleting.metadata.deletion_timestamp = Some(now());
        let nms = vec![
            nm("a", "w1", "Running", &[("shop", "web-1"), ("db", "pg-0")]),
            nm("b", "w2", "Running", &[("db", "pg-1")]),
            nm("c", "w3", "Succeeded", &[("shop", "web-2")]),
            Arc::new(deleting),
        ];
        assert_eq!(names(waiting_in_namespace(&nms, "shop")), ["a"]);
        assert_eq!(names(waiting_in_namespace(&nms, "db")), ["a", "b"]);
        assert!(waiting_in_namespace(&nms, "other").is_empty());
        let gone = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        // a waits for web-1 and pg-0 on w1, both evicted (terminating).
        let mut w1 = Departures::default();
        w1.seen(&pod("shop", "web-1", true));
        w1.seen(&pod("db", "pg-0", true));
        assert!(
            w1.left(&nms, "w1", gone("db", "pg-0")).is_empty(),
            "web-1 is still terminating: its departure wakes a"
        );
        assert!(
            w1.left(&nms, "w1", gone("db", "pg-1")).is_empty(),
            "not pending there"
        );
        assert_eq!(
            names(w1.left(&nms, "w1", gone("shop", "web-1"))),
            ["a"],
            "the last terminating pod of a left"
        );
        // A pending pod that is not terminating (a PDB holds it) holds no wake back.
        let mut w1 = Departures::default();
        w1.seen(&pod("shop", "web-1", false));
        assert_eq!(names(w1.left(&nms, "w1", gone("db", "pg-0"))), ["a"]);
        let mut w2 = Departures::default();
        assert!(
            w2.left(&nms, "w2", gone("shop", "web-1")).is_empty(),
            "another node"
        );
        assert_eq!(names(w2.left(&nms, "w2", gone("db", "pg-1"))), ["b"]);
        assert!(
            w2.departed.len() <= 1,
            "only departures still listed pending are kept"
        );
        let nodes: Vec<_> = draining(&nms).map(|nm| nm.spec.node_name.clone()).collect();
        assert_eq!(nodes, ["w1", "w2"], "Running and not being deleted");
    }
}
