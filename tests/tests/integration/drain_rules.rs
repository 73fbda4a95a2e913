//! Drain rules (issue 39) through the local plane: a `Skip` rule keeps its
//! pod through a Succeeded maintenance and the pod label overrides a rule; a
//! `WaitCompleted` pod is not evicted, named in `Blocked`, and the drain
//! goes on once it completes; three order groups leave in order; a bad rule
//! is denied with the field named; the warnings name kept and waited-for
//! pods. Rules are cluster-wide: each test's rules match only its own nodes
//! (the test group's label) and are named after its group.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use nmo_tests::controller_env::ControllerEnv as Env;
use nmo_tests::fixtures::{GROUP_KEY, TestBed};
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{TestWebhook, create_with_warnings, test_nm, webhook_bed};
use serde_json::{Value, json};
use shared::MaintenancePhase;
use shared::api::drain_rule::NodeDrainRule;
use shared::rules::drain::{DRAIN_LABEL, DRAIN_ORDER_ANNOTATION};

const SHORT: Duration = Duration::from_secs(30);

/// A rule of `bed`'s group for the pods labelled `app` on its nodes.
fn rule(bed: &TestBed, short: &str, drain: Value, app: &str) -> NodeDrainRule {
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1alpha1", "kind": "NodeDrainRule",
        "metadata": {"name": format!("{}-{short}", bed.group), "labels": {GROUP_KEY: bed.group}},
        "spec": {
            "drain": drain,
            "nodes": [{"selector": {"matchLabels": {GROUP_KEY: bed.group}}}],
            "pods": [{"selector": {"matchLabels": {"app": app}}}]
        }
    }))
    .expect("NodeDrainRule JSON")
}

async fn create_rule(client: &Client, r: &NodeDrainRule) -> Result<NodeDrainRule, kube::Error> {
    Api::<NodeDrainRule>::all(client.clone())
        .create(&PostParams::default(), r)
        .await
}

async fn delete_rules(client: &Client, bed: &TestBed) {
    let api = Api::<NodeDrainRule>::all(client.clone());
    let lp = kube::api::ListParams::default().labels(&format!("{GROUP_KEY}={}", bed.group));
    for r in api.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        let _ = api.delete(&r.name_any(), &DeleteParams::default()).await;
    }
}

fn pods(env: &Env) -> Api<Pod> {
    Api::namespaced(env.client(), &env.bed.namespace)
}

/// Wait until pod `name` is Running (kwok made it so).
async fn running(env: &Env, name: &str) {
    let api = pods(env);
    until(&format!("pod {name} Running"), SHORT, || async {
        let p = api.get(name).await?;
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        Ok(if phase == "Running" {
            Poll::Ready(())
        } else {
            Poll::Pending(phase)
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

fn condition(nm: &shared::NodeMaintenance, type_: &str) -> Option<(String, String, String)> {
    let c = nm
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// A Skip rule keeps pod `logs` through a Succeeded maintenance; pod
/// `logs-over`, matched by the same rule, carries the pod label `drain`
/// and is evicted: the label is over the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_rule_keeps_its_pod_and_the_pod_label_overrides_it() {
    let env = Env::new("nm-dr-skip", 0).await;
    let client = env.client();
    create_rule(
        &client,
        &rule(&env.bed, "keep-logs", json!({"behavior": "Skip"}), "logs"),
    )
    .await
    .expect("rule created");
    let node = env.target().await;
    for (name, extra) in [
        ("web", json!({})),
        ("logs", json!({})),
        (
            "logs-over",
            json!({"metadata": {"labels": {"app": "logs", DRAIN_LABEL: "drain"}}}),
        ),
    ] {
        env.bed.pod_on(name, &node, extra).await.expect("pod");
        running(&env, name).await;
    }
    let nm = env.n("a");
    env.create_nm(&nm, &node).await;
    let done = env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    let st = done.status.unwrap_or_default();
    assert_eq!((st.total_pods, st.eviction_pods), (3, 2), "{st:?}");
    let api = pods(&env);
    let kept = api.get("logs").await.expect("the kept pod is still there");
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "the kept pod is not terminating"
    );
    for gone in ["web", "logs-over"] {
        until(&format!("pod {gone} gone"), SHORT, || async {
            Ok(match api.get_opt(gone).await? {
                None => Poll::Ready(()),
                Some(p) => Poll::Pending(format!("{:?}", p.metadata.deletion_timestamp)),
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }
    delete_rules(&client, &env.bed).await;
    env.teardown().await;
}

/// A WaitCompleted pod is not evicted: the maintenance names it in
/// Blocked (reason WaitingForCompletion, not a PDB) and says
/// DrainWaitingForCompletion; the pod completes and the drain goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_completed_pod_is_waited_for_and_named_until_it_completes() {
    let env = Env::new("nm-dr-wait", 0).await;
    let client = env.client();
    let wait = json!({"behavior": "WaitCompleted"});
    create_rule(&client, &rule(&env.bed, "train-finishes", wait, "train"))
        .await
        .expect("rule created");
    let node = env.target().await;
    for name in ["web", "train"] {
        env.bed.pod_on(name, &node, json!({})).await.expect("pod");
        running(&env, name).await;
    }
    let nm = env.n("a");
    env.create_nm(&nm, &node).await;
    let ns = env.bed.namespace.clone();
    let held = env
        .wait_nm(
            &nm,
            "Blocked: WaitingForCompletion naming the train pod, web gone",
            |m| {
                let pending = m.status.as_ref().map(|s| s.pending_pods.clone());
                pending == Some(vec!["train".to_string()])
                    && condition(m, "Blocked").is_some_and(|(status, reason, message)| {
                        status == "True"
                            && reason == "WaitingForCompletion"
                            && message.contains(&format!(
                                "{ns}/train: not evicted: waits until it completes"
                            ))
                    })
            },
        )
        .await;
    let st = held.status.clone().unwrap_or_default();
    println!("waiting: {}", st.last_error);
    assert_eq!(st.pending_pods, ["train"], "web left, train is waited for");
    assert_eq!(
        held.status.as_ref().and_then(|s| s.phase.clone()),
        Some(MaintenancePhase::Running)
    );
    env.wait_event(&nm, "DrainWaitingForCompletion").await;
    let train = pods(&env).get("train").await.expect("train is still there");
    assert!(
        train.metadata.deletion_timestamp.is_none(),
        "no eviction was sent for train"
    );

    // The pod completes (the test plays its kubelet).
    let done = json!({"status": {"phase": "Succeeded"}});
    pods(&env)
        .patch_status("train", &PatchParams::default(), &Patch::Merge(&done))
        .await
        .expect("train completed");
    let completed = Instant::now();
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    let took = completed.elapsed();
    println!(
        "drain went on {} ms after the pod completed",
        took.as_millis()
    );
    // The pod's change wakes the drain (its pod watch), not the 5 s retry.
    assert!(
        took < Duration::from_secs(3),
        "the drain went on {took:?} after the pod completed: that is the blocked retry, not the wake"
    );
    delete_rules(&client, &env.bed).await;
    env.teardown().await;
}

/// Three order groups: `storage` (rule order 10), `logs` (annotation 20)
/// and `web` (group 0): each leaves only once the one before has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_order_groups_leave_in_order() {
    let env = Env::new("nm-dr-order", 0).await;
    let client = env.client();
    let last = json!({"behavior": "Drain", "order": 10});
    create_rule(&client, &rule(&env.bed, "storage-later", last, "storage"))
        .await
        .expect("rule created");
    let node = env.target().await;
    let annotated = json!({"metadata": {"annotations": {DRAIN_ORDER_ANNOTATION: "20"}}});
    for (name, extra) in [
        ("web", json!({})),
        ("storage", json!({})),
        ("logs", annotated),
    ] {
        env.bed.pod_on(name, &node, extra).await.expect("pod");
        running(&env, name).await;
    }
    // When each pod is marked for deletion (its eviction accepted).
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let marked = tokio::spawn(deletions(pods(&env), 3, listed_tx));
    // The watch has listed the pods: it sees every deletion from now on.
    tokio::time::timeout(SHORT, listed)
        .await
        .expect("the pod watch listed within 30 s")
        .expect("the watch task runs");
    let started = Instant::now();
    let nm = env.n("a");
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    let marked = tokio::time::timeout(SHORT, marked)
        .await
        .expect("three deletions seen")
        .expect("watch task");
    let mut order: Vec<(Duration, String)> = marked
        .into_iter()
        .map(|(name, at)| (at.duration_since(started), name))
        .collect();
    order.sort();
    for (at, name) in &order {
        println!(
            "order group figure: {name} evicted {} ms after the create",
            at.as_millis()
        );
    }
    let names: Vec<&str> = order.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(
        names,
        ["web", "storage", "logs"],
        "groups 0, 10, 20 in turn: {order:?}"
    );
    delete_rules(&client, &env.bed).await;
    env.teardown().await;
}

/// The first time each of `count` pods of `api` is seen marked for
/// deletion; `listed` is told once the watch's first list is in.
async fn deletions(
    api: Api<Pod>,
    count: usize,
    listed: tokio::sync::oneshot::Sender<()>,
) -> BTreeMap<String, Instant> {
    let mut seen = BTreeMap::new();
    let mut listed = Some(listed);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    while seen.len() < count {
        let Some(event) = stream.next().await else {
            break;
        };
        if matches!(event, Ok(watcher::Event::InitDone)) {
            if let Some(tx) = listed.take() {
                let _ = tx.send(());
            }
        }
        let pods: Vec<Pod> = match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                if p.metadata.deletion_timestamp.is_some() {
                    vec![p]
                } else {
                    vec![]
                }
            }
            Ok(watcher::Event::Delete(p)) => vec![p],
            _ => vec![],
        };
        for p in pods {
            seen.entry(p.name_any()).or_insert_with(Instant::now);
        }
    }
    seen
}

/// The webhook denies a bad rule naming the field; the API server's schema
/// refuses an unknown behaviour naming its field; the warnings of a
/// NodeMaintenance say which pods the rules keep and wait for, and the groups.
#[tokio::test]
async fn bad_rules_are_denied_and_the_warnings_name_what_the_rules_do() {
    let (client, bed, _cleanup) = webhook_bed("nm-dr-hook").await;
    let webhook = TestWebhook::start(
        &client,
        &bed.group,
        &["--warnings-timeout=5s", "--max-concurrent-maintenances=0"],
    )
    .await;
    webhook.register(&client, &bed.group).await;

    let mut bad = rule(&bed, "bad-op", json!({"behavior": "Skip"}), "x");
    bad.spec.pods[0].selector = serde_json::from_value(json!(
        {"matchExpressions": [{"key": "app", "operator": "Equals", "values": ["x"]}]}
    ))
    .expect("selector");
    let denied = until("the bad rule denied by our webhook", SHORT, || async {
        Ok(match create_rule(&client, &bad).await {
            Err(kube::Error::Api(s)) if s.message.contains("is not valid") => {
                Poll::Ready(s.message)
            }
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    println!("denied: {denied}");
    assert!(
        denied.contains(
            "spec.pods[0].selector.matchExpressions[0].operator: unknown operator \"Equals\""
        ),
        "{denied}"
    );
    // An unknown behaviour does not even reach the webhook: the CRD's schema.
    let mut unknown =
        serde_json::to_value(rule(&bed, "bad-behavior", json!({"behavior": "Skip"}), "x"))
            .expect("rule JSON");
    unknown["spec"]["drain"]["behavior"] = json!("Sometimes");
    let unknown: DynamicObject = serde_json::from_value(unknown).expect("object");
    let ar = ApiResource::erase::<NodeDrainRule>(&());
    match Api::<DynamicObject>::all_with(client.clone(), &ar)
        .create(&PostParams::default(), &unknown)
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert!(s.message.contains("spec.drain.behavior"), "{}", s.message)
        }
        other => panic!("an unknown behaviour was accepted: {other:?}"),
    }
    let order_on_skip = rule(
        &bed,
        "bad-order",
        json!({"behavior": "Skip", "order": 3}),
        "x",
    );
    match create_rule(&client, &order_on_skip).await {
        Err(kube::Error::Api(s)) => {
            assert!(s.message.contains("spec.drain.order"), "{}", s.message)
        }
        other => panic!("an order on Skip was accepted: {other:?}"),
    }

    // The warnings: what the rules will do on a node.
    for (short, drain, app) in [
        ("keep", json!({"behavior": "Skip"}), "logs"),
        ("wait", json!({"behavior": "WaitCompleted"}), "train"),
        (
            "later",
            json!({"behavior": "Drain", "order": 10}),
            "storage",
        ),
    ] {
        create_rule(&client, &rule(&bed, short, drain, app))
            .await
            .expect("rule created");
    }
    let node = bed.node("w1", false).await.expect("node").name_any();
    for name in ["web", "logs", "train", "storage"] {
        bed.pod_on(name, &node, json!({})).await.expect("pod");
    }
    let ns = bed.namespace.clone();
    let nm = test_nm(&format!("{}-nm", bed.group), &node);
    let want = [
        format!(
            "drain rules keep 1 pod(s) on node {node} (behavior Skip, never evicted): {ns}/logs (NodeDrainRule {}-keep)",
            bed.group
        ),
        format!(
            "the drain waits for 1 pod(s) on node {node} to complete, not evicting them (behavior WaitCompleted; spec.drainTimeout still bounds it): {ns}/train (NodeDrainRule {}-wait)",
            bed.group
        ),
        format!(
            "pods leave node {node} in order groups, each once the one before has left: group 0: 1 pod(s), group 10: 1 pod(s)"
        ),
    ];
    let warnings = until("warnings naming the rules' pods", SHORT, || async {
        Ok(match create_with_warnings(&client, &nm, true).await {
            Ok(w) if want.iter().all(|line| w.contains(line)) => Poll::Ready(w),
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    println!("warnings:\n{}", warnings.join("\n"));
    delete_rules(&client, &bed).await;
}

/// `--exclude-from-load-balancers --load-balancer-drain-delay=3s`: the node
/// gets the exclusion label with its cordon, its pod is not evicted before
/// the delay, and the give-back removes the label; a node that carried the
/// label before keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_is_shed_first_and_the_label_given_back() {
    use shared::serve::drain_flags::EXCLUDE_FROM_LB_LABEL;
    const DELAY: Duration = Duration::from_secs(3);
    let flags = [
        "--exclude-from-load-balancers".to_string(),
        "--load-balancer-drain-delay=3s".to_string(),
    ];
    let env = Env::with_flags("nm-dr-lb", 0, &flags).await;
    let node = env.target().await;
    env.bed.pod_on("web", &node, json!({})).await.expect("pod");
    running(&env, "web").await;
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let marked = tokio::spawn(deletions(pods(&env), 1, listed_tx));
    tokio::time::timeout(SHORT, listed)
        .await
        .expect("the pod watch listed within 30 s")
        .expect("the watch task runs");
    let nm = env.n("a");
    env.create_nm(&nm, &node).await;
    let labelled_at = until("the exclusion label on the node", SHORT, || async {
        let n = env.nodes().get(&node).await?;
        Ok(match n.labels().get(EXCLUDE_FROM_LB_LABEL) {
            Some(v) if v == "true" => Poll::Ready(Instant::now()),
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    env.wait_event(&nm, "LoadBalancersExcluded").await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    let evicted = tokio::time::timeout(SHORT, marked)
        .await
        .expect("the eviction seen")
        .expect("watch task");
    let after = evicted["web"].duration_since(labelled_at);
    println!(
        "load balancer figure: web evicted {} ms after the label was seen",
        after.as_millis()
    );
    // The label was seen a little after it went on (polling): the first
    // eviction comes at least the delay after, less that lag.
    assert!(
        after + Duration::from_millis(500) >= DELAY,
        "evicted {after:?} after the label"
    );
    env.nms()
        .delete(&nm, &DeleteParams::default())
        .await
        .expect("deleted");
    env.wait_gone(&nm).await;
    let back = env.nodes().get(&node).await.expect("node");
    assert!(
        !back.labels().contains_key(EXCLUDE_FROM_LB_LABEL),
        "given back: {:?}",
        back.labels()
    );

    // A node that carried the label before keeps it.
    let other = env
        .bed
        .node("labelled", false)
        .await
        .expect("node")
        .name_any();
    let add = json!({"metadata": {"labels": {EXCLUDE_FROM_LB_LABEL: "admin"}}});
    env.nodes()
        .patch(&other, &PatchParams::default(), &Patch::Merge(&add))
        .await
        .expect("labelled by an admin");
    let nm_b = env.n("b");
    env.create_nm(&nm_b, &other).await;
    env.wait_phase(&nm_b, MaintenancePhase::Succeeded).await;
    env.nms()
        .delete(&nm_b, &DeleteParams::default())
        .await
        .expect("deleted");
    env.wait_gone(&nm_b).await;
    let kept = env.nodes().get(&other).await.expect("node");
    assert_eq!(
        kept.labels().get(EXCLUDE_FROM_LB_LABEL).map(String::as_str),
        Some("admin"),
        "an admin's label is kept"
    );
    env.teardown().await;
}
