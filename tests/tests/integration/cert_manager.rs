//! manifests/overlays/cert-manager with a real cert-manager (`make
//! companions`): its Issuers and Certificates, as rendered, are issued by
//! cert-manager; cainjector fills the caBundle of the rendered webhook
//! configuration; the webhook serves the issued Secret from the kubelet's
//! volume layout; the API server calls it at the Service's DNS name
//! (`nmo-webhook-service.nmo-system.svc`, routed to 127.0.0.1 for the API
//! server alone: tests/cluster/up.sh) and trusts it through the injected
//! caBundle. Then cert-manager renews the serving certificate, and the CA,
//! under a steady stream of creates through the API server; every failed
//! admission is counted and printed, and none may fail.
//!
//! The test plays the kubelet's part: when the Secret changes it rewrites the
//! mounted directory by the same `..data` symlink swap, at once (a kubelet
//! takes up to a minute or so; with a CA that outlives its leaves that delay
//! changes nothing, which is the point of the overlay's two-level chain).
//!
//! One test: the overlay's names (Issuers, Certificates, Secrets, the webhook
//! configuration) are cluster-wide fixed names.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use nmo_tests::admission_stream::Stream;
use nmo_tests::companions::{self, wait_certificate};
use nmo_tests::deployment::Launch;
use nmo_tests::fixtures::{GROUP_KEY, TestBed};
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{create_with_warnings, test_nm};
use nmo_webhook_client::{ReviewClient, tls_config};
use serde_json::{Value, json};
use shared::api::consts::WEBHOOK_PATH;

const NS: &str = "nmo-system";
const OVERLAY: &str = "overlays/cert-manager";
const LONG: Duration = Duration::from_secs(90);

fn rendered(kind: &str) -> Vec<Value> {
    companions::rendered(OVERLAY, kind).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The Certificate whose Secret the webhook Deployment mounts, and the one
/// (if any) that is a CA.
fn certificates() -> (Value, Option<Value>) {
    let dep = nmo_tests::deployment::deployment(OVERLAY, "nmo-webhook").expect("Deployment");
    let secret = dep
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|p| p.volumes)
        .unwrap_or_default()
        .into_iter()
        .find_map(|v| v.secret.and_then(|s| s.secret_name))
        .expect("the webhook Deployment mounts a Secret");
    let all = rendered("Certificate");
    let serving = all
        .iter()
        .find(|c| c["spec"]["secretName"] == secret.as_str())
        .unwrap_or_else(|| panic!("no Certificate of {OVERLAY} writes Secret {secret}"))
        .clone();
    let ca = all.into_iter().find(|c| c["spec"]["isCA"] == true);
    (serving, ca)
}

fn name_of(v: &Value) -> String {
    v["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The rendered webhook configuration made callable here: the Service it
/// names becomes a URL on that DNS name at the local port, and only this
/// test's NodeMaintenances are sent to it. Its annotation (what cainjector
/// reads) is kept as rendered.
fn webhook_configuration(port: u16, group: &str) -> (Value, String) {
    let mut vwc = rendered("ValidatingWebhookConfiguration")
        .pop()
        .expect("the overlay renders a ValidatingWebhookConfiguration");
    let svc = vwc["webhooks"][0]["clientConfig"]["service"].clone();
    let host = format!(
        "{}.{}.svc",
        svc["name"].as_str().expect("service name"),
        svc["namespace"].as_str().expect("service namespace")
    );
    let path = svc["path"].as_str().unwrap_or(WEBHOOK_PATH).to_string();
    vwc["webhooks"][0]["clientConfig"] = json!({"url": format!("https://{host}:{port}{path}")});
    vwc["webhooks"][0]["matchConditions"] = json!([{
        "name": "this-test-only",
        "expression": format!("object.metadata.name.startsWith('{group}')"),
    }]);
    vwc["metadata"]["labels"][GROUP_KEY] = json!(group);
    (vwc, host)
}

/// Renew Certificate `name`, wait for the new revision to be issued and
/// served, and for `more` creates after it; returns the failed admissions.
#[allow(clippy::too_many_arguments)]
async fn renew_under_load(
    client: &Client,
    stream: &Stream,
    cert: &str,
    serving_secret: &str,
    tls_addr: SocketAddr,
    host: &str,
    vwc: &str,
    also_leaf: bool,
) -> (Duration, usize) {
    let (_, before) = stream.counts();
    let certs_api = companions::certificates(client, NS);
    let rev = certs_api.get(cert).await.expect("Certificate").data["status"]["revision"]
        .as_i64()
        .unwrap_or(0);
    let t0 = Instant::now();
    companions::renew(client, NS, cert).await.expect("renew");
    wait_certificate(client, NS, cert, rev, LONG)
        .await
        .expect("renewed");
    if also_leaf {
        // A new CA signs only what is issued after it: the serving
        // certificate's next renewal is what brings the new CA into play.
        let (serving, _) = certificates();
        let leaf = name_of(&serving);
        let lrev = certs_api.get(&leaf).await.expect("leaf").data["status"]["revision"]
            .as_i64()
            .unwrap_or(0);
        companions::renew(client, NS, &leaf)
            .await
            .expect("renew leaf");
        wait_certificate(client, NS, &leaf, lrev, LONG)
            .await
            .expect("leaf renewed");
    }
    let want = companions::secret_value(client, NS, serving_secret, "tls.crt")
        .await
        .expect("serving Secret's tls.crt");
    let ca = companions::wait_injected(client, NS, vwc, serving_secret, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    // The webhook serves the new certificate, and it verifies against the caBundle.
    let want_der = nmo_webhook_client::pem_to_der(&want);
    until(
        "the webhook to serve the renewed certificate",
        LONG,
        || async {
            let c = ReviewClient::connect(tls_addr, host, tls_config(ca.as_bytes())?).await?;
            Ok(if Some(&c.peer_certificate) == want_der.as_ref() {
                Poll::Ready(())
            } else {
                Poll::Pending("the previous certificate".into())
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let took = t0.elapsed();
    stream
        .wait_more(100, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (_, after) = stream.counts();
    (took, after.len() - before.len())
}

#[tokio::test]
async fn overlay_is_issued_injected_served_and_renewed_without_a_failed_admission() {
    let client = nmo_tests::manifests::admin_with_webhook_prereqs().await;
    companions::certificates(&client, NS)
        .list(&Default::default())
        .await
        .expect("cert-manager's CRDs: run `make companions` (tests/companions/up.sh) first");
    let bed = TestBed::new(client.clone(), "cm")
        .await
        .expect("test namespace");
    let g = bed.group.clone();
    let node = bed
        .node("w", false)
        .await
        .expect("node")
        .metadata
        .name
        .expect("name");

    // 1. The overlay's Issuers and Certificates, as rendered, issued by
    // cert-manager from nothing (what an earlier run left is deleted first).
    companions::forget_overlay_certificates(&client, OVERLAY).await;
    let issued = companions::issue_overlay_certificates(&client, OVERLAY, LONG)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e:#}\ncert-manager log:\n{}",
                nmo_tests::component_log_tails(30)
            )
        });
    let (serving, ca_cert) = certificates();
    let serving_name = name_of(&serving);
    let secret = serving["spec"]["secretName"]
        .as_str()
        .expect("secretName")
        .to_string();
    eprintln!("cert-manager issued {issued}");

    // 2. The webhook, given that Secret in the kubelet's layout.
    let dir = nmo_tests::repo_root()
        .join(".cluster/test-logs")
        .join(format!("{g}-cert"));
    let stop = Arc::new(AtomicBool::new(false));
    companions::mirror_secret(client.clone(), NS, &secret, &dir, stop.clone());
    // The metrics certificate (another Secret volume of the overlay's Deployment).
    let metrics_dir = dir.with_extension("metrics");
    companions::mirror_secret(
        client.clone(),
        NS,
        "nmo-metrics-cert",
        &metrics_dir,
        stop.clone(),
    );
    until("the Secret in the mounted directory", LONG, || async {
        Ok(if dir.join("tls.crt").exists() {
            Poll::Ready(())
        } else {
            Poll::Pending("empty".into())
        })
    })
    .await
    .expect("mounted");
    let kubeconfig = dir.with_extension("kubeconfig");
    nmo_tests::process::service_account_kubeconfig(&client, NS, "nmo-webhook", &kubeconfig)
        .await
        .expect("webhook kubeconfig");
    let pod = Launch::new(OVERLAY, "nmo-webhook")
        .volume("cert", &dir)
        .volume("metrics-cert", &metrics_dir)
        .kubeconfig(&kubeconfig)
        .extra_args(["--openshift=false", "--metrics-secure=false"])
        .start(&client)
        .await
        .expect("webhook started");
    pod.wait_ready(LONG).await.expect("webhook Ready");
    let port = pod.flag_port("webhook-bind-address").expect("mapped port");
    let tls_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);

    // 3. The rendered configuration; cainjector injects the CA.
    let (vwc, host) = webhook_configuration(port, &g);
    let vwc_name = name_of(&vwc);
    let routed = companions::route_to_loopback(&host).expect("hosts file");
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let _ = api.delete(&vwc_name, &DeleteParams::default()).await;
    api.patch(
        &vwc_name,
        &PatchParams::apply("nmo-tests").force(),
        &Patch::Apply(&vwc),
    )
    .await
    .expect("webhook configuration applied");
    let ca = companions::wait_injected(&client, NS, &vwc_name, &secret, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));

    // 4. The handshake the API server makes: server name, injected CA.
    let c = ReviewClient::connect(tls_addr, &host, tls_config(ca.as_bytes()).expect("CA"))
        .await
        .unwrap_or_else(|e| panic!("TLS to {host} with the injected caBundle: {e}"));
    assert!(!c.peer_certificate.is_empty());
    assert!(
        routed,
        "the API server does not read .cluster/hosts (not root?): the API server's own call to {host} cannot be shown here"
    );
    let ghost = format!("{g}-ghost");
    until(
        "the API server to call the webhook at its Service name",
        LONG,
        || async {
            let r =
                create_with_warnings(&client, &test_nm(&format!("{g}-probe"), &ghost), true).await;
            Ok(match &r {
                Err((403, m)) if m.ends_with(&format!("no node with name {ghost} found")) => {
                    Poll::Ready(())
                }
                _ => Poll::Pending(format!("{r:?}")),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nwebhook log:\n{}", pod.proc.log_text()));
    eprintln!(
        "the API server called https://{host}:{port} and trusted it through cainjector's caBundle"
    );

    // 5. Renewals by cert-manager under a stream of creates.
    let stream = Stream::start(client.clone(), g.clone(), node.clone());
    stream
        .wait_more(100, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (took, leaf_failed) = renew_under_load(
        &client,
        &stream,
        &serving_name,
        &secret,
        tls_addr,
        &host,
        &vwc_name,
        false,
    )
    .await;
    eprintln!(
        "leaf renewal ({serving_name}): served {took:?} after the renewal was asked for; failed admissions: {leaf_failed}"
    );
    let mut ca_failed = 0;
    if let Some(ca_cert) = &ca_cert {
        let (took, n) = renew_under_load(
            &client,
            &stream,
            &name_of(ca_cert),
            &secret,
            tls_addr,
            &host,
            &vwc_name,
            true,
        )
        .await;
        ca_failed = n;
        let bundle = companions::injected_ca(&client, &vwc_name)
            .await
            .unwrap_or_default();
        eprintln!(
            "CA renewal ({}), then the leaf: new leaf served {took:?} after; caBundle holds {} CA certificate(s); failed admissions: {n}",
            name_of(ca_cert),
            bundle.matches("BEGIN CERTIFICATE").count()
        );
    }
    stop.store(true, Ordering::SeqCst);
    stream.stop();
    let (ok, failed) = stream.counts();
    let at = |f: Option<&(u128, String)>| f.map_or("-".to_string(), |(ms, _)| ms.to_string());
    eprintln!(
        "creates through the API server: {ok} admitted, {} failed (first at {} ms, last at {} ms of the stream)",
        failed.len(),
        at(failed.first()),
        at(failed.last())
    );
    let _ = api.delete(&vwc_name, &DeleteParams::default()).await;
    let _ = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .delete(&node, &DeleteParams::default())
        .await;
    bed.teardown().await;
    assert_eq!(
        leaf_failed,
        0,
        "failed admissions across the leaf renewal: {:?}",
        &failed[..failed.len().min(5)]
    );
    assert_eq!(
        ca_failed,
        0,
        "failed admissions across the CA renewal: {:?}",
        &failed[..failed.len().min(5)]
    );
}
