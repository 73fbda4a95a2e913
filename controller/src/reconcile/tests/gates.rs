//! The fleet gates pass by pass against the fake API server: a held
//! maintenance is Pending with the gate's reason in `Queued`, says so once
//! in an event, never touches its node, and starts once the gate lets it.

use serde_json::Value;

use super::fake::{self, FakeApi, NODE_PATH, condition};
use super::fake_ctx_with;
use super::scenarios::{new_nm, pass, phase, pods};

/// A window on Saturdays 02:00-06:00 UTC: the set clock of these tests
/// (Saturday 01:30 UTC, `TEST_NOW`) is 30 minutes before it opens.
const SATURDAY_WINDOW: &str = "--maintenance-window=0 2 * * 6 4h UTC";

fn queued(api: &FakeApi) -> Option<(String, String)> {
    condition(&api.status(), "Queued")
}

fn last_error(api: &FakeApi) -> String {
    api.status()["lastError"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn outside_every_window_it_waits_and_says_when_the_next_opens() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let ctx = fake_ctx_with(
        &api,
        &["--node-lifecycle-conditions=false", SATURDAY_WINDOW],
    )
    .await;
    new_nm(&api);
    pass(&api, &ctx).await.expect("finalizer");
    api.calls();
    api.events();
    let action = pass(&api, &ctx).await.expect("held");
    assert_eq!(phase(&api), "Pending");
    assert_eq!(
        queued(&api),
        Some(("True".to_string(), "OutsideWindow".to_string()))
    );
    let err = last_error(&api);
    assert!(
        err.contains("next window starts 2026-12-05T02:00:00")
            && err.contains("--maintenance-window"),
        "{err}"
    );
    assert_eq!(
        api.events(),
        vec![("Normal".to_string(), "OutsideWindow".to_string())]
    );
    let calls = api.calls();
    assert!(
        !calls
            .iter()
            .any(|c| c.contains("/nodes/") || c.contains("/leases/")),
        "a held maintenance touches neither node nor lease: {calls:?}"
    );
    // It looks again on its own, just after the window opens.
    let opens = std::time::Duration::from_secs(30 * 60) + std::time::Duration::from_millis(100);
    assert_eq!(action, kube::runtime::controller::Action::requeue(opens));
    pass(&api, &ctx).await.expect("held again");
    assert!(api.events().is_empty(), "one event per wait, not per check");
    assert_eq!(phase(&api), "Pending");
}

#[tokio::test]
async fn an_unreachable_prometheus_holds_every_start() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let url = format!("--block-on-alerts-url=http://127.0.0.1:{port}");
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let ctx = fake_ctx_with(&api, &["--node-lifecycle-conditions=false", &url]).await;
    new_nm(&api);
    pass(&api, &ctx).await.expect("finalizer");
    pass(&api, &ctx).await.expect("held");
    assert_eq!(phase(&api), "Pending");
    assert_eq!(
        queued(&api),
        Some(("True".to_string(), "AlertsFiring".to_string()))
    );
    let err = last_error(&api);
    assert!(
        err.contains(&format!("127.0.0.1:{port}")),
        "names the URL: {err}"
    );
}

#[tokio::test]
async fn without_gates_it_starts_as_before() {
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let ctx = fake_ctx_with(&api, &["--node-lifecycle-conditions=false"]).await;
    new_nm(&api);
    pass(&api, &ctx).await.expect("finalizer");
    pass(&api, &ctx).await.expect("first sight");
    assert_eq!(phase(&api), Value::from("Running"));
    assert_eq!(
        queued(&api),
        Some(("False".to_string(), "NotQueued".to_string()))
    );
}

#[tokio::test(start_paused = true)]
async fn no_maintenance_starts_before_the_nodes_are_listed() {
    use kube::runtime::watcher::Event;
    let api = FakeApi::start();
    api.put(NODE_PATH, fake::node("worker-1"));
    pods(&api, false);
    let flags = [
        "--node-lifecycle-conditions=false",
        "--max-concurrent-per-zone=1",
    ];
    let ctx = fake_ctx_with(&api, &flags).await;
    new_nm(&api);
    pass(&api, &ctx).await.expect("finalizer");
    // Just started: the node watch has sent its first page only.
    let view: shared::kube::partial::NodeView =
        serde_json::from_value(fake::node("worker-1")).expect("node view");
    ctx.fleet.observe(&Event::Init);
    ctx.fleet.observe(&Event::InitApply(view));
    pass(&api, &ctx).await.expect("held");
    assert_eq!(phase(&api), "Pending");
    assert_eq!(
        queued(&api),
        Some(("True".to_string(), "ZoneBudget".to_string()))
    );
    let err = last_error(&api);
    assert!(err.contains("waits for the node list"), "{err}");
    let calls = api.calls();
    assert!(
        !calls.iter().any(|c| c.contains("/leases/")),
        "no lease taken: {calls:?}"
    );
    ctx.fleet.observe(&Event::InitDone);
    pass(&api, &ctx).await.expect("listed: starts");
    assert_eq!(phase(&api), Value::from("Running"));
}
