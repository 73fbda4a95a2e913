//! What a maintenance says on its Node and gives back, against the real API
//! server: the KEP-5683 node lifecycle conditions (set and cleared, merged
//! by type beside the kubelet's and someone else's, surviving a heartbeat),
//! a cordon from before the maintenance kept through it and a controller
//! restart, and upstream's #163 (no re-cordon once the finalizer is gone).

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use nmo_tests::controller_env::{ControllerEnv as Env, LONG, is_cordoned, node_taint_keys};
use nmo_tests::wait::{Poll, stays, until};
use serde_json::json;
use shared::MaintenancePhase;

const PLANNED: &str = "MaintenancePlanned";
const IN_PROGRESS: &str = "MaintenanceInProgress";
const DRAINING: &str = "DrainInProgress";
const DRAINED: &str = "Drained";
const ANNOTATION: &str = "nodemaintenance.medik8s.io/cordoned-before";
const EXCLUDE: &str = "remediation.medik8s.io/exclude-from-remediation";

/// (type, status, reason) of every condition of the node, sorted by type.
fn conditions(node: &Node) -> Vec<(String, String, String)> {
    let mut v: Vec<_> = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason.unwrap_or_default()))
        .collect();
    v.sort();
    v
}

fn status_of(node: &Node, type_: &str) -> Option<String> {
    conditions(node)
        .into_iter()
        .find(|c| c.0 == type_)
        .map(|c| c.1)
}

/// Wait until node `name`'s four conditions read `want` (None: absent).
async fn wait_says(env: &Env, name: &str, want: [Option<&str>; 4]) -> Node {
    let nodes = env.nodes();
    until(
        &format!("node {name} lifecycle conditions {want:?}"),
        LONG,
        || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(name).await?;
                let says = [PLANNED, IN_PROGRESS, DRAINING, DRAINED].map(|t| status_of(&node, t));
                Ok(
                    if says.iter().map(Option::as_deref).eq(want.iter().copied()) {
                        Poll::Ready(node)
                    } else {
                        Poll::Pending(format!("{:?}", conditions(&node)))
                    },
                )
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", nmo_tests::component_log_tails(10)))
}

/// Patch the node's status conditions as a kubelet does (strategic merge,
/// by type): `conditions` of its own types.
async fn status_patch(env: &Env, node: &str, conditions: serde_json::Value) {
    env.nodes()
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": conditions}})),
        )
        .await
        .expect("node status patched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_conditions_appear_and_clear_merged_by_type() {
    let env = Env::new("nm-cond", 1).await;
    let first = env.target().await;
    let second = env
        .bed
        .node("second", false)
        .await
        .expect("node")
        .name_any();
    // Someone else's Drained (a fleet tool): never ours to change.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    status_patch(
        &env,
        &second,
        json!([{"type": DRAINED, "status": "False",
        "reason": "FleetTool", "message": "not drained by the fleet tool",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]),
    )
    .await;

    env.create_nm(&env.n("a"), &first).await;
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    let node = wait_says(
        &env,
        &first,
        [Some("False"), Some("True"), Some("False"), Some("True")],
    )
    .await;
    assert_eq!(
        status_of(&node, "Ready").as_deref(),
        Some("True"),
        "kwok's Ready stays"
    );
    let drained = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == DRAINED).cloned())
        .expect("Drained");
    assert_eq!(drained.reason.as_deref(), Some("NodeMaintenanceDrained"));
    assert!(
        drained
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&env.n("a"))),
        "{drained:?}"
    );

    // One slot: the second waits, and its node says it is planned.
    env.create_nm(&env.n("b"), &second).await;
    env.wait_phase(&env.n("b"), MaintenancePhase::Pending).await;
    wait_says(&env, &second, [Some("True"), None, None, Some("False")]).await;

    // A heartbeat as the kubelet sends it (its own types, merged) keeps ours.
    let beat = k8s_openapi::jiff::Timestamp::now().to_string();
    status_patch(
        &env,
        &first,
        json!([{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "kubelet is posting ready status",
        "lastHeartbeatTime": beat}]),
    )
    .await;
    let node = env.nodes().get(&first).await.expect("node");
    assert_eq!(
        status_of(&node, IN_PROGRESS).as_deref(),
        Some("True"),
        "{:?}",
        conditions(&node)
    );
    assert_eq!(
        status_of(&node, DRAINED).as_deref(),
        Some("True"),
        "{:?}",
        conditions(&node)
    );

    env.nms()
        .delete(&env.n("a"), &DeleteParams::default())
        .await
        .expect("delete a");
    env.wait_gone(&env.n("a")).await;
    wait_says(
        &env,
        &first,
        [Some("False"), Some("False"), Some("False"), Some("False")],
    )
    .await;
    env.wait_phase(&env.n("b"), MaintenancePhase::Succeeded)
        .await;
    let node = wait_says(
        &env,
        &second,
        [Some("False"), Some("True"), Some("False"), Some("False")],
    )
    .await;
    assert!(
        conditions(&node).contains(&(DRAINED.into(), "False".into(), "FleetTool".into())),
        "someone else's Drained is left alone: {:?}",
        conditions(&node)
    );
    env.nms()
        .delete(&env.n("b"), &DeleteParams::default())
        .await
        .expect("delete b");
    env.wait_gone(&env.n("b")).await;
    let node = wait_says(
        &env,
        &second,
        [Some("False"), Some("False"), Some("False"), Some("False")],
    )
    .await;
    assert!(conditions(&node).contains(&(DRAINED.into(), "False".into(), "FleetTool".into())));
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_conditions_can_be_turned_off() {
    let mut env = Env::new("nm-cond-off", 1).await;
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    env.ctrl = Some(
        env.spawn_controller(&["--node-lifecycle-conditions=false".into()])
            .await,
    );
    let target = env.node_in_maintenance().await;
    let node = env.nodes().get(&target).await.expect("node");
    for t in [PLANNED, IN_PROGRESS, DRAINING, DRAINED] {
        assert_eq!(status_of(&node, t), None, "{t}: {:?}", conditions(&node));
    }
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prior_cordon_survives_the_maintenance_and_a_restart() {
    let mut env = Env::new("nm-prior", 1).await;
    let target = env
        .bed
        .node("target", true)
        .await
        .expect("cordoned node")
        .name_any();
    // A value Node Health Check would not skip: the maintenance makes it "true".
    env.nodes()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {EXCLUDE: "false"}}})),
        )
        .await
        .expect("label");
    env.create_nm(&env.n("a"), &target).await;
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    let during = env.nodes().get(&target).await.expect("node");
    assert_eq!(
        during.annotations().get(ANNOTATION).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        during.labels().get(EXCLUDE).map(String::as_str),
        Some("true"),
        "exactly \"true\""
    );
    env.wait_event(&env.n("a"), "NodeWasCordoned").await;

    // A restart mid-maintenance: the fact is on the node, not in memory.
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    env.start_controller().await;
    env.nms()
        .delete(&env.n("a"), &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(&env.n("a")).await;
    let after = env.nodes().get(&target).await.expect("node");
    assert!(
        is_cordoned(&after),
        "still unschedulable, as before the maintenance"
    );
    let taints = node_taint_keys(&after);
    assert!(
        !taints.contains(&"medik8s.io/drain:NoSchedule".to_string()),
        "{taints:?}"
    );
    assert!(!after.annotations().contains_key(ANNOTATION));
    assert!(
        !after.labels().contains_key(EXCLUDE),
        "{:?}",
        after.labels()
    );
    env.wait_event(&target, "CordonKept").await;
    assert!(
        !env.event_reasons(&target)
            .await
            .contains(&"UncordonNode".to_string())
    );
    env.teardown().await;
}

/// Upstream #163: a deleting NodeMaintenance held by someone else's
/// finalizer, ours gone, never cordons its node again, however often it is
/// reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_recordon_once_the_finalizer_is_gone() {
    let env = Env::new("nm-163", 1).await;
    let target = env.node_in_maintenance().await;
    let name = env.n("a");
    env.nms()
        .patch(&name, &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["foregroundDeleteNodeMaintenance", "example.com/blocker"]}})))
        .await
        .expect("blocker finalizer");
    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_nm(&name, "our finalizer removed, the blocker's kept", |nm| {
        nm.finalizers() == ["example.com/blocker"]
    })
    .await;
    let nodes = env.nodes();
    let given_back = || {
        let nodes = nodes.clone();
        let target = target.clone();
        async move {
            let n = nodes.get(&target).await.map_err(|e| e.to_string())?;
            let taints = node_taint_keys(&n);
            if is_cordoned(&n) || taints.iter().any(|t| t.starts_with("medik8s.io/drain")) {
                Err(format!("cordoned again: taints {taints:?}"))
            } else {
                Ok(())
            }
        }
    };
    given_back().await.expect("given back");
    // Every change of the object reaches the controller: touch it a few times.
    for i in 0..3 {
        env.nms()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"nmo-test/touch": i.to_string()}}}),
                ),
            )
            .await
            .expect("touch");
    }
    stays(
        "the node stays given back",
        Duration::from_secs(5),
        given_back,
    )
    .await;
    assert!(env.lease(&target).await.is_none(), "no lease taken again");
    env.nms()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": []}})),
        )
        .await
        .expect("blocker removed");
    env.wait_gone(&name).await;
    env.teardown().await;
}
