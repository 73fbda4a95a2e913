//! The controller's endpoints beside the API server work: health probes
//! (started first, so a slow API server still shows liveness) and metrics
//! (HTTPS with token checks unless --metrics-secure=false). Both answer until
//! the process exits, so /readyz says "shutting down" while reconciles finish.

use anyhow::Context as _;
use kube::Client;
use shared::serve::probes::{Readiness, spawn_probes};
use shared::serve::telemetry::parse_bind_address;

use crate::config::Config;
use crate::metrics::Metrics;

pub async fn probes(cfg: &Config, readiness: &Readiness) -> anyhow::Result<()> {
    let flag = "--health-probe-bind-address";
    if let Some(addr) = parse_bind_address(flag, &cfg.runtime.health_probe_bind_address)? {
        spawn_probes(addr, readiness).await?;
    }
    Ok(())
}

pub async fn metrics(cfg: &Config, metrics: &Metrics, client: &Client) -> anyhow::Result<()> {
    let names = vec![format!(
        "nmo-controller-metrics.{}.svc",
        cfg.leader_election_namespace
    )];
    if let Some(serving) =
        shared::serve::metrics_server::MetricsServing::from_flags(&cfg.runtime, names)?
    {
        let serving = shared::serve::metrics_server::serve(
            serving,
            metrics.registry.clone(),
            client.clone(),
            std::future::pending(),
        )
        .await?;
        tokio::spawn(serving);
    }
    Ok(())
}

/// Requests of one client waiting for their answer at once: 100
/// maintenances evicting 32 pods each would otherwise send 3,200 at once
/// (over HTTP/1.1, each on a TLS connection of its own), which a busy API
/// server serves no faster than a queue here.
const MAX_IN_FLIGHT: usize = crate::drain::IN_FLIGHT;

/// The controller's API clients, every request counted in the metrics: one
/// for everything, and one for evictions that does not retry 429 by itself:
/// for the Eviction API a 429 is the answer ("a PodDisruptionBudget says not
/// now"), and the drain must record it and move on, not sit in a
/// multi-minute backoff.
pub async fn clients(metrics: &Metrics) -> anyhow::Result<Clients> {
    let mut config = kube::Config::infer().await.context(
        "loading the Kubernetes client configuration (in-cluster or KUBECONFIG); check the service account or kubeconfig",
    )?;
    let api = counted_client(metrics, &config)?;
    config.default_retry = false;
    Ok(Clients {
        api,
        evict: counted_client(metrics, &config)?,
    })
}

/// A client whose every request is counted (`Metrics::rest_layer`), with at
/// most [`MAX_IN_FLIGHT`] requests waiting for their response headers at
/// once (a watch counts until its stream begins); HTTP/2 when the API server
/// offers it (`shared::kube::client`).
fn counted_client(metrics: &Metrics, config: &kube::Config) -> anyhow::Result<Client> {
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.as_str().to_string())
        .unwrap_or_default();
    Ok(shared::kube::client::builder(config)?
        .with_layer(&metrics.rest_layer(&host))
        .with_layer(&tower::limit::ConcurrencyLimitLayer::new(MAX_IN_FLIGHT))
        .build())
}

/// See [`clients`].
#[derive(Clone)]
pub struct Clients {
    /// Everything but evictions.
    pub api: Client,
    /// The Eviction API: same credentials, no retries of its own on 429.
    pub evict: Client,
}
