//! Prometheus series of the webhook. The two `controller_runtime_webhook_*`
//! series keep upstream's names and labels so existing dashboards work; the
//! `nmo_webhook_*` series are ours.
//!
//! Each series is declared once, in the `shared::series!` table (as the
//! controller's are): field, kind, name, help text, labels and buckets side
//! by side.

use std::ops::Deref;

use prometheus::{Histogram, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry};

/// Buckets of `nmo_webhook_review_duration_seconds`: 25 µs to 1 s.
pub const REVIEW_DURATION_BUCKETS: [f64; 13] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 0.25,
    1.0,
];

/// Error creating or registering a series (a programming error: duplicate name).
#[derive(Debug, thiserror::Error)]
#[error("registering webhook metrics failed: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

shared::series! {
    /// Every series of the webhook. Both certificate reload results exist
    /// from the start so rate() and alerts work before the first reload.
    pub struct Series() {
        /// HTTP requests by status code, as controller-runtime counts them.
        pub requests_total: IntCounterVec("controller_runtime_webhook_requests_total",
            "Total number of admission requests by HTTP status code.", ["code", "webhook"]),
        /// Request latency in seconds (controller-runtime's name and default buckets).
        pub latency_seconds: HistogramVec("controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests", ["webhook"]),
        /// Review handling time with sub-millisecond buckets (controller-runtime's
        /// smallest latency bucket, 5 ms, cannot tell 50 µs from 4 ms).
        pub review_duration_seconds: Histogram("nmo_webhook_review_duration_seconds",
            "Time from an admission request reaching the handler to its answer, in seconds.",
            [], buckets = REVIEW_DURATION_BUCKETS),
        /// Requests being served right now.
        pub requests_in_flight: IntGaugeVec("controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.", ["webhook"]),
        /// Admission decisions by operation, allowed and reason.
        pub decisions_total: IntCounterVec("nmo_webhook_decisions_total",
            "Admission decisions by operation, outcome and reason.",
            ["operation", "allowed", "reason"]),
        /// notAfter of the certificate being served, unix seconds.
        pub certificate_not_after_seconds: IntGauge("nmo_webhook_certificate_not_after_seconds",
            "Expiry (notAfter) of the serving certificate currently in use, as unix time.", []),
        /// Certificate reloads by result (success / failure).
        pub certificate_reloads_total: IntCounterVec("nmo_webhook_certificate_reloads_total",
            "Serving certificate reloads after a change on disk, by result (success, failure).",
            ["result"], zero [["success"], ["failure"]]),
        /// 1 once a cache has its first full list, by cache name.
        pub cache_ready: IntGaugeVec("nmo_webhook_cache_ready",
            "1 once the named watch cache holds its first complete list.", ["cache"]),
        /// 1 when the etcd quorum rule applies (OpenShift), 0 otherwise.
        pub openshift: IntGauge("nmo_webhook_openshift",
            "1 when the etcd quorum rule for control-plane nodes applies (OpenShift).", []),
    }
}

/// The webhook's series (reached through `Deref`: `metrics.openshift`) and
/// the registry /metrics renders them from.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    series: Series,
}

impl Deref for Metrics {
    type Target = Series;

    fn deref(&self) -> &Series {
        &self.series
    }
}

impl Metrics {
    /// Every series created and registered.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let series = Series::build()?;
        series.register(&registry)?;
        Ok(Metrics { registry, series })
    }

    /// The latency histogram of one webhook path (resolved once, not per request).
    pub fn latency_for(&self, webhook: &str) -> Histogram {
        self.latency_seconds.with_label_values(&[webhook])
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    /// The /metrics text as the registry's encoder writes it, with every
    /// labelled series touched once.
    fn exposition() -> String {
        let m = Metrics::new().expect("metrics");
        m.requests_total
            .with_label_values(&["200", "/validate"])
            .inc();
        m.latency_for("/validate").observe(0.003);
        m.review_duration_seconds.observe(0.000_07);
        m.requests_in_flight
            .with_label_values(&["/validate"])
            .set(2);
        m.decisions_total
            .with_label_values(&["CREATE", "true", "allowed"])
            .inc();
        m.certificate_not_after_seconds.set(1_900_000_000);
        m.certificate_reloads_total
            .with_label_values(&["success"])
            .inc();
        m.cache_ready.with_label_values(&["nodes"]).set(1);
        m.openshift.set(1);
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&m.registry.gather(), &mut buf)
            .expect("encode");
        String::from_utf8(buf).expect("utf-8")
    }

    /// Dashboards and alerts read these names, labels, help texts and
    /// buckets: any change here is a change for them.
    #[test]
    fn the_exposition_stays_as_dashboards_know_it() {
        let got = exposition();
        for (i, (got, want)) in got.lines().zip(EXPOSITION.lines()).enumerate() {
            assert_eq!(got, want, "line {}", i + 1);
        }
        assert_eq!(got, EXPOSITION);
    }

    const EXPOSITION: &str = r#"# HELP controller_runtime_webhook_latency_seconds Histogram of the latency of processing admission requests
# TYPE controller_runtime_webhook_latency_seconds histogram
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.005"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.01"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.025"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.05"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.1"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.25"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="0.5"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="1"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="2.5"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="5"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="10"} 1
controller_runtime_webhook_latency_seconds_bucket{webhook="/validate",le="+Inf"} 1
controller_runtime_webhook_latency_seconds_sum{webhook="/validate"} 0.003
controller_runtime_webhook_latency_seconds_count{webhook="/validate"} 1
# HELP controller_runtime_webhook_requests_in_flight Current number of admission requests being served.
# TYPE controller_runtime_webhook_requests_in_flight gauge
controller_runtime_webhook_requests_in_flight{webhook="/validate"} 2
# HELP controller_runtime_webhook_requests_total Total number of admission requests by HTTP status code.
# TYPE controller_runtime_webhook_requests_total counter
controller_runtime_webhook_requests_total{code="200",webhook="/validate"} 1
# HELP nmo_webhook_cache_ready 1 once the named watch cache holds its first complete list.
# TYPE nmo_webhook_cache_ready gauge
nmo_webhook_cache_ready{cache="nodes"} 1
# HELP nmo_webhook_certificate_not_after_seconds Expiry (notAfter) of the serving certificate currently in use, as unix time.
# TYPE nmo_webhook_certificate_not_after_seconds gauge
nmo_webhook_certificate_not_after_seconds 1900000000
# HELP nmo_webhook_certificate_reloads_total Serving certificate reloads after a change on disk, by result (success, failure).
# TYPE nmo_webhook_certificate_reloads_total counter
nmo_webhook_certificate_reloads_total{result="failure"} 0
nmo_webhook_certificate_reloads_total{result="success"} 1
# HELP nmo_webhook_decisions_total Admission decisions by operation, outcome and reason.
# TYPE nmo_webhook_decisions_total counter
nmo_webhook_decisions_total{allowed="true",operation="CREATE",reason="allowed"} 1
# HELP nmo_webhook_openshift 1 when the etcd quorum rule for control-plane nodes applies (OpenShift).
# TYPE nmo_webhook_openshift gauge
nmo_webhook_openshift 1
# HELP nmo_webhook_review_duration_seconds Time from an admission request reaching the handler to its answer, in seconds.
# TYPE nmo_webhook_review_duration_seconds histogram
nmo_webhook_review_duration_seconds_bucket{le="0.000025"} 0
nmo_webhook_review_duration_seconds_bucket{le="0.00005"} 0
nmo_webhook_review_duration_seconds_bucket{le="0.0001"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.00025"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.0005"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.001"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.002"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.005"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.01"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.025"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.1"} 1
nmo_webhook_review_duration_seconds_bucket{le="0.25"} 1
nmo_webhook_review_duration_seconds_bucket{le="1"} 1
nmo_webhook_review_duration_seconds_bucket{le="+Inf"} 1
nmo_webhook_review_duration_seconds_sum 0.00007
nmo_webhook_review_duration_seconds_count 1
"#;
}
