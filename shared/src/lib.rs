//! Types, rules and plumbing shared by the nmo-rs controller and webhook, in
//! four parts, one folder each:
//!
//! - [`api`]: the NodeMaintenance type ([`api::crd`]), the names and messages
//!   of the upstream contract ([`api::consts`]), the build version;
//! - [`rules`]: pure rules over plain data, no I/O: the medik8s lease, the
//!   etcd quorum, maintenance slots, Go durations, node facts, an expiring
//!   cache and a poison-tolerant lock;
//! - [`kube`]: API plumbing, which does talk to the API server: clients,
//!   partial decodes of big objects ([`kube::partial`]), watch reconnects,
//!   namespaces;
//! - [`serve`]: what both binaries serve and start the same way: TLS with
//!   reloads, HTTPS, probes, secure metrics (serving, TokenReview and
//!   SubjectAccessReview, series declared as tables), telemetry and logs, Go
//!   flag syntax, shutdown.
//!
//! The types and rules are what "a types crate both services share" means:
//! nothing in `api` or `rules` performs I/O.

pub mod api;
pub mod kube;
pub mod rules;
pub mod serve;

pub use api::crd::{
    DrainTimeoutAction, MaintenancePhase, NodeMaintenance, NodeMaintenanceSpec,
    NodeMaintenanceStatus, PodReference,
};
