//! Waiting for a condition with a deadline, never sleeping as synchronisation:
//! poll, and on timeout fail with the last state seen.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll `check` every `every` until it returns `Ok(Some(v))` or `deadline` passes.
/// `check` returns `Ok(None)` (not yet) along with a description of what it saw
/// through `last`, or `Err` for a hard failure.
pub async fn until<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Poll<T>>>,
{
    let start = Instant::now();
    let every = Duration::from_millis(100);
    let mut last: String;
    loop {
        match check().await {
            Ok(Poll::Ready(v)) => return Ok(v),
            Ok(Poll::Pending(seen)) => last = seen,
            Err(e) => last = format!("error: {e:#}"),
        }
        if start.elapsed() > deadline {
            anyhow::bail!(
                "timed out after {:?} waiting for {what}; last seen: {last}",
                deadline
            );
        }
        tokio::time::sleep(every).await;
    }
}

/// One observation of a polled condition.
pub enum Poll<T> {
    Ready(T),
    /// Not yet, and what was seen instead.
    Pending(String),
}

/// Watch `check` stay true for `window`, failing as soon as it does not: for
/// a negative ("nothing more happens") no condition can signal, so a fixed
/// observation window is the assertion itself, not a synchronisation.
pub async fn stays<F, Fut>(what: &str, window: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let end = tokio::time::Instant::now() + window;
    while tokio::time::Instant::now() < end {
        if let Err(seen) = check().await {
            panic!("{what}: {seen}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
