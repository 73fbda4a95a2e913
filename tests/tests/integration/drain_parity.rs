//! Parity with upstream's drain and node changes, against a real API server:
//! kubectl drain's DaemonSet rules (a finished or orphaned DaemonSet pod
//! leaves the node, a live DaemonSet's pod stays) with upstream's
//! `evictionPods`/`totalpods` bookkeeping, and the taint patch's `test` guard
//! on a node that has no taints at all.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::MaintenancePhase;

use nmo_tests::controller_env::{
    ControllerEnv as Env, LONG, describe_pods, is_cordoned, node_taint_keys, running_on,
};

const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable:NoSchedule";
const DRAIN: &str = "medik8s.io/drain:NoSchedule";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_and_orphaned_daemonset_pods_leave_like_kubectl_drain() {
    let env = Env::new("nm-dsparity", 1).await;
    let bed = &env.bed;
    // DaemonSet "agent" exists but runs nowhere (its nodeSelector matches no
    // node): only its existence matters to the drain.
    let daemonsets: Api<DaemonSet> = Api::namespaced(env.client(), &bed.namespace);
    let agent: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {"nmo-test/nowhere": "true"},
                    "containers": [{"name": "c", "image": "registry.invalid/fake:1"}]
                }
            }
        }
    }))
    .expect("DaemonSet JSON");
    daemonsets
        .create(&PostParams::default(), &agent)
        .await
        .expect("DaemonSet agent");
    let target = bed
        .node("target", false)
        .await
        .expect("target node")
        .name_any();

    // Pods whose controller is a DaemonSet by kind and name (see the fixture):
    // of the live "agent" (one running, one to be finished), of a "gone" one.
    bed.daemonset_pod("ds-live", &target, "agent")
        .await
        .expect("pod of a live DaemonSet");
    bed.daemonset_pod("ds-done", &target, "agent")
        .await
        .expect("pod to finish");
    bed.daemonset_pod("ds-orphan", &target, "gone")
        .await
        .expect("orphaned DaemonSet pod");
    bed.bare_pod("bare", &target).await.expect("bare pod");
    env.wait_pods("ds-* and bare pods Ready on the target", |m| {
        running_on(m, &target, "ds-") == 3 && running_on(m, &target, "bare") == 1
    })
    .await;
    bed.finish_pod("ds-done").await.expect("ds-done finished");

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let nm = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let st = nm.status.clone().expect("status");
    // Upstream: totalpods = every pod of the node (field selector list);
    // evictionPods = the pods kubectl's drain filters let go.
    assert_eq!(
        st.total_pods, 4,
        "ds-live + ds-done + ds-orphan + bare: {st:?}"
    );
    assert_eq!(st.eviction_pods, 3, "ds-done + ds-orphan + bare: {st:?}");
    assert_eq!(st.drain_progress, 100, "{st:?}");
    assert!(st.pending_pods.is_empty(), "{st:?}");

    // The drain removed exactly those three; the live DaemonSet's pod stays.
    env.wait_pods("only ds-live left on the target", |m| {
        let left: Vec<String> = m
            .get(&target)
            .map(|v| {
                v.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| p.name_any())
                    .collect()
            })
            .unwrap_or_default();
        left == ["ds-live"]
    })
    .await;
    let by_node = bed.pods_by_node().await.expect("pods");
    assert_eq!(
        running_on(&by_node, &target, "ds-live"),
        1,
        "{}",
        describe_pods(&by_node)
    );

    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_without_taints_goes_into_maintenance_and_back_unchanged() {
    let env = Env::new("nm-notaint", 1).await;
    let bed = &env.bed;
    let target = bed
        .node_without_taints("bare-node")
        .await
        .expect("node without taints")
        .name_any();
    // A new node carries node.kubernetes.io/not-ready until kwok reports it
    // Ready and the node lifecycle controller lifts it, and that controller
    // adds beta.kubernetes.io/os: start from the node they are done with.
    let before = settled_without_taints(&env, &target).await;

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let during = env.nodes().get(&target).await.expect("node");
    assert_eq!(
        node_taint_keys(&during),
        [UNSCHEDULABLE, DRAIN],
        "exactly our two taints, in upstream's order"
    );
    assert!(is_cordoned(&during));

    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("NodeMaintenance deleted");
    env.wait_gone(&name).await;
    let after = until(
        &format!("node {target} as it was before the maintenance"),
        LONG,
        || async {
            let n = env.nodes().get(&target).await?;
            Ok(if same_node(&n, &before) {
                Poll::Ready(n)
            } else {
                Poll::Pending(format!(
                    "spec {}, labels {:?}; before: spec {}, labels {:?}",
                    serde_json::to_string(&n.spec)?,
                    n.metadata.labels,
                    serde_json::to_string(&before.spec)?,
                    before.metadata.labels
                ))
            })
        },
    )
    .await
    .expect("node restored");
    assert_eq!(after.spec, before.spec, "spec.taints absent again, not []");

    env.teardown().await;
}

/// The node once it is Ready with no taints at all (`spec.taints` absent).
async fn settled_without_taints(env: &Env, node: &str) -> Node {
    until(
        &format!("node {node} Ready without taints"),
        Duration::from_secs(30),
        || async {
            let n = env.nodes().get(node).await?;
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let taints = n.spec.as_ref().and_then(|s| s.taints.clone());
            let labels = n.labels();
            let beta_os = labels.get("beta.kubernetes.io/os").is_some()
                && labels.get("beta.kubernetes.io/os") == labels.get("kubernetes.io/os");
            Ok(if ready && taints.is_none() && beta_os {
                Poll::Ready(n)
            } else {
                Poll::Pending(format!(
                    "ready {ready}, taints {taints:?}, labels {:?}",
                    n.labels()
                ))
            })
        },
    )
    .await
    .expect("node settles")
}

/// What a maintenance touches is as it was: the spec (cordon, taints) and the labels.
fn same_node(a: &Node, b: &Node) -> bool {
    a.spec == b.spec && a.metadata.labels == b.metadata.labels
}
