//! How every watch of the controller and the webhook reconnects after the API
//! server went away (restart, upgrade, etcd outage): each webhook cache's
//! watch through `WatchStreamExt::backoff`, the controller's watches through
//! its `Controller::trigger_backoff` (which pauses them all after an error).
//!
//! kube-runtime's `default_backoff()` is client-go's reflector policy: 0.8 s
//! doubling to 30 s, back to the start only once no error came for 2 minutes.
//! After an API server restart that left our caches up to half a minute behind
//! the cluster. Reconnecting is one request per watch, so we retry soon and
//! often instead: 100 ms doubling to 1 s, each wait stretched by a random
//! 0-100 % so replicas do not reconnect in lockstep (waits of 0.1-2 s), and
//! back to 100 ms as soon as the watch delivers anything again (kube-runtime's
//! `StreamBackoff` resets on every `Ok`).
//!
//! A store that missed events while disconnected is not patched up by guessing:
//! the API server answers a resumed watch whose resourceVersion it no longer
//! holds with 410 Gone (a restarted API server's watch cache starts at the
//! current revision), and kube-runtime's watcher then lists again from scratch,
//! replacing the store's contents on `InitDone`.

use std::time::Duration;

use kube::runtime::watcher::ExponentialBackoff;

/// First wait after a failed (re)connect, before jitter.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// Longest wait between reconnect attempts, before jitter (at most twice this after).
pub const MAX_RETRY: Duration = Duration::from_secs(1);

/// The reconnect policy for `WatchStreamExt::backoff` (see the module docs).
pub fn reconnect_backoff() -> ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(FIRST_RETRY)
        .with_max_delay(MAX_RETRY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    #[test]
    fn waits_stay_between_first_and_twice_the_max_and_never_give_up() {
        let mut b = reconnect_backoff();
        let waits: Vec<Duration> = (0..50).map_while(|_| b.next()).collect();
        assert_eq!(waits.len(), 50, "never gives up");
        for w in &waits {
            assert!(*w >= FIRST_RETRY && *w <= 2 * MAX_RETRY, "{w:?}");
        }
        // Once at the cap, every wait is at least the cap.
        assert!(waits[10..].iter().all(|w| *w >= MAX_RETRY), "{waits:?}");
    }

    #[test]
    fn reset_starts_over_at_the_first_wait() {
        let mut b = reconnect_backoff();
        for _ in 0..10 {
            b.next();
        }
        b.reset();
        let w = b.next().expect("a wait");
        assert!(w >= FIRST_RETRY && w <= 2 * FIRST_RETRY, "{w:?}");
    }
}
