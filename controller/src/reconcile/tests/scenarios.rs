//! The reconcile's paths, pass by pass, against the fake API server: new →
//! running → drained → succeeded, blocked by a PDB, lease held by another
//! operator, node gone, deletion, and a refused node patch (failure).

use std::sync::Arc;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::fake::{self, FakeApi, LEASE_PATH, NM_PATH, NODE_PATH, PDB_BLOCKED};
use super::{fake_ctx, reconcile};
use crate::reconcile::{Ctx, Error};

/// A new NodeMaintenance of worker-1 (no finalizer yet).
pub(super) fn new_nm(api: &FakeApi) {
    api.put(
        NM_PATH,
        json!({"apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
            "metadata": {"name": "nm-1", "uid": "u-1", "generation": 1},
            "spec": {"nodeName": "worker-1", "reason": "test"}}),
    );
}

/// Mark the stored NodeMaintenance deleted (as `kubectl delete` does with a finalizer).
pub(super) fn mark_deleted(api: &FakeApi) {
    let mut nm = api.get(NM_PATH).unwrap_or_default();
    nm["metadata"]["deletionTimestamp"] = json!(super::TEST_NOW.to_string());
    nm["metadata"]["resourceVersion"] = Value::Null;
    api.put(NM_PATH, nm);
}

/// One pass on the object as stored now.
pub(super) async fn pass(api: &FakeApi, ctx: &Arc<Ctx>) -> Result<Action, Error> {
    reconcile(Arc::new(api.nm()), ctx.clone()).await
}

fn calls(api: &FakeApi) -> Vec<String> {
    api.calls()
}

pub(super) fn phase(api: &FakeApi) -> Value {
    api.status()["phase"].clone()
}

pub(super) fn node_unschedulable(api: &FakeApi) -> bool {
    api.get(NODE_PATH)
        .is_some_and(|n| n["spec"]["unschedulable"] == true)
}

/// Two pods on worker-1; `blocked` makes the second one's PDB refuse.
pub(super) fn pods(api: &FakeApi, blocked: bool) {
    api.put(
        &fake::pod_path("shop", "web-a"),
        fake::pod("shop", "web-a", "worker-1", json!({})),
    );
    let labels = if blocked {
        json!({PDB_BLOCKED.0: PDB_BLOCKED.1})
    } else {
        json!({})
    };
    api.put(
        &fake::pod_path("shop", "web-b"),
        fake::pod("shop", "web-b", "worker-1", labels),
    );
}

/// A NodeMaintenance taken through its first pass: the finalizer (with
/// the Node owner reference); the next pass is its first sight.
pub(super) async fn started(api: &FakeApi, ctx: &Arc<Ctx>) {
    new_nm(api);
    assert_eq!(
        pass(api, ctx).await.expect("finalizer pass"),
        Action::await_change()
    );
    api.calls();
    api.events();
}

#[tokio::test]
async fn new_running_drained_succeeded() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let ctx = fake_ctx(&api).await;
    new_nm(&api);
    the_finalizer_and_owner_come_first(&api, &ctx).await;
    first_sight_takes_the_node_and_evicts(&api, &ctx).await;
    an_empty_list_is_success(&api, &ctx).await;
}

/// Pass 1: the node read once, the finalizer and the Node owner reference
/// in one write, and BeginMaintenance.
async fn the_finalizer_and_owner_come_first(api: &FakeApi, ctx: &Arc<Ctx>) {
    assert_eq!(
        pass(api, ctx).await.expect("pass 1"),
        Action::await_change()
    );
    assert_eq!(
        calls(api),
        [
            format!("GET {NODE_PATH}"),
            format!("PATCH {NM_PATH}"),
            "POST /api/v1/namespaces/default/events".into()
        ]
    );
    assert_eq!(api.events(), [("Normal".into(), "BeginMaintenance".into())]);
    let nm = api.nm();
    assert!(nm.metadata.finalizers.is_some_and(|f| f.len() == 1));
    assert!(
        nm.metadata
            .owner_references
            .is_some_and(|r| r.len() == 1 && r[0].kind == "Node"),
        "the owner reference went with the finalizer"
    );
}

/// Pass 2 (first sight): the lease and the pods listed side by side, the
/// node into maintenance, upstream's starting point written, then the
/// evictions from that list (no second list, no second status write).
async fn first_sight_takes_the_node_and_evicts(api: &FakeApi, ctx: &Arc<Ctx>) {
    let action = pass(api, ctx).await.expect("pass 2");
    assert_eq!(
        action,
        Action::requeue(ctx.blocked_retry),
        "the node's pod watch starts from this round's list: the last departure wakes the \
         maintenance, the poll is the backstop"
    );
    assert_eq!(
        calls(api),
        [
            "POST /apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases".into(),
            "GET /api/v1/pods".into(),
            format!("PATCH {NODE_PATH}"),
            format!("PATCH {NM_PATH}/status"),
            "POST /api/v1/namespaces/shop/pods/web-a/eviction".into(),
            "POST /api/v1/namespaces/shop/pods/web-b/eviction".into(),
        ]
    );
    assert!(node_unschedulable(api));
    let st = api.status();
    assert_eq!(
        (
            st["phase"].clone(),
            st["totalpods"].clone(),
            st["evictionPods"].clone()
        ),
        (json!("Running"), json!(2), json!(2))
    );
    assert_eq!(
        st["pendingPods"],
        json!(["web-a", "web-b"]),
        "evicted pods are pending until a list no longer has them"
    );
}

/// Pass 3: the list (beside the lease, which the unmoved test clock keeps
/// without a renewal) is empty: Succeeded, SucceedMaintenance.
async fn an_empty_list_is_success(api: &FakeApi, ctx: &Arc<Ctx>) {
    let action = pass(api, ctx).await.expect("pass 3");
    assert_eq!(action, Action::requeue(crate::plan::REQUEUE_HOLD));
    assert_eq!(
        calls(api),
        [
            "GET /api/v1/pods".into(),
            format!("PATCH {NM_PATH}/status"),
            "POST /api/v1/namespaces/default/events".into(),
        ]
    );
    let st = api.status();
    assert_eq!(
        (st["phase"].clone(), st["drainProgress"].clone()),
        (json!("Succeeded"), json!(100))
    );
    assert_eq!(
        fake::condition(&st, "Drained").map(|c| c.0),
        Some("True".into())
    );
    assert!(
        api.events()
            .contains(&("Normal".into(), "SucceedMaintenance".into()))
    );
}

#[tokio::test]
async fn a_pdb_blocks_the_drain_and_is_named() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, true);
    let ctx = fake_ctx(&api).await;
    started(&api, &ctx).await;

    let action = pass(&api, &ctx).await.expect("blocked pass");
    assert_eq!(action, Action::requeue(ctx.blocked_retry));
    let st = api.status();
    let last_error = st["lastError"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("shop/web-b: eviction blocked by a PodDisruptionBudget"),
        "{last_error}"
    );
    // web-a's eviction was accepted: pending until a list no longer has it.
    assert_eq!(st["pendingPods"], json!(["web-a", "web-b"]));
    assert_eq!(
        fake::condition(&st, "Blocked").map(|c| c.1),
        Some("EvictionBlocked".into())
    );
    assert!(
        api.events()
            .contains(&("Warning".into(), "DrainBlocked".into()))
    );

    // The next blocked pass refreshes lastUpdate but says DrainBlocked once.
    api.calls();
    pass(&api, &ctx).await.expect("again");
    assert_eq!(api.status()["pendingPods"], json!(["web-b"]));
    assert!(!api.events().iter().any(|e| e.1 == "DrainBlocked"));
}

#[tokio::test]
async fn a_lease_held_by_another_operator_is_waited_for() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let now = super::TEST_NOW;
    api.put(
        LEASE_PATH,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "node-worker-1", "namespace": "medik8s-leases"},
            "spec": {"holderIdentity": "NodeHealthCheck", "leaseDurationSeconds": 3600,
                "acquireTime": now.to_string(), "renewTime": now.to_string()}}),
    );
    let ctx = fake_ctx(&api).await;
    started(&api, &ctx).await;

    let action = pass(&api, &ctx).await.expect("waiting pass");
    assert_eq!(action, Action::requeue(ctx.blocked_retry));
    assert_eq!(
        calls(&api),
        [
            "POST /apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases".into(),
            "GET /api/v1/pods".into(),
            format!("GET {LEASE_PATH}"),
            format!("PATCH {NM_PATH}/status")
        ],
        "the create finds the lease there: read and judged"
    );
    let st = api.status();
    assert_eq!(
        (st["phase"].clone(), st["evictionPods"].clone()),
        (json!("Running"), json!(2)),
        "upstream's starting point stands while the lease is waited for"
    );
    assert_eq!(
        st["lastError"],
        shared::api::consts::msg_lease_held_by_other("NodeHealthCheck")
    );
    assert_eq!(
        st["errorOnLeaseCount"],
        json!(null),
        "waited for, not counted"
    );
    assert!(!node_unschedulable(&api), "the node is not touched");
}

#[tokio::test]
async fn a_node_that_is_gone_fails_the_maintenance() {
    let api = FakeApi::start();
    let ctx = fake_ctx(&api).await;
    new_nm(&api);
    pass(&api, &ctx).await.expect("finalizer");
    api.calls();
    api.events();

    assert_eq!(
        pass(&api, &ctx).await.expect("node gone"),
        Action::await_change()
    );
    assert_eq!(
        calls(&api),
        [
            format!("GET {NODE_PATH}"),
            format!("PATCH {NM_PATH}/status"),
            "POST /api/v1/namespaces/default/events".into()
        ]
    );
    let st = api.status();
    assert_eq!(
        (st["phase"].clone(), st["lastError"].clone()),
        (json!("Failed"), json!("nodes \"worker-1\" not found"))
    );
    assert_eq!(
        fake::condition(&st, "Failed").map(|c| c.1),
        Some("NodeNotFound".into())
    );
    assert_eq!(
        api.events(),
        [("Warning".into(), "FailedMaintenance".into())]
    );

    // Failed is final: nothing more is read or written.
    pass(&api, &ctx).await.expect("final");
    assert_eq!(calls(&api), Vec::<String>::new());
}

#[tokio::test]
async fn deletion_gives_the_node_back_then_removes_the_finalizer() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    let ctx = fake_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("drained");
    assert!(node_unschedulable(&api));
    assert!(api.get(LEASE_PATH).is_some());
    mark_deleted(&api);
    api.calls();
    api.events();

    assert_eq!(
        pass(&api, &ctx).await.expect("cleanup"),
        Action::await_change()
    );
    let seen = calls(&api);
    let event = "POST /api/v1/namespaces/default/events".to_string();
    assert_eq!(
        seen[..2],
        [
            // The copy handed in is newer than our last write: read live;
            // then the cleanup checks the live object is still due.
            format!("GET {NM_PATH}"),
            format!("GET {NM_PATH}"),
        ]
    );
    // The node patch (then UncordonNode) and the lease release go side by
    // side; our last write of the lease is the precondition: no read.
    let mut beside = seen[2..5].to_vec();
    beside.sort();
    let mut want = vec![
        format!("PATCH {NODE_PATH}"),
        event.clone(),
        format!("DELETE {LEASE_PATH}"),
    ];
    want.sort();
    assert_eq!(beside, want, "{seen:?}");
    let at = |c: &str| seen.iter().position(|s| s == c);
    assert!(
        at(&format!("PATCH {NODE_PATH}")) < at(&event),
        "UncordonNode after the patch: {seen:?}"
    );
    assert_eq!(
        seen[5..],
        [format!("PATCH {NM_PATH}"), event.clone()],
        "the finalizer last: {seen:?}"
    );
    assert!(!node_unschedulable(&api), "the node is given back");
    assert!(api.get(LEASE_PATH).is_none(), "the lease is released");
    assert_eq!(
        api.nm().metadata.finalizers.unwrap_or_default(),
        Vec::<String>::new()
    );
    let reasons: Vec<String> = api.events().into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["UncordonNode", "RemovedMaintenance"]);
}

#[tokio::test]
async fn a_refused_node_patch_is_recorded_and_retried() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    let ctx = fake_ctx(&api).await;
    started(&api, &ctx).await;
    api.refuse_node_patches(
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"nodes \"worker-1\" is forbidden: ValidatingAdmissionPolicy 'freeze' with binding 'freeze' denied request: frozen","reason":"Invalid","details":{"causes":[{"message":"frozen"}]},"code":422}"#,
    );

    let err = pass(&api, &ctx).await.expect_err("refused");
    assert!(matches!(err, Error::NodeRefused { .. }), "{err:?}");
    let st = api.status();
    let last_error = st["lastError"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("ValidatingAdmissionPolicy 'freeze'"),
        "{last_error}"
    );
    assert_eq!(
        fake::condition(&st, "Blocked").map(|c| c.1),
        Some("NodeUpdateRefused".into())
    );
    assert_eq!(
        api.events(),
        [("Warning".into(), "NodeUpdateRefused".into())]
    );
    assert_eq!(phase(&api), "Running", "retried, not failed");
}

/// A person uncordons the node of a Succeeded maintenance: the pass puts
/// nothing back and drains nothing (no node patch, no pod list), marks
/// Cordoned False/ChangedByHand and says so once; while draining the cordon
/// is re-asserted instead (the first passes above).
#[tokio::test]
async fn a_finished_maintenance_leaves_a_node_changed_by_hand_alone() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    let ctx = fake_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("first sight");
    pass(&api, &ctx).await.expect("the drain round");
    assert_eq!(phase(&api), "Succeeded", "no pods: drained at once");
    api.calls();
    api.events();
    // kubectl uncordon worker-1 (kube-controller-manager then drops the unschedulable taint).
    let mut node = api.get(NODE_PATH).unwrap_or_default();
    node["spec"]["unschedulable"] = json!(false);
    node["spec"]["taints"] = json!([{"key": "medik8s.io/drain", "effect": "NoSchedule"}]);
    node["metadata"]["resourceVersion"] = json!("900");
    api.put(NODE_PATH, node.clone());
    // The node watch delivers the change to the controller's node cache.
    let view: shared::kube::partial::NodeView =
        serde_json::from_value(node).expect("the node as watched");
    ctx.node_cache
        .observe(&kube::runtime::watcher::Event::Apply(view));
    let action = pass(&api, &ctx).await.expect("the pass after the uncordon");
    assert_eq!(action, Action::requeue(crate::plan::REQUEUE_HOLD));
    let made = calls(&api);
    assert!(
        !made
            .iter()
            .any(|c| c == &format!("PATCH {NODE_PATH}") || c.starts_with("GET /api/v1/pods")),
        "nothing put back, nothing drained: {made:?}"
    );
    assert!(!node_unschedulable(&api), "left uncordoned");
    let st = api.status();
    assert_eq!(st["phase"], "Succeeded");
    assert_eq!(
        fake::condition(&st, "Cordoned"),
        Some(("False".into(), "ChangedByHand".into()))
    );
    assert_eq!(
        api.events(),
        [("Warning".into(), "NodeChangedByHand".into())]
    );
    // Another pass with nothing new: no second event.
    pass(&api, &ctx).await.expect("a later pass");
    assert_eq!(api.events(), Vec::<(String, String)>::new(), "said once");
}
