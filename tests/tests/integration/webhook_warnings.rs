//! Admission warnings and the pre-flight check through the real API server:
//! an allowed NodeMaintenance create answers with what the maintenance will
//! do (pods a PodDisruptionBudget holds, KubeVirt VMs that cannot
//! live-migrate, pods without a controller, emptyDir data, a taken
//! maintenance slot), for a real create, a server-side dry run and
//! `kubectl create --dry-run=server` alike. Each test runs its own webhook as
//! the nmo-webhook ServiceAccount (so manifests/webhook/'s grants are what
//! the lookups get), registered for its own group's NodeMaintenances only.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::api::{GroupVersionKind, PostParams};
use kube::{Api, Client};
use nmo_tests::fixtures::GROUP_KEY;
use nmo_tests::wait::{Poll, until};
use nmo_tests::webhook_pod::{TestWebhook, create_with_warnings, test_nm, webhook_bed as setup};
use nmo_webhook::warnings::slot_line;
use serde_json::json;
use shared::NodeMaintenance;
use shared::rules::slots;

const SHORT: Duration = Duration::from_secs(30);
const VMI_CRD: &str = "virtualmachineinstances.kubevirt.io";
/// Generous budget: the test machine is shared and the binaries are debug
/// builds; the default (250 ms) is about production API servers.
const BUDGET: &str = "--warnings-timeout=5s";

fn name_of(n: Node) -> String {
    n.metadata.name.expect("node name")
}

/// A minimal stand-in for KubeVirt's VirtualMachineInstance CRD (kubevirt.io/v1,
/// schema-less, status written with the object), so discovery serves it. It
/// stays installed (deleting it would race with a rerun's create); the VMIs
/// go with their namespaces.
async fn install_vmi_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": VMI_CRD},
        "spec": {
            "group": "kubevirt.io",
            "scope": "Namespaced",
            "names": {"plural": "virtualmachineinstances", "singular": "virtualmachineinstance",
                      "kind": "VirtualMachineInstance", "shortNames": ["vmi"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .expect("CRD JSON");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("VMI CRD: {e}"),
    }
    nmo_tests::manifests::wait_established(client, VMI_CRD, SHORT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

fn vmi_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// VMI `name` in `ns` with a LiveMigratable condition, and its virt-launcher
/// pod on `node` (controlled by the VMI, with KubeVirt's emptyDir volumes).
async fn vm_on(client: &Client, ns: &str, name: &str, node: &str, migratable: bool) {
    let condition = if migratable {
        json!({"type": "LiveMigratable", "status": "True"})
    } else {
        json!({"type": "LiveMigratable", "status": "False",
               "reason": "DisksNotLiveMigratable",
               "message": "cannot migrate VMI: PVC rootdisk is not shared"})
    };
    let vmi: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"evictionStrategy": "LiveMigrate"},
        "status": {"nodeName": node, "conditions": [condition]}
    }))
    .expect("VMI JSON");
    let vmi = vmi_api(client, ns)
        .create(&PostParams::default(), &vmi)
        .await
        .expect("VMI created");
    let uid = vmi.metadata.uid.expect("VMI uid");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("virt-launcher-{name}-abcde"),
            "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                 "name": name, "uid": uid, "controller": true,
                                 "blockOwnerDeletion": true}]
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": GROUP_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "volumes": [{"name": "private", "emptyDir": {}}, {"name": "sockets", "emptyDir": {}}],
            "containers": [{"name": "compute", "image": "registry.invalid/virt-launcher:1"}]
        }
    }))
    .expect("pod JSON");
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("virt-launcher pod created");
}

/// `kubectl create --dry-run=server -f -` of `nm` as admin: (exit ok, the
/// "Warning: " lines of its stderr without the prefix, stdout).
async fn kubectl_dry_run(nm: &NodeMaintenance) -> (bool, Vec<String>, String) {
    let yaml = serde_yaml::to_string(nm).expect("NodeMaintenance YAML");
    let root = nmo_tests::repo_root();
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut child = std::process::Command::new(root.join(".cluster/bin/kubectl"))
            .arg("--kubeconfig")
            .arg(nmo_tests::kubeconfig_path())
            .args(["create", "--dry-run=server", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(yaml.as_bytes())?;
        }
        child.wait_with_output()
    })
    .await
    .expect("kubectl task")
    .expect("kubectl runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Warning: "))
        .map(str::to_string)
        .collect();
    (
        out.status.success(),
        warnings,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Dry-run creates until the warnings satisfy `ok` (the webhook's PDB cache
/// and the PDB status catch up asynchronously); returns them.
async fn warnings_once(
    client: &Client,
    nm: &NodeMaintenance,
    what: &str,
    ok: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    until(what, SHORT, || async {
        Ok(match create_with_warnings(client, nm, true).await {
            Ok(w) if ok(&w) => Poll::Ready(w),
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test]
async fn allowed_create_and_dry_run_say_what_the_maintenance_will_do() {
    let (client, bed, mut cleanup) = setup("ww").await;
    let ns = bed.namespace.clone();
    let ns_b = format!("{}-b", bed.group);
    cleanup.namespaces.push(ns_b.clone());
    let ns_obj: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns_b}})).expect("namespace JSON");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns_obj)
        .await
        .expect("second namespace");
    install_vmi_crd(&client).await;

    let node = name_of(bed.node("w1", false).await.expect("node"));
    // No slot limit here: other tests' NodeMaintenances must not show up.
    let webhook = TestWebhook::start(
        &client,
        &bed.group,
        &[BUDGET, "--max-concurrent-maintenances=0"],
    )
    .await;
    webhook.register(&client, &bed.group).await;

    // What the drain will hit: a Deployment pod its PDB holds (1 replica,
    // minAvailable 1), a bare pod, a bare pod with emptyDir, VMs that cannot
    // live-migrate in two namespaces and one that can; and what it leaves
    // alone: a DaemonSet pod, a mirror pod (finished pods: unit tests).
    bed.deployment("web", 1).await.expect("deployment");
    bed.pdb("web-pdb", "web", 1).await.expect("pdb");
    bed.bare_pod("solo", &node).await.expect("bare pod");
    bed.emptydir_pod("scratch", &node)
        .await
        .expect("emptyDir pod");
    bed.daemonset_pod("agent", &node, "agent-ds")
        .await
        .expect("DaemonSet pod");
    bed.mirror_pod("static", &node).await.expect("mirror pod");
    vm_on(&client, &ns, "vm1", &node, false).await;
    vm_on(&client, &ns_b, "vm2", &node, false).await;
    vm_on(&client, &ns, "vm3", &node, true).await;
    bed.wait_pdb_status("web-pdb", 1, SHORT)
        .await
        .expect("PDB status");

    let nm = test_nm(&format!("{}-nm", bed.group), &node);
    let held = format!("is held by PodDisruptionBudget {ns}/web-pdb (allowed disruptions 0)");
    let warnings = warnings_once(&client, &nm, "warnings naming the PDB", |w| {
        w.iter().any(|l| l.contains(&held))
    })
    .await;
    eprintln!("warnings:\n{}", warnings.join("\n"));

    let web_pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("web pods")
        .items
        .into_iter()
        .next()
        .and_then(|p| p.metadata.name)
        .expect("the Deployment's pod");
    let migrate = |ns: &str, vm: &str| {
        format!(
            "VirtualMachineInstance {ns}/{vm} (pod virt-launcher-{vm}-abcde) cannot live-migrate, \
             so the drain stops it or waits for it (its evictionStrategy decides): \
             DisksNotLiveMigratable: cannot migrate VMI: PVC rootdisk is not shared"
        )
    };
    let expected = vec![
        format!("pod {ns}/{web_pod} {held}: the drain waits until it allows one"),
        migrate(&ns, "vm1"),
        migrate(&ns_b, "vm2"),
        format!(
            "pod {ns}/scratch has no controller: it will be deleted for good, not recreated elsewhere"
        ),
        format!(
            "pod {ns}/solo has no controller: it will be deleted for good, not recreated elsewhere"
        ),
        format!("pod {ns}/scratch has emptyDir volume(s) scratch: their data will be lost"),
    ];
    let mut got = warnings.clone();
    let mut want = expected.clone();
    // Within one kind the order is the API server's list order.
    got.sort();
    want.sort();
    assert_eq!(got, want, "server dry-run warnings");

    // kubectl prints the same lines, "Warning: " first: the pre-flight check.
    let (ok, mut kubectl, stdout) = kubectl_dry_run(&nm).await;
    assert!(ok, "kubectl create --dry-run=server failed");
    assert!(stdout.contains("created (server dry run)"), "{stdout}");
    kubectl.sort();
    assert_eq!(kubectl, want, "kubectl --dry-run=server warnings");

    // A real create gets them too, and is allowed: warnings never deny.
    let mut real = create_with_warnings(&client, &nm, false)
        .await
        .expect("created with warnings");
    real.sort();
    assert_eq!(real, want, "warnings of the real create");
    drop(webhook);
}

#[tokio::test]
async fn a_taken_slot_says_what_the_new_maintenance_waits_for() {
    let (client, bed, _cleanup) = setup("wslot").await;
    // Cordoned: no other pod of this group lands on them.
    let first_node = name_of(bed.node("s1", true).await.expect("node"));
    let second_node = name_of(bed.node("s2", true).await.expect("node"));
    let webhook = TestWebhook::start(&client, &bed.group, &[BUDGET]).await;
    webhook.register(&client, &bed.group).await;

    // A maintenance of this group already Running (no controller runs here:
    // the status is set as admin).
    let first = format!("{}-first", bed.group);
    create_with_warnings(&client, &test_nm(&first, &first_node), false)
        .await
        .expect("first NodeMaintenance created");
    Api::<NodeMaintenance>::all(client.clone())
        .patch_status(
            &first,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("first set Running");

    let second = test_nm(&format!("{}-second", bed.group), &second_node);
    // Every NodeMaintenance of the cluster counts, other tests' too: the
    // expected line is the controller's decision (shared::rules::slots::turn) over what the API
    // server holds now; polled, since other tests change it meanwhile.
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let expected = || async {
        let all = nms.list(&ListParams::default()).await?.items;
        let me = slots::Entry {
            created: "~".to_string(),
            ..slots::Entry::of(&second)
        };
        let mut entries: Vec<slots::Entry> = all.iter().map(slots::Entry::of).collect();
        entries.push(me.clone());
        let no_gate = |_: &slots::Entry, _: &[slots::Entry]| None::<()>;
        let turn = slots::turn(&me, &entries, 1, no_gate);
        let waits = matches!(turn.decision, Ok(slots::SlotDecision::Wait { .. }));
        let ahead = waits.then_some(turn.ahead);
        anyhow::Ok(ahead.map(|a| (a.contains(&first), slot_line(&a))))
    };
    let warnings = until("the will-wait warning of the slot rules", SHORT, || async {
        let want = expected().await?;
        let got = create_with_warnings(&client, &second, true).await;
        Ok(match (&want, &got) {
            (Some((true, line)), Ok(w)) if w == std::slice::from_ref(line) => {
                Poll::Ready(w.clone())
            }
            _ => Poll::Pending(format!("want {want:?}, got {got:?}")),
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("warnings:\n{}", warnings.join("\n"));
    // The node has no pods: nothing else to say.
    assert!(warnings[0].starts_with("will wait: "), "{warnings:?}");

    let (ok, kubectl, _) = kubectl_dry_run(&second).await;
    assert!(ok, "kubectl create --dry-run=server failed");
    assert!(
        kubectl.len() == 1 && kubectl[0].starts_with("will wait: "),
        "kubectl: {kubectl:?}"
    );

    let real = create_with_warnings(&client, &second, false)
        .await
        .expect("second created: a wait is no denial");
    assert!(
        real.len() == 1 && real[0].starts_with("will wait: "),
        "{real:?}"
    );
    drop(webhook);
}
