//! Maintenance slots: at most N nodes in maintenance at once, the rest wait in
//! creation order. Also decides which of several NodeMaintenances naming the
//! same node owns it (two creates can race past the webhook).
//!
//! A NodeMaintenance holds a slot from the moment it is admitted (phase
//! Running or Succeeded) until it is gone, deletion included, so the next one
//! starts only after the node was given back.
//!
//! Pure functions over [`Entry`]s. [`turn`] joins the slots and the fleet
//! gates into one answer: the controller acts on it and the webhook tells
//! at admission time what a new NodeMaintenance will wait for from it.

use crate::rules::sync::LockExt;
use crate::{MaintenancePhase, NodeMaintenance};

/// What the slot logic needs to know about one NodeMaintenance.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub node: String,
    /// Creation time as sortable text (RFC 3339 UTC) plus name break ties.
    pub created: String,
    pub phase: Option<MaintenancePhase>,
    pub deleting: bool,
}

impl Entry {
    /// The one place a NodeMaintenance becomes a slot entry.
    pub fn of(nm: &NodeMaintenance) -> Entry {
        Entry {
            name: nm.metadata.name.clone().unwrap_or_default(),
            node: nm.spec.node_name.clone(),
            created: nm
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            phase: nm.phase().cloned(),
            deleting: nm.metadata.deletion_timestamp.is_some(),
        }
    }

    /// Running or Succeeded: it holds its slot (and its node).
    pub(crate) fn started(&self) -> bool {
        matches!(
            self.phase,
            Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
        )
    }
    pub(crate) fn failed(&self) -> bool {
        matches!(self.phase, Some(MaintenancePhase::Failed))
    }
    pub(crate) fn order_key(&self) -> (&str, &str) {
        (&self.created, &self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotDecision {
    /// Go ahead (or carry on).
    Admitted,
    /// Another NodeMaintenance already owns this node: never touch it.
    Duplicate { owner: String },
    /// Wait: `position` is 1-based in the queue, `holders` are the names in maintenance.
    Wait {
        position: usize,
        holders: Vec<String>,
        max: usize,
    },
}

/// Decide for `me`. `max == 0` means no limit.
pub fn decide(me: &Entry, all: &[Entry], max: usize) -> SlotDecision {
    if me.started() {
        return SlotDecision::Admitted;
    }
    // The owner of a node: an admitted NodeMaintenance for it, else the oldest
    // one that has not failed.
    let same_node = all
        .iter()
        .filter(|e| e.node == me.node && e.name != me.name);
    let mut rivals: Vec<&Entry> = same_node.filter(|e| !e.failed()).collect();
    rivals.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    if let Some(owner) = rivals.iter().find(|e| e.started()) {
        return SlotDecision::Duplicate {
            owner: owner.name.clone(),
        };
    }
    if let Some(older) = rivals.iter().find(|e| e.order_key() < me.order_key()) {
        return SlotDecision::Duplicate {
            owner: older.name.clone(),
        };
    }
    if max == 0 {
        return SlotDecision::Admitted;
    }
    let holders = holders(all);
    let free = max.saturating_sub(holders.len());
    let queue = queue(all);
    let position = queue
        .iter()
        .position(|e| e.name == me.name)
        .unwrap_or(queue.len());
    if position < free {
        SlotDecision::Admitted
    } else {
        SlotDecision::Wait {
            position: position + 1 - free.min(position + 1),
            holders: holders.iter().map(|e| e.name.clone()).collect(),
            max,
        }
    }
}

/// The admissions this process decided that its cache may not show yet.
///
/// The controller decides from its watch cache, which learns of an
/// admission (the `Running` status write) only some milliseconds later. In
/// between, a second NodeMaintenance decided from the cache alone would see
/// the first as not admitted: with one slot, or for the same node, and
/// ordered ahead of it (same creation second, smaller name), it would be
/// admitted too. [`Admissions::decide`] counts this process's own decisions
/// as admitted until the cache shows the object admitted, failed or gone,
/// and records a new admission before anyone can act on it (one decision at
/// a time).
#[derive(Debug, Default)]
pub struct Admissions {
    /// (name, creation time) of each admission not yet seen in the cache.
    decided: std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
}

impl Admissions {
    /// How many admissions of this process the cache does not show yet.
    pub fn len(&self) -> usize {
        self.decided.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cache shows NodeMaintenance `name` in `phase`: once that is
    /// admitted or failed, the cache decides for it and our record goes
    /// (after Failed no decision may come to drop it otherwise).
    pub fn seen(&self, name: &str, phase: Option<&MaintenancePhase>) {
        if matches!(
            phase,
            Some(
                MaintenancePhase::Running | MaintenancePhase::Succeeded | MaintenancePhase::Failed
            )
        ) {
            self.forget(name);
        }
    }

    /// NodeMaintenance `name` is gone: its admission is no longer counted.
    pub fn forget(&self, name: &str) {
        self.decided.locked().retain(|(n, _)| n != name);
    }

    /// [`decide`] for `me` over `all` (the cache), with this process's own
    /// admissions counted; an admission of `me` is recorded before it is
    /// returned.
    pub fn decide(&self, me: &Entry, all: &[Entry], max: usize) -> SlotDecision {
        let no_gate = |_: &Entry, _: &[Entry]| None::<std::convert::Infallible>;
        match self.decide_gated(me, all, max, no_gate) {
            Ok(decision) => decision,
            Err(never) => match never {},
        }
    }

    /// [`Admissions::decide`] with the fleet gates: [`turn`] over `me` and
    /// `all` as counted here (this process's admissions the cache does not
    /// show yet count as Running); an admission is recorded, a gate's wait
    /// is `Err(wait)` with nothing recorded. The gate runs under the same
    /// lock as the record, so two decisions cannot both spend the last of
    /// a budget.
    pub fn decide_gated<W>(
        &self,
        me: &Entry,
        all: &[Entry],
        max: usize,
        gate: impl Fn(&Entry, &[Entry]) -> Option<W>,
    ) -> Result<SlotDecision, W> {
        let mut decided = self.decided.locked();
        // The cache has caught up with these (or they are gone): it decides.
        decided.retain(|(name, created)| {
            all.iter()
                .any(|e| &e.name == name && &e.created == created && e.phase_is_undecided())
        });
        let counted = |e: &Entry| {
            let mut e = e.clone();
            if e.phase_is_undecided() && decided.contains(&(e.name.clone(), e.created.clone())) {
                e.phase = Some(MaintenancePhase::Running);
            }
            e
        };
        let all: Vec<Entry> = all.iter().map(counted).collect();
        let me_counted = counted(me);
        let decision = turn(&me_counted, &all, max, gate).decision;
        if !me_counted.started() && matches!(decision, Ok(SlotDecision::Admitted)) {
            decided.insert((me.name.clone(), me.created.clone()));
        }
        decision
    }
}

/// The slots' and the gates' one answer for a NodeMaintenance: what the
/// controller acts on and what the webhook warns with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn<W> {
    /// The slots' answer, or the wait of the gate that holds it (`Err`).
    pub decision: Result<SlotDecision, W>,
    /// When it waits for a slot: the slot holders, then those queued before
    /// it that no gate holds, each in creation order. Empty otherwise.
    pub ahead: Vec<String>,
}

/// Decide for `me` with the slots (`max`, 0: no limit) and the fleet gates
/// (`gate`: `Some(wait)` holds a maintenance that has not started). The
/// slots decide first; in their queue, an earlier maintenance that a gate
/// holds takes no slot ahead of `me` (it waits for something else: its
/// zone, say). Started ones and duplicates pass no gate. Without gates,
/// `decision` is [`decide`]'s.
pub fn turn<W>(
    me: &Entry,
    all: &[Entry],
    max: usize,
    gate: impl Fn(&Entry, &[Entry]) -> Option<W>,
) -> Turn<W> {
    let start = |decision| Turn {
        decision,
        ahead: Vec::new(),
    };
    let decision = decide(me, all, max);
    if me.started() || matches!(decision, SlotDecision::Duplicate { .. }) {
        return start(Ok(decision));
    }
    if let SlotDecision::Wait { holders, max, .. } = decision {
        let free = max.saturating_sub(holders.len());
        let before: Vec<String> = queue(all)
            .into_iter()
            .take_while(|e| e.name != me.name)
            .filter(|e| gate(e, all).is_none())
            .map(|e| e.name.clone())
            .collect();
        if before.len() >= free {
            let position = before.len() + 1 - free;
            let ahead = holders.iter().cloned().chain(before).collect();
            let decision = Ok(SlotDecision::Wait {
                position,
                holders,
                max,
            });
            return Turn { decision, ahead };
        }
    }
    match gate(me, all) {
        Some(wait) => start(Err(wait)),
        None => start(Ok(SlotDecision::Admitted)),
    }
}

impl Entry {
    /// Neither admitted nor failed (new or Pending, as the cache shows it).
    fn phase_is_undecided(&self) -> bool {
        !self.started() && !self.failed()
    }
}

/// The admitted ones, in creation order.
fn holders(all: &[Entry]) -> Vec<&Entry> {
    let mut holders: Vec<&Entry> = all.iter().filter(|e| e.started()).collect();
    holders.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    holders
}

/// The queue: everyone not admitted, not failed, not being deleted, first per
/// node, in creation order.
pub(crate) fn queue(all: &[Entry]) -> Vec<&Entry> {
    let mut queue: Vec<&Entry> = all
        .iter()
        .filter(|e| !e.started() && !e.failed() && !e.deleting)
        .collect();
    queue.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
    let mut seen_nodes = std::collections::HashSet::new();
    queue.retain(|e| seen_nodes.insert(e.node.as_str()));
    queue
}

/// A NodeMaintenance left (its finalizer removed, or deleted before its
/// turn): the ones to decide again at once, as a slot, a zone's turn, the
/// unavailable budget, a pause or an earlier waiter may have gone with it.
/// The queue (first per node, creation order); those that started, failed
/// or are being deleted wait for nothing.
pub fn woken_by_departure(all: &[Entry]) -> Vec<String> {
    queue(all).into_iter().map(|e| e.name.clone()).collect()
}

/// The text a waiting NodeMaintenance shows in `lastError`.
pub fn wait_message(position: usize, holders: &[String], max: usize) -> String {
    format!(
        "waiting for a maintenance slot: {} of {max} in use by {}; position {position} in the queue \
         (the limit is --max-concurrent-maintenances)",
        holders.len().min(max),
        if holders.is_empty() {
            "none".to_string()
        } else {
            holders.join(", ")
        }
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A test entry (the gates' tests use it too).
    pub(crate) fn e(
        name: &str,
        node: &str,
        created: &str,
        phase: Option<MaintenancePhase>,
    ) -> Entry {
        Entry {
            name: name.into(),
            node: node.into(),
            created: created.into(),
            phase,
            deleting: false,
        }
    }

    #[test]
    fn a_departure_wakes_the_queue_in_order() {
        use MaintenancePhase::*;
        let mut deleting = e("del", "n4", "4", Some(Pending));
        deleting.deleting = true;
        let cases: Vec<(&str, Vec<Entry>, Vec<&str>)> = vec![
            ("nothing left", vec![], vec![]),
            (
                "holders, failed and deleting wait for nothing",
                vec![
                    e("run", "n1", "1", Some(Running)),
                    e("ok", "n2", "2", Some(Succeeded)),
                    e("bad", "n3", "3", Some(Failed)),
                    deleting,
                ],
                vec![],
            ),
            (
                "waiters in creation order, first per node",
                vec![
                    e("late", "n2", "3", Some(Pending)),
                    e("new", "n1", "2", None),
                    e("first", "n3", "1", Some(Pending)),
                    e("dup", "n1", "4", None),
                ],
                vec!["first", "new", "late"],
            ),
        ];
        for (case, all, want) in cases {
            assert_eq!(woken_by_departure(&all), want, "{case}");
        }
    }

    #[test]
    fn first_come_first_served_with_one_slot() {
        let a = e("a", "n1", "2024-01-01T00:00:01Z", None);
        let b = e("b", "n2", "2024-01-01T00:00:02Z", None);
        let all = vec![a.clone(), b.clone()];
        assert_eq!(decide(&a, &all, 1), SlotDecision::Admitted);
        assert!(matches!(
            decide(&b, &all, 1),
            SlotDecision::Wait { position: 1, .. }
        ));
    }

    #[test]
    fn holder_keeps_slot_until_gone_even_while_deleting() {
        let mut a = e("a", "n1", "1", Some(MaintenancePhase::Succeeded));
        a.deleting = true;
        let b = e("b", "n2", "2", Some(MaintenancePhase::Pending));
        let all = vec![a.clone(), b.clone()];
        assert_eq!(decide(&a, &all, 1), SlotDecision::Admitted);
        assert_eq!(
            decide(&b, &all, 1),
            SlotDecision::Wait {
                position: 1,
                holders: vec!["a".into()],
                max: 1
            }
        );
        // a is gone: b starts.
        assert_eq!(
            decide(&b, std::slice::from_ref(&b), 1),
            SlotDecision::Admitted
        );
    }

    #[test]
    fn failed_ones_free_their_slot() {
        let a = e("a", "n1", "1", Some(MaintenancePhase::Failed));
        let b = e("b", "n2", "2", Some(MaintenancePhase::Pending));
        assert_eq!(decide(&b, &[a, b.clone()], 1), SlotDecision::Admitted);
    }

    #[test]
    fn zero_means_unlimited_and_n_slots_admit_n() {
        let all: Vec<_> = (0..5)
            .map(|i| e(&format!("m{i}"), &format!("n{i}"), &format!("{i}"), None))
            .collect();
        for m in &all {
            assert_eq!(decide(m, &all, 0), SlotDecision::Admitted);
        }
        let admitted = all
            .iter()
            .filter(|m| decide(m, &all, 2) == SlotDecision::Admitted)
            .count();
        assert_eq!(admitted, 2);
        assert!(matches!(
            decide(&all[4], &all, 2),
            SlotDecision::Wait { position: 3, .. }
        ));
    }

    #[test]
    fn second_for_same_node_is_a_duplicate() {
        let a = e("a", "n1", "1", None);
        let b = e("b", "n1", "2", None);
        let all = vec![a.clone(), b.clone()];
        assert_eq!(decide(&a, &all, 0), SlotDecision::Admitted);
        assert_eq!(
            decide(&b, &all, 0),
            SlotDecision::Duplicate { owner: "a".into() }
        );
        // Even an older one loses to one that already runs on the node.
        let running = e("z", "n1", "3", Some(MaintenancePhase::Running));
        let all = vec![a.clone(), running.clone()];
        assert_eq!(
            decide(&a, &all, 0),
            SlotDecision::Duplicate { owner: "z".into() }
        );
        assert_eq!(decide(&running, &all, 0), SlotDecision::Admitted);
    }

    /// The race of issue 22, in the order the controller meets it: A and B
    /// created in the same second, B with the smaller name. A is decided
    /// first (admitted, its Running write under way); B arrives while the
    /// cache still shows A with no phase.
    #[test]
    fn an_admission_the_cache_does_not_show_yet_still_holds_its_slot() {
        let a = e("zeta", "n1", "2026-12-03T12:00:00Z", None);
        let b = e("alpha", "n2", "2026-12-03T12:00:00Z", None);
        let cache = vec![a.clone(), b.clone()];
        // Deciding from the cache alone admits both: the bug, shown.
        assert_eq!(decide(&b, &cache, 1), SlotDecision::Admitted);
        let only_a = vec![a.clone()];
        assert_eq!(decide(&a, &only_a, 1), SlotDecision::Admitted);

        let admissions = Admissions::default();
        // A is reconciled before B is in the cache: admitted, recorded.
        assert_eq!(admissions.decide(&a, &only_a, 1), SlotDecision::Admitted);
        // B arrives; the cache still shows A with no phase: B waits for A.
        assert_eq!(
            admissions.decide(&b, &cache, 1),
            SlotDecision::Wait {
                position: 1,
                holders: vec!["zeta".into()],
                max: 1
            }
        );
        // A's next reconcile (cache still behind) keeps its slot.
        assert_eq!(admissions.decide(&a, &cache, 1), SlotDecision::Admitted);
        // The cache shows A Running: it counts from the cache now.
        let mut a_running = a.clone();
        a_running.phase = Some(MaintenancePhase::Running);
        let caught_up = vec![a_running.clone(), b.clone()];
        assert!(matches!(
            admissions.decide(&b, &caught_up, 1),
            SlotDecision::Wait { .. }
        ));
        // A is gone: B starts.
        assert_eq!(
            admissions.decide(&b, std::slice::from_ref(&b), 1),
            SlotDecision::Admitted
        );
    }

    #[test]
    fn a_gone_maintenance_leaves_no_admission_behind() {
        let a = e("zeta", "n1", "2026-12-03T12:00:00Z", None);
        let admissions = Admissions::default();
        admissions.decide(&a, std::slice::from_ref(&a), 1);
        assert_eq!(admissions.len(), 1);
        admissions.forget("other");
        assert_eq!(admissions.len(), 1);
        admissions.forget("zeta");
        assert!(admissions.is_empty());

        admissions.decide(&a, std::slice::from_ref(&a), 1);
        admissions.seen("zeta", Some(&MaintenancePhase::Pending));
        assert_eq!(admissions.len(), 1, "the cache does not show it yet");
        admissions.seen("zeta", Some(&MaintenancePhase::Failed));
        assert!(admissions.is_empty(), "the cache shows it decided");
    }

    /// The same race for one node: the later-decided one with the smaller
    /// name is a duplicate of the admitted one, not its owner.
    #[test]
    fn two_for_one_node_in_the_same_second_admit_one() {
        let a = e("zeta", "n1", "2026-12-03T12:00:00Z", None);
        let b = e("alpha", "n1", "2026-12-03T12:00:00Z", None);
        let admissions = Admissions::default();
        assert_eq!(
            admissions.decide(&a, std::slice::from_ref(&a), 0),
            SlotDecision::Admitted
        );
        assert_eq!(
            admissions.decide(&b, &[a.clone(), b.clone()], 0),
            SlotDecision::Duplicate {
                owner: "zeta".into()
            }
        );
        // A failed (shown in the cache): it no longer owns the node.
        let mut a_failed = a.clone();
        a_failed.phase = Some(MaintenancePhase::Failed);
        assert_eq!(
            admissions.decide(&b, &[a_failed, b.clone()], 0),
            SlotDecision::Admitted
        );
    }

    #[test]
    fn wait_message_names_holders_and_limit() {
        let m = wait_message(2, &["a".into()], 1);
        assert!(m.contains("1 of 1 in use by a"), "{m}");
        assert!(m.contains("position 2"), "{m}");
        assert!(m.contains("--max-concurrent-maintenances"), "{m}");
    }
    /// [`turn`] without gates: the names ahead when it waits for a slot.
    fn ahead(me: &Entry, all: &[Entry], max: usize) -> Option<Vec<String>> {
        let no_gate = |_: &Entry, _: &[Entry]| None::<()>;
        let t = turn(me, all, max, no_gate);
        matches!(t.decision, Ok(SlotDecision::Wait { .. })).then_some(t.ahead)
    }

    #[test]
    fn ahead_names_holders_then_the_queue_before_me() {
        let a = e("a", "n1", "1", Some(MaintenancePhase::Running));
        let b = e("b", "n2", "2", Some(MaintenancePhase::Pending));
        let c = e("c", "n3", "3", None);
        let all = vec![a.clone(), b.clone(), c.clone()];
        assert_eq!(ahead(&a, &all, 1), None);
        assert_eq!(ahead(&b, &all, 1), Some(vec!["a".to_string()]));
        assert_eq!(
            ahead(&c, &all, 1),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(ahead(&c, &all, 0), None, "no limit: nobody waits");
        assert_eq!(ahead(&b, &all, 2), None, "a second slot is free");
        assert_eq!(
            ahead(&c, &all, 2),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        // A duplicate is not a wait.
        let dup = e("d", "n1", "4", None);
        assert_eq!(ahead(&dup, &[a, dup.clone()], 1), None);
    }
}
