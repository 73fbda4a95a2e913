//! Read-your-writes over a watch cache that lags: the NodeMaintenance our
//! last write returned, until the cache shows it.

use shared::rules::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use shared::NodeMaintenance;

/// Our own writes of each NodeMaintenance, for read-your-writes over a watch
/// cache that lags. A reconcile triggered before the watch delivered our last
/// write (e.g. by the node event of our own patch) would act on an older
/// copy, and could put a node that was just given back into maintenance
/// again. Every write of ours is checked against the version it was computed
/// from, so while the cache holds one of the versions our writes replaced,
/// nothing but our writes happened since: the object our last write returned
/// is the current one, and no request is needed. A cached copy at any other
/// version (someone else wrote) is read live. One entry per object we wrote;
/// it goes once the cache caught up: when a reconcile reads it, or when the
/// watch delivers it ([`OwnWrites::seen`]; a status-only change triggers no
/// reconcile, and after Failed none may come at all).
#[derive(Clone, Default)]
pub struct OwnWrites(Arc<Mutex<HashMap<String, Written>>>);

struct Written {
    /// The versions our writes replaced, oldest first (a chain of writes
    /// within one reconcile replaces several).
    replaced: Vec<String>,
    /// What our last write returned.
    latest: NodeMaintenance,
}

/// What a reconcile should act on, given the cached copy.
#[derive(Debug)]
pub enum Current {
    /// The cached copy is current (or we never wrote the object).
    Cached,
    /// The cache lags only our own writes: this is what the last one returned.
    Ours(Box<NodeMaintenance>),
    /// Someone else wrote the object: read it live.
    ReadLive,
}

impl OwnWrites {
    /// We wrote `name` from the version `based_on`, and got back `written`.
    pub fn wrote(&self, name: &str, based_on: Option<&str>, written: &NodeMaintenance) {
        let mut m = self.0.locked();
        let (Some(base), Some(_)) = (based_on, written.metadata.resource_version.as_deref()) else {
            m.remove(name);
            return;
        };
        let mut replaced = match m.remove(name) {
            // A chain of our writes: the cache may hold any version of it.
            Some(w) if w.latest.metadata.resource_version.as_deref() == Some(base) => w.replaced,
            _ => Vec::new(),
        };
        replaced.push(base.to_string());
        m.insert(
            name.to_string(),
            Written {
                replaced,
                latest: written.clone(),
            },
        );
    }

    /// What to act on when the cache holds `name` at version `cached`.
    pub fn current(&self, name: &str, cached: Option<&str>) -> Current {
        let mut m = self.0.locked();
        let Some(w) = m.get(name) else {
            return Current::Cached;
        };
        if cached.is_some() && cached == w.latest.metadata.resource_version.as_deref() {
            m.remove(name);
            return Current::Cached;
        }
        if cached.is_some_and(|c| w.replaced.iter().any(|r| r == c)) {
            return Current::Ours(Box::new(w.latest.clone()));
        }
        m.remove(name);
        Current::ReadLive
    }

    /// How many NodeMaintenances have a write the cache has not shown yet.
    pub fn len(&self) -> usize {
        self.0.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The watch cache now holds `nm`: if that is our last write, the cache
    /// caught up and nothing is left to bridge.
    pub fn seen(&self, nm: &NodeMaintenance) {
        let Some(name) = nm.metadata.name.as_deref() else {
            return;
        };
        let mut m = self.0.locked();
        if m.get(name).is_some_and(|w| {
            nm.metadata.resource_version.is_some()
                && w.latest.metadata.resource_version == nm.metadata.resource_version
        }) {
            m.remove(name);
        }
    }

    /// The object is gone, or a live read replaced what we knew.
    pub fn forget(&self, name: &str) {
        self.0.locked().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nm(version: &str) -> NodeMaintenance {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "resourceVersion": version},
            "spec": {"nodeName": "n"}
        }))
        .expect("nm")
    }

    fn rv(c: Current) -> String {
        match c {
            Current::Cached => "cached".into(),
            Current::Ours(nm) => {
                format!("ours {}", nm.metadata.resource_version.unwrap_or_default())
            }
            Current::ReadLive => "live".into(),
        }
    }

    #[test]
    fn the_watch_showing_our_last_write_ends_the_entry() {
        let w = OwnWrites::default();
        w.wrote("a", Some("5"), &nm("7"));
        w.seen(&nm("5"));
        assert_eq!(w.len(), 1, "an older copy: still ahead of the cache");
        assert_eq!(rv(w.current("a", Some("5"))), "ours 7");
        w.seen(&nm("7"));
        assert!(w.is_empty(), "the cache caught up");
        assert_eq!(rv(w.current("a", Some("7"))), "cached");
    }

    #[test]
    fn a_cache_behind_our_own_writes_gets_our_last_copy_anything_else_is_read_live() {
        let w = OwnWrites::default();
        assert_eq!(
            rv(w.current("a", Some("5"))),
            "cached",
            "never written: the cache is all we know"
        );
        w.wrote("a", Some("5"), &nm("7"));
        assert_eq!(
            rv(w.current("a", Some("5"))),
            "ours 7",
            "the cache predates our write"
        );
        // A second write in the same chain: either replaced version is ours.
        w.wrote("a", Some("7"), &nm("9"));
        assert_eq!(rv(w.current("a", Some("5"))), "ours 9");
        assert_eq!(rv(w.current("a", Some("7"))), "ours 9");
        assert_eq!(rv(w.current("a", Some("9"))), "cached", "caught up");
        assert_eq!(
            rv(w.current("a", Some("5"))),
            "cached",
            "entry gone once caught up"
        );
        // Someone else wrote after us (the cache holds a version we never saw).
        w.wrote("a", Some("9"), &nm("11"));
        assert_eq!(rv(w.current("a", Some("12"))), "live");
        assert_eq!(
            rv(w.current("a", Some("12"))),
            "cached",
            "read live once, then the cache again"
        );
        // A write based on a copy that is not our last one starts a new chain.
        w.wrote("a", Some("12"), &nm("14"));
        w.wrote("a", Some("20"), &nm("21"));
        assert_eq!(rv(w.current("a", Some("12"))), "live");
        w.wrote("b", Some("1"), &nm("2"));
        w.forget("b");
        assert_eq!(rv(w.current("b", Some("1"))), "cached");
    }
}
