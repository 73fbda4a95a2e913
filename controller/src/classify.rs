//! Which pods a drain removes, and the progress maths, as pure functions.
//!
//! Upstream drives kubectl's drain with force, delete-emptydir-data and
//! ignore-all-daemonsets. kubectl's filters then amount to:
//! - a mirror (static) pod stays: the kubelet owns it;
//! - a pod whose controller is a DaemonSet stays while that DaemonSet exists
//!   and the pod still runs: the DaemonSet would put it straight back. kubectl
//!   looks the DaemonSet up by the pod's namespace and the name in its
//!   controller reference (the kind is all it checks, not the API version or
//!   the uid);
//! - a finished DaemonSet pod (phase Succeeded or Failed) leaves, and so does
//!   an orphaned one (its DaemonSet is not found), which `--force` allows;
//! - every other pod, with or without a controller, with or without emptyDir,
//!   finished or not, leaves.
//!
//! Every pod that leaves goes through the Eviction API, as kubectl does when
//! the server offers it: for a finished pod the API server deletes it without
//! consulting PodDisruptionBudgets, for the others it honours them.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// Annotation the kubelet puts on the API mirror of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    /// Stays on the node: a static pod's mirror cannot be evicted.
    SkipMirror,
    /// Stays on the node: its DaemonSet exists and would put it straight back.
    SkipDaemonSet,
    /// Must leave: ask the Eviction API.
    Evict,
    /// Must leave and is already terminating: wait for it to go.
    AwaitTermination,
}

impl PodAction {
    /// Pods the maintenance waits for (counted in `evictionPods` and `pendingPods`).
    pub fn must_leave(self) -> bool {
        matches!(self, PodAction::Evict | PodAction::AwaitTermination)
    }
}

fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// Phase Succeeded or Failed: the pod's containers will not run again.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The name of the DaemonSet (in the pod's namespace) whose existence decides
/// whether `pod` stays: set for a pod that is no mirror, is controlled by a
/// DaemonSet and has not finished. None: `classify` needs no lookup.
pub fn daemonset_to_look_up(pod: &Pod) -> Option<&str> {
    if is_mirror(pod) || is_finished(pod) {
        return None;
    }
    controller_of(pod)
        .filter(|r| r.kind == "DaemonSet")
        .map(|r| r.name.as_str())
}

/// What the drain does with `pod`. `daemonset_exists` answers for the
/// DaemonSet named by [`daemonset_to_look_up`] (called only for such pods).
pub fn classify(pod: &Pod, daemonset_exists: impl FnOnce(&str) -> bool) -> PodAction {
    if is_mirror(pod) {
        return PodAction::SkipMirror;
    }
    if daemonset_to_look_up(pod).is_some_and(daemonset_exists) {
        return PodAction::SkipDaemonSet;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return PodAction::AwaitTermination;
    }
    PodAction::Evict
}

/// `drainProgress` as upstream computes it: the share of the pods that had to
/// leave which are gone, in whole percent, clamped to 0..=100 (pods that
/// appear on a cordoned node later must not make it negative). In i128:
/// `evictionPods` is any i64 a user with `/status` access writes, and
/// `(evictionPods - pending) * 100` overflows i64 past `i64::MAX / 100`.
pub fn drain_progress(eviction_pods: i64, pending: i64) -> i64 {
    if eviction_pods <= 0 {
        return if pending == 0 { 100 } else { 0 };
    }
    let (evictions, pending) = (i128::from(eviction_pods), i128::from(pending));
    let percent = ((evictions - pending) * 100 / evictions).clamp(0, 100);
    i64::try_from(percent).unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    pub fn mk_pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some("ns".to_string());
        p
    }

    fn owned_by(mut p: Pod, kind: &str, name: &str, controller: bool) -> Pod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller: Some(controller),
            ..Default::default()
        }]);
        p
    }

    fn phase(mut p: Pod, phase: &str) -> Pod {
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    fn mirror(mut p: Pod) -> Pod {
        p.metadata.annotations =
            Some([(MIRROR_POD_ANNOTATION.to_string(), "hash".to_string())].into());
        p
    }

    fn terminating(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        p
    }

    /// The DaemonSets that exist in these cases.
    const LIVE_DAEMONSETS: &[&str] = &["agent"];

    fn ds(name: &str) -> Pod {
        owned_by(mk_pod(name), "DaemonSet", name, true)
    }

    #[test]
    fn kubectl_drain_filters() {
        use PodAction::*;
        // (case, pod, expected action); DaemonSet "agent" exists, "gone" does not.
        let cases: Vec<(&str, Pod, PodAction)> = vec![
            ("mirror pod", mirror(mk_pod("etcd-node")), SkipMirror),
            (
                "finished mirror pod",
                mirror(phase(mk_pod("m"), "Succeeded")),
                SkipMirror,
            ),
            ("running DaemonSet pod", ds("agent"), SkipDaemonSet),
            (
                "pending DaemonSet pod",
                phase(ds("agent"), "Pending"),
                SkipDaemonSet,
            ),
            (
                "terminating DaemonSet pod",
                terminating(ds("agent")),
                SkipDaemonSet,
            ),
            (
                "succeeded DaemonSet pod",
                phase(ds("agent"), "Succeeded"),
                Evict,
            ),
            ("failed DaemonSet pod", phase(ds("agent"), "Failed"), Evict),
            ("orphaned DaemonSet pod", ds("gone"), Evict),
            (
                "terminating orphaned DaemonSet pod",
                terminating(ds("gone")),
                AwaitTermination,
            ),
            ("no controller (force)", mk_pod("bare"), Evict),
            (
                "ReplicaSet pod",
                owned_by(mk_pod("rs"), "ReplicaSet", "agent", true),
                Evict,
            ),
            (
                "DaemonSet only a non-controller owner",
                owned_by(mk_pod("x"), "DaemonSet", "agent", false),
                Evict,
            ),
            ("finished pod", phase(mk_pod("job"), "Succeeded"), Evict),
            ("failed pod", phase(mk_pod("job"), "Failed"), Evict),
            (
                "terminating pod",
                terminating(mk_pod("t")),
                AwaitTermination,
            ),
        ];
        for (case, pod, want) in cases {
            let got = classify(&pod, |name| LIVE_DAEMONSETS.contains(&name));
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn lookups_only_for_unfinished_daemonset_pods() {
        let cases: Vec<(&str, Pod, Option<&str>)> = vec![
            ("running DaemonSet pod", ds("agent"), Some("agent")),
            ("finished DaemonSet pod", phase(ds("agent"), "Failed"), None),
            ("mirror pod", mirror(ds("agent")), None),
            (
                "ReplicaSet pod",
                owned_by(mk_pod("rs"), "ReplicaSet", "w", true),
                None,
            ),
            ("no owner", mk_pod("bare"), None),
        ];
        for (case, pod, want) in cases {
            assert_eq!(daemonset_to_look_up(&pod), want, "{case}");
        }
    }

    #[test]
    fn what_must_leave() {
        assert!(PodAction::Evict.must_leave());
        assert!(PodAction::AwaitTermination.must_leave());
        assert!(!PodAction::SkipMirror.must_leave());
        assert!(!PodAction::SkipDaemonSet.must_leave());
    }

    #[test]
    fn progress_maths() {
        assert_eq!(drain_progress(5, 5), 0);
        assert_eq!(drain_progress(5, 3), 40);
        assert_eq!(drain_progress(3, 1), 66, "integer division as upstream");
        assert_eq!(drain_progress(5, 0), 100);
        assert_eq!(drain_progress(0, 0), 100);
        assert_eq!(drain_progress(2, 5), 0, "never negative");
        assert_eq!(drain_progress(0, 1), 0);
    }

    /// Found by tests/no_panic.rs: a hand-written `evictionPods` past
    /// `i64::MAX / 100` with a pod left overflowed `* 100` (a panic in debug
    /// builds, a wrapped percentage in release), and so can
    /// `evictionPods - pending` for a very negative `pending`.
    #[test]
    fn progress_of_hand_written_huge_counts() {
        assert_eq!(drain_progress(92_233_720_368_547_761, 1), 99);
        assert_eq!(drain_progress(i64::MAX, 0), 100);
        assert_eq!(drain_progress(i64::MAX, i64::MAX), 0);
        assert_eq!(drain_progress(i64::MAX / 2, i64::MAX), 0);
        assert_eq!(drain_progress(92_233_720_368_547_758, -1), 100);
        assert_eq!(drain_progress(1, i64::MIN), 100);
        assert_eq!(drain_progress(i64::MAX, i64::MIN), 100);
    }
}
