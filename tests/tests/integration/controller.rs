//! The controller against a real API server: each test gets its own kwok
//! nodes, namespace and controller process (selecting only its own
//! NodeMaintenances), running under the ServiceAccount and RBAC of manifests/.
//! Leader election runs on upstream's Lease name in the test's private copy
//! of nmo-system (the manifests' Roles there, name restriction included), so
//! parallel tests never share a leader.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use nmo_tests::fixtures::GROUP_KEY;
use nmo_tests::wait::{Poll, stays, until};
use serde_json::json;
use shared::api::consts::LEADER_ELECTION_LEASE_NAME;
use shared::{MaintenancePhase, NodeMaintenance};

use nmo_tests::controller_env::{
    ControllerEnv as Env, LONG, events_of, is_cordoned, node_taint_keys, running_on,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cycle_drains_the_node_and_restores_it_exactly() {
    let env = Env::new("nm-full", 1).await;
    let bed = &env.bed;
    let target = bed
        .node("target", false)
        .await
        .expect("target node")
        .name_any();
    let spare = bed
        .node("spare", true)
        .await
        .expect("spare node")
        .name_any();

    // Someone else's taint and label, which must survive the whole cycle.
    env.nodes()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"labels": {"team": "storage"}},
                "spec": {"taints": [
                    {"key": GROUP_KEY, "value": bed.group, "effect": "NoSchedule"},
                    {"key": "example.com/foreign", "value": "x", "effect": "PreferNoSchedule"}
                ]}
            })),
        )
        .await
        .expect("foreign taint and label");
    let before = env.nodes().get(&target).await.expect("node");

    bed.deployment("web", 3).await.expect("deployment");
    bed.daemonset("agent").await.expect("daemonset");
    bed.bare_pod("bare", &target).await.expect("bare pod");
    bed.emptydir_pod("scratch", &target)
        .await
        .expect("emptyDir pod");
    bed.mirror_pod("static", &target).await.expect("mirror pod");
    bed.completed_pod("done", &target)
        .await
        .expect("completed pod");
    env.wait_pods("3 web pods and the agent Ready on the target", |m| {
        running_on(m, &target, "web-") == 3 && running_on(m, &target, "agent-") == 1
    })
    .await;
    // Let the spare take the evicted pods.
    env.nodes()
        .patch(
            &spare,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .expect("uncordon spare");

    env.create_nm(&env.n("a"), &target).await;
    let nm = env
        .wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    let st = nm.status.clone().expect("status");
    assert_eq!(st.drain_progress, 100);
    assert_eq!(
        st.eviction_pods, 6,
        "3 web + bare + emptyDir + completed: {st:?}"
    );
    assert_eq!(st.total_pods, 8, "6 + DaemonSet pod + mirror pod: {st:?}");
    assert!(
        st.pending_pods.is_empty() && st.pending_pods_refs.is_empty(),
        "{st:?}"
    );
    let owner = nm.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner
            .iter()
            .any(|o| o.kind == "Node" && o.name == target && o.controller == Some(false)),
        "owner reference to the node: {owner:?}"
    );

    let during = env.nodes().get(&target).await.expect("node");
    let taints = node_taint_keys(&during);
    for t in [
        "node.kubernetes.io/unschedulable:NoSchedule",
        "medik8s.io/drain:NoSchedule",
        "example.com/foreign:PreferNoSchedule",
    ] {
        assert!(taints.contains(&t.to_string()), "taint {t} in {taints:?}");
    }
    assert!(is_cordoned(&during));
    let labels = during.labels();
    assert_eq!(
        labels
            .get("remediation.medik8s.io/exclude-from-remediation")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(labels.get("team").map(String::as_str), Some("storage"));
    let lease = env.lease(&target).await.expect("lease exists");
    let spec = lease.spec.expect("lease spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("node-maintenance"));
    assert_eq!(spec.lease_duration_seconds, Some(3600));

    // DaemonSet and mirror pods stay; the rest went, web pods now run on the spare.
    env.wait_pods("web pods rescheduled onto the spare only", |m| {
        running_on(m, &spare, "web-") == 3
    })
    .await;
    let by_node = bed.pods_by_node().await.expect("pods");
    let left: Vec<String> = by_node
        .get(&target)
        .map(|v| v.iter().map(|p| p.name_any()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().any(|n| n.starts_with("agent-")),
        "DaemonSet pod stays: {left:?}"
    );
    assert!(
        left.contains(&"static".to_string()),
        "mirror pod stays: {left:?}"
    );
    assert_eq!(
        left.len(),
        2,
        "only DaemonSet and mirror pods on the target: {left:?}"
    );

    env.wait_event(&env.n("a"), "BeginMaintenance").await;
    env.wait_event(&env.n("a"), "SucceedMaintenance").await;

    env.nms()
        .delete(&env.n("a"), &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(&env.n("a")).await;
    let after = env.nodes().get(&target).await.expect("node");
    assert_eq!(
        node_taint_keys(&after),
        node_taint_keys(&before),
        "taints restored exactly"
    );
    // kube-controller-manager adds beta.kubernetes.io/* labels to new nodes on
    // its own; what matters is that every label from before is intact and ours is gone.
    for (k, v) in before.labels() {
        assert_eq!(
            after.labels().get(k),
            Some(v),
            "label {k} survives the cycle"
        );
    }
    assert!(
        !after
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );
    assert!(!is_cordoned(&after));
    assert!(env.lease(&target).await.is_none(), "lease released");
    env.wait_event(&target, "UncordonNode").await;
    env.wait_event(&env.n("a"), "RemovedMaintenance").await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_blocks_one_pod_others_go_and_lifting_it_completes() {
    let mut env = Env::new("nm-pdb", 1).await;
    let nm = env.blocked_maintenance().await;
    let st = nm.status.expect("status");
    assert_eq!(st.phase, Some(MaintenancePhase::Running));
    assert_eq!(st.eviction_pods, 2);
    assert_eq!(st.drain_progress, 50);
    assert!(
        st.last_error.contains("disruption budget"),
        "lastError says why: {}",
        st.last_error
    );
    assert_eq!(st.pending_pods_refs[0].namespace, env.bed.namespace);

    // A controller crash mid-drain: the next one resumes.
    env.ctrl.as_mut().expect("controller").proc.kill();
    env.start_controller().await;

    env.lift_pdb().await;
    let nm = env
        .wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    assert_eq!(
        nm.status.expect("status").last_error,
        "",
        "cleared on success"
    );
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_lease_waits_without_touching_the_node() {
    let env = Env::new("nm-lease", 1).await;
    let target = env.target().await;
    let leases: Api<Lease> = Api::namespaced(env.client(), "medik8s-leases");
    nmo_tests::manifests::apply_yaml(
        &env.client(),
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: medik8s-leases\n",
    )
    .await
    .expect("lease namespace");
    let now = micro_now();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": format!("node-{target}")},
        "spec": {"holderIdentity": "self-node-remediation", "leaseDurationSeconds": 3600,
                 "acquireTime": now, "renewTime": now}
    }))
    .expect("lease json");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("foreign lease");

    env.create_nm(&env.n("a"), &target).await;
    let nm = env
        .wait_nm(&env.n("a"), "lease conflict reported", |nm| {
            nm.status
                .as_ref()
                .is_some_and(|s| s.last_error.contains("held by different owner"))
        })
        .await;
    let st = nm.status.expect("status");
    assert_eq!(
        st.last_error,
        "can't update or invalidate the lease because it is held by different owner: self-node-remediation"
    );
    assert_eq!(
        st.error_on_lease_count, 0,
        "no error counted before the drain started"
    );
    let node = env.nodes().get(&target).await.expect("node");
    assert!(
        !is_cordoned(&node),
        "node untouched while the lease is foreign"
    );
    assert!(
        !node
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );

    leases
        .delete(&format!("node-{target}"), &DeleteParams::default())
        .await
        .expect("release");
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    let lease = env.lease(&target).await.expect("our lease now");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("node-maintenance")
    );
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_for_good_fails_and_restores_the_node() {
    let env = Env::new("nm-lost", 1).await;
    let target = env.node_in_maintenance().await;

    // Another operator takes the lease over (as if ours had lapsed).
    let leases: Api<Lease> = Api::namespaced(env.client(), "medik8s-leases");
    let now = micro_now();
    leases
        .patch(
            &format!("node-{target}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "self-node-remediation",
                "renewTime": now, "acquireTime": now}})),
        )
        .await
        .expect("lease stolen");
    // Node changes bring the controller back; each failed renewal counts.
    let nm = env
        .wait_nm(&env.n("a"), "maintenance failed on the lease", |nm| {
            if nm.phase() != Some(&MaintenancePhase::Failed) {
                let n = rand::random::<u32>().to_string();
                let nodes = env.nodes();
                let target = target.clone();
                tokio::spawn(async move {
                    let _ = nodes
                        .patch(
                            &target,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"labels": {"nudge": n}}})),
                        )
                        .await;
                });
                return false;
            }
            true
        })
        .await;
    let st = nm.status.expect("status");
    assert_eq!(
        st.last_error,
        "maintenance failed: lease could not be extended after 4 attempts"
    );
    // The Failed condition keeps upstream's text and names the cause.
    let failed = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")
        .unwrap_or_else(|| panic!("a True Failed condition: {:?}", st.conditions));
    assert_eq!(failed.reason, "LeaseLost");
    assert_eq!(
        failed.message,
        "maintenance failed: lease could not be extended after 4 attempts; last lease error: \
         can't update or invalidate the lease because it is held by different owner: self-node-remediation"
    );
    let node = env.nodes().get(&target).await.expect("node");
    assert!(!is_cordoned(&node), "node given back");
    assert!(
        !node_taint_keys(&node)
            .iter()
            .any(|t| t.starts_with("medik8s.io/drain"))
    );
    assert!(
        !node
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation")
    );
    let lease = env.lease(&target).await.expect("foreign lease left alone");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("self-node-remediation")
    );
    env.wait_event(&env.n("a"), "FailedMaintenance").await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_second_waits_then_runs() {
    let env = Env::new("nm-slot", 1).await;
    let a = env.bed.node("a", false).await.expect("node").name_any();
    let b = env.bed.node("b", false).await.expect("node").name_any();
    env.create_nm(&env.n("a"), &a).await;
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    env.create_nm(&env.n("b"), &b).await;
    let nm = env.wait_phase(&env.n("b"), MaintenancePhase::Pending).await;
    let msg = nm.status.expect("status").last_error;
    assert!(
        msg.contains(&env.n("a")) && msg.contains("position 1"),
        "{msg}"
    );
    assert!(
        !is_cordoned(&env.nodes().get(&b).await.expect("node")),
        "waiting node untouched"
    );

    env.nms()
        .delete(&env.n("a"), &DeleteParams::default())
        .await
        .expect("delete a");
    env.wait_phase(&env.n("b"), MaintenancePhase::Succeeded)
        .await;
    env.teardown().await;
}

/// One slot, pairs created within the same second, the later one with the
/// smaller name (it sorts first in the queue): never two admitted at once.
/// The controller decides from its cache, which learns of the first
/// admission only after its Running write; shared::rules::slots::Admissions counts
/// its own admissions meanwhile (the unit test
/// an_admission_the_cache_does_not_show_yet_still_holds_its_slot shows the
/// race deterministically; this one through the real API server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slot_same_second_pairs_never_both_admitted() {
    let env = Env::new("nm-slot-race", 1).await;
    let admitted = |nm: &NodeMaintenance| {
        matches!(
            nm.phase(),
            Some(MaintenancePhase::Running | MaintenancePhase::Succeeded)
        )
    };
    for round in 0..3 {
        let (first, second) = (env.n(&format!("z{round}")), env.n(&format!("a{round}")));
        let n1 = env
            .bed
            .node(&format!("z{round}"), false)
            .await
            .expect("node")
            .name_any();
        let n2 = env
            .bed
            .node(&format!("a{round}"), false)
            .await
            .expect("node")
            .name_any();
        env.create_nm(&first, &n1).await;
        env.create_nm(&second, &n2).await;
        let both = [first.clone(), second.clone()];
        // Until one has finished, and for a while after: at most one admitted.
        let check = || async {
            let mut seen = Vec::new();
            for name in &both {
                let nm = env.nms().get(name).await.map_err(|e| e.to_string())?;
                seen.push((name.clone(), nm.phase().cloned(), admitted(&nm)));
            }
            if seen.iter().filter(|s| s.2).count() > 1 {
                return Err(format!("two admitted with one slot: {seen:?}"));
            }
            Ok(seen)
        };
        until("one of the pair Succeeded", LONG, || async {
            let seen = check().await.map_err(|e| anyhow::anyhow!(e))?;
            Ok(
                if seen
                    .iter()
                    .any(|s| s.1 == Some(MaintenancePhase::Succeeded))
                {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{seen:?}"))
                },
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        stays("at most one admitted", Duration::from_secs(2), || async {
            check().await.map(|_| ())
        })
        .await;
        for name in &both {
            env.nms()
                .delete(name, &DeleteParams::default())
                .await
                .expect("delete");
        }
        for name in &both {
            env.wait_gone(name).await;
        }
    }
    env.teardown().await;
}

/// A pod that lands on the node after the drain finished (here bound by
/// name, past the cordon) is evicted too, and the finished drain is not
/// rewound: phase Succeeded, drainProgress 100, no pending pods (issue 22:
/// progress dropped to 0 with the pod pending while the phase said Succeeded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_arriving_after_success_is_evicted_without_rewinding() {
    let env = Env::new("nm-late-pod", 1).await;
    let target = env.node_in_maintenance().await;
    // Held by a PDB, so it stays on the node for rounds on end. The PDB
    // comes first: a pod arriving wakes a round at once, and one that came
    // before its PDB was evicted (seen once, the test then waited in vain).
    env.bed.pdb("late-pdb", "late", 1).await.expect("pdb");
    env.bed.bare_pod("late", &target).await.expect("late pod");
    env.bed
        .wait_pdb_status("late-pdb", 1, LONG)
        .await
        .expect("pdb status");
    // A node change brings the maintenance back for a round.
    env.nodes()
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"nudge": "late-pod"}}})),
        )
        .await
        .expect("nudge");
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client(), &env.bed.namespace);
    let consistent = || async {
        let nm = env
            .nms()
            .get(&env.n("a"))
            .await
            .map_err(|e| e.to_string())?;
        let st = nm.status.unwrap_or_default();
        if st.phase != Some(MaintenancePhase::Succeeded)
            || st.drain_progress != 100
            || !st.pending_pods.is_empty()
        {
            return Err(format!(
                "status rewound: phase {:?}, progress {}, pending {:?}",
                st.phase, st.drain_progress, st.pending_pods
            ));
        }
        Ok(())
    };
    until("the late pod reported as blocked", LONG, || async {
        consistent().await.map_err(|e| anyhow::anyhow!(e))?;
        let nm = env.nms().get(&env.n("a")).await?;
        let err = nm.status.unwrap_or_default().last_error;
        Ok(if err.contains("late-pdb") {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("lastError {err:?}"))
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    stays(
        "the status stays Succeeded at 100 while blocked",
        Duration::from_secs(2),
        consistent,
    )
    .await;
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        env.client(),
        &env.bed.namespace,
    )
    .delete("late-pdb", &DeleteParams::default())
    .await
    .expect("lift the PDB");
    until(
        "the late pod evicted, the status unchanged",
        LONG,
        || async {
            consistent().await.map_err(|e| anyhow::anyhow!(e))?;
            Ok(match pods.get_opt("late").await? {
                None => Poll::Ready(()),
                Some(p) => Poll::Pending(format!(
                    "pod late still there (deleting: {})",
                    p.metadata.deletion_timestamp.is_some()
                )),
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    stays(
        "the status stays Succeeded at 100",
        Duration::from_secs(2),
        consistent,
    )
    .await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_node_fails_without_retry_loop() {
    let env = Env::new("nm-missing", 1).await;
    let ghost = format!("{}-ghost", env.bed.group);
    env.create_nm(&env.n("a"), &ghost).await;
    let nm = env.wait_phase(&env.n("a"), MaintenancePhase::Failed).await;
    assert_eq!(
        nm.status.as_ref().expect("status").last_error,
        format!("nodes \"{ghost}\" not found")
    );
    env.wait_event(&env.n("a"), "FailedMaintenance").await;
    // No retry loop: across two retry periods (5 s) the object is not
    // written again and the event is not repeated.
    let version = nm.metadata.resource_version.clone();
    let name = env.n("a");
    stays("Failed is final", Duration::from_secs(11), || {
        let (api, client, name, version) = (env.nms(), env.client(), name.clone(), version.clone());
        async move {
            let now = api.get(&name).await.map_err(|e| e.to_string())?;
            let events = events_of(&client, &name).await;
            if now.metadata.resource_version == version && events.len() == 2 {
                Ok(())
            } else {
                Err(format!(
                    "resourceVersion {:?} (was {version:?}), events {events:?}",
                    now.metadata.resource_version
                ))
            }
        }
    })
    .await;
    env.nms()
        .delete(&env.n("a"), &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(&env.n("a")).await;
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_for_same_node_fails_and_never_touches_it() {
    let env = Env::new("nm-dup", 0).await;
    let target = env.node_in_maintenance().await;
    env.create_nm(&env.n("b"), &target).await;
    let nm = env.wait_phase(&env.n("b"), MaintenancePhase::Failed).await;
    let msg = nm.status.expect("status").last_error;
    assert!(
        msg.contains(&env.n("a"))
            && msg.contains(&format!("delete NodeMaintenance {}", env.n("b"))),
        "{msg}"
    );
    env.nms()
        .delete(&env.n("b"), &DeleteParams::default())
        .await
        .expect("delete b");
    env.wait_gone(&env.n("b")).await;
    let node = env.nodes().get(&target).await.expect("node");
    assert!(
        is_cordoned(&node),
        "deleting the duplicate leaves the real maintenance in place"
    );
    assert!(env.lease(&target).await.is_some());
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_node_collects_the_maintenance_and_its_lease() {
    let env = Env::new("nm-gc", 1).await;
    let target = env.node_in_maintenance().await;
    // The lease's ownerReference would let the garbage collector delete it
    // too: take it away, so only the controller's release can.
    Api::<Lease>::namespaced(env.client(), "medik8s-leases")
        .patch(
            &format!("node-{target}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null}})),
        )
        .await
        .expect("lease without ownerReferences");
    env.nodes()
        .delete(&target, &DeleteParams::default())
        .await
        .expect("delete node");
    env.wait_gone(&env.n("a")).await;
    until("lease released by the controller", LONG, || async {
        Ok(match env.lease(&target).await {
            None => Poll::Ready(()),
            Some(l) => Poll::Pending(format!("{:?}", l.spec)),
        })
    })
    .await
    .expect("lease gone");
    env.teardown().await;
}

async fn wait_http(port: u16, path: &str) -> String {
    until(
        &format!("GET {path} on port {port} answers 200"),
        LONG,
        || async move {
            Ok(match nmo_tests::process::http_get_local(port, path).await {
                Ok(body) => Poll::Ready(body),
                Err(e) => Poll::Pending(e.to_string()),
            })
        },
    )
    .await
    .expect("endpoint answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_metrics_and_clean_shutdown() {
    let mut env = Env::new("nm-probe", 1).await;
    // This test drives its own controller with probes and metrics on.
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    // The manifest's probe and metrics addresses, mapped to local ports;
    // plain-HTTP metrics here (the secure default is tested in metrics_auth.rs).
    let pod = env
        .spawn_controller(&["--metrics-secure=false".to_string()])
        .await;
    let probe = pod.port("health").expect("health port");
    let metrics = pod.flag_port("metrics-bind-address").expect("metrics port");
    let mut ctrl = pod.proc;
    assert_eq!(wait_http(probe, "/healthz").await, "ok");
    assert_eq!(wait_http(probe, "/readyz").await, "ok");
    let target = env.node_in_maintenance().await;
    // Series that only count after real work: a value above 0 (a series
    // created at 0 up front would not pass). Exact names and labels of every
    // controller-runtime series: tests/tests/integration/controller_metrics.rs.
    let text = wait_http(metrics, "/metrics").await;
    for series in [
        "controller_runtime_reconcile_total{controller=\"nodemaintenance\",result=\"requeue_after\"}",
        "controller_runtime_reconcile_time_seconds_count{controller=\"nodemaintenance\"}",
    ] {
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.trim().parse::<f64>().ok());
        assert!(
            value.is_some_and(|v| v > 0.0),
            "{series} counted the reconciles of a maintenance: {value:?}\n{text}"
        );
    }
    let phase_line = format!(
        "nmo_nodemaintenance_phase{{name=\"{}\",node=\"{target}\",phase=\"Succeeded\"}} 1",
        env.n("a")
    );
    // The gauge is set right after the status write the test just observed.
    until(&format!("metric line {phase_line}"), LONG, || async {
        let text = nmo_tests::process::http_get_local(metrics, "/metrics").await?;
        Ok(if text.contains(&phase_line) {
            Poll::Ready(())
        } else {
            Poll::Pending(
                text.lines()
                    .filter(|l| l.starts_with("nmo_nodemaintenance_phase"))
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })
    })
    .await
    .expect("phase gauge");
    let status = ctrl.terminate().expect("exit status");
    assert!(
        status.success(),
        "SIGTERM ends the controller cleanly: {status:?}\n{}",
        ctrl.log_text()
    );
    assert!(ctrl.log_text().contains("stopped cleanly"));
    env.teardown().await;
}

// ------------------------------------------------------------ high availability

/// Lease duration of the controller's leader election (controller-runtime's 15 s).
const LEADER_LEASE: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_is_ready_and_takes_over_a_killed_leaders_drain() {
    let mut env = Env::new("nm-ha-kill", 1).await;
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    // Both replicas pass their readiness probe (spawn waits for it), standby included.
    let a = env.replica().await;
    let b = env.replica().await;
    let leader_at = env.wait_leader(&[&a, &b]).await;
    let (mut leader, standby) = if leader_at == 0 { (a, b) } else { (b, a) };
    assert!(standby.ready().await, "the standby replica is Ready");
    assert!(leader.ready().await, "the leader replica is Ready");
    let lease = LEADER_ELECTION_LEASE_NAME;
    leader.wait_master_status(lease, "1").await;
    standby.wait_master_status(lease, "0").await;

    // The leader starts a drain that a PDB holds, then dies without a word.
    let before = env.blocked_maintenance().await.status.expect("status");
    let renewed = env
        .leader_lease()
        .await
        .and_then(|l| l.spec)
        .and_then(|s| s.renew_time)
        .expect("renewTime");
    leader.pod.proc.kill();
    let killed = std::time::Instant::now();
    until(
        "the standby to take the Lease over",
        LEADER_LEASE * 3,
        || async {
            let h = env.holder().await;
            Ok(if h.as_ref() == Some(&standby.pod.name) {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("holder {h:?}"))
            })
        },
    )
    .await
    .expect("takeover");
    let took = killed.elapsed();
    // The Lease's term ends LEADER_LEASE after its last renewal, which came
    // before the kill; a takeover within that term plus the standby's 2 s
    // retry period and request latency is what leader election promises.
    let term_left = {
        let renewed_at = std::time::SystemTime::from(renewed.0);
        (renewed_at + LEADER_LEASE)
            .duration_since(std::time::SystemTime::now() - took)
            .unwrap_or_default()
    };
    eprintln!("takeover {took:?} after SIGKILL; the dead leader's term had {term_left:?} left");
    assert!(
        took <= term_left + Duration::from_secs(4),
        "takeover took {took:?}, the Lease term had {term_left:?} left"
    );
    standby.wait_master_status(lease, "1").await;

    // The new leader carries the drain on from the status the first one wrote.
    let nm = env.nms().get(&env.n("a")).await.expect("nm");
    let st = nm.status.expect("status");
    assert_eq!(
        (st.phase.clone(), st.eviction_pods, st.total_pods),
        (
            before.phase.clone(),
            before.eviction_pods,
            before.total_pods
        )
    );
    env.lift_pdb().await;
    let done = env
        .wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    assert_eq!(done.status.expect("status").drain_progress, 100);
    drop(standby);
    env.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_hands_over_leadership_and_keeps_status() {
    let mut env = Env::new("nm-ha-roll", 1).await;
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    let mut old = env.replica().await;
    env.wait_leader(&[&old]).await;
    let before = env.blocked_maintenance().await.status.expect("status");

    // maxSurge 1, maxUnavailable 0: the new pod starts and must become Ready
    // (spawn waits for its readiness probe) while the old one still leads.
    let new = env.replica().await;
    assert_eq!(
        env.holder().await.as_ref(),
        Some(&old.pod.name),
        "the old pod still leads"
    );
    // Then the old pod gets SIGTERM; watch the Lease until the new pod holds it.
    let term = std::time::Instant::now();
    let status = old.pod.proc.terminate().expect("exit status");
    let exited = term.elapsed();
    assert!(
        status.success(),
        "SIGTERM ends the old replica cleanly: {status:?}\n{}",
        old.pod.proc.log_tail(30)
    );
    until("the new replica to lead", LEADER_LEASE, || async {
        let h = env.holder().await;
        Ok(if h.as_ref() == Some(&new.pod.name) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("holder {h:?}"))
        })
    })
    .await
    .expect("handover");
    let leaderless = term.elapsed();
    eprintln!(
        "rolling upgrade: old replica exited {exited:?} after SIGTERM; new leader {leaderless:?} after SIGTERM"
    );
    new.wait_master_status(LEADER_ELECTION_LEASE_NAME, "1")
        .await;

    // Nothing of the status was lost in the handover, and the drain finishes.
    let st = env
        .nms()
        .get(&env.n("a"))
        .await
        .expect("nm")
        .status
        .expect("status");
    assert_eq!(st.phase, before.phase);
    assert_eq!(st.eviction_pods, before.eviction_pods);
    assert_eq!(st.total_pods, before.total_pods);
    assert_eq!(st.pending_pods, before.pending_pods);
    assert_eq!(st.drain_progress, before.drain_progress);
    env.lift_pdb().await;
    env.wait_phase(&env.n("a"), MaintenancePhase::Succeeded)
        .await;
    drop(new);
    env.teardown().await;
}

/// Now as a Kubernetes MicroTime JSON value (exactly microseconds, as the API wants).
fn micro_now() -> serde_json::Value {
    let t = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    serde_json::to_value(t).expect("micro time")
}

/// SIGTERM before the NodeMaintenance cache is filled stops the controller
/// at once, and it is not Ready meanwhile. Seen before the fix: kube-runtime
/// holds reconciles until the cache is filled and its graceful shutdown
/// stops the watch that fills it, so the process waited forever (a standby
/// SIGTERMed 25 ms after its start, in `make test`); and /readyz answered 200
/// before the cache's gate was registered. Here the cache can never fill:
/// the controller's ServiceAccount may not read NodeMaintenances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_before_its_cache_filled_it_exits_at_once() {
    let env = Env::new("nm-early-stop", 1).await;
    let client = env.client();
    let (ns, sa) = (env.bed.namespace.clone(), "blind-controller");
    nmo_tests::manifests::apply_yaml(
        &client,
        &format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n"
        ),
    )
    .await
    .expect("ServiceAccount without RBAC");
    let kubeconfig = env
        .kubeconfig
        .with_file_name(format!("{}-blind.kubeconfig", env.bed.group));
    nmo_tests::process::service_account_kubeconfig(&client, &ns, sa, &kubeconfig)
        .await
        .expect("kubeconfig");
    let mut pod = nmo_tests::deployment::Launch::new("base", "nmo-controller")
        .extra_args([
            format!("--nodemaintenance-selector={GROUP_KEY}={}", env.bed.group),
            "--leader-elect=false".to_string(),
        ])
        .kubeconfig(&kubeconfig)
        .start(&client)
        .await
        .expect("controller starts");
    let probe = pod.port("health").expect("health port");
    let answer = until("/readyz to answer", LONG, || async {
        Ok(
            match nmo_tests::process::http_status_local(probe, "/readyz").await {
                Ok(answer) => Poll::Ready(answer),
                Err(e) => Poll::Pending(format!("{e:#}")),
            },
        )
    })
    .await
    .expect("probes up");
    assert_eq!(answer.0, 503, "not Ready without its cache: {answer:?}");
    assert!(answer.1.contains("NodeMaintenance cache"), "{answer:?}");
    let status = pod
        .proc
        .terminate()
        .unwrap_or_else(|e| panic!("stops on SIGTERM: {e}"));
    assert!(status.success(), "a clean exit: {status:?}");
    env.teardown().await;
}

/// The emergency steps of the design documents (seed 003), in their order,
/// run while the controller is up: uncordon, remove both taints, remove the
/// label, remove the finalizer, delete. Once the drain is done the
/// controller puts nothing back (it did, through its node watch, until
/// issue 38): the node stays as the person left it, and a Warning event
/// and the Cordoned condition say what the maintenance no longer keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emergency_steps_with_the_controller_running_leave_the_node_as_left() {
    let env = Env::new("hands", 1).await;
    let (nm, node) = env.drained("worker-1", "kernel").await;
    let nodes = env.nodes();
    let pp = PatchParams::default();
    // kubectl uncordon <node>
    nodes
        .patch(
            &node,
            &pp,
            &Patch::Merge(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .expect("uncordon");
    let by_hand = env
        .wait_nm(&nm, "Cordoned False, ChangedByHand", |n| {
            n.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Cordoned" && c.status == "False" && c.reason == "ChangedByHand"
                })
            })
        })
        .await;
    env.wait_event(&nm, "NodeChangedByHand").await;
    let message = by_hand
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == "Cordoned")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("uncordoned") && message.contains(&node),
        "{message}"
    );
    // kubectl taint node <node> medik8s.io/drain:NoSchedule- (and the unschedulable one)
    let current = nodes.get(&node).await.expect("node");
    let kept: Vec<_> = current
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != "medik8s.io/drain" && t.key != "node.kubernetes.io/unschedulable")
        .collect();
    nodes
        .patch(&node, &pp, &Patch::Merge(json!({"spec": {"taints": kept}})))
        .await
        .expect("untaint");
    // kubectl label node <node> remediation.medik8s.io/exclude-from-remediation-
    let label = "remediation.medik8s.io/exclude-from-remediation";
    nodes
        .patch(
            &node,
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {label: null}}})),
        )
        .await
        .expect("unlabel");
    // kubectl patch nm <nm> -p '{"metadata":{"finalizers":[]}}' --type=merge; kubectl delete nm <nm>
    env.nms()
        .patch(
            &nm,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": []}})),
        )
        .await
        .expect("finalizer removed");
    env.nms()
        .delete(&nm, &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone(&nm).await;
    stays(
        "the node as the person left it",
        Duration::from_secs(5),
        || async {
            let n = nodes.get(&node).await.map_err(|e| e.to_string())?;
            let labelled = n
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(label));
            let taints = node_taint_keys(&n);
            let ours = taints.iter().any(|t| t == "medik8s.io/drain");
            if is_cordoned(&n) || ours || labelled {
                return Err(format!(
                    "put back: cordoned {}, taints {taints:?}, label {labelled}",
                    is_cordoned(&n)
                ));
            }
            Ok(())
        },
    )
    .await;
    env.teardown().await;
}
