//! A KubeVirt VM on a node under maintenance, through the real API server.
//!
//! KubeVirt's virt-api registers a validating webhook on `pods/eviction`: the
//! eviction of a live-migratable VM's virt-launcher pod is answered 429 with
//! `Eviction triggered evacuation of VMI "<ns>/<vm>"` (then `Evacuation in
//! progress: ...` while the migration runs), the VM is live-migrated away and
//! the pod goes once the migration completes. Here a webhook served by the
//! test process answers as KubeVirt does, for this test's namespace only; the
//! test deletes the pod to complete the "migration". The drain must count the
//! pod as migrating (pending, in the eviction metric), not as blocked, and
//! report it only once it has migrated longer than --migration-warning-after.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nmo_tests::controller_env::{ControllerEnv as Env, LONG};
use nmo_tests::fixtures::{GROUP_KEY, KUBEVIRT_DOMAIN_ANNOTATION, TestBed, VIRT_LAUNCHER_LABEL};
use nmo_tests::wait::{Poll, until};
use serde_json::{Value, json};
use shared::{MaintenancePhase, NodeMaintenanceStatus};

/// KubeVirt's webhook, as named in its ValidatingWebhookConfiguration.
const KUBEVIRT_WEBHOOK: &str = "virt-launcher-eviction-interceptor.kubevirt.io";

/// A pod with this label is refused "not now" (429, [`LATER_MESSAGE`]) by the
/// test's webhook, as any eviction webhook may answer (a change freeze).
const LATER_LABEL: (&str, &str) = ("nmo-tests.medik8s.io/eviction", "later");
const LATER_MESSAGE: &str = "change freeze: evictions resume on Monday";

/// A webhook in the test process answering `pods/eviction` reviews of one
/// namespace as KubeVirt's virt-api does for VMs with eviction strategy
/// LiveMigrate: 429 for every virt-launcher pod, the first time with
/// "Eviction triggered evacuation", then "Evacuation in progress".
struct KubeVirtWebhook {
    client: Client,
    configuration: String,
    server: tokio::task::JoinHandle<()>,
    answers: Answers,
}

#[derive(Clone)]
struct Answers {
    client: Client,
    /// Evictions refused (dry runs not counted).
    denials: Arc<AtomicUsize>,
    /// `<ns>/<vm>` of the VMs marked for evacuation.
    evacuating: Arc<Mutex<BTreeSet<String>>>,
}

impl Answers {
    /// KubeVirt's answer to one AdmissionReview (pod-eviction-admitter): pods
    /// other than virt-launchers pass; a VM's pod is refused with 429 while
    /// its VM is (or starts being) evacuated.
    async fn review(&self, body: String) -> ([(&'static str, &'static str); 1], String) {
        let review: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let req = &review["request"];
        let uid = req["uid"].as_str().unwrap_or_default();
        let namespace = req["namespace"].as_str().unwrap_or_default();
        let name = req["name"].as_str().unwrap_or_default();
        let dry_run = req["dryRun"].as_bool().unwrap_or(false);
        let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await;
        let vm = match &pod {
            Ok(Some(p))
                if p.labels().get(VIRT_LAUNCHER_LABEL.0).map(String::as_str)
                    == Some(VIRT_LAUNCHER_LABEL.1) =>
            {
                p.annotations().get(KUBEVIRT_DOMAIN_ANNOTATION).cloned()
            }
            _ => None,
        };
        let later = matches!(&pod, Ok(Some(p))
            if p.labels().get(LATER_LABEL.0).map(String::as_str) == Some(LATER_LABEL.1));
        let response = match vm {
            None if later => {
                json!({"uid": uid, "allowed": false, "status": {"code": 429, "message": LATER_MESSAGE}})
            }
            None => json!({"uid": uid, "allowed": true}),
            Some(vm) => {
                let vmi = format!("{namespace}/{vm}");
                let triggered = format!("Eviction triggered evacuation of VMI \"{vmi}\"");
                let already = self
                    .evacuating
                    .lock()
                    .map(|s| s.contains(&vmi))
                    .unwrap_or(true);
                if !dry_run {
                    if let Ok(mut s) = self.evacuating.lock() {
                        s.insert(vmi);
                    }
                    self.denials.fetch_add(1, Ordering::SeqCst);
                }
                let message = if already {
                    format!("Evacuation in progress: {triggered}")
                } else {
                    triggered
                };
                json!({"uid": uid, "allowed": false, "status": {"code": 429, "message": message}})
            }
        };
        let answer = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        });
        ([("content-type", "application/json")], answer.to_string())
    }
}

impl KubeVirtWebhook {
    /// Serve on a free 127.0.0.1 port over TLS (a certificate with an IP SAN,
    /// its CA as the caBundle) and register it for `pods/eviction` in the
    /// bed's namespace; returns once the API server calls it for `probe_pod`.
    async fn start(bed: &TestBed, probe_pod: &str) -> KubeVirtWebhook {
        let dir = nmo_tests::repo_root()
            .join(".cluster/test-logs")
            .join(format!("{}-kubevirt-certs", bed.group));
        let ca = certs::Ca::new("nmo-tests-kubevirt-ca", Duration::from_secs(3600)).expect("CA");
        certs::write_serving_set(&dir, &ca, &nmo_tests::webhook_pod::issue(&ca))
            .expect("serving certificate written");
        let paths = shared::serve::tls::CertPaths {
            cert: dir.join(certs::TLS_CRT),
            key: dir.join(certs::TLS_KEY),
            dir,
        };
        let resolver = shared::serve::tls::CertResolver::load(
            paths,
            shared::serve::tls::CertMetrics::detached(),
        )
        .expect("serving certificate loaded");
        let tls = shared::serve::tls::server_config(Arc::new(resolver), false).expect("TLS config");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let port = listener.local_addr().expect("local address").port();

        let answers = Answers {
            client: bed.client.clone(),
            denials: Arc::default(),
            evacuating: Arc::default(),
        };
        let handler = answers.clone();
        // shared's routers are axum's: every path but the probes gets the review.
        let router = shared::serve::probes::probe_router(Default::default()).fallback(
            move |body: String| {
                let handler = handler.clone();
                async move { handler.review(body).await }
            },
        );
        let opts = shared::serve::https::ServeOptions {
            max_connections: 64,
            tls_handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            enable_http2: false,
            shutdown_timeout: Duration::from_secs(1),
        };
        let server = tokio::spawn(shared::serve::https::serve(
            "KubeVirt-like pod eviction webhook (test)",
            listener,
            tls,
            router,
            opts,
            std::future::pending(),
        ));

        let configuration = format!("{}-kubevirt", bed.group);
        let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": configuration, "labels": {GROUP_KEY: bed.group}},
            "webhooks": [{
                "name": KUBEVIRT_WEBHOOK,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {
                    "url": format!("https://127.0.0.1:{port}/pod-eviction"),
                    "caBundle": certs::ca_bundle_base64(ca.cert_pem()),
                },
                "rules": [{
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods/eviction"],
                    "scope": "Namespaced",
                }],
                // Webhook configurations are cluster-wide: this test's namespace only.
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": bed.namespace}},
            }]
        }))
        .expect("ValidatingWebhookConfiguration JSON");
        Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
            .create(&PostParams::default(), &vwc)
            .await
            .expect("ValidatingWebhookConfiguration created");

        let webhook = KubeVirtWebhook {
            client: bed.client.clone(),
            configuration,
            server,
            answers,
        };
        webhook.wait_effective(&bed.namespace, probe_pod).await;
        webhook
    }

    /// Until the API server sends evictions to us: a dry-run eviction of
    /// `pod` is refused with our words (dry runs are not counted).
    async fn wait_effective(&self, namespace: &str, pod: &str) {
        let client = nmo_tests::fixtures::no_retry_client()
            .await
            .expect("local control plane");
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let dry = EvictParams {
            delete_options: Some(DeleteParams::default().dry_run()),
            post_options: PostParams {
                dry_run: true,
                ..PostParams::default()
            },
        };
        until(
            &format!("the API server to call webhook {}", self.configuration),
            LONG,
            || async {
                Ok(match pods.evict(pod, &dry).await {
                    Err(kube::Error::Api(s))
                        if s.code == 429
                            && (s.message.contains("evacuation of VMI")
                                || s.message.contains(LATER_MESSAGE)) =>
                    {
                        Poll::Ready(())
                    }
                    other => Poll::Pending(format!("dry-run eviction of {pod}: {other:?}")),
                })
            },
        )
        .await
        .expect("KubeVirt-like webhook effective");
    }

    fn denials(&self) -> usize {
        self.answers.denials.load(Ordering::SeqCst)
    }

    async fn stop(self) {
        let _ = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.configuration, &DeleteParams::default())
            .await;
        self.server.abort();
    }
}

/// `nmo_evictions_total{result="<result>"}` in a scrape, if present.
fn evictions(text: &str, result: &str) -> Option<f64> {
    let prefix = format!("nmo_evictions_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Complete the "migration": the VM runs elsewhere, its pod goes.
async fn migration_completes(env: &Env, pod: &str) {
    Api::<Pod>::namespaced(env.client(), &env.bed.namespace)
        .delete(pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap_or_else(|e| panic!("delete virt-launcher pod {pod}: {e}"));
}

fn status_json(st: &NodeMaintenanceStatus) -> String {
    serde_json::to_string(st).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migrating_vm_is_progress_not_a_blocker() {
    /// KubeVirt refuses this many evictions before the migration completes
    /// (several drain rounds).
    const DENIALS: usize = 3;
    let mut env = Env::new("nm-kubevirt", 1).await;
    let metrics = env.plain_metrics_controller(&[]).await;
    let target = env.target().await;
    let launcher = "virt-launcher-vm1-x7k2p";
    env.bed
        .virt_launcher_pod(launcher, &target, "vm1")
        .await
        .expect("virt-launcher pod");
    env.bed.bare_pod("web", &target).await.expect("web pod");
    let kubevirt = KubeVirtWebhook::start(&env.bed, launcher).await;

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let st = until(
        &format!("NodeMaintenance {name} Running with {launcher} migrating ({DENIALS} refusals)"),
        LONG,
        || async {
            let st = env.nms().get(&name).await?.status.unwrap_or_default();
            if st.last_error.contains(launcher) {
                return Ok(Poll::Ready(Err(status_json(&st))));
            }
            let denials = kubevirt.denials();
            Ok(
                if denials >= DENIALS
                    && st.phase == Some(MaintenancePhase::Running)
                    && st.pending_pods == vec![launcher.to_string()]
                {
                    Poll::Ready(Ok(st))
                } else {
                    Poll::Pending(format!("{denials} refusals, status {}", status_json(&st)))
                },
            )
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", nmo_tests::component_log_tails(10)))
    .unwrap_or_else(|st| panic!("{launcher} reported as a blocker while migrating: {st}"));
    assert_eq!(
        st.last_error, "",
        "nothing blocks NodeMaintenance {name} while {launcher} migrates"
    );
    assert_eq!(st.drain_progress, 50, "web evicted, {launcher} pending");
    let drained = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Drained")
        .expect("Drained condition");
    assert_eq!(
        drained.message, "1 of 2 pods still to leave, 1 of them KubeVirt VMs live-migrating away",
        "the condition says why it waits"
    );
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Blocked" && c.status == "False"),
        "a migration is not a blocker: {:?}",
        st.conditions
    );

    // The eviction metric says migrating, never blocked.
    let text = until(
        "nmo_evictions_total{result=\"migrating\"}",
        LONG,
        || async {
            let text = nmo_tests::process::http_get_local(metrics, "/metrics").await?;
            Ok(match evictions(&text, "migrating") {
                Some(n) if n >= 1.0 => Poll::Ready(text),
                other => Poll::Pending(format!("migrating = {other:?}")),
            })
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!("{e:#} (nmo_evictions_total needs drain::outcome_label wired in reconcile.rs)")
    });
    assert_eq!(
        evictions(&text, "blocked").unwrap_or(0.0),
        0.0,
        "no eviction of {launcher} counted as blocked"
    );

    migration_completes(&env, launcher).await;
    let nm = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let st = nm.status.unwrap_or_default();
    assert_eq!((st.last_error.as_str(), st.drain_progress), ("", 100));
    kubevirt.stop().await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_running_too_long_is_reported() {
    let mut env = Env::new("nm-kubevirt-slow", 1).await;
    env.plain_metrics_controller(&["--migration-warning-after=2s"])
        .await;
    let target = env.target().await;
    let launcher = "virt-launcher-vm2-q4d8s";
    env.bed
        .virt_launcher_pod(launcher, &target, "vm2")
        .await
        .expect("virt-launcher pod");
    let kubevirt = KubeVirtWebhook::start(&env.bed, launcher).await;

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let want = format!(
        "{}/{launcher}: VM live migration running for",
        env.bed.namespace
    );
    let nm = env
        .wait_nm(&name, &format!("{launcher} reported after 2s"), |nm| {
            nm.status.as_ref().is_some_and(|s| {
                s.last_error.contains(&want)
                    && s.last_error
                        .contains("longer than --migration-warning-after (2s)")
            })
        })
        .await;
    let st = nm.status.unwrap_or_default();
    assert_eq!(
        st.phase,
        Some(MaintenancePhase::Running),
        "{}",
        status_json(&st)
    );
    assert!(
        st.last_error.contains("Evacuation in progress"),
        "KubeVirt's last answer quoted: {}",
        st.last_error
    );

    migration_completes(&env, launcher).await;
    let nm = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    assert_eq!(nm.status.unwrap_or_default().last_error, "");
    kubevirt.stop().await;
    env.teardown().await;
}

/// Issue 22: a 429 of an eviction webhook was reported as "eviction blocked
/// by a PodDisruptionBudget". Seen on the code before the fix: lastError
/// `... eviction blocked by a PodDisruptionBudget: admission webhook
/// "virt-launcher-eviction-interceptor.kubevirt.io" denied the request:
/// change freeze ...` with no PodDisruptionBudget anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhooks_not_now_is_not_worded_as_a_budget() {
    let env = Env::new("nm-later", 1).await;
    let target = env.target().await;
    let frozen = "frozen";
    env.bed
        .pod_on(
            frozen,
            &target,
            json!({"metadata": {"labels": {LATER_LABEL.0: LATER_LABEL.1}}}),
        )
        .await
        .expect("frozen pod");
    let webhook = KubeVirtWebhook::start(&env.bed, frozen).await;

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let nm = env
        .wait_nm(&name, "lastError naming the webhook's refusal", |nm| {
            nm.status
                .as_ref()
                .is_some_and(|s| s.last_error.contains(LATER_MESSAGE))
        })
        .await;
    let last_error = nm.status.map(|s| s.last_error).unwrap_or_default();
    assert!(
        !last_error.contains("blocked by a PodDisruptionBudget"),
        "no PodDisruptionBudget here: {last_error}"
    );
    assert!(
        last_error.contains("not by a PodDisruptionBudget"),
        "says what refused: {last_error}"
    );
    // The freeze ends: the drain goes on by itself.
    webhook.stop().await;
    env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    env.teardown().await;
}
