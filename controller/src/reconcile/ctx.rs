//! What every reconcile shares: the API clients, the caches that bridge
//! the watch cache's lag, the drain's shared state, metrics and settings.

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use shared::{NodeMaintenance, rules::slots};
use std::time::Duration;

use super::Error;
use crate::clock::Clock;
use crate::conflicts::ConflictStreaks;
use crate::drain::Drainer;
use crate::drain_wakes::WatchedNodes;
use crate::events::Events;
use crate::fleet::Fleet;
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use crate::node_cache::NodeCache;
use crate::node_lease::NodeLeases;
use crate::own_writes::OwnWrites;

pub struct Ctx {
    pub client: Client,
    pub store: Store<NodeMaintenance>,
    pub events: Events,
    pub metrics: Metrics,
    pub leases: NodeLeases,
    /// Pod lists, evictions, and what they keep across rounds.
    pub drainer: Drainer,
    pub max_concurrent_maintenances: usize,
    pub leadership: Leadership,
    /// Conflicts in a row per NodeMaintenance (see `error_policy`).
    pub conflicts: ConflictStreaks,
    /// Our last write of each NodeMaintenance (read-your-writes).
    pub own_writes: OwnWrites,
    /// When to look again while something blocks (--blocked-retry-interval).
    pub blocked_retry: Duration,
    /// The nodes of the maintenances, as the node watch sees them.
    pub node_cache: NodeCache,
    /// The nodes whose pods' departures are watched (`drain_wakes`).
    pub departures_watched: WatchedNodes,
    /// `--allow-force-drain`: whether drainTimeoutAction Force may delete pods.
    pub allow_force_drain: bool,
    /// Slot admissions decided here that the cache may not show yet.
    pub admissions: slots::Admissions,
    /// `--node-lifecycle-conditions`: write KEP-5683 conditions on the nodes.
    pub node_lifecycle_conditions: bool,
    /// The node lifecycle conditions last written per node.
    pub node_signals: super::NodeSignals,
    /// The fleet gates and what they read (nodes, alerts).
    pub fleet: Fleet,
    /// `--exclude-from-load-balancers`: the wait before the first eviction
    /// (`--load-balancer-drain-delay`); None: traffic is not shed first.
    pub shed_traffic: Option<Duration>,
    /// The time every decision of a pass reads (set by unit tests).
    pub clock: Clock,
}

impl Ctx {
    pub fn new(
        cfg: &crate::config::Config,
        clients: crate::serving::Clients,
        store: Store<NodeMaintenance>,
        metrics: Metrics,
        leadership: &Leadership,
        fleet: Fleet,
        drain_rules: crate::drain::DrainRules,
    ) -> Ctx {
        let client = clients.api;
        Ctx {
            events: Events::new(client.clone(), crate::leadership::instance_name()),
            leases: NodeLeases::new(client.clone(), cfg.lease_namespace.clone()),
            drainer: Drainer::new(
                client.clone(),
                clients.evict,
                cfg.max_concurrent_evictions,
                cfg.migration_warning_after,
                drain_rules,
            ),
            client,
            store,
            metrics,
            max_concurrent_maintenances: cfg.max_concurrent_maintenances,
            leadership: leadership.clone(),
            conflicts: ConflictStreaks::default(),
            own_writes: OwnWrites::default(),
            blocked_retry: cfg.blocked_retry_interval,
            node_cache: NodeCache::default(),
            departures_watched: WatchedNodes::default(),
            allow_force_drain: cfg.allow_force_drain,
            admissions: slots::Admissions::default(),
            node_lifecycle_conditions: cfg.node_lifecycle_conditions,
            node_signals: super::NodeSignals::default(),
            fleet,
            shed_traffic: cfg.drain.shed_traffic(),
            clock: Clock::system(),
        }
    }

    /// This context reading the time from `clock` (unit tests set one).
    pub fn with_clock(mut self, clock: Clock) -> Ctx {
        self.leases.clock = clock.clone();
        self.drainer.clock = clock.clone();
        self.clock = clock;
        self
    }

    /// NodeMaintenance `name` is gone (whoever removed its finalizer): drop
    /// what was kept for it, and the cached nodes no maintenance names.
    pub fn forget_maintenance(&self, name: &str) {
        self.own_writes.forget(name);
        self.conflicts.clear(name);
        self.admissions.forget(name);
        let named: std::collections::HashSet<String> = self
            .store
            .state()
            .iter()
            .map(|nm| nm.spec.node_name.clone())
            .collect();
        self.node_cache.retire_unnamed(&named);
        self.node_signals.retire_unnamed(&named);
        self.leases.forget_unnamed(&named);
    }

    /// We wrote NodeMaintenance `name` from version `based_on` and got
    /// `written` back. The watch may have delivered it already (then
    /// [`Ctx::cache_saw`] found nothing to drop): the cache decides.
    pub(super) fn wrote(&self, name: &str, based_on: Option<&str>, written: &NodeMaintenance) {
        self.own_writes.wrote(name, based_on, written);
        if let Some(cached) = self
            .store
            .get(&kube::runtime::reflector::ObjectRef::new(name))
        {
            self.own_writes.seen(&cached);
        }
    }

    /// The NodeMaintenance watch delivered `nm` (the cache holds it now):
    /// drop what only bridged the cache's lag.
    pub fn cache_saw(&self, nm: &NodeMaintenance) {
        self.own_writes.seen(nm);
        self.admissions.seen(
            &nm.name_any(),
            nm.status.as_ref().and_then(|s| s.phase.as_ref()),
        );
    }

    /// What this process keeps in memory per maintenance or node, by store
    /// (`nmo_controller_kept_entries`): each goes back to 0 once no
    /// maintenance of this controller is left.
    pub fn kept_entries(&self) -> [(&'static str, usize); 7] {
        [
            ("node_cache", self.node_cache.len()),
            ("own_writes", self.own_writes.len()),
            ("conflict_streaks", self.conflicts.len()),
            ("node_leases", self.leases.kept()),
            ("departures_watched", self.departures_watched.len()),
            ("admissions", self.admissions.len()),
            ("node_conditions", self.node_signals.len()),
        ]
    }

    /// `nmo_nodemaintenance_waiting`: the waiting maintenances in the cache
    /// by the reason of their `Queued` condition, every reason listed.
    pub fn waiting(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = crate::conditions::WAITING_LABELS
            .iter()
            .map(|l| (*l, 0))
            .collect();
        for nm in self.store.state() {
            let conditions = nm.status.as_ref().map(|s| s.conditions.as_slice());
            if let Some(label) = conditions.and_then(crate::conditions::waiting_label)
                && let Some(entry) = counts.iter_mut().find(|(l, _)| *l == label)
            {
                entry.1 += 1;
            }
        }
        counts
    }

    /// NodeMaintenance `name` as the API server has it now (None: gone).
    pub(super) async fn read_live(&self, name: &str) -> Result<Option<NodeMaintenance>, Error> {
        self.nms()
            .get_opt(name)
            .await
            .map_err(|source| Error::NodeMaintenance {
                action: "read",
                name: name.to_string(),
                source,
            })
    }

    /// The node, from the node cache when a reconcile read it before (the
    /// watch keeps it current), else live. Only a live read says a node is
    /// gone.
    pub(super) async fn read_node(&self, name: &str) -> Result<Option<Node>, Error> {
        if let Some(node) = self.node_cache.get(name) {
            return Ok(Some(node));
        }
        let node = self
            .nodes()
            .get_opt(name)
            .await
            .map_err(|source| Error::Node {
                action: "read",
                node: name.to_string(),
                source,
            })?;
        if let Some(node) = &node {
            self.node_cache.put(node);
            if self.node_lifecycle_conditions {
                self.node_signals.read(node);
            }
        }
        Ok(node)
    }

    pub(super) fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.client.clone())
    }

    pub(super) fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }
}
