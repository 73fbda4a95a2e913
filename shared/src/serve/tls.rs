//! TLS serving certificates for the webhook's admission port and the secure
//! metrics port: loaded at start (bad files fail the start), served through a
//! rustls resolver that reads an `ArcSwap` (no lock on the handshake path), and
//! reloaded when the certificate directory changes. Without a directory, a
//! self-signed certificate generated at start (controller-runtime's metrics
//! default).
//!
//! The directory is watched, not the files: kubelet updates a mounted Secret by
//! swapping the `..data` symlink, which never writes to `tls.crt` itself.
//! Events are debounced, both files are re-read, and the new pair is swapped in
//! only when both parse and belong together; otherwise the old pair keeps being
//! served and the failure is logged and counted. A periodic re-read is the
//! backstop for missed events.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use prometheus::{IntCounterVec, IntGauge, Opts};

/// Quiet time after the last filesystem event before re-reading: kubelet's
/// swap is several events in a row.
const DEBOUNCE: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "cannot read {what} {path}: {source}; mount the certificate there or point the certificate directory and file name flags at it"
    )]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path} is not valid PEM: {reason}; it must hold a PEM {expected}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        reason: String,
        expected: &'static str,
    },
    #[error(
        "certificate {cert} and key {key} do not form a usable pair: {reason}; write a key and the certificate issued for it"
    )]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("cannot parse certificate {path} to read its expiry: {reason}")]
    X509 { path: PathBuf, reason: String },
    #[error("cannot set up TLS: {0}")]
    Config(#[from] rustls::Error),
    #[error("cannot generate a self-signed certificate: {0}")]
    Generate(#[from] certs::CertError),
}

/// Where a certificate and its key live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertPaths {
    /// Watched for changes (kubelet swaps a `..data` symlink inside it).
    pub dir: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Series a resolver keeps current: the served certificate's expiry and the
/// reload results. The owner registers them (or not: [`CertMetrics::detached`]).
#[derive(Clone)]
pub struct CertMetrics {
    pub not_after_seconds: IntGauge,
    /// Labelled `result` = success | failure.
    pub reloads_total: IntCounterVec,
}

impl CertMetrics {
    /// Series registered nowhere, for a certificate nobody graphs.
    pub fn detached() -> Self {
        // Static, valid names: these constructors cannot fail.
        let not_after_seconds = IntGauge::new("certificate_not_after_seconds", "unused")
            .unwrap_or_else(|_| unreachable!("valid metric name"));
        let reloads_total = IntCounterVec::new(
            Opts::new("certificate_reloads_total", "unused"),
            &["result"],
        )
        .unwrap_or_else(|_| unreachable!("valid metric name"));
        CertMetrics {
            not_after_seconds,
            reloads_total,
        }
    }
}

/// A loaded pair and facts about it.
struct Loaded {
    key: Arc<CertifiedKey>,
    not_after_unix: i64,
}

/// What a reload attempt did.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// Files are byte-for-byte what is served (or what already failed): nothing done.
    Unchanged,
    /// A new pair is being served.
    Swapped { not_after_unix: i64 },
    /// The files changed but cannot be used; the previous pair is still served.
    Failed(TlsError),
}

/// File contents seen at the last reload, to tell changes from re-reads.
#[derive(Default, PartialEq, Eq)]
struct Seen {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// rustls certificate resolver with an atomically swappable pair.
pub struct CertResolver {
    current: ArcSwap<CertifiedKey>,
    /// None: a generated certificate, nothing to reload.
    paths: Option<CertPaths>,
    provider: Arc<CryptoProvider>,
    seen: Mutex<Seen>,
    metrics: CertMetrics,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver")
            .field("paths", &self.paths)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The crypto provider every TLS object uses (ring, as the
/// workspace selects), passed explicitly so no process-wide default is needed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl CertResolver {
    /// Load the pair; an error here should stop the process.
    pub fn load(paths: CertPaths, metrics: impl Into<CertMetrics>) -> Result<Self, TlsError> {
        let metrics = metrics.into();
        let provider = provider();
        let seen = read_files(&paths)?;
        let loaded = parse_pair(&paths, &seen, &provider)?;
        metrics.not_after_seconds.set(loaded.not_after_unix);
        tracing::info!(
            cert = %paths.cert.display(),
            key = %paths.key.display(),
            not_after_unix = loaded.not_after_unix,
            "certificate loaded"
        );
        Ok(CertResolver {
            current: ArcSwap::new(loaded.key),
            paths: Some(paths),
            provider,
            seen: Mutex::new(seen),
            metrics,
        })
    }

    /// A fresh self-signed certificate for `names` (DNS names) and localhost,
    /// valid for a year, as controller-runtime generates for metrics when no
    /// certificate is given. Clients must skip verification or pin it.
    pub fn self_signed(
        names: &[String],
        metrics: impl Into<CertMetrics>,
    ) -> Result<Self, TlsError> {
        let metrics = metrics.into();
        let provider = provider();
        let validity = Duration::from_secs(365 * 24 * 60 * 60);
        let ca = certs::Ca::new("nmo-rs self-signed metrics CA", validity)?;
        let mut dns: Vec<String> = names.iter().filter(|n| !n.is_empty()).cloned().collect();
        dns.push("localhost".to_string());
        let ips = [
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ];
        let leaf = ca.issue_serving(&dns, &ips, validity)?;
        let files = Seen {
            cert: format!("{}{}", leaf.cert_pem, ca.cert_pem()).into_bytes(),
            key: leaf.key_pem.into_bytes(),
        };
        let generated = Path::new("(generated)");
        let paths = CertPaths {
            dir: generated.to_path_buf(),
            cert: generated.to_path_buf(),
            key: generated.to_path_buf(),
        };
        let loaded = parse_pair(&paths, &files, &provider)?;
        metrics.not_after_seconds.set(loaded.not_after_unix);
        tracing::info!(
            names = ?dns,
            not_after_unix = loaded.not_after_unix,
            "generated a self-signed certificate"
        );
        Ok(CertResolver {
            current: ArcSwap::new(loaded.key),
            paths: None,
            provider,
            seen: Mutex::new(files),
            metrics,
        })
    }

    /// The files served, None for a generated certificate.
    pub fn paths(&self) -> Option<&CertPaths> {
        self.paths.as_ref()
    }

    /// The certificate chain currently served (for tests and diagnostics).
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current.load().cert.clone()
    }

    /// Re-read both files; swap only if they changed, parse and match.
    pub fn reload(&self) -> ReloadOutcome {
        let Some(paths) = &self.paths else {
            return ReloadOutcome::Unchanged;
        };
        let files = match read_files(paths) {
            Ok(files) => files,
            // Mid-rotation a file can be briefly missing; the next event or the
            // periodic re-read tries again. Remember "missing" so it is reported once.
            Err(e) => return self.fail(Seen::default(), e),
        };
        let Ok(mut seen) = self.seen.lock() else {
            return ReloadOutcome::Unchanged;
        };
        if *seen == files {
            return ReloadOutcome::Unchanged;
        }
        match parse_pair(paths, &files, &self.provider) {
            Ok(loaded) => {
                self.current.store(loaded.key);
                *seen = files;
                self.metrics.not_after_seconds.set(loaded.not_after_unix);
                self.metrics
                    .reloads_total
                    .with_label_values(&["success"])
                    .inc();
                tracing::info!(
                    cert = %paths.cert.display(),
                    not_after_unix = loaded.not_after_unix,
                    "certificate reloaded"
                );
                ReloadOutcome::Swapped {
                    not_after_unix: loaded.not_after_unix,
                }
            }
            Err(e) => {
                drop(seen);
                self.fail(files, e)
            }
        }
    }

    fn fail(&self, files: Seen, e: TlsError) -> ReloadOutcome {
        let Ok(mut seen) = self.seen.lock() else {
            return ReloadOutcome::Unchanged;
        };
        if *seen == files {
            // Same broken content as last time: already logged and counted.
            return ReloadOutcome::Unchanged;
        }
        *seen = files;
        self.metrics
            .reloads_total
            .with_label_values(&["failure"])
            .inc();
        tracing::warn!(error = %e, "new certificate not usable; still serving the previous one");
        ReloadOutcome::Failed(e)
    }
}

fn read_files(paths: &CertPaths) -> Result<Seen, TlsError> {
    let read = |what, path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            what,
            path: path.to_path_buf(),
            source,
        })
    };
    Ok(Seen {
        cert: read("certificate", &paths.cert)?,
        key: read("private key", &paths.key)?,
    })
}

fn parse_pair(
    paths: &CertPaths,
    files: &Seen,
    provider: &CryptoProvider,
) -> Result<Loaded, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&files.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            path: paths.cert.clone(),
            reason: e.to_string(),
            expected: "certificate chain (BEGIN CERTIFICATE)",
        })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsError::Pem {
            what: "certificate",
            path: paths.cert.clone(),
            reason: "no certificate found".into(),
            expected: "certificate chain (BEGIN CERTIFICATE)",
        });
    };
    let not_after_unix = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map(|(_, c)| c.validity().not_after.timestamp())
        .map_err(|e| TlsError::X509 {
            path: paths.cert.clone(),
            reason: e.to_string(),
        })?;
    let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|e| TlsError::Pem {
        what: "private key",
        path: paths.key.clone(),
        reason: e.to_string(),
        expected: "private key (PKCS#8, PKCS#1 or SEC1)",
    })?;
    let key = CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Pair {
        cert: paths.cert.clone(),
        key: paths.key.clone(),
        reason: e.to_string(),
    })?;
    Ok(Loaded {
        key: Arc::new(key),
        not_after_unix,
    })
}

/// TLS 1.2+ server configuration; ALPN offers h2 only when HTTP/2 is enabled.
pub fn server_config(
    resolver: Arc<CertResolver>,
    enable_http2: bool,
) -> Result<ServerConfig, TlsError> {
    let mut cfg = ServerConfig::builder_with_provider(resolver.provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = if enable_http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(cfg)
}

/// Reload on directory changes (debounced) and every `interval`, until
/// `shutdown`. Returns at once for a generated certificate.
pub async fn watch_for_changes(
    resolver: Arc<CertResolver>,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let Some(dir) = resolver.paths().map(|p| p.dir.clone()) else {
        return; // generated: nothing on disk to follow
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
    // Keep the watcher alive for the whole loop: dropping it stops the events.
    let _watcher = match notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if res.is_ok() {
            // A full channel already means "reload pending": coalesce.
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w))
    {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                dir = %dir.display(),
                error = %e,
                interval_s = interval.as_secs_f64(),
                "cannot watch the certificate directory; relying on the periodic re-read only"
            );
            None
        }
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the pair was just loaded
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            Some(()) = rx.recv() => {
                // Debounce: wait for a quiet period so both files are in place.
                while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
                resolver.reload();
            }
            _ = tick.tick() => {
                resolver.reload();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Instant;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let p = std::env::temp_dir()
                .join(format!("nmo-shared-tls-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("mkdir");
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn issue(ca: &certs::Ca) -> certs::ServingCert {
        ca.issue_serving(
            &["localhost".to_string()],
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Duration::from_secs(3600),
        )
        .expect("issue")
    }

    fn paths(dir: &Path) -> CertPaths {
        CertPaths {
            dir: dir.to_path_buf(),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("pem")
            .as_ref()
            .to_vec()
    }

    fn served(r: &CertResolver) -> Vec<u8> {
        r.current_chain()[0].as_ref().to_vec()
    }

    fn reloads(m: &CertMetrics, result: &str) -> u64 {
        m.reloads_total.with_label_values(&[result]).get()
    }

    fn setup(
        tag: &str,
    ) -> (
        TempDir,
        certs::Ca,
        certs::ServingCert,
        CertMetrics,
        CertResolver,
    ) {
        let dir = TempDir::new(tag);
        let ca = certs::Ca::new("test-ca", Duration::from_secs(3600)).expect("ca");
        let first = issue(&ca);
        certs::write_serving_set(&dir.0, &ca, &first).expect("write");
        let metrics = CertMetrics::detached();
        let r = CertResolver::load(paths(&dir.0), metrics.clone()).expect("load");
        (dir, ca, first, metrics, r)
    }

    #[test]
    fn loads_kubelet_layout_and_reports_expiry() {
        let (_dir, _ca, first, metrics, r) = setup("load");
        assert_eq!(served(&r), der(&first.cert_pem));
        let want = certs::not_after(&first.cert_pem)
            .expect("not_after")
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after epoch")
            .as_secs() as i64;
        assert_eq!(metrics.not_after_seconds.get(), want);
    }

    #[test]
    fn bad_files_fail_the_start_with_the_path() {
        let dir = TempDir::new("bad-start");
        let m = CertMetrics::detached();
        let err = CertResolver::load(paths(&dir.0), m.clone()).expect_err("missing files");
        assert!(err.to_string().contains("tls.crt"), "{err}");
        certs::write_kubelet_layout(&dir.0, &[("tls.crt", b"garbage"), ("tls.key", b"garbage")])
            .expect("write");
        let err = CertResolver::load(paths(&dir.0), m).expect_err("garbage");
        assert!(err.to_string().contains("tls.crt"), "{err}");
    }

    #[test]
    fn kubelet_rotation_is_served_after_reload() {
        let (dir, ca, _first, metrics, r) = setup("rotate");
        assert!(matches!(r.reload(), ReloadOutcome::Unchanged));
        let second = issue(&ca);
        certs::write_serving_set(&dir.0, &ca, &second).expect("rotate");
        assert!(matches!(r.reload(), ReloadOutcome::Swapped { .. }));
        assert_eq!(served(&r), der(&second.cert_pem));
        assert_eq!(reloads(&metrics, "success"), 1);
        assert!(
            matches!(r.reload(), ReloadOutcome::Unchanged),
            "no change, no reload"
        );
    }

    #[test]
    fn broken_or_mismatched_files_keep_the_old_pair() {
        let (dir, ca, first, metrics, r) = setup("broken");
        certs::write_kubelet_layout(
            &dir.0,
            &[("tls.crt", b"not a cert"), ("tls.key", b"not a key")],
        )
        .expect("write");
        assert!(matches!(
            r.reload(),
            ReloadOutcome::Failed(TlsError::Pem { .. })
        ));
        assert_eq!(served(&r), der(&first.cert_pem));
        assert_eq!(reloads(&metrics, "failure"), 1);
        assert!(
            matches!(r.reload(), ReloadOutcome::Unchanged),
            "same broken files counted once"
        );

        // A valid certificate with somebody else's key.
        let a = issue(&ca);
        let b = issue(&ca);
        certs::write_kubelet_layout(
            &dir.0,
            &[
                ("tls.crt", a.cert_pem.as_bytes()),
                ("tls.key", b.key_pem.as_bytes()),
            ],
        )
        .expect("write");
        assert!(matches!(
            r.reload(),
            ReloadOutcome::Failed(TlsError::Pair { .. })
        ));
        assert_eq!(served(&r), der(&first.cert_pem));
        assert_eq!(reloads(&metrics, "failure"), 2);

        // Fixed files are picked up again.
        certs::write_serving_set(&dir.0, &ca, &a).expect("write");
        assert!(matches!(r.reload(), ReloadOutcome::Swapped { .. }));
        assert_eq!(served(&r), der(&a.cert_pem));
    }

    #[tokio::test]
    async fn directory_watch_picks_up_a_kubelet_rotation() {
        let (dir, ca, _first, _metrics, r) = setup("watch");
        let r = Arc::new(r);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // A long periodic interval: only the directory watch can make this pass in time.
        let task = tokio::spawn(watch_for_changes(
            r.clone(),
            Duration::from_secs(3600),
            async {
                let _ = stop_rx.await;
            },
        ));
        let second = issue(&ca);
        // The watcher is installed asynchronously; rotate until it has seen one.
        let deadline = Instant::now() + Duration::from_secs(10);
        let want = der(&second.cert_pem);
        certs::write_serving_set(&dir.0, &ca, &second).expect("rotate");
        let mut rewrites = 0;
        while served(&r) != want {
            assert!(
                Instant::now() < deadline,
                "rotation not picked up within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            if rewrites < 50 {
                // Re-write the same pair: a fresh event in case the first came
                // before the watch was installed.
                certs::write_serving_set(&dir.0, &ca, &second).expect("rotate");
                rewrites += 1;
            }
        }
        let _ = stop_tx.send(());
        task.await.expect("watch task ends on shutdown");
    }

    #[tokio::test]
    async fn periodic_reread_is_a_backstop() {
        let (dir, ca, _first, _metrics, r) = setup("periodic");
        let r = Arc::new(r);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(watch_for_changes(
            r.clone(),
            Duration::from_millis(50),
            async {
                let _ = stop_rx.await;
            },
        ));
        let second = issue(&ca);
        certs::write_serving_set(&dir.0, &ca, &second).expect("rotate");
        let deadline = Instant::now() + Duration::from_secs(10);
        while served(&r) != der(&second.cert_pem) {
            assert!(
                Instant::now() < deadline,
                "rotation not picked up within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop_tx.send(());
        task.await.expect("watch task ends");
    }

    #[test]
    fn self_signed_serves_localhost_and_never_reloads() {
        let m = CertMetrics::detached();
        let r = CertResolver::self_signed(&["nmo-controller".to_string()], m.clone())
            .expect("generate");
        assert!(r.paths().is_none());
        let chain = r.current_chain();
        assert_eq!(chain.len(), 2, "leaf and its CA");
        let (_, leaf) = x509_parser::parse_x509_certificate(chain[0].as_ref()).expect("x509");
        let sans = format!(
            "{:?}",
            leaf.subject_alternative_name().expect("ext").expect("sans")
        );
        assert!(
            sans.contains("nmo-controller") && sans.contains("localhost"),
            "{sans}"
        );
        assert!(m.not_after_seconds.get() > 0);
        assert!(matches!(r.reload(), ReloadOutcome::Unchanged));
    }
}
