//! Runtime flags common to both binaries and the log setup.
//!
//! Flag names and defaults follow upstream's controller-runtime binaries so
//! existing Deployments, runbooks and dashboards keep working. They use Go's
//! flag syntax (see [`crate::serve::goflags`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::serve::goflags::GoBoolFlag as _;
pub use crate::serve::zap::LogFlags;
use crate::serve::zap_format::ZapFormat;

/// Flags both the controller and the webhook accept.
#[derive(Args, Debug, Clone)]
pub struct RuntimeFlags {
    /// Address the Prometheus `/metrics` endpoint binds to (Go style: ":8443" means every
    /// interface, port 8443; "0" turns metrics off).
    #[arg(long, env = "METRICS_BIND_ADDRESS", default_value = ":8443")]
    pub metrics_bind_address: String,

    /// Serve `/metrics` over HTTPS and only to callers whose bearer token passes a
    /// TokenReview and a SubjectAccessReview (get on the non-resource URL /metrics).
    /// --metrics-secure=false serves plain HTTP to anyone.
    #[arg(long, env = "METRICS_SECURE", go_bool_default = true)]
    pub metrics_secure: bool,

    /// Directory with the metrics serving certificate and key (reloaded when they
    /// change). Without it a self-signed certificate is generated at start.
    #[arg(long, env = "METRICS_CERT_DIR", value_name = "DIR")]
    pub metrics_cert_dir: Option<PathBuf>,

    /// Certificate file name inside --metrics-cert-dir.
    #[arg(
        long,
        env = "METRICS_CERT_NAME",
        value_name = "FILE",
        default_value = "tls.crt"
    )]
    pub metrics_cert_name: String,

    /// Private key file name inside --metrics-cert-dir.
    #[arg(
        long,
        env = "METRICS_KEY_NAME",
        value_name = "FILE",
        default_value = "tls.key"
    )]
    pub metrics_key_name: String,

    /// Address the `/healthz` and `/readyz` probes bind to (Go style, "0" turns them off).
    /// Always plain HTTP.
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    pub health_probe_bind_address: String,

    /// Enable HTTP/2 on TLS servers (the webhook's admission port and the secure
    /// metrics port). Off by default to sidestep the HTTP/2 rapid-reset CVEs
    /// (CVE-2023-44487, CVE-2023-39325).
    #[arg(long, env = "ENABLE_HTTP2", go_bool_default = false)]
    pub enable_http2: bool,

    #[command(flatten)]
    pub log: LogFlags,
}

/// Keeps the log writer thread alive; dropping it (or `finish`) writes every
/// line still buffered. Hold it in `main` until the process is about to exit.
pub use crate::serve::logwriter::WriterGuard as LogGuard;

/// Install the global log subscriber the flags describe. Our crates log at the
/// chosen level; dependencies (hyper, rustls, kube internals) one step quieter
/// unless debugging. `RUST_LOG`, when set, overrides the levels.
///
/// Lines are formatted where they are logged and written to stderr in batches
/// by a writer thread (see [`crate::serve::logwriter`]): a request path does not wait
/// on log I/O, and nothing is dropped. A panic is logged as one line and
/// written out at once ([`crate::serve::panic_log`]).
pub fn init_logging(flags: &LogFlags) -> LogGuard {
    let (writer, guard) = crate::serve::logwriter::batched(
        std::io::stderr(),
        crate::serve::logwriter::DEFAULT_BATCH_DELAY,
        crate::serve::logwriter::DEFAULT_MAX_BUFFERED,
    );
    // A second call (tests) keeps the first subscriber and its panic hook;
    // this writer then simply goes unused.
    if log_subscriber(flags, writer.clone()).try_init().is_ok() {
        crate::serve::panic_log::install(move || writer.flush_now());
    }
    guard
}

/// The subscriber [`init_logging`] installs (filter, zap's keys and
/// encodings: [`crate::serve::zap_format`]), writing to `writer`; public so
/// benchmarks and tests log exactly as the binaries do.
pub fn log_subscriber<W>(flags: &LogFlags, writer: W) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let settings = flags.settings();
    let lvl = settings.level.as_str().to_ascii_lowercase();
    let deps = match settings.level {
        tracing::Level::TRACE => "debug",
        tracing::Level::DEBUG => "info",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{deps},nmo_controller={lvl},nmo_webhook={lvl},shared={lvl},kube_runtime={deps}"
        ))
    });
    let layer = tracing_subscriber::fmt::layer()
        .event_format(ZapFormat::new(&settings))
        .with_writer(writer);
    tracing_subscriber::registry().with(layer.with_filter(filter))
}

/// Errors in a bind address flag.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid bind address {value:?} for {flag}: {reason}; use HOST:PORT, :PORT or 0 to disable"
)]
pub struct BindAddressError {
    pub flag: &'static str,
    pub value: String,
    pub reason: String,
}

/// Parse a Go-style bind address: ":8080" binds all interfaces, "0" disables
/// the listener (None), "127.0.0.1:9000" and `[::1]:9000` as usual.
pub fn parse_bind_address(
    flag: &'static str,
    value: &str,
) -> Result<Option<SocketAddr>, BindAddressError> {
    let v = value.trim();
    if v == "0" || v.is_empty() {
        return Ok(None);
    }
    let full = if let Some(port) = v.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else if let Some(port) = v.strip_prefix("localhost:") {
        format!("127.0.0.1:{port}")
    } else {
        v.to_string()
    };
    full.parse::<SocketAddr>()
        .map(Some)
        .map_err(|e| BindAddressError {
            flag,
            value: value.to_string(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_bind_addresses() {
        let p = |v| parse_bind_address("--x", v);
        assert_eq!(
            p(":8080").expect("ok"),
            Some("0.0.0.0:8080".parse().expect("addr"))
        );
        assert_eq!(p("0").expect("ok"), None);
        assert_eq!(
            p("127.0.0.1:9").expect("ok"),
            Some("127.0.0.1:9".parse().expect("addr"))
        );
        assert_eq!(
            p("localhost:9").expect("ok"),
            Some("127.0.0.1:9".parse().expect("addr"))
        );
        assert_eq!(
            p("[::1]:9").expect("ok"),
            Some("[::1]:9".parse().expect("addr"))
        );
        let err = p("nonsense").expect_err("must fail");
        assert!(err.to_string().contains("--x"), "{err}");
    }
}
