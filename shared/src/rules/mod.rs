//! Pure rules over plain data, no I/O: the medik8s lease rule, the etcd
//! quorum rule, maintenance slots, fleet gates and maintenance windows, drain
//! rules, Go
//! durations, node facts, and two small data helpers (an expiring cache, a
//! poison-tolerant lock).

pub mod drain;
pub mod duration;
pub mod gates;
pub mod lease;
pub mod nodes;
pub mod quorum;
pub mod slots;
pub mod sync;
pub mod ttl;
pub mod window;

#[cfg(test)]
mod tests {
    /// The rules stay pure: no file under src/rules (its tests aside) uses the kube client,
    /// the serving code or an async runtime (the watch types convert
    /// themselves into the rules' types; the alert source parses the wire).
    #[test]
    fn the_rules_import_no_kube_serve_or_runtime() {
        fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut all = Vec::new();
        files(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rules"),
            &mut all,
        );
        assert!(all.len() > 10, "the rules' files: {all:?}");
        let banned = [
            "crate::kube",
            "crate::serve",
            "use kube",
            "kube::",
            "tokio",
            "hyper",
            "axum",
        ];
        let mut found = Vec::new();
        for path in &all {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            // The code, not its unit tests (which may use a runtime).
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in code.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if let Some(b) = banned.iter().find(|b| code.contains(*b)) {
                    found.push(format!("{}:{}: {b}", path.display(), n + 1));
                }
            }
        }
        assert!(found.is_empty(), "the rules must stay pure: {found:#?}");
    }
}
