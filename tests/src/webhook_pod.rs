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
use shared::consts::WEBHOOK_PATH;

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
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": group, "labels": {GROUP_KEY: group}},
        "webhooks": [{
            "name": webhook_name(group),
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
        }]
    }))
    .expect("ValidatingWebhookConfiguration JSON");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("ValidatingWebhookConfiguration created");
}

/// Remove what [`register_url`] registered for `group` (best effort).
pub async fn unregister(client: &Client, group: &str) {
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(group, &kube::api::DeleteParams::default())
        .await;
}
