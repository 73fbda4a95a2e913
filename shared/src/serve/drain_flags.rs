//! Drain flags both services take (issue 39): the controller acts on them,
//! the webhook warns with them, so both Deployments carry the same values.
//! Every flag also comes from the environment. Defaults change nothing.

use std::time::Duration;

use clap::Args;

use crate::serve::goflags::GoBoolFlag as _;

/// The label that tells cloud controllers (service controller) to take a
/// node out of external load balancers.
pub const EXCLUDE_FROM_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// On a node whose exclusion label a maintenance added: when (RFC 3339).
pub const EXCLUDED_AT_ANNOTATION: &str =
    "nodemaintenance.medik8s.io/excluded-from-load-balancers-at";

#[derive(Args, Debug, Clone, Default)]
pub struct DrainFlags {
    /// Shed traffic first: label a node taken by a maintenance
    /// node.kubernetes.io/exclude-from-external-load-balancers (removed when
    /// it is given back, unless it was there before) and wait
    /// --load-balancer-drain-delay before its first eviction.
    #[arg(long, env = "EXCLUDE_FROM_LOAD_BALANCERS", go_bool_default = false)]
    pub exclude_from_load_balancers: bool,

    /// With --exclude-from-load-balancers: how long the drain waits after the
    /// label is put on, before the first eviction (a Go duration: 30s, 2m),
    /// so the load balancers stop sending new connections and open ones end.
    #[arg(long, env = "LOAD_BALANCER_DRAIN_DELAY", default_value = "30s", value_parser = drain_delay)]
    pub load_balancer_drain_delay: Duration,
}

fn drain_delay(text: &str) -> Result<Duration, String> {
    crate::rules::duration::parse(text)
        .map_err(|e| format!("invalid --load-balancer-drain-delay {text:?}: {e}"))
}

impl DrainFlags {
    /// The wait before the first eviction, when traffic is shed first.
    pub fn shed_traffic(&self) -> Option<Duration> {
        self.exclude_from_load_balancers
            .then_some(self.load_balancer_drain_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::goflags::normalize;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        drain: DrainFlags,
    }

    fn parse(args: &[&str]) -> Result<DrainFlags, String> {
        let mut full = vec!["bin"];
        full.extend_from_slice(args);
        Cli::try_parse_from(normalize(full))
            .map(|c| c.drain)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn off_by_default_and_go_syntax() {
        assert_eq!(parse(&[]).expect("defaults").shed_traffic(), None);
        let on = parse(&["--exclude-from-load-balancers"]).expect("on");
        assert_eq!(on.shed_traffic(), Some(Duration::from_secs(30)));
        let custom = parse(&[
            "-exclude-from-load-balancers=true",
            "--load-balancer-drain-delay=2m",
        ])
        .expect("custom");
        assert_eq!(custom.shed_traffic(), Some(Duration::from_secs(120)));
        let bad = parse(&["--load-balancer-drain-delay=soon"]).expect_err("bad");
        assert!(bad.contains("--load-balancer-drain-delay"), "{bad}");
    }
}
