//! The release and demo scripts' small promises, checked without a cluster:
//! `make release` points the alerts' runbook links at the guide of its tag
//! (tests/release/lib.sh `pin_runbooks`) and refuses a placeholder
//! repository; no script reopens its own standard output or error (which
//! truncates a log captured with `> log 2>&1`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    // tests/tools -> the repository.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// Run `script` in bash with tests/release/lib.sh sourced, `input` on stdin.
fn with_release_lib(script: &str, args: &[&str], input: &str) -> Output {
    use std::io::Write as _;
    let lib = repo_root().join("tests/release/lib.sh");
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; source '{}'; {script}",
            lib.display()
        ))
        .arg("release-test")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("bash runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("writing the input");
    child.wait_with_output().expect("bash finishes")
}

const MAIN: &str = "https://example.invalid/nmo-rs/blob/main/docs/troubleshooting.md";
const TAG: &str = "https://github.com/acme/nmo-rs/blob/v1.2.3/docs/troubleshooting.md";

/// What `kubectl kustomize manifests/monitoring` renders: the committed
/// rule file with the annotation's base in front of every anchor (the
/// replacement of manifests/monitoring/kustomization.yaml; manifests/check.sh
/// checks the real rendering).
fn rendered_rules() -> String {
    let path = repo_root().join("manifests/monitoring/prometheusrule.yaml");
    let rules = std::fs::read_to_string(&path).expect("the rule file");
    let base = rules
        .lines()
        .find_map(|l| l.trim().strip_prefix("nmo.medik8s.io/runbook-base:"))
        .expect("the rule file has the nmo.medik8s.io/runbook-base annotation")
        .trim()
        .to_string();
    assert_eq!(
        base, MAIN,
        "the committed runbook base must be Cargo.toml's repository + /blob/main/docs/troubleshooting.md"
    );
    rules.replace("runbook_url: \"#", &format!("runbook_url: \"{base}#"))
}

#[test]
fn release_points_every_runbook_at_the_tagged_guide() {
    let out = with_release_lib(r#"pin_runbooks "$1" "$2""#, &[MAIN, TAG], &rendered_rules());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pin_runbooks failed: {stderr}");
    let pinned = String::from_utf8_lossy(&out.stdout);
    let urls: Vec<&str> = pinned
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
        .map(|u| u.trim().trim_matches('"'))
        .collect();
    assert!(
        urls.len() >= 8,
        "only {} runbook_urls: {pinned}",
        urls.len()
    );
    for url in urls {
        assert!(url.starts_with(&format!("{TAG}#")), "not pinned: {url}");
        assert!(
            !url.contains("example.invalid"),
            "placeholder host left: {url}"
        );
    }
    assert!(pinned.contains(&format!("nmo.medik8s.io/runbook-base: {TAG}")));
}

#[test]
fn release_refuses_runbooks_it_could_not_pin() {
    // A rule whose link does not start with the committed base.
    let stray = format!(
        "{}        - alert: Stray\n          annotations:\n            runbook_url: https://elsewhere.example/x#y\n",
        rendered_rules()
    );
    let out = with_release_lib(r#"pin_runbooks "$1" "$2""#, &[MAIN, TAG], &stray);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a stray runbook_url was let through");
    assert!(
        stderr.contains("https://elsewhere.example/x#y")
            && stderr.contains("nmo.medik8s.io/runbook-base"),
        "the error must name the link and where the base is set: {stderr}"
    );
    let out = with_release_lib(
        r#"pin_runbooks "$1" "$2""#,
        &[MAIN, TAG],
        "kind: ConfigMap\n",
    );
    assert!(
        !out.status.success(),
        "rules without any runbook_url were let through"
    );
}

#[test]
fn release_refuses_a_placeholder_repository() {
    for bad in [
        "https://example.invalid/nmo-rs",
        "http://github.com/acme/nmo-rs",
        "",
    ] {
        let out = with_release_lib(r#"check_runbook_repository "$1""#, &[bad], "");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(stderr.contains("repository"), "{bad:?}: {stderr}");
    }
    let out = with_release_lib(
        r#"check_runbook_repository "$1""#,
        &["https://github.com/acme/nmo-rs"],
        "",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = with_release_lib(r#"runbook_base "$1" "$2""#, &["https://g/x/", "v1.0.0"], "");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "https://g/x/blob/v1.0.0/docs/troubleshooting.md"
    );
}

/// `tee /dev/stderr`, `> /dev/stdout` and the like open the file behind the
/// descriptor again, truncating it when it is a log the caller redirected
/// with `>` (`make demo > demo.log 2>&1` lost everything before the
/// NodeMaintenance's YAML). `>&2` and `>> /dev/stderr` are fine.
#[test]
fn no_script_reopens_its_own_output() {
    let root = repo_root();
    let mut scripts = Vec::new();
    for dir in [
        "tests",
        "tests/deploy",
        "tests/release",
        "tests/cluster",
        "manifests",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "sh") {
                scripts.push(p);
            }
        }
    }
    scripts.push(root.join("Makefile"));
    assert!(scripts.len() > 10, "found only {scripts:?}");
    let mut found = Vec::new();
    for path in &scripts {
        let text = std::fs::read_to_string(path).expect("a script");
        for (i, line) in text.lines().enumerate() {
            let code = line.split(" #").next().unwrap_or("").trim_start();
            if code.starts_with('#') {
                continue;
            }
            if reopens_output(code) {
                found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "these lines open /dev/stdout or /dev/stderr again, which truncates a log captured \
         with `> log 2>&1`; print with printf (or >&2) instead:\n{}",
        found.join("\n")
    );
}

fn reopens_output(code: &str) -> bool {
    let squeezed: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
    ["/dev/stdout", "/dev/stderr"].iter().any(|dev| {
        squeezed.contains(&format!("tee {dev}"))
            || squeezed.contains(&format!(">{dev}"))
            || squeezed.contains(&format!("> {dev}"))
    }) && !squeezed.contains(">>/dev/")
        && !squeezed.contains(">> /dev/")
}

#[test]
fn the_output_guard_knows_reopening_from_duplicating() {
    assert!(reopens_output(
        "cat <<YAML | tee /dev/stderr | kubectl apply -f -"
    ));
    assert!(reopens_output("echo x >/dev/stderr"));
    assert!(reopens_output("echo x > /dev/stdout"));
    assert!(!reopens_output("echo x >&2"));
    assert!(!reopens_output("echo x >>/dev/stderr"));
    assert!(!reopens_output("kubectl apply -f - >/dev/null"));
}
