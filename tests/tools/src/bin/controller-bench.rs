//! `make bench`, controller part: time from creating a NodeMaintenance to
//! `Succeeded` for a kwok node with N pods (zero grace period), the API
//! requests the controller spent on it, the controller's RSS, and how soon a
//! drain blocked by a PodDisruptionBudget finishes once the PDB is deleted.
//! Runs the release build under its ServiceAccount against the local cluster.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, ResourceExt};
use nmo_tests::fixtures::{GROUP_KEY, TestBed, is_ready};
use nmo_tests::process::{Running, free_port, http_get_local, rss_kib, service_account_kubeconfig};
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

fn requests_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("rest_client_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let pods: usize = std::env::var("BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(110);
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let client = nmo_tests::admin_client().await?;
    nmo_tests::manifests::install_controller_prereqs(&client).await?;
    let bed = TestBed::new(client.clone(), "bench").await?;
    let result = bench(&bed, pods, runs).await;
    bed.teardown().await;
    result
}

async fn bench(bed: &TestBed, pods: usize, runs: usize) -> anyhow::Result<()> {
    let dir = nmo_tests::repo_root().join(".cluster/test-logs");
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("bench-controller.kubeconfig");
    service_account_kubeconfig(&bed.client, "nmo-system", "nmo-controller", &kubeconfig).await?;
    let metrics_port = free_port()?;
    let args = vec![
        format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
        // The bench scrapes plain HTTP.
        "--metrics-secure=false".to_string(),
        "--health-probe-bind-address=0".to_string(),
        format!("--nodemaintenance-selector={GROUP_KEY}={}", bed.group),
        "--zap-level=info".to_string(),
    ];
    let ctrl = Running::start("nmo-controller", &args, &kubeconfig, &[])?;
    until(
        "controller metrics endpoint",
        Duration::from_secs(30),
        || async {
            Ok(match http_get_local(metrics_port, "/metrics").await {
                Ok(_) => Poll::Ready(()),
                Err(e) => Poll::Pending(e.to_string()),
            })
        },
    )
    .await?;

    println!(
        "controller drain benchmark: {pods} pods per node (kwok, grace period 0), {runs} runs"
    );
    let mut times = Vec::new();
    for run in 1..=runs {
        let node = bed.node(&format!("n{run}"), false).await?.name_any();
        let mut created = futures::stream::iter(0..pods)
            .map(|i| {
                let node = node.clone();
                async move { bed.bare_pod(&format!("p{run}-{i}"), &node).await }
            })
            .buffer_unordered(16);
        use futures::StreamExt;
        while let Some(r) = created.next().await {
            r?;
        }
        until(
            &format!("{pods} pods Ready on {node}"),
            Duration::from_secs(120),
            || async {
                let by_node = bed.pods_by_node().await?;
                let ready = by_node
                    .get(&node)
                    .map(|v| v.iter().filter(|p| is_ready(p)).count())
                    .unwrap_or(0);
                Ok(if ready == pods {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{ready} ready"))
                })
            },
        )
        .await?;

        let before = requests_total(&http_get_local(metrics_port, "/metrics").await?);
        let name = format!("{}-run{run}", bed.group);
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {GROUP_KEY: bed.group}},
            "spec": {"nodeName": node, "reason": "bench"}
        }))?;
        let api: Api<NodeMaintenance> = Api::all(bed.client.clone());
        let start = Instant::now();
        api.create(&PostParams::default(), &nm).await?;
        until("Succeeded", Duration::from_secs(120), || async {
            let nm = api.get(&name).await?;
            Ok(if nm.phase() == Some(&MaintenancePhase::Succeeded) {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{:?}", nm.status))
            })
        })
        .await
        .context("maintenance did not finish")?;
        let took = start.elapsed();
        let after = requests_total(&http_get_local(metrics_port, "/metrics").await?);
        println!(
            "  run {run}: create -> Succeeded in {:.2} s, {} API requests by the controller",
            took.as_secs_f64(),
            after - before
        );
        times.push(took.as_secs_f64());
        api.delete(&name, &Default::default()).await?;
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let rss = rss_kib(ctrl.child.id()).unwrap_or(0);
    println!(
        "controller: median create -> Succeeded {:.2} s (target <= 3 s), RSS {:.1} MiB",
        times[times.len() / 2],
        rss as f64 / 1024.0
    );
    resume_after_pdb_deleted(bed, runs.max(5)).await
}

/// A maintenance whose last pod is held by a PDB; the PDB is deleted 0, 1,
/// 2, ... s after the drain blocked (so the deletion falls at every point of
/// the 5 s retry cycle); the time from the delete to phase Succeeded.
async fn resume_after_pdb_deleted(bed: &TestBed, runs: usize) -> anyhow::Result<()> {
    println!("resume after a PDB is deleted: {runs} runs, deleted 0-4 s after the drain blocked");
    let api: Api<NodeMaintenance> = Api::all(bed.client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(bed.client.clone(), &bed.namespace);
    let mut took = Vec::new();
    for run in 0..runs {
        let node = bed.node(&format!("r{run}"), false).await?.name_any();
        let (pod, pdb) = (format!("g{run}"), format!("pdb{run}"));
        bed.bare_pod(&pod, &node).await?;
        bed.pdb(&pdb, &pod, 1).await?;
        bed.wait_pdb_status(&pdb, 1, Duration::from_secs(60))
            .await?;
        let name = format!("{}-resume{run}", bed.group);
        let nm: NodeMaintenance = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {GROUP_KEY: bed.group}},
            "spec": {"nodeName": node, "reason": "bench"}
        }))?;
        api.create(&PostParams::default(), &nm).await?;
        let blocked = |nm: Option<&NodeMaintenance>| {
            nm.and_then(|nm| nm.status.as_ref())
                .is_some_and(|s| s.pending_pods == [pod.clone()] && !s.last_error.is_empty())
        };
        within(
            await_condition(api.clone(), &name, blocked),
            &name,
            "blocked",
        )
        .await?;
        // Deliberately spread over the retry cycle: a phase, not a synchronisation.
        let phase = Duration::from_secs((run % 5) as u64);
        tokio::time::sleep(phase).await;
        let start = Instant::now();
        pdbs.delete(&pdb, &DeleteParams::default()).await?;
        let done = |nm: Option<&NodeMaintenance>| {
            nm.and_then(|nm| nm.phase()) == Some(&MaintenancePhase::Succeeded)
        };
        within(
            await_condition(api.clone(), &name, done),
            &name,
            "Succeeded",
        )
        .await?;
        let ms = start.elapsed().as_millis();
        println!(
            "  resume after a PDB is deleted: {ms} ms (deleted {}s after the drain blocked)",
            phase.as_secs()
        );
        took.push(ms);
        api.delete(&name, &Default::default()).await?;
    }
    took.sort_unstable();
    println!(
        "controller: resume after a PDB is deleted: median {} ms, max {} ms (the 5 s retry alone: up to 5000 ms)",
        took[took.len() / 2],
        took[took.len() - 1]
    );
    Ok(())
}

async fn within<T>(
    wait: impl std::future::Future<Output = Result<T, kube::runtime::wait::Error>>,
    name: &str,
    what: &str,
) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .with_context(|| format!("NodeMaintenance {name} not {what} within 60 s"))?
        .with_context(|| format!("watching NodeMaintenance {name}"))
}
