//! How soon a NodeMaintenance is retried when its writes keep losing to a newer
//! version of the object (HTTP 409 Conflict) even after a fresh read: 200 ms,
//! doubling up to 5 s, counted per NodeMaintenance and forgotten once a
//! reconcile ends without a conflict. Someone else writing the same object in
//! a loop then costs a few requests per second at most, not one every 200 ms.

use shared::rules::sync::LockExt;
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
        let mut m = self.0.locked();
        let n = m.entry(name.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        delay(*n)
    }

    /// How many NodeMaintenances have a streak.
    pub fn len(&self) -> usize {
        self.0.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The last reconcile of `name` did not end in a conflict.
    pub fn clear(&self, name: &str) {
        self.0.locked().remove(name);
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
}
