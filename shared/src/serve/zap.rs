//! controller-runtime's zap logging flags (`--zap-devel`, `--zap-log-level`,
//! `--zap-encoder`, `--zap-stacktrace-level`, `--zap-time-encoding`) and what
//! they mean for our `tracing` output. The lines themselves carry zap's keys
//! (`level`, `ts`, `logger`, `caller`, `msg`) in every mode:
//! [`crate::serve::zap_format`].
//!
//! The time without `--zap-time-encoding`, our choice: `ts` is RFC 3339, UTC,
//! in microseconds, a JSON string (`"2024-12-04T18:46:40.123456Z"`), with or
//! without `--zap-devel`. Why: controller-runtime since v0.15 defaults every
//! encoder to zap's RFC 3339 (`"2024-12-04T18:46:40Z"`; its flag help still
//! says "Defaults to 'epoch'", which was true up to v0.14: epoch seconds as a
//! JSON number for JSON, ISO 8601 for the console). Ours is that same type
//! and form with the fraction RFC 3339 allows: parsers of RFC 3339 (Go's
//! `time.RFC3339`, Elasticsearch's `strict_date_optional_time`, Vector's
//! `parse_timestamp`) read both, and lines within one second keep their
//! order in a log store. `--zap-time-encoding=rfc3339` gives zap's exact
//! form; `epoch` gives the v0.14 number. Every explicit encoding is written
//! as zap writes it: epoch, millis and nanos as JSON numbers, the others as
//! strings.
//!
//! Differences from zap, on purpose:
//! - no Go stack traces exist here, so `--zap-stacktrace-level` is accepted
//!   and validated; at `info` every line carries its source file and line in
//!   zap's `caller` key instead (the closest useful thing), otherwise nothing
//!   changes. A panic's line carries Rust's backtrace when `RUST_BACKTRACE`
//!   asks for one ([`crate::serve::panic_log`]).

use clap::{Args, ValueEnum};
use tracing::Level;

use crate::serve::goflags::GoBoolFlag as _;

/// The logging flags, as controller-runtime's `zap.Options.BindFlags` defines them.
#[derive(Args, Debug, Clone, Default)]
pub struct LogFlags {
    /// Development defaults: console (human-readable) output at debug level.
    /// --zap-encoder and --zap-log-level still override them.
    #[arg(long, env = "ZAP_DEVEL", go_bool_default = false)]
    pub zap_devel: bool,

    /// Log level: debug, info, error (also warn, dpanic, panic, fatal), or an
    /// integer verbosity above 0 (1 = debug, 2 and more = trace). Default: info
    /// (debug with --zap-devel). --zap-level is the same flag.
    #[arg(long, alias = "zap-level", env = "ZAP_LOG_LEVEL", value_name = "LEVEL",
          value_parser = LogLevel::parse)]
    pub zap_log_level: Option<LogLevel>,

    /// Log encoding: json (one JSON object a line) or console (tab-separated, for humans).
    /// Default: json (console with --zap-devel).
    #[arg(long, env = "ZAP_ENCODER", value_enum, ignore_case = true)]
    pub zap_encoder: Option<Encoder>,

    /// Level from which zap attaches stack traces: info, error or panic. There
    /// are no Go stack traces here: `info` adds the source file and line to
    /// every line, the others change nothing.
    #[arg(long, env = "ZAP_STACKTRACE_LEVEL", value_enum, ignore_case = true)]
    pub zap_stacktrace_level: Option<StacktraceLevel>,

    /// Timestamp format of `ts`: epoch (seconds), millis, nanos, iso8601, rfc3339
    /// or rfc3339nano. Default: RFC 3339 in microseconds, UTC.
    #[arg(long, env = "ZAP_TIME_ENCODING", value_enum, ignore_case = true)]
    pub zap_time_encoding: Option<TimeEncoding>,
}

/// A zap level name, or a verbosity (logr's V-levels: zap level -N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    DPanic,
    Panic,
    Fatal,
    Verbosity(u8),
}

impl LogLevel {
    /// Parse as controller-runtime does: a level name (any case) or an integer above 0.
    pub fn parse(value: &str) -> Result<LogLevel, String> {
        let level = match value.to_ascii_lowercase().as_str() {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "warn" => LogLevel::Warn,
            "error" => LogLevel::Error,
            "dpanic" => LogLevel::DPanic,
            "panic" => LogLevel::Panic,
            "fatal" => LogLevel::Fatal,
            _ => match value.parse::<u8>() {
                Ok(v) if v > 0 => LogLevel::Verbosity(v),
                _ => {
                    return Err(format!(
                        "invalid log level {value:?}: use debug, info, error or an integer verbosity above 0"
                    ));
                }
            },
        };
        Ok(level)
    }

    /// The most verbose `tracing` level shown. tracing has nothing above
    /// error, so dpanic, panic and fatal show errors.
    pub fn tracing_level(self) -> Level {
        match self {
            LogLevel::Debug | LogLevel::Verbosity(1) => Level::DEBUG,
            LogLevel::Verbosity(_) => Level::TRACE,
            LogLevel::Info => Level::INFO,
            LogLevel::Warn => Level::WARN,
            LogLevel::Error | LogLevel::DPanic | LogLevel::Panic | LogLevel::Fatal => Level::ERROR,
        }
    }
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    Json,
    Console,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StacktraceLevel {
    Info,
    Error,
    Panic,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeEncoding {
    /// Seconds since the Unix epoch, with a fraction.
    Epoch,
    /// Milliseconds since the Unix epoch, with a fraction.
    Millis,
    /// Nanoseconds since the Unix epoch (controller-runtime's help says "nano").
    #[value(alias = "nano")]
    Nanos,
    /// 2006-01-02T15:04:05.000Z
    Iso8601,
    /// 2006-01-02T15:04:05Z
    Rfc3339,
    /// 2006-01-02T15:04:05.999999999Z (trailing zeros dropped)
    #[value(name = "rfc3339nano")]
    Rfc3339Nano,
}

/// What the flags resolve to, after `--zap-devel` filled in its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    pub level: Level,
    pub encoder: Encoder,
    /// Source file and line (zap's `caller`) on every line.
    pub source_location: bool,
    /// None: RFC 3339 in microseconds (see the module's top comment).
    pub time: Option<TimeEncoding>,
}

impl LogFlags {
    pub fn settings(&self) -> LogSettings {
        let default_level = if self.zap_devel {
            LogLevel::Debug
        } else {
            LogLevel::Info
        };
        let default_encoder = if self.zap_devel {
            Encoder::Console
        } else {
            Encoder::Json
        };
        LogSettings {
            level: self.zap_log_level.unwrap_or(default_level).tracing_level(),
            encoder: self.zap_encoder.unwrap_or(default_encoder),
            source_location: self.zap_stacktrace_level == Some(StacktraceLevel::Info),
            time: self.zap_time_encoding,
        }
    }
}

impl TimeEncoding {
    /// Format `nanos` (since the Unix epoch, UTC) the way zap's encoder of the same name does.
    pub fn format(self, nanos: i128) -> String {
        let secs = nanos.div_euclid(1_000_000_000);
        let frac = nanos.rem_euclid(1_000_000_000);
        match self {
            TimeEncoding::Epoch => trim_fraction(format!("{secs}.{frac:09}")),
            TimeEncoding::Millis => {
                let ms = nanos.div_euclid(1_000_000);
                let sub = nanos.rem_euclid(1_000_000);
                trim_fraction(format!("{ms}.{sub:06}"))
            }
            TimeEncoding::Nanos => nanos.to_string(),
            TimeEncoding::Iso8601 | TimeEncoding::Rfc3339 | TimeEncoding::Rfc3339Nano => {
                let Ok(ts) = jiff::Timestamp::from_nanosecond(nanos) else {
                    return nanos.to_string();
                };
                match self {
                    TimeEncoding::Iso8601 => format!("{ts:.3}"),
                    TimeEncoding::Rfc3339 => format!("{ts:.0}"),
                    _ => format!("{ts}"),
                }
            }
        }
    }
}

/// "12.500000000" -> "12.5", "12.000000000" -> "12".
fn trim_fraction(s: String) -> String {
    let t = s.trim_end_matches('0').trim_end_matches('.');
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    #[command(args_override_self = true)]
    struct Cli {
        #[command(flatten)]
        log: LogFlags,
    }

    fn settings(args: &[&str]) -> LogSettings {
        let mut full = vec!["prog"];
        full.extend_from_slice(args);
        Cli::try_parse_from(crate::serve::goflags::normalize(full))
            .expect("flags parse")
            .log
            .settings()
    }

    #[test]
    fn defaults_are_json_at_info() {
        let s = settings(&[]);
        assert_eq!(s.level, Level::INFO);
        assert_eq!(s.encoder, Encoder::Json);
        assert!(!s.source_location);
        assert_eq!(s.time, None);
    }

    #[test]
    fn devel_means_console_at_debug_unless_overridden() {
        let s = settings(&["--zap-devel"]);
        assert_eq!((s.level, s.encoder), (Level::DEBUG, Encoder::Console));
        let s = settings(&[
            "-zap-devel=true",
            "--zap-encoder=json",
            "--zap-log-level=error",
        ]);
        assert_eq!((s.level, s.encoder), (Level::ERROR, Encoder::Json));
        assert_eq!(settings(&["--zap-devel=false"]).encoder, Encoder::Json);
    }

    #[test]
    fn levels_names_verbosity_and_the_old_spelling() {
        assert_eq!(settings(&["--zap-log-level=debug"]).level, Level::DEBUG);
        assert_eq!(settings(&["--zap-log-level", "ERROR"]).level, Level::ERROR);
        assert_eq!(settings(&["--zap-level=debug"]).level, Level::DEBUG);
        assert_eq!(settings(&["-zap-level=panic"]).level, Level::ERROR);
        assert_eq!(settings(&["--zap-log-level=1"]).level, Level::DEBUG);
        assert_eq!(settings(&["--zap-log-level=5"]).level, Level::TRACE);
        assert_eq!(
            settings(&["--zap-level=debug", "--zap-log-level=info"]).level,
            Level::INFO,
            "alias and name are one flag: the last wins"
        );
        for bad in ["0", "-1", "loud", ""] {
            let err = LogLevel::parse(bad).expect_err(bad);
            assert!(err.contains("integer verbosity"), "{err}");
        }
    }

    #[test]
    fn encoder_stacktrace_and_time_values() {
        assert_eq!(
            settings(&["--zap-encoder=Console"]).encoder,
            Encoder::Console
        );
        assert!(settings(&["--zap-stacktrace-level=info"]).source_location);
        assert!(!settings(&["--zap-stacktrace-level=panic"]).source_location);
        for (v, want) in [
            ("epoch", TimeEncoding::Epoch),
            ("millis", TimeEncoding::Millis),
            ("nano", TimeEncoding::Nanos),
            ("nanos", TimeEncoding::Nanos),
            ("iso8601", TimeEncoding::Iso8601),
            ("rfc3339", TimeEncoding::Rfc3339),
            ("RFC3339Nano", TimeEncoding::Rfc3339Nano),
        ] {
            let arg = format!("--zap-time-encoding={v}");
            assert_eq!(settings(&[&arg]).time, Some(want), "{v}");
        }
        let mut full = vec!["prog", "--zap-stacktrace-level=warn"];
        assert!(Cli::try_parse_from(&full).is_err());
        full[1] = "--zap-time-encoding=unix";
        assert!(Cli::try_parse_from(&full).is_err());
    }

    #[test]
    fn time_encodings_format_like_zap() {
        // 2024-01-02T03:04:05.120000000Z
        let t: i128 = 1_704_164_645_120_000_000;
        assert_eq!(TimeEncoding::Epoch.format(t), "1704164645.12");
        assert_eq!(TimeEncoding::Millis.format(t), "1704164645120");
        assert_eq!(TimeEncoding::Millis.format(t + 500_000), "1704164645120.5");
        assert_eq!(TimeEncoding::Nanos.format(t), "1704164645120000000");
        assert_eq!(TimeEncoding::Iso8601.format(t), "2024-01-02T03:04:05.120Z");
        assert_eq!(TimeEncoding::Rfc3339.format(t), "2024-01-02T03:04:05Z");
        assert_eq!(
            TimeEncoding::Rfc3339Nano.format(t),
            "2024-01-02T03:04:05.12Z"
        );
        assert_eq!(
            TimeEncoding::Rfc3339Nano.format(t - 120_000_000),
            "2024-01-02T03:04:05Z"
        );
    }
}
