//! The guide's commands, read without a cluster: each says which install
//! path it is for when it names what only some paths have; no command
//! writes a `caBundle` it has not checked; the controller's liveness is not
//! judged by `lastUpdate`; tokens, ServiceAccounts and shell variables exist
//! before a command uses them; log filters skip lines that are not JSON.
//! (The checked examples themselves run against the plane: the scenarios of
//! the parent module, among them `olm-names` with OLM's names and
//! `webhook-tls` with a Secret with and without cert-manager's `ca.crt`.)

use std::collections::BTreeSet;

use super::{GUIDE, heading_anchors, read_guide, repo_path};

/// One command of the guide's code blocks.
#[derive(Debug, Clone)]
struct Command {
    /// 1-based line in the file where the command starts.
    line: usize,
    /// The heading above it.
    section: String,
    /// Index of its code block in the file.
    block: usize,
    /// A ```console block (each runs in a shell of its own) or a ```sh one.
    console: bool,
    /// The command, continuation lines joined, with the `#` comment lines
    /// directly above it in its block.
    text: String,
}

/// A line whose command goes on on the next line.
fn continues(line: &str) -> bool {
    let t = line.trim_end();
    t.ends_with('\\') || t.ends_with("&&") || t.ends_with("||") || t.ends_with('|')
}

/// Every command of the ```console and ```sh blocks of `text`.
fn commands(text: &str) -> Vec<Command> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let (mut section, mut block, mut i) = (String::new(), 0, 0);
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with('#') {
            section = line.trim_start_matches('#').trim().to_string();
        }
        let Some(info) = line.trim().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let Some(len) = lines[i + 1..].iter().position(|l| l.trim() == "```") else {
            break;
        };
        let body = &lines[i + 1..i + 1 + len];
        let console = info.trim() == "console";
        if console || info.trim() == "sh" {
            let first = i + 2;
            out.extend(block_commands(body, first, &section, block, console));
        }
        block += 1;
        i += len + 2;
    }
    out
}

fn block_commands(
    body: &[&str],
    first: usize,
    section: &str,
    block: usize,
    console: bool,
) -> Vec<Command> {
    let mut out = Vec::new();
    let mut comments = String::new();
    let mut k = 0;
    while k < body.len() {
        let raw = body[k];
        let start = k;
        let Some(mut text) = (if console {
            raw.strip_prefix("$ ").map(str::to_string)
        } else {
            Some(raw.to_string())
        }) else {
            k += 1;
            continue;
        };
        if !console && text.trim_start().starts_with('#') {
            comments.push_str(text.trim());
            comments.push('\n');
            k += 1;
            continue;
        }
        while continues(&text) && k + 1 < body.len() {
            k += 1;
            text.push('\n');
            text.push_str(body[k]);
        }
        k += 1;
        if text.trim().is_empty() {
            comments.clear();
            continue;
        }
        out.push(Command {
            line: first + start,
            section: section.to_string(),
            block,
            console,
            text: format!("{comments}{text}"),
        });
        comments.clear();
    }
    out
}

/// Fail with `why` and every line of `found`, if there is one.
fn none_of(found: &[String], why: &str) {
    assert!(found.is_empty(), "{why}:\n{}", found.join("\n"));
}

/// The install paths a `#` comment may name.
const PATHS: &[&str] = &["base", "cert-manager", "OpenShift", "OLM", "kustomize"];

/// What exists on some install paths only, or changes what it does with the
/// path: a command using one must say which paths it is for.
const PATH_SPECIFIC: &[&str] = &[
    "nmo-validating-webhook",
    "nmo-webhook-cert",
    "nmo-webhook-service-cert",
    "olmCAKey",
    "openshift-service-ca",
    "ca\\.crt",
    "get csv",
    "delete csv",
    "subscription",
    "oc ",
    "apply -k manifests",
    "patch validatingwebhookconfiguration",
];

/// Whether a `#` comment of `text` names an install path.
fn names_a_path(text: &str) -> bool {
    text.lines()
        .filter_map(|l| l.split_once('#').map(|(_, c)| c))
        .any(|c| PATHS.iter().any(|p| c.contains(p)))
}

#[test]
fn every_command_works_on_every_path_or_says_which() {
    let wrong: Vec<String> = commands(&read_guide())
        .into_iter()
        .filter(|c| {
            let code: String = c
                .text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n");
            // A shell function's definition is no use of it.
            let definition = code.contains("() {");
            !definition && PATH_SPECIFIC.iter().any(|n| code.contains(n)) && !names_a_path(&c.text)
        })
        .map(|c| format!("{GUIDE}:{} ({}): {}", c.line, c.section, c.text))
        .collect();
    none_of(
        &wrong,
        &format!(
            "these commands name what only some install paths have, without a `# <path>` comment \
         naming them (one of {PATHS:?}); find the name as `Install paths` does, or say which \
         paths the command is for"
        ),
    );
}

#[test]
fn the_path_check_reads_commands_as_written() {
    let text = "# S\n```sh\n# OLM: the names\nkubectl get csv\nkubectl get secret nmo-webhook-cert\n```\n\
                ```console\n$ kubectl patch validatingwebhookconfiguration x \\\n  -p y   # kustomize\nout\n```\n";
    let c = commands(text);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(names_a_path(&c[0].text), "a comment line above counts");
    assert!(
        !names_a_path(&c[1].text),
        "the comment belongs to the command below it only"
    );
    assert!(
        c[2].console && names_a_path(&c[2].text),
        "continued lines are one command"
    );
    assert_eq!((c[2].line, c[2].section.as_str()), (8, "S"));
}

/// A command that writes a `caBundle` (with `kubectl patch`) must refuse an
/// empty value first: a `test -n`/`test -z` (or `[ -n`/`[ -z`) of it before
/// the patch. The guide's and manifests/README.md's.
#[test]
fn no_command_writes_an_unchecked_ca_bundle() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, text) in [
        (GUIDE, read_guide()),
        (
            "manifests/README.md",
            std::fs::read_to_string(repo_path("manifests/README.md")).expect("README"),
        ),
    ] {
        for c in commands(&text) {
            let Some(patch) = c.text.find("kubectl patch") else {
                continue;
            };
            if !c.text.contains("caBundle") {
                continue;
            }
            let guard = ["test -n", "test -z", "[ -n", "[ -z"]
                .iter()
                .filter_map(|g| c.text.find(g))
                .min();
            match guard {
                Some(g) if g < patch => checked += 1,
                _ => wrong.push(format!("{file}:{}: {}", c.line, c.text)),
            }
        }
    }
    none_of(
        &wrong,
        "these commands may write an empty caBundle (a missing key or file gives an empty value): \
         refuse an empty value before the patch",
    );
    assert!(
        checked >= 2,
        "the guide and manifests/README.md must keep their caBundle fixes"
    );
    let guide = read_guide();
    assert!(
        guide.contains("refusing to write an empty caBundle"),
        "the guide must show the refusal on a base install (checked by scenario webhook-tls)"
    );
}

/// The anchor of "Is the controller alive?".
const LIVENESS: &str = "is-the-controller-alive";

/// `lastUpdate` stands still while the same reconcile error repeats
/// (an identical status is not written again): it is no sign of life. The
/// liveness check counts reconciles, and every other mention of
/// `lastUpdate` leads there.
#[test]
fn liveness_is_judged_by_reconciles_not_by_last_update() {
    let guide = read_guide();
    assert!(
        heading_anchors(&guide).contains(LIVENESS),
        "{GUIDE} lost its section #{LIVENESS}"
    );
    let all = commands(&guide);
    let in_section: Vec<&Command> = all
        .iter()
        .filter(|c| c.section == "Is the controller alive?")
        .collect();
    assert!(
        in_section
            .iter()
            .any(|c| c.console && c.text.contains("controller_runtime_reconcile_total")),
        "the liveness check must count reconciles (a checked example reading controller_runtime_reconcile_total)"
    );
    let elsewhere: Vec<String> = all
        .iter()
        .filter(|c| c.section != "Is the controller alive?" && c.text.contains("lastUpdate"))
        .map(|c| format!("{GUIDE}:{}: {}", c.line, c.text))
        .collect();
    none_of(
        &elsewhere,
        "only the liveness section may read lastUpdate (to show it is no sign of life)",
    );
    let mut in_code = false;
    let mut section = String::new();
    for paragraph in guide.split("\n\n") {
        if paragraph.trim_start().starts_with('#') {
            section = paragraph.lines().next().unwrap_or_default().to_string();
        }
        if paragraph.matches("```").count() % 2 == 1 {
            in_code = !in_code;
        }
        if in_code
            || !paragraph.contains("lastUpdate")
            || section.contains("Is the controller alive?")
        {
            continue;
        }
        assert!(
            paragraph.contains(&format!("](#{LIVENESS})")),
            "{GUIDE}: a paragraph about lastUpdate that does not lead to #{LIVENESS}:\n{paragraph}"
        );
    }
}

/// Variables (`$TOKEN`, `$VWC`) are set before a command uses them: in the
/// same block for a ```console one (each runs in a shell of its own),
/// earlier in the guide for a ```sh one (the reader's shell). A token is
/// made for a ServiceAccount the guide created before.
#[test]
fn tokens_and_variables_exist_before_use() {
    let mut wrong = Vec::new();
    let mut set_anywhere: BTreeSet<&str> = BTreeSet::new();
    let mut service_accounts: BTreeSet<String> = BTreeSet::from(["default".to_string()]);
    let all = commands(&read_guide());
    for (i, c) in all.iter().enumerate() {
        for var in ["TOKEN", "VWC"] {
            if !c.text.contains(&format!("${var}")) && !c.text.contains(&format!("\"${var}\"")) {
                continue;
            }
            let set_before = |d: &&Command| d.text.contains(&format!("{var}="));
            let ok = if c.console {
                all[..i]
                    .iter()
                    .filter(|d| d.block == c.block)
                    .any(|d| set_before(&d))
            } else {
                set_anywhere.contains(var) || all[..i].iter().any(|d| set_before(&d))
            };
            if !ok && !c.text.contains(&format!("{var}=")) {
                wrong.push(format!(
                    "{GUIDE}:{}: ${var} used before it is set: {}",
                    c.line, c.text
                ));
            }
        }
        for var in ["TOKEN", "VWC"] {
            if c.text.contains(&format!("{var}=")) {
                set_anywhere.insert(var);
            }
        }
        if let Some(sa) = word_after(&c.text, "create serviceaccount ") {
            service_accounts.insert(sa);
        }
        if let Some(sa) = word_after(&c.text, "create token ")
            && !service_accounts.contains(&sa)
        {
            wrong.push(format!(
                "{GUIDE}:{}: a token for ServiceAccount {sa}, which the guide creates only later (or never): {}",
                c.line, c.text
            ));
        }
    }
    none_of(
        &wrong,
        "variables, tokens or ServiceAccounts used before the guide sets them up",
    );
}

/// The word after `prefix` in `text`, without closing punctuation.
fn word_after(text: &str, prefix: &str) -> Option<String> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let word = rest.split_whitespace().next()?;
    Some(word.trim_end_matches([')', '"', ';']).to_string())
}

/// A log holds lines that are not JSON (a crash's message, a refused flag):
/// `jq` on a log reads lines raw and skips what does not parse.
#[test]
fn log_filters_skip_lines_that_are_not_json() {
    let wrong: Vec<String> = commands(&read_guide())
        .into_iter()
        .filter(|c| c.text.contains(" logs ") && c.text.contains("| jq"))
        .filter(|c| {
            let jq = &c.text[c.text.find("| jq").unwrap_or(0)..];
            let flags: String = jq
                .split_whitespace()
                .skip(2)
                .take_while(|w| w.starts_with('-'))
                .collect();
            !(flags.contains('R') && jq.contains("fromjson?"))
        })
        .map(|c| format!("{GUIDE}:{}: {}", c.line, c.text))
        .collect();
    none_of(
        &wrong,
        "these jq filters stop at the first line of a log that is not JSON: use `jq -R 'fromjson? | ...'`",
    );
}
