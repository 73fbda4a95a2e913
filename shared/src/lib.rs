//! Types and rules shared by the nmo-rs controller and webhook.
//!
//! Nothing in here talks to the API server: it is the NodeMaintenance API, the
//! constants of the upstream compatibility contract, and pure functions over
//! plain data (lease validity, the etcd quorum rule, node roles), plus the
//! telemetry and probe plumbing both binaries start the same way.

pub mod consts;
pub mod crd;
pub mod duration;
pub mod goflags;
pub mod https;
pub mod kube_client;
pub mod lean;
pub mod lease;
pub mod logwriter;
pub mod metrics_auth;
pub mod metrics_server;
pub mod namespace;
pub mod nodes;
pub mod probes;
pub mod quorum;
pub mod shutdown;
pub mod slots;
pub mod telemetry;
pub mod tls;
pub mod version;
pub mod watch;
pub mod zap;

pub use crd::{
    DrainTimeoutAction, MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec,
    NodeMaintenanceStatus, PodReference,
};
