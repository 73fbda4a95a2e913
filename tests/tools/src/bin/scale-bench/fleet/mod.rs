//! The fleet gates at scale (issue 31), the last stages of `make bench-scale`:
//!
//! 1. The scenario: the scale nodes labelled into [`ZONES`] zones (round
//!    robin, in number order), the controller started again with
//!    [`controller_args`] after its manifest's, then
//!    BENCH_SCALE_FLEET_MAINTENANCES NodeMaintenances created at once on as
//!    many untouched nodes spread over the zones; the bench deletes each
//!    once Succeeded (that frees its zone). Figures: the time until all were
//!    Succeeded, the most holding a node at once per zone and in total
//!    against the limits (watch.rs), how many waited and why, and the
//!    plane's floor for the same work (floor.rs).
//! 2. The soak (soak.rs): maintenances flowing through the gates while the
//!    controller is SIGKILLed at random and the API server restarted.
//!
//! Figures, never assertions: a limit exceeded prints VIOLATED.

mod floor;
mod soak;
mod watch;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use shared::NodeMaintenance;
use shared::rules::gates::{DEFAULT_ZONE_LABEL, MaxUnavailable};

use crate::scale::{Census, PODS_PER_NODE, POOL, POOL_LABEL};
use crate::{GROUP, LONG, Services, Table, create_at_once, env_duration, env_or};
use watch::{FleetWatch, Limits, Seen};

/// Zones `zone-0` ... `zone-9` (the value of [`DEFAULT_ZONE_LABEL`]).
pub const ZONES: usize = 10;
const PER_ZONE: usize = 1;
const MAX_UNAVAILABLE: MaxUnavailable = MaxUnavailable::Percent(10);
/// Long stages print a line at least this often.
const PROGRESS: Duration = Duration::from_secs(30);
/// The scenario's 200 maintenances run in 20 rounds of one per zone.
const SCENARIO_DEADLINE: Duration = Duration::from_secs(30 * 60);
const DELETES_IN_FLIGHT: usize = 16;

pub struct Settings {
    /// BENCH_SCALE_FLEET_MAINTENANCES (200; 0 skips the scenario).
    pub maintenances: usize,
    /// BENCH_SCALE_FLEET_SOAK (30m; 0s skips the soak).
    pub soak: Duration,
    /// BENCH_SCALE_FLEET_KILL_EVERY (2m-6m): the controller is SIGKILLed
    /// after a random time in this range, again and again.
    pub kill_every: (Duration, Duration),
}

impl Settings {
    pub fn from_env() -> anyhow::Result<Settings> {
        let key = "BENCH_SCALE_FLEET_KILL_EVERY";
        let range = std::env::var(key).unwrap_or_else(|_| "2m-6m".into());
        let kill_every =
            parse_range(&range).map_err(|e| anyhow::anyhow!("{key}={range:?}: {e}"))?;
        Ok(Settings {
            maintenances: env_or("BENCH_SCALE_FLEET_MAINTENANCES", 200)?,
            soak: env_duration("BENCH_SCALE_FLEET_SOAK", "30m")?,
            kill_every,
        })
    }
}

/// `2m-6m` -> (2 min, 6 min).
fn parse_range(text: &str) -> Result<(Duration, Duration), String> {
    let parse = |v: &str| shared::rules::duration::parse(v.trim());
    let (lo, hi) = text
        .split_once('-')
        .ok_or("write two durations with a dash between them, e.g. 2m-6m")?;
    let (lo, hi) = (parse(lo)?, parse(hi)?);
    if lo.is_zero() || lo > hi {
        return Err("the first duration must be above zero and not above the second".into());
    }
    Ok((lo, hi))
}

/// The controller's arguments for these stages, after its manifest's.
pub fn controller_args() -> Vec<String> {
    vec![
        "--max-concurrent-maintenances=0".into(),
        format!("--max-concurrent-per-zone={PER_ZONE}"),
        format!("--max-unavailable={MAX_UNAVAILABLE}"),
        format!("--fleet-node-selector={POOL_LABEL}={POOL}"),
    ]
}

/// Both stages; rows for the final table.
pub async fn run(
    client: &Client,
    svc: &mut Services,
    census: &Census,
    nodes: &[String],
    table: &mut Table,
) -> anyhow::Result<()> {
    let cfg = Settings::from_env()?;
    if cfg.maintenances == 0 && cfg.soak.is_zero() {
        return Ok(());
    }
    let zones = Arc::new(zones_of(nodes));
    println!(
        "== fleet: the scale nodes into {ZONES} zones ({DEFAULT_ZONE_LABEL}=zone-0 ... zone-{}, round robin)",
        ZONES - 1
    );
    label_zones(client, &zones).await?;
    let args = controller_args();
    println!(
        "== fleet: the controller started again with {}",
        args.join(" ")
    );
    svc.restart_controller(client, &args, false).await?;
    let limits = Limits {
        per_zone: PER_ZONE,
        total: MAX_UNAVAILABLE.limit(nodes.len()),
    };
    if cfg.maintenances > 0 {
        scenario(
            client,
            census,
            nodes,
            &zones,
            limits,
            cfg.maintenances,
            table,
        )
        .await?;
    }
    if !cfg.soak.is_zero() {
        soak::run(client, svc, nodes, &zones, limits, &cfg, table).await?;
    }
    Ok(())
}

/// node -> `zone-<i mod ZONES>`, `i` its place in `nodes` (number order).
pub fn zones_of(nodes: &[String]) -> HashMap<String, String> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), format!("zone-{}", i % ZONES)))
        .collect()
}

/// Set the zone label where it is not right yet (a kept plane has it).
async fn label_zones(client: &Client, zones: &HashMap<String, String>) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let listed = api
        .list_metadata(&ListParams::default().labels(&format!("{POOL_LABEL}={POOL}")))
        .await?;
    let todo: Vec<(String, String)> = listed
        .items
        .iter()
        .filter_map(|n| {
            let want = zones.get(&n.name_any())?;
            (n.labels().get(DEFAULT_ZONE_LABEL) != Some(want)).then(|| (n.name_any(), want.clone()))
        })
        .collect();
    let start = Instant::now();
    let mut every = Every::new(PROGRESS);
    let total = todo.len();
    let mut done = 0;
    let mut patches = futures::stream::iter(todo)
        .map(|(node, zone)| {
            let api = api.clone();
            async move {
                let patch =
                    Patch::Merge(json!({"metadata": {"labels": {DEFAULT_ZONE_LABEL: zone}}}));
                api.patch(&node, &PatchParams::default(), &patch)
                    .await
                    .with_context(|| format!("labelling node {node} {DEFAULT_ZONE_LABEL}={zone}"))
            }
        })
        .buffer_unordered(DELETES_IN_FLIGHT);
    while let Some(r) = patches.next().await {
        r?;
        done += 1;
        if every.due() {
            println!(
                "  zones: {done} of {total} nodes labelled after {:.0} s",
                start.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "  zones: {total} nodes labelled in {:.1} s ({} had their zone already)",
        start.elapsed().as_secs_f64(),
        zones.len().saturating_sub(total)
    );
    Ok(())
}

/// Up to `count` of `eligible`, round robin over their zones (in `eligible`'s order within a zone).
fn round_robin(eligible: &[String], zones: &HashMap<String, String>, count: usize) -> Vec<String> {
    let mut by_zone: BTreeMap<&str, VecDeque<&String>> = BTreeMap::new();
    for n in eligible {
        let zone = zones.get(n).map_or("", String::as_str);
        by_zone.entry(zone).or_default().push_back(n);
    }
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let before = out.len();
        for queue in by_zone.values_mut() {
            if out.len() == count {
                break;
            }
            if let Some(n) = queue.pop_front() {
                out.push(n.clone());
            }
        }
        if out.len() == before {
            break;
        }
    }
    out
}

/// "ok", or "VIOLATED" and what was seen.
fn verdict(most: usize, limit: usize, violations: &[String]) -> String {
    if most <= limit {
        "ok".into()
    } else {
        format!("VIOLATED: {}", violations.join("; "))
    }
}

/// "ZoneBudget 190, MaxUnavailable 0, WaitingForSlot 0": the budgets' and
/// the slots' reasons always, any other that was seen too.
fn by_reason(counts: &BTreeMap<String, usize>) -> String {
    let mut shown: Vec<String> = ["ZoneBudget", "MaxUnavailable", "WaitingForSlot"]
        .iter()
        .map(|r| format!("{r} {}", counts.get(*r).copied().unwrap_or(0)))
        .collect();
    for (r, n) in counts {
        if !["ZoneBudget", "MaxUnavailable", "WaitingForSlot"].contains(&r.as_str()) {
            shown.push(format!("{r} {n}"));
        }
    }
    shown.join(", ")
}

/// The gate lines of a stage ("fleet", "soak"); whether both held.
fn print_gates(stage: &str, s: &Seen, limits: Limits, pool: usize) -> bool {
    println!(
        "  {stage}: most holding a node at once in one zone: {} (limit {}): {}",
        s.most_per_zone,
        limits.per_zone,
        verdict(s.most_per_zone, limits.per_zone, &s.violations)
    );
    println!(
        "  {stage}: most holding a node at once in total: {} (limit {} = {MAX_UNAVAILABLE} of {pool} pool nodes): {}",
        s.most_total,
        limits.total,
        verdict(s.most_total, limits.total, &s.violations)
    );
    println!(
        "  {stage}: waiting at the peak ({} at once) by Queued reason: {}; the most at once per reason: {}",
        s.most_waiting,
        by_reason(&s.waiting_at_peak),
        by_reason(&s.most_by_reason)
    );
    s.most_per_zone <= limits.per_zone && s.most_total <= limits.total
}

/// The scenario and its floor.
async fn scenario(
    client: &Client,
    census: &Census,
    nodes: &[String],
    zones: &Arc<HashMap<String, String>>,
    limits: Limits,
    count: usize,
    table: &mut Table,
) -> anyhow::Result<()> {
    // Untouched nodes: the earlier stages' drains left theirs short of pods.
    let per_node = census.per_node();
    let eligible: Vec<String> = nodes
        .iter()
        .filter(|n| per_node.get(*n).copied().unwrap_or(0) >= PODS_PER_NODE)
        .cloned()
        .collect();
    let targets = round_robin(&eligible, zones, count);
    anyhow::ensure!(
        targets.len() == count,
        "only {} scale nodes were never drained ({} pods or more); BENCH_SCALE_FLEET_MAINTENANCES wants {count}: lower it or raise BENCH_SCALE_NODES",
        targets.len(),
        PODS_PER_NODE
    );
    println!(
        "== fleet: {count} NodeMaintenances at once on {count} nodes of {} zones; the bench deletes each once Succeeded",
        targets
            .iter()
            .map(|n| &zones[n])
            .collect::<HashSet<_>>()
            .len()
    );
    let b = burst(client, zones.clone(), limits, &targets).await?;
    println!(
        "  fleet: all {count} Succeeded {:.2} s after the first create (creates took {:.2} s; {} evictions; all deleted and gone {:.2} s after the first create)",
        b.all_succeeded.as_secs_f64(),
        b.created.as_secs_f64(),
        b.evictions,
        b.all_gone.as_secs_f64()
    );
    let held = print_gates("fleet", &b.seen, limits, nodes.len());
    if !b.failed.is_empty() {
        println!("  fleet: {} Failed instead: {:?}", b.failed.len(), b.failed);
    }
    table.add(
        format!("fleet: {count} maintenances, 1 per zone: all Succeeded"),
        format!("{:.2} s", b.all_succeeded.as_secs_f64()),
    );
    table.against(
        "fleet: most at once per zone / in total",
        format!("{} / {}", b.seen.most_per_zone, b.seen.most_total),
        format!("<= {} / <= {}", limits.per_zone, limits.total),
        held,
    );
    let rest: Vec<String> = eligible
        .iter()
        .filter(|n| !targets.contains(n))
        .cloned()
        .collect();
    let floor_nodes = round_robin(&rest, zones, count);
    let f = floor::run(client, census, &floor_nodes, zones, limits).await?;
    let ratio = b.all_succeeded.as_secs_f64() / f.took.as_secs_f64().max(0.001);
    println!(
        "  fleet: time to all Succeeded against the plane's floor: {:.2} s for {} evictions, floor {:.2} s for {} evictions ({}): {ratio:.2} x the floor",
        b.all_succeeded.as_secs_f64(),
        b.evictions,
        f.took.as_secs_f64(),
        f.evictions,
        f.what
    );
    table.add(
        format!("fleet: the plane's floor, same constraints ({})", f.what),
        format!("{:.2} s ({ratio:.2} x)", f.took.as_secs_f64()),
    );
    Ok(())
}

/// What one burst of maintenances showed.
struct Burst {
    created: Duration,
    all_succeeded: Duration,
    all_gone: Duration,
    evictions: usize,
    failed: Vec<String>,
    seen: Seen,
}

/// Create a maintenance on each of `targets` at once; delete each once
/// Succeeded; until all are Succeeded, then gone.
async fn burst(
    client: &Client,
    zones: Arc<HashMap<String, String>>,
    limits: Limits,
    targets: &[String],
) -> anyhow::Result<Burst> {
    let mut watch = FleetWatch::start(client.clone(), zones, limits);
    watch.listed_within(LONG).await?;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let names: Vec<String> = targets
        .iter()
        .map(|n| format!("{GROUP}-fleet-{n}"))
        .collect();
    let start = Instant::now();
    create_at_once(&api, &names, targets).await?;
    let created = start.elapsed();
    let mut deleter = Deleter::new(api);
    let mut every = Every::new(PROGRESS);
    let ended = |s: &Seen| {
        names
            .iter()
            .all(|n| s.succeeded.contains_key(n) || s.failed.contains(n))
    };
    loop {
        deleter.finished(&watch).await;
        let (done, line) = watch.with(|s| (ended(s) && s.now.is_empty(), progress(s, &names)));
        if done {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < SCENARIO_DEADLINE,
            "fleet: not all {} NodeMaintenances Succeeded and gone within {SCENARIO_DEADLINE:?}: {line}; see the controller's log under .cluster/test-logs",
            names.len()
        );
        if every.due() {
            println!(
                "  fleet: {line} after {:.0} s",
                start.elapsed().as_secs_f64()
            );
        }
        watch.next_change(Duration::from_secs(1)).await;
    }
    let all_gone = start.elapsed();
    let seen = watch.take();
    let last = names
        .iter()
        .filter_map(|n| seen.succeeded.get(n))
        .max()
        .copied();
    Ok(Burst {
        created,
        all_succeeded: last.map_or(all_gone, |t| t.duration_since(start)),
        all_gone,
        evictions: names.iter().filter_map(|n| seen.evictions.get(n)).sum(),
        failed: names
            .iter()
            .filter(|n| seen.failed.contains(*n))
            .cloned()
            .collect(),
        seen,
    })
}

/// "45 of 200 Succeeded, 10 holding a node, 145 waiting (ZoneBudget 145, ...)".
fn progress(s: &Seen, names: &[String]) -> String {
    let succeeded = names
        .iter()
        .filter(|n| s.succeeded.contains_key(*n))
        .count();
    let holding = s.now.values().filter(|nm| nm.holds()).count();
    let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
    for reason in s.now.values().filter_map(|nm| nm.queued.clone()) {
        *waiting.entry(reason).or_default() += 1;
    }
    format!(
        "{succeeded} of {} Succeeded, {holding} holding a node, {} waiting ({}), {} left",
        names.len(),
        waiting.values().sum::<usize>(),
        by_reason(&waiting),
        s.now.len()
    )
}

/// Deletes the bench's maintenances that are Succeeded or Failed, each once
/// (a failed request is tried again on the next call).
struct Deleter {
    api: Api<NodeMaintenance>,
    asked: HashSet<String>,
    errors: usize,
}

impl Deleter {
    fn new(api: Api<NodeMaintenance>) -> Deleter {
        Deleter {
            api,
            asked: HashSet::new(),
            errors: 0,
        }
    }

    /// Delete those of `watch` that finished and were not asked for yet.
    async fn finished(&mut self, watch: &FleetWatch) {
        let done: Vec<String> = watch.with(|s| {
            s.now
                .iter()
                .filter(|(name, nm)| {
                    !nm.deleting
                        && !self.asked.contains(*name)
                        && (s.succeeded.contains_key(*name) || s.failed.contains(*name))
                })
                .map(|(name, _)| name.clone())
                .collect()
        });
        self.delete(done).await;
    }

    async fn delete(&mut self, names: Vec<String>) {
        let results: Vec<(String, bool)> = futures::stream::iter(names)
            .map(|name| {
                let api = self.api.clone();
                async move {
                    let ok = match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => true,
                        Err(kube::Error::Api(s)) => s.code == 404,
                        Err(_) => false,
                    };
                    (name, ok)
                }
            })
            .buffer_unordered(DELETES_IN_FLIGHT)
            .collect()
            .await;
        for (name, ok) in results {
            if ok {
                self.asked.insert(name);
            } else {
                self.errors += 1;
            }
        }
    }
}

/// True once per `period`.
struct Every {
    last: Instant,
    period: Duration,
}

impl Every {
    fn new(period: Duration) -> Every {
        Every {
            last: Instant::now(),
            period,
        }
    }

    fn due(&mut self) -> bool {
        let due = self.last.elapsed() >= self.period;
        if due {
            self.last = Instant::now();
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("{prefix}-{i}")).collect()
    }

    #[test]
    fn nodes_go_round_robin_over_zones() {
        let nodes = names("scale", 25);
        let zones = zones_of(&nodes);
        assert_eq!(zones["scale-1"], "zone-0");
        assert_eq!(zones["scale-11"], "zone-0");
        assert_eq!(zones["scale-10"], "zone-9");
        let picked = round_robin(&nodes, &zones, 12);
        let first: Vec<&str> = picked.iter().map(|n| zones[n].as_str()).take(10).collect();
        let distinct: HashSet<&str> = first.iter().copied().collect();
        assert_eq!(distinct.len(), 10, "{first:?}");
        assert_eq!(round_robin(&nodes, &zones, 99).len(), 25);
    }

    #[test]
    fn kill_ranges_parse() {
        let m = Duration::from_secs(60);
        assert_eq!(parse_range("2m-6m"), Ok((2 * m, 6 * m)));
        assert_eq!(parse_range("30s - 30s"), Ok((m / 2, m / 2)));
        assert!(parse_range("6m-2m").is_err());
        assert!(parse_range("0s-2m").is_err());
        assert!(parse_range("2m").is_err());
    }

    #[test]
    fn reasons_show_the_budgets_always() {
        let counts = BTreeMap::from([
            ("ZoneBudget".to_string(), 3),
            ("OutsideWindow".to_string(), 1),
        ]);
        assert_eq!(
            by_reason(&counts),
            "ZoneBudget 3, MaxUnavailable 0, WaitingForSlot 0, OutsideWindow 1"
        );
    }
}
