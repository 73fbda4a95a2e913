//! What a cluster runs: each Deployment of `manifests/` (base and the
//! OpenShift overlay), with its exact arguments, environment, ServiceAccount
//! and volumes, run from its image as the image's user, becomes Ready against
//! the local plane; so does each binary with upstream's own argument list.
//!
//! The controllers started here carry no selector and would reconcile every
//! NodeMaintenance of the cluster (other tests' too), so the test holds their
//! leader election Lease under a foreign identity first: they stay standbys,
//! which must be Ready all the same.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nmo_tests::deployment::Launch;
use nmo_tests::wait::{Poll, until};
use shared::api::consts::LEADER_ELECTION_LEASE_NAME;

const READY: Duration = Duration::from_secs(60);

/// upstream's Deployment and CSV arguments (contract, "Runtime surface").
const UPSTREAM_ARGS: [&str; 4] = [
    "--leader-elect",
    "--enable-http2=false",
    "--metrics-bind-address=:8443",
    "--health-probe-bind-address=:8081",
];

/// Hold the leader election Lease as someone else for an hour, so controllers
/// started from the manifests stay standbys. Reused when an earlier run left it.
async fn hold_leader_lease(client: &kube::Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "nmo-system");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": LEADER_ELECTION_LEASE_NAME, "labels": {"nmo-test/holder": "deployments"}},
        "spec": {
            "holderIdentity": "nmo-tests-deployments",
            "leaseDurationSeconds": 3600,
            "acquireTime": now_micro(),
            "renewTime": now_micro(),
        }
    }))
    .expect("lease JSON");
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let cur = leases
                .get(LEADER_ELECTION_LEASE_NAME)
                .await
                .expect("read the leader Lease");
            let spec = cur.spec.unwrap_or_default();
            // Free as any candidate sees it: ours, nobody's, or expired (a
            // controller killed without releasing it, e.g. under a restart).
            let expired =
                !shared::rules::lease::is_valid(&spec, k8s_openapi::jiff::Timestamp::now());
            let holder = spec.holder_identity.unwrap_or_default();
            assert!(
                holder == "nmo-tests-deployments" || holder.is_empty() || expired,
                "Lease nmo-system/{LEADER_ELECTION_LEASE_NAME} is held by {holder:?} and not expired: a \
                 controller (make deploy-local?) runs against this plane; stop it (make undeploy-local) first"
            );
            let _ = leases
                .delete(LEADER_ELECTION_LEASE_NAME, &DeleteParams::default())
                .await;
            leases
                .create(&PostParams::default(), &lease)
                .await
                .expect("leader Lease held for the test");
        }
        Err(e) => panic!("holding the leader Lease: {e}"),
    }
}

fn now_micro() -> serde_json::Value {
    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ))
    .expect("micro time")
}

/// A serving certificate for the webhook's Secret volume, in the kubelet layout.
fn webhook_certs(dir: &Path) {
    let ca = certs::Ca::new("nmo-tests-deployments-ca", Duration::from_secs(3600)).expect("CA");
    let cert = ca
        .issue_serving(
            &["localhost".to_string()],
            &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            Duration::from_secs(3600),
        )
        .expect("serving certificate");
    if nmo_tests::deployment::is_root() {
        certs::write_serving_set_owned(dir, &ca, &cert, 65532, 65532)
    } else {
        certs::write_serving_set(dir, &ca, &cert)
    }
    .expect("certificates written");
}

/// Start `launch` and wait for its readiness probe; the log tail on failure.
async fn ready(client: &kube::Client, what: &str, launch: Launch) -> Vec<String> {
    let pod = launch
        .start(client)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    pod.wait_ready(READY)
        .await
        .unwrap_or_else(|e| panic!("{what} never became Ready: {e:#}"));
    // Still running (a process that exits after passing a probe is no better).
    let mut proc = pod.proc;
    assert!(
        proc.child.try_wait().expect("wait status").is_none(),
        "{what} exited after becoming Ready:\n{}",
        proc.log_tail(30)
    );
    let args = pod.args.clone();
    let status = proc.terminate().expect("exit status");
    assert!(
        status.success(),
        "{what} stops cleanly on SIGTERM: {status:?}"
    );
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deployment_and_upstreams_arguments_become_ready() {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_prereqs(
        &client,
        &[
            "manifests/controller/rbac.yaml",
            "manifests/webhook/rbac.yaml",
        ],
    )
    .await
    .expect("CRD and RBAC");
    hold_leader_lease(&client).await;
    let dir = nmo_tests::repo_root().join(".cluster/test-logs");
    let certs_dir = dir.join(nmo_tests::unique("deployments-certs"));
    webhook_certs(&certs_dir);

    for overlay in ["base", "overlays/openshift"] {
        let args = ready(
            &client,
            &format!("nmo-controller of manifests/{overlay}"),
            Launch::new(overlay, "nmo-controller"),
        )
        .await;
        assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
        ready(
            &client,
            &format!("nmo-webhook of manifests/{overlay}"),
            Launch::new(overlay, "nmo-webhook").volume("cert", &certs_dir),
        )
        .await;
    }
    // Upstream's list replaces the manifest's: a drop-in keeps its Deployment.
    for name in ["nmo-controller", "nmo-webhook"] {
        let args = ready(
            &client,
            &format!("{name} with upstream's arguments"),
            Launch::new("base", name)
                .args(UPSTREAM_ARGS)
                .volume("cert", &certs_dir),
        )
        .await;
        assert_eq!(args.len(), UPSTREAM_ARGS.len(), "{args:?}");
    }
    // Nobody took the Lease from its holder: the controllers were standbys.
    let holder = until("the leader Lease", READY, || async {
        let l = Api::<Lease>::namespaced(client.clone(), "nmo-system")
            .get(LEADER_ELECTION_LEASE_NAME)
            .await?;
        Ok(Poll::Ready(l.spec.and_then(|s| s.holder_identity)))
    })
    .await
    .expect("lease");
    assert_eq!(holder.as_deref(), Some("nmo-tests-deployments"));
    let _ = Api::<Lease>::namespaced(client.clone(), "nmo-system")
        .delete(LEADER_ELECTION_LEASE_NAME, &DeleteParams::default())
        .await;
}
