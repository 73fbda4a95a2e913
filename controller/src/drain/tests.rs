//! Unit tests of the drain's words and answers.
use super::evict::{Refusal, refusal};
use super::kubevirt::Migrations;
use super::outcome::human;
use super::*;
use k8s_openapi::api::core::v1::Pod;
use std::time::Instant;

fn blocker_summary(node: &str, o: &BTreeMap<PodReference, PodOutcome>) -> Option<String> {
    outcome::blocker_summary(node, o, DEFAULT_MIGRATION_WARNING_AFTER)
}

fn r(n: &str) -> PodReference {
    PodReference {
        namespace: "shop".into(),
        name: n.into(),
    }
}

#[test]
fn a_pod_stuck_terminating_is_a_blocker_naming_its_finalizers() {
    let mut o = BTreeMap::new();
    o.insert(r("a"), PodOutcome::Terminating(5));
    o.insert(
        r("b"),
        PodOutcome::Stuck {
            finalizers: vec!["example.com/backup".into()],
        },
    );
    let text = outcome::blocker_summary("n1", &o, Duration::from_secs(600)).expect("a blocker");
    assert!(
        text.contains("shop/b: still there long after its grace period ended, held by finalizers example.com/backup"),
        "{text}"
    );
    assert!(
        !text.contains("shop/a"),
        "terminating in time is no blocker: {text}"
    );
}

#[test]
fn summary_names_blocked_pods_only() {
    let mut o = BTreeMap::new();
    o.insert(r("a"), PodOutcome::Evicted);
    o.insert(r("b"), PodOutcome::Blocked("Cannot evict pod".into()));
    o.insert(r("c"), PodOutcome::Terminating(3));
    let s = blocker_summary("w1", &o).expect("blocked");
    assert!(s.contains("node w1, 1 blocked"), "{s}");
    assert!(
        s.contains("shop/b: eviction blocked by a PodDisruptionBudget"),
        "{s}"
    );
    assert!(!s.contains("shop/a"), "{s}");
}

#[test]
fn no_summary_when_only_terminating() {
    let mut o = BTreeMap::new();
    o.insert(r("a"), PodOutcome::Evicted);
    o.insert(r("c"), PodOutcome::Terminating(1));
    assert_eq!(blocker_summary("w1", &o), None);
}

fn status_429(message: &str, causes: &[&str]) -> kube::Error {
    let causes: Vec<_> = causes
        .iter()
        .map(|m| serde_json::json!({"reason": "DisruptionBudget", "message": m}))
        .collect();
    let s: kube::core::Status = serde_json::from_value(serde_json::json!({
        "status": "Failure", "code": 429, "message": message, "reason": "TooManyRequests",
        "details": {"causes": causes}
    }))
    .expect("Status JSON");
    kube::Error::Api(Box::new(s))
}

/// KubeVirt's two answers (virt-api pod-eviction-admitter), as the API
/// server relays them.
const KUBEVIRT_FIRST: &str = "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" \
    denied the request: Eviction triggered evacuation of VMI \"shop/vm1\"";
const KUBEVIRT_AGAIN: &str = "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" \
    denied the request: Evacuation in progress: Eviction triggered evacuation of VMI \"shop/vm1\"";
const PDB: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

#[test]
fn kubevirt_429_is_a_migration() {
    for launcher in [true, false] {
        for m in [KUBEVIRT_FIRST, KUBEVIRT_AGAIN] {
            assert_eq!(
                refusal(&status_429(m, &[]), launcher),
                Refusal::Evacuation(m.to_string()),
                "launcher {launcher}: {m}"
            );
        }
    }
    // KubeVirt's other answers count only for a virt-launcher pod.
    let target = "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" \
        denied the request: Eviction request for target Pod";
    let kubevirt_pdb = "The disruption budget kubevirt-disruption-budget-x7k2p needs 1 healthy pods and has 1 currently";
    assert!(matches!(
        refusal(&status_429(target, &[]), true),
        Refusal::Evacuation(_)
    ));
    assert!(matches!(
        refusal(&status_429(target, &[]), false),
        Refusal::NotNow(_)
    ));
    assert!(matches!(
        refusal(&status_429(PDB, &[kubevirt_pdb]), true),
        Refusal::Evacuation(m) if m.contains(kubevirt_pdb)
    ));
    assert!(matches!(
        refusal(&status_429(PDB, &[kubevirt_pdb]), false),
        Refusal::Budget(_)
    ));
    assert!(matches!(
        refusal(&status_429("Evacuation in progress", &[]), false),
        Refusal::NotNow(_)
    ));
}

/// Issue 22: a 429 of a webhook on pods/eviction (or throttling) was
/// worded as a PodDisruptionBudget. Only the API server's PDB check puts
/// a DisruptionBudget cause on its 429.
#[test]
fn only_a_disruption_budget_cause_is_worded_as_a_budget() {
    let webhook = "admission webhook \"freeze.example.com\" denied the request: change freeze";
    let outcome = match refusal(&status_429(webhook, &[]), false) {
        Refusal::NotNow(m) => PodOutcome::NotNow(m),
        other => panic!("a webhook's 429 is no budget: {other:?}"),
    };
    let text = outcome.describe();
    assert!(!text.contains("by a PodDisruptionBudget:"), "{text}");
    assert!(
        text.contains("not by a PodDisruptionBudget") && text.contains(webhook),
        "{text}"
    );
    assert!(
        outcome.problem(Duration::from_secs(60)).is_some(),
        "still a blocker"
    );
    assert_eq!(outcome_label(&outcome), "blocked");
    let throttled = "the server has received too many requests and has asked us to try again later";
    assert!(matches!(
        refusal(&status_429(throttled, &[]), false),
        Refusal::NotNow(_)
    ));
}

#[test]
fn other_refusals_as_before() {
    let users_pdb = "The disruption budget web needs 2 healthy pods and has 2 currently";
    for launcher in [true, false] {
        assert_eq!(
            refusal(&status_429(PDB, &[users_pdb]), launcher),
            Refusal::Budget(format!("{PDB} ({users_pdb})")),
            "a PDB of the user's holds even a VM's pod"
        );
        assert!(matches!(
            refusal(
                &status_429(
                    "admission webhook \"x.example.com\" denied the request: later",
                    &[]
                ),
                launcher
            ),
            Refusal::NotNow(_)
        ));
    }
    let forbidden: kube::core::Status = serde_json::from_value(serde_json::json!({
        "status": "Failure", "code": 403, "reason": "Forbidden",
        "message": "Eviction triggered evacuation of VMI \"shop/vm1\"",
    }))
    .expect("Status JSON");
    assert!(matches!(
        refusal(&kube::Error::Api(Box::new(forbidden)), true),
        Refusal::Failed(_)
    ));
}

fn migrating_for(since_secs: u64) -> PodOutcome {
    PodOutcome::Migrating {
        since_secs,
        message: KUBEVIRT_AGAIN.into(),
    }
}

#[test]
fn migration_is_no_blocker_until_it_runs_too_long() {
    let ten_min = Duration::from_secs(600);
    let mut o = BTreeMap::new();
    o.insert(r("virt-launcher-vm1-x"), migrating_for(599));
    o.insert(r("web"), PodOutcome::Evicted);
    assert_eq!(outcome::blocker_summary("w1", &o, ten_min), None);
    assert_eq!(migrating(&o), vec![r("virt-launcher-vm1-x")]);

    o.insert(r("virt-launcher-vm1-x"), migrating_for(12 * 60 + 5));
    let s = outcome::blocker_summary("w1", &o, ten_min).expect("overdue");
    assert!(
        s.contains(
            "node w1, 1 blocked: shop/virt-launcher-vm1-x: VM live migration running for 12m, \
             longer than --migration-warning-after (10m)"
        ),
        "{s}"
    );
    assert!(s.contains("Evacuation in progress"), "{s}");

    // A real blocker next to a young migration: only the blocker is named.
    o.insert(r("virt-launcher-vm1-x"), migrating_for(5));
    o.insert(r("db"), PodOutcome::Blocked("Cannot evict pod".into()));
    let s = outcome::blocker_summary("w1", &o, ten_min).expect("blocked");
    assert!(s.contains("1 blocked: shop/db:"), "{s}");
    assert!(!s.contains("virt-launcher"), "{s}");
}

#[test]
fn outcome_labels() {
    let labels: Vec<_> = [
        PodOutcome::Evicted,
        PodOutcome::Gone,
        PodOutcome::Terminating(1),
        PodOutcome::Blocked("pdb".into()),
        migrating_for(1),
        PodOutcome::Failed("x".into()),
    ]
    .iter()
    .map(outcome_label)
    .collect();
    assert_eq!(
        labels,
        [
            "evicted",
            "gone",
            "terminating",
            "blocked",
            "migrating",
            "failed"
        ]
    );
}

#[test]
fn migrations_remember_the_first_answer() {
    let m = Migrations::default();
    let t0 = Instant::now();
    assert_eq!(m.observe("u1", t0), Duration::ZERO);
    let later = t0 + Duration::from_secs(90);
    assert_eq!(m.observe("u1", later), Duration::from_secs(90));
    assert_eq!(m.observe("u2", later), Duration::ZERO);
    m.forget("u1");
    assert_eq!(m.observe("u1", later), Duration::ZERO, "a new migration");
    // Pods nobody asks about any more (gone) are dropped.
    let much_later = later + Migrations::STALE + Duration::from_secs(1);
    assert_eq!(m.observe("u3", much_later), Duration::ZERO);
    assert_eq!(m.len(), 1);
}

#[test]
fn ages_read_as_people_write_them() {
    let h = |s| human(Duration::from_secs(s));
    assert_eq!(
        [h(0), h(45), h(60), h(12 * 60 + 59), h(3600), h(3900)],
        ["0s", "45s", "1m", "12m", "1h", "1h5m"]
    );
}

#[test]
fn virt_launcher_by_label() {
    let pod = |labels: serde_json::Value| -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "labels": labels}}))
            .expect("pod")
    };
    assert!(is_virt_launcher(
        &pod(serde_json::json!({"kubevirt.io": "virt-launcher"})).metadata
    ));
    assert!(!is_virt_launcher(
        &pod(serde_json::json!({"kubevirt.io": "hotplug-disk"})).metadata
    ));
    assert!(!is_virt_launcher(&pod(serde_json::json!({})).metadata));
}

#[test]
fn summary_is_bounded() {
    let o: BTreeMap<_, _> = (0..9)
        .map(|i| (r(&format!("p{i}")), PodOutcome::Failed("denied".into())))
        .collect();
    let s = blocker_summary("w1", &o).expect("blocked");
    assert!(s.contains("9 blocked"), "{s}");
    assert!(s.contains("and 4 more"), "{s}");
}
