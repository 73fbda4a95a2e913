//! Status and events exactly as upstream writes them, through the real API
//! server: lastUpdate refreshed while a drain is blocked, an error never
//! rewriting an older status, and each event once (type, reason, message),
//! even while the finalizer cannot be removed.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use nmo_tests::controller_env::{ControllerEnv as Env, LONG};
use nmo_tests::controller_env::{ev, events_of};
use nmo_tests::wait::{Poll, stays, until};
use serde_json::json;
use shared::MaintenancePhase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_drain_refreshes_last_update() {
    let env = Env::new("nm-fresh", 1).await;
    let nm = env.blocked_maintenance().await;
    let first = nm
        .status
        .and_then(|s| s.last_update)
        .expect("lastUpdate written");
    // Nothing changes while the PDB blocks, yet every 5 s retry says so.
    let name = env.n("a");
    let later = env
        .wait_nm(&name, "lastUpdate refreshed by a blocked retry", |nm| {
            nm.status
                .as_ref()
                .and_then(|s| s.last_update.as_ref())
                .is_some_and(|t| t.0 > first.0)
        })
        .await;
    let st = later.status.expect("status");
    assert_eq!(st.phase, Some(MaintenancePhase::Running));
    assert_eq!(st.pending_pods, vec!["guarded".to_string()]);
    // Conditions say why: Blocked (the pod named), Cordoned; not Drained.
    let cond = |st: &shared::NodeMaintenanceStatus, ty: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == ty)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
            .unwrap_or_else(|| panic!("no {ty} condition in {:?}", st.conditions))
    };
    let blocked = cond(&st, "Blocked");
    assert_eq!(
        (blocked.0.as_str(), blocked.1.as_str()),
        ("True", "EvictionBlocked")
    );
    assert!(blocked.2.contains("guarded"), "{blocked:?}");
    assert_eq!(cond(&st, "Cordoned").0, "True");
    assert_eq!(cond(&st, "Drained").1, "Draining");
    // Several retries, one DrainBlocked warning (the blockers did not change).
    let client = env.client();
    let drain_blocked = events_of(&client, &name)
        .await
        .into_iter()
        .filter(|e| e.1 == "DrainBlocked")
        .collect::<Vec<_>>();
    assert_eq!(drain_blocked.len(), 1, "{drain_blocked:?}");
    assert_eq!(drain_blocked[0].0, "Warning");
    assert!(drain_blocked[0].2.contains("guarded"), "{drain_blocked:?}");
    // What kubectl shows at a glance.
    let get = kubectl(&["get", "nm", &name, "--no-headers"]);
    assert!(get.contains("EvictionBlocked"), "kubectl get nm: {get}");

    env.lift_pdb().await;
    let done = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let st = done.status.expect("status");
    assert_eq!(cond(&st, "Drained").0, "True");
    assert_eq!(cond(&st, "Blocked").0, "False");
    let get = kubectl(&["get", "nm", &name]);
    println!("{get}");
    assert!(get.contains("DrainComplete"), "kubectl get nm: {get}");
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_once_even_while_the_finalizer_cannot_be_removed() {
    let env = Env::new("nm-events", 1).await;
    let client = env.client();
    let target = env.node_in_maintenance().await;
    let name = env.n("a");
    // From now on every update of this NodeMaintenance is refused: its
    // validating webhook points at a port nobody listens on (failurePolicy
    // Fail), as when the webhook Deployment is down.
    let ca = certs::Ca::new("dead-webhook-ca", Duration::from_secs(3600)).expect("ca");
    let bundle = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(ca.cert_pem())
    };
    nmo_tests::webhook_pod::register_url(&client, &env.bed.group, 1, &bundle).await;
    until("updates refused by the dead webhook", LONG, || async {
        let r = env
            .nms()
            .patch(
                &name,
                &PatchParams::default().dry_run(),
                &Patch::Merge(json!({"metadata": {"labels": {"probe": "x"}}})),
            )
            .await;
        Ok(match r {
            Err(kube::Error::Api(s)) if s.message.contains("webhook") => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .expect("webhook effective");

    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    // The node is given back at once; the finalizer stays (refused).
    until("node given back", LONG, || async {
        let n = env.nodes().get(&target).await?;
        Ok(if n.spec.and_then(|s| s.unschedulable) == Some(true) {
            Poll::Pending("still cordoned".into())
        } else {
            Poll::Ready(())
        })
    })
    .await
    .expect("uncordoned");
    // Three retries (5 s apart) later: still one UncordonNode, no
    // RemovedMaintenance (the finalizer is not gone yet).
    stays(
        "no repeated events while the finalizer is stuck",
        Duration::from_secs(12),
        || {
            let (client, name, target) = (client.clone(), name.clone(), target.clone());
            async move {
                let node_events = events_of(&client, &target).await;
                let nm_events = events_of(&client, &name).await;
                let uncordons = node_events.iter().filter(|e| e.1 == "UncordonNode").count();
                let removed = nm_events
                    .iter()
                    .filter(|e| e.1 == "RemovedMaintenance")
                    .count();
                if uncordons <= 1 && removed == 0 {
                    Ok(())
                } else {
                    Err(format!(
                        "node events {node_events:?}, NodeMaintenance events {nm_events:?}"
                    ))
                }
            }
        },
    )
    .await;
    assert!(
        env.nms().get_opt(&name).await.expect("read").is_some(),
        "the finalizer could not have been removed"
    );

    // The webhook is back: the finalizer goes, and each event was said once.
    nmo_tests::webhook_pod::unregister(&client, &env.bed.group).await;
    env.wait_gone(&name).await;
    until("RemovedMaintenance recorded", LONG, || async {
        let seen = events_of(&client, &name).await;
        Ok(if seen.iter().any(|e| e.1 == "RemovedMaintenance") {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{seen:?}"))
        })
    })
    .await
    .expect("RemovedMaintenance");
    assert_eq!(
        events_of(&client, &name).await,
        vec![
            ev("Normal", "BeginMaintenance", "Begin a node maintenance"),
            ev("Normal", "RemovedMaintenance", "Removed a node maintenance"),
            ev(
                "Normal",
                "SucceedMaintenance",
                "Node maintenance was succeeded"
            ),
        ],
        "events of NodeMaintenance {name}, each once"
    );
    assert_eq!(
        events_of(&client, &target).await,
        vec![ev("Normal", "UncordonNode", "Uncordon a node")],
        "events of node {target}"
    );
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_the_first_status_write_keeps_that_status() {
    let env = Env::new("nm-keep", 1).await;
    let client = env.client();
    let target = env.target().await;
    env.bed.bare_pod("p1", &target).await.expect("pod");
    env.bed.bare_pod("p2", &target).await.expect("pod");
    // A policy refuses the maintenance taint on this node: putting the node
    // into maintenance fails after the starting status was written.
    let policy = format!("{}-no-drain-taint", env.bed.group);
    let yaml = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {policy}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["UPDATE"]
        resources: ["nodes"]
  matchConditions:
    - name: this-node
      expression: "object.metadata.name == '{target}'"
  validations:
    - expression: "!has(object.spec.taints) || !object.spec.taints.exists(t, t.key == 'medik8s.io/drain')"
      message: "test policy {policy} refuses the drain taint"
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {policy}
spec:
  policyName: {policy}
  validationActions: [Deny]
"#
    );
    nmo_tests::manifests::apply_yaml(&client, &yaml)
        .await
        .expect("policy applied");
    until("the policy refuses the drain taint", LONG, || async {
        let r = env
            .nodes()
            .patch(
                &target,
                &PatchParams::default().dry_run(),
                &Patch::Merge(json!({"spec": {"taints": [
                    {"key": "medik8s.io/drain", "effect": "NoSchedule"}
                ]}})),
            )
            .await;
        Ok(match r {
            Err(kube::Error::Api(s)) if s.message.contains(&policy) => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .expect("policy effective");

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let nm = env
        .wait_nm(&name, "the refusal in lastError", |nm| {
            nm.status
                .as_ref()
                .is_some_and(|s| s.last_error.contains(&policy))
        })
        .await;
    let st = nm.status.expect("status");
    assert_eq!(st.phase, Some(MaintenancePhase::Running), "{st:?}");
    assert_eq!((st.eviction_pods, st.total_pods), (2, 2), "{st:?}");
    assert_eq!(st.pending_pods.len(), 2, "{st:?}");
    // Retries (5 s apart) keep that status and never begin again.
    stays("the starting status stays", Duration::from_secs(11), || {
        let (api, client, name) = (env.nms(), client.clone(), name.clone());
        async move {
            let st = api.get(&name).await.map_err(|e| e.to_string())?.status;
            let begins = events_of(&client, &name)
                .await
                .into_iter()
                .filter(|e| e.1 == "BeginMaintenance")
                .count();
            match st {
                Some(st)
                    if st.phase == Some(MaintenancePhase::Running)
                        && st.eviction_pods == 2
                        && begins == 1 =>
                {
                    Ok(())
                }
                other => Err(format!("status {other:?}, BeginMaintenance x{begins}")),
            }
        }
    })
    .await;
    // Nothing half-applied: the refused patch carried cordon, taints and label together.
    let node = env.nodes().get(&target).await.expect("node");
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert!(
        !node
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );

    for kind in [
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
    ] {
        delete_admission_object(&client, kind, &policy).await;
    }
    env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let begins = events_of(&client, &name)
        .await
        .into_iter()
        .filter(|e| e.1 == "BeginMaintenance")
        .count();
    assert_eq!(begins, 1);
    env.teardown().await;
}

async fn delete_admission_object(client: &Client, kind: &str, name: &str) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let _ = api.delete(name, &DeleteParams::default()).await;
}

/// `kubectl ARGS` against the local plane; its stdout.
fn kubectl(args: &[&str]) -> String {
    let out = std::process::Command::new(nmo_tests::cluster_dir().join("bin/kubectl"))
        .arg("--kubeconfig")
        .arg(nmo_tests::kubeconfig_path())
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A pod that outlives its grace period (here: its node has no kubelet to
/// stop it, and a finalizer holds it) is reported as what blocks the drain,
/// with its finalizers, in the Blocked condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_stuck_terminating_is_named_with_its_finalizers() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::PostParams;
    let env = Env::new("nm-stuck", 1).await;
    let client = env.client();
    let group = env.bed.group.clone();
    // A node no kwok manages: nothing ever stops its pods.
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": format!("{group}-silent"),
                     "labels": {nmo_tests::fixtures::GROUP_KEY: group}}
    }))
    .expect("node JSON");
    let node = env
        .nodes()
        .create(&PostParams::default(), &node)
        .await
        .expect("node")
        .name_any();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &env.bed.namespace);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "held", "finalizers": ["example.com/backup"]},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": "registry.invalid/fake:1"}]}
    }))
    .expect("pod JSON");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod");
    let name = env.n("a");
    env.create_nm(&name, &node).await;
    let nm = env
        .wait_nm(&name, "the stuck pod named in Blocked", |nm| {
            nm.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Blocked"
                        && c.status == "True"
                        && c.message
                            .contains("/held: still there long after its grace period")
                        && c.message.contains("example.com/backup")
                })
            })
        })
        .await;
    assert_eq!(nm.phase(), Some(&MaintenancePhase::Running));
    // Let it go: the finalizer removed, the pod gone, the drain done.
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("finalizer removed");
    let _ = pods
        .delete("held", &DeleteParams::default().grace_period(0))
        .await;
    env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    env.teardown().await;
}
