//! A small TLS client that talks to the webhook directly, as the API server
//! does: HTTP/1.1 with keep-alive, the server certificate verified against a
//! CA. Used by the webhook's in-process tests (webhook/tests/server.rs), the
//! integration tests and the benches (webhook-bench, scale-bench); not by the
//! webhook itself.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
pub use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("CA bundle is not usable: {0}")]
    Ca(String),
    #[error("connecting to {addr} failed: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS with {addr} failed: {source}")]
    Tls {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("building the request failed: {0}")]
    Request(#[from] hyper::http::Error),
}

/// TLS client settings trusting exactly the CA(s) in `ca_pem`.
pub fn tls_config(ca_pem: &[u8]) -> Result<Arc<ClientConfig>, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| ClientError::Ca(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| ClientError::Ca(e.to_string()))?;
    }
    let cfg = ClientConfig::builder_with_provider(shared::serve::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Ca(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Open a TLS connection to `addr`, checking the certificate for `server_name`.
pub async fn connect_tls(
    addr: SocketAddr,
    server_name: &str,
    tls: Arc<ClientConfig>,
) -> Result<TlsStream<TcpStream>, ClientError> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| ClientError::Connect { addr, source })?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| ClientError::Ca(format!("invalid server name {server_name:?}: {e}")))?;
    TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|source| ClientError::Tls { addr, source })
}

/// One keep-alive HTTP/1.1 connection to the webhook.
pub struct ReviewClient {
    sender: SendRequest<Full<Bytes>>,
    /// DER of the certificate the server presented on this connection.
    pub peer_certificate: Vec<u8>,
}

impl ReviewClient {
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        tls: Arc<ClientConfig>,
    ) -> Result<Self, ClientError> {
        let stream = connect_tls(addr, server_name, tls).await?;
        let peer_certificate = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(ReviewClient {
            sender,
            peer_certificate,
        })
    }

    /// POST a JSON body to `path`; returns status and body.
    pub async fn post(
        &mut self,
        path: &str,
        body: impl Into<Bytes>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let req = Request::post(path)
            .header("host", "webhook")
            .header("content-type", "application/json")
            .body(Full::new(body.into()))?;
        self.send(req).await
    }

    /// A request with any method, path and content type (None: no header).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<Bytes>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "webhook");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        self.send(req.body(Full::new(body.into()))?).await
    }

    /// Send any request (tests use it for malformed ones).
    pub async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// What a connection did after one raw request: see [`send_raw_then_reuse`].
#[derive(Debug)]
pub struct Reuse {
    /// Status line and headers of the first answer ("" if none in time).
    pub first: String,
    /// The first answer said `Connection: close`.
    pub said_close: bool,
    /// Status line and headers of the answer to `follow_up` sent on the same
    /// connection; None when the first answer said close (nothing is sent).
    pub second: Option<String>,
}

/// Send `raw` on a fresh TLS connection, read one whole answer, then, unless
/// it said `Connection: close`, send `follow_up` on the same connection and
/// read its answer. A server that closes a connection without saying so shows
/// up as `second == Some("")`.
pub async fn send_raw_then_reuse(
    addr: SocketAddr,
    server_name: &str,
    tls: Arc<ClientConfig>,
    raw: &[u8],
    follow_up: &[u8],
    wait: std::time::Duration,
) -> Result<Reuse, ClientError> {
    use tokio::io::AsyncWriteExt;
    let stream = connect_tls(addr, server_name, tls).await?;
    let (mut rd, mut wr) = tokio::io::split(stream);
    let raw = raw.to_vec();
    // Write while reading: the server may answer before the body is complete.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&raw).await;
        let _ = wr.flush().await;
        wr
    });
    let mut pending = Vec::new();
    let first = tokio::time::timeout(wait, read_answer(&mut rd, &mut pending))
        .await
        .unwrap_or_default();
    let said_close = first
        .to_ascii_lowercase()
        .lines()
        .any(|l| l.trim() == "connection: close");
    if first.is_empty() || said_close {
        writer.abort();
        return Ok(Reuse {
            first,
            said_close,
            second: None,
        });
    }
    let Ok(Ok(mut wr)) = tokio::time::timeout(wait, writer).await else {
        return Ok(Reuse {
            first,
            said_close,
            second: Some(String::new()),
        });
    };
    let _ = wr.write_all(follow_up).await;
    let _ = wr.flush().await;
    let second = tokio::time::timeout(wait, read_answer(&mut rd, &mut pending))
        .await
        .unwrap_or_default();
    Ok(Reuse {
        first,
        said_close,
        second: Some(second),
    })
}

/// Read one HTTP/1.1 answer (headers, then a Content-Length body) and return
/// its head; bytes past it stay in `pending`. "" when the connection ends first.
async fn read_answer<R: tokio::io::AsyncRead + Unpin>(rd: &mut R, pending: &mut Vec<u8>) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let len: usize = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            let total = end + 4 + len;
            while pending.len() < total {
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return String::new(),
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                }
            }
            pending.drain(..total);
            return head;
        }
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => return String::new(),
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// DER of the first certificate in a PEM string.
pub fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .ok()
        .map(|c| c.as_ref().to_vec())
}

/// An AdmissionReview v1 CREATE request for a NodeMaintenance, as the API server sends it.
pub fn create_review(uid: &str, name: &str, node: &str) -> String {
    serde_json::json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
            "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
            "requestKind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
            "requestResource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": {
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
                "kind": "NodeMaintenance",
                "metadata": {
                    "name": name,
                    "uid": "0b0e4f4c-1b2a-4c8e-9a57-6a9f1f4f2d10",
                    "creationTimestamp": "2026-11-29T10:00:00Z",
                    "managedFields": [{
                        "manager": "kubectl-create", "operation": "Update",
                        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
                        "time": "2026-11-29T10:00:00Z", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:spec": {".": {}, "f:nodeName": {}, "f:reason": {}}}
                    }]
                },
                "spec": {"nodeName": node, "reason": "kernel upgrade"}
            },
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
    .to_string()
}

/// The `response` part of a review answer: (uid, allowed, status code, message).
pub fn parse_response(body: &[u8]) -> Option<(String, bool, u16, String)> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let r = v.get("response")?;
    Some((
        r.get("uid")?.as_str()?.to_string(),
        r.get("allowed")?.as_bool()?,
        r.pointer("/status/code")
            .and_then(|c| c.as_u64())
            .unwrap_or(0) as u16,
        r.pointer("/status/message")
            .and_then(|m| m.as_str())
            .unwrap_or("")
            .to_string(),
    ))
}
