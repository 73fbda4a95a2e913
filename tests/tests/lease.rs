//! The per-node medik8s lease through the real API server, as the medik8s
//! common library (shared with Node Health Check and Self Node Remediation)
//! writes it: creation, renewal, re-acquisition, takeover of an expired
//! foreign lease, a lease naming no holder, and release. The rules themselves
//! are unit-tested in shared/src/lease.rs; these tests prove the controller
//! writes what they decide (fields, owner references) and deletes what it
//! should.
//!
//! Not covered here: LEASE_NAMESPACE naming a namespace that does not exist.
//! The controller then creates it (controller/src/node_lease.rs), but the
//! manifests' RBAC does not let it create namespaces or touch leases outside
//! medik8s-leases, and the suite's RBAC audit fails on any forbidden answer.

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
