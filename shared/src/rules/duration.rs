//! Durations as Go writes them (`time.ParseDuration`, `metav1.Duration`):
//! "90s", "1h30m", "250ms", "1.5h". The CRD's `spec.drainTimeout` and the
//! services' duration flags share this one parser.

use std::time::Duration;

/// The CRD schema pattern of a Go duration (non-negative; "0" allowed).
pub const GO_DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$";

/// The longest duration Go can hold: `math.MaxInt64` nanoseconds,
/// 2562047h47m16.854775807s (about 292 years).
pub const MAX: Duration = Duration::from_nanos(i64::MAX as u64);

/// What an out-of-range duration's error says about the limit.
pub const MAX_TEXT: &str = "2562047h47m16.854775807s (about 292 years)";

/// Parse a non-negative Go duration exactly as Go's `time.ParseDuration`
/// does: integer nanoseconds, units ns, us, µs, μs, ms, s, m, h, an optional
/// fraction per number, an error past [`MAX`]. As Go, a number needs a unit
/// ("0" aside): "10" is refused, not guessed. Negative durations are
/// refused (nothing here waits a negative time).
pub fn parse(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    let bad = |why: &str| {
        format!("invalid duration {value:?}: {why}; write it as Go does, e.g. 90s, 1h30m, 250ms")
    };
    let v = v.strip_prefix('+').unwrap_or(v);
    if v.starts_with('-') {
        return Err(bad("negative"));
    }
    if v.is_empty() {
        return Err(bad("empty"));
    }
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    let max = i64::MAX as u64;
    let too_long = || bad(&format!("out of range: at most {MAX_TEXT}"));
    let mut total: u64 = 0;
    let mut rest = v;
    while !rest.is_empty() {
        let (whole, after, int_digits) = leading_int(rest).ok_or_else(too_long)?;
        rest = after;
        let (mut frac, mut scale, mut frac_digits) = (0u64, 1f64, false);
        if let Some(after_dot) = rest.strip_prefix('.') {
            (frac, scale, rest, frac_digits) = leading_fraction(after_dot);
        }
        if !int_digits && !frac_digits {
            return Err(bad("expected a number"));
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = unit_nanos(&rest[..unit_len]).map_err(|why| bad(&why))?;
        rest = &rest[unit_len..];
        let mut n = whole
            .checked_mul(unit)
            .filter(|n| *n <= max)
            .ok_or_else(too_long)?;
        if frac > 0 {
            // As Go: float64 for the fraction's share, truncated.
            n = n
                .checked_add((frac as f64 * (unit as f64 / scale)) as u64)
                .filter(|n| *n <= max)
                .ok_or_else(too_long)?;
        }
        total = total
            .checked_add(n)
            .filter(|t| *t <= max)
            .ok_or_else(too_long)?;
    }
    Ok(Duration::from_nanos(total))
}

/// Nanoseconds per `unit` (Go's units), or why it is not one.
fn unit_nanos(unit: &str) -> Result<u64, String> {
    Ok(match unit {
        "" => return Err("a number without a unit".to_string()),
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        other => return Err(format!("unknown unit {other:?} (ns, us, ms, s, m, h)")),
    })
}

/// The leading decimal integer of `s`, the rest, and whether there was a
/// digit; None when it overflows Go's int64.
fn leading_int(s: &str) -> Option<(u64, &str, bool)> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut x: u64 = 0;
    for b in s[..digits].bytes() {
        x = x
            .checked_mul(10)?
            .checked_add(u64::from(b - b'0'))
            .filter(|x| *x <= i64::MAX as u64)?;
    }
    Some((x, &s[digits..], digits > 0))
}

/// The digits after a decimal point as Go reads them: the value, the power
/// of ten it is scaled by, the rest, and whether there was a digit; digits
/// past int64's precision are read and dropped.
fn leading_fraction(s: &str) -> (u64, f64, &str, bool) {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    for b in s[..digits].bytes() {
        if overflow {
            continue;
        }
        match x
            .checked_mul(10)
            .and_then(|y| y.checked_add(u64::from(b - b'0')))
            .filter(|y| *y <= i64::MAX as u64)
        {
            Some(y) => {
                x = y;
                scale *= 10.0;
            }
            None => overflow = true,
        }
    }
    (x, scale, &s[digits..], digits > 0)
}

/// Go's way of printing a duration, shortest form ("1h30m0s" -> "1h30m").
pub fn format(d: Duration) -> String {
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let ms = d.subsec_millis();
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || (out.is_empty() && ms == 0) {
        out.push_str(&format!("{s}s"));
    }
    if ms > 0 && h == 0 && m == 0 && s == 0 {
        out.push_str(&format!("{ms}ms"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        for (text, secs) in [
            ("90s", 90.0),
            ("1h30m", 5400.0),
            ("1.5h", 5400.0),
            ("250ms", 0.25),
            ("2m3s", 123.0),
            ("0", 0.0),
            ("1h0m0s", 3600.0),
            ("500us", 0.0005),
            ("500µs", 0.0005),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_secs_f64(secs)), "{text}");
        }
        for bad in [
            "", "ten", "5d", "-1s", "1h-3m", "s", "1.2.3s", "10 s", "10", "1.5", ".s", "-0",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    /// Go's own cases (time.ParseDuration), as integer nanoseconds.
    #[test]
    fn as_go_parses_them() {
        for (text, nanos) in [
            ("5s", 5_000_000_000u64),
            ("+5s", 5_000_000_000),
            ("30s", 30_000_000_000),
            ("1478s", 1_478_000_000_000),
            ("5.0s", 5_000_000_000),
            ("5.6s", 5_600_000_000),
            ("5.s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.0s", 1_000_000_000),
            ("1.00s", 1_000_000_000),
            ("1.004s", 1_004_000_000),
            ("1.0040s", 1_004_000_000),
            ("100.00100s", 100_001_000_000),
            ("10ns", 10),
            ("11us", 11_000),
            ("12µs", 12_000),
            ("12μs", 12_000),
            ("13ms", 13_000_000),
            ("14s", 14_000_000_000),
            ("15m", 900_000_000_000),
            ("16h", 57_600_000_000_000),
            ("3h30m", 12_600_000_000_000),
            ("10.5s4m", 250_500_000_000),
            ("1h1m1s1ms1us1ns", 3_661_001_001_001),
            ("39h9m14.425s", 140_954_425_000_000),
            ("52763797000ns", 52_763_797_000),
            ("0.3333333333333333333h", 1_200_000_000_000),
            ("9007199254740993ns", 9_007_199_254_740_993),
            ("9223372036854775807ns", 9_223_372_036_854_775_807),
            ("9223372036854775.807us", 9_223_372_036_854_775_807),
            ("9223372036s854ms775us807ns", 9_223_372_036_854_775_807),
            ("0.100000000000000000000h", 360_000_000_000),
            ("0.830103483285477580700h", 2_988_372_539_827),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_nanos(nanos)), "{text}");
        }
        assert_eq!(parse("2562047h47m16.854775807s"), Ok(MAX));
    }

    #[test]
    fn past_292_years_is_refused_naming_the_limit() {
        for huge in [
            "9999999999999999999h",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "2562048h",
            "2562047h47m16.854775808s",
            "99999999999999999999999999999999999999999999s",
            "1e400s",
        ] {
            let err = parse(huge).expect_err(huge);
            if huge != "1e400s" {
                assert!(err.contains(MAX_TEXT), "{huge}: {err}");
            }
        }
    }

    #[test]
    fn printed_as_go_prints_it() {
        for (secs, text) in [
            (5400, "1h30m"),
            (90, "1m30s"),
            (30, "30s"),
            (0, "0s"),
            (3600, "1h"),
        ] {
            assert_eq!(format(Duration::from_secs(secs)), text);
        }
        assert_eq!(format(Duration::from_millis(250)), "250ms");
    }
}
