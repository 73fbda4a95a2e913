//! [`TtlCache`]: a small bounded map whose entries expire, for answers worth
//! reusing for a while (a TokenReview, "does this DaemonSet exist", API
//! discovery).
//!
//! Time is a parameter: every call takes `now`, so callers pass
//! `Instant::now()` and tests any instant they like. The cache does no
//! locking (wrap it in a `Mutex`) and runs no timer: an expired entry is
//! dropped when it is read, when room is needed, or by [`TtlCache::prune`].
//!
//! ```
//! use std::time::{Duration, Instant};
//! use shared::rules::ttl::TtlCache;
//!
//! let mut answers: TtlCache<String, bool> = TtlCache::new(1024);
//! let t0 = Instant::now();
//! answers.insert("kube-system/kube-proxy".into(), true, Duration::from_secs(10), t0);
//! let key = "kube-system/kube-proxy".to_string();
//! assert_eq!(answers.get(&key, t0 + Duration::from_secs(9)), Some(&true));
//! assert_eq!(answers.get(&key, t0 + Duration::from_secs(10)), None); // expired, dropped
//! assert!(answers.is_empty());
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A map of at most `max_entries` entries, each fresh until its own TTL
/// (given at insert) has passed.
#[derive(Debug, Clone)]
pub struct TtlCache<K, V> {
    entries: HashMap<K, Entry<V>>,
    max: usize,
}

#[derive(Debug, Clone)]
struct Entry<V> {
    value: V,
    /// None: `now + ttl` is beyond what an `Instant` holds, never expires.
    expires: Option<Instant>,
}

impl<V> Entry<V> {
    fn fresh(&self, now: Instant) -> bool {
        self.expires.is_none_or(|at| at > now)
    }
}

impl<K: Hash + Eq + Clone, V> TtlCache<K, V> {
    /// An empty cache holding at most `max_entries` entries (at least one).
    pub fn new(max_entries: usize) -> Self {
        TtlCache {
            entries: HashMap::new(),
            max: max_entries.max(1),
        }
    }

    /// The value of `key` if it is still fresh at `now` (inserted less than
    /// its TTL before). An expired entry is dropped.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<&V> {
        if self.entries.get(key).is_some_and(|e| !e.fresh(now)) {
            self.entries.remove(key);
        }
        self.entries.get(key).map(|e| &e.value)
    }

    /// Keep `value` for `key` until `ttl` after `now`, replacing what was
    /// there. When the cache is full and `key` is new, the expired entries
    /// go first; if none had expired, the one soonest to expire does.
    pub fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= self.max && !self.entries.contains_key(&key) {
            self.prune(now);
            if self.entries.len() >= self.max {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| (e.expires.is_none(), e.expires))
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    self.entries.remove(&k);
                }
            }
        }
        let expires = now.checked_add(ttl);
        self.entries.insert(key, Entry { value, expires });
    }

    /// Drop every entry expired at `now`; returns how many went.
    pub fn prune(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| e.fresh(now));
        before - self.entries.len()
    }

    /// Entries held, expired ones included until they are dropped.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_entry_is_fresh_until_its_own_ttl_has_passed() {
        let mut c = TtlCache::new(8);
        let t = Instant::now();
        c.insert("short", 1, 5 * S, t);
        c.insert("long", 2, 60 * S, t);
        assert_eq!(c.get(&"short", t), Some(&1));
        assert_eq!(c.get(&"short", t + 4 * S), Some(&1));
        assert_eq!(
            c.get(&"short", t + 5 * S),
            None,
            "expired at exactly its TTL"
        );
        assert_eq!(c.len(), 1, "the expired entry was dropped on read");
        assert_eq!(c.get(&"long", t + 59 * S), Some(&2));
        assert_eq!(c.get(&"missing", t), None);
    }

    #[test]
    fn insert_replaces_and_restarts_the_ttl() {
        let mut c = TtlCache::new(1);
        let t = Instant::now();
        c.insert("k", "old", 5 * S, t);
        c.insert("k", "new", 5 * S, t + 4 * S);
        assert_eq!(c.len(), 1);
        assert_eq!(c.get(&"k", t + 8 * S), Some(&"new"));
    }

    #[test]
    fn a_full_cache_drops_expired_entries_then_the_soonest_to_expire() {
        let mut c: TtlCache<u32, ()> = TtlCache::new(3);
        let t = Instant::now();
        c.insert(1, (), 10 * S, t);
        c.insert(2, (), 5 * S, t);
        c.insert(3, (), 20 * S, t);
        c.insert(4, (), 20 * S, t);
        assert_eq!(c.len(), 3);
        assert!(c.get(&2, t).is_none(), "soonest to expire was dropped");
        assert!(c.get(&1, t).is_some());
        // Expired entries make room first.
        c.insert(5, (), S, t + 15 * S);
        assert!(c.get(&1, t + 15 * S).is_none());
        assert!(c.get(&3, t + 15 * S).is_some());
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn prune_drops_only_the_expired() {
        let mut c = TtlCache::new(0);
        assert_eq!(c.max, 1, "room for one at least");
        let t = Instant::now();
        c.insert('a', (), S, t);
        assert_eq!(c.prune(t), 0);
        assert_eq!(c.prune(t + S), 1);
        assert!(c.is_empty());
    }

    #[test]
    fn a_ttl_beyond_any_instant_never_expires_and_goes_last() {
        let mut c = TtlCache::new(2);
        let t = Instant::now();
        c.insert("forever", (), Duration::MAX, t);
        c.insert("soon", (), S, t);
        assert!(c.get(&"forever", t + 1000 * S).is_some());
        c.insert("third", (), 10 * S, t);
        assert!(c.get(&"soon", t).is_none(), "the finite entry went first");
        assert!(c.get(&"forever", t).is_some());
    }
}
