//! Log lines in controller-runtime's zap encodings, so log pipelines built
//! for upstream keep matching ours.
//!
//! - `--zap-encoder=json`: one JSON object per line, keys in zap's order:
//!   `level` (lower case: `debug`, `info`, `warn`, `error`), `ts`, `logger`,
//!   `caller` (only with `--zap-stacktrace-level=info`), `msg`, then the
//!   event's fields. Strings stay JSON strings; integers, floats and booleans
//!   are JSON numbers and booleans; values only `Debug` can show are strings.
//! - `--zap-encoder=console`: zap's console line, tab-separated: time,
//!   `LEVEL` in upper case, logger, caller (when on), message, and the fields
//!   as one JSON object (left out when there are none).
//!
//! `logger` is what controller-runtime calls the logger's name; ours is the
//! `tracing` target, the Rust module that logged (`nmo_controller::reconcile`).
//! `ts` follows `--zap-time-encoding` (see [`crate::serve::zap`] for the
//! default): numbers for epoch, millis and nanos, strings otherwise.
//! `tracing`'s TRACE (verbosity 2 and more) is written as `debug`: zap would
//! write `Level(-2)`, which no pipeline filters on. Spans add nothing: none
//! of our code opens one, and zap has no such thing.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::serve::zap::{Encoder, LogSettings, TimeEncoding};

/// The `FormatEvent` both encoders share.
#[derive(Debug, Clone, Copy)]
pub struct ZapFormat {
    encoder: Encoder,
    time: Option<TimeEncoding>,
    caller: bool,
}

impl ZapFormat {
    pub fn new(settings: &LogSettings) -> ZapFormat {
        ZapFormat {
            encoder: settings.encoder,
            time: settings.time,
            caller: settings.source_location,
        }
    }

    /// The whole line (with its newline) for `event`, logged at `nanos`
    /// since the Unix epoch.
    fn line(&self, event: &Event<'_>, nanos: i128) -> String {
        let meta = event.metadata();
        let mut fields = EventFields::default();
        event.record(&mut fields);
        let logger = fields.log_target.as_deref().unwrap_or(meta.target());
        let caller = match (&fields.log_file, meta.file(), meta.line()) {
            _ if !self.caller => None,
            (Some(file), _, _) => Some(format!("{file}:{}", fields.log_line.unwrap_or(0))),
            (None, Some(file), Some(line)) => Some(format!("{file}:{line}")),
            _ => None,
        };
        let (ts, ts_is_number) = timestamp(self.time, nanos);
        let head = Head {
            level: *meta.level(),
            ts: &ts,
            ts_is_number,
            logger,
            caller: caller.as_deref(),
        };
        match self.encoder {
            Encoder::Json => json_line(&head, &fields),
            Encoder::Console => console_line(&head, &fields),
        }
    }
}

impl<S, N> FormatEvent<S, N> for ZapFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str(&self.line(event, jiff::Timestamp::now().as_nanosecond()))
    }
}

/// What comes before the message and the fields.
struct Head<'a> {
    level: Level,
    ts: &'a str,
    ts_is_number: bool,
    logger: &'a str,
    caller: Option<&'a str>,
}

/// The time as zap writes it, and whether that is a JSON number. Without
/// `--zap-time-encoding`: RFC 3339, UTC, in microseconds.
fn timestamp(time: Option<TimeEncoding>, nanos: i128) -> (String, bool) {
    match time {
        Some(t @ (TimeEncoding::Epoch | TimeEncoding::Millis | TimeEncoding::Nanos)) => {
            (t.format(nanos), true)
        }
        Some(t) => (t.format(nanos), false),
        None => match jiff::Timestamp::from_nanosecond(nanos) {
            Ok(ts) => (format!("{ts:.6}"), false),
            Err(_) => (nanos.to_string(), true),
        },
    }
}

/// zap's level names: lower case for JSON, upper case for the console.
fn level_name(level: Level, upper: bool) -> &'static str {
    match (level, upper) {
        (Level::ERROR, false) => "error",
        (Level::WARN, false) => "warn",
        (Level::INFO, false) => "info",
        (_, false) => "debug",
        (Level::ERROR, true) => "ERROR",
        (Level::WARN, true) => "WARN",
        (Level::INFO, true) => "INFO",
        (_, true) => "DEBUG",
    }
}

fn json_line(head: &Head<'_>, fields: &EventFields) -> String {
    let mut out = String::with_capacity(128 + fields.json.len() + fields.msg.len());
    out.push_str("{\"level\":\"");
    out.push_str(level_name(head.level, false));
    out.push_str("\",\"ts\":");
    if head.ts_is_number {
        out.push_str(head.ts);
    } else {
        push_json_str(&mut out, head.ts);
    }
    out.push_str(",\"logger\":");
    push_json_str(&mut out, head.logger);
    if let Some(caller) = head.caller {
        out.push_str(",\"caller\":");
        push_json_str(&mut out, caller);
    }
    out.push_str(",\"msg\":");
    push_json_str(&mut out, &fields.msg);
    if !fields.json.is_empty() {
        out.push(',');
        out.push_str(&fields.json);
    }
    out.push_str("}\n");
    out
}

fn console_line(head: &Head<'_>, fields: &EventFields) -> String {
    let mut out = String::with_capacity(96 + fields.json.len() + fields.msg.len());
    out.push_str(head.ts);
    out.push('\t');
    out.push_str(level_name(head.level, true));
    out.push('\t');
    out.push_str(head.logger);
    if let Some(caller) = head.caller {
        out.push('\t');
        out.push_str(caller);
    }
    out.push('\t');
    out.push_str(&fields.msg);
    if !fields.json.is_empty() {
        out.push_str("\t{");
        out.push_str(&fields.json);
        out.push('}');
    }
    out.push('\n');
    out
}

/// An event's message and its other fields, the latter already written as
/// the members of a JSON object (`"k":v,"k2":v2`, no braces).
#[derive(Default)]
struct EventFields {
    msg: String,
    json: String,
    // Events from the `log` crate carry their origin as fields.
    log_target: Option<String>,
    log_file: Option<String>,
    log_line: Option<u64>,
}

impl EventFields {
    /// Start the member `field`; false for what is not a member of its own.
    fn key(&mut self, field: &Field) -> bool {
        if field.name() == "message" || field.name().starts_with("log.") {
            return false;
        }
        if !self.json.is_empty() {
            self.json.push(',');
        }
        push_json_str(&mut self.json, field.name());
        self.json.push(':');
        true
    }

    fn number(&mut self, field: &Field, value: impl fmt::Display) {
        if self.key(field) {
            let _ = write!(self.json, "{value}");
        }
    }
}

impl Visit for EventFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.msg, "{value:?}");
            }
            "log.target" => self.log_target = Some(format!("{value:?}")),
            "log.file" => self.log_file = Some(format!("{value:?}")),
            _ if self.key(field) => {
                self.json.push('"');
                let _ = write!(JsonEscaped(&mut self.json), "{value:?}");
                self.json.push('"');
            }
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.msg.push_str(value),
            "log.target" => self.log_target = Some(value.to_string()),
            "log.file" => self.log_file = Some(value.to_string()),
            _ if self.key(field) => push_json_str(&mut self.json, value),
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.number(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "log.line" {
            self.log_line = Some(value);
        } else {
            self.number(field, value);
        }
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.number(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.number(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.number(field, value);
        } else if self.key(field) {
            // zap writes what JSON has no number for as a string.
            let text = match value {
                v if v.is_nan() => "NaN",
                v if v > 0.0 => "+Inf",
                _ => "-Inf",
            };
            push_json_str(&mut self.json, text);
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.number(field, value);
    }
}

/// Append `s` as a JSON string, quotes included.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    let _ = JsonEscaped(out).write_str(s);
    out.push('"');
}

/// Escapes what it is given for the inside of a JSON string.
struct JsonEscaped<'a>(&'a mut String);

impl fmt::Write for JsonEscaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let out = &mut *self.0;
        let mut plain = 0;
        for (i, c) in s.char_indices() {
            let escape = match c {
                '"' => "\\\"",
                '\\' => "\\\\",
                '\n' => "\\n",
                '\r' => "\\r",
                '\t' => "\\t",
                c if (c as u32) < 0x20 => "",
                _ => continue,
            };
            out.push_str(&s[plain..i]);
            if escape.is_empty() {
                let _ = write!(out, "\\u{:04x}", c as u32);
            } else {
                out.push_str(escape);
            }
            plain = i + c.len_utf8();
        }
        out.push_str(&s[plain..]);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
