//! The integration tests against the local control plane (`make cluster-up`),
//! one test binary with a module per suite, so that the harness and its
//! dependencies are linked once rather than once per suite. What each suite
//! covers, and which stage of `make test` runs it: tests/README.md.
//!
//! A test's full name starts with its suite: `controller::full_cycle_...`.
//! `tests/run-tests.sh` runs one suite at a time, its tests in parallel
//! (`cargo test -p nmo-tests --test integration -- controller::`), as it ran
//! one binary per suite before: tests of one suite never touch each other's
//! objects, but suites were written to run one after the other. Some share
//! cluster-wide objects: `webhook::` simulates OpenShift for the whole plane
//! (namespace openshift-etcd, which it empties and deletes, and the
//! config.openshift.io CRD) while `troubleshooting::etcd_quorum` expects
//! openshift-etcd to hold its PDBs only. So run a suite, or single tests,
//! not the whole binary at once.
//!
//! The suites share one process: `nmo_tests::unique` (names stay unique: one
//! counter for the process), the kustomize render cache and the image unpack
//! lock are process-wide, and none of them holds anything specific to a suite.

mod arm64;
mod cert_manager;
mod cluster;
mod controller;
mod controller_metrics;
mod deployments;
mod drain_parity;
mod drain_rules;
mod drain_timeout;
mod gates;
mod kubevirt;
mod lease;
mod metrics_auth;
mod node_signals;
mod prometheus;
mod real_node;
mod refused_writes;
mod restarts;
mod resume;
mod status_events;
mod troubleshooting;
mod webhook;
mod webhook_warnings;
