//! Restarting one component of the shared local control plane through
//! `tests/cluster/restart.sh` (SIGKILL, down for a while, started again with the
//! same command line, waited for until healthy), for the restart tests and
//! `make bench`. Everyone using the plane sees the outage.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What one restart took, as restart.sh measured it.
#[derive(Debug, Clone)]
pub struct Restart {
    pub component: String,
    /// From the kill to the new start.
    pub down: Duration,
    /// From the new start until the component was healthy.
    pub start_to_ready: Duration,
    /// From the kill until the API server answered /readyz again.
    pub outage: Duration,
    /// When the script saw the API server ready again (it polls every 200 ms).
    pub ready_at: Instant,
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} down {:.2} s, healthy {:.2} s after its start, API server ready {:.2} s after the kill",
            self.component,
            self.down.as_secs_f64(),
            self.start_to_ready.as_secs_f64(),
            self.outage.as_secs_f64()
        )
    }
}

/// A restart in progress.
pub struct Restarting {
    component: String,
    child: Child,
    killed: Option<oneshot::Receiver<()>>,
    log: JoinHandle<String>,
}

/// Restart `component` (etcd, kube-apiserver, ...) with `down` seconds between
/// kill and start; returns once the API server is ready again.
pub async fn restart(component: &str, down: f64) -> anyhow::Result<Restart> {
    Restarting::start(component, down)?.ready().await
}

impl Restarting {
    /// Run restart.sh in the background; its log lines go to our stderr.
    pub fn start(component: &str, down: f64) -> anyhow::Result<Restarting> {
        let script = crate::repo_root().join("tests/cluster/restart.sh");
        let mut child = Command::new("bash")
            .arg(&script)
            .arg(component)
            .arg(format!("--down-seconds={down}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", script.display()))?;
        let stderr = child
            .stderr
            .take()
            .context("restart.sh stderr is not piped")?;
        let (tx, rx) = oneshot::channel();
        let log = tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut text = String::new();
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                // restart.sh logs this line once the process is gone.
                if line.contains(" down; starting it again") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        Ok(Restarting {
            component: component.to_string(),
            child,
            killed: Some(rx),
            log,
        })
    }

    /// Resolves once the component has been killed (and is not back yet).
    pub async fn killed(&mut self) -> anyhow::Result<()> {
        let Some(rx) = self.killed.take() else {
            return Ok(());
        };
        if rx.await.is_err() {
            bail!(
                "restart.sh {} ended before killing it; its log:\n{}",
                self.component,
                (&mut self.log).await.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Wait for the script to finish: the component and the API server are ready.
    pub async fn ready(mut self) -> anyhow::Result<Restart> {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            out.read_to_string(&mut stdout).await?;
        }
        let status = self.child.wait().await?;
        let ready_at = Instant::now();
        let log = self.log.await.unwrap_or_default();
        if !status.success() {
            bail!(
                "tests/cluster/restart.sh {} failed ({status}); the plane may need \
                 `tests/cluster/up.sh` to be whole again. Its log:\n{log}",
                self.component
            );
        }
        parse_report(&self.component, &stdout, ready_at)
            .with_context(|| format!("restart.sh printed {stdout:?}; log:\n{log}"))
    }
}

/// Restarts kube-controller-manager, kube-scheduler and kwok (no downtime)
/// when dropped, also when a test panicked. After an API server or etcd
/// restart their client-go informers reconnect with a backoff that grows to
/// a minute and resets only after two quiet minutes: for that long, new
/// namespaces get no default ServiceAccount, PDBs no status, owners no
/// garbage collection. Fresh processes list at once, so the plane is whole
/// again for the next test and whoever uses it next.
pub struct RefreshClientsOnDrop;

impl Drop for RefreshClientsOnDrop {
    fn drop(&mut self) {
        let script = crate::repo_root().join("tests/cluster/restart.sh");
        for c in ["kube-controller-manager", "kube-scheduler", "kwok"] {
            let out = std::process::Command::new("bash")
                .arg(&script)
                .arg(c)
                .arg("--down-seconds=0")
                .output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "restarting {c} (to refresh its watches) failed; run tests/cluster/up.sh:\n{}",
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => eprintln!("running {}: {e}", script.display()),
            }
        }
    }
}

/// Read restart.sh's last line:
/// `restarted C: down_s=8.00 start_to_ready_s=2.41 outage_s=10.47`.
fn parse_report(component: &str, stdout: &str, ready_at: Instant) -> anyhow::Result<Restart> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("restarted "))
        .context("no `restarted ...` line")?;
    let field = |key: &str| -> anyhow::Result<Duration> {
        let v = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .with_context(|| format!("no {key}= in {line:?}"))?;
        let secs: f64 = v
            .parse()
            .with_context(|| format!("{key}={v} is no number"))?;
        Ok(Duration::from_secs_f64(secs))
    };
    Ok(Restart {
        component: component.to_string(),
        down: field("down_s")?,
        start_to_ready: field("start_to_ready_s")?,
        outage: field("outage_s")?,
        ready_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_timings_line() {
        let out = "noise\nrestarted etcd: down_s=5.01 start_to_ready_s=0.40 outage_s=7.25\n";
        let r = parse_report("etcd", out, Instant::now()).expect("parsed");
        assert_eq!(r.down, Duration::from_millis(5010));
        assert_eq!(r.start_to_ready, Duration::from_millis(400));
        assert_eq!(r.outage, Duration::from_millis(7250));
        assert!(parse_report("etcd", "restarted etcd: down_s=x", Instant::now()).is_err());
        assert!(parse_report("etcd", "", Instant::now()).is_err());
    }
}
