//! The admission port's serving certificate: [`shared::serve::tls`] does the loading,
//! serving and reloading (the secure metrics port uses the same code); the
//! webhook counts its reloads and expiry in its own series.

pub use shared::serve::tls::{
    CertMetrics, CertResolver, ReloadOutcome, TlsError, provider, server_config, watch_for_changes,
};

use crate::metrics::Metrics;

/// The serving certificate reports through `nmo_webhook_certificate_*`.
impl From<Metrics> for CertMetrics {
    fn from(m: Metrics) -> Self {
        // Clones share their series (an Arc inside): the same counters as before.
        CertMetrics {
            not_after_seconds: m.certificate_not_after_seconds.clone(),
            reloads_total: m.certificate_reloads_total.clone(),
        }
    }
}
