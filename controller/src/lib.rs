//! nmo-controller's modules; main.rs wires them together.

pub mod classify;
pub mod clock;
pub mod conditions;
pub mod config;
pub mod conflicts;
pub mod drain;
pub mod drain_wakes;
pub mod events;
pub mod fleet;
pub mod leadership;
pub mod load_balancers;
pub mod metrics;
pub mod node;
pub mod node_cache;
pub mod node_lease;
pub mod own_writes;
pub mod plan;
pub mod queue_metrics;
pub mod reconcile;
pub mod serving;
pub mod watches;
