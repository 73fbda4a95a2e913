//! One webhook pod for a test: serving certificates in the kubelet layout, the
//! base Deployment's pod started from its image, and a
//! ValidatingWebhookConfiguration that sends the API server's reviews of this
//! test's NodeMaintenances (and only those) to it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;
use shared::api::consts::WEBHOOK_PATH;
use shared::api::drain_rule::DRAIN_RULE_WEBHOOK_PATH;

use crate::deployment::Launch;
use crate::fixtures::GROUP_KEY;
use crate::process::Running;

const LONG: Duration = Duration::from_secs(60);

/// A serving certificate for 127.0.0.1 / localhost, signed by `ca`.
pub fn issue(ca: &certs::Ca) -> certs::ServingCert {
    ca.issue_serving(
        &["localhost".to_string()],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        Duration::from_secs(3600),
    )
    .expect("serving certificate")
}

/// Write (or rotate) the serving set in the kubelet layout, readable by the
/// image's user (65532) as a Secret volume with the pod's fsGroup would be.
pub fn write_certs(dir: &std::path::Path, ca: &certs::Ca, cert: &certs::ServingCert) {
    if crate::deployment::is_root() {
        certs::write_serving_set_owned(dir, ca, cert, 65532, 65532)
    } else {
        certs::write_serving_set(dir, ca, cert)
    }
    .expect("certificates written");
}

/// One pod of the base webhook Deployment, from the image: its arguments with
/// the listen addresses mapped to local ports and the certificate Secret volume
/// standing at `cert_dir`; plain-HTTP metrics for the counters. Returns once
/// its readiness probe passes, with its TLS, probe and metrics addresses.
pub async fn launch_pod(
    client: &Client,
    cert_dir: &std::path::Path,
    kubeconfig: &std::path::Path,
    openshift: &str,
) -> (Running, SocketAddr, SocketAddr, SocketAddr) {
    let pod = Launch::new("base", "nmo-webhook")
        .volume("cert", cert_dir)
        .kubeconfig(kubeconfig)
        .extra_args([
            format!("--openshift={openshift}"),
            // Short: the rotation test also proves the periodic backstop is harmless.
            "--cert-reload-interval=5s".to_string(),
            "--metrics-secure=false".to_string(),
        ])
        .start(client)
        .await
        .expect("webhook started");
    pod.wait_ready(LONG).await.expect("webhook Ready");
    let local = |p: anyhow::Result<u16>| {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), p.expect("mapped port"))
    };
    let tls = local(pod.flag_port("webhook-bind-address"));
    let probe = local(pod.port("health"));
    let metrics = local(pod.flag_port("metrics-bind-address"));
    (pod.proc, tls, probe, metrics)
}

fn webhook_name(group: &str) -> String {
    format!("{group}.nmo-tests.medik8s.io")
}

/// Register the webhook at 127.0.0.1:`port` for NodeMaintenances whose name
/// starts with `group` (configuration named `group`, labelled with it).
pub async fn register_url(client: &Client, group: &str, port: u16, ca_bundle: &str) {
    register_named(client, group, &webhook_name(group), port, ca_bundle).await;
}

/// [`register_url`] with the webhook itself named `name` (e.g. the
/// manifests' own, so messages read as a cluster's would).
pub async fn register_named(client: &Client, group: &str, name: &str, port: u16, ca_bundle: &str) {
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": group, "labels": {GROUP_KEY: group}},
        "webhooks": [
            test_webhook(group, name, port, ca_bundle),
            drain_rule_webhook(group, port, ca_bundle),
        ]
    }))
    .expect("ValidatingWebhookConfiguration JSON");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("ValidatingWebhookConfiguration created");
}

/// One webhook entry of a configuration: `name`, calling 127.0.0.1:`port`,
/// for the NodeMaintenances of test group `group` only, failurePolicy Fail.
pub fn test_webhook(group: &str, name: &str, port: u16, ca_bundle: &str) -> serde_json::Value {
    json!({
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 10,
        "clientConfig": {
            "url": format!("https://127.0.0.1:{port}{WEBHOOK_PATH}"),
            "caBundle": ca_bundle,
        },
        "rules": [{
            "apiGroups": ["nodemaintenance.medik8s.io"],
            "apiVersions": ["v1beta1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["nodemaintenances"],
        }],
        // Webhook configurations are cluster-wide: only this test's objects.
        "matchConditions": [{
            "name": "this-test-only",
            "expression": format!("object.metadata.name.startsWith('{group}')"),
        }],
    })
}

/// The NodeDrainRule webhook entry of a test's configuration: the rules
/// whose name starts with `group` only.
pub fn drain_rule_webhook(group: &str, port: u16, ca_bundle: &str) -> serde_json::Value {
    json!({
        "name": format!("rules.{}", webhook_name(group)),
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 10,
        "clientConfig": {
            "url": format!("https://127.0.0.1:{port}{DRAIN_RULE_WEBHOOK_PATH}"),
            "caBundle": ca_bundle,
        },
        "rules": [{
            "apiGroups": ["nodemaintenance.medik8s.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["nodedrainrules"],
        }],
        "matchConditions": [{
            "name": "this-test-only",
            "expression": format!("object.metadata.name.startsWith('{group}')"),
        }],
    })
}

/// Remove what [`register_url`] registered for `group` (best effort).
pub async fn unregister(client: &Client, group: &str) {
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(group, &kube::api::DeleteParams::default())
        .await;
}

/// One webhook for a test, started as suite `webhook` starts its own: fresh
/// certificates in the kubelet layout, the base Deployment's pod run as the
/// nmo-webhook ServiceAccount with `extra_args` after the manifests'
/// arguments.
pub struct TestWebhook {
    pub proc: Running,
    pub tls_addr: SocketAddr,
    /// Where its /metrics listens (plain HTTP unless `--metrics-secure=true`
    /// is among the extra arguments).
    pub metrics_port: u16,
    pub ca: certs::Ca,
}

impl TestWebhook {
    /// Start it (`--openshift=false`) and wait for its readiness probe.
    pub async fn start(client: &Client, group: &str, extra_args: &[&str]) -> TestWebhook {
        Self::start_in(client, group, "base", &[], extra_args).await
    }

    /// [`TestWebhook::start`] with the Deployment of `manifests/<overlay>`,
    /// its Secret volumes other than "cert" standing at `volumes`.
    pub async fn start_in(
        client: &Client,
        group: &str,
        overlay: &str,
        volumes: &[(&str, &std::path::Path)],
        extra_args: &[&str],
    ) -> TestWebhook {
        let dir = crate::repo_root().join(".cluster/test-logs");
        let cert_dir = dir.join(format!("{group}-certs"));
        let ca = certs::Ca::new("nmo-tests-webhook-ca", Duration::from_secs(3600)).expect("CA");
        let cert = issue(&ca);
        write_certs(&cert_dir, &ca, &cert);
        let kubeconfig = dir.join(format!("{group}-webhook.kubeconfig"));
        crate::process::service_account_kubeconfig(
            client,
            "nmo-system",
            "nmo-webhook",
            &kubeconfig,
        )
        .await
        .expect("webhook kubeconfig");
        let mut args = vec![
            "--openshift=false".to_string(),
            "--metrics-secure=false".to_string(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let mut launch = Launch::new(overlay, "nmo-webhook").volume("cert", &cert_dir);
        for (name, path) in volumes {
            launch = launch.volume(name, path);
        }
        let pod = launch
            .kubeconfig(&kubeconfig)
            .extra_args(args)
            .start(client)
            .await
            .expect("webhook started");
        pod.wait_ready(LONG).await.expect("webhook Ready");
        let port = pod.flag_port("webhook-bind-address").expect("mapped port");
        let metrics_port = pod.flag_port("metrics-bind-address").expect("mapped port");
        TestWebhook {
            proc: pod.proc,
            tls_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            metrics_port,
            ca,
        }
    }

    /// Register it for NodeMaintenances named `group...` ([`register_url`]),
    /// and return once the API server calls it: a dry-run create for a
    /// missing node is denied with this webhook's words.
    pub async fn register(&self, client: &Client, group: &str) {
        register_url(
            client,
            group,
            self.tls_addr.port(),
            &certs::ca_bundle_base64(self.ca.cert_pem()),
        )
        .await;
        let ghost = format!("{group}-ghost");
        let nm = test_nm(&format!("{group}-probe"), &ghost);
        crate::wait::until(
            "the API server to call this test's webhook",
            Duration::from_secs(20),
            || async {
                let r = create_with_warnings(client, &nm, true).await;
                Ok(match &r {
                    Err((403, m)) if m.ends_with(&format!("no node with name {ghost} found")) => {
                        crate::wait::Poll::Ready(())
                    }
                    _ => crate::wait::Poll::Pending(format!("{r:?}")),
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nwebhook log:\n{}", self.proc.log_text()));
    }
}

/// A NodeMaintenance for `node` named `name` (from JSON: optional spec
/// fields keep their defaults whatever the API version adds).
pub fn test_nm(name: &str, node: &str) -> shared::NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "webhook test"}
    }))
    .expect("NodeMaintenance JSON")
}

/// Create `nm` through the API server (a server-side dry run when `dry_run`)
/// and return the warnings it answered with (its `Warning` headers, as
/// kubectl prints them), or the refusal's (code, message). kube's typed
/// `create` drops the headers, so this sends the request itself.
pub async fn create_with_warnings(
    client: &Client,
    nm: &shared::NodeMaintenance,
    dry_run: bool,
) -> Result<Vec<String>, (u16, String)> {
    let pp = PostParams {
        dry_run,
        ..Default::default()
    };
    let body = serde_json::to_vec(nm).map_err(|e| (0, e.to_string()))?;
    let req = kube::core::Request::new("/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances")
        .create(&pp, body)
        .map_err(|e| (0, e.to_string()))?;
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|e| (0, e.to_string()))?;
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| warning_text(&String::from_utf8_lossy(v.as_bytes())))
        .collect();
    if (200..300).contains(&status) {
        return Ok(warnings);
    }
    let body = resp.into_body().collect_bytes().await.unwrap_or_default();
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    Err((status, message))
}

/// The text of one `Warning: 299 - "text"` header (RFC 7234 quoting).
fn warning_text(header: &str) -> String {
    let quoted = header
        .split_once(" - ")
        .map(|(_, rest)| rest)
        .unwrap_or(header)
        .trim();
    let inner = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(quoted);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

/// Run `cleanup` with an admin client to completion from a `Drop` (which
/// cannot await): on its own thread and runtime, also while panicking.
pub fn run_cleanup<F, Fut>(cleanup: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let done = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            if let Ok(client) = crate::admin_client().await {
                cleanup(client).await;
            }
        });
    });
    let _ = done.join();
}

/// Removes what a webhook test of `group` created ([`remove_group`]), also
/// when it panicked: on its own thread and runtime, since Drop cannot await.
pub struct GroupCleanup {
    pub group: String,
    pub namespaces: Vec<String>,
}

impl Drop for GroupCleanup {
    fn drop(&mut self) {
        let (group, namespaces) = (self.group.clone(), self.namespaces.clone());
        run_cleanup(move |client| async move {
            remove_group(&client, &group, &namespaces).await;
        });
    }
}

/// A webhook test's start: an admin client, the webhook's prerequisites from
/// manifests/, a test bed of `prefix` and what removes it all again.
pub async fn webhook_bed(prefix: &str) -> (Client, crate::fixtures::TestBed, GroupCleanup) {
    let client = crate::admin_client().await.expect("local control plane");
    crate::manifests::install_webhook_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let bed = crate::fixtures::TestBed::new(client.clone(), prefix)
        .await
        .expect("test namespace");
    let cleanup = GroupCleanup {
        group: bed.group.clone(),
        namespaces: vec![bed.namespace.clone()],
    };
    (client, bed, cleanup)
}

/// Remove what a webhook test of `group` created (best effort): its webhook
/// configuration, the NodeMaintenances named `group...`, `namespaces`, and
/// the nodes labelled with the group.
pub async fn remove_group(client: &Client, group: &str, namespaces: &[String]) {
    use k8s_openapi::api::core::v1::{Namespace, Node};
    use kube::api::{DeleteParams, ListParams};
    let dp = DeleteParams::default();
    unregister(client, group).await;
    let nms: Api<shared::NodeMaintenance> = Api::all(client.clone());
    if let Ok(list) = nms.list(&ListParams::default()).await {
        for n in list.items {
            let name = n.metadata.name.unwrap_or_default();
            if name.starts_with(group) {
                let _ = nms.delete(&name, &dp).await;
            }
        }
    }
    let rules: Api<shared::api::drain_rule::NodeDrainRule> = Api::all(client.clone());
    if let Ok(list) = rules.list(&ListParams::default()).await {
        for r in list.items {
            let name = r.metadata.name.unwrap_or_default();
            if name.starts_with(group) {
                let _ = rules.delete(&name, &dp).await;
            }
        }
    }
    for ns in namespaces {
        let _ = Api::<Namespace>::all(client.clone()).delete(ns, &dp).await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{GROUP_KEY}={group}"));
    if let Ok(list) = nodes.list(&lp).await {
        for n in list.items {
            if let Some(name) = n.metadata.name {
                let _ = nodes.delete(&name, &dp).await;
            }
        }
    }
}
