//! Command-line flags in Go's flag syntax (each also readable from the
//! environment) and their resolution into concrete settings: listen addresses,
//! certificate paths, limits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use shared::api::consts::{OLM_CERT_DIR, OLM_CERT_FILE, OLM_KEY_FILE, TLS_CERT_FILE, TLS_KEY_FILE};
use shared::serve::gate_flags::GateFlags;
use shared::serve::goflags::GoBoolFlag as _;
use shared::serve::telemetry::{BindAddressError, RuntimeFlags, parse_bind_address};

/// controller-runtime's default certificate directory, used when neither
/// `--cert-dir` is given nor OLM's directory holds a certificate.
pub const CONTROLLER_RUNTIME_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "nmo-webhook",
    version = shared::api::version::VERSION,
    args_override_self = true,
    about = "Validating admission webhook for NodeMaintenance objects",
    long_about = "Validating admission webhook for NodeMaintenance objects \
        (nodemaintenance.medik8s.io/v1beta1).\n\n\
        Serves AdmissionReview v1 over TLS on --webhook-bind-address; probes (/healthz, /readyz) \
        on their own plain-HTTP port; /metrics on its own port, over HTTPS for callers allowed \
        to get /metrics (TokenReview, SubjectAccessReview) unless --metrics-secure=false. Answers come from watch caches of \
        NodeMaintenances, Node metadata and, on OpenShift, the etcd guard PDB and pods."
)]
pub struct Config {
    #[command(flatten)]
    pub runtime: RuntimeFlags,

    /// Accepted so the controller's argument list (upstream's) works here too;
    /// the webhook has no leader: every replica answers reviews.
    #[arg(long, env = "LEADER_ELECT", go_bool_default = false)]
    pub leader_elect: bool,

    /// Admit `drainTimeoutAction: Force` (pods deleted past their
    /// PodDisruptionBudgets once drainTimeout passed). Off: such a
    /// NodeMaintenance is denied, naming how an admin enables it. Set by
    /// manifests/components/force-drain, with the controller's flag and grant.
    #[arg(long, env = "ALLOW_FORCE_DRAIN", go_bool_default = false)]
    pub allow_force_drain: bool,

    /// Address the TLS admission endpoint binds to (Go style: ":9443" means every interface).
    #[arg(long, env = "WEBHOOK_BIND_ADDRESS", default_value = ":9443")]
    pub webhook_bind_address: String,

    /// Directory holding the serving certificate and key. Default: OLM's
    /// /apiserver.local.config/certificates when it holds apiserver.crt, else
    /// /tmp/k8s-webhook-server/serving-certs (controller-runtime's default).
    #[arg(long, env = "CERT_DIR", value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,

    /// Certificate file name inside --cert-dir. Default: apiserver.crt when that
    /// file exists (OLM), else tls.crt (cert-manager / Secret volume).
    #[arg(long, env = "CERT_NAME", value_name = "FILE")]
    pub cert_name: Option<String>,

    /// Private key file name inside --cert-dir. Default: apiserver.key when
    /// apiserver.crt exists (OLM), else tls.key.
    #[arg(long, env = "KEY_NAME", value_name = "FILE")]
    pub key_name: Option<String>,

    /// How often the certificate files are re-read even without a change
    /// notification (a backstop for missed filesystem events), e.g. "60s".
    #[arg(long, env = "CERT_RELOAD_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub cert_reload_interval: Duration,

    /// Whether the etcd quorum rule for control-plane nodes applies: "auto"
    /// detects OpenShift by API discovery of config.openshift.io/v1 at start.
    #[arg(long, env = "OPENSHIFT", value_enum, default_value = "auto")]
    pub openshift: OpenShiftMode,

    /// Kubeconfig file to use. Default: in-cluster service account, else the
    /// KUBECONFIG environment variable, else ~/.kube/config.
    #[arg(long, env = "WEBHOOK_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Longest time to receive one request body; slower requests get 408.
    #[arg(long, env = "REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Largest accepted request body in bytes; larger requests get 413.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Threads serving reviews. 0 (the default) sizes the pool from the CPUs the
    /// process may use, which honours the container's CPU limit (a 200m limit
    /// gives one thread: more threads than CPU quota only add throttling).
    #[arg(long, env = "WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// Reviews processed at once; more wait up to --request-timeout, then get 429.
    #[arg(long, env = "MAX_CONCURRENT_REVIEWS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_reviews: u32,

    /// Open TLS connections accepted at once; further connections are closed at once.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Longest time for a client to finish the TLS handshake.
    #[arg(long, env = "TLS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub tls_handshake_timeout: Duration,

    /// How long an HTTP/1.1 connection may wait for the next request's headers.
    /// Keep it above the API server's idle-connection timeout (90 s), otherwise
    /// the webhook closes connections the API server is about to reuse.
    #[arg(long, env = "IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// On SIGTERM, keep serving this long after /readyz turned red (gives
    /// endpoints time to drop this replica) before closing the listener.
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// As the controller's flag: at most this many nodes in maintenance at
    /// once (0 = no limit). The webhook only uses it to warn, on create, that
    /// a NodeMaintenance will wait for a slot ("will wait: N maintenance(s) ahead").
    #[arg(long, env = "MAX_CONCURRENT_MAINTENANCES", default_value_t = 1)]
    pub max_concurrent_maintenances: usize,

    /// As the controller's flag, when it handles only some NodeMaintenances
    /// ("key=value[,key=value]", equality only): the slots and gates of the
    /// warnings count only the matching ones, and a create that does not
    /// match gets no queue warning (that controller does not handle it).
    /// The admission decision itself sees every NodeMaintenance.
    #[arg(long, env = "NODEMAINTENANCE_SELECTOR", default_value = "", value_name = "LABELS",
          value_parser = shared::serve::gate_flags::equality_selector)]
    pub nodemaintenance_selector: shared::serve::gate_flags::Selector,

    /// The fleet gates, as the controller's flags (both Deployments carry the
    /// same values): the webhook only warns, on create, that a
    /// NodeMaintenance will not start yet because of one.
    #[command(flatten)]
    pub gates: GateFlags,

    /// Drain flags, as the controller's: the webhook warns that a node will
    /// be taken out of the load balancers first.
    #[command(flatten)]
    pub drain: shared::serve::drain_flags::DrainFlags,

    /// Time budget of the admission warnings of one create (pods of the node,
    /// PodDisruptionBudgets, KubeVirt VMIs): what is not known by then is left
    /// out (and named as not checked). 0 turns the warnings off.
    #[arg(long, env = "WARNINGS_TIMEOUT", default_value = "250ms", value_parser = parse_duration)]
    pub warnings_timeout: Duration,

    /// Longest time to finish in-flight reviews after the listener closed.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "8s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
}

/// `--openshift` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenShiftMode {
    /// Detect by API discovery of config.openshift.io/v1.
    Auto,
    /// Apply the etcd quorum rule without asking.
    True,
    /// Never apply the etcd quorum rule.
    False,
}

/// Errors turning flags into settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    BindAddress(#[from] BindAddressError),
    #[error(
        "--webhook-bind-address must not be \"0\": the webhook cannot run without its TLS listener"
    )]
    NoWebhookListener,
    /// A gate flag the webhook cannot use (`--block-on-alerts-url`).
    #[error("{0}")]
    Gates(String),
}

/// Where the serving certificate and key live.
pub use shared::serve::tls::CertPaths;

/// Listen addresses after parsing (None = that endpoint is off).
#[derive(Debug, Clone)]
pub struct Listeners {
    pub webhook: SocketAddr,
    pub metrics: Option<SocketAddr>,
    pub probes: Option<SocketAddr>,
}

impl Config {
    pub fn listeners(&self) -> Result<Listeners, ConfigError> {
        Ok(Listeners {
            webhook: parse_bind_address("--webhook-bind-address", &self.webhook_bind_address)?
                .ok_or(ConfigError::NoWebhookListener)?,
            metrics: parse_bind_address(
                "--metrics-bind-address",
                &self.runtime.metrics_bind_address,
            )?,
            probes: parse_bind_address(
                "--health-probe-bind-address",
                &self.runtime.health_probe_bind_address,
            )?,
        })
    }

    /// Resolve the certificate directory and file names, applying the OLM /
    /// cert-manager auto-detection for whatever was not given explicitly.
    pub fn cert_paths(&self) -> CertPaths {
        let dir = match &self.cert_dir {
            Some(d) => d.clone(),
            None if Path::new(OLM_CERT_DIR).join(OLM_CERT_FILE).exists() => {
                PathBuf::from(OLM_CERT_DIR)
            }
            None => PathBuf::from(CONTROLLER_RUNTIME_CERT_DIR),
        };
        let olm = dir.join(OLM_CERT_FILE).exists();
        let (default_cert, default_key) = if olm {
            (OLM_CERT_FILE, OLM_KEY_FILE)
        } else {
            (TLS_CERT_FILE, TLS_KEY_FILE)
        };
        let cert = dir.join(self.cert_name.as_deref().unwrap_or(default_cert));
        let key = dir.join(self.key_name.as_deref().unwrap_or(default_key));
        CertPaths { dir, cert, key }
    }
}

/// Durations of the flags, in Go's syntax ("10s", "250ms", "1h30m"); one
/// parser for the whole project.
pub use shared::rules::duration::parse as parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    fn try_parse(args: &[&str]) -> Result<Config, clap::Error> {
        let mut full = vec!["nmo-webhook"];
        full.extend_from_slice(args);
        Config::try_parse_from(shared::serve::goflags::normalize(full))
    }

    fn parse(args: &[&str]) -> Config {
        try_parse(args).expect("flags parse")
    }

    #[test]
    fn upstream_common_arguments_parse() {
        let c = parse(&[
            "--leader-elect",
            "--enable-http2=false",
            "--metrics-bind-address=:8443",
            "--health-probe-bind-address=:8081",
        ]);
        assert!(c.leader_elect, "accepted for a drop-in argument list");
        assert!(!c.runtime.enable_http2);
        let l = c.listeners().expect("listeners");
        assert_eq!(l.metrics, Some("0.0.0.0:8443".parse().expect("addr")));
        assert_eq!(l.probes, Some("0.0.0.0:8081".parse().expect("addr")));
    }

    #[test]
    fn go_flag_spellings() {
        let c = parse(&[
            "-enable-http2",
            "-cert-dir",
            "/x",
            "-zap-level=debug",
            "--leader-elect=false",
        ]);
        assert!(c.runtime.enable_http2 && !c.leader_elect);
        assert_eq!(c.cert_dir.as_deref(), Some(Path::new("/x")));
        let c = parse(&[
            "--enable-http2=true",
            "--enable-http2=0",
            "--openshift=true",
            "--openshift=false",
        ]);
        assert!(!c.runtime.enable_http2, "the last occurrence wins");
        assert_eq!(c.openshift, OpenShiftMode::False);
        assert!(
            try_parse(&["--enable-http2", "false"]).is_err(),
            "a bool takes no separate value"
        );
        let err = try_parse(&["--version"]).expect_err("--version exits");
        assert!(
            err.to_string().starts_with("nmo-webhook 0.") && err.to_string().contains("(git "),
            "{err}"
        );
    }

    #[test]
    fn the_nodemaintenance_selector_scopes_what_the_queue_counts() {
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let all = parse(&[]).nodemaintenance_selector;
        assert!(all.matches(None), "empty: every NodeMaintenance");
        let c = parse(&["--nodemaintenance-selector=shard=a,team=ops"]);
        let s = &c.nodemaintenance_selector;
        assert!(s.matches(Some(&labels(&[
            ("shard", "a"),
            ("team", "ops"),
            ("x", "y")
        ]))));
        assert!(!s.matches(Some(&labels(&[("shard", "a")]))), "every label");
        assert!(!s.matches(None));
    }

    #[test]
    fn defaults_match_controller_runtime() {
        let c = parse(&[]);
        let l = c.listeners().expect("listeners");
        assert_eq!(l.webhook, "0.0.0.0:9443".parse().expect("addr"));
        // Upstream today: secure metrics on :8443.
        assert_eq!(l.metrics, Some("0.0.0.0:8443".parse().expect("addr")));
        assert!(c.runtime.metrics_secure);
        assert_eq!(c.runtime.metrics_cert_name, "tls.crt");
        assert_eq!(c.runtime.metrics_key_name, "tls.key");
        assert_eq!(l.probes, Some("0.0.0.0:8081".parse().expect("addr")));
        assert_eq!(c.openshift, OpenShiftMode::Auto);
        assert!(!c.runtime.enable_http2);
        assert!(!parse(&["--metrics-secure=false"]).runtime.metrics_secure);
        assert_eq!(c.max_body_bytes, 1024 * 1024);
        assert_eq!(c.max_concurrent_maintenances, 1, "as the controller's");
        assert_eq!(c.warnings_timeout, Duration::from_millis(250));
        let c = parse(&["--max-concurrent-maintenances=0", "--warnings-timeout=1s"]);
        assert_eq!(c.max_concurrent_maintenances, 0);
        assert_eq!(c.warnings_timeout, Duration::from_secs(1));
    }

    #[test]
    fn gate_flags_as_the_controllers() {
        let g = parse(&[]).gates.gates();
        assert!(
            !g.needs_nodes() && !g.needs_alerts(),
            "defaults gate nothing"
        );
        assert!(g.windows.is_empty() && !g.pause_after_failure);
        let c = parse(&[
            "--max-unavailable=10%",
            "--maintenance-window=0 2 * * 6 4h UTC",
            "--pause-after-failure",
        ]);
        let g = c.gates.gates();
        assert_eq!(g.max_unavailable, Some("10%".parse().expect("10%")));
        assert_eq!(g.windows.len(), 1);
        assert_eq!(g.windows[0].spec(), "0 2 * * 6 4h UTC");
        assert!(g.needs_nodes() && g.pause_after_failure);
        let err = try_parse(&["--max-unavailable=ten"]).expect_err("not a count");
        assert!(err.to_string().contains("--max-unavailable"), "{err}");
    }

    #[test]
    fn cert_names_follow_the_directory_contents() {
        let dir =
            std::env::temp_dir().join(format!("nmo-webhook-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let d = dir.to_str().expect("utf8");

        let c = parse(&["--cert-dir", d]);
        assert_eq!(c.cert_paths().cert, dir.join("tls.crt"));
        assert_eq!(c.cert_paths().key, dir.join("tls.key"));

        std::fs::write(dir.join("apiserver.crt"), b"x").expect("write");
        assert_eq!(c.cert_paths().cert, dir.join("apiserver.crt"));
        assert_eq!(c.cert_paths().key, dir.join("apiserver.key"));

        let c = parse(&[
            "--cert-dir",
            d,
            "--cert-name",
            "a.pem",
            "--key-name",
            "b.pem",
        ]);
        assert_eq!(c.cert_paths().cert, dir.join("a.pem"));
        assert_eq!(c.cert_paths().key, dir.join("b.pem"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn webhook_listener_cannot_be_disabled() {
        let c = parse(&["--webhook-bind-address", "0"]);
        assert!(matches!(c.listeners(), Err(ConfigError::NoWebhookListener)));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("3").is_err(), "a unit is needed, as in Go");
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
