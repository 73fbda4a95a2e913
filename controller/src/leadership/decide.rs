//! The rules of leader election, as pure functions (client-go's, which
//! controller-runtime and so upstream use):
//!
//! - Another holder's Lease counts as held until its leaseDurationSeconds
//!   have passed since this replica first saw it in its current state (the
//!   local clock only, so replicas with skewed clocks still agree); an empty
//!   holder is free.
//! - A replica takes a free or expired Lease (acquireTime now, one more
//!   transition) and renews its own (renewTime now) every retry period.
//! - A leader whose last successful renewal is `renew_deadline` old gives
//!   leadership up, before the others may see the Lease as expired; every
//!   attempt of a leader is cut off at that deadline.
//! - Releasing leaves an empty holder with a 1 s duration, so a standby takes
//!   over at its next look.
//!
//! Times are offsets from a monotonic start the caller owns, so the tests set them.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// The three durations of an election (kube-controller-manager's flag names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long others wait after the last change they saw before taking over.
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often every replica looks at (and a leader renews) the Lease.
    pub retry_period: Duration,
}

impl Timing {
    /// controller-runtime's defaults: 15 s, 10 s, 2 s.
    pub const DEFAULT: Timing = Timing {
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    /// The three, checked: lease duration > renew deadline > retry period > 0,
    /// and the lease duration a whole number of seconds (the Lease holds seconds).
    pub fn new(lease: Duration, renew: Duration, retry: Duration) -> Result<Timing, String> {
        let fix = "set --leader-elect-lease-duration > --leader-elect-renew-deadline > --leader-elect-retry-period > 0";
        if retry.is_zero() || renew <= retry {
            return Err(format!(
                "the renew deadline ({renew:?}) must be longer than the retry period ({retry:?}), which must be above zero; {fix}"
            ));
        }
        if lease <= renew {
            return Err(format!(
                "the lease duration ({lease:?}) must be longer than the renew deadline ({renew:?}), or a standby may take over while the leader still leads; {fix}"
            ));
        }
        if lease.subsec_nanos() != 0 || i32::try_from(lease.as_secs()).is_err() {
            return Err(format!(
                "the lease duration ({lease:?}) must be a whole number of seconds (leaseDurationSeconds); {fix}"
            ));
        }
        Ok(Timing {
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
        })
    }

    fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The Lease as last read, and since when this replica has seen it so.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    pub spec: LeaseSpec,
    pub since: Duration,
}

/// `spec` read at `now`: the same as before keeps its first sighting.
pub fn observe(previous: Option<Observed>, spec: LeaseSpec, now: Duration) -> Observed {
    match previous {
        Some(p) if p.spec == spec => p,
        _ => Observed { spec, since: now },
    }
}

/// What to do with the Lease found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// There is none: create it, held by us.
    Create,
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it (a new term).
    TakeOver,
    /// Someone else holds it and it has not expired.
    HeldBy(String),
}

/// The holder named by `spec`, an empty name being none.
pub fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// Decide from the Lease found (`None`: there is none) as `me` at `now`.
pub fn claim(found: Option<&Observed>, me: &str, now: Duration) -> Claim {
    let Some(found) = found else {
        return Claim::Create;
    };
    match holder(&found.spec) {
        Some(h) if h == me => Claim::Renew,
        None => Claim::TakeOver,
        Some(other) => {
            let secs = found.spec.lease_duration_seconds.unwrap_or(0).max(0);
            let ends = found.since + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
            if now < ends {
                Claim::HeldBy(other.to_string())
            } else {
                Claim::TakeOver
            }
        }
    }
}

/// The spec to write for `claim` (not `HeldBy`) over `found` at wall time `now`.
pub fn written(
    found: Option<&LeaseSpec>,
    me: &str,
    claim: &Claim,
    timing: Timing,
    now: Timestamp,
) -> LeaseSpec {
    let old = found.cloned().unwrap_or_default();
    let renewing = *claim == Claim::Renew;
    let transitions = old.lease_transitions.unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(timing.lease_seconds()),
        renew_time: Some(MicroTime(now)),
        acquire_time: match (renewing, old.acquire_time) {
            (true, Some(t)) => Some(t),
            _ => Some(MicroTime(now)),
        },
        lease_transitions: Some(match claim {
            Claim::Create => 0,
            Claim::Renew => transitions,
            _ => transitions.saturating_add(1),
        }),
        ..old
    }
}

/// The spec that gives our Lease up at wall time `now`.
pub fn released(found: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        acquire_time: Some(MicroTime(now)),
        ..found.clone()
    }
}

/// Where this replica stands at `now`, given its last successful renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not leading.
    Standby,
    /// Leading until `until` unless renewed before.
    Leading { until: Duration },
    /// Led, but the renew deadline has passed: give leadership up.
    Lapsed,
}

pub fn standing(last_renewed: Option<Duration>, timing: Timing, now: Duration) -> Standing {
    let Some(at) = last_renewed else {
        return Standing::Standby;
    };
    let until = at + timing.renew_deadline;
    if now < until {
        Standing::Leading { until }
    } else {
        Standing::Lapsed
    }
}

/// How long the attempt starting at `now` may take: a leader's ends at its
/// deadline, a standby's at one renew deadline.
pub fn attempt_budget(standing: Standing, timing: Timing, now: Duration) -> Duration {
    match standing {
        Standing::Leading { until } => until.saturating_sub(now),
        _ => timing.renew_deadline,
    }
}

/// How long to wait before the next attempt: a retry period, cut short by a
/// leader's deadline (none once it passed) so that it steps down on time.
pub fn pause(standing: Standing, timing: Timing, now: Duration) -> Duration {
    match standing {
        Standing::Leading { until } => timing.retry_period.min(until.saturating_sub(now)),
        Standing::Lapsed => Duration::ZERO,
        Standing::Standby => timing.retry_period,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
