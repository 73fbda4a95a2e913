//! Admit: a maintenance's turn, the one decision of the slots and the fleet
//! gates (`shared::rules::slots::turn`, the webhook's warnings call it
//! too), from the NodeMaintenance cache, the fleet's node views and the
//! alerts; an admission is recorded under the same lock.

use shared::rules::gates::AlertsSeen;
use shared::{MaintenancePhase, rules::slots};

use super::Ctx;
use crate::plan::Observed;

/// `seen` with its admission: the slots (`--max-concurrent-maintenances`),
/// then the fleet gates for one the slots would start, decided under the
/// admissions' lock so two passes cannot both spend the last of a budget.
pub(super) async fn admit(seen: Observed, ctx: &Ctx) -> Observed {
    let all: Vec<slots::Entry> = ctx
        .store
        .state()
        .iter()
        .map(|o| slots::Entry::of(o))
        .collect();
    let own = slots::Entry::of(&seen.nm);
    // Read outside the lock (a bounded request, cached a few seconds), and
    // only for a maintenance that has not started.
    let waits = own.phase.is_none() || own.phase == Some(MaintenancePhase::Pending);
    // The budgets count the nodes: the rule holds a start until they are
    // listed (this waits a little for the first list).
    let (alerts, listed) = if waits {
        (ctx.fleet.alerts().await, ctx.fleet.nodes_listed().await)
    } else {
        (AlertsSeen::NotRead, true)
    };
    let judge = ctx.fleet.judge(&alerts, seen.now, listed);
    let gate = |me: &slots::Entry, all: &[slots::Entry]| judge.hold(me, all);
    match ctx
        .admissions
        .decide_gated(&own, &all, ctx.max_concurrent_maintenances, gate)
    {
        Ok(slot) => seen.admitted(&slot),
        Err(held) => seen.gated(held.reason, held.message, held.requeue),
    }
}
