//! Turns the cached `openshift-etcd` PodDisruptionBudgets and pods into the
//! inputs of `shared::rules::quorum::allows_disruption`. Pure functions over objects,
//! so the derivation is tested without a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::{Selector, SelectorExt};
use shared::rules::quorum::{GuardPdb, GuardPodReadiness, readiness_from_condition};

/// A PDB whose selector cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "PodDisruptionBudget {namespace}/{name} has a selector this webhook cannot evaluate: {reason}"
)]
pub struct SelectorError {
    pub namespace: String,
    pub name: String,
    pub reason: String,
}

/// The guard PDBs as the quorum rule sees them. Like upstream, every PDB in the
/// namespace counts, whatever its name: more than one means the rule cannot judge.
pub fn guard_pdbs<'a>(pdbs: impl IntoIterator<Item = &'a PodDisruptionBudget>) -> Vec<GuardPdb> {
    pdbs.into_iter()
        .map(|pdb| GuardPdb {
            name: pdb.metadata.name.clone().unwrap_or_default(),
            disruptions_allowed: pdb.status.as_ref().map_or(0, |s| s.disruptions_allowed),
        })
        .collect()
}

/// Readiness of the guard pod the PDB selects on `node`, if there is one.
///
/// The PDB's selector is applied to the pods of `openshift-etcd` as upstream
/// does: a PDB without a selector selects every pod there (upstream turns the
/// absent selector into an empty label set, which matches everything).
///
/// Should several selected pods run on the node (a rollout in progress), the
/// healthiest one counts: a node is only "already disrupted" when none of its
/// guard pods is ready, which errs on the side of protecting quorum.
pub fn guard_pod_readiness<'a>(
    pdb: &PodDisruptionBudget,
    pods: impl IntoIterator<Item = &'a Pod>,
    node: &str,
) -> Result<Option<GuardPodReadiness>, SelectorError> {
    let selector = pdb_selector(pdb)?;
    let no_labels = BTreeMap::new();
    Ok(pods
        .into_iter()
        .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|pod| selector.matches(pod.metadata.labels.as_ref().unwrap_or(&no_labels)))
        .map(pod_readiness)
        .max_by_key(|r| health_rank(*r)))
}

fn pdb_selector(pdb: &PodDisruptionBudget) -> Result<Selector, SelectorError> {
    // Absent or empty ({}): every pod in the namespace.
    let ls = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    Selector::try_from(ls).map_err(|e| SelectorError {
        namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
        name: pdb.metadata.name.clone().unwrap_or_default(),
        reason: e.to_string(),
    })
}

fn pod_readiness(pod: &Pod) -> GuardPodReadiness {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    readiness_from_condition(ready)
}

fn health_rank(r: GuardPodReadiness) -> u8 {
    match r {
        GuardPodReadiness::NotReady => 0,
        GuardPodReadiness::Unknown => 1,
        GuardPodReadiness::Ready => 2,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector, LabelSelectorRequirement, ObjectMeta,
    };

    pub fn mk_pdb(
        name: &str,
        allowed: i32,
        selector: Option<LabelSelector>,
    ) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("openshift-etcd".into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector,
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: allowed,
                ..Default::default()
            }),
        }
    }

    pub fn guard_selector() -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some([("app".to_string(), "guard".to_string())].into()),
            match_expressions: None,
        })
    }

    /// A pod on `node` with labels `app=<app>` and the given Ready status (None: no condition).
    pub fn mk_pod(name: &str, app: &str, node: &str, ready: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("openshift-etcd".into()),
                labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: ready.map(|s| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn pdbs_map_to_rule_input() {
        let p = [mk_pdb("etcd-guard-pdb", 1, None), mk_pdb("other", 0, None)];
        let g = guard_pdbs(&p);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].name, "etcd-guard-pdb");
        assert_eq!(g[0].disruptions_allowed, 1);
        let mut no_status = mk_pdb("x", 5, None);
        no_status.status = None;
        assert_eq!(
            guard_pdbs([&no_status])[0].disruptions_allowed,
            0,
            "no status: nothing allowed"
        );
    }

    #[test]
    fn finds_the_guard_pod_on_the_node() {
        let pdb = mk_pdb("etcd-guard-pdb", 0, guard_selector());
        let pods = [
            mk_pod("guard-cp-1", "guard", "cp-1", Some("True")),
            mk_pod("guard-cp-2", "guard", "cp-2", Some("False")),
            mk_pod("etcd-cp-3", "etcd", "cp-3", Some("True")),
        ];
        let r = |node| guard_pod_readiness(&pdb, &pods, node).expect("selector ok");
        assert_eq!(r("cp-1"), Some(GuardPodReadiness::Ready));
        assert_eq!(r("cp-2"), Some(GuardPodReadiness::NotReady));
        assert_eq!(r("cp-3"), None, "pod not selected by the PDB");
        assert_eq!(r("worker-1"), None, "no pod on the node");
    }

    #[test]
    fn missing_ready_condition_is_unknown() {
        let pdb = mk_pdb("etcd-guard-pdb", 0, guard_selector());
        let pods = [
            mk_pod("a", "guard", "cp-1", None),
            mk_pod("b", "guard", "cp-2", Some("Unknown")),
        ];
        assert_eq!(
            guard_pod_readiness(&pdb, &pods, "cp-1").expect("ok"),
            Some(GuardPodReadiness::Unknown)
        );
        assert_eq!(
            guard_pod_readiness(&pdb, &pods, "cp-2").expect("ok"),
            Some(GuardPodReadiness::Unknown)
        );
    }

    #[test]
    fn healthiest_guard_pod_wins() {
        let pdb = mk_pdb("etcd-guard-pdb", 0, guard_selector());
        let pods = [
            mk_pod("old", "guard", "cp-1", Some("False")),
            mk_pod("new", "guard", "cp-1", Some("True")),
        ];
        assert_eq!(
            guard_pod_readiness(&pdb, &pods, "cp-1").expect("ok"),
            Some(GuardPodReadiness::Ready)
        );
    }

    #[test]
    fn absent_or_empty_selector_selects_every_pod() {
        // Upstream: an absent selector becomes an empty label set, which
        // selects every pod of openshift-etcd; the pod on the node decides.
        for (case, selector) in [("absent", None), ("empty", Some(LabelSelector::default()))] {
            let pdb = mk_pdb("p", 0, selector);
            let pods = [
                mk_pod("a", "anything", "cp-1", Some("True")),
                mk_pod("b", "other", "cp-2", Some("False")),
            ];
            let r = |node| guard_pod_readiness(&pdb, &pods, node).expect("ok");
            assert_eq!(r("cp-1"), Some(GuardPodReadiness::Ready), "{case}");
            assert_eq!(r("cp-2"), Some(GuardPodReadiness::NotReady), "{case}");
            assert_eq!(r("cp-3"), None, "{case}: no pod on the node");
        }
    }

    #[test]
    fn absent_selector_with_a_healthy_pod_on_the_node_denies() {
        // Before the fix an absent selector selected nothing: "no guard pod",
        // and a control-plane node with a healthy etcd was let go.
        let pdb = mk_pdb("etcd-guard-pdb", 0, None);
        let pods = [mk_pod("etcd-guard-cp-1", "guard", "cp-1", Some("True"))];
        let guard = guard_pod_readiness(&pdb, &pods, "cp-1").expect("ok");
        let verdict = shared::rules::quorum::allows_disruption(&guard_pdbs([&pdb]), guard);
        assert_eq!(
            verdict,
            shared::rules::quorum::QuorumVerdict::WouldViolateQuorum
        );
    }

    #[test]
    fn match_expressions_are_honoured_and_bad_ones_reported() {
        let sel = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "In".into(),
                values: Some(vec!["guard".into()]),
            }]),
        };
        let pdb = mk_pdb("p", 0, Some(sel));
        let pods = [mk_pod("a", "guard", "cp-1", Some("False"))];
        assert_eq!(
            guard_pod_readiness(&pdb, &pods, "cp-1").expect("ok"),
            Some(GuardPodReadiness::NotReady)
        );
        let bad = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "Sideways".into(),
                values: None,
            }]),
        };
        let err =
            guard_pod_readiness(&mk_pdb("p", 0, Some(bad)), &pods, "cp-1").expect_err("bad op");
        assert!(err.to_string().contains("openshift-etcd/p"), "{err}");
    }
}
