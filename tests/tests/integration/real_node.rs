//! nmo-rs as a cluster runs it: manifests/base (rendered, plus only
//! tests/node/local-images) installed on the real node `real-1`, its pods
//! started, probed, replaced and restarted by a real kubelet and containerd
//! (tests/node/up.sh). The API server reaches the webhook pods through their
//! Service, from inside the node (the "cluster" egress); the maintenances
//! run on kwok nodes.
//!
//! Every test is `#[ignore]`d: tests/node/stage.sh (the last stage of make
//! test, `make real-node-test`) installs the base on the node and runs them
//! one at a time; they change the shared install (its Deployments' versions,
//! its replicas, its leader). `cert_manager_renewals_refuse_no_admission`
//! runs on its own after the stage installed manifests/overlays/cert-manager
//! instead (`tests/node/install.sh cert-manager`, the real cert-manager of
//! make companions).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nmo_tests::admission_stream::Stream;
use nmo_tests::companions;
use nmo_tests::fixtures::TestBed;
use nmo_tests::real_node;
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::test_nm;
use serde_json::json;
use shared::NodeMaintenance;
use shared::api::crd::MaintenancePhase;

const NS: &str = "nmo-system";
const LEADER_LEASE: &str = "135b1886.medik8s.io";
const LONG: Duration = Duration::from_secs(180);

async fn client() -> anyhow::Result<Client> {
    real_node::state()?;
    nmo_tests::admin_client().await
}

/// Deployment `name` has rolled out: every replica updated and available,
/// and no pod of an older template left.
async fn wait_rolled_out(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    until(&format!("deployment {name} rolled out"), LONG, || async {
        let d = api.get(name).await?;
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let st = d.status.unwrap_or_default();
        let done = st.observed_generation >= d.metadata.generation
            && st.updated_replicas == Some(want)
            && st.available_replicas == Some(want)
            && st.replicas == Some(want);
        Ok(if done {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("want {want}: {st:?}"))
        })
    })
    .await
}

/// Roll Deployment `name` to a second build: its image under a new tag
/// (tagged in the node's containerd: the same content, as a rebuild of the
/// same commit would be) and a new version label on its pods.
async fn upgrade(client: &Client, name: &str, version: &str) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = api.get(name).await?;
    let c = &d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec")
        .containers[0];
    let image = c.image.clone().expect("image");
    let repo = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
    let next = format!("{repo}:{version}");
    real_node::tag_image(&image, &next)?;
    let patch = json!({"spec": {"template": {
        "metadata": {"labels": {"app.kubernetes.io/version": version}},
        "spec": {"containers": [{"name": c.name, "image": next}]}
    }}});
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await?;
    Ok(())
}

async fn scale(client: &Client, name: &str, replicas: i32) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let patch = json!({"spec": {"replicas": replicas}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_rolled_out(client, name).await
}

async fn leader(client: &Client) -> anyhow::Result<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NS)
        .get(LEADER_LEASE)
        .await?;
    Ok(lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}

async fn pod_names(client: &Client, component: &str) -> anyhow::Result<Vec<String>> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/component={component}"));
    let pods = Api::<Pod>::namespaced(client.clone(), NS).list(&lp).await?;
    Ok(pods
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// The container restarts of `component`'s pods, by pod.
async fn restarts(client: &Client, component: &str) -> anyhow::Result<BTreeMap<String, i32>> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/component={component}"));
    let pods = Api::<Pod>::namespaced(client.clone(), NS).list(&lp).await?;
    Ok(pods
        .items
        .into_iter()
        .map(|p| {
            let n = p
                .status
                .and_then(|s| s.container_statuses)
                .map_or(0, |c| c.iter().map(|c| c.restart_count).sum());
            (p.metadata.name.unwrap_or_default(), n)
        })
        .collect())
}

/// Wait until none of `pods` (of `component`) exists any more: terminated
/// after their grace period, not only terminating.
async fn wait_gone(client: &Client, component: &str, pods: &[String]) -> anyhow::Result<()> {
    until(&format!("the old {component} pods gone"), LONG, || async {
        let left: Vec<String> = pod_names(client, component)
            .await?
            .into_iter()
            .filter(|p| pods.contains(p))
            .collect();
        Ok(if left.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("still there: {left:?}"))
        })
    })
    .await
}

/// Wait until the leader election Lease names a live controller pod other
/// than `not`.
async fn wait_leader(client: &Client, not: &str) -> anyhow::Result<String> {
    until("another controller pod to lead", LONG, || async {
        let l = leader(client).await?;
        let alive = pod_names(client, "controller").await?;
        Ok(if l != not && alive.contains(&l) {
            Poll::Ready(l)
        } else {
            Poll::Pending(format!("holder {l:?}, pods {alive:?}"))
        })
    })
    .await
}

/// A maintenance held by a PodDisruptionBudget: a kwok node of `bed` with one
/// pod a PDB (minAvailable 1) protects, and a NodeMaintenance for it, waiting
/// with that pod pending. Returns (node, maintenance).
async fn held_drain(bed: &TestBed, suffix: &str) -> anyhow::Result<(String, String)> {
    let node = bed
        .node(suffix, false)
        .await?
        .metadata
        .name
        .unwrap_or_default();
    let app = format!("held-{suffix}");
    bed.pod_on(&app, &node, json!({})).await?;
    bed.pdb(&app, &app, 1).await?;
    bed.wait_pdb_status(&app, 1, LONG).await?;
    let nm = format!("{}-{suffix}", bed.group);
    let nms: Api<NodeMaintenance> = Api::all(bed.client.clone());
    nms.create(&PostParams::default(), &test_nm(&nm, &node))
        .await?;
    until(&format!("{nm} held by PDB {app}"), LONG, || async {
        let st = nms.get(&nm).await?.status.unwrap_or_default();
        let pending = st.pending_pods;
        Ok(if pending.contains(&app) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("phase {:?}, pending {pending:?}", st.phase))
        })
    })
    .await?;
    Ok((node, nm))
}

/// Lift the PDB of `held_drain` and wait for the maintenance to succeed.
async fn release(bed: &TestBed, suffix: &str, nm: &str) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    Api::<PodDisruptionBudget>::namespaced(bed.client.clone(), &bed.namespace)
        .delete(&format!("held-{suffix}"), &DeleteParams::default())
        .await?;
    let nms: Api<NodeMaintenance> = Api::all(bed.client.clone());
    until(&format!("{nm} Succeeded"), LONG, || async {
        let st = nms.get(nm).await?.status.unwrap_or_default();
        Ok(match st.phase {
            Some(MaintenancePhase::Succeeded) => Poll::Ready(()),
            p => Poll::Pending(format!("phase {p:?}, lastError {:?}", st.last_error)),
        })
    })
    .await?;
    Ok(t0.elapsed())
}

/// The events on NodeMaintenance `nm`, counted by reason.
async fn events_of(client: &Client, nm: &str) -> anyhow::Result<BTreeMap<String, i32>> {
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=NodeMaintenance,involvedObject.name={nm}"
    ));
    let mut out = BTreeMap::new();
    for e in Api::<Event>::all(client.clone()).list(&lp).await?.items {
        *out.entry(e.reason.unwrap_or_default()).or_insert(0) += e.count.unwrap_or(1);
    }
    Ok(out)
}

/// BeginMaintenance and SucceedMaintenance on `nm`, each exactly once (the
/// events are written after the status: wait for both first).
async fn assert_once(client: &Client, nm: &str) -> anyhow::Result<()> {
    const ONCE: [&str; 2] = ["BeginMaintenance", "SucceedMaintenance"];
    let ev = until(&format!("{ONCE:?} on {nm}"), LONG, || async {
        let ev = events_of(client, nm).await?;
        Ok(if ONCE.iter().all(|r| ev.contains_key(*r)) {
            Poll::Ready(ev)
        } else {
            Poll::Pending(format!("{ev:?}"))
        })
    })
    .await?;
    println!("events on {nm}: {ev:?}");
    for reason in ONCE {
        assert_eq!(
            ev.get(reason),
            Some(&1),
            "{reason} on {nm} exactly once: {ev:?}"
        );
    }
    Ok(())
}

/// Delete NodeMaintenance `nm` and wait until the controller has given its
/// node back and let it go.
async fn delete_and_wait(client: &Client, nm: &str) -> anyhow::Result<()> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let _ = api.delete(nm, &DeleteParams::default()).await;
    until(&format!("{nm} gone"), LONG, || async {
        Ok(match api.get_opt(nm).await? {
            None => Poll::Ready(()),
            Some(_) => Poll::Pending("still there".into()),
        })
    })
    .await
}

async fn finish(bed: &TestBed, nms: &[&str]) {
    for nm in nms {
        let _ = delete_and_wait(&bed.client, nm).await;
    }
    bed.teardown().await;
}

/// The sum of `component`'s container restarts.
async fn restart_sum(client: &Client, component: &str) -> anyhow::Result<i32> {
    Ok(restarts(client, component).await?.values().sum())
}

/// Once the webhook has rolled out: a test bed with a kwok node of its own,
/// and a stream of creates for it already flowing (50 admitted).
async fn streaming(client: &Client, prefix: &str) -> anyhow::Result<(TestBed, Stream)> {
    wait_rolled_out(client, "nmo-webhook").await?;
    let bed = TestBed::new(client.clone(), prefix).await?;
    let node = bed
        .node("w", false)
        .await?
        .metadata
        .name
        .unwrap_or_default();
    let stream = Stream::start(client.clone(), bed.group.clone(), node);
    stream.wait_more(50, LONG).await?;
    Ok((bed, stream))
}

#[tokio::test]
#[ignore = "tests/node/stage.sh runs it with manifests/base on the real node"]
async fn webhook_rolling_upgrade_refuses_no_admission() -> anyhow::Result<()> {
    let client = client().await?;
    let (bed, stream) = streaming(&client, "rn-up").await?;
    let before = pod_names(&client, "webhook").await?;
    let t0 = Instant::now();
    upgrade(&client, "nmo-webhook", &nmo_tests::unique("0.1.0-next")).await?;
    wait_rolled_out(&client, "nmo-webhook").await?;
    wait_gone(&client, "webhook", &before).await?;
    let took = t0.elapsed();
    stream.wait_more(100, LONG).await?;
    stream.stop();
    let after = pod_names(&client, "webhook").await?;
    let (ok, failed) = stream.counts();
    println!(
        "webhook rolling upgrade (pods {before:?} -> {after:?}) in {:.1} s under a stream of creates: {ok} admitted, {} failed",
        took.as_secs_f64(),
        failed.len()
    );
    bed.teardown().await;
    assert!(
        before.iter().all(|p| !after.contains(p)),
        "every webhook pod replaced"
    );
    assert!(
        failed.is_empty(),
        "failed admissions during the rolling upgrade: {failed:?}"
    );
    Ok(())
}

#[tokio::test]
#[ignore = "tests/node/stage.sh runs it with manifests/base on the real node"]
async fn controller_hand_over_finishes_a_held_drain_once() -> anyhow::Result<()> {
    let client = client().await?;
    scale(&client, "nmo-controller", 2).await?;
    let bed = TestBed::new(client.clone(), "rn-ho").await?;

    // A rolling upgrade while a PodDisruptionBudget holds the drain.
    let (_, nm1) = held_drain(&bed, "a").await?;
    let old_leader = leader(&client).await?;
    let old_pods = pod_names(&client, "controller").await?;
    upgrade(&client, "nmo-controller", &nmo_tests::unique("0.1.0-next")).await?;
    wait_rolled_out(&client, "nmo-controller").await?;
    wait_gone(&client, "controller", &old_pods).await?;
    let new_leader = wait_leader(&client, &old_leader).await?;
    let took = release(&bed, "a", &nm1).await?;
    println!(
        "controller rolling upgrade mid-drain: leader {old_leader} -> {new_leader}; {nm1} Succeeded {:.1} s after its PDB was lifted",
        took.as_secs_f64()
    );
    assert_once(&client, &nm1).await?;
    // Given back first: a Succeeded maintenance keeps its slot (one by default).
    delete_and_wait(&client, &nm1).await?;

    // The leading pod deleted while a drain is held: the standby takes over.
    let (_, nm2) = held_drain(&bed, "b").await?;
    let killed = leader(&client).await?;
    let t0 = Instant::now();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(&killed, &DeleteParams::default())
        .await?;
    let took_over = wait_leader(&client, &killed).await?;
    let lead_after = t0.elapsed();
    let took = release(&bed, "b", &nm2).await?;
    println!(
        "leader pod {killed} deleted mid-drain: {took_over} leads after {:.1} s; {nm2} Succeeded {:.1} s after its PDB was lifted",
        lead_after.as_secs_f64(),
        took.as_secs_f64()
    );
    assert_once(&client, &nm2).await?;
    wait_rolled_out(&client, "nmo-controller").await?;
    println!(
        "controller restarts: {:?}",
        restarts(&client, "controller").await?
    );
    finish(&bed, &[&nm1, &nm2]).await;
    Ok(())
}

/// What controller-runtime guarantees and a cluster relies on: a leader cut
/// off from the API server for longer than its 10 s renew deadline gives its
/// Lease up and exits before the Lease (15 s) can expire for the others, so
/// the kubelet restarts it and the next leader finishes the drain.
///
///
/// The deadline runs from the leader's last successful renewal (every 2 s),
/// so a 12 s outage always passes it (controller/src/leadership/decide.rs).
/// tests/node/stage.sh runs it last, on its own: kube-controller-manager
/// may take a while to catch up after the restart.
#[tokio::test]
#[ignore = "restarts the shared API server: tests/node/stage.sh runs it on its own"]
async fn apiserver_restart_mid_drain_the_kubelet_restarts_the_leader_and_it_finishes()
-> anyhow::Result<()> {
    let client = client().await?;
    scale(&client, "nmo-controller", 2).await?;
    let bed = TestBed::new(client.clone(), "rn-ar").await?;
    let (_, nm) = held_drain(&bed, "c").await?;
    let before = restarts(&client, "controller").await?;
    let sum_before: i32 = before.values().sum();
    // Down for 12 s: longer than the leader's 10 s renew deadline.
    let r = nmo_tests::plane::restart("kube-apiserver", 12.0).await?;
    until(
        "the kubelet to restart the controller that gave its Lease up",
        LONG,
        || async {
            let n = restart_sum(&client, "controller").await?;
            Ok(if n > sum_before {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{n} restarts"))
            })
        },
    )
    .await?;
    wait_rolled_out(&client, "nmo-controller").await?;
    let leader = wait_leader(&client, "").await?;
    let took = release(&bed, "c", &nm).await?;
    let after = restarts(&client, "controller").await?;
    println!(
        "API server restarted mid-drain ({r}): controller restarts {before:?} -> {after:?}; {leader} leads; \
         {nm} Succeeded {:.1} s after its PDB was lifted",
        took.as_secs_f64()
    );
    assert_once(&client, &nm).await?;
    finish(&bed, &[&nm]).await;
    Ok(())
}

/// The certificate each webhook pod serves (DER), by pod: dialed at the
/// pod's address from inside the node, verified against `ca` for the
/// Service's name, as the API server dials and verifies it.
async fn served_by_pods(client: &Client, ca: &str) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let tls = nmo_webhook_client::tls_config(ca.as_bytes())?;
    let lp = ListParams::default().labels("app.kubernetes.io/component=webhook");
    let mut out = BTreeMap::new();
    for p in Api::<Pod>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        let (Some(name), Some(ip)) = (p.metadata.name, p.status.and_then(|s| s.pod_ip)) else {
            continue;
        };
        let addr = std::net::SocketAddr::new(ip.parse()?, 9443);
        let cert = real_node::served_certificate(addr, SERVICE_NAME, tls.clone()).await?;
        out.insert(name, cert);
    }
    Ok(out)
}

const SERVICE_NAME: &str = "nmo-webhook-service.nmo-system.svc";

/// Renew `certs` in order (as `cmctl renew`), then wait until every webhook
/// pod serves the Secret's new certificate, verified against the injected
/// caBundle. Returns the time from the first renewal to the last pod serving.
async fn renew_and_serve(client: &Client, certs: &[&str]) -> anyhow::Result<Duration> {
    let api = companions::certificates(client, NS);
    let t0 = Instant::now();
    for c in certs {
        let rev = api.get(c).await?.data["status"]["revision"]
            .as_i64()
            .unwrap_or(0);
        companions::renew(client, NS, c).await?;
        companions::wait_certificate(client, NS, c, rev, LONG).await?;
    }
    let want = companions::secret_value(client, NS, "nmo-webhook-cert", "tls.crt").await?;
    let want = nmo_webhook_client::pem_to_der(&want).unwrap_or_default();
    let ca = companions::wait_injected(
        client,
        NS,
        "nmo-validating-webhook",
        "nmo-webhook-cert",
        LONG,
    )
    .await?;
    until(
        "every webhook pod to serve the renewed certificate",
        LONG,
        || async {
            let served = served_by_pods(client, &ca).await?;
            let old: Vec<&String> = served
                .iter()
                .filter(|(_, c)| **c != want)
                .map(|(p, _)| p)
                .collect();
            Ok(if !served.is_empty() && old.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("still the previous certificate: {old:?}"))
            })
        },
    )
    .await?;
    Ok(t0.elapsed())
}

#[tokio::test]
#[ignore = "tests/node/stage.sh runs it with manifests/overlays/cert-manager on the real node"]
async fn cert_manager_renewals_refuse_no_admission() -> anyhow::Result<()> {
    let client = client().await?;
    let (bed, stream) = streaming(&client, "rn-cm").await?;
    let mut failed_total = 0;
    for (what, certs) in [
        ("leaf renewal", &["nmo-webhook-cert"][..]),
        (
            "CA renewal, then the leaf's",
            &["nmo-webhook-ca", "nmo-webhook-cert"][..],
        ),
    ] {
        let (_, before) = stream.counts();
        let took = renew_and_serve(&client, certs).await?;
        stream.wait_more(100, LONG).await?;
        let (ok, after) = stream.counts();
        let failed = after.len() - before.len();
        failed_total += failed;
        println!(
            "{what}: both webhook pods serve the new certificate {:.1} s after the renewal was asked \
             (the kubelet projected the Secret); {ok} admitted so far, {failed} failed during it",
            took.as_secs_f64()
        );
    }
    stream.stop();
    let (_, failed) = stream.counts();
    bed.teardown().await;
    assert_eq!(
        failed_total, 0,
        "failed admissions across the renewals: {failed:?}"
    );
    Ok(())
}
