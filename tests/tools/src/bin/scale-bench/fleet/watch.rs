//! The bench's NodeMaintenances as one watch sees them, event by event: how
//! many hold a node at once per zone and in total (Running or Succeeded, its
//! deletion included, as the gates count them), how many wait and why (the
//! reason of their `Queued` condition), and when each first reached
//! Succeeded. Every event is looked at, in the order the API server sent
//! them, so "the most at once" is exact for what the watch delivered; a
//! re-list (after an API server restart) replaces the view at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use shared::{MaintenancePhase, NodeMaintenance};

use crate::BENCH_LABEL;

/// The controller's condition type for a maintenance held back (by a gate,
/// or for a slot: reason `WaitingForSlot`).
const QUEUED: &str = "Queued";
/// At most this many violations are kept, with what was seen.
const KEEP_VIOLATIONS: usize = 5;

/// One NodeMaintenance, as far as the figures care.
#[derive(Debug, Clone)]
pub struct Nm {
    pub node: String,
    pub phase: Option<MaintenancePhase>,
    /// The reason of its `Queued` condition while that is True.
    pub queued: Option<String>,
    pub deleting: bool,
    /// status.evictionPods.
    pub evictions: usize,
}

impl Nm {
    pub fn of(nm: &NodeMaintenance) -> Nm {
        let status = nm.status.as_ref();
        Nm {
            node: nm.spec.node_name.clone(),
            phase: nm.phase().cloned(),
            queued: status
                .and_then(|s| {
                    s.conditions
                        .iter()
                        .find(|c| c.type_ == QUEUED && c.status == "True")
                })
                .map(|c| c.reason.clone()),
            deleting: nm.metadata.deletion_timestamp.is_some(),
            evictions: status.map_or(0, |s| usize::try_from(s.eviction_pods).unwrap_or(0)),
        }
    }

    /// It holds its node (and its zone's turn) from the start until it is
    /// gone: phase Running or Succeeded, deletion included.
    pub fn holds(&self) -> bool {
        matches!(
            self.phase,
            Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
        )
    }
}

/// What the gates were given: at most this many at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub per_zone: usize,
    pub total: usize,
}

/// The view now and the figures so far.
#[derive(Debug, Default)]
pub struct Seen {
    pub now: HashMap<String, Nm>,
    pub most_per_zone: usize,
    pub most_total: usize,
    /// The most waiting at once, and by reason at that moment.
    pub most_waiting: usize,
    pub waiting_at_peak: BTreeMap<String, usize>,
    /// The most waiting at once for each reason on its own.
    pub most_by_reason: BTreeMap<String, usize>,
    pub first_seen: HashMap<String, Instant>,
    pub succeeded: HashMap<String, Instant>,
    pub failed: BTreeSet<String>,
    /// status.evictionPods of each, as last seen.
    pub evictions: HashMap<String, usize>,
    /// The first few moments a limit was exceeded, with what held nodes then.
    pub violations: Vec<String>,
    pub relists: usize,
}

impl Seen {
    /// `name` is now `nm` (None: gone); then the figures are brought up to date.
    pub fn apply(&mut self, name: &str, nm: Option<Nm>, at: Instant) {
        match nm {
            Some(nm) => {
                self.note(name, &nm, at);
                self.now.insert(name.to_string(), nm);
            }
            None => {
                self.now.remove(name);
            }
        }
    }

    /// A fresh list replaces the view.
    pub fn replace(&mut self, all: Vec<(String, Nm)>, at: Instant) {
        self.relists += 1;
        self.now.clear();
        for (name, nm) in all {
            self.note(&name, &nm, at);
            self.now.insert(name, nm);
        }
    }

    fn note(&mut self, name: &str, nm: &Nm, at: Instant) {
        self.first_seen.entry(name.to_string()).or_insert(at);
        match nm.phase {
            Some(MaintenancePhase::Succeeded) => {
                self.succeeded.entry(name.to_string()).or_insert(at);
            }
            Some(MaintenancePhase::Failed) => {
                self.failed.insert(name.to_string());
            }
            _ => {}
        }
        if nm.evictions > 0 {
            self.evictions.insert(name.to_string(), nm.evictions);
        }
    }

    /// Count what holds a node per zone and in total, and what waits; keep
    /// the most seen and any moment beyond `limits`.
    pub fn record(&mut self, limits: Limits, zones: &HashMap<String, String>) {
        let mut per_zone: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
        for (name, nm) in &self.now {
            if nm.holds() {
                let zone = zones.get(&nm.node).map_or("(no zone)", String::as_str);
                per_zone.entry(zone).or_default().push(name);
            } else if let Some(reason) = &nm.queued {
                *waiting.entry(reason.clone()).or_default() += 1;
            }
        }
        let total: usize = per_zone.values().map(Vec::len).sum();
        let busiest = per_zone.iter().max_by_key(|(_, v)| v.len());
        let most_in_a_zone = busiest.map_or(0, |(_, v)| v.len());
        self.most_total = self.most_total.max(total);
        self.most_per_zone = self.most_per_zone.max(most_in_a_zone);
        if self.violations.len() < KEEP_VIOLATIONS {
            if let Some((zone, names)) = busiest.filter(|(_, v)| v.len() > limits.per_zone) {
                let mut names = names.clone();
                names.sort_unstable();
                self.violations
                    .push(format!("{} at once in {zone}: {names:?}", names.len()));
            }
            if total > limits.total {
                self.violations
                    .push(format!("{total} at once in total (limit {})", limits.total));
            }
        }
        for (reason, n) in &waiting {
            let most = self.most_by_reason.entry(reason.clone()).or_default();
            *most = (*most).max(*n);
        }
        let waiting_now: usize = waiting.values().sum();
        if waiting_now > self.most_waiting {
            self.most_waiting = waiting_now;
            self.waiting_at_peak = waiting;
        }
    }
}

/// The watch, in the background, and a signal on every change.
pub struct FleetWatch {
    seen: Arc<Mutex<Seen>>,
    changed: tokio::sync::watch::Receiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FleetWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FleetWatch {
    /// Watch the bench's NodeMaintenances; `zones` maps node -> zone.
    pub fn start(
        client: Client,
        zones: Arc<HashMap<String, String>>,
        limits: Limits,
    ) -> FleetWatch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = tokio::sync::watch::channel(());
        let api: Api<NodeMaintenance> = Api::all(client);
        let cfg = watcher::Config::default().labels(BENCH_LABEL);
        let shared = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, cfg).default_backoff());
            let mut listing: Option<Vec<(String, Nm)>> = None;
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let at = Instant::now();
                let Ok(mut seen) = shared.lock() else { return };
                match event {
                    watcher::Event::Init => listing = Some(Vec::new()),
                    watcher::Event::InitApply(nm) => {
                        if let Some(l) = listing.as_mut() {
                            l.push((nm.name_any(), Nm::of(&nm)));
                        }
                    }
                    watcher::Event::InitDone => {
                        seen.replace(listing.take().unwrap_or_default(), at);
                    }
                    watcher::Event::Apply(nm) => seen.apply(&nm.name_any(), Some(Nm::of(&nm)), at),
                    watcher::Event::Delete(nm) => seen.apply(&nm.name_any(), None, at),
                }
                if listing.is_none() {
                    seen.record(limits, &zones);
                    drop(seen);
                    tx.send_replace(());
                }
            }
        });
        FleetWatch {
            seen,
            changed,
            task,
        }
    }

    /// Read the view and the figures.
    pub fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        match self.seen.lock() {
            Ok(seen) => f(&seen),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    /// Wait for the next change, at most `wait` (a pace for progress lines
    /// and retries, never a synchronisation: the caller looks again).
    pub async fn next_change(&mut self, wait: std::time::Duration) {
        let _ = tokio::time::timeout(wait, self.changed.changed()).await;
    }

    /// Wait for the first list.
    pub async fn listed_within(&self, deadline: std::time::Duration) -> anyhow::Result<()> {
        nmo_tests::wait::until(
            "the bench's watch of NodeMaintenances to list",
            deadline,
            || async {
                Ok(match self.with(|s| s.relists) {
                    0 => nmo_tests::wait::Poll::Pending("no list yet".into()),
                    _ => nmo_tests::wait::Poll::Ready(()),
                })
            },
        )
        .await
    }

    /// The figures so far; the view starts again empty (until the next event).
    pub fn take(&self) -> Seen {
        match self.seen.lock() {
            Ok(mut seen) => std::mem::take(&mut *seen),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nm(node: &str, phase: Option<MaintenancePhase>, queued: Option<&str>) -> Nm {
        Nm {
            node: node.into(),
            phase,
            queued: queued.map(Into::into),
            deleting: false,
            evictions: 0,
        }
    }

    fn zones() -> HashMap<String, String> {
        [("a1", "zone-0"), ("a2", "zone-0"), ("b1", "zone-1")]
            .into_iter()
            .map(|(n, z)| (n.to_string(), z.to_string()))
            .collect()
    }

    const LIMITS: Limits = Limits {
        per_zone: 1,
        total: 2,
    };

    #[test]
    fn counts_holders_per_zone_and_waiters_by_reason() {
        let mut s = Seen::default();
        let t = Instant::now();
        let running = Some(MaintenancePhase::Running);
        let pending = Some(MaintenancePhase::Pending);
        s.apply("x", Some(nm("a1", running.clone(), None)), t);
        s.apply("y", Some(nm("a2", pending.clone(), Some("ZoneBudget"))), t);
        s.apply("z", Some(nm("b1", pending, Some("MaxUnavailable"))), t);
        s.record(LIMITS, &zones());
        assert_eq!((s.most_per_zone, s.most_total, s.most_waiting), (1, 1, 2));
        assert_eq!(s.waiting_at_peak.get("ZoneBudget"), Some(&1));
        assert!(s.violations.is_empty(), "{:?}", s.violations);
        // y starts while x (Succeeded, being deleted) still holds zone-0.
        let mut done = nm("a1", Some(MaintenancePhase::Succeeded), None);
        done.deleting = true;
        s.apply("x", Some(done), t);
        s.apply("y", Some(nm("a2", running, None)), t);
        s.record(LIMITS, &zones());
        assert_eq!(s.most_per_zone, 2);
        assert!(s.succeeded.contains_key("x"));
        assert_eq!(s.violations.len(), 1, "{:?}", s.violations);
        assert!(s.violations[0].contains("zone-0"), "{:?}", s.violations);
        // Gone: the zone is free again, the most seen stays.
        s.apply("x", None, t);
        s.record(LIMITS, &zones());
        assert_eq!((s.most_per_zone, s.now.len()), (2, 2));
    }

    #[test]
    fn a_relist_replaces_the_view() {
        let mut s = Seen::default();
        let t = Instant::now();
        s.apply(
            "old",
            Some(nm("a1", Some(MaintenancePhase::Running), None)),
            t,
        );
        s.replace(vec![("new".into(), nm("b1", None, None))], t);
        s.record(LIMITS, &zones());
        assert!(s.now.contains_key("new") && !s.now.contains_key("old"));
        assert_eq!(s.relists, 1);
    }
}
