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

use clap::Parser;
use nmo_webhook::client::{ReviewClient, create_review, parse_response, tls_config};
use nmo_webhook::config::parse_duration;
use shared::consts::WEBHOOK_PATH;

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
}

struct LevelResult {
    concurrency: usize,
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
    tls: Arc<nmo_webhook::client::ClientConfig>,
    id: usize,
    concurrency: usize,
    per_connection_rate: Option<f64>,
    measure_from: Instant,
    stop: Instant,
) -> Result<(usize, usize, Vec<u32>, Vec<u32>), String> {
    let mut c = ReviewClient::connect(args.addr, &args.server_name, tls.clone())
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
        let body = format!("{head}{uid}{tail}");
        let sent = Instant::now();
        let answer = c.post(WEBHOOK_PATH, body).await;
        let took = sent.elapsed();
        let good = matches!(&answer, Ok((s, b)) if s.as_u16() == 200
            && parse_response(b).is_some_and(|r| r.0 == uid));
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
            c = ReviewClient::connect(args.addr, &args.server_name, tls.clone())
                .await
                .map_err(|e| format!("reconnecting {id}: {e}"))?;
        }
    }
    Ok((ok, errors, lat, lags))
}

fn c_tls(args: &Args) -> Result<Arc<nmo_webhook::client::ClientConfig>, String> {
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
    let mut result = LevelResult {
        concurrency,
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
        "webhook-bench: {} (node {:?}), warm-up {:?} + {:?} per level, client on 1 thread, {} CPUs",
        args.addr,
        args.node,
        args.warmup,
        args.duration,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if let Some((rss, hwm)) = args.pid.and_then(memory) {
        println!(
            "webhook memory before: VmRSS {:.1} MiB, VmHWM {:.1} MiB",
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
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
