//! A node update the API server refuses (a ValidatingAdmissionPolicy here)
//! is reported on the NodeMaintenance (lastError, the Blocked condition, one
//! Warning event), not retried silently as a conflict; once the policy goes,
//! the maintenance goes on. Issue 22 item 3.

use std::time::{Duration, Instant};

use futures::FutureExt as _;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nmo_tests::controller_env::{ControllerEnv as Env, LONG, events_of};
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

/// How soon the refusal must show on the object (before the fix it never
/// did: the 422 was taken for a conflict and retried in silence).
const REPORTED_WITHIN: Duration = Duration::from_secs(10);

/// A policy and its binding, both named `name`, that freeze the spec of the
/// node labelled `kubernetes.io/hostname=<node>` (every node update changing
/// its spec is denied with `message`).
async fn freeze_node_spec(client: &Client, name: &str, node: &str, message: &str) {
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["nodes"]
            }]},
            "validations": [{
                "expression": "object.spec == oldObject.spec",
                "message": message
            }]
        }
    }))
    .expect("policy JSON");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"objectSelector": {"matchLabels": {"kubernetes.io/hostname": node}}}
        }
    }))
    .expect("binding JSON");
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("policy created");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding created");
}

/// Delete the policy and binding `name` (best effort: also the cleanup).
async fn lift_freeze(client: &Client, name: &str) {
    let dp = DeleteParams::default();
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete(name, &dp)
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .delete(name, &dp)
        .await;
}

/// Wait until the API server's admission applies the new policy: a dry-run
/// cordon of `node` is refused with `message`.
async fn wait_policy_enforced(client: &Client, node: &str, message: &str) {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    until("the API server to enforce the policy", LONG, || {
        let nodes = nodes.clone();
        let dry_run = dry_run.clone();
        async move {
            let patch = Patch::Merge(json!({"spec": {"unschedulable": true}}));
            Ok(match nodes.patch(node, &dry_run, &patch).await {
                Err(kube::Error::Api(s)) if s.message.contains(message) => Poll::Ready(()),
                other => Poll::Pending(format!("{other:?}")),
            })
        }
    })
    .await
    .expect("policy enforced");
}

/// The Blocked condition of `nm`: (status, reason, message).
fn blocked(nm: &NodeMaintenance) -> Option<(String, String, String)> {
    nm.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_node_update_is_reported_and_retried_until_let_through() {
    let env = Env::new("nm-refused", 1).await;
    let client = env.client();
    let policy = env.n("freeze");
    let result = std::panic::AssertUnwindSafe(refused_then_let_through(&env, &policy))
        .catch_unwind()
        .await;
    // The policy and binding are cluster-wide: gone even when the test failed.
    lift_freeze(&client, &policy).await;
    // The NodeMaintenance goes while its controller runs (it gives the node
    // back and drops the finalizer); teardown stops the controller.
    let name = env.n("a");
    let nms = env.nms();
    let _ = nms.delete(&name, &DeleteParams::default()).await;
    let gone = until("the NodeMaintenance to be deleted", LONG, || {
        let nms = nms.clone();
        let name = name.clone();
        async move {
            Ok(match nms.get_opt(&name).await? {
                None => Poll::Ready(()),
                Some(nm) => Poll::Pending(format!("finalizers {:?}", nm.metadata.finalizers)),
            })
        }
    })
    .await;
    env.teardown().await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    gone.expect("NodeMaintenance deleted");
}

async fn refused_then_let_through(env: &Env, policy: &str) {
    let client = env.client();
    let target = env.target().await;
    let message = format!("node {target} is frozen by test policy {policy}");
    freeze_node_spec(&client, policy, &target, &message).await;
    wait_policy_enforced(&client, &target, &message).await;

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let nms = env.nms();
    let started = Instant::now();
    let nm = until(
        "lastError to carry the policy's words",
        REPORTED_WITHIN,
        || {
            let nms = nms.clone();
            let name = name.clone();
            let message = message.clone();
            async move {
                let nm = nms.get(&name).await?;
                let err = nm
                    .status
                    .as_ref()
                    .map(|s| s.last_error.clone())
                    .unwrap_or_default();
                Ok(if err.contains(&message) {
                    Poll::Ready(nm)
                } else {
                    Poll::Pending(format!("status {}", serde_json::to_string(&nm.status)?))
                })
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    println!("refusal reported after {:?}", started.elapsed());
    println!(
        "lastError: {}",
        nm.status
            .as_ref()
            .map(|s| s.last_error.as_str())
            .unwrap_or_default()
    );

    let st = nm.status.clone().expect("status");
    for want in [
        format!("ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request"),
        format!("node {target}"),
        "admission policy or webhook".to_string(),
        "the controller retries".to_string(),
    ] {
        assert!(
            st.last_error.contains(&want),
            "{want:?} in {}",
            st.last_error
        );
    }
    assert_eq!(st.phase, Some(MaintenancePhase::Running), "{st:?}");
    let (on, reason, said) = blocked(&nm).expect("a Blocked condition");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "NodeUpdateRefused")
    );
    assert_eq!(said, st.last_error);

    // The node was left as it was.
    let node = env.nodes().get(&target).await.expect("node");
    assert!(
        !nmo_tests::controller_env::is_cordoned(&node),
        "the policy kept the cordon off"
    );

    // Retries go on (lastUpdate moves), one Warning all the same.
    let first = st.last_update.clone().expect("lastUpdate");
    env.wait_nm(&name, "a later refused retry", |nm| {
        nm.status
            .as_ref()
            .and_then(|s| s.last_update.as_ref())
            .is_some_and(|t| t.0 > first.0)
    })
    .await;
    let warnings: Vec<_> = events_of(&client, &name)
        .await
        .into_iter()
        .filter(|e| e.1 == "NodeUpdateRefused")
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "Warning");
    assert!(warnings[0].2.contains(&message), "{warnings:?}");

    lift_freeze(&client, policy).await;
    let done = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let st = done.status.clone().expect("status");
    assert!(st.last_error.is_empty(), "{st:?}");
    let (on, _, _) = blocked(&done).expect("a Blocked condition");
    assert_eq!(on, "False", "{st:?}");
    let node = env.nodes().get(&target).await.expect("node");
    assert!(nmo_tests::controller_env::is_cordoned(&node));
}
