//! The last answer of a slow lookup (the firing alerts, the node list),
//! kept for a while and fetched by one task at a time, for the controller's
//! gates and the webhook's warnings alike. A caller finding no fresh answer
//! starts the fetch in a task of its own (unless one runs) and waits for it
//! until its own deadline; the answer serves whoever asks next, so a storm
//! of callers asks once, and an answer slower than one caller's deadline
//! still serves the callers after it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::rules::sync::LockExt;
use crate::rules::ttl::TtlCache;

/// One lookup's last answer, used for `fresh_for`.
pub struct RecentAnswer<T> {
    answer: Mutex<TtlCache<(), T>>,
    fresh_for: Duration,
    running: AtomicBool,
    done: Notify,
}

impl<T: Clone + Send + 'static> RecentAnswer<T> {
    pub fn new(fresh_for: Duration) -> Self {
        RecentAnswer {
            answer: Mutex::new(TtlCache::new(1)),
            fresh_for,
            running: AtomicBool::new(false),
            done: Notify::new(),
        }
    }

    fn fresh(&self) -> Option<T> {
        self.answer
            .locked()
            .get(&(), Instant::now().into_std())
            .cloned()
    }

    /// The kept answer, else the one `fetch` (or a fetch under way) gives by
    /// `deadline`; `None` when none came in time.
    pub async fn get<F>(self: &Arc<Self>, deadline: Instant, fetch: F) -> Option<T>
    where
        F: Future<Output = T> + Send + 'static,
    {
        // Registered before looking, so a fetch ending meanwhile wakes it.
        let done = self.done.notified();
        if let Some(answer) = self.fresh() {
            return Some(answer);
        }
        if !self.running.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move {
                let _running = Running(&me);
                let answer = fetch.await;
                let now = Instant::now().into_std();
                me.answer.locked().insert((), answer, me.fresh_for, now);
            });
        }
        let _ = tokio::time::timeout_at(deadline, done).await;
        self.fresh()
    }
}

/// Marks the fetch of a [`RecentAnswer`] ended, even when it panicked.
struct Running<'a, T>(&'a RecentAnswer<T>);

impl<T> Drop for Running<'_, T> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0.done.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A fetch slower than one create's deadline carries on; creates meanwhile
    /// join it, and the answer serves the next ones: one fetch for all.
    #[tokio::test(start_paused = true)]
    async fn one_fetch_serves_the_creates_after_it() {
        let answer = Arc::new(RecentAnswer::<u32>::new(Duration::from_secs(5)));
        let fetches = Arc::new(AtomicUsize::new(0));
        let fetch = |value: u32, takes: Duration| {
            let fetches = fetches.clone();
            async move {
                fetches.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(takes).await;
                value
            }
        };
        let soon = Instant::now() + Duration::from_millis(20);
        let slow = fetch(7, Duration::from_millis(100));
        assert_eq!(answer.get(soon, slow).await, None, "past its deadline");
        let later = Instant::now() + Duration::from_secs(2);
        let (a, b) = tokio::join!(
            answer.get(later, fetch(8, Duration::ZERO)),
            answer.get(later, fetch(9, Duration::ZERO))
        );
        assert_eq!((a, b), (Some(7), Some(7)), "joined the fetch under way");
        assert_eq!(answer.get(later, fetch(10, Duration::ZERO)).await, Some(7));
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }
}
