//! Durations as Go writes them (`time.ParseDuration`, `metav1.Duration`):
//! "90s", "1h30m", "250ms", "1.5h". The CRD's `spec.drainTimeout` and the
//! services' duration flags share this one parser.

use std::time::Duration;

/// The CRD schema pattern of a Go duration (non-negative; "0" allowed).
pub const GO_DURATION_PATTERN: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$";

/// Parse a non-negative Go duration. As Go, a number needs a unit ("0"
/// aside): "10" is refused, not guessed.
pub fn parse(value: &str) -> Result<Duration, String> {
    let v = value.trim();
    let bad = |why: &str| {
        format!("invalid duration {value:?}: {why}; write it as Go does, e.g. 90s, 1h30m, 250ms")
    };
    if v.is_empty() {
        return Err(bad("empty"));
    }
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    if v.parse::<f64>().is_ok() {
        return Err(bad("a number without a unit"));
    }
    let mut total = 0f64;
    let mut rest = v;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| bad("a number without a unit"))?;
        if num_len == 0 {
            return Err(bad("expected a number"));
        }
        let n: f64 = rest[..num_len].parse().map_err(|_| bad("not a number"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(bad(&format!(
                    "unknown unit {other:?} (ns, us, ms, s, m, h)"
                )));
            }
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    seconds(total).ok_or_else(|| bad("out of range"))
}

fn seconds(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
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
            "", "ten", "5d", "-1s", "1h-3m", "s", "1.2.3s", "10 s", "10", "1.5",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be refused");
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
