//! The admission decision: a pure function of the review and of what the
//! caches know, so every branch is unit-tested without a cluster.
//!
//! CREATE, in upstream's order: the node exists; no other NodeMaintenance names
//! it; on OpenShift a control-plane node keeps etcd quorum. UPDATE:
//! `spec.nodeName` is immutable. Anything else is allowed. When a lookup cannot
//! be answered (a cache still filling) the request is denied with "please try
//! again" and the cause, never guessed.

use shared::api::consts::{
    GROUP, KIND, MSG_NODE_NAME_IMMUTABLE, msg_duplicate, msg_etcd_quorum, msg_node_not_found,
};
use shared::rules::quorum::{GuardPdb, GuardPodReadiness, QuorumVerdict, allows_disruption};
use shared::{DrainTimeoutAction, NodeMaintenance};

use crate::review::{Operation, ReviewRequest};

/// What the rules need to know about a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeFacts {
    pub control_plane: bool,
}

/// Inputs of the etcd quorum rule for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdGuard {
    pub pdbs: Vec<GuardPdb>,
    pub guard_pod: Option<GuardPodReadiness>,
}

/// What the cluster's admin allows, from the webhook's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// `--allow-force-drain` (manifests/components/force-drain): whether
    /// `drainTimeoutAction: Force` may be asked for. Off by default: it
    /// deletes pods past their PodDisruptionBudgets.
    pub allow_force_drain: bool,
}

/// A lookup that cannot be answered right now; the text is the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// What the decision may ask of the cluster (served from caches).
pub trait Lookups: Send + Sync {
    fn node(&self, name: &str) -> Result<Option<NodeFacts>, Unavailable>;
    fn maintenance_exists_for(&self, node: &str) -> Result<bool, Unavailable>;
    fn is_openshift(&self) -> Result<bool, Unavailable>;
    fn etcd_guard(&self, node: &str) -> Result<EtcdGuard, Unavailable>;

    /// Confirm a node the cache does not know with a direct read: a node
    /// created a moment ago may not have reached the watch yet. Only called
    /// on a miss, so the hot path never leaves the cache.
    fn confirm_node(&self, _name: &str) -> futures::future::BoxFuture<'_, Option<NodeFacts>> {
        Box::pin(std::future::ready(None))
    }

    /// Admission warnings for an allowed create of `nm` (see `warnings`):
    /// asked only after the decision, never able to change it.
    fn warnings<'a>(
        &'a self,
        _nm: &'a NodeMaintenance,
    ) -> futures::future::BoxFuture<'a, Vec<String>> {
        Box::pin(std::future::ready(Vec::new()))
    }
}

/// Lookups that also know one node the cache had not seen yet.
pub struct WithNode<'a> {
    pub inner: &'a dyn Lookups,
    pub name: &'a str,
    pub facts: NodeFacts,
}

impl Lookups for WithNode<'_> {
    fn node(&self, name: &str) -> Result<Option<NodeFacts>, Unavailable> {
        if name == self.name {
            return Ok(Some(self.facts));
        }
        self.inner.node(name)
    }
    fn maintenance_exists_for(&self, node: &str) -> Result<bool, Unavailable> {
        self.inner.maintenance_exists_for(node)
    }
    fn is_openshift(&self) -> Result<bool, Unavailable> {
        self.inner.is_openshift()
    }
    fn etcd_guard(&self, node: &str) -> Result<EtcdGuard, Unavailable> {
        self.inner.etcd_guard(node)
    }
}

/// [`decide`], confirming an unknown node against the API server before denying.
pub async fn decide_confirmed(
    req: &ReviewRequest,
    lookups: &dyn Lookups,
    policy: Policy,
) -> Decision {
    let decision = decide(req, lookups, policy);
    if decision.reason != Reason::NodeNotFound {
        return decision;
    }
    let Some(node) = decision.node.clone() else {
        return decision;
    };
    match lookups.confirm_node(&node).await {
        Some(facts) => decide(
            req,
            &WithNode {
                inner: lookups,
                name: &node,
                facts,
            },
            policy,
        ),
        None => decision,
    }
}

/// Why a decision came out as it did: the `reason` label of
/// `nmo_webhook_decisions_total` and of the decision log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// CREATE passed every rule that applies.
    Valid,
    /// CREATE on OpenShift control plane: the guard PDB allows a disruption.
    QuorumDisruptionAllowed,
    /// CREATE on OpenShift control plane: the node's guard pod is not ready.
    QuorumAlreadyDisrupted,
    /// CREATE on OpenShift control plane: no guard pod on the node.
    QuorumNoGuardPod,
    /// UPDATE that keeps spec.nodeName.
    NodeNameUnchanged,
    /// DELETE / CONNECT: nothing to validate.
    NotValidated,
    NodeNotFound,
    Duplicate,
    QuorumViolation,
    QuorumNoPdb,
    QuorumSeveralPdbs,
    NodeNameImmutable,
    /// A field of ours (beyond upstream) that the controller could not act
    /// on, e.g. a `spec.drainTimeout` past Go's ~292 years.
    InvalidSpec,
    /// `drainTimeoutAction: Force` while `--allow-force-drain` is off.
    ForceNotAllowed,
    /// A cache could not answer; the client should retry.
    LookupUnavailable,
    /// The review or its objects could not be read.
    Malformed,
    /// The review is about some other resource than NodeMaintenance.
    UnexpectedResource,
    /// A NodeDrainRule the controller can act on.
    DrainRuleValid,
    /// A NodeDrainRule with a field in error (named in the message).
    InvalidDrainRule,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Valid => "valid",
            Reason::QuorumDisruptionAllowed => "quorum_disruption_allowed",
            Reason::QuorumAlreadyDisrupted => "quorum_already_disrupted",
            Reason::QuorumNoGuardPod => "quorum_no_guard_pod",
            Reason::NodeNameUnchanged => "node_name_unchanged",
            Reason::NotValidated => "not_validated",
            Reason::NodeNotFound => "node_not_found",
            Reason::Duplicate => "duplicate",
            Reason::QuorumViolation => "quorum_violation",
            Reason::QuorumNoPdb => "quorum_no_pdb",
            Reason::QuorumSeveralPdbs => "quorum_several_pdbs",
            Reason::NodeNameImmutable => "node_name_immutable",
            Reason::InvalidSpec => "invalid_spec",
            Reason::ForceNotAllowed => "force_not_allowed",
            Reason::LookupUnavailable => "lookup_unavailable",
            Reason::Malformed => "malformed",
            Reason::UnexpectedResource => "unexpected_resource",
            Reason::DrainRuleValid => "drain_rule_valid",
            Reason::InvalidDrainRule => "invalid_drain_rule",
        }
    }
}

/// The answer to one review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Status code reported to the API server's client: 200, 403 or 400.
    pub code: u16,
    pub message: String,
    pub reason: Reason,
    /// The object's name (generateName prefix when the name is not set yet).
    pub object: String,
    /// spec.nodeName of the object under review, when it could be read.
    pub node: Option<String>,
}

impl Decision {
    pub(crate) fn allow(reason: Reason) -> Self {
        Decision {
            allowed: true,
            code: 200,
            message: String::new(),
            reason,
            object: String::new(),
            node: None,
        }
    }

    pub(crate) fn deny(reason: Reason, message: String) -> Self {
        Decision {
            allowed: false,
            code: 403,
            message,
            reason,
            object: String::new(),
            node: None,
        }
    }

    /// A well-formed denial for input the webhook cannot read (status 400, as
    /// controller-runtime's `admission.Errored(400, ...)`).
    pub fn malformed(reason: Reason, message: String) -> Self {
        Decision {
            allowed: false,
            code: 400,
            message,
            reason,
            object: String::new(),
            node: None,
        }
    }

    /// An allowed CREATE: the one answer that carries warnings.
    pub fn admits_create(&self) -> bool {
        self.allowed
            && matches!(
                self.reason,
                Reason::Valid
                    | Reason::QuorumDisruptionAllowed
                    | Reason::QuorumAlreadyDisrupted
                    | Reason::QuorumNoGuardPod
            )
    }

    /// This decision about the object `name` (no node).
    pub(crate) fn named(mut self, name: &str) -> Self {
        self.object = name.to_string();
        self
    }

    fn about(mut self, nm: &NodeMaintenance) -> Self {
        self.object = nm
            .metadata
            .name
            .clone()
            .or_else(|| nm.metadata.generate_name.clone())
            .unwrap_or_default();
        self.node = Some(nm.spec.node_name.clone());
        self
    }
}

/// Decide on one admission request.
pub fn decide(req: &ReviewRequest, lookups: &dyn Lookups, policy: Policy) -> Decision {
    if req.kind.group == GROUP && req.kind.kind == crate::drain_rule::KIND {
        return crate::drain_rule::decide(req);
    }
    if req.kind.group != GROUP || req.kind.kind != KIND {
        return Decision::malformed(
            Reason::UnexpectedResource,
            format!(
                "this webhook validates {GROUP} {KIND} and NodeDrainRule objects only, got group {:?} kind {:?}; \
                 fix the rules of the ValidatingWebhookConfiguration that sent it",
                req.kind.group, req.kind.kind
            ),
        );
    }
    let mut decision = match req.operation {
        Operation::Create => match decode_object(req, "object", req.object.as_deref()) {
            Ok(nm) => validate_create(&nm, lookups, policy).about(&nm),
            Err(d) => d,
        },
        Operation::Update => {
            let new = decode_object(req, "object", req.object.as_deref());
            let old = decode_object(req, "oldObject", req.old_object.as_deref());
            match (new, old) {
                (Ok(new), Ok(old)) => validate_update(&new, &old, policy).about(&new),
                (Err(d), _) | (_, Err(d)) => d,
            }
        }
        Operation::Delete | Operation::Connect | Operation::Other(_) => {
            Decision::allow(Reason::NotValidated)
        }
    };
    if decision.object.is_empty() {
        decision.object = req.name.clone();
    }
    decision
}

pub(crate) fn decode_object(
    req: &ReviewRequest,
    field: &str,
    raw: Option<&serde_json::value::RawValue>,
) -> Result<NodeMaintenance, Decision> {
    let Some(raw) = raw else {
        return Err(Decision::malformed(
            Reason::Malformed,
            format!(
                "the {} review of NodeMaintenance {:?} has no request.{field}",
                req.operation.as_str(),
                req.name
            ),
        ));
    };
    serde_json::from_str(raw.get()).map_err(|e| {
        Decision::malformed(
            Reason::Malformed,
            format!(
                "cannot read request.{field} of the {} review of NodeMaintenance {:?} as a \
                 {GROUP} {KIND}: {e}",
                req.operation.as_str(),
                req.name
            ),
        )
    })
}

/// The fields beyond upstream's spec, checked with the parser the
/// controller uses, so nothing is admitted that the controller cannot read.
/// `old`: on an UPDATE, the object before it; a field it does not change is
/// not judged again (a finalizer removal must pass whatever was admitted).
fn check_spec(
    nm: &NodeMaintenance,
    old: Option<&NodeMaintenance>,
    policy: Policy,
) -> Option<Decision> {
    let action = nm.spec.drain_timeout_action;
    if action == Some(DrainTimeoutAction::Force)
        && !policy.allow_force_drain
        && old.is_none_or(|o| o.spec.drain_timeout_action != action)
    {
        return Some(Decision::deny(
            Reason::ForceNotAllowed,
            MSG_FORCE_NOT_ALLOWED.to_string(),
        ));
    }
    let timeout = nm.spec.drain_timeout.as_deref()?;
    if old.is_some_and(|o| o.spec.drain_timeout.as_deref() == Some(timeout)) {
        return None;
    }
    let err = shared::rules::duration::parse(timeout).err()?;
    Some(Decision::deny(
        Reason::InvalidSpec,
        format!("spec.drainTimeout: {err}"),
    ))
}

/// The denial of `drainTimeoutAction: Force` while `--allow-force-drain` is off.
pub const MSG_FORCE_NOT_ALLOWED: &str = "spec.drainTimeoutAction: Force is not enabled on this \
     cluster: it deletes pods past their PodDisruptionBudgets, which only a cluster admin may \
     allow, by installing the force-drain component (manifests/components/force-drain: it grants \
     the controller delete on pods and sets ALLOW_FORCE_DRAIN=true on both services); use \
     drainTimeoutAction: Fail (the default) meanwhile";

fn validate_create(nm: &NodeMaintenance, lookups: &dyn Lookups, policy: Policy) -> Decision {
    let decision = validate_create_upstream(nm, lookups);
    if !decision.allowed {
        return decision;
    }
    check_spec(nm, None, policy).unwrap_or(decision)
}

/// Upstream's CREATE rules, in upstream's order.
fn validate_create_upstream(nm: &NodeMaintenance, lookups: &dyn Lookups) -> Decision {
    let node = nm.spec.node_name.as_str();

    let facts = match lookups.node(node) {
        Ok(Some(facts)) => facts,
        Ok(None) => return Decision::deny(Reason::NodeNotFound, msg_node_not_found(node)),
        Err(cause) => {
            return try_again("could not get node for validating spec.NodeName", &cause);
        }
    };

    match lookups.maintenance_exists_for(node) {
        Ok(false) => {}
        Ok(true) => return Decision::deny(Reason::Duplicate, msg_duplicate(node)),
        Err(cause) => {
            return try_again(
                "could not list NodeMaintenances for validating spec.NodeName",
                &cause,
            );
        }
    }

    match lookups.is_openshift() {
        Ok(true) => {}
        Ok(false) => return Decision::allow(Reason::Valid),
        Err(cause) => {
            return try_again(
                "could not tell whether the cluster is OpenShift for master/control-plane quorum validation",
                &cause,
            );
        }
    }
    if !facts.control_plane {
        return Decision::allow(Reason::Valid);
    }
    let guard = match lookups.etcd_guard(node) {
        Ok(guard) => guard,
        Err(cause) => {
            return try_again(
                "could not get PodDisruptionBudget for master/control-plane quorum validation",
                &cause,
            );
        }
    };
    match allows_disruption(&guard.pdbs, guard.guard_pod) {
        QuorumVerdict::DisruptionsAllowed => Decision::allow(Reason::QuorumDisruptionAllowed),
        QuorumVerdict::AlreadyDisrupted => Decision::allow(Reason::QuorumAlreadyDisrupted),
        QuorumVerdict::NoGuardPod => Decision::allow(Reason::QuorumNoGuardPod),
        QuorumVerdict::NoPdb => Decision::deny(Reason::QuorumNoPdb, msg_etcd_quorum(node)),
        QuorumVerdict::SeveralPdbs(_) => {
            Decision::deny(Reason::QuorumSeveralPdbs, msg_etcd_quorum(node))
        }
        QuorumVerdict::WouldViolateQuorum => {
            Decision::deny(Reason::QuorumViolation, msg_etcd_quorum(node))
        }
    }
}

fn validate_update(new: &NodeMaintenance, old: &NodeMaintenance, policy: Policy) -> Decision {
    if new.spec.node_name != old.spec.node_name {
        return Decision::deny(
            Reason::NodeNameImmutable,
            MSG_NODE_NAME_IMMUTABLE.to_string(),
        );
    }
    check_spec(new, Some(old), policy).unwrap_or(Decision::allow(Reason::NodeNameUnchanged))
}

/// Upstream's wording for a failed lookup: what could not be checked, "please
/// try again", and the cause.
fn try_again(what: &str, cause: &Unavailable) -> Decision {
    Decision::deny(
        Reason::LookupUnavailable,
        format!("{what}, please try again: {cause}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::decode;
    use crate::review::tests::create_review;
    use std::collections::{BTreeMap, BTreeSet};

    /// In-memory lookups; `None` fields mean "cache not ready".
    #[derive(Default)]
    struct Fake {
        nodes: Option<BTreeMap<String, NodeFacts>>,
        maintained: Option<BTreeSet<String>>,
        openshift: Option<bool>,
        guard: Option<EtcdGuard>,
    }

    impl Fake {
        fn cluster() -> Self {
            Fake {
                nodes: Some(
                    [
                        (
                            "cp-1".to_string(),
                            NodeFacts {
                                control_plane: true,
                            },
                        ),
                        (
                            "worker-1".to_string(),
                            NodeFacts {
                                control_plane: false,
                            },
                        ),
                    ]
                    .into(),
                ),
                maintained: Some(BTreeSet::new()),
                openshift: Some(false),
                guard: None,
            }
        }
        fn openshift(mut self, pdbs: &[i32], guard_pod: Option<GuardPodReadiness>) -> Self {
            self.openshift = Some(true);
            self.guard = Some(EtcdGuard {
                pdbs: pdbs
                    .iter()
                    .map(|&a| GuardPdb {
                        name: "etcd-guard-pdb".into(),
                        disruptions_allowed: a,
                    })
                    .collect(),
                guard_pod,
            });
            self
        }
    }

    impl Lookups for Fake {
        fn node(&self, name: &str) -> Result<Option<NodeFacts>, Unavailable> {
            let nodes = self
                .nodes
                .as_ref()
                .ok_or_else(|| Unavailable("node cache not synced".into()))?;
            Ok(nodes.get(name).copied())
        }
        fn maintenance_exists_for(&self, node: &str) -> Result<bool, Unavailable> {
            let m = self
                .maintained
                .as_ref()
                .ok_or_else(|| Unavailable("NodeMaintenance cache not synced".into()))?;
            Ok(m.contains(node))
        }
        fn is_openshift(&self) -> Result<bool, Unavailable> {
            self.openshift
                .ok_or_else(|| Unavailable("discovery pending".into()))
        }
        fn etcd_guard(&self, _node: &str) -> Result<EtcdGuard, Unavailable> {
            self.guard
                .clone()
                .ok_or_else(|| Unavailable("etcd caches not synced".into()))
        }
    }

    fn create(node: &str, lookups: &dyn Lookups) -> Decision {
        let req = decode(create_review("uid-1", "nm-1", node).as_bytes()).expect("valid review");
        decide(&req, lookups, Policy::default())
    }

    fn update(old_node: &str, new_node: &str, new_reason: &str) -> Decision {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "uid-2", "name": "nm-1", "operation": "UPDATE",
                "kind": {"group": GROUP, "version": "v1beta1", "kind": KIND},
                "userInfo": {"username": "alice"},
                "object": {"metadata": {"name": "nm-1"}, "spec": {"nodeName": new_node, "reason": new_reason}},
                "oldObject": {"metadata": {"name": "nm-1"}, "spec": {"nodeName": old_node, "reason": "before"}},
            }
        });
        let req = decode(body.to_string().as_bytes()).expect("valid review");
        decide(&req, &Fake::cluster(), Policy::default())
    }

    /// A review of `op` whose object's spec is `spec` (and oldObject's `old`).
    fn review_with_spec(
        op: &str,
        spec: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> Decision {
        review_under(Policy::default(), op, spec, old)
    }

    fn review_under(
        policy: Policy,
        op: &str,
        spec: serde_json::Value,
        old: Option<serde_json::Value>,
    ) -> Decision {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "uid-3", "name": "nm-1", "operation": op,
                "kind": {"group": GROUP, "version": "v1beta1", "kind": KIND},
                "userInfo": {"username": "alice"},
                "object": {"metadata": {"name": "nm-1"}, "spec": spec},
                "oldObject": old.map(|o| serde_json::json!({"metadata": {"name": "nm-1"}, "spec": o})),
            }
        });
        let req = decode(body.to_string().as_bytes()).expect("valid review");
        decide(&req, &Fake::cluster(), policy)
    }

    #[test]
    fn a_drain_timeout_past_gos_limit_is_denied_naming_field_and_limit() {
        let spec =
            serde_json::json!({"nodeName": "worker-1", "drainTimeout": "9999999999999999999h"});
        let d = review_with_spec("CREATE", spec.clone(), None);
        assert_denied(
            &d,
            Reason::InvalidSpec,
            "spec.drainTimeout: invalid duration \"9999999999999999999h\": out of range: at most \
             2562047h47m16.854775807s (about 292 years); write it as Go does, e.g. 90s, 1h30m, \
             250ms",
        );
        // Upstream's rules come first: an unknown node is still "no node".
        let unknown =
            serde_json::json!({"nodeName": "nope", "drainTimeout": "9999999999999999999h"});
        assert_eq!(
            review_with_spec("CREATE", unknown, None).reason,
            Reason::NodeNotFound
        );
        // Setting it on an UPDATE is denied too...
        let before = serde_json::json!({"nodeName": "worker-1"});
        let d = review_with_spec("UPDATE", spec.clone(), Some(before));
        assert_eq!(d.reason, Reason::InvalidSpec, "{d:?}");
        // ...but an UPDATE that leaves an admitted value alone (a finalizer
        // removal) passes whatever it is.
        let d = review_with_spec("UPDATE", spec.clone(), Some(spec));
        assert_allowed(&d, Reason::NodeNameUnchanged);
        // The longest Go duration is fine.
        let longest =
            serde_json::json!({"nodeName": "worker-1", "drainTimeout": "2562047h47m16.854775807s"});
        assert_allowed(&review_with_spec("CREATE", longest, None), Reason::Valid);
    }

    #[test]
    fn force_is_the_admins_to_allow() {
        let force = serde_json::json!({"nodeName": "worker-1", "drainTimeout": "1s",
            "drainTimeoutAction": "Force"});
        let off = review_with_spec("CREATE", force.clone(), None);
        assert_denied(&off, Reason::ForceNotAllowed, MSG_FORCE_NOT_ALLOWED);
        // Fail (and no action at all) stays available.
        let fail = serde_json::json!({"nodeName": "worker-1", "drainTimeout": "1s",
            "drainTimeoutAction": "Fail"});
        assert_allowed(
            &review_with_spec("CREATE", fail.clone(), None),
            Reason::Valid,
        );
        // Switching an existing maintenance to Force is denied too; an update
        // that leaves an admitted Force alone (a finalizer removal) is not.
        let d = review_with_spec("UPDATE", force.clone(), Some(fail));
        assert_eq!(d.reason, Reason::ForceNotAllowed, "{d:?}");
        let d = review_with_spec("UPDATE", force.clone(), Some(force.clone()));
        assert_allowed(&d, Reason::NodeNameUnchanged);
        // With the component installed (--allow-force-drain), Force passes.
        let on = Policy {
            allow_force_drain: true,
        };
        assert_allowed(&review_under(on, "CREATE", force, None), Reason::Valid);
    }

    fn assert_denied(d: &Decision, reason: Reason, message: &str) {
        assert!(!d.allowed, "{d:?}");
        assert_eq!(d.reason, reason, "{d:?}");
        assert_eq!(d.message, message);
        assert_eq!(d.code, 403);
    }

    fn assert_allowed(d: &Decision, reason: Reason) {
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.reason, reason, "{d:?}");
        assert_eq!(d.code, 200);
    }

    #[test]
    fn create_on_existing_free_node_is_allowed() {
        let d = create("worker-1", &Fake::cluster());
        assert_allowed(&d, Reason::Valid);
        assert_eq!(d.object, "nm-1");
        assert_eq!(d.node.as_deref(), Some("worker-1"));
    }

    #[test]
    fn unknown_node_is_denied_with_upstream_message() {
        let d = create("ghost", &Fake::cluster());
        assert_denied(
            &d,
            Reason::NodeNotFound,
            "invalid nodeName, no node with name ghost found",
        );
    }

    #[test]
    fn duplicate_is_denied_with_upstream_message() {
        let mut f = Fake::cluster();
        f.maintained = Some(["worker-1".to_string()].into());
        let d = create("worker-1", &f);
        assert_denied(
            &d,
            Reason::Duplicate,
            "invalid nodeName, a NodeMaintenance for node worker-1 already exists",
        );
    }

    /// A cluster whose cache misses a node the API server already has.
    struct Lagging(Fake);

    impl Lookups for Lagging {
        fn node(&self, name: &str) -> Result<Option<NodeFacts>, Unavailable> {
            self.0.node(name)
        }
        fn maintenance_exists_for(&self, node: &str) -> Result<bool, Unavailable> {
            self.0.maintenance_exists_for(node)
        }
        fn is_openshift(&self) -> Result<bool, Unavailable> {
            self.0.is_openshift()
        }
        fn etcd_guard(&self, node: &str) -> Result<EtcdGuard, Unavailable> {
            self.0.etcd_guard(node)
        }
        fn confirm_node(&self, name: &str) -> futures::future::BoxFuture<'_, Option<NodeFacts>> {
            let known = name == "just-created";
            Box::pin(std::future::ready(known.then_some(NodeFacts {
                control_plane: false,
            })))
        }
    }

    fn create_confirmed(node: &str, lookups: &dyn Lookups) -> Decision {
        let req = decode(create_review("uid-1", "nm-1", node).as_bytes()).expect("valid review");
        futures::executor::block_on(decide_confirmed(&req, lookups, Policy::default()))
    }

    #[test]
    fn node_missing_from_cache_is_confirmed_before_denying() {
        let lagging = Lagging(Fake::cluster());
        assert_allowed(&create_confirmed("just-created", &lagging), Reason::Valid);
        assert_eq!(
            create_confirmed("ghost", &lagging).reason,
            Reason::NodeNotFound,
            "a node the API server does not have either is still denied"
        );
    }

    #[test]
    fn node_check_comes_before_duplicate_check() {
        let mut f = Fake::cluster();
        f.maintained = Some(["ghost".to_string()].into());
        assert_eq!(create("ghost", &f).reason, Reason::NodeNotFound);
    }

    #[test]
    fn duplicate_check_comes_before_quorum() {
        let mut f = Fake::cluster().openshift(&[0], Some(GuardPodReadiness::Ready));
        f.maintained = Some(["cp-1".to_string()].into());
        assert_eq!(create("cp-1", &f).reason, Reason::Duplicate);
    }

    #[test]
    fn control_plane_node_outside_openshift_is_allowed() {
        assert_allowed(&create("cp-1", &Fake::cluster()), Reason::Valid);
    }

    #[test]
    fn worker_on_openshift_skips_quorum() {
        // Even with no PDB at all (which denies control-plane nodes).
        let f = Fake::cluster().openshift(&[], None);
        assert_allowed(&create("worker-1", &f), Reason::Valid);
    }

    const QUORUM_MSG: &str = "can not put master/control-plane node into maintenance at this moment, disrupting node cp-1 will violate etcd quorum";

    #[test]
    fn quorum_no_pdb_denies() {
        let f = Fake::cluster().openshift(&[], Some(GuardPodReadiness::NotReady));
        assert_denied(&create("cp-1", &f), Reason::QuorumNoPdb, QUORUM_MSG);
    }

    #[test]
    fn quorum_two_pdbs_deny() {
        let f = Fake::cluster().openshift(&[1, 1], None);
        assert_denied(&create("cp-1", &f), Reason::QuorumSeveralPdbs, QUORUM_MSG);
    }

    #[test]
    fn quorum_disruptions_allowed_allows() {
        let f = Fake::cluster().openshift(&[1], Some(GuardPodReadiness::Ready));
        assert_allowed(&create("cp-1", &f), Reason::QuorumDisruptionAllowed);
    }

    #[test]
    fn quorum_ready_guard_denies() {
        let f = Fake::cluster().openshift(&[0], Some(GuardPodReadiness::Ready));
        assert_denied(&create("cp-1", &f), Reason::QuorumViolation, QUORUM_MSG);
    }

    #[test]
    fn quorum_unknown_guard_denies() {
        let f = Fake::cluster().openshift(&[0], Some(GuardPodReadiness::Unknown));
        assert_denied(&create("cp-1", &f), Reason::QuorumViolation, QUORUM_MSG);
    }

    #[test]
    fn quorum_not_ready_guard_allows() {
        let f = Fake::cluster().openshift(&[0], Some(GuardPodReadiness::NotReady));
        assert_allowed(&create("cp-1", &f), Reason::QuorumAlreadyDisrupted);
    }

    #[test]
    fn quorum_absent_guard_allows() {
        let f = Fake::cluster().openshift(&[0], None);
        assert_allowed(&create("cp-1", &f), Reason::QuorumNoGuardPod);
    }

    #[test]
    fn unsynced_caches_deny_with_please_try_again() {
        let mut f = Fake::cluster();
        f.nodes = None;
        let d = create("worker-1", &f);
        assert_denied(
            &d,
            Reason::LookupUnavailable,
            "could not get node for validating spec.NodeName, please try again: node cache not synced",
        );

        let mut f = Fake::cluster();
        f.maintained = None;
        let d = create("worker-1", &f);
        assert_eq!(d.reason, Reason::LookupUnavailable);
        assert!(
            d.message
                .contains("please try again: NodeMaintenance cache not synced"),
            "{d:?}"
        );

        let mut f = Fake::cluster();
        f.openshift = None;
        let d = create("worker-1", &f);
        assert_eq!(d.reason, Reason::LookupUnavailable);
        assert!(
            d.message.contains("please try again: discovery pending"),
            "{d:?}"
        );

        let mut f = Fake::cluster();
        f.openshift = Some(true);
        let d = create("cp-1", &f);
        assert_eq!(d.reason, Reason::LookupUnavailable);
        assert!(
            d.message.starts_with("could not get PodDisruptionBudget for master/control-plane quorum validation, please try again"),
            "{d:?}"
        );
        // ... but a worker on OpenShift does not need the etcd caches.
        assert_allowed(&create("worker-1", &f), Reason::Valid);
    }

    #[test]
    fn update_changing_node_name_is_denied() {
        let d = update("worker-1", "worker-2", "before");
        assert_denied(
            &d,
            Reason::NodeNameImmutable,
            "updating spec.NodeName isn't allowed",
        );
        assert_eq!(d.node.as_deref(), Some("worker-2"));
    }

    #[test]
    fn update_changing_reason_is_allowed() {
        assert_allowed(
            &update("worker-1", "worker-1", "after"),
            Reason::NodeNameUnchanged,
        );
    }

    fn review_with(
        op: &str,
        object: serde_json::Value,
        old: serde_json::Value,
        kind: &str,
    ) -> Decision {
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "uid-3", "name": "nm-x", "operation": op,
                "kind": {"group": if kind == KIND { GROUP } else { "" }, "version": "v1", "kind": kind},
                "userInfo": {"username": "bob"},
                "object": object, "oldObject": old,
            }
        });
        decide(
            &decode(body.to_string().as_bytes()).expect("valid"),
            &Fake::cluster(),
            Policy::default(),
        )
    }

    #[test]
    fn delete_and_connect_are_not_validated() {
        let null = serde_json::Value::Null;
        for op in ["DELETE", "CONNECT", "SOMETHING"] {
            let d = review_with(op, null.clone(), null.clone(), KIND);
            assert_allowed(&d, Reason::NotValidated);
            assert_eq!(d.object, "nm-x");
        }
    }

    #[test]
    fn unreadable_objects_get_a_400_denial() {
        let null = serde_json::Value::Null;
        let d = review_with("CREATE", null.clone(), null.clone(), KIND);
        assert!(!d.allowed);
        assert_eq!((d.code, d.reason), (400, Reason::Malformed));
        assert!(d.message.contains("has no request.object"), "{d:?}");

        let d = review_with(
            "CREATE",
            serde_json::json!({"spec": {"nodeName": 5}}),
            null.clone(),
            KIND,
        );
        assert_eq!((d.code, d.reason), (400, Reason::Malformed));
        assert!(d.message.contains("cannot read request.object"), "{d:?}");

        let ok =
            serde_json::json!({"metadata": {"name": "nm-x"}, "spec": {"nodeName": "worker-1"}});
        let d = review_with("UPDATE", ok, null, KIND);
        assert_eq!((d.code, d.reason), (400, Reason::Malformed));
        assert!(d.message.contains("request.oldObject"), "{d:?}");
    }

    #[test]
    fn other_resources_are_refused() {
        let d = review_with(
            "CREATE",
            serde_json::json!({}),
            serde_json::Value::Null,
            "Pod",
        );
        assert!(!d.allowed);
        assert_eq!((d.code, d.reason), (400, Reason::UnexpectedResource));
    }
}
