//! A lean HTTP/1.1 review sender for the bench: requests are written from a
//! reused buffer and responses read with just enough parsing to find their end
//! and check status and uid. The hyper client costs the (shared) CPU several
//! times more per review, and on a 2-vCPU machine the load generator's own
//! cost shows up in the webhook's latency figures.

use std::net::SocketAddr;
use std::sync::Arc;

use nmo_webhook_client::{ClientConfig, connect_tls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Largest response accepted; reviews answers are a few hundred bytes.
const MAX_RESPONSE: usize = 1 << 20;

pub struct RawConn {
    stream: TlsStream<TcpStream>,
    out: Vec<u8>,
    inbuf: Vec<u8>,
}

impl RawConn {
    pub async fn connect(
        addr: SocketAddr,
        server_name: &str,
        tls: Arc<ClientConfig>,
    ) -> Result<Self, String> {
        let stream = connect_tls(addr, server_name, tls)
            .await
            .map_err(|e| e.to_string())?;
        Ok(RawConn {
            stream,
            out: Vec::with_capacity(4096),
            inbuf: Vec::with_capacity(4096),
        })
    }

    /// POST `head + uid + tail` as JSON to `path`; Ok(true) when the answer
    /// is a 200 whose body names `uid`.
    pub async fn review(
        &mut self,
        path: &str,
        head: &str,
        uid: &str,
        tail: &str,
    ) -> Result<bool, String> {
        let len = head.len() + uid.len() + tail.len();
        self.out.clear();
        self.out.extend_from_slice(
            format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: {len}\r\n\r\n"
            )
            .as_bytes(),
        );
        self.out.extend_from_slice(head.as_bytes());
        self.out.extend_from_slice(uid.as_bytes());
        self.out.extend_from_slice(tail.as_bytes());
        self.stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("sending: {e}"))?;
        self.stream
            .flush()
            .await
            .map_err(|e| format!("sending: {e}"))?;

        self.inbuf.clear();
        let mut chunk = [0u8; 4096];
        let (header_end, body_len) = loop {
            if let Some(end) = find(&self.inbuf, b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.inbuf[..end])
                    .map_err(|_| "response head is not UTF-8".to_string())?;
                break (end + 4, content_length(head)?);
            }
            self.read_more(&mut chunk).await?;
        };
        while self.inbuf.len() < header_end + body_len {
            self.read_more(&mut chunk).await?;
        }
        let ok_status = self.inbuf.starts_with(b"HTTP/1.1 200 ");
        let body = &self.inbuf[header_end..header_end + body_len];
        let quoted = format!("\"{uid}\"");
        Ok(ok_status && find(body, quoted.as_bytes()).is_some())
    }

    async fn read_more(&mut self, chunk: &mut [u8]) -> Result<(), String> {
        let n = self
            .stream
            .read(chunk)
            .await
            .map_err(|e| format!("receiving: {e}"))?;
        if n == 0 {
            return Err("connection closed by the webhook".into());
        }
        if self.inbuf.len() + n > MAX_RESPONSE {
            return Err(format!("response larger than {MAX_RESPONSE} bytes"));
        }
        self.inbuf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The Content-Length of a response head (keep-alive answers always carry one here).
fn content_length(head: &str) -> Result<usize, String> {
    head.split("\r\n")
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .ok_or_else(|| "response without Content-Length".to_string())?
        .1
        .trim()
        .parse()
        .map_err(|e| format!("bad Content-Length: {e}"))
}

#[cfg(test)]
mod tests {
    use super::{content_length, find};

    #[test]
    fn response_framing() {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 42";
        assert_eq!(content_length(head), Ok(42));
        assert!(content_length("HTTP/1.1 200 OK\r\nx: y").is_err());
        assert_eq!(find(b"ab\r\n\r\ncd", b"\r\n\r\n"), Some(2));
        assert_eq!(find(b"abc", b"\"u\""), None);
    }
}
