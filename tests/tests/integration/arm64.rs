//! The linux/arm64 images against the local control plane: each service's
//! arm64 binary, out of its image index (`make images`), run as its
//! Deployment would run it, under qemu-aarch64 on an amd64 machine.
//!
//! Run by the arm64 stage of `make test` only (`bash tests/arm64.sh`, which
//! sets `NMO_TEST_IMAGE_PLATFORM=linux/arm64`): the tests are `#[ignore]`d so
//! that the other stages, which run the host's images, never pick them up.
//! They start the same webhook and controller pods as suites `webhook_warnings`
//! and `controller` (`TestWebhook`, `ControllerEnv`), on the arm64 image.

use kube::ResourceExt;
use kube::api::DeleteParams;
use nmo_tests::controller_env::{ControllerEnv, LONG, is_cordoned, node_taint_keys, running_on};
use nmo_tests::image::{PLATFORM_VAR, host_platform, test_platform};
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{TestWebhook, create_with_warnings, test_nm, webhook_bed};
use shared::MaintenancePhase;

const ARM64: &str = "linux/arm64";

/// These tests mean the arm64 image: fail early, saying how to run them,
/// when the launcher would start another one.
fn require_arm64() {
    assert_eq!(
        test_platform(),
        ARM64,
        "suite arm64 runs the linux/arm64 images: run it with {PLATFORM_VAR}={ARM64} (bash tests/arm64.sh does)"
    );
}

/// The process `pid` is the service's arm64 binary, run under qemu-aarch64
/// when this machine is not arm64 itself.
fn assert_runs_arm64_binary(pid: u32, service: &str) {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/cmdline of {service}: {e}"));
    let argv: Vec<String> = raw
        .strip_suffix(&[0])
        .unwrap_or(&raw)
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let binary = if host_platform() == ARM64 {
        argv.first()
    } else {
        assert!(
            argv.first().is_some_and(|a| a.ends_with("/qemu-aarch64")),
            "{service} should run under qemu-aarch64: {argv:?}"
        );
        argv.get(1)
    };
    assert!(
        binary.is_some_and(|b| b.ends_with(&format!("/{service}"))),
        "{service}: {argv:?}"
    );
    let image = nmo_tests::image::unpack(service).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(image.platform, ARM64, "{service} image {}", image.digest);
    eprintln!(
        "{service}: pid {pid} runs {argv:?} from image {} ({})",
        image.digest, image.platform
    );
}

#[tokio::test]
#[ignore = "the arm64 stage of make test runs it: bash tests/arm64.sh"]
async fn webhook_admits_and_denies_a_duplicate() {
    require_arm64();
    let (client, bed, _cleanup) = webhook_bed("a64wh").await;
    let node = bed.node("n", false).await.expect("node").name_any();
    let webhook = TestWebhook::start(&client, &bed.group, &[]).await;
    assert_runs_arm64_binary(webhook.proc.pid(), "nmo-webhook");
    // Returns once the API server calls it (a denial in its words).
    webhook.register(&client, &bed.group).await;

    let first = test_nm(&format!("{}-first", bed.group), &node);
    create_with_warnings(&client, &first, false)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the arm64 webhook should admit the first NodeMaintenance for {node}: {e:?}\nwebhook log:\n{}",
                webhook.proc.log_tail(40)
            )
        });
    // The duplicate is denied once the webhook's cache holds the first.
    let dup = test_nm(&format!("{}-dup", bed.group), &node);
    let want = format!("invalid nodeName, a NodeMaintenance for node {node} already exists");
    until("the arm64 webhook to deny the duplicate", LONG, || async {
        Ok(match create_with_warnings(&client, &dup, true).await {
            Err((403, m)) if m.ends_with(&want) => Poll::Ready(()),
            other => Poll::Pending(format!("dry-run create of the duplicate: {other:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nwebhook log:\n{}", webhook.proc.log_tail(40)));
    let real = create_with_warnings(&client, &dup, false).await;
    assert!(
        matches!(&real, Err((403, m)) if m.ends_with(&want)),
        "the real create of the duplicate: {real:?}"
    );
    drop(webhook);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the arm64 stage of make test runs it: bash tests/arm64.sh"]
async fn controller_takes_a_maintenance_to_succeeded_and_back() {
    require_arm64();
    let env = ControllerEnv::new("a64ctl", 1).await;
    let pid = env.ctrl.as_ref().map(|c| c.proc.pid()).expect("controller");
    assert_runs_arm64_binary(pid, "nmo-controller");
    let target = env.target().await;
    env.bed
        .bare_pod("bare", &target)
        .await
        .expect("a pod to evict");
    env.wait_pods("the bare pod running on the target", |m| {
        running_on(m, &target, "bare") == 1
    })
    .await;
    // Taken once the node lifecycle controller has lifted a fresh node's
    // not-ready taint, so that only the maintenance changes the taints.
    let nodes = env.nodes();
    let before = until("the target without its not-ready taint", LONG, || async {
        let n = nodes.get(&target).await?;
        let taints = node_taint_keys(&n);
        Ok(
            if taints
                .iter()
                .any(|t| t.starts_with("node.kubernetes.io/not-ready"))
            {
                Poll::Pending(format!("taints {taints:?}"))
            } else {
                Poll::Ready(n)
            },
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));

    let name = env.n("a");
    env.create_nm(&name, &target).await;
    let nm = env.wait_phase(&name, MaintenancePhase::Succeeded).await;
    let st = nm.status.expect("status");
    assert_eq!(st.drain_progress, 100, "{st:?}");
    let during = env.nodes().get(&target).await.expect("node");
    assert!(is_cordoned(&during), "cordoned while in maintenance");
    let taints = node_taint_keys(&during);
    assert!(
        taints.contains(&"medik8s.io/drain:NoSchedule".to_string()),
        "drain taint: {taints:?}"
    );
    env.wait_pods("the bare pod evicted from the target", |m| {
        running_on(m, &target, "bare") == 0
    })
    .await;

    env.nms()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the NodeMaintenance");
    env.wait_gone(&name).await;
    let want = node_taint_keys(&before);
    until(
        "the node given back (uncordoned, taints as before)",
        LONG,
        || async {
            let n = nodes.get(&target).await?;
            let taints = node_taint_keys(&n);
            Ok(if !is_cordoned(&n) && taints == want {
                Poll::Ready(())
            } else {
                Poll::Pending(format!(
                    "unschedulable {}, taints {taints:?} (want {want:?})",
                    is_cordoned(&n)
                ))
            })
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", nmo_tests::component_log_tails(10)));
    env.teardown().await;
}
