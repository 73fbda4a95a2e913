//! The controller's /metrics through a real API server: controller-runtime's
//! and client-go's series under their upstream names and labels (so
//! upstream's dashboards and alerts work unchanged), counting what one
//! maintenance did, and the per-maintenance gauges.

use kube::api::DeleteParams;
use nmo_tests::controller_env::{ControllerEnv as Env, LONG};
use nmo_tests::wait::{Poll, until};

/// One sample of the Prometheus text format: name, labels, value.
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// The samples of a Prometheus text exposition (comments skipped).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value = value.parse::<f64>().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
                None => (series, Vec::new()),
            };
            Some(Sample {
                name: name.to_string(),
                labels,
                value,
            })
        })
        .collect()
}

/// `a="x",b="y"` (values with `\"` and `\\` escapes).
fn parse_labels(mut s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => value.push(chars.next()?.1),
                '"' => break i,
                c => value.push(c),
            }
        };
        out.push((key.to_string(), value));
        s = rest[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

/// The sum of the samples named `name` whose labels include all of `want`;
/// None when there is no such sample.
fn sum(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = samples(text)
        .into_iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

const C: (&str, &str) = ("controller", "nodemaintenance");
const Q: (&str, &str) = ("name", "nodemaintenance");

/// A series to find: name, labels it must carry, and whether its sum must be
/// above zero (otherwise it only has to be there).
type Check = (&'static str, Vec<(&'static str, &'static str)>, bool);

/// What is still missing from `text` after one maintenance ran and was deleted.
fn missing_after_one_maintenance(text: &str) -> Vec<String> {
    let checks: Vec<Check> = vec![
        ("controller_runtime_reconcile_total", vec![C], true),
        // The cleanup after the delete ends with no requeue: a success.
        (
            "controller_runtime_reconcile_total",
            vec![C, ("result", "success")],
            true,
        ),
        (
            "controller_runtime_reconcile_total",
            vec![C, ("result", "error")],
            false,
        ),
        (
            "controller_runtime_reconcile_total",
            vec![C, ("result", "requeue")],
            false,
        ),
        (
            "controller_runtime_reconcile_total",
            vec![C, ("result", "requeue_after")],
            false,
        ),
        ("controller_runtime_reconcile_errors_total", vec![C], false),
        (
            "controller_runtime_terminal_reconcile_errors_total",
            vec![C],
            false,
        ),
        ("controller_runtime_reconcile_panics_total", vec![C], false),
        (
            "controller_runtime_reconcile_time_seconds_count",
            vec![C],
            true,
        ),
        (
            "controller_runtime_reconcile_time_seconds_bucket",
            vec![C],
            true,
        ),
        (
            "controller_runtime_max_concurrent_reconciles",
            vec![C],
            false,
        ),
        ("controller_runtime_active_workers", vec![C], false),
        ("workqueue_depth", vec![Q, C], false),
        ("workqueue_adds_total", vec![Q, C], true),
        ("workqueue_queue_duration_seconds_count", vec![Q, C], true),
        ("workqueue_work_duration_seconds_count", vec![Q, C], true),
        ("workqueue_retries_total", vec![Q, C], false),
        (
            "rest_client_requests_total",
            vec![("code", "200"), ("method", "GET")],
            true,
        ),
        (
            "rest_client_request_duration_seconds_count",
            vec![("verb", "GET")],
            true,
        ),
        ("leader_election_master_status", vec![], false),
    ];
    checks
        .into_iter()
        .filter_map(|(name, labels, positive)| {
            let ok = match sum(text, name, &labels) {
                None => false,
                Some(v) => !positive || v > 0.0,
            };
            (!ok).then(|| {
                format!(
                    "{name}{labels:?}{}",
                    if positive { " > 0" } else { " present" }
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_series_count_one_maintenance() {
    let mut env = Env::new("nm-metrics", 1).await;
    let port = env.plain_metrics_controller(&[]).await;

    let target = env.node_in_maintenance().await;
    let name = env.n("a");
    let scrape = || nmo_tests::process::http_get_local(port, "/metrics");

    // The per-maintenance gauge follows the status the test just observed.
    let phase = [
        ("name", name.as_str()),
        ("node", target.as_str()),
        ("phase", "Succeeded"),
    ];
    until("phase gauge Succeeded = 1", LONG, || async {
        let text = scrape().await?;
        Ok(match sum(&text, "nmo_nodemaintenance_phase", &phase) {
            Some(1.0) => Poll::Ready(()),
            other => Poll::Pending(format!("nmo_nodemaintenance_phase{phase:?} = {other:?}")),
        })
    })
    .await
    .expect("phase gauge");

    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("NodeMaintenance deleted");
    env.wait_gone(&name).await;

    let text = until("upstream series after one maintenance", LONG, || async {
        let text = scrape().await?;
        let missing = missing_after_one_maintenance(&text);
        Ok(if missing.is_empty() {
            Poll::Ready(text)
        } else {
            Poll::Pending(format!("missing: {}", missing.join("; ")))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", nmo_tests::component_log_tails(10)));
    // The old names are gone.
    for old in [
        "nmo_controller_api_requests_total",
        "controller_runtime_reconcile_duration_seconds",
    ] {
        assert!(!text.contains(old), "{old} no longer exposed:\n{text}");
    }
    // A deleted maintenance leaves no per-maintenance series behind.
    assert!(
        sum(
            &text,
            "nmo_nodemaintenance_phase",
            &[("name", name.as_str())]
        )
        .is_none(),
        "no phase series for the deleted {name}:\n{text}"
    );
    env.teardown().await;
}

#[test]
fn the_text_parser_reads_labels_and_sums() {
    let text = "# HELP x y\n\
        rest_client_requests_total{code=\"200\",host=\"h:1\",method=\"GET\"} 3\n\
        rest_client_requests_total{code=\"<error>\",host=\"h:1\",method=\"GET\"} 1\n\
        rest_client_requests_total{code=\"200\",host=\"h:1\",method=\"PATCH\"} 2\n\
        odd{v=\"a\\\"b,c\"} 5\n\
        plain 7\n";
    assert_eq!(
        sum(text, "rest_client_requests_total", &[("code", "200")]),
        Some(5.0)
    );
    assert_eq!(sum(text, "rest_client_requests_total", &[]), Some(6.0));
    assert_eq!(sum(text, "odd", &[("v", "a\"b,c")]), Some(5.0));
    assert_eq!(sum(text, "plain", &[]), Some(7.0));
    assert_eq!(sum(text, "absent", &[]), None);
}

/// Wait until every store of `nmo_controller_kept_entries` is 0.
async fn wait_nothing_kept(port: u16, after: &str) {
    let stores = [
        "node_cache",
        "own_writes",
        "conflict_streaks",
        "node_leases",
        "departures_watched",
        "admissions",
        "node_conditions",
    ];
    until(&format!("nothing kept after {after}"), LONG, || async {
        let text = nmo_tests::process::http_get_local(port, "/metrics").await?;
        let kept: Vec<(&str, Option<f64>)> = stores
            .iter()
            .map(|s| {
                (
                    *s,
                    sum(&text, "nmo_controller_kept_entries", &[("store", s)]),
                )
            })
            .collect();
        Ok(if kept.iter().all(|(_, v)| *v == Some(0.0)) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{kept:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", nmo_tests::component_log_tails(10)));
}

/// What the controller keeps in memory per maintenance or node
/// (`nmo_controller_kept_entries`) goes back to nothing once every
/// maintenance ended, whichever way it ended: deleted with its finalizer
/// taken off by someone else, Failed (a node that does not exist, the
/// object still there), and collected with its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_kept_once_every_maintenance_ended() {
    use kube::ResourceExt as _;
    use kube::api::{Patch, PatchParams};
    use shared::MaintenancePhase;
    let mut env = Env::new("nm-kept", 2).await;
    let port = env.plain_metrics_controller(&[]).await;

    // a: Succeeded, then deleted with its finalizer removed by someone else.
    let target = env.node_in_maintenance().await;
    let a = env.n("a");
    until("kept entries for a running maintenance", LONG, || async {
        let text = nmo_tests::process::http_get_local(port, "/metrics").await?;
        Ok(match sum(&text, "nmo_controller_kept_entries", &[]) {
            Some(v) if v > 0.0 => Poll::Ready(()),
            other => Poll::Pending(format!("sum {other:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    env.nms()
        .delete(&a, &DeleteParams::default())
        .await
        .expect("delete a");
    env.nms()
        .patch(
            &a,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer of a removed by someone else");
    env.wait_gone(&a).await;
    wait_nothing_kept(
        port,
        "a maintenance deleted, its finalizer removed by someone else",
    )
    .await;

    // b: Failed on a node that does not exist, and left there.
    let b = env.n("b");
    env.create_nm(&b, &format!("{}-ghost", env.bed.group)).await;
    env.wait_phase(&b, MaintenancePhase::Failed).await;
    wait_nothing_kept(port, "a maintenance Failed (its node does not exist)").await;

    // c: Succeeded on another node, then the node is deleted: the
    // maintenance goes with it (its ownerReference).
    let other = env
        .bed
        .node("other", false)
        .await
        .expect("second node")
        .name_any();
    assert_ne!(other, target);
    let c = env.n("c");
    env.create_nm(&c, &other).await;
    env.wait_phase(&c, MaintenancePhase::Succeeded).await;
    env.nodes()
        .delete(&other, &DeleteParams::default())
        .await
        .expect("delete the node of c");
    env.wait_gone(&c).await;
    wait_nothing_kept(port, "a maintenance collected with its deleted node").await;

    env.nms()
        .delete(&b, &DeleteParams::default())
        .await
        .expect("delete b");
    env.wait_gone(&b).await;
    wait_nothing_kept(port, "the Failed maintenance deleted").await;
    env.teardown().await;
}
