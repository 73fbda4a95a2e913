//! client-go's `workqueue_*` series for kube-runtime's Controller, whose queue
//! (a scheduler holding one entry per object, at its earliest due time) is
//! internal. `WorkQueue` mirrors it from the outside:
//!
//! - `added(key, ready_in)`: an object was scheduled (a watch event with
//!   `ready_in` zero, a requeue with its delay). A key already queued keeps the
//!   earlier of its two ready times, as kube-runtime's scheduler (and a
//!   workqueue) deduplicates.
//! - `started(key)`: a reconcile of `key` began; it leaves the queue and
//!   `workqueue_queue_duration_seconds` observes how long it waited since it
//!   became ready.
//! - `finished(key, seconds)`: `workqueue_work_duration_seconds`.
//! - `retried(key)`: `workqueue_retries_total` (client-go counts every
//!   delayed re-add: error retries and requeue-afters alike).
//! - `forget(key)`: the key left the queue without a reconcile (the object
//!   was deleted meanwhile, or a standby replica skipped it).
//!
//! As in client-go, an add counts in `workqueue_adds_total` and
//! `workqueue_depth` once it is ready (not while it waits for its delay);
//! both are brought up to date at scrape time by the Collector, so the depth
//! never shows keys still waiting for a requeue delay.
//!
//! Labels are controller-runtime's (pkg/metrics/workqueue.go): `name` and
//! `controller` (both the controller's name), plus `priority` (empty for a
//! queue without priorities) on `workqueue_depth`. Buckets: client-go's
//! `ExponentialBuckets(10e-9, 10, 12)`. The same Collector serves
//! controller-runtime's `controller_runtime_active_workers`, counted from the
//! reconciles in progress.

use shared::rules::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, HistogramVec, IntCounterVec, IntGaugeVec, exponential_buckets};

#[derive(Clone)]
pub struct WorkQueue {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    /// Label values: name, controller.
    labels: [String; 2],
    series: Series,
}

shared::series! {
    /// client-go's workqueue series (controller-runtime's labels) and
    /// `controller_runtime_active_workers`, every one at zero from the start.
    struct Series(name: &str) {
        depth: IntGaugeVec("workqueue_depth",
            "Current depth of workqueue by workqueue and priority",
            ["name", "controller", "priority"], zero [[name, name, ""]]),
        adds: IntCounterVec("workqueue_adds_total",
            "Total number of adds handled by workqueue", ["name", "controller"],
            zero [[name, name]]),
        queue_duration: HistogramVec("workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            ["name", "controller"], buckets = exponential_buckets(10e-9, 10.0, 12)?,
            zero [[name, name]]),
        work_duration: HistogramVec("workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            ["name", "controller"], buckets = exponential_buckets(10e-9, 10.0, 12)?,
            zero [[name, name]]),
        retries: IntCounterVec("workqueue_retries_total",
            "Total number of retries handled by workqueue", ["name", "controller"],
            zero [[name, name]]),
        unfinished: GaugeVec("workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
            ["name", "controller"], zero [[name, name]]),
        longest: GaugeVec("workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            ["name", "controller"], zero [[name, name]]),
        active_workers: IntGaugeVec("controller_runtime_active_workers",
            "Number of currently used workers per controller", ["controller"], zero [[name]]),
    }
}

#[derive(Default)]
struct State {
    /// Keys waiting for a reconcile: when they are (or become) ready, and
    /// whether that readiness was already counted in adds_total.
    queued: HashMap<String, Queued>,
    /// Keys being reconciled, since when.
    processing: HashMap<String, Instant>,
}

struct Queued {
    ready_at: Instant,
    counted: bool,
}

impl WorkQueue {
    /// A tracker for the queue of controller `name` (label values of
    /// `workqueue_*{name,controller}` and `controller_runtime_active_workers`).
    pub fn new(name: &str) -> Result<Self, prometheus::Error> {
        let inner = Inner {
            state: Mutex::new(State::default()),
            labels: [name.to_string(), name.to_string()],
            series: Series::build(name)?,
        };
        Ok(WorkQueue {
            inner: Arc::new(inner),
        })
    }

    /// The Collector to register (it brings depth and the in-progress gauges
    /// up to date on every scrape).
    pub fn collector(&self) -> Box<dyn Collector> {
        Box::new(QueueCollector(self.inner.clone()))
    }

    /// `key` was scheduled; it becomes ready after `ready_in`.
    pub fn added(&self, key: &str, ready_in: Duration) {
        let now = Instant::now();
        self.add_ready_at(key, now.checked_add(ready_in).unwrap_or(now), now);
    }

    fn add_ready_at(&self, key: &str, ready_at: Instant, now: Instant) {
        let inner = &self.inner;
        let mut st = inner.lock();
        match st.queued.get_mut(key) {
            Some(q) if ready_at < q.ready_at && !q.counted => q.ready_at = ready_at,
            Some(_) => {}
            None => {
                st.queued.insert(
                    key.to_string(),
                    Queued {
                        ready_at,
                        counted: false,
                    },
                );
            }
        }
        inner.promote(&mut st, now);
    }

    /// A reconcile of `key` began.
    pub fn started(&self, key: &str) {
        let inner = &self.inner;
        let now = Instant::now();
        let mut st = inner.lock();
        inner.promote(&mut st, now);
        if let Some(q) = st.queued.remove(key) {
            let waited = now.saturating_duration_since(q.ready_at);
            inner
                .series
                .queue_duration
                .with_label_values(&inner.label_refs())
                .observe(waited.as_secs_f64());
        }
        st.processing.insert(key.to_string(), now);
    }

    /// The reconcile of `key` ended after `seconds`.
    pub fn finished(&self, key: &str, seconds: f64) {
        let inner = &self.inner;
        let mut st = inner.lock();
        st.processing.remove(key);
        inner
            .series
            .work_duration
            .with_label_values(&inner.label_refs())
            .observe(seconds);
    }

    /// `key` was put back for another try.
    pub fn retried(&self, _key: &str) {
        let inner = &self.inner;
        inner
            .series
            .retries
            .with_label_values(&inner.label_refs())
            .inc();
    }

    /// `key` left the queue without a reconcile.
    pub fn forget(&self, key: &str) {
        self.inner.lock().queued.remove(key);
    }

    /// Keep only the keys in `present` (the objects in the cache).
    pub fn retain(&self, present: &std::collections::HashSet<String>) {
        self.inner.lock().queued.retain(|k, _| present.contains(k));
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain bookkeeping behind:
        // keep using it.
        self.state.locked()
    }

    fn label_refs(&self) -> [&str; 2] {
        [self.labels[0].as_str(), self.labels[1].as_str()]
    }

    /// Count the adds of keys that have become ready.
    fn promote(&self, st: &mut State, now: Instant) {
        let mut newly = 0;
        for q in st.queued.values_mut() {
            if !q.counted && q.ready_at <= now {
                q.counted = true;
                newly += 1;
            }
        }
        if newly > 0 {
            self.series
                .adds
                .with_label_values(&self.label_refs())
                .inc_by(newly);
        }
    }

    /// Bring the scrape-time gauges up to date.
    fn refresh(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        self.promote(&mut st, now);
        let l = self.label_refs();
        let ready = st.queued.values().filter(|q| q.counted).count();
        self.series
            .depth
            .with_label_values(&[l[0], l[1], ""])
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
        let running: Vec<f64> = st
            .processing
            .values()
            .map(|s| now.saturating_duration_since(*s).as_secs_f64())
            .collect();
        self.series
            .unfinished
            .with_label_values(&l)
            .set(running.iter().sum());
        self.series
            .longest
            .with_label_values(&l)
            .set(running.iter().copied().fold(0.0, f64::max));
        self.series
            .active_workers
            .with_label_values(&[l[1]])
            .set(i64::try_from(running.len()).unwrap_or(i64::MAX));
    }
}

struct QueueCollector(Arc<Inner>);

impl Collector for QueueCollector {
    fn desc(&self) -> Vec<&Desc> {
        let all = self.0.series.collectors();
        all.into_iter().flat_map(|c| c.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.refresh();
        let all = self.0.series.collectors();
        all.into_iter().flat_map(|c| c.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(q: &WorkQueue) -> String {
        let r = prometheus::Registry::new();
        r.register(q.collector()).expect("register");
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&r.gather(), &mut out)
            .expect("encode");
        out
    }

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{series} in\n{text}"))
    }

    const DEPTH: &str = r#"workqueue_depth{controller="q",name="q",priority=""}"#;
    const ADDS: &str = r#"workqueue_adds_total{controller="q",name="q"}"#;

    #[test]
    fn depth_counts_only_ready_keys() {
        let q = WorkQueue::new("q").expect("queue");
        q.added("now", Duration::ZERO);
        q.added("later", Duration::from_secs(3600));
        let text = render(&q);
        assert_eq!(value(&text, DEPTH), 1.0);
        // A key waiting for its delay is not an add yet (client-go counts on ready).
        assert_eq!(value(&text, ADDS), 1.0);
    }

    #[test]
    fn a_readded_key_keeps_its_earliest_ready_time() {
        let q = WorkQueue::new("q").expect("queue");
        // Scheduled for later, then made due now: ready now, one add.
        q.added("a", Duration::from_secs(3600));
        q.added("a", Duration::ZERO);
        // Due now, then scheduled for later: still ready now.
        q.added("b", Duration::ZERO);
        q.added("b", Duration::from_secs(3600));
        let text = render(&q);
        assert_eq!(value(&text, DEPTH), 2.0);
        assert_eq!(value(&text, ADDS), 2.0);
    }

    #[test]
    fn started_observes_the_wait_since_ready_and_leaves_the_queue() {
        let q = WorkQueue::new("q").expect("queue");
        let now = Instant::now();
        let ready = now.checked_sub(Duration::from_millis(250)).unwrap_or(now);
        q.add_ready_at("a", ready, now);
        q.started("a");
        let text = render(&q);
        assert_eq!(value(&text, DEPTH), 0.0);
        assert_eq!(
            value(
                &text,
                r#"workqueue_queue_duration_seconds_count{controller="q",name="q"}"#
            ),
            1.0
        );
        let waited = value(
            &text,
            r#"workqueue_queue_duration_seconds_sum{controller="q",name="q"}"#,
        );
        assert!(
            waited >= 0.2 || ready == now,
            "waited {waited} s, expected about 0.25"
        );
        assert_eq!(
            value(
                &text,
                r#"controller_runtime_active_workers{controller="q"}"#
            ),
            1.0
        );
        q.finished("a", 0.5);
        q.retried("a");
        let text = render(&q);
        assert_eq!(
            value(
                &text,
                r#"controller_runtime_active_workers{controller="q"}"#
            ),
            0.0
        );
        assert_eq!(
            value(
                &text,
                r#"workqueue_work_duration_seconds_count{controller="q",name="q"}"#
            ),
            1.0
        );
        assert_eq!(
            value(&text, r#"workqueue_retries_total{controller="q",name="q"}"#),
            1.0
        );
    }

    #[test]
    fn a_key_added_while_processing_is_queued_again() {
        let q = WorkQueue::new("q").expect("queue");
        q.added("a", Duration::ZERO);
        q.started("a");
        q.added("a", Duration::ZERO);
        q.finished("a", 0.1);
        let text = render(&q);
        assert_eq!(value(&text, DEPTH), 1.0);
        assert_eq!(value(&text, ADDS), 2.0);
        q.forget("a");
        assert_eq!(value(&render(&q), DEPTH), 0.0);
    }
}
