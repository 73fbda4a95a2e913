//! The API client both services use: kube's own layers (base URI,
//! authentication, extra headers, its retry policy when the configuration
//! asks for it) over a hyper client that speaks HTTP/2 when the API server
//! offers it, as client-go does.
//!
//! Why not kube's default client: it speaks HTTP/1.1 only, so every watch
//! and every request in flight holds a TLS connection of its own, with its
//! buffers (kept idle up to 90 s after a burst). The controller draining 100
//! nodes at once had some 130 (64 pod watches, the evictions and reads in
//! flight) and peaked at 48 MiB. Over HTTP/2 all of them are streams of one
//! connection. Pings every 30 s find a dead connection (an API server that
//! went away without closing it); every request and watch then fails over to
//! a new one, and the watches list again as after any lost connection.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ClientBuilder, ConfigExt, retry::RetryPolicy};
use tower::{BoxError, ServiceBuilder, ServiceExt as _, util::BoxService};

/// How often an HTTP/2 connection is pinged (client-go checks after 30 s
/// without a read), and how long the answer may take.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The service type of [`builder`]'s client, boxed so callers can layer on it.
pub type Service =
    BoxService<http::Request<Body>, http::Response<Box<kube::client::DynBody>>, BoxError>;

#[derive(Debug, thiserror::Error)]
#[error("building the Kubernetes client for {server}: {source}")]
pub struct Error {
    server: String,
    #[source]
    source: kube::Error,
}

/// A [`ClientBuilder`] for `config`, HTTP/2 when the API server offers it
/// (ALPN), HTTP/1.1 otherwise. Add layers with `with_layer`, then `build()`.
pub fn builder(config: &kube::Config) -> Result<ClientBuilder<Service>, Error> {
    let err = |source| Error {
        server: config.cluster_url.to_string(),
        source,
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    http.set_nodelay(true);
    let tls = config.rustls_client_config().map_err(err)?;
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    let hyper_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build::<_, Body>(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(err)?)
        .layer(config.extra_headers_layer().map_err(err)?)
        .map_err(BoxError::from)
        .service(hyper_client)
        .map_response(|r| {
            r.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from))
                    as Box<kube::client::DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// A plain client for `config` (see [`builder`]).
pub fn client(config: &kube::Config) -> Result<kube::Client, Error> {
    Ok(builder(config)?.build())
}
