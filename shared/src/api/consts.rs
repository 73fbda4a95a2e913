//! Every name, message and number of the upstream compatibility contract
//! (`upstream-contract.md`). Other operators, dashboards and runbooks depend on
//! these exact values: change one only together with the contract.

/// API group, version and kind of the NodeMaintenance resource.
pub const GROUP: &str = "nodemaintenance.medik8s.io";
pub const VERSION: &str = "v1beta1";
pub const KIND: &str = "NodeMaintenance";
pub const PLURAL: &str = "nodemaintenances";

/// Finalizer the controller puts on every NodeMaintenance it handles.
pub const FINALIZER: &str = "foregroundDeleteNodeMaintenance";

/// Taints a node in maintenance carries (both with effect NoSchedule).
pub const TAINT_UNSCHEDULABLE_KEY: &str = "node.kubernetes.io/unschedulable";
/// KubeVirt's virt-handler live-migrates VMs away from nodes with this taint.
pub const TAINT_DRAIN_KEY: &str = "medik8s.io/drain";
pub const TAINT_EFFECT: &str = "NoSchedule";

/// Label telling Node Health Check and Self Node Remediation to leave the node alone.
pub const EXCLUDE_FROM_REMEDIATION_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
pub const EXCLUDE_FROM_REMEDIATION_VALUE: &str = "true";

/// Annotation on a node that was unschedulable before its maintenance
/// began (value "true"): giving the node back keeps it cordoned. Kept on
/// the node, not in memory, so a restart, a failover or a handover
/// mid-maintenance keeps it too. (Beyond upstream, which uncordons.)
pub const PRIOR_CORDON_ANNOTATION: &str = "nodemaintenance.medik8s.io/cordoned-before";

/// Node role labels that mark a control-plane node.
pub const ROLE_MASTER_LABEL: &str = "node-role.kubernetes.io/master";
pub const ROLE_CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// The per-node lease shared with the other medik8s operators.
pub const LEASE_NAMESPACE_DEFAULT: &str = "medik8s-leases";
pub const LEASE_NAMESPACE_ENV: &str = "LEASE_NAMESPACE";
pub const LEASE_HOLDER_IDENTITY: &str = "node-maintenance";
pub const LEASE_DURATION_SECONDS: i32 = 3600;
/// More lease errors than this fail the maintenance.
pub const MAX_ALLOWED_ERROR_TO_UPDATE_OWNED_LEASE: i64 = 3;

/// Name of the per-node lease: `node-<nodeName>` in lower case.
pub fn lease_name(node_name: &str) -> String {
    format!("node-{node_name}").to_lowercase()
}

/// Leader election lease name used by upstream's controller manager.
pub const LEADER_ELECTION_LEASE_NAME: &str = "135b1886.medik8s.io";

/// Event source component and the events of the contract.
pub const EVENT_COMPONENT: &str = "NodeMaintenance";

/// One Kubernetes event of the contract: reason, type and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSpec {
    pub reason: &'static str,
    pub warning: bool,
    pub message: &'static str,
}

pub const EVENT_BEGIN_MAINTENANCE: EventSpec = EventSpec {
    reason: "BeginMaintenance",
    warning: false,
    message: "Begin a node maintenance",
};
pub const EVENT_SUCCEED_MAINTENANCE: EventSpec = EventSpec {
    reason: "SucceedMaintenance",
    warning: false,
    message: "Node maintenance was succeeded",
};
pub const EVENT_UNCORDON_NODE: EventSpec = EventSpec {
    reason: "UncordonNode",
    warning: false,
    message: "Uncordon a node",
};
pub const EVENT_REMOVED_MAINTENANCE: EventSpec = EventSpec {
    reason: "RemovedMaintenance",
    warning: false,
    message: "Removed a node maintenance",
};
pub const EVENT_FAILED_MAINTENANCE: EventSpec = EventSpec {
    reason: "FailedMaintenance",
    warning: true,
    message: "Failed a node maintenance",
};

/// Admission webhook path (AdmissionReview v1).
pub const WEBHOOK_PATH: &str = "/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance";

/// Webhook denial messages, word for word as upstream answers.
pub fn msg_node_not_found(node: &str) -> String {
    format!("invalid nodeName, no node with name {node} found")
}
pub fn msg_duplicate(node: &str) -> String {
    format!("invalid nodeName, a NodeMaintenance for node {node} already exists")
}
pub fn msg_etcd_quorum(node: &str) -> String {
    format!(
        "can not put master/control-plane node into maintenance at this moment, disrupting node {node} will violate etcd quorum"
    )
}
pub const MSG_NODE_NAME_IMMUTABLE: &str = "updating spec.NodeName isn't allowed";

/// Controller status messages.
pub fn msg_lease_held_by_other(holder: &str) -> String {
    format!("can't update or invalidate the lease because it is held by different owner: {holder}")
}
pub fn msg_lease_failed(attempts: i64) -> String {
    format!("maintenance failed: lease could not be extended after {attempts} attempts")
}
pub fn msg_node_missing(node: &str) -> String {
    format!("nodes \"{node}\" not found")
}

/// OpenShift detection: API discovery offers this group/version.
pub const OPENSHIFT_CONFIG_GROUP: &str = "config.openshift.io";
pub const OPENSHIFT_CONFIG_VERSION: &str = "v1";
/// Where OpenShift keeps the etcd quorum guard: a PodDisruptionBudget named
/// `etcd-guard-pdb` (OpenShift 4.11+) or `etcd-quorum-guard` (before). Like
/// upstream, the rule counts every PDB in this namespace, whatever its name.
pub const ETCD_NAMESPACE: &str = "openshift-etcd";

/// Certificate file names: OLM and cert-manager layouts.
pub const OLM_CERT_DIR: &str = "/apiserver.local.config/certificates";
pub const OLM_CERT_FILE: &str = "apiserver.crt";
pub const OLM_KEY_FILE: &str = "apiserver.key";
pub const TLS_CERT_FILE: &str = "tls.crt";
pub const TLS_KEY_FILE: &str = "tls.key";

/// Upstream drain timing: one attempt lasts at most this long, then a requeue.
pub const DRAIN_ATTEMPT_TIMEOUT_SECS: u64 = 30;
pub const DRAIN_REQUEUE_SECS: u64 = 5;

/// Beyond upstream: the KEP-5683 node condition a maintenance holds while
/// it has the node, and the reason it says when the node was given back
/// (its lastTransitionTime then says when: the settle gate reads it).
pub const NODE_CONDITION_MAINTENANCE_IN_PROGRESS: &str = "MaintenanceInProgress";
/// Every reason we write on the node conditions starts so.
pub const NODE_CONDITION_REASON_PREFIX: &str = "NodeMaintenance";
/// The reason of our node conditions once the node was given back.
pub const NODE_CONDITION_REASON_ENDED: &str = "NodeMaintenanceEnded";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_name_is_lower_case() {
        assert_eq!(lease_name("Worker-1"), "node-worker-1");
    }

    #[test]
    fn messages_match_contract() {
        assert_eq!(
            msg_node_not_found("n1"),
            "invalid nodeName, no node with name n1 found"
        );
        assert_eq!(
            msg_duplicate("n1"),
            "invalid nodeName, a NodeMaintenance for node n1 already exists"
        );
        assert_eq!(msg_node_missing("n1"), "nodes \"n1\" not found");
        assert_eq!(
            msg_lease_failed(4),
            "maintenance failed: lease could not be extended after 4 attempts"
        );
    }
}
