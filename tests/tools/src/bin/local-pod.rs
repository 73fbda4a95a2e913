//! `local-pod`: run one pod of a Deployment of `manifests/` as a local
//! process that outlives this command, the way the integration tests run it
//! ([`nmo_tests::deployment::Launch`]): the container's command comes from the
//! built image (`make images`), its arguments, environment, ServiceAccount,
//! volume mounts and readiness probe from the rendered manifests, with every
//! `--*-bind-address` mapped to a 127.0.0.1 port. `make deploy-local`
//! (tests/deploy/) starts the webhook and the controller with it.
//!
//! ```text
//! local-pod --overlay base --deployment nmo-webhook --volume cert=DIR \
//!     --port 9443=9443 --port 8443=18080 --port 8081=18081 \
//!     --mint-kubeconfig FILE --log FILE --pod-name NAME --ready-timeout 60 \
//!     [-- EXTRA_ARG...]
//! ```
//!
//! Once the manifest's readiness probe answers 200 it prints `pid=<pid>` and
//! one `port.<containerPort>=<localPort>` line per mapped port on stdout, the
//! program and its final argument list on stderr, and exits 0, leaving the
//! process running in its own process group. On any failure it kills the
//! process, says what failed with the last lines of its log, and exits 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};
use nmo_tests::deployment::{Launch, Pod, deployment};

#[derive(Parser, Debug)]
#[command(
    name = "local-pod",
    about = "Run one pod of a Deployment of manifests/ locally, from the built image, detached; \
             print its pid and ports once its readiness probe passes"
)]
struct Args {
    /// Kustomize directory below manifests/ ("base", "overlays/openshift", ...).
    #[arg(long, default_value = "base")]
    overlay: String,

    /// Name of the Deployment (also the image: target/images/<name>.oci.tar).
    #[arg(long)]
    deployment: String,

    /// VOLUME=DIR: the host directory standing in for a volume of the pod.
    #[arg(long = "volume", value_name = "VOLUME=DIR", value_parser = parse_volume)]
    volumes: Vec<(String, PathBuf)>,

    /// CONTAINER_PORT=LOCAL_PORT: pin a container port to this 127.0.0.1 port
    /// (unpinned ports get a free one).
    #[arg(long = "port", value_name = "CONTAINER=LOCAL", value_parser = parse_port)]
    ports: Vec<(u16, u16)>,

    /// Use this kubeconfig (it should authenticate as the pod's ServiceAccount).
    #[arg(long, value_name = "FILE", conflicts_with = "mint_kubeconfig")]
    kubeconfig: Option<PathBuf>,

    /// Mint a token for the Deployment's ServiceAccount (as the local plane's
    /// admin) and write a kubeconfig with it to FILE. Without this and without
    /// --kubeconfig a 2 h token is minted under .cluster/test-logs.
    #[arg(long, value_name = "FILE")]
    mint_kubeconfig: Option<PathBuf>,

    /// Lifetime of the token --mint-kubeconfig mints, in hours.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=8760))]
    token_hours: u32,

    /// The process's stdout and stderr (default: a new file under .cluster/test-logs).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,

    /// The pod name (POD_NAME, HOSTNAME, the leader election identity).
    #[arg(long)]
    pod_name: Option<String>,

    /// Seconds to wait for the readiness probe.
    #[arg(long, default_value_t = 60)]
    ready_timeout: u64,

    /// Arguments appended after the manifest's (Go flags: the last one wins).
    #[arg(last = true)]
    extra_args: Vec<String>,
}

fn parse_volume(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(format!("expected VOLUME=DIR, got {s:?}")),
    }
}

fn parse_port(s: &str) -> Result<(u16, u16), String> {
    let parsed = s
        .split_once('=')
        .and_then(|(c, l)| Some((c.parse::<u16>().ok()?, l.parse::<u16>().ok()?)));
    match parsed {
        Some((c, l)) if c != 0 && l != 0 => Ok((c, l)),
        _ => Err(format!(
            "expected CONTAINER_PORT=LOCAL_PORT (1-65535 each), got {s:?}"
        )),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let what = format!(
        "Deployment {} of manifests/{}",
        args.deployment, args.overlay
    );
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("local-pod: ERROR: {what}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    check_against_manifest(&args)?;
    let client = nmo_tests::admin_client().await?;

    let mut launch = Launch::new(&args.overlay, &args.deployment).detached();
    for (name, dir) in &args.volumes {
        let dir = std::fs::canonicalize(dir)
            .with_context(|| format!("--volume {name}={}: no such directory", dir.display()))?;
        launch = launch.volume(name, &dir);
    }
    for &(container, local) in &args.ports {
        launch = launch.port(container, local);
    }
    if let Some(path) = &args.mint_kubeconfig {
        mint_kubeconfig(&client, &args, path).await?;
        launch = launch.kubeconfig(path);
    } else if let Some(path) = &args.kubeconfig {
        launch = launch.kubeconfig(path);
    }
    if let Some(log) = &args.log {
        if let Some(dir) = log.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating log directory {}", dir.display()))?;
        }
        launch = launch.log(log);
    }
    if let Some(name) = &args.pod_name {
        launch = launch.pod_name(name);
    }
    launch = launch.extra_args(args.extra_args.iter().cloned());

    let pod = launch.start(&client).await?;
    let pid = pod.proc.pid();
    let ready = wait_ready(&pod, Duration::from_secs(args.ready_timeout)).await;
    if let Err(e) = ready {
        // Dropping the handle kills the process.
        bail!("{e:#}\n  log: {}", pod.proc.log.display());
    }

    let program = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".into());
    eprintln!(
        "local-pod: {} ready: pid {pid}, uid {}, log {}\n  {} {}",
        pod.name,
        uid_of(pid).unwrap_or_else(|| "?".into()),
        pod.proc.log.display(),
        program,
        pod.args
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("pid={pid}");
    for (container, local) in &pod.ports {
        println!("port.{container}={local}");
    }
    pod.proc.detach();
    Ok(())
}

/// The readiness probe, or why the pod will never pass it.
async fn wait_ready(pod: &Pod, deadline: Duration) -> anyhow::Result<()> {
    let pid = pod.proc.pid();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing a SIGTERM handler")?;
    tokio::select! {
        r = pod.wait_ready(deadline) => r,
        () = exited(pid) => bail!(
            "the process (pid {pid}) exited during start-up; last lines of its log:\n{}",
            indent(&pod.proc.log_tail(30))
        ),
        _ = tokio::signal::ctrl_c() => bail!("interrupted (SIGINT) before the pod was ready"),
        _ = term.recv() => bail!("terminated (SIGTERM) before the pod was ready"),
    }
}

/// Resolves once process `pid` (our child) has exited: gone or a zombie.
async fn exited(pid: u32) {
    loop {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return;
        };
        // The state follows the parenthesised command name.
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
        if state.is_none_or(|s| s.starts_with('Z')) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Fail early, naming the manifest's ports and volumes, on a --port or
/// --volume the Deployment does not have or a pinned local port in use.
fn check_against_manifest(args: &Args) -> anyhow::Result<()> {
    let d = deployment(&args.overlay, &args.deployment)?;
    let containers = d
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| (p.containers, p.volumes.unwrap_or_default()));
    let Some((containers, volumes)) = containers else {
        bail!("no pod template");
    };
    let declared: Vec<i32> = containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten().map(|p| p.container_port))
        .collect();
    for &(container, local) in &args.ports {
        if !declared.contains(&i32::from(container)) {
            bail!(
                "--port {container}={local}: the container declares no port {container} (it declares {declared:?})"
            );
        }
        if std::net::TcpListener::bind(("127.0.0.1", local)).is_err() {
            bail!(
                "127.0.0.1:{local} (for container port {container}) is in use by another process: \
                 stop that process or map the port elsewhere (--port {container}=OTHER)"
            );
        }
    }
    let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    for (name, _) in &args.volumes {
        if !names.contains(&name.as_str()) {
            bail!("--volume {name}=...: the pod has no volume {name} (it has {names:?})");
        }
    }
    Ok(())
}

/// Write a kubeconfig for the Deployment's ServiceAccount with a token of
/// `--token-hours`, the admin kubeconfig's cluster entry kept as it is.
async fn mint_kubeconfig(client: &Client, args: &Args, out: &Path) -> anyhow::Result<()> {
    let d = deployment(&args.overlay, &args.deployment)?;
    let namespace = d.metadata.namespace.unwrap_or_else(|| "default".into());
    let sa = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.service_account_name)
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(i64::from(args.token_hours) * 3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), &namespace)
        .create_token_request(&sa, &PostParams::default(), &request)
        .await
        .with_context(|| {
            format!(
                "minting a token for ServiceAccount {namespace}/{sa} (is it applied? manifests/controller, manifests/webhook)"
            )
        })?
        .status
        .context("TokenRequest answered without a status")?
        .token;

    let admin_path = nmo_tests::kubeconfig_path();
    let admin: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(&admin_path)
            .with_context(|| format!("reading {}", admin_path.display()))?,
    )
    .with_context(|| format!("parsing {}", admin_path.display()))?;
    let cluster = &admin["clusters"][0]["cluster"];
    if !cluster.is_mapping() {
        bail!("{} names no cluster", admin_path.display());
    }
    let user = format!("{namespace}-{sa}");
    let config = yaml_map([
        ("apiVersion", "v1".into()),
        ("kind", "Config".into()),
        (
            "clusters",
            vec![yaml_map([
                ("name", "local".into()),
                ("cluster", cluster.clone()),
            ])]
            .into(),
        ),
        (
            "users",
            vec![yaml_map([
                ("name", user.as_str().into()),
                ("user", yaml_map([("token", token.into())])),
            ])]
            .into(),
        ),
        (
            "contexts",
            vec![yaml_map([
                ("name", user.as_str().into()),
                (
                    "context",
                    yaml_map([("cluster", "local".into()), ("user", user.as_str().into())]),
                ),
            ])]
            .into(),
        ),
        ("current-context", user.as_str().into()),
    ]);
    write_private(out, &serde_yaml::to_string(&config)?)
}

/// Create or replace `path` with mode 0600.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn uid_of(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    uids.split_whitespace().next().map(str::to_string)
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn yaml_map<const N: usize>(pairs: [(&str, serde_yaml::Value); N]) -> serde_yaml::Value {
    serde_yaml::Value::Mapping(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
}
