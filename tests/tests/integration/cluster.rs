//! The local control plane is real: built version, kwok nodes Ready, the
//! scheduler, controller manager and kwok running workloads, and the
//! Eviction API honouring PodDisruptionBudgets.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{EvictParams, PostParams};
use kube::{Api, ResourceExt};
use nmo_tests::fixtures::{TestBed, is_ready};
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::NodeMaintenance;

const LONG: Duration = Duration::from_secs(60);

/// A client that gets a 429 as an answer (kube retries 429 by default).
async fn no_retry_client() -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(nmo_tests::kubeconfig_path()).expect("kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("client")
}

#[tokio::test]
async fn server_reports_the_built_version_and_default_nodes_are_ready() {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    let v = client.apiserver_version().await.expect("version");
    let versions =
        std::fs::read_to_string(nmo_tests::repo_root().join("tests/cluster/versions.env"))
            .expect("versions.env");
    let want = versions
        .lines()
        .find_map(|l| l.strip_prefix("K8S_VERSION="))
        .expect("K8S_VERSION line");
    assert_eq!(v.git_version, want, "server version is the one we built");

    let nodes: Api<Node> = Api::all(client);
    for name in ["cp-1", "cp-2", "cp-3", "worker-1", "worker-2", "worker-3"] {
        let n = nodes
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("node {name}: {e}"));
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        assert!(ready, "node {name} Ready");
        if name.starts_with("cp-") {
            assert!(
                shared::rules::nodes::is_control_plane(Some(n.labels())),
                "{name} is control plane"
            );
        }
    }
}

#[tokio::test]
async fn deployment_pods_are_scheduled_and_run_on_kwok_nodes() {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    let bed = TestBed::new(client, "cp-deploy").await.expect("namespace");
    bed.node("w1", false).await.expect("node");
    bed.node("w2", false).await.expect("node");
    bed.deployment("web", 3).await.expect("deployment");
    until(
        "3 Running, Ready web pods on the test's nodes",
        LONG,
        || async {
            let by_node = bed.pods_by_node().await?;
            let ready: usize = by_node
                .iter()
                .filter(|(n, _)| n.starts_with(&bed.group))
                .map(|(_, pods)| pods.iter().filter(|p| is_ready(p)).count())
                .sum();
            Ok(if ready == 3 {
                Poll::Ready(())
            } else {
                Poll::Pending(format!(
                    "{ready} ready; pods by node: {:?}",
                    by_node.keys().collect::<Vec<_>>()
                ))
            })
        },
    )
    .await
    .expect("deployment runs");
    bed.teardown().await;
}

#[tokio::test]
async fn eviction_honours_pod_disruption_budgets() {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    let bed = TestBed::new(client.clone(), "cp-evict")
        .await
        .expect("namespace");
    let node = bed.node("w1", false).await.expect("node").name_any();
    bed.bare_pod("guarded", &node).await.expect("pod");
    bed.pdb("guard", "guarded", 1).await.expect("pdb");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &bed.namespace);
    until("PDB computed with 0 disruptions allowed", LONG, || async {
        let st = pdbs.get("guard").await?.status.unwrap_or_default();
        Ok(if st.expected_pods == 1 && st.current_healthy == 1 {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{st:?}"))
        })
    })
    .await
    .expect("pdb status");

    let pods: Api<Pod> = Api::namespaced(no_retry_client().await, &bed.namespace);
    match pods.evict("guarded", &EvictParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "PDB refusal: {s:?}"),
        other => {
            panic!("eviction against a PDB allowing 0 disruptions must answer 429, got {other:?}")
        }
    }

    // Allow one disruption: the eviction goes through and the pod goes away.
    pdbs.patch(
        "guard",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"spec": {"minAvailable": 0}})),
    )
    .await
    .expect("relax pdb");
    until("eviction accepted", LONG, || async {
        Ok(match pods.evict("guarded", &EvictParams::default()).await {
            Ok(_) => Poll::Ready(()),
            Err(e) => Poll::Pending(e.to_string()),
        })
    })
    .await
    .expect("eviction succeeds once the PDB allows it");
    until("evicted pod gone", LONG, || async {
        Ok(match pods.get_opt("guarded").await? {
            None => Poll::Ready(()),
            Some(p) => Poll::Pending(format!(
                "still there, deleting since {:?}",
                p.metadata.deletion_timestamp
            )),
        })
    })
    .await
    .expect("pod removed");
    bed.teardown().await;
}

#[tokio::test]
async fn crd_applies_and_an_upstream_object_reads_back_unchanged() {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_controller_prereqs(&client)
        .await
        .expect("CRD");
    let name = nmo_tests::unique("upstream-sample");
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let spec = json!({"nodeName": "worker-1", "reason": "Replace a failed DIMM"});
    let obj: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": spec
    }))
    .expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("created");
    // A status exactly as upstream writes it.
    let status = json!({
        "phase": "Running", "drainProgress": 40, "lastUpdate": "2024-05-01T10:11:12Z",
        "lastError": "Cannot evict pod as it would violate the pod's disruption budget.",
        "pendingPods": ["web-1", "db-0"],
        "pendingPodsRefs": [{"namespace": "shop", "name": "web-1"}, {"namespace": "shop", "name": "db-0"}],
        "totalpods": 7, "evictionPods": 5, "errorOnLeaseCount": 1
    });
    api.patch_status(
        &name,
        &Default::default(),
        &kube::api::Patch::Merge(json!({"status": status})),
    )
    .await
    .expect("status written");
    let raw: serde_json::Value = client
        .request(http_get(&format!(
            "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances/{name}"
        )))
        .await
        .expect("raw read");
    assert_eq!(raw["spec"], spec, "spec stored unchanged");
    assert_eq!(raw["status"], status, "status stored unchanged");
    // Our type reads it and writes the same field names and values back.
    let typed: NodeMaintenance = serde_json::from_value(raw.clone()).expect("typed read");
    let back = serde_json::to_value(&typed).expect("serialize");
    assert_eq!(back["status"], status);
    assert_eq!(back["spec"], spec);
    // An empty nodeName is refused by the schema.
    let bad: NodeMaintenance = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-bad")}, "spec": {"nodeName": ""}
    }))
    .expect("object");
    let err = api
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("empty nodeName rejected");
    assert!(err.to_string().contains("nodeName"), "{err}");
    api.delete(&name, &Default::default())
        .await
        .expect("delete");
}

fn http_get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path).body(Vec::new()).expect("request")
}
