use super::*;

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn window(spec: &str) -> Window {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

const BERLIN_SATURDAY: &str = "0 2 * * 6 4h Europe/Berlin";

#[test]
fn open_and_next_start() {
    let cases = [
        // 2026-12-12 is a Saturday; Berlin is UTC+1 in winter.
        (
            "before the start",
            BERLIN_SATURDAY,
            "2026-12-12T00:30:00Z",
            false,
            "2026-12-12T01:00:00Z",
        ),
        (
            "the start is in",
            BERLIN_SATURDAY,
            "2026-12-12T01:00:00Z",
            true,
            "2026-12-12T01:00:00Z",
        ),
        (
            "just before the end",
            BERLIN_SATURDAY,
            "2026-12-12T04:59:59Z",
            true,
            "2026-12-19T01:00:00Z",
        ),
        (
            "the end is out",
            BERLIN_SATURDAY,
            "2026-12-12T05:00:00Z",
            false,
            "2026-12-19T01:00:00Z",
        ),
        (
            "a weekday",
            BERLIN_SATURDAY,
            "2026-12-14T01:30:00Z",
            false,
            "2026-12-19T01:00:00Z",
        ),
        (
            "summer time",
            BERLIN_SATURDAY,
            "2026-07-04T00:30:00Z",
            true,
            "2026-07-11T00:00:00Z",
        ),
        (
            "utc by default",
            "30 22 * * * 2h",
            "2026-12-12T22:00:00Z",
            false,
            "2026-12-12T22:30:00Z",
        ),
        (
            "across midnight",
            "30 22 * * * 2h",
            "2026-12-12T23:59:00Z",
            true,
            "2026-12-13T22:30:00Z",
        ),
        (
            "after midnight end",
            "30 22 * * * 2h",
            "2026-12-13T00:30:00Z",
            false,
            "2026-12-13T22:30:00Z",
        ),
    ];
    check(&cases);
}

/// (case, spec, now, open, next start at or after now)
type Row = (&'static str, &'static str, &'static str, bool, &'static str);

fn check(cases: &[Row]) {
    for (case, spec, now, open, next) in cases {
        let w = window(spec);
        assert_eq!(w.contains(ts(now)), *open, "{case}: open at {now}");
        assert_eq!(w.next_start(ts(now)), Some(ts(next)), "{case}: next start");
    }
}

#[test]
fn long_windows_and_leap_days() {
    let cases = [
        (
            "longer than its period",
            "0 * * * * 90m",
            "2026-12-12T10:10:00Z",
            true,
            "2026-12-12T11:00:00Z",
        ),
        (
            "a leap day",
            "0 0 29 2 * 1h",
            "2097-01-01T00:00:00Z",
            false,
            "2104-02-29T00:00:00Z",
        ),
    ];
    check(&cases);
}

#[test]
fn daylight_saving_time() {
    let cases = [
        // Berlin springs forward on 2027-03-28, 02:00 -> 03:00: 02:30 is
        // moved forward by the gap, to 03:30 CEST (01:30Z).
        (
            "skipped hour",
            "30 2 * * * 1h Europe/Berlin",
            "2027-03-28T00:00:00Z",
            false,
            "2027-03-28T01:30:00Z",
        ),
        // Berlin falls back on 2026-10-25, 03:00 -> 02:00: only the first
        // 02:30 (CEST, 00:30Z) opens; the second 02:30 (01:30Z) does not.
        (
            "repeated hour: first",
            "30 2 * * * 1h Europe/Berlin",
            "2026-10-25T00:00:00Z",
            false,
            "2026-10-25T00:30:00Z",
        ),
        (
            "repeated hour: once",
            "30 2 * * * 1h Europe/Berlin",
            "2026-10-25T01:31:00Z",
            false,
            "2026-10-26T01:30:00Z",
        ),
        (
            "repeated hour: elapsed",
            "30 2 * * * 1h Europe/Berlin",
            "2026-10-25T01:29:00Z",
            true,
            "2026-10-26T01:30:00Z",
        ),
    ];
    check(&cases);
}

#[test]
fn bad_specs_are_named_with_an_example() {
    let cases = [
        ("empty", "", "found 0 part(s)"),
        ("no duration", "0 2 * * 6", "found 5 part(s)"),
        (
            "too many",
            "0 2 * * 6 4h Europe/Berlin x",
            "found 8 part(s)",
        ),
        ("bad hour", "0 25 * * 6 4h", "the hour field \"25\""),
        (
            "bad duration",
            "0 2 * * 6 4x",
            "the duration: invalid duration \"4x\"",
        ),
        ("no unit", "0 2 * * 6 4", "a number without a unit"),
        ("zero duration", "0 2 * * 6 0s", "must be more than 0"),
        ("over a year", "0 2 * * 6 9000h", "at most 8784h"),
        (
            "unknown zone",
            "0 2 * * 6 4h Europe/Berln",
            "unknown time zone \"Europe/Berln\"",
        ),
        ("never fires", "0 0 30 2 * 1h", "never fires"),
    ];
    for (case, spec, want) in cases {
        let err = spec.parse::<Window>().expect_err(case);
        assert!(err.contains(want), "{case}: {err}");
        assert!(err.contains(EXAMPLE), "{case}: {err}");
        assert!(err.contains("--maintenance-window"), "{case}: {err}");
    }
}

#[test]
fn messages_show_the_window_clock() {
    let w = window(BERLIN_SATURDAY);
    assert_eq!(
        w.local_time(ts("2026-12-12T01:00:00Z")),
        "2026-12-12T02:00:00+01:00 (Europe/Berlin)"
    );
    assert_eq!(w.to_string(), BERLIN_SATURDAY);
    let utc = window("0  2 * * 6   4h");
    assert_eq!(utc.spec(), "0 2 * * 6 4h");
    assert_eq!(
        utc.local_time(ts("2026-12-12T02:00:00Z")),
        "2026-12-12T02:00:00+00:00 (UTC)"
    );
}

#[test]
fn the_earliest_of_several_windows_opens_next() {
    let windows = [window(BERLIN_SATURDAY), window("0 3 * * 3 1h UTC")];
    let (at, w) = next_opening(&windows, ts("2026-12-14T00:00:00Z")).expect("opens");
    assert_eq!(at, ts("2026-12-16T03:00:00Z"));
    assert_eq!(w.spec(), "0 3 * * 3 1h UTC");
    assert!(next_opening(&[], ts("2026-12-14T00:00:00Z")).is_none());
}

/// Every reconcile of a waiting maintenance asks; the worst schedules
/// (every minute; a leap day eight years off; every minute of a leap day)
/// stay well under a millisecond each in an optimised build, and within a
/// few in a debug one.
#[test]
fn the_search_is_bounded_and_quick() {
    let specs = [
        "* * * * * 1m",
        "0 0 29 2 * 1h",
        "* * 29 2 * 1m Europe/Berlin",
    ];
    let now = ts("2097-03-01T00:00:00Z");
    let started = std::time::Instant::now();
    for spec in specs {
        let w = window(spec);
        for i in 0..20 {
            let at = now + SignedDuration::from_hours(i * 7);
            assert!(w.next_start(at).is_some(), "{spec}");
            let _ = w.contains(at);
        }
    }
    let per_call = started.elapsed() / (specs.len() as u32 * 20 * 2);
    assert!(
        per_call < std::time::Duration::from_millis(20),
        "{per_call:?} per call"
    );
}
