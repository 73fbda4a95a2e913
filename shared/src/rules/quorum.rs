//! The etcd quorum rule for OpenShift control-plane nodes.
//!
//! OpenShift guards etcd with a PodDisruptionBudget over "guard" pods, one per
//! control-plane node. A node may enter maintenance only when losing it leaves
//! etcd with quorum.

/// What the rule needs to know about the guard PDBs in `openshift-etcd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardPdb {
    pub name: String,
    pub disruptions_allowed: i32,
}

/// Readiness of the guard pod found on the node, by its Ready condition.
///
/// As upstream (medik8s/common `etcd.IsEtcdDisruptionAllowed`), only a Ready
/// condition that says False marks the node as already disrupted; a guard pod
/// without a Ready condition (not yet reported by its kubelet) is taken as
/// healthy, so its node is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardPodReadiness {
    /// Ready condition True.
    Ready,
    /// Ready condition Unknown (or missing): treated as healthy.
    Unknown,
    /// Ready condition False: the node is already disrupted.
    NotReady,
}

/// Why the rule decided as it did (for logs and metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuorumVerdict {
    /// Allowed: the PDB still allows a disruption.
    DisruptionsAllowed,
    /// Allowed: the node's guard pod is not ready, so etcd there is already down.
    AlreadyDisrupted,
    /// Allowed: no guard pod runs on the node.
    NoGuardPod,
    /// Denied: no guard PDB at all, cannot judge.
    NoPdb,
    /// Denied: several guard PDBs, cannot judge.
    SeveralPdbs(usize),
    /// Denied: the node's etcd member is healthy and no disruption is allowed.
    WouldViolateQuorum,
}

impl QuorumVerdict {
    pub fn allowed(&self) -> bool {
        matches!(
            self,
            QuorumVerdict::DisruptionsAllowed
                | QuorumVerdict::AlreadyDisrupted
                | QuorumVerdict::NoGuardPod
        )
    }
}

/// Apply the rule. `guard_pod` is the guard pod (selected by the PDB) on the
/// node being maintained; only consulted when the PDB allows no disruption.
pub fn allows_disruption(pdbs: &[GuardPdb], guard_pod: Option<GuardPodReadiness>) -> QuorumVerdict {
    let pdb = match pdbs {
        [] => return QuorumVerdict::NoPdb,
        [one] => one,
        several => return QuorumVerdict::SeveralPdbs(several.len()),
    };
    if pdb.disruptions_allowed >= 1 {
        return QuorumVerdict::DisruptionsAllowed;
    }
    match guard_pod {
        None => QuorumVerdict::NoGuardPod,
        Some(GuardPodReadiness::NotReady) => QuorumVerdict::AlreadyDisrupted,
        Some(GuardPodReadiness::Ready | GuardPodReadiness::Unknown) => {
            QuorumVerdict::WouldViolateQuorum
        }
    }
}

/// Readiness from a pod's Ready condition status string ("True"/"False"/"Unknown").
pub fn readiness_from_condition(status: Option<&str>) -> GuardPodReadiness {
    match status {
        Some("True") => GuardPodReadiness::Ready,
        Some("False") => GuardPodReadiness::NotReady,
        _ => GuardPodReadiness::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(allowed: i32) -> GuardPdb {
        GuardPdb {
            name: "etcd-guard-pdb".into(),
            disruptions_allowed: allowed,
        }
    }

    #[test]
    fn no_pdb_denies() {
        let v = allows_disruption(&[], Some(GuardPodReadiness::NotReady));
        assert_eq!(v, QuorumVerdict::NoPdb);
        assert!(!v.allowed());
    }

    #[test]
    fn two_pdbs_deny() {
        let v = allows_disruption(&[pdb(1), pdb(1)], None);
        assert_eq!(v, QuorumVerdict::SeveralPdbs(2));
        assert!(!v.allowed());
    }

    #[test]
    fn disruptions_allowed_allows_even_with_ready_guard() {
        let v = allows_disruption(&[pdb(1)], Some(GuardPodReadiness::Ready));
        assert_eq!(v, QuorumVerdict::DisruptionsAllowed);
        assert!(v.allowed());
    }

    #[test]
    fn ready_or_unknown_guard_denies_when_no_disruption_left() {
        for r in [GuardPodReadiness::Ready, GuardPodReadiness::Unknown] {
            let v = allows_disruption(&[pdb(0)], Some(r));
            assert_eq!(v, QuorumVerdict::WouldViolateQuorum, "{r:?}");
            assert!(!v.allowed());
        }
    }

    #[test]
    fn not_ready_guard_allows() {
        let v = allows_disruption(&[pdb(0)], Some(GuardPodReadiness::NotReady));
        assert_eq!(v, QuorumVerdict::AlreadyDisrupted);
        assert!(v.allowed());
    }

    #[test]
    fn absent_guard_allows() {
        let v = allows_disruption(&[pdb(0)], None);
        assert_eq!(v, QuorumVerdict::NoGuardPod);
        assert!(v.allowed());
    }

    #[test]
    fn guard_pod_without_ready_condition_denies_as_upstream() {
        // Upstream allows only on Ready=False; no condition at all falls
        // through to "node not disrupted".
        let v = allows_disruption(&[pdb(0)], Some(readiness_from_condition(None)));
        assert_eq!(v, QuorumVerdict::WouldViolateQuorum);
        assert!(!v.allowed());
    }

    #[test]
    fn condition_mapping() {
        assert_eq!(
            readiness_from_condition(Some("True")),
            GuardPodReadiness::Ready
        );
        assert_eq!(
            readiness_from_condition(Some("False")),
            GuardPodReadiness::NotReady
        );
        assert_eq!(
            readiness_from_condition(Some("Unknown")),
            GuardPodReadiness::Unknown
        );
        assert_eq!(readiness_from_condition(None), GuardPodReadiness::Unknown);
    }
}
