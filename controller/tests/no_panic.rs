//! No panic is reachable from any object the API server accepts (issue 22,
//! item 1).
//!
//! The schema of a NodeMaintenance leaves a lot open: `spec.nodeName` and
//! `spec.reason` are any non-empty (resp. any) string, `spec.drainTimeout`
//! any string matching the Go-duration pattern, however many digits; and a
//! user allowed to write `/status` can set every status field to anything
//! its type allows (i64 extremes, lists of unrelated lengths, conditions of
//! any type, status and time). These properties build such objects as JSON
//! text, decode them as the controller does (serde_json), and drive every
//! pure decision of the controller with them: `shared::rules::duration::parse`,
//! `plan`, `conditions`, `classify::drain_progress` and `shared::rules::slots`.
//! Each case runs under the test (debug) profile, where an integer overflow
//! panics; the outputs are checked to stay sane (drainProgress in 0..=100
//! after any function that sets it, phases as each function documents).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use nmo_controller::classify::drain_progress;
use nmo_controller::conditions::{self, Cause};
use nmo_controller::plan::{
    self, Admission, Deadline, LeaseOutcome, LeaseStep, Lifecycle, REQUEUE_HOLD, Round,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::string::string_regex;
use proptest::test_runner::{Config, RngAlgorithm};
use serde_json::{Map, Value, json};
use shared::api::consts::{FINALIZER, MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE};
use shared::rules::duration;
use shared::rules::slots::{self, Entry, SlotDecision};
use shared::{
    DrainTimeoutAction, MaintenancePhase, NodeMaintenance, NodeMaintenanceStatus as Status,
    PodReference,
};

/// The longest generated string, in chars.
const HUGE: usize = 100_000;
/// The longest generated pod lists.
const MANY: usize = 3_000;

fn config() -> Config {
    Config {
        cases: 256,
        // A failure prints its minimal input; no regression files in the tree.
        failure_persistence: None,
        // Its quality is plenty here, at a fraction of ChaCha's cost in debug.
        rng_algorithm: RngAlgorithm::XorShift,
        ..Config::default()
    }
}

// ---------------------------------------------------------------- strategies

fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => any::<char>(),
        2 => prop::char::range('a', 'z'),
        1 => select(vec![
            '\0', '\u{202E}', '\u{200F}', '\u{061C}', 'ש', 'ع', '😀', '\u{200D}', '\u{FEFF}',
            '\u{FFFF}', '\u{10FFFF}', '\u{0301}', '"', '\\', '\n', '\u{7F}', 'µ', 'μ', '/', ' ',
        ]),
    ]
}

/// Any unicode text: mostly short, sometimes RTL, emoji, NUL, and now and
/// then up to [`HUGE`] chars.
fn text() -> BoxedStrategy<String> {
    text_huge_one_in(11)
}

/// [`text`] with one in `n` up to [`HUGE`] chars (conditions come by the
/// dozen: a huge text in each would only slow the test down).
fn text_huge_one_in(n: u32) -> BoxedStrategy<String> {
    prop_oneof![
        (n - 3) => vec(any_char(), 0..24).prop_map(String::from_iter),
        2 => select(vec![
            "",
            "\u{202E}gnp.exe\u{202C}",
            "שלום עולם",
            "مرحبا بالعالم",
            "👩\u{200D}👩\u{200D}👧\u{200D}👦🏳\u{FE0F}\u{200D}🌈",
            "a\u{0}b",
            "\u{0}",
            "e\u{301}\u{301}\u{301}",
        ])
        .prop_map(String::from),
        1 => (vec(any_char(), 1..8), 1..=HUGE).prop_map(|(chunk, n)| {
            String::from_iter(&chunk).repeat(n.div_ceil(chunk.len()))
        }),
    ]
    .boxed()
}

fn nonempty_text() -> BoxedStrategy<String> {
    text()
        .prop_map(|s| if s.is_empty() { "n".to_string() } else { s })
        .boxed()
}

fn short_text() -> impl Strategy<Value = String> {
    vec(any_char(), 0..12).prop_map(String::from_iter)
}

/// Any i64, the edges (and the edges of `* 100`) often.
fn any_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => any::<i64>(),
        2 => select(vec![
            i64::MIN,
            i64::MIN + 1,
            i64::MIN / 100 - 1,
            -101,
            -100,
            -1,
            0,
            1,
            3,
            4,
            99,
            100,
            101,
            i64::MAX / 100,
            i64::MAX / 100 + 1,
            i64::MAX - 1,
            i64::MAX,
        ]),
        2 => -1_000i64..1_000,
    ]
}

fn any_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        2 => 0usize..10_000,
        1 => any::<usize>(),
        1 => select(vec![0, 1, usize::MAX - 1, usize::MAX]),
    ]
}

/// RFC 3339 years 0000..=9999 (what the API server's date-time admits), in seconds.
const RFC3339_SECONDS: std::ops::RangeInclusive<i64> = -62_167_219_200..=253_402_300_799;

/// A timestamp anywhere in jiff's range, the API server's and now's often.
fn timestamp() -> impl Strategy<Value = Timestamp> {
    let (min, max) = (Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    let at = |(s, ns): (i64, i64)| {
        let t = Timestamp::from_second(s).expect("in jiff's range");
        t.checked_add(SignedDuration::from_nanos(ns)).unwrap_or(t)
    };
    prop_oneof![
        2 => (min..=max, 0..1_000_000_000i64).prop_map(at),
        2 => (RFC3339_SECONDS, 0..1_000_000_000i64).prop_map(at),
        2 => (1_600_000_000i64..1_900_000_000, Just(0)).prop_map(at),
        1 => select(vec![Timestamp::MIN, Timestamp::MAX, Timestamp::UNIX_EPOCH]),
    ]
}

/// A timestamp as JSON: as the API server writes it (whole seconds) where
/// RFC 3339 can say it, else in jiff's extended form.
fn time_json() -> impl Strategy<Value = Value> {
    (timestamp(), any::<bool>()).prop_map(|(t, k8s_form)| {
        if k8s_form && RFC3339_SECONDS.contains(&t.as_second()) {
            serde_json::to_value(Time(t)).expect("a time serialises")
        } else {
            json!(t.to_string())
        }
    })
}

/// Strings the CRD's `drainTimeout` pattern admits: from the pattern itself,
/// small valid ones, long digit runs, many segments, and known edges.
fn drain_timeout() -> BoxedStrategy<String> {
    let pattern = duration::GO_DURATION_PATTERN
        .trim_start_matches('^')
        .trim_end_matches('$');
    let re = |r: &str| string_regex(r).expect("a valid regex");
    prop_oneof![
        3 => re(pattern),
        3 => re(r"([0-9]{1,3}(\.[0-9]{1,3})?(ns|us|µs|ms|s|m|h)){1,4}"),
        2 => re(r"([0-9]{19,40}(\.[0-9]{1,40})?(ns|us|µs|ms|s|m|h)){1,3}"),
        1 => vec(re(r"[0-9]{1,2}(\.[0-9])?(ns|us|µs|ms|s|m|h)"), 1..300).prop_map(|s| s.concat()),
        1 => select(vec![
            "0",
            "9999999999999999999h",
            "9999999999999999999999999999999999999999h",
            "2562047h47m16.854775807s",
            "2562047h47m16.854775808s",
            "9223372036854775807ns",
            "9223372036854775808ns",
            "0.0000000000000000000000000000000000000001ns",
            "18446744073709551615ns",
            "18446744073709551616ns",
            "1.99999999999999999999999999999999999999h",
        ])
        .prop_map(String::from),
    ]
    .boxed()
}

fn phase_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => select(vec!["Pending", "Running", "Succeeded", "Failed"]).prop_map(|p| json!(p)),
        1 => text().prop_map(|p| json!(p)),
    ]
}

fn pod_ref() -> impl Strategy<Value = PodReference> {
    (short_text(), short_text()).prop_map(|(namespace, name)| PodReference { namespace, name })
}

/// A list of `item`s: mostly short, sometimes up to [`MANY`] (a few
/// generated ones repeated: cheap to generate and to shrink).
fn list<T, S>(item: fn() -> S) -> BoxedStrategy<Vec<T>>
where
    T: Clone + std::fmt::Debug + 'static,
    S: Strategy<Value = T> + 'static,
{
    prop_oneof![
        3 => vec(item(), 0..4),
        1 => (vec(item(), 1..4), 0..=MANY)
            .prop_map(|(some, n)| some.into_iter().cycle().take(n).collect()),
    ]
    .boxed()
}

fn pods() -> BoxedStrategy<Vec<PodReference>> {
    list(pod_ref)
}

fn names() -> BoxedStrategy<Vec<String>> {
    list(short_text)
}

fn condition_json() -> impl Strategy<Value = Value> {
    let type_ = prop_oneof![
        3 => select(vec![
            conditions::QUEUED,
            conditions::CORDONED,
            conditions::DRAINED,
            conditions::BLOCKED,
            conditions::FAILED,
        ])
        .prop_map(String::from),
        1 => short_text(),
    ];
    let status = prop_oneof![
        3 => select(vec!["True", "False", "Unknown"]).prop_map(String::from),
        1 => short_text(),
    ];
    let reason = prop_oneof![
        1 => Just("EvictionBlocked".to_string()),
        2 => text_huge_one_in(50),
    ];
    (
        type_,
        status,
        reason,
        text_huge_one_in(50),
        time_json(),
        prop::option::of(any_i64()),
    )
        .prop_map(|(type_, status, reason, message, time, generation)| {
            let mut c = json!({
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": time,
            });
            if let Some(g) = generation {
                c["observedGeneration"] = json!(g);
            }
            c
        })
}

/// `Some((field, value))` most of the time, else the field is left out.
fn field<S>(name: &'static str, s: S) -> impl Strategy<Value = Option<(&'static str, Value)>>
where
    S: Strategy<Value = Value>,
{
    prop::option::weighted(0.8, s).prop_map(move |v| v.map(|v| (name, v)))
}

fn object(fields: impl IntoIterator<Item = Option<(&'static str, Value)>>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<Map<_, _>>(),
    )
}

/// A status as a user with `/status` RBAC may write it: every field any
/// value of its type, independent of the others.
fn status_json() -> impl Strategy<Value = Value> {
    let refs = || pods().prop_map(|p| serde_json::to_value(p).expect("pod refs serialise"));
    (
        field("phase", phase_json()),
        field("drainProgress", any_i64().prop_map(|v| json!(v))),
        field("lastUpdate", time_json()),
        field("lastError", text().prop_map(|v| json!(v))),
        field("pendingPods", names().prop_map(|v| json!(v))),
        field("pendingPodsRefs", refs()),
        field("totalpods", any_i64().prop_map(|v| json!(v))),
        field("evictionPods", any_i64().prop_map(|v| json!(v))),
        field("errorOnLeaseCount", any_i64().prop_map(|v| json!(v))),
        field("forceDeletedPods", refs()),
        field(
            "conditions",
            vec(condition_json(), 0..8).prop_map(|v| json!(v)),
        ),
    )
        .prop_map(|f| object([f.0, f.1, f.2, f.3, f.4, f.5, f.6, f.7, f.8, f.9, f.10]))
}

/// Object names as the API server admits them (DNS subdomains), from a
/// small pool now and then so that several objects share one.
fn object_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => string_regex(r"[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?").expect("a valid regex"),
        1 => select(vec!["a", "b", "nm-1"]).prop_map(String::from),
    ]
}

/// A NodeMaintenance the API server accepts, as JSON. `node` and `phase`
/// override the generated ones (the slot tests want shared nodes).
fn nm_json(
    node: impl Strategy<Value = String>,
    status: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Value> {
    let metadata = (
        object_name(),
        field("creationTimestamp", time_json()),
        field("deletionTimestamp", time_json()),
        field(
            "finalizers",
            vec(prop_oneof![Just(FINALIZER.to_string()), short_text()], 0..3)
                .prop_map(|v| json!(v)),
        ),
        field("generation", any_i64().prop_map(|v| json!(v))),
    )
        .prop_map(|(name, c, d, f, g)| {
            let mut m = object([c, d, f, g]);
            m["name"] = json!(name);
            m
        });
    let spec = (
        node,
        field("reason", text().prop_map(|v| json!(v))),
        field("drainTimeout", drain_timeout().prop_map(|v| json!(v))),
        field(
            "drainTimeoutAction",
            select(vec!["Fail", "Force"]).prop_map(|v| json!(v)),
        ),
    )
        .prop_map(|(node, r, t, a)| {
            let mut s = object([r, t, a]);
            s["nodeName"] = json!(node);
            s
        });
    (metadata, spec, prop::option::weighted(0.9, status)).prop_map(|(metadata, spec, status)| {
        let mut nm = json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": metadata,
            "spec": spec,
        });
        if let Some(status) = status {
            nm["status"] = status;
        }
        nm
    })
}

/// Decode as the controller gets it: JSON text from the API server.
fn decode(nm: &Value) -> NodeMaintenance {
    let text = serde_json::to_string(nm).expect("JSON serialises");
    match serde_json::from_str(&text) {
        Ok(nm) => nm,
        Err(e) => panic!("a schema-valid NodeMaintenance must decode: {e}"),
    }
}

fn slot_decision() -> impl Strategy<Value = SlotDecision> {
    prop_oneof![
        Just(SlotDecision::Admitted),
        text().prop_map(|owner| SlotDecision::Duplicate { owner }),
        (any_usize(), names(), any_usize()).prop_map(|(position, holders, max)| {
            SlotDecision::Wait {
                position,
                holders,
                max,
            }
        }),
    ]
}

fn round() -> impl Strategy<Value = Round> {
    (
        pods(),
        prop::option::of(text()),
        pods(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                remaining,
                blocker,
                migrating,
                departures_watched,
                listed_before_cordon,
                waits_only,
            )| {
                Round {
                    remaining,
                    blocker,
                    migrating,
                    departures_watched,
                    listed_before_cordon,
                    waits_only,
                }
            },
        )
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..100_000, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(duration::MAX),
    ]
}

const CAUSES: [Cause; 12] = [
    Cause::Progress,
    Cause::WaitingForSlot,
    Cause::EvictionBlocked,
    Cause::LeaseHeldByOther,
    Cause::LeaseError,
    Cause::ReconcileError,
    Cause::NodeNotFound,
    Cause::LeaseLost,
    Cause::DuplicateMaintenance,
    Cause::DrainTimeout,
    Cause::InternalError,
    Cause::NodeUpdateRefused,
];

// ---------------------------------------------------------------- checks

/// drainProgress as a plan function leaves it: a percentage.
fn assert_progress(st: &Status, what: &str) {
    assert!(
        (0..=100).contains(&st.drain_progress),
        "{what}: drainProgress {} outside 0..=100",
        st.drain_progress
    );
}

/// `new` equals `old` but for its phase and lastError.
fn same_but_phase_and_error(old: &Status, new: &Status) -> bool {
    let mut cmp = new.clone();
    cmp.phase = old.phase.clone();
    cmp.last_error = old.last_error.clone();
    cmp == *old
}

fn check_admit(st: &Status, slot: &SlotDecision, name: &str, node: &str) {
    let got = plan::admit(st, slot, name, node);
    if st.phase == Some(MaintenancePhase::Failed) {
        assert_eq!(got, Admission::Final, "Failed is final, whatever the slot");
        return;
    }
    match (slot, got) {
        (SlotDecision::Duplicate { .. }, Admission::Fail(new)) => {
            assert_eq!(new.phase, Some(MaintenancePhase::Failed));
            assert!(
                same_but_phase_and_error(st, &new),
                "a duplicate keeps the rest"
            );
        }
        (SlotDecision::Wait { .. }, Admission::Wait(new)) => {
            assert_eq!(new.phase, Some(MaintenancePhase::Pending));
            assert!(!new.last_error.is_empty(), "a wait says what it waits for");
            assert!(same_but_phase_and_error(st, &new), "a wait keeps the rest");
        }
        (SlotDecision::Admitted, Admission::Proceed { first_sight }) => {
            assert_eq!(first_sight, !plan::touched_node(st.phase.as_ref()));
        }
        (slot, got) => panic!("{slot:?} admitted as {got:?}"),
    }
}

fn check_lease(st: &Status, outcome: LeaseOutcome) {
    let counted = match &outcome {
        LeaseOutcome::Held => None,
        LeaseOutcome::HeldByOther(_) if st.drain_progress == 0 => None,
        _ => Some(st.error_on_lease_count.saturating_add(1)),
    };
    let held = outcome == LeaseOutcome::Held;
    match plan::after_lease(st, outcome) {
        LeaseStep::Proceed(new) => {
            assert!(held, "only a held lease proceeds");
            assert_eq!(
                new.error_on_lease_count, 0,
                "getting the lease resets the count"
            );
        }
        LeaseStep::Retry(new) => {
            assert!(!held);
            assert_eq!(
                new.error_on_lease_count,
                counted.unwrap_or(st.error_on_lease_count)
            );
            if counted.is_some() {
                assert!(new.error_on_lease_count <= MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE);
            }
            assert_eq!(new.phase, st.phase, "a retry keeps the phase");
        }
        LeaseStep::GiveUp { status, .. } => {
            let count = counted.expect("only a counted failure gives up");
            assert!(count > MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE);
            assert_eq!(status.error_on_lease_count, count);
            assert_eq!(status.phase, Some(MaintenancePhase::Failed));
        }
    }
}

fn check_round(st: &Status, round: Round, retry: Duration) {
    let left = round.remaining.len();
    let waiting = round.blocker.is_some() || !round.migrating.is_empty();
    let before_cordon = round.listed_before_cordon;
    let next = plan::after_round(st, round, retry);
    assert_progress(&next.status, "after_round");
    if left == 0 && before_cordon {
        // Documented: a list taken before the cordon never says Succeeded;
        // a list after it follows at once.
        assert_eq!(next.status.phase, st.phase);
        assert_eq!(next.status.drain_progress, 100);
        assert!(next.status.pending_pods.is_empty() && next.status.pending_pods_refs.is_empty());
        assert_eq!(next.requeue, plan::REQUEUE_NOW);
    } else if left == 0 {
        // Documented: nothing left is Succeeded, 100, lists cleared. (A
        // Failed maintenance never gets here: admit says Final first.)
        assert_eq!(next.status.phase, Some(MaintenancePhase::Succeeded));
        assert_eq!(next.status.drain_progress, 100);
        assert!(next.status.pending_pods.is_empty() && next.status.pending_pods_refs.is_empty());
        assert_eq!(next.requeue, REQUEUE_HOLD);
        assert!(!next.refresh);
    } else if st.phase == Some(MaintenancePhase::Succeeded) {
        // Documented: a pod arriving after success does not rewind the drain.
        assert_eq!(next.status.phase, st.phase);
        assert_eq!(next.status.drain_progress, 100);
        assert!(next.status.pending_pods.is_empty() && next.status.pending_pods_refs.is_empty());
        assert_eq!(next.refresh, waiting);
    } else {
        assert_eq!(
            next.status.phase, st.phase,
            "a round under way keeps the phase"
        );
        assert_eq!(next.status.pending_pods.len(), left);
        assert_eq!(next.status.pending_pods_refs.len(), left);
        assert_eq!(next.refresh, waiting);
        assert_eq!(
            next.status.drain_progress,
            drain_progress(st.eviction_pods, left as i64)
        );
    }
}

fn check_deadline(
    timeout: Option<Duration>,
    action: DrainTimeoutAction,
    since: Option<Timestamp>,
    now: Timestamp,
) {
    let got = plan::deadline(timeout, action, since, now);
    match (timeout, since, got) {
        (None, _, d) | (_, None, d) => assert_eq!(d, Deadline::Unbounded),
        (Some(t), Some(_), Deadline::Ahead(left)) => {
            assert!(!left.is_zero() && left <= t, "{left:?} left of {t:?}");
        }
        (Some(_), Some(_), Deadline::Passed(a)) => assert_eq!(a, action),
        (Some(_), Some(_), Deadline::Unbounded) => panic!("a deadline and a start: bounded"),
    }
}

fn check_conditions(
    st: &Status,
    cordoned: bool,
    migrating: usize,
    generation: Option<i64>,
    now: &Time,
    cause_text: &str,
) {
    let old = &st.conditions;
    // What the status already holds, as the controller reads it back.
    let _ = conditions::blocked_message(old);
    for t in [
        conditions::QUEUED,
        conditions::CORDONED,
        conditions::DRAINED,
        conditions::BLOCKED,
        conditions::FAILED,
    ] {
        if let Some(since) = conditions::true_since(old, t) {
            assert!(
                old.iter()
                    .any(|c| c.type_ == t && c.last_transition_time == since)
            );
        }
    }
    for cause in CAUSES {
        let mut new = conditions::conditions(old, st, cause, cordoned, migrating, generation, now);
        let types: Vec<&str> = new.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                conditions::FAILED,
                conditions::BLOCKED,
                conditions::QUEUED,
                conditions::DRAINED,
                conditions::CORDONED
            ]
        );
        for c in &new {
            assert!(c.status == "True" || c.status == "False", "{c:?}");
            assert_eq!(c.observed_generation, generation);
            let kept = old
                .iter()
                .any(|o| o.type_ == c.type_ && o.status == c.status);
            assert!(kept || c.last_transition_time == *now);
        }
        let failed = st.phase == Some(MaintenancePhase::Failed);
        assert_eq!(new[0].status == "True", failed);
        let before: Vec<Condition> = new.clone();
        conditions::add_failure_cause(&mut new, cause_text);
        if cause_text.is_empty() || !failed {
            assert_eq!(new, before);
        } else {
            assert!(new[0].message.ends_with(cause_text));
        }
        if let Some(msg) = conditions::drain_blocked_news(old, &new) {
            assert_eq!(Some(msg), conditions::blocked_message(&new));
            assert_ne!(Some(msg), conditions::blocked_message(old));
        }
        let _ = conditions::drain_blocked_news(&new, old);
        let _ = conditions::true_since(&new, conditions::CORDONED);
    }
}

// ---------------------------------------------------------------- properties

proptest! {
    #![proptest_config(config())]

    /// One object, decoded, through every plan and conditions function.
    #[test]
    fn any_accepted_object_goes_through_every_decision(
        nm in nm_json(nonempty_text(), status_json()),
        slot in slot_decision(),
        total in any_usize(),
        must_leave in pods(),
        lease_holder in text(),
        lease_error in text(),
        round in round(),
        blocked_retry in any_duration(),
        since in prop::option::of(timestamp()),
        now in timestamp(),
        cordoned in any::<bool>(),
        extra in (any_usize(), prop::option::of(any_i64()), text(), any::<bool>()),
    ) {
        let (migrating, generation, cause_text, refresh) = extra;
        let nm = decode(&nm);
        let name = nm.metadata.name.clone().unwrap_or_default();
        let node = nm.spec.node_name.clone();
        let st = nm.status.clone().unwrap_or_default();

        // The spec: the timeout, as reconcile's drain_timeout reads it.
        let timeout = nm.spec.drain_timeout.as_deref().and_then(|t| duration::parse(t).ok());
        if let Some(t) = timeout {
            prop_assert!(t <= duration::MAX);
        }
        let action = nm.spec.drain_timeout_action.unwrap_or_default();

        let has_finalizer = nm.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER);
        let deleting = nm.metadata.deletion_timestamp.is_some();
        let lc = plan::lifecycle(has_finalizer, deleting);
        prop_assert_eq!(lc == Lifecycle::Cleanup || lc == Lifecycle::Done, deleting);

        // Admission, with the generated decision and with each kind.
        check_admit(&st, &slot, &name, &node);
        check_admit(&st, &SlotDecision::Admitted, &name, &node);
        check_admit(&st, &SlotDecision::Duplicate { owner: lease_holder.clone() }, &name, &node);
        check_admit(
            &st,
            &SlotDecision::Wait { position: total, holders: vec![name.clone()], max: migrating },
            &name,
            &node,
        );

        let missing = plan::node_missing(&st, &node);
        prop_assert_eq!(missing.phase.clone(), Some(MaintenancePhase::Failed));
        prop_assert!(same_but_phase_and_error(&st, &missing));

        let begun = plan::begin(&st, total, must_leave.clone());
        prop_assert_eq!(begun.phase.clone(), Some(MaintenancePhase::Running));
        prop_assert_eq!(begun.total_pods, i64::try_from(total).unwrap_or(i64::MAX));
        prop_assert_eq!(begun.eviction_pods, must_leave.len() as i64);
        prop_assert_eq!(begun.pending_pods.len(), must_leave.len());
        assert_progress(&begun, "begin");

        for outcome in [
            LeaseOutcome::Held,
            LeaseOutcome::HeldByOther(lease_holder.clone()),
            LeaseOutcome::Failed(lease_error.clone()),
        ] {
            check_lease(&st, outcome.clone());
            check_lease(&begun, outcome);
        }

        // A round on the hand-written status (any phase) and on a begun one.
        check_round(&st, round.clone(), blocked_retry);
        check_round(&begun, round.clone(), blocked_retry);

        // The deadline: from the Cordoned condition, as reconcile takes it,
        // and from any time.
        let cordoned_since =
            conditions::true_since(&st.conditions, conditions::CORDONED).map(|t| t.0);
        for s in [cordoned_since, since] {
            check_deadline(timeout, action, s, now);
            check_deadline(timeout, DrainTimeoutAction::Force, s, now);
        }
        for t in [timeout, Some(blocked_retry)].into_iter().flatten() {
            let out = plan::timed_out(&st, t, &node);
            prop_assert_eq!(out.phase.clone(), Some(MaintenancePhase::Failed));
            prop_assert!(same_but_phase_and_error(&st, &out));
            let said = format!("{} pods still on node", st.pending_pods_refs.len());
            prop_assert!(out.last_error.contains(&said));
        }

        // Writes and events between any two of these statuses.
        let next = plan::after_round(&st, round, blocked_retry).status;
        let now_time = Time(now);
        for new in [&st, &missing, &begun, &next] {
            prop_assert!(plan::needs_write(&st, new, true));
            let mut touched = new.clone();
            touched.last_update = Some(now_time.clone());
            prop_assert!(!plan::needs_write(new, &touched, false), "lastUpdate alone is no change");
            let _ = plan::needs_write(&st, new, refresh);
            let ends = matches!(
                new.phase,
                Some(MaintenancePhase::Succeeded | MaintenancePhase::Failed)
            );
            let event = plan::transition_event(&st, new);
            prop_assert_eq!(event.is_some(), st.phase != new.phase && ends);
            check_conditions(new, cordoned, migrating, generation, &now_time, &cause_text);
        }
        // The conditions of the status as written, against what it held.
        let mut on_top = next.clone();
        on_top.conditions = st.conditions.clone();
        let written = nm.metadata.generation;
        check_conditions(&on_top, cordoned, migrating, written, &now_time, &cause_text);
    }

    /// drainProgress is a percentage for any pair the status can hold.
    #[test]
    fn drain_progress_is_a_percentage(eviction in any_i64(), pending in any_i64()) {
        let p = drain_progress(eviction, pending);
        prop_assert!((0..=100).contains(&p), "drain_progress({eviction}, {pending}) = {p}");
    }

    /// For the values a real drain produces, the arithmetic is upstream's.
    #[test]
    fn drain_progress_is_upstreams_for_real_counts(
        eviction in 1i64..1_000_000,
        pending in 0i64..2_000_000,
    ) {
        let want = ((eviction - pending) * 100 / eviction).clamp(0, 100);
        prop_assert_eq!(drain_progress(eviction, pending), want);
        prop_assert_eq!(drain_progress(0, 0), 100);
        prop_assert_eq!(drain_progress(0, pending.max(1)), 0);
    }

    /// The slot rules over any set of accepted objects (names and nodes
    /// shared now and then), fed on into admission.
    #[test]
    fn slots_decide_for_any_set_of_objects(
        nms in vec(
            nm_json(
                prop_oneof![
                    2 => select(vec!["n1", "n2", "n3"]).prop_map(String::from),
                    1 => nonempty_text(),
                ],
                prop_oneof![
                    3 => phase_json().prop_map(|p| json!({"phase": p})),
                    1 => status_json(),
                ],
            ),
            0..8,
        ),
        outsider in nm_json(nonempty_text(), status_json()),
        max in any_usize(),
        position in any_usize(),
    ) {
        let nms: Vec<NodeMaintenance> = nms.iter().map(decode).collect();
        let outsider = decode(&outsider);
        let all: Vec<Entry> = nms.iter().map(Entry::of).collect();
        let small_max = max % 4;
        let entries = all.iter().cloned().chain([Entry::of(&outsider)]);
        for (nm, me) in nms.iter().chain([&outsider]).zip(entries) {
            for max in [0, 1, small_max, max] {
                let decision = slots::decide(&me, &all, max);
                let no_gate = |_: &Entry, _: &[Entry]| None::<()>;
                let turn = slots::turn(&me, &all, max, no_gate);
                prop_assert_eq!(&turn.decision, &Ok(decision.clone()), "no gate: the slots decide");
                let waits = matches!(decision, SlotDecision::Wait { .. });
                let ahead = waits.then_some(turn.ahead);
                match &decision {
                    SlotDecision::Wait { position, holders, max: m } => {
                        prop_assert!(*position >= 1, "positions are 1-based");
                        prop_assert_eq!(*m, max);
                        prop_assert!(max > 0, "no limit never waits");
                        let ahead = ahead.expect("a wait names who is ahead");
                        prop_assert!(ahead.len() >= holders.len());
                        prop_assert!(!slots::wait_message(*position, holders, max).is_empty());
                    }
                    _ => prop_assert!(ahead.is_none()),
                }
                if plan::touched_node(me.phase.as_ref()) {
                    prop_assert_eq!(&decision, &SlotDecision::Admitted);
                }
                let st = nm.status.clone().unwrap_or_default();
                check_admit(&st, &decision, &me.name, &me.node);
            }
        }
        let holders: Vec<String> = all.iter().map(|e| e.name.clone()).collect();
        let _ = slots::wait_message(position, &holders, max);
    }
}
