//! nmo-webhook: the validating admission webhook for NodeMaintenance objects.
//!
//! `run` wires the parts: certificate (`tls`), watch caches (`cache`, each
//! store and its readiness gate `cached`), the pure
//! decision (`validate`) behind the hardened TLS endpoint (`server`), the
//! admission warnings (`warnings`, their API lookups `warning_lookups`, the
//! fleet gates' part `gate_lookups`),
//! probes on their own plain-HTTP port, metrics (`metrics`) on theirs (HTTPS
//! with TokenReview and SubjectAccessReview unless --metrics-secure=false),
//! and graceful shutdown on SIGTERM/SIGINT.

pub mod body;
pub mod cache;
pub mod cached;
pub mod config;
pub mod drain_rule;
pub mod etcd;
pub mod gate_lookups;
pub mod metrics;
pub mod review;
pub mod server;
pub mod tls;
pub mod validate;
pub mod warning_lookups;
pub mod warnings;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use shared::serve::metrics_server::{self, MetricsServeError, MetricsServing};
use shared::serve::probes::{Readiness, ServeError, spawn_probes};

use crate::config::{Config, ConfigError};
use crate::gate_lookups::GateSettings;
use crate::metrics::{Metrics, MetricsError};
use crate::server::{AppState, Limits, ServeOptions, ServerError};
use crate::tls::{CertResolver, TlsError};

/// Everything that stops the webhook from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("serving certificate (--cert-dir, --cert-name, --key-name): {0}")]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    MetricsServe(#[from] MetricsServeError),
    #[error(
        "cannot build a Kubernetes client: {0}; run in a pod with a service account, set KUBECONFIG or pass --kubeconfig"
    )]
    Kube(String),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[from] std::io::Error),
}

/// The API client (HTTP/2 when offered: `shared::kube::client`).
async fn kube_client(config: &Config) -> Result<Client, Error> {
    let cfg = match &config.kubeconfig {
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Kube(e.to_string()))?,
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                Error::Kube(format!("reading --kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Kube(format!("loading --kubeconfig {}: {e}", path.display())))?
        }
    };
    shared::kube::client::client(&cfg).map_err(|e| Error::Kube(e.to_string()))
}

/// Names for a self-signed metrics certificate: the metrics Service's.
fn metrics_server_names() -> Vec<String> {
    let ns = shared::kube::namespace::operator_namespace();
    vec![
        format!("nmo-webhook-metrics.{ns}.svc"),
        format!("nmo-webhook-metrics.{ns}.svc.cluster.local"),
    ]
}

/// Run the webhook until SIGTERM/SIGINT; returns once in-flight reviews are done.
pub async fn run(config: Config) -> Result<(), Error> {
    tracing::info!(
        version = shared::api::version::VERSION,
        namespace = %shared::kube::namespace::operator_namespace(),
        "nmo-webhook starting"
    );
    let listeners = config.listeners()?;
    let metrics = Metrics::new()?;
    let readiness = Readiness::default();
    let signals = shared::serve::shutdown::Signals::install()?;

    // Certificate first: unusable files stop the start with the path in the message.
    let cert_gate = readiness.gate("serving certificate");
    let resolver = Arc::new(CertResolver::load(config.cert_paths(), metrics.clone())?);
    cert_gate.set(true);
    let tls_config = tls::server_config(resolver.clone(), config.runtime.enable_http2)?;
    let listener = server::bind(listeners.webhook).await?;

    let client = kube_client(&config).await?;
    let caches = cache::Caches::start(
        client.clone(),
        config.openshift,
        warning_lookups::WarningSettings {
            max_concurrent_maintenances: config.max_concurrent_maintenances,
            timeout: config.warnings_timeout,
            gates: GateSettings::of(&config.gates).map_err(ConfigError::Gates)?,
            selector: config.nodemaintenance_selector.clone(),
            shed_traffic: config.drain.shed_traffic(),
        },
        &readiness,
        &metrics,
    );
    serve_probes_and_metrics(&config, listeners.probes, &readiness, &metrics, client).await?;
    tokio::spawn(tls::watch_for_changes(
        resolver,
        config.cert_reload_interval,
        signals.requested(),
    ));

    let state = app_state(&config, caches, metrics);
    let stop_accepting = stop_accepting(&readiness, &signals, config.shutdown_delay);
    server::serve(
        listener,
        tls_config,
        server::router(state).layer(server::close_connections_when(move || {
            readiness.is_shutting_down()
        })),
        serve_options(&config),
        stop_accepting,
    )
    .await;
    tracing::info!("webhook stopped");
    Ok(())
}

/// Start the probe and metrics servers, when their addresses are set.
async fn serve_probes_and_metrics(
    config: &Config,
    probes: Option<SocketAddr>,
    readiness: &Readiness,
    metrics: &Metrics,
    client: Client,
) -> Result<(), Error> {
    // Probes and metrics keep answering until the process exits, so /readyz
    // reports "shutting down" while in-flight reviews finish.
    if let Some(addr) = probes {
        spawn_probes(addr, readiness).await?;
    }
    if let Some(serving) = MetricsServing::from_flags(&config.runtime, metrics_server_names())
        .map_err(ConfigError::from)?
    {
        let serving = metrics_server::serve(
            serving,
            metrics.registry.clone(),
            client,
            std::future::pending(),
        )
        .await?;
        tokio::spawn(serving);
    }
    Ok(())
}

/// The review handler's state: the caches, the policy, the limits.
fn app_state(config: &Config, caches: Arc<cache::Caches>, metrics: Metrics) -> AppState {
    AppState::new(
        caches,
        server::Policy {
            allow_force_drain: config.allow_force_drain,
        },
        metrics,
        Limits {
            max_body_bytes: config.max_body_bytes,
            request_timeout: config.request_timeout,
            max_concurrent_reviews: config.max_concurrent_reviews as usize,
        },
    )
}

/// The TLS listener's connection limits and timeouts.
fn serve_options(config: &Config) -> ServeOptions {
    ServeOptions {
        max_connections: config.max_connections as usize,
        tls_handshake_timeout: config.tls_handshake_timeout,
        idle_timeout: config.idle_timeout,
        enable_http2: config.runtime.enable_http2,
        shutdown_timeout: config.shutdown_timeout,
    }
}

/// Done when the webhook should stop accepting: on SIGTERM/SIGINT /readyz
/// fails at once, and the listener stays open for --shutdown-delay more.
fn stop_accepting(
    readiness: &Readiness,
    signals: &shared::serve::shutdown::Signals,
    shutdown_delay: Duration,
) -> impl Future<Output = ()> + Send + 'static {
    let failing = readiness.fail_after(signals.requested());
    async move {
        failing.await;
        // Endpoints need a moment to drop this replica: keep serving.
        if !shutdown_delay.is_zero() {
            tracing::info!(delay = ?shutdown_delay, "serving on during --shutdown-delay");
            tokio::time::sleep(shutdown_delay).await;
        }
    }
}
