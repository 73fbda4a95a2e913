//! Run a Deployment of `manifests/` as local processes, the way a kubelet
//! would run its pod: the container's command, arguments, environment,
//! ServiceAccount, volume mounts and readiness probe all come from the
//! kustomize-rendered manifests, and the binary comes from the built image
//! (`make images`), started as the image's (or the securityContext's) user.
//!
//! What a pod network and volumes would provide is mapped onto the host, and
//! only that: every `--*-bind-address` value is rewritten to a free port on
//! 127.0.0.1 (container port -> local port, like a port mapping), and a value
//! naming a mounted path is rewritten to the host directory that stands in for
//! the volume. The flag names and every other value stay as the manifest has
//! them, so a manifest argument a binary rejects fails the test.
//!
//! The image is the test platform's (`crate::image::test_platform`: the
//! host's, or `NMO_TEST_IMAGE_PLATFORM`); a binary of another architecture
//! runs under the qemu user-mode emulator (`qemu-aarch64 /nmo-webhook ...`),
//! started explicitly, since binfmt_misc may not be registered.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context as _, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use kube::Client;
use serde::Deserialize;

use crate::image;
use crate::process::{Running, free_port, service_account_kubeconfig};

/// Where the binary comes from: the image (default) or, for a quick local
/// loop, cargo's target directory (`NMO_TEST_BINARIES=cargo`).
fn binaries_from_cargo() -> bool {
    std::env::var("NMO_TEST_BINARIES").is_ok_and(|v| v == "cargo")
}

/// Render `manifests/<dir>` with the cluster's kubectl (kustomize built in).
pub fn render(dir: &str) -> anyhow::Result<String> {
    static CACHE: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    if let Some(hit) = CACHE.lock().ok().and_then(|c| c.get(dir).cloned()) {
        return Ok(hit);
    }
    let kubectl = crate::cluster_dir().join("bin/kubectl");
    let path = crate::repo_root().join("manifests").join(dir);
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(&path)
        .output()
        .with_context(|| {
            format!(
                "running {} kustomize (start the local plane with `make cluster-up`)",
                kubectl.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout).context("kustomize output is not UTF-8")?;
    if let Ok(mut c) = CACHE.lock() {
        c.insert(dir.to_string(), text.clone());
    }
    Ok(text)
}

/// The Deployment `name` of the rendered `manifests/<dir>`.
pub fn deployment(dir: &str, name: &str) -> anyhow::Result<Deployment> {
    let yaml = render(dir)?;
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let v = serde_yaml::Value::deserialize(doc)?;
        if v["kind"].as_str() == Some("Deployment") && v["metadata"]["name"].as_str() == Some(name)
        {
            return serde_yaml::from_value(v)
                .with_context(|| format!("Deployment {name} of manifests/{dir}"));
        }
    }
    bail!("manifests/{dir} renders no Deployment named {name}")
}

/// How to run one pod of a Deployment.
pub struct Launch {
    overlay: String,
    deployment: String,
    args: Option<Vec<String>>,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
    volumes: BTreeMap<String, PathBuf>,
    kubeconfig: Option<PathBuf>,
    pod_name: String,
    pinned_ports: BTreeMap<u16, u16>,
    log: Option<PathBuf>,
    detached: bool,
}

/// A running pod: its process and where its container ports landed.
pub struct Pod {
    pub proc: Running,
    pub name: String,
    /// containerPort -> 127.0.0.1 port.
    pub ports: BTreeMap<u16, u16>,
    /// Port name -> containerPort, from the manifest.
    pub port_names: BTreeMap<String, u16>,
    /// The argument list the process got (after address and path mapping).
    pub args: Vec<String>,
    readiness: Option<(String, u16)>,
}

impl Launch {
    /// One pod of Deployment `deployment` in `manifests/<overlay>` ("base",
    /// "overlays/openshift", ...).
    pub fn new(overlay: &str, deployment: &str) -> Launch {
        Launch {
            overlay: overlay.to_string(),
            deployment: deployment.to_string(),
            args: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            volumes: BTreeMap::new(),
            kubeconfig: None,
            pod_name: crate::unique(deployment),
            pinned_ports: BTreeMap::new(),
            log: None,
            detached: false,
        }
    }

    /// Arguments appended after the manifest's (Go flags: the last one wins).
    pub fn extra_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Replace the manifest's arguments (e.g. with upstream's exact list).
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// An extra environment variable (after the manifest's).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    /// The host directory standing in for volume `name` of the pod.
    pub fn volume(mut self, name: &str, host_dir: &Path) -> Self {
        self.volumes
            .insert(name.to_string(), host_dir.to_path_buf());
        self
    }

    /// Map container port `container` to this local port (default: a free one).
    pub fn port(mut self, container: u16, local: u16) -> Self {
        self.pinned_ports.insert(container, local);
        self
    }

    /// Write the process output to `path` (default: a new file under .cluster/test-logs).
    pub fn log(mut self, path: &Path) -> Self {
        self.log = Some(path.to_path_buf());
        self
    }

    /// Start the process in its own process group, to outlive its starter
    /// (`make deploy-local`); [`Pod::proc`] still holds it, see `Running::detach`.
    pub fn detached(mut self) -> Self {
        self.detached = true;
        self
    }

    /// The pod name (POD_NAME, HOSTNAME and the leader election identity).
    pub fn pod_name(mut self, name: &str) -> Self {
        self.pod_name = name.to_string();
        self
    }

    /// Use this kubeconfig instead of minting a token for the pod's ServiceAccount.
    pub fn kubeconfig(mut self, path: &Path) -> Self {
        self.kubeconfig = Some(path.to_path_buf());
        self
    }

    /// Start the pod's process; returns once it runs (see [`Pod::wait_ready`]).
    pub async fn start(self, client: &Client) -> anyhow::Result<Pod> {
        let what = format!(
            "Deployment {} of manifests/{}",
            self.deployment, self.overlay
        );
        let d = deployment(&self.overlay, &self.deployment)?;
        let namespace = d
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let pod: PodSpec = d
            .spec
            .and_then(|s| s.template.spec)
            .with_context(|| format!("{what} has no pod template"))?;
        let container = match pod.containers.as_slice() {
            [one] => one.clone(),
            _ => bail!("{what}: expected exactly one container"),
        };

        // The binary, and the user to run it as.
        let Program {
            path: program,
            emulator,
            default_args: entry_args,
            user: image_user,
        } = self.program(&container, &what)?;
        let sc_user = |c: &Container| {
            c.security_context
                .as_ref()
                .and_then(|s| Some((s.run_as_user?, s.run_as_group)))
        };
        let pod_user = pod
            .security_context
            .as_ref()
            .and_then(|s| Some((s.run_as_user?, s.run_as_group)));
        let (uid, gid) = match sc_user(&container).or(pod_user) {
            Some((u, g)) => (u32::try_from(u)?, u32::try_from(g.unwrap_or(u))?),
            None => image_user,
        };

        // Volume mounts -> host directories.
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            if m.mount_path.starts_with("/var/run/secrets/kubernetes.io") {
                continue; // the ServiceAccount token: KUBECONFIG stands in for it
            }
            let host = self.volumes.get(&m.name).with_context(|| {
                format!(
                    "{what} mounts volume {} at {}: the test must provide a host directory for it (Launch::volume)",
                    m.name, m.mount_path
                )
            })?;
            let host = match &m.sub_path {
                Some(sub) if !sub.is_empty() => host.join(sub),
                _ => host.clone(),
            };
            grant(&host, uid, gid)?;
            mounts.push((m.mount_path.trim_end_matches('/').to_string(), host));
        }

        // Arguments: bind addresses and mounted paths mapped, nothing else touched.
        let manifest_args = self
            .args
            .clone()
            .or(container.args.clone())
            .unwrap_or(entry_args);
        let mut ports = self.pinned_ports.clone();
        let mut from_args = std::collections::BTreeSet::<u16>::new();
        let mut args = Vec::new();
        let mut all: Vec<String> = manifest_args;
        all.extend(self.extra_args.iter().cloned());
        let mut iter = all.into_iter().peekable();
        while let Some(a) = iter.next() {
            let flag = a.trim_start_matches('-');
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (flag.to_string(), None),
            };
            if a.starts_with('-') && name.ends_with("-bind-address") {
                let (value, two_tokens) = match inline {
                    Some(v) => (v, false),
                    None => (
                        iter.next()
                            .with_context(|| format!("{what}: {a} without a value"))?,
                        true,
                    ),
                };
                let mapped = map_address(&value, &mut ports)?;
                if let Some(p) = value.rsplit(':').next().and_then(|p| p.parse().ok()) {
                    from_args.insert(p);
                }
                if two_tokens {
                    args.push(a.clone());
                    args.push(mapped);
                } else {
                    args.push(format!("--{name}={mapped}"));
                }
                continue;
            }
            args.push(map_paths(&a, &mounts));
        }

        // Container ports no argument named: the binary's defaults, reached
        // through the flags' environment fallbacks.
        let mut env: Vec<(String, String)> = Vec::new();
        let mut port_names = BTreeMap::new();
        for p in container.ports.iter().flatten() {
            let cp = u16::try_from(p.container_port)?;
            if let Some(n) = &p.name {
                port_names.insert(n.clone(), cp);
            }
            if from_args.contains(&cp) {
                continue;
            }
            let var = match cp {
                9443 => "WEBHOOK_BIND_ADDRESS",
                8081 => "HEALTH_PROBE_BIND_ADDRESS",
                8080 | 8443 => "METRICS_BIND_ADDRESS",
                other => bail!(
                    "{what}: container port {other} is bound by no --*-bind-address argument and is no known default"
                ),
            };
            let local = match ports.get(&cp) {
                Some(l) => *l,
                None => free_port()?,
            };
            ports.insert(cp, local);
            env.push((var.to_string(), format!("127.0.0.1:{local}")));
        }

        // Environment as the kubelet would set it.
        env.push(("HOSTNAME".into(), self.pod_name.clone()));
        for e in container.env.iter().flatten() {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.name") => self.pod_name.clone(),
                        Some("metadata.namespace") => namespace.clone(),
                        Some("spec.nodeName") => "localhost".into(),
                        Some("status.podIP") => "127.0.0.1".into(),
                        Some("spec.serviceAccountName") => {
                            pod.service_account_name.clone().unwrap_or_default()
                        }
                        other => bail!(
                            "{what}: env {} from {other:?} is not supported by the test launcher",
                            e.name
                        ),
                    }
                }
                (None, None) => String::new(),
            };
            env.push((e.name.clone(), map_paths(&value, &mounts)));
        }
        // A default certificate directory that is a mount but named by no argument.
        for (path, host) in &mounts {
            let default_cert_dir = path == "/tmp/k8s-webhook-server/serving-certs"
                || path == "/apiserver.local.config/certificates";
            if default_cert_dir && !args.iter().any(|a| a.contains(&host.display().to_string())) {
                env.push(("CERT_DIR".into(), host.display().to_string()));
            }
        }
        env.extend(self.env.iter().cloned());

        // Credentials of the pod's ServiceAccount.
        let sa = pod
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        let kubeconfig = match &self.kubeconfig {
            Some(k) => k.clone(),
            None => {
                let dir = crate::repo_root().join(".cluster/test-logs");
                std::fs::create_dir_all(&dir)?;
                let k = dir.join(format!("{}.kubeconfig", self.pod_name));
                service_account_kubeconfig(client, &namespace, &sa, &k).await?;
                k
            }
        };
        grant(&kubeconfig, uid, gid)?;

        let readiness = container.readiness_probe.as_ref().and_then(|p| {
            let get = p.http_get.as_ref()?;
            let port = match &get.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => {
                    u16::try_from(*n).ok()?
                }
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                    *port_names.get(s)?
                }
            };
            Some((get.path.clone().unwrap_or_else(|| "/".into()), port))
        });
        if container.readiness_probe.is_some() && readiness.is_none() {
            bail!("{what}: the readiness probe names a port the container does not declare");
        }

        let mut cmd = match &emulator {
            Some(qemu) => {
                let mut c = Command::new(qemu);
                c.arg(&program);
                c
            }
            None => Command::new(&program),
        };
        cmd.args(&args).env_clear();
        for k in ["PATH", "RUST_BACKTRACE"] {
            if let Ok(v) = std::env::var(k) {
                cmd.env(k, v);
            }
        }
        cmd.env("KUBECONFIG", &kubeconfig)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost");
        for (k, v) in &env {
            cmd.env(k, v);
        }
        if is_root() {
            use std::os::unix::process::CommandExt as _;
            // std drops the supplementary groups when root switches uid.
            cmd.uid(uid).gid(gid);
        }
        if self.detached {
            use std::os::unix::process::CommandExt as _;
            cmd.process_group(0);
        }
        let proc = match &self.log {
            Some(log) => Running::spawn_logged(&self.deployment, cmd, log.clone())?,
            None => Running::spawn(&self.deployment, cmd)?,
        };
        Ok(Pod {
            proc,
            name: self.pod_name,
            ports,
            port_names,
            args,
            readiness,
        })
    }

    /// The program to run (and its emulator), the image's default
    /// arguments, and the image's user.
    fn program(&self, c: &Container, what: &str) -> anyhow::Result<Program> {
        let service = self.deployment.as_str();
        if binaries_from_cargo() {
            return Ok(Program {
                path: crate::process::binary(service),
                emulator: None,
                default_args: Vec::new(),
                user: (65532, 65532),
            });
        }
        let img = image::unpack(service)?;
        let command = c
            .command
            .clone()
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| img.entrypoint.clone());
        let Some(first) = command.first() else {
            bail!(
                "{what}: neither the container nor image {} names a command",
                img.digest
            );
        };
        if command.len() > 1 {
            bail!("{what}: multi-word commands are not supported by the test launcher");
        }
        let program = img.path_of(first);
        if !program.exists() {
            bail!(
                "{what}: command {first} does not exist in image {} (unpacked at {})",
                img.digest,
                img.root.display()
            );
        }
        let emulator = emulator_for(&img.platform)
            .with_context(|| format!("{what}: image {} is {}", img.digest, img.platform))?;
        Ok(Program {
            path: program,
            emulator,
            default_args: img.cmd.clone(),
            user: (img.uid, img.gid),
        })
    }
}

/// What [`Launch::program`] found: the binary, and how to start it.
struct Program {
    path: PathBuf,
    /// The user-mode emulator that runs it when the image is not the host's
    /// architecture (`qemu-aarch64` for linux/arm64 on an amd64 machine).
    emulator: Option<PathBuf>,
    default_args: Vec<String>,
    user: (u32, u32),
}

/// The qemu user-mode emulator for a binary of `platform`, or none when the
/// host runs it itself.
pub fn emulator_for(platform: &str) -> anyhow::Result<Option<PathBuf>> {
    let host = image::host_platform();
    if platform == host {
        return Ok(None);
    }
    let name = match platform {
        "linux/arm64" => "qemu-aarch64",
        "linux/amd64" => "qemu-x86_64",
        other => bail!("no emulator is known for {other} binaries on this {host} machine"),
    };
    let path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    match path {
        Some(p) => Ok(Some(p)),
        None => bail!(
            "{platform} binaries need {name} on this {host} machine, and it is not on PATH: install it with `apt-get install qemu-user` (or `bash tests/setup.sh` as root)"
        ),
    }
}

impl Pod {
    /// Local port of container port `name` (e.g. "health").
    pub fn port(&self, name: &str) -> anyhow::Result<u16> {
        let cp = self
            .port_names
            .get(name)
            .with_context(|| format!("pod {} declares no port named {name}", self.name))?;
        self.ports
            .get(cp)
            .copied()
            .with_context(|| format!("container port {cp} of pod {} is not mapped", self.name))
    }

    /// Local port a `--<flag>=127.0.0.1:<port>` argument (or its environment
    /// default) ended up on, e.g. `metrics-bind-address`.
    pub fn flag_port(&self, flag: &str) -> anyhow::Result<u16> {
        let prefix = format!("--{flag}=");
        self.args
            .iter()
            .rev()
            .find_map(|a| a.strip_prefix(&prefix))
            .and_then(|v| v.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .with_context(|| {
                format!(
                    "pod {} has no {prefix}HOST:PORT argument: {:?}",
                    self.name, self.args
                )
            })
    }

    /// Wait until the manifest's readiness probe answers 200 (as the kubelet would).
    pub async fn wait_ready(&self, deadline: std::time::Duration) -> anyhow::Result<()> {
        let Some((path, cp)) = &self.readiness else {
            return Ok(());
        };
        let local = *self.ports.get(cp).with_context(|| {
            format!(
                "readiness probe port {cp} of pod {} is not mapped",
                self.name
            )
        })?;
        let res = crate::wait::until(
            &format!("pod {} readiness probe GET {path}", self.name),
            deadline,
            || async {
                Ok(match crate::process::http_status_local(local, path).await {
                    Ok((200, _)) => crate::wait::Poll::Ready(()),
                    Ok((code, body)) => crate::wait::Poll::Pending(format!("{code} {body}")),
                    Err(e) => crate::wait::Poll::Pending(format!("{e:#}")),
                })
            },
        )
        .await;
        res.map_err(|e| anyhow::anyhow!("{e:#}\n{} log:\n{}", self.name, self.proc.log_tail(40)))
    }
}

/// `:8443`, `0.0.0.0:8443`, `[::]:8443` -> a fresh `127.0.0.1:<port>`; `0` stays off.
fn map_address(value: &str, ports: &mut BTreeMap<u16, u16>) -> anyhow::Result<String> {
    if value == "0" || value.is_empty() {
        return Ok(value.to_string());
    }
    let port: u16 = value
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("bind address {value:?} has no port"))?;
    if port == 0 {
        return Ok("127.0.0.1:0".into());
    }
    let local = match ports.get(&port) {
        Some(l) => *l,
        None => {
            let l = free_port()?;
            ports.insert(port, l);
            l
        }
    };
    Ok(format!("127.0.0.1:{local}"))
}

/// Rewrite a mounted path inside an argument or value to its host directory.
fn map_paths(value: &str, mounts: &[(String, PathBuf)]) -> String {
    for (path, host) in mounts {
        if let Some(pos) = value.find(path.as_str()) {
            let rest = &value[pos + path.len()..];
            if rest.is_empty() || rest.starts_with('/') {
                return format!("{}{}{}", &value[..pos], host.display(), rest);
            }
        }
    }
    value.to_string()
}

/// Whether we may switch users (the launcher runs pods as their image user).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Make `path` (recursively) owned by the pod's user, as a volume with the
/// pod's fsGroup would be. Without root the process runs as ourselves anyway.
pub fn grant(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    if !is_root() {
        return Ok(());
    }
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("volume path {} missing", path.display()))?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))
        .with_context(|| format!("chown {}", path.display()))?;
    if meta.is_dir() {
        for e in std::fs::read_dir(path)? {
            grant(&e?.path(), uid, gid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_map_to_loopback_ports() {
        let mut ports = BTreeMap::new();
        let a = map_address(":8443", &mut ports).expect("mapped");
        assert!(a.starts_with("127.0.0.1:"), "{a}");
        assert_eq!(map_address("0.0.0.0:8443", &mut ports).expect("same"), a);
        assert_eq!(map_address("0", &mut ports).expect("off"), "0");
        assert!(map_address("nonsense", &mut ports).is_err());
        assert_eq!(ports.len(), 1);
    }

    #[test]
    fn mounted_paths_map_to_host_dirs() {
        let mounts = vec![("/tmp/certs".to_string(), PathBuf::from("/h/c"))];
        assert_eq!(
            map_paths("--cert-dir=/tmp/certs", &mounts),
            "--cert-dir=/h/c"
        );
        assert_eq!(map_paths("/tmp/certs/tls.crt", &mounts), "/h/c/tls.crt");
        assert_eq!(map_paths("/tmp/certsx", &mounts), "/tmp/certsx");
        assert_eq!(map_paths("--leader-elect", &mounts), "--leader-elect");
    }
}
