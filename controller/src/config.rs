//! Command line of the controller. Every flag can also come from the environment.

use clap::Parser;
use shared::consts::LEADER_ELECTION_LEASE_NAME;
use shared::telemetry::RuntimeFlags;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "nmo-controller",
    version,
    about = "Reconciles NodeMaintenance objects: takes the node's medik8s lease, excludes it from \
             remediation, cordons and taints it, drains it through the Eviction API, and gives it \
             back when the NodeMaintenance is deleted."
)]
pub struct Config {
    #[command(flatten)]
    pub runtime: RuntimeFlags,

    /// Elect a leader among replicas through a Lease; only the leader reconciles and writes status.
    #[arg(long, env = "LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,

    /// Name of the leader election Lease (upstream's name, so an upgrade never runs two leaders).
    #[arg(long, env = "LEADER_ELECTION_ID", default_value = LEADER_ELECTION_LEASE_NAME)]
    pub leader_election_id: String,

    /// Namespace of the leader election Lease (defaults to the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "nmo-system")]
    pub leader_election_namespace: String,

    /// At most this many nodes are in maintenance at once; the others wait in creation order
    /// with phase Pending. 0 means no limit (upstream's behaviour).
    #[arg(long, env = "MAX_CONCURRENT_MAINTENANCES", default_value_t = 1)]
    pub max_concurrent_maintenances: usize,

    /// Eviction requests in flight at once per NodeMaintenance.
    #[arg(long, env = "MAX_CONCURRENT_EVICTIONS", default_value_t = 32)]
    pub max_concurrent_evictions: usize,

    /// Only handle NodeMaintenances whose labels match this selector (e.g. "shard=a").
    /// Empty handles all. Slots are counted among the matching ones.
    #[arg(long, env = "NODEMAINTENANCE_SELECTOR", default_value = "")]
    pub nodemaintenance_selector: String,

    /// Namespace of the per-node medik8s leases (upstream reads LEASE_NAMESPACE).
    #[arg(long, env = "LEASE_NAMESPACE", default_value = shared::consts::LEASE_NAMESPACE_DEFAULT)]
    pub lease_namespace: String,
}
