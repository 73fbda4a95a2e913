//! The `/metrics` listener of both binaries, served as controller-runtime
//! serves it: by default over HTTPS with each request's bearer token checked
//! by a TokenReview and a SubjectAccessReview ([`crate::serve::metrics_auth`]);
//! with `--metrics-secure=false` as plain HTTP to anyone.
//!
//! The certificate comes from `--metrics-cert-dir` (reloaded on rotation like
//! the webhook's) or is self-signed at start. HTTP/2 only with `--enable-http2`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::middleware;
use kube::Client;
use prometheus::Registry;

use crate::serve::https::ServeOptions;
use crate::serve::metrics_auth::{Authorizer, CacheTtls, KubeReviews, require_authorization};
use crate::serve::probes::{ServeError, bind_and_serve, metrics_router};
use crate::serve::telemetry::{BindAddressError, RuntimeFlags, parse_bind_address};
use crate::serve::tls::{
    CertMetrics, CertPaths, CertResolver, TlsError, server_config, watch_for_changes,
};

/// How often a certificate from --metrics-cert-dir is re-read without a change event.
const CERT_REREAD_INTERVAL: Duration = Duration::from_secs(60);

/// Where and how `/metrics` is served, from the runtime flags.
#[derive(Debug, Clone)]
pub struct MetricsServing {
    pub addr: SocketAddr,
    pub secure: bool,
    /// None: a self-signed certificate.
    pub cert: Option<CertPaths>,
    pub enable_http2: bool,
    /// DNS names of a self-signed certificate (localhost is always in).
    pub server_names: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum MetricsServeError {
    #[error(transparent)]
    BindAddress(#[from] BindAddressError),
    #[error(transparent)]
    Bind(#[from] ServeError),
    #[error(
        "metrics certificate (--metrics-cert-dir, --metrics-cert-name, --metrics-key-name): {0}"
    )]
    Tls(#[from] TlsError),
}

/// A running listener; await it to serve until the shutdown future given to [`serve`] fires.
pub type Serving = Pin<Box<dyn Future<Output = ()> + Send>>;

impl MetricsServing {
    /// None when `--metrics-bind-address=0` turns metrics off.
    pub fn from_flags(
        flags: &RuntimeFlags,
        server_names: Vec<String>,
    ) -> Result<Option<Self>, BindAddressError> {
        let Some(addr) = parse_bind_address("--metrics-bind-address", &flags.metrics_bind_address)?
        else {
            return Ok(None);
        };
        let cert = flags.metrics_cert_dir.as_ref().map(|dir| CertPaths {
            dir: dir.clone(),
            cert: dir.join(&flags.metrics_cert_name),
            key: dir.join(&flags.metrics_key_name),
        });
        Ok(Some(MetricsServing {
            addr,
            secure: flags.metrics_secure,
            cert,
            enable_http2: flags.enable_http2,
            server_names,
        }))
    }
}

/// Bind now (a taken port or unusable certificate fails the start) and return
/// the serving future. `client` asks the reviews in secure mode.
pub async fn serve(
    cfg: MetricsServing,
    registry: Registry,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Serving, MetricsServeError> {
    if !cfg.secure {
        tracing::warn!(
            addr = %cfg.addr,
            "serving /metrics over plain HTTP without authentication (--metrics-secure=false)"
        );
        let fut = bind_and_serve("metrics", cfg.addr, metrics_router(registry), shutdown).await?;
        return Ok(Box::pin(async move {
            if let Err(e) = fut.await {
                tracing::error!(error = %e, "metrics endpoint stopped");
            }
        }));
    }

    let resolver = Arc::new(match cfg.cert {
        Some(paths) => CertResolver::load(paths, CertMetrics::detached())?,
        None => CertResolver::self_signed(&cfg.server_names, CertMetrics::detached())?,
    });
    let tls = server_config(resolver.clone(), cfg.enable_http2)?;
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|source| ServeError {
            what: "metrics",
            addr: cfg.addr,
            source,
        })?;
    let authorizer = Arc::new(Authorizer::new(
        Arc::new(KubeReviews::new(client)),
        CacheTtls::default(),
    ));
    let router = metrics_router(registry).layer(middleware::from_fn_with_state(
        authorizer,
        require_authorization,
    ));
    let opts = ServeOptions {
        max_connections: 64,
        tls_handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
        enable_http2: cfg.enable_http2,
        shutdown_timeout: Duration::from_secs(5),
    };
    Ok(Box::pin(async move {
        // The watch ends with the listener; it returns at once for a generated certificate.
        let watch = tokio::spawn(watch_for_changes(
            resolver,
            CERT_REREAD_INTERVAL,
            std::future::pending(),
        ));
        crate::serve::https::serve("metrics", listener, tls, router, opts, shutdown).await;
        watch.abort();
    }))
}
