//! AdmissionReview v1 on the wire.
//!
//! Decoding is done in two steps so that every input that carries a request uid
//! gets a well-formed answer: the envelope first (uid, operation, user, kind,
//! with the objects kept as raw JSON), the NodeMaintenance objects only when a
//! rule needs them. When even the envelope does not decode, a second, minimal
//! pass looks for just `request.uid`. Only input with no recoverable uid is
//! refused at the HTTP level (400).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub const API_VERSION_V1: &str = "admission.k8s.io/v1";
pub const REVIEW_KIND: &str = "AdmissionReview";

/// `request.kind` / group-version-kind of the object under review.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct Gvk {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// The operation of an admission request; unknown values are kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
    Other(String),
}

impl Operation {
    fn parse(s: &str) -> Self {
        match s {
            "CREATE" => Operation::Create,
            "UPDATE" => Operation::Update,
            "DELETE" => Operation::Delete,
            "CONNECT" => Operation::Connect,
            other => Operation::Other(other.to_string()),
        }
    }

    /// Metric label: the four operations by name, anything else as "OTHER"
    /// (keeps label cardinality bounded whatever a client sends).
    pub fn label(&self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
            Operation::Other(_) => "OTHER",
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Operation::Other(s) => s,
            known => known.label(),
        }
    }
}

/// One decoded admission request. Objects stay raw until a rule decodes them.
#[derive(Debug)]
pub struct ReviewRequest {
    pub uid: String,
    pub kind: Gvk,
    pub sub_resource: Option<String>,
    pub name: String,
    pub operation: Operation,
    pub user: String,
    pub dry_run: bool,
    pub object: Option<Box<RawValue>>,
    pub old_object: Option<Box<RawValue>>,
}

/// Why a body could not be turned into a [`ReviewRequest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    /// The request uid when it could still be read: the caller then answers
    /// with a denial instead of an HTTP error.
    pub uid: Option<String>,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    request: Option<RawRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest {
    uid: String,
    kind: Gvk,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    operation: String,
    #[serde(default)]
    user_info: Option<UserInfo>,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(default)]
    object: Option<Box<RawValue>>,
    #[serde(default)]
    old_object: Option<Box<RawValue>>,
}

#[derive(Deserialize, Default)]
struct UserInfo {
    #[serde(default)]
    username: Option<String>,
}

/// Minimal shape used to recover the uid from an otherwise undecodable review.
#[derive(Deserialize)]
struct UidProbe {
    request: UidOnly,
}

#[derive(Deserialize)]
struct UidOnly {
    uid: String,
}

fn recover_uid(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<UidProbe>(body)
        .ok()
        .map(|p| p.request.uid)
        .filter(|uid| !uid.is_empty())
}

/// Decode an AdmissionReview v1 request body.
pub fn decode(body: &[u8]) -> Result<ReviewRequest, DecodeError> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| DecodeError {
        uid: recover_uid(body),
        message: format!(
            "cannot decode the AdmissionReview: {e}; the webhook expects an admission.k8s.io/v1 \
             AdmissionReview with a request"
        ),
    })?;
    let Some(req) = envelope.request else {
        return Err(DecodeError {
            uid: None,
            message: "the AdmissionReview has no request: nothing to review".to_string(),
        });
    };
    if req.uid.is_empty() {
        return Err(DecodeError {
            uid: None,
            message: "the AdmissionReview request has an empty uid".to_string(),
        });
    }
    let api_version = envelope.api_version.unwrap_or_default();
    let kind = envelope.kind.unwrap_or_default();
    if api_version != API_VERSION_V1 || kind != REVIEW_KIND {
        return Err(DecodeError {
            uid: Some(req.uid),
            message: format!(
                "unsupported review apiVersion {api_version:?} kind {kind:?}: this webhook speaks \
                 {API_VERSION_V1} {REVIEW_KIND} only; set admissionReviewVersions: [v1] in the \
                 ValidatingWebhookConfiguration"
            ),
        });
    }
    Ok(ReviewRequest {
        uid: req.uid,
        kind: req.kind,
        sub_resource: req.sub_resource.filter(|s| !s.is_empty()),
        name: req.name.unwrap_or_default(),
        operation: Operation::parse(&req.operation),
        user: req.user_info.and_then(|u| u.username).unwrap_or_default(),
        dry_run: req.dry_run.unwrap_or(false),
        object: req.object,
        old_object: req.old_object,
    })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    status: StatusOut<'a>,
    /// Shown by kubectl as "Warning: ..." (AdmissionReview v1 `response.warnings`).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

/// metav1.Status as controller-runtime fills it: code always, reason and
/// message only when set.
#[derive(Serialize)]
struct StatusOut<'a> {
    code: u16,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
}

/// Encode an AdmissionReview v1 response. `code` is the status code the API
/// server reports to its client (200 allowed, 403 denied, 400 bad request).
pub fn encode_response(uid: &str, allowed: bool, code: u16, message: &str) -> Vec<u8> {
    encode_response_with_warnings(uid, allowed, code, message, &[])
}

/// [`encode_response`] plus `response.warnings` (left out when empty).
pub fn encode_response_with_warnings(
    uid: &str,
    allowed: bool,
    code: u16,
    message: &str,
    warnings: &[String],
) -> Vec<u8> {
    let reason = match code {
        403 => "Forbidden",
        400 => "BadRequest",
        _ => "",
    };
    let review = ReviewOut {
        api_version: API_VERSION_V1,
        kind: REVIEW_KIND,
        response: ResponseOut {
            uid,
            allowed,
            status: StatusOut {
                code,
                reason,
                message,
            },
            warnings,
        },
    };
    // Serializing these plain structs cannot fail; fall back to a hand-written
    // denial anyway rather than panic on the request path.
    serde_json::to_vec(&review).unwrap_or_else(|_| {
        format!(
            r#"{{"apiVersion":"{API_VERSION_V1}","kind":"{REVIEW_KIND}","response":{{"uid":{},"allowed":false,"status":{{"code":400}}}}}}"#,
            serde_json::Value::String(uid.to_string())
        )
        .into_bytes()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A realistic CREATE review as the API server sends it.
    pub fn create_review(uid: &str, name: &str, node: &str) -> String {
        format!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"{uid}","kind":{{"group":"nodemaintenance.medik8s.io","version":"v1beta1","kind":"NodeMaintenance"}},"resource":{{"group":"nodemaintenance.medik8s.io","version":"v1beta1","resource":"nodemaintenances"}},"requestKind":{{"group":"nodemaintenance.medik8s.io","version":"v1beta1","kind":"NodeMaintenance"}},"name":"{name}","operation":"CREATE","userInfo":{{"username":"admin","groups":["system:masters","system:authenticated"]}},"object":{{"apiVersion":"nodemaintenance.medik8s.io/v1beta1","kind":"NodeMaintenance","metadata":{{"name":"{name}","creationTimestamp":null,"managedFields":[{{"manager":"kubectl","operation":"Update","apiVersion":"nodemaintenance.medik8s.io/v1beta1","time":"2026-11-29T10:00:00Z","fieldsType":"FieldsV1","fieldsV1":{{"f:spec":{{".":{{}},"f:nodeName":{{}},"f:reason":{{}}}}}}}}]}},"spec":{{"nodeName":"{node}","reason":"test"}}}},"oldObject":null,"dryRun":false,"options":{{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}}}}}}"#
        )
    }

    #[test]
    fn decodes_an_api_server_review() {
        let r = decode(create_review("u-1", "nm-1", "worker-1").as_bytes()).expect("decodes");
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.operation, Operation::Create);
        assert_eq!(r.user, "admin");
        assert_eq!(r.name, "nm-1");
        assert_eq!(r.kind.kind, "NodeMaintenance");
        assert!(r.object.is_some());
        assert!(r.old_object.is_none(), "null oldObject is None");
    }

    #[test]
    fn broken_json_has_no_uid() {
        let e = decode(b"{not json").expect_err("fails");
        assert_eq!(e.uid, None);
        assert!(
            e.message.contains("cannot decode the AdmissionReview"),
            "{e}"
        );
    }

    #[test]
    fn missing_request_has_no_uid() {
        let e = decode(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#)
            .expect_err("fails");
        assert_eq!(e.uid, None);
    }

    #[test]
    fn uid_is_recovered_from_an_incomplete_request() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-2","operation":7}}"#;
        let e = decode(body).expect_err("fails");
        assert_eq!(e.uid.as_deref(), Some("u-2"));
    }

    #[test]
    fn wrong_version_is_denied_with_uid() {
        let body = create_review("u-3", "nm", "n")
            .replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1");
        let e = decode(body.as_bytes()).expect_err("fails");
        assert_eq!(e.uid.as_deref(), Some("u-3"));
        assert!(e.message.contains("admission.k8s.io/v1beta1"), "{e}");
        let body = create_review("u-4", "nm", "n").replace("\"AdmissionReview\"", "\"Pod\"");
        assert_eq!(
            decode(body.as_bytes()).expect_err("fails").uid.as_deref(),
            Some("u-4")
        );
    }

    #[test]
    fn response_shape_matches_controller_runtime() {
        let v: serde_json::Value =
            serde_json::from_slice(&encode_response("u", false, 403, "no")).expect("json");
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": "u", "allowed": false,
                             "status": {"code": 403, "reason": "Forbidden", "message": "no"}}
            })
        );
        let v: serde_json::Value =
            serde_json::from_slice(&encode_response("u", true, 200, "")).expect("json");
        assert_eq!(v["response"]["status"], serde_json::json!({"code": 200}));
        assert!(
            v["response"].get("warnings").is_none(),
            "no warnings: no field"
        );
    }

    #[test]
    fn warnings_go_in_the_response() {
        let w = vec!["pod a/b has no controller".to_string(), "x".to_string()];
        let v: serde_json::Value =
            serde_json::from_slice(&encode_response_with_warnings("u", true, 200, "", &w))
                .expect("json");
        assert_eq!(
            v["response"],
            serde_json::json!({"uid": "u", "allowed": true, "status": {"code": 200},
                               "warnings": ["pod a/b has no controller", "x"]})
        );
    }
}
