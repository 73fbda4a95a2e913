//! The real node (tests/node/up.sh, `make real-node`) as the tests see it:
//! its state file, and the way in that the API server uses. Pod and Service
//! addresses exist only inside the node's network namespace; a test reaches
//! them as the API server does, through the "cluster" egress socket
//! (`.cluster/sockets/egress.sock`: an HTTP CONNECT proxy inside the node).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::UnixStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

pub const NODE_NAME: &str = "real-1";

/// The node's state file (`.cluster/real-1/state.env`) as keys and values;
/// an error saying how to start the node when it is not up.
pub fn state() -> anyhow::Result<BTreeMap<String, String>> {
    let path = crate::cluster_dir().join(NODE_NAME).join("state.env");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "the real node is not up ({} unreadable): run make real-node, or tests/node/stage.sh",
            path.display()
        )
    })?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn egress_socket() -> PathBuf {
    crate::cluster_dir().join("sockets").join("egress.sock")
}

/// A connection to `addr` (a pod's or a Service's address) opened from
/// inside the node, through the egress socket's CONNECT proxy.
pub async fn connect(addr: SocketAddr) -> anyhow::Result<UnixStream> {
    let sock = egress_socket();
    let mut s = UnixStream::connect(&sock).await.with_context(|| {
        format!(
            "no egress socket at {}: is the real node up?",
            sock.display()
        )
    })?;
    s.write_all(format!("CONNECT {addr} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader.read_line(&mut status).await?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? <= 2 {
            break;
        }
    }
    if !status.starts_with("HTTP/1.1 200") {
        bail!(
            "CONNECT {addr} through {}: {}",
            sock.display(),
            status.trim()
        );
    }
    Ok(reader.into_inner())
}

/// The certificate (DER) that `addr` serves for `server_name`, verified
/// against `tls`'s roots: what the API server sees when it calls there.
pub async fn served_certificate(
    addr: SocketAddr,
    server_name: &str,
    tls: Arc<ClientConfig>,
) -> anyhow::Result<Vec<u8>> {
    let stream = connect(addr).await?;
    let name = ServerName::try_from(server_name.to_string())?;
    let tls = TlsConnector::from(tls)
        .connect(name, stream)
        .await
        .with_context(|| format!("TLS handshake with {addr} as {server_name}"))?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .context("no peer certificate")
}

/// Tag an image in the node's containerd (`ctr images tag`): a second
/// reference to the same content, as a second build is pulled under a new tag.
pub fn tag_image(from: &str, to: &str) -> anyhow::Result<()> {
    let st = state()?;
    let sock = st
        .get("CONTAINERD_SOCKET")
        .context("CONTAINERD_SOCKET missing from the node's state file")?;
    let out = std::process::Command::new("ctr")
        .args([
            "--address",
            sock,
            "--namespace",
            "k8s.io",
            "images",
            "tag",
            "--force",
            from,
            to,
        ])
        .output()
        .context("running ctr")?;
    if !out.status.success() {
        bail!(
            "ctr images tag {from} {to}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
