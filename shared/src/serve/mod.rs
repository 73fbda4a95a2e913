//! What both binaries serve and start the same way: TLS with reloads,
//! HTTPS, probes, secure metrics (serving, token and access reviews, series
//! declared as tables), telemetry and logs (zap's keys, panics as one line),
//! Go flag syntax, shutdown; the fleet gates' flags and the alert gate's reader.

pub mod alert_source;
pub mod drain_flags;
pub mod gate_flags;
pub mod goflags;
pub mod https;
pub mod logwriter;
pub mod metrics_auth;
pub mod metrics_server;
pub mod panic_log;
pub mod probes;
pub mod recent;
pub mod series;
pub mod shutdown;
pub mod telemetry;
pub mod tls;
pub mod zap;
pub mod zap_format;
