//! The operator's binaries run as child processes of a test, authenticated as
//! their ServiceAccount (a token minted through the TokenRequest API), so a
//! missing RBAC rule fails the test instead of production. The child is killed
//! when the handle drops; its log is printed if the test panicked.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};
use serde_json::json;

/// Path of a workspace binary built by `cargo build --workspace --bins`
/// (`NMO_BIN_PROFILE=release` picks the release build instead).
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| crate::repo_root().join("target"));
    let profile = std::env::var("NMO_BIN_PROFILE").unwrap_or_else(|_| "debug".to_string());
    target.join(profile).join(name)
}

/// Resident set size of a process in KiB, from /proc.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// GET a plain-HTTP URL path on 127.0.0.1:port (probes, metrics) and return the body.
pub async fn http_get_local(port: u16, path: &str) -> anyhow::Result<String> {
    match http_status_local(port, path).await? {
        (200, body) => Ok(body),
        (code, body) => anyhow::bail!("GET {path} on port {port}: HTTP {code}: {body}"),
    }
}

/// GET a plain-HTTP path on 127.0.0.1:port: status code and body, whatever the code.
pub async fn http_status_local(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("GET {path} on port {port}: no status line in {head:?}"))?;
    Ok((code, body.to_string()))
}

/// A free TCP port on 127.0.0.1 for a process to listen on, below the
/// kernel's ephemeral range: a port from that range (what binding port 0
/// gives) can become the source port of any outgoing connection between this
/// check and the listener's bind, and with the companions' watches and
/// scrapes that happened ("Address in use"). Ports go round the 2,000 below
/// the range from a random start, one process-wide counter, so the tests of
/// one run never get the same one; each is checked by binding it. Above the
/// plane's (20247-26643), deploy-local's (<= 28081) and the companions'
/// (29090-29299) ports.
pub fn free_port() -> anyhow::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const SPAN: u32 = 2000;
    if ephemeral < 29300 + SPAN {
        // An unusual range: fall back to the kernel's choice.
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port());
    }
    let _ = NEXT.compare_exchange(
        u32::MAX,
        rand::random::<u32>() % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = ephemeral - SPAN + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        if let Ok(port) = u16::try_from(port) {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    anyhow::bail!(
        "no free port in {}..{ephemeral} on 127.0.0.1",
        ephemeral - SPAN
    )
}

/// A fresh token of ServiceAccount `namespace/sa` (TokenRequest API), valid 2 h.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    sa: &str,
) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let req: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 7200}
    }))?;
    Ok(api
        .create_token_request(sa, &Default::default(), &req)
        .await
        .with_context(|| format!("minting a token for ServiceAccount {namespace}/{sa}"))?
        .status
        .context("TokenRequest without status")?
        .token)
}

/// Write a kubeconfig that authenticates as `namespace/sa` with a fresh token.
pub async fn service_account_kubeconfig(
    client: &Client,
    namespace: &str,
    sa: &str,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    let token = service_account_token(client, namespace, sa).await?;
    let admin = std::fs::read_to_string(crate::kubeconfig_path())?;
    let admin: serde_yaml::Value = serde_yaml::from_str(&admin)?;
    let cluster = admin["clusters"][0]["cluster"].clone();
    let kc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": serde_json::to_value(&cluster)?}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": sa}}],
        "current-context": "sa"
    });
    std::fs::write(out, serde_yaml::to_string(&kc)?)?;
    Ok(())
}

/// A running operator process.
pub struct Running {
    pub child: Child,
    pub log: PathBuf,
    pub name: String,
    /// Left running when dropped (`make deploy-local`).
    detached: bool,
}

impl Running {
    /// Start `bin` with `args` and the given kubeconfig; stdout+stderr to a log file.
    pub fn start(
        bin: &str,
        args: &[String],
        kubeconfig: &std::path::Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Running> {
        let path = binary(bin);
        anyhow::ensure!(
            path.exists(),
            "{} is not built; run `cargo build --workspace --bins` first",
            path.display()
        );
        let dir = crate::repo_root().join(".cluster/test-logs");
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{}.log", crate::unique(bin)));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&path);
        cmd.args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", path.display()))?;
        Ok(Running {
            child,
            log,
            name: bin.to_string(),
            detached: false,
        })
    }

    /// Start a prepared command (program, arguments, environment, user);
    /// stdout and stderr go to a log file under .cluster/test-logs.
    pub fn spawn(name: &str, cmd: Command) -> anyhow::Result<Running> {
        let dir = crate::repo_root().join(".cluster/test-logs");
        std::fs::create_dir_all(&dir)?;
        let log = dir.join(format!("{}.log", crate::unique(name)));
        Self::spawn_logged(name, cmd, log)
    }

    /// [`Running::spawn`] with the log at `log`.
    pub fn spawn_logged(name: &str, mut cmd: Command, log: PathBuf) -> anyhow::Result<Running> {
        let file = std::fs::File::create(&log)
            .with_context(|| format!("creating log file {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Running {
            child,
            log,
            name: name.to_string(),
            detached: false,
        })
    }

    /// Leave the process running after this handle is gone; returns its pid.
    pub fn detach(mut self) -> u32 {
        self.detached = true;
        self.child.id()
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for the exit status, as a kubelet does: for at
    /// most [`TERMINATION_GRACE`], then SIGKILL and an error saying so (a
    /// service that ignores SIGTERM would otherwise hang the suite).
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus, String> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + TERMINATION_GRACE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Ok(None) => {
                    self.kill();
                    return Err(format!(
                        "{} (pid {pid}) still running {TERMINATION_GRACE:?} after SIGTERM: killed. Log tail:\n{}",
                        self.name,
                        self.log_tail(20)
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "{} (pid {pid}): waiting for its exit: {e}",
                        self.name
                    ));
                }
            }
        }
    }
}

/// How long [`Running::terminate`] waits after SIGTERM: the manifests'
/// terminationGracePeriodSeconds (10 s), doubled for debug builds.
pub const TERMINATION_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

impl Drop for Running {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        if std::thread::panicking() {
            let text = self.log_text();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            eprintln!(
                "---- {} log {} (last 60 lines)",
                self.name,
                self.log.display()
            );
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
        self.kill();
    }
}
