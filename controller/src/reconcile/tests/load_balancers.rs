//! `--exclude-from-load-balancers` through a reconcile against the fake API
//! server: the label goes on with the cordon (LoadBalancersExcluded), no
//! eviction before `--load-balancer-drain-delay` has passed, and the
//! give-back takes the label off again; a label that was there before stays.

use kube::runtime::controller::Action;
use serde_json::json;
use shared::serve::drain_flags::EXCLUDE_FROM_LB_LABEL;

use super::fake::{self, FakeApi, NODE_PATH};
use super::fake_ctx_with;
use super::scenarios::{mark_deleted, pass, pods, started};
use crate::load_balancers::EXCLUDED_AT_ANNOTATION;

const FLAGS: &[&str] = &[
    "--node-lifecycle-conditions=false",
    "--exclude-from-load-balancers",
    "--load-balancer-drain-delay=30s",
];

fn evictions(api: &FakeApi) -> usize {
    api.calls()
        .iter()
        .filter(|c| c.ends_with("/eviction"))
        .count()
}

fn label(api: &FakeApi) -> Option<String> {
    let node = api.get(NODE_PATH)?;
    node["metadata"]["labels"][EXCLUDE_FROM_LB_LABEL]
        .as_str()
        .map(str::to_string)
}

#[tokio::test]
async fn the_label_goes_on_the_drain_waits_and_the_give_back_takes_it_off() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let ctx = fake_ctx_with(&api, FLAGS).await;
    started(&api, &ctx).await;
    let action = pass(&api, &ctx).await.expect("first sight");
    assert_eq!(
        action,
        Action::requeue(std::time::Duration::from_secs(30)),
        "looks again when the delay has passed"
    );
    assert_eq!(evictions(&api), 0, "no eviction before the delay");
    assert_eq!(label(&api).as_deref(), Some("true"));
    assert!(
        api.events()
            .contains(&("Normal".into(), "LoadBalancersExcluded".into()))
    );
    // Still inside the delay: nothing is evicted.
    ctx.clock
        .advance(k8s_openapi::jiff::SignedDuration::from_secs(10));
    pass(&api, &ctx).await.expect("inside the delay");
    assert_eq!(evictions(&api), 0, "no eviction 10 s in");
    ctx.clock
        .advance(k8s_openapi::jiff::SignedDuration::from_secs(21));
    pass(&api, &ctx).await.expect("after the delay");
    assert_eq!(
        evictions(&api),
        2,
        "both pods evicted once the delay passed"
    );
    mark_deleted(&api);
    api.calls();
    pass(&api, &ctx).await.expect("cleanup");
    assert_eq!(label(&api), None, "the give-back takes the label off");
    let node = api.get(NODE_PATH).expect("node");
    assert!(
        node["metadata"]["annotations"][EXCLUDED_AT_ANNOTATION].is_null(),
        "{node}"
    );
}

#[tokio::test]
async fn a_label_there_before_stays_and_holds_no_eviction() {
    let api = FakeApi::start();
    let mut node = fake::node("worker-1");
    node["metadata"]["labels"] = json!({EXCLUDE_FROM_LB_LABEL: ""});
    api.put(NODE_PATH, node);
    pods(&api, false);
    let ctx = fake_ctx_with(&api, FLAGS).await;
    started(&api, &ctx).await;
    pass(&api, &ctx).await.expect("first sight");
    assert_eq!(evictions(&api), 2, "not ours: no wait");
    assert!(!api.events().iter().any(|e| e.1 == "LoadBalancersExcluded"));
    mark_deleted(&api);
    pass(&api, &ctx).await.expect("drained");
    pass(&api, &ctx).await.expect("cleanup");
    assert_eq!(label(&api).as_deref(), Some(""), "an admin's label is kept");
}
