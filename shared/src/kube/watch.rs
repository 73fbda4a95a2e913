//! How every watch of the controller and the webhook reconnects after the API
//! server went away (restart, upgrade, etcd outage): each webhook cache's
//! watch through `WatchStreamExt::backoff`, the controller's watches through
//! its `Controller::trigger_backoff` (which pauses them all after an error).
//!
//! Every watch goes through [`reconnecting`], which waits by what failed
//! ([`retry_after`]): nothing after a 410 (list again now), a steady
//! 0.1-0.2 s while the API server does not answer at all (so a restarted
//! one is met at once), 0.2-0.4 s while it refuses (401/403 from an
//! authorizer still warming up, ten times), and the doubling below once it
//! answers with another error. [`reconnect_backoff`] is that doubling as a kube `Backoff`, for
//! the Controller's trigger pause, which our watches never reach (they
//! hand it no errors).
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

use futures::{Stream, StreamExt as _};
use kube::runtime::watcher::{self, ExponentialBackoff};

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

/// Why a watch attempt failed, as far as when to try again goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 410 Gone: the API server no longer holds our position; the watcher
    /// lists again on its next poll, at once (nothing to wait for).
    Gone,
    /// No answer (connection refused or reset, TLS, timeout): the API
    /// server is down or restarting. Trying costs it nothing, so tries
    /// come often and a restarted API server is met within a fraction of
    /// a second.
    Unreachable,
    /// 401 or 403: after a restart the API server answers before its
    /// authorizer has caught up, for a second or two; tried again every
    /// 0.2-0.4 s [`REFUSED_FAST_TRIES`] times, then as [`Failure::Answered`]
    /// (a grant really missing is not hammered).
    Refused,
    /// The API server answered with another error (5xx, 429, ...): the
    /// usual doubling wait.
    Answered,
}

/// Quick tries after a refusal (see [`Failure::Refused`]).
pub const REFUSED_FAST_TRIES: u32 = 10;

/// What kind of failure `e` is.
pub fn failure(e: &watcher::Error) -> Failure {
    let of_client = |e: &kube::Error| match e {
        kube::Error::Api(s) if s.code == 410 => Failure::Gone,
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Failure::Refused,
        kube::Error::Api(_) => Failure::Answered,
        _ => Failure::Unreachable,
    };
    match e {
        watcher::Error::WatchError(s) if s.code == 410 => Failure::Gone,
        watcher::Error::WatchError(s) if s.code == 401 || s.code == 403 => Failure::Refused,
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => Failure::Answered,
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => of_client(e),
    }
}

/// Longest wait between tries of an unreachable API server, before jitter.
pub const UNREACHABLE_RETRY: Duration = Duration::from_millis(100);

/// The wait before the next try after `streak` failures in a row (1 for
/// the first), the last one `f`, before jitter.
pub fn retry_after(f: Failure, streak: u32) -> Duration {
    match f {
        Failure::Gone => Duration::ZERO,
        Failure::Unreachable => UNREACHABLE_RETRY,
        Failure::Refused if streak <= REFUSED_FAST_TRIES => 2 * FIRST_RETRY,
        Failure::Refused => retry_after(Failure::Answered, streak - REFUSED_FAST_TRIES),
        Failure::Answered => {
            let doublings = streak.saturating_sub(1).min(16);
            FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
        }
    }
}

/// `watch` with its errors paced by [`retry_after`] (each wait stretched
/// by a random 0-100 % so replicas do not reconnect in lockstep): after a
/// failure the next poll of `watch` waits; anything delivered starts the
/// count over. The errors themselves are passed on, for the caller's log.
pub fn reconnecting<S, T>(watch: S) -> impl Stream<Item = watcher::Result<T>> + Send + 'static
where
    S: Stream<Item = watcher::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let state = (watch.boxed(), 0u32, Duration::ZERO);
    futures::stream::unfold(state, |(mut watch, streak, wait)| async move {
        if !wait.is_zero() {
            tokio::time::sleep(wait.mul_f64(1.0 + rand::random::<f64>())).await;
        }
        let item = watch.next().await?;
        let (streak, wait) = match &item {
            Ok(_) => (0, Duration::ZERO),
            Err(e) => {
                let streak = streak.saturating_add(1);
                (streak, retry_after(failure(e), streak))
            }
        };
        Some((item, (watch, streak, wait)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("test", "Test").with_code(code),
        ))
    }

    #[test]
    fn failures_and_their_waits() {
        let gone = watcher::Error::WatchError(Box::new(
            kube::core::Status::failure("too old", "Expired").with_code(410),
        ));
        let cases: Vec<(&str, watcher::Error, Failure, [u64; 3])> = vec![
            ("410 during a watch", gone, Failure::Gone, [0, 0, 0]),
            (
                "410 on a list",
                watcher::Error::InitialListFailed(api(410)),
                Failure::Gone,
                [0, 0, 0],
            ),
            (
                "403 while the authorizer warms up",
                watcher::Error::WatchStartFailed(api(403)),
                Failure::Refused,
                [200, 200, 200],
            ),
            (
                "500",
                watcher::Error::WatchFailed(api(500)),
                Failure::Answered,
                [100, 200, 400],
            ),
            (
                "no HTTP answer (a client-side error)",
                watcher::Error::InitialListFailed(kube::Error::LinesCodecMaxLineLengthExceeded),
                Failure::Unreachable,
                [100, 100, 100],
            ),
        ];
        for (name, e, want, waits) in cases {
            let f = failure(&e);
            assert_eq!(f, want, "{name}");
            let got: Vec<u64> = (1..=3)
                .map(|n| retry_after(f, n).as_millis() as u64)
                .collect();
            assert_eq!(got, waits, "{name}");
        }
        assert_eq!(retry_after(Failure::Answered, 50), MAX_RETRY, "capped");
        assert_eq!(
            retry_after(Failure::Refused, REFUSED_FAST_TRIES + 1),
            FIRST_RETRY,
            "then doubling"
        );
        assert_eq!(retry_after(Failure::Refused, 60), MAX_RETRY);
    }

    #[tokio::test]
    async fn a_gone_watch_lists_again_at_once_and_successes_reset_the_count() {
        let items = vec![
            Err(watcher::Error::WatchError(Box::new(
                kube::core::Status::failure("old", "Expired").with_code(410),
            ))),
            Ok(1),
            Err(watcher::Error::WatchStartFailed(api(403))),
            Ok(2),
        ];
        let start = tokio::time::Instant::now();
        let got: Vec<bool> = reconnecting(futures::stream::iter(items))
            .map(|r| r.is_ok())
            .collect()
            .await;
        assert_eq!(got, [false, true, false, true], "errors passed on");
        let took = start.elapsed();
        // Only the 403 waits (200-400 ms); the 410 none.
        assert!(
            took >= 2 * FIRST_RETRY && took < 5 * FIRST_RETRY,
            "{took:?}"
        );
    }

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
