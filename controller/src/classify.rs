//! Which pods a drain removes, and the progress maths, as pure functions.
//!
//! Upstream drives kubectl's drain with force, delete-emptydir-data and
//! ignore-all-daemonsets, which amounts to: mirror (static) pods and DaemonSet
//! pods stay; every other pod, with or without a controller, with or without
//! emptyDir, finished or not, leaves the node through the Eviction API.

use k8s_openapi::api::core::v1::Pod;

/// Annotation the kubelet puts on the API mirror of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodAction {
    /// Stays on the node: a static pod's mirror cannot be evicted.
    SkipMirror,
    /// Stays on the node: its DaemonSet would put it straight back.
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

pub fn classify(pod: &Pod) -> PodAction {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
    {
        return PodAction::SkipMirror;
    }
    let daemonset_owned = meta.owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.controller == Some(true) && r.kind == "DaemonSet")
    });
    if daemonset_owned {
        return PodAction::SkipDaemonSet;
    }
    if meta.deletion_timestamp.is_some() {
        return PodAction::AwaitTermination;
    }
    PodAction::Evict
}

/// `drainProgress` as upstream computes it: the share of the pods that had to
/// leave which are gone, in whole percent, clamped to 0..=100 (pods that
/// appear on a cordoned node later must not make it negative).
pub fn drain_progress(eviction_pods: i64, pending: i64) -> i64 {
    if eviction_pods <= 0 {
        return if pending == 0 { 100 } else { 0 };
    }
    ((eviction_pods - pending) * 100 / eviction_pods).clamp(0, 100)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;

    pub fn mk_pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some("ns".to_string());
        p
    }

    fn owned_by(mut p: Pod, kind: &str, controller: bool) -> Pod {
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: "owner".into(),
            uid: "u".into(),
            controller: Some(controller),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn mirror_and_daemonset_pods_stay() {
        let mut mirror = mk_pod("etcd-node");
        mirror.metadata.annotations =
            Some([(MIRROR_POD_ANNOTATION.to_string(), "hash".to_string())].into());
        assert_eq!(classify(&mirror), PodAction::SkipMirror);
        assert_eq!(
            classify(&owned_by(mk_pod("ds"), "DaemonSet", true)),
            PodAction::SkipDaemonSet
        );
        assert!(!PodAction::SkipMirror.must_leave());
    }

    #[test]
    fn everything_else_is_evicted() {
        assert_eq!(
            classify(&mk_pod("bare")),
            PodAction::Evict,
            "no controller: force"
        );
        assert_eq!(
            classify(&owned_by(mk_pod("rs"), "ReplicaSet", true)),
            PodAction::Evict
        );
        // A DaemonSet that is only a non-controller owner does not protect the pod.
        assert_eq!(
            classify(&owned_by(mk_pod("x"), "DaemonSet", false)),
            PodAction::Evict
        );
        let mut done = mk_pod("job");
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        assert_eq!(
            classify(&done),
            PodAction::Evict,
            "finished pods are removed"
        );
    }

    #[test]
    fn terminating_pods_are_awaited() {
        let mut p = mk_pod("t");
        p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(classify(&p), PodAction::AwaitTermination);
        assert!(PodAction::AwaitTermination.must_leave());
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
}
