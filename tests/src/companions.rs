//! The companions of `make companions` (tests/companions/up.sh) as the suites
//! use them: cert-manager (a Certificate's readiness, a renewal as `cmctl
//! renew` asks for one), the API server's private /etc/hosts (a Service name
//! routed to 127.0.0.1 for it alone), and the local Prometheus (its HTTP API,
//! the target files its scrape jobs read).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wait::{Poll, until};

/// cert-manager's Certificate, read without its Go types.
pub fn certificates(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// cert-manager's Issuer, read without its Go types.
pub fn issuers(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", "Issuer");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// The status of condition `type_` of a cert-manager object, if any.
pub fn condition(obj: &DynamicObject, type_: &str) -> Option<String> {
    obj.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

/// Wait until Certificate `ns/name` is Ready with a revision above `after`
/// (0: any); returns its revision.
pub async fn wait_certificate(
    client: &Client,
    ns: &str,
    name: &str,
    after: i64,
    deadline: Duration,
) -> anyhow::Result<i64> {
    let api = certificates(client, ns);
    until(
        &format!("Certificate {ns}/{name} Ready at a revision above {after}"),
        deadline,
        || async {
            let c = api.get(name).await?;
            let rev = c.data["status"]["revision"].as_i64().unwrap_or(0);
            let ready = condition(&c, "Ready");
            Ok(if ready.as_deref() == Some("True") && rev > after {
                Poll::Ready(rev)
            } else {
                Poll::Pending(format!(
                    "revision {rev}, Ready {ready:?}, conditions {}",
                    c.data["status"]["conditions"]
                ))
            })
        },
    )
    .await
}

/// Ask cert-manager to issue Certificate `ns/name` again now, as `cmctl
/// renew` does: condition Issuing=True, reason ManuallyTriggered, on its status.
pub async fn renew(client: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let api = certificates(client, ns);
    let mut c = api
        .get(name)
        .await
        .with_context(|| format!("reading Certificate {ns}/{name}"))?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let issuing = json!({
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered",
        "lastTransitionTime": now,
    });
    let conds = c.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|x| x["type"] != "Issuing")
        .collect();
    conds.push(issuing);
    c.data["status"]["conditions"] = Value::Array(conds);
    api.replace_status(name, &PostParams::default(), &c)
        .await
        .with_context(|| format!("marking Certificate {ns}/{name} for renewal"))?;
    Ok(())
}

/// The caBundle of the first webhook of configuration `name`, when set.
pub async fn injected_ca(client: &Client, name: &str) -> Option<String> {
    let vwc = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await
        .ok()?;
    let bundle = vwc.webhooks?.into_iter().next()?.client_config.ca_bundle?;
    Some(String::from_utf8_lossy(&bundle.0).to_string()).filter(|s| !s.is_empty())
}

/// One key of Secret `ns/name`, as text.
pub async fn secret_value(
    client: &Client,
    ns: &str,
    name: &str,
    key: &str,
) -> anyhow::Result<String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading Secret {ns}/{name}"))?;
    s.data
        .and_then(|d| {
            d.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).to_string())
        })
        .with_context(|| format!("Secret {ns}/{name} has no {key}"))
}

/// Wait until cainjector's caBundle in `vwc` holds the `ca.crt` of Secret
/// `ns/secret`; returns the bundle. cainjector may keep the previous CA next
/// to the new one through a rotation: the bundle must hold the current one.
pub async fn wait_injected(
    client: &Client,
    ns: &str,
    vwc: &str,
    secret: &str,
    deadline: Duration,
) -> anyhow::Result<String> {
    until(
        &format!("cainjector to put Secret {ns}/{secret}'s ca.crt in {vwc}'s caBundle"),
        deadline,
        || async {
            let ca = secret_value(client, ns, secret, "ca.crt")
                .await
                .unwrap_or_default();
            let got = injected_ca(client, vwc).await;
            Ok(match got {
                Some(b) if !ca.trim().is_empty() && b.contains(ca.trim()) => Poll::Ready(b),
                other => Poll::Pending(format!(
                    "caBundle {} bytes, ca.crt {} bytes",
                    other.map_or(0, |b| b.len()),
                    ca.len()
                )),
            })
        },
    )
    .await
}

/// The objects of kind `kind` of the rendered `manifests/<dir>`.
pub fn rendered(dir: &str, kind: &str) -> anyhow::Result<Vec<Value>> {
    let yaml = crate::deployment::render(dir)?;
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(&yaml) {
        let v = serde_json::to_value(serde_yaml::Value::deserialize(d)?)?;
        if v["kind"] == kind {
            out.push(v);
        }
    }
    Ok(out)
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Apply the Issuers and Certificates of the rendered `manifests/<dir>` and
/// wait until cert-manager has issued every Certificate; returns what it issued.
pub async fn issue_overlay_certificates(
    client: &Client,
    dir: &str,
    deadline: Duration,
) -> anyhow::Result<String> {
    let mut issued = String::new();
    for kind in ["Issuer", "Certificate"] {
        for obj in rendered(dir, kind)? {
            issued += &format!("{kind} {} ", name_of(&obj));
            crate::manifests::apply_yaml(client, &serde_yaml::to_string(&obj)?)
                .await
                .with_context(|| format!("applying {kind} {}", name_of(&obj)))?;
        }
    }
    for c in rendered(dir, "Certificate")? {
        let ns = c["metadata"]["namespace"].as_str().unwrap_or("default");
        wait_certificate(client, ns, &name_of(&c), 0, deadline).await?;
    }
    Ok(issued)
}

/// Delete the Certificates of the rendered `manifests/<dir>`, their
/// Secrets and its Issuers (best effort): the next issuance starts from nothing.
pub async fn forget_overlay_certificates(client: &Client, dir: &str) {
    let dp = DeleteParams::default();
    for c in rendered(dir, "Certificate").unwrap_or_default() {
        let ns = c["metadata"]["namespace"].as_str().unwrap_or("default");
        let _ = certificates(client, ns).delete(&name_of(&c), &dp).await;
        if let Some(s) = c["spec"]["secretName"].as_str() {
            let _ = Api::<Secret>::namespaced(client.clone(), ns)
                .delete(s, &dp)
                .await;
        }
    }
    for i in rendered(dir, "Issuer").unwrap_or_default() {
        let ns = i["metadata"]["namespace"].as_str().unwrap_or("default");
        let _ = issuers(client, ns).delete(&name_of(&i), &dp).await;
    }
}

/// Copies Secret `ns/name` into `dir` in the kubelet layout whenever its
/// data changes, until `stop` (a kubelet does this for a mounted Secret, a
/// minute or so late; this at once), owned by the images' user when root.
pub fn mirror_secret(client: Client, ns: &str, name: &str, dir: &Path, stop: Arc<AtomicBool>) {
    let api: Api<Secret> = Api::namespaced(client, ns);
    let (name, dir) = (name.to_string(), dir.to_path_buf());
    tokio::spawn(async move {
        let mut last: Option<BTreeMap<String, Vec<u8>>> = None;
        while !stop.load(Ordering::SeqCst) {
            if let Ok(s) = api.get(&name).await {
                let data: BTreeMap<String, Vec<u8>> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                if last.as_ref() != Some(&data) && data.contains_key("tls.crt") {
                    let files: Vec<(&str, &[u8])> = data
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_slice()))
                        .collect();
                    let written = if crate::deployment::is_root() {
                        certs::write_kubelet_layout_owned(&dir, &files, 65532, 65532)
                    } else {
                        certs::write_kubelet_layout(&dir, &files)
                    };
                    if written.is_ok() {
                        last = Some(data);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// Wait until [`mirror_secret`] has written `dir` once.
pub async fn wait_mounted(dir: &Path, deadline: Duration) {
    until(
        &format!("the Secret mirrored into {}", dir.display()),
        deadline,
        || async {
            Ok(if dir.join("tls.crt").exists() {
                Poll::Ready(())
            } else {
                Poll::Pending("nothing yet".into())
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Whether the local API server reads `.cluster/hosts` as its /etc/hosts
/// (tests/cluster/up.sh starts it so when run as root).
pub fn apiserver_reads_hosts_file() -> bool {
    std::fs::read_to_string(crate::cluster_dir().join("pids/kube-apiserver.cmd"))
        .is_ok_and(|c| c.starts_with("unshare "))
        && crate::cluster_dir().join("hosts").is_file()
}

/// Make `name` resolve to 127.0.0.1 for the API server alone; false (and
/// nothing written) when it does not read `.cluster/hosts`.
pub fn route_to_loopback(name: &str) -> anyhow::Result<bool> {
    if !apiserver_reads_hosts_file() {
        return Ok(false);
    }
    let path = crate::cluster_dir().join("hosts");
    let text = std::fs::read_to_string(&path)?;
    let line = format!("127.0.0.1 {name}");
    if !text.lines().any(|l| l.trim() == line) {
        // Appended in place: the API server's bind mount follows this inode.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path)?;
        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())
            .with_context(|| format!("adding {name} to {}", path.display()))?;
    }
    Ok(true)
}

/// The local Prometheus' base URL (`make companions` writes it).
pub fn prometheus_url() -> anyhow::Result<String> {
    let path = crate::cluster_dir().join("prometheus.url");
    let url = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no local Prometheus: {} is missing; run `make companions` first",
            path.display()
        )
    })?;
    Ok(url.trim().to_string())
}

/// GET `path` (with its query) from the local Prometheus; the JSON `data`.
pub async fn prometheus_get(path: &str) -> anyhow::Result<Value> {
    let (base, text) = prometheus_request("GET", path, Duration::from_secs(10)).await?;
    let (_, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("GET {base}{path}: not an HTTP answer: {text}"))?;
    let v: Value = serde_json::from_str(body)
        .with_context(|| format!("GET {base}{path}: not JSON: {body}"))?;
    if v["status"] != "success" {
        bail!("GET {base}{path}: {v}");
    }
    Ok(v["data"].clone())
}

/// One HTTP/1.0 request to the local Prometheus: its base URL and the whole answer.
async fn prometheus_request(
    method: &str,
    path: &str,
    answer_within: Duration,
) -> anyhow::Result<(String, String)> {
    let base = prometheus_url()?;
    let host = base
        .strip_prefix("http://")
        .with_context(|| format!("Prometheus URL {base} is not http://HOST:PORT"))?;
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(host))
        .await
        .with_context(|| format!("connecting to Prometheus at {base}: timed out"))?
        .with_context(|| format!("connecting to Prometheus at {base}"))?;
    let req = format!("{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(answer_within, s.read_to_end(&mut buf))
        .await
        .with_context(|| format!("{method} {base}{path}: no answer in {answer_within:?}"))??;
    Ok((base, String::from_utf8_lossy(&buf).into_owned()))
}

/// Percent-encode a PromQL expression for a query string.
pub fn encode(q: &str) -> String {
    let mut out = String::new();
    for b in q.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// An instant query's result vector.
pub async fn query(expr: &str) -> anyhow::Result<Vec<Value>> {
    let data = prometheus_get(&format!("/api/v1/query?query={}", encode(expr))).await?;
    Ok(data["result"].as_array().cloned().unwrap_or_default())
}

/// Where the local Prometheus reads Service `ns/name`'s targets.
pub fn targets_file(ns: &str, service: &str) -> PathBuf {
    crate::cluster_dir()
        .join("prometheus/targets")
        .join(format!("{ns}_{service}.json"))
}

/// Point the scrape of Service `ns/name` (port `port_name`) at local
/// addresses, labelled as the Prometheus Operator labels a Service's targets.
pub fn set_targets(
    ns: &str,
    service: &str,
    port_name: &str,
    addrs: &[String],
    pods: &[String],
) -> anyhow::Result<()> {
    let groups: Vec<Value> = addrs
        .iter()
        .zip(pods.iter().chain(std::iter::repeat(&String::new())))
        .map(|(a, pod)| {
            json!({"targets": [a], "labels": {
                "job": service, "namespace": ns, "service": service,
                "endpoint": port_name, "pod": pod,
            }})
        })
        .collect();
    let path = targets_file(ns, service);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&groups)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    // Renamed into place: Prometheus never reads half a file.
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// An alert a test raises in the local Prometheus: a rule file of its own in
/// `prometheus/rules.d/` (read by the configuration prometheus-config
/// writes), an alert that always fires (`vector(1)`) with the test's labels,
/// evaluated by Prometheus itself. [`TestAlert::clear`] removes it; dropping
/// it removes the file (the next reload forgets the alert).
pub struct TestAlert {
    path: PathBuf,
    name: String,
    labels: BTreeMap<String, String>,
}

impl TestAlert {
    /// Raise alert `name` with `labels`; returns once Prometheus lists it firing.
    pub async fn raise(name: &str, labels: &[(&str, &str)]) -> anyhow::Result<TestAlert> {
        let dir = crate::cluster_dir().join("prometheus").join("rules.d");
        if !dir.is_dir() {
            bail!(
                "{} is missing: the local Prometheus predates test rules; run `make companions`",
                dir.display()
            );
        }
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let rules = json!({"groups": [{"name": format!("test-{name}"), "interval": "1s",
            "rules": [{"alert": name, "expr": "vector(1)", "labels": labels}]}]});
        // One file per raise: tests raising the same alert name never remove
        // each other's.
        let path = dir.join(format!("{}.yaml", crate::unique(name)));
        std::fs::write(&path, serde_yaml::to_string(&rules)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let alert = TestAlert {
            path,
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        prometheus_reload().await?;
        alert.wait(true).await?;
        Ok(alert)
    }

    /// Clear the alert; returns once Prometheus no longer lists it.
    pub async fn clear(self) -> anyhow::Result<()> {
        std::fs::remove_file(&self.path)
            .with_context(|| format!("removing {}", self.path.display()))?;
        prometheus_reload().await?;
        self.wait(false).await
    }

    async fn wait(&self, firing: bool) -> anyhow::Result<()> {
        let what = if firing { "firing" } else { "gone" };
        until(
            &format!("test alert {} {what} in Prometheus", self.name),
            Duration::from_secs(60),
            || async {
                let data = prometheus_get("/api/v1/alerts").await?;
                let states: Vec<String> = data["alerts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|a| {
                        a["labels"]["alertname"] == self.name.as_str()
                            && self
                                .labels
                                .iter()
                                .all(|(k, v)| a["labels"][k.as_str()] == v.as_str())
                    })
                    .map(|a| a["state"].as_str().unwrap_or_default().to_string())
                    .collect();
                let done = if firing {
                    states.iter().any(|s| s == "firing")
                } else {
                    states.is_empty()
                };
                Ok(if done {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("states {states:?}"))
                })
            },
        )
        .await
    }
}

impl Drop for TestAlert {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// POST /-/reload to the local Prometheus (started with --web.enable-lifecycle).
pub async fn prometheus_reload() -> anyhow::Result<()> {
    let (base, text) = prometheus_request("POST", "/-/reload", Duration::from_secs(30)).await?;
    if !text.starts_with("HTTP/1.0 200") && !text.starts_with("HTTP/1.1 200") {
        bail!("POST {base}/-/reload: {text}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promql_is_encoded_for_a_query_string() {
        assert_eq!(encode(r#"up{job="a b"}"#), "up%7Bjob%3D%22a%20b%22%7D");
    }
}
