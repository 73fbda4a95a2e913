//! The opt-in drain deadline (beyond upstream): `spec.drainTimeout` with
//! `drainTimeoutAction` Fail (the node given back) or Force (the pods in the
//! way deleted without eviction, each named), through the real API server.
//! Without it a blocked drain waits forever, as upstream (controller.rs).
//! Force runs only where the cluster admin installed the force-drain
//! component (manifests/components/force-drain).

use kube::api::{Api, DeleteParams, PostParams};
use nmo_tests::controller_env::{
    ControllerEnv as Env, events_of, is_cordoned, node_taint_keys, pdb_in, pod_in, second_namespace,
};
use nmo_tests::fixtures::GROUP_KEY;
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

/// NodeMaintenance "a" on a node whose pod "guarded" a PDB holds (as
/// `Env::blocked_maintenance`), asking for `timeout` then `action`; the node
/// `<group>-target` is created unless `new_node` is false (already there).
async fn blocked_with_deadline(env: &Env, timeout: &str, action: &str, new_node: bool) -> String {
    let bed = &env.bed;
    let target = format!("{}-target", bed.group);
    if new_node {
        bed.node("target", false).await.expect("node");
    }
    bed.node("spare", false).await.expect("spare");
    bed.bare_pod("guarded", &target).await.expect("guarded pod");
    bed.pdb("guard", "guarded", 1).await.expect("pdb");
    bed.wait_pdb_status("guard", 1, nmo_tests::controller_env::LONG)
        .await
        .expect("pdb status");
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.n("a"), "labels": {GROUP_KEY: bed.group}},
        "spec": {"nodeName": target, "reason": "deadline test",
                 "drainTimeout": timeout, "drainTimeoutAction": action}
    }))
    .expect("nm json");
    env.nms()
        .create(&PostParams::default(), &nm)
        .await
        .expect("NodeMaintenance created");
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_fail_gives_the_node_back() {
    let env = Env::new("nm-deadline-fail", 1).await;
    let target = blocked_with_deadline(&env, "3s", "Fail", true).await;
    let name = env.n("a");
    let nm = env.wait_phase(&name, MaintenancePhase::Failed).await;
    let st = nm.status.expect("status");
    assert!(
        st.last_error.starts_with(
            "drain did not finish within 3s (spec.drainTimeout): 1 pods still on node"
        ) && st.last_error.contains("guarded"),
        "{}",
        st.last_error
    );
    let failed = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed")
        .expect("Failed condition");
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_str()),
        ("True", "DrainTimeout")
    );
    // Given back: no cordon, no taint of ours, no lease; the pod never deleted.
    until(
        "node given back and lease released",
        nmo_tests::controller_env::LONG,
        || async {
            let node = env.nodes().get(&target).await?;
            let lease = env.lease(&target).await;
            let taints = node_taint_keys(&node);
            Ok(
                if !is_cordoned(&node)
                    && !taints.iter().any(|t| t.starts_with("medik8s.io/drain"))
                    && lease.is_none()
                {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("taints {taints:?}, lease {}", lease.is_some()))
                },
            )
        },
    )
    .await
    .expect("node restored");
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client(), &env.bed.namespace);
    assert!(
        pods.get_opt("guarded").await.expect("read pod").is_some(),
        "Fail never deletes"
    );
    env.wait_event(&name, "FailedMaintenance").await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_force_deletes_what_blocks_and_names_it() {
    // Force is the cluster admin's to allow: the force-drain component.
    let env = Env::with_force_drain("nm-deadline-force", 1).await;
    // Blocked pods in two namespaces: "guarded" in the test's, "db" in a second.
    let second = second_namespace(&env).await;
    let target = format!("{}-target", env.bed.group);
    env.bed.node("target", false).await.expect("node");
    pod_in(&env, &second, "db", &target).await;
    pdb_in(&env, &second, "db-pdb", "db").await;
    blocked_with_deadline(&env, "3s", "Force", false).await;
    let name = env.n("a");
    let nm = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let st = nm.status.expect("status");
    let mut forced: Vec<String> = st
        .force_deleted_pods
        .iter()
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    forced.sort();
    let mut want = vec![
        format!("{}/guarded", env.bed.namespace),
        format!("{second}/db"),
    ];
    want.sort();
    assert_eq!(forced, want);
    let events = events_of(&env.client(), &name).await;
    let warned: Vec<_> = events.iter().filter(|e| e.1 == "PodForceDeleted").collect();
    assert_eq!(warned.len(), 2, "{events:?}");
    for w in &warned {
        assert_eq!(w.0, "Warning");
        assert!(w.2.contains("without eviction"), "{w:?}");
    }
    assert!(warned.iter().any(|w| w.2.contains("guarded")), "{warned:?}");
    assert!(
        warned.iter().any(|w| w.2.contains(&format!("{second}/db"))),
        "{warned:?}"
    );
    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(&name).await;
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client())
        .delete(&second, &DeleteParams::default())
        .await;
    env.teardown().await;
}

/// With the default manifests (no force-drain component) a maintenance
/// asking for Force that reaches the controller anyway (no webhook in front)
/// deletes nothing: at its deadline it fails as with Fail, naming how an
/// admin enables Force, and the PDB-protected pod stays. Before, the pod
/// was deleted within seconds by anyone allowed to create a NodeMaintenance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_without_the_admins_component_deletes_nothing() {
    let env = Env::new("nm-deadline-noforce", 1).await;
    let target = blocked_with_deadline(&env, "1s", "Force", true).await;
    let name = env.n("a");
    let nm = env.wait_phase(&name, MaintenancePhase::Failed).await;
    let st = nm.status.expect("status");
    assert!(
        st.last_error
            .starts_with("drain did not finish within 1s (spec.drainTimeout)")
            && st
                .last_error
                .contains("drainTimeoutAction Force is not enabled on this controller")
            && st.last_error.contains("manifests/components/force-drain"),
        "{}",
        st.last_error
    );
    assert!(st.force_deleted_pods.is_empty(), "{st:?}");
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client(), &env.bed.namespace)
        .get_opt("guarded")
        .await
        .expect("read the guarded pod")
        .expect("the PDB-protected pod is still there");
    assert!(
        pod.metadata.deletion_timestamp.is_none(),
        "not being deleted"
    );
    assert!(
        !events_of(&env.client(), &name)
            .await
            .iter()
            .any(|e| e.1 == "PodForceDeleted")
    );
    let node = env.nodes().get(&target).await.expect("node");
    assert!(!is_cordoned(&node), "node given back as with Fail");
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_is_not_a_go_duration_is_refused() {
    let env = Env::new("nm-deadline-bad", 1).await;
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.n("a"), "labels": {GROUP_KEY: env.bed.group}},
        "spec": {"nodeName": "whatever", "drainTimeout": "5 days"}
    }))
    .expect("nm json");
    let err = env
        .nms()
        .create(&PostParams::default(), &nm)
        .await
        .expect_err("the CRD refuses it");
    assert!(err.to_string().contains("drainTimeout"), "{err}");
    env.teardown().await;
}

/// A drainTimeout past Go's ~292 years that reached the controller anyway
/// (no webhook here, as when it is down or was bypassed): the controller
/// neither panics nor stops, that maintenance runs with no deadline and
/// another one goes on beside it. Before the fix the parser panicked and the
/// controller crash-looped on the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_deadline_crashes_nothing() {
    let mut env = Env::new("nm-deadline-huge", 0).await;
    let bed = &env.bed;
    let a = bed.node("a", false).await.expect("node a");
    let b = bed.node("b", false).await.expect("node b");
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.n("a"), "labels": {GROUP_KEY: bed.group}},
        "spec": {"nodeName": a.metadata.name, "drainTimeout": "9999999999999999999h",
                 "drainTimeoutAction": "Fail"}
    }))
    .expect("nm json");
    env.nms()
        .create(&PostParams::default(), &nm)
        .await
        .expect("the CRD's pattern admits it");
    env.create_nm(&env.n("b"), b.metadata.name.as_deref().unwrap_or_default())
        .await;
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    env.wait_phase(&env.n("b"), MaintenancePhase::Succeeded)
        .await;
    let ctrl = env.ctrl.as_mut().expect("controller");
    assert!(
        ctrl.proc.child.try_wait().expect("wait status").is_none(),
        "the controller is still running:\n{}",
        ctrl.proc.log_tail(30)
    );
    env.teardown().await;
}
