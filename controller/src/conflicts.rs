//! How soon a NodeMaintenance is retried when its writes keep losing to a newer
//! version of the object (HTTP 409 Conflict) even after a fresh read: 200 ms,
//! doubling up to 5 s, counted per NodeMaintenance and forgotten once a
//! reconcile ends without a conflict. Someone else writing the same object in
//! a loop then costs a few requests per second at most, not one every 200 ms.
//!
//! Also `OwnWrites`: read-your-writes over a watch cache that lags.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

const FIRST: Duration = Duration::from_millis(200);
const MAX: Duration = Duration::from_secs(5);

/// The wait after the `streak`-th conflict in a row (1-based).
pub fn delay(streak: u32) -> Duration {
    let doublings = streak.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

/// Conflicts in a row, by NodeMaintenance name (cluster-scoped, so unique).
#[derive(Default)]
pub struct ConflictStreaks(Mutex<HashMap<String, u32>>);

impl ConflictStreaks {
    /// Count one more conflict for `name`; returns how long to wait before retrying.
    pub fn record(&self, name: &str) -> Duration {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(name.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        delay(*n)
    }

    /// The last reconcile of `name` did not end in a conflict.
    pub fn clear(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

/// The resourceVersion our last write of each NodeMaintenance returned. A
/// reconcile triggered before the watch delivered that write (e.g. by the
/// node event of our own patch) would act on an older copy, and could put a
/// node that was just given back into maintenance again. So while the cache
/// holds another version than our last write, the reconcile reads the object
/// live. One entry per object we wrote; it goes once the cache caught up.
#[derive(Default)]
pub struct OwnWrites(Mutex<HashMap<String, String>>);

impl OwnWrites {
    /// We wrote `name` and got back `version`.
    pub fn wrote(&self, name: &str, version: Option<&str>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match version {
            Some(v) => {
                m.insert(name.to_string(), v.to_string());
            }
            None => {
                m.remove(name);
            }
        }
    }

    /// Whether a cached copy of `name` at `cached` may predate our last write.
    pub fn is_stale(&self, name: &str, cached: Option<&str>) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(name) {
            None => false,
            Some(ours) if Some(ours.as_str()) == cached => {
                m.remove(name);
                false
            }
            Some(_) => true,
        }
    }

    /// A live read replaced the cached copy (or the object is gone).
    pub fn forget(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_200_ms_up_to_5_s() {
        let waits: Vec<u128> = (1..=8).map(|n| delay(n).as_millis()).collect();
        assert_eq!(waits, vec![200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(delay(u32::MAX), MAX);
        assert_eq!(delay(0), FIRST);
    }

    #[test]
    fn streaks_are_per_object_and_cleared_by_a_clean_reconcile() {
        let s = ConflictStreaks::default();
        assert_eq!(s.record("a"), Duration::from_millis(200));
        assert_eq!(s.record("a"), Duration::from_millis(400));
        assert_eq!(s.record("b"), Duration::from_millis(200));
        s.clear("a");
        assert_eq!(s.record("a"), Duration::from_millis(200));
        assert_eq!(s.record("b"), Duration::from_millis(400));
    }

    #[test]
    fn a_cached_copy_other_than_our_last_write_is_read_live() {
        let w = OwnWrites::default();
        assert!(
            !w.is_stale("a", Some("5")),
            "never written: the cache is all we know"
        );
        w.wrote("a", Some("7"));
        assert!(w.is_stale("a", Some("5")), "the cache predates our write");
        assert!(!w.is_stale("a", Some("7")), "caught up");
        assert!(!w.is_stale("a", Some("5")), "entry gone once caught up");
        w.wrote("b", Some("9"));
        w.forget("b");
        assert!(!w.is_stale("b", Some("3")));
    }
}
