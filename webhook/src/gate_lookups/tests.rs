use shared::NodeMaintenance;
use shared::rules::gates::Alert;

use super::*;

/// The entry of a NodeMaintenance created at `created`, in `phase`.
fn entry(name: &str, node: &str, created: &str, phase: Option<&str>) -> Entry {
    let nm: NodeMaintenance = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"nodeName": node, "reason": "test"},
        "status": phase.map(|p| serde_json::json!({"phase": p})),
    }))
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    Entry::of(&nm)
}

const OLD: &str = "2026-12-12T01:00:00Z";
const NEW: &str = "2026-12-12T01:29:00Z";

fn node(name: &str, ready: bool) -> FleetNode {
    FleetNode {
        name: name.into(),
        zone: None,
        ready,
        cordoned: false,
        maintained: shared::rules::gates::Maintained::No,
    }
}

fn gates(args: &[&str]) -> Gates {
    flags(args).gates()
}

fn flags(args: &[&str]) -> GateFlags {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        gates: GateFlags,
    }
    let mut full = vec!["nmo-webhook"];
    full.extend_from_slice(args);
    Cli::try_parse_from(shared::serve::goflags::normalize(full))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
        .gates
}

fn now() -> Timestamp {
    "2026-12-12T01:30:00Z".parse().expect("a time")
}

/// One node of three NotReady, a budget of one: the create waits, unless the
/// nodes are unknown, which leaves the budget out and says so.
#[test]
fn what_did_not_answer_is_left_out_and_named() {
    let me = entry("nm-new", "n1", NEW, None);
    let all = [entry("nm-old", "n0", OLD, None), me.clone()];
    let g = gates(&["--max-unavailable=1"]);
    let nodes = Arc::new(vec![node("n0", true), node("n1", true), node("n2", false)]);
    let seen = Seen {
        nodes: Some(Ok(nodes)),
        alerts: None,
    };
    let got = decide(&me, &all, 0, &g, seen, now());
    let (reason, message) = got.wait.expect("a wait");
    assert_eq!(reason, GateReason::MaxUnavailable, "{message}");
    assert!(message.contains("n2 (NotReady)"), "{message}");
    assert!(got.unchecked.is_empty());

    let line = "--max-unavailable and --max-concurrent-per-zone not checked: x".to_string();
    let seen = Seen {
        nodes: Some(Err(line.clone())),
        alerts: None,
    };
    let got = decide(&me, &all, 0, &g, seen, now());
    assert_eq!(
        got,
        QueueFacts {
            unchecked: vec![line],
            ..QueueFacts::default()
        }
    );
}

#[test]
fn alerts_unread_in_time_are_named_and_failed_ones_block() {
    let me = entry("nm-new", "n1", NEW, None);
    let all = [me.clone()];
    let g = gates(&["--block-on-alerts-url=http://prometheus:9090"]);
    let late = Seen {
        nodes: None,
        alerts: Some(Err("--block-on-alerts-url not checked: late".into())),
    };
    let got = decide(&me, &all, 0, &g, late, now());
    assert_eq!(got.wait, None);
    assert_eq!(
        got.unchecked,
        vec!["--block-on-alerts-url not checked: late"]
    );

    let failed = Seen {
        nodes: None,
        alerts: Some(Ok(Arc::new(AlertsSeen::Failed(
            "connection refused".into(),
        )))),
    };
    let got = decide(&me, &all, 0, &g, failed, now());
    let (reason, message) = got.wait.expect("fails closed");
    assert_eq!(reason, GateReason::AlertsFiring);
    assert!(message.contains("connection refused"), "{message}");

    let quiet = Seen {
        nodes: None,
        alerts: Some(Ok(Arc::new(AlertsSeen::Read(vec![Alert {
            labels: [("alertname".to_string(), "Slow".to_string())].into(),
            state: "pending".into(),
        }])))),
    };
    assert_eq!(
        decide(&me, &all, 0, &g, quiet, now()),
        QueueFacts::default()
    );
}

#[test]
fn a_window_and_the_pause_need_no_lookup() {
    let me = entry("nm-new", "n1", NEW, None);
    let broken = entry("nm-broken", "n0", OLD, Some("Failed"));
    let g = gates(&[
        "--maintenance-window=0 2 * * 6 4h UTC",
        "--pause-after-failure",
    ]);
    let settings = GateSettings {
        gates: g.clone(),
        alerts: None,
    };
    assert!(settings.any());
    let got = decide(
        &me,
        std::slice::from_ref(&me),
        0,
        &g,
        Seen::default(),
        now(),
    );
    let (reason, message) = got.wait.expect("outside the window");
    assert_eq!(reason, GateReason::OutsideWindow, "{message}");
    let got = decide(&me, &[broken, me.clone()], 0, &g, Seen::default(), now());
    assert_eq!(
        got.wait.map(|(r, _)| r),
        Some(GateReason::PausedAfterFailure)
    );
}

#[test]
fn settings_of_the_flags() {
    let none = GateSettings::of(&flags(&[])).expect("defaults");
    assert!(!none.any(), "defaults gate nothing");
    let err = GateSettings::of(&flags(&["--block-on-alerts-url=https://p:9090"]))
        .expect_err("only http://");
    assert!(
        err.contains("--block-on-alerts-url=https://p:9090"),
        "{err}"
    );
    let ok = GateSettings::of(&flags(&["--block-on-alerts-url=http://p:9090"])).expect("http");
    assert!(ok.any() && ok.alerts.is_some());
}

/// A real node's JSON (images and all) decodes to the view the gates read.
#[test]
fn nodes_decode_lean() {
    let json = serde_json::json!({
        "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "a"},
                     "managedFields": [{"manager": "kubelet"}]},
        "spec": {"unschedulable": true, "podCIDR": "10.0.0.0/24"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True", "message": "kubelet is posting ready status"}],
            "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}]
        }
    });
    let lean: shared::kube::partial::NodeView = serde_json::from_value(json).expect("a node");
    let view = lean.gate_view("topology.kubernetes.io/zone");
    assert_eq!(
        view,
        FleetNode {
            name: "n1".into(),
            zone: Some("a".into()),
            ready: true,
            cordoned: true,
            maintained: shared::rules::gates::Maintained::No,
        }
    );
    let bare: shared::kube::partial::NodeView =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n2"}})).expect("a node");
    let view = bare.gate_view("topology.kubernetes.io/zone");
    assert!(!view.ready && !view.cordoned && view.zone.is_none());
}

/// An API server that never answers: the nodes are named as not checked
/// within the budget, and a gate that needs no lookup still speaks.
#[tokio::test]
async fn nodes_unlisted_in_time_leave_the_window_gate() {
    let flags = flags(&[
        "--max-unavailable=1",
        "--maintenance-window=0 2 * * 6 4h UTC",
    ]);
    let settings = GateSettings::of(&flags).expect("settings");
    let budget = Duration::from_millis(100);
    let client = crate::cache::tests::silent_client();
    let lookups = GateLookups::new(client, settings, budget);
    let me = entry("nm-new", "n1", NEW, None);
    let began = Deadline::now();
    let got = lookups
        .decide_queue(&me, std::slice::from_ref(&me), 0, began + budget, now())
        .await;
    assert!(began.elapsed() < budget * 3, "took {:?}", began.elapsed());
    assert_eq!(
        got.unchecked,
        vec![
            "--max-unavailable and --max-concurrent-per-zone not checked: the nodes were not \
             listed within --warnings-timeout 100ms"
        ]
    );
    // Saturday 01:30 UTC, before the window (02:00-06:00): it still holds.
    assert_eq!(
        got.wait.map(|(reason, _)| reason),
        Some(GateReason::OutsideWindow)
    );
}

/// Two slots, one per zone: a running in zone a, b of zone a held by its
/// zone. A create in zone b starts at once (the controller's decision, as
/// `shared::rules::slots::turn` makes it), so no wait is warned of; one in
/// zone a is told of the zone, not of a slot.
#[test]
fn the_warning_is_the_controllers_decision_with_slots_and_a_zone_budget() {
    let zoned = |name: &str, zone: &str| FleetNode {
        zone: Some(zone.into()),
        ..node(name, true)
    };
    let nodes = Arc::new(vec![
        zoned("a1", "a"),
        zoned("a2", "a"),
        zoned("a3", "a"),
        zoned("b1", "b"),
    ]);
    let g = gates(&["--max-concurrent-per-zone=1"]);
    let running = entry("nm-a", "a1", OLD, Some("Running"));
    let held = entry("nm-b", "a2", OLD, None);
    for (me, want) in [
        (entry("nm-new", "b1", NEW, None), None),
        (
            entry("nm-new", "a3", NEW, None),
            Some(GateReason::ZoneBudget),
        ),
    ] {
        let all = [running.clone(), held.clone(), me.clone()];
        let seen = Seen {
            nodes: Some(Ok(nodes.clone())),
            alerts: None,
        };
        let got = decide(&me, &all, 2, &g, seen, now());
        assert_eq!(got.slot_ahead, None, "{}: no slot wait: {got:?}", me.node);
        assert_eq!(got.wait.map(|(r, _)| r), want, "{}", me.node);
    }
}
