//! `make bench-scale` (tests/bench-scale.sh starts the plane and its nodes):
//! both services, from their images and with their manifests' arguments,
//! against a plane of 1,000 kwok nodes and 30,000 pods (scale.rs).
//! Prints, against the targets of issue 12 (figures, never assertions):
//! each service's memory idle, after maintenances and across a soak of pod,
//! node and PodDisruptionBudget churn; the webhook's reviews/s; one 30-pod
//! node's create -> Succeeded and delete -> node given back; 100
//! NodeMaintenances created at once (`--max-concurrent-maintenances=0`)
//! until all are Succeeded; API requests per maintenance. Then the fleet
//! gates (fleet/): 200 maintenances through the zone and max-unavailable
//! budgets against the plane's floor, and a 30-minute soak with the
//! controller SIGKILLed and the API server restarted.
//!
//! Settings (environment): BENCH_SCALE_NODES (1000), BENCH_SCALE_MAINTENANCES
//! (100), BENCH_SCALE_SOAK (Go duration, 3m), BENCH_SCALE_FILL_TIMEOUT (30m),
//! BENCH_SCALE_FLEET_MAINTENANCES (200), BENCH_SCALE_FLEET_SOAK (30m),
//! BENCH_SCALE_FLEET_KILL_EVERY (2m-6m).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use nmo_tests::deployment::{Launch, Pod as LocalPod};
use nmo_tests::process::binary;
use nmo_tests::scrape::{self, MetricsReader};
use nmo_tests::wait::{Poll, until};
use scale::{Census, NAMESPACE, PODS_PER_NODE, POOL, POOL_LABEL};
use serde_json::json;
use shared::api::consts::{
    EXCLUDE_FROM_REMEDIATION_LABEL, LEASE_NAMESPACE_DEFAULT as LEASE_NAMESPACE, TAINT_DRAIN_KEY,
    TAINT_UNSCHEDULABLE_KEY,
};
use shared::{MaintenancePhase, NodeMaintenance};

mod fleet;
mod scale;

/// Label of this bench's NodeMaintenances (and name prefix, for the webhook).
const BENCH_LABEL: &str = "nmo-rs/scale-bench";
const GROUP: &str = "scale-bench";
const MIB: f64 = 1024.0;
const RSS_TARGET_MIB: f64 = 20.0;
const ALL_SUCCEEDED_TARGET: Duration = Duration::from_secs(5);
/// "A small constant" of API requests per maintenance beyond its evictions
/// (issue 12 said 20; issue 38's lean hand-over asks for 15).
const REQUESTS_BEYOND_EVICTIONS: f64 = 15.0;
const LONG: Duration = Duration::from_secs(120);
/// For the stages that move thousands of pods on a plane of two cores.
const MASS: Duration = Duration::from_secs(900);

struct Settings {
    nodes: usize,
    maintenances: usize,
    soak: Duration,
    fill_timeout: Duration,
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(key) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{key}={v:?} is not a valid value")),
        Err(_) => Ok(default),
    }
}

fn env_duration(key: &str, default: &str) -> anyhow::Result<Duration> {
    let v = std::env::var(key).unwrap_or_else(|_| default.to_string());
    shared::rules::duration::parse(&v).map_err(|e| anyhow::anyhow!("{key}={v:?}: {e}"))
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        Ok(Settings {
            nodes: env_or("BENCH_SCALE_NODES", 1000)?,
            maintenances: env_or("BENCH_SCALE_MAINTENANCES", 100)?,
            soak: env_duration("BENCH_SCALE_SOAK", "3m")?,
            fill_timeout: env_duration("BENCH_SCALE_FILL_TIMEOUT", "30m")?,
        })
    }
}

/// VmRSS and VmHWM (peak) of a process, in KiB.
#[derive(Debug, Clone, Copy, Default)]
struct Memory {
    rss: u64,
    peak: u64,
}

impl Memory {
    fn of(pid: u32) -> anyhow::Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status: has the process exited?"))?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        Ok(Memory {
            rss: field("VmRSS:"),
            peak: field("VmHWM:"),
        })
    }

    fn show(&self) -> String {
        format!(
            "{:.1} MiB (peak {:.1})",
            self.rss as f64 / MIB,
            self.peak as f64 / MIB
        )
    }

    fn within(&self, target_mib: f64) -> bool {
        (self.peak as f64 / MIB) <= target_mib
    }
}

/// Start a new peak (VmHWM) measurement: writing 5 to clear_refs resets it.
/// Needs the right to write there (root, or the same user); false otherwise.
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// One row of the final table.
struct Row {
    what: String,
    figure: String,
    target: String,
    /// None: no target.
    met: Option<bool>,
}

#[derive(Default)]
struct Table(Vec<Row>);

impl Table {
    fn add(&mut self, what: impl Into<String>, figure: impl Into<String>) {
        self.0.push(Row {
            what: what.into(),
            figure: figure.into(),
            target: String::new(),
            met: None,
        });
    }
    fn against(
        &mut self,
        what: impl Into<String>,
        figure: impl Into<String>,
        target: impl Into<String>,
        met: bool,
    ) {
        self.0.push(Row {
            what: what.into(),
            figure: figure.into(),
            target: target.into(),
            met: Some(met),
        });
    }
    fn print(&self) {
        let w0 = self.0.iter().map(|r| r.what.len()).max().unwrap_or(0);
        let w1 = self.0.iter().map(|r| r.figure.len()).max().unwrap_or(0);
        let w2 = self.0.iter().map(|r| r.target.len()).max().unwrap_or(0);
        for r in &self.0 {
            let verdict = match r.met {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "",
            };
            println!(
                "  {:<w0$}  {:>w1$}  {:<w2$}  {verdict}",
                r.what, r.figure, r.target
            );
        }
    }
}

/// Both services, as their Deployments run them, plus the scraper.
struct Services {
    webhook: LocalPod,
    controller: LocalPod,
    controller_metrics: u16,
    /// When the running controller process was started.
    controller_started: Instant,
    /// The controller's --metrics-cert-dir argument.
    metrics_cert: String,
    reader: MetricsReader,
    ca_file: std::path::PathBuf,
}

/// The controller from its image, with `extra` arguments after the
/// manifest's (and the metrics certificate); Ready.
async fn launch_controller(
    client: &Client,
    metrics_cert: &str,
    extra: &[String],
) -> anyhow::Result<LocalPod> {
    let controller = Launch::new("base", "nmo-controller")
        .pod_name("nmo-controller-scale")
        .extra_args(std::iter::once(metrics_cert.to_string()).chain(extra.iter().cloned()))
        .start(client)
        .await?;
    controller.wait_ready(LONG).await?;
    Ok(controller)
}

impl Services {
    async fn start(client: &Client) -> anyhow::Result<Services> {
        nmo_tests::manifests::install_controller_prereqs(client).await?;
        nmo_tests::manifests::install_webhook_prereqs(client).await?;
        let dir = nmo_tests::cluster_dir().join("scale-bench");
        std::fs::create_dir_all(&dir)?;
        let cert_dir = dir.join("certs");
        let ca = certs::Ca::new("nmo-scale-bench-ca", Duration::from_secs(24 * 3600))?;
        nmo_tests::webhook_pod::write_certs(&cert_dir, &ca, &nmo_tests::webhook_pod::issue(&ca));
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, ca.cert_pem())?;
        let metrics_cert = format!("--metrics-cert-dir={}", cert_dir.display());
        // The webhook's Deployment gets one serving thread from its 200m CPU
        // limit; a host without that limit would give it one per CPU.
        let webhook = Launch::new("base", "nmo-webhook")
            .volume("cert", &cert_dir)
            .pod_name("nmo-webhook-scale")
            .extra_args([metrics_cert.clone(), "--worker-threads=1".to_string()])
            .start(client)
            .await?;
        webhook.wait_ready(LONG).await?;
        let tls = webhook.flag_port("webhook-bind-address")?;
        nmo_tests::webhook_pod::unregister(client, GROUP).await;
        nmo_tests::webhook_pod::register_url(
            client,
            GROUP,
            tls,
            &certs::ca_bundle_base64(ca.cert_pem()),
        )
        .await;
        let controller = launch_controller(
            client,
            &metrics_cert,
            &["--max-concurrent-maintenances=0".to_string()],
        )
        .await?;
        let controller_metrics = controller.flag_port("metrics-bind-address")?;
        let reader =
            MetricsReader::create(client, "nmo-scale-bench-reader", ca.cert_pem().as_bytes())
                .await?;
        let services = Services {
            webhook,
            controller,
            controller_metrics,
            controller_started: Instant::now(),
            metrics_cert,
            reader,
            ca_file,
        };
        // The binding may take a moment to reach the authorizer.
        until(
            "the controller's /metrics to let the reader in",
            LONG,
            || async {
                Ok(
                    match services.reader.scrape(services.controller_metrics).await {
                        Ok(_) => Poll::Ready(()),
                        Err(e) => Poll::Pending(format!("{e:#}")),
                    },
                )
            },
        )
        .await?;
        Ok(services)
    }

    /// Stop the controller (SIGKILL when `crash`, else SIGTERM as a kubelet
    /// does) and start it again, from its image, with `extra` arguments.
    async fn restart_controller(
        &mut self,
        client: &Client,
        extra: &[String],
        crash: bool,
    ) -> anyhow::Result<()> {
        if crash {
            self.controller.proc.kill();
        } else if let Err(e) = self.controller.proc.terminate() {
            eprintln!("{e}");
        }
        self.controller = launch_controller(client, &self.metrics_cert, extra).await?;
        self.controller_metrics = self.controller.flag_port("metrics-bind-address")?;
        self.controller_started = Instant::now();
        Ok(())
    }

    fn controller_age(&self) -> Duration {
        self.controller_started.elapsed()
    }

    fn pids(&self) -> (u32, u32) {
        (self.controller.proc.pid(), self.webhook.proc.pid())
    }

    fn memory(&self) -> anyhow::Result<(Memory, Memory)> {
        let (c, w) = self.pids();
        Ok((Memory::of(c)?, Memory::of(w)?))
    }

    /// Reset both peaks; false when this user may not.
    fn new_peaks(&self) -> bool {
        let (c, w) = self.pids();
        reset_peak(c) & reset_peak(w)
    }

    async fn requests(&self) -> anyhow::Result<f64> {
        let page = self.reader.scrape(self.controller_metrics).await?;
        Ok(scrape::sum(&page, "rest_client_requests_total"))
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, p) in [
            ("nmo-controller", &mut self.controller.proc),
            ("nmo-webhook", &mut self.webhook.proc),
        ] {
            if let Some(status) = p.child.try_wait()? {
                anyhow::bail!(
                    "{name} exited ({status}); last lines of {}:\n{}",
                    p.log.display(),
                    p.log_tail(30)
                );
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cfg = Settings::from_env()?;
    let client = nmo_tests::admin_client().await?;
    let nodes = scale_nodes(&client, cfg.nodes).await?;
    println!(
        "== scale plane: {} nodes of pool {POOL}, {} pods each ({} in all); {} CPUs, {:.0} GiB memory",
        nodes.len(),
        PODS_PER_NODE,
        nodes.len() * PODS_PER_NODE,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        total_memory_gib()
    );
    let census = Census::start(client.clone());
    census.synced(LONG).await?;
    // The services run while the plane fills (as they would in a cluster);
    // they also remove what an interrupted run on a kept plane left.
    println!("== both services, from their images, with their manifests' arguments");
    let started = Instant::now();
    let mut svc = Services::start(&client).await?;
    println!(
        "services Ready {:.1} s after start (caches synced)",
        started.elapsed().as_secs_f64()
    );
    clean_leftovers(&client).await?;
    let filled = scale::fill(&client, &nodes, &census, cfg.fill_timeout).await?;
    println!(
        "fill: every pod Ready {:.0} s after the workloads were created",
        filled.as_secs_f64()
    );
    let mut table = Table::default();
    table.add(
        "plane",
        format!("{} nodes, {} pods", nodes.len() + 3, census.counts().pods),
    );
    svc.check_alive()?;
    let (ctrl_idle, wh_idle) = settle(&svc).await?;
    println!(
        "idle: controller {}, webhook {} (peak since start, the fill included)",
        ctrl_idle.show(),
        wh_idle.show()
    );
    let peaks_reset = svc.new_peaks();
    let target = format!("<= {RSS_TARGET_MIB:.0} MiB");
    table.against(
        "controller RSS idle",
        ctrl_idle.show(),
        &target,
        ctrl_idle.within(RSS_TARGET_MIB),
    );
    table.against(
        "webhook RSS idle",
        wh_idle.show(),
        &target,
        wh_idle.within(RSS_TARGET_MIB),
    );

    println!(
        "== webhook: CREATE reviews of a NodeMaintenance for a 30-pod node, allowed (webhook-bench, 5 s per level)"
    );
    println!(
        "   each allowed create also lists the node's pods for its warnings (one API request)"
    );
    let reviews = webhook_load(&svc, &nodes[0]).await?;
    table.add("webhook reviews/s, allowed + warnings, c=1 / 32", reviews);
    svc.check_alive()?;

    println!("== controller: one 30-pod node");
    let mut tracker = Tracker::start(client.clone()).await?;
    let free = thirty_pod_nodes(&census, &nodes);
    let one = free
        .last()
        .cloned()
        .context("no scale node holds exactly 30 pods")?;
    let name = format!("{GROUP}-one-{one}");
    let took = one_maintenance(&client, &mut tracker, &name, &one).await?;
    println!(
        "== webhook: CREATE reviews for {one}, which has a NodeMaintenance (denied from the caches, no API request)"
    );
    let denied = webhook_load(&svc, &one).await?;
    table.add("webhook reviews/s, denied duplicate, c=1 / 32", denied);
    let back = give_back(&client, &mut tracker, &name, &one).await?;
    println!(
        "  {one}: create -> Succeeded {:.2} s, delete -> node given back {:.2} s",
        took.as_secs_f64(),
        back.as_secs_f64()
    );
    table.add(
        "one 30-pod node: create -> Succeeded",
        format!("{:.2} s", took.as_secs_f64()),
    );
    table.add(
        "one node: delete -> node given back",
        format!("{:.2} s", back.as_secs_f64()),
    );
    svc.check_alive()?;

    println!(
        "== controller: {} NodeMaintenances at once (--max-concurrent-maintenances=0)",
        cfg.maintenances
    );
    let targets: Vec<String> = thirty_pod_nodes(&census, &nodes)
        .into_iter()
        .filter(|n| *n != one)
        .take(cfg.maintenances)
        .collect();
    anyhow::ensure!(
        targets.len() == cfg.maintenances,
        "only {} scale nodes hold exactly {PODS_PER_NODE} pods; {} wanted",
        targets.len(),
        cfg.maintenances
    );
    let before = svc.requests().await?;
    let many = many_maintenances(&client, &mut tracker, &targets).await?;
    let requests = svc.requests().await? - before;
    let per = requests / targets.len() as f64;
    println!(
        "  all {} Succeeded {:.2} s after the first create (creates took {:.2} s; first Succeeded at {:.2} s)",
        targets.len(),
        many.all_succeeded.as_secs_f64(),
        many.created.as_secs_f64(),
        many.first_succeeded.as_secs_f64()
    );
    println!(
        "  API requests by the controller: {requests:.0}, {per:.1} per maintenance ({} pods evicted each)",
        many.evicted_each
    );
    table.against(
        format!("{} maintenances at once: all Succeeded", targets.len()),
        format!("{:.2} s", many.all_succeeded.as_secs_f64()),
        format!("<= {} s", ALL_SUCCEEDED_TARGET.as_secs()),
        many.all_succeeded <= ALL_SUCCEEDED_TARGET,
    );
    let budget = many.evicted_each as f64 + REQUESTS_BEYOND_EVICTIONS;
    table.against(
        "API requests per maintenance",
        format!("{per:.1} ({} evictions)", many.evicted_each),
        format!("<= {} + {REQUESTS_BEYOND_EVICTIONS:.0}", many.evicted_each),
        per <= budget,
    );
    let (ctrl_after, wh_after) = svc.memory()?;
    println!(
        "after maintenances: controller {}, webhook {} (peak since idle{})",
        ctrl_after.show(),
        wh_after.show(),
        if peaks_reset {
            ""
        } else {
            ", or since start: this user may not reset peaks"
        }
    );
    let given_back = release_all(&client, &mut tracker, &targets).await?;
    println!(
        "  all {} deleted and their nodes given back {:.2} s after the first delete",
        targets.len(),
        given_back.as_secs_f64()
    );
    table.add(
        format!(
            "{} maintenances deleted: all nodes given back",
            targets.len()
        ),
        format!("{:.2} s", given_back.as_secs_f64()),
    );
    let (ctrl_after, wh_after) = {
        let (c, w) = svc.memory()?;
        (
            Memory {
                peak: c.peak.max(ctrl_after.peak),
                ..c
            },
            Memory {
                peak: w.peak.max(wh_after.peak),
                ..w
            },
        )
    };
    table.against(
        "controller RSS after maintenances",
        ctrl_after.show(),
        &target,
        ctrl_after.within(RSS_TARGET_MIB),
    );
    table.against(
        "webhook RSS after maintenances",
        wh_after.show(),
        &target,
        wh_after.within(RSS_TARGET_MIB),
    );
    svc.check_alive()?;
    drop(tracker);

    println!(
        "== the plane alone: the same evictions from a bare client ({FLOOR_IN_FLIGHT} in flight), no controller"
    );
    let untouched: Vec<String> = nodes
        .iter()
        .filter(|n| **n != one && !targets.contains(n))
        .take(cfg.maintenances)
        .cloned()
        .collect();
    let (evictions, took) = floor(&client, &census, &untouched).await?;
    println!(
        "  {evictions} evictions from {} cordoned nodes: all pods gone {:.2} s after the first",
        untouched.len(),
        took.as_secs_f64()
    );
    table.add(
        format!("the plane alone: {evictions} evictions, all pods gone"),
        format!("{:.2} s", took.as_secs_f64()),
    );

    if !cfg.soak.is_zero() {
        println!(
            "== soak: {} of pod, node label and PodDisruptionBudget churn",
            shared::rules::duration::format(cfg.soak)
        );
        let (c0, w0) = settle(&svc).await?;
        svc.new_peaks();
        let churned = soak(&client, &nodes, cfg.soak).await?;
        let (c1, w1) = settle(&svc).await?;
        println!("  {churned}");
        println!(
            "  controller {} -> {}; webhook {} -> {}",
            c0.show(),
            c1.show(),
            w0.show(),
            w1.show()
        );
        let grew = |a: &Memory, b: &Memory| (b.rss as f64 - a.rss as f64) / MIB;
        table.against(
            "soak: controller RSS before -> after",
            format!(
                "{:.1} -> {:.1} MiB",
                c0.rss as f64 / MIB,
                c1.rss as f64 / MIB
            ),
            "no growth (< 1 MiB)",
            grew(&c0, &c1) < 1.0,
        );
        table.against(
            "soak: webhook RSS before -> after",
            format!(
                "{:.1} -> {:.1} MiB",
                w0.rss as f64 / MIB,
                w1.rss as f64 / MIB
            ),
            "no growth (< 1 MiB)",
            grew(&w0, &w1) < 1.0,
        );
        svc.check_alive()?;
    }

    fleet::run(&client, &mut svc, &census, &nodes, &mut table).await?;

    println!("== scale bench figures (targets printed, not asserted)");
    table.print();
    nmo_tests::webhook_pod::unregister(&client, GROUP).await;
    svc.reader.remove(&client).await;
    Ok(())
}

fn total_memory_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0)
}

/// The scale pool's nodes, in number order; exactly `want` of them.
async fn scale_nodes(client: &Client, want: usize) -> anyhow::Result<Vec<String>> {
    let list = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default().labels(&format!("{POOL_LABEL}={POOL}")))
        .await?;
    let mut names: Vec<(usize, String)> = list
        .items
        .iter()
        .filter_map(|n| {
            let name = n.name_any();
            let k = name.strip_prefix("scale-")?.parse().ok()?;
            Some((k, name))
        })
        .collect();
    names.sort();
    anyhow::ensure!(
        names.len() == want,
        "the plane has {} nodes labelled {POOL_LABEL}={POOL}, BENCH_SCALE_NODES wants {want}: \
         run tests/bench-scale.sh (it adds them with tests/cluster/add-nodes.sh)",
        names.len()
    );
    Ok(names.into_iter().map(|(_, n)| n).collect())
}

/// Scale nodes with exactly [`PODS_PER_NODE`] pods (evictions of earlier
/// stages put Deployment pods elsewhere), in number order.
fn thirty_pod_nodes(census: &Census, nodes: &[String]) -> Vec<String> {
    let per_node = census.per_node();
    nodes
        .iter()
        .filter(|n| per_node.get(*n) == Some(&PODS_PER_NODE))
        .cloned()
        .collect()
}

/// Let the services finish starting (their first lists freed), then read
/// their memory: two readings 2 s apart that differ by less than 256 KiB.
async fn settle(svc: &Services) -> anyhow::Result<(Memory, Memory)> {
    let mut last = svc.memory()?;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(2)).await; // sampling, not synchronisation
        let now = svc.memory()?;
        let steady = |a: &Memory, b: &Memory| a.rss.abs_diff(b.rss) < 256;
        if steady(&last.0, &now.0) && steady(&last.1, &now.1) {
            return Ok(now);
        }
        last = now;
    }
    Ok(last)
}

/// NodeMaintenances of an earlier, interrupted run on a kept plane.
async fn clean_leftovers(client: &Client) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let lp = ListParams::default().labels(BENCH_LABEL);
    let old = api.list_metadata(&lp).await?;
    if old.items.is_empty() {
        return Ok(());
    }
    println!(
        "removing {} NodeMaintenances of an earlier run",
        old.items.len()
    );
    api.delete_collection(&DeleteParams::default(), &lp).await?;
    until("earlier NodeMaintenances gone", LONG, || async {
        let left = api.list_metadata(&lp).await?.items.len();
        Ok(if left == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{left} left"))
        })
    })
    .await
}

/// webhook-bench against the webhook at concurrency 1 and 32; its output is
/// shown, the reviews/s column returned.
async fn webhook_load(svc: &Services, node: &str) -> anyhow::Result<String> {
    let tls = svc.webhook.flag_port("webhook-bind-address")?;
    let bench = binary("webhook-bench");
    let out = tokio::process::Command::new(&bench)
        .args(["--addr", &format!("127.0.0.1:{tls}")])
        .arg("--ca-file")
        .arg(&svc.ca_file)
        .args(["--server-name", "localhost", "--node", node])
        .args(["--pid", &svc.webhook.proc.pid().to_string()])
        .args(["--concurrency", "1", "--concurrency", "32"])
        .args(["--duration", "5s", "--warmup", "1s", "--cpu-probe", "0s"])
        .args(["--metrics-url", ""])
        .output()
        .await
        .with_context(|| {
            format!(
                "running {} (built by cargo build --release)",
                bench.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines() {
        println!("  {l}");
    }
    anyhow::ensure!(
        out.status.success(),
        "webhook-bench failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The table's rows start with the concurrency; reviews/s is the 4th column.
    let rates: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.len() >= 9 && cols[0].parse::<usize>().is_ok()).then(|| cols[3].to_string())
        })
        .collect();
    Ok(rates.join(" / "))
}

/// The NodeMaintenances, nodes and leases as watches see them, so waiting
/// costs no polling requests that would compete with the controller's.
struct Tracker {
    nms: reflector::Store<NodeMaintenance>,
    nodes: reflector::Store<Node>,
    leases: reflector::Store<Lease>,
    changed: tokio::sync::watch::Receiver<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Tracker {
    async fn start(client: Client) -> anyhow::Result<Tracker> {
        let (tx, changed) = tokio::sync::watch::channel(());
        let tx = Arc::new(tx);
        let mut tasks = Vec::new();
        let (nms, w) = reflector::store();
        tasks.push(follow(
            watcher(
                Api::<NodeMaintenance>::all(client.clone()),
                watcher::Config::default().labels(BENCH_LABEL),
            ),
            w,
            tx.clone(),
        ));
        let (nodes, w) = reflector::store();
        tasks.push(follow(
            watcher(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().labels(&format!("{POOL_LABEL}={POOL}")),
            ),
            w,
            tx.clone(),
        ));
        let (leases, w) = reflector::store();
        tasks.push(follow(
            watcher(
                Api::<Lease>::namespaced(client, LEASE_NAMESPACE),
                watcher::Config::default(),
            ),
            w,
            tx,
        ));
        for (what, ready) in [
            ("NodeMaintenances", nms.wait_until_ready().await),
            ("nodes", nodes.wait_until_ready().await),
            ("leases", leases.wait_until_ready().await),
        ] {
            ready.with_context(|| format!("the bench's watch of {what} ended"))?;
        }
        Ok(Tracker {
            nms,
            nodes,
            leases,
            changed,
            tasks,
        })
    }

    /// Wait until `done` holds over the stores; `what` names it on timeout,
    /// with the last thing `done` reported.
    async fn until(
        &mut self,
        what: &str,
        deadline: Duration,
        mut done: impl FnMut(&Tracker) -> Result<(), String>,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        loop {
            let seen = match done(self) {
                Ok(()) => return Ok(start.elapsed()),
                Err(seen) => seen,
            };
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero()
                || tokio::time::timeout(left, self.changed.changed())
                    .await
                    .is_err()
            {
                anyhow::bail!("timed out after {deadline:?} waiting for {what}; last seen: {seen}");
            }
        }
    }

    /// status.evictionPods of NodeMaintenance `name`.
    fn evictions_of(&self, name: &str) -> Option<usize> {
        let nm = self.nms.get(&reflector::ObjectRef::new(name))?;
        usize::try_from(nm.status.as_ref()?.eviction_pods).ok()
    }

    fn phase(&self, name: &str) -> Option<MaintenancePhase> {
        self.nms
            .get(&reflector::ObjectRef::new(name))
            .and_then(|nm| nm.phase().cloned())
    }

    /// What still marks `node` as in maintenance, if anything.
    fn not_given_back(&self, node: &str) -> Option<String> {
        let lease = format!("node-{node}");
        if self
            .leases
            .get(&reflector::ObjectRef::new(&lease).within(LEASE_NAMESPACE))
            .is_some()
        {
            return Some(format!("lease {LEASE_NAMESPACE}/{lease} still there"));
        }
        let n = self.nodes.get(&reflector::ObjectRef::new(node))?;
        let spec = n.spec.as_ref();
        if spec.and_then(|s| s.unschedulable) == Some(true) {
            return Some(format!("{node} still cordoned"));
        }
        let taints: Vec<&str> = spec
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .map(|t| t.key.as_str())
            .filter(|k| *k == TAINT_DRAIN_KEY || *k == TAINT_UNSCHEDULABLE_KEY)
            .collect();
        if !taints.is_empty() {
            return Some(format!("{node} still tainted {taints:?}"));
        }
        if n.labels().contains_key(EXCLUDE_FROM_REMEDIATION_LABEL) {
            return Some(format!(
                "{node} still labelled {EXCLUDE_FROM_REMEDIATION_LABEL}"
            ));
        }
        None
    }
}

fn follow<K>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    writer: reflector::store::Writer<K>,
    changed: Arc<tokio::sync::watch::Sender<()>>,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    tokio::spawn(async move {
        let mut s = std::pin::pin!(stream.default_backoff().reflect(writer));
        while let Some(_event) = s.next().await {
            changed.send_replace(());
        }
    })
}

fn maintenance(name: &str, node: &str) -> anyhow::Result<NodeMaintenance> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {BENCH_LABEL: "true"}},
        "spec": {"nodeName": node, "reason": "scale bench"}
    }))?)
}

/// One maintenance `name` of `node`: create -> Succeeded.
async fn one_maintenance(
    client: &Client,
    tracker: &mut Tracker,
    name: &str,
    node: &str,
) -> anyhow::Result<Duration> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let start = Instant::now();
    api.create(&PostParams::default(), &maintenance(name, node)?)
        .await
        .with_context(|| format!("creating NodeMaintenance {name}"))?;
    let waited = tracker
        .until(&format!("{name} Succeeded"), LONG, |t| {
            match t.phase(name) {
                Some(MaintenancePhase::Succeeded) => Ok(()),
                other => Err(format!("phase {other:?}")),
            }
        })
        .await;
    waited.map(|_| start.elapsed())
}

/// Delete maintenance `name` -> `node` given back.
async fn give_back(
    client: &Client,
    tracker: &mut Tracker,
    name: &str,
    node: &str,
) -> anyhow::Result<Duration> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let start = Instant::now();
    api.delete(name, &DeleteParams::default()).await?;
    let waited = tracker
        .until(&format!("{name} gone and {node} given back"), LONG, |t| {
            if t.nms.get(&reflector::ObjectRef::new(name)).is_some() {
                return Err(format!("{name} still there"));
            }
            t.not_given_back(node).map_or(Ok(()), Err)
        })
        .await;
    waited.map(|_| start.elapsed())
}

struct Many {
    created: Duration,
    first_succeeded: Duration,
    all_succeeded: Duration,
    evicted_each: usize,
}

/// Create NodeMaintenance `names[i]` for `nodes[i]`, all at once.
async fn create_at_once(
    api: &Api<NodeMaintenance>,
    names: &[String],
    nodes: &[String],
) -> anyhow::Result<()> {
    futures::stream::iter(names.iter().zip(nodes))
        .map(|(name, node)| async move {
            api.create(&PostParams::default(), &maintenance(name, node)?)
                .await
                .with_context(|| format!("creating NodeMaintenance {name} for node {node}"))
        })
        .buffer_unordered(names.len().max(1))
        .try_collect::<Vec<_>>()
        .await
        .map(drop)
}

/// Create a NodeMaintenance on each of `nodes` at once; time until all are Succeeded.
async fn many_maintenances(
    client: &Client,
    tracker: &mut Tracker,
    nodes: &[String],
) -> anyhow::Result<Many> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let names: Vec<String> = nodes.iter().map(|n| format!("{GROUP}-{n}")).collect();
    let start = Instant::now();
    create_at_once(&api, &names, nodes).await?;
    let created = start.elapsed();
    let mut first = None;
    tracker
        .until("every NodeMaintenance Succeeded", MASS, |t| {
            let left: Vec<&String> = names
                .iter()
                .filter(|n| t.phase(n) != Some(MaintenancePhase::Succeeded))
                .collect();
            if left.len() < names.len() && first.is_none() {
                first = Some(start.elapsed());
            }
            match left.as_slice() {
                [] => Ok(()),
                some => Err(format!(
                    "{} not Succeeded yet, e.g. {} ({:?})",
                    some.len(),
                    some[0],
                    t.phase(some[0])
                )),
            }
        })
        .await?;
    let all_succeeded = start.elapsed();
    let evicted: BTreeSet<usize> = names
        .iter()
        .filter_map(|n| tracker.evictions_of(n))
        .collect();
    Ok(Many {
        created,
        first_succeeded: first.unwrap_or(all_succeeded),
        all_succeeded,
        evicted_each: evicted.iter().next_back().copied().unwrap_or(0),
    })
}

/// Delete every bench NodeMaintenance of `nodes`; time until all are gone
/// and every node is given back.
async fn release_all(
    client: &Client,
    tracker: &mut Tracker,
    nodes: &[String],
) -> anyhow::Result<Duration> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let start = Instant::now();
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(BENCH_LABEL),
    )
    .await?;
    tracker
        .until("every node given back", MASS, |t| {
            let left = t.nms.state().len();
            if left > 0 {
                return Err(format!("{left} NodeMaintenances still there"));
            }
            nodes
                .iter()
                .find_map(|n| t.not_given_back(n))
                .map_or(Ok(()), Err)
        })
        .await?;
    Ok(start.elapsed())
}

/// Evictions in flight for [`floor`]: as many as the controller allows itself.
const FLOOR_IN_FLIGHT: usize = 32;

/// What the plane itself needs for a mass drain: cordon `nodes` (untimed),
/// evict every pod on them but the DaemonSet's from a plain client, time
/// until the census sees them gone, uncordon. Returns (evictions, time).
async fn floor(
    client: &Client,
    census: &Census,
    nodes: &[String],
) -> anyhow::Result<(usize, Duration)> {
    let node_api: Api<Node> = Api::all(client.clone());
    let cordon = |on: bool| {
        let node_api = node_api.clone();
        futures::stream::iter(nodes.to_vec())
            .map(move |n| {
                let node_api = node_api.clone();
                async move {
                    let patch = Patch::Merge(json!({"spec": {"unschedulable": on}}));
                    node_api
                        .patch(&n, &PatchParams::default(), &patch)
                        .await
                        .with_context(|| format!("setting spec.unschedulable={on} on node {n}"))
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
    };
    cordon(true).await?;
    // An eviction's 429 is an answer, not something to retry for minutes.
    let mut config = nmo_tests::admin_config().await?;
    config.default_retry = false;
    let evicting = Client::try_from(config)?;
    let pods: Api<Pod> = Api::namespaced(evicting, NAMESPACE);
    let doomed = census.evictable_on(nodes);
    let start = Instant::now();
    futures::stream::iter(doomed.iter().cloned())
        .map(|name| {
            let pods = pods.clone();
            async move {
                match pods.evict(&name, &Default::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
                    Err(e) => Err(anyhow::Error::from(e).context(format!("evicting pod {name}"))),
                }
            }
        })
        .buffer_unordered(FLOOR_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    let left = |c: &Census| c.evictable_on(nodes).len();
    until("the evicted pods to be gone", MASS, || async {
        Ok(match left(census) {
            0 => Poll::Ready(()),
            n => Poll::Pending(format!("{n} pods still on those nodes")),
        })
    })
    .await?;
    let took = start.elapsed();
    cordon(false).await?;
    Ok((doomed.len(), took))
}

/// Churn for `length`: bare pods created and deleted on the scale nodes, node
/// labels set and removed, PodDisruptionBudgets created and deleted, in one
/// loop of rounds; returns what was done.
async fn soak(client: &Client, nodes: &[String], length: Duration) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NAMESPACE);
    let node_api: Api<Node> = Api::all(client.clone());
    let start = Instant::now();
    let mut last = Instant::now();
    let (mut round, mut pods_churned, mut labels, mut budgets) = (0usize, 0usize, 0usize, 0usize);
    let churn_label = json!({ scale::CHURN_LABEL: "true" });
    while start.elapsed() < length {
        round += 1;
        // 20 pods in, the previous round's 20 out.
        let names: Vec<(String, String)> = (0..20)
            .map(|i| {
                let node = &nodes[(round * 20 + i) % nodes.len()];
                (format!("churn-{round}-{i}"), node.clone())
            })
            .collect();
        futures::stream::iter(names.iter())
            .map(|(name, node)| {
                let pods = pods.clone();
                let labels = churn_label.clone();
                async move {
                    pods.create(
                        &PostParams::default(),
                        &scale::bare_pod(name, node, labels)?,
                    )
                    .await
                    .with_context(|| format!("soak: creating pod {name}"))
                }
            })
            .buffer_unordered(20)
            .try_collect::<Vec<_>>()
            .await?;
        if round > 1 {
            futures::stream::iter(0..20)
                .map(|i| {
                    let pods = pods.clone();
                    async move {
                        let name = format!("churn-{}-{i}", round - 1);
                        match pods.delete(&name, &DeleteParams::default()).await {
                            Ok(_) | Err(kube::Error::Api(_)) => Ok::<_, anyhow::Error>(()),
                            Err(e) => Err(e).with_context(|| format!("soak: deleting pod {name}")),
                        }
                    }
                })
                .buffer_unordered(20)
                .try_collect::<Vec<_>>()
                .await?;
        }
        pods_churned += 20;
        // Five nodes labelled, the previous round's five unlabelled.
        for i in 0..5 {
            let set = &nodes[(round * 5 + i) % nodes.len()];
            let unset = &nodes[((round - 1) * 5 + i) % nodes.len()];
            let pp = PatchParams::default();
            if round > 1 {
                node_api
                    .patch(
                        unset,
                        &pp,
                        &Patch::Merge(json!({"metadata": {"labels": {"nmo-rs/soak": null}}})),
                    )
                    .await?;
            }
            node_api
                .patch(
                    set,
                    &pp,
                    &Patch::Merge(
                        json!({"metadata": {"labels": {"nmo-rs/soak": round.to_string()}}}),
                    ),
                )
                .await?;
            labels += 1;
        }
        // One PDB in, the previous one out.
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": format!("churn-{round}")},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": format!("churn-{round}")}}}
        }))?;
        pdbs.create(&PostParams::default(), &pdb).await?;
        if round > 1 {
            let _ = pdbs
                .delete(&format!("churn-{}", round - 1), &DeleteParams::default())
                .await;
        }
        budgets += 1;
        if last.elapsed() >= Duration::from_secs(30) {
            println!(
                "  soak: {:.0} s, {pods_churned} pods, {labels} node labels, {budgets} PDBs churned",
                start.elapsed().as_secs_f64()
            );
            last = Instant::now();
        }
    }
    // Leave nothing behind.
    let lp = ListParams::default().labels(scale::CHURN_LABEL);
    pods.delete_collection(&DeleteParams::default(), &lp)
        .await?;
    let _ = pdbs
        .delete(&format!("churn-{round}"), &DeleteParams::default())
        .await;
    let labelled = node_api
        .list_metadata(&ListParams::default().labels("nmo-rs/soak"))
        .await?;
    for n in labelled.items {
        node_api
            .patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"nmo-rs/soak": null}}})),
            )
            .await?;
    }
    Ok(format!(
        "{round} rounds in {:.0} s: {pods_churned} pods created and deleted, {labels} node label changes, {budgets} PodDisruptionBudgets created and deleted",
        start.elapsed().as_secs_f64()
    ))
}
