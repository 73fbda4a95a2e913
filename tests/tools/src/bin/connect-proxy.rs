//! `connect-proxy`: the local API server's "cluster" egress into the real node
//! (tests/node/up.sh). An HTTP CONNECT proxy listening on a unix socket, run
//! inside the node's network namespace: the API server (on the machine's
//! loopback, `--egress-selector-config-file`) asks it for a Service's
//! ClusterIP (a webhook named by `clientConfig.service`) or a kubelet's
//! address (logs, exec), and it dials from where those addresses exist
//! (kube-proxy's rules turn a ClusterIP into a pod's address there).
//!
//! It answers only CONNECT (the API server's egress speaks nothing else), to
//! addresses of the private ranges the node's namespace holds, and logs one
//! line per refused or failed tunnel.

use std::io::{self, BufReader, Write as _};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;

/// The head of a CONNECT request is a few short lines; anything longer is not
/// the API server speaking.
const MAX_HEAD: usize = 8 * 1024;
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Parser, Debug)]
#[command(
    about = "HTTP CONNECT proxy on a unix socket (the local API server's egress into the real node)"
)]
struct Args {
    /// The unix socket to listen on (replaced if it exists).
    #[arg(long)]
    listen: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = std::fs::remove_file(&args.listen);
    let listener = UnixListener::bind(&args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen.display()))?;
    eprintln!("connect-proxy: listening on {}", args.listen.display());
    for conn in listener.incoming() {
        match conn {
            Ok(conn) => {
                thread::spawn(move || {
                    if let Err(e) = tunnel(conn) {
                        eprintln!("connect-proxy: {e:#}");
                    }
                });
            }
            Err(e) => eprintln!("connect-proxy: accept failed: {e}"),
        }
    }
    Ok(())
}

/// Reads one CONNECT request, dials its target and copies both ways until
/// either side closes.
fn tunnel(client: UnixStream) -> anyhow::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let target = read_connect(&mut reader)?;
    let mut client = client;
    let upstream = match dial(&target) {
        Ok(s) => s,
        Err(e) => {
            let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
            return Err(e);
        }
    };
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    // The API server speaks TLS next (client first): nothing is buffered
    // beyond the head, but hand over whatever is.
    let buffered = reader.buffer().to_vec();
    let mut up_w = upstream.try_clone()?;
    up_w.write_all(&buffered)?;
    let mut up_r = upstream;
    let mut client_w = client.try_clone()?;
    let back = thread::spawn(move || {
        let _ = io::copy(&mut up_r, &mut client_w);
        let _ = client_w.shutdown(Shutdown::Write);
    });
    let mut client_r = reader.into_inner();
    let _ = io::copy(&mut client_r, &mut up_w);
    let _ = up_w.shutdown(Shutdown::Write);
    let _ = back.join();
    Ok(())
}

/// The `host:port` of a `CONNECT host:port HTTP/1.1` head.
fn read_connect(reader: &mut impl io::BufRead) -> anyhow::Result<SocketAddr> {
    let mut line = String::new();
    let mut total = reader.read_line(&mut line)?;
    let request = line.trim_end().to_owned();
    loop {
        line.clear();
        let n = reader.read_line(&mut line)?;
        total += n;
        if n == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if total > MAX_HEAD {
            bail!("request head over {MAX_HEAD} bytes");
        }
    }
    parse_connect(&request)
}

fn parse_connect(request: &str) -> anyhow::Result<SocketAddr> {
    let mut words = request.split_whitespace();
    let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
        bail!("not a CONNECT request: {request:?}");
    };
    let addr: SocketAddr = target
        .parse()
        .with_context(|| format!("CONNECT target {target:?} is not an IP:port"))?;
    if !inside_node(addr.ip()) {
        bail!("CONNECT to {addr} refused: only the node namespace's private addresses are served");
    }
    Ok(addr)
}

/// Pod, Service and node addresses in the node's namespace are private-range
/// IPv4; nothing else is dialed from there.
fn inside_node(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_private(),
        IpAddr::V6(_) => false,
    }
}

fn dial(addr: &SocketAddr) -> anyhow::Result<TcpStream> {
    TcpStream::connect_timeout(addr, DIAL_TIMEOUT).with_context(|| format!("dial {addr} failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_heads() {
        let cases = [
            ("CONNECT 10.96.0.10:443 HTTP/1.1", Some("10.96.0.10:443")),
            ("CONNECT 10.87.0.2:10250 HTTP/1.1", Some("10.87.0.2:10250")),
            ("GET / HTTP/1.1", None),
            ("CONNECT example.com:443 HTTP/1.1", None),
            ("CONNECT 127.0.0.1:22 HTTP/1.1", None),
            ("CONNECT 8.8.8.8:53 HTTP/1.1", None),
            ("", None),
        ];
        for (head, want) in cases {
            let got = parse_connect(head).ok().map(|a| a.to_string());
            assert_eq!(got.as_deref(), want, "{head}");
        }
    }

    #[test]
    fn reads_the_head_up_to_the_blank_line() {
        let mut input = io::Cursor::new(
            b"CONNECT 10.96.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n\x16\x03".to_vec(),
        );
        let addr = read_connect(&mut input).map(|a| a.to_string()).ok();
        assert_eq!(addr.as_deref(), Some("10.96.0.1:443"));
    }
}
