//! Log writer benchmark: JSON lines formatted exactly as the binaries format
//! them ([`shared::serve::telemetry::log_subscriber`], default flags), logged from 1
//! and 4 threads, through each candidate writer, to a file, to /dev/null and
//! to a pipe read by `cat >/dev/null` (a container's stderr is a pipe).
//!
//! Run (release, well under a minute):
//!
//! ```text
//! CARGO_INCREMENTAL=0 cargo run --release -p nmo-shared --example log_writers -- [LINES] [ROUNDS]
//! ```
//!
//! LINES (default 200000) lines per run, ROUNDS (default 3) rounds; within a
//! round the writers run back to back for each case, their order rotating
//! from round to round, so a noisy neighbour hits them all alike. Per run:
//! - `calls/s`: lines / time until every logging thread returned;
//! - `drained/s`: lines / time until the writer's guard returned (all written);
//! - `p50`, `p99`, `max`: time of one `tracing::info!` call, over all threads.
//!
//! File runs also check that every line arrived.

use std::fs::File;
use std::io::{BufRead as _, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shared::serve::telemetry::{LogFlags, log_subscriber};
use tracing::Dispatch;

#[derive(Clone, Copy, PartialEq)]
enum Writer {
    /// shared::serve::logwriter::batched, as init_logging starts it.
    Ours,
    /// tracing-appender non_blocking, lossy(false), straight to the sink.
    Appender,
    /// The same with a 64 KiB BufWriter in front of the sink (the worker
    /// flushes whenever it has emptied the channel).
    AppenderBuf,
}

impl Writer {
    fn name(self) -> &'static str {
        match self {
            Writer::Ours => "logwriter",
            Writer::Appender => "appender",
            Writer::AppenderBuf => "appender+BufWriter",
        }
    }
}

const WRITERS: [Writer; 3] = [Writer::Ours, Writer::Appender, Writer::AppenderBuf];

/// Lines tracing-appender holds before logging waits: as many as fit in
/// logwriter's byte limit, at the ~400 bytes of this benchmark's line
/// (printed as "mean line length").
const APPENDER_LINES: usize = shared::serve::logwriter::DEFAULT_MAX_BUFFERED / 400;

struct Run {
    calls_per_s: f64,
    drained_per_s: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    /// Mean length of a line, from the file runs.
    line_bytes: Option<f64>,
}

fn log_lines(dispatch: &Dispatch, thread: usize, lines: usize) -> Vec<u32> {
    let mut took = Vec::with_capacity(lines);
    tracing::dispatcher::with_default(dispatch, || {
        for i in 0..lines {
            let object = format!("nm-{thread}-{i}");
            let start = Instant::now();
            // The webhook's admission decision line (webhook/src/server.rs).
            tracing::info!(
                target: "nmo_webhook::decision",
                uid = "5f0c2b1e-8d3a-4f6b-9c7d-2e1a0b3c4d5e",
                user = "system:serviceaccount:openshift-machine-config-operator:machine-config-controller",
                operation = "CREATE",
                object = object.as_str(),
                node = "worker-3.example.internal",
                allowed = true,
                reason = "Allowed",
                denial = "",
                latency_ms = 0.042,
                "admission decision"
            );
            took.push(u32::try_from(start.elapsed().as_nanos()).unwrap_or(u32::MAX));
        }
    });
    took
}

#[derive(Clone, Copy)]
enum Sink<'a> {
    File(&'a Path),
    Null,
    Pipe,
}

impl Sink<'_> {
    fn name(self) -> &'static str {
        match self {
            Sink::File(_) => "file",
            Sink::Null => "/dev/null",
            Sink::Pipe => "pipe",
        }
    }

    /// The output, and the reader process to wait for (pipe).
    fn open(self) -> (Box<dyn Write + Send>, Option<Child>) {
        match self {
            Sink::File(p) => (Box::new(File::create(p).expect("create the file")), None),
            Sink::Null => (
                Box::new(File::create("/dev/null").expect("open /dev/null")),
                None,
            ),
            Sink::Pipe => {
                let mut child = Command::new("cat")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("start cat");
                let stdin = child.stdin.take().expect("cat's stdin");
                (Box::new(stdin), Some(child))
            }
        }
    }
}

fn run_one(writer: Writer, sink: Sink<'_>, threads: usize, lines: usize) -> Run {
    let (out, reader) = sink.open();
    let flags = LogFlags::default();
    let per_thread = lines / threads;
    let start = Instant::now();
    let (dispatch, finish): (Dispatch, Box<dyn FnOnce()>) = match writer {
        Writer::Ours => {
            let (w, mut guard) = shared::serve::logwriter::batched(
                out,
                shared::serve::logwriter::DEFAULT_BATCH_DELAY,
                shared::serve::logwriter::DEFAULT_MAX_BUFFERED,
            );
            (
                Dispatch::new(log_subscriber(&flags, w)),
                Box::new(move || guard.finish()),
            )
        }
        Writer::Appender | Writer::AppenderBuf => {
            let builder = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .lossy(false)
                .buffered_lines_limit(APPENDER_LINES);
            let (w, guard) = if writer == Writer::AppenderBuf {
                builder.finish(
                    Box::new(BufWriter::with_capacity(64 << 10, out)) as Box<dyn Write + Send>
                )
            } else {
                builder.finish(out)
            };
            (
                Dispatch::new(log_subscriber(&flags, w)),
                Box::new(move || drop(guard)),
            )
        }
    };
    let mut took: Vec<u32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let d = &dispatch;
                s.spawn(move || log_lines(d, t, per_thread))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("logging thread"))
            .collect()
    });
    let logged = start.elapsed();
    finish();
    let drained = start.elapsed();
    // The last writer clone goes with the dispatch: the pipe closes.
    drop(dispatch);
    if let Some(mut cat) = reader {
        let _ = cat.wait();
    }
    let mut line_bytes = None;
    if let Sink::File(path) = sink {
        let got = BufReader::new(File::open(path).expect("reopen the file"))
            .lines()
            .count();
        assert_eq!(got, per_thread * threads, "{}: lines lost", writer.name());
        let size = std::fs::metadata(path).expect("file size").len();
        line_bytes = Some(size as f64 / got as f64);
    }
    took.sort_unstable();
    let pct = |p: f64| {
        let i = ((took.len() as f64 * p) as usize).min(took.len() - 1);
        Duration::from_nanos(u64::from(took[i]))
    };
    let n = (per_thread * threads) as f64;
    Run {
        calls_per_s: n / logged.as_secs_f64(),
        drained_per_s: n / drained.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        max: pct(1.0),
        line_bytes,
    }
}

/// Sink name, logging threads, writer.
type Case = (&'static str, usize, Writer);

fn arg(n: usize, default: usize) -> usize {
    match std::env::args().nth(n) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("usage: log_writers [LINES] [ROUNDS]; {v:?} is not a number");
            std::process::exit(2)
        }),
    }
}

fn main() {
    let lines = arg(1, 200_000).max(4);
    let rounds = arg(2, 3).max(1);
    let file = std::env::temp_dir().join(format!("nmo-log-writers-{}.log", std::process::id()));
    let sinks = [Sink::File(&file), Sink::Null, Sink::Pipe];
    println!(
        "{lines} JSON lines a run; {rounds} rounds; {} CPUs; logwriter holds {} bytes, appender {APPENDER_LINES} lines",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        shared::serve::logwriter::DEFAULT_MAX_BUFFERED
    );
    println!(
        "{:<6} {:<10} {:>2}  {:<19} {:>10} {:>10} {:>8} {:>8} {:>9}",
        "round", "sink", "th", "writer", "calls/s", "drained/s", "p50", "p99", "max"
    );
    // Every run's figures by case, for the medians.
    let mut all: Vec<(Case, Vec<Run>)> = Vec::new();
    for round in 0..rounds {
        for sink in sinks {
            for threads in [1, 4] {
                for k in 0..WRITERS.len() {
                    let writer = WRITERS[(k + round) % WRITERS.len()];
                    let r = run_one(writer, sink, threads, lines);
                    println!(
                        "{:<6} {:<10} {:>2}  {:<19} {:>10.0} {:>10.0} {:>8.2?} {:>8.2?} {:>9.2?}",
                        round,
                        sink.name(),
                        threads,
                        writer.name(),
                        r.calls_per_s,
                        r.drained_per_s,
                        r.p50,
                        r.p99,
                        r.max
                    );
                    let key = (sink.name(), threads, writer);
                    match all.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, runs)) => runs.push(r),
                        None => all.push((key, vec![r])),
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_file(&file);
    if let Some(b) = all.iter().flat_map(|(_, r)| r).find_map(|r| r.line_bytes) {
        println!("mean line length: {b:.0} bytes");
    }
    println!("medians over {rounds} rounds; in brackets: against logwriter's median");
    println!(
        "{:<10} {:>2}  {:<19} {:>17} {:>17} {:>17}",
        "sink", "th", "writer", "calls/s", "drained/s", "p99"
    );
    let median = |runs: &[Run], f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let calls = |r: &Run| r.calls_per_s;
    let drained = |r: &Run| r.drained_per_s;
    let p99 = |r: &Run| r.p99.as_secs_f64() * 1e6;
    for ((sink, threads, writer), runs) in &all {
        let base = all
            .iter()
            .find(|(k, _)| *k == (*sink, *threads, Writer::Ours))
            .map(|(_, r)| r.as_slice())
            .unwrap_or(runs);
        let cell = |f: &dyn Fn(&Run) -> f64| {
            let (m, b) = (median(runs, f), median(base, f));
            format!("{m:>9.1} ({:+4.0}%)", (m / b - 1.0) * 100.0)
        };
        println!(
            "{:<10} {:>2}  {:<19} {} {} {}µs",
            sink,
            threads,
            writer.name(),
            cell(&calls),
            cell(&drained),
            cell(&p99)
        );
    }
}
