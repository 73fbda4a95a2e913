//! A blocked drain resumes as soon as its blocker clears, not on its next
//! 5 s retry (controller/src/drain_wakes.rs): a PodDisruptionBudget deleted in the
//! namespace of a pending pod, or a pending pod leaving the node.
//!
//! No timing race decides these tests. A blocked drain retries every 5 s and
//! each retry refreshes `status.lastUpdate` (status_events.rs); each test
//! clears the blocker right after it sees such a refresh, when the next retry
//! is still ~5 s away (nothing else reconciles a blocked maintenance: its own
//! status writes and kwok's node heartbeats wake nothing). Progress within
//! [`WATCHED`] of that can only come from the watches. With a longer
//! `--blocked-retry-interval` the same holds with more room.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use nmo_tests::controller_env::{ControllerEnv as Env, pdb_in, pod_in};
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

/// Resumed this soon after the blocker cleared: well before the retry due
/// ~5 s after the refresh that was just seen (see the module docs).
const WATCHED: Duration = Duration::from_secs(3);

fn last_update(nm: &NodeMaintenance) -> Option<Time> {
    nm.status.as_ref().and_then(|s| s.last_update.clone())
}

fn pending(nm: &NodeMaintenance) -> Vec<String> {
    nm.status
        .as_ref()
        .map(|s| s.pending_pods.clone())
        .unwrap_or_default()
}

/// Wait for the next blocked retry of `name` (a fresh lastUpdate): the one
/// after it is ~5 s away.
async fn right_after_a_retry(env: &Env, name: &str) {
    let seen = env.nms().get(name).await.expect("NodeMaintenance");
    let before = last_update(&seen).map(|t| t.0);
    env.wait_nm(name, "a blocked retry (lastUpdate refreshed)", |nm| {
        last_update(nm).map(|t| t.0) > before
    })
    .await;
}

/// How long after `cleared` the NodeMaintenance satisfied `ok`; fails past [`WATCHED`].
async fn resumed(
    env: &Env,
    name: &str,
    what: &str,
    cleared: Instant,
    ok: impl Fn(&NodeMaintenance) -> bool,
) -> Duration {
    env.wait_nm(name, what, ok).await;
    let took = cleared.elapsed();
    println!("resume figure: {what}: {} ms", took.as_millis());
    assert!(
        took < WATCHED,
        "{what} took {took:?} after the blocker cleared: that is the 5 s retry, not the watch\n{}",
        nmo_tests::component_log_tails(20)
    );
    took
}

async fn delete_pdb(env: &Env, ns: &str, name: &str) {
    Api::<PodDisruptionBudget>::namespaced(env.client(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("PDB deleted");
}

/// Two pods on the node, in two namespaces, each held by a PDB of its own:
/// deleting one PDB wakes the maintenance through its namespace, and the
/// evicted pod leaving the node wakes it again (its pod watch), though the
/// other pod is still blocked; deleting the other PDB finishes the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pdb_resumes_the_drain_at_once_in_each_namespace() {
    let env = Env::new("nm-resume-pdb", 1).await;
    let client = env.client();
    let (first, second) = (env.bed.namespace.clone(), format!("{}-b", env.bed.group));
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": second}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("second namespace");
    let target = env.target().await;
    env.bed.node("spare", false).await.expect("spare node");
    pod_in(&env, &first, "web", &target).await;
    pod_in(&env, &second, "db", &target).await;
    pdb_in(&env, &first, "web-pdb", "web").await;
    pdb_in(&env, &second, "db-pdb", "db").await;
    let name = env.n("a");
    env.create_nm(&name, &target).await;
    env.wait_nm(&name, "both pods blocked by their PDBs", |nm| {
        pending(nm) == ["web", "db"]
            && nm
                .status
                .as_ref()
                .is_some_and(|s| s.last_error.contains("web") && s.last_error.contains("db"))
    })
    .await;

    right_after_a_retry(&env, &name).await;
    let cleared = Instant::now();
    delete_pdb(&env, &first, "web-pdb").await;
    resumed(
        &env,
        &name,
        &format!("PDB {first}/web-pdb deleted: pod web evicted and gone, db still pending"),
        cleared,
        |nm| pending(nm) == ["db"],
    )
    .await;

    right_after_a_retry(&env, &name).await;
    let cleared = Instant::now();
    delete_pdb(&env, &second, "db-pdb").await;
    resumed(
        &env,
        &name,
        &format!("PDB {second}/db-pdb deleted: Succeeded"),
        cleared,
        |nm| nm.phase() == Some(&MaintenancePhase::Succeeded),
    )
    .await;

    let _ = Api::<Namespace>::all(client)
        .delete(&second, &DeleteParams::default())
        .await;
    env.teardown().await;
}

/// The pod a blocked drain waits for is deleted by someone else (the PDB
/// stays and allows nothing): the pod watch of the node wakes the maintenance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_pod_leaving_the_node_resumes_the_drain_at_once() {
    let env = Env::new("nm-resume-pod", 1).await;
    env.blocked_maintenance().await;
    let name = env.n("a");
    right_after_a_retry(&env, &name).await;
    let cleared = Instant::now();
    Api::<Pod>::namespaced(env.client(), &env.bed.namespace)
        .delete("guarded", &DeleteParams::default())
        .await
        .expect("pod deleted");
    resumed(
        &env,
        &name,
        "blocked pod guarded deleted: Succeeded",
        cleared,
        |nm| nm.phase() == Some(&MaintenancePhase::Succeeded),
    )
    .await;
    // The PDB is still there, and still allows nothing: the pod watch did it.
    let pdb = Api::<PodDisruptionBudget>::namespaced(env.client(), &env.bed.namespace)
        .get("guard")
        .await
        .expect("PDB still there");
    assert_eq!(
        pdb.status.map(|s| s.disruptions_allowed),
        Some(0),
        "PDB {} allows nothing",
        pdb.metadata.name.unwrap_or_default()
    );
    let pods = env.bed.pods_by_node().await.expect("pods");
    assert!(
        !pods.values().flatten().any(|p| p.name_any() == "guarded"),
        "pod guarded gone"
    );
    env.teardown().await;
}
