//! The fleet gates with the local Prometheus (suite `prometheus`: one test at
//! a time, as they share its rules): the alert gate against alerts the real
//! Prometheus evaluates, and the five gates together ordering a fleet of
//! three zones.

use k8s_openapi::jiff::{Timestamp, ToSpan as _};
use kube::api::{Patch, PatchParams};
use nmo_tests::companions::{TestAlert, prometheus_url};
use nmo_tests::controller_env::{pdb_in, pod_in};
use nmo_tests::fixtures::GROUP_KEY;
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

use crate::gates::{Gated, gate_warning, wait_all};

const ALERT: &str = "NmoFleetGateTest";
/// Each stage may wait for the window to open (up to ~2 minutes) first.
const LONG_WAIT: std::time::Duration = std::time::Duration::from_secs(240);

/// The gate flags for alert `ALERT` labelled `test_group=<group>`.
fn alert_flags(group: &str) -> [String; 2] {
    [
        format!(
            "--block-on-alerts-url={}",
            prometheus_url().expect("make companions")
        ),
        format!("--block-on-alerts-filter=alertname=\"{ALERT}\",test_group=\"{group}\""),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_alert_holds_every_start_until_it_resolves() {
    let group_hint = nmo_tests::unique("alert");
    let flags = alert_flags(&group_hint);
    let g = Gated::new("gate-alert", &[&flags[0], &flags[1]]).await;
    let node = g.node("x1", "a", false).await;
    // Someone else's alert of the same name does not hold this fleet.
    let other = TestAlert::raise("NmoFleetGateOther", &[("test_group", "other")])
        .await
        .expect("other alert");
    let alert = TestAlert::raise(
        ALERT,
        &[("test_group", &group_hint), ("severity", "critical")],
    )
    .await
    .expect("alert raised");
    let warnings = g.create("a", &node).await;
    assert!(
        gate_warning(&warnings, "AlertsFiring").contains(ALERT),
        "{warnings:?}"
    );
    let message = g.wait_held("a", "AlertsFiring").await;
    assert!(message.contains(ALERT), "names the alert: {message}");
    assert!(!message.contains("NmoFleetGateOther"), "{message}");
    g.env.wait_event(&g.env.n("a"), "AlertsFiring").await;
    g.wait_waiting("alerts_firing", 1.0).await;
    alert.clear().await.expect("alert cleared");
    g.wait_phase("a", MaintenancePhase::Succeeded).await;
    g.wait_waiting("alerts_firing", 0.0).await;
    other.clear().await.expect("other alert cleared");
    g.teardown().await;
}

/// A window opening at the start of a minute at least 40 s away, for 20 min.
fn window_soon() -> (String, Timestamp) {
    let now = Timestamp::now();
    let mut opens = now
        .checked_add(100.seconds())
        .and_then(|t| t.round(k8s_openapi::jiff::Unit::Minute))
        .expect("a minute");
    if opens.duration_since(now).as_secs() < 40 {
        opens = opens.checked_add(1.minute()).expect("time");
    }
    let at = opens.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    (
        format!(
            "--maintenance-window={} {} * * * 20m UTC",
            at.minute(),
            at.hour()
        ),
        opens,
    )
}

/// Short names of the maintenances in `want` with their expected state:
/// a phase, or Pending held by a reason.
fn holds(mine: &[(String, Option<MaintenancePhase>, String)], want: &[(&str, &str)]) -> bool {
    want.iter().all(|(short, state)| {
        mine.iter().any(|(s, phase, reason)| {
            s == short
                && match *state {
                    "Succeeded" => phase == &Some(MaintenancePhase::Succeeded),
                    "Failed" => phase == &Some(MaintenancePhase::Failed),
                    reason_wanted => {
                        phase == &Some(MaintenancePhase::Pending) && reason == reason_wanted
                    }
                }
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_gates_order_a_fleet_of_three_zones() {
    let group_hint = nmo_tests::unique("five");
    let alerts = alert_flags(&group_hint);
    let (window, opens) = window_soon();
    let g = Gated::new(
        "gate-five",
        &[
            &alerts[0],
            &alerts[1],
            &window,
            "--max-unavailable=3",
            "--max-concurrent-per-zone=1",
            "--pause-after-failure",
        ],
    )
    .await;
    let alert = TestAlert::raise(ALERT, &[("test_group", &group_hint)])
        .await
        .expect("alert raised");
    let nodes = [
        ("m1", "a"),
        ("m2", "a"),
        ("m3", "b"),
        ("m4", "b"),
        ("m5", "c"),
    ];
    // m2's node is cordoned by someone else: unavailable already, so m2
    // adds none and waits only for its zone.
    let mut names = Vec::new();
    for (short, zone) in nodes {
        let cordoned = short == "m2";
        names.push(g.node(&format!("{short}-node"), zone, cordoned).await);
    }
    // m1's drain is held by a PDB; it fails when the test shortens its
    // drainTimeout (below), not on a clock racing the checks before it.
    let ns = g.env.bed.namespace.clone();
    pod_in(&g.env, &ns, "guarded", &names[0]).await;
    pdb_in(&g.env, &ns, "guard", "guarded").await;
    let m1: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": g.env.n("m1"), "labels": {GROUP_KEY: g.env.bed.group}},
        "spec": {"nodeName": names[0], "reason": "fails", "drainTimeout": "30m",
                 "drainTimeoutAction": "Fail"}
    }))
    .expect("nm json");
    g.env
        .nms()
        .create(&Default::default(), &m1)
        .await
        .expect("m1");
    for (i, (short, _)) in nodes.iter().enumerate().skip(1) {
        g.create(short, &names[i]).await;
    }
    let all = |state: &'static str| -> Vec<(&'static str, &'static str)> {
        nodes.iter().map(|(s, _)| (*s, state)).collect()
    };
    wait_all(&g, LONG_WAIT, "all five held by the alert", |m| {
        holds(m, &all("AlertsFiring"))
    })
    .await;
    alert.clear().await.expect("alert cleared");
    if Timestamp::now() < opens {
        wait_all(&g, LONG_WAIT, "all five held by the window", |m| {
            holds(m, &all("OutsideWindow"))
        })
        .await;
    }
    // The window opens: m1 (zone a) and m3 (b) start, with m2's node that
    // makes 3 unavailable (max 3); m2 waits for its zone only; m4 would
    // make 4; m5 would fit alone but waits behind m4, in creation order.
    // (A maintenance held by both budgets names max-unavailable, the order
    // of the gates: the test keeps each wait to one budget.)
    let budgets = [
        ("m2", "ZoneBudget"),
        ("m4", "MaxUnavailable"),
        ("m5", "MaxUnavailable"),
        ("m3", "Succeeded"),
    ];
    wait_all(&g, LONG_WAIT, "the budgets after the window opened", |m| {
        holds(m, &budgets)
    })
    .await;
    // m1's deadline is brought forward: it fails and gives its node back;
    // the pause holds all.
    let shorter = json!({"spec": {"drainTimeout": "1s"}});
    g.env
        .nms()
        .patch(
            &g.env.n("m1"),
            &PatchParams::default(),
            &Patch::Merge(&shorter),
        )
        .await
        .expect("m1's drainTimeout shortened");
    let paused = [
        ("m1", "Failed"),
        ("m2", "PausedAfterFailure"),
        ("m4", "PausedAfterFailure"),
        ("m5", "PausedAfterFailure"),
    ];
    wait_all(&g, LONG_WAIT, "paused after m1 failed", |m| {
        holds(m, &paused)
    })
    .await;
    g.delete("m1").await;
    // Zone a is free: m2 starts (its node counted already). m4 waits for
    // zone b (m3), which lets m5 pass it: 3 unavailable (m2's, m3's, m5's
    // nodes); then m4 would make 4.
    let resumed = [
        ("m2", "Succeeded"),
        ("m5", "Succeeded"),
        ("m4", "MaxUnavailable"),
    ];
    wait_all(&g, LONG_WAIT, "m2 and m5 after the pause", |m| {
        holds(m, &resumed)
    })
    .await;
    g.delete("m3").await;
    wait_all(&g, LONG_WAIT, "m4 once m3 is gone", |m| {
        holds(m, &[("m4", "Succeeded")])
    })
    .await;
    g.teardown().await;
}
