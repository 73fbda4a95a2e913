//! Command line of the controller, in Go's flag syntax (upstream's Deployment
//! arguments work as they are). Every flag can also come from the environment.

use std::time::Duration;

use clap::Parser;
use shared::api::consts::LEADER_ELECTION_LEASE_NAME;
use shared::serve::gate_flags::GateFlags;
use shared::serve::goflags::GoBoolFlag as _;
use shared::serve::telemetry::RuntimeFlags;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "nmo-controller",
    version = shared::api::version::VERSION,
    args_override_self = true,
    about = "Reconciles NodeMaintenance objects: takes the node's medik8s lease, excludes it from \
             remediation, cordons and taints it, drains it through the Eviction API, and gives it \
             back when the NodeMaintenance is deleted."
)]
pub struct Config {
    #[command(flatten)]
    pub runtime: RuntimeFlags,

    /// Elect a leader among replicas through a Lease; only the leader reconciles and writes status.
    #[arg(long, env = "LEADER_ELECT", go_bool_default = false)]
    pub leader_elect: bool,

    /// Name of the leader election Lease (upstream's name, so an upgrade never runs two leaders).
    #[arg(long, env = "LEADER_ELECTION_ID", default_value = LEADER_ELECTION_LEASE_NAME)]
    pub leader_election_id: String,

    /// Namespace of the leader election Lease. Default: OPERATOR_NAMESPACE, else
    /// POD_NAMESPACE, else the service account's namespace, else nmo-system.
    #[arg(long, default_value_t = shared::kube::namespace::operator_namespace())]
    pub leader_election_namespace: String,

    /// How long standbys wait, after the last change of the leader election
    /// Lease they saw, before taking it over (controller-runtime's 15s).
    /// Go duration syntax, whole seconds.
    #[arg(long, env = "LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = positive_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps leading without renewing the Lease; then it
    /// exits (controller-runtime's 10s). Shorter than the lease duration. A
    /// cluster with one API server whose restarts take longer may raise both.
    #[arg(long, env = "LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = positive_duration)]
    pub leader_elect_renew_deadline: Duration,

    /// How often every replica looks at the Lease, and the leader renews it
    /// (controller-runtime's 2s). Shorter than the renew deadline.
    #[arg(long, env = "LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = positive_duration)]
    pub leader_elect_retry_period: Duration,

    /// At most this many nodes are in maintenance at once; the others wait in creation order
    /// with phase Pending. 0 means no limit (upstream's behaviour).
    #[arg(long, env = "MAX_CONCURRENT_MAINTENANCES", default_value_t = 1)]
    pub max_concurrent_maintenances: usize,

    /// Eviction requests in flight at once per NodeMaintenance.
    #[arg(long, env = "MAX_CONCURRENT_EVICTIONS", default_value_t = 32)]
    pub max_concurrent_evictions: usize,

    /// Only handle NodeMaintenances whose labels match this selector (e.g. "shard=a").
    /// Empty handles all. Slots are counted among the matching ones.
    #[arg(long, env = "NODEMAINTENANCE_SELECTOR", default_value = "")]
    pub nodemaintenance_selector: String,

    /// Namespace of the per-node medik8s leases (upstream reads LEASE_NAMESPACE).
    #[arg(long, env = "LEASE_NAMESPACE", default_value = shared::api::consts::LEASE_NAMESPACE_DEFAULT)]
    pub lease_namespace: String,

    /// How soon a blocked drain (PodDisruptionBudget, eviction webhook, a
    /// foreign lease) or a failed reconcile retries on its own (upstream's 5s).
    /// A PDB that starts allowing a disruption, or a pod leaving a node under
    /// maintenance, retries a drain at once anyway; this is the backstop.
    /// Go duration syntax: 5s, 500ms, 1m.
    #[arg(long, env = "BLOCKED_RETRY_INTERVAL", default_value = "5s", value_parser = positive_duration)]
    pub blocked_retry_interval: Duration,

    /// Let a NodeMaintenance with `drainTimeoutAction: Force` delete the pods
    /// still on its node once its drainTimeout passed (PodDisruptionBudgets
    /// bypassed). Off (the default): such a maintenance fails at its deadline
    /// as with Fail, naming this flag. A cluster admin's choice: set by
    /// manifests/components/force-drain, which also grants delete on pods.
    #[arg(long, env = "ALLOW_FORCE_DRAIN", go_bool_default = false)]
    pub allow_force_drain: bool,

    /// A KubeVirt VM being live-migrated off the node (KubeVirt answered the
    /// eviction of its virt-launcher pod with "evacuation") is drain progress,
    /// not a blocker, until the migration has run this long; then lastError
    /// names the pod. Go duration syntax: 10m, 1h30m.
    #[arg(long, env = "MIGRATION_WARNING_AFTER", default_value = "10m", value_parser = positive_duration)]
    pub migration_warning_after: Duration,

    /// Write the KEP-5683 node lifecycle conditions (MaintenancePlanned,
    /// MaintenanceInProgress, DrainInProgress, Drained) on the Node of each
    /// maintenance, merged by type; needs patch on nodes/status. A failed
    /// write never holds a maintenance back. `=false` turns them off.
    #[arg(long, env = "NODE_LIFECYCLE_CONDITIONS", go_bool_default = true)]
    pub node_lifecycle_conditions: bool,

    /// The fleet gates (shared with the webhook, which warns with them).
    #[command(flatten)]
    pub gates: GateFlags,

    /// Drain flags (shared with the webhook, which warns with them).
    #[command(flatten)]
    pub drain: shared::serve::drain_flags::DrainFlags,
}

/// A duration in Go's syntax ("5s", "500ms", "1m30s"), above zero.
fn positive_duration(value: &str) -> Result<Duration, String> {
    let d = shared::rules::duration::parse(value)?;
    if d.is_zero() {
        return Err(format!("invalid duration {value:?}: must be above zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::serve::goflags::normalize;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        let mut full = vec!["nmo-controller"];
        full.extend_from_slice(args);
        Config::try_parse_from(normalize(full))
    }

    #[test]
    fn upstream_deployment_arguments_parse() {
        let c = parse(&[
            "--leader-elect",
            "--enable-http2=false",
            "--metrics-bind-address=:8443",
            "--health-probe-bind-address=:8081",
        ])
        .expect("upstream's exact argument list");
        assert!(c.leader_elect);
        assert!(!c.runtime.enable_http2);
        assert_eq!(c.runtime.metrics_bind_address, ":8443");
        assert_eq!(c.runtime.health_probe_bind_address, ":8081");
    }

    #[test]
    fn go_flag_spellings() {
        let c = parse(&[
            "-leader-elect=true",
            "-enable-http2",
            "-metrics-bind-address",
            "0",
        ])
        .expect("single dash");
        assert!(c.leader_elect && c.runtime.enable_http2);
        assert_eq!(c.runtime.metrics_bind_address, "0");
        assert!(
            !parse(&["--leader-elect=false"])
                .expect("=false")
                .leader_elect
        );
        assert!(!parse(&[]).expect("defaults").leader_elect);
        let c = parse(&[
            "--leader-elect",
            "--leader-elect=F",
            "--max-concurrent-maintenances=2",
            "--max-concurrent-maintenances=3",
        ])
        .expect("repeated flags");
        assert!(!c.leader_elect, "the last occurrence wins");
        assert_eq!(c.max_concurrent_maintenances, 3);
        let c = parse(&[
            "--zap-log-level=debug",
            "--zap-devel",
            "--zap-encoder=console",
            "--zap-stacktrace-level=error",
            "--zap-time-encoding=iso8601",
        ])
        .expect("zap flags");
        assert!(c.runtime.log.zap_devel);
        let err = parse(&["--leader-elect=yes"])
            .expect_err("not a Go bool")
            .to_string();
        assert!(err.contains("--leader-elect"), "{err}");
    }

    #[test]
    fn blocked_retry_interval() {
        let d = |args: &[&str]| parse(args).map(|c| c.blocked_retry_interval);
        assert_eq!(
            d(&[]).expect("default"),
            Duration::from_secs(5),
            "upstream's"
        );
        assert_eq!(
            d(&["--blocked-retry-interval=60s"]).expect("60s"),
            Duration::from_secs(60)
        );
        assert_eq!(
            d(&["-blocked-retry-interval", "1m30s"]).expect("1m30s"),
            Duration::from_secs(90)
        );
        assert_eq!(
            d(&["--blocked-retry-interval=500ms"]).expect("500ms"),
            Duration::from_millis(500)
        );
        for bad in ["0s", "-5s", "5", "soon"] {
            let err = d(&[&format!("--blocked-retry-interval={bad}")])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("--blocked-retry-interval"), "{bad}: {err}");
        }
    }

    #[test]
    fn migration_warning_after() {
        let d = |args: &[&str]| parse(args).map(|c| c.migration_warning_after);
        assert_eq!(
            d(&[]).expect("default"),
            crate::drain::DEFAULT_MIGRATION_WARNING_AFTER
        );
        assert_eq!(
            d(&["--migration-warning-after=1h30m"]).expect("1h30m"),
            Duration::from_secs(90 * 60)
        );
        for bad in ["0s", "10", "later"] {
            let err = d(&[&format!("--migration-warning-after={bad}")])
                .expect_err(bad)
                .to_string();
            assert!(err.contains("--migration-warning-after"), "{bad}: {err}");
        }
    }

    #[test]
    fn version_names_the_git_revision() {
        let err = parse(&["--version"]).expect_err("--version exits");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayVersion);
        let text = err.to_string();
        assert!(
            text.starts_with("nmo-controller 0.") && text.contains("(git "),
            "{text}"
        );
    }
}
