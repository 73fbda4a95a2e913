//! A hardened HTTPS server loop shared by the webhook's admission port and the
//! secure metrics port: a bounded number of connections, a TLS handshake
//! deadline, an idle timeout, HTTP/2 only when asked for, and a graceful stop
//! that lets in-flight requests finish (bounded by a timeout).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Per-connection settings of the TLS listener.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub max_connections: usize,
    pub tls_handshake_timeout: Duration,
    pub idle_timeout: Duration,
    pub enable_http2: bool,
    pub shutdown_timeout: Duration,
}

/// Serve `router` over TLS on `listener` until `shutdown` completes, then
/// finish in-flight requests (at most `opts.shutdown_timeout`).
pub async fn serve(
    endpoint: &'static str,
    listener: TcpListener,
    tls: ServerConfig,
    router: Router,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(opts.max_connections));
    let builder = Arc::new(connection_builder(&opts));
    let mut shutdown = std::pin::pin!(shutdown);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(endpoint, %addr, http2 = opts.enable_http2, "listening");
    }

    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(endpoint, %peer, max = opts.max_connections, "connection limit reached; closing new connection");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            acceptor: acceptor.clone(),
            builder: builder.clone(),
            handshake_timeout: opts.tls_handshake_timeout,
            peer,
        };
        let service = TowerToHyperService::new(router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            connection.run(stream, service, watcher).await;
        });
    }

    drop(listener);
    finish_in_flight(endpoint, graceful, opts.shutdown_timeout).await;
}

/// The HTTP side of every connection: HTTP/1 with keep-alive and a header
/// deadline, plus HTTP/2 only when asked for.
fn connection_builder(opts: &ServeOptions) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.idle_timeout)
        .keep_alive(true);
    if !opts.enable_http2 {
        builder = builder.http1_only();
    }
    builder
}

/// One accepted TCP connection: its TLS handshake (bounded), then HTTP.
struct Connection {
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    handshake_timeout: Duration,
    peer: SocketAddr,
}

impl Connection {
    async fn run(self, stream: TcpStream, service: TowerToHyperService<Router>, watcher: Watcher) {
        let peer = self.peer;
        let accepting = self.acceptor.accept(stream);
        let tls = match tokio::time::timeout(self.handshake_timeout, accepting).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        };
        let conn = self.builder.serve_connection(TokioIo::new(tls), service);
        if let Err(e) = watcher.watch(conn).await {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }
}

/// Let the connections still open finish, for at most `timeout`.
async fn finish_in_flight(endpoint: &'static str, graceful: GracefulShutdown, timeout: Duration) {
    tracing::info!(
        connections = graceful.count(),
        endpoint,
        "stopped accepting; finishing in-flight requests"
    );
    if tokio::time::timeout(timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(endpoint, timeout = ?timeout, "in-flight requests did not finish in time; closing anyway");
    }
}
