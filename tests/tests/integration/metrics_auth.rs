//! Secure metrics through the real API server: each binary runs as its own
//! ServiceAccount (so the nmo-metrics-auth RBAC in manifests/ is exercised)
//! with `/metrics` over HTTPS, and every scrape's bearer token goes through a
//! TokenReview and a SubjectAccessReview. No token: 401; a ServiceAccount
//! without nmo-metrics-reader: 403; one bound to it: 200 with the series.
//! `--metrics-secure=false` serves plain HTTP to anyone.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, StatusCode};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use nmo_tests::deployment::Launch;
use nmo_tests::fixtures::GROUP_KEY;
use nmo_tests::manifests::install_prereqs;
use nmo_tests::process::{Running, http_get_local};
use nmo_tests::wait::{Poll, until};
use nmo_webhook_client::{ClientConfig, ReviewClient, tls_config};
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);
const NS: &str = "nmo-system";

/// Two scrapers (ServiceAccounts with fresh tokens) and a metrics certificate
/// from a test CA, so the client can verify the server.
struct Setup {
    client: Client,
    group: String,
    /// The test's copy of nmo-system, where its controller elects a leader.
    operator_ns: String,
    reader_token: String,
    stranger_token: String,
    cert_dir: PathBuf,
    tls: Arc<ClientConfig>,
}

async fn token(client: &Client, sa: &str) -> String {
    nmo_tests::process::service_account_token(client, NS, sa)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

impl Setup {
    async fn new(prefix: &str) -> Setup {
        let client = nmo_tests::admin_client()
            .await
            .expect("local control plane");
        install_prereqs(
            &client,
            &[
                "manifests/controller/rbac.yaml",
                "manifests/webhook/rbac.yaml",
            ],
        )
        .await
        .expect("CRD, namespace and RBAC");
        let group = nmo_tests::unique(prefix);
        let operator_ns = nmo_tests::manifests::operator_namespace_copy(&client, &group)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
        for who in ["reader", "stranger"] {
            let sa: ServiceAccount =
                serde_json::from_value(json!({"metadata": {"name": format!("{group}-{who}")}}))
                    .expect("sa");
            sas.create(&PostParams::default(), &sa)
                .await
                .expect("scraper ServiceAccount");
        }
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("{group}-reader")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "nmo-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": format!("{group}-reader"),
                          "namespace": NS}]
        }))
        .expect("binding");
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("metrics-reader binding");

        let cert_dir = nmo_tests::repo_root()
            .join(".cluster/test-logs")
            .join(format!("{group}-certs"));
        let ca = certs::Ca::new("nmo-tests-metrics-ca", Duration::from_secs(3600)).expect("CA");
        let cert = ca
            .issue_serving(
                &["localhost".to_string()],
                &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
                Duration::from_secs(3600),
            )
            .expect("serving certificate");
        // Readable by the images' user, as a Secret volume with fsGroup would be.
        if nmo_tests::deployment::is_root() {
            certs::write_serving_set_owned(&cert_dir, &ca, &cert, 65532, 65532)
        } else {
            certs::write_serving_set(&cert_dir, &ca, &cert)
        }
        .expect("certificates written");
        Setup {
            reader_token: token(&client, &format!("{group}-reader")).await,
            stranger_token: token(&client, &format!("{group}-stranger")).await,
            tls: tls_config(ca.cert_pem().as_bytes()).expect("client TLS config"),
            client,
            group,
            operator_ns,
            cert_dir,
        }
    }

    /// A pod of the base Deployment `name` (from its image, as its
    /// ServiceAccount), `extra` flags after the manifest's; returns once Ready,
    /// with the local port of its metrics endpoint.
    async fn run(&self, name: &str, extra: Vec<String>) -> (Running, u16) {
        let pod = Launch::new("base", name)
            .volume("cert", &self.cert_dir)
            .extra_args(extra)
            .start(&self.client)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        pod.wait_ready(LONG)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let port = pod.flag_port("metrics-bind-address").expect("metrics port");
        (pod.proc, port)
    }

    /// The controller (its manifest's secure metrics on :8443, mapped), `extra` added.
    async fn controller(&self, extra: &str) -> (Running, u16) {
        let args = vec![
            extra.to_string(),
            // Reconcile nothing of other tests, lead in our copy of nmo-system.
            format!("--nodemaintenance-selector={GROUP_KEY}={}", self.group),
            format!("--leader-election-namespace={}", self.operator_ns),
        ];
        self.run("nmo-controller", args).await
    }

    /// GET /metrics over TLS with an optional bearer token, once the port answers.
    async fn scrape(&self, proc: &Running, port: u16, token: Option<&str>) -> (StatusCode, String) {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        let mut c = until("the metrics port to accept TLS", LONG, || async {
            Ok(
                match ReviewClient::connect(addr, "localhost", self.tls.clone()).await {
                    Ok(c) => Poll::Ready(c),
                    Err(e) => Poll::Pending(e.to_string()),
                },
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nlog:\n{}", proc.log_text()));
        let mut req = Request::get("/metrics").header("host", "localhost");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let (status, body) = c
            .send(req.body(Default::default()).expect("request"))
            .await
            .expect("scrape");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// The three callers: no token, a stranger, the reader (the RBAC binding
    /// may take a moment to reach the authorizer: poll for the 200).
    async fn check_callers(&self, proc: &Running, port: u16, series: &str) {
        let (status, body) = self.scrape(proc, port, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "no token: {body}");
        let (status, body) = self.scrape(proc, port, Some("not-a-token")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "invalid token: {body}");
        let (status, body) = self.scrape(proc, port, Some(&self.stranger_token)).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "token without nmo-metrics-reader: {body}"
        );
        let body = until("the metrics reader to be let in", LONG, || async {
            let (status, body) = self.scrape(proc, port, Some(&self.reader_token)).await;
            Ok(if status == StatusCode::OK {
                Poll::Ready(body)
            } else {
                Poll::Pending(format!("{status}: {body}"))
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nlog:\n{}", proc.log_text()));
        assert!(body.contains(series), "{series} missing from:\n{body}");
    }

    /// Stop the services first: the Lease namespace goes away here.
    async fn teardown(&self) {
        nmo_tests::manifests::delete_operator_namespace_copy(&self.client, &self.operator_ns).await;
        let dp = DeleteParams::default();
        let _ = Api::<ClusterRoleBinding>::all(self.client.clone())
            .delete(&format!("{}-reader", self.group), &dp)
            .await;
        let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), NS);
        for who in ["reader", "stranger"] {
            let _ = sas.delete(&format!("{}-{who}", self.group), &dp).await;
        }
        let _ = std::fs::remove_dir_all(&self.cert_dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_metrics_need_a_token_allowed_to_get_metrics() {
    let s = Setup::new("metrics-ctrl").await;
    let cert_dir = format!("--metrics-cert-dir={}", s.cert_dir.display());
    let (proc, port) = s.controller(&cert_dir).await;
    s.check_callers(&proc, port, "controller_runtime_reconcile_total")
        .await;
    drop(proc);
    s.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_metrics_need_a_token_allowed_to_get_metrics() {
    let s = Setup::new("metrics-wh").await;
    let (proc, port) = s
        .run(
            "nmo-webhook",
            vec![
                format!("--metrics-cert-dir={}", s.cert_dir.display()),
                "--openshift=false".into(),
            ],
        )
        .await;
    s.check_callers(&proc, port, "nmo_webhook_certificate_reloads_total")
        .await;
    s.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_metrics_are_plain_http_for_anyone() {
    let s = Setup::new("metrics-plain").await;
    let (proc, port) = s.controller("--metrics-secure=false").await;
    let body = until("plain-HTTP metrics", LONG, || async {
        Ok(match http_get_local(port, "/metrics").await {
            Ok(body) => Poll::Ready(body),
            Err(e) => Poll::Pending(e.to_string()),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nlog:\n{}", proc.log_text()));
    assert!(
        body.contains("controller_runtime_reconcile_total"),
        "{body}"
    );
    drop(proc);
    s.teardown().await;
}
