//! Rules of the per-node medik8s lease, as pure functions.
//!
//! The lease `medik8s-leases/node-<name>` is shared with Node Health Check and
//! Self Node Remediation: whoever holds a valid lease owns the node. These
//! rules decide what to do with an existing lease; the controller carries out
//! the decision against the API server.

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// What to do with the lease we found, given who we are and the time now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Ours, and it lasts at least until now + duration: nothing to write.
    Keep,
    /// Ours but expiring before now + duration (or never acquired): write
    /// renewTime; when `reacquire` is set also acquireTime and transitions + 1.
    Renew { reacquire: bool },
    /// Someone else's and no longer valid: take it over
    /// (holder, acquireTime, renewTime reset, transitions + 1).
    TakeOver,
    /// Someone else's and still valid: we must wait.
    HeldByOther(String),
}

/// A lease is valid when its renewTime is not in the future and
/// renewTime + leaseDurationSeconds is still after `now`.
pub fn is_valid(spec: &LeaseSpec, now: Timestamp) -> bool {
    let (Some(renew), Some(secs)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds) else {
        return false;
    };
    let renew = renew.0;
    if now < renew {
        return false;
    }
    match renew.checked_add(SignedDuration::from_secs(i64::from(secs))) {
        Ok(expiry) => expiry > now,
        Err(_) => false,
    }
}

/// Decide how to request the lease for `holder` for `duration_secs` at `now`.
pub fn decide(spec: &LeaseSpec, holder: &str, duration_secs: i32, now: Timestamp) -> LeaseDecision {
    if spec.holder_identity.as_deref() == Some(holder) {
        if spec.acquire_time.is_none() {
            return LeaseDecision::Renew { reacquire: true };
        }
        let wanted = now.checked_add(SignedDuration::from_secs(i64::from(duration_secs)));
        let expiry = match (spec.renew_time.as_ref(), spec.lease_duration_seconds) {
            (Some(renew), Some(secs)) => renew
                .0
                .checked_add(SignedDuration::from_secs(i64::from(secs)))
                .ok(),
            _ => None,
        };
        return match (expiry, wanted) {
            (Some(expiry), Ok(wanted)) if expiry >= wanted => LeaseDecision::Keep,
            _ => LeaseDecision::Renew { reacquire: false },
        };
    }
    if is_valid(spec, now) {
        return LeaseDecision::HeldByOther(spec.holder_identity.clone().unwrap_or_default());
    }
    LeaseDecision::TakeOver
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid timestamp")
    }

    fn lease(holder: &str, acquire: Option<i64>, renew: Option<i64>, dur: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_string()),
            acquire_time: acquire.map(|s| MicroTime(ts(s))),
            renew_time: renew.map(|s| MicroTime(ts(s))),
            lease_duration_seconds: Some(dur),
            ..Default::default()
        }
    }

    #[test]
    fn validity_window() {
        let l = lease("x", Some(0), Some(0), 100);
        assert!(is_valid(&l, ts(0)));
        assert!(is_valid(&l, ts(99)));
        assert!(
            !is_valid(&l, ts(100)),
            "expired exactly at renew + duration"
        );
        assert!(
            !is_valid(&l, ts(-1)),
            "renewTime in the future is not valid"
        );
        assert!(!is_valid(&lease("x", Some(0), None, 100), ts(1)));
        let mut no_dur = l.clone();
        no_dur.lease_duration_seconds = None;
        assert!(!is_valid(&no_dur, ts(1)));
    }

    #[test]
    fn own_lease_kept_while_it_covers_the_duration() {
        let l = lease("me", Some(0), Some(100), 3600);
        assert_eq!(decide(&l, "me", 3600, ts(100)), LeaseDecision::Keep);
        assert_eq!(
            decide(&l, "me", 3600, ts(101)),
            LeaseDecision::Renew { reacquire: false }
        );
    }

    #[test]
    fn own_lease_without_acquire_time_is_reacquired() {
        let l = lease("me", None, Some(100), 3600);
        assert_eq!(
            decide(&l, "me", 3600, ts(100)),
            LeaseDecision::Renew { reacquire: true }
        );
    }

    #[test]
    fn foreign_valid_lease_blocks() {
        let l = lease("self-node-remediation", Some(0), Some(0), 3600);
        assert_eq!(
            decide(&l, "me", 3600, ts(10)),
            LeaseDecision::HeldByOther("self-node-remediation".into())
        );
    }

    #[test]
    fn foreign_expired_or_future_lease_is_taken_over() {
        let l = lease("other", Some(0), Some(0), 10);
        assert_eq!(decide(&l, "me", 3600, ts(10)), LeaseDecision::TakeOver);
        let future = lease("other", Some(0), Some(50), 10);
        assert_eq!(decide(&future, "me", 3600, ts(10)), LeaseDecision::TakeOver);
        let empty = LeaseSpec::default();
        assert_eq!(decide(&empty, "me", 3600, ts(10)), LeaseDecision::TakeOver);
    }
}
