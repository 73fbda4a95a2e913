//! Batched log output: log lines are appended to a shared buffer where they are
//! logged, and a writer thread writes the buffer out a few milliseconds after
//! it stops being empty, one `write` for many lines.
//!
//! Why not one write per line: the webhook logs one line per admission
//! decision, so at tens of thousands of reviews per second a write (or a
//! channel wake-up of a writer thread) per line costs more than the review
//! itself. Here a burst of lines costs one wake-up and one write.
//! Nothing is dropped: above `max_buffered` bytes (the output is stuck or very
//! slow) the logging thread writes the buffer itself and so waits for the
//! output, as a plain write would. Lines keep their order. The cost: a process
//! killed outright (SIGKILL, abort) loses the last few milliseconds of lines;
//! a normal exit writes everything (the binaries hold the guard in `main`),
//! and the panic hook writes the buffer out with the panic's line
//! ([`crate::serve::panic_log`]).
//!
//! Why not tracing-appender (`non_blocking` with `lossy(false)`, which blocks
//! rather than drops when full): measured slower, on every case. Benchmark:
//! `shared/examples/log_writers.rs` (run with `make bench`, or see its header),
//! 200k webhook decision lines (402-byte JSON lines, our formatting), from 1
//! and 4 threads, to a file, /dev/null and a pipe; 2 vCPUs shared with other
//! builds; 3 runs x 5 interleaved rounds, medians per run; tracing-appender
//! held 10,485 lines (our 4 MiB at 400 bytes a line). Against this writer:
//! - tracing-appender: lines/s 20% to 43% lower in all 18 medians (262k-726k
//!   against our 407k-960k); p99 of one log call 25% to 108% higher in all 18
//!   (2.6-4.9 us against our 1.9-2.7 us).
//! - tracing-appender with a 64 KiB `BufWriter` before the sink (its worker
//!   flushes whenever the channel runs empty, so writes are batched as here):
//!   lines/s from 24% lower to 14% higher (more than 15% lower in 10 of 18);
//!   p99 higher in 17 of 18 (more than 15% higher in 16, up to 3.9x).
//!
//! Where the time goes there: a heap allocation and a channel send per line,
//! and without the `BufWriter` one `write` per line on its worker thread, which
//! takes CPU from the logging threads on a small machine. Its guard also
//! differs at exit: it waits at most about 1.1 s for queued lines and then
//! drops them (we wait for all), and lines logged after it is dropped are lost
//! (here they are written directly).

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::rules::sync::LockExt;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the writer collects lines after the first one of a batch arrives.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(5);
/// Bytes held before logging waits for the output.
pub const DEFAULT_MAX_BUFFERED: usize = 4 << 20;

type Sink = Box<dyn Write + Send>;

struct State {
    buf: Vec<u8>,
    writer_waiting: bool,
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    // Held by whoever writes to the sink, taken while `state` is held, so
    // batches reach the sink in the order their lines were logged.
    sink: Mutex<Sink>,
    max_buffered: usize,
}

impl Shared {
    /// Write `bytes` to the sink, ignoring errors: there is nowhere left to
    /// report a failing log output.
    fn write_out(sink: &mut Sink, bytes: &[u8]) {
        let _ = sink.write_all(bytes);
        let _ = sink.flush();
    }

    fn append(&self, line: &[u8]) {
        let mut st = self.state.locked();
        st.buf.extend_from_slice(line);
        // Write here when the writer thread is gone (closing) or the output
        // does not keep up (back-pressure); queued lines go first.
        if st.closing || st.buf.len() >= self.max_buffered {
            let out = std::mem::take(&mut st.buf);
            let mut sink = self.sink.locked();
            drop(st);
            Self::write_out(&mut sink, &out);
            return;
        }
        if st.writer_waiting {
            st.writer_waiting = false;
            self.wake.notify_one();
        }
    }

    /// Write what is buffered now, on the calling thread.
    fn flush_now(&self) {
        let mut st = self.state.locked();
        if st.buf.is_empty() {
            return;
        }
        let out = std::mem::take(&mut st.buf);
        let mut sink = self.sink.locked();
        drop(st);
        Self::write_out(&mut sink, &out);
    }

    fn run_writer(&self, batch_delay: Duration) {
        let mut spare: Vec<u8> = Vec::new();
        loop {
            let mut st = self.state.locked();
            while st.buf.is_empty() && !st.closing {
                st.writer_waiting = true;
                st = self.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            st.writer_waiting = false;
            if st.buf.is_empty() && st.closing {
                return;
            }
            // Let the batch fill up: lines logged meanwhile cost no wake-up
            // (appends only notify a writer that waits for a first line).
            // Closing cuts the wait short.
            let deadline = Instant::now() + batch_delay;
            while !st.closing {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = self
                    .wake
                    .wait_timeout(st, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            spare.clear();
            std::mem::swap(&mut st.buf, &mut spare);
            let mut sink = self.sink.locked();
            drop(st);
            Self::write_out(&mut sink, &spare);
        }
    }
}

/// The writer handed to the log subscriber; cheap to clone.
#[derive(Clone)]
pub struct BatchWriter(Arc<Shared>);

impl BatchWriter {
    /// Write every buffered line now, on this thread, without waiting for
    /// the batch delay (the panic hook's line must be out before the
    /// process may end). `Write::flush` does the same.
    pub fn flush_now(&self) {
        self.0.flush_now();
    }
}

/// Stops the writer thread when dropped (or on [`WriterGuard::finish`]),
/// after every buffered line has been written.
#[must_use = "dropping the guard stops the log writer; keep it until exit"]
pub struct WriterGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl WriterGuard {
    /// Write what is buffered and stop the writer thread. Later lines are
    /// written directly.
    pub fn finish(&mut self) {
        {
            let mut st = self.shared.state.locked();
            st.closing = true;
            self.shared.wake.notify_one();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Start a writer thread for `sink`. If the thread cannot be started, lines
/// are written directly (no batching) and nothing is lost.
pub fn batched(
    sink: impl Write + Send + 'static,
    batch_delay: Duration,
    max_buffered: usize,
) -> (BatchWriter, WriterGuard) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            buf: Vec::with_capacity(64 << 10),
            writer_waiting: false,
            closing: false,
        }),
        wake: Condvar::new(),
        sink: Mutex::new(Box::new(sink)),
        max_buffered: max_buffered.max(1),
    });
    let worker = shared.clone();
    let thread = std::thread::Builder::new()
        .name("nmo-log-writer".into())
        .spawn(move || worker.run_writer(batch_delay))
        .ok();
    if thread.is_none() {
        shared.state.locked().closing = true;
    }
    (BatchWriter(shared.clone()), WriterGuard { shared, thread })
}

impl Write for BatchWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush_now();
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter {
    type Writer = BatchWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that records each write call separately.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.locked().push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Recorder {
        fn text(&self) -> String {
            String::from_utf8(self.0.locked().concat()).expect("utf8")
        }
        fn writes(&self) -> usize {
            self.0.locked().len()
        }
    }

    fn lines(n: usize) -> String {
        (0..n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn lines_arrive_in_order_in_few_writes_and_all_by_finish() {
        let rec = Recorder::default();
        let (mut w, mut guard) = batched(rec.clone(), Duration::from_millis(50), 1 << 20);
        for i in 0..1000 {
            w.write_all(format!("line {i}\n").as_bytes())
                .expect("write");
        }
        guard.finish();
        assert_eq!(rec.text(), lines(1000));
        assert!(
            rec.writes() < 10,
            "1000 lines logged within the batch delay took {} writes",
            rec.writes()
        );
    }

    #[test]
    fn a_full_buffer_is_written_by_the_logging_thread_without_loss() {
        let rec = Recorder::default();
        // Batches never leave the writer thread within the test (1 h delay):
        // everything that reaches the sink before finish went through the
        // back-pressure path.
        let (mut w, mut guard) = batched(rec.clone(), Duration::from_secs(3600), 64);
        for i in 0..100 {
            w.write_all(format!("line {i}\n").as_bytes())
                .expect("write");
        }
        assert!(rec.writes() > 0, "a full buffer must be written at once");
        drop(w);
        // finish does not wait for the batch delay.
        guard.finish();
        assert_eq!(rec.text(), lines(100));
    }

    #[test]
    fn lines_from_many_threads_stay_whole_and_in_order_per_thread() {
        let rec = Recorder::default();
        // A small buffer so both the writer thread and the back-pressure path
        // write while the threads log.
        let (w, mut guard) = batched(rec.clone(), Duration::from_millis(1), 4096);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        w.write_all(format!("thread {t} line {i}\n").as_bytes())
                            .expect("write");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("logging thread");
        }
        guard.finish();
        let text = rec.text();
        for t in 0..4 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let want: Vec<String> = (0..2000).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, want, "thread {t}'s lines lost, torn or reordered");
        }
        assert_eq!(text.lines().count(), 8000);
    }

    #[test]
    fn lines_after_finish_are_written_directly() {
        let rec = Recorder::default();
        let (mut w, mut guard) = batched(rec.clone(), DEFAULT_BATCH_DELAY, 1 << 20);
        w.write_all(b"before\n").expect("write");
        guard.finish();
        w.write_all(b"after\n").expect("write");
        assert_eq!(rec.text(), "before\nafter\n");
    }

    #[test]
    fn flush_writes_the_buffer_at_once() {
        let rec = Recorder::default();
        // No batch would leave the writer thread within the test.
        let (mut w, _guard) = batched(rec.clone(), Duration::from_secs(3600), 1 << 20);
        w.write_all(b"first\n").expect("write");
        w.write_all(b"panic line\n").expect("write");
        w.flush().expect("flush");
        assert_eq!(rec.text(), "first\npanic line\n");
        w.flush_now();
        assert_eq!(rec.writes(), 1, "nothing buffered: nothing written");
    }

    #[test]
    fn a_lone_line_is_written_without_waiting_for_more() {
        let rec = Recorder::default();
        let (mut w, _guard) = batched(rec.clone(), Duration::from_millis(1), 1 << 20);
        w.write_all(b"only\n").expect("write");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while rec.text() != "only\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "line not written within 10 s; sink holds {:?}",
                rec.text()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
