//! The reconciler's errors: what failed, on which object, and whether it
//! is a conflict (decided again on a fresh read), a refusal (reported on
//! the object) or a plain failure (retried).

use std::time::Duration;

use crate::drain;
use crate::node_lease::LeaseError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to {action} node {node}: {source}")]
    Node {
        action: &'static str,
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "node {node} changed while we patched it (someone updated its taints at the same time); retrying with a fresh copy"
    )]
    NodeChanged { node: String },
    /// The API server refused the node patch itself (not a conflict): a
    /// ValidatingAdmissionPolicy, an admission webhook or the node's
    /// validation. Reported on the object (lastError, Blocked, a Warning
    /// event) and retried.
    #[error(
        "the API server refused the controller's patch of node {node} ({action}): {message}; \
         an admission policy or webhook refusing updates of this node is the usual cause: \
         let the controller's node patches through (the controller retries until one is accepted)"
    )]
    NodeRefused {
        action: &'static str,
        node: String,
        /// The API server's words.
        message: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to {action} NodeMaintenance {name}: {source}")]
    NodeMaintenance {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Pods(#[from] drain::ListPodsError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(
        "reconcile took longer than {0:?} (the API server is slow or a request hung); retrying"
    )]
    Timeout(Duration),
    /// A bug: the reconcile panicked. Recorded on the object (see
    /// [`record_panic`]); the process and the other maintenances go on.
    #[error("{0}")]
    Panicked(String),
}

impl Error {
    /// A write refused because our copy of the object was outdated (HTTP 409).
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::NodeMaintenance { source, .. } => {
                matches!(source, kube::Error::Api(s) if s.code == 409)
            }
            Error::NodeChanged { .. } => true,
            _ => false,
        }
    }

    /// The NodeMaintenance itself is gone (HTTP 404 on it): someone removed
    /// its finalizer while we worked on it.
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::NodeMaintenance { source: kube::Error::Api(s), .. } if s.code == 404)
    }

    /// Label for the error metric and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Node { .. } => "node",
            Error::NodeChanged { .. } => "node_changed",
            Error::NodeRefused { .. } => "node_refused",
            Error::NodeMaintenance { .. } => "nodemaintenance",
            Error::Pods(_) => "pods",
            Error::Lease(_) => "lease",
            Error::Timeout(_) => "timeout",
            Error::Panicked(_) => "panic",
        }
    }
}

/// What the API server says when a JSON patch cannot be applied to the
/// stored object, a failed `test` operation included: apiserver's
/// patch.go answers `NewGenericServerResponse(422, ...)`, which drops the
/// patch library's own words ("testing value /spec/taints failed") and
/// leaves this text, reason Invalid, no details.
const JSON_PATCH_NOT_APPLICABLE: &str =
    "the server rejected our request due to an error in our request";

/// Whether the answer to a node JSON patch says the node moved on since we
/// read it: a 409, or the 422 of a patch that no longer applies (our patch
/// opens with a `test` of the taints we read). Any other 422 is a refusal:
/// a ValidatingAdmissionPolicy (`nodes "x" is forbidden:
/// ValidatingAdmissionPolicy '...' with binding '...' denied request: ...`)
/// or the node's validation (`Node "x" is invalid: ...`) answer 422 with
/// reason Invalid too, but with their own message and details.
fn node_moved_on(s: &kube::core::Status) -> bool {
    s.code == 409
        || (s.code == 422
            && s.message == JSON_PATCH_NOT_APPLICABLE
            && s.details.as_ref().is_none_or(|d| d.causes.is_empty()))
}

/// The error of a failed node patch: a conflict (decided again on a fresh
/// read), a refusal (400: an admission webhook's default; 403: a policy or
/// webhook answering Forbidden, or RBAC; 422: a policy or the node's
/// validation), or anything else (the API server unreachable, busy, ...).
pub(super) fn node_patch_error(node: &str, action: &'static str, source: kube::Error) -> Error {
    match &source {
        kube::Error::Api(s) if node_moved_on(s) => Error::NodeChanged {
            node: node.to_string(),
        },
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422) => Error::NodeRefused {
            action,
            node: node.to_string(),
            message: s.message.clone(),
            source,
        },
        _ => Error::Node {
            action,
            node: node.to_string(),
            source,
        },
    }
}
