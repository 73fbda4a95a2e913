//! The time the reconcile reads: the wall clock in the process; in unit
//! tests, a time the test sets (and moves), so no decision of a test
//! depends on the day it runs.

use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use shared::rules::sync::LockExt;

#[derive(Clone, Debug, Default)]
pub struct Clock(Option<Arc<Mutex<Timestamp>>>);

impl Clock {
    /// The wall clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock standing at `at` until moved.
    pub fn set_at(at: Timestamp) -> Clock {
        Clock(Some(Arc::new(Mutex::new(at))))
    }

    pub fn now(&self) -> Timestamp {
        match &self.0 {
            None => Timestamp::now(),
            Some(at) => *at.locked(),
        }
    }

    /// Move a set clock by `by` (the wall clock moves on its own).
    pub fn advance(&self, by: SignedDuration) {
        if let Some(at) = &self.0 {
            let mut at = at.locked();
            *at = at.checked_add(by).unwrap_or(*at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_clock_stands_until_moved() {
        let t0: Timestamp = "2026-12-12T01:30:00Z".parse().expect("a time");
        let clock = Clock::set_at(t0);
        let copy = clock.clone();
        assert_eq!(clock.now(), t0);
        copy.advance(SignedDuration::from_secs(90));
        assert_eq!(
            clock.now(),
            t0 + SignedDuration::from_secs(90),
            "clones share it"
        );
    }
}
