//! Shared helpers for the integration tests: a client for the local control
//! plane (`make cluster-up`), unique names, fixtures, waiting with a deadline,
//! manifests applied as the cluster admin, and the operator's own processes
//! run under their ServiceAccounts so RBAC is exercised for real.

pub mod admission_stream;
pub mod companions;
pub mod controller_env;
pub mod deployment;
pub mod fixtures;
pub mod image;
pub mod manifests;
pub mod olm;
pub mod plane;
pub mod process;
pub mod real_node;
pub mod scrape;
pub mod wait;
pub mod webhook_pod;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::Context as _;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The local plane's state directory: `NMO_CLUSTER_DIR` when set (as the
/// tests/cluster scripts read it, e.g. a second plane for restart tests),
/// else `<repo>/.cluster`.
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("NMO_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cluster"))
}

/// The admin kubeconfig written by `make cluster-up`.
pub fn kubeconfig_path() -> PathBuf {
    cluster_dir().join("kubeconfig")
}

/// The admin client configuration of the local control plane, or an error
/// that says how to start it.
pub async fn admin_config() -> anyhow::Result<kube::Config> {
    let path = kubeconfig_path();
    let kc = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "no local control plane: {} is missing or unreadable; run `make cluster-up` first",
            path.display()
        )
    })?;
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("loading the local kubeconfig")
}

/// An admin client for the local control plane, or an error that says how to start it.
pub async fn admin_client() -> anyhow::Result<Client> {
    Client::try_from(admin_config().await?).context("building a client for the local control plane")
}

/// A name unique to this test process and call: `<prefix>-<pid hex>-<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let salt: u16 = rand::random();
    format!("{prefix}-{:x}{salt:04x}-{n}", std::process::id() & 0xffff)
}

/// The cluster's component logs, tail of each, for a failing test's output.
pub fn component_log_tails(lines: usize) -> String {
    let dir = cluster_dir().join("logs");
    let mut out = String::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return format!("(no logs under {})", dir.display());
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        if let Ok(text) = std::fs::read_to_string(&p) {
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            out.push_str(&format!("---- {} (last {lines} lines)\n", p.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}
