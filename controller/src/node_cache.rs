//! The nodes that maintenances name, as the node watch last saw them, so a
//! reconcile reads its node without a request (upstream's controller reads
//! nodes from its informer cache too). Only nodes a reconcile asked for are
//! kept, trimmed to what a decision reads (name, uid, labels, cordon,
//! taints): a thousand-node cluster with one maintenance holds one node.
//!
//! Freshness: the node watch updates an entry before it can wake a
//! reconcile, so a reconcile woken by a node change reads that change. Our
//! own patches update the entry from what the API server returned. A copy
//! that is still stale (the watch lagging someone else's write) is harmless:
//! every node patch first tests the taint list it was computed from, so it
//! fails (422) instead of overwriting, and a failed patch drops the entry so
//! the retry reads the node live. A watch that lost track (a new full list)
//! empties the cache.
//!
//! It also tells our own writes apart: the watch event of a patch we made
//! (same resourceVersion as the patch's answer) wakes no reconcile; the
//! reconcile that made it already acted on it.

use shared::rules::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use shared::api::consts::PRIOR_CORDON_ANNOTATION;
use shared::kube::partial::NodeView;

#[derive(Clone, Default)]
pub struct NodeCache(Arc<Mutex<HashMap<String, Entry>>>);

struct Entry {
    node: Node,
    /// The resourceVersion our last patch of the node returned, until the
    /// watch delivered that version.
    own_write: Option<String>,
    /// The watch saw the node deleted (`node` is its last version): a
    /// tombstone, so a live read that raced the delete cannot put the node
    /// back (a reconcile would then never see it gone). Only a later
    /// version (the node created again) replaces it.
    deleted: bool,
}

/// `node` may replace what `e` holds: not older, and never the same node
/// again once the watch saw it deleted (a live read from before the delete).
fn replaces(e: &Entry, node: &Node) -> bool {
    if e.deleted {
        let recreated = node.metadata.uid.is_some() && node.metadata.uid != e.node.metadata.uid;
        return recreated || older(rv(&e.node), rv(node));
    }
    !older(rv(node), rv(&e.node))
}

/// resourceVersions are opaque by contract but etcd's are increasing
/// integers; compared only when both parse, otherwise the later arrival wins.
fn rv_number(rv: Option<&str>) -> Option<u64> {
    rv.and_then(|v| v.parse().ok())
}

/// `a` is a strictly older version than `b` (as far as can be told).
fn older(a: Option<&str>, b: Option<&str>) -> bool {
    matches!((rv_number(a), rv_number(b)), (Some(a), Some(b)) if a < b)
}

fn rv(node: &Node) -> Option<&str> {
    node.metadata.resource_version.as_deref()
}

/// The node annotations the controller reads (ours).
const READ_ANNOTATIONS: [&str; 2] = [
    PRIOR_CORDON_ANNOTATION,
    shared::serve::drain_flags::EXCLUDED_AT_ANNOTATION,
];

/// A node holding only what the controller reads: name, uid, version,
/// labels, our annotations, cordon, taints.
fn lean_node(meta: &ObjectMeta, unschedulable: Option<bool>, taints: Option<Vec<Taint>>) -> Node {
    let kept: std::collections::BTreeMap<String, String> = (meta.annotations.iter().flatten())
        .filter(|(k, _)| READ_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let kept = (!kept.is_empty()).then_some(kept);
    Node {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            labels: meta.labels.clone(),
            annotations: kept,
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            unschedulable,
            taints,
            ..NodeSpec::default()
        }),
        status: None,
    }
}

/// The node as the watch decoded it, reduced as [`lean_node`] does.
fn from_view(view: &NodeView) -> Node {
    let spec = view.spec.as_ref();
    lean_node(
        &view.metadata,
        spec.and_then(|s| s.unschedulable),
        spec.and_then(|s| s.taints.clone()),
    )
}

impl NodeCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.0.locked()
    }

    /// The cached copy of node `name`, if a reconcile read it before.
    pub fn get(&self, name: &str) -> Option<Node> {
        let mut m = self.lock();
        let e = m.get_mut(name)?;
        if e.deleted {
            return None;
        }
        Some(e.node.clone())
    }

    /// A node just read live.
    pub fn put(&self, node: &Node) {
        self.store(node, false, true);
    }

    /// What our patch of a node returned.
    pub fn wrote(&self, node: &Node) {
        self.store(node, true, true);
    }

    /// What our patch of a node returned, if the node is cached (a node
    /// given back is not taken back in).
    pub fn wrote_if_cached(&self, node: &Node) {
        self.store(node, true, false);
    }

    /// Keep `node` (`ours`: our patch's answer); a node not cached yet
    /// only when `add`.
    fn store(&self, node: &Node, ours: bool, add: bool) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        let spec = node.spec.as_ref();
        let node = lean_node(
            &node.metadata,
            spec.and_then(|s| s.unschedulable),
            spec.and_then(|s| s.taints.clone()),
        );
        let written = node.metadata.resource_version.clone();
        let mut m = self.lock();
        match m.get_mut(&name) {
            Some(e) => {
                // The watch may deliver our write before the patch's answer
                // gets here: then nothing of it is pending.
                let delivered = !e.deleted && rv(&e.node) == written.as_deref();
                if !replaces(e, &node) {
                    return;
                }
                e.node = node;
                e.deleted = false;
                if ours && !delivered {
                    e.own_write = written;
                }
            }
            None if add => {
                m.insert(
                    name,
                    Entry {
                        node,
                        own_write: if ours { written } else { None },
                        deleted: false,
                    },
                );
            }
            None => {}
        }
    }

    /// Drop node `name` (a patch of it failed: the next read goes live).
    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    /// The maintenance of node `name` is over: drop it. The echo of our
    /// last write, if still on its way, then wakes the maintenances naming
    /// the node, if any: a reconcile with nothing to do, where waiting for
    /// an echo that may already have passed would keep the entry forever.
    pub fn retire(&self, name: &str) {
        self.lock().remove(name);
    }

    /// Retire every node that no maintenance in `named` names (their
    /// maintenances went without our cleanup, e.g. a finalizer removed by
    /// hand).
    pub fn retire_unnamed(&self, named: &std::collections::HashSet<String>) {
        let unnamed: Vec<String> = self
            .lock()
            .keys()
            .filter(|n| !named.contains(*n))
            .cloned()
            .collect();
        for name in unnamed {
            self.retire(&name);
        }
    }

    /// Follow the node watch (called on every event, before any reconcile
    /// it wakes).
    pub fn observe(&self, event: &watcher::Event<NodeView>) {
        match event {
            watcher::Event::Apply(v) | watcher::Event::InitApply(v) => {
                let Some(name) = v.metadata.name.as_deref() else {
                    return;
                };
                let mut m = self.lock();
                if let Some(e) = m.get_mut(name) {
                    let seen = v.metadata.resource_version.as_deref();
                    let node = from_view(v);
                    if replaces(e, &node) {
                        e.node = node;
                        e.deleted = false;
                    }
                    // A later version than our write: its echo went by (or
                    // changed nothing the reconciles look at).
                    if older(e.own_write.as_deref(), seen) {
                        e.own_write = None;
                    }
                }
            }
            watcher::Event::Delete(v) => {
                if let Some(name) = v.metadata.name.as_deref() {
                    // Kept as a tombstone while a maintenance names the
                    // node; retire() (its maintenance ended) or a new full
                    // list drops it.
                    let mut m = self.lock();
                    if let Some(e) = m.get_mut(name) {
                        e.node = from_view(v);
                        e.deleted = true;
                        e.own_write = None;
                    }
                }
            }
            // A new full list: what it no longer holds may be gone.
            watcher::Event::Init => self.lock().clear(),
            watcher::Event::InitDone => {}
        }
    }

    /// True when `view` is the watch's echo of our own last patch of that
    /// node (then no reconcile needs waking). Asked once per node change.
    pub fn is_own_echo(&self, view: &NodeView) -> bool {
        let Some(name) = view.metadata.name.as_deref() else {
            return false;
        };
        let mut m = self.lock();
        let Some(e) = m.get_mut(name) else {
            return false;
        };
        if e.own_write.is_none() || e.own_write != view.metadata.resource_version {
            return false;
        }
        e.own_write = None;
        true
    }

    /// How many nodes are cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(rv: &str, unschedulable: bool) -> NodeView {
        serde_json::from_value(json!({
            "metadata": {"name": "w1", "uid": "u1", "resourceVersion": rv, "labels": {"a": "b"}},
            "spec": {"unschedulable": unschedulable,
                     "taints": [{"key": "k", "effect": "NoExecute", "timeAdded": "2026-12-01T10:00:00Z"}]}
        }))
        .expect("node view")
    }

    fn node(rv: &str, unschedulable: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "w1", "uid": "u1", "resourceVersion": rv,
                         "annotations": {"big": "x"}, "labels": {"a": "b"}},
            "spec": {"unschedulable": unschedulable, "podCIDR": "10.0.0.0/24"},
            "status": {"capacity": {"cpu": "4"}}
        }))
        .expect("node")
    }

    fn rv_of(n: &Node) -> &str {
        n.metadata.resource_version.as_deref().unwrap_or_default()
    }

    #[test]
    fn keeps_only_nodes_a_reconcile_read_and_trims_them() {
        let c = NodeCache::default();
        c.observe(&watcher::Event::Apply(view("5", false)));
        assert!(c.get("w1").is_none(), "the watch alone caches nothing");
        c.put(&node("5", false));
        let n = c.get("w1").expect("cached");
        assert!(n.status.is_none() && n.metadata.annotations.is_none());
        assert_eq!(n.spec.and_then(|s| s.pod_cidr), None);
    }

    #[test]
    fn follows_the_watch_but_never_goes_back_in_time() {
        let c = NodeCache::default();
        c.put(&node("5", false));
        c.observe(&watcher::Event::Apply(view("7", true)));
        let n = c.get("w1").expect("cached");
        assert_eq!(rv_of(&n), "7");
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        let t = &n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .expect("taints")[0];
        assert!(
            t.time_added.is_some(),
            "the taint list is kept whole for the patch's test"
        );
        c.observe(&watcher::Event::Apply(view("6", false)));
        assert_eq!(rv_of(&c.get("w1").expect("cached")), "7");
        c.wrote(&node("4", false));
        assert_eq!(rv_of(&c.get("w1").expect("cached")), "7");
    }

    #[test]
    fn the_echo_of_our_own_patch_wakes_nothing_once() {
        let c = NodeCache::default();
        c.wrote(&node("9", true));
        assert!(!c.is_own_echo(&view("8", false)));
        assert!(c.is_own_echo(&view("9", true)));
        assert!(!c.is_own_echo(&view("9", true)), "only once");
        assert!(!c.is_own_echo(&view("10", true)), "someone else's change");

        // An echo the node watch's filter swallowed is over once a later
        // version arrives.
        c.wrote(&node("11", true));
        c.observe(&watcher::Event::Apply(view("12", true)));
        assert!(!c.is_own_echo(&view("11", true)));
    }

    /// The watch delivered our patch (version 8) before the patch's answer
    /// reached the cache: nothing is pending, so retiring drops the entry
    /// at once (it used to wait for an echo that had already passed).
    #[test]
    fn our_write_seen_by_the_watch_first_is_not_pending() {
        let c = NodeCache::default();
        c.put(&node("7", false));
        c.observe(&watcher::Event::Apply(view("8", true)));
        c.wrote(&node("8", true));
        c.retire("w1");
        assert!(c.is_empty());
    }

    /// Issue 22: a live read (version 5) that raced the node's deletion
    /// (the watch's Delete, version 6) put the node back, and the reconcile
    /// never saw it gone.
    #[test]
    fn a_late_read_never_resurrects_a_deleted_node() {
        let c = NodeCache::default();
        c.put(&node("5", false));
        c.observe(&watcher::Event::Delete(view("6", false)));
        assert!(c.get("w1").is_none(), "gone");
        c.put(&node("5", false));
        assert!(
            c.get("w1").is_none(),
            "the late read does not bring it back"
        );
        c.wrote(&node("6", false));
        assert!(c.get("w1").is_none(), "nor does the deleted version itself");
        // The node created again (a newer version, another uid) is news.
        let mut again = node("9", true);
        again.metadata.uid = Some("u2".into());
        c.put(&again);
        assert_eq!(
            c.get("w1").map(|n| rv_of(&n).to_string()).as_deref(),
            Some("9")
        );
        // Recreated and seen first by the watch.
        c.observe(&watcher::Event::Delete(view("10", false)));
        c.observe(&watcher::Event::Apply(view("11", false)));
        assert!(c.get("w1").is_some());
    }

    #[test]
    fn deletes_relists_and_retirement_drop_entries() {
        let c = NodeCache::default();
        c.put(&node("5", false));
        c.observe(&watcher::Event::Delete(view("6", false)));
        assert!(c.get("w1").is_none());
        c.retire("w1");
        assert!(c.is_empty(), "a tombstone goes with its maintenance");

        c.put(&node("5", false));
        c.observe(&watcher::Event::Init);
        assert!(c.is_empty());

        c.put(&node("5", false));
        c.retire("w1");
        assert!(c.is_empty(), "nothing pending: gone at once");

        c.wrote(&node("6", false));
        c.retire("w1");
        assert!(
            c.is_empty(),
            "gone even with the echo of our write on its way (it may have passed)"
        );
        assert!(!c.is_own_echo(&view("6", false)), "then it wakes: harmless");

        c.wrote(&node("7", false));
        c.forget("w1");
        assert!(c.is_empty());

        // A maintenance gone without our cleanup: its node goes unless
        // another maintenance names it.
        c.put(&node("8", false));
        let named: std::collections::HashSet<String> = ["w1".to_string()].into();
        c.retire_unnamed(&named);
        assert_eq!(c.len(), 1, "still named");
        c.retire_unnamed(&Default::default());
        assert!(c.is_empty());
    }
}
