//! The alert gate (`--block-on-alerts-url`, `--block-on-alerts-filter`):
//! while a firing alert matches the filter, no maintenance starts; alerts
//! that could not be read block too (fail closed), as kured's
//! `--prometheus-url` does.
//!
//! The filter is a list of Prometheus label matchers, comma-separated, with
//! or without braces: `severity="critical",alertname!="Watchdog"`,
//! `{namespace=~"kube-.*"}`. `=`, `!=`, `=~`, `!~`; a regex matches the
//! whole value; a missing label is the empty value. An empty filter matches
//! every firing alert.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use regex::Regex;

use super::{GateDecision, GateReason};

/// A valid filter, shown in every parse error.
const EXAMPLE: &str = "severity=\"critical\",alertname!=\"Watchdog\"";

/// How many alerts a message names.
const NAMED: usize = 5;

/// The alert gate's settings.
#[derive(Debug, Clone)]
pub struct AlertGate {
    /// `--block-on-alerts-url`: Prometheus (or Alertmanager-compatible)
    /// base URL; the caller fetches `<url>/api/v1/alerts`.
    pub url: String,
    /// `--block-on-alerts-filter`.
    pub filter: AlertFilter,
}

/// The alerts as the caller read them.
#[derive(Debug, Clone, PartialEq)]
pub enum AlertsSeen {
    /// Not read yet (blocks: fail closed).
    NotRead,
    Read(Vec<Alert>),
    /// Why they could not be read (blocks: fail closed).
    Failed(String),
}

/// One alert as the gate judges it (the alert source reads it from
/// Prometheus or Alertmanager: `shared::serve::alert_source`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    /// `firing` or `pending`; only firing ones block.
    pub state: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal,
    NotEqual,
    Matches,
    NotMatches,
}

#[derive(Debug, Clone)]
struct Matcher {
    name: String,
    op: Op,
    value: String,
    /// The anchored regex of `=~` and `!~`.
    regex: Option<Regex>,
}

impl Matcher {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.name).map(String::as_str).unwrap_or("");
        let re = |v: &str| self.regex.as_ref().is_some_and(|r| r.is_match(v));
        match self.op {
            Op::Equal => v == self.value,
            Op::NotEqual => v != self.value,
            Op::Matches => re(v),
            Op::NotMatches => !re(v),
        }
    }
}

/// A parsed `--block-on-alerts-filter`.
#[derive(Debug, Clone, Default)]
pub struct AlertFilter {
    text: String,
    matchers: Vec<Matcher>,
}

impl FromStr for AlertFilter {
    type Err = String;

    fn from_str(text: &str) -> Result<AlertFilter, String> {
        let bad = |why: String| {
            format!("invalid --block-on-alerts-filter {text:?}: {why}; a valid one: {EXAMPLE}")
        };
        let mut rest = text.trim();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            rest = inner.trim();
        }
        let mut matchers = Vec::new();
        while !rest.is_empty() {
            let (matcher, after) = matcher(rest).map_err(bad)?;
            matchers.push(matcher);
            rest = after.trim_start();
            if !rest.is_empty() {
                rest = rest
                    .strip_prefix(',')
                    .ok_or_else(|| bad(format!("expected ',' before {rest:?}")))?
                    .trim_start();
            }
        }
        Ok(AlertFilter {
            text: text.trim().to_string(),
            matchers,
        })
    }
}

impl fmt::Display for AlertFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl AlertFilter {
    /// Whether every matcher matches `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matchers.iter().all(|m| m.matches(labels))
    }

    /// The firing alerts the filter matches.
    pub fn firing<'a>(&self, alerts: &'a [Alert]) -> Vec<&'a Alert> {
        alerts
            .iter()
            .filter(|a| a.state == "firing" && self.matches(&a.labels))
            .collect()
    }

    /// `alertname{label="value",...}` with the labels the filter names.
    fn describe(&self, alert: &Alert) -> String {
        let name = alert
            .labels
            .get("alertname")
            .map_or("(no alertname)", |n| n);
        let mut shown: Vec<&str> = self.matchers.iter().map(|m| m.name.as_str()).collect();
        shown.sort_unstable();
        shown.dedup();
        let labels: Vec<String> = shown
            .into_iter()
            .filter(|l| *l != "alertname")
            .filter_map(|l| alert.labels.get(l).map(|v| format!("{l}={v:?}")))
            .collect();
        if labels.is_empty() {
            name.to_string()
        } else {
            format!("{name}{{{}}}", labels.join(","))
        }
    }
}

/// One matcher at the start of `s`, and what follows it.
fn matcher(s: &str) -> Result<(Matcher, &str), String> {
    let name_len = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    let name = &s[..name_len];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("expected a label name at {s:?}"));
    }
    let rest = s[name_len..].trim_start();
    let ops = [
        ("=~", Op::Matches),
        ("!~", Op::NotMatches),
        ("!=", Op::NotEqual),
        ("=", Op::Equal),
    ];
    let Some((op, rest)) = ops
        .iter()
        .find_map(|(text, op)| rest.strip_prefix(text).map(|r| (*op, r)))
    else {
        return Err(format!(
            "expected =, !=, =~ or !~ after {name:?}, found {rest:?}"
        ));
    };
    let (value, rest) = quoted(rest.trim_start())
        .ok_or_else(|| format!("the value of {name:?} must be in double quotes"))?;
    let regex = match op {
        Op::Matches | Op::NotMatches => Some(
            Regex::new(&format!("^(?:{value})$"))
                .map_err(|e| format!("the regex of {name:?} does not compile: {e}"))?,
        ),
        Op::Equal | Op::NotEqual => None,
    };
    let matcher = Matcher {
        name: name.to_string(),
        op,
        value,
        regex,
    };
    Ok((matcher, rest))
}

/// A double-quoted string (escapes `\"`, `\\`, `\n`, `\t`) at the start
/// of `s`, and what follows it.
fn quoted(s: &str) -> Option<(String, &str)> {
    let body = s.strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &body[i + 1..])),
            '\\' => value.push(match chars.next()?.1 {
                'n' => '\n',
                't' => '\t',
                other => other,
            }),
            c => value.push(c),
        }
    }
    None
}

/// The gate: `None` lets a maintenance start.
pub(super) fn check(seen: &AlertsSeen, gate: Option<&AlertGate>) -> Option<GateDecision> {
    let gate = gate?;
    let url = &gate.url;
    let message = match seen {
        AlertsSeen::NotRead => format!(
            "waits: the alerts at {url} have not been read yet; no maintenance starts until \
             they are (--block-on-alerts-url fails closed)"
        ),
        AlertsSeen::Failed(why) => format!(
            "waits: the alerts could not be read from {url}: {why}; no maintenance starts \
             until they can be (--block-on-alerts-url fails closed)"
        ),
        AlertsSeen::Read(alerts) => {
            let firing = gate.filter.firing(alerts);
            if firing.is_empty() {
                return None;
            }
            let mut named: Vec<String> = firing
                .iter()
                .take(NAMED)
                .map(|a| gate.filter.describe(a))
                .collect();
            if firing.len() > NAMED {
                named.push(format!("and {} more", firing.len() - NAMED));
            }
            let filter = if gate.filter.matchers.is_empty() {
                "any alert".to_string()
            } else {
                gate.filter.to_string()
            };
            format!(
                "waits while alerts fire: {}; it starts when they resolve \
                 (--block-on-alerts-filter {filter} at {url})",
                named.join(", ")
            )
        }
    };
    GateDecision::wait(GateReason::AlertsFiring, message)
}

#[cfg(test)]
mod tests;
