//! Prometheus series: controller-runtime's names (so upstream dashboards keep
//! working) plus per-maintenance gauges for the dashboards and alerts upstream
//! never had.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, exponential_buckets,
};
use shared::MaintenancePhase;

pub const CONTROLLER_NAME: &str = "nodemaintenance";
const PHASES: [&str; 4] = ["Pending", "Running", "Succeeded", "Failed"];

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    reconcile_total: IntCounterVec,
    reconcile_errors: IntCounterVec,
    reconcile_duration: HistogramVec,
    phase: IntGaugeVec,
    progress: IntGaugeVec,
    pending: IntGaugeVec,
    evictions: IntCounterVec,
    api_requests: IntCounterVec,
    leader: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let reconcile_total = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_total",
                "Total number of reconciliations per controller",
            ),
            &["controller", "result"],
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "controller_runtime_reconcile_errors_total",
                "Total number of reconciliation errors per controller",
            ),
            &["controller"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "controller_runtime_reconcile_duration_seconds",
                "Length of time per reconciliation per controller",
            )
            .buckets(exponential_buckets(0.005, 2.0, 14)?),
            &["controller"],
        )?;
        let phase = IntGaugeVec::new(
            Opts::new(
                "nmo_nodemaintenance_phase",
                "1 for the current phase of each NodeMaintenance, 0 for the others",
            ),
            &["name", "node", "phase"],
        )?;
        let progress = IntGaugeVec::new(
            Opts::new(
                "nmo_nodemaintenance_drain_progress_percent",
                "Drain progress of each NodeMaintenance",
            ),
            &["name", "node"],
        )?;
        let pending = IntGaugeVec::new(
            Opts::new(
                "nmo_nodemaintenance_pending_pods",
                "Pods still to leave the node of each NodeMaintenance",
            ),
            &["name", "node"],
        )?;
        let evictions = IntCounterVec::new(
            Opts::new(
                "nmo_evictions_total",
                "Eviction requests by outcome (evicted, gone, blocked, failed)",
            ),
            &["result"],
        )?;
        registry.register(Box::new(reconcile_total.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(phase.clone()))?;
        registry.register(Box::new(progress.clone()))?;
        registry.register(Box::new(pending.clone()))?;
        let api_requests = IntCounterVec::new(
            Opts::new(
                "nmo_controller_api_requests_total",
                "Requests the controller sent to the API server, by HTTP method",
            ),
            &["method"],
        )?;
        // client-go's series: 1 on the replica holding the leader election Lease.
        let leader = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(evictions.clone()))?;
        registry.register(Box::new(api_requests.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        for result in ["success", "error", "requeue", "requeue_after"] {
            reconcile_total.with_label_values(&[CONTROLLER_NAME, result]);
        }
        reconcile_errors.with_label_values(&[CONTROLLER_NAME]);
        Ok(Metrics {
            registry,
            reconcile_total,
            reconcile_errors,
            reconcile_duration,
            phase,
            progress,
            pending,
            evictions,
            api_requests,
            leader,
        })
    }

    /// Whether this replica holds the leader election Lease `name`.
    pub fn leader(&self, name: &str, leading: bool) {
        self.leader
            .with_label_values(&[name])
            .set(i64::from(leading));
    }

    pub fn reconciled(&self, result: &str, seconds: f64) {
        self.reconcile_total
            .with_label_values(&[CONTROLLER_NAME, result])
            .inc();
        if result == "error" {
            self.reconcile_errors
                .with_label_values(&[CONTROLLER_NAME])
                .inc();
        }
        self.reconcile_duration
            .with_label_values(&[CONTROLLER_NAME])
            .observe(seconds);
    }

    /// A client whose every request to the API server is counted by method.
    pub fn counted_client(&self, config: kube::Config) -> anyhow::Result<kube::Client> {
        let counter = self.api_requests.clone();
        let layer = tower::layer::layer_fn(move |svc| CountRequests {
            inner: svc,
            counter: counter.clone(),
        });
        Ok(kube::client::ClientBuilder::try_from(config)
            .map_err(|e| anyhow::anyhow!("building the Kubernetes client: {e}"))?
            .with_layer(&layer)
            .build())
    }

    pub fn eviction(&self, result: &str) {
        self.evictions.with_label_values(&[result]).inc();
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
            self.phase
                .with_label_values(&[name, node, p])
                .set(i64::from(p == phase.as_str()));
        }
        self.progress.with_label_values(&[name, node]).set(progress);
        self.pending
            .with_label_values(&[name, node])
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
    }

    pub fn forget(&self, name: &str, node: &str) {
        for p in PHASES {
            let _ = self.phase.remove_label_values(&[name, node, p]);
        }
        let _ = self.progress.remove_label_values(&[name, node]);
        let _ = self.pending.remove_label_values(&[name, node]);
    }
}

/// Tower service that counts requests before passing them on.
#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    counter: IntCounterVec,
}

impl<S, B> tower::Service<http::Request<B>> for CountRequests<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        self.counter
            .with_label_values(&[req.method().as_str()])
            .inc();
        self.inner.call(req)
    }
}
