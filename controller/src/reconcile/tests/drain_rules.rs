//! Drain rules through a reconcile against the fake API server: a pod
//! label keeps a pod, a NodeDrainRule waits for a pod until it completes
//! (Blocked: WaitingForCompletion, DrainWaitingForCompletion), and order
//! groups leave one after the other.

use serde_json::{Value, json};
use shared::api::drain_rule::NodeDrainRule;

use super::fake::{self, FakeApi, NM_PATH, NODE_PATH};
use super::scenarios::{pass, started};
use super::{fake_ctx, fake_ctx_ruled};
use crate::drain::DrainRules;

const DRAIN_LABEL: &str = shared::rules::drain::DRAIN_LABEL;

fn put_pod(api: &FakeApi, name: &str, labels: Value) {
    api.put(
        &fake::pod_path("shop", name),
        fake::pod("shop", name, "worker-1", labels),
    );
}

fn evictions(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.ends_with("/eviction"))
        .map(|c| {
            c.trim_end_matches("/eviction")
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn rule(name: &str, spec: Value) -> NodeDrainRule {
    serde_json::from_value(json!({"apiVersion": "nodemaintenance.medik8s.io/v1alpha1",
        "kind": "NodeDrainRule", "metadata": {"name": name}, "spec": spec}))
    .expect("a NodeDrainRule")
}

#[tokio::test]
async fn the_skip_label_keeps_a_pod_through_a_succeeded_drain() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    put_pod(&api, "web", json!({}));
    put_pod(&api, "fluent", json!({DRAIN_LABEL: "skip"}));
    let ctx = fake_ctx(&api).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("first sight");
    assert_eq!(
        evictions(&api.calls()),
        ["web"],
        "the kept pod got no eviction"
    );
    let st = api.status();
    assert_eq!(
        (st["totalpods"].clone(), st["evictionPods"].clone()),
        (json!(2), json!(1))
    );
    pass(&api, &ctx).await.expect("drained");
    assert_eq!(api.status()["phase"], json!("Succeeded"));
    assert!(
        api.get(&fake::pod_path("shop", "fluent")).is_some(),
        "the kept pod is still there"
    );
}

#[tokio::test]
async fn a_rule_waits_for_a_pod_to_complete_and_names_it() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    put_pod(&api, "web", json!({}));
    put_pod(&api, "train", json!({"app": "train"}));
    let rules = DrainRules::fixed(
        vec![rule(
            "jobs-finish",
            json!({"drain": {"behavior": "WaitCompleted"},
            "pods": [{"selector": {"matchLabels": {"app": "train"}}}]}),
        )],
        vec![],
    );
    let ctx = fake_ctx_ruled(&api, &["--node-lifecycle-conditions=false"], rules).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("first sight");
    assert_eq!(
        evictions(&api.calls()),
        ["web"],
        "the waited-for pod got no eviction"
    );
    pass(&api, &ctx).await.expect("waiting");
    let st = api.status();
    let last_error = st["lastError"].as_str().unwrap_or_default().to_string();
    assert!(
        last_error.contains(
            "shop/train: not evicted: waits until it completes (NodeDrainRule jobs-finish"
        ),
        "{last_error}"
    );
    assert_eq!(
        fake::condition(&st, "Blocked"),
        Some(("True".into(), "WaitingForCompletion".into()))
    );
    assert!(
        api.events()
            .contains(&("Normal".into(), "DrainWaitingForCompletion".into()))
    );
    assert_eq!(st["phase"], json!("Running"));
    // The pod finishes: it leaves as finished pods do, and the drain ends.
    let mut done = api.get(&fake::pod_path("shop", "train")).expect("pod");
    done["status"]["phase"] = json!("Succeeded");
    api.put(&fake::pod_path("shop", "train"), done);
    api.calls();
    pass(&api, &ctx).await.expect("finished");
    assert_eq!(evictions(&api.calls()), ["train"]);
    pass(&api, &ctx).await.expect("drained");
    assert_eq!(api.status()["phase"], json!("Succeeded"));
    assert!(
        !api.calls()
            .iter()
            .any(|c| c.starts_with(&format!("PATCH {NM_PATH}/status")) && c.contains("Failed"))
    );
}

#[tokio::test]
async fn order_groups_leave_one_after_the_other() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    put_pod(&api, "web", json!({}));
    put_pod(&api, "osd", json!({"app": "osd"}));
    let mut late = fake::pod("shop", "logs", "worker-1", json!({}));
    late["metadata"]["annotations"] = json!({shared::rules::drain::DRAIN_ORDER_ANNOTATION: "20"});
    api.put(&fake::pod_path("shop", "logs"), late);
    let rules = DrainRules::fixed(
        vec![rule(
            "storage-last",
            json!({"drain": {"behavior": "Drain", "order": 10},
            "pods": [{"selector": {"matchLabels": {"app": "osd"}}}]}),
        )],
        vec![],
    );
    let ctx = fake_ctx_ruled(&api, &["--node-lifecycle-conditions=false"], rules).await;
    started(&api, &ctx).await;
    let mut order = Vec::new();
    for round in 0..6 {
        pass(&api, &ctx)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        order.extend(evictions(&api.calls()));
        if api.status()["phase"] == json!("Succeeded") {
            break;
        }
    }
    assert_eq!(order, ["web", "osd", "logs"], "groups 0, 10, 20 in turn");
    assert_eq!(api.status()["phase"], json!("Succeeded"));
}
