//! Maintenance windows (`--maintenance-window`): `"<cron: 5 fields>
//! <duration> [<IANA time zone>]"`, e.g. `"0 2 * * 6 4h Europe/Berlin"`:
//! each Saturday at 02:00 Berlin time, for four hours.
//!
//! The cron fields are read on the window's wall clock (UTC when no zone is
//! given); the duration is elapsed time from the start. Time zones come from
//! the database bundled into the binary (jiff's `tzdb-bundle-always`): the
//! images are FROM scratch and have no `/usr/share/zoneinfo`.
//!
//! Daylight saving time, as jiff's "compatible" rule (RFC 5545, the one
//! Temporal and java.time use): a start in a skipped hour (02:30 the night
//! clocks go from 02:00 to 03:00) is moved forward by the gap, to 03:30; a
//! start in a repeated hour (02:30 the night clocks go back from 03:00 to
//! 02:00) is the first 02:30 only, so the window opens once. A window's
//! duration is elapsed time, so "4h" is four real hours on both nights.

mod cron;

use std::fmt;
use std::str::FromStr;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use crate::rules::duration;
use cron::Cron;

/// A valid spec, shown in every parse error.
pub const EXAMPLE: &str = "\"0 2 * * 6 4h Europe/Berlin\" (Saturdays 02:00-06:00, Berlin time)";

/// The longest window: past a year it is "always", which is no window.
const MAX_DURATION: SignedDuration = SignedDuration::from_hours(366 * 24);

/// How far [`Window::next_start`] looks, in days: eight years and a margin,
/// so that a schedule on 29 February is found across a skipped leap year
/// (2096 to 2104).
const HORIZON_DAYS: usize = 8 * 366 + 2;

/// One parsed `--maintenance-window`.
#[derive(Debug, Clone)]
pub struct Window {
    spec: String,
    cron: Cron,
    duration: SignedDuration,
    tz: TimeZone,
    tz_name: String,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl FromStr for Window {
    type Err = String;

    /// Parse a spec; the error names the bad part and shows [`EXAMPLE`].
    fn from_str(spec: &str) -> Result<Window, String> {
        let bad = |why: String| {
            format!("invalid --maintenance-window {spec:?}: {why}; a valid one: {EXAMPLE}")
        };
        let parts: Vec<&str> = spec.split_whitespace().collect();
        if !(6..=7).contains(&parts.len()) {
            return Err(bad(format!(
                "expected 5 cron fields, a duration and an optional time zone, found {} part(s)",
                parts.len()
            )));
        }
        let cron = Cron::parse([parts[0], parts[1], parts[2], parts[3], parts[4]]).map_err(bad)?;
        let duration = duration::parse(parts[5])
            .map_err(|e| bad(format!("the duration: {e}")))
            .and_then(|d| SignedDuration::try_from(d).map_err(|e| bad(e.to_string())))?;
        if duration.is_zero() || duration > MAX_DURATION {
            return Err(bad(format!(
                "the duration {:?} must be more than 0 and at most 8784h (366 days)",
                parts[5]
            )));
        }
        let tz_name = parts.get(6).copied().unwrap_or("UTC");
        let tz = TimeZone::get(tz_name).map_err(|_| {
            bad(format!(
                "unknown time zone {tz_name:?} (an IANA name such as Europe/Berlin, or UTC)"
            ))
        })?;
        let window = Window {
            spec: parts.join(" "),
            cron,
            duration,
            tz,
            tz_name: tz_name.to_string(),
        };
        if window.next_start(Timestamp::UNIX_EPOCH).is_none() {
            return Err(bad("the schedule never fires (such as 30 February)".into()));
        }
        Ok(window)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

impl Window {
    /// Whether a window is open at `now`: it started at most `duration`
    /// ago (start included, end excluded).
    pub fn contains(&self, now: Timestamp) -> bool {
        let earliest = now.checked_sub(self.duration).unwrap_or(Timestamp::MIN);
        let just_after_earliest = earliest
            .checked_add(SignedDuration::from_nanos(1))
            .unwrap_or(earliest);
        self.next_start(just_after_earliest)
            .is_some_and(|start| start <= now)
    }

    /// The first start at or after `now`. `None` only when the schedule
    /// fires nowhere in the next eight years (refused at parse time).
    ///
    /// Walks days, not minutes: each day is tested against the day fields,
    /// and only on a matching day are its times turned into instants.
    pub fn next_start(&self, now: Timestamp) -> Option<Timestamp> {
        // A day early: a start on the day before may land after `now`'s
        // midnight when a skipped hour moves it forward.
        let mut day: Date = self.tz.to_datetime(now).date().yesterday().ok()?;
        for _ in 0..HORIZON_DAYS {
            if self.cron.matches_day(day) {
                let first = self
                    .cron
                    .times_of_day()
                    .filter_map(|(h, m)| self.tz.to_timestamp(day.at(h, m, 0, 0)).ok())
                    .filter(|start| *start >= now)
                    .min();
                if first.is_some() {
                    return first;
                }
            }
            day = day.tomorrow().ok()?;
        }
        None
    }

    /// `at` on the window's clock, for messages:
    /// `2026-12-12T02:00:00+01:00 (Europe/Berlin)`.
    pub fn local_time(&self, at: Timestamp) -> String {
        let zoned = at.to_zoned(self.tz.clone());
        format!(
            "{} ({})",
            zoned.strftime("%Y-%m-%dT%H:%M:%S%:z"),
            self.tz_name
        )
    }

    /// The spec as given (whitespace normalised).
    pub fn spec(&self) -> &str {
        &self.spec
    }
}

/// When the earliest of `windows` opens next, at or after `now`, with the
/// window: `None` when there are none (or none fires again).
pub fn next_opening(windows: &[Window], now: Timestamp) -> Option<(Timestamp, &Window)> {
    windows
        .iter()
        .filter_map(|w| w.next_start(now).map(|t| (t, w)))
        .min_by_key(|(t, _)| *t)
}

#[cfg(test)]
mod tests;
