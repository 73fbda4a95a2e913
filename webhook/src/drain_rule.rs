//! NodeDrainRule admission (beyond upstream): a rule is admitted only if
//! the controller can act on it, checked with the controller's own parser
//! (`shared::rules::drain::Rule::compile`); a denial names every field in
//! error. The API server's schema already refuses an unknown behaviour.

use shared::api::drain_rule::NodeDrainRule;
use shared::rules::drain::Rule;

use crate::review::{Operation, ReviewRequest};
use crate::validate::{Decision, Reason};

/// The kind this module decides on (group `nodemaintenance.medik8s.io`).
pub const KIND: &str = "NodeDrainRule";

/// Decide on a review of a NodeDrainRule.
pub fn decide(req: &ReviewRequest) -> Decision {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Decision::allow(Reason::NotValidated).named(&req.name);
    }
    let Some(raw) = req.object.as_deref() else {
        return Decision::malformed(
            Reason::Malformed,
            format!(
                "the {} review of NodeDrainRule {:?} has no request.object",
                req.operation.as_str(),
                req.name
            ),
        );
    };
    let rule: NodeDrainRule = match serde_json::from_str(raw.get()) {
        Ok(rule) => rule,
        Err(e) => {
            return Decision::malformed(
                Reason::Malformed,
                format!(
                    "cannot read request.object of NodeDrainRule {:?}: {e}",
                    req.name
                ),
            );
        }
    };
    let name = rule
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| req.name.clone());
    match Rule::compile(&name, &rule.spec) {
        Ok(_) => Decision::allow(Reason::DrainRuleValid).named(&name),
        Err(errors) => {
            let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Decision::deny(
                Reason::InvalidDrainRule,
                format!(
                    "NodeDrainRule {name} is not valid: {}; fix the field(s) named and apply it again",
                    listed.join("; ")
                ),
            )
            .named(&name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review(operation: &str, object: serde_json::Value) -> ReviewRequest {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1", "operation": operation, "name": "r",
                "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1alpha1", "kind": "NodeDrainRule"},
                "userInfo": {"username": "admin"},
                "object": object
            }
        });
        crate::review::decode(body.to_string().as_bytes()).expect("a review")
    }

    fn rule(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "nodemaintenance.medik8s.io/v1alpha1", "kind": "NodeDrainRule",
            "metadata": {"name": "r"}, "spec": spec})
    }

    #[test]
    fn rules_are_admitted_or_denied_naming_the_field() {
        // (case, operation, spec, allowed, words of the message)
        let cases = [
            (
                "a good rule",
                "CREATE",
                json!({"drain": {"behavior": "Drain", "order": 5},
                "pods": [{"selector": {"matchLabels": {"app": "osd"}}}]}),
                true,
                "",
            ),
            (
                "an order on Skip",
                "CREATE",
                json!({"drain": {"behavior": "Skip", "order": 5}}),
                false,
                "spec.drain.order: an order is for behavior Drain only",
            ),
            (
                "a bad operator on update",
                "UPDATE",
                json!({"drain": {"behavior": "Skip"},
                "pods": [{"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Equals", "values": ["a"]}]}}]}),
                false,
                "spec.pods[0].namespaceSelector.matchExpressions[0].operator: unknown operator \"Equals\"",
            ),
            (
                "a bad node label key",
                "CREATE",
                json!({"drain": {"behavior": "WaitCompleted"},
                "nodes": [{"selector": {"matchLabels": {"-pool": "a"}}}]}),
                false,
                "spec.nodes[0].selector.matchLabels[\"-pool\"]",
            ),
        ];
        for (name, op, spec, allowed, words) in cases {
            let d = decide(&review(op, rule(spec)));
            assert_eq!(d.allowed, allowed, "{name}: {d:?}");
            assert!(d.message.contains(words), "{name}: {}", d.message);
            if !allowed {
                assert!(
                    d.message.starts_with("NodeDrainRule r is not valid: "),
                    "{name}: {}",
                    d.message
                );
                assert_eq!(d.code, 403, "{name}");
            }
        }
        let unreadable = decide(&review("CREATE", rule(json!({"drain": {"behavior": 3}}))));
        assert_eq!(
            (unreadable.allowed, unreadable.code),
            (false, 400),
            "{unreadable:?}"
        );
    }
}
