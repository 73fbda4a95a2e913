//! The lines as a log pipeline sees them: each encoder and each time
//! encoding, through the subscriber the binaries install.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use pretty_assertions::assert_eq;
use serde_json::Value;

use crate::rules::sync::LockExt;
use crate::serve::telemetry::{LogFlags, log_subscriber};

/// The subscriber's output, kept in memory.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.locked().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    log: LogFlags,
}

/// What `log` writes through the binaries' subscriber with these flags.
fn lines_with(args: &[&str], log: impl FnOnce()) -> String {
    let mut full = vec!["prog"];
    full.extend_from_slice(args);
    let flags = Cli::try_parse_from(crate::serve::goflags::normalize(full))
        .expect("flags parse")
        .log;
    let out = Capture::default();
    tracing::subscriber::with_default(log_subscriber(&flags, out.clone()), log);
    let bytes = out.0.locked().clone();
    String::from_utf8(bytes).expect("utf-8 lines")
}

const LOGGER: &str = "shared::serve::zap_format::tests";
const MSG: &str = "lease error: counted, retried";

fn sample_event() {
    tracing::info!(node = "worker-1", attempts = 3, allowed = false, "{MSG}");
}

/// How `ts` must look for each `--zap-time-encoding` (None: the default).
#[derive(Debug, Clone, Copy)]
enum Ts {
    /// A JSON number this many units per second since the epoch.
    Number(f64),
    /// A JSON string: RFC 3339 with this many fraction digits (None: 0 to 9,
    /// trailing zeros dropped).
    Text(Option<usize>),
}

const TIME_ENCODINGS: [(Option<&str>, Ts); 7] = [
    (None, Ts::Text(Some(6))),
    (Some("epoch"), Ts::Number(1.0)),
    (Some("millis"), Ts::Number(1e3)),
    (Some("nanos"), Ts::Number(1e9)),
    (Some("iso8601"), Ts::Text(Some(3))),
    (Some("rfc3339"), Ts::Text(Some(0))),
    (Some("rfc3339nano"), Ts::Text(None)),
];

fn time_flag(enc: Option<&str>) -> Vec<String> {
    enc.map(|e| vec![format!("--zap-time-encoding={e}")])
        .unwrap_or_default()
}

/// Check the bare (unquoted) time `raw` against `want`: the right form, and
/// within a minute of now.
fn check_ts(raw: &str, want: Ts, case: &str) {
    let now = jiff::Timestamp::now();
    match want {
        Ts::Number(per_second) => {
            assert!(
                raw.chars().all(|c| c.is_ascii_digit() || c == '.'),
                "{case}: ts {raw:?} is no plain number"
            );
            let v: f64 = raw.parse().expect("number");
            let secs = v / per_second;
            assert!(
                (secs - now.as_second() as f64).abs() < 60.0,
                "{case}: ts {raw} is not now"
            );
        }
        Ts::Text(digits) => {
            let t: jiff::Timestamp = raw
                .parse()
                .unwrap_or_else(|e| panic!("{case}: ts {raw:?}: {e}"));
            assert!(raw.ends_with('Z') && raw.len() >= 20, "{case}: {raw}");
            let fraction = raw[19..raw.len() - 1].trim_start_matches('.');
            if let Some(n) = digits {
                assert_eq!(fraction.len(), n, "{case}: fraction digits in {raw}");
            } else {
                assert!(
                    fraction.len() <= 9 && !fraction.ends_with('0'),
                    "{case}: {raw}"
                );
            }
            assert!(t.duration_until(now).as_secs().abs() < 60, "{case}: {raw}");
        }
    }
}

#[test]
fn json_lines_have_zaps_keys_in_zaps_order_for_every_time_encoding() {
    for (enc, want) in TIME_ENCODINGS {
        let case = format!("json, time {enc:?}");
        let flags = time_flag(enc);
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let text = lines_with(&args, sample_event);
        assert_eq!(text.lines().count(), 1, "{case}: {text}");
        let line = text.trim_end_matches('\n');
        let value: Value = serde_json::from_str(line).expect("one JSON object");
        match want {
            Ts::Number(_) => assert!(value["ts"].is_number(), "{case}: {line}"),
            Ts::Text(_) => assert!(value["ts"].is_string(), "{case}: {line}"),
        }
        let rest = line
            .strip_prefix(r#"{"level":"info","ts":"#)
            .unwrap_or_else(|| panic!("{case}: level, then ts: {line}"));
        let (ts, rest) = rest.split_once(",\"logger\":").expect("logger after ts");
        check_ts(ts.trim_matches('"'), want, &case);
        assert_eq!(
            rest,
            format!(r#""{LOGGER}","msg":"{MSG}","node":"worker-1","attempts":3,"allowed":false}}"#),
            "{case}"
        );
    }
}

#[test]
fn console_lines_are_zaps_tab_separated_form_for_every_time_encoding() {
    for (enc, want) in TIME_ENCODINGS {
        let case = format!("console, time {enc:?}");
        let mut flags = time_flag(enc);
        flags.push("--zap-encoder=console".into());
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let text = lines_with(&args, || {
            sample_event();
            tracing::warn!("no fields");
        });
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(lines.len(), 2, "{case}: {text}");
        check_ts(lines[0][0], want, &case);
        check_ts(lines[1][0], want, &case);
        assert_eq!(
            lines[0][1..],
            [
                "INFO",
                LOGGER,
                MSG,
                r#"{"node":"worker-1","attempts":3,"allowed":false}"#
            ],
            "{case}"
        );
        assert_eq!(lines[1][1..], ["WARN", LOGGER, "no fields"], "{case}");
    }
}

#[test]
fn levels_are_zaps_names() {
    let log = || {
        tracing::debug!("d");
        tracing::info!("i");
        tracing::warn!("w");
        tracing::error!("e");
    };
    let levels = |args: &[&str]| -> Vec<String> {
        let text = lines_with(args, log);
        text.lines()
            .map(|l| match serde_json::from_str::<Value>(l) {
                Ok(v) => v["level"].as_str().expect("level").to_string(),
                Err(_) => l.split('\t').nth(1).expect("level").to_string(),
            })
            .collect()
    };
    assert_eq!(
        levels(&["--zap-log-level=debug"]),
        ["debug", "info", "warn", "error"]
    );
    assert_eq!(levels(&["--zap-log-level=5"])[0], "debug");
    assert_eq!(levels(&[]), ["info", "warn", "error"]);
    assert_eq!(levels(&["--zap-devel"]), ["DEBUG", "INFO", "WARN", "ERROR"]);
}

#[test]
fn caller_follows_logger_when_source_location_is_on() {
    for encoder in ["json", "console"] {
        let enc = format!("--zap-encoder={encoder}");
        let mut at = 0;
        let text = lines_with(&["--zap-stacktrace-level=info", &enc], || {
            at = line!() + 1;
            tracing::info!(node = "worker-1", "{MSG}");
        });
        let caller = format!("{}:{at}", file!());
        let want = match encoder {
            "json" => format!(
                r#","logger":"{LOGGER}","caller":"{caller}","msg":"{MSG}","node":"worker-1"}}"#
            ),
            _ => format!("\tINFO\t{LOGGER}\t{caller}\t{MSG}\t{{\"node\":\"worker-1\"}}"),
        };
        assert!(text.trim_end().ends_with(&want), "{encoder}: {text}");
    }
    let text = lines_with(&[], sample_event);
    assert!(!text.contains("\"caller\""), "{text}");
}

#[derive(Debug)]
enum Kind {
    NodeRefused,
}

#[test]
fn field_values_keep_their_json_types_and_strings_are_escaped() {
    let text = lines_with(&[], || {
        let err = io::Error::other("lease \"node-a\" is held\nby another");
        tracing::info!(
            error = %err,
            kind = ?Kind::NodeRefused,
            ratio = 0.5,
            latency_ms = 12u64,
            delta = -4i64,
            nothing = f64::NAN,
            tab = "a\tb\u{1}",
            "quoted \"msg\"\\ here"
        );
    });
    let line = text.trim_end();
    let value: Value = serde_json::from_str(line).expect("one JSON object");
    assert_eq!(value["msg"], "quoted \"msg\"\\ here");
    assert_eq!(value["error"], "lease \"node-a\" is held\nby another");
    assert_eq!(value["kind"], "NodeRefused");
    assert_eq!(value["ratio"], 0.5);
    assert_eq!(value["latency_ms"], 12);
    assert_eq!(value["delta"], -4);
    assert_eq!(value["nothing"], "NaN");
    assert_eq!(value["tab"], "a\tb\u{1}");
    assert!(
        line.ends_with(r#","nothing":"NaN","tab":"a\tb\u0001"}"#),
        "{line}"
    );
}

#[test]
fn a_panic_is_one_json_line_at_error_and_flushed() {
    let flushed = Arc::new(AtomicBool::new(false));
    let text = lines_with(&[], || {
        // The hook is global for a moment: another test panicking meanwhile
        // logs to its own (empty) subscriber instead of stderr.
        let previous = std::panic::take_hook();
        let mark = flushed.clone();
        crate::serve::panic_log::install(move || mark.store(true, Ordering::SeqCst));
        let result = std::panic::catch_unwind(|| panic!("reconcile bug: {}", 42));
        std::panic::set_hook(previous);
        assert!(result.is_err());
    });
    assert!(
        flushed.load(Ordering::SeqCst),
        "the hook flushes the writer"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    let line = text.trim_end();
    let value: Value = serde_json::from_str(line).expect("one JSON object");
    assert_eq!(value["level"], "error");
    assert_eq!(value["msg"], "reconcile bug: 42");
    assert_eq!(value["logger"], "shared::serve::panic_log");
    let location = value["location"].as_str().expect("location");
    assert!(location.starts_with(&format!("{}:", file!())), "{location}");
    assert!(value["thread"].is_string(), "{line}");
    assert!(
        value.get("stacktrace").is_none_or(Value::is_string),
        "{line}"
    );
    assert!(
        line.starts_with(r#"{"level":"error","ts":"#)
            && line.contains(r#","msg":"reconcile bug: 42","location":"#),
        "{line}"
    );
}

#[test]
fn panic_payloads_as_text() {
    use crate::serve::panic_log::payload_text;
    assert_eq!(payload_text(&"static"), "static");
    assert_eq!(payload_text(&String::from("formatted")), "formatted");
    assert_eq!(payload_text(&7u8), "panic with a non-string payload");
}
