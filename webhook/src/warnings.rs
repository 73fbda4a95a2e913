//! Admission warnings: what an allowed NodeMaintenance create will do, told
//! to whoever creates it (kubectl prints each as "Warning: ..."). Also the
//! pre-flight check: `kubectl create --dry-run=server` gets the same lines.
//!
//! [`build`] is a pure function of plain facts (pods of the node, the
//! PodDisruptionBudgets of their namespaces, KubeVirt VMIs, the maintenance
//! slots, the fleet gates' verdict), so every case is unit-tested without a cluster; the facts come from
//! [`PodFacts::of`], [`PdbFacts::of`] and [`vmi_not_migratable`] over API
//! objects, gathered by `warning_lookups` within a time budget.
//! Warnings never deny and never delay a decision: they are computed only for
//! an allowed CREATE, after the decision.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
use shared::rules::drain::{DrainBehavior, PodDrain, Preview};
use shared::rules::gates::GateReason;

/// Warnings beyond this many are summed up in one "... and N more" line.
pub const MAX_WARNINGS: usize = 20;

/// The API server truncates warnings to 256 characters when many come
/// together: each line is clipped below that, on our terms.
const MAX_LINE_CHARS: usize = 250;

/// NodeMaintenances named in the "will wait" line; the rest are counted.
const MAX_NAMES: usize = 5;

/// Label of KubeVirt's virt-launcher pods (`kubevirt.io=virt-launcher`).
pub const KUBEVIRT_LABEL: &str = "kubevirt.io";
pub const VIRT_LAUNCHER: &str = "virt-launcher";
/// Label naming the VirtualMachineInstance a virt-launcher pod runs.
pub const VM_NAME_LABEL: &str = "vm.kubevirt.io/name";

/// What the warnings need to know about one pod of the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its controller is a DaemonSet: it stays on the node, as in the drain.
    pub daemonset: bool,
    /// The API mirror of a static pod: the drain leaves it.
    pub mirror: bool,
    /// Phase Succeeded or Failed: nothing left to lose.
    pub finished: bool,
    /// Some ownerReference has controller=true: it is recreated elsewhere.
    pub has_controller: bool,
    /// Names of its emptyDir volumes.
    pub empty_dirs: Vec<String>,
    /// A virt-launcher pod: the VirtualMachineInstance it runs.
    pub vmi: Option<String>,
    /// What the drain rules do with it (`shared::rules::drain`, the
    /// controller's decision); upstream's drain by default.
    pub drain: PodDrain,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> PodFacts {
        let meta = &pod.metadata;
        let labels = meta.labels.clone().unwrap_or_default();
        let owners = meta.owner_references.as_deref().unwrap_or_default();
        let controller = owners.iter().find(|o| o.controller == Some(true));
        let vmi = (labels.get(KUBEVIRT_LABEL).map(String::as_str) == Some(VIRT_LAUNCHER))
            .then(|| labels.get(VM_NAME_LABEL).cloned())
            .flatten();
        PodFacts {
            drain: PodDrain::default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            daemonset: controller.is_some_and(|o| o.kind == "DaemonSet"),
            mirror: meta
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror")),
            finished: pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed"),
            has_controller: controller.is_some(),
            empty_dirs: pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .map(|vs| {
                    vs.iter()
                        .filter(|v| v.empty_dir.is_some())
                        .map(|v| v.name.clone())
                        .collect()
                })
                .unwrap_or_default(),
            vmi,
            labels,
        }
    }

    /// Pods the drain removes: not DaemonSet-owned, not mirrors, not
    /// finished, not kept or waited for by a drain rule.
    fn evicted(&self) -> bool {
        self.leaves() && !self.finished && self.drain.behavior == DrainBehavior::Drain
    }

    /// Pods upstream's drain would take off the node (the drain rules then
    /// decide how): not DaemonSet-owned, not mirrors.
    fn leaves(&self) -> bool {
        !self.daemonset && !self.mirror
    }
}

/// What the warnings need to know about one PodDisruptionBudget.
#[derive(Debug, Clone)]
pub struct PdbFacts {
    pub namespace: String,
    pub name: String,
    /// `None`: absent, empty or unreadable selector, which selects nothing
    /// (as the Eviction API judges it).
    pub selector: Option<Selector>,
    pub disruptions_allowed: i32,
}

impl PdbFacts {
    pub fn of(pdb: &PodDisruptionBudget) -> PdbFacts {
        let selector = pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .filter(|ls| {
                ls.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                    || ls.match_expressions.as_ref().is_some_and(|m| !m.is_empty())
            })
            .and_then(|ls| Selector::try_from(ls).ok());
        PdbFacts {
            namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
            name: pdb.metadata.name.clone().unwrap_or_default(),
            selector,
            disruptions_allowed: pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed),
        }
    }

    fn blocks(&self, pod: &PodFacts) -> bool {
        self.disruptions_allowed <= 0
            && self.namespace == pod.namespace
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(&pod.labels))
    }
}

/// A VirtualMachineInstance that says it cannot live-migrate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotMigratable {
    pub reason: String,
    pub message: String,
}

/// Read the `LiveMigratable` condition of a VirtualMachineInstance (as JSON):
/// `Some` only when its status is "False".
pub fn vmi_not_migratable(vmi: &serde_json::Value) -> Option<NotMigratable> {
    let conditions = vmi.pointer("/status/conditions")?.as_array()?;
    let c = conditions
        .iter()
        .find(|c| c.get("type").and_then(|t| t.as_str()) == Some("LiveMigratable"))?;
    if c.get("status").and_then(|s| s.as_str()) != Some("False") {
        return None;
    }
    let text = |k: &str| {
        c.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Some(NotMigratable {
        reason: text("reason"),
        message: text("message"),
    })
}

/// Everything [`build`] looks at. Lookups that did not answer in time leave
/// their part empty and say so in `unchecked`.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub node: String,
    pub pods: Vec<PodFacts>,
    pub pdbs: Vec<PdbFacts>,
    /// VMIs known not to live-migrate, by (namespace, name).
    pub not_migratable: BTreeMap<(String, String), NotMigratable>,
    /// The NodeMaintenances ahead of this one when it will wait for a slot.
    pub slot_ahead: Option<Vec<String>>,
    /// The fleet gate it will wait for (`shared::rules::gates::may_start`),
    /// with the gate's message; on its own or besides a slot wait.
    pub gate: Option<(GateReason, String)>,
    /// `--exclude-from-load-balancers`: the wait before the first eviction,
    /// and whether the node carries the exclusion label already.
    pub shed_traffic: Option<(std::time::Duration, bool)>,
    /// What could not be checked, one line each.
    pub unchecked: Vec<String>,
}

/// The warnings, most consequential first: the wait for a slot, the wait
/// for a gate, pods a PDB blocks now, VMs that cannot live-migrate, pods deleted for good, emptyDir
/// data; then what could not be checked. At most [`MAX_WARNINGS`] lines plus
/// one "... and N more".
pub fn build(facts: &Facts) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(ahead) = &facts.slot_ahead {
        out.push(slot_line(ahead));
    }
    if let Some((reason, message)) = &facts.gate {
        out.push(gate_line(*reason, message));
    }
    if let Some((delay, labelled)) = facts.shed_traffic {
        out.push(shed_traffic_line(&facts.node, delay, labelled));
    }
    let ruled = facts.pods.iter().filter(|p| p.leaves());
    out.extend(drain_rule_lines(
        &facts.node,
        &shared::rules::drain::preview(ruled.map(|p| (p.name.as_str(), &p.drain, p.finished))),
        &facts.pods,
    ));
    let pods: Vec<&PodFacts> = facts.pods.iter().filter(|p| p.evicted()).collect();
    out.extend(pdb_lines(&pods, &facts.pdbs));
    out.extend(vmi_lines(&pods, &facts.not_migratable));
    for pod in pods.iter().filter(|p| !p.has_controller) {
        out.push(format!(
            "pod {}/{} has no controller: it will be deleted for good, not recreated elsewhere",
            pod.namespace, pod.name
        ));
    }
    // virt-launcher emptyDirs hold KubeVirt's runtime files, not data: the VM
    // line above covers those pods.
    for pod in pods
        .iter()
        .filter(|p| !p.empty_dirs.is_empty() && p.vmi.is_none())
    {
        out.push(format!(
            "pod {}/{} has emptyDir volume(s) {}: their data will be lost",
            pod.namespace,
            pod.name,
            pod.empty_dirs.join(", ")
        ));
    }
    out.extend(facts.unchecked.iter().cloned());
    cap(out.into_iter().map(|w| one_line(&w)).collect())
}

/// The VMs of virt-launcher pods that cannot live-migrate, one line each.
fn vmi_lines(
    pods: &[&PodFacts],
    not_migratable: &BTreeMap<(String, String), NotMigratable>,
) -> Vec<String> {
    let mut out = Vec::new();
    for pod in pods {
        let Some(vmi) = &pod.vmi else { continue };
        if let Some(nm) = not_migratable.get(&(pod.namespace.clone(), vmi.clone())) {
            let why = match (nm.reason.is_empty(), nm.message.is_empty()) {
                (true, true) => "no reason given".to_string(),
                (false, true) => nm.reason.clone(),
                (true, false) => nm.message.clone(),
                (false, false) => format!("{}: {}", nm.reason, nm.message),
            };
            // The VMI's own words last: a long message is what gets clipped.
            out.push(format!(
                "VirtualMachineInstance {}/{vmi} (pod {}) cannot live-migrate, so the drain \
                 stops it or waits for it (its evictionStrategy decides): {why}",
                pod.namespace, pod.name
            ));
        }
    }
    out
}

/// `--exclude-from-load-balancers`: the node leaves the load balancers
/// first, and the drain waits before its first eviction.
fn shed_traffic_line(node: &str, delay: std::time::Duration, labelled: bool) -> String {
    let label = shared::serve::drain_flags::EXCLUDE_FROM_LB_LABEL;
    let delay = shared::rules::duration::format(delay);
    if labelled {
        format!(
            "node {node} already carries label {label}: it is kept after the maintenance; the \
             first eviction waits {delay} (--load-balancer-drain-delay) only when the label goes \
             on with the maintenance"
        )
    } else {
        format!(
            "node {node} will be labelled {label} with its cordon (--exclude-from-load-balancers) \
             and the first eviction waits {delay} (--load-balancer-drain-delay)"
        )
    }
}

/// The pods a PodDisruptionBudget holds now, one line each.
fn pdb_lines(pods: &[&PodFacts], pdbs: &[PdbFacts]) -> Vec<String> {
    let mut out = Vec::new();
    for pod in pods {
        for pdb in pdbs.iter().filter(|b| b.blocks(pod)) {
            out.push(format!(
                "pod {}/{} is held by PodDisruptionBudget {}/{} (allowed disruptions {}): \
                 the drain waits until it allows one",
                pod.namespace, pod.name, pdb.namespace, pdb.name, pdb.disruptions_allowed
            ));
        }
    }
    out
}

/// What the drain rules will do on the node: pods kept, pods waited for,
/// the order groups, and labels or annotations ignored.
fn drain_rule_lines(node: &str, p: &Preview, pods: &[PodFacts]) -> Vec<String> {
    let ns_of = |name: &str| {
        pods.iter()
            .find(|f| f.name == name)
            .map_or(String::new(), |f| format!("{}/", f.namespace))
    };
    let named = |list: &[(String, shared::rules::drain::DecidedBy)]| {
        list.iter()
            .take(MAX_NAMES)
            .map(|(n, by)| format!("{}{n} ({by})", ns_of(n)))
            .collect::<Vec<_>>()
            .join(", ")
            + &if list.len() > MAX_NAMES {
                format!(" and {} more", list.len() - MAX_NAMES)
            } else {
                String::new()
            }
    };
    let mut out = Vec::new();
    if !p.kept.is_empty() {
        out.push(format!(
            "drain rules keep {} pod(s) on node {node} (behavior Skip, never evicted): {}",
            p.kept.len(),
            named(&p.kept)
        ));
    }
    if !p.waited.is_empty() {
        out.push(format!(
            "the drain waits for {} pod(s) on node {node} to complete, not evicting them \
             (behavior WaitCompleted; spec.drainTimeout still bounds it): {}",
            p.waited.len(),
            named(&p.waited)
        ));
    }
    if !p.groups.is_empty() {
        let groups: Vec<String> = (p.groups.iter())
            .map(|(g, n)| format!("group {g}: {n} pod(s)"))
            .collect();
        out.push(format!(
            "pods leave node {node} in order groups, each once the one before has left: {}",
            groups.join(", ")
        ));
    }
    for (name, why) in &p.ignored {
        out.push(format!("pod {}{name}: {why}", ns_of(name)));
    }
    out
}

/// "will wait: N maintenance(s) ahead (a, b, ...)": the slot holders and the
/// NodeMaintenances queued before this one that no gate holds (`shared::rules::slots::turn`).
pub fn slot_line(ahead: &[String]) -> String {
    let mut names = ahead
        .iter()
        .take(MAX_NAMES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if ahead.len() > MAX_NAMES {
        names.push_str(&format!(" and {} more", ahead.len() - MAX_NAMES));
    }
    format!(
        "will wait: {} maintenance(s) ahead ({names}); the limit is --max-concurrent-maintenances",
        ahead.len()
    )
}

/// "will not start yet (<reason>): <the gate's message>": the reason first,
/// as the `Queued` condition will name it, so clipping never loses it.
pub fn gate_line(reason: GateReason, message: &str) -> String {
    format!("will not start yet ({reason}): {message}")
}

fn cap(mut lines: Vec<String>) -> Vec<String> {
    if lines.len() > MAX_WARNINGS {
        let more = lines.len() - MAX_WARNINGS;
        lines.truncate(MAX_WARNINGS);
        lines.push(format!("... and {more} more"));
    }
    lines
}

/// One printable line (the API server drops warnings with control
/// characters), at most [`MAX_LINE_CHARS`] characters, clipped with "...".
fn one_line(s: &str) -> String {
    let clean = s.chars().map(|c| if c.is_control() { ' ' } else { c });
    if s.chars().count() <= MAX_LINE_CHARS {
        return clean.collect();
    }
    let mut out: String = clean.take(MAX_LINE_CHARS - 3).collect();
    out.push_str("...");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn pod(name: &str) -> PodFacts {
        PodFacts {
            namespace: "team-a".into(),
            name: name.into(),
            labels: [("app".to_string(), name.to_string())].into(),
            has_controller: true,
            ..Default::default()
        }
    }

    fn bare(name: &str) -> PodFacts {
        PodFacts {
            has_controller: false,
            ..pod(name)
        }
    }

    fn pdb(name: &str, app: &str, allowed: i32) -> PdbFacts {
        let ls = LabelSelector {
            match_labels: Some([("app".to_string(), app.to_string())].into()),
            ..Default::default()
        };
        PdbFacts {
            namespace: "team-a".into(),
            name: name.into(),
            selector: Selector::try_from(ls).ok(),
            disruptions_allowed: allowed,
        }
    }

    fn facts(pods: Vec<PodFacts>) -> Facts {
        Facts {
            node: "worker-1".into(),
            pods,
            ..Default::default()
        }
    }

    /// Messages as `shared::rules::gates::may_start` words them.
    const WINDOW: &str = "waits for the maintenance window: next window starts \
        2026-12-12T02:00:00+00:00[UTC] (--maintenance-window \"0 2 * * 6 4h UTC\")";
    const ZONE: &str = "waits for the zone budget: zone \"a\" has 1 of 1 maintenance(s) \
        running: nm-a (node n0) (--max-concurrent-per-zone=1, \
        --zone-label=topology.kubernetes.io/zone)";
    const UNAVAILABLE: &str = "waits for the unavailable-node budget: with node worker-1 that \
        makes 2 of 10 nodes unavailable, at most 1 may be (--max-unavailable=10%); \
        unavailable: n2 (NotReady); it starts when one of them is back";
    const PAUSED: &str = "waits: NodeMaintenance nm-x (node n3) failed; no maintenance starts \
        until it is deleted (--pause-after-failure)";
    const ALERTS: &str = "waits: the alerts could not be read from http://prometheus:9090: \
        connection refused; no maintenance starts until they can be (--block-on-alerts-url \
        fails closed)";

    /// A create with a bare pod that `reason` holds.
    fn gated(reason: GateReason, message: &str) -> Facts {
        Facts {
            gate: Some((reason, message.into())),
            ..facts(vec![bare("solo")])
        }
    }

    const HELD: &str = "pod team-a/web is held by PodDisruptionBudget team-a/web-pdb (allowed disruptions 0): the drain waits until it allows one";
    const BARE: &str =
        "pod team-a/solo has no controller: it will be deleted for good, not recreated elsewhere";

    struct Case {
        name: &'static str,
        facts: Facts,
        want: Vec<String>,
    }

    fn check(cases: Vec<Case>) {
        for c in cases {
            assert_eq!(build(&c.facts), c.want, "case: {}", c.name);
        }
    }

    #[test]
    fn table() {
        let mut ds = bare("agent");
        ds.daemonset = true;
        let mut mirror = bare("static");
        mirror.mirror = true;
        let mut done = bare("job");
        done.finished = true;
        let mut scratch = pod("cache");
        scratch.empty_dirs = vec!["scratch".into(), "tmp".into()];
        let mut vm = pod("virt-launcher-vm1-abcde");
        vm.vmi = Some("vm1".into());
        vm.empty_dirs = vec!["private".into()];
        let mut other_ns = pod("web");
        other_ns.namespace = "team-b".into();

        let cases = vec![
            Case {
                name: "nothing to say",
                facts: facts(vec![pod("web")]),
                want: vec![],
            },
            Case {
                name: "PDB with 0 allowed disruptions holds its pod",
                facts: Facts {
                    pdbs: vec![pdb("web-pdb", "web", 0), pdb("other", "db", 0)],
                    ..facts(vec![pod("web"), pod("api")])
                },
                want: vec![HELD.into()],
            },
            Case {
                name: "PDB that allows a disruption says nothing",
                facts: Facts {
                    pdbs: vec![pdb("web-pdb", "web", 1)],
                    ..facts(vec![pod("web")])
                },
                want: vec![],
            },
            Case {
                name: "a PDB only selects pods of its namespace",
                facts: Facts {
                    pdbs: vec![pdb("web-pdb", "web", 0)],
                    ..facts(vec![other_ns])
                },
                want: vec![],
            },
            Case {
                name: "a PDB without selector selects nothing",
                facts: Facts {
                    pdbs: vec![PdbFacts {
                        selector: None,
                        ..pdb("all", "web", 0)
                    }],
                    ..facts(vec![pod("web")])
                },
                want: vec![],
            },
            Case {
                name: "bare pod is deleted for good",
                facts: facts(vec![bare("solo")]),
                want: vec![BARE.into()],
            },
            Case {
                name: "DaemonSet, mirror and finished pods stay out",
                facts: Facts {
                    pdbs: vec![pdb("p", "agent", 0), pdb("q", "job", 0)],
                    ..facts(vec![ds, mirror, done])
                },
                want: vec![],
            },
            Case {
                name: "emptyDir volumes are named",
                facts: facts(vec![scratch]),
                want: vec![
                    "pod team-a/cache has emptyDir volume(s) scratch, tmp: their data will be lost"
                        .into(),
                ],
            },
            Case {
                name: "VMI that cannot live-migrate, reason and message",
                facts: Facts {
                    not_migratable: [(
                        ("team-a".to_string(), "vm1".to_string()),
                        NotMigratable {
                            reason: "DisksNotLiveMigratable".into(),
                            message: "PVC disk0 is not shared".into(),
                        },
                    )]
                    .into(),
                    ..facts(vec![vm.clone()])
                },
                want: vec![
                    "VirtualMachineInstance team-a/vm1 (pod virt-launcher-vm1-abcde) cannot \
                     live-migrate, so the drain stops it or waits for it (its evictionStrategy \
                     decides): DisksNotLiveMigratable: PVC disk0 is not shared"
                        .into(),
                ],
            },
            Case {
                name: "migratable VMI (or no VMI facts): its virt-launcher emptyDirs say nothing",
                facts: facts(vec![vm]),
                want: vec![],
            },
            Case {
                name: "slot taken, first line",
                facts: Facts {
                    slot_ahead: Some(vec!["nm-a".into(), "nm-b".into()]),
                    ..facts(vec![bare("solo")])
                },
                want: vec![
                    "will wait: 2 maintenance(s) ahead (nm-a, nm-b); the limit is \
                     --max-concurrent-maintenances"
                        .into(),
                    BARE.into(),
                ],
            },
            Case {
                name: "what could not be checked comes last",
                facts: Facts {
                    unchecked: vec!["pods on node worker-1 not checked: timeout".into()],
                    ..facts(vec![bare("solo")])
                },
                want: vec![
                    BARE.into(),
                    "pods on node worker-1 not checked: timeout".into(),
                ],
            },
        ];
        check(cases);
    }

    /// One line per create for the gate that holds it, named by the
    /// `Queued` reason, right after the slot line.
    #[test]
    fn gate_table() {
        let cases = vec![
            Case {
                name: "no gate holds it: no gate line",
                facts: Facts {
                    gate: None,
                    ..facts(vec![bare("solo")])
                },
                want: vec![BARE.into()],
            },
            Case {
                name: "gate OutsideWindow, before the pods",
                facts: gated(GateReason::OutsideWindow, WINDOW),
                want: vec![
                    format!("will not start yet (OutsideWindow): {WINDOW}"),
                    BARE.into(),
                ],
            },
            Case {
                name: "gate ZoneBudget",
                facts: gated(GateReason::ZoneBudget, ZONE),
                want: vec![
                    format!("will not start yet (ZoneBudget): {ZONE}"),
                    BARE.into(),
                ],
            },
            Case {
                name: "gate MaxUnavailable",
                facts: gated(GateReason::MaxUnavailable, UNAVAILABLE),
                want: vec![
                    format!("will not start yet (MaxUnavailable): {UNAVAILABLE}"),
                    BARE.into(),
                ],
            },
            Case {
                name: "gate PausedAfterFailure",
                facts: gated(GateReason::PausedAfterFailure, PAUSED),
                want: vec![
                    format!("will not start yet (PausedAfterFailure): {PAUSED}"),
                    BARE.into(),
                ],
            },
            Case {
                name: "gate AlertsFiring (alerts that could not be read block too)",
                facts: gated(GateReason::AlertsFiring, ALERTS),
                want: vec![
                    format!("will not start yet (AlertsFiring): {ALERTS}"),
                    BARE.into(),
                ],
            },
            Case {
                name: "waits for a slot and a gate: both, the slot first",
                facts: Facts {
                    slot_ahead: Some(vec!["nm-a".into()]),
                    ..gated(GateReason::OutsideWindow, WINDOW)
                },
                want: vec![
                    "will wait: 1 maintenance(s) ahead (nm-a); the limit is \
                     --max-concurrent-maintenances"
                        .into(),
                    format!("will not start yet (OutsideWindow): {WINDOW}"),
                    BARE.into(),
                ],
            },
        ];
        check(cases);
    }

    #[test]
    fn capped_with_a_count_of_the_rest() {
        let pods = (0..25).map(|i| bare(&format!("p{i:02}"))).collect();
        let w = build(&facts(pods));
        assert_eq!(w.len(), MAX_WARNINGS + 1);
        assert!(w[0].starts_with("pod team-a/p00 "), "{w:?}");
        assert_eq!(w[MAX_WARNINGS], "... and 5 more");
    }

    #[test]
    fn lines_are_printable_and_short() {
        let l = one_line(&format!("a\nb\t{}", "x".repeat(500)));
        assert!(l.starts_with("a b "), "{l}");
        assert_eq!(l.chars().count(), MAX_LINE_CHARS);
        assert!(l.ends_with("..."));
        assert_eq!(one_line("short"), "short");
    }

    #[test]
    fn a_long_gate_line_keeps_its_reason() {
        let long = format!(
            "waits for the unavailable-node budget: {}",
            "n, ".repeat(200)
        );
        let w = build(&Facts {
            gate: Some((GateReason::MaxUnavailable, long)),
            ..facts(vec![])
        });
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("will not start yet (MaxUnavailable): waits for the unavailable-node"),
            "{w:?}"
        );
        assert_eq!(w[0].chars().count(), MAX_LINE_CHARS);
    }

    #[test]
    fn slot_line_names_five_and_counts_the_rest() {
        let names: Vec<String> = (1..=7).map(|i| format!("nm-{i}")).collect();
        assert_eq!(
            slot_line(&names[..1]),
            "will wait: 1 maintenance(s) ahead (nm-1); the limit is --max-concurrent-maintenances"
        );
        assert_eq!(
            slot_line(&names),
            "will wait: 7 maintenance(s) ahead (nm-1, nm-2, nm-3, nm-4, nm-5 and 2 more); the \
             limit is --max-concurrent-maintenances"
        );
    }

    #[test]
    fn facts_from_objects() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "virt-launcher-vm1-x", "namespace": "ns",
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"},
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": "vm1", "uid": "u", "controller": true}]},
            "spec": {"containers": [], "volumes": [{"name": "private", "emptyDir": {}},
                                                   {"name": "cfg", "configMap": {"name": "c"}}]},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        let f = PodFacts::of(&p);
        assert_eq!(f.vmi.as_deref(), Some("vm1"));
        assert!(f.has_controller && !f.daemonset && !f.mirror && !f.finished);
        assert_eq!(f.empty_dirs, vec!["private".to_string()]);

        let b: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"selector": {}},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1,
                       "expectedPods": 1}
        }))
        .expect("pdb");
        assert!(
            PdbFacts::of(&b).selector.is_none(),
            "empty selector: nothing"
        );

        let vmi = serde_json::json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable",
             "message": "cannot migrate"}]}});
        assert_eq!(
            vmi_not_migratable(&vmi),
            Some(NotMigratable {
                reason: "DisksNotLiveMigratable".into(),
                message: "cannot migrate".into()
            })
        );
        let ok = serde_json::json!({"status": {"conditions": [
            {"type": "LiveMigratable", "status": "True"}]}});
        assert_eq!(vmi_not_migratable(&ok), None);
        assert_eq!(vmi_not_migratable(&serde_json::json!({})), None);
    }

    #[test]
    fn shedding_traffic_first_is_said_once() {
        let delay = std::time::Duration::from_secs(30);
        let line = |labelled| {
            build(&Facts {
                node: "w1".into(),
                shed_traffic: Some((delay, labelled)),
                ..Default::default()
            })
        };
        assert_eq!(
            line(false),
            [
                "node w1 will be labelled node.kubernetes.io/exclude-from-external-load-balancers \
              with its cordon (--exclude-from-load-balancers) and the first eviction waits 30s \
              (--load-balancer-drain-delay)"
            ]
        );
        assert!(
            line(true)[0].contains("already carries label"),
            "{:?}",
            line(true)
        );
        assert!(build(&Facts::default()).is_empty(), "off: no line");
    }
}
