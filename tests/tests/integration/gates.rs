//! The fleet gates through the real API server: each gate holds a
//! maintenance (phase Pending, `Queued` with the gate's reason, one event
//! named after it, the webhook's pre-flight warning, the
//! `nmo_nodemaintenance_waiting` series) and lets it go when its cause
//! does. Each test counts only its own nodes (`--fleet-node-selector`) in
//! zones of its own label, so tests of the suite run side by side. The alert
//! gate, which needs the local Prometheus, is in suite `prometheus`.

use std::time::Duration;

use k8s_openapi::jiff::{Timestamp, ToSpan as _};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use nmo_tests::controller_env::{ControllerEnv as Env, pdb_in, pod_in};
use nmo_tests::fixtures::GROUP_KEY;
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{TestWebhook, create_with_warnings};
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

pub const ZONE_LABEL: &str = "nmo-test/zone";
const WAIT: Duration = Duration::from_secs(90);

/// A test's gates world: a controller and a webhook with the same gate
/// flags (as both Deployments carry them), counting only this test's nodes.
pub struct Gated {
    pub env: Env,
    pub webhook: TestWebhook,
    pub metrics_port: u16,
}

impl Gated {
    pub async fn new(prefix: &str, gate_flags: &[&str]) -> Gated {
        Gated::with_slots(prefix, 0, gate_flags).await
    }

    /// [`Gated::new`] with `--max-concurrent-maintenances=max` on both.
    pub async fn with_slots(prefix: &str, max: usize, gate_flags: &[&str]) -> Gated {
        let mut env = Env::new(prefix, max).await;
        let mut flags: Vec<String> = gate_flags.iter().map(|f| f.to_string()).collect();
        flags.push(format!(
            "--fleet-node-selector={GROUP_KEY}={}",
            env.bed.group
        ));
        flags.push(format!("--zone-label={ZONE_LABEL}"));
        env.flags = flags.clone();
        let metrics_port = env.plain_metrics_controller(&[]).await;
        let client = env.client();
        nmo_tests::manifests::install_webhook_prereqs(&client)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let mut webhook_flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        // The webhook counts what the controller counts: this test's own.
        let slots = format!("--max-concurrent-maintenances={max}");
        let mine = format!("--nodemaintenance-selector={GROUP_KEY}={}", env.bed.group);
        webhook_flags.extend(["--warnings-timeout=5s", slots.as_str(), mine.as_str()]);
        let webhook = TestWebhook::start(&client, &env.bed.group, &webhook_flags).await;
        webhook.register(&client, &env.bed.group).await;
        Gated {
            env,
            webhook,
            metrics_port,
        }
    }

    /// A Ready node of this test in `zone`, optionally cordoned (by someone else).
    pub async fn node(&self, suffix: &str, zone: &str, cordoned: bool) -> String {
        let name = self
            .env
            .bed
            .node(suffix, cordoned)
            .await
            .expect("node")
            .name_any();
        self.env
            .nodes()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {ZONE_LABEL: zone}}})),
            )
            .await
            .expect("zone label");
        name
    }

    /// Create NodeMaintenance `short` for `node` through the API server and
    /// this test's webhook; the warnings it answered with.
    pub async fn create(&self, short: &str, node: &str) -> Vec<String> {
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": self.env.n(short), "labels": {GROUP_KEY: self.env.bed.group}},
            "spec": {"nodeName": node, "reason": "fleet gates test"}
        }))
        .expect("nm json");
        create_with_warnings(&self.env.client(), &nm, false)
            .await
            .unwrap_or_else(|e| panic!("create {short}: {e:?}"))
    }

    /// Wait until `short` is Pending and held by `reason`; its Queued message.
    pub async fn wait_held(&self, short: &str, reason: &str) -> String {
        let nm = self
            .env
            .wait_nm(
                &self.env.n(short),
                &format!("{short} Pending, Queued {reason}"),
                |nm| nm.phase() == Some(&MaintenancePhase::Pending) && queued(nm).0 == reason,
            )
            .await;
        queued(&nm).1
    }

    pub async fn wait_phase(&self, short: &str, phase: MaintenancePhase) -> NodeMaintenance {
        self.env.wait_phase(&self.env.n(short), phase).await
    }

    pub async fn delete(&self, short: &str) {
        let name = self.env.n(short);
        self.env
            .nms()
            .delete(&name, &DeleteParams::default())
            .await
            .expect("delete");
        self.env.wait_gone(&name).await;
    }

    /// Wait until `nmo_nodemaintenance_waiting{reason=label}` reads `want`.
    pub async fn wait_waiting(&self, label: &str, want: f64) {
        let port = self.metrics_port;
        let series = format!("nmo_nodemaintenance_waiting{{reason=\"{label}\"}}");
        until(&format!("{series} = {want}"), WAIT, || async {
            let text = nmo_tests::process::http_get_local(port, "/metrics").await?;
            let got = nmo_tests::scrape::sum(&text, &series);
            Ok(if got == want {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{series} = {got}"))
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }

    pub async fn teardown(self) {
        nmo_tests::webhook_pod::unregister(&self.env.client(), &self.env.bed.group).await;
        drop(self.webhook);
        self.env.teardown().await;
    }
}

/// (reason, message) of the `Queued` condition when it holds.
pub fn queued(nm: &NodeMaintenance) -> (String, String) {
    nm.status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Queued" && c.status == "True")
        })
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

/// The one warning line naming `reason` (`will not start yet (<reason>): ...`).
pub fn gate_warning<'a>(warnings: &'a [String], reason: &str) -> &'a str {
    let want = format!("({reason})");
    warnings
        .iter()
        .find(|w| w.contains(&want))
        .unwrap_or_else(|| panic!("no warning naming {reason}: {warnings:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_holds_a_maintenance_until_it_opens() {
    // A window opening at the start of a minute 40-100 s away, for 2 minutes.
    let now = Timestamp::now();
    let opens = now
        .checked_add(100.seconds())
        .expect("time")
        .round(k8s_openapi::jiff::Unit::Minute)
        .expect("minute");
    let opens = if opens.duration_since(now).as_secs() < 40 {
        opens.checked_add(1.minute()).expect("time")
    } else {
        opens
    };
    let at = opens.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    let window = format!(
        "--maintenance-window={} {} * * * 2m UTC",
        at.minute(),
        at.hour()
    );
    let g = Gated::new("gate-window", &[&window]).await;
    let node = g.node("w1", "a", false).await;
    let warnings = g.create("a", &node).await;
    let line = gate_warning(&warnings, "OutsideWindow");
    assert!(line.contains("next window starts"), "{line}");
    let message = g.wait_held("a", "OutsideWindow").await;
    assert!(
        message.contains("next window starts") && message.contains("--maintenance-window"),
        "{message}"
    );
    g.env.wait_event(&g.env.n("a"), "OutsideWindow").await;
    g.wait_waiting("outside_window", 1.0).await;
    // The window opens up to ~2 minutes after the create.
    let nm = g
        .env
        .wait_nm_within(
            &g.env.n("a"),
            "a Succeeded once the window opened",
            Duration::from_secs(240),
            |nm| nm.phase() == Some(&MaintenancePhase::Succeeded),
        )
        .await;
    let started = nm
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Queued"))
        .map(|c| c.last_transition_time.0)
        .expect("Queued condition");
    assert!(
        started >= opens,
        "started at {started}, before the window opened at {opens}"
    );
    g.wait_waiting("outside_window", 0.0).await;
    g.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_maintenance_per_zone() {
    let g = Gated::new("gate-zone", &["--max-concurrent-per-zone=1"]).await;
    let a1 = g.node("a1", "a", false).await;
    let a2 = g.node("a2", "a", false).await;
    let b1 = g.node("b1", "b", false).await;
    g.create("a1", &a1).await;
    g.wait_phase("a1", MaintenancePhase::Succeeded).await;
    let warnings = g.create("a2", &a2).await;
    let line = gate_warning(&warnings, "ZoneBudget");
    assert!(
        line.contains(&g.env.n("a1")),
        "names the one running: {line}"
    );
    assert!(
        !g.create("b1", &b1)
            .await
            .iter()
            .any(|w| w.contains("will not start yet")),
        "zone b is free"
    );
    g.wait_phase("b1", MaintenancePhase::Succeeded).await;
    let message = g.wait_held("a2", "ZoneBudget").await;
    assert!(
        message.contains("\"a\"") && message.contains(&g.env.n("a1")),
        "names the zone and its maintenance: {message}"
    );
    g.env.wait_event(&g.env.n("a2"), "ZoneBudget").await;
    g.wait_waiting("zone_budget", 1.0).await;
    g.delete("a1").await;
    g.wait_phase("a2", MaintenancePhase::Succeeded).await;
    g.wait_waiting("zone_budget", 0.0).await;
    g.teardown().await;
}

/// The webhook's warning is the controller's own decision
/// (`shared::rules::slots::turn`): two slots, one maintenance per zone; m1
/// holds zone a (and a slot), m2 of zone a waits for its zone and so takes
/// no slot; m3 in zone b starts at once, and its create is warned of no
/// wait (the webhook used to count m2 ahead of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_warning_and_the_controller_agree_with_slots_and_a_zone_budget() {
    let g = Gated::with_slots("gate-agree", 2, &["--max-concurrent-per-zone=1"]).await;
    let a1 = g.node("a1", "a", false).await;
    let a2 = g.node("a2", "a", false).await;
    let b1 = g.node("b1", "b", false).await;
    g.create("m1", &a1).await;
    g.wait_phase("m1", MaintenancePhase::Succeeded).await;
    let held = g.create("m2", &a2).await;
    let line = gate_warning(&held, "ZoneBudget");
    assert!(
        !held.iter().any(|w| w.contains("will wait:")),
        "m2 waits for its zone, not a slot: {held:?}"
    );
    g.wait_held("m2", "ZoneBudget").await;
    let free = g.create("m3", &b1).await;
    assert!(
        !free
            .iter()
            .any(|w| w.contains("will wait:") || w.contains("will not start yet")),
        "m3 starts at once, so no wait is warned of: {free:?}"
    );
    g.wait_phase("m3", MaintenancePhase::Succeeded).await;
    println!("m2 warned: {line}; m3 warned of no wait and started");
    g.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_nodes_count_a_cordon_by_someone_else() {
    // 50% of 4 nodes: 2 may be unavailable; one is cordoned already.
    let g = Gated::new("gate-unavail", &["--max-unavailable=50%"]).await;
    let n1 = g.node("n1", "a", false).await;
    let n2 = g.node("n2", "b", false).await;
    g.node("n3", "c", false).await;
    let foreign = g.node("n4", "d", true).await;
    g.create("m1", &n1).await;
    g.wait_phase("m1", MaintenancePhase::Succeeded).await;
    let warnings = g.create("m2", &n2).await;
    let line = gate_warning(&warnings, "MaxUnavailable");
    assert!(line.contains("3 of 4 nodes"), "{line}");
    let message = g.wait_held("m2", "MaxUnavailable").await;
    assert!(
        message.contains(&foreign) && message.contains(&n1) && message.contains("50%"),
        "names the unavailable nodes and the limit: {message}"
    );
    g.env.wait_event(&g.env.n("m2"), "MaxUnavailable").await;
    g.wait_waiting("max_unavailable", 1.0).await;
    // Someone uncordons their node: the budget has room again, and the
    // node's change wakes m2 at once (not at its next look, 2 s later).
    // Watched, so the figure is not a polling interval.
    let (api, m2) = (g.env.nms(), g.env.n("m2"));
    let started = tokio::spawn(async move {
        let not_pending = |nm: Option<&NodeMaintenance>| {
            nm.and_then(|nm| nm.phase())
                .is_some_and(|p| *p != MaintenancePhase::Pending)
        };
        let watch = kube::runtime::wait::await_condition(api, &m2, not_pending);
        tokio::time::timeout(WAIT, watch).await
    });
    g.env
        .nodes()
        .patch(
            &foreign,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .expect("uncordon");
    let uncordoned = std::time::Instant::now();
    started
        .await
        .expect("the watch task")
        .expect("m2 starts within the wait")
        .expect("the watch of m2");
    println!(
        "budget wake figure: m2 started {:.3} s after the node that held --max-unavailable was uncordoned (target 0.5 s)",
        uncordoned.elapsed().as_secs_f64()
    );
    g.wait_phase("m2", MaintenancePhase::Succeeded).await;
    g.wait_waiting("max_unavailable", 0.0).await;
    g.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_maintenance_pauses_the_others_until_it_is_deleted() {
    let g = Gated::new("gate-pause", &["--pause-after-failure"]).await;
    let bad = g.node("bad", "a", false).await;
    let next = g.node("next", "b", false).await;
    // A maintenance that fails: its pod a PodDisruptionBudget holds, 2 s allowed.
    let ns = g.env.bed.namespace.clone();
    pod_in(&g.env, &ns, "guarded", &bad).await;
    pdb_in(&g.env, &ns, "guard", "guarded").await;
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": g.env.n("bad"), "labels": {GROUP_KEY: g.env.bed.group}},
        "spec": {"nodeName": bad, "reason": "fails", "drainTimeout": "2s",
                 "drainTimeoutAction": "Fail"}
    }))
    .expect("nm json");
    g.env
        .nms()
        .create(&Default::default(), &nm)
        .await
        .expect("create");
    g.wait_phase("bad", MaintenancePhase::Failed).await;
    let warnings = g.create("next", &next).await;
    let line = gate_warning(&warnings, "PausedAfterFailure");
    assert!(line.contains(&g.env.n("bad")), "{line}");
    let message = g.wait_held("next", "PausedAfterFailure").await;
    assert!(
        message.contains(&g.env.n("bad")) && message.contains("--pause-after-failure"),
        "{message}"
    );
    g.env
        .wait_event(&g.env.n("next"), "PausedAfterFailure")
        .await;
    g.wait_waiting("paused_after_failure", 1.0).await;
    g.delete("bad").await;
    g.wait_phase("next", MaintenancePhase::Succeeded).await;
    g.teardown().await;
}

/// Wait until `check` holds of every NodeMaintenance of `g` (by short name).
pub async fn wait_all(
    g: &Gated,
    within: Duration,
    what: &str,
    check: impl Fn(&[(String, Option<MaintenancePhase>, String)]) -> bool,
) {
    let api = g.env.nms();
    let prefix = format!("{}-", g.env.bed.group);
    until(what, within, || async {
        let list = api.list(&Default::default()).await?;
        let mine: Vec<(String, Option<MaintenancePhase>, String)> = list
            .items
            .iter()
            .filter_map(|nm| {
                let short = nm.name_any().strip_prefix(&prefix)?.to_string();
                Some((short, nm.phase().cloned(), queued(nm).0))
            })
            .collect();
        Ok(if check(&mine) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{mine:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_prometheus_holds_every_start() {
    // A port nothing listens on (bound, then closed): fail closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let url = format!("--block-on-alerts-url=http://127.0.0.1:{port}");
    let g = Gated::new("gate-noprom", &[&url]).await;
    let node = g.node("p1", "a", false).await;
    let warnings = g.create("a", &node).await;
    let line = gate_warning(&warnings, "AlertsFiring");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    let message = g.wait_held("a", "AlertsFiring").await;
    assert!(
        message.contains(&format!("127.0.0.1:{port}")),
        "names the URL it could not read: {message}"
    );
    g.teardown().await;
}

/// `--settle-after=4s` with one maintenance per zone: once a1 is deleted
/// (its node given back), a2 of the same zone waits with reason Settling,
/// naming a1's node and the time left, and starts once the pause has passed
/// (measured from the node's `MaintenanceInProgress` condition, which has
/// whole seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_after_holds_the_next_node_of_a_zone_and_releases_it_on_time() {
    const SETTLE: Duration = Duration::from_secs(4);
    let g = Gated::new(
        "gate-settle",
        &["--max-concurrent-per-zone=1", "--settle-after=4s"],
    )
    .await;
    let a1 = g.node("a1", "a", false).await;
    let a2 = g.node("a2", "a", false).await;
    g.create("a1", &a1).await;
    g.wait_phase("a1", MaintenancePhase::Succeeded).await;
    g.create("a2", &a2).await;
    g.wait_held("a2", "ZoneBudget").await;
    let deleted = std::time::Instant::now();
    g.delete("a1").await;
    let message = g.wait_held("a2", "Settling").await;
    println!(
        "settle figure: a2 held {} ms after a1's delete: {message}",
        deleted.elapsed().as_millis()
    );
    assert!(
        message.contains(&format!("waits for node {a1} to settle"))
            && message.contains("--settle-after=4s"),
        "names the node before and the flag: {message}"
    );
    g.env.wait_event(&g.env.n("a2"), "Settling").await;
    g.wait_waiting("settling", 1.0).await;
    let started = g
        .env
        .wait_nm(&g.env.n("a2"), "a2 started (Running or Succeeded)", |nm| {
            matches!(
                nm.status.as_ref().and_then(|s| s.phase.clone()),
                Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
            )
        })
        .await;
    let took = deleted.elapsed();
    println!(
        "settle figure: a2 started {} ms after a1's delete (--settle-after=4s, phase {:?})",
        took.as_millis(),
        started.status.and_then(|s| s.phase)
    );
    // The condition's time has whole seconds: up to 1 s early; the 2 s
    // look of a waiting maintenance (and the give-back) make it late.
    assert!(
        took + Duration::from_secs(1) >= SETTLE,
        "started before the pause: {took:?}"
    );
    assert!(
        took <= SETTLE + Duration::from_secs(4),
        "held past the pause: {took:?}"
    );
    g.teardown().await;
}
