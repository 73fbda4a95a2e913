//! The admission webhook through the real API server: each test runs its own
//! `nmo-webhook` process (as the nmo-webhook ServiceAccount, so the RBAC of
//! manifests/webhook/ is exercised) with fresh certificates, and registers its
//! own ValidatingWebhookConfiguration whose matchCondition limits it to
//! NodeMaintenances named after the test's group, so tests never see each
//! other's objects. Allowed creates on shared state are server-side dry runs.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nmo_tests::fixtures::{GROUP_KEY, TestBed};
use nmo_tests::process::{Running, service_account_kubeconfig};
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{issue, launch_pod, register_url, write_certs};
use nmo_webhook_client::{
    ClientConfig, ReviewClient, create_review, parse_response, pem_to_der, send_raw_then_reuse,
    tls_config,
};
use serde_json::json;
use shared::api::consts::WEBHOOK_PATH;
use shared::{NodeMaintenance, NodeMaintenanceSpec};

const SHORT: Duration = Duration::from_secs(20);
const LONG: Duration = Duration::from_secs(60);
const ETCD_NS: &str = "openshift-etcd";
const OPENSHIFT_CRD: &str = "clusterversions.config.openshift.io";

// ---------------------------------------------------------------- plumbing

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("fixture JSON matches the Kubernetes type")
}

/// GET over plain HTTP (probes, metrics): (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    })
    .await?
}

/// Sum of the samples of `name` whose labels include all of `want`.
fn metric(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once("} ") {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(v) => ("", v),
                None => continue,
            },
        };
        let have: BTreeMap<&str, &str> = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if want.iter().all(|(k, v)| have.get(k) == Some(v)) {
            sum += value.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    sum
}

/// The API server's answer to a create or update: Ok, or (code, message).
fn outcome<T>(r: Result<T, kube::Error>) -> Result<(), (u16, String)> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
        Err(e) => Err((0, e.to_string())),
    }
}

fn nm(name: &str, node: &str) -> NodeMaintenance {
    NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.to_string(),
            reason: "webhook test".to_string(),
            ..Default::default()
        },
    )
}

async fn dry_create(
    api: &Api<NodeMaintenance>,
    name: &str,
    node: &str,
) -> Result<(), (u16, String)> {
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    outcome(api.create(&pp, &nm(name, node)).await)
}

/// Poll a dry-run create until its outcome satisfies `ok`, with a deadline.
async fn dry_create_until(
    api: &Api<NodeMaintenance>,
    name: &str,
    node: &str,
    what: &str,
    ok: impl Fn(&Result<(), (u16, String)>) -> bool,
) {
    until(what, SHORT, || async {
        let r = dry_create(api, name, node).await;
        Ok(if ok(&r) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{r:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

fn denied_with(msg: &str) -> impl Fn(&Result<(), (u16, String)>) -> bool + '_ {
    move |r| matches!(r, Err((403, m)) if m.ends_with(msg))
}

fn allowed(r: &Result<(), (u16, String)>) -> bool {
    r.is_ok()
}

/// CRD, namespace and the webhook's RBAC (shared installer, retried when
/// parallel tests race on the same objects).
async fn install_prereqs(client: &Client) {
    nmo_tests::manifests::install_webhook_prereqs(client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

// ---------------------------------------------------------------- the webhook process

struct Webhook {
    proc: Running,
    tls_addr: SocketAddr,
    probe_addr: SocketAddr,
    metrics_addr: SocketAddr,
    cert_dir: PathBuf,
    ca: certs::Ca,
    first_cert_pem: String,
}
impl Webhook {
    /// Start `nmo-webhook` on free ports with fresh certificates (kubelet layout),
    /// authenticated as the nmo-webhook ServiceAccount; returns once /readyz is ok.
    async fn start(client: &Client, group: &str, openshift: &str) -> Webhook {
        let dir = nmo_tests::repo_root().join(".cluster/test-logs");
        let cert_dir = dir.join(format!("{group}-certs"));
        let ca = certs::Ca::new("nmo-tests-webhook-ca", Duration::from_secs(3600)).expect("CA");
        let cert = issue(&ca);
        write_certs(&cert_dir, &ca, &cert);
        let kubeconfig = dir.join(format!("{group}-webhook.kubeconfig"));
        service_account_kubeconfig(client, "nmo-system", "nmo-webhook", &kubeconfig)
            .await
            .expect("webhook kubeconfig");
        let (proc, tls_addr, probe_addr, metrics_addr) =
            launch_pod(client, &cert_dir, &kubeconfig, openshift).await;
        Webhook {
            proc,
            tls_addr,
            probe_addr,
            metrics_addr,
            cert_dir,
            ca,
            first_cert_pem: cert.cert_pem,
        }
    }

    fn tls(&self) -> Arc<ClientConfig> {
        tls_config(self.ca.cert_pem().as_bytes()).expect("client TLS config")
    }

    async fn client(&self) -> ReviewClient {
        ReviewClient::connect(self.tls_addr, "localhost", self.tls())
            .await
            .expect("TLS connection to the webhook")
    }

    async fn metrics(&self) -> String {
        http_get(self.metrics_addr, "/metrics")
            .await
            .expect("metrics")
            .1
    }

    async fn decisions(&self, allowed: &str, reason: &str) -> f64 {
        metric(
            &self.metrics().await,
            "nmo_webhook_decisions_total",
            &[("allowed", allowed), ("reason", reason)],
        )
    }

    /// Register this webhook for NodeMaintenances whose name starts with `group`.
    async fn register(&self, client: &Client, group: &str) {
        register_url(
            client,
            group,
            self.tls_addr.port(),
            &certs::ca_bundle_base64(self.ca.cert_pem()),
        )
        .await;
        // The API server picks the configuration up asynchronously: probe with a
        // dry-run create for a missing node until this webhook counts the denial.
        let api: Api<NodeMaintenance> = Api::all(client.clone());
        until(
            "the API server to call this test's webhook",
            SHORT,
            || async {
                let before = self.decisions("false", "node_not_found").await;
                let r =
                    dry_create(&api, &format!("{group}-probe"), &format!("{group}-ghost")).await;
                let after = self.decisions("false", "node_not_found").await;
                Ok(if after > before {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("create: {r:?}"))
                })
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nwebhook log:\n{}", self.proc.log_text()));
    }
}

/// Removes what a test created, also when it panicked: its webhook
/// configuration, NodeMaintenances, nodes and namespace, and (for the
/// OpenShift test) the simulated OpenShift objects. Runs on its own thread and
/// runtime because Drop cannot await.
struct Cleanup {
    group: String,
    openshift: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let group = self.group.clone();
        let openshift = self.openshift;
        nmo_tests::webhook_pod::run_cleanup(move |client| async move {
            let dp = DeleteParams::default();
            let lp = ListParams::default().labels(&format!("{GROUP_KEY}={group}"));
            if openshift {
                let _ = Api::<Pod>::namespaced(client.clone(), ETCD_NS)
                    .delete_collection(&dp, &lp)
                    .await;
                let _ = Api::<PodDisruptionBudget>::namespaced(client.clone(), ETCD_NS)
                    .delete_collection(&dp, &lp)
                    .await;
                // Leave no trace of "OpenShift" for other tests and webhooks in auto mode.
                let _ = Api::<Namespace>::all(client.clone())
                    .delete(ETCD_NS, &dp)
                    .await;
                let _ = Api::<CustomResourceDefinition>::all(client.clone())
                    .delete(OPENSHIFT_CRD, &dp)
                    .await;
            }
            nmo_tests::webhook_pod::remove_group(&client, &group, std::slice::from_ref(&group))
                .await;
        });
    }
}

async fn setup(prefix: &str, openshift: bool) -> (Client, TestBed, Cleanup) {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    install_prereqs(&client).await;
    let bed = TestBed::new(client.clone(), prefix)
        .await
        .expect("test namespace");
    let cleanup = Cleanup {
        group: bed.group.clone(),
        openshift,
    };
    (client, bed, cleanup)
}

/// A node of this test with the control-plane role labels.
async fn control_plane_node(bed: &TestBed, suffix: &str) -> String {
    let node = bed.node(suffix, false).await.expect("node created");
    let name = node.metadata.name.expect("name");
    Api::<Node>::all(bed.client.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "node-role.kubernetes.io/control-plane": "",
                "node-role.kubernetes.io/master": "",
            }}})),
        )
        .await
        .expect("control-plane labels");
    name
}

async fn worker_node(bed: &TestBed, suffix: &str) -> String {
    bed.node(suffix, false)
        .await
        .expect("node created")
        .metadata
        .name
        .expect("name")
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn validates_creates_and_updates_through_the_api_server() {
    let (client, bed, _cleanup) = setup("wh-rules", false).await;
    let g = bed.group.clone();
    let worker = worker_node(&bed, "w1").await;
    let cp = control_plane_node(&bed, "cp1").await;
    let wh = Webhook::start(&client, &g, "false").await;
    wh.register(&client, &g).await;
    let api: Api<NodeMaintenance> = Api::all(client.clone());

    // Unknown node: upstream's message, word for word, as a 403.
    let ghost = format!("{g}-ghost");
    let r = dry_create(&api, &format!("{g}-a"), &ghost).await;
    let msg = format!("invalid nodeName, no node with name {ghost} found");
    assert!(denied_with(&msg)(&r), "unknown node: {r:?}");

    // Not OpenShift: a control-plane node may enter maintenance.
    assert_eq!(dry_create(&api, &format!("{g}-a"), &cp).await, Ok(()));

    // Duplicate: a second NodeMaintenance for the same node (once the first is in the cache).
    api.create(&PostParams::default(), &nm(&format!("{g}-a"), &worker))
        .await
        .expect("first NodeMaintenance for the worker is admitted");
    let dup = format!("invalid nodeName, a NodeMaintenance for node {worker} already exists");
    dry_create_until(
        &api,
        &format!("{g}-b"),
        &worker,
        "the duplicate to be denied",
        denied_with(&dup),
    )
    .await;

    // nodeName is immutable ...
    let r = outcome(
        api.patch(
            &format!("{g}-a"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": cp}})),
        )
        .await,
    );
    assert!(
        denied_with("updating spec.NodeName isn't allowed")(&r),
        "nodeName change: {r:?}"
    );
    // ... the reason is not.
    let updated = api
        .patch(
            &format!("{g}-a"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"reason": "new reason"}})),
        )
        .await
        .expect("reason change admitted");
    assert_eq!(updated.spec.reason, "new reason");
    assert_eq!(updated.spec.node_name, worker);

    // A drainTimeout the CRD's pattern admits but Go (and so the controller)
    // cannot hold: denied, naming the field and the limit (issue 22: it was
    // admitted, and crash-looped the controller).
    let mut absurd = nm(&format!("{g}-c"), &cp);
    absurd.spec.drain_timeout = Some("9999999999999999999h".into());
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let r = outcome(api.create(&pp, &absurd).await);
    assert!(
        matches!(&r, Err((403, m)) if m.contains("spec.drainTimeout: invalid duration")
            && m.contains("at most 2562047h47m16.854775807s")),
        "absurd drainTimeout: {r:?}"
    );
    // Force is the cluster admin's to allow (manifests/components/force-drain):
    // without it, denied naming how; Fail stays available.
    let mut force = nm(&format!("{g}-d"), &cp);
    force.spec.drain_timeout = Some("1s".into());
    force.spec.drain_timeout_action = Some(shared::DrainTimeoutAction::Force);
    let r = outcome(api.create(&pp, &force).await);
    assert!(
        matches!(&r, Err((403, m)) if m.contains("drainTimeoutAction: Force is not enabled")
            && m.contains("manifests/components/force-drain")),
        "Force without the component: {r:?}"
    );
    force.spec.drain_timeout_action = Some(shared::DrainTimeoutAction::Fail);
    assert_eq!(
        outcome(api.create(&pp, &force).await),
        Ok(()),
        "Fail is allowed"
    );

    // This webhook (not some other one) made those decisions.
    let text = wh.metrics().await;
    for (allowed, reason) in [
        ("false", "node_not_found"),
        ("true", "valid"),
        ("false", "duplicate"),
        ("false", "node_name_immutable"),
        ("true", "node_name_unchanged"),
        ("false", "invalid_spec"),
        ("false", "force_not_allowed"),
    ] {
        let n = metric(
            &text,
            "nmo_webhook_decisions_total",
            &[("allowed", allowed), ("reason", reason)],
        );
        assert!(n >= 1.0, "no {reason} decision counted:\n{text}");
    }
    assert!(
        metric(
            &text,
            "controller_runtime_webhook_requests_total",
            &[("code", "200"), ("webhook", WEBHOOK_PATH)]
        ) >= 5.0,
        "{text}"
    );
    // The fine-grained duration histogram sees every review the upstream one sees.
    let upstream = metric(
        &text,
        "controller_runtime_webhook_latency_seconds_count",
        &[("webhook", WEBHOOK_PATH)],
    );
    let fine = metric(&text, "nmo_webhook_review_duration_seconds_count", &[]);
    assert!(
        upstream >= 5.0 && fine == upstream,
        "review duration count {fine}, upstream latency count {upstream}:\n{text}"
    );
    // One structured log line per decision (written a few milliseconds after
    // the decision: log lines go out in batches).
    let line = until("the decision log line for the duplicate", SHORT, || async {
        let log = wh.proc.log_text();
        Ok(
            match log
                .lines()
                .filter_map(|l| Some((l, serde_json::from_str::<serde_json::Value>(l).ok()?)))
                .find(|(_, v)| v["msg"] == "admission decision" && v["reason"] == "duplicate")
            {
                Some((raw, line)) => Poll::Ready((raw.to_string(), line)),
                None => Poll::Pending(format!("log so far:\n{log}")),
            },
        )
    })
    .await
    .expect("decision log line");
    let (raw, line) = line;
    // zap's keys in zap's order, as upstream's log pipelines expect.
    assert!(
        raw.starts_with(r#"{"level":"info","ts":""#)
            && raw.contains(r#","logger":"nmo_webhook"#)
            && raw.contains(r#","msg":"admission decision","#),
        "decision log line not in zap's keys and order: {raw}"
    );
    for field in [
        "uid",
        "user",
        "operation",
        "object",
        "node",
        "allowed",
        "reason",
        "latency_ms",
    ] {
        assert!(
            !line[field].is_null(),
            "decision log line lacks {field}: {line}"
        );
    }
    assert_eq!(line["node"], json!(worker));
    assert_eq!(line["allowed"], json!(false));
    api.delete(&format!("{g}-a"), &DeleteParams::default())
        .await
        .expect("delete");
}

/// A Service stand-in in front of webhook replicas: new connections go round
/// robin to the replicas whose readiness probe passes (looked at every 100 ms,
/// as endpoints follow readiness), falling over to the next one that accepts.
/// Bytes are copied both ways, as kube-proxy forwards them.
struct ServiceProxy {
    port: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ServiceProxy {
    /// `backends`: (TLS address, probe address) of each replica.
    async fn start(backends: Vec<(SocketAddr, SocketAddr)>) -> ServiceProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy listener");
        let port = listener.local_addr().expect("proxy address").port();
        let ready: Arc<Vec<AtomicBool>> =
            Arc::new(backends.iter().map(|_| AtomicBool::new(true)).collect());
        let probe = {
            let (ready, backends) = (ready.clone(), backends.clone());
            tokio::spawn(async move {
                loop {
                    for (i, (_, probe)) in backends.iter().enumerate() {
                        let ok = matches!(http_get(*probe, "/readyz").await, Ok((200, _)));
                        ready[i].store(ok, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let next = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let (backends, ready) = (backends.clone(), ready.clone());
                let first = next.fetch_add(1, Ordering::SeqCst) as usize;
                tokio::spawn(async move {
                    let n = backends.len();
                    let order = (0..n).map(|i| (first + i) % n);
                    let (up, down): (Vec<usize>, Vec<usize>) =
                        order.partition(|i| ready[*i].load(Ordering::SeqCst));
                    for i in up.into_iter().chain(down) {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(backends[i].0).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                            return;
                        }
                    }
                });
            }
        });
        ServiceProxy {
            port,
            tasks: vec![probe, accept],
        }
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_stopped_under_load_rejects_no_create() {
    let (client, bed, _cleanup) = setup("wh-ha", false).await;
    let g = bed.group.clone();
    let node = worker_node(&bed, "w").await;
    let a = Webhook::start(&client, &g, "false").await;
    // The second replica mounts the same certificate Secret, as pods of one Deployment do.
    let kubeconfig =
        nmo_tests::repo_root().join(format!(".cluster/test-logs/{g}-webhook.kubeconfig"));
    let (mut b_proc, b_tls, b_probe, b_metrics) =
        launch_pod(&client, &a.cert_dir, &kubeconfig, "false").await;
    let proxy = ServiceProxy::start(vec![(a.tls_addr, a.probe_addr), (b_tls, b_probe)]).await;
    register_url(
        &client,
        &g,
        proxy.port,
        &certs::ca_bundle_base64(a.ca.cert_pem()),
    )
    .await;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    dry_create_until(
        &api,
        &format!("{g}-probe"),
        &format!("{g}-ghost"),
        "the API server to call the webhook through the proxy",
        denied_with(&format!("no node with name {g}-ghost found")),
    )
    .await;
    let valid_b = || async {
        let text = http_get(b_metrics, "/metrics")
            .await
            .map(|r| r.1)
            .unwrap_or_default();
        metric(
            &text,
            "nmo_webhook_decisions_total",
            &[("allowed", "true"), ("reason", "valid")],
        )
    };

    // A steady stream of creates (server-side dry runs: the webhook is called
    // exactly as for a real create) from four clients; replica b is deleted
    // (SIGTERM, as the kubelet stops a pod) once both replicas answered some.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, rejected) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (api, stop, sent, rejected, errors) = (
            api.clone(),
            stop.clone(),
            sent.clone(),
            rejected.clone(),
            errors.clone(),
        );
        let (g, node) = (g.clone(), node.clone());
        clients.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let r = dry_create(&api, &format!("{g}-c{c}-{i}"), &node).await;
                sent.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = r {
                    rejected.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut v) = errors.lock() {
                        v.push(format!("{e:?}"));
                    }
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    until("both replicas to answer creates", SHORT, || async {
        let (va, vb) = (a.decisions("true", "valid").await, valid_b().await);
        Ok(if va > 0.0 && vb > 0.0 {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("replica a {va}, replica b {vb}"))
        })
    })
    .await
    .expect("load spread over both replicas");
    let at_kill = sent.load(Ordering::SeqCst);
    let status = b_proc.terminate().expect("exit status");
    assert!(
        status.success(),
        "replica b stops cleanly on SIGTERM: {status:?}"
    );
    // Keep the stream going until replica a alone has answered as many again.
    until(
        "creates to flow through the surviving replica",
        LONG,
        || async {
            let now = sent.load(Ordering::SeqCst);
            Ok(if now >= at_kill * 2 + 50 {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{now} creates sent, {at_kill} before the kill"))
            })
        },
    )
    .await
    .expect("creates after the kill");
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client task");
    }
    let (sent, rejected) = (sent.load(Ordering::SeqCst), rejected.load(Ordering::SeqCst));
    eprintln!("{sent} creates, {at_kill} before replica b was killed, {rejected} rejected");
    assert_eq!(
        rejected,
        0,
        "creates rejected while a replica died: {:?}",
        errors.lock().map(|v| v.clone())
    );
    drop(proxy);
    drop(a);
}

#[tokio::test]
async fn without_the_webhook_process_creates_are_rejected() {
    let (client, bed, _cleanup) = setup("wh-down", false).await;
    let g = bed.group.clone();
    let worker = worker_node(&bed, "w1").await;
    let mut wh = Webhook::start(&client, &g, "false").await;
    wh.register(&client, &g).await;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    assert_eq!(dry_create(&api, &format!("{g}-a"), &worker).await, Ok(()));

    wh.proc.kill();
    // failurePolicy Fail: a real create is refused while nothing answers.
    until(
        "creates to be rejected with the webhook down",
        SHORT,
        || async {
            let r = outcome(
                api.create(&PostParams::default(), &nm(&format!("{g}-a"), &worker))
                    .await,
            );
            Ok(match &r {
                Err((_, m)) if m.contains("failed calling webhook") => Poll::Ready(()),
                Ok(()) => anyhow::bail!("the create was admitted with the webhook down"),
                other => Poll::Pending(format!("{other:?}")),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        api.get_opt(&format!("{g}-a")).await.expect("get").is_none(),
        "the NodeMaintenance must not exist"
    );
}

#[tokio::test]
async fn openshift_etcd_quorum_rule() {
    let (client, bed, _cleanup) = setup("wh-ocp", true).await;
    let g = bed.group.clone();
    // Simulated OpenShift: discovery offers config.openshift.io/v1 ...
    let crd: CustomResourceDefinition = from_json(json!({
        "metadata": {"name": OPENSHIFT_CRD},
        "spec": {
            "group": "config.openshift.io",
            "names": {"kind": "ClusterVersion", "plural": "clusterversions", "singular": "clusterversion", "listKind": "ClusterVersionList"},
            "scope": "Cluster",
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) | Err(kube::Error::Api(_)) => {} // already there from an earlier run: fine
        Err(e) => panic!("creating {OPENSHIFT_CRD}: {e}"),
    }
    until(
        "discovery to offer config.openshift.io/v1",
        SHORT,
        || async {
            let groups = client.list_api_groups().await?;
            let found = groups
                .groups
                .iter()
                .any(|g| g.name == "config.openshift.io");
            Ok(if found {
                Poll::Ready(())
            } else {
                Poll::Pending("not in /apis".into())
            })
        },
    )
    .await
    .expect("OpenShift simulated");
    // ... and openshift-etcd holds the guard PDB and one guard pod per control-plane node.
    let ns: Namespace = from_json(json!({"metadata": {"name": ETCD_NS}}));
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    // The webhook reads openshift-etcd through the openshift overlay's Role
    // there, in effect before the webhook starts watching.
    nmo_tests::manifests::install_webhook_openshift_rbac(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ETCD_NS);
    let stale = pdbs.list(&ListParams::default()).await.expect("list PDBs");
    assert!(
        stale.items.iter().all(|p| p
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(GROUP_KEY))),
        "openshift-etcd holds PDBs this test did not create; remove them: {:?}",
        stale
            .items
            .iter()
            .map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    let _ = pdbs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;

    let cps = [
        control_plane_node(&bed, "cp1").await,
        control_plane_node(&bed, "cp2").await,
        control_plane_node(&bed, "cp3").await,
    ];
    let worker = worker_node(&bed, "w1").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ETCD_NS);
    let app = format!("{g}-guard");
    for cp in &cps {
        let pod: Pod = from_json(json!({
            "metadata": {"name": format!("guard-{cp}"), "labels": {"app": app, GROUP_KEY: g}},
            "spec": {"nodeName": cp, "containers": [{"name": "guard", "image": "registry.invalid/guard:1"}]}
        }));
        // The namespace's default ServiceAccount appears shortly after the namespace.
        until("a guard pod to be created", SHORT, || async {
            Ok(match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => Poll::Ready(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Poll::Ready(()),
                Err(e) => Poll::Pending(e.to_string()),
            })
        })
        .await
        .expect("guard pod");
    }
    let guard_pdb = |name: &str, min: i32| -> PodDisruptionBudget {
        from_json(json!({
            "metadata": {"name": name, "labels": {GROUP_KEY: g}},
            "spec": {"minAvailable": min, "selector": {"matchLabels": {"app": app}}}
        }))
    };
    pdbs.create(&PostParams::default(), &guard_pdb("etcd-guard-pdb", 3))
        .await
        .expect("guard PDB");
    let pdb_state = |healthy: i32, allowed: i32| {
        let pdbs = pdbs.clone();
        async move {
            until(
                &format!(
                    "etcd-guard-pdb to report {healthy} healthy, {allowed} disruptions allowed"
                ),
                LONG,
                || async {
                    let p = pdbs.get("etcd-guard-pdb").await?;
                    let s = p.status.clone().unwrap_or_default();
                    let current = s.observed_generation == p.metadata.generation;
                    Ok(
                        if current
                            && s.current_healthy == healthy
                            && s.disruptions_allowed == allowed
                        {
                            Poll::Ready(())
                        } else {
                            Poll::Pending(format!("{s:?}"))
                        },
                    )
                },
            )
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
        }
    };
    pdb_state(3, 0).await;

    let wh = Webhook::start(&client, &g, "auto").await;
    wh.register(&client, &g).await;
    assert_eq!(
        metric(&wh.metrics().await, "nmo_webhook_openshift", &[]),
        1.0,
        "auto-detected OpenShift"
    );
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let quorum = |node: &str| {
        format!(
            "can not put master/control-plane node into maintenance at this moment, disrupting node {node} will violate etcd quorum"
        )
    };
    let nm_name = format!("{g}-nm");

    // All guards Ready, no disruption left: control-plane nodes are refused, workers are not.
    dry_create_until(
        &api,
        &nm_name,
        &cps[0],
        "cp1 to be refused (guard ready)",
        denied_with(&quorum(&cps[0])),
    )
    .await;
    assert_eq!(
        dry_create(&api, &nm_name, &worker).await,
        Ok(()),
        "worker on OpenShift"
    );

    // The guard on cp1 turns NotReady: cp1 is already disrupted, so allowed; cp2 is still refused.
    pods.patch_status(
        &format!("guard-{}", cps[0]),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
    )
    .await
    .expect("guard on cp1 not ready");
    pdb_state(2, 0).await;
    dry_create_until(
        &api,
        &nm_name,
        &cps[0],
        "cp1 to be allowed (guard not ready)",
        allowed,
    )
    .await;
    assert!(denied_with(&quorum(&cps[1]))(
        &dry_create(&api, &nm_name, &cps[1]).await
    ));

    // The PDB allows one disruption: cp2 is allowed.
    pdbs.patch(
        "etcd-guard-pdb",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
    )
    .await
    .expect("minAvailable 1");
    pdb_state(2, 1).await;
    dry_create_until(
        &api,
        &nm_name,
        &cps[1],
        "cp2 to be allowed (disruption allowed)",
        allowed,
    )
    .await;

    // Two guard PDBs: the rule cannot judge, refuse.
    pdbs.create(&PostParams::default(), &guard_pdb("etcd-quorum-guard", 1))
        .await
        .expect("second PDB");
    dry_create_until(
        &api,
        &nm_name,
        &cps[1],
        "cp2 to be refused (two PDBs)",
        denied_with(&quorum(&cps[1])),
    )
    .await;

    // No guard PDB at all: refuse.
    pdbs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("PDBs deleted");
    until("the PDBs to be gone", SHORT, || async {
        let n = pdbs.list(&ListParams::default()).await?.items.len();
        Ok(if n == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{n} left"))
        })
    })
    .await
    .expect("PDBs gone");
    let before = wh.decisions("false", "quorum_no_pdb").await;
    dry_create_until(&api, &nm_name, &cps[1], "cp2 to be refused (no PDB)", |r| {
        denied_with(&quorum(&cps[1]))(r)
    })
    .await;
    assert!(
        wh.decisions("false", "quorum_no_pdb").await > before,
        "refused for the missing PDB"
    );

    let text = wh.metrics().await;
    for (allowed, reason) in [
        ("false", "quorum_violation"),
        ("true", "quorum_already_disrupted"),
        ("true", "quorum_disruption_allowed"),
        ("false", "quorum_several_pdbs"),
        ("true", "valid"),
    ] {
        let n = metric(
            &text,
            "nmo_webhook_decisions_total",
            &[("allowed", allowed), ("reason", reason)],
        );
        assert!(n >= 1.0, "no {reason} decision counted:\n{text}");
    }
}

#[tokio::test]
async fn certificate_rotation_under_load_loses_no_review() {
    let (client, bed, _cleanup) = setup("wh-rotate", false).await;
    let g = bed.group.clone();
    let wh = Webhook::start(&client, &g, "false").await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));

    // Load: reviews back to back on keep-alive connections, reconnecting every
    // 50 reviews so handshakes happen throughout the rotation.
    let load = {
        let (stop, done, failures) = (stop.clone(), done.clone(), failures.clone());
        let (addr, tls) = (wh.tls_addr, wh.tls());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let mut c = match ReviewClient::connect(addr, "localhost", tls.clone()).await {
                    Ok(c) => c,
                    Err(e) => {
                        failures.lock().expect("lock").push(format!("connect: {e}"));
                        continue;
                    }
                };
                for _ in 0..50 {
                    i += 1;
                    let uid = format!("load-{i}");
                    match c
                        .post(WEBHOOK_PATH, create_review(&uid, "nm", "some-node"))
                        .await
                    {
                        Ok((s, b))
                            if s.as_u16() == 200
                                && parse_response(&b).is_some_and(|r| r.0 == uid) =>
                        {
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                        other => failures
                            .lock()
                            .expect("lock")
                            .push(format!("{uid}: {other:?}")),
                    }
                }
            }
        })
    };
    let wait_reviews = |n: u64| {
        let done = done.clone();
        async move {
            until(&format!("{n} reviews answered"), SHORT, || {
                let d = done.load(Ordering::SeqCst);
                async move {
                    Ok(if d >= n {
                        Poll::Ready(())
                    } else {
                        Poll::Pending(format!("{d} answered"))
                    })
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
        }
    };
    // What a fresh connection is served.
    let served = || async {
        let mut c = wh.client().await;
        let (s, _) = c
            .post(WEBHOOK_PATH, create_review("probe", "nm", "some-node"))
            .await
            .expect("review on a fresh connection");
        assert_eq!(s.as_u16(), 200);
        c.peer_certificate
    };
    assert_eq!(Some(served().await), pem_to_der(&wh.first_cert_pem));
    wait_reviews(100).await;

    // Rotate the way kubelet updates a mounted Secret (..data symlink swap).
    let second = issue(&wh.ca);
    let want = pem_to_der(&second.cert_pem);
    let t0 = Instant::now();
    write_certs(&wh.cert_dir, &wh.ca, &second);
    until(
        "the new certificate to be served",
        Duration::from_secs(10),
        || async {
            let got = served().await;
            Ok(if Some(&got) == want.as_ref() {
                Poll::Ready(())
            } else {
                Poll::Pending("old certificate".into())
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nwebhook log:\n{}", wh.proc.log_text()));
    let took = t0.elapsed();
    let at_rotation = done.load(Ordering::SeqCst);
    wait_reviews(at_rotation + 200).await;

    // Broken files: the last good pair stays in service, the failure is counted.
    certs::write_kubelet_layout(
        &wh.cert_dir,
        &[("tls.crt", b"garbage"), ("tls.key", b"garbage")],
    )
    .expect("broken");
    until("the failed reload to be counted", SHORT, || async {
        let text = wh.metrics().await;
        let n = metric(
            &text,
            "nmo_webhook_certificate_reloads_total",
            &[("result", "failure")],
        );
        Ok(if n >= 1.0 {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("failures: {n}"))
        })
    })
    .await
    .expect("failure counted");
    assert_eq!(
        served().await,
        want.clone().expect("der"),
        "still serving the last good certificate"
    );
    let at_broken = done.load(Ordering::SeqCst);
    wait_reviews(at_broken + 100).await;

    stop.store(true, Ordering::SeqCst);
    load.await.expect("load task");
    let failures = failures.lock().expect("lock").clone();
    assert!(
        failures.is_empty(),
        "{} reviews failed, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        took < Duration::from_secs(5),
        "new certificate served after {took:?}"
    );
    let text = wh.metrics().await;
    assert!(
        metric(
            &text,
            "nmo_webhook_certificate_reloads_total",
            &[("result", "success")]
        ) >= 1.0,
        "{text}"
    );
    eprintln!(
        "rotation: new certificate served after {took:?}; {} reviews, none failed",
        done.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn malformed_requests_never_break_the_process() {
    let (client, bed, _cleanup) = setup("wh-fuzz", false).await;
    let g = bed.group.clone();
    let mut wh = Webhook::start(&client, &g, "false").await;
    let valid = create_review("u-ok", "nm", "some-node");
    let with = |f: &dyn Fn(&mut serde_json::Value)| -> Vec<u8> {
        let mut v: serde_json::Value = serde_json::from_str(&valid).expect("json");
        f(&mut v);
        v.to_string().into_bytes()
    };
    let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    // (name, body, uid expected in a 200 denial; None = a 4xx is expected)
    let bodies: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("empty", vec![], None),
        ("not json", b"{\"apiVersion\":".to_vec(), None),
        ("binary", (0u8..=255).collect(), None),
        ("top-level string", b"\"AdmissionReview\"".to_vec(), None),
        ("deep nesting", deep.into_bytes(), None),
        (
            "no request",
            with(&|v| v["request"] = serde_json::Value::Null),
            None,
        ),
        (
            "uid object",
            with(&|v| v["request"]["uid"] = json!({"a": 1})),
            None,
        ),
        (
            "v1beta1",
            with(&|v| v["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            Some("u-ok"),
        ),
        (
            "kind Pod",
            with(&|v| v["kind"] = json!("Pod")),
            Some("u-ok"),
        ),
        (
            "no operation",
            with(&|v| v["request"]["operation"] = serde_json::Value::Null),
            Some("u-ok"),
        ),
        (
            "object array",
            with(&|v| v["request"]["object"] = json!([])),
            Some("u-ok"),
        ),
        (
            "spec null",
            with(&|v| v["request"]["object"]["spec"] = serde_json::Value::Null),
            Some("u-ok"),
        ),
        (
            "huge node name",
            with(&|v| v["request"]["object"]["spec"]["nodeName"] = json!("x".repeat(100_000))),
            Some("u-ok"),
        ),
        (
            "unicode",
            with(&|v| {
                v["request"]["object"]["spec"]["nodeName"] = json!("nöde-\u{1F600}-\u{0000}")
            }),
            Some("u-ok"),
        ),
        (
            "update no old",
            with(&|v| v["request"]["operation"] = json!("UPDATE")),
            Some("u-ok"),
        ),
        (
            "other group",
            with(&|v| v["request"]["kind"]["group"] = json!("apps")),
            Some("u-ok"),
        ),
    ];
    let mut c = wh.client().await;
    for (name, body, uid) in bodies {
        // One keep-alive connection for all: no answer may leave it unusable.
        let r = c
            .post(WEBHOOK_PATH, body)
            .await
            .unwrap_or_else(|e| panic!("{name}: no answer on the reused connection: {e}"));
        let (status, resp) = (r.0.as_u16(), r.1);
        match uid {
            Some(uid) => {
                assert_eq!(status, 200, "{name}");
                let (got, allowed, code, msg) = parse_response(&resp)
                    .unwrap_or_else(|| panic!("{name}: not a review: {resp:?}"));
                assert_eq!((got.as_str(), allowed), (uid, false), "{name}: {msg}");
                assert!(code == 400 || code == 403, "{name}: status code {code}");
                assert!(!msg.is_empty(), "{name}: denial without a message");
            }
            None => assert!((400..500).contains(&status), "{name}: HTTP {status}"),
        }
    }
    let tls = wh.tls();
    // After each answer the connection is either reusable (a valid review sent
    // on it next gets its 200) or the answer said `Connection: close`: a client
    // reusing a connection must never find it closed without being told.
    let follow_up = {
        let review = create_review("u-next", "nm", "some-node");
        let mut r = format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            review.len()
        )
        .into_bytes();
        r.extend_from_slice(review.as_bytes());
        r
    };
    // A real 2 MiB body (over the 1 MiB limit, within the 4 MiB it reads
    // and discards): a 413 the client reads, on a connection it can reuse.
    let mut big = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        2 * 1024 * 1024
    )
    .into_bytes();
    big.extend(std::iter::repeat_n(b' ', 2 * 1024 * 1024));
    // (name, request, expected status line, expected to keep the connection)
    for (name, raw, want, keeps) in [
        (
            "GET",
            format!("GET {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\n\r\n").into_bytes(),
            "HTTP/1.1 405",
            true,
        ),
        (
            "other path",
            "POST /validate HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
                .as_bytes()
                .to_vec(),
            "HTTP/1.1 404",
            true,
        ),
        (
            "form post",
            format!(
                "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 3\r\n\r\na=b"
            )
            .into_bytes(),
            "HTTP/1.1 415",
            true,
        ),
        ("2 MiB body", big, "HTTP/1.1 413", true),
        (
            "declared 100 MiB",
            format!(
                "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 104857600\r\n\r\n{{"
            )
            .into_bytes(),
            "HTTP/1.1 413",
            false,
        ),
        (
            "stalled body",
            format!(
                "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{{\"a\":"
            )
            .into_bytes(),
            "HTTP/1.1 408",
            false,
        ),
        (
            "garbage request line",
            b"\x01\x02\x03 nonsense\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
            false,
        ),
    ] {
        let got = send_raw_then_reuse(
            wh.tls_addr,
            "localhost",
            tls.clone(),
            &raw,
            &follow_up,
            Duration::from_secs(15),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got.first.starts_with(want),
            "{name}: expected {want}, got {:?}",
            got.first
        );
        match &got.second {
            None => assert!(
                !keeps,
                "{name}: said Connection: close where the connection should stay usable: {:?}",
                got.first
            ),
            Some(second) => {
                assert!(
                    keeps,
                    "{name}: expected Connection: close, got {:?}",
                    got.first
                );
                assert!(
                    second.starts_with("HTTP/1.1 200"),
                    "{name}: the connection was kept without Connection: close, but a review sent on it got {second:?}"
                );
            }
        }
    }

    // Not TLS at all.
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0x16, 0x03, 0x03, 0xff, 0xff, 0x00][..],
    ] {
        let addr = wh.tls_addr;
        let junk = junk.to_vec();
        tokio::task::spawn_blocking(move || {
            if let Ok(mut s) = TcpStream::connect(addr) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.write_all(&junk);
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            }
        })
        .await
        .expect("junk client");
    }

    // Alive, healthy, still answering, never a 5xx.
    assert!(
        wh.proc.child.try_wait().expect("status").is_none(),
        "the webhook exited"
    );
    assert_eq!(
        http_get(wh.probe_addr, "/healthz")
            .await
            .expect("healthz")
            .0,
        200
    );
    let mut c = wh.client().await;
    let (s, b) = c
        .post(WEBHOOK_PATH, create_review("u-after", "nm", "some-node"))
        .await
        .expect("review");
    assert_eq!(s.as_u16(), 200);
    assert_eq!(parse_response(&b).map(|r| r.0), Some("u-after".to_string()));
    let text = wh.metrics().await;
    for code in ["500", "502", "503", "504"] {
        assert_eq!(
            metric(
                &text,
                "controller_runtime_webhook_requests_total",
                &[("code", code)]
            ),
            0.0,
            "{text}"
        );
    }

    // SIGTERM: exits 0 after saying so.
    let status = wh.proc.terminate().expect("exit status");
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        wh.proc.log_text()
    );
    assert!(
        wh.proc.log_text().contains("webhook stopped"),
        "{}",
        wh.proc.log_text()
    );
}
