use super::*;
use crate::MaintenancePhase::{Failed, Pending, Running, Succeeded};
use crate::rules::slots::tests::e;
use crate::rules::slots::{Admissions, SlotDecision};

fn deleting(mut entry: Entry) -> Entry {
    entry.deleting = true;
    entry
}

fn node(name: &str, zone: Option<&str>) -> FleetNode {
    FleetNode {
        name: name.into(),
        zone: zone.map(str::to_string),
        ready: true,
        cordoned: false,
        maintained: Maintained::No,
    }
}

/// Ten ready nodes n0..n9, n0-n4 in zone "a", n5-n7 in "b", n8-n9 unlabelled.
fn fleet() -> Vec<FleetNode> {
    (0..10)
        .map(|i| {
            let zone = match i {
                0..=4 => Some("a"),
                5..=7 => Some("b"),
                _ => None,
            };
            node(&format!("n{i}"), zone)
        })
        .collect()
}

fn with(mut nodes: Vec<FleetNode>, name: &str, change: fn(&mut FleetNode)) -> Vec<FleetNode> {
    nodes.iter_mut().filter(|n| n.name == name).for_each(change);
    nodes
}

fn not_ready(n: &mut FleetNode) {
    n.ready = false;
}

fn cordoned(n: &mut FleetNode) {
    n.cordoned = true;
}

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn observe<'a>(nodes: &'a [FleetNode], alerts: &'a AlertsSeen, now: &str) -> GateInputs<'a> {
    GateInputs {
        nodes,
        nodes_listed: true,
        now: ts(now),
        alerts,
    }
}

/// One decision table row: `me` is the last entry of `all`.
struct Case {
    name: &'static str,
    gates: Gates,
    all: Vec<Entry>,
    nodes: Vec<FleetNode>,
    alerts: AlertsSeen,
    now: &'static str,
    /// `None`: Start; else the reason and words the message must hold.
    want: Option<(GateReason, &'static [&'static str])>,
}

impl Default for Case {
    fn default() -> Self {
        Case {
            name: "",
            gates: Gates::default(),
            all: Vec::new(),
            nodes: fleet(),
            alerts: AlertsSeen::NotRead,
            now: "2026-12-12T01:30:00Z",
            want: None,
        }
    }
}

fn run(cases: Vec<Case>) {
    for c in cases {
        let me = c
            .all
            .last()
            .unwrap_or_else(|| panic!("{}: no entries", c.name));
        let observed = observe(&c.nodes, &c.alerts, c.now);
        let got = may_start(me, &c.all, &observed, &c.gates);
        match (&got, c.want) {
            (GateDecision::Start, None) => {}
            (GateDecision::Wait { reason, message }, Some((want, words))) => {
                assert_eq!(*reason, want, "{}: {message}", c.name);
                for w in words {
                    assert!(message.contains(w), "{}: {w:?} not in {message}", c.name);
                }
            }
            (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
        }
    }
}

fn pause() -> Gates {
    Gates {
        pause_after_failure: true,
        ..Gates::default()
    }
}

#[test]
fn pause_after_failure() {
    let failed = e("broken", "n1", "1", Some(Failed));
    run(vec![
        Case {
            name: "off: a failure holds nothing",
            all: vec![failed.clone(), e("me", "n2", "2", None)],
            ..Case::default()
        },
        Case {
            name: "a failed one holds every start",
            gates: pause(),
            all: vec![failed.clone(), e("me", "n2", "2", Some(Pending))],
            want: Some((
                GateReason::PausedAfterFailure,
                &[
                    "broken (node n1) failed",
                    "until it is deleted",
                    "--pause-after-failure",
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "even an older one waits",
            gates: pause(),
            all: vec![
                e("broken", "n1", "3", Some(Failed)),
                e("me", "n2", "2", None),
            ],
            want: Some((GateReason::PausedAfterFailure, &["broken"])),
            ..Case::default()
        },
        Case {
            name: "until its deletion is done",
            gates: pause(),
            all: vec![deleting(failed.clone()), e("me", "n2", "2", None)],
            want: Some((GateReason::PausedAfterFailure, &["broken"])),
            ..Case::default()
        },
        Case {
            name: "no failure",
            gates: pause(),
            all: vec![
                e("ok", "n1", "1", Some(Succeeded)),
                e("me", "n2", "2", None),
            ],
            ..Case::default()
        },
        Case {
            name: "a running one carries on",
            gates: pause(),
            all: vec![failed, e("me", "n2", "2", Some(Running))],
            ..Case::default()
        },
    ]);
}

fn alert(name: &str, severity: &str, state: &str) -> Alert {
    Alert {
        labels: [("alertname", name), ("severity", severity), ("pod", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        state: state.into(),
    }
}

fn alert_gate(filter: &str) -> Gates {
    Gates {
        alerts: Some(AlertGate {
            url: "http://prometheus:9090".into(),
            filter: filter.parse().unwrap_or_else(|e| panic!("{e}")),
        }),
        ..Gates::default()
    }
}

#[test]
fn alerts_fail_closed() {
    let me = || vec![e("me", "n1", "1", None)];
    let critical = r#"severity="critical""#;
    run(vec![
        Case {
            name: "off: not read is fine",
            all: me(),
            ..Case::default()
        },
        Case {
            name: "not read yet: fail closed",
            gates: alert_gate(critical),
            all: me(),
            want: Some((
                GateReason::AlertsFiring,
                &[
                    "http://prometheus:9090",
                    "not been read yet",
                    "fails closed",
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "unreachable: fail closed",
            gates: alert_gate(critical),
            all: me(),
            alerts: AlertsSeen::Failed("connection refused".into()),
            want: Some((
                GateReason::AlertsFiring,
                &["connection refused", "fails closed"],
            )),
            ..Case::default()
        },
    ]);
}

#[test]
fn alerts_firing() {
    let me = || vec![e("me", "n1", "1", None)];
    let critical = r#"severity="critical""#;
    let many: Vec<Alert> = (0..7)
        .map(|i| alert(&format!("A{i}"), "critical", "firing"))
        .collect();
    run(vec![
        Case {
            name: "a matching alert fires",
            gates: alert_gate(critical),
            all: me(),
            alerts: AlertsSeen::Read(vec![alert("NodeDown", "critical", "firing")]),
            want: Some((
                GateReason::AlertsFiring,
                &[
                    r#"NodeDown{severity="critical"}"#,
                    "when they resolve",
                    r#"(--block-on-alerts-filter severity="critical" at"#,
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "pending is not firing",
            gates: alert_gate(critical),
            all: me(),
            alerts: AlertsSeen::Read(vec![alert("NodeDown", "critical", "pending")]),
            ..Case::default()
        },
        Case {
            name: "another severity",
            gates: alert_gate(critical),
            all: me(),
            alerts: AlertsSeen::Read(vec![alert("Slow", "warning", "firing")]),
            ..Case::default()
        },
        Case {
            name: "no filter: any firing alert",
            gates: alert_gate(""),
            all: me(),
            alerts: AlertsSeen::Read(vec![alert("Slow", "warning", "firing")]),
            want: Some((GateReason::AlertsFiring, &["Slow;", "any alert"])),
            ..Case::default()
        },
        Case {
            name: "many: five named",
            gates: alert_gate(critical),
            all: me(),
            alerts: AlertsSeen::Read(many),
            want: Some((GateReason::AlertsFiring, &["A4{", "and 2 more"])),
            ..Case::default()
        },
    ]);
}

const BERLIN_SATURDAY: &str = "0 2 * * 6 4h Europe/Berlin";

fn windows(specs: &[&str]) -> Gates {
    Gates {
        windows: specs
            .iter()
            .map(|s| s.parse().unwrap_or_else(|e| panic!("{e}")))
            .collect(),
        ..Gates::default()
    }
}

#[test]
fn maintenance_windows() {
    let me = || vec![e("me", "n1", "1", None)];
    run(vec![
        Case {
            name: "no window: any time",
            all: me(),
            now: "2026-12-14T12:00:00Z",
            ..Case::default()
        },
        Case {
            name: "inside the window",
            gates: windows(&[BERLIN_SATURDAY]),
            all: me(),
            now: "2026-12-12T01:30:00Z",
            ..Case::default()
        },
        Case {
            name: "outside: the next start on the window's clock",
            gates: windows(&[BERLIN_SATURDAY]),
            all: me(),
            now: "2026-12-12T00:30:00Z",
            want: Some((
                GateReason::OutsideWindow,
                &[
                    "next window starts 2026-12-12T02:00:00+01:00 (Europe/Berlin)",
                    r#"(--maintenance-window "0 2 * * 6 4h Europe/Berlin")"#,
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "outside both: the earlier one",
            gates: windows(&[BERLIN_SATURDAY, "0 3 * * 3 1h"]),
            all: me(),
            now: "2026-12-14T00:00:00Z",
            want: Some((
                GateReason::OutsideWindow,
                &["2026-12-16T03:00:00+00:00 (UTC)"],
            )),
            ..Case::default()
        },
        Case {
            name: "one of two open",
            gates: windows(&[BERLIN_SATURDAY, "0 3 * * 3 1h"]),
            all: me(),
            now: "2026-12-16T03:10:00Z",
            ..Case::default()
        },
        Case {
            name: "one that started runs to its end",
            gates: windows(&[BERLIN_SATURDAY]),
            all: vec![e("me", "n1", "1", Some(Running))],
            now: "2026-12-14T12:00:00Z",
            ..Case::default()
        },
    ]);
    let gates = windows(&[BERLIN_SATURDAY]);
    assert_eq!(
        next_window_start(&gates, ts("2026-12-12T00:30:00Z")),
        Some(ts("2026-12-12T01:00:00Z"))
    );
    assert_eq!(next_window_start(&gates, ts("2026-12-12T01:30:00Z")), None);
    assert_eq!(
        next_window_start(&Gates::default(), ts("2026-12-12T01:30:00Z")),
        None
    );
}

fn max_unavailable(setting: &str, per_zone: usize) -> Gates {
    Gates {
        max_unavailable: Some(setting.parse().unwrap_or_else(|e| panic!("{e}"))),
        max_per_zone: per_zone,
        ..Gates::default()
    }
}

#[test]
fn max_unavailable_counts_maintenance_not_ready_and_cordoned() {
    let running = || e("a", "n1", "1", Some(Running));
    run(vec![
        Case {
            name: "within the budget",
            gates: max_unavailable("2", 0),
            all: vec![running(), e("me", "n2", "2", None)],
            ..Case::default()
        },
        Case {
            name: "in maintenance and NotReady fill it",
            gates: max_unavailable("2", 0),
            all: vec![running(), e("me", "n2", "2", None)],
            nodes: with(fleet(), "n3", not_ready),
            want: Some((
                GateReason::MaxUnavailable,
                &[
                    "makes 3 of 10 nodes unavailable, at most 2",
                    "n1 (in maintenance, a)",
                    "n3 (NotReady)",
                    "--max-unavailable=2",
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "cordoned by anyone counts",
            gates: max_unavailable("1", 0),
            all: vec![e("me", "n2", "2", None)],
            nodes: with(fleet(), "n4", cordoned),
            want: Some((GateReason::MaxUnavailable, &["n4 (cordoned)"])),
            ..Case::default()
        },
        Case {
            name: "its own node counts once",
            gates: max_unavailable("1", 0),
            all: vec![e("me", "n2", "2", None)],
            nodes: with(fleet(), "n2", cordoned),
            ..Case::default()
        },
        Case {
            name: "a deleting one holds its node until gone",
            gates: max_unavailable("1", 0),
            all: vec![deleting(running()), e("me", "n2", "2", None)],
            want: Some((GateReason::MaxUnavailable, &["n1 (in maintenance, a)"])),
            ..Case::default()
        },
        Case {
            name: "a percentage rounds down",
            gates: max_unavailable("25%", 0),
            all: vec![
                running(),
                e("b", "n2", "2", Some(Running)),
                e("me", "n3", "3", None),
            ],
            want: Some((
                GateReason::MaxUnavailable,
                &["at most 2", "--max-unavailable=25%"],
            )),
            ..Case::default()
        },
        Case {
            name: "a percentage is at least one",
            gates: max_unavailable("5%", 0),
            all: vec![e("me", "n3", "3", None)],
            ..Case::default()
        },
    ]);
}

/// Creation order: an earlier maintenance that passes counts as started;
/// one that waits for the budget holds every later one.
#[test]
fn max_unavailable_keeps_creation_order() {
    run(vec![
        Case {
            name: "an earlier one starts first",
            gates: max_unavailable("2", 0),
            all: vec![e("b", "n2", "1", None), e("me", "n3", "2", None)],
            nodes: with(fleet(), "n1", not_ready),
            want: Some((GateReason::MaxUnavailable, &["n2 (b starts first)"])),
            ..Case::default()
        },
        Case {
            name: "a later one may not pass an earlier waiter",
            gates: max_unavailable("1", 0),
            // me's node is NotReady already: alone it would fit.
            all: vec![e("b", "n2", "1", None), e("me", "n1", "2", None)],
            nodes: with(fleet(), "n1", not_ready),
            want: Some((
                GateReason::MaxUnavailable,
                &[
                    "1 of 10 nodes are unavailable, at most 1",
                    "n1 (NotReady)",
                    "b (node n2) waits ahead of it for the same budget",
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "the earliest waiter goes first",
            gates: max_unavailable("1", 0),
            all: vec![e("b", "n2", "2", None), e("me", "n1", "1", None)],
            nodes: with(fleet(), "n1", not_ready),
            ..Case::default()
        },
        Case {
            name: "an earlier waiter for its zone does not hold the budget",
            gates: max_unavailable("2", 1),
            all: vec![
                e("a", "n0", "1", Some(Running)),
                e("b", "n1", "2", None),
                e("me", "n5", "3", None),
            ],
            ..Case::default()
        },
        Case {
            name: "failed and deleting ones are not in the queue",
            gates: max_unavailable("1", 0),
            all: vec![
                e("f", "n2", "1", Some(Failed)),
                deleting(e("d", "n3", "2", None)),
                e("me", "n4", "3", None),
            ],
            ..Case::default()
        },
    ]);
}

fn per_zone(n: usize) -> Gates {
    Gates {
        max_per_zone: n,
        ..Gates::default()
    }
}

#[test]
fn zone_budget() {
    let in_a = || e("a", "n0", "1", Some(Running));
    run(vec![
        Case {
            name: "the zone is full",
            gates: per_zone(1),
            all: vec![in_a(), e("me", "n1", "2", None)],
            want: Some((
                GateReason::ZoneBudget,
                &[
                    r#"zone "a" has 1 of 1 maintenance(s) running: a (node n0)"#,
                    "--max-concurrent-per-zone=1",
                    "--zone-label=topology.kubernetes.io/zone",
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "another zone",
            gates: per_zone(1),
            all: vec![in_a(), e("me", "n5", "2", None)],
            ..Case::default()
        },
        Case {
            name: "unlabelled nodes are one zone",
            gates: per_zone(1),
            all: vec![e("a", "n8", "1", Some(Running)), e("me", "n9", "2", None)],
            want: Some((
                GateReason::ZoneBudget,
                &["the zone of nodes without label topology.kubernetes.io/zone"],
            )),
            ..Case::default()
        },
        Case {
            name: "unlabelled is not a labelled zone",
            gates: per_zone(1),
            all: vec![e("a", "n8", "1", Some(Running)), e("me", "n0", "2", None)],
            ..Case::default()
        },
        Case {
            name: "an unknown node is unlabelled",
            gates: per_zone(1),
            all: vec![e("a", "gone", "1", Some(Running)), e("me", "n9", "2", None)],
            want: Some((GateReason::ZoneBudget, &["a (node gone)"])),
            ..Case::default()
        },
        Case {
            name: "an earlier one of the zone starts first",
            gates: per_zone(2),
            all: vec![in_a(), e("b", "n1", "2", None), e("me", "n2", "3", None)],
            want: Some((
                GateReason::ZoneBudget,
                &["2 of 2", "b (node n1, starts first)"],
            )),
            ..Case::default()
        },
        Case {
            name: "a later one of another zone passes an earlier waiter",
            gates: per_zone(1),
            all: vec![in_a(), e("b", "n1", "2", None), e("me", "n5", "3", None)],
            ..Case::default()
        },
        Case {
            name: "two zones fill independently",
            gates: per_zone(1),
            all: vec![
                e("b", "n1", "2", None),
                e("c", "n5", "3", None),
                e("me", "n6", "4", None),
            ],
            want: Some((
                GateReason::ZoneBudget,
                &[r#"zone "b""#, "c (node n5, starts first)"],
            )),
            ..Case::default()
        },
    ]);
}

/// A zone of four: the holder, then three waiters. The later waiters name
/// the one just ahead of them, not the holder, so their words stay the same
/// while the zone hands over (only the first waiter's change).
#[test]
fn later_zone_waiters_keep_their_words_through_a_hand_over() {
    let words = |all: &[Entry]| {
        let nodes = fleet();
        let observed = observe(&nodes, &AlertsSeen::NotRead, "2026-12-12T01:30:00Z");
        let me = all.last().expect("an entry");
        match may_start(me, all, &observed, &per_zone(1)) {
            GateDecision::Wait { reason, message } => {
                assert_eq!(reason, GateReason::ZoneBudget, "{message}");
                message
            }
            GateDecision::Start => panic!("{} started", me.name),
        }
    };
    let holder = e("h", "n0", "1", Some(Running));
    let (w1, w2) = (e("w1", "n1", "2", None), e("w2", "n2", "3", None));
    let me = e("me", "n3", "4", None);
    let before = words(&[holder.clone(), w1.clone(), w2.clone(), me.clone()]);
    assert!(
        before.contains("w2 (node n2) waits ahead of it in the same zone"),
        "{before}"
    );
    assert!(
        !before.contains("h (node n0)"),
        "a later waiter names the holder: {before}"
    );
    // The holder is given back: w1 starts first, w2 is now the first waiter.
    let after = words(&[w1.clone(), w2.clone(), me.clone()]);
    assert_eq!(
        before, after,
        "a later waiter's words changed with the holder"
    );
    let first = words(&[w1, w2]);
    assert!(first.contains("w1 (node n1, starts first)"), "{first}");
}

fn settle(minutes: u64, per_zone: usize) -> Gates {
    Gates {
        settle_after: Some(std::time::Duration::from_secs(minutes * 60)),
        max_per_zone: per_zone,
        ..Gates::default()
    }
}

fn ended(at: &'static str) -> fn(&mut FleetNode) {
    match at {
        "01:25" => |n| n.maintained = Maintained::EndedAt(ts("2026-12-12T01:25:00Z")),
        "01:10" => |n| n.maintained = Maintained::EndedAt(ts("2026-12-12T01:10:00Z")),
        _ => |n| n.maintained = Maintained::InProgress,
    }
}

/// `--settle-after`: now is 01:30; a node given back at 01:25 holds the
/// next start for a 10-minute pause (5 min left), one given back at 01:10
/// does not; in progress with no maintenance holding it = being given back.
#[test]
fn settle_after() {
    type Change = (&'static str, fn(&mut FleetNode));
    let nodes = |changes: &[Change]| changes.iter().fold(fleet(), |acc, (n, f)| with(acc, n, *f));
    run(vec![
        Case {
            name: "given back 5 min ago: 5 min left",
            gates: settle(10, 0),
            nodes: nodes(&[("n2", ended("01:25"))]),
            all: vec![e("me", "n1", "2", None)],
            want: Some((
                GateReason::Settling,
                &[
                    "waits for node n2 to settle: given back 5m",
                    "5m left",
                    "--settle-after=10m",
                ],
            )),
            ..Case::default()
        },
        Case {
            name: "given back 20 min ago: settled",
            gates: settle(10, 0),
            nodes: nodes(&[("n2", ended("01:10"))]),
            all: vec![e("me", "n1", "2", None)],
            ..Case::default()
        },
        Case {
            name: "the last one given back counts, not an older one",
            gates: settle(10, 0),
            nodes: nodes(&[("n2", ended("01:10")), ("n6", ended("01:25"))]),
            all: vec![e("me", "n1", "2", None)],
            want: Some((GateReason::Settling, &["node n6"])),
            ..Case::default()
        },
        Case {
            name: "settled but not Ready",
            gates: settle(10, 0),
            nodes: nodes(&[("n2", ended("01:10")), ("n2", not_ready)]),
            all: vec![e("me", "n1", "2", None)],
            want: Some((
                GateReason::Settling,
                &["waits for node n2, given back 20m", "to be Ready"],
            )),
            ..Case::default()
        },
        Case {
            name: "being given back now (its maintenance gone, the condition not yet cleared)",
            gates: settle(10, 0),
            nodes: nodes(&[("n2", ended("now"))]),
            all: vec![e("me", "n1", "2", None)],
            want: Some((GateReason::Settling, &["given back 0s ago", "10m left"])),
            ..Case::default()
        },
        Case {
            name: "in progress under a running maintenance is not given back",
            gates: settle(10, 0),
            nodes: nodes(&[("n2", ended("now"))]),
            all: vec![e("a", "n2", "1", Some(Running)), e("me", "n1", "2", None)],
            ..Case::default()
        },
        Case {
            name: "with a zone budget, only the zone's nodes count",
            gates: settle(10, 1),
            nodes: nodes(&[("n6", ended("01:25"))]),
            all: vec![e("me", "n1", "2", None)],
            ..Case::default()
        },
        Case {
            name: "with a zone budget, the zone's last node holds",
            gates: settle(10, 1),
            nodes: nodes(&[("n3", ended("01:25"))]),
            all: vec![e("me", "n1", "2", None)],
            want: Some((
                GateReason::Settling,
                &["node n3", r#"next node of zone "a""#],
            )),
            ..Case::default()
        },
        Case {
            name: "the zone is full: ZoneBudget first",
            gates: settle(10, 1),
            nodes: nodes(&[("n3", ended("01:25"))]),
            all: vec![e("a", "n0", "1", Some(Running)), e("me", "n1", "2", None)],
            want: Some((GateReason::ZoneBudget, &["zone \"a\""])),
            ..Case::default()
        },
    ]);
}

/// Every gate blocks; lifting them one by one shows their order.
#[test]
fn gates_decide_in_their_documented_order() {
    let mut gates = Gates {
        pause_after_failure: true,
        ..max_unavailable("1", 1)
    };
    gates.windows = windows(&[BERLIN_SATURDAY]).windows;
    gates.alerts = alert_gate("").alerts;
    gates.settle_after = Some(std::time::Duration::from_secs(600));
    let all = vec![
        e("broken", "n9", "0", Some(Failed)),
        e("a", "n0", "1", Some(Running)),
        e("me", "n1", "2", None),
    ];
    let nodes = with(fleet(), "n2", |n| {
        n.maintained = Maintained::EndedAt(ts("2026-12-13T23:59:00Z"));
    });
    let alerts = AlertsSeen::Read(vec![alert("NodeDown", "critical", "firing")]);
    let me = &all[2];
    let mut seen = Vec::new();
    loop {
        let observed = observe(&nodes, &alerts, "2026-12-14T00:00:00Z");
        let GateDecision::Wait { reason, .. } = may_start(me, &all, &observed, &gates) else {
            break;
        };
        seen.push(reason);
        match reason {
            GateReason::PausedAfterFailure => gates.pause_after_failure = false,
            GateReason::AlertsFiring => gates.alerts = None,
            GateReason::OutsideWindow => gates.windows.clear(),
            GateReason::MaxUnavailable => gates.max_unavailable = None,
            GateReason::ZoneBudget => gates.max_per_zone = 0,
            GateReason::Settling => gates.settle_after = None,
        }
    }
    assert_eq!(seen, GateReason::ALL);
}

#[test]
fn reasons_are_named_exactly() {
    let names: Vec<&str> = GateReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        names,
        [
            "PausedAfterFailure",
            "AlertsFiring",
            "OutsideWindow",
            "MaxUnavailable",
            "ZoneBudget",
            "Settling"
        ]
    );
    let labels: Vec<&str> = GateReason::ALL.iter().map(|r| r.metric_label()).collect();
    assert_eq!(
        labels,
        [
            "paused_after_failure",
            "alerts_firing",
            "outside_window",
            "max_unavailable",
            "zone_budget",
            "settling"
        ]
    );
    assert_eq!(GateReason::ZoneBudget.to_string(), "ZoneBudget");
}

#[test]
fn needs_say_what_to_gather() {
    let cases = [
        ("defaults", Gates::default(), false, false),
        ("max-unavailable", max_unavailable("1", 0), true, false),
        ("per zone", per_zone(1), true, false),
        ("alerts", alert_gate(""), false, true),
        ("windows", windows(&[BERLIN_SATURDAY]), false, false),
    ];
    for (case, gates, nodes, alerts) in cases {
        assert_eq!(gates.needs_nodes(), nodes, "{case}");
        assert_eq!(gates.needs_alerts(), alerts, "{case}");
    }
}

/// [`may_start`] as the gate [`Admissions::decide_gated`] takes.
fn as_gate<'a>(
    observed: &'a GateInputs<'a>,
    gates: &'a Gates,
) -> impl Fn(&Entry, &[Entry]) -> Option<GateDecision> + 'a {
    move |me, all| match may_start(me, all, observed, gates) {
        GateDecision::Start => None,
        wait => Some(wait),
    }
}

/// Through the admissions record: a start this process decided counts
/// against the zone before the cache shows it Running, and a wait is not
/// recorded as an admission.
#[test]
fn admissions_count_for_the_gates() {
    let gates = per_zone(1);
    let nodes = fleet();
    let alerts = AlertsSeen::NotRead;
    let observed = observe(&nodes, &alerts, "2026-12-14T00:00:00Z");
    let gate = as_gate(&observed, &gates);
    let a = e("a", "n0", "1", None);
    let b = e("b", "n1", "2", None);
    let cache = vec![a.clone(), b.clone()];
    let admissions = Admissions::default();
    assert_eq!(
        admissions.decide_gated(&a, &cache, 0, &gate),
        Ok(SlotDecision::Admitted)
    );
    let waited = admissions.decide_gated(&b, &cache, 0, &gate);
    assert!(
        matches!(&waited, Err(GateDecision::Wait { reason: GateReason::ZoneBudget, message }) if message.contains("a (node n0)")),
        "{waited:?}"
    );
    assert_eq!(admissions.len(), 1, "the wait is not recorded");
    // A started one is not gated again.
    assert_eq!(
        admissions.decide_gated(&a, &cache, 0, &gate),
        Ok(SlotDecision::Admitted)
    );
    // A slot wait comes before the gates.
    assert!(matches!(
        admissions.decide_gated(&b, &cache, 1, &gate),
        Ok(SlotDecision::Wait { .. })
    ));
}

#[test]
fn node_views_read_zone_ready_and_cordon() {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    let mk = |zone: Option<&str>, ready: Option<&str>, unschedulable: Option<bool>| {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.labels = zone.map(|z| [(DEFAULT_ZONE_LABEL.to_string(), z.to_string())].into());
        n.spec = Some(NodeSpec {
            unschedulable,
            ..NodeSpec::default()
        });
        n.status = ready.map(|s| NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: s.into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        });
        FleetNode::of(&n, DEFAULT_ZONE_LABEL)
    };
    let cases = [
        (
            "ready, zoned",
            mk(Some("a"), Some("True"), None),
            Some("a"),
            true,
            false,
        ),
        (
            "not ready",
            mk(None, Some("False"), Some(false)),
            None,
            false,
            false,
        ),
        (
            "unknown",
            mk(None, Some("Unknown"), None),
            None,
            false,
            false,
        ),
        ("no condition yet", mk(None, None, None), None, false, false),
        (
            "cordoned",
            mk(None, Some("True"), Some(true)),
            None,
            true,
            true,
        ),
    ];
    for (case, view, zone, ready, cordoned) in cases {
        assert_eq!(view.name, "n1", "{case}");
        assert_eq!(view.zone.as_deref(), zone, "{case}");
        assert_eq!(view.ready, ready, "{case}");
        assert_eq!(view.cordoned, cordoned, "{case}");
    }
}

/// The webhook asks for a NodeMaintenance not in its cache yet, with no
/// creation time ("~" sorts after any): it queues behind every other.
#[test]
fn a_new_one_not_in_the_cache_queues_last() {
    let gates = max_unavailable("1", 0);
    let nodes = fleet();
    let alerts = AlertsSeen::NotRead;
    let observed = observe(&nodes, &alerts, "2026-12-14T00:00:00Z");
    let all = vec![e("b", "n2", "2026-12-13T00:00:00Z", None)];
    let new = e("new", "n3", "~", None);
    let got = may_start(&new, &all, &observed, &gates);
    assert!(
        matches!(&got, GateDecision::Wait { reason: GateReason::MaxUnavailable, message }
            if message.contains("n2 (b starts first)")),
        "{got:?}"
    );
    assert_eq!(
        may_start(&all[0], &all, &observed, &gates),
        GateDecision::Start
    );
}

/// The slots and a budget together: an earlier maintenance a zone holds
/// takes no slot ahead of a later one in a free zone; one that would start
/// still does.
#[test]
fn a_gate_held_maintenance_takes_no_slot_ahead() {
    let gates = per_zone(1);
    let nodes = fleet();
    let alerts = AlertsSeen::NotRead;
    let observed = observe(&nodes, &alerts, "2026-12-14T00:00:00Z");
    let gate = as_gate(&observed, &gates);
    let zone_of = |n: &str| {
        nodes
            .iter()
            .find(|v| v.name == n)
            .and_then(|v| v.zone.clone())
    };
    let other_zone = nodes
        .iter()
        .find(|v| v.zone != zone_of("n0"))
        .map(|v| v.name.clone())
        .expect("a node in another zone");
    let running = e("a", "n0", "1", Some(crate::MaintenancePhase::Running));
    let held = e("b", "n1", "2", None);
    assert_eq!(
        zone_of("n1"),
        zone_of("n0"),
        "the fleet puts n0 and n1 in one zone"
    );
    let later = e("c", &other_zone, "3", None);
    let cache = vec![running.clone(), held.clone(), later.clone()];
    let admissions = Admissions::default();
    let c = admissions.decide_gated(&later, &cache, 2, &gate);
    assert_eq!(
        c,
        Ok(SlotDecision::Admitted),
        "b waits for its zone, c takes the free slot"
    );
    assert_eq!(admissions.len(), 1);
    // Without the zone gate b would start: c waits for the slot behind it.
    let admissions = Admissions::default();
    let no_gate = |_: &Entry, _: &[Entry]| None::<GateDecision>;
    assert!(matches!(
        admissions.decide_gated(&later, &cache, 2, no_gate),
        Ok(SlotDecision::Wait { position: 1, .. })
    ));
}

/// `--fleet-node-selector`: maintenances of nodes outside the selection
/// neither count against the budgets nor are held by them.
#[test]
fn budgets_count_only_the_selected_nodes() {
    use crate::MaintenancePhase;
    let selected = Gates {
        max_per_zone: 1,
        max_unavailable: Some(MaxUnavailable::Nodes(1)),
        node_selector: [("pool".to_string(), "blue".to_string())].into(),
        ..Gates::default()
    };
    // The caller keeps only the selected nodes as views: n0..n4 here.
    let nodes: Vec<FleetNode> = fleet().into_iter().take(5).collect();
    let alerts = AlertsSeen::NotRead;
    let observed = observe(&nodes, &alerts, "2026-12-14T00:00:00Z");
    let cases = [
        (
            "a maintenance outside the pool holds no one",
            vec![e("red", "n7", "1", Some(MaintenancePhase::Running))],
            "n1",
            true,
        ),
        (
            "one inside does",
            vec![e("blue", "n2", "1", Some(MaintenancePhase::Running))],
            "n1",
            false,
        ),
        (
            "a node outside the pool is held by none",
            vec![e("blue", "n2", "1", Some(MaintenancePhase::Running))],
            "n8",
            true,
        ),
    ];
    for (case, mut all, node, starts) in cases {
        let me = e("me", node, "9", None);
        all.push(me.clone());
        let got = may_start(&me, &all, &observed, &selected);
        assert_eq!(got == GateDecision::Start, starts, "{case}: {got:?}");
    }
}

/// What [`turn`] answers in a row of [`slots_and_each_gate_combined`].
#[derive(Debug, PartialEq)]
enum Want {
    Start,
    /// Waits for a slot at `position`, these ahead of it.
    Slot(usize, &'static [&'static str]),
    Gate(GateReason),
}

/// (name, --max-concurrent-maintenances, gates, all with `me` last, alerts, answer)
type Row<'a> = (&'a str, usize, Gates, Vec<Entry>, &'a AlertsSeen, Want);

/// [`turn`], the one decision of the controller and the webhook's warning,
/// over the slots with each gate: `me` is the last entry of `all`. Zones of
/// [`fleet`]: n0-n4 "a", n5-n7 "b".
#[test]
fn slots_and_each_gate_combined() {
    use crate::rules::slots::turn;
    let firing = AlertsSeen::Read(vec![alert("EtcdDown", "critical", "firing")]);
    let friday = "2026-12-11T12:00:00Z"; // outside the Berlin window (Saturday 02:00 local)
    #[rustfmt::skip]
    let cases: Vec<Row> = vec![
        ("slots alone: behind the holder", 1, Gates::default(),
            vec![e("a", "n0", "1", Some(Running)), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Slot(1, &["a"])),
        ("slots alone: behind the holder and an earlier waiter", 1, Gates::default(),
            vec![e("a", "n0", "1", Some(Running)), e("b", "n1", "2", None), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Slot(2, &["a", "b"])),
        ("zone: an earlier one held by its zone takes no slot, another zone starts", 2, per_zone(1),
            vec![e("a", "n0", "1", Some(Running)), e("b", "n1", "2", None), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Start),
        ("zone: the same zone waits for it", 2, per_zone(1),
            vec![e("a", "n0", "1", Some(Running)), e("b", "n1", "2", None), e("me", "n2", "3", None)], &AlertsSeen::NotRead, Want::Gate(GateReason::ZoneBudget)),
        ("zone: every slot in use, the slot comes first", 2, per_zone(1),
            vec![e("a", "n0", "1", Some(Running)), e("c", "n5", "2", Some(Running)), e("me", "n8", "3", None)], &AlertsSeen::NotRead, Want::Slot(1, &["a", "c"])),
        ("max-unavailable: held like the earlier one", 2, max_unavailable("1", 0),
            vec![e("a", "n0", "1", Some(Running)), e("b", "n1", "2", None), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Gate(GateReason::MaxUnavailable)),
        ("window: a free slot, the window holds it", 2, windows(&[BERLIN_SATURDAY]),
            vec![e("a", "n0", "1", Some(Running)), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Gate(GateReason::OutsideWindow)),
        ("window: no free slot, the slot is named (earlier waiters held by the window take none)", 1, windows(&[BERLIN_SATURDAY]),
            vec![e("a", "n0", "1", Some(Running)), e("b", "n1", "2", None), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Slot(1, &["a"])),
        ("pause: a failed one holds a free slot's start", 2, pause(),
            vec![e("f", "n3", "1", Some(Failed)), e("me", "n5", "3", None)], &AlertsSeen::NotRead, Want::Gate(GateReason::PausedAfterFailure)),
        ("alerts: firing holds a free slot's start", 1, alert_gate(r#"severity="critical""#),
            vec![e("me", "n5", "3", None)], &firing, Want::Gate(GateReason::AlertsFiring)),
        ("started: no slot or gate stops it", 1, per_zone(1),
            vec![e("a", "n0", "1", Some(Running)), e("me", "n1", "3", Some(Succeeded))], &AlertsSeen::NotRead, Want::Start),
    ];
    for (name, max, gates, all, alerts, want) in cases {
        let nodes = fleet();
        let observed = observe(&nodes, alerts, friday);
        let me = all.last().expect("me").clone();
        let t = turn(&me, &all, max, as_gate(&observed, &gates));
        let ok = match (&t.decision, &want) {
            (Ok(SlotDecision::Admitted), Want::Start) => t.ahead.is_empty(),
            (Ok(SlotDecision::Wait { position, .. }), Want::Slot(p, names)) => {
                position == p && t.ahead == *names
            }
            (Err(GateDecision::Wait { reason, .. }), Want::Gate(r)) => {
                reason == r && t.ahead.is_empty()
            }
            _ => false,
        };
        assert!(ok, "{name}: want {want:?}, got {t:?}");
    }
}

#[test]
fn a_wait_for_the_node_list_names_the_budget_that_needs_it() {
    let both = Gates {
        max_unavailable: Some(MaxUnavailable::Nodes(2)),
        max_per_zone: 1,
        ..Gates::default()
    };
    let cases = [
        (both, GateReason::MaxUnavailable, "--max-unavailable"),
        (
            per_zone(1),
            GateReason::ZoneBudget,
            "--max-concurrent-per-zone",
        ),
        (
            windows(&[BERLIN_SATURDAY]),
            GateReason::OutsideWindow,
            "--maintenance-window",
        ),
    ];
    let alerts = AlertsSeen::NotRead;
    for (gates, reason, flag) in cases {
        let inputs = GateInputs {
            nodes: &[],
            nodes_listed: false,
            now: ts("2026-12-11T12:00:00Z"),
            alerts: &alerts,
        };
        let me = e("me", "n1", "1", None);
        match may_start(&me, std::slice::from_ref(&me), &inputs, &gates) {
            GateDecision::Wait { reason: r, message } => {
                assert_eq!(r, reason, "{flag}: {message}");
                assert!(message.contains(flag), "{message}");
                let unlisted = message.contains("list and watch nodes");
                assert_eq!(
                    unlisted,
                    reason != GateReason::OutsideWindow,
                    "only the budgets wait for the list: {message}"
                );
            }
            GateDecision::Start => panic!("{flag}: started without the node list"),
        }
    }
}
