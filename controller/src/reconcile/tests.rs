//! The reconciler's orchestration against a mocked API server (kube's
//! `tower-test` mock service answered by [`fake::FakeApi`], a small
//! in-memory API server): each scenario reads as the API calls a pass
//! makes and what it leaves behind. The integration tests prove the same
//! against a real API server.

mod drain_rules;
mod fake;
mod gates;
mod load_balancers;
mod node_signals;
mod scenarios;

use std::sync::Arc;

use serde_json::json;
use shared::NodeMaintenance;
use shared::api::consts::FINALIZER;

use super::error::node_patch_error;
use super::{Ctx, Error, error_policy, reconcile};
use crate::leadership::Leadership;
use crate::metrics::Metrics;
use fake::FakeApi;

/// The time of every pass in these tests: a Saturday, 01:30 UTC.
pub(super) const TEST_NOW: k8s_openapi::jiff::Timestamp =
    k8s_openapi::jiff::Timestamp::constant(1_796_434_200, 0);

/// `spec.reason` that makes `step` panic (test builds only).
pub const PANIC_REASON: &str = "nmo-test: panic in step";

/// A context whose client is the fake API's; leader election off (leading).
/// The node lifecycle conditions are off here: the scenarios list every
/// request a pass makes without them; `scenarios::node_conditions_*` turn
/// them on.
pub(super) async fn fake_ctx(api: &FakeApi) -> Arc<Ctx> {
    fake_ctx_with(api, &["--node-lifecycle-conditions=false"]).await
}

/// [`fake_ctx`] with controller flags.
pub(super) async fn fake_ctx_with(api: &FakeApi, flags: &[&str]) -> Arc<Ctx> {
    fake_ctx_ruled(api, flags, crate::drain::DrainRules::none()).await
}

/// [`fake_ctx_with`] whose drains read `rules`.
pub(super) async fn fake_ctx_ruled(
    api: &FakeApi,
    flags: &[&str],
    rules: crate::drain::DrainRules,
) -> Arc<Ctx> {
    let client = api.client();
    let args = std::iter::once("nmo-controller").chain(flags.iter().copied());
    let cfg = <crate::config::Config as clap::Parser>::parse_from(args);
    let metrics = Metrics::new().expect("metrics");
    let (leadership, _) = Leadership::start(client.clone(), &cfg, &metrics)
        .await
        .expect("leading without an election");
    let (store, _writer) = kube::runtime::reflector::store();
    let clients = crate::serving::Clients {
        api: client.clone(),
        evict: client,
    };
    let fleet = crate::fleet::Fleet::new(cfg.gates.gates()).expect("the gates of the test flags");
    let mut ctx = Ctx::new(&cfg, clients, store, metrics, &leadership, fleet, rules);
    ctx.events = ctx.events.inline();
    Arc::new(ctx.with_clock(crate::clock::Clock::set_at(TEST_NOW)))
}

fn nm(reason: &str) -> NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": "nm-1", "uid": "u-1", "resourceVersion": "7",
            "finalizers": [FINALIZER]},
        "spec": {"nodeName": "worker-1", "reason": reason}
    }))
    .expect("NodeMaintenance JSON")
}

#[tokio::test]
async fn a_panic_is_recorded_and_the_controller_goes_on() {
    let api = FakeApi::start();
    let obj = nm(PANIC_REASON);
    api.put(fake::NM_PATH, serde_json::to_value(&obj).expect("nm JSON"));
    let ctx = fake_ctx(&api).await;
    let result = reconcile(Arc::new(obj), ctx.clone()).await;
    let Err(Error::Panicked(text)) = &result else {
        panic!("a panic comes back as Error::Panicked: {result:?}");
    };
    assert!(text.contains("injected by the test"), "{text}");
    // error_policy handles it like any error: retry later, no exit.
    let _ = error_policy(
        Arc::new(nm(PANIC_REASON)),
        result.as_ref().expect_err("err"),
        ctx.clone(),
    );
    let mut metrics = String::new();
    prometheus::TextEncoder::new()
        .encode_utf8(&ctx.metrics.registry.gather(), &mut metrics)
        .expect("metrics text");
    assert!(
        metrics.contains(
            "controller_runtime_reconcile_panics_total{controller=\"nodemaintenance\"} 1"
        ),
        "{metrics}"
    );
    assert_eq!(
        api.calls(),
        [
            "GET /apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances/nm-1",
            "PATCH /apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances/nm-1/status",
            "POST /api/v1/namespaces/default/events",
        ],
    );
    let status = api.status();
    assert_eq!(status["phase"], "Failed", "{status}");
    assert_eq!(status["lastError"].as_str(), Some(text.as_str()));
    assert_eq!(
        fake::condition(&status, "Failed"),
        Some(("True".into(), "InternalError".into()))
    );
    assert_eq!(
        api.events(),
        [("Warning".to_string(), "FailedMaintenance".to_string())]
    );
}

/// Answers of kube-apiserver v1.34.4 (the local plane) to a node JSON
/// patch, captured with `kubectl patch node ... --type=json -v=8`.
mod answers {
    /// `[{"op":"test","path":"/spec/taints","value":[]}, ...]` on a node
    /// with a taint: the failed `test` (patch.go drops the patch
    /// library's words).
    pub const TEST_OP_FAILED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}"#;
    /// A ValidatingAdmissionPolicy (validationActions [Deny], no
    /// `reason`, so Invalid) freezing the node's spec.
    pub const VAP_DENIED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes \"refusal-probe-23922\" is forbidden: ValidatingAdmissionPolicy 'refusal-probe-23922' with binding 'refusal-probe-23922' denied request: node refusal-probe-23922 is frozen by policy refusal-probe-23922: its spec may not change","reason":"Invalid","details":{"name":"refusal-probe-23922","kind":"nodes","causes":[{"message":"ValidatingAdmissionPolicy 'refusal-probe-23922' with binding 'refusal-probe-23922' denied request: node refusal-probe-23922 is frozen by policy refusal-probe-23922: its spec may not change"}]},"code":422}"#;
    /// The node's own validation (a taint with effect "Bogus").
    pub const NODE_INVALID: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Node \"refusal-probe-23922\" is invalid: metadata.taints[0].effect: Unsupported value: \"Bogus\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"","reason":"Invalid","details":{"name":"refusal-probe-23922","kind":"Node","causes":[{"reason":"FieldValueNotSupported","message":"Unsupported value: \"Bogus\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"","field":"metadata.taints[0].effect"},{"reason":"FieldValueNotSupported","message":"Unsupported value: \"Bogus\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"","field":"metadata.taints[0].effect"}]},"code":422}"#;
    /// Not captured: an update against an outdated resourceVersion, as
    /// apimachinery's NewConflict words it.
    pub const CONFLICT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on nodes \"worker-1\": the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","details":{"name":"worker-1","kind":"nodes"},"code":409}"#;
    /// Not captured: an admission webhook's denial without a code
    /// (apiserver's ToStatusErr makes it 400).
    pub const WEBHOOK_DENIED: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"admission webhook \"nodes.example.com\" denied the request: nodes are frozen","code":400}"#;
}

fn api_error(body: &str) -> kube::Error {
    let status: kube::core::Status = serde_json::from_str(body).expect("a Status");
    kube::Error::Api(Box::new(status))
}

#[test]
fn a_failed_test_op_or_409_is_a_conflict() {
    for body in [answers::TEST_OP_FAILED, answers::CONFLICT] {
        let e = node_patch_error("worker-1", "put into maintenance", api_error(body));
        assert!(
            matches!(&e, Error::NodeChanged { node } if node == "worker-1"),
            "{body}: {e:?}"
        );
        assert!(e.is_conflict());
    }
}

#[test]
fn a_refused_node_patch_is_reported_not_retried_as_a_conflict() {
    let cases = [
        (
            answers::VAP_DENIED,
            "ValidatingAdmissionPolicy 'refusal-probe-23922' with binding 'refusal-probe-23922' denied request: node refusal-probe-23922 is frozen",
        ),
        (
            answers::NODE_INVALID,
            "Node \"refusal-probe-23922\" is invalid",
        ),
        (
            answers::WEBHOOK_DENIED,
            "admission webhook \"nodes.example.com\" denied the request",
        ),
    ];
    for (body, words) in cases {
        let e = node_patch_error("worker-1", "put into maintenance", api_error(body));
        assert!(matches!(e, Error::NodeRefused { .. }), "{body}: {e:?}");
        assert!(!e.is_conflict(), "{body}");
        assert_eq!(e.kind(), "node_refused");
        let text = e.to_string();
        for want in [
            "node worker-1 (put into maintenance)",
            words,
            "admission policy or webhook",
            "the controller retries",
        ] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
    }
}

#[test]
fn other_node_patch_failures_stay_plain_errors() {
    let busy = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server is currently unable to handle the request","reason":"ServiceUnavailable","code":503}"#;
    let e = node_patch_error("worker-1", "give back", api_error(busy));
    assert!(matches!(e, Error::Node { .. }), "{e:?}");
    assert!(!e.is_conflict());
}
