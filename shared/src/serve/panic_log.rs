//! Panics as one log line: a log pipeline that parses every line as JSON
//! keeps a panic whole, at `error`, instead of the standard hook's several
//! lines of plain text ("thread '...' panicked at ...", "note: run with
//! `RUST_BACKTRACE=1` ...").
//!
//! The line: `msg` is the panic's message; `location` is `file:line:column`
//! of the `panic!`; `thread` names the thread; `stacktrace` is Rust's
//! backtrace when `RUST_BACKTRACE` (or `RUST_LIB_BACKTRACE`) asks for one
//! (one JSON string, its line breaks escaped). The standard hook is not
//! chained: all it would add is the multi-line text this replaces.
//!
//! The log writer batches lines (see [`crate::serve::logwriter`]); the hook
//! writes the buffer out before it returns, so the line is out before the
//! panic unwinds, aborts or ends the process.

use std::any::Any;
use std::backtrace::{Backtrace, BacktraceStatus};
use std::panic::PanicHookInfo;

/// Replace the panic hook: log each panic as one line, then `flush`.
pub fn install(flush: impl Fn() + Send + Sync + 'static) {
    std::panic::set_hook(Box::new(move |info| {
        log_panic(info);
        flush();
    }));
}

/// Log the panic `info` describes through the current `tracing` subscriber.
pub fn log_panic(info: &PanicHookInfo<'_>) {
    let location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
    let backtrace = Backtrace::capture();
    let stacktrace =
        (backtrace.status() == BacktraceStatus::Captured).then(|| backtrace.to_string());
    let thread = std::thread::current();
    tracing::error!(
        location,
        thread = thread.name().unwrap_or("<unnamed>"),
        stacktrace,
        "{}",
        payload_text(info.payload())
    );
}

/// The message a panic was raised with (`panic!` gives a `&str` or a `String`).
pub fn payload_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "panic with a non-string payload"
    }
}
