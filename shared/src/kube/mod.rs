//! API plumbing, which does talk to the API server: clients, partial
//! decodes of big objects, watch reconnects, namespaces.

pub mod client;
pub mod drain_rules;
pub mod namespace;
pub mod partial;
pub mod watch;
