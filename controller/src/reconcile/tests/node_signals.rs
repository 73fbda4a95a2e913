//! What a maintenance says on its node (KEP-5683 lifecycle conditions),
//! and upstream's latest fixes, pass by pass against the fake API server:
//! no re-cordon once the finalizer is gone (upstream #163), lease errors
//! after draining started stop the maintenance (upstream #158).

use std::sync::Arc;

use serde_json::{Value, json};

use super::fake::{self, FakeApi, LEASE_PATH, NM_PATH, NODE_PATH, node_condition};
use super::fake_ctx_with;
use super::scenarios::{mark_deleted, new_nm, node_unschedulable, pass, phase, pods, started};
use crate::plan::node_conditions::{
    DRAIN_IN_PROGRESS, DRAINED, MAINTENANCE_IN_PROGRESS, MAINTENANCE_PLANNED,
};
use crate::reconcile::Ctx;

/// The four conditions on the node as (Planned, InProgress, DrainInProgress, Drained).
fn says(api: &FakeApi) -> [Option<String>; 4] {
    let node = api.get(NODE_PATH).unwrap_or(Value::Null);
    [
        MAINTENANCE_PLANNED,
        MAINTENANCE_IN_PROGRESS,
        DRAIN_IN_PROGRESS,
        DRAINED,
    ]
    .map(|t| node_condition(&node, t))
}

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

/// A node with the kubelet's Ready condition, which must stay as it is.
fn node_with_ready(api: &FakeApi) {
    let mut node = fake::node("worker-1");
    node["status"] = json!({"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "kubelet is posting ready status"}]});
    api.put(NODE_PATH, node);
}

async fn conditions_ctx(api: &FakeApi) -> Arc<Ctx> {
    fake_ctx_with(api, &[]).await
}

#[tokio::test]
async fn node_conditions_follow_the_maintenance_and_clear() {
    let api = FakeApi::start();
    node_with_ready(&api);
    pods(&api, false);
    let ctx = conditions_ctx(&api).await;
    new_nm(&api);
    pass(&api, &ctx).await.expect("finalizer");
    assert_eq!(
        says(&api),
        [None, None, None, None],
        "nothing before the first sight"
    );
    api.calls();
    pass(&api, &ctx)
        .await
        .expect("first sight: the first round");
    assert_eq!(says(&api), [s("False"), s("True"), s("True"), s("False")]);
    let calls = api.calls();
    assert!(
        calls.ends_with(&[format!("PATCH {NODE_PATH}/status")])
            && !calls.contains(&format!("GET {NODE_PATH}")),
        "one patch of nodes/status after the status write, computed from the node read \
         when the finalizer was added: {calls:?}"
    );
    pass(&api, &ctx).await.expect("drained");
    assert_eq!(phase(&api), "Succeeded");
    assert_eq!(says(&api), [s("False"), s("True"), s("False"), s("True")]);
    let node = api.get(NODE_PATH).unwrap_or_default();
    let drained = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == DRAINED).cloned())
        .unwrap_or_default();
    assert_eq!(drained["reason"], "NodeMaintenanceDrained");
    assert!(
        drained["message"]
            .as_str()
            .is_some_and(|m| m.contains("nm-1")),
        "{drained}"
    );

    // Another pass in the same stage writes nothing to the node.
    api.calls();
    pass(&api, &ctx).await.expect("hold");
    assert!(
        !api.calls().iter().any(|c| c.contains("/nodes/")),
        "same stage: no node request"
    );

    mark_deleted(&api);
    pass(&api, &ctx).await.expect("cleanup");
    assert_eq!(says(&api), [s("False"), s("False"), s("False"), s("False")]);
    assert_eq!(
        node_condition(&api.get(NODE_PATH).unwrap_or_default(), "Ready"),
        s("True"),
        "the kubelet's condition is left alone"
    );
    assert_eq!(ctx.node_signals.len(), 0, "nothing kept once given back");
}

#[tokio::test]
async fn a_refused_condition_write_never_holds_the_maintenance_back() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    api.forbid_node_status();
    let ctx = conditions_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx)
        .await
        .expect("first sight: the first round");
    pass(&api, &ctx).await.expect("drained");
    assert_eq!(phase(&api), "Succeeded", "the maintenance went on");
    assert!(node_unschedulable(&api));
    assert_eq!(says(&api), [None, None, None, None]);
    let mut text = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&ctx.metrics.registry.gather(), &mut text)
        .expect("encode");
    assert!(
        text.contains(r#"nmo_node_condition_write_errors_total{node="worker-1"} 2"#),
        "the first round and drained each counted:\n{text}"
    );
}

#[tokio::test]
async fn no_node_condition_when_turned_off() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    let ctx = fake_ctx_with(&api, &["--node-lifecycle-conditions=false"]).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("first sight");
    pass(&api, &ctx).await.expect("drained");
    assert_eq!(phase(&api), "Succeeded");
    assert_eq!(says(&api), [None, None, None, None]);
}

/// Upstream #163: once our finalizer is gone, a deleting NodeMaintenance
/// (kept by someone else's finalizer) never touches its node again.
#[tokio::test]
async fn no_recordon_once_the_finalizer_is_gone() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    let ctx = conditions_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("drained");
    mark_deleted(&api);
    pass(&api, &ctx).await.expect("cleanup");
    assert!(!node_unschedulable(&api), "given back");
    // Someone else's finalizer keeps the object; ours is gone.
    let mut nm = api.get(NM_PATH).unwrap_or_default();
    nm["metadata"]["finalizers"] = json!(["example.com/blocker"]);
    nm["metadata"]["resourceVersion"] = Value::Null;
    api.put(NM_PATH, nm);
    api.calls();
    for _ in 0..3 {
        pass(&api, &ctx).await.expect("pass after the finalizer");
    }
    let writes: Vec<String> = api
        .calls()
        .into_iter()
        .filter(|c| !c.starts_with("GET "))
        .collect();
    assert_eq!(writes, Vec::<String>::new(), "nothing written");
    assert!(!node_unschedulable(&api), "not cordoned again");
    assert!(api.get(LEASE_PATH).is_none(), "no lease taken again");
}

/// Upstream #158: lease errors after draining started are counted, and
/// past three the maintenance fails and gives the node back.
#[tokio::test]
async fn lease_errors_mid_drain_stop_the_maintenance() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, true);
    let ctx = conditions_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("blocked round");
    pass(&api, &ctx).await.expect("web-a gone");
    assert_eq!(api.status()["drainProgress"], 50, "draining started");
    let now = super::TEST_NOW;
    api.put(
        LEASE_PATH,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-worker-1", "namespace": "medik8s-leases"},
            "spec": {"holderIdentity": "NodeHealthCheck", "leaseDurationSeconds": 3600,
                "acquireTime": now.to_string(), "renewTime": now.to_string()}}),
    );
    for count in 1..=3 {
        // Time goes on: our lease is due for renewal (and so found taken).
        ctx.clock
            .advance(k8s_openapi::jiff::SignedDuration::from_secs(1));
        pass(&api, &ctx).await.expect("lease error");
        let st = api.status();
        assert_eq!(st["errorOnLeaseCount"], count, "{st}");
        assert_eq!(st["phase"], "Running", "{st}");
        assert!(
            node_unschedulable(&api),
            "still in maintenance after {count}"
        );
    }
    pass(&api, &ctx).await.expect("fourth lease error");
    let st = api.status();
    assert_eq!(st["phase"], "Failed", "{st}");
    assert_eq!(
        st["lastError"],
        "maintenance failed: lease could not be extended after 4 attempts"
    );
    assert!(!node_unschedulable(&api), "the node is given back");
    assert_eq!(says(&api)[1], s("False"), "MaintenanceInProgress cleared");
    assert!(
        api.get(LEASE_PATH).is_some(),
        "the other operator's lease is left alone"
    );
}

/// The node deleted under its maintenance: the cleanup's last condition
/// write finds it gone (404), which leaves nothing kept for it.
#[tokio::test]
async fn a_node_deleted_under_its_maintenance_leaves_nothing_kept() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    let ctx = conditions_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("first sight");
    assert_eq!(ctx.node_signals.len(), 1, "the node's conditions are known");
    api.remove(NODE_PATH);
    mark_deleted(&api);
    // The cached node is patched first (404): the next cleanup reads it gone.
    let _ = pass(&api, &ctx).await;
    pass(&api, &ctx)
        .await
        .expect("cleanup of a node that is gone");
    assert!(
        api.nm().metadata.finalizers.unwrap_or_default().is_empty(),
        "the finalizer is removed"
    );
    assert_eq!(
        ctx.node_signals.len(),
        0,
        "nothing kept for a node that is gone"
    );
}
