//! docs/troubleshooting.md, run against the local control plane.
//!
//! Every ```` ```console ```` example of the guide is preceded by a marker
//! `<!-- check: SCENARIO -->`. For each scenario a test below sets the
//! situation up (a NodeMaintenance blocked by a PodDisruptionBudget, a lease
//! held by Node Health Check, a webhook that is down, ...), then runs the
//! scenario's examples in the order of the guide, each in one `bash` (so
//! `TOKEN=$(...)` carries to the next line), with `kubectl` being the plane's
//! kubectl and kubeconfig, and checks every output line the guide shows.
//!
//! The format, as the guide's "About the examples" states it:
//! - `$ ` starts a command; a line ending in `\` continues on the next line;
//! - every other line is output that must appear in what the command printed
//!   (stdout and stderr), in this order, whole lines, runs of white space
//!   compared as one space; `...` inside a line stands for any text, and a
//!   line of its own for more output (no check);
//! - `<node>`, `<nm>`, ... are placeholders each scenario fills in with its
//!   own unique names. A few real names the shared local plane cannot have as
//!   such are placeholders too, listed at the scenario that replaces them
//!   (e.g. the ValidatingWebhookConfiguration is named after the test,
//!   `localhost:8443` is where the test's controller serves `/metrics`).
//!
//! A scenario in the guide without a setup here fails
//! `every_scenario_of_the_guide_has_a_setup_and_back`, as does a setup here
//! the guide no longer uses, a `console` block without a marker, and a
//! marker without a `console` block. The alerts' `runbook_url`s must point at
//! sections of the guide (`every_alert_links_to_a_section_of_the_guide`).
//! Module `commands` reads the guide's commands without a cluster: install
//! paths named, caBundle writes checked, liveness by reconciles, variables
//! set before use, log filters that skip non-JSON lines.

mod commands;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nmo_tests::controller_env::{ControllerEnv, LONG};
use nmo_tests::deployment::Launch;
use nmo_tests::fixtures::{GROUP_KEY, TestBed};
use nmo_tests::process::Running;
use nmo_tests::wait::{Poll, until};
use serde_json::json;
use shared::{MaintenancePhase, NodeMaintenance};

/// The guide, relative to the repository root.
const GUIDE: &str = "docs/troubleshooting.md";
/// The alert rules whose `runbook_url`s point into the guide.
const RULES: &str = "manifests/monitoring/prometheusrule.yaml";
/// The webhook's name in manifests/base/validating-webhook.yaml: what the API
/// server's errors name, so the tests register theirs under it too.
const WEBHOOK_NAME: &str = "vnodemaintenance.kb.io";
/// The PrometheusRule annotation holding the guide's address.
const RUNBOOK_BASE_KEY: &str = "nmo.medik8s.io/runbook-base";
/// How the guide finds the webhook configuration on every install path; the
/// scenarios narrow the list to the test's own configurations.
const VWC_LIST: &str = "kubectl get validatingwebhookconfigurations -o json";
/// How long one example block may run (the must-gather one reads the plane).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(300);
/// Separates the commands' outputs in the one bash that runs a block.
const STEP_MARK: &str = "@@nmo-troubleshooting-step@@";
/// The Node Health Check holder in the lease examples: NHC writes
/// `NodeHealthCheck-<NodeHealthCheck name>`, here its usual default name.
const NHC_HOLDER: &str = "NodeHealthCheck-nhc-worker-default";

// ---------------------------------------------------------------- the guide

/// One command of an example and the lines it must print.
#[derive(Debug, Clone)]
struct Step {
    command: String,
    expect: Vec<String>,
}

/// One checked ```console block.
#[derive(Debug, Clone)]
struct Block {
    scenario: String,
    /// Line of the opening fence in the guide (1-based).
    line: usize,
    steps: Vec<Step>,
}

fn repo_path(rel: &str) -> PathBuf {
    nmo_tests::repo_root().join(rel)
}

fn read_guide() -> String {
    let path = repo_path(GUIDE);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The scenario named by a `<!-- check: NAME -->` line.
fn marker(line: &str) -> Option<&str> {
    let name = line
        .trim()
        .strip_prefix("<!-- check:")?
        .strip_suffix("-->")?
        .trim();
    Some(name)
}

fn valid_scenario_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Every checked block of the guide, or every problem with its markers.
fn parse_guide(text: &str) -> Result<Vec<Block>, Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut errors = Vec::new();
    // A marker waiting for its block: (scenario, line).
    let mut pending: Option<(String, usize)> = None;
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim();
        if let Some(name) = marker(t) {
            if let Some((prev, at)) = pending.take() {
                errors.push(format!(
                    "line {at}: marker `check: {prev}` is followed by no ```console block"
                ));
            }
            if !valid_scenario_name(name) {
                errors.push(format!(
                    "line {}: scenario name {name:?}: use lower case letters, digits and '-'",
                    i + 1
                ));
            }
            pending = Some((name.to_string(), i + 1));
            i += 1;
            continue;
        }
        if let Some(info) = t.strip_prefix("```") {
            let info = info.trim();
            let open = i + 1;
            let Some(len) = lines[i + 1..].iter().position(|l| l.trim() == "```") else {
                errors.push(format!("line {open}: code block never closed"));
                break;
            };
            let body = &lines[i + 1..i + 1 + len];
            match (info, pending.take()) {
                ("console", Some((scenario, _))) => match parse_block(body, open + 1) {
                    Ok(steps) => blocks.push(Block {
                        scenario,
                        line: open,
                        steps,
                    }),
                    Err(e) => errors.push(e),
                },
                ("console", None) => errors.push(format!(
                    "line {open}: ```console block without a `<!-- check: SCENARIO -->` marker: \
                     every console example is run by tests/tests/integration/troubleshooting.rs; write \
                     commands the local plane cannot run in a ```sh block"
                )),
                (other, Some((scenario, at))) => errors.push(format!(
                    "line {at}: marker `check: {scenario}` is followed by a ```{other} block, \
                     not ```console"
                )),
                (_, None) => {}
            }
            i += len + 2;
            continue;
        }
        if !t.is_empty()
            && let Some((scenario, at)) = pending.take()
        {
            errors.push(format!(
                "line {at}: marker `check: {scenario}` must be followed directly by its \
                 ```console block"
            ));
        }
        i += 1;
    }
    if let Some((scenario, at)) = pending {
        errors.push(format!(
            "line {at}: marker `check: {scenario}` at the end of the guide"
        ));
    }
    if errors.is_empty() {
        Ok(blocks)
    } else {
        Err(errors)
    }
}

/// The commands and expected lines of one block; `first` is the guide's line
/// number of its first line.
fn parse_block(body: &[&str], first: usize) -> Result<Vec<Step>, String> {
    let mut steps: Vec<Step> = Vec::new();
    let mut k = 0;
    while k < body.len() {
        let line = body[k];
        if let Some(command) = line.strip_prefix("$ ") {
            let mut command = command.to_string();
            while command.ends_with('\\') && k + 1 < body.len() {
                k += 1;
                command.push('\n');
                command.push_str(body[k]);
            }
            steps.push(Step {
                command,
                expect: Vec::new(),
            });
        } else if !(line.trim().is_empty() || line.trim() == "...") {
            match steps.last_mut() {
                Some(step) => step.expect.push(line.to_string()),
                None => {
                    return Err(format!(
                        "line {}: output before the block's first `$ ` command",
                        first + k
                    ));
                }
            }
        }
        k += 1;
    }
    if steps.is_empty() {
        return Err(format!(
            "line {first}: a checked block needs at least one `$ ` command"
        ));
    }
    Ok(steps)
}

/// Runs of white space as one space, no leading or trailing space.
fn normalize(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether output line `line` is what `pattern` shows (both normalized):
/// equal, or with each `...` of the pattern standing for any text.
fn line_matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split("...").map(str::trim).collect();
    if parts.len() == 1 {
        return line == pattern;
    }
    let last = parts.len() - 1;
    let mut rest = line;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == last {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(p) => rest = &rest[p + part.len()..],
                None => return false,
            }
        }
    }
    true
}

/// The first expected line (normalized) not found in order in `output`.
fn first_missing<'a>(expected: &'a [String], output: &str) -> Option<&'a str> {
    let lines: Vec<String> = output.lines().map(normalize).collect();
    let mut from = 0;
    for want in expected {
        match lines[from..].iter().position(|l| line_matches(want, l)) {
            Some(p) => from += p + 1,
            None => return Some(want),
        }
    }
    None
}

/// The checked blocks of `scenario`, in the guide's order.
fn blocks_of(scenario: &str) -> Vec<Block> {
    let blocks = parse_guide(&read_guide())
        .unwrap_or_else(|e| panic!("{GUIDE} has problems:\n{}", e.join("\n")));
    let mine: Vec<Block> = blocks
        .into_iter()
        .filter(|b| b.scenario == scenario)
        .collect();
    assert!(
        !mine.is_empty(),
        "{GUIDE} has no `<!-- check: {scenario} -->` example any more: remove its setup from \
         tests/tests/integration/troubleshooting.rs"
    );
    mine
}

// ---------------------------------------------------------------- scenarios

/// What a scenario set up: its placeholders, where its commands run, what
/// happens between its blocks, and how to undo it.
struct Scenario {
    /// Placeholder -> value, applied to commands and expected lines.
    aliases: Vec<(String, String)>,
    /// The commands' working directory (files such as nm.yaml are there).
    cwd: PathBuf,
    /// Where the `kubectl` wrapper lives (first in PATH).
    bin: PathBuf,
    /// Run before the block of this index (the test waits for what the
    /// guide's reader would wait for, e.g. the API server noticing a changed
    /// webhook configuration).
    interludes: BTreeMap<usize, BoxFuture<'static, anyhow::Result<()>>>,
    cleanup: Cleanup,
}

/// Undoing a scenario, best effort, in this order: `first` (e.g. a stuck
/// finalizer), the webhook configurations, NodeMaintenances, namespaces and
/// nodes of `groups`, the controller test of `env`, then the processes.
#[derive(Default)]
struct Cleanup {
    first: Vec<BoxFuture<'static, ()>>,
    groups: Vec<(String, Vec<String>)>,
    env: Option<ControllerEnv>,
    procs: Vec<Running>,
}

impl Scenario {
    /// A scenario of test group `group`: its directory under
    /// .cluster/test-logs with the `kubectl` wrapper.
    fn new(group: &str) -> Scenario {
        let dir = nmo_tests::cluster_dir()
            .join("test-logs")
            .join(format!("{group}-docs"));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("scenario directory");
        let kubectl = bin.join("kubectl");
        let _ = std::fs::remove_file(&kubectl);
        // The plane's kubectl, with its kubeconfig: `kubectl` in the guide.
        let wrapper = format!(
            "#!/bin/sh\nexec '{}' --kubeconfig '{}' \"$@\"\n",
            nmo_tests::cluster_dir().join("bin/kubectl").display(),
            nmo_tests::kubeconfig_path().display()
        );
        std::fs::write(&kubectl, wrapper).expect("kubectl wrapper");
        set_executable(&kubectl);
        Scenario {
            aliases: Vec::new(),
            cwd: dir,
            bin,
            interludes: BTreeMap::new(),
            cleanup: Cleanup::default(),
        }
    }

    fn alias(mut self, placeholder: &str, value: impl Into<String>) -> Scenario {
        self.aliases.push((placeholder.to_string(), value.into()));
        self
    }

    fn before_block(
        mut self,
        index: usize,
        step: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Scenario {
        self.interludes.insert(index, Box::pin(step));
        self
    }

    /// Write `name` into the commands' directory.
    fn file(self, name: &str, content: &str) -> Scenario {
        std::fs::write(self.cwd.join(name), content).expect("scenario file");
        self
    }

    fn fill(&self, text: &str) -> String {
        let mut aliases = self.aliases.clone();
        // Longest first: `<node>` never eats into `<node2>`'s text.
        aliases.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        let mut out = text.to_string();
        for (k, v) in &aliases {
            out = out.replace(k, v);
        }
        out
    }
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mut perms = std::fs::metadata(path).expect("stat").permissions();
    perms.set_mode(0o755);
    std::fs::set_permissions(path, perms).expect("chmod");
}

impl Cleanup {
    async fn run(self, client: &Client) {
        for f in self.first {
            f.await;
        }
        for (group, _) in &self.groups {
            nmo_tests::webhook_pod::unregister(client, group).await;
        }
        if let Some(env) = &self.env {
            delete_maintenances(client, &env.bed.group).await;
        }
        for (group, namespaces) in &self.groups {
            delete_maintenances(client, group).await;
            nmo_tests::webhook_pod::remove_group(client, group, namespaces).await;
        }
        if let Some(env) = self.env {
            env.teardown().await;
        }
        drop(self.procs);
    }
}

/// Delete the NodeMaintenances named `<group>...` and wait (a while) for them
/// to go, while their controller still runs.
async fn delete_maintenances(client: &Client, group: &str) {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let mine = |list: Vec<NodeMaintenance>| -> Vec<String> {
        list.into_iter()
            .map(|n| n.name_any())
            .filter(|n| n.starts_with(group))
            .collect()
    };
    if let Ok(list) = nms.list(&ListParams::default()).await {
        for name in mine(list.items) {
            let _ = nms.delete(&name, &DeleteParams::default()).await;
        }
    }
    let _ = until(
        &format!("the NodeMaintenances of {group} to go"),
        Duration::from_secs(30),
        || async {
            let left = mine(nms.list(&ListParams::default()).await?.items);
            Ok(if left.is_empty() {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{left:?}"))
            })
        },
    )
    .await;
}

/// Run the scenario's blocks (each after its interlude), then undo it; panic
/// with everything seen when an expected line is missing.
async fn check(name: &str, blocks: Vec<Block>, mut scenario: Scenario) {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    let mut failure = None;
    for (index, block) in blocks.iter().enumerate() {
        if let Some(step) = scenario.interludes.remove(&index)
            && let Err(e) = step.await
        {
            failure = Some(format!(
                "scenario {name}: before the block at {GUIDE}:{}: {e:#}",
                block.line
            ));
            break;
        }
        if let Err(e) = run_block(block, &scenario).await {
            failure = Some(format!("scenario {name}: {e}"));
            break;
        }
    }
    if failure.is_none() && !scenario.interludes.is_empty() {
        let at: Vec<&usize> = scenario.interludes.keys().collect();
        failure = Some(format!(
            "scenario {name}: the setup waits before blocks {at:?}, but {GUIDE} has only {} \
             blocks of it: the guide and the setup disagree",
            blocks.len()
        ));
    }
    if let Some(f) = &mut failure {
        // What the services said meanwhile.
        let logs = scenario
            .cleanup
            .env
            .iter()
            .filter_map(|e| e.ctrl.as_ref().map(|c| &c.proc))
            .chain(scenario.cleanup.procs.iter());
        for proc in logs {
            f.push_str(&format!(
                "\n---- {} log {} (last 40 lines)\n{}",
                proc.name,
                proc.log.display(),
                proc.log_tail(40)
            ));
        }
    }
    scenario.cleanup.run(&client).await;
    if let Some(f) = failure {
        panic!("{f}");
    }
}

/// Run one block in one bash and check each command's output.
async fn run_block(block: &Block, sc: &Scenario) -> Result<(), String> {
    let steps: Vec<(String, Vec<String>)> = block
        .steps
        .iter()
        .map(|s| {
            (
                sc.fill(&s.command),
                s.expect.iter().map(|e| normalize(&sc.fill(e))).collect(),
            )
        })
        .collect();
    let mut script = String::from("exec 2>&1\n");
    for (i, (command, _)) in steps.iter().enumerate() {
        script.push_str(&format!("printf '\\n{STEP_MARK}{i}\\n'\n{command}\n"));
    }
    script.push_str(&format!("printf '\\n{STEP_MARK}end\\n'\n"));
    let path = format!(
        "{}:{}",
        sc.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("--noprofile")
        .arg("--norc")
        .arg("-c")
        .arg(&script)
        .current_dir(&sc.cwd)
        .env("PATH", path)
        .env("KUBECONFIG", nmo_tests::kubeconfig_path())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(BLOCK_TIMEOUT, cmd.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("running bash: {e}")),
        Err(_) => {
            return Err(format!(
                "the block at {GUIDE}:{} did not finish within {BLOCK_TIMEOUT:?}",
                block.line
            ));
        }
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let outputs = split_outputs(&text, steps.len());
    let mut transcript = String::new();
    for (i, (command, expected)) in steps.iter().enumerate() {
        let output = outputs.get(i).map(String::as_str).unwrap_or("");
        transcript.push_str(&format!("$ {command}\n{output}\n"));
        if let Some(missing) = first_missing(expected, output) {
            return Err(format!(
                "the block at {GUIDE}:{}: command {} printed no line matching\n    {missing}\n\
                 (lines checked in order, white space normalized, `...` = any text)\n\
                 ---- what the block printed so far:\n{transcript}",
                block.line,
                i + 1
            ));
        }
    }
    Ok(())
}

/// The output of each of `n` commands, from the one bash's output.
fn split_outputs(text: &str, n: usize) -> Vec<String> {
    let mut outputs = vec![String::new(); n];
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if let Some(tag) = line.strip_prefix(STEP_MARK) {
            current = tag.parse().ok();
            continue;
        }
        if let Some(out) = current.and_then(|i| outputs.get_mut(i)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    // Each command's output began after a blank line the marker printed.
    for out in &mut outputs {
        *out = out.trim_end_matches('\n').to_string();
    }
    outputs
}

macro_rules! scenarios {
    ($($name:literal => $test:ident: $setup:ident),* $(,)?) => {
        /// Every scenario this file can set up.
        const SCENARIOS: &[&str] = &[$($name),*];
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let blocks = blocks_of($name);
                let scenario = $setup().await;
                check($name, blocks, scenario).await;
            }
        )*
    };
}

scenarios! {
    "webhook-denials" => webhook_denials: setup_webhook_denials,
    "etcd-quorum" => etcd_quorum: setup_etcd_quorum,
    "drain-pdb" => drain_pdb: setup_drain_pdb,
    "node-gone" => node_gone: setup_node_gone,
    "duplicate-failed" => duplicate_failed: setup_duplicate_failed,
    "lease-held-by-other" => lease_held_by_other: setup_lease_held_by_other,
    "lease-lost" => lease_lost: setup_lease_lost,
    "lease-forbidden" => lease_forbidden: setup_lease_forbidden,
    "node-update-refused" => node_update_refused: setup_node_update_refused,
    "drain-timeout" => drain_timeout: setup_drain_timeout,
    "waiting-for-slot" => waiting_for_slot: setup_waiting_for_slot,
    "zone-budget" => zone_budget: setup_zone_budget,
    "max-unavailable" => max_unavailable: setup_max_unavailable,
    "outside-window" => outside_window: setup_outside_window,
    "paused-after-failure" => paused_after_failure: setup_paused_after_failure,
    "alerts-unreadable" => alerts_unreadable: setup_alerts_unreadable,
    "drain-finalizer" => drain_finalizer: setup_drain_finalizer,
    "succeeded" => succeeded: setup_succeeded,
    "webhook-down" => webhook_down: setup_webhook_down,
    "webhook-tls" => webhook_tls: setup_webhook_tls,
    "olm-names" => olm_names: setup_olm_names,
    "metrics" => metrics: setup_metrics,
    "rbac" => rbac: setup_rbac,
    "must-gather" => must_gather: setup_must_gather,
}

// ---------------------------------------------------------------- consistency (no cluster)

#[test]
fn every_scenario_of_the_guide_has_a_setup_and_back() {
    let blocks = parse_guide(&read_guide())
        .unwrap_or_else(|e| panic!("{GUIDE} has problems:\n{}", e.join("\n")));
    let in_guide: BTreeSet<&str> = blocks.iter().map(|b| b.scenario.as_str()).collect();
    let here: BTreeSet<&str> = SCENARIOS.iter().copied().collect();
    assert_eq!(here.len(), SCENARIOS.len(), "a scenario listed twice");
    let no_setup: Vec<_> = in_guide.difference(&here).collect();
    assert!(
        no_setup.is_empty(),
        "{GUIDE} checks scenarios no test sets up: {no_setup:?}; add each to `scenarios!` in \
         tests/tests/integration/troubleshooting.rs with a setup"
    );
    let unused: Vec<_> = here.difference(&in_guide).collect();
    assert!(
        unused.is_empty(),
        "tests/tests/integration/troubleshooting.rs sets up scenarios {GUIDE} no longer checks: {unused:?}"
    );
}

#[test]
fn the_example_format_is_read_as_documented() {
    let text = "# t\n<!-- check: a-1 -->\n```console\n$ echo one \\\n  two\none two\n...\n$ true\n```\n\
                ```sh\nkubectl logs x\n```\n";
    let blocks = parse_guide(text).expect("parses");
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].steps.len(), 2);
    assert_eq!(blocks[0].steps[0].command, "echo one \\\n  two");
    assert_eq!(blocks[0].steps[0].expect, ["one two"]);
    assert!(
        parse_guide("```console\n$ true\n```\n").is_err(),
        "unmarked"
    );
    assert!(
        parse_guide("<!-- check: x -->\ntext\n```console\n$ true\n```\n").is_err(),
        "marker not directly before its block"
    );
    assert!(
        parse_guide("<!-- check: x -->\n```sh\ntrue\n```\n").is_err(),
        "marker on a sh block"
    );
    assert!(line_matches("a b", "a b"));
    assert!(!line_matches("a b", "a b c"));
    assert!(line_matches("a ... c", "a b c"));
    assert!(line_matches("... c", "a b c"));
    assert!(line_matches("a ...", "a b c"));
    assert!(line_matches("a ... b ... d", "a x b y d"));
    assert!(!line_matches("a ... b ... d", "a x d y b"));
    assert_eq!(
        first_missing(&["x".into(), "y".into()], "y\nx\n"),
        Some("y"),
        "in order"
    );
    assert_eq!(
        split_outputs(
            &format!("\n{STEP_MARK}0\nhi\n\n{STEP_MARK}1\n\n{STEP_MARK}end\n"),
            2
        ),
        ["hi", ""]
    );
}

/// The guide's address is set once, in the PrometheusRule's annotation
/// `nmo.medik8s.io/runbook-base`: the workspace's repository URL
/// (Cargo.toml), then `/blob/main/docs/troubleshooting.md`. Every alert's
/// `runbook_url` is `#<anchor>` of a heading of the guide, and
/// manifests/monitoring/kustomization.yaml puts the base in front of it
/// (manifests/check.sh checks the rendering; `make release` pins the base to
/// the release's tag, tests/tools/tests/release_scripts.rs).
#[test]
fn every_alert_links_to_a_section_of_the_guide() {
    let cargo = std::fs::read_to_string(repo_path("Cargo.toml")).expect("Cargo.toml");
    let repository = cargo
        .lines()
        .find_map(|l| {
            let v = l
                .trim()
                .strip_prefix("repository")?
                .trim()
                .strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
        .expect("Cargo.toml names the workspace repository");
    let base = format!("{repository}/blob/main/{GUIDE}");
    let anchors = heading_anchors(&read_guide());
    let rules = std::fs::read_to_string(repo_path(RULES)).expect("rule file");
    let rules: serde_yaml::Value = serde_yaml::from_str(&rules).expect("rule YAML");
    assert_eq!(
        rules["metadata"]["annotations"][RUNBOOK_BASE_KEY].as_str(),
        Some(base.as_str()),
        "{RULES}: the annotation {RUNBOOK_BASE_KEY} must be the one place of the guide's address"
    );
    let kustomization =
        std::fs::read_to_string(repo_path("manifests/monitoring/kustomization.yaml"))
            .expect("monitoring kustomization");
    assert!(
        kustomization.contains(&format!(
            "fieldPath: metadata.annotations.[{RUNBOOK_BASE_KEY}]"
        )) && kustomization.contains("annotations.runbook_url"),
        "manifests/monitoring/kustomization.yaml must copy {RUNBOOK_BASE_KEY} into every runbook_url"
    );
    let mut alerts = 0;
    for group in rules["spec"]["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            alerts += 1;
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("alert {alert} has no runbook_url annotation"));
            let anchor = url.strip_prefix('#').unwrap_or_else(|| {
                panic!(
                    "alert {alert}: runbook_url {url} must be only `#<anchor>`: the base comes \
                     from {RUNBOOK_BASE_KEY}"
                )
            });
            assert!(
                anchors.contains(anchor),
                "alert {alert}: runbook_url {url}: {GUIDE} has no heading with anchor #{anchor}"
            );
        }
    }
    assert!(alerts >= 8, "only {alerts} alerts in {RULES}");
}

/// Every `](#anchor)` link of the guide leads to one of its headings.
#[test]
fn the_guides_own_links_resolve() {
    let text = read_guide();
    let anchors = heading_anchors(&text);
    let broken: Vec<&str> = text
        .split("](#")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|a| !anchors.contains(*a))
        .collect();
    assert!(
        broken.is_empty(),
        "{GUIDE} links to missing sections: {broken:?}"
    );
}

/// Every condition reason the controller writes (controller/src/conditions.rs)
/// and every event reason it records (shared/src/api/consts.rs, the `EVENT_*`
/// constants of controller/src/reconcile/mod.rs) is named in the guide, in
/// backticks: a new reason needs its section.
#[test]
fn every_condition_and_event_reason_is_in_the_guide() {
    let guide = read_guide();
    let source = |rel: &str| {
        let text = std::fs::read_to_string(repo_path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        // Unit tests name made-up reasons; only the code before them counts.
        match text.find("#[cfg(test)]\nmod tests") {
            Some(at) => text[..at].to_string(),
            None => text,
        }
    };
    let quoted = |line: &str| -> Vec<String> {
        line.split('"')
            .skip(1)
            .step_by(2)
            .filter(|w| {
                w.len() > 2
                    && w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                    && w.chars().all(|c| c.is_ascii_alphanumeric())
            })
            .map(str::to_string)
            .collect()
    };
    let mut reasons = BTreeSet::new();
    let conditions = source("controller/src/conditions.rs");
    for line in conditions.lines() {
        let l = line.trim();
        // `Cause::X => "X"`, `push(.., "Reason", ..)`, a reason on a line of
        // its own, or a row `(TYPE, on, reason, "OffReason")` of a table.
        let row = l.starts_with('(') && l.ends_with("),");
        if l.starts_with("Cause::") || l.starts_with("push(") || l.starts_with('"') || row {
            reasons.extend(quoted(l));
        }
    }
    // Cause::Progress names the absence of a problem: no condition carries it.
    reasons.remove("Progress");
    for line in source("shared/src/api/consts.rs").lines() {
        if line.trim().starts_with("reason:") {
            reasons.extend(quoted(line));
        }
    }
    for line in source("controller/src/reconcile/mod.rs").lines() {
        if line.trim().starts_with("const EVENT_") {
            reasons.extend(quoted(line));
        }
    }
    // The fleet gates' reasons (the Queued condition's and their events').
    for line in source("shared/src/rules/gates/mod.rs").lines() {
        if line.trim().starts_with("GateReason::") {
            reasons.extend(quoted(line));
        }
    }
    for must in [
        "NotFailed",
        "LeaseLost",
        "BeginMaintenance",
        "DrainBlocked",
        "ZoneBudget",
    ] {
        assert!(
            reasons.contains(must),
            "reading the sources found no {must}: {reasons:?}"
        );
    }
    let missing: Vec<&String> = reasons
        .iter()
        .filter(|r| !guide.contains(&format!("`{r}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "{GUIDE} does not name these condition or event reasons: {missing:?}"
    );
}

/// The anchors GitHub gives the guide's headings (lower case; letters,
/// digits, '-' and '_' kept; spaces to '-'; a repeated one gets `-1`, `-2`).
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

#[test]
fn heading_anchors_follow_github() {
    let a = heading_anchors(
        "# Upstream names to ours\n## `LeaseLost`: the lease\n## A\n## A\n```sh\n# not\n```\n",
    );
    let want: BTreeSet<String> = ["upstream-names-to-ours", "leaselost-the-lease", "a", "a-1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(a, want);
}

// ---------------------------------------------------------------- helpers for setups

fn micro_now() -> serde_json::Value {
    serde_json::to_value(MicroTime(Timestamp::now())).expect("micro time")
}

/// A NodeMaintenance manifest as a reader writes it, plus this test's label
/// (the test controller handles only its group's objects).
fn nm_yaml(name: &str, node: &str, group: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  \
         name: {name}\n  labels:\n    {GROUP_KEY}: {group}\nspec:\n  nodeName: {node}\n  \
         reason: kernel security patch\n{extra_spec}"
    )
}

/// Create NodeMaintenance `name` for `node` with `spec` merged in, labelled
/// with the environment's group.
async fn create_nm_with(env: &ControllerEnv, name: &str, node: &str, spec: serde_json::Value) {
    let mut v = json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {GROUP_KEY: env.bed.group}},
        "spec": {"nodeName": node, "reason": "kernel security patch"}
    });
    nmo_tests::fixtures::merge(&mut v["spec"], spec);
    let nm: NodeMaintenance = serde_json::from_value(v).expect("NodeMaintenance JSON");
    env.nms()
        .create(&PostParams::default(), &nm)
        .await
        .expect("NodeMaintenance created");
}

/// The True condition `type_` of `nm`: (reason, message).
fn condition(nm: &NodeMaintenance, type_: &str) -> Option<(String, String)> {
    nm.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// Wait until `nm` is Blocked for `reason`.
async fn wait_blocked(env: &ControllerEnv, nm: &str, reason: &str) -> NodeMaintenance {
    env.wait_nm(nm, &format!("{nm} Blocked for {reason}"), |n| {
        condition(n, "Blocked").is_some_and(|(r, _)| r == reason)
    })
    .await
}

/// The log file of the environment's controller (what `kubectl logs` of its pod shows).
fn controller_log(env: &ControllerEnv) -> PathBuf {
    env.ctrl
        .as_ref()
        .map(|c| c.proc.log.clone())
        .expect("the environment runs a controller")
}

/// A webhook pod of manifests/base for this test: certificates in the
/// kubelet layout signed by its own CA, run as nmo-webhook.
struct Webhook {
    proc: Running,
    tls: SocketAddr,
    metrics: u16,
    ca: certs::Ca,
    cert_dir: PathBuf,
}

impl Webhook {
    async fn start(client: &Client, group: &str, extra: &[&str]) -> Webhook {
        nmo_tests::manifests::install_webhook_prereqs(client)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        let dir = nmo_tests::cluster_dir().join("test-logs");
        let cert_dir = dir.join(format!("{group}-certs"));
        let ca = certs::Ca::new("nmo-webhook-ca", Duration::from_secs(3600)).expect("CA");
        let cert = nmo_tests::webhook_pod::issue(&ca);
        nmo_tests::webhook_pod::write_certs(&cert_dir, &ca, &cert);
        let kubeconfig = dir.join(format!("{group}-webhook.kubeconfig"));
        nmo_tests::process::service_account_kubeconfig(
            client,
            "nmo-system",
            "nmo-webhook",
            &kubeconfig,
        )
        .await
        .expect("webhook kubeconfig");
        let mut args = vec!["--openshift=false".to_string()];
        args.extend(extra.iter().map(|a| a.to_string()));
        let pod = Launch::new("base", "nmo-webhook")
            .volume("cert", &cert_dir)
            .kubeconfig(&kubeconfig)
            .extra_args(args)
            .start(client)
            .await
            .expect("webhook started");
        pod.wait_ready(LONG).await.expect("webhook Ready");
        let port = pod.flag_port("webhook-bind-address").expect("mapped port");
        let metrics = pod.flag_port("metrics-bind-address").expect("metrics port");
        Webhook {
            proc: pod.proc,
            tls: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            metrics,
            ca,
            cert_dir,
        }
    }

    fn ca_bundle(&self) -> String {
        certs::ca_bundle_base64(self.ca.cert_pem())
    }
}

/// Register a webhook at 127.0.0.1:`port` under the manifests' webhook name
/// ([`WEBHOOK_NAME`]) for the NodeMaintenances named `<group>...`, in a
/// ValidatingWebhookConfiguration named `group` (as
/// `webhook_pod::register_url`, whose `unregister` removes it).
async fn register(client: &Client, group: &str, port: u16, ca_bundle: &str) {
    nmo_tests::webhook_pod::register_named(client, group, WEBHOOK_NAME, port, ca_bundle).await;
}

/// Wait until a dry-run create of a NodeMaintenance for `node` named
/// `<group>-probe` gets an answer `ok` accepts (what the API server says once
/// it uses the current webhook configuration).
async fn wait_create_answer(
    client: &Client,
    group: &str,
    node: &str,
    what: &str,
    ok: impl Fn(&Result<Vec<String>, (u16, String)>) -> bool,
) -> anyhow::Result<()> {
    let nm = nmo_tests::webhook_pod::test_nm(&format!("{group}-probe"), node);
    until(what, LONG, || async {
        let r = nmo_tests::webhook_pod::create_with_warnings(client, &nm, true).await;
        Ok(if ok(&r) {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{r:?}"))
        })
    })
    .await
}

/// A webhook answering for `group`: started, registered, and called by the
/// API server (a create for a missing node is denied in its words).
async fn serving_webhook(client: &Client, group: &str, extra: &[&str]) -> Webhook {
    let wh = Webhook::start(client, group, extra).await;
    register(client, group, wh.tls.port(), &wh.ca_bundle()).await;
    let ghost = format!("{group}-ghost");
    wait_create_answer(
        client,
        group,
        &ghost,
        "the API server to call this test's webhook",
        |r| matches!(r, Err((403, m)) if m.ends_with(&format!("no node with name {ghost} found"))),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\nwebhook log:\n{}", wh.proc.log_text()));
    wh
}

/// A ValidatingWebhookConfiguration for `group` whose webhook does not
/// answer (nothing listens on its port), as when every webhook pod is down;
/// returns once the API server refuses this group's creates for it.
async fn dead_webhook(client: &Client, group: &str) {
    let ca = certs::Ca::new("nmo-webhook-ca", Duration::from_secs(3600)).expect("CA");
    let port = nmo_tests::process::free_port().expect("a free port");
    register(client, group, port, &certs::ca_bundle_base64(ca.cert_pem())).await;
    wait_create_answer(
        client,
        group,
        &format!("{group}-ghost"),
        "the API server to call the dead webhook",
        |r| matches!(r, Err((_, m)) if m.contains("failed calling webhook")),
    )
    .await
    .expect("dead webhook in effect");
}

/// Delete NodeMaintenance `nm` and strip its finalizer (once it is being
/// deleted, no controller adds it again): for what no controller can end.
async fn force_remove(client: &Client, nm: &str) {
    let nms: Api<NodeMaintenance> = Api::all(client.clone());
    let _ = nms.delete(nm, &DeleteParams::default()).await;
    let _ = nms
        .patch(
            nm,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
}

/// Patch (dry run) of `nm`'s labels: whether an UPDATE gets through admission.
async fn update_admitted(client: &Client, nm: &str) -> anyhow::Result<bool> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    match api
        .patch(
            nm,
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"metadata": {"labels": {"probe": "x"}}})),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.message.contains("failed calling webhook") => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Wait until ServiceAccount `ns/sa` may get `/metrics` (the authorizer has
/// seen its new binding).
async fn wait_metrics_access(client: Client, ns: String, sa: String) -> anyhow::Result<()> {
    let api: Api<SubjectAccessReview> = Api::all(client);
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{ns}:{sa}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"),
                       "system:authenticated"],
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"}
        }
    }))?;
    until(
        &format!("{ns}/{sa} to be allowed to get /metrics"),
        LONG,
        || async {
            let answer = api.create(&PostParams::default(), &review).await?;
            Ok(match answer.status {
                Some(s) if s.allowed => Poll::Ready(()),
                other => Poll::Pending(format!("{other:?}")),
            })
        },
    )
    .await
}

/// Delete ServiceAccount `nmo-system/name` and ClusterRoleBinding `name` (best effort).
fn remove_metrics_reader(client: Client, name: String) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let dp = DeleteParams::default();
        let _ = Api::<ClusterRoleBinding>::all(client.clone())
            .delete(&name, &dp)
            .await;
        let _ = Api::<ServiceAccount>::namespaced(client, "nmo-system")
            .delete(&name, &dp)
            .await;
    })
}

// ---------------------------------------------------------------- the scenarios

/// Webhook denials on create and update (sections "Node not found",
/// "Duplicate maintenance", "nodeName cannot be changed"): a webhook pod for
/// this test (without the force-drain component), nodes `<node>` and
/// `<other-node>`, nm.yaml naming `<typo-node>`, which does not exist, and
/// nm-force.yaml asking for `drainTimeoutAction: Force`. The ValidatingWebhookConfiguration is
/// this test's (see [`register`]).
async fn setup_webhook_denials() -> Scenario {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_webhook_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let bed = TestBed::new(client.clone(), "ts-deny")
        .await
        .expect("test namespace");
    let g = bed.group.clone();
    let node = bed.node("worker-1", false).await.expect("node").name_any();
    let other = bed.node("worker-2", false).await.expect("node").name_any();
    let typo = format!("{g}-worker1");
    let wh = serving_webhook(&client, &g, &[]).await;
    let (nm, nm2) = (format!("{g}-kernel"), format!("{g}-kernel-again"));
    let mut sc = Scenario::new(&g)
        .alias("<nm>", &nm)
        .alias("<nm2>", &nm2)
        .alias("<node>", &node)
        .alias("<other-node>", &other)
        .alias("<typo-node>", &typo)
        .file("nm.yaml", &nm_yaml(&nm, &typo, &g, ""))
        .file("nm2.yaml", &nm_yaml(&nm2, &node, &g, ""))
        .file(
            "nm-force.yaml",
            &nm_yaml(
                &format!("{g}-kernel-force"),
                &node,
                &g,
                "  drainTimeout: 45m\n  drainTimeoutAction: Force\n",
            ),
        );
    sc.cleanup.groups.push((g, vec![bed.namespace.clone()]));
    sc.cleanup.procs.push(wh.proc);
    sc
}

const ETCD_NS: &str = "openshift-etcd";

/// The etcd quorum rule (OpenShift): three control-plane nodes, a guard pod
/// on each (`etcd-guard-<node>`, label `app=guard`, as OpenShift names them)
/// and `etcd-guard-pdb` (minAvailable 2) in openshift-etcd; the guard on
/// `<cp-2>` is not ready, so no disruption is left and `<cp-1>` is refused.
/// Before the second block the guard on `<cp-2>` is ready again. The webhook
/// runs with `--openshift=true`.
async fn setup_etcd_quorum() -> Scenario {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_webhook_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let bed = TestBed::new(client.clone(), "ts-etcd")
        .await
        .expect("test namespace");
    let g = bed.group.clone();
    ensure_etcd_namespace(&client).await;
    nmo_tests::manifests::install_webhook_openshift_rbac(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ETCD_NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ETCD_NS);
    // The rule counts every PDB in openshift-etcd: only this test's may be there.
    let foreign: Vec<String> = pdbs
        .list(&ListParams::default())
        .await
        .expect("list PDBs")
        .items
        .into_iter()
        .filter(|p| !p.labels().contains_key(GROUP_KEY))
        .map(|p| p.name_any())
        .collect();
    assert!(
        foreign.is_empty(),
        "{ETCD_NS} holds PDBs no test made: {foreign:?}"
    );
    let leftovers = ListParams::default().labels(GROUP_KEY);
    let _ = pdbs
        .delete_collection(&DeleteParams::default(), &leftovers)
        .await;
    let _ = pods
        .delete_collection(&DeleteParams::default().grace_period(0), &leftovers)
        .await;
    until("no test PDB left in openshift-etcd", LONG, || async {
        let n = pdbs.list(&ListParams::default()).await?.items.len();
        Ok(if n == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{n} PDBs"))
        })
    })
    .await
    .expect("openshift-etcd without PDBs");

    let mut cps = Vec::new();
    for i in 1..=3 {
        let node = bed.node(&format!("cp-{i}"), false).await.expect("node");
        let name = node.name_any();
        Api::<Node>::all(client.clone())
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {
                    "node-role.kubernetes.io/control-plane": "",
                    "node-role.kubernetes.io/master": "",
                }}})),
            )
            .await
            .expect("control-plane labels");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("etcd-guard-{name}"),
                         "labels": {"app": "guard", GROUP_KEY: g}},
            "spec": {"nodeName": name,
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "guard", "image": "registry.invalid/guard:1"}]}
        }))
        .expect("guard pod JSON");
        // The namespace's default ServiceAccount may still be on its way.
        until("a guard pod to be created", LONG, || async {
            Ok(match pods.create(&PostParams::default(), &pod).await {
                Ok(_) => Poll::Ready(()),
                Err(e) => Poll::Pending(e.to_string()),
            })
        })
        .await
        .expect("guard pod");
        cps.push(name);
    }
    let guard = |node: &str| format!("etcd-guard-{node}");
    until("the guard pods to be Ready", LONG, || async {
        let mut not_ready = Vec::new();
        for cp in &cps {
            let p = pods.get(&guard(cp)).await?;
            if !nmo_tests::fixtures::is_ready(&p) {
                not_ready.push(cp.clone());
            }
        }
        Ok(if not_ready.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("not ready: {not_ready:?}"))
        })
    })
    .await
    .expect("guards Ready");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "etcd-guard-pdb", "labels": {GROUP_KEY: g}},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guard"}}}
    }))
    .expect("PDB JSON");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("guard PDB");
    set_guard_ready(&pods, &guard(&cps[1]), "False").await;
    wait_guard_pdb(&pdbs, 2, 0).await.expect("PDB: 0 allowed");

    let wh = serving_webhook(&client, &g, &["--openshift=true"]).await;
    let nm = format!("{g}-kernel");
    let cp1 = cps[0].clone();
    let healed = {
        let (client, g, pods, pdbs, cp2, cp1) = (
            client.clone(),
            g.clone(),
            pods.clone(),
            pdbs.clone(),
            guard(&cps[1]),
            cp1.clone(),
        );
        async move {
            // etcd on <cp-2> is healthy again: its guard turns ready.
            set_guard_ready(&pods, &cp2, "True").await;
            wait_guard_pdb(&pdbs, 3, 1).await?;
            wait_create_answer(&client, &g, &cp1, "the create to be allowed", |r| r.is_ok()).await
        }
    };
    let mut sc = Scenario::new(&g)
        .alias("<nm>", &nm)
        .alias("<cp-1>", &cps[0])
        .alias("<cp-2>", &cps[1])
        .alias("<cp-3>", &cps[2])
        .file("nm.yaml", &nm_yaml(&nm, &cp1, &g, ""))
        .before_block(1, healed);
    let cleanup_client = client.clone();
    sc.cleanup.first.push(Box::pin(async move {
        let lp = ListParams::default().labels(&format!("{GROUP_KEY}={g}"));
        let dp = DeleteParams::default();
        let _ = Api::<PodDisruptionBudget>::namespaced(cleanup_client.clone(), ETCD_NS)
            .delete_collection(&dp, &lp)
            .await;
        let _ = Api::<Pod>::namespaced(cleanup_client, ETCD_NS)
            .delete_collection(&DeleteParams::default().grace_period(0), &lp)
            .await;
    }));
    sc.cleanup
        .groups
        .push((bed.group.clone(), vec![bed.namespace.clone()]));
    sc.cleanup.procs.push(wh.proc);
    sc
}

/// openshift-etcd exists and is not being deleted (another test removes it
/// when it is done).
async fn ensure_etcd_namespace(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    until("namespace openshift-etcd to be usable", LONG, || async {
        match namespaces.get_opt(ETCD_NS).await? {
            Some(ns) if ns.metadata.deletion_timestamp.is_none() => Ok(Poll::Ready(())),
            Some(_) => Ok(Poll::Pending("terminating".into())),
            None => {
                let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ETCD_NS}}))?;
                match namespaces.create(&PostParams::default(), &ns).await {
                    Ok(_) => Ok(Poll::Ready(())),
                    Err(e) => Ok(Poll::Pending(e.to_string())),
                }
            }
        }
    })
    .await
    .expect("openshift-etcd");
}

async fn set_guard_ready(pods: &Api<Pod>, name: &str, status: &str) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": status}]}})),
    )
    .await
    .expect("guard pod readiness");
}

async fn wait_guard_pdb(
    pdbs: &Api<PodDisruptionBudget>,
    healthy: i32,
    allowed: i32,
) -> anyhow::Result<()> {
    until(
        &format!("etcd-guard-pdb: {healthy} healthy, {allowed} disruptions allowed"),
        LONG,
        || async {
            let p = pdbs.get("etcd-guard-pdb").await?;
            let s = p.status.clone().unwrap_or_default();
            Ok(
                if s.observed_generation == p.metadata.generation
                    && s.current_healthy == healthy
                    && s.disruptions_allowed == allowed
                {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{s:?}"))
                },
            )
        },
    )
    .await
}

/// A drain blocked by a PodDisruptionBudget (sections "First look" and
/// "EvictionBlocked: a PodDisruptionBudget"): on `<node>` a bare pod `cache`
/// (evicted at once) and the one pod of Deployment `web`, which PDB `web`
/// (minAvailable 1) holds; a spare node takes the pods that leave. And, for
/// "An eviction webhook", a `pods/eviction` webhook registered as KubeVirt's
/// virt-api does (configuration `virt-api-validator`, named after the test),
/// which selects no namespace: it is only there to be found.
async fn setup_drain_pdb() -> Scenario {
    let env = ControllerEnv::new("ts-pdb", 1).await;
    let bed = &env.bed;
    let eviction_webhook = format!("{}-virt-api-validator", bed.group);
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": eviction_webhook, "labels": {GROUP_KEY: bed.group}},
        "webhooks": [{
            "name": "virt-launcher-eviction-interceptor.kubevirt.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "clientConfig": {"url": "https://127.0.0.1:1/launcher-eviction-validate"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods/eviction"]}],
            "namespaceSelector": {"matchLabels": {"nmo-test/no-such-namespace": "true"}},
        }]
    }))
    .expect("ValidatingWebhookConfiguration JSON");
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(env.client());
    vwcs.create(&PostParams::default(), &vwc)
        .await
        .expect("the eviction webhook's configuration");
    let node = bed.node("worker-1", false).await.expect("node").name_any();
    bed.deployment("web", 1).await.expect("deployment");
    env.wait_pods("the web pod Ready on the node", |by_node| {
        nmo_tests::controller_env::running_on(by_node, &node, "web") == 1
    })
    .await;
    bed.bare_pod("cache", &node).await.expect("pod");
    bed.pdb("web", "web", 1).await.expect("PDB");
    bed.wait_pdb_status("web", 1, LONG)
        .await
        .expect("PDB status");
    bed.node("worker-2", false).await.expect("spare node");
    let nm = env.n("kernel");
    create_nm_with(&env, &nm, &node, json!({})).await;
    env.wait_nm(&nm, "cache evicted, web held by its PDB", |n| {
        condition(n, "Blocked").is_some_and(|(r, _)| r == "EvictionBlocked")
            && n.status.as_ref().is_some_and(|s| s.drain_progress == 50)
    })
    .await;
    let mut sc = Scenario::new(&bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .alias("<ns>", &bed.namespace)
        .alias("virt-api-validator", &eviction_webhook);
    sc.cleanup.first.push(Box::pin(async move {
        let _ = vwcs
            .delete(&eviction_webhook, &DeleteParams::default())
            .await;
    }));
    sc.cleanup.env = Some(env);
    sc
}

/// A NodeMaintenance for a node that does not exist, created while no
/// webhook checked it: Failed, NodeNotFound.
async fn setup_node_gone() -> Scenario {
    let env = ControllerEnv::new("ts-gone", 1).await;
    let node = format!("{}-worker-9", env.bed.group);
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Failed).await;
    env.wait_event(&nm, "FailedMaintenance").await;
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node);
    sc.cleanup.env = Some(env);
    sc
}

/// `<nm>` has drained `<node>`; `<nm2>`, for the same node, was created while
/// no webhook checked it: Failed, DuplicateMaintenance.
async fn setup_duplicate_failed() -> Scenario {
    let env = ControllerEnv::new("ts-dup", 1).await;
    let node = env
        .bed
        .node("worker-1", false)
        .await
        .expect("node")
        .name_any();
    let (nm, nm2) = (env.n("kernel"), env.n("kernel-again"));
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    env.create_nm(&nm2, &node).await;
    env.wait_phase(&nm2, MaintenancePhase::Failed).await;
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<nm2>", &nm2)
        .alias("<node>", &node);
    sc.cleanup.env = Some(env);
    sc
}

/// Node Health Check holds `<node>`'s lease (valid, 660 s: NHC's default
/// remediation timeout plus its one minute of buffer) when `<nm>` is created:
/// Blocked, LeaseHeldByOther. The controller's log stands in for `kubectl logs`.
async fn setup_lease_held_by_other() -> Scenario {
    let env = ControllerEnv::new("ts-nhc", 1).await;
    let node = env.bed.node("worker-1", false).await.expect("node");
    let name = node.name_any();
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": format!("node-{name}"), "ownerReferences": [{
            "apiVersion": "v1", "kind": "Node", "name": name,
            "uid": node.uid().expect("node uid")}]},
        "spec": {"holderIdentity": NHC_HOLDER, "leaseDurationSeconds": 660,
                 "acquireTime": micro_now(), "renewTime": micro_now(), "leaseTransitions": 0}
    }))
    .expect("lease JSON");
    Api::<Lease>::namespaced(env.client(), "medik8s-leases")
        .create(&PostParams::default(), &lease)
        .await
        .expect("NHC's lease");
    let nm = env.n("kernel");
    env.create_nm(&nm, &name).await;
    wait_blocked(&env, &nm, "LeaseHeldByOther").await;
    let log = controller_log(&env);
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &name)
        .alias(
            "kubectl -n nmo-system logs deploy/nmo-controller",
            format!("cat '{}'", log.display()),
        );
    sc.cleanup.env = Some(env);
    sc
}

/// `<nm>` drained `<node>`, then Node Health Check took the lease (as if ours
/// had lapsed while the controller was down): four failed renewals later,
/// Failed, LeaseLost, the node given back. Node changes wake the drained
/// maintenance (it otherwise renews every 30 min), as time would.
async fn setup_lease_lost() -> Scenario {
    let env = ControllerEnv::new("ts-lost", 1).await;
    let (nm, node) = env.drained("worker-1", "kernel").await;
    Api::<Lease>::namespaced(env.client(), "medik8s-leases")
        .patch(
            &format!("node-{node}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": NHC_HOLDER,
                "leaseDurationSeconds": 660, "renewTime": micro_now(), "acquireTime": micro_now()}})),
        )
        .await
        .expect("lease taken by NHC");
    env.wait_nm(&nm, "Failed for the lost lease", |n| {
        if n.phase() == Some(&MaintenancePhase::Failed) {
            return true;
        }
        let nodes = env.nodes();
        let node = node.clone();
        let nudge = rand::random::<u32>().to_string();
        tokio::spawn(async move {
            let _ = nodes
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"nudge": nudge}}})),
                )
                .await;
        });
        false
    })
    .await;
    env.wait_event(&nm, "FailedMaintenance").await;
    let log = controller_log(&env);
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .alias(
            "kubectl -n nmo-system logs deploy/nmo-controller",
            format!("cat '{}'", log.display()),
        );
    sc.cleanup.env = Some(env);
    sc
}

/// The controller's leases are in `<lease-namespace>` (LEASE_NAMESPACE), but
/// RBAC lets it use leases in medik8s-leases only (manifests/controller/
/// node-leases.yaml not adapted): every read is forbidden.
///
/// The manifests' nmo-controller must never be refused anything (the RBAC
/// audit after the suite fails on it), so this controller runs as a
/// stand-in: ServiceAccount `ts-controller` in the test's namespace, bound to
/// exactly what nmo-controller has outside medik8s-leases (ClusterRole
/// nmo-controller, the events Role, nmo-metrics-auth), leader election off.
/// Its name replaces `system:serviceaccount:nmo-system:nmo-controller` in
/// the examples. The second block ("Is the controller alive?") reads its
/// `/metrics` at `localhost:8443` with a token of `nmo-metrics-debug` (made
/// here, named after the test): the same ReconcileError repeats, lastUpdate
/// stands still, and the reconcile count grows.
async fn setup_lease_forbidden() -> Scenario {
    let mut env = ControllerEnv::new("ts-lease-ns", 1).await;
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    let client = env.client();
    let g = env.bed.group.clone();
    let sa_ns = env.bed.namespace.clone();
    let sa = "ts-controller";
    let lease_ns = format!("{g}-leases");
    let rbac = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {sa}, namespace: {sa_ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {g}-controller, labels: {{{GROUP_KEY}: {g}}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nmo-controller}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {sa_ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {g}-metrics-auth, labels: {{{GROUP_KEY}: {g}}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nmo-metrics-auth}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {sa_ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {g}-events, namespace: default, labels: {{{GROUP_KEY}: {g}}}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: nmo-controller-events}}
subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {sa_ns}}}]
---
apiVersion: v1
kind: Namespace
metadata: {{name: {lease_ns}, labels: {{{GROUP_KEY}: {g}}}}}
"#
    );
    nmo_tests::manifests::apply_yaml(&client, &rbac)
        .await
        .expect("stand-in RBAC");
    nmo_tests::manifests::wait_bindings_effective(&client, "stand-in controller", &rbac)
        .await
        .expect("bindings effective");
    let kubeconfig = env
        .kubeconfig
        .with_file_name(format!("{g}-stand-in.kubeconfig"));
    nmo_tests::process::service_account_kubeconfig(&client, &sa_ns, sa, &kubeconfig)
        .await
        .expect("kubeconfig");
    let ctrl = Launch::new("base", "nmo-controller")
        .extra_args([
            format!("--nodemaintenance-selector={GROUP_KEY}={g}"),
            "--leader-elect=false".to_string(),
        ])
        .env("LEASE_NAMESPACE", &lease_ns)
        .kubeconfig(&kubeconfig)
        .start(&client)
        .await
        .expect("controller starts");
    ctrl.wait_ready(LONG).await.expect("controller Ready");
    let node = env
        .bed
        .node("worker-1", false)
        .await
        .expect("node")
        .name_any();
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    // Three counted lease errors, then the fourth fails releasing the lease too.
    env.wait_nm(&nm, "lease errors counted to 3, then ReconcileError", |n| {
        n.status
            .as_ref()
            .is_some_and(|s| s.error_on_lease_count == 3)
            && condition(n, "Blocked").is_some_and(|(r, _)| r == "ReconcileError")
    })
    .await;
    let log = ctrl.proc.log.clone();
    // "Is the controller alive?" reads this controller's /metrics.
    let metrics = ctrl
        .flag_port("metrics-bind-address")
        .expect("metrics port");
    let reader = format!("{g}-reader");
    let reader_ca = certs::Ca::new("nmo-metrics-ca", Duration::from_secs(3600)).expect("CA");
    nmo_tests::scrape::MetricsReader::create(&client, &reader, reader_ca.cert_pem().as_bytes())
        .await
        .expect("metrics reader");
    wait_metrics_access(client.clone(), "nmo-system".into(), reader.clone())
        .await
        .expect("reader allowed");
    let mut sc = Scenario::new(&g)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .alias("nmo-metrics-debug", &reader)
        .alias("localhost:8443", format!("127.0.0.1:{metrics}"))
        .alias("<lease-namespace>", &lease_ns)
        .alias(
            "system:serviceaccount:nmo-system:nmo-controller",
            format!("system:serviceaccount:{sa_ns}:{sa}"),
        )
        .alias(
            "kubectl -n nmo-system logs deploy/nmo-controller",
            format!("cat '{}'", log.display()),
        );
    // Deleting it cannot finish either (the release is refused): the
    // finalizer goes by hand, then the stand-in's RBAC.
    sc.cleanup
        .first
        .push(remove_metrics_reader(client.clone(), reader));
    sc.cleanup.first.push(Box::pin(async move {
        force_remove(&client, &nm).await;
        let dp = DeleteParams::default();
        for binding in ["controller", "metrics-auth"] {
            let _ = Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&format!("{g}-{binding}"), &dp)
                .await;
        }
        let _ = Api::<RoleBinding>::namespaced(client.clone(), "default")
            .delete(&format!("{g}-events"), &dp)
            .await;
        let _ = Api::<Namespace>::all(client).delete(&lease_ns, &dp).await;
    }));
    sc.cleanup.procs.push(ctrl.proc);
    sc.cleanup.env = Some(env);
    sc
}

/// An admission policy refuses every change of `<node>`'s spec (a
/// ValidatingAdmissionPolicy and its binding, `node-freeze`, named after the
/// test): the controller cannot cordon it. Blocked, NodeUpdateRefused.
async fn setup_node_update_refused() -> Scenario {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let env = ControllerEnv::new("ts-frozen", 1).await;
    let client = env.client();
    let node = env
        .bed
        .node("worker-1", false)
        .await
        .expect("node")
        .name_any();
    let freeze = format!("{}-node-freeze", env.bed.group);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": freeze, "labels": {GROUP_KEY: env.bed.group}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["nodes"]
            }]},
            "validations": [{
                "expression": "object.spec == oldObject.spec",
                "message": "node specs are frozen during the hardware audit"
            }]
        }
    }))
    .expect("policy JSON");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": freeze, "labels": {GROUP_KEY: env.bed.group}},
        "spec": {
            "policyName": freeze,
            "validationActions": ["Deny"],
            "matchResources": {"objectSelector": {"matchLabels": {"kubernetes.io/hostname": node}}}
        }
    }))
    .expect("binding JSON");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("policy created");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding created");
    let nodes = env.nodes();
    until("the API server to enforce the policy", LONG, || async {
        let r = nodes
            .patch(
                &node,
                &PatchParams::default().dry_run(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await;
        Ok(match r {
            Err(kube::Error::Api(s)) if s.message.contains("frozen") => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        })
    })
    .await
    .expect("policy enforced");
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    wait_blocked(&env, &nm, "NodeUpdateRefused").await;
    env.wait_event(&nm, "NodeUpdateRefused").await;
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .alias("node-freeze", &freeze);
    sc.cleanup.first.push(Box::pin(async move {
        let dp = DeleteParams::default();
        let _ = bindings.delete(&freeze, &dp).await;
        let _ = policies.delete(&freeze, &dp).await;
    }));
    sc.cleanup.env = Some(env);
    sc
}

/// Two drains blocked by PodDisruptionBudgets, with `drainTimeout: 5s`:
/// `<nm>` on `<node>` with `drainTimeoutAction: Fail`, `<nm2>` on `<node2>`
/// with `Force`, on a controller with the force-drain component.
async fn setup_drain_timeout() -> Scenario {
    let env = ControllerEnv::with_force_drain("ts-deadline", 0).await;
    let bed = &env.bed;
    let node = bed.node("worker-1", false).await.expect("node").name_any();
    let node2 = bed.node("worker-2", false).await.expect("node").name_any();
    for (pod, on) in [("db-0", &node), ("db-1", &node2)] {
        bed.bare_pod(pod, on).await.expect("pod");
        bed.pdb(pod, pod, 1).await.expect("PDB");
        bed.wait_pdb_status(pod, 1, LONG).await.expect("PDB status");
    }
    let (nm, nm2) = (env.n("kernel"), env.n("firmware"));
    create_nm_with(
        &env,
        &nm,
        &node,
        json!({"drainTimeout": "5s", "drainTimeoutAction": "Fail"}),
    )
    .await;
    create_nm_with(
        &env,
        &nm2,
        &node2,
        json!({"drainTimeout": "5s", "drainTimeoutAction": "Force"}),
    )
    .await;
    env.wait_phase(&nm, MaintenancePhase::Failed).await;
    env.wait_phase(&nm2, MaintenancePhase::Succeeded).await;
    env.wait_event(&nm2, "PodForceDeleted").await;
    let mut sc = Scenario::new(&bed.group)
        .alias("<nm>", &nm)
        .alias("<nm2>", &nm2)
        .alias("<node>", &node)
        .alias("<node2>", &node2)
        .alias("<ns>", &bed.namespace);
    sc.cleanup.env = Some(env);
    sc
}

/// One maintenance slot: `<nm>` holds it (Succeeded on `<node>`), `<nm2>`
/// waits for it (Pending on `<node2>`).
async fn setup_waiting_for_slot() -> Scenario {
    let env = ControllerEnv::new("ts-slot", 1).await;
    let node = env
        .bed
        .node("worker-1", false)
        .await
        .expect("node")
        .name_any();
    let node2 = env
        .bed
        .node("worker-2", false)
        .await
        .expect("node")
        .name_any();
    let (nm, nm2) = (env.n("kernel"), env.n("kernel-w2"));
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    env.create_nm(&nm2, &node2).await;
    env.wait_phase(&nm2, MaintenancePhase::Pending).await;
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<nm2>", &nm2)
        .alias("<node>", &node)
        .alias("<node2>", &node2);
    sc.cleanup.env = Some(env);
    sc
}

/// The zone label the gate scenarios use (the default of --zone-label).
const ZONE: &str = "topology.kubernetes.io/zone";

/// A scenario over `env` (torn down with it) with `aliases` (placeholder, value).
fn scenario_of(env: ControllerEnv, aliases: &[(&str, &str)]) -> Scenario {
    let mut sc = Scenario::new(&env.bed.group);
    for (placeholder, value) in aliases {
        sc = sc.alias(placeholder, *value);
    }
    sc.cleanup.env = Some(env);
    sc
}

/// NodeMaintenance `short` for `node`, waited for until gate `reason` holds it.
async fn held(env: &ControllerEnv, short: &str, node: &str, reason: &str) -> String {
    let nm = env.n(short);
    env.create_nm(&nm, node).await;
    env.wait_held(&nm, reason).await;
    nm
}

/// `<nm>` for `<node>` reaches phase `first`, then `<nm2>` for `<node2>`
/// is held by gate `reason`.
async fn held_behind(
    env: ControllerEnv,
    (node, node2): (String, String),
    first: MaintenancePhase,
    reason: &str,
) -> Scenario {
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, first).await;
    let nm2 = held(&env, "kernel-w2", &node2, reason).await;
    let aliases = [
        ("<nm>", nm.as_str()),
        ("<nm2>", &nm2),
        ("<node>", &node),
        ("<node2>", &node2),
    ];
    scenario_of(env, &aliases)
}

/// A node of `env` named after `suffix`.
async fn plain_node(env: &ControllerEnv, suffix: &str, cordoned: bool) -> String {
    env.bed
        .node(suffix, cordoned)
        .await
        .expect("node")
        .name_any()
}

/// One maintenance per zone: `<nm>` drained `<node>`; `<nm2>` for `<node2>`,
/// the same zone, waits: ZoneBudget.
async fn setup_zone_budget() -> Scenario {
    let env = ControllerEnv::gated("ts-zone", &["--max-concurrent-per-zone=1"]).await;
    let node = env.labelled_node("worker-1", false, ZONE, "zone-a").await;
    let node2 = env.labelled_node("worker-2", false, ZONE, "zone-a").await;
    held_behind(
        env,
        (node, node2),
        MaintenancePhase::Succeeded,
        "ZoneBudget",
    )
    .await
}

/// At most one node unavailable: `<node2>` is cordoned by someone else, so
/// `<nm>` for `<node>` waits: MaxUnavailable.
async fn setup_max_unavailable() -> Scenario {
    let env = ControllerEnv::gated("ts-unavail", &["--max-unavailable=1"]).await;
    let node = plain_node(&env, "worker-1", false).await;
    let node2 = plain_node(&env, "worker-2", true).await;
    let nm = held(&env, "kernel", &node, "MaxUnavailable").await;
    scenario_of(
        env,
        &[("<nm>", &nm), ("<node>", &node), ("<node2>", &node2)],
    )
}

/// A daily one-hour window that opens two hours from now (UTC): `<nm>`
/// waits for it: OutsideWindow.
async fn setup_outside_window() -> Scenario {
    let hour = (Timestamp::now()
        .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
        .hour()
        + 2)
        % 24;
    let window = format!("0 {hour} * * * 1h UTC");
    let flag = format!("--maintenance-window={window}");
    let env = ControllerEnv::gated("ts-window", &[flag.as_str()]).await;
    let node = plain_node(&env, "worker-1", false).await;
    let nm = held(&env, "kernel", &node, "OutsideWindow").await;
    scenario_of(
        env,
        &[("<nm>", &nm), ("<node>", &node), ("<window>", &window)],
    )
}

/// `--pause-after-failure`: `<nm>` failed (its node `<node>` does not
/// exist), so `<nm2>` for `<node2>` waits: PausedAfterFailure.
async fn setup_paused_after_failure() -> Scenario {
    let env = ControllerEnv::gated("ts-pause", &["--pause-after-failure"]).await;
    let node = format!("{}-gone", env.bed.group);
    let node2 = plain_node(&env, "worker-2", false).await;
    held_behind(
        env,
        (node, node2),
        MaintenancePhase::Failed,
        "PausedAfterFailure",
    )
    .await
}

/// `--block-on-alerts-url` at an address where nothing listens: the alerts
/// cannot be read, so `<nm>` waits (fails closed): AlertsFiring.
async fn setup_alerts_unreadable() -> Scenario {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let flag = format!("--block-on-alerts-url={url}");
    let env = ControllerEnv::gated("ts-alerts", &[flag.as_str()]).await;
    let node = plain_node(&env, "worker-1", false).await;
    let nm = held(&env, "kernel", &node, "AlertsFiring").await;
    scenario_of(
        env,
        &[("<nm>", &nm), ("<node>", &node), ("<prometheus>", &url)],
    )
}

/// A pod held by a finalizer (`example.com/backup`) outlives its grace
/// period: Blocked, EvictionBlocked, naming the finalizer (after 30 s).
async fn setup_drain_finalizer() -> Scenario {
    let env = ControllerEnv::new("ts-stuck", 1).await;
    let bed = &env.bed;
    let node = bed.node("worker-1", false).await.expect("node").name_any();
    bed.pod_on(
        "backup-0",
        &node,
        json!({"metadata": {"finalizers": ["example.com/backup"]},
               "spec": {"terminationGracePeriodSeconds": 1}}),
    )
    .await
    .expect("pod");
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    env.wait_nm(&nm, "the pod named with its finalizer", |n| {
        condition(n, "Blocked").is_some_and(|(_, m)| m.contains("held by finalizers"))
    })
    .await;
    let ns = bed.namespace.clone();
    let client = env.client();
    let mut sc = Scenario::new(&bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .alias("<ns>", &ns);
    // If the example did not get that far, the namespace must not hang on it.
    sc.cleanup.first.push(Box::pin(async move {
        let _ = Api::<Pod>::namespaced(client, &ns)
            .patch(
                "backup-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }));
    sc.cleanup.env = Some(env);
    sc
}

/// A maintenance that worked: `<node>` (no taints of its own) drained of its
/// one pod. The guide deletes it in the first block; before the second, the
/// controller has said UncordonNode and RemovedMaintenance.
async fn setup_succeeded() -> Scenario {
    let env = ControllerEnv::new("ts-ok", 1).await;
    let node = env
        .bed
        .node_without_taints("worker-1")
        .await
        .expect("node")
        .name_any();
    env.bed.bare_pod("web", &node).await.expect("pod");
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    let client = env.client();
    let (n2, node2) = (nm.clone(), node.clone());
    let said = async move {
        for (object, reason) in [(&node2, "UncordonNode"), (&n2, "RemovedMaintenance")] {
            until(&format!("event {reason}"), LONG, || async {
                let seen = nmo_tests::controller_env::events_of(&client, object).await;
                Ok(if seen.iter().any(|e| e.1 == reason) {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{seen:?}"))
                })
            })
            .await?;
        }
        Ok(())
    };
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .before_block(1, said);
    sc.cleanup.env = Some(env);
    sc
}

/// Every webhook pod is down, and the controller too: `<nm>` drained
/// `<node>` (no taints of its own), then the controller stopped and the
/// webhook configuration (this test's, named after it: it stands for
/// `nmo-validating-webhook`) points at nothing. nm.yaml asks for `<node2>`.
/// Before the third block the API server has seen `failurePolicy: Ignore`;
/// before the fourth, kube-controller-manager has removed the
/// `node.kubernetes.io/unschedulable` taint of the uncordoned node.
async fn setup_webhook_down() -> Scenario {
    let mut env = ControllerEnv::new("ts-down", 1).await;
    let client = env.client();
    let g = env.bed.group.clone();
    let node = env
        .bed
        .node_without_taints("worker-1")
        .await
        .expect("node")
        .name_any();
    let node2 = env
        .bed
        .node("worker-2", false)
        .await
        .expect("node")
        .name_any();
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    if let Some(mut c) = env.ctrl.take() {
        c.proc.kill();
    }
    dead_webhook(&client, &g).await;
    let ignored = {
        let (client, nm) = (client.clone(), nm.clone());
        async move {
            until("updates admitted (failurePolicy Ignore)", LONG, || async {
                Ok(if update_admitted(&client, &nm).await? {
                    Poll::Ready(())
                } else {
                    Poll::Pending("refused".into())
                })
            })
            .await
        }
    };
    let untainted = {
        let (nodes, node) = (env.nodes(), node.clone());
        async move {
            until("the node's taints to go", LONG, || async {
                let n = nodes.get(&node).await?;
                let taints = nmo_tests::controller_env::node_taint_keys(&n);
                Ok(if taints.is_empty() {
                    Poll::Ready(())
                } else {
                    Poll::Pending(format!("{taints:?}"))
                })
            })
            .await
        }
    };
    let n2 = format!("{g}-kernel-w2");
    let mut sc = Scenario::new(&g)
        .alias("<nm>", &nm)
        .alias("<nm2>", &n2)
        .alias("<node>", &node)
        .alias("<node2>", &node2)
        .alias("nmo-validating-webhook", &g)
        .alias(VWC_LIST, own_vwc_list(&g))
        .file("nm.yaml", &nm_yaml(&n2, &node2, &g, ""))
        .before_block(2, ignored)
        .before_block(3, untainted);
    // Should the example stop half-way: no webhook, no controller, so the
    // NodeMaintenance goes by hand.
    sc.cleanup.first.push(Box::pin(async move {
        nmo_tests::webhook_pod::unregister(&client, &g).await;
        force_remove(&client, &nm).await;
    }));
    sc.cleanup.env = Some(env);
    sc
}

/// `kubectl get validatingwebhookconfigurations -o json` narrowed to the
/// configurations of test group `group`: what the guide's lookup of the
/// webhook configuration sees on a cluster with one install.
fn own_vwc_list(group: &str) -> String {
    format!("kubectl get validatingwebhookconfigurations -l {GROUP_KEY}={group} -o json")
}

/// The webhook pod runs, but the webhook configuration's caBundle is another
/// CA's: the API server cannot verify it. Secret `nmo-webhook-cert` is first
/// a base install's (`tls.crt`, `tls.key`: no `ca.crt`), in the test's
/// namespace, which stands for nmo-system in `-n nmo-system get secret`;
/// `ca/ca.crt` is the CA file the admin signed with. Blocks: the lookup of
/// the configuration, the x509 diagnosis, the base install's fix (the
/// cert-manager command refused on the base Secret, then the CA file);
/// before the fourth, the fix took effect, the caBundle is stale again and
/// the Secret has cert-manager's `ca.crt`: the cert-manager fix; before the
/// fifth, creates are allowed again. The webhook's /metrics is at
/// `localhost:8443`, read with a token of ServiceAccount `nmo-metrics-debug`
/// (made here, named after the test).
async fn setup_webhook_tls() -> Scenario {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_controller_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let bed = TestBed::new(client.clone(), "ts-tls")
        .await
        .expect("test namespace");
    let g = bed.group.clone();
    let node = bed.node("worker-1", false).await.expect("node").name_any();
    let wh = Webhook::start(&client, &g, &["--metrics-secure=true"]).await;
    let stale = certs::Ca::new("nmo-webhook-ca", Duration::from_secs(3600)).expect("CA");
    register(
        &client,
        &g,
        wh.tls.port(),
        &certs::ca_bundle_base64(stale.cert_pem()),
    )
    .await;
    wait_create_answer(
        &client,
        &g,
        &node,
        "the API server to call the webhook with the stale CA",
        |r| matches!(r, Err((_, m)) if m.contains("x509")),
    )
    .await
    .expect("x509 errors");
    let read = |f: &str| std::fs::read_to_string(wh.cert_dir.join(f)).expect("certificate file");
    // As `kubectl create secret tls` makes it: no ca.crt.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "nmo-webhook-cert"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": read("tls.crt"), "tls.key": read("tls.key")}
    }))
    .expect("Secret JSON");
    let secrets = Api::<Secret>::namespaced(client.clone(), &bed.namespace);
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret");
    let reader = format!("{g}-reader");
    nmo_tests::scrape::MetricsReader::create(&client, &reader, wh.ca.cert_pem().as_bytes())
        .await
        .expect("metrics reader");
    wait_metrics_access(client.clone(), "nmo-system".into(), reader.clone())
        .await
        .expect("reader allowed");
    let cert_manager = as_cert_manager(
        client.clone(),
        g.clone(),
        node.clone(),
        secrets,
        stale.cert_pem().to_string(),
        wh.ca.cert_pem().to_string(),
    );
    let repaired = {
        let (client, g, node) = (client.clone(), g.clone(), node.clone());
        async move {
            wait_create_answer(&client, &g, &node, "creates to be allowed", |r| r.is_ok()).await
        }
    };
    let nm = format!("{g}-kernel");
    let mut sc = Scenario::new(&g);
    std::fs::create_dir_all(sc.cwd.join("ca")).expect("the CA directory");
    sc = sc
        .alias("<nm>", &nm)
        .alias("nmo-validating-webhook", &g)
        .alias(VWC_LIST, own_vwc_list(&g))
        .alias(
            "-n nmo-system get secret",
            format!("-n {} get secret", bed.namespace),
        )
        .alias("nmo-metrics-debug", &reader)
        .alias("localhost:8443", format!("127.0.0.1:{}", wh.metrics))
        .file("nm.yaml", &nm_yaml(&nm, &node, &g, ""))
        .file("ca/ca.crt", wh.ca.cert_pem())
        .before_block(3, cert_manager)
        .before_block(4, repaired);
    sc.cleanup.first.push(remove_metrics_reader(client, reader));
    sc.cleanup.groups.push((g, vec![bed.namespace.clone()]));
    sc.cleanup.procs.push(wh.proc);
    sc
}

/// Between the base install's fix and cert-manager's: the base fix took
/// effect (creates allowed), then the caBundle of `group`'s configuration is
/// `stale_pem` again (x509 errors), and the Secret gets `ca.crt` =
/// `ca_pem`, as cert-manager writes it.
async fn as_cert_manager(
    client: Client,
    group: String,
    node: String,
    secrets: Api<Secret>,
    stale_pem: String,
    ca_pem: String,
) -> anyhow::Result<()> {
    wait_create_answer(
        &client,
        &group,
        &node,
        "the base install's fix to work",
        |r| r.is_ok(),
    )
    .await?;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mut vwc = configs.get(&group).await?;
    for w in vwc.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(k8s_openapi::ByteString(stale_pem.clone().into_bytes()));
    }
    configs
        .replace(&group, &PostParams::default(), &vwc)
        .await?;
    wait_create_answer(
        &client,
        &group,
        &node,
        "x509 errors again",
        |r| matches!(r, Err((_, m)) if m.contains("x509")),
    )
    .await?;
    secrets
        .patch(
            "nmo-webhook-cert",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"ca.crt": ca_pem}})),
        )
        .await?;
    Ok(())
}

/// The webhook configuration as OLM writes it for the bundle's
/// `webhookdefinitions` (tests/src/olm.rs reads the same CSV): named
/// `vnodemaintenance.kb.io-<suffix>` by `generateName`, labelled with its
/// owner and `olm.webhook-description-generate-name`, its one webhook named
/// `vnodemaintenance.kb.io`. It calls nothing (nothing listens, failurePolicy
/// Ignore, only this test's objects): only its names are under test.
async fn setup_olm_names() -> Scenario {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    let g = nmo_tests::unique("ts-olm");
    let port = nmo_tests::process::free_port().expect("a free port");
    let csv = nmo_tests::olm::read_csv().expect("the bundle's CSV");
    let csv_name = csv["metadata"]["name"]
        .as_str()
        .unwrap_or("node-maintenance-operator-rs");
    let definition = &csv["spec"]["webhookdefinitions"][0];
    let generate_name = definition["generateName"].as_str().unwrap_or(WEBHOOK_NAME);
    assert_eq!(
        generate_name, WEBHOOK_NAME,
        "the bundle's webhook is no longer {WEBHOOK_NAME}"
    );
    let mut webhook = nmo_tests::webhook_pod::test_webhook(&g, generate_name, port, "");
    webhook["failurePolicy"] = json!("Ignore");
    webhook["timeoutSeconds"] = json!(1);
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {
            "generateName": format!("{generate_name}-"),
            "labels": {
                GROUP_KEY: g,
                "olm.owner": csv_name,
                "olm.owner.kind": "ClusterServiceVersion",
                "olm.owner.namespace": "nmo-system",
                "olm.webhook-description-generate-name": generate_name,
            }
        },
        "webhooks": [webhook]
    }))
    .expect("ValidatingWebhookConfiguration JSON");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("OLM-named ValidatingWebhookConfiguration created");
    let mut sc = Scenario::new(&g).alias(VWC_LIST, own_vwc_list(&g));
    sc.cleanup.first.push(Box::pin(async move {
        let _ = Api::<ValidatingWebhookConfiguration>::all(client)
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("{GROUP_KEY}={g}")),
            )
            .await;
    }));
    sc
}

/// The controller's secure /metrics, as a human reads it (and its leader
/// Lease, the second block): the guide creates ServiceAccount
/// `nmo-metrics-debug` (named after the test here) and its binding in the
/// first block ("A reader for /metrics"); before the third the authorizer
/// knows the binding. `localhost:8443` is where the test's controller serves /metrics;
/// its leader Lease lives in the test's copy of nmo-system (`-n nmo-system
/// get lease`). `<nm>` has drained `<node>`.
async fn setup_metrics() -> Scenario {
    let env = ControllerEnv::new("ts-metrics", 1).await;
    let node = env
        .bed
        .node("worker-1", false)
        .await
        .expect("node")
        .name_any();
    let nm = env.n("kernel");
    env.create_nm(&nm, &node).await;
    env.wait_phase(&nm, MaintenancePhase::Succeeded).await;
    let port = env
        .ctrl
        .as_ref()
        .expect("controller")
        .flag_port("metrics-bind-address")
        .expect("metrics port");
    let reader = format!("{}-reader", env.bed.group);
    let client = env.client();
    let bound = wait_metrics_access(client.clone(), "nmo-system".into(), reader.clone());
    let mut sc = Scenario::new(&env.bed.group)
        .alias("<nm>", &nm)
        .alias("<node>", &node)
        .alias("nmo-metrics-debug", &reader)
        .alias("localhost:8443", format!("127.0.0.1:{port}"))
        .alias(
            "-n nmo-system get lease",
            format!("-n {} get lease", env.operator_ns),
        )
        .before_block(2, bound);
    sc.cleanup.first.push(remove_metrics_reader(client, reader));
    sc.cleanup.env = Some(env);
    sc
}

/// What the manifests grant the controller and the webhook, as installed by
/// the tests (nothing else to set up).
async fn setup_rbac() -> Scenario {
    let client = nmo_tests::admin_client()
        .await
        .expect("local control plane");
    nmo_tests::manifests::install_controller_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    nmo_tests::manifests::install_webhook_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    Scenario::new(&nmo_tests::unique("ts-rbac")).alias("<any-namespace>", "kube-system")
}

/// manifests/must-gather.sh against the plane, run from the repository root;
/// the bundle goes to the scenario's directory (`/tmp/nmo-gather`).
async fn setup_must_gather() -> Scenario {
    let group = nmo_tests::unique("ts-gather");
    let mut sc = Scenario::new(&group);
    let out = sc.cwd.join("gather");
    std::fs::create_dir_all(&out).expect("output directory");
    sc = sc.alias("/tmp/nmo-gather", out.display().to_string());
    sc.cwd = nmo_tests::repo_root();
    sc
}
