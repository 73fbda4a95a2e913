//! The TLS admission endpoint in-process, with fake lookups: decisions over the
//! wire, the malformed-input battery, limits, HTTP/2 off, graceful shutdown.
//! No cluster needed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::Full;
use hyper::{Request, StatusCode};
use nmo_webhook::config::CertPaths;
use nmo_webhook::metrics::Metrics;
use nmo_webhook::server::{self, AppState, Limits, ServeOptions};
use nmo_webhook::tls::{CertResolver, server_config};
use nmo_webhook::validate::{EtcdGuard, Lookups, NodeFacts, Unavailable};
use nmo_webhook_client::{
    ReviewClient, connect_tls, create_review, parse_response, send_raw_then_reuse, tls_config,
};
use shared::api::consts::WEBHOOK_PATH;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct FakeCluster;

impl Lookups for FakeCluster {
    fn node(&self, name: &str) -> Result<Option<NodeFacts>, Unavailable> {
        Ok((name == "worker-1").then_some(NodeFacts {
            control_plane: false,
        }))
    }
    fn maintenance_exists_for(&self, _node: &str) -> Result<bool, Unavailable> {
        Ok(false)
    }
    fn is_openshift(&self) -> Result<bool, Unavailable> {
        Ok(false)
    }
    fn etcd_guard(&self, _node: &str) -> Result<EtcdGuard, Unavailable> {
        Err(Unavailable("not OpenShift".into()))
    }
    /// A node the cache misses and the direct read takes 3 s to find: a
    /// review for it holds its slot that long.
    fn confirm_node(&self, name: &str) -> futures::future::BoxFuture<'_, Option<NodeFacts>> {
        let slow = name == SLOW_NODE;
        Box::pin(async move {
            if !slow {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            Some(NodeFacts {
                control_plane: false,
            })
        })
    }
}

const SLOW_NODE: &str = "slow-to-confirm";

struct Running {
    addr: SocketAddr,
    ca_pem: Vec<u8>,
    metrics: Metrics,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Running {
    async fn client(&self) -> ReviewClient {
        ReviewClient::connect(
            self.addr,
            "localhost",
            tls_config(&self.ca_pem).expect("ca"),
        )
        .await
        .expect("connect")
    }
}

async fn start(limits: Limits) -> Running {
    start_with(limits, false).await
}

async fn start_with(limits: Limits, enable_http2: bool) -> Running {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!(
        "nmo-webhook-server-test-{}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = certs::Ca::new("test-ca", Duration::from_secs(3600)).expect("ca");
    let cert = ca
        .issue_serving(
            &["localhost".into()],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Duration::from_secs(3600),
        )
        .expect("cert");
    certs::write_serving_set(&dir, &ca, &cert).expect("write");
    let metrics = Metrics::new().expect("metrics");
    let resolver = Arc::new(
        CertResolver::load(
            CertPaths {
                dir: dir.clone(),
                cert: dir.join("tls.crt"),
                key: dir.join("tls.key"),
            },
            metrics.clone(),
        )
        .expect("load"),
    );
    let tls = server_config(resolver, enable_http2).expect("tls");
    let listener = server::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = AppState::new(
        Arc::new(FakeCluster),
        Default::default(),
        metrics.clone(),
        limits,
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server::serve(
        listener,
        tls,
        server::router(state),
        ServeOptions {
            max_connections: 64,
            tls_handshake_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            enable_http2,
            shutdown_timeout: Duration::from_secs(5),
        },
        async {
            let _ = rx.await;
        },
    ));
    Running {
        addr,
        ca_pem: ca.cert_pem().as_bytes().to_vec(),
        metrics,
        stop: Some(tx),
        task,
        dir,
    }
}

fn limits() -> Limits {
    Limits {
        max_body_bytes: 64 * 1024,
        request_timeout: Duration::from_millis(500),
        max_concurrent_reviews: 8,
    }
}

#[tokio::test]
async fn decisions_over_tls() {
    let srv = start(limits()).await;
    let mut c = srv.client().await;
    let (status, body) = c
        .post(WEBHOOK_PATH, create_review("u-1", "nm-1", "worker-1"))
        .await
        .expect("post");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        parse_response(&body),
        Some(("u-1".into(), true, 200, String::new()))
    );

    // Same connection (keep-alive), second review.
    let (status, body) = c
        .post(WEBHOOK_PATH, create_review("u-2", "nm-2", "ghost"))
        .await
        .expect("post");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        parse_response(&body),
        Some((
            "u-2".into(),
            false,
            403,
            "invalid nodeName, no node with name ghost found".into()
        ))
    );
    let ok = srv
        .metrics
        .requests_total
        .with_label_values(&["200", WEBHOOK_PATH])
        .get();
    assert_eq!(ok, 2);
    let denied = srv
        .metrics
        .decisions_total
        .with_label_values(&["CREATE", "false", "node_not_found"])
        .get();
    assert_eq!(denied, 1);
}

/// What the battery accepts as an answer: a denial carrying the uid, or a 4xx.
#[derive(Debug, PartialEq)]
enum Answer {
    Denied { uid: String, code: u16 },
    Http(u16),
}

fn classify(status: StatusCode, body: &Bytes) -> Answer {
    if status == StatusCode::OK {
        match parse_response(body) {
            Some((uid, false, code, msg)) => {
                assert!(!msg.is_empty(), "denial without a message");
                Answer::Denied { uid, code }
            }
            other => panic!("200 that is not a denial: {other:?} {body:?}"),
        }
    } else {
        Answer::Http(status.as_u16())
    }
}

#[tokio::test]
async fn malformed_input_gets_a_denial_or_a_4xx() {
    let srv = start(limits()).await;
    let valid = create_review("u-ok", "nm", "worker-1");
    // The valid review with one change applied.
    let with = |f: &dyn Fn(&mut serde_json::Value)| -> Vec<u8> {
        let mut v: serde_json::Value = serde_json::from_str(&valid).expect("json");
        f(&mut v);
        v.to_string().into_bytes()
    };
    let denied = || Answer::Denied {
        uid: "u-ok".into(),
        code: 400,
    };
    let deep = format!("{}{}", "[".repeat(30_000), "]".repeat(30_000));
    let cases: Vec<(&str, Vec<u8>, Answer)> = vec![
        ("empty body", vec![], Answer::Http(400)),
        ("not json", b"{nope".to_vec(), Answer::Http(400)),
        ("binary", vec![0xff, 0xfe, 0x00, 0x01], Answer::Http(400)),
        ("json array", b"[1,2,3]".to_vec(), Answer::Http(400)),
        ("json null", b"null".to_vec(), Answer::Http(400)),
        ("deep nesting", deep.into_bytes(), Answer::Http(400)),
        (
            "no request",
            with(&|v| drop(v.as_object_mut().map(|o| o.remove("request")))),
            Answer::Http(400),
        ),
        (
            "request null",
            with(&|v| v["request"] = serde_json::Value::Null),
            Answer::Http(400),
        ),
        (
            "no uid",
            with(&|v| drop(v["request"].as_object_mut().map(|o| o.remove("uid")))),
            Answer::Http(400),
        ),
        (
            "empty uid",
            with(&|v| v["request"]["uid"] = "".into()),
            Answer::Http(400),
        ),
        (
            "uid is a number",
            with(&|v| v["request"]["uid"] = 42.into()),
            Answer::Http(400),
        ),
        (
            "v1beta1 review",
            with(&|v| v["apiVersion"] = "admission.k8s.io/v1beta1".into()),
            denied(),
        ),
        (
            "no apiVersion",
            with(&|v| drop(v.as_object_mut().map(|o| o.remove("apiVersion")))),
            denied(),
        ),
        ("wrong kind", with(&|v| v["kind"] = "Pod".into()), denied()),
        (
            "operation missing",
            with(&|v| drop(v["request"].as_object_mut().map(|o| o.remove("operation")))),
            denied(),
        ),
        (
            "operation is a list",
            with(&|v| v["request"]["operation"] = serde_json::json!([1])),
            denied(),
        ),
        (
            "object is a string",
            with(&|v| v["request"]["object"] = "surprise".into()),
            denied(),
        ),
        (
            "object without spec",
            with(&|v| v["request"]["object"] = serde_json::json!({"metadata": {"name": "x"}})),
            denied(),
        ),
        (
            "object missing",
            with(&|v| v["request"]["object"] = serde_json::Value::Null),
            denied(),
        ),
        (
            "nodeName is a number",
            with(&|v| v["request"]["object"]["spec"]["nodeName"] = 7.into()),
            denied(),
        ),
        (
            "update without oldObject",
            with(&|v| v["request"]["operation"] = "UPDATE".into()),
            denied(),
        ),
        (
            "review for pods",
            with(&|v| {
                v["request"]["kind"] =
                    serde_json::json!({"group": "", "version": "v1", "kind": "Pod"})
            }),
            denied(),
        ),
    ];
    let mut c = srv.client().await;
    for (name, body, want) in cases {
        // A fresh connection when the previous answer may have closed it.
        let (status, resp) = match c.post(WEBHOOK_PATH, body.clone()).await {
            Ok(r) => r,
            Err(_) => {
                c = srv.client().await;
                c.post(WEBHOOK_PATH, body)
                    .await
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
            }
        };
        assert!(status.as_u16() < 500, "{name}: got {status}");
        let got = classify(status, &resp);
        assert_eq!(
            got,
            want,
            "{name}: body {:?}",
            String::from_utf8_lossy(&resp)
        );
    }

    // Requests that are wrong at the HTTP level.
    let wrong: Vec<(&str, Request<Full<Bytes>>, u16)> = vec![
        (
            "GET",
            Request::get(WEBHOOK_PATH)
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .expect("req"),
            405,
        ),
        (
            "unknown path",
            Request::post("/mutate")
                .header("host", "x")
                .body(Full::new(Bytes::from(valid.clone())))
                .expect("req"),
            404,
        ),
        (
            "yaml content type",
            Request::post(WEBHOOK_PATH)
                .header("host", "x")
                .header("content-type", "application/yaml")
                .body(Full::new(Bytes::from(valid.clone())))
                .expect("req"),
            415,
        ),
    ];
    for (name, req, want) in wrong {
        let mut c = srv.client().await;
        let (status, _) = c.send(req).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(status.as_u16(), want, "{name}");
    }

    // Declared length above the limit: refused before the body is read.
    let mut tls = connect_tls(srv.addr, "localhost", tls_config(&srv.ca_pem).expect("ca"))
        .await
        .expect("tls");
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        65 * 1024
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    let _ = tls.write_all(&vec![b' '; 65 * 1024]).await;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf))
        .await
        .expect("answer within 5 s")
        .expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "oversize: {answer:?}");

    // Chunked body with no length, growing past the limit.
    let mut tls = connect_tls(srv.addr, "localhost", tls_config(&srv.ca_pem).expect("ca"))
        .await
        .expect("tls");
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    let chunk = format!("{:x}\r\n{}\r\n", 8192, " ".repeat(8192));
    let mut answer = String::new();
    for _ in 0..16 {
        if tls.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut answer)).await;
    assert!(
        answer.starts_with("HTTP/1.1 413")
            && answer.to_ascii_lowercase().contains("connection: close"),
        "chunked oversize that never ends: 413 and Connection: close, got {answer:?}"
    );

    // Lying content-length (declares more than it sends): times out as 408.
    let mut tls = connect_tls(srv.addr, "localhost", tls_config(&srv.ca_pem).expect("ca"))
        .await
        .expect("tls");
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"a\":"
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf))
        .await
        .expect("answer within 5 s")
        .expect("read");
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "slow body: {answer:?}");

    // Garbage instead of TLS, then plain HTTP on the TLS port: connection dropped, server fine.
    for junk in [
        &b"\x16\x03\x01\x00\x05hello"[..],
        &b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..],
    ] {
        let mut tcp = tokio::net::TcpStream::connect(srv.addr).await.expect("tcp");
        let _ = tcp.write_all(junk).await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
    }

    // Still alive and answering.
    let mut c = srv.client().await;
    let (status, body) = c
        .post(WEBHOOK_PATH, create_review("u-after", "nm", "worker-1"))
        .await
        .expect("post");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(parse_response(&body).map(|r| r.1), Some(true));
    for code in ["500", "501", "502", "503", "504"] {
        assert_eq!(
            srv.metrics
                .requests_total
                .with_label_values(&[code, WEBHOOK_PATH])
                .get(),
            0
        );
    }
}

#[tokio::test]
async fn http2_is_not_offered_by_default() {
    let srv = start(limits()).await;
    let mut cfg = (*tls_config(&srv.ca_pem).expect("ca")).clone();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = connect_tls(srv.addr, "localhost", Arc::new(cfg))
        .await
        .expect("tls");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
}

#[tokio::test]
async fn overload_answers_429_not_5xx() {
    let srv = start(Limits {
        max_concurrent_reviews: 1,
        ..limits()
    })
    .await;
    // Hold the only slot for 3 s: a review for a node the lookups take 3 s
    // to confirm (the wait for a slot is 500 ms).
    let hog_client = srv.client().await;
    let hog = tokio::spawn(async move {
        let mut c = hog_client;
        c.post(WEBHOOK_PATH, create_review("u-hog", "nm", SLOW_NODE))
            .await
            .map(|(status, _)| status)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let gauge = srv
        .metrics
        .requests_in_flight
        .with_label_values(&[WEBHOOK_PATH]);
    while gauge.get() < 1 {
        assert!(Instant::now() < deadline, "hog request never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut c = srv.client().await;
    let (status, body) = c
        .post(WEBHOOK_PATH, create_review("u", "nm", "worker-1"))
        .await
        .expect("post");
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        String::from_utf8_lossy(&body)
    );
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("--max-concurrent-reviews"), "{text}");
    // The busy answer leaves the connection usable, and the hog is answered.
    assert_eq!(
        hog.await.expect("hog task").expect("hog answered"),
        StatusCode::OK
    );
    let (status, _) = c
        .post(WEBHOOK_PATH, create_review("u2", "nm", "worker-1"))
        .await
        .expect("the connection that got 429 still works");
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn every_answer_keeps_the_connection_or_says_close() {
    let srv = start(limits()).await;
    let tls = tls_config(&srv.ca_pem).expect("ca");
    let review = create_review("u-next", "nm", "worker-1");
    let post = |extra: &str, body: &[u8]| -> Vec<u8> {
        let mut r = format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\n{extra}content-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    let follow_up = post("content-type: application/json\r\n", review.as_bytes());
    let limit = limits().max_body_bytes;
    let over = vec![b' '; 2 * limit];
    let far_over = vec![b' '; 6 * limit];
    // (name, request, status line, connection kept)
    let cases: Vec<(&str, Vec<u8>, &str, bool)> = vec![
        ("valid review", follow_up.clone(), "HTTP/1.1 200", true),
        (
            "form post",
            post(
                "content-type: application/x-www-form-urlencoded\r\n",
                b"a=b",
            ),
            "HTTP/1.1 415",
            true,
        ),
        ("twice the limit", post("", &over), "HTTP/1.1 413", true),
        (
            "six times the limit",
            post("", &far_over),
            "HTTP/1.1 413",
            false,
        ),
        (
            "stalled body",
            format!("POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{{")
                .into_bytes(),
            "HTTP/1.1 408",
            false,
        ),
        ("not JSON", post("", b"{\"a\":"), "HTTP/1.1 400", true),
    ];
    for (name, raw, want, keeps) in cases {
        let got = send_raw_then_reuse(
            srv.addr,
            "localhost",
            tls.clone(),
            &raw,
            &follow_up,
            Duration::from_secs(5),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got.first.starts_with(want), "{name}: {:?}", got.first);
        assert_eq!(got.said_close, !keeps, "{name}: {:?}", got.first);
        if let Some(second) = got.second {
            assert!(
                second.starts_with("HTTP/1.1 200"),
                "{name}: kept the connection without saying close, but the next review got {second:?}"
            );
        }
    }
}

#[tokio::test]
async fn shutdown_finishes_in_flight_reviews() {
    let mut srv = start(Limits {
        request_timeout: Duration::from_secs(10),
        ..limits()
    })
    .await;
    let body = create_review("u-late", "nm", "worker-1");
    let (first, rest) = body.split_at(body.len() / 2);
    let mut tls = connect_tls(srv.addr, "localhost", tls_config(&srv.ca_pem).expect("ca"))
        .await
        .expect("tls");
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{first}",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    let gauge = srv
        .metrics
        .requests_in_flight
        .with_label_values(&[WEBHOOK_PATH]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while gauge.get() < 1 {
        assert!(Instant::now() < deadline, "request never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Shut down while the review is half received...
    let _ = srv.stop.take().map(|s| s.send(()));
    // ...new connections are refused once the listener is gone...
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(srv.addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "listener still open after shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...and the in-flight review still gets its answer.
    tls.write_all(rest.as_bytes()).await.expect("write rest");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"uid\":\"u-late\""), "{answer}");
    tokio::time::timeout(Duration::from_secs(5), &mut srv.task)
        .await
        .expect("serve() returns after the last review")
        .expect("no panic");
}

#[tokio::test]
async fn http2_is_offered_when_enabled() {
    let srv = start_with(limits(), true).await;
    let mut cfg = (*tls_config(&srv.ca_pem).expect("ca")).clone();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = connect_tls(srv.addr, "localhost", Arc::new(cfg))
        .await
        .expect("tls");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // HTTP/1.1 clients keep working.
    let mut c = srv.client().await;
    let (status, _) = c
        .post(WEBHOOK_PATH, create_review("u", "nm", "worker-1"))
        .await
        .expect("post");
    assert_eq!(status, StatusCode::OK);
}
