//! The soak of the fleet gates (BENCH_SCALE_FLEET_SOAK, 30 min): two loops
//! side by side until the time is up.
//!
//! - The flow: NodeMaintenances for random free scale nodes, kept at
//!   [`in_flight`] not yet finished, each deleted by the bench once
//!   Succeeded; the gates keep most of them waiting.
//! - The faults: the controller SIGKILLed after a random time in
//!   BENCH_SCALE_FLEET_KILL_EVERY (2-6 min) and started again as the harness
//!   starts it; the plane's kube-apiserver restarted through
//!   `nmo_tests::plane::restart` once per 10 min of soak (at least once), at
//!   a random moment of its slot, then kube-controller-manager and
//!   kube-scheduler restarted to refresh their watches, as the restart tests
//!   do (kwok reconnects by itself: see [`restart_apiserver`]); both
//!   services' RSS sampled every minute.
//!
//! Then no more creates: every maintenance of the soak must reach Succeeded
//! within [`STUCK_AFTER`] of appearing; what is left is deleted; once none
//! is left every store of `nmo_controller_kept_entries` must be back at 0.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::PostParams;
use kube::{Api, Client};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use shared::NodeMaintenance;

use super::watch::{FleetWatch, Limits, Seen};
use super::{Deleter, Every, PROGRESS, Settings, ZONES, by_reason, controller_args, print_gates};
use crate::{GROUP, LONG, MIB, Services, Table, maintenance};

/// A maintenance of the soak that has not reached Succeeded this long after
/// it appeared is stuck.
const STUCK_AFTER: Duration = Duration::from_secs(600);
const SAMPLE_EVERY: Duration = Duration::from_secs(60);
const APISERVER_DOWN_SECS: f64 = 8.0;
/// One API server restart per this much soak (at least one).
const RESTART_EVERY: Duration = Duration::from_secs(600);
/// How long the kept entries may take to drain once no maintenance is left.
const KEPT_DEADLINE: Duration = Duration::from_secs(60);
const CREATES_IN_FLIGHT: usize = 16;

/// Maintenances not finished that the flow keeps: three per zone, so that
/// the zone budget holds most of them; at most a quarter of the nodes.
fn in_flight(nodes: usize) -> usize {
    (3 * ZONES).min(nodes / 4).max(1)
}

fn soak_name(seq: usize, node: &str) -> String {
    format!("{GROUP}-soak-{seq}-{node}")
}

fn is_soak(name: &str) -> bool {
    name.starts_with(&format!("{GROUP}-soak-"))
}

pub async fn run(
    client: &Client,
    svc: &mut Services,
    nodes: &[String],
    zones: &Arc<HashMap<String, String>>,
    limits: Limits,
    cfg: &Settings,
    table: &mut Table,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        std::env::var_os("NMO_CLUSTER_DIR").is_some(),
        "the fleet soak restarts the plane's kube-apiserver: run it through tests/bench-scale.sh, whose NMO_CLUSTER_DIR names the scale plane (BENCH_SCALE_FLEET_SOAK=0s skips it)"
    );
    let restarts = (cfg.soak.as_secs() / RESTART_EVERY.as_secs()).max(1) as usize;
    let fmt = shared::rules::duration::format;
    println!(
        "== fleet soak: {} of maintenances through the gates ({} unfinished at a time, each deleted once Succeeded); the controller SIGKILLed every {}-{} at random, API server restarts: {restarts}",
        fmt(cfg.soak),
        in_flight(nodes.len()),
        fmt(cfg.kill_every.0),
        fmt(cfg.kill_every.1)
    );
    let mut watch = FleetWatch::start(client.clone(), zones.clone(), limits);
    watch.listed_within(LONG).await?;
    let mut deleter = Deleter::new(Api::all(client.clone()));
    let start = Instant::now();
    let end = start + cfg.soak;
    let plan = Plan::new(start, cfg, restarts);
    let (flowed, faults) = tokio::join!(
        flow(client, &mut watch, &mut deleter, nodes, end),
        faults(client, svc, plan, end)
    );
    let (flowed, faults) = (flowed?, faults?);
    let stuck = wind_down(&mut watch, &mut deleter).await?;
    let seen = watch.take();
    let held = print_gates("soak", &seen, limits, nodes.len());
    println!(
        "  soak: {} created ({} refused by the API, {} create and {} delete requests failed, e.g. during the restarts); controller kills: {} (Ready again after {}), API server restarts: {}",
        flowed.created,
        flowed.refused,
        flowed.failed,
        deleter.errors,
        faults.kills.len(),
        seconds(&faults.kills),
        faults.restarts
    );
    let (stuck_figure, nothing_stuck) = report_stuck(&seen, &stuck);
    let kept = kept_entries(svc).await?;
    table.against(
        "soak: most at once per zone / in total",
        format!("{} / {}", seen.most_per_zone, seen.most_total),
        format!("<= {} / <= {}", limits.per_zone, limits.total),
        held,
    );
    table.against(
        "soak: maintenances not Succeeded in 10 min",
        stuck_figure,
        "0",
        nothing_stuck,
    );
    table.against(
        "soak: kept entries once none is left",
        kept.0,
        "every store 0",
        kept.1,
    );
    memory(&faults, table);
    svc.check_alive()
}

/// The memory line and its rows.
fn memory(faults: &Faults, table: &mut Table) {
    let (ctrl, ctrl_flat) = trend("controller", &faults.controller);
    let (wh, wh_flat) = trend("webhook", &faults.webhook);
    println!("  soak memory: {ctrl}; {wh}");
    table.against(
        "soak: controller RSS, first -> last",
        short(&faults.controller),
        "flat (last <= first x 1.2 + 2 MiB)",
        ctrl_flat,
    );
    table.against(
        "soak: webhook RSS, first -> last",
        short(&faults.webhook),
        "flat (last <= first x 1.2 + 2 MiB)",
        wh_flat,
    );
}

/// What the flow did.
struct Flowed {
    created: usize,
    refused: usize,
    failed: usize,
}

/// Create and delete maintenances until `end` (see the module doc).
async fn flow(
    client: &Client,
    watch: &mut FleetWatch,
    deleter: &mut Deleter,
    nodes: &[String],
    end: Instant,
) -> anyhow::Result<Flowed> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let target = in_flight(nodes.len());
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let mut out = Flowed {
        created: 0,
        refused: 0,
        failed: 0,
    };
    // Created, not seen by the watch yet: name -> node.
    let mut pending: HashMap<String, String> = HashMap::new();
    let (mut seq, mut every, start) = (0, Every::new(PROGRESS), Instant::now());
    let mut pause_until = start;
    while Instant::now() < end {
        deleter.finished(watch).await;
        let (busy, open, line) = watch.with(|s| {
            pending.retain(|name, _| !s.first_seen.contains_key(name));
            let busy: HashSet<String> = s
                .now
                .values()
                .map(|nm| nm.node.clone())
                .chain(pending.values().cloned())
                .collect();
            let open = s
                .now
                .keys()
                .filter(|n| is_soak(n) && !finished(s, n))
                .count()
                + pending.len();
            (busy, open, progress(s))
        });
        if open < target && Instant::now() >= pause_until {
            let free: Vec<&String> = nodes.iter().filter(|n| !busy.contains(*n)).collect();
            let picked: Vec<(String, String)> = free
                .choose_multiple(&mut rng, target - open)
                .map(|node| {
                    seq += 1;
                    (soak_name(seq, node), (*node).clone())
                })
                .collect();
            let results = create_all(&api, picked).await;
            for (name, node, result) in results {
                match result {
                    Ok(()) => {
                        out.created += 1;
                        pending.insert(name, node);
                    }
                    Err(Some(code)) if code < 500 => out.refused += 1,
                    Err(_) => {
                        out.failed += 1;
                        pause_until = Instant::now() + Duration::from_secs(1);
                    }
                }
            }
        }
        if every.due() {
            println!(
                "  soak: {:.0} s of {:.0}: {} created; now {line}",
                start.elapsed().as_secs_f64(),
                (end - start).as_secs_f64(),
                out.created
            );
        }
        watch.next_change(Duration::from_secs(1)).await;
    }
    Ok(out)
}

fn finished(s: &Seen, name: &str) -> bool {
    s.succeeded.contains_key(name) || s.failed.contains(name)
}

/// "10 holding a node, 20 waiting (ZoneBudget 18, ...)".
fn progress(s: &Seen) -> String {
    let holding = s.now.values().filter(|nm| nm.holds()).count();
    let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
    for reason in s.now.values().filter_map(|nm| nm.queued.clone()) {
        *waiting.entry(reason).or_default() += 1;
    }
    let soak: Vec<&String> = s.first_seen.keys().filter(|n| is_soak(n)).collect();
    let done = soak
        .iter()
        .filter(|n| s.succeeded.contains_key(**n))
        .count();
    format!(
        "{holding} holding a node, {} waiting ({}); {done} of {} seen reached Succeeded",
        waiting.values().sum::<usize>(),
        by_reason(&waiting),
        soak.len()
    )
}

/// Create each (name, node); the outcome of each: Ok, or the HTTP code of
/// the answer (None: no answer).
async fn create_all(
    api: &Api<NodeMaintenance>,
    picked: Vec<(String, String)>,
) -> Vec<(String, String, Result<(), Option<u16>>)> {
    futures::stream::iter(picked)
        .map(|(name, node)| async move {
            let result = match maintenance(&name, &node) {
                Ok(nm) => match api.create(&PostParams::default(), &nm).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) => Err(Some(s.code)),
                    Err(_) => Err(None),
                },
                Err(_) => Err(Some(400)),
            };
            (name, node, result)
        })
        .buffer_unordered(CREATES_IN_FLIGHT)
        .collect()
        .await
}

/// When the faults fall.
struct Plan {
    start: Instant,
    kill_every: (Duration, Duration),
    restarts: VecDeque<Instant>,
    rng: rand::rngs::StdRng,
}

impl Plan {
    /// One restart at a random moment in the middle half of each of
    /// `restarts` equal slots of the soak.
    fn new(start: Instant, cfg: &Settings, restarts: usize) -> Plan {
        let mut rng = rand::rngs::StdRng::from_os_rng();
        let slot = cfg.soak / u32::try_from(restarts).unwrap_or(1);
        let restarts = (0..restarts)
            .map(|k| {
                start
                    + slot * u32::try_from(k).unwrap_or(0)
                    + slot.mul_f64(rng.random_range(0.25..0.75))
            })
            .collect();
        Plan {
            start,
            kill_every: cfg.kill_every,
            restarts,
            rng,
        }
    }

    fn next_kill(&mut self, from: Instant) -> Instant {
        let (lo, hi) = (
            self.kill_every.0.as_secs_f64(),
            self.kill_every.1.as_secs_f64(),
        );
        from + Duration::from_secs_f64(self.rng.random_range(lo..=hi))
    }

    fn at(&self) -> String {
        format!("{:.0} s", self.start.elapsed().as_secs_f64())
    }
}

/// What the faults loop did and sampled.
struct Faults {
    /// Per kill: from the kill until the new controller was Ready.
    kills: Vec<Duration>,
    restarts: usize,
    /// RSS samples in KiB.
    controller: Vec<u64>,
    webhook: Vec<u64>,
}

/// Kill, restart and sample until `end` (see the module doc).
async fn faults(
    client: &Client,
    svc: &mut Services,
    mut plan: Plan,
    end: Instant,
) -> anyhow::Result<Faults> {
    let mut out = Faults {
        kills: vec![],
        restarts: 0,
        controller: vec![],
        webhook: vec![],
    };
    let mut next_kill = plan.next_kill(plan.start);
    let mut next_sample = plan.start;
    // No kill in the last stretch (the shortest interval): the controller
    // that winds down, and whose kept entries are read, has run the flow.
    let last_kill = end.checked_sub(plan.kill_every.0).unwrap_or(plan.start);
    loop {
        let restart = plan.restarts.front().copied().unwrap_or(end);
        let kill = if next_kill <= last_kill {
            next_kill
        } else {
            end
        };
        let next = kill.min(restart).min(next_sample).min(end);
        // A schedule of faults, not a synchronisation.
        tokio::time::sleep_until(next.into()).await;
        if next == next_sample || next == end {
            let (c, w) = svc.memory()?;
            out.controller.push(c.rss);
            out.webhook.push(w.rss);
            next_sample += SAMPLE_EVERY;
        }
        if next == end {
            return Ok(out);
        } else if next == restart {
            plan.restarts.pop_front();
            let r = restart_apiserver().await?;
            out.restarts += 1;
            println!(
                "  soak: {}: {r}; kube-controller-manager and kube-scheduler restarted after it to refresh their watches, kwok left to reconnect",
                plan.at()
            );
        } else if next == kill {
            let pid = svc.controller.proc.pid();
            let took = kill_controller(client, svc).await?;
            out.kills.push(took);
            println!(
                "  soak: {}: controller (pid {pid}) SIGKILLed; started again, Ready {:.1} s after the kill",
                plan.at(),
                took.as_secs_f64()
            );
            next_kill = plan.next_kill(Instant::now());
        }
    }
}

/// Restart the plane's kube-apiserver, then kube-controller-manager and
/// kube-scheduler (no downtime), as the restart tests refresh them: their
/// client-go watches would reconnect with a backoff of up to a minute. Not
/// kwok: a new kwok leaves every pod alone until the old one's node Leases
/// expire (240 s on the scale plane), which would stall every drain.
async fn restart_apiserver() -> anyhow::Result<nmo_tests::plane::Restart> {
    let r = nmo_tests::plane::restart("kube-apiserver", APISERVER_DOWN_SECS).await?;
    for c in ["kube-controller-manager", "kube-scheduler"] {
        nmo_tests::plane::restart(c, 0.0).await?;
    }
    Ok(r)
}

/// SIGKILL the controller and start it again (a few tries: the API server
/// may be busy catching up).
async fn kill_controller(client: &Client, svc: &mut Services) -> anyhow::Result<Duration> {
    let start = Instant::now();
    for attempt in 1..=3 {
        match svc
            .restart_controller(client, &controller_args(), true)
            .await
        {
            Ok(()) => return Ok(start.elapsed()),
            Err(e) if attempt < 3 => {
                eprintln!(
                    "  soak: starting the controller again failed (try {attempt} of 3): {e:#}"
                );
                tokio::time::sleep(Duration::from_secs(5)).await; // a pause between tries
            }
            Err(e) => return Err(e.context("starting the controller again after its SIGKILL")),
        }
    }
    unreachable!("the last try returns")
}

/// Wait until every maintenance of the soak finished or is older than
/// [`STUCK_AFTER`], deleting the finished ones; then delete the rest and
/// wait until none is left. Returns the stuck ones, described.
async fn wind_down(watch: &mut FleetWatch, deleter: &mut Deleter) -> anyhow::Result<Vec<String>> {
    let (start, mut every) = (Instant::now(), Every::new(PROGRESS));
    let stuck = loop {
        deleter.finished(watch).await;
        let (open, stuck) = watch.with(|s| {
            let open: Vec<&String> = s
                .first_seen
                .keys()
                .filter(|n| is_soak(n) && !finished(s, n))
                .collect();
            let stuck: Vec<String> = open
                .iter()
                .filter(|n| s.first_seen[**n].elapsed() >= STUCK_AFTER)
                .map(|n| describe(s, n))
                .collect();
            (open.len(), stuck)
        });
        if open == stuck.len() {
            break stuck;
        }
        if every.due() {
            println!(
                "  soak over: {open} maintenances not finished yet, {} s later",
                start.elapsed().as_secs()
            );
        }
        watch.next_change(Duration::from_secs(1)).await;
    };
    let left: Vec<String> = watch.with(|s| s.now.keys().cloned().collect());
    deleter.delete(left).await;
    let gone = Instant::now();
    while !watch.with(|s| s.now.is_empty()) {
        let left = watch.with(|s| s.now.len());
        anyhow::ensure!(
            gone.elapsed() < LONG * 2,
            "soak: {left} NodeMaintenances still there {:?} after their deletion; see the controller's log",
            LONG * 2
        );
        if every.due() {
            println!("  soak over: {left} maintenances being deleted");
        }
        deleter.finished(watch).await;
        watch.next_change(Duration::from_secs(1)).await;
    }
    Ok(stuck)
}

/// "name (phase Pending, Queued ZoneBudget, on node scale-4)".
fn describe(s: &Seen, name: &str) -> String {
    match s.now.get(name) {
        Some(nm) => format!(
            "{name} (phase {}, Queued {}, node {})",
            nm.phase.as_ref().map_or("none", |p| p.as_str()),
            nm.queued.as_deref().unwrap_or("no"),
            nm.node
        ),
        None => format!("{name} (gone without reaching Succeeded)"),
    }
}

/// The "nothing stuck" line; the figure for the table and whether nothing was.
fn report_stuck(s: &Seen, stuck: &[String]) -> (String, bool) {
    let soak: Vec<&String> = s.first_seen.keys().filter(|n| is_soak(n)).collect();
    let times: Vec<Duration> = soak
        .iter()
        .filter_map(|n| Some(s.succeeded.get(*n)?.duration_since(s.first_seen[*n])))
        .collect();
    let late: Vec<&&String> = soak
        .iter()
        .filter(|n| {
            s.succeeded
                .get(**n)
                .is_some_and(|t| t.duration_since(s.first_seen[**n]) > STUCK_AFTER)
        })
        .collect();
    let failed = soak.iter().filter(|n| s.failed.contains(**n)).count();
    let slowest = times.iter().max().copied().unwrap_or_default();
    let ok = stuck.is_empty() && late.is_empty() && failed == 0;
    if ok {
        println!(
            "  soak: nothing stuck: all {} NodeMaintenances created during the soak reached Succeeded (the slowest {:.1} s after it appeared)",
            soak.len(),
            slowest.as_secs_f64()
        );
    } else {
        println!(
            "  soak: STUCK: {} of {} did not reach Succeeded within {} min: {}; {} reached it later: {late:?}; {failed} Failed",
            stuck.len(),
            soak.len(),
            STUCK_AFTER.as_secs() / 60,
            stuck.join(", "),
            late.len()
        );
    }
    (
        format!("{} of {}", stuck.len() + late.len() + failed, soak.len()),
        ok,
    )
}

/// Read `nmo_controller_kept_entries` until every store is 0 (at most
/// [`KEPT_DEADLINE`]); prints the line; (figure, all 0).
async fn kept_entries(svc: &Services) -> anyhow::Result<(String, bool)> {
    let start = Instant::now();
    loop {
        let page = svc.reader.scrape(svc.controller_metrics).await?;
        let stores = parse_kept(&page);
        anyhow::ensure!(
            !stores.is_empty(),
            "the controller's /metrics has no nmo_controller_kept_entries"
        );
        let not_zero: Vec<String> = stores
            .iter()
            .filter(|(_, v)| **v != 0.0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        if not_zero.is_empty() || start.elapsed() >= KEPT_DEADLINE {
            let up = svc.controller_age();
            let (line, ok) = if not_zero.is_empty() {
                (
                    format!(
                        "every store 0 ({})",
                        stores.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                    true,
                )
            } else {
                (
                    format!(
                        "NOT 0 after {} s: {}",
                        KEPT_DEADLINE.as_secs(),
                        not_zero.join(", ")
                    ),
                    false,
                )
            };
            println!(
                "  soak: nmo_controller_kept_entries once no maintenance is left: {line} (this controller process up {:.0} s, since its last start)",
                up.as_secs_f64()
            );
            return Ok((
                if ok {
                    "all 0".into()
                } else {
                    not_zero.join(", ")
                },
                ok,
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await; // the poll's pace
    }
}

/// store -> value of every `nmo_controller_kept_entries{store="..."}` line.
fn parse_kept(page: &str) -> BTreeMap<String, f64> {
    page.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("nmo_controller_kept_entries{store=\"")?;
            let (store, rest) = rest.split_once('"')?;
            let value = rest.rsplit(' ').next()?.parse().ok()?;
            Some((store.to_string(), value))
        })
        .collect()
}

/// The memory line of one service; whether it stayed flat.
fn trend(service: &str, samples: &[u64]) -> (String, bool) {
    let mib = |k: u64| k as f64 / MIB;
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return (format!("{service}: no sample"), false);
    };
    let (min, max) = (
        samples.iter().min().unwrap_or(first),
        samples.iter().max().unwrap_or(first),
    );
    let flat = mib(*last) <= mib(*first) * 1.2 + 2.0;
    (
        format!(
            "{service} RSS every minute ({} samples): first {:.1}, min {:.1}, max {:.1}, last {:.1} MiB: {}",
            samples.len(),
            mib(*first),
            mib(*min),
            mib(*max),
            mib(*last),
            if flat { "flat" } else { "GROWING" }
        ),
        flat,
    )
}

fn short(samples: &[u64]) -> String {
    let mib = |k: &u64| *k as f64 / MIB;
    format!(
        "{:.1} -> {:.1} MiB",
        samples.first().map_or(0.0, mib),
        samples.last().map_or(0.0, mib)
    )
}

fn seconds(ds: &[Duration]) -> String {
    if ds.is_empty() {
        return "-".into();
    }
    let s: Vec<String> = ds
        .iter()
        .map(|d| format!("{:.1}", d.as_secs_f64()))
        .collect();
    format!("{} s", s.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_allows_a_fifth_and_two_mib() {
        let mib = 1024;
        assert!(trend("c", &[10 * mib, 9 * mib, 14 * mib]).1);
        assert!(!trend("c", &[10 * mib, 15 * mib]).1);
        assert!(trend("c", &[10 * mib]).0.contains("flat"));
        assert!(!trend("c", &[]).1);
    }

    #[test]
    fn kept_entries_are_read_per_store() {
        let page = "# HELP x\nnmo_controller_kept_entries{store=\"node_cache\"} 0\nnmo_controller_kept_entries{store=\"own_writes\"} 3\nother 1\n";
        let kept = parse_kept(page);
        assert_eq!(kept.get("own_writes"), Some(&3.0));
        assert_eq!(kept.len(), 2);
    }

    #[test]
    fn in_flight_is_three_per_zone_at_most_a_quarter() {
        assert_eq!(in_flight(1000), 30);
        assert_eq!(in_flight(60), 15);
        assert_eq!(in_flight(2), 1);
        assert!(is_soak(&soak_name(3, "scale-9")));
    }
}
