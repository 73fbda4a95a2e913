//! Embeds the git revision as `NMO_GIT_REVISION` for `--version`.
//!
//! `NMO_GIT_REVISION` from the environment wins (image builds from a tree
//! without `.git` pass it); else `git rev-parse --short=12 HEAD`; else
//! "unknown". Nothing time-dependent is embedded, so builds of one revision
//! are identical. No `.git` (or no git) never fails the build.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NMO_GIT_REVISION");
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let dir = Path::new(&dir);

    let from_env = std::env::var("NMO_GIT_REVISION")
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty());
    let revision = match from_env {
        Some(v) => v,
        None => {
            // Rerun when HEAD moves: a checkout changes HEAD, a commit changes
            // the branch ref (loose or packed). Only existing files are
            // watched: cargo reruns every build for a missing one.
            let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
            if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
                watched.push(r);
            }
            for name in watched {
                if let Some(p) = git(
                    dir,
                    &["rev-parse", "--path-format=absolute", "--git-path", &name],
                ) {
                    if Path::new(&p).exists() {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
            }
            git(dir, &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=NMO_GIT_REVISION={revision}");
}
