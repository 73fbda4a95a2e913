//! Plain-HTTP health probes and Prometheus metrics endpoints.
//!
//! `/healthz` answers while the process runs; `/readyz` only once the binary
//! says it is ready (caches synced, certificate loaded, ...) and not after
//! shutdown began. Both live on their own port, never on the webhook's TLS port.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};

/// A set of named readiness gates; ready when every gate is open.
type GateList = Vec<(String, Arc<AtomicBool>)>;

#[derive(Clone, Default)]
pub struct Readiness {
    gates: Arc<std::sync::Mutex<GateList>>,
    shutting_down: Arc<AtomicBool>,
}

/// One readiness gate, opened by whoever owns it.
#[derive(Clone)]
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    pub fn set(&self, open: bool) {
        self.0.store(open, Ordering::SeqCst);
    }
    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl Readiness {
    /// Register a gate, closed until set.
    pub fn gate(&self, name: &str) -> Gate {
        let flag = Arc::new(AtomicBool::new(false));
        if let Ok(mut g) = self.gates.lock() {
            g.push((name.to_string(), flag.clone()));
        }
        Gate(flag)
    }

    /// Names of the gates still closed (empty when ready).
    pub fn waiting_for(&self) -> Vec<String> {
        let mut out: Vec<String> = match self.gates.lock() {
            Ok(g) => g
                .iter()
                .filter(|(_, f)| !f.load(Ordering::SeqCst))
                .map(|(n, _)| n.clone())
                .collect(),
            Err(_) => vec!["readiness state".to_string()],
        };
        if self.shutting_down.load(Ordering::SeqCst) {
            out.push("shutting down".to_string());
        }
        out
    }

    pub fn is_ready(&self) -> bool {
        self.waiting_for().is_empty()
    }

    /// Mark the process as shutting down: `/readyz` turns red for good.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Resolves after `requested` did, having turned `/readyz` red: hand it
    /// to whatever stops the work on shutdown.
    pub fn fail_after(
        &self,
        requested: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        let me = self.clone();
        async move {
            requested.await;
            tracing::info!("shutdown requested: /readyz now fails; finishing the work in flight");
            me.begin_shutdown();
        }
    }

    /// Whether shutdown began (servers then stop keeping connections alive).
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(r): State<Readiness>) -> impl IntoResponse {
    let waiting = r.waiting_for();
    if waiting.is_empty() {
        (StatusCode::OK, "ok".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: waiting for {}", waiting.join(", ")),
        )
    }
}

async fn metrics(State(reg): State<Registry>) -> impl IntoResponse {
    let mut buf = Vec::new();
    let families = reg.gather();
    match TextEncoder::new().encode(&families, &mut buf) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            buf,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics failed: {e}"),
        )
            .into_response(),
    }
}

/// Router with `/healthz` and `/readyz`.
pub fn probe_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

/// Router with `/metrics`.
pub fn metrics_router(registry: Registry) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry)
}

/// Errors starting a plain-HTTP endpoint.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot listen on {addr} for {what}: {source}; free the port or pick another with the matching flag"
)]
pub struct ServeError {
    pub what: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Bind `addr` now (so a taken port fails at start) and serve `router` until `shutdown`.
pub async fn bind_and_serve(
    what: &'static str,
    addr: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<impl Future<Output = std::io::Result<()>>, ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError { what, addr, source })?;
    // The bound address (port 0 resolves to a real port here).
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(endpoint = what, addr = %bound, "listening");
    Ok(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
    })
}

/// Serve the health probes on `addr` until the process exits (bound now,
/// so a taken port fails at start): /readyz keeps answering, "shutting
/// down" included, while the work in flight finishes.
pub async fn spawn_probes(addr: SocketAddr, readiness: &Readiness) -> Result<(), ServeError> {
    let serving = bind_and_serve(
        "health probes",
        addr,
        probe_router(readiness.clone()),
        std::future::pending(),
    )
    .await?;
    tokio::spawn(serving);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_every_gate() {
        let r = Readiness::default();
        assert!(r.is_ready(), "no gates: ready");
        let a = r.gate("nodes cache");
        let b = r.gate("certificate");
        assert_eq!(r.waiting_for(), vec!["nodes cache", "certificate"]);
        a.set(true);
        assert_eq!(r.waiting_for(), vec!["certificate"]);
        b.set(true);
        assert!(r.is_ready());
        r.begin_shutdown();
        assert!(!r.is_ready());
    }
}
