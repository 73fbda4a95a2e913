//! Types, rules and plumbing shared by the nmo-rs controller and webhook, in
//! four parts (one flat module list for now; issue 23 gives them folders):
//!
//! - the API: [`crd`] (the NodeMaintenance type), [`consts`] (names of the
//!   upstream contract), [`version`];
//! - pure rules over plain data, no I/O: [`lease`], [`quorum`], [`slots`],
//!   [`duration`], [`nodes`], [`ttl`] (a cache whose entries expire);
//! - API plumbing, which does talk to the API server: [`kube_client`]
//!   (clients), [`lean`] (partial decodes of big objects), [`watch`]
//!   (reconnect back-off), [`namespace`], and [`metrics_auth`] (TokenReview
//!   and SubjectAccessReview for /metrics);
//! - service plumbing both binaries start the same way: [`tls`], [`https`],
//!   [`probes`], [`metrics_server`], [`series`] (Prometheus series as a
//!   table), [`telemetry`], [`logwriter`], [`zap`], [`goflags`],
//!   [`shutdown`].

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
pub mod series;
pub mod shutdown;
pub mod slots;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod ttl;
pub mod version;
pub mod watch;
pub mod zap;

pub use crd::{
    DrainTimeoutAction, MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec,
    NodeMaintenanceStatus, PodReference,
};
