//! webhook-bench: direct AdmissionReview load against a running nmo-webhook,
//! over TLS with keep-alive, as the API server sends it. Prints reviews/s,
//! latency percentiles and the webhook's memory for each concurrency level.
//!
//!   webhook-bench --addr 127.0.0.1:9443 --ca-file .cluster/certs/ca/ca.crt \
//!     --pid "$(cat .cluster/pids/webhook.pid)" --concurrency 1 --concurrency 32
//!
//! The client runs on one thread so that, on a small machine, most of the CPU
//! is left to the webhook; client and webhook still share the machine, so the
//! figures are a lower bound of what the webhook alone can do.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use nmo_webhook_client::{ReviewClient, create_review, parse_response, tls_config};
use shared::api::consts::WEBHOOK_PATH;
use shared::rules::duration::parse as parse_duration;

mod raw;

/// How the bench speaks HTTP/1.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ClientKind {
    /// Hand-framed requests and responses: little client CPU per review.
    Raw,
    /// hyper's HTTP/1.1 client (a cross-check of the raw client).
    Hyper,
}

/// One keep-alive connection of either kind.
enum Conn {
    Raw(Box<raw::RawConn>),
    Hyper(ReviewClient),
}

impl Conn {
    async fn connect(
        kind: ClientKind,
        args: &Args,
        tls: Arc<nmo_webhook_client::ClientConfig>,
    ) -> Result<Self, String> {
        Ok(match kind {
            ClientKind::Raw => Conn::Raw(Box::new(
                raw::RawConn::connect(args.addr, &args.server_name, tls).await?,
            )),
            ClientKind::Hyper => Conn::Hyper(
                ReviewClient::connect(args.addr, &args.server_name, tls)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        })
    }

    /// Send one review; Ok(true) for a 200 answer about `uid`.
    async fn review(&mut self, head: &str, uid: &str, tail: &str) -> Result<bool, String> {
        match self {
            Conn::Raw(c) => c.review(WEBHOOK_PATH, head, uid, tail).await,
            Conn::Hyper(c) => {
                let (status, body) = c
                    .post(WEBHOOK_PATH, format!("{head}{uid}{tail}"))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(status.as_u16() == 200 && parse_response(&body).is_some_and(|r| r.0 == uid))
            }
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "webhook-bench",
    about = "Direct AdmissionReview load against a running nmo-webhook"
)]
struct Args {
    /// TLS address of the webhook.
    #[arg(long, env = "BENCH_ADDR", default_value = "127.0.0.1:9443")]
    addr: SocketAddr,
    /// CA that signed the webhook's serving certificate (PEM). The default is
    /// where `make deploy-local` keeps it (relative to the repository root).
    #[arg(
        long,
        env = "BENCH_CA_FILE",
        default_value = ".cluster/certs/ca/ca.crt"
    )]
    ca_file: PathBuf,
    /// Name the serving certificate is checked against.
    #[arg(long, env = "BENCH_SERVER_NAME", default_value = "localhost")]
    server_name: String,
    /// Node named in the reviews; an existing one exercises every CREATE rule.
    #[arg(long, env = "BENCH_NODE", default_value = "worker-1")]
    node: String,
    /// Webhook process id, to report its memory (VmRSS / VmHWM). Default: the
    /// pid in --pid-file, when that file exists.
    #[arg(long, env = "BENCH_PID")]
    pid: Option<u32>,
    /// Where `make deploy-local` records the webhook's pid.
    #[arg(
        long,
        env = "BENCH_PID_FILE",
        default_value = ".cluster/pids/webhook.pid"
    )]
    pid_file: PathBuf,
    /// Concurrency levels (connections, one review in flight each); repeatable.
    #[arg(long = "concurrency", default_values_t = [1usize, 32])]
    concurrency: Vec<usize>,
    /// Measured time per level.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Offered load in reviews/s over all connections (paced, open loop);
    /// unset: each connection sends back to back (closed loop, maximum rate).
    /// Latency is the response time of each review; how late the client sent
    /// against its schedule is printed separately (tokio's timer ticks in 1 ms).
    #[arg(long)]
    rate: Option<f64>,
    /// Unmeasured warm-up per level (connections, caches, allocator).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// The webhook's /metrics, read before and after each level for the
    /// server-side review duration (nmo_webhook_review_duration_seconds).
    /// Empty: skip.
    #[arg(
        long,
        env = "BENCH_METRICS_URL",
        default_value = "http://127.0.0.1:18080/metrics"
    )]
    metrics_url: String,
    /// HTTP client: "raw" (lean, the default) or "hyper".
    #[arg(long, value_enum, default_value = "raw")]
    client: ClientKind,
    /// Before the load, spin one thread this long and report how steady the
    /// CPU is (speed of 10 ms windows against their median): on shared or
    /// throttled hosts that, not the webhook, sets the latency tail. 0: skip.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    cpu_probe: Duration,
}

struct LevelResult {
    concurrency: usize,
    /// Server-side review duration quantiles (p50, p99) in ms, when /metrics was read.
    server: Option<(f64, f64)>,
    reviews: usize,
    errors: usize,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    send_lag_us: Vec<u32>,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[idx.min(sorted.len() - 1)]) / 1000.0
}

const REVIEW_DURATION: &str = "nmo_webhook_review_duration_seconds_bucket";

/// Cumulative buckets (upper bound, count) of the webhook's review duration
/// histogram, read from its /metrics over plain HTTP; None when unreachable.
async fn review_buckets(url: &str) -> Option<Vec<(f64, f64)>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, "metrics"));
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(authority),
    )
    .await
    .ok()?
    .ok()?;
    let request = format!("GET /{path} HTTP/1.0\r\nHost: {authority}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text))
        .await
        .ok()?
        .ok()?;
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(REVIEW_DURATION))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    (!buckets.is_empty()).then_some(buckets)
}

/// Quantile of cumulative buckets by linear interpolation inside the bucket,
/// as Prometheus' histogram_quantile does; None without observations.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let inside = count - below;
            let frac = if inside > 0.0 {
                (rank - below) / inside
            } else {
                1.0
            };
            return Some(lower + (le - lower) * frac);
        }
        lower = le;
        below = count;
    }
    Some(lower)
}

/// Spin for `dur` in 10 ms windows and compare each window's work with the
/// median: (median-relative speed of the slowest window, share of windows
/// below half speed).
fn cpu_steadiness(dur: Duration) -> (f64, f64) {
    let window = Duration::from_millis(10);
    let mut counts = Vec::new();
    let start = Instant::now();
    let mut x = 1u64;
    while start.elapsed() < dur {
        let end = Instant::now() + window;
        let mut n = 0u64;
        while Instant::now() < end {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
            n += 1;
        }
        counts.push(n);
    }
    let mut sorted = counts.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2].max(1) as f64;
    let slowest = sorted[0] as f64 / median;
    let slow = counts
        .iter()
        .filter(|&&c| (c as f64) < median / 2.0)
        .count();
    (slowest, slow as f64 / counts.len().max(1) as f64)
}

fn memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// One connection sending reviews back to back until `stop`; latencies of
/// those sent after `measure_from` are kept.
async fn worker(
    args: Arc<Args>,
    tls: Arc<nmo_webhook_client::ClientConfig>,
    id: usize,
    concurrency: usize,
    per_connection_rate: Option<f64>,
    measure_from: Instant,
    stop: Instant,
) -> Result<(usize, usize, Vec<u32>, Vec<u32>), String> {
    let mut c = Conn::connect(args.client, &args, tls.clone())
        .await
        .map_err(|e| format!("connection {id}: {e}"))?;
    // The body is built once; only the uid changes per review.
    let template = create_review("UIDUIDUID", "bench-nm", &args.node);
    let (head, tail) = template
        .split_once("UIDUIDUID")
        .ok_or("review template without uid placeholder")?;
    let (mut ok, mut errors, mut lat) = (0usize, 0usize, Vec::with_capacity(1 << 16));
    let mut lags = Vec::new();
    let mut n = 0u64;
    // Paced: this connection's share of the rate, phase-shifted per connection.
    let period = per_connection_rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let first = Instant::now()
        + period.map_or(Duration::ZERO, |p| {
            p.mul_f64(id as f64 / concurrency as f64)
        });
    loop {
        let scheduled = match period {
            Some(p) => first + p.mul_f64(n as f64),
            None => Instant::now(),
        };
        if scheduled >= stop {
            break;
        }
        if period.is_some() {
            tokio::time::sleep_until(scheduled.into()).await;
        }
        n += 1;
        let uid = format!("bench-{id}-{n}");
        let sent = Instant::now();
        let answer = c.review(head, &uid, tail).await;
        let took = sent.elapsed();
        let good = matches!(answer, Ok(true));
        if sent >= measure_from {
            if good {
                ok += 1;
                lat.push(took.as_micros().min(u128::from(u32::MAX)) as u32);
                let behind = sent.saturating_duration_since(scheduled);
                lags.push(behind.as_micros().min(u128::from(u32::MAX)) as u32);
            } else {
                errors += 1;
            }
        }
        if answer.is_err() {
            // Reconnect rather than give up; the error is counted above.
            c = Conn::connect(args.client, &args, tls.clone())
                .await
                .map_err(|e| format!("reconnecting {id}: {e}"))?;
        }
    }
    Ok((ok, errors, lat, lags))
}

fn c_tls(args: &Args) -> Result<Arc<nmo_webhook_client::ClientConfig>, String> {
    let pem = std::fs::read(&args.ca_file)
        .map_err(|e| format!("reading --ca-file {}: {e}", args.ca_file.display()))?;
    tls_config(&pem).map_err(|e| e.to_string())
}

async fn run_level(args: Arc<Args>, concurrency: usize) -> Result<LevelResult, String> {
    let tls = c_tls(&args)?;
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let stop = measure_from + args.duration;
    let mut tasks = Vec::with_capacity(concurrency);
    for id in 0..concurrency {
        let per_connection = args.rate.map(|r| r / concurrency as f64);
        tasks.push(tokio::spawn(worker(
            args.clone(),
            tls.clone(),
            id,
            concurrency,
            per_connection,
            measure_from,
            stop,
        )));
    }
    let before = {
        let url = args.metrics_url.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(measure_from.into()).await;
            review_buckets(&url).await
        })
    };
    let mut result = LevelResult {
        concurrency,
        server: None,
        reviews: 0,
        errors: 0,
        elapsed: args.duration,
        latencies_us: Vec::new(),
        send_lag_us: Vec::new(),
    };
    for t in tasks {
        let (ok, errors, lat, lags) = t.await.map_err(|e| format!("worker panicked: {e}"))??;
        result.reviews += ok;
        result.errors += errors;
        result.latencies_us.extend(lat);
        result.send_lag_us.extend(lags);
    }
    result.latencies_us.sort_unstable();
    result.send_lag_us.sort_unstable();
    if let (Ok(Some(b)), Some(a)) = (before.await, review_buckets(&args.metrics_url).await) {
        let delta: Vec<(f64, f64)> = a
            .iter()
            .zip(b.iter())
            .map(|((le, n_after), (_, n_before))| (*le, n_after - n_before))
            .collect();
        if let (Some(p50), Some(p99)) =
            (bucket_quantile(&delta, 0.50), bucket_quantile(&delta, 0.99))
        {
            result.server = Some((p50 * 1000.0, p99 * 1000.0));
        }
    }
    Ok(result)
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.pid.is_none() {
        args.pid = std::fs::read_to_string(&args.pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok());
    }
    if !args.ca_file.exists() {
        eprintln!(
            "webhook-bench: CA file {} not found: start the webhook with `make deploy-local` \
             (or tests/deploy/bench-webhook.sh), or pass --ca-file",
            args.ca_file.display()
        );
        return ExitCode::FAILURE;
    }
    if std::net::TcpStream::connect_timeout(&args.addr, Duration::from_secs(2)).is_err() {
        eprintln!(
            "webhook-bench: nothing listens on {}: start the webhook with `make deploy-local` \
             (or tests/deploy/bench-webhook.sh), or pass --addr",
            args.addr
        );
        return ExitCode::FAILURE;
    }
    let args = Arc::new(args);
    // One client thread: leave the other cores to the webhook under test.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("webhook-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "webhook-bench: {} (node {:?}), warm-up {:?} + {:?} per level, {:?} client on 1 thread, {} CPUs",
        args.addr,
        args.node,
        args.warmup,
        args.duration,
        args.client,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if let Some((rss, hwm)) = args.pid.and_then(memory) {
        println!(
            "webhook memory before: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    if let Some(pid) = args.pid {
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            println!("webhook threads: {} (pid {pid})", tasks.count());
        }
    }
    if !args.cpu_probe.is_zero() {
        let (slowest, share) = cpu_steadiness(args.cpu_probe);
        println!(
            "host CPU steadiness over {:?}: slowest 10 ms window ran at {:.0}% of the median speed; \
             {:.1}% of windows below half speed",
            args.cpu_probe,
            slowest * 100.0,
            share * 100.0
        );
    }
    println!(
        "{:>11} {:>8} {:>10} {:>12} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "concurrency",
        "offered",
        "reviews",
        "reviews/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "errors"
    );
    let offered = args.rate.map_or("max".to_string(), |r| format!("{r:.0}/s"));
    let mut failed = false;
    for &c in &args.concurrency {
        match rt.block_on(run_level(args.clone(), c.max(1))) {
            Ok(r) => {
                let l = &r.latencies_us;
                println!(
                    "{:>11} {:>8} {:>10} {:>12.0} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7}",
                    r.concurrency,
                    offered,
                    r.reviews,
                    r.reviews as f64 / r.elapsed.as_secs_f64(),
                    percentile(l, 0.50),
                    percentile(l, 0.90),
                    percentile(l, 0.99),
                    percentile(l, 1.0),
                    r.errors
                );
                if let Some((p50, p99)) = r.server {
                    println!(
                        "{:>11} inside the webhook (handler, from its /metrics): p50 {p50:.3} ms, p99 {p99:.3} ms",
                        ""
                    );
                }
                if args.rate.is_some() {
                    println!(
                        "{:>11} client send lag behind schedule: p50 {:.3} ms, p99 {:.3} ms (not part of the latency above)",
                        "",
                        percentile(&r.send_lag_us, 0.50),
                        percentile(&r.send_lag_us, 0.99)
                    );
                }
                failed |= r.errors > 0;
            }
            Err(e) => {
                eprintln!("webhook-bench: concurrency {c}: {e}");
                failed = true;
            }
        }
    }
    if let Some(pid) = args.pid {
        match memory(pid) {
            Some((rss, hwm)) => println!(
                "webhook memory after:  VmRSS {:.1} MiB, VmHWM {:.1} MiB (pid {pid})",
                rss as f64 / 1024.0,
                hwm as f64 / 1024.0
            ),
            None => {
                eprintln!(
                    "webhook-bench: cannot read /proc/{pid}/status: is the webhook still running?"
                );
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::bucket_quantile;

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let b = [(0.001, 50.0), (0.002, 100.0), (f64::INFINITY, 100.0)];
        let near = |a: Option<f64>, e: f64| a.is_some_and(|a| (a - e).abs() < 1e-9);
        assert!(near(bucket_quantile(&b, 0.5), 0.001));
        assert!(near(bucket_quantile(&b, 0.75), 0.0015));
        assert!(near(bucket_quantile(&b, 0.99), 0.00198));
        assert_eq!(
            bucket_quantile(&[(0.001, 0.0), (f64::INFINITY, 0.0)], 0.5),
            None
        );
        // Everything above the last finite bound: that bound is the answer.
        assert!(near(
            bucket_quantile(&[(0.001, 0.0), (f64::INFINITY, 4.0)], 0.5),
            0.001
        ));
    }
}
