//! The two budgets: `--max-unavailable` (nodes in maintenance, NotReady or
//! cordoned by anyone, after the start) and `--max-concurrent-per-zone`
//! (maintenances running per zone label value), walked over the queue in
//! creation order (see the module doc of `gates` for the rule).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use super::{FleetNode, GateDecision, GateInputs, GateReason, Gates};
use crate::rules::slots::{self, Entry};

/// `--max-unavailable`: a count of nodes, or a percentage of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnavailable {
    Nodes(usize),
    Percent(u8),
}

impl FromStr for MaxUnavailable {
    type Err = String;

    fn from_str(text: &str) -> Result<MaxUnavailable, String> {
        let bad = |why: &str| {
            format!(
                "invalid --max-unavailable {text:?}: {why}; write a count of nodes (2) or a \
                 percentage of them (10%), or leave it unset for no limit"
            )
        };
        let t = text.trim();
        let value = match t.strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 100 => MaxUnavailable::Percent(p),
                _ => return Err(bad("a percentage is a whole number from 0 to 100")),
            },
            None => match t.parse::<usize>() {
                Ok(n) => MaxUnavailable::Nodes(n),
                Err(_) => return Err(bad("not a whole number")),
            },
        };
        if value == MaxUnavailable::Nodes(0) {
            return Err(bad("0 would hold every maintenance"));
        }
        Ok(value)
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnavailable::Nodes(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl MaxUnavailable {
    /// How many of `total` nodes may be unavailable: a percentage is
    /// rounded down, and at least 1.
    pub fn limit(self, total: usize) -> usize {
        match self {
            MaxUnavailable::Nodes(n) => n,
            MaxUnavailable::Percent(p) => (total * usize::from(p) / 100).max(1),
        }
    }
}

/// Why a node counts as unavailable (the first that applies).
#[derive(Debug, Clone)]
enum Cause {
    InMaintenance(String),
    StartsFirst(String),
    NotReady,
    Cordoned,
}

/// The walk's state: what is unavailable and what runs per zone, with the
/// earlier maintenances that pass counted as started.
struct Walk<'a> {
    zones: HashMap<&'a str, Option<&'a str>>,
    unavailable: BTreeMap<String, Cause>,
    /// Per zone: the maintenances running, and those that start first
    /// (`true`).
    running: BTreeMap<Option<&'a str>, Vec<(&'a Entry, bool)>>,
    /// The first earlier one that waits for max-unavailable.
    unavailable_waiter: Option<&'a Entry>,
    /// Per zone, the last earlier one that waits for its zone: the one
    /// just ahead of the next, which stays so while the zone hands over
    /// (its waiters' words change only when the one ahead starts).
    zone_waiters: BTreeMap<Option<&'a str>, &'a Entry>,
    /// `--fleet-node-selector` is set: only the nodes seen count (else a
    /// node not seen, e.g. gone, counts in the unlabelled zone).
    selective: bool,
}

impl<'a> Walk<'a> {
    fn new(all: &'a [Entry], nodes: &'a [FleetNode], selective: bool) -> Walk<'a> {
        let zones = nodes
            .iter()
            .map(|n| (n.name.as_str(), n.zone.as_deref()))
            .collect();
        let mut walk = Walk {
            zones,
            unavailable: BTreeMap::new(),
            running: BTreeMap::new(),
            unavailable_waiter: None,
            zone_waiters: BTreeMap::new(),
            selective,
        };
        let mut started: Vec<&Entry> = all
            .iter()
            .filter(|e| e.started() && walk.counts(e))
            .collect();
        started.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        for e in started {
            walk.start(e, Cause::InMaintenance(e.name.clone()));
        }
        for n in nodes {
            let cause = match (n.ready, n.cordoned) {
                (false, _) => Cause::NotReady,
                (true, true) => Cause::Cordoned,
                (true, false) => continue,
            };
            walk.unavailable.entry(n.name.clone()).or_insert(cause);
        }
        walk
    }

    /// Whether `e`'s node is among the nodes counted (`--fleet-node-selector`).
    fn counts(&self, e: &Entry) -> bool {
        !self.selective || self.zones.contains_key(e.node.as_str())
    }

    fn zone(&self, e: &Entry) -> Option<&'a str> {
        self.zones.get(e.node.as_str()).copied().flatten()
    }

    fn start(&mut self, e: &'a Entry, cause: Cause) {
        let first = matches!(cause, Cause::StartsFirst(_));
        self.unavailable.entry(e.node.clone()).or_insert(cause);
        self.running
            .entry(self.zone(e))
            .or_default()
            .push((e, first));
    }

    /// An earlier maintenance `e` in the queue: it starts first if both
    /// budgets let it and no earlier one waits for the same budget; else
    /// it waits, for max-unavailable first (the order of the gates).
    fn pass(&mut self, e: &'a Entry, limit: Option<usize>, per_zone: usize) {
        let zone = self.zone(e);
        let fits = limit.is_none_or(|l| self.unavailable_with(e) <= l);
        if self.unavailable_waiter.is_some() || !fits {
            self.unavailable_waiter.get_or_insert(e);
        } else if self.zone_waiters.contains_key(&zone)
            || (per_zone > 0 && self.running_in(zone).len() >= per_zone)
        {
            self.zone_waiters.insert(zone, e);
        } else {
            self.start(e, Cause::StartsFirst(e.name.clone()));
        }
    }

    /// How many nodes would be unavailable once `e` started.
    fn unavailable_with(&self, e: &Entry) -> usize {
        self.unavailable.len() + usize::from(!self.unavailable.contains_key(&e.node))
    }

    fn running_in(&self, zone: Option<&'a str>) -> &[(&'a Entry, bool)] {
        self.running.get(&zone).map_or(&[], Vec::as_slice)
    }
}

/// The budgets' verdict on `me`: `None` lets it start.
pub(super) fn check(
    me: &Entry,
    all: &[Entry],
    observed: &GateInputs,
    gates: &Gates,
) -> Option<GateDecision> {
    let limit = gates
        .max_unavailable
        .map(|m| (m, m.limit(observed.nodes.len())));
    let per_zone = gates.max_per_zone;
    if limit.is_none() && per_zone == 0 {
        return None;
    }
    let mut walk = Walk::new(all, observed.nodes, !gates.node_selector.is_empty());
    // A node the budgets do not count (outside --fleet-node-selector) is
    // held by none of them, and holds no one.
    if !walk.counts(me) {
        return None;
    }
    let earlier: Vec<&Entry> = slots::queue(all)
        .into_iter()
        .filter(|e| {
            e.name != me.name
                && e.node != me.node
                && e.order_key() < me.order_key()
                && walk.counts(e)
        })
        .collect();
    for e in earlier {
        walk.pass(e, limit.map(|(_, l)| l), per_zone);
    }
    if let Some((setting, limit)) = limit {
        let after = walk.unavailable_with(me);
        if after > limit || walk.unavailable_waiter.is_some() {
            let message = unavailable_message(&walk, me, after, limit, setting, observed);
            return GateDecision::wait(
                GateReason::MaxUnavailable,
                message + &waiter_note(walk.unavailable_waiter, "for the same budget"),
            );
        }
    }
    let zone = walk.zone(me);
    let waiter = walk.zone_waiters.get(&zone).copied();
    if per_zone > 0 && (walk.running_in(zone).len() >= per_zone || waiter.is_some()) {
        let message = zone_message(&walk, zone, per_zone, &gates.zone_label, waiter);
        return GateDecision::wait(
            GateReason::ZoneBudget,
            message + &waiter_note(waiter, "in the same zone"),
        );
    }
    None
}

/// The zone's words. Those running are named only to the first waiter of
/// the zone; a later one names the waiter just ahead of it (the note), so
/// a zone's hand-over rewrites two waiters' status, not every waiter's.
fn zone_message(
    walk: &Walk,
    zone: Option<&str>,
    per_zone: usize,
    label: &str,
    waiter: Option<&Entry>,
) -> String {
    let running = walk.running_in(zone);
    let names: Vec<String> = running
        .iter()
        .map(|(e, first)| match first {
            false => format!("{} (node {})", e.name, e.node),
            true => format!("{} (node {}, starts first)", e.name, e.node),
        })
        .collect();
    let listed = match (waiter, names.is_empty()) {
        (Some(_), _) => String::new(),
        (None, true) => ": none".to_string(),
        (None, false) => format!(": {}", names.join(", ")),
    };
    format!(
        "waits for the zone budget: {} has {} of {per_zone} maintenance(s) running{listed} \
         (--max-concurrent-per-zone={per_zone}, --zone-label={label})",
        zone_text(zone, label),
        running.len(),
    )
}

fn unavailable_message(
    walk: &Walk,
    me: &Entry,
    after: usize,
    limit: usize,
    setting: MaxUnavailable,
    observed: &GateInputs,
) -> String {
    let listed: Vec<String> = walk
        .unavailable
        .iter()
        .map(|(node, cause)| match cause {
            Cause::InMaintenance(nm) => format!("{node} (in maintenance, {nm})"),
            Cause::StartsFirst(nm) => format!("{node} ({nm} starts first)"),
            Cause::NotReady => format!("{node} (NotReady)"),
            Cause::Cordoned => format!("{node} (cordoned)"),
        })
        .collect();
    let total = observed.nodes.len();
    let state = if after > limit {
        format!(
            "with node {} that makes {after} of {total} nodes unavailable",
            me.node
        )
    } else {
        // It fits, but an earlier one waits for the budget (the note says).
        format!(
            "{} of {total} nodes are unavailable",
            walk.unavailable.len()
        )
    };
    format!(
        "waits for the unavailable-node budget: {state}, at most {limit} may be \
         (--max-unavailable={setting}); unavailable: {}; it starts when one of them is back",
        if listed.is_empty() {
            "none".to_string()
        } else {
            listed.join(", ")
        },
    )
}

fn zone_text(zone: Option<&str>, label: &str) -> String {
    match zone {
        Some(z) => format!("zone {z:?}"),
        None => format!("the zone of nodes without label {label}"),
    }
}

/// "; <name> (node <node>) waits ahead of it <how>", when one does.
fn waiter_note(waiter: Option<&Entry>, how: &str) -> String {
    waiter.map_or(String::new(), |w| {
        format!("; {} (node {}) waits ahead of it {how}", w.name, w.node)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_parses_counts_and_percentages() {
        let cases = [
            ("a count", "2", Ok(MaxUnavailable::Nodes(2))),
            ("a percentage", "10%", Ok(MaxUnavailable::Percent(10))),
            ("spaces", " 25 % ", Ok(MaxUnavailable::Percent(25))),
            ("all", "100%", Ok(MaxUnavailable::Percent(100))),
            (
                "zero percent is one node",
                "0%",
                Ok(MaxUnavailable::Percent(0)),
            ),
            ("zero nodes", "0", Err("0 would hold every maintenance")),
            ("over 100%", "101%", Err("from 0 to 100")),
            ("a fraction", "1.5", Err("not a whole number")),
            ("negative", "-1", Err("not a whole number")),
            ("empty", "", Err("not a whole number")),
            ("a word", "half", Err("not a whole number")),
        ];
        for (case, text, want) in cases {
            match (text.parse::<MaxUnavailable>(), want) {
                (Ok(got), Ok(want)) => {
                    assert_eq!(got, want, "{case}");
                    assert_eq!(got.to_string().parse(), Ok(got), "{case}: round trip");
                }
                (Err(e), Err(w)) => {
                    assert!(e.contains(w), "{case}: {e}");
                    assert!(e.contains("--max-unavailable"), "{case}: {e}");
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn limits_round_down_to_at_least_one() {
        let cases = [
            ("count", MaxUnavailable::Nodes(3), 10, 3),
            ("count over the fleet", MaxUnavailable::Nodes(30), 10, 30),
            ("10% of 10", MaxUnavailable::Percent(10), 10, 1),
            ("25% of 10", MaxUnavailable::Percent(25), 10, 2),
            ("5% of 10", MaxUnavailable::Percent(5), 10, 1),
            ("0% of 10", MaxUnavailable::Percent(0), 10, 1),
            ("50% of none", MaxUnavailable::Percent(50), 0, 1),
            ("100% of 7", MaxUnavailable::Percent(100), 7, 7),
        ];
        for (case, setting, total, want) in cases {
            assert_eq!(setting.limit(total), want, "{case}");
        }
    }
}
