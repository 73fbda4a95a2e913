//! While the PodDisruptionBudget watch reconnects, the PDBs are listed.
//!
//! A restarted API server answers lists at once (a consistent list goes to
//! etcd while its watch cache is still filling) but holds a resumed watch
//! until that cache is ready, a second or more after it reports healthy;
//! only then does the 410 come that makes the watch list again. A PDB
//! deleted in that gap (an operator lifting a blocker as soon as the API
//! server is back) would wait for it, or for the drain's 5 s poll. So from
//! the watch's first error until it delivers again, one cluster-wide PDB list
//! runs every [`POLL_EVERY`], for at most [`POLL_FOR`], and only while a
//! drain waits for a pod: a PDB gone or now allowing a disruption wakes the
//! drains of its namespace at once, as the watch's own events do.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use kube::api::ListParams;
use kube::{Api, Client};
use shared::kube::partial::PdbView;
use tokio::time::Instant;

use crate::watches::LIST_PAGE;

/// How often the PDBs are listed while their watch reconnects.
pub const POLL_EVERY: Duration = Duration::from_millis(200);
/// For how long after the watch's first error at most (a watch that resumed
/// without a 410 may deliver nothing for minutes in a quiet cluster).
pub const POLL_FOR: Duration = Duration::from_secs(30);

type Listing = BoxFuture<'static, kube::Result<Vec<PdbView>>>;

/// The watch's deafness and the one list in flight.
#[derive(Default)]
pub struct DeafPoll {
    /// The watch's first error since its last event.
    since: Option<Instant>,
    in_flight: FuturesUnordered<Listing>,
}

impl DeafPoll {
    /// The watch failed: from now on it may miss what changes.
    pub fn watch_failed(&mut self, now: Instant) {
        self.since.get_or_insert(now);
    }

    /// The watch delivered: it is current again, and a list still in flight
    /// is older than what it says.
    pub fn watch_delivered(&mut self) {
        self.since = None;
        if self.listing() {
            self.in_flight = FuturesUnordered::new();
        }
    }

    /// Whether the watch is deaf (the poll's tick runs only then).
    pub fn deaf(&self) -> bool {
        self.since.is_some()
    }

    /// Start a list if the watch is deaf, has not been for too long, no list
    /// is in flight, and `someone_waits` (a drain waits for a pod).
    pub fn tick(&mut self, now: Instant, someone_waits: bool, client: &Client) {
        if due(self.since, now, someone_waits, self.listing()) {
            let api = Api::<PdbView>::all(client.clone());
            self.in_flight.push(list_all(api).boxed());
        }
    }

    /// The next finished list (pending forever while none is in flight:
    /// guard its `select!` branch with [`DeafPoll::listing`]).
    pub async fn listed(&mut self) -> Option<kube::Result<Vec<PdbView>>> {
        self.in_flight.next().await
    }

    pub fn listing(&self) -> bool {
        !self.in_flight.is_empty()
    }
}

/// Whether a list starts now: the watch deaf `since` then, not for
/// [`POLL_FOR`] yet, a drain waiting, no list in flight.
fn due(since: Option<Instant>, now: Instant, someone_waits: bool, listing: bool) -> bool {
    let deaf_for = since.map(|t| now.saturating_duration_since(t));
    deaf_for.is_some_and(|d| d < POLL_FOR) && someone_waits && !listing
}

/// Every PDB, page by page, read fresh (no resourceVersion: not from a
/// watch cache that may still be filling).
async fn list_all(api: Api<PdbView>) -> kube::Result<Vec<PdbView>> {
    let mut all = Vec::new();
    let mut lp = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = api.list(&lp).await?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(all),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_due_only_while_deaf_briefly_and_someone_waits() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let cases = [
            ("watch current", None, s(1), true, false, false),
            ("deaf, a drain waits", Some(t0), s(1), true, false, true),
            ("deaf just now", Some(t0), s(0), true, false, true),
            ("deaf, nobody waits", Some(t0), s(1), false, false, false),
            ("a list in flight", Some(t0), s(1), true, true, false),
            ("deaf too long", Some(t0), POLL_FOR, true, false, false),
        ];
        for (name, since, after, waits, listing, want) in cases {
            assert_eq!(due(since, t0 + after, waits, listing), want, "{name}");
        }
    }

    #[tokio::test]
    async fn deaf_from_the_first_error_until_the_watch_delivers() {
        let mut p = DeafPoll::default();
        assert!(!p.deaf());
        let t0 = Instant::now();
        p.watch_failed(t0);
        p.watch_failed(t0 + Duration::from_secs(5));
        assert_eq!(p.since, Some(t0), "the first error counts");
        assert!(p.deaf());
        p.watch_delivered();
        assert!(!p.deaf());
        assert!(!p.listing());
    }
}
