use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn filter(text: &str) -> AlertFilter {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn filters_match_as_prometheus_matchers() {
    let critical = labels(&[("alertname", "NodeDown"), ("severity", "critical")]);
    let warning = labels(&[("alertname", "Slow"), ("severity", "warning")]);
    // (case, filter, matches critical, matches warning)
    let cases = [
        ("empty matches all", "", true, true),
        ("equal", r#"severity="critical""#, true, false),
        ("not equal", r#"severity!="critical""#, false, true),
        ("regex is anchored", r#"severity=~"crit""#, false, false),
        ("regex", r#"severity=~"crit.*|warn.*""#, true, true),
        ("not regex", r#"alertname!~"Node.*""#, false, true),
        (
            "all must match",
            r#"severity="critical",alertname="Slow""#,
            false,
            false,
        ),
        (
            "braces and spaces",
            r#"{ severity = "critical" , }"#,
            true,
            false,
        ),
        ("missing is empty", r#"team="""#, true, true),
        ("missing is not a value", r#"team!="""#, false, false),
        ("escapes", r#"alertname!="a\"b\\c""#, true, true),
        (
            "a comma in quotes",
            r#"alertname=~"NodeDown|x,y""#,
            true,
            false,
        ),
    ];
    for (case, text, want_critical, want_warning) in cases {
        let f = filter(text);
        assert_eq!(f.matches(&critical), want_critical, "{case}: critical");
        assert_eq!(f.matches(&warning), want_warning, "{case}: warning");
    }
}

#[test]
fn bad_filters_are_named_with_an_example() {
    let cases = [
        (
            "no operator",
            "severity",
            "expected =, !=, =~ or !~ after \"severity\"",
        ),
        ("unquoted", "severity=critical", "must be in double quotes"),
        (
            "unterminated",
            r#"severity="critical"#,
            "must be in double quotes",
        ),
        ("no name", r#"="x""#, "expected a label name"),
        ("digit first", r#"1a="x""#, "expected a label name"),
        ("no comma", r#"a="x" b="y""#, "expected ',' before"),
        (
            "bad regex",
            r#"a=~"(""#,
            "the regex of \"a\" does not compile",
        ),
    ];
    for (case, text, want) in cases {
        let err = text.parse::<AlertFilter>().expect_err(case);
        assert!(err.contains(want), "{case}: {err}");
        assert!(err.contains(EXAMPLE), "{case}: {err}");
        assert!(err.contains("--block-on-alerts-filter"), "{case}: {err}");
    }
}

#[test]
fn only_firing_matches_count() {
    let f = filter(r#"severity="critical""#);
    let alerts = vec![
        Alert {
            labels: labels(&[("alertname", "A"), ("severity", "critical")]),
            state: "firing".into(),
        },
        Alert {
            labels: labels(&[("alertname", "B"), ("severity", "critical")]),
            state: "pending".into(),
        },
        Alert {
            labels: labels(&[("alertname", "C"), ("severity", "info")]),
            state: "firing".into(),
        },
    ];
    let firing: Vec<&str> = f
        .firing(&alerts)
        .iter()
        .map(|a| a.labels["alertname"].as_str())
        .collect();
    assert_eq!(firing, ["A"]);
    assert_eq!(f.describe(&alerts[0]), r#"A{severity="critical"}"#);
    assert_eq!(filter("").describe(&alerts[0]), "A");
}
