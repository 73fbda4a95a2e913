//! Leader election among controller replicas.
//!
//! Every replica watches and caches from the start, so a standby is Ready (a
//! rolling upgrade waits for the new pod's readiness) and takes over with warm
//! caches. Only the leader reconciles: `is_leading` is checked at the top of
//! every reconcile, and `acquired` fires once leadership is won so everything
//! in the cache is reconciled at that moment. A leader that cannot renew the
//! Lease within its renew deadline, or finds it held by another, exits (as
//! controller-runtime does) so two replicas never write at once; on SIGTERM
//! the Lease is released so the successor need not wait for it to expire.
//! The rules are in [`decide`], the loop against the API server in `elect`.

pub mod decide;
mod elect;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use decide::Timing;

/// Longest wait for the Lease release on shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "setting up leader election on Lease {namespace}/{name}: {source}; check the namespace exists and the controller's Role there allows get and patch on this Lease (by name) and create on leases; a different --leader-election-id needs its name in that Role"
    )]
    Setup {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("leader election timing of Lease {name}: {0}", name = .1)]
    Timing(String, String),
    #[error(
        "lost leadership of Lease {namespace}/{name}; exiting so that only the new leader writes"
    )]
    Lost { namespace: String, name: String },
}

/// Where and as whom to elect.
pub struct Settings {
    pub enabled: bool,
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub timing: Result<Timing, String>,
}

impl Settings {
    pub fn from_config(cfg: &crate::config::Config) -> Settings {
        Settings {
            enabled: cfg.leader_elect,
            namespace: cfg.leader_election_namespace.clone(),
            name: cfg.leader_election_id.clone(),
            identity: instance_name(),
            timing: Timing::new(
                cfg.leader_elect_lease_duration,
                cfg.leader_elect_renew_deadline,
                cfg.leader_elect_retry_period,
            ),
        }
    }
}

/// This replica's name: the pod's (POD_NAME, else HOSTNAME), else a
/// process-unique fallback. Holder of the leader Lease and events' reporter.
pub fn instance_name() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| format!("nmo-controller-{}", std::process::id()))
}

/// Shared view of this replica's leadership.
#[derive(Clone)]
pub struct Leadership {
    leading: Arc<AtomicBool>,
    /// `None` without leader election (always leading).
    changes: Option<watch::Receiver<bool>>,
    namespace: String,
    name: String,
}

/// Owns the election task; `release` gives the Lease up.
pub struct Election {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Leadership {
    /// Start electing (or, with leader election off, lead at once).
    pub async fn start(
        client: Client,
        cfg: &crate::config::Config,
        metrics: &Metrics,
    ) -> Result<(Leadership, Option<Election>), Error> {
        let settings = Settings::from_config(cfg);
        if !settings.enabled {
            metrics.leader(&settings.name, true);
            let l = Leadership {
                leading: Arc::new(AtomicBool::new(true)),
                changes: None,
                namespace: settings.namespace,
                name: settings.name,
            };
            return Ok((l, None));
        }
        metrics.leader(&settings.name, false);
        let timing = settings
            .timing
            .map_err(|e| Error::Timing(e, settings.name.clone()))?;
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        // One read first: a missing namespace or Role fails the start, named.
        if let Err(source) = api.get_opt(&settings.name).await {
            return Err(Error::Setup {
                namespace: settings.namespace,
                name: settings.name,
                source,
            });
        }
        let (tx, channel) = watch::channel(false);
        let stop = CancellationToken::new();
        let elector = elect::Elector {
            api,
            name: settings.name.clone(),
            identity: settings.identity.clone(),
            timing,
        };
        let task = tokio::spawn(elector.run(tx, stop.clone()));
        tracing::info!(lease = %format!("{}/{}", settings.namespace, settings.name),
            identity = %settings.identity, "waiting to become leader (standby replicas are Ready and keep their caches warm)");
        let l = Leadership {
            leading: Arc::new(AtomicBool::new(false)),
            changes: Some(channel.clone()),
            namespace: settings.namespace,
            name: settings.name,
        };
        Ok((l, Some(Election { stop, task })))
    }

    /// Whether this replica may reconcile now.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Yields once each time leadership is won (never without leader election).
    /// `is_leading` is already true when it yields, so an object that reaches
    /// the cache afterwards is reconciled through its own watch event.
    pub fn acquired(&self, metrics: Metrics) -> impl Stream<Item = ()> + Send + 'static {
        let leading = self.leading.clone();
        let changes = self.changes.clone();
        let name = self.name.clone();
        futures::stream::unfold((changes, leading, false), move |(changes, leading, was)| {
            let (metrics, name) = (metrics.clone(), name.clone());
            async move {
                let mut rx = changes?;
                loop {
                    let now = *rx.borrow_and_update();
                    if now && !was {
                        leading.store(true, Ordering::SeqCst);
                        metrics.leader(&name, true);
                        tracing::info!(lease = %name, "became leader: reconciling every NodeMaintenance");
                        return Some(((), (Some(rx), leading, true)));
                    }
                    if !now && was {
                        // Lost: stop reconciling at once; `lost` ends the process.
                        leading.store(false, Ordering::SeqCst);
                        metrics.leader(&name, false);
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            }
        })
    }

    /// Resolves when a replica that led loses the Lease (never otherwise).
    pub async fn lost(&self) -> Error {
        let lost = Error::Lost {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        };
        let Some(mut rx) = self.changes.clone() else {
            return std::future::pending().await;
        };
        let mut led = *rx.borrow_and_update();
        loop {
            if rx.changed().await.is_err() {
                // The election task ended: without it nothing renews the Lease.
                if led {
                    return lost;
                }
                return std::future::pending().await;
            }
            let now = *rx.borrow_and_update();
            if led && !now {
                return lost;
            }
            led = now;
        }
    }
}

impl Election {
    /// Give the Lease up (if held) so a successor takes over at once.
    pub async fn release(self) {
        self.stop.cancel();
        match tokio::time::timeout(RELEASE_TIMEOUT, self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "leader election task failed"),
            Err(_) => tracing::warn!(
                "releasing the leader election Lease took longer than {RELEASE_TIMEOUT:?}; the successor waits for it to expire"
            ),
        }
    }
}
