//! Rules of the per-node medik8s lease, as pure functions.
//!
//! The lease `medik8s-leases/node-<name>` is shared with Node Health Check and
//! Self Node Remediation, which all go through the lease manager of the Go
//! library github.com/medik8s/common (pkg/lease): whoever holds a valid lease
//! owns the node. These rules are that manager's, field by field, so the
//! operators agree on who owns a node; the controller carries the decisions
//! out against the API server (controller/src/node_lease.rs).
//!
//! - Validity: renewTime and leaseDurationSeconds both set, renewTime not
//!   after now, and renewTime + duration not before now (the end instant
//!   itself still counts as valid).
//! - Our own lease (holderIdentity equal to ours, nothing else compared):
//!   without renewTime or duration it is re-acquired; once expired it is
//!   renewed, re-acquired only when it has no acquireTime; otherwise it is
//!   renewed only if it would end before now + our duration.
//! - Anyone else's lease, holderless included: still valid means held (a
//!   missing holder is reported as `unknown`); otherwise it is taken over.
//! - Every write sets holder, duration and renewTime, and replaces the owner
//!   references with the Node's alone; a re-acquisition or takeover also sets
//!   acquireTime and adds one to leaseTransitions (1 when unset).
//! - Release deletes the lease unless it names another holder; a lease with
//!   no holder is deleted.

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Holder reported for a valid lease that names no holder.
pub const UNKNOWN_HOLDER: &str = "unknown";

/// What to do with the lease we found, given who we are and the time now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Ours, and it lasts at least until now + duration: nothing to write.
    Keep,
    /// Ours but ending before now + duration, expired, or incomplete: write
    /// it (see [`written_spec`]); `reacquire` also resets acquireTime and
    /// adds one to leaseTransitions.
    Renew { reacquire: bool },
    /// Someone else's (or no one's) and not valid: take it over, which is a
    /// re-acquisition under our name.
    TakeOver,
    /// Someone else's (or no one's) and still valid: we must wait. Carries
    /// the holder, [`UNKNOWN_HOLDER`] when the lease names none.
    HeldByOther(String),
}

/// What releasing the lease we found means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseDecision {
    /// Ours, or naming no holder: delete it.
    Delete,
    /// Names another holder: leave it alone.
    HeldByOther(String),
}

fn seconds(secs: i32) -> SignedDuration {
    SignedDuration::from_secs(i64::from(secs))
}

/// renewTime + leaseDurationSeconds, when both are set. An end beyond the
/// representable range is treated as "never".
fn end_of(spec: &LeaseSpec) -> Option<Timestamp> {
    let (renew, secs) = (spec.renew_time.as_ref()?, spec.lease_duration_seconds?);
    Some(renew.0.checked_add(seconds(secs)).unwrap_or(Timestamp::MAX))
}

/// A lease is valid when renewTime and leaseDurationSeconds are set, renewTime
/// is not after `now` and renewTime + leaseDurationSeconds is not before `now`.
pub fn is_valid(spec: &LeaseSpec, now: Timestamp) -> bool {
    match (spec.renew_time.as_ref(), end_of(spec)) {
        (Some(renew), Some(end)) => renew.0 <= now && end >= now,
        _ => false,
    }
}

/// Decide how to request the lease for `holder` for `duration_secs` at `now`.
pub fn decide(spec: &LeaseSpec, holder: &str, duration_secs: i32, now: Timestamp) -> LeaseDecision {
    if spec.holder_identity.as_deref() != Some(holder) {
        if is_valid(spec, now) {
            let holder = spec.holder_identity.as_deref().unwrap_or(UNKNOWN_HOLDER);
            return LeaseDecision::HeldByOther(holder.to_string());
        }
        return LeaseDecision::TakeOver;
    }
    let Some(end) = end_of(spec) else {
        return LeaseDecision::Renew { reacquire: true };
    };
    if end < now {
        return LeaseDecision::Renew {
            reacquire: spec.acquire_time.is_none(),
        };
    }
    let wanted = now
        .checked_add(seconds(duration_secs))
        .unwrap_or(Timestamp::MAX);
    if end < wanted {
        LeaseDecision::Renew { reacquire: false }
    } else {
        LeaseDecision::Keep
    }
}

/// The spec to write after a [`LeaseDecision::Renew`] (`reacquire` as
/// decided) or a [`LeaseDecision::TakeOver`] (`reacquire` true): holder,
/// duration and renewTime always; acquireTime and leaseTransitions + 1 (1 when
/// unset) on a re-acquisition. Other fields are kept as they are.
pub fn written_spec(
    old: &LeaseSpec,
    reacquire: bool,
    holder: &str,
    duration_secs: i32,
    now: Timestamp,
) -> LeaseSpec {
    let mut spec = old.clone();
    if reacquire {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(old.lease_transitions.map_or(1, |n| n.saturating_add(1)));
    }
    spec.holder_identity = Some(holder.to_string());
    spec.lease_duration_seconds = Some(duration_secs);
    spec.renew_time = Some(MicroTime(now));
    spec
}

/// The spec of a lease we create: acquired and renewed now, no transitions yet.
pub fn new_spec(holder: &str, duration_secs: i32, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(holder.to_string()),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(duration_secs),
        lease_transitions: Some(0),
        ..Default::default()
    }
}

/// Decide what releasing a lease with this spec (none: a lease without spec)
/// means for `holder`.
pub fn decide_release(spec: Option<&LeaseSpec>, holder: &str) -> ReleaseDecision {
    match spec.and_then(|s| s.holder_identity.as_deref()) {
        Some(other) if other != holder => ReleaseDecision::HeldByOther(other.to_string()),
        _ => ReleaseDecision::Delete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "node-maintenance";
    const DUR: i32 = 3600;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid timestamp")
    }

    /// A lease spec; `None` leaves the field unset.
    fn lease(
        holder: Option<&str>,
        acquire: Option<i64>,
        renew: Option<i64>,
        dur: Option<i32>,
        transitions: Option<i32>,
    ) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            acquire_time: acquire.map(|s| MicroTime(ts(s))),
            renew_time: renew.map(|s| MicroTime(ts(s))),
            lease_duration_seconds: dur,
            lease_transitions: transitions,
            ..Default::default()
        }
    }

    #[test]
    fn validity() {
        let nanos = |s: i64, n: i32| {
            ts(s)
                .checked_add(SignedDuration::new(0, n))
                .expect("valid timestamp")
        };
        // (name, lease, now, valid)
        let cases: Vec<(&str, LeaseSpec, Timestamp, bool)> = vec![
            (
                "renewed exactly now",
                lease(Some("x"), Some(0), Some(0), Some(100), None),
                ts(0),
                true,
            ),
            (
                "inside the window",
                lease(Some("x"), Some(0), Some(0), Some(100), None),
                ts(99),
                true,
            ),
            (
                "renewTime + duration == now is still valid",
                lease(Some("x"), Some(0), Some(0), Some(100), None),
                ts(100),
                true,
            ),
            (
                "one nanosecond after renewTime + duration",
                lease(Some("x"), Some(0), Some(0), Some(100), None),
                nanos(100, 1),
                false,
            ),
            (
                "renewTime one second in the future",
                lease(Some("x"), Some(0), Some(1), Some(100), None),
                ts(0),
                false,
            ),
            (
                "renewTime one nanosecond in the future",
                lease(Some("x"), Some(0), Some(0), Some(100), None),
                nanos(-1, 999_999_999),
                false,
            ),
            (
                "no renewTime",
                lease(Some("x"), Some(0), None, Some(100), None),
                ts(1),
                false,
            ),
            (
                "no duration",
                lease(Some("x"), Some(0), Some(0), None, None),
                ts(1),
                false,
            ),
            (
                "zero duration, now == renewTime",
                lease(Some("x"), Some(0), Some(0), Some(0), None),
                ts(0),
                true,
            ),
            (
                "acquireTime plays no part",
                lease(Some("x"), None, Some(0), Some(100), None),
                ts(50),
                true,
            ),
            (
                "no holder does not change validity",
                lease(None, None, Some(0), Some(100), None),
                ts(50),
                true,
            ),
            ("empty spec", LeaseSpec::default(), ts(0), false),
        ];
        for (name, spec, now, want) in cases {
            assert_eq!(is_valid(&spec, now), want, "{name}");
        }
    }

    #[test]
    fn request_decisions() {
        use LeaseDecision::*;
        let held = |h: &str| HeldByOther(h.to_string());
        // (name, lease, now, decision); we request DUR seconds as ME.
        let cases: Vec<(&str, LeaseSpec, i64, LeaseDecision)> = vec![
            // Our own lease.
            (
                "own, ends exactly at now + duration: kept",
                lease(Some(ME), Some(0), Some(100), Some(DUR), Some(0)),
                100,
                Keep,
            ),
            (
                "own, ends one second before now + duration: renewed",
                lease(Some(ME), Some(0), Some(100), Some(DUR), Some(0)),
                101,
                Renew { reacquire: false },
            ),
            (
                "own, ends after now + duration (longer duration): kept",
                lease(Some(ME), Some(0), Some(100), Some(2 * DUR), Some(0)),
                200,
                Keep,
            ),
            (
                "own, renewTime in the future: kept like any long lease",
                lease(Some(ME), Some(0), Some(500), Some(DUR), Some(0)),
                100,
                Keep,
            ),
            (
                "own, ends exactly now (not yet expired): renewed",
                lease(Some(ME), None, Some(0), Some(DUR), None),
                i64::from(DUR),
                Renew { reacquire: false },
            ),
            (
                "own, no acquireTime, not expired: renewed without re-acquiring",
                lease(Some(ME), None, Some(100), Some(DUR), None),
                101,
                Renew { reacquire: false },
            ),
            (
                "own, no acquireTime, lasting: kept",
                lease(Some(ME), None, Some(100), Some(DUR), None),
                100,
                Keep,
            ),
            (
                "own, expired, acquireTime set: renewed without re-acquiring",
                lease(Some(ME), Some(0), Some(0), Some(DUR), Some(1)),
                i64::from(DUR) + 1,
                Renew { reacquire: false },
            ),
            (
                "own, expired, no acquireTime: re-acquired",
                lease(Some(ME), None, Some(0), Some(DUR - 42), None),
                i64::from(DUR) + 1,
                Renew { reacquire: true },
            ),
            (
                "own, no renewTime: re-acquired",
                lease(Some(ME), Some(-599), None, Some(DUR), Some(3)),
                0,
                Renew { reacquire: true },
            ),
            (
                "own, no duration: re-acquired",
                lease(Some(ME), Some(-599), Some(0), None, Some(3)),
                0,
                Renew { reacquire: true },
            ),
            (
                "own, neither renewTime nor duration: re-acquired",
                lease(Some(ME), Some(-599), None, None, Some(3)),
                0,
                Renew { reacquire: true },
            ),
            // Someone else's lease.
            (
                "foreign, valid: held",
                lease(
                    Some("self-node-remediation"),
                    Some(0),
                    Some(0),
                    Some(DUR),
                    None,
                ),
                10,
                held("self-node-remediation"),
            ),
            (
                "foreign, ends exactly now: still held",
                lease(Some("other"), Some(0), Some(0), Some(10), None),
                10,
                held("other"),
            ),
            (
                "foreign, expired one second ago: taken over",
                lease(Some("other"), Some(0), Some(0), Some(10), Some(3)),
                11,
                TakeOver,
            ),
            (
                "foreign, renewTime in the future: taken over",
                lease(Some("other"), Some(0), Some(50), Some(10), None),
                10,
                TakeOver,
            ),
            (
                "foreign, no renewTime: taken over",
                lease(Some("other"), Some(0), None, Some(10), None),
                1,
                TakeOver,
            ),
            (
                "holder differs only in case: foreign",
                lease(Some("Node-Maintenance"), Some(0), Some(0), Some(DUR), None),
                10,
                held("Node-Maintenance"),
            ),
            (
                "empty holder, valid: held by \"\"",
                lease(Some(""), Some(0), Some(0), Some(DUR), None),
                10,
                held(""),
            ),
            // A lease naming no holder.
            (
                "no holder, valid: held by unknown",
                lease(None, Some(0), Some(0), Some(DUR), None),
                10,
                held(UNKNOWN_HOLDER),
            ),
            (
                "no holder, expired: taken over",
                lease(None, Some(0), Some(0), Some(10), None),
                11,
                TakeOver,
            ),
            ("empty spec: taken over", LeaseSpec::default(), 10, TakeOver),
        ];
        for (name, spec, now, want) in cases {
            assert_eq!(decide(&spec, ME, DUR, ts(now)), want, "{name}");
        }
    }

    #[test]
    fn written_fields() {
        let now = ts(5000);
        let micro = |s: i64| Some(MicroTime(ts(s)));
        // (name, old lease, reacquire, expected lease)
        let cases: Vec<(&str, LeaseSpec, bool, LeaseSpec)> = vec![
            (
                "renewal: only renewTime (and duration) move",
                lease(Some(ME), Some(10), Some(20), Some(DUR - 42), Some(2)),
                false,
                lease(Some(ME), Some(10), Some(5000), Some(DUR), Some(2)),
            ),
            (
                "renewal keeps a missing acquireTime and transitions missing",
                lease(Some(ME), None, Some(20), Some(DUR), None),
                false,
                lease(Some(ME), None, Some(5000), Some(DUR), None),
            ),
            (
                "re-acquisition: acquireTime now, transitions + 1",
                lease(Some(ME), Some(-599), None, None, Some(3)),
                true,
                lease(Some(ME), Some(5000), Some(5000), Some(DUR), Some(4)),
            ),
            (
                "takeover of a foreign lease: our holder, transitions + 1",
                lease(Some("miau"), Some(42), Some(43), Some(44), Some(3)),
                true,
                lease(Some(ME), Some(5000), Some(5000), Some(DUR), Some(4)),
            ),
            (
                "takeover without transitions: 1",
                lease(Some("miau"), Some(42), Some(43), Some(44), None),
                true,
                lease(Some(ME), Some(5000), Some(5000), Some(DUR), Some(1)),
            ),
            (
                "takeover of a holderless lease",
                LeaseSpec::default(),
                true,
                lease(Some(ME), Some(5000), Some(5000), Some(DUR), Some(1)),
            ),
        ];
        for (name, old, reacquire, want) in cases {
            let got = written_spec(&old, reacquire, ME, DUR, now);
            assert_eq!(got, want, "{name}");
            assert_eq!(got.renew_time, micro(5000), "{name}");
        }
        let mut extra = lease(Some("x"), None, None, None, Some(i32::MAX));
        extra.preferred_holder = Some("y".into());
        let got = written_spec(&extra, true, ME, DUR, now);
        assert_eq!(
            got.preferred_holder.as_deref(),
            Some("y"),
            "other fields kept"
        );
        assert_eq!(got.lease_transitions, Some(i32::MAX), "no overflow");
    }

    #[test]
    fn created_lease() {
        assert_eq!(
            new_spec(ME, DUR, ts(7)),
            lease(Some(ME), Some(7), Some(7), Some(DUR), Some(0))
        );
    }

    #[test]
    fn release_decisions() {
        use ReleaseDecision::*;
        // (name, lease, decision)
        let own = lease(Some(ME), Some(0), Some(0), Some(DUR), None);
        let foreign = lease(Some("miau"), Some(0), Some(0), Some(44), None);
        let expired_foreign = lease(Some("miau"), Some(0), Some(0), Some(1), None);
        let holderless = lease(None, Some(0), Some(0), Some(DUR), None);
        let empty_holder = lease(Some(""), None, None, None, None);
        let cases: Vec<(&str, Option<&LeaseSpec>, ReleaseDecision)> = vec![
            ("own lease: deleted", Some(&own), Delete),
            (
                "foreign lease: left alone",
                Some(&foreign),
                HeldByOther("miau".into()),
            ),
            (
                "expired foreign lease: still left alone",
                Some(&expired_foreign),
                HeldByOther("miau".into()),
            ),
            ("no holder: deleted", Some(&holderless), Delete),
            ("no spec: deleted", None, Delete),
            (
                "empty holder names someone else",
                Some(&empty_holder),
                HeldByOther(String::new()),
            ),
        ];
        for (name, spec, want) in cases {
            assert_eq!(decide_release(spec, ME), want, "{name}");
        }
    }
}
