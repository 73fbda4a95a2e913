//! KEP-5683 node lifecycle conditions: what the Node of a maintenance says
//! about it (`MaintenancePlanned`, `MaintenanceInProgress`,
//! `DrainInProgress`, `Drained`), as pure decisions. A pass names the
//! [`Stage`] its plan and record put the maintenance in ([`stage`]);
//! [`changes`] compares what that stage wants with the node's conditions and
//! gives only the conditions to write, each merged by type (the reconcile
//! sends them as a strategic merge patch of `status.conditions`).
//!
//! Only these four types are ever written, and only when the node has none
//! of that type or ours (reason starting `NodeMaintenance`): the same type
//! written by someone else is theirs and stays as it is.

use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use shared::MaintenancePhase;

use super::{Plan, Record};
use crate::conditions::Cause;

pub const MAINTENANCE_PLANNED: &str = "MaintenancePlanned";
pub const MAINTENANCE_IN_PROGRESS: &str =
    shared::api::consts::NODE_CONDITION_MAINTENANCE_IN_PROGRESS;
pub const DRAIN_IN_PROGRESS: &str = "DrainInProgress";
pub const DRAINED: &str = "Drained";
/// The four types, in the order a maintenance reaches them.
pub const TYPES: [&str; 4] = [
    MAINTENANCE_PLANNED,
    MAINTENANCE_IN_PROGRESS,
    DRAIN_IN_PROGRESS,
    DRAINED,
];
/// Every reason we write starts so: a condition of one of the four types
/// with another reason was written by someone else.
pub const REASON_PREFIX: &str = shared::api::consts::NODE_CONDITION_REASON_PREFIX;

/// Where a maintenance stands, as its node's conditions tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Created, not yet holding the node: queued for a slot, or the lease
    /// held by another operator.
    Waiting,
    /// The node taken (lease, cordon, taints, label) and being drained.
    Draining,
    /// The node taken and drained.
    Drained,
    /// The node given back (deleted, failed, or stopped waiting).
    Ended,
}

/// What a plan means for the node's conditions, known before it is applied
/// (the plan is consumed by applying it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Nothing to say (a new object, a duplicate, a final one, a node that
    /// was never there).
    Silent,
    /// Waiting for a slot or a gate.
    Wait,
    /// Lease, cordon, a drain round: the record says how it went.
    Maintain,
    /// The node is given back.
    End,
}

impl Intent {
    /// The intent of `plan`; `pending`: the maintenance is in phase
    /// Pending (a deleted one that only waited has a Planned to clear).
    pub fn of(plan: &Plan, pending: bool) -> Intent {
        match plan {
            Plan::Nothing | Plan::AddFinalizer { .. } => Intent::Silent,
            Plan::Write(r) if matches!(r.why.cause, Cause::WaitingForSlot | Cause::Gate(_)) => {
                Intent::Wait
            }
            Plan::Write(_) => Intent::Silent,
            Plan::Maintain { .. } => Intent::Maintain,
            Plan::GiveBack(_) => Intent::End,
            Plan::Cleanup { give_back } if *give_back || pending => Intent::End,
            Plan::Cleanup { .. } => Intent::Silent,
        }
    }
}

/// The stage a pass leaves the maintenance in: its intent, and for a
/// maintain pass the record it wrote (None: the pass wrote nothing).
pub fn stage(intent: Intent, record: Option<&Record>) -> Option<Stage> {
    match intent {
        Intent::Silent => None,
        Intent::Wait => Some(Stage::Waiting),
        Intent::End => Some(Stage::Ended),
        Intent::Maintain => {
            let record = record?;
            Some(match record.status.phase {
                Some(MaintenancePhase::Failed) => Stage::Ended,
                // Drained, then changed by hand: still drained as far as
                // the maintenance goes (it leaves the node as it is).
                _ if record.why.by_hand.is_some() => Stage::Drained,
                // A lease not (yet) ours: the node was not taken.
                _ if !record.why.cordoned => Stage::Waiting,
                Some(MaintenancePhase::Succeeded) => Stage::Drained,
                _ => Stage::Draining,
            })
        }
    }
}

/// One condition as a stage wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
    /// Written even as False on a node without it: a taken node shows all
    /// four; a given-back one only turns off what it showed.
    pub always: bool,
}

fn want(type_: &'static str, status: bool, reason: &'static str, message: String) -> Want {
    Want {
        type_,
        status,
        reason,
        message,
        always: true,
    }
}

/// The four conditions as `stage` of NodeMaintenance `nm` wants them.
pub fn wanted(stage: Stage, nm: &str) -> Vec<Want> {
    let taken = format!(
        "node taken by NodeMaintenance {nm}: cordoned, tainted and excluded from remediation"
    );
    match stage {
        Stage::Waiting => vec![want(
            MAINTENANCE_PLANNED,
            true,
            "NodeMaintenanceWaiting",
            format!(
                "NodeMaintenance {nm} waits to start (its status.lastError says why); \
                 the node is not touched yet"
            ),
        )],
        Stage::Draining | Stage::Drained => {
            let drained = stage == Stage::Drained;
            let (drain_reason, drain_msg) = if drained {
                (
                    "NodeMaintenanceDrained",
                    format!("NodeMaintenance {nm} drained the node"),
                )
            } else {
                (
                    "NodeMaintenanceDraining",
                    format!("NodeMaintenance {nm} is draining the node"),
                )
            };
            vec![
                want(
                    MAINTENANCE_PLANNED,
                    false,
                    "NodeMaintenanceStarted",
                    format!("NodeMaintenance {nm} started"),
                ),
                want(
                    MAINTENANCE_IN_PROGRESS,
                    true,
                    "NodeMaintenanceInProgress",
                    taken,
                ),
                want(DRAIN_IN_PROGRESS, !drained, drain_reason, drain_msg.clone()),
                want(DRAINED, drained, drain_reason, drain_msg),
            ]
        }
        Stage::Ended => TYPES
            .iter()
            .map(|t| Want {
                always: false,
                ..want(
                    t,
                    false,
                    shared::api::consts::NODE_CONDITION_REASON_ENDED,
                    format!("NodeMaintenance {nm} ended: the node was given back"),
                )
            })
            .collect(),
    }
}

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Whether condition `c` (of one of our types) is ours to change.
pub fn is_ours(c: &NodeCondition) -> bool {
    c.reason
        .as_deref()
        .is_some_and(|r| r.starts_with(REASON_PREFIX))
}

/// The conditions to write so that the node's `current` conditions say
/// what `wants` wants, stamped `now`: a type the node lacks is added
/// unless the want is False and not `always` (a given-back node only turns
/// off what it showed); a type written by
/// someone else is left alone; one of ours already saying the same is not
/// written again. `lastTransitionTime` moves only when the status changes.
pub fn changes(current: &[NodeCondition], wants: &[Want], now: &Time) -> Vec<NodeCondition> {
    wants
        .iter()
        .filter_map(|w| {
            let existing = current.iter().find(|c| c.type_ == w.type_);
            let status = status_word(w.status);
            let transition = match existing {
                None if !w.status && !w.always => return None,
                None => now.clone(),
                Some(c) if !is_ours(c) => return None,
                Some(c)
                    if c.status == status
                        && c.reason.as_deref() == Some(w.reason)
                        && c.message.as_deref() == Some(w.message.as_str()) =>
                {
                    return None;
                }
                Some(c) if c.status == status => c
                    .last_transition_time
                    .clone()
                    .unwrap_or_else(|| now.clone()),
                Some(_) => now.clone(),
            };
            Some(NodeCondition {
                type_: w.type_.to_string(),
                status: status.to_string(),
                reason: Some(w.reason.to_string()),
                message: Some(w.message.clone()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Why;
    use k8s_openapi::jiff::Timestamp;
    use shared::NodeMaintenanceStatus;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("a time"))
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str, since: i64) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_heartbeat_time: Some(at(since)),
            last_transition_time: Some(at(since)),
        }
    }

    fn record(phase: MaintenancePhase, cordoned: bool) -> Record {
        Record {
            status: NodeMaintenanceStatus {
                phase: Some(phase),
                ..Default::default()
            },
            why: Why::new(Cause::Progress, cordoned),
            requeue: None,
        }
    }

    /// Apply `changes` as the API server's strategic merge does (by type).
    fn merged(current: &[NodeCondition], changes: Vec<NodeCondition>) -> Vec<NodeCondition> {
        let mut out = current.to_vec();
        for c in changes {
            match out.iter_mut().find(|o| o.type_ == c.type_) {
                Some(o) => *o = c,
                None => out.push(c),
            }
        }
        out
    }

    fn says(conditions: &[NodeCondition]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_stage_a_pass_leaves() {
        use MaintenancePhase::*;
        let cases: &[(&str, Intent, Option<Record>, Option<Stage>)] = &[
            ("silent pass", Intent::Silent, None, None),
            ("queued", Intent::Wait, None, Some(Stage::Waiting)),
            ("given back", Intent::End, None, Some(Stage::Ended)),
            ("maintain wrote nothing", Intent::Maintain, None, None),
            (
                "lease held by another, node not taken",
                Intent::Maintain,
                Some(record(Running, false)),
                Some(Stage::Waiting),
            ),
            (
                "draining",
                Intent::Maintain,
                Some(record(Running, true)),
                Some(Stage::Draining),
            ),
            (
                "drained",
                Intent::Maintain,
                Some(record(Succeeded, true)),
                Some(Stage::Drained),
            ),
            (
                "drained, then uncordoned by hand",
                Intent::Maintain,
                Some(Record {
                    why: Why {
                        by_hand: Some("uncordoned".into()),
                        ..Why::new(Cause::Progress, false)
                    },
                    ..record(Succeeded, false)
                }),
                Some(Stage::Drained),
            ),
            (
                "lease lost for good",
                Intent::Maintain,
                Some(record(Failed, true)),
                Some(Stage::Ended),
            ),
            (
                "failed before the cordon",
                Intent::Maintain,
                Some(record(Failed, false)),
                Some(Stage::Ended),
            ),
        ];
        for (name, intent, rec, want) in cases {
            assert_eq!(stage(*intent, rec.as_ref()), *want, "{name}");
        }
    }

    #[test]
    fn intents_of_plans() {
        let waiting = record(MaintenancePhase::Pending, false);
        let wait = Record {
            why: Why::new(Cause::WaitingForSlot, false),
            ..waiting.clone()
        };
        let duplicate = Record {
            why: Why::new(Cause::DuplicateMaintenance, false),
            ..waiting.clone()
        };
        let cases: Vec<(&str, Plan, bool, Intent)> = vec![
            ("nothing", Plan::Nothing, false, Intent::Silent),
            (
                "finalizer",
                Plan::AddFinalizer { owner_refs: None },
                false,
                Intent::Silent,
            ),
            ("queued for a slot", Plan::Write(wait), true, Intent::Wait),
            (
                "duplicate never speaks for the node",
                Plan::Write(duplicate),
                false,
                Intent::Silent,
            ),
            (
                "first sight: the record says whether the node was taken",
                Plan::Maintain {
                    owner_refs: None,
                    deadline: crate::plan::Deadline::Unbounded,
                    first_sight: true,
                },
                true,
                Intent::Maintain,
            ),
            ("give back", Plan::GiveBack(waiting), false, Intent::End),
            (
                "cleanup of a taken node",
                Plan::Cleanup { give_back: true },
                false,
                Intent::End,
            ),
            (
                "cleanup of a queued one",
                Plan::Cleanup { give_back: false },
                true,
                Intent::End,
            ),
            (
                "cleanup of a failed one",
                Plan::Cleanup { give_back: false },
                false,
                Intent::Silent,
            ),
        ];
        for (name, plan, pending, want) in cases {
            assert_eq!(Intent::of(&plan, pending), want, "{name}");
        }
    }

    #[test]
    fn a_maintenance_sets_its_conditions_and_clears_them() {
        let mut node = vec![cond(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
            1,
        )];
        let mut seen = Vec::new();
        for (i, stage) in [
            Stage::Waiting,
            Stage::Draining,
            Stage::Drained,
            Stage::Ended,
        ]
        .into_iter()
        .enumerate()
        {
            let now = at(100 + i as i64);
            node = merged(&node, changes(&node, &wanted(stage, "nm-a"), &now));
            seen.push(says(&node));
            assert!(
                changes(&node, &wanted(stage, "nm-a"), &at(500)).is_empty(),
                "{stage:?} twice writes nothing"
            );
        }
        let s = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            let mut v: Vec<_> = pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            seen[0],
            s(&[("Ready", "True"), (MAINTENANCE_PLANNED, "True")])
        );
        assert_eq!(
            seen[1],
            s(&[
                ("Ready", "True"),
                (MAINTENANCE_PLANNED, "False"),
                (MAINTENANCE_IN_PROGRESS, "True"),
                (DRAIN_IN_PROGRESS, "True"),
                (DRAINED, "False")
            ]),
            "a taken node shows all four"
        );
        assert_eq!(
            seen[2],
            s(&[
                ("Ready", "True"),
                (MAINTENANCE_PLANNED, "False"),
                (MAINTENANCE_IN_PROGRESS, "True"),
                (DRAIN_IN_PROGRESS, "False"),
                (DRAINED, "True")
            ])
        );
        assert_eq!(
            seen[3],
            s(&[
                ("Ready", "True"),
                (MAINTENANCE_PLANNED, "False"),
                (MAINTENANCE_IN_PROGRESS, "False"),
                (DRAIN_IN_PROGRESS, "False"),
                (DRAINED, "False")
            ])
        );
        let ready = node.iter().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!(
            ready,
            &cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
                1
            )
        );
        let drained = node.iter().find(|c| c.type_ == DRAINED).expect("Drained");
        assert!(
            drained
                .message
                .as_deref()
                .is_some_and(|m| m.contains("nm-a")),
            "{drained:?}"
        );
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let node = vec![cond(
            DRAIN_IN_PROGRESS,
            "True",
            "NodeMaintenanceDraining",
            "old words",
            10,
        )];
        let c = changes(&node, &wanted(Stage::Draining, "nm-a"), &at(99));
        let drain = c
            .iter()
            .find(|c| c.type_ == DRAIN_IN_PROGRESS)
            .expect("rewritten: other words");
        assert_eq!(
            drain.last_transition_time,
            Some(at(10)),
            "still True: its transition stays"
        );
        assert_eq!(drain.last_heartbeat_time, Some(at(99)));
        let c = changes(&node, &wanted(Stage::Drained, "nm-a"), &at(120));
        let drain = c
            .iter()
            .find(|c| c.type_ == DRAIN_IN_PROGRESS)
            .expect("now False");
        assert_eq!(drain.last_transition_time, Some(at(120)));
    }

    #[test]
    fn someone_elses_condition_of_our_types_is_left_alone() {
        let theirs = cond(
            MAINTENANCE_PLANNED,
            "True",
            "FirmwareUpgrade",
            "planned by the fleet tool",
            5,
        );
        let node = vec![theirs.clone()];
        for stage in [Stage::Waiting, Stage::Draining, Stage::Ended] {
            let c = changes(&node, &wanted(stage, "nm-a"), &at(50));
            assert!(
                c.iter().all(|c| c.type_ != MAINTENANCE_PLANNED),
                "{stage:?}: {c:?}"
            );
        }
        let other_types = changes(&node, &wanted(Stage::Draining, "nm-a"), &at(50));
        assert!(
            other_types
                .iter()
                .all(|c| TYPES.contains(&c.type_.as_str()))
        );
        assert!(!is_ours(&theirs));
    }

    #[test]
    fn ended_turns_off_only_what_the_node_shows() {
        assert!(changes(&[], &wanted(Stage::Ended, "nm-a"), &at(1)).is_empty());
        let waited = merged(&[], changes(&[], &wanted(Stage::Waiting, "nm-a"), &at(1)));
        let ended = merged(
            &waited,
            changes(&waited, &wanted(Stage::Ended, "nm-a"), &at(2)),
        );
        assert_eq!(
            says(&ended),
            [(MAINTENANCE_PLANNED.to_string(), "False".to_string())]
        );
    }
}
