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

/// Path of a workspace binary built by `cargo build --workspace --bins`.
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| crate::repo_root().join("target"));
    target.join("debug").join(name)
}

/// Write a kubeconfig that authenticates as `namespace/sa` with a fresh token.
pub async fn service_account_kubeconfig(
    client: &Client,
    namespace: &str,
    sa: &str,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let req: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 7200}
    }))?;
    let token = api
        .create_token_request(sa, &Default::default(), &req)
        .await
        .with_context(|| format!("minting a token for ServiceAccount {namespace}/{sa}"))?
        .status
        .context("TokenRequest without status")?
        .token;
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
        })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.child.wait().ok()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
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
