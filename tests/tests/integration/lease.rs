//! The per-node medik8s lease through the real API server, as the medik8s
//! common library (shared with Node Health Check and Self Node Remediation)
//! writes it: creation, renewal, re-acquisition, takeover of an expired
//! foreign lease, a lease naming no holder, and release. The rules themselves
//! are unit-tested in shared/src/rules/lease.rs; these tests prove the controller
//! writes what they decide (fields, owner references) and deletes what it
//! should.
//!
//! LEASE_NAMESPACE naming a namespace that does not exist: the controller
//! creates it (with a test ServiceAccount granted that, since the manifests
//! create medik8s-leases themselves and grant no namespace creation).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nmo_tests::controller_env::{ControllerEnv as Env, LONG};
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::MaintenancePhase;

const NS: &str = "medik8s-leases";
const OURS: &str = "node-maintenance";
const SNR: &str = "self-node-remediation";

fn leases(env: &Env) -> Api<Lease> {
    Api::namespaced(env.client(), NS)
}

/// Now, whole seconds before and after `offset` seconds: exact once stored
/// as a micro-time, and never after a time the controller reads later.
fn secs_from_now(offset: i64) -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second() + offset).expect("timestamp in range")
}

fn micro(t: Timestamp) -> serde_json::Value {
    serde_json::to_value(MicroTime(t)).expect("micro time")
}

/// The owner reference the library writes for a Node.
fn node_ref(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.name_any(),
        uid: node.uid().expect("node uid"),
        ..Default::default()
    }
}

async fn node(env: &Env, name: &str) -> Node {
    env.nodes().get(name).await.expect("node")
}

/// Create Lease node-<node> with `spec` (JSON) owned by `owner`.
async fn put_lease(env: &Env, node: &str, spec: serde_json::Value, owner: &Node) {
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": format!("node-{node}"), "ownerReferences": [node_ref(owner)]},
        "spec": spec,
    }))
    .expect("lease json");
    leases(env)
        .create(&PostParams::default(), &lease)
        .await
        .expect("lease created");
}

fn spec_of(lease: Lease) -> LeaseSpec {
    lease.spec.expect("lease spec")
}

fn time(t: &Option<MicroTime>, what: &str) -> Timestamp {
    t.as_ref().unwrap_or_else(|| panic!("{what} set")).0
}

async fn wait_lease_gone(env: &Env, node: &str) {
    until(&format!("lease node-{node} deleted"), LONG, || async move {
        Ok(match env.lease(node).await {
            None => Poll::Ready(()),
            Some(l) => Poll::Pending(format!("still there: {:?}", l.spec)),
        })
    })
    .await
    .expect("lease deleted");
}

/// Delete NodeMaintenance `nm` and wait until it is gone.
async fn end(env: &Env, nm: &str) {
    env.nms()
        .delete(nm, &DeleteParams::default())
        .await
        .expect("delete NodeMaintenance");
    env.wait_gone(nm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_foreign_lease_is_taken_over_for_the_node() {
    let env = Env::new("lease-take", 1).await;
    let target = env.target().await;
    // The old holder's owner: another node that exists (the garbage collector
    // would delete a lease whose owners are all gone).
    let other = env.bed.node("other", false).await.expect("other node");
    let long_ago = secs_from_now(-7200);
    put_lease(
        &env,
        &target,
        json!({"holderIdentity": SNR, "leaseDurationSeconds": 44,
               "acquireTime": micro(long_ago), "renewTime": micro(long_ago),
               "leaseTransitions": 3}),
        &other,
    )
    .await;

    let before = secs_from_now(0);
    env.create_nm(&env.n("a"), &target).await;
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;

    let lease = env.lease(&target).await.expect("lease");
    assert_eq!(
        lease.metadata.owner_references.clone().unwrap_or_default(),
        vec![node_ref(&node(&env, &target).await)],
        "the old holder's owner reference is replaced by the Node's"
    );
    let spec = spec_of(lease);
    assert_eq!(spec.holder_identity.as_deref(), Some(OURS));
    assert_eq!(spec.lease_duration_seconds, Some(3600));
    assert_eq!(spec.lease_transitions, Some(4), "transitions + 1");
    let acquired = time(&spec.acquire_time, "acquireTime");
    assert!(
        acquired >= before,
        "acquireTime reset: {acquired} < {before}"
    );
    // Each later request renews it (it would end before now + one hour).
    assert!(time(&spec.renew_time, "renewTime") >= acquired);

    end(&env, &env.n("a")).await;
    wait_lease_gone(&env, &target).await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_lease_is_created_renewed_and_reacquired() {
    // No limit: the three maintenances run side by side.
    let env = Env::new("lease-own", 0).await;
    let bed = &env.bed;
    let fresh = env.target().await;
    let renewing = bed.node("renew", false).await.expect("node").name_any();
    let no_renew_time = bed.node("norenew", false).await.expect("node").name_any();

    let acquired_long_ago = secs_from_now(-7200);
    // Ours, still valid, but ending in 50 minutes: before now + one hour.
    let renewed_before = secs_from_now(-600);
    put_lease(
        &env,
        &renewing,
        json!({"holderIdentity": OURS, "leaseDurationSeconds": 3600,
               "acquireTime": micro(acquired_long_ago), "renewTime": micro(renewed_before),
               "leaseTransitions": 2}),
        &node(&env, &renewing).await,
    )
    .await;
    // Ours, but never renewed: the library re-acquires it.
    put_lease(
        &env,
        &no_renew_time,
        json!({"holderIdentity": OURS, "leaseDurationSeconds": 3600,
               "acquireTime": micro(acquired_long_ago), "leaseTransitions": 5}),
        &node(&env, &no_renew_time).await,
    )
    .await;

    let before = secs_from_now(0);
    for (nm, n) in [
        ("fresh", &fresh),
        ("renew", &renewing),
        ("norenew", &no_renew_time),
    ] {
        env.create_nm(&env.n(nm), n).await;
    }
    for nm in ["fresh", "renew", "norenew"] {
        env.wait_phase(&env.n(nm), MaintenancePhase::Succeeded)
            .await;
    }

    // Created: acquired when first renewed, no transitions, owned by the Node.
    let lease = env.lease(&fresh).await.expect("created lease");
    assert_eq!(
        lease.metadata.owner_references.clone().unwrap_or_default(),
        vec![node_ref(&node(&env, &fresh).await)]
    );
    let spec = spec_of(lease);
    assert_eq!(spec.holder_identity.as_deref(), Some(OURS));
    assert_eq!(spec.lease_duration_seconds, Some(3600));
    assert_eq!(spec.lease_transitions, Some(0));
    let acquired = time(&spec.acquire_time, "acquireTime");
    assert!(acquired >= before);
    assert!(time(&spec.renew_time, "renewTime") >= acquired);

    // Renewed: renewTime moves, acquireTime and transitions do not.
    let lease = env.lease(&renewing).await.expect("renewed lease");
    assert_eq!(
        lease.metadata.owner_references.clone().unwrap_or_default(),
        vec![node_ref(&node(&env, &renewing).await)]
    );
    let spec = spec_of(lease);
    let renewed = time(&spec.renew_time, "renewTime");
    assert!(
        renewed >= before,
        "renewTime moved: {renewed} (was {renewed_before})"
    );
    assert_eq!(
        time(&spec.acquire_time, "acquireTime"),
        acquired_long_ago,
        "a renewal keeps acquireTime"
    );
    assert_eq!(
        spec.lease_transitions,
        Some(2),
        "a renewal is no transition"
    );

    // No renewTime: re-acquired, acquireTime reset and transitions + 1.
    let spec = spec_of(env.lease(&no_renew_time).await.expect("re-acquired lease"));
    let reacquired = time(&spec.acquire_time, "acquireTime");
    assert!(
        reacquired >= before,
        "acquireTime reset: {reacquired} (was {acquired_long_ago})"
    );
    assert!(time(&spec.renew_time, "renewTime") >= reacquired);
    assert_eq!(spec.lease_transitions, Some(6), "transitions + 1");

    for (nm, n) in [
        ("fresh", &fresh),
        ("renew", &renewing),
        ("norenew", &no_renew_time),
    ] {
        end(&env, &env.n(nm)).await;
        wait_lease_gone(&env, n).await;
    }
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_naming_no_holder() {
    let env = Env::new("lease-nohold", 1).await;
    let target = env.target().await;
    let target_node = node(&env, &target).await;
    let lease_name = format!("node-{target}");

    // Valid but naming no holder: nobody may take it; reported as "unknown".
    let now = secs_from_now(0);
    put_lease(
        &env,
        &target,
        json!({"leaseDurationSeconds": 3600, "renewTime": micro(now), "leaseTransitions": 1}),
        &target_node,
    )
    .await;
    env.create_nm(&env.n("a"), &target).await;
    env.wait_nm(&env.n("a"), "holderless lease reported", |nm| {
        nm.status.as_ref().is_some_and(|s| {
            s.last_error
                == "can't update or invalidate the lease because it is held by different owner: unknown"
        })
    })
    .await;
    let spec = spec_of(env.lease(&target).await.expect("lease"));
    assert_eq!(spec.holder_identity, None, "not taken while valid");

    // Once expired it is taken over (the controller retries every 5 s).
    let long_ago = secs_from_now(-7200);
    leases(&env)
        .patch(
            &lease_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"renewTime": micro(long_ago)}})),
        )
        .await
        .expect("lease expired");
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    let spec = spec_of(env.lease(&target).await.expect("lease"));
    assert_eq!(spec.holder_identity.as_deref(), Some(OURS));
    assert_eq!(spec.lease_transitions, Some(2), "takeover: transitions + 1");

    // Ours again, then its holder is cleared: the release deletes it all the
    // same (only a lease naming another holder is left alone).
    leases(&env)
        .patch(
            &lease_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .expect("holder cleared");
    end(&env, &env.n("a")).await;
    wait_lease_gone(&env, &target).await;
    env.teardown().await;
}

/// LEASE_NAMESPACE naming a namespace that does not exist yet: the controller
/// creates it before the first lease, as upstream does. The manifests do not
/// grant that (they create medik8s-leases themselves; README "Security"), so
/// this controller runs as a test ServiceAccount bound to the manifests'
/// ClusterRole plus what an admin moving the leases grants: creating
/// namespaces and writing leases there. (The suite's RBAC audit examines the
/// manifests' own ServiceAccounts only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_namespace_from_the_environment_is_created_when_missing() {
    let mut env = Env::new("lease-ns", 1).await;
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    let client = env.client();
    let group = env.bed.group.clone();
    let sa_ns = env.bed.namespace.clone();
    let lease_ns = format!("{group}-leases");
    let controller_role =
        nmo_tests::manifests::controller_cluster_role().unwrap_or_else(|e| panic!("{e:#}"));
    let rbac = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: lease-ns-controller, namespace: {sa_ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {group}-moved-leases}}
rules:
  - apiGroups: [""]
    resources: ["namespaces"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["get", "create", "update", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {group}-moved-leases}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {group}-moved-leases}}
subjects: [{{kind: ServiceAccount, name: lease-ns-controller, namespace: {sa_ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {group}-controller}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {controller_role}}}
subjects: [{{kind: ServiceAccount, name: lease-ns-controller, namespace: {sa_ns}}}]
"#
    );
    nmo_tests::manifests::apply_yaml(&client, &rbac)
        .await
        .expect("test RBAC");
    nmo_tests::manifests::wait_bindings_effective(&client, "moved leases", &rbac)
        .await
        .expect("bindings effective");
    let kubeconfig = env
        .kubeconfig
        .with_file_name(format!("{group}-moved.kubeconfig"));
    nmo_tests::process::service_account_kubeconfig(
        &client,
        &sa_ns,
        "lease-ns-controller",
        &kubeconfig,
    )
    .await
    .expect("kubeconfig");
    let mut ctrl = nmo_tests::deployment::Launch::new("base", "nmo-controller")
        .extra_args([
            format!(
                "--nodemaintenance-selector={}={group}",
                nmo_tests::fixtures::GROUP_KEY
            ),
            "--leader-elect=false".to_string(),
        ])
        .env("LEASE_NAMESPACE", &lease_ns)
        .kubeconfig(&kubeconfig)
        .start(&client)
        .await
        .expect("controller starts");
    ctrl.wait_ready(LONG).await.expect("controller Ready");

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    assert!(namespaces.get_opt(&lease_ns).await.expect("read").is_none());
    let target = env.target().await;
    let name = env.n("a");
    env.create_nm(&name, &target).await;
    env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    assert!(
        namespaces.get_opt(&lease_ns).await.expect("read").is_some(),
        "namespace {lease_ns} created"
    );
    let moved: Api<Lease> = Api::namespaced(client.clone(), &lease_ns);
    let lease = moved
        .get(&format!("node-{target}"))
        .await
        .expect("the lease lives in LEASE_NAMESPACE");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(OURS)
    );
    assert!(
        leases(&env)
            .get_opt(&format!("node-{target}"))
            .await
            .expect("read")
            .is_none(),
        "nothing in medik8s-leases"
    );
    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(&name).await;
    assert!(
        moved
            .get_opt(&format!("node-{target}"))
            .await
            .expect("read")
            .is_none(),
        "released"
    );

    ctrl.proc.kill();
    let _ = namespaces.delete(&lease_ns, &DeleteParams::default()).await;
    for crb in [
        format!("{group}-moved-leases"),
        format!("{group}-controller"),
    ] {
        let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone())
            .delete(&crb, &DeleteParams::default())
            .await;
    }
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone())
        .delete(&format!("{group}-moved-leases"), &DeleteParams::default())
        .await;
    env.teardown().await;
}
