//! What `--version` prints: the workspace version and the git revision the
//! binary was built from (see `shared/build.rs`).

/// Git revision (12 hex digits), `NMO_GIT_REVISION` as given to the build, or "unknown".
pub const GIT_REVISION: &str = env!("NMO_GIT_REVISION");

/// "0.1.0 (git 0123456789ab)"; clap prefixes the binary name.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("NMO_GIT_REVISION"),
    ")"
);
