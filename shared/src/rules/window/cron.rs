//! The five cron fields of a maintenance window (minute, hour, day of month,
//! month, day of week), matched over civil (wall clock) times.
//!
//! As Vixie cron (and Kubernetes CronJobs): `*`, `a`, `a-b`, `*/n`, `a-b/n`,
//! `a/n` (from a to the end), lists with `,`; month and weekday names
//! (`jan`, `sat`); weekday 7 is Sunday as 0 is. When both day fields are
//! restricted (neither starts with `*`), a day matches if either does.

use jiff::civil::Date;

/// One field's name, range and names for its values (index 0 is `min`).
struct Field {
    name: &'static str,
    min: u8,
    max: u8,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY_OF_MONTH: Field = Field {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DAY_OF_WEEK: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cron {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// The day-of-month / day-of-week field started with `*`.
    dom_star: bool,
    dow_star: bool,
}

impl Cron {
    /// Parse the five fields; the error names the bad field.
    pub(super) fn parse(fields: [&str; 5]) -> Result<Cron, String> {
        let [minute, hour, dom, month, dow] = fields;
        let mut weekdays = parse_field(dow, &DAY_OF_WEEK)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays & !(1 << 7)) | 1; // 7 is Sunday, as 0
        }
        Ok(Cron {
            minutes: parse_field(minute, &MINUTE)?,
            hours: parse_field(hour, &HOUR)?,
            days: parse_field(dom, &DAY_OF_MONTH)?,
            months: parse_field(month, &MONTH)?,
            weekdays,
            dom_star: dom.starts_with('*'),
            dow_star: dow.starts_with('*'),
        })
    }

    /// Whether the schedule fires on some minute of `date`.
    pub(super) fn matches_day(&self, date: Date) -> bool {
        let bit = |set: u64, v: i8| set & (1u64 << v) != 0;
        if !bit(self.months, date.month()) {
            return false;
        }
        let dom = bit(self.days, date.day());
        let dow = bit(self.weekdays, date.weekday().to_sunday_zero_offset());
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The (hour, minute) pairs the schedule fires at on a matching day,
    /// in clock order.
    pub(super) fn times_of_day(&self) -> impl Iterator<Item = (i8, i8)> + '_ {
        bits(self.hours).flat_map(move |h| bits(self.minutes).map(move |m| (h, m)))
    }
}

fn bits(set: u64) -> impl Iterator<Item = i8> {
    (0..64i8).filter(move |b| set & (1u64 << b) != 0)
}

/// One field as a bit set; every error names the field and its range.
fn parse_field(text: &str, field: &Field) -> Result<u64, String> {
    let bad = |why: String| {
        format!(
            "the {} field {text:?} {why} (values {}-{}{})",
            field.name,
            field.min,
            field.max,
            if field.names.is_empty() {
                String::new()
            } else {
                format!(
                    " or {}-{}",
                    field.names[0],
                    field.names[field.names.len() - 1]
                )
            }
        )
    };
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => match step.parse::<u8>() {
                Ok(s) if s > 0 => (range, s),
                _ => return Err(bad(format!("has a bad step {step:?}"))),
            },
            None => (part, 1),
        };
        let (lo, hi) = match range {
            "*" => (Some(field.min), Some(field.max)),
            _ => match range.split_once('-') {
                Some((lo, hi)) => (value(lo, field), value(hi, field)),
                // As Vixie cron: `a/n` runs from a to the end of the range.
                None if step > 1 => (value(range, field), Some(field.max)),
                None => (value(range, field), value(range, field)),
            },
        };
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Err(bad(format!("has a value out of range in {part:?}")));
        };
        if lo > hi {
            return Err(bad(format!("has a backwards range {part:?}")));
        }
        for v in (lo..=hi).step_by(usize::from(step)) {
            set |= 1u64 << v;
        }
    }
    Ok(set)
}

/// A number or a name within the field's range.
fn value(text: &str, field: &Field) -> Option<u8> {
    let v = match text.parse::<u8>() {
        Ok(v) => v,
        Err(_) => {
            let i = field
                .names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(text))?;
            field.min + u8::try_from(i).ok()?
        }
    };
    (field.min..=field.max).contains(&v).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn cron(spec: &str) -> Result<Cron, String> {
        let f: Vec<&str> = spec.split_whitespace().collect();
        Cron::parse([f[0], f[1], f[2], f[3], f[4]])
    }

    #[test]
    fn fields_parse_to_the_values_they_name() {
        let cases: &[(&str, &str, &[i8], &[i8])] = &[
            // (case, spec, hours, minutes)
            ("a list", "0,30 1,2 * * *", &[1, 2], &[0, 30]),
            ("a range", "5 1-3 * * *", &[1, 2, 3], &[5]),
            ("a stepped star", "*/20 */12 * * *", &[0, 12], &[0, 20, 40]),
            (
                "a stepped range",
                "10-30/10 22-23 * * *",
                &[22, 23],
                &[10, 20, 30],
            ),
            ("a start and step", "50/5 23 * * *", &[23], &[50, 55]),
        ];
        for (case, spec, hours, minutes) in cases {
            let c = cron(spec).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(bits(c.hours).collect::<Vec<_>>(), *hours, "{case}");
            assert_eq!(bits(c.minutes).collect::<Vec<_>>(), *minutes, "{case}");
        }
        let every = cron("* * * * *").expect("valid");
        assert_eq!(every.times_of_day().count(), 24 * 60);
        assert_eq!(every.times_of_day().next(), Some((0, 0)));
        assert_eq!(every.times_of_day().last(), Some((23, 59)));
    }

    #[test]
    fn days_match_as_vixie_cron() {
        // 2026-12-12 is a Saturday, 2026-12-13 a Sunday.
        let cases = [
            ("any day", "0 2 * * *", date(2026, 12, 13), true),
            ("saturday by number", "0 2 * * 6", date(2026, 12, 12), true),
            ("saturday by name", "0 2 * * SAT", date(2026, 12, 12), true),
            ("not on a sunday", "0 2 * * 6", date(2026, 12, 13), false),
            ("seven is sunday", "0 2 * * 7", date(2026, 12, 13), true),
            ("month by name", "0 2 * dec *", date(2026, 12, 13), true),
            ("other month", "0 2 * jan *", date(2026, 12, 13), false),
            (
                "both restricted: either",
                "0 2 1 * 6",
                date(2026, 12, 12),
                true,
            ),
            (
                "both restricted: dom",
                "0 2 13 * 1",
                date(2026, 12, 13),
                true,
            ),
            (
                "both restricted: neither",
                "0 2 1 * 1",
                date(2026, 12, 13),
                false,
            ),
            (
                "star step day: and",
                "0 2 */2 * 6",
                date(2026, 12, 12),
                false,
            ),
        ];
        for (case, spec, day, want) in cases {
            let c = cron(spec).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(c.matches_day(day), want, "{case}");
        }
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            ("minute too big", "60 * * * *", "the minute field \"60\""),
            ("hour too big", "0 24 * * *", "the hour field \"24\""),
            ("day zero", "0 0 0 * *", "the day-of-month field \"0\""),
            ("month name", "0 0 * foo *", "the month field \"foo\""),
            ("weekday 8", "0 0 * * 8", "the day-of-week field \"8\""),
            ("zero step", "*/0 * * * *", "bad step"),
            ("backwards", "0 5-1 * * *", "backwards range"),
            ("empty list item", "0, * * * *", "out of range"),
            ("negative", "-1 * * * *", "out of range"),
        ];
        for (case, spec, want) in cases {
            let err = cron(spec).expect_err(case);
            assert!(err.contains(want), "{case}: {err}");
        }
    }
}
