//! The local Prometheus of `make companions` (tests/companions/up.sh), set up
//! from manifests/monitoring as rendered, against the services run as their
//! Deployments: both targets are scraped over HTTPS with the token of the
//! ServiceAccount the nmo-metrics-reader binding names; a maintenance that
//! really fails makes NodeMaintenanceFailed fire; every query of the Grafana
//! dashboard answers for a running maintenance; a stopped webhook makes
//! NodeMaintenanceWebhookDown fire. (The local Prometheus holds every alert's
//! `for:` at a few seconds; promtool's rule tests check the real ones.)
//!
//! The tests share the scrape jobs' target files and the alerts (the
//! plane's, not a test's): make test runs them one at a time.

use std::time::Duration;

use kube::api::DeleteParams;
use nmo_tests::companions::{self, prometheus_get, query, set_targets};
use nmo_tests::controller_env::ControllerEnv;
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::TestWebhook;
use serde_json::Value;
use shared::MaintenancePhase;

mod fleet_gates;

const NS: &str = "nmo-system";
const LONG: Duration = Duration::from_secs(90);
const WEBHOOK_JOB: &str = "nmo-webhook-metrics";
const CONTROLLER_JOB: &str = "nmo-controller-metrics";

/// The health and last error Prometheus reports for `job`'s targets.
async fn target_health(job: &str) -> anyhow::Result<Vec<(String, String)>> {
    let data = prometheus_get("/api/v1/targets?state=active").await?;
    Ok(data["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["labels"]["job"] == job)
        .map(|t| {
            (
                t["health"].as_str().unwrap_or("?").to_string(),
                t["lastError"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect())
}

/// Wait until every target of `job` satisfies `ok(health, lastError)`.
async fn wait_targets(job: &str, what: &str, ok: impl Fn(&str, &str) -> bool) {
    until(&format!("{job}: {what}"), LONG, || async {
        let h = target_health(job).await?;
        Ok(if !h.is_empty() && h.iter().all(|(s, e)| ok(s, e)) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{h:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

async fn wait_up(job: &str) {
    wait_targets(job, "scraped, up", |health, _| health == "up").await
}

/// Wait until every target of `job` is down with `error` in its lastError.
async fn wait_down_with(job: &str, error: &str) {
    wait_targets(job, &format!("down with '{error}'"), |health, e| {
        health == "down" && e.contains(error)
    })
    .await
}

/// The alerts Prometheus holds now (pending and firing).
async fn alerts() -> anyhow::Result<Vec<Value>> {
    let data = prometheus_get("/api/v1/alerts").await?;
    Ok(data["alerts"].as_array().cloned().unwrap_or_default())
}

/// Point the scrape jobs of both Services at these two pods.
fn scrape(ctrl: &nmo_tests::deployment::Pod, wh: &TestWebhook) {
    let port = ctrl
        .flag_port("metrics-bind-address")
        .expect("metrics port");
    set_targets(
        NS,
        CONTROLLER_JOB,
        "https",
        &[format!("127.0.0.1:{port}")],
        std::slice::from_ref(&ctrl.name),
    )
    .expect("controller targets");
    let addr = format!("127.0.0.1:{}", wh.metrics_port);
    set_targets(
        NS,
        WEBHOOK_JOB,
        "https",
        &[addr],
        std::slice::from_ref(&wh.proc.name),
    )
    .expect("webhook targets");
}

/// Wait until alert `name` is firing with every label of `labels`.
async fn wait_firing(name: &str, labels: &[(&str, &str)]) -> Value {
    until(
        &format!("alert {name} {labels:?} firing in Prometheus"),
        LONG,
        || async {
            let all = alerts().await?;
            let mine = all.iter().find(|a| {
                a["labels"]["alertname"] == name
                    && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
                    && a["state"] == "firing"
            });
            Ok(match mine {
                Some(a) => Poll::Ready(a.clone()),
                None => Poll::Pending(format!(
                    "alerts: {:?}",
                    all.iter()
                        .map(|a| format!("{} {}", a["labels"]["alertname"], a["state"]))
                        .collect::<Vec<_>>()
                )),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Wait until no alert `name` is pending or firing.
async fn wait_quiet(name: &str) {
    until(&format!("alert {name} to be quiet"), LONG, || async {
        let states: Vec<String> = alerts()
            .await?
            .iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .map(|a| a["state"].as_str().unwrap_or("?").to_string())
            .collect();
        Ok(if states.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{name}: {states:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Every query of manifests/monitoring/nmo-dashboard.json, with Grafana's
/// `$__rate_interval` as it would be for this scrape interval.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = nmo_tests::repo_root().join("manifests/monitoring/nmo-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard"))
        .expect("dashboard JSON");
    let mut out = Vec::new();
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            walk(&p["panels"], out);
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    let title = p["title"].as_str().unwrap_or("?").to_string();
                    out.push((title, e.replace("$__rate_interval", "1m")));
                }
            }
        }
    }
    walk(&d["panels"], &mut out);
    out
}

/// Whether a query answer has at least one number (NaN is a panel with no data).
fn has_data(result: &[Value]) -> bool {
    result.iter().any(|r| {
        r["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| !v.is_nan())
    })
}

#[tokio::test]
async fn scraped_as_the_servicemonitors_say_alerts_fire_and_the_dashboard_answers() {
    companions::prometheus_url().unwrap_or_else(|e| panic!("{e:#}"));
    let env = ControllerEnv::new("prom", 0).await;
    let client = env.client();
    let g = env.bed.group.clone();
    // 1. A maintenance that really fails: its node does not exist.
    let failed = env.n("gone");
    env.create_nm(&failed, &format!("{g}-ghost")).await;
    env.wait_phase(&failed, MaintenancePhase::Failed).await;

    // 2. The webhook, HTTPS metrics as the manifest has them, registered for this test.
    let mut wh = TestWebhook::start(&client, &g, &["--metrics-secure=true"]).await;
    wh.register(&client, &g).await;
    scrape(env.ctrl.as_ref().expect("controller"), &wh);
    wait_up(CONTROLLER_JOB).await;
    wait_up(WEBHOOK_JOB).await;
    eprintln!("Prometheus scrapes {CONTROLLER_JOB} and {WEBHOOK_JOB}: up");
    // Both targets up: the Down alerts (firing while nothing was scraped) go quiet.
    wait_quiet("NodeMaintenanceWebhookDown").await;
    wait_quiet("NodeMaintenanceControllerDown").await;

    let alert = wait_firing("NodeMaintenanceFailed", &[("name", &failed)]).await;
    eprintln!("NodeMaintenanceFailed firing: {}", alert["labels"]);

    // 3. A maintenance that runs: a pod to evict, the create reviewed by the webhook.
    let node = env.target().await;
    env.bed.deployment("app", 2).await.expect("workload");
    env.wait_pods("2 pods on the target", |by| {
        by.get(&node).is_some_and(|p| p.len() == 2)
    })
    .await;
    let running = env.n("run");
    env.create_nm(&running, &node).await;
    env.wait_phase(&running, MaintenancePhase::Succeeded).await;
    let queries = dashboard_queries();
    assert!(
        queries.len() >= 15,
        "only {} queries in the dashboard",
        queries.len()
    );
    until("every dashboard query to answer", LONG, || async {
        let mut empty = Vec::new();
        for (title, q) in &queries {
            if !has_data(&query(q).await?) {
                empty.push(format!("{title}: {q}"));
            }
        }
        Ok(if empty.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{} without data: {empty:#?}", empty.len()))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("all {} dashboard queries answer", queries.len());

    // 4. The webhook stops: WebhookDown fires (no kube-state-metrics here).
    wh.proc.kill();
    let down = wait_firing("NodeMaintenanceWebhookDown", &[]).await;
    eprintln!("NodeMaintenanceWebhookDown firing: {}", down["labels"]);

    set_targets(NS, WEBHOOK_JOB, "https", &[], &[]).expect("targets");
    set_targets(NS, CONTROLLER_JOB, "https", &[], &[]).expect("targets");
    nmo_tests::webhook_pod::unregister(&client, &g).await;
    for nm in [&failed, &running] {
        let _ = env.nms().delete(nm, &DeleteParams::default()).await;
    }
    env.teardown().await;
}

/// manifests/overlays/cert-manager serves /metrics with a certificate of its
/// CA, and the ServiceMonitors with manifests/monitoring/tls/cert-manager
/// verify it (that CA from Secret nmo-metrics-cert, the Service's DNS name).
/// Needs the local Prometheus set up from tests/monitoring/cert-manager,
/// which make test's stage does before it runs this test.
#[tokio::test]
#[ignore = "needs Prometheus set up from tests/monitoring/cert-manager: make test's stage runs it"]
async fn verifies_the_metrics_certificate_cert_manager_issued() {
    const OVERLAY: &str = "overlays/cert-manager";
    let cfg_path = nmo_tests::cluster_dir().join("prometheus/prometheus.yml");
    let cfg = std::fs::read_to_string(&cfg_path)
        .unwrap_or_else(|e| panic!("{}: {e}", cfg_path.display()));
    assert!(
        cfg.contains("server_name: nmo-webhook-metrics.nmo-system.svc"),
        "the local Prometheus does not verify the metrics certificate: run \
         NMO_PROMETHEUS_MONITORING=tests/monitoring/cert-manager tests/companions/up.sh prometheus first"
    );
    let ca_file =
        nmo_tests::cluster_dir().join("prometheus/secrets/nmo-system_nmo-metrics-cert_ca.crt");
    let client = nmo_tests::manifests::admin_with_webhook_prereqs().await;
    let issued = companions::issue_overlay_certificates(&client, OVERLAY, LONG)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("cert-manager issued {issued}");

    // Both services from the overlay's Deployments, the Secrets mirrored in.
    let dir = nmo_tests::cluster_dir()
        .join("test-logs")
        .join(nmo_tests::unique("metrics-cert"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    companions::mirror_secret(client.clone(), NS, "nmo-metrics-cert", &dir, stop.clone());
    companions::wait_mounted(&dir, LONG).await;
    let env = ControllerEnv::with_overlay(
        "promtls",
        0,
        OVERLAY,
        vec![("metrics-cert".into(), dir.clone())],
    )
    .await;
    let g = env.bed.group.clone();
    let wh = TestWebhook::start_in(
        &client,
        &g,
        OVERLAY,
        &[("metrics-cert", dir.as_path())],
        &["--metrics-secure=true"],
    )
    .await;
    scrape(env.ctrl.as_ref().expect("controller"), &wh);

    // A CA that did not sign them: Prometheus refuses the certificates...
    let stranger = certs::Ca::new("not-the-metrics-ca", Duration::from_secs(3600)).expect("CA");
    std::fs::write(&ca_file, stranger.cert_pem()).expect("CA file");
    wait_down_with(CONTROLLER_JOB, "x509").await;
    wait_down_with(WEBHOOK_JOB, "x509").await;
    eprintln!("with another CA: both targets down, x509 errors");
    // ... and with the Secret's ca.crt (as the Prometheus Operator mounts it) verifies them.
    let secret = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS)
        .get("nmo-metrics-cert")
        .await
        .expect("Secret nmo-metrics-cert");
    let ca = secret
        .data
        .and_then(|d| d.get("ca.crt").map(|b| b.0.clone()))
        .expect("ca.crt");
    std::fs::write(&ca_file, ca).expect("CA file");
    wait_up(CONTROLLER_JOB).await;
    wait_up(WEBHOOK_JOB).await;
    eprintln!("with Secret nmo-metrics-cert's ca.crt and the Services' names: both targets up");

    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    set_targets(NS, WEBHOOK_JOB, "https", &[], &[]).expect("targets");
    set_targets(NS, CONTROLLER_JOB, "https", &[], &[]).expect("targets");
    drop(wh);
    env.teardown().await;
}

/// Whether alert `name` is pending or firing now.
async fn active(name: &str) -> bool {
    alerts()
        .await
        .expect("alerts")
        .iter()
        .any(|a| a["labels"]["alertname"] == name)
}

/// The base Deployments applied to the plane as rendered (kwok plays their
/// pods), so kube-state-metrics reports them available as in a cluster.
async fn apply_deployments(client: &kube::Client, replicas: &[(&str, i32)]) {
    use k8s_openapi::api::apps::v1::Deployment;
    let api: kube::Api<Deployment> = kube::Api::namespaced(client.clone(), NS);
    for (name, n) in replicas {
        let mut d =
            nmo_tests::deployment::deployment("base", name).unwrap_or_else(|e| panic!("{e:#}"));
        if let Some(spec) = d.spec.as_mut() {
            spec.replicas = Some(*n);
        }
        d.metadata.managed_fields = None;
        api.patch(
            name,
            &kube::api::PatchParams::apply("nmo-tests").force(),
            &kube::api::Patch::Apply(&d),
        )
        .await
        .unwrap_or_else(|e| panic!("applying Deployment {NS}/{name}: {e}"));
    }
}

/// Wait until Prometheus has kube-state-metrics' availability of `name` at `want`.
async fn wait_available(name: &str, want: i32) {
    let q = format!(
        "kube_deployment_status_replicas_available{{namespace=\"{NS}\",deployment=\"{name}\"}}"
    );
    until(
        &format!("kube-state-metrics: {name} available {want}"),
        LONG,
        || async {
            let r = query(&q).await?;
            let got: Vec<String> = r
                .iter()
                .filter_map(|v| v["value"][1].as_str().map(str::to_string))
                .collect();
            Ok(if got == [want.to_string()] {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{got:?}"))
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#} (is kube-state-metrics running? make companions)"));
}

/// A scrape refused (the token's ServiceAccount not bound to
/// nmo-metrics-reader) while kube-state-metrics sees the pods available:
/// NodeMaintenanceMetricsScrapeFailing, and no critical page; once the
/// webhook Deployment has no available pod, NodeMaintenanceWebhookDown.
#[tokio::test]
async fn a_refused_scrape_pages_no_one_while_the_pods_are_available() {
    companions::prometheus_url().unwrap_or_else(|e| panic!("{e:#}"));
    let env = ControllerEnv::new("promref", 0).await;
    let client = env.client();
    let g = env.bed.group.clone();
    apply_deployments(&client, &[("nmo-webhook", 2), ("nmo-controller", 1)]).await;
    wait_available("nmo-webhook", 2).await;
    wait_available("nmo-controller", 1).await;
    let wh = TestWebhook::start(&client, &g, &["--metrics-secure=true"]).await;
    scrape(env.ctrl.as_ref().expect("controller"), &wh);
    wait_up(CONTROLLER_JOB).await;
    wait_up(WEBHOOK_JOB).await;

    // Prometheus' token becomes one the services refuse (403): it re-reads
    // the file at every scrape.
    let token_file = nmo_tests::cluster_dir().join("prometheus/token");
    let bound = std::fs::read(&token_file).expect("Prometheus' token");
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "unbound-scraper"}}))
            .expect("sa");
    kube::Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
        client.clone(),
        &env.bed.namespace,
    )
    .create(&Default::default(), &sa)
    .await
    .expect("ServiceAccount");
    let refused =
        nmo_tests::process::service_account_token(&client, &env.bed.namespace, "unbound-scraper")
            .await
            .expect("token");
    std::fs::write(&token_file, refused).expect("token file");
    wait_down_with(WEBHOOK_JOB, "403").await;
    wait_down_with(CONTROLLER_JOB, "403").await;
    for job in [WEBHOOK_JOB, CONTROLLER_JOB] {
        wait_firing("NodeMaintenanceMetricsScrapeFailing", &[("job", job)]).await;
    }
    let pages = (
        active("NodeMaintenanceWebhookDown").await,
        active("NodeMaintenanceControllerDown").await,
    );
    eprintln!(
        "scrapes refused (403), pods available: MetricsScrapeFailing firing for both, WebhookDown/ControllerDown active: {pages:?}"
    );

    // No available webhook pod any more: now it is a critical page.
    apply_deployments(&client, &[("nmo-webhook", 0)]).await;
    wait_available("nmo-webhook", 0).await;
    let down = wait_firing("NodeMaintenanceWebhookDown", &[]).await;
    eprintln!(
        "no available webhook pod: {} firing",
        down["labels"]["alertname"]
    );

    std::fs::write(&token_file, bound).expect("token file restored");
    set_targets(NS, WEBHOOK_JOB, "https", &[], &[]).expect("targets");
    set_targets(NS, CONTROLLER_JOB, "https", &[], &[]).expect("targets");
    use k8s_openapi::api::apps::v1::Deployment;
    for name in ["nmo-webhook", "nmo-controller"] {
        let _ = kube::Api::<Deployment>::namespaced(client.clone(), NS)
            .delete(name, &DeleteParams::background())
            .await;
    }
    drop(wh);
    env.teardown().await;
    assert_eq!(
        pages,
        (false, false),
        "a refused scrape paged while kube-state-metrics saw the pods available"
    );
}
