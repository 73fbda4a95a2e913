use super::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn spec(holder: Option<&str>, duration: Option<i32>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(str::to_string),
        lease_duration_seconds: duration,
        ..LeaseSpec::default()
    }
}

fn wall(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).expect("a wall time")
}

#[test]
fn claim_table() {
    struct Case {
        name: &'static str,
        found: Option<(LeaseSpec, u64)>,
        now: u64,
        want: Claim,
    }
    let held = |h: &str| Claim::HeldBy(h.to_string());
    let cases = [
        Case {
            name: "no Lease: create it",
            found: None,
            now: 0,
            want: Claim::Create,
        },
        Case {
            name: "ours: renew",
            found: Some((spec(Some("me"), Some(15)), 0)),
            now: 100,
            want: Claim::Renew,
        },
        Case {
            name: "no holder: take it",
            found: Some((spec(None, Some(15)), 0)),
            now: 0,
            want: Claim::TakeOver,
        },
        Case {
            name: "released (empty holder): take it",
            found: Some((spec(Some(""), Some(1)), 5)),
            now: 5,
            want: Claim::TakeOver,
        },
        Case {
            name: "another's, just seen: held",
            found: Some((spec(Some("b"), Some(15)), 10)),
            now: 10,
            want: held("b"),
        },
        Case {
            name: "another's, 14 s unchanged: held",
            found: Some((spec(Some("b"), Some(15)), 10)),
            now: 24,
            want: held("b"),
        },
        Case {
            name: "another's, 15 s unchanged: take it",
            found: Some((spec(Some("b"), Some(15)), 10)),
            now: 25,
            want: Claim::TakeOver,
        },
        Case {
            name: "another's without a duration: take it",
            found: Some((spec(Some("b"), None), 10)),
            now: 10,
            want: Claim::TakeOver,
        },
        Case {
            name: "another's with a negative duration: take it",
            found: Some((spec(Some("b"), Some(-5)), 10)),
            now: 10,
            want: Claim::TakeOver,
        },
    ];
    for c in cases {
        let found = c.found.map(|(spec, since)| Observed {
            spec,
            since: secs(since),
        });
        assert_eq!(
            claim(found.as_ref(), "me", secs(c.now)),
            c.want,
            "{}",
            c.name
        );
    }
}

#[test]
fn a_changed_lease_is_seen_anew_an_unchanged_one_keeps_its_first_sighting() {
    let first = observe(None, spec(Some("b"), Some(15)), secs(3));
    assert_eq!(first.since, secs(3));
    let same = observe(Some(first.clone()), spec(Some("b"), Some(15)), secs(9));
    assert_eq!(same.since, secs(3), "unchanged: the first sighting counts");
    let mut renewed = spec(Some("b"), Some(15));
    renewed.renew_time = Some(MicroTime(wall(9)));
    let changed = observe(Some(same), renewed, secs(9));
    assert_eq!(changed.since, secs(9), "renewed by its holder: seen anew");
}

#[test]
fn written_table() {
    let mut old = spec(Some("b"), Some(15));
    old.acquire_time = Some(MicroTime(wall(-100)));
    old.lease_transitions = Some(4);
    let mut ours = old.clone();
    ours.holder_identity = Some("me".into());
    // (name, found, claim, acquireTime, transitions)
    let cases: [(&str, Option<&LeaseSpec>, Claim, Timestamp, i32); 4] = [
        ("create: a first term", None, Claim::Create, wall(0), 0),
        (
            "renew: the term goes on",
            Some(&ours),
            Claim::Renew,
            wall(-100),
            4,
        ),
        (
            "take over: a new term",
            Some(&old),
            Claim::TakeOver,
            wall(0),
            5,
        ),
        (
            "renew of a Lease without acquireTime: now",
            Some(&spec(Some("me"), Some(15))),
            Claim::Renew,
            wall(0),
            0,
        ),
    ];
    for (name, found, c, acquire, transitions) in cases {
        let w = written(found, "me", &c, Timing::DEFAULT, wall(0));
        assert_eq!(w.holder_identity.as_deref(), Some("me"), "{name}");
        assert_eq!(w.lease_duration_seconds, Some(15), "{name}");
        assert_eq!(w.renew_time, Some(MicroTime(wall(0))), "{name}");
        assert_eq!(w.acquire_time, Some(MicroTime(acquire)), "{name}");
        assert_eq!(w.lease_transitions, Some(transitions), "{name}");
    }
}

#[test]
fn released_leaves_an_empty_holder_for_one_second_and_the_count() {
    let mut ours = spec(Some("me"), Some(15));
    ours.lease_transitions = Some(3);
    let r = released(&ours, wall(0));
    assert_eq!(holder(&r), None);
    assert_eq!(r.lease_duration_seconds, Some(1));
    assert_eq!(r.lease_transitions, Some(3));
    assert_eq!(
        claim(Some(&observe(None, r, secs(0))), "other", secs(0)),
        Claim::TakeOver
    );
}

#[test]
fn standing_budget_and_pause_table() {
    let t = Timing::DEFAULT;
    let lead = |until| Standing::Leading { until: secs(until) };
    // (name, last renewed, now, standing, attempt budget, pause)
    let (idle, lapsed) = (Standing::Standby, Standing::Lapsed);
    let cases = [
        ("never led", None, 50, idle, secs(10), secs(2)),
        ("just renewed", Some(20), 20, lead(30), secs(10), secs(2)),
        ("failing 9 s", Some(20), 29, lead(30), secs(1), secs(1)),
        (
            "renew deadline reached",
            Some(20),
            30,
            lapsed,
            secs(10),
            secs(0),
        ),
        ("long past it", Some(20), 300, lapsed, secs(10), secs(0)),
    ];
    for (name, last, now, want, budget, wait) in cases {
        let s = standing(last.map(secs), t, secs(now));
        assert_eq!(s, want, "{name}");
        assert_eq!(attempt_budget(s, t, secs(now)), budget, "{name}");
        assert_eq!(pause(s, t, secs(now)), wait, "{name}");
    }
}

#[test]
fn timing_table() {
    let ms = Duration::from_millis;
    // (lease, renew, retry, accepted, words of the refusal)
    let cases = [
        (secs(15), secs(10), secs(2), true, ""),
        (secs(60), secs(40), ms(500), true, ""),
        (
            secs(10),
            secs(10),
            secs(2),
            false,
            "longer than the renew deadline",
        ),
        (
            secs(15),
            secs(2),
            secs(2),
            false,
            "longer than the retry period",
        ),
        (secs(15), secs(10), secs(0), false, "above zero"),
        (
            ms(15_500),
            secs(10),
            secs(2),
            false,
            "whole number of seconds",
        ),
    ];
    for (lease, renew, retry, ok, words) in cases {
        match Timing::new(lease, renew, retry) {
            Ok(t) => assert!(ok, "{lease:?}/{renew:?}/{retry:?} accepted: {t:?}"),
            Err(e) => {
                assert!(!ok, "{lease:?}/{renew:?}/{retry:?} refused: {e}");
                assert!(
                    e.contains(words) && e.contains("--leader-elect-renew-deadline"),
                    "{e}"
                );
            }
        }
    }
}
