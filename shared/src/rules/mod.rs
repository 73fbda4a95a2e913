//! Pure rules over plain data, no I/O: the medik8s lease rule, the etcd
//! quorum rule, maintenance slots, fleet gates and maintenance windows, Go
//! durations, node facts, and two small data helpers (an expiring cache, a
//! poison-tolerant lock).

pub mod duration;
pub mod gates;
pub mod lease;
pub mod nodes;
pub mod quorum;
pub mod slots;
pub mod sync;
pub mod ttl;
pub mod window;
