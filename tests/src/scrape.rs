//! Reading a secure `/metrics` endpoint as Prometheus does: HTTPS, with the
//! bearer token of a ServiceAccount bound to ClusterRole nmo-metrics-reader
//! (manifests/controller), the server certificate checked against a CA.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use nmo_webhook_client::{ClientConfig, ReviewClient, tls_config};
use serde_json::json;

const NS: &str = "nmo-system";

/// A scraper: ServiceAccount nmo-system/`name`, bound to nmo-metrics-reader.
pub struct MetricsReader {
    name: String,
    token: String,
    tls: Arc<ClientConfig>,
}

impl MetricsReader {
    /// Create the ServiceAccount and its binding (kept when they exist) and
    /// mint a token; the servers' certificates must chain to `ca_pem`.
    pub async fn create(client: &Client, name: &str, ca_pem: &[u8]) -> anyhow::Result<Self> {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        ignore_exists(
            Api::<ServiceAccount>::namespaced(client.clone(), NS)
                .create(&PostParams::default(), &sa)
                .await,
        )
        .with_context(|| format!("creating ServiceAccount {NS}/{name}"))?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "nmo-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
        }))?;
        ignore_exists(
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&PostParams::default(), &binding)
                .await,
        )
        .with_context(|| format!("binding {NS}/{name} to ClusterRole nmo-metrics-reader"))?;
        Ok(MetricsReader {
            name: name.to_string(),
            token: crate::process::service_account_token(client, NS, name).await?,
            tls: tls_config(ca_pem).context("the metrics CA")?,
        })
    }

    /// GET /metrics on 127.0.0.1:`port`; anything but 200 is an error.
    pub async fn scrape(&self, port: u16) -> anyhow::Result<String> {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let mut c = ReviewClient::connect(addr, "localhost", self.tls.clone()).await?;
        let req = http::Request::get("/metrics")
            .header("host", "localhost")
            .header("authorization", format!("Bearer {}", self.token))
            .body(Default::default())?;
        let (status, body) = c.send(req).await?;
        let body = String::from_utf8_lossy(&body).into_owned();
        anyhow::ensure!(
            status == http::StatusCode::OK,
            "GET https://{addr}/metrics as {NS}/{}: HTTP {status}: {body}",
            self.name
        );
        Ok(body)
    }

    /// Remove the ServiceAccount and the binding (best effort).
    pub async fn remove(self, client: &Client) {
        let dp = DeleteParams::default();
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&self.name, &dp)
            .await;
        let _ = Api::<ServiceAccount>::namespaced(client.clone(), NS)
            .delete(&self.name, &dp)
            .await;
    }
}

fn ignore_exists<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The sum of every sample of `series` (all label sets) in a Prometheus text page.
pub fn sum(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
