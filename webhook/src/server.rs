//! The admission endpoint: an axum router on a TLS listener, hardened so that
//! no input can crash it, hang it or make it answer 5xx.
//!
//! Limits: request body size (413), time to receive the body (408), reviews in
//! progress (429 after waiting `request_timeout`), open connections (closed at
//! once above the limit), TLS handshake time. An answer sent before the body
//! was read to its end says `Connection: close` (see `body`). Shutdown stops accepting, lets
//! every in-flight review finish (bounded by a timeout) and returns.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus::{Histogram, IntCounter, IntGauge};
use rustls::ServerConfig;
use shared::api::consts::WEBHOOK_PATH;
use shared::api::drain_rule::DRAIN_RULE_WEBHOOK_PATH;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::body;
use crate::metrics::Metrics;
use crate::review;
use crate::validate::{Decision, Lookups, Reason, decide_confirmed, decode_object};

/// Per-request limits.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub max_concurrent_reviews: usize,
}

pub use crate::validate::Policy;

pub use shared::serve::https::ServeOptions;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "cannot listen on {addr} for the admission webhook: {source}; free the port or pick another with --webhook-bind-address"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Shared state of the review handler.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

struct Inner {
    lookups: Arc<dyn Lookups>,
    policy: Policy,
    metrics: Metrics,
    limits: Limits,
    permits: Semaphore,
    // Resolved once: label lookups are not free on the hot path.
    latency: Histogram,
    in_flight: IntGauge,
    ok_total: IntCounter,
}

impl AppState {
    pub fn new(
        lookups: Arc<dyn Lookups>,
        policy: Policy,
        metrics: Metrics,
        limits: Limits,
    ) -> Self {
        let latency = metrics.latency_for(WEBHOOK_PATH);
        let in_flight = metrics
            .requests_in_flight
            .with_label_values(&[WEBHOOK_PATH]);
        let ok_total = metrics
            .requests_total
            .with_label_values(&["200", WEBHOOK_PATH]);
        AppState(Arc::new(Inner {
            lookups,
            policy,
            permits: Semaphore::new(limits.max_concurrent_reviews),
            metrics,
            limits,
            latency,
            in_flight,
            ok_total,
        }))
    }
}

/// Router with the validate paths only (NodeMaintenance, upstream's;
/// NodeDrainRule, ours); everything else is 404 / 405.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(WEBHOOK_PATH, post(review_handler))
        .route(DRAIN_RULE_WEBHOOK_PATH, post(drain_rule_handler))
        .with_state(state)
}

/// NodeDrainRule reviews: rare (an admin's edits), so the path's series are
/// resolved per request.
async fn drain_rule_handler(State(st): State<AppState>, req: Request) -> Response {
    let start = Instant::now();
    let m = &st.0.metrics;
    let path = DRAIN_RULE_WEBHOOK_PATH;
    m.requests_in_flight.with_label_values(&[path]).inc();
    let resp = handle(&st.0, req, start).await;
    m.requests_in_flight.with_label_values(&[path]).dec();
    let code = resp.status();
    m.requests_total
        .with_label_values(&[code.as_str(), path])
        .inc();
    m.latency_for(path).observe(start.elapsed().as_secs_f64());
    resp
}

/// Answers with `Connection: close` while `draining()` holds: during the
/// shutdown delay every client that still reaches this replica (the API
/// server's pooled keep-alive connections) is told to go elsewhere, so no
/// connection is closed under a request the client has already sent.
pub fn close_connections_when(
    draining: impl Fn() -> bool + Clone + Send + Sync + 'static,
) -> tower::util::MapResponseLayer<impl Fn(Response) -> Response + Clone + Send + Sync + 'static> {
    tower::util::MapResponseLayer::new(move |mut resp: Response| {
        if draining() {
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        resp
    })
}

async fn review_handler(State(st): State<AppState>, req: Request) -> Response {
    let start = Instant::now();
    st.0.in_flight.inc();
    let resp = handle(&st.0, req, start).await;
    st.0.in_flight.dec();
    let code = resp.status();
    if code == StatusCode::OK {
        st.0.ok_total.inc();
    } else {
        st.0.metrics
            .requests_total
            .with_label_values(&[code.as_str(), WEBHOOK_PATH])
            .inc();
    }
    let took = start.elapsed().as_secs_f64();
    st.0.latency.observe(took);
    st.0.metrics.review_duration_seconds.observe(took);
    resp
}

fn plain(code: StatusCode, msg: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

/// An answer, and whether the connection it goes out on stays usable.
struct Answer {
    resp: Response,
    /// False when the request body was not read to its end: the connection
    /// is out of step, so the answer says `Connection: close` and hyper closes
    /// it after writing, instead of a client finding it closed on reuse.
    reusable: bool,
}

impl From<Response> for Answer {
    fn from(resp: Response) -> Self {
        Answer {
            resp,
            reusable: true,
        }
    }
}

async fn handle(st: &Inner, req: Request, start: Instant) -> Response {
    let Answer { mut resp, reusable } = answer(st, req, start).await;
    if !reusable {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

async fn answer(st: &Inner, req: Request, start: Instant) -> Answer {
    let limits = &st.limits;
    // Wait for a slot, but not forever: an overloaded webhook says so (429).
    let Ok(Ok(_permit)) = tokio::time::timeout(limits.request_timeout, st.permits.acquire()).await
    else {
        let resp = plain(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "webhook busy: more than {} reviews in progress for {:?}; retry later or raise --max-concurrent-reviews",
                limits.max_concurrent_reviews, limits.request_timeout
            ),
        );
        return refuse(req, limits, resp).await;
    };
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        if !is_json(ct) {
            let resp = plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "content type {ct:?} not supported: send the AdmissionReview as application/json"
                ),
            );
            return refuse(req, limits, resp).await;
        }
    }
    match read_body(req, limits).await {
        Ok(bytes) => review_answer(st, &bytes, start).await.into(),
        Err(answer) => answer,
    }
}

/// `resp` to a request whose body is not wanted: the body is read and
/// dropped (within the limits) so the connection can serve the next one.
async fn refuse(req: Request, limits: &Limits, resp: Response) -> Answer {
    let reusable = body::discard(
        req.into_body(),
        limits.max_body_bytes,
        limits.request_timeout,
    )
    .await;
    Answer { resp, reusable }
}

/// The whole request body within the limits, or the answer saying why not
/// (413, 408, 400).
async fn read_body(req: Request, limits: &Limits) -> Result<Bytes, Answer> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match body::read(
        req.into_body(),
        declared,
        limits.max_body_bytes,
        limits.request_timeout,
    )
    .await
    {
        body::Read::Complete(bytes) => Ok(bytes),
        body::Read::TooLarge { drained } => Err(Answer {
            resp: too_large(limits.max_body_bytes),
            reusable: drained,
        }),
        body::Read::TimedOut => Err(Answer {
            resp: plain(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {:?}",
                    limits.request_timeout
                ),
            ),
            reusable: false,
        }),
        body::Read::Failed(e) => Err(Answer {
            resp: plain(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            ),
            reusable: false,
        }),
    }
}

/// The answer to a review read whole: decoded, decided, counted and logged,
/// with the warnings of an allowed CREATE.
async fn review_answer(st: &Inner, bytes: &[u8], start: Instant) -> Response {
    let request = match review::decode(bytes) {
        Ok(r) => r,
        Err(e) => {
            return match e.uid {
                Some(uid) => {
                    let d = Decision::malformed(Reason::Malformed, e.message);
                    record(st, "", &d, &uid, "", "", start);
                    json(review::encode_response(&uid, false, d.code, &d.message))
                }
                None => plain(StatusCode::BAD_REQUEST, e.message),
            };
        }
    };
    let decision = decide_confirmed(&request, st.lookups.as_ref(), st.policy).await;
    record(
        st,
        request.operation.label(),
        &decision,
        &request.uid,
        &request.user,
        request.operation.as_str(),
        start,
    );
    let warnings = if decision.admits_create() {
        warnings_for(st, &request).await
    } else {
        Vec::new()
    };
    json(review::encode_response_with_warnings(
        &request.uid,
        decision.allowed,
        decision.code,
        &decision.message,
        &warnings,
    ))
}

/// The warnings for an allowed CREATE, after its decision was made and
/// logged (the lookups bound themselves by --warnings-timeout).
async fn warnings_for(st: &Inner, request: &review::ReviewRequest) -> Vec<String> {
    let Ok(nm) = decode_object(request, "object", request.object.as_deref()) else {
        return Vec::new();
    };
    let began = Instant::now();
    let warnings = st.lookups.warnings(&nm).await;
    tracing::info!(
        target: "nmo_webhook::decision",
        uid = clip(&request.uid),
        object = clip(&request.name),
        dry_run = request.dry_run,
        warnings = warnings.len(),
        latency_ms = began.elapsed().as_micros() as f64 / 1000.0,
        "admission warnings"
    );
    warnings
}

fn is_json(ct: &HeaderValue) -> bool {
    ct.to_str()
        .map(|s| {
            s.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
        .unwrap_or(false)
}

fn too_large(max: usize) -> Response {
    plain(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("request body larger than {max} bytes (--max-body-bytes)"),
    )
}

fn json(body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Count the decision and write its log line.
fn record(
    st: &Inner,
    op_label: &str,
    d: &Decision,
    uid: &str,
    user: &str,
    operation: &str,
    start: Instant,
) {
    let op_label = if op_label.is_empty() {
        "UNKNOWN"
    } else {
        op_label
    };
    st.metrics
        .decisions_total
        .with_label_values(&[
            op_label,
            if d.allowed { "true" } else { "false" },
            d.reason.as_str(),
        ])
        .inc();
    // Microsecond resolution is plenty, and keeps the log line short.
    let latency_ms = start.elapsed().as_micros() as f64 / 1000.0;
    tracing::info!(
        target: "nmo_webhook::decision",
        uid = clip(uid),
        user = clip(user),
        operation = clip(operation),
        object = clip(&d.object),
        node = clip(d.node.as_deref().unwrap_or("")),
        allowed = d.allowed,
        reason = d.reason.as_str(),
        denial = clip(&d.message),
        latency_ms,
        "admission decision"
    );
}

/// Values from the request are logged at most this long: a direct caller can
/// send megabyte-long names, and one request must not become megabytes of log.
const LOG_VALUE_MAX: usize = 256;

fn clip(s: &str) -> &str {
    if s.len() <= LOG_VALUE_MAX {
        return s;
    }
    let mut end = LOG_VALUE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Bind the TLS port now, so a taken port fails the start.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// Serve `router` over TLS on `listener` until `shutdown` completes, then
/// finish in-flight reviews (at most `opts.shutdown_timeout`).
pub async fn serve(
    listener: TcpListener,
    tls: ServerConfig,
    router: Router,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    shared::serve::https::serve(
        "admission webhook (TLS)",
        listener,
        tls,
        router,
        opts,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_log_values_are_clipped_on_a_char_boundary() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(300); // 2 bytes each
        let c = clip(&long);
        assert!(c.len() <= LOG_VALUE_MAX && c.len() >= LOG_VALUE_MAX - 1);
        assert!(long.starts_with(c));
    }
}
