//! Prometheus series: controller-runtime's and client-go's names, labels and
//! buckets (so upstream's dashboards and alerts work unchanged) plus
//! per-maintenance gauges for the dashboards and alerts upstream never had.
//!
//! Upstream's series (controller label "nodemaintenance"):
//! - `controller_runtime_reconcile_total{controller,result}` (success, error,
//!   requeue, requeue_after), `controller_runtime_reconcile_errors_total`,
//!   `controller_runtime_terminal_reconcile_errors_total`,
//!   `controller_runtime_reconcile_panics_total`,
//!   `controller_runtime_reconcile_time_seconds` (histogram),
//!   `controller_runtime_max_concurrent_reconciles`,
//!   `controller_runtime_active_workers` (pkg/internal/controller/metrics);
//! - `workqueue_*{name,controller}` (see queue_metrics.rs);
//! - `rest_client_requests_total{code,host,method}` and
//!   `rest_client_request_duration_seconds{verb,host}` (client-go, through
//!   `rest_layer`); `code` is the HTTP status, or `<error>` when no
//!   response came;
//! - `leader_election_master_status{name}`.
//!
//! How a reconcile is recorded (one call site, plus the requeue of an error):
//!
//! ```ignore
//! let timer = ctx.metrics.reconcile_started(&name);   // leaves the queue, a worker is busy
//! let result = ...;                                    // the reconcile itself
//! timer.finish(ReconcileResult::RequeueAfter(d));      // or Success, Error, ...
//! // in error_policy, once the retry delay is known:
//! ctx.metrics.requeued(&name, wait);
//! ```
//!
//! `ReconcileResult` follows controller-runtime's accounting:
//! - `Success`: nothing scheduled (kube's `Action::await_change()`);
//! - `RequeueAfter(d)`: come back after `d` (`Action::requeue(d)`); the key
//!   is queued again and counts as a workqueue retry (client-go's AddAfter);
//! - `Requeue(d)`: controller-runtime's rate-limited `Requeue: true`, `d`
//!   being the backoff; counted like `RequeueAfter` but as `result="requeue"`;
//! - `Error`: a failed reconcile that will be retried: `result="error"` and
//!   `reconcile_errors_total`; the retry itself is recorded by `requeued`
//!   from the error policy, which knows the delay;
//! - `TerminalError`: failed and not retried: also
//!   `terminal_reconcile_errors_total`;
//! - `Panic`: `reconcile_panics_total`, and an error as well (controller-runtime
//!   recovers a panic into an error). A `ReconcileTimer` dropped during a
//!   panic records this by itself; one dropped otherwise (the reconcile was
//!   cancelled) only frees its worker.
//!
//! Every reconcile observes `controller_runtime_reconcile_time_seconds` and
//! `workqueue_work_duration_seconds`.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};
use shared::{MaintenancePhase, NodeMaintenance};

use crate::queue_metrics::WorkQueue;

pub const CONTROLLER_NAME: &str = "nodemaintenance";
const PHASES: [&str; 4] = ["Pending", "Running", "Succeeded", "Failed"];

/// controller-runtime's buckets for `controller_runtime_reconcile_time_seconds`.
const RECONCILE_TIME_BUCKETS: [f64; 40] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0,
    25.0, 30.0, 40.0, 50.0, 60.0,
];
/// Kubernetes' (component-base restclient) buckets for
/// `rest_client_request_duration_seconds`.
const REST_CLIENT_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// How a reconcile ended; see the top of this file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcileResult {
    Success,
    Requeue(Duration),
    RequeueAfter(Duration),
    Error,
    TerminalError,
    Panic,
}

impl ReconcileResult {
    /// The `result` label of `controller_runtime_reconcile_total`.
    pub fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Requeue(_) => "requeue",
            ReconcileResult::RequeueAfter(_) => "requeue_after",
            ReconcileResult::Error | ReconcileResult::TerminalError | ReconcileResult::Panic => {
                "error"
            }
        }
    }
}

/// A gauge family sampled at each scrape ([`Metrics::register_kept_entries`],
/// [`Metrics::register_waiting`]).
struct Sampled {
    gauge: IntGaugeVec,
    #[allow(clippy::type_complexity)]
    sample: Box<dyn Fn() -> Vec<(&'static str, usize)> + Send + Sync>,
}

impl prometheus::core::Collector for Sampled {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        for (store, n) in (self.sample)() {
            self.gauge
                .with_label_values(&[store])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.gauge.collect()
    }
}

/// Shorthand for the controller label value in the table below.
const C: &str = CONTROLLER_NAME;

shared::series! {
    /// Every series but the workqueue's (queue_metrics.rs) and the sampled
    /// `nmo_controller_kept_entries`. The `zero` label sets exist from the
    /// start, as controller-runtime's initMetrics makes them.
    struct Series() {
        reconcile_total: IntCounterVec("controller_runtime_reconcile_total",
            "Total number of reconciliations per controller", ["controller", "result"],
            zero [[C, "success"], [C, "error"], [C, "requeue"], [C, "requeue_after"]]),
        reconcile_errors: IntCounterVec("controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller", ["controller"], zero [[C]]),
        terminal_errors: IntCounterVec("controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller", ["controller"],
            zero [[C]]),
        panics: IntCounterVec("controller_runtime_reconcile_panics_total",
            "Total number of reconciliation panics per controller", ["controller"], zero [[C]]),
        reconcile_time: HistogramVec("controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller", ["controller"],
            buckets = RECONCILE_TIME_BUCKETS, zero [[C]]),
        max_concurrent: IntGaugeVec("controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller", ["controller"], zero [[C]]),
        phase: IntGaugeVec("nmo_nodemaintenance_phase",
            "1 for the current phase of each NodeMaintenance, 0 for the others",
            ["name", "node", "phase"]),
        progress: IntGaugeVec("nmo_nodemaintenance_drain_progress_percent",
            "Drain progress of each NodeMaintenance", ["name", "node"]),
        pending: IntGaugeVec("nmo_nodemaintenance_pending_pods",
            "Pods still to leave the node of each NodeMaintenance", ["name", "node"]),
        evictions: IntCounterVec("nmo_evictions_total",
            "Eviction requests by outcome (evicted, gone, migrating, blocked, failed; deferred: not answered within the round's budget)",
            ["result"]),
        node_condition_errors: IntCounterVec("nmo_node_condition_write_errors_total",
            "Failed writes of the node lifecycle conditions (the maintenance went on; retried on the next pass)",
            ["node"]),
        /// client-go's label order: code, method, host.
        rest_requests: IntCounterVec("rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"]),
        rest_duration: HistogramVec("rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.", ["verb", "host"],
            buckets = REST_CLIENT_BUCKETS),
        /// client-go's series: 1 on the replica holding the leader election Lease.
        leader: IntGaugeVec("leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ["name"]),
    }
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// The workqueue tracker (clone it into watch callbacks: `queue.added`).
    pub queue: WorkQueue,
    series: Series,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let series = Series::build()?;
        series.register(&registry)?;
        let queue = WorkQueue::new(CONTROLLER_NAME)?;
        registry.register(queue.collector())?;
        Ok(Metrics {
            registry,
            queue,
            series,
        })
    }

    /// Whether this replica holds the leader election Lease `name`.
    pub fn leader(&self, name: &str, leading: bool) {
        self.series
            .leader
            .with_label_values(&[name])
            .set(i64::from(leading));
    }

    /// `nmo_controller_kept_entries{store}`: what the reconciler keeps in
    /// memory per maintenance or node, sampled by `sample` at each scrape.
    /// Each store goes back to 0 once none of this controller's maintenances
    /// is left; one that only grows is a leak.
    pub fn register_kept_entries(
        &self,
        sample: impl Fn() -> Vec<(&'static str, usize)> + Send + Sync + 'static,
    ) -> Result<(), prometheus::Error> {
        self.register_sampled(
            "nmo_controller_kept_entries",
            "Entries the controller keeps in memory per NodeMaintenance or node, by store",
            "store",
            Box::new(sample),
        )
    }

    /// A gauge family with one label, set from `sample` at each scrape.
    fn register_sampled(
        &self,
        name: &str,
        help: &str,
        label: &str,
        sample: Box<dyn Fn() -> Vec<(&'static str, usize)> + Send + Sync>,
    ) -> Result<(), prometheus::Error> {
        let gauge =
            <IntGaugeVec as shared::serve::series::Family>::family(name, help, &[label], &[])?;
        self.registry.register(Box::new(Sampled { gauge, sample }))
    }

    /// `nmo_nodemaintenance_waiting{reason}`: NodeMaintenances in phase
    /// Pending by the reason of their `Queued` condition (WaitingForSlot or
    /// a fleet gate), sampled by `sample` at each scrape; every reason is
    /// there from the start.
    pub fn register_waiting(
        &self,
        sample: impl Fn() -> Vec<(&'static str, usize)> + Send + Sync + 'static,
    ) -> Result<(), prometheus::Error> {
        self.register_sampled(
            "nmo_nodemaintenance_waiting",
            "NodeMaintenances waiting to start, by the reason of their Queued condition (a slot or a fleet gate)",
            "reason",
            Box::new(sample),
        )
    }

    /// `controller_runtime_max_concurrent_reconciles`: how many reconciles the
    /// Controller runs at once (its `concurrency`).
    pub fn set_max_concurrent_reconciles(&self, n: usize) {
        self.series
            .max_concurrent
            .with_label_values(&[CONTROLLER_NAME])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A reconcile of `key` (the NodeMaintenance's name) begins; record its
    /// end with [`ReconcileTimer::finish`].
    pub fn reconcile_started(&self, key: &str) -> ReconcileTimer {
        self.queue.started(key);
        ReconcileTimer {
            metrics: self.clone(),
            key: key.to_string(),
            started: Instant::now(),
            done: false,
        }
    }

    /// `key` goes back to the queue for another try after `after` (the
    /// error policy's retry; `finish` records requeues of its own).
    pub fn requeued(&self, key: &str, after: Duration) {
        self.queue.added(key, after);
        self.queue.retried(key);
    }

    fn record(&self, key: &str, result: ReconcileResult, seconds: f64) {
        let c = [CONTROLLER_NAME];
        self.series
            .reconcile_time
            .with_label_values(&c)
            .observe(seconds);
        self.series
            .reconcile_total
            .with_label_values(&[CONTROLLER_NAME, result.label()])
            .inc();
        match result {
            ReconcileResult::Success => {}
            ReconcileResult::Requeue(d) | ReconcileResult::RequeueAfter(d) => {
                self.requeued(key, d);
            }
            ReconcileResult::Error => self.series.reconcile_errors.with_label_values(&c).inc(),
            ReconcileResult::TerminalError => {
                self.series.reconcile_errors.with_label_values(&c).inc();
                self.series.terminal_errors.with_label_values(&c).inc();
            }
            ReconcileResult::Panic => {
                self.series.reconcile_errors.with_label_values(&c).inc();
                self.series.panics.with_label_values(&c).inc();
            }
        }
        self.queue.finished(key, seconds);
    }

    /// A client layer that counts every request to the API server as
    /// client-go does: `rest_client_requests_total{code,host,method}` and
    /// `rest_client_request_duration_seconds{verb,host}` (time to the
    /// response headers). `host` is the API server's host:port (the client
    /// is built in `serving::clients`).
    pub fn rest_layer<S>(
        &self,
        host: &str,
    ) -> impl tower::Layer<S, Service = CountRequests<S>> + Clone + use<S> {
        let rest = RestClientMetrics {
            requests: self.series.rest_requests.clone(),
            duration: self.series.rest_duration.clone(),
            host: Arc::from(host),
        };
        tower::layer::layer_fn(move |svc| CountRequests {
            inner: svc,
            metrics: rest.clone(),
        })
    }

    /// A write of node `node`'s lifecycle conditions failed.
    pub fn node_condition_write_failed(&self, node: &str) {
        self.series
            .node_condition_errors
            .with_label_values(&[node])
            .inc();
    }

    pub fn eviction(&self, result: &str) {
        self.series.evictions.with_label_values(&[result]).inc();
    }

    pub fn observe(
        &self,
        name: &str,
        node: &str,
        phase: &MaintenancePhase,
        progress: i64,
        pending: usize,
    ) {
        for p in PHASES {
            self.series
                .phase
                .with_label_values(&[name, node, p])
                .set(i64::from(p == phase.as_str()));
        }
        self.series
            .progress
            .with_label_values(&[name, node])
            .set(progress);
        self.series
            .pending
            .with_label_values(&[name, node])
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    pub fn forget(&self, name: &str, node: &str) {
        for p in PHASES {
            let _ = self.series.phase.remove_label_values(&[name, node, p]);
        }
        let _ = self.series.progress.remove_label_values(&[name, node]);
        let _ = self.series.pending.remove_label_values(&[name, node]);
    }

    /// Set the per-maintenance gauges from the status of every NodeMaintenance
    /// in the cache, and drop the series of those no longer there (or not yet
    /// given a phase). Call on start, once the cache is synced, and when this
    /// replica becomes leader, so alerts keep firing across restarts and
    /// failovers. Also drops queued keys of objects that are gone.
    pub fn rebuild(&self, all: &[Arc<NodeMaintenance>]) {
        let mut present: HashSet<(String, String)> = HashSet::new();
        let mut names = HashSet::new();
        for nm in all {
            let Some(name) = nm.metadata.name.clone() else {
                continue;
            };
            names.insert(name.clone());
            let Some(status) = &nm.status else { continue };
            let Some(phase) = &status.phase else { continue };
            let node = nm.spec.node_name.clone();
            self.observe(
                &name,
                &node,
                phase,
                status.drain_progress,
                status.pending_pods.len(),
            );
            present.insert((name, node));
        }
        for (name, node) in self.series_keys() {
            if !present.contains(&(name.clone(), node.clone())) {
                self.forget(&name, &node);
            }
        }
        self.queue.retain(&names);
    }

    /// The (name, node) pairs that have per-maintenance series now.
    fn series_keys(&self) -> HashSet<(String, String)> {
        use prometheus::core::Collector as _;
        let mut keys = HashSet::new();
        let families = [
            self.series.phase.collect(),
            self.series.progress.collect(),
            self.series.pending.collect(),
        ];
        for m in families.iter().flatten().flat_map(|f| f.get_metric()) {
            let label = |n: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_string())
                    .unwrap_or_default()
            };
            keys.insert((label("name"), label("node")));
        }
        keys
    }
}

/// One reconcile in progress; see the top of this file.
#[must_use = "finish(result) records how the reconcile ended"]
pub struct ReconcileTimer {
    metrics: Metrics,
    key: String,
    started: Instant,
    done: bool,
}

impl ReconcileTimer {
    /// The reconcile ended with `result`. Returns its duration in seconds.
    pub fn finish(mut self, result: ReconcileResult) -> f64 {
        self.done = true;
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.record(&self.key, result, seconds);
        seconds
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let seconds = self.started.elapsed().as_secs_f64();
        if std::thread::panicking() {
            self.metrics
                .record(&self.key, ReconcileResult::Panic, seconds);
        } else {
            // Cancelled (shutdown): no result, but the worker is free again.
            self.metrics.queue.finished(&self.key, seconds);
        }
    }
}

#[derive(Clone)]
struct RestClientMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    host: Arc<str>,
}

impl RestClientMetrics {
    fn record(&self, method: &str, code: &str, started: Instant) {
        self.requests
            .with_label_values(&[code, method, &self.host])
            .inc();
        self.duration
            .with_label_values(&[method, &self.host])
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Tower service that counts each request with the status of its response.
#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    metrics: RestClientMetrics,
}

impl<S, B, R> tower::Service<http::Request<B>> for CountRequests<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        Counted {
            method: req.method().clone(),
            started: Instant::now(),
            metrics: self.metrics.clone(),
            inner: self.inner.call(req),
        }
    }
}

/// The response future of [`CountRequests`]: counts when the response (or
/// the failure) arrives.
pub struct Counted<F> {
    inner: F,
    method: http::Method,
    started: Instant,
    metrics: RestClientMetrics,
}

impl<F, R, E> std::future::Future for Counted<F>
where
    F: std::future::Future<Output = Result<http::Response<R>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let out = std::task::ready!(Pin::new(&mut this.inner).poll(cx));
        let code = match &out {
            Ok(resp) => resp.status().as_u16().to_string(),
            Err(_) => "<error>".to_string(),
        };
        this.metrics
            .record(this.method.as_str(), &code, this.started);
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(m: &Metrics) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&m.registry.gather(), &mut out)
            .expect("encode");
        out
    }

    /// The value of the sample whose line starts with `series` (name and labels).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    fn nm(
        name: &str,
        node: &str,
        phase: Option<MaintenancePhase>,
        progress: i64,
    ) -> Arc<NodeMaintenance> {
        let mut nm = NodeMaintenance::new(
            name,
            shared::NodeMaintenanceSpec {
                node_name: node.to_string(),
                ..Default::default()
            },
        );
        nm.status = Some(shared::NodeMaintenanceStatus {
            phase,
            drain_progress: progress,
            pending_pods: vec!["p1".into(), "p2".into()],
            ..Default::default()
        });
        Arc::new(nm)
    }

    async fn one_request(m: &Metrics, status: u16) {
        use tower::{Service as _, ServiceExt as _};
        let rest = RestClientMetrics {
            requests: m.series.rest_requests.clone(),
            duration: m.series.rest_duration.clone(),
            host: Arc::from("10.0.0.1:6443"),
        };
        let inner = tower::service_fn(move |_req: http::Request<()>| {
            std::future::ready(if status == 0 {
                Err("connection refused")
            } else {
                Ok(http::Response::builder()
                    .status(status)
                    .body(())
                    .expect("response"))
            })
        });
        let mut svc = CountRequests {
            inner,
            metrics: rest,
        };
        let req = http::Request::get("/api/v1/nodes")
            .body(())
            .expect("request");
        let _ = svc.ready().await.expect("ready").call(req).await;
    }

    /// `text` with the values of the series named in `timed` (their
    /// observations are wall-clock times) replaced by `T`.
    fn untimed(text: &str, timed: &[&str]) -> String {
        let mut out = String::new();
        for line in text.lines() {
            match line.rsplit_once(' ') {
                Some((series, _)) if timed.iter().any(|t| series.starts_with(t)) => {
                    out.push_str(series);
                    out.push_str(" T");
                }
                _ => out.push_str(line),
            }
            out.push('\n');
        }
        out
    }

    /// The exposition is a contract (controller-runtime's and client-go's
    /// names, help, labels and buckets; every series at zero from the start):
    /// a fresh registry, and one after a recorded observation of each kind,
    /// render exactly as testdata/ says.
    #[tokio::test]
    async fn the_exposition_is_exactly_the_expected_text() {
        let m = Metrics::new().expect("metrics");
        assert_eq!(render(&m), include_str!("testdata/metrics_fresh.txt"));
        m.register_kept_entries(|| vec![("node_cache", 2), ("own_writes", 0)])
            .expect("register");
        m.set_max_concurrent_reconciles(1);
        m.leader("135b1886.medik8s.io", true);
        m.queue.added("later", Duration::from_secs(3600));
        m.queue.started("a");
        m.record(
            "a",
            ReconcileResult::RequeueAfter(Duration::from_secs(3600)),
            0.3,
        );
        m.queue.started("b");
        m.record("b", ReconcileResult::Success, 0.002);
        m.queue.started("c");
        m.record("c", ReconcileResult::Panic, 7.0);
        m.queue.started("d");
        m.record("d", ReconcileResult::Requeue(Duration::from_secs(5)), 70.0);
        m.eviction("evicted");
        m.eviction("blocked");
        one_request(&m, 200).await;
        one_request(&m, 0).await;
        m.observe("nm-1", "node-1", &MaintenancePhase::Running, 40, 3);
        // Waits (queue_duration) are not observed here: no key became ready.
        let timed = [
            "rest_client_request_duration_seconds_bucket",
            "rest_client_request_duration_seconds_sum",
        ];
        assert_eq!(
            untimed(&render(&m), &timed),
            include_str!("testdata/metrics_observed.txt")
        );
    }

    /// What one reconcile of each result (and the calls before it in
    /// every_upstream_series_is_exposed_after_one_reconcile) must expose:
    /// (series, Some(value) or None when only presence matters).
    fn upstream_series() -> Vec<(String, Option<f64>)> {
        let c = r#"controller="nodemaintenance""#;
        let nc = r#"controller="nodemaintenance",name="nodemaintenance""#;
        vec![
            (
                format!(r#"controller_runtime_reconcile_total{{{c},result="success"}}"#),
                Some(1.0),
            ),
            (
                format!(r#"controller_runtime_reconcile_total{{{c},result="error"}}"#),
                Some(1.0),
            ),
            (
                format!(r#"controller_runtime_reconcile_total{{{c},result="requeue"}}"#),
                Some(0.0),
            ),
            (
                format!(r#"controller_runtime_reconcile_total{{{c},result="requeue_after"}}"#),
                Some(1.0),
            ),
            (
                format!("controller_runtime_reconcile_errors_total{{{c}}}"),
                Some(1.0),
            ),
            (
                format!("controller_runtime_terminal_reconcile_errors_total{{{c}}}"),
                Some(1.0),
            ),
            (
                format!("controller_runtime_reconcile_panics_total{{{c}}}"),
                Some(0.0),
            ),
            (
                format!("controller_runtime_reconcile_time_seconds_count{{{c}}}"),
                Some(3.0),
            ),
            (
                format!(r#"controller_runtime_reconcile_time_seconds_bucket{{{c},le="60"}}"#),
                Some(3.0),
            ),
            (
                format!("controller_runtime_max_concurrent_reconciles{{{c}}}"),
                Some(1.0),
            ),
            (
                format!("controller_runtime_active_workers{{{c}}}"),
                Some(0.0),
            ),
            (format!(r#"workqueue_depth{{{nc},priority=""}}"#), Some(0.0)),
            (format!("workqueue_adds_total{{{nc}}}"), Some(1.0)),
            (
                format!("workqueue_queue_duration_seconds_count{{{nc}}}"),
                Some(1.0),
            ),
            (
                format!(r#"workqueue_queue_duration_seconds_bucket{{{nc},le="1000"}}"#),
                Some(1.0),
            ),
            (
                format!("workqueue_work_duration_seconds_count{{{nc}}}"),
                Some(3.0),
            ),
            (format!("workqueue_retries_total{{{nc}}}"), Some(1.0)),
            (
                format!("workqueue_unfinished_work_seconds{{{nc}}}"),
                Some(0.0),
            ),
            (
                format!("workqueue_longest_running_processor_seconds{{{nc}}}"),
                Some(0.0),
            ),
            (
                r#"leader_election_master_status{name="135b1886.medik8s.io"}"#.into(),
                Some(1.0),
            ),
            (
                r#"rest_client_requests_total{code="200",host="10.0.0.1:6443",method="GET"}"#
                    .into(),
                Some(1.0),
            ),
            (
                r#"rest_client_requests_total{code="<error>",host="10.0.0.1:6443",method="GET"}"#
                    .into(),
                Some(1.0),
            ),
            (
                r#"rest_client_request_duration_seconds_count{host="10.0.0.1:6443",verb="GET"}"#
                    .into(),
                Some(2.0),
            ),
            (
                r#"nmo_nodemaintenance_phase{name="a",node="node-1",phase="Running"}"#.into(),
                Some(1.0),
            ),
            (
                r#"nmo_nodemaintenance_drain_progress_percent{name="a",node="node-1"}"#.into(),
                Some(40.0),
            ),
            (
                r#"nmo_nodemaintenance_pending_pods{name="a",node="node-1"}"#.into(),
                Some(3.0),
            ),
        ]
    }

    #[tokio::test]
    async fn every_upstream_series_is_exposed_after_one_reconcile() {
        let m = Metrics::new().expect("metrics");
        m.set_max_concurrent_reconciles(1);
        m.leader("135b1886.medik8s.io", true);
        m.queue.added("a", Duration::ZERO);
        let t = m.reconcile_started("a");
        t.finish(ReconcileResult::RequeueAfter(Duration::from_secs(3600)));
        let t = m.reconcile_started("b");
        t.finish(ReconcileResult::Success);
        let t = m.reconcile_started("c");
        t.finish(ReconcileResult::TerminalError);
        one_request(&m, 200).await;
        one_request(&m, 0).await;
        m.observe("a", "node-1", &MaintenancePhase::Running, 40, 3);
        let text = render(&m);

        for (series, want) in upstream_series() {
            let got = value(&text, &series);
            assert!(got.is_some(), "{series} exposed:\n{text}");
            if let Some(want) = want {
                assert_eq!(got, Some(want), "{series}:\n{text}");
            }
        }
        assert!(!text.contains("nmo_controller_api_requests_total"));
        assert!(!text.contains("controller_runtime_reconcile_duration_seconds"));
        // The requeue-after is scheduled for later: queued, not yet in depth.
        assert!(text.contains("# TYPE workqueue_queue_duration_seconds histogram"));
    }

    #[test]
    fn a_panic_counts_as_a_panic_and_an_error() {
        let m = Metrics::new().expect("metrics");
        let m2 = m.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _t = m2.reconcile_started("a");
            panic!("reconcile bug");
        }));
        assert!(r.is_err());
        let text = render(&m);
        let c = r#"controller="nodemaintenance""#;
        assert_eq!(
            value(
                &text,
                &format!("controller_runtime_reconcile_panics_total{{{c}}}")
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                &format!("controller_runtime_reconcile_errors_total{{{c}}}")
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&text, &format!("controller_runtime_active_workers{{{c}}}")),
            Some(0.0)
        );
    }

    #[test]
    fn a_cancelled_reconcile_frees_its_worker_and_counts_nothing() {
        let m = Metrics::new().expect("metrics");
        drop(m.reconcile_started("a"));
        let text = render(&m);
        let c = r#"controller="nodemaintenance""#;
        assert_eq!(
            value(&text, &format!("controller_runtime_active_workers{{{c}}}")),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                &format!("controller_runtime_reconcile_time_seconds_count{{{c}}}")
            ),
            Some(0.0)
        );
    }

    #[test]
    fn kept_entries_are_sampled_at_each_scrape() {
        let m = Metrics::new().expect("metrics");
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(3));
        let seen = n.clone();
        m.register_kept_entries(move || {
            vec![
                ("node_cache", seen.load(std::sync::atomic::Ordering::SeqCst)),
                ("own_writes", 0),
            ]
        })
        .expect("register");
        let text = render(&m);
        assert_eq!(
            value(&text, r#"nmo_controller_kept_entries{store="node_cache"}"#),
            Some(3.0)
        );
        assert_eq!(
            value(&text, r#"nmo_controller_kept_entries{store="own_writes"}"#),
            Some(0.0)
        );
        n.store(0, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            value(
                &render(&m),
                r#"nmo_controller_kept_entries{store="node_cache"}"#
            ),
            Some(0.0)
        );
    }

    #[test]
    fn rebuild_sets_gauges_from_status_and_drops_the_gone() {
        let m = Metrics::new().expect("metrics");
        m.observe("gone", "node-9", &MaintenancePhase::Running, 10, 1);
        m.observe("moved", "old-node", &MaintenancePhase::Running, 10, 1);
        m.queue.added("gone", Duration::ZERO);
        m.rebuild(&[
            nm("a", "node-1", Some(MaintenancePhase::Succeeded), 100),
            nm("moved", "new-node", Some(MaintenancePhase::Failed), 50),
            nm("fresh", "node-2", None, 0),
        ]);
        let text = render(&m);
        let v = |s: &str| value(&text, s);
        assert_eq!(
            v(r#"nmo_nodemaintenance_phase{name="a",node="node-1",phase="Succeeded"}"#),
            Some(1.0)
        );
        assert_eq!(
            v(r#"nmo_nodemaintenance_phase{name="a",node="node-1",phase="Running"}"#),
            Some(0.0)
        );
        assert_eq!(
            v(r#"nmo_nodemaintenance_drain_progress_percent{name="a",node="node-1"}"#),
            Some(100.0)
        );
        assert_eq!(
            v(r#"nmo_nodemaintenance_pending_pods{name="a",node="node-1"}"#),
            Some(2.0)
        );
        assert_eq!(
            v(r#"nmo_nodemaintenance_phase{name="moved",node="new-node",phase="Failed"}"#),
            Some(1.0)
        );
        assert!(!text.contains("gone"), "{text}");
        assert!(!text.contains("old-node"), "{text}");
        assert!(!text.contains(r#"name="fresh""#), "{text}");
        assert_eq!(
            v(
                r#"workqueue_depth{controller="nodemaintenance",name="nodemaintenance",priority=""}"#
            ),
            Some(0.0)
        );
    }
}
