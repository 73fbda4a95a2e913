//! The controller and the webhook across restarts of the control plane itself,
//! as a cluster upgrade does them: kube-apiserver SIGKILLed mid-drain and
//! mid-deletion and started again 8 s later, etcd SIGKILLed for 5 s. Each test
//! prints a `restart figure:` line, how long after the API server was ready
//! again the operator had finished (`make bench` collects them), and checks
//! that the node is given back with no cordon, taint, label or lease left.
//! The mid-drain case (a PDB deleted right after the API server answers
//! again) has a target, within 0.5 s every run: `make bench` runs it ten
//! times and counts.
//!
//! These tests restart the shared local plane (tests/cluster/restart.sh) that
//! every other test uses, so they are `#[ignore]`d: a plain `cargo test` never
//! runs them by accident, and tests/run-tests.sh runs them on their own, after
//! the rest, one at a time:
//!
//!     cargo test -p nmo-tests --test restarts -- --ignored --test-threads=1

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nmo_tests::deployment::{Launch, Pod};
use nmo_tests::fixtures::{ControllerBed, GROUP_KEY, TestBed, teardown_controller_test};
use nmo_tests::plane::{RefreshClientsOnDrop, Restart, Restarting, restart};
use nmo_tests::process::service_account_kubeconfig;
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{issue, launch_pod, register_url, write_certs};
use serde_json::json;
use shared::api::consts::{
    EXCLUDE_FROM_REMEDIATION_LABEL, LEASE_NAMESPACE_DEFAULT, TAINT_DRAIN_KEY,
    TAINT_UNSCHEDULABLE_KEY, lease_name, msg_duplicate, msg_node_not_found,
};
use shared::{MaintenancePhase, NodeMaintenance};

const LONG: Duration = Duration::from_secs(60);
/// How long after the API server is ready again the operator may take here.
/// The target is 5 s (upstream's operator: ~2 s); the bound is generous so a
/// busy machine does not fail the test (each test prints its figure).
/// `NMO_AFTER_READY_SECS` raises it, e.g. to measure an older build.
fn after_ready() -> Duration {
    std::env::var("NMO_AFTER_READY_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(20))
}
/// How long kube-controller-manager may take to catch up after a restart:
/// its informers reconnect with client-go's backoff (up to 30 s, doubled by
/// jitter, and not reset between restarts less than 2 minutes apart), and the
/// tests need it for the namespace's default ServiceAccount and PDB status.
const KCM_CATCH_UP: Duration = Duration::from_secs(150);
const APISERVER_DOWN_SECS: f64 = 8.0;
const ETCD_DOWN_SECS: f64 = 5.0;

/// One figure for `make bench`: `what` happened `secs` after the API server was ready.
fn figure(scenario: &str, what: &str, since_ready: Duration, r: &Restart) {
    println!(
        "restart figure: {scenario}: {what} {:.2} s after the API server was ready ({r})",
        since_ready.as_secs_f64()
    );
}

/// Panic with `e`, the last lines of the plane's logs, and (through the pod
/// handles' Drop) the operator's own log.
fn fail(e: anyhow::Error) -> ! {
    panic!("{e:#}\n{}", nmo_tests::component_log_tails(10))
}

/// Retry one request across the restart's aftermath (a pooled connection to
/// the killed API server fails once; a starting one may answer 5xx).
async fn eventually<T, E, F, Fut>(what: &str, op: F) -> T
where
    E: std::fmt::Display,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    until(what, LONG, || async {
        Ok(match op().await {
            Ok(v) => Poll::Ready(v),
            Err(e) => Poll::Pending(format!("{e:#}")),
        })
    })
    .await
    .unwrap_or_else(|e| fail(e))
}

/// What of the maintenance is still on `node`: cordon, our taints, our label, our lease.
fn leftovers(node: &Node, lease: Option<&Lease>) -> Vec<String> {
    let mut left = Vec::new();
    let spec = node.spec.clone().unwrap_or_default();
    if spec.unschedulable == Some(true) {
        left.push("cordoned".to_string());
    }
    for t in spec.taints.unwrap_or_default() {
        if t.key == TAINT_DRAIN_KEY || t.key == TAINT_UNSCHEDULABLE_KEY {
            left.push(format!("taint {}:{}", t.key, t.effect));
        }
    }
    if node.labels().contains_key(EXCLUDE_FROM_REMEDIATION_LABEL) {
        left.push(format!("label {EXCLUDE_FROM_REMEDIATION_LABEL}"));
    }
    if let Some(l) = lease {
        left.push(format!(
            "lease {LEASE_NAMESPACE_DEFAULT}/{} held by {:?}",
            l.name_any(),
            l.spec.as_ref().and_then(|s| s.holder_identity.clone())
        ));
    }
    left
}

/// A test's own nodes and namespace, and one controller pod (the base
/// Deployment, from its image) for its NodeMaintenances, electing itself
/// leader in the test's private copy of nmo-system (as tests/tests/integration/controller.rs).
struct Env {
    bed: TestBed,
    operator_ns: String,
    ctrl: Pod,
}

impl Env {
    async fn new(prefix: &str) -> Env {
        let ControllerBed {
            bed,
            operator_ns,
            kubeconfig,
        } = ControllerBed::new(prefix).await;
        let client = bed.client.clone();
        let ctrl = Launch::new("base", "nmo-controller")
            .extra_args([
                format!("--nodemaintenance-selector={GROUP_KEY}={}", bed.group),
                format!("--leader-election-namespace={operator_ns}"),
                // The only API server is down 8 s and takes seconds to serve
                // again: past controller-runtime's 10 s renew deadline, after
                // which a leader exits (real_node.rs proves that, with the
                // kubelet restarting it). These tests are about carrying on,
                // as a cluster with one API server would set it.
                "--leader-elect-renew-deadline=40s".to_string(),
                "--leader-elect-lease-duration=60s".to_string(),
                "--zap-log-level=debug".to_string(),
            ])
            .kubeconfig(&kubeconfig)
            // kube_runtime at debug: the log shows each reconnect wait.
            .env("RUST_LOG", "info,nmo_controller=debug,kube_runtime=debug")
            .start(&client)
            .await
            .expect("controller starts");
        ctrl.wait_ready(LONG).await.expect("controller Ready");
        Env {
            bed,
            operator_ns,
            ctrl,
        }
    }

    fn client(&self) -> Client {
        self.bed.client.clone()
    }

    fn nms(&self) -> Api<NodeMaintenance> {
        Api::all(self.client())
    }

    /// NodeMaintenance `<group>-a` for `node`.
    async fn create_nm(&self, node: &str) -> String {
        let name = format!("{}-a", self.bed.group);
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {GROUP_KEY: self.bed.group}},
            "spec": {"nodeName": node, "reason": "restart test"}
        }))
        .expect("NodeMaintenance JSON");
        self.nms()
            .create(&PostParams::default(), &nm)
            .await
            .expect("NodeMaintenance created");
        name
    }

    async fn wait_nm(
        &self,
        name: &str,
        what: &str,
        deadline: Duration,
        ok: impl Fn(&NodeMaintenance) -> bool,
    ) {
        let api = self.nms();
        until(what, deadline, || async {
            let nm = api.get(name).await?;
            Ok(if ok(&nm) {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("status {}", serde_json::to_string(&nm.status)?))
            })
        })
        .await
        .unwrap_or_else(|e| fail(e));
    }

    /// A node under a NodeMaintenance that has Succeeded (its next own round
    /// is half an hour away: only a watch event brings it back sooner).
    async fn succeeded_maintenance(&self) -> (String, String) {
        let node = self
            .bed
            .node("target", false)
            .await
            .expect("node")
            .name_any();
        let nm = self.create_nm(&node).await;
        self.wait_nm(&nm, "phase Succeeded", LONG, |nm| {
            nm.phase() == Some(&MaintenancePhase::Succeeded)
        })
        .await;
        (nm, node)
    }

    /// A node whose one pod is guarded by PDB "guard" (minAvailable 1), under a
    /// NodeMaintenance that is Running and reports the pod as blocked.
    async fn blocked_maintenance(&self) -> (String, String) {
        let bed = &self.bed;
        // Pods need the namespace's default ServiceAccount, which
        // kube-controller-manager makes; after a previous test's restart it
        // may still be reconnecting.
        let sas: Api<ServiceAccount> = Api::namespaced(self.client(), &bed.namespace);
        until(
            "ServiceAccount default in the test namespace",
            KCM_CATCH_UP,
            || async {
                Ok(match sas.get_opt("default").await? {
                    Some(_) => Poll::Ready(()),
                    None => Poll::Pending("not yet made by kube-controller-manager".into()),
                })
            },
        )
        .await
        .unwrap_or_else(|e| fail(e));
        let node = bed.node("target", false).await.expect("node").name_any();
        bed.bare_pod("guarded", &node).await.expect("guarded pod");
        bed.pdb("guard", "guarded", 1).await.expect("pdb");
        bed.wait_pdb_status("guard", 1, KCM_CATCH_UP)
            .await
            .unwrap_or_else(|e| fail(e));
        let nm = self.create_nm(&node).await;
        self.wait_nm(&nm, "the drain blocked on the guarded pod", LONG, |nm| {
            nm.status.as_ref().is_some_and(|s| {
                s.phase == Some(MaintenancePhase::Running)
                    && s.pending_pods == vec!["guarded".to_string()]
                    && s.last_error.contains("guarded")
            })
        })
        .await;
        (nm, node)
    }

    async fn lift_pdb(&self) {
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client(), &self.bed.namespace);
        eventually("PDB guard deleted", || async {
            match pdbs.delete("guard", &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                other => other.map(|_| ()),
            }
        })
        .await;
    }

    /// Delete the NodeMaintenance and wait until `node` is given back; returns
    /// when that was seen.
    async fn delete_and_wait_given_back(&self, nm: &str, node: &str) -> Instant {
        eventually(&format!("NodeMaintenance {nm} deleted"), || async {
            self.nms().delete(nm, &DeleteParams::default()).await
        })
        .await;
        self.wait_given_back(nm, node, LONG).await
    }

    /// Wait until NodeMaintenance `nm` is gone and `node` carries nothing of
    /// it; returns when that was seen.
    async fn wait_given_back(&self, nm: &str, node: &str, deadline: Duration) -> Instant {
        let nodes: Api<Node> = Api::all(self.client());
        let leases: Api<Lease> = Api::namespaced(self.client(), LEASE_NAMESPACE_DEFAULT);
        let what = format!(
            "NodeMaintenance {nm} gone and node {node} given back (no cordon, taint, label or lease of ours)"
        );
        until(&what, deadline, || async {
            let lease = leases.get_opt(&lease_name(node)).await?;
            let mut left = leftovers(&nodes.get(node).await?, lease.as_ref());
            if let Some(still) = self.nms().get_opt(nm).await? {
                left.push(format!(
                    "NodeMaintenance still there, finalizers {:?}",
                    still.finalizers()
                ));
            }
            Ok(if left.is_empty() {
                Poll::Ready(Instant::now())
            } else {
                Poll::Pending(left.join("; "))
            })
        })
        .await
        .unwrap_or_else(|e| fail(e))
    }

    /// The end of a deletion test: `node` given back within [`after_ready`]
    /// of `r`, the figure printed, the controller still the same process.
    async fn given_back_after(mut self, scenario: &str, nm: &str, node: &str, r: &Restart) {
        let given_back = self.wait_given_back(nm, node, after_ready()).await;
        figure(
            scenario,
            "node given back",
            given_back.duration_since(r.ready_at),
            r,
        );
        self.assert_controller_survived();
        self.teardown().await;
    }

    /// The controller carried on: same process, never exited (a leader that
    /// lost its Lease would have).
    fn assert_controller_survived(&mut self) {
        let status = self.ctrl.proc.child.try_wait().expect("controller status");
        assert!(
            status.is_none(),
            "the controller exited ({status:?}) during the restart; its log:\n{}",
            self.ctrl.proc.log_tail(40)
        );
    }

    /// Log lines of the controller that mention `needle`.
    fn log_count(&self, needle: &str) -> usize {
        self.ctrl.proc.log_text().matches(needle).count()
    }

    async fn teardown(mut self) {
        teardown_controller_test(&self.bed, &self.operator_ns, Some(&mut self.ctrl.proc)).await;
    }
}

/// SIGSTOP or SIGCONT a process (to hold the controller still for a moment).
fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

/// A drain held up by a PDB while `component` is SIGKILLed and started again
/// `down` seconds later; the PDB is lifted as soon as the API server is ready:
/// the maintenance must reach Succeeded within [`after_ready`].
async fn drain_across_a_restart(prefix: &str, component: &str, down: f64, scenario: &str) {
    let _refresh = RefreshClientsOnDrop;
    let mut env = Env::new(prefix).await;
    let (nm, node) = env.blocked_maintenance().await;

    let r = restart(component, down).await.unwrap_or_else(|e| fail(e));
    env.lift_pdb().await;
    let what = format!("phase Succeeded after the {component} restart");
    env.wait_nm(&nm, &what, after_ready(), |nm| {
        nm.phase() == Some(&MaintenancePhase::Succeeded)
    })
    .await;
    figure(scenario, "Succeeded", r.ready_at.elapsed(), &r);
    println!(
        "controller log: {} \"could not record lastError\", {} re-decisions on a fresh read after a conflict",
        env.log_count("could not record lastError"),
        env.log_count("deciding again on a fresh read")
    );
    env.assert_controller_survived();

    env.delete_and_wait_given_back(&nm, &node).await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared control plane: run alone, `--ignored --test-threads=1` (tests/run-tests.sh does)"]
async fn apiserver_restart_mid_drain_finishes_once_the_pdb_is_lifted() {
    drain_across_a_restart(
        "rs-drain",
        "kube-apiserver",
        APISERVER_DOWN_SECS,
        "kube-apiserver restart mid-drain",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared control plane: run alone, `--ignored --test-threads=1` (tests/run-tests.sh does)"]
async fn etcd_restart_mid_drain_the_controller_carries_on() {
    drain_across_a_restart("rs-etcd", "etcd", ETCD_DOWN_SECS, "etcd restart mid-drain").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared control plane: run alone, `--ignored --test-threads=1` (tests/run-tests.sh does)"]
async fn apiserver_restart_mid_deletion_gives_the_node_back() {
    let _refresh = RefreshClientsOnDrop;
    let env = Env::new("rs-delete").await;
    let (nm, node) = env.succeeded_maintenance().await;

    // The deletion must reach the controller while the API server is away, not
    // a few milliseconds before the kill (then the undo would be done already):
    // hold the controller still, delete, kill the API server, let it go on.
    let pid = env.ctrl.proc.pid();
    signal(pid, "-STOP");
    let deleted = env.nms().delete(&nm, &DeleteParams::default()).await;
    let killed = match Restarting::start("kube-apiserver", APISERVER_DOWN_SECS) {
        Ok(mut restarting) => restarting.killed().await.map(|()| restarting),
        Err(e) => Err(e),
    };
    signal(pid, "-CONT");
    deleted.expect("NodeMaintenance deleted");
    let r = killed
        .unwrap_or_else(|e| fail(e))
        .ready()
        .await
        .unwrap_or_else(|e| fail(e));
    env.given_back_after("kube-apiserver restart mid-deletion", &nm, &node, &r)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared control plane: run alone, `--ignored --test-threads=1` (tests/run-tests.sh does)"]
async fn apiserver_restart_then_a_deletion_reaches_the_controller_through_its_watch() {
    let _refresh = RefreshClientsOnDrop;
    let env = Env::new("rs-after").await;
    let (nm, node) = env.succeeded_maintenance().await;

    // Deleted as soon as the API server is back: nothing of the controller's
    // own is due for half an hour, so only its reconnected watch tells it.
    let r = restart("kube-apiserver", APISERVER_DOWN_SECS)
        .await
        .unwrap_or_else(|e| fail(e));
    eventually(&format!("NodeMaintenance {nm} deleted"), || async {
        env.nms().delete(&nm, &DeleteParams::default()).await
    })
    .await;
    env.given_back_after("kube-apiserver restart, then deletion", &nm, &node, &r)
        .await;
}

/// A server-side dry-run create of NodeMaintenance `name` for `node`: Ok, or (code, message).
async fn dry_create(
    api: &Api<NodeMaintenance>,
    name: &str,
    node: &str,
) -> Result<(), (u16, String)> {
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "restart test"}
    }))
    .expect("NodeMaintenance JSON");
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&pp, &nm).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err((s.code, s.message)),
        Err(e) => Err((0, e.to_string())),
    }
}

/// Poll dry-run creates until the answer is `want` (None: allowed; Some(msg):
/// denied with a message ending in msg); returns when it was.
async fn admission_until(
    api: &Api<NodeMaintenance>,
    name: &str,
    node: &str,
    want: Option<&str>,
) -> Instant {
    let what = match want {
        None => format!("a NodeMaintenance for node {node} to be admitted"),
        Some(m) => format!("a NodeMaintenance for node {node} to be denied with {m:?}"),
    };
    until(&what, after_ready(), || async {
        let got = dry_create(api, name, node).await;
        let ok = match (&got, want) {
            (Ok(()), None) => true,
            (Err((403, m)), Some(want)) => m.ends_with(want),
            _ => false,
        };
        Ok(if ok {
            Poll::Ready(Instant::now())
        } else {
            Poll::Pending(format!("{got:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| fail(e))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "restarts the shared control plane: run alone, `--ignored --test-threads=1` (tests/run-tests.sh does)"]
async fn webhook_decides_right_for_a_node_created_after_an_apiserver_restart() {
    let _refresh = RefreshClientsOnDrop;
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_webhook_prereqs(&client)
        .await
        .unwrap_or_else(|e| fail(e));
    let bed = TestBed::new(client.clone(), "rs-webhook")
        .await
        .expect("test namespace");
    let g = bed.group.clone();
    let dir = nmo_tests::repo_root().join(".cluster/test-logs");
    let cert_dir = dir.join(format!("{g}-certs"));
    let ca = certs::Ca::new("nmo-tests-webhook-ca", Duration::from_secs(3600)).expect("CA");
    write_certs(&cert_dir, &ca, &issue(&ca));
    let kubeconfig = dir.join(format!("{g}-webhook.kubeconfig"));
    service_account_kubeconfig(&client, "nmo-system", "nmo-webhook", &kubeconfig)
        .await
        .expect("webhook kubeconfig");
    let (mut webhook, tls, _, _) = launch_pod(&client, &cert_dir, &kubeconfig, "false").await;
    register_url(
        &client,
        &g,
        tls.port(),
        &certs::ca_bundle_base64(ca.cert_pem()),
    )
    .await;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let ghost = format!("{g}-ghost");
    admission_until(
        &api,
        &format!("{g}-probe"),
        &ghost,
        Some(&msg_node_not_found(&ghost)),
    )
    .await;

    let r = restart("kube-apiserver", APISERVER_DOWN_SECS)
        .await
        .unwrap_or_else(|e| fail(e));
    let node = eventually("a node created after the restart", || {
        bed.node("fresh", false)
    })
    .await
    .name_any();
    let admitted = admission_until(&api, &format!("{g}-a"), &node, None).await;
    admission_until(
        &api,
        &format!("{g}-b"),
        &ghost,
        Some(&msg_node_not_found(&ghost)),
    )
    .await;
    figure(
        "kube-apiserver restart, webhook",
        "new node admitted",
        admitted.duration_since(r.ready_at),
        &r,
    );

    // The duplicate rule reads only the NodeMaintenance cache: a denial proves
    // that watch is back too.
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "metadata": {"name": format!("{g}-a"), "labels": {GROUP_KEY: g}},
        "spec": {"nodeName": node, "reason": "restart test"}
    }))
    .expect("NodeMaintenance JSON");
    let pp = PostParams::default();
    eventually("the first NodeMaintenance for the new node", || {
        api.create(&pp, &nm)
    })
    .await;
    let duplicate =
        admission_until(&api, &format!("{g}-c"), &node, Some(&msg_duplicate(&node))).await;
    figure(
        "kube-apiserver restart, webhook",
        "duplicate denied",
        duplicate.duration_since(r.ready_at),
        &r,
    );

    assert!(
        webhook.child.try_wait().expect("webhook status").is_none(),
        "the webhook exited during the restart; its log:\n{}",
        webhook.log_tail(40)
    );
    let dp = DeleteParams::default();
    let _ = api.delete(&format!("{g}-a"), &dp).await;
    nmo_tests::webhook_pod::unregister(&client, &g).await;
    bed.teardown().await;
}
