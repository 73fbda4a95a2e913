//! Leader election among controller replicas.
//!
//! Every replica watches and caches from the start, so a standby is Ready (a
//! rolling upgrade waits for the new pod's readiness) and takes over with warm
//! caches. Only the leader reconciles: `is_leading` is checked at the top of
//! every reconcile, and `acquired` fires once leadership is won so everything
//! in the cache is reconciled at that moment. A leader that loses the Lease
//! exits (as controller-runtime does) so two replicas never write at once; on
//! SIGTERM the Lease is released so the successor need not wait for it to expire.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::Stream;
use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Lease duration and renewal margin (controller-runtime's defaults: 15 s lease).
const LEASE_DURATION_SECS: u64 = 15;
const LEASE_GRACE_SECS: u64 = 5;
/// A leader that could not renew for this long steps down (the Lease may have
/// expired for the others by then).
const RENEW_DEADLINE: Duration = Duration::from_secs(LEASE_DURATION_SECS - LEASE_GRACE_SECS);
/// How often a standby looks at the Lease (controller-runtime's retry period).
/// Left alone, the lease manager trusts its cached copy until the holder's
/// term ends, so a released Lease (rolling upgrade) would wait out its term.
const RETRY_PERIOD: Duration = Duration::from_secs(2);
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
        source: kube_lease_manager::LeaseManagerError,
    },
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
}

impl Settings {
    pub fn from_config(cfg: &crate::config::Config) -> Settings {
        Settings {
            enabled: cfg.leader_elect,
            namespace: cfg.leader_election_namespace.clone(),
            name: cfg.leader_election_id.clone(),
            identity: instance_name(),
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
        let factory = Factory {
            client,
            namespace: settings.namespace.clone(),
            name: settings.name.clone(),
            identity: settings.identity.clone(),
        };
        let manager = factory.build().await.map_err(|source| Error::Setup {
            namespace: settings.namespace.clone(),
            name: settings.name.clone(),
            source,
        })?;
        let (tx, channel) = watch::channel(false);
        let stop = CancellationToken::new();
        let task = tokio::spawn(elect(factory, manager, tx, stop.clone()));
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

/// The election loop: publish each change of leadership until stopped, then
/// release the Lease if held. API errors are retried with a capped backoff;
/// the manager itself stops renewing when it cannot, so a leader cut off from
/// the API server loses the Lease when it expires, as everyone else sees it.
async fn elect(
    factory: Factory,
    mut manager: LeaseManager,
    tx: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(500);
    let mut failing_since: Option<Instant> = None;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            changed = next_change(&manager, *tx.borrow()) => match changed {
                // A standby's look again: a fresh manager reads the Lease anew
                // (one GET), so a released or expired Lease is taken at once.
                None => match factory.build().await {
                    Ok(fresh) => manager = fresh,
                    Err(e) => tracing::warn!(error = %e, "leader election: reading the Lease failed; retrying"),
                },
                Some(Ok(leading)) => {
                    backoff = Duration::from_millis(500);
                    failing_since = None;
                    tx.send_replace(leading);
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "leader election: the Lease could not be read or renewed; retrying");
                    // A leader that cannot renew within the deadline must assume
                    // a standby took over (controller-runtime's renew deadline).
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if *tx.borrow() && since.elapsed() >= RENEW_DEADLINE {
                        tracing::error!("leader election: Lease not renewed for {RENEW_DEADLINE:?}; giving leadership up");
                        tx.send_replace(false);
                    }
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            },
        }
    }
    match manager.release().await {
        Ok(()) => tracing::info!("leader election Lease released (if it was held)"),
        Err(e) => tracing::warn!(error = %e,
            "releasing the leader election Lease failed; the successor waits for it to expire"),
    }
}

/// Builds lease managers for one Lease and identity.
struct Factory {
    client: Client,
    namespace: String,
    name: String,
    identity: String,
}

impl Factory {
    /// A manager with the Lease's current state (read, or created when missing).
    async fn build(&self) -> kube_lease_manager::Result<LeaseManager> {
        LeaseManagerBuilder::new(self.client.clone(), &self.name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(LEASE_DURATION_SECS)
            .with_grace(LEASE_GRACE_SECS)
            .build()
            .await
    }
}

/// The next change of leadership; a standby gives up waiting after
/// `RETRY_PERIOD` (None) so the caller looks again and sees a released Lease.
async fn next_change(
    manager: &LeaseManager,
    leading: bool,
) -> Option<kube_lease_manager::Result<bool>> {
    if leading {
        return Some(manager.changed().await);
    }
    tokio::time::timeout(RETRY_PERIOD, manager.changed())
        .await
        .ok()
}
