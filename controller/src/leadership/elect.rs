//! The election loop against the API server: one look at the Lease per retry
//! period (GET, then a create or a patch guarded by its resourceVersion, so
//! two replicas never both win a term), the decisions taken in [`decide`].

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::decide::{self, Claim, Observed, Standing, Timing};

/// Whom to elect and where.
pub(super) struct Elector {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub timing: Timing,
}

/// What this replica knows of the Lease across looks.
#[derive(Default)]
struct Term {
    /// The Lease as last read, with its first sighting.
    seen: Option<Observed>,
    /// When our last successful write started (None: not leading).
    renewed: Option<Duration>,
    /// The last foreign holder reported, to report each one once.
    last_holder: Option<String>,
}

/// What one look at the Lease came to.
#[derive(Debug, PartialEq, Eq)]
enum Look {
    /// We hold it (created, taken or renewed just now).
    Holding,
    /// Someone else does.
    Held(String),
    /// Another replica wrote the Lease between our read and our write: look again.
    Raced,
}

impl Elector {
    /// Publish each change of leadership until stopped (then release the
    /// Lease if held) or until leadership is lost (then end without a word
    /// to the API server: `Leadership::lost` sees the channel close).
    pub async fn run(self, tx: watch::Sender<bool>, stop: CancellationToken) {
        let start = Instant::now();
        let mut term = Term::default();
        loop {
            let now = start.elapsed();
            let standing = decide::standing(term.renewed, self.timing, now);
            if standing == Standing::Lapsed {
                tracing::error!(lease = %self.name, "leader election: Lease not renewed for {:?}; giving leadership up", self.timing.renew_deadline);
                tx.send_replace(false);
                return;
            }
            let budget = decide::attempt_budget(standing, self.timing, now);
            let look = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                look = tokio::time::timeout(budget, self.look(&mut term.seen, start)) => look,
            };
            let look = look.unwrap_or_else(|_| {
                Err(kube::Error::Service(
                    format!("no answer within {budget:?}").into(),
                ))
            });
            if !self.took(look, now, &mut term, &tx) {
                return;
            }
            let now = start.elapsed();
            let standing = decide::standing(term.renewed, self.timing, now);
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(decide::pause(standing, self.timing, now)) => {}
            }
        }
        if term.renewed.is_some() {
            self.release().await;
        }
    }

    /// Take in what the look that started at `now` found; false when
    /// leadership is lost to another replica.
    fn took(
        &self,
        look: kube::Result<Look>,
        now: Duration,
        term: &mut Term,
        tx: &watch::Sender<bool>,
    ) -> bool {
        match look {
            Ok(Look::Holding) => {
                term.renewed = Some(now);
                tx.send_if_modified(|leading| !std::mem::replace(leading, true));
            }
            Ok(Look::Held(holder)) if term.renewed.is_some() => {
                tracing::error!(lease = %self.name, %holder, "leader election: the Lease is held by another replica; giving leadership up");
                tx.send_replace(false);
                return false;
            }
            Ok(Look::Held(holder)) => {
                if term.last_holder.as_deref() != Some(&holder) {
                    tracing::info!(lease = %self.name, %holder, "leader election: the Lease is held by another replica; standing by");
                    term.last_holder = Some(holder);
                }
            }
            Ok(Look::Raced) => {
                tracing::debug!(lease = %self.name, "leader election: the Lease changed meanwhile; looking again")
            }
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "leader election: the Lease could not be read or written; retrying")
            }
        }
        true
    }

    /// One look: read the Lease, then create, take or renew it, or note its holder.
    async fn look(&self, seen: &mut Option<Observed>, start: Instant) -> kube::Result<Look> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            *seen = None;
            return self.create().await;
        };
        let spec = lease.spec.unwrap_or_default();
        let now = start.elapsed();
        let observed = decide::observe(seen.take(), spec, now);
        let claim = decide::claim(Some(&observed), &self.identity, now);
        let spec = observed.spec.clone();
        *seen = Some(observed);
        if let Claim::HeldBy(holder) = claim {
            return Ok(Look::Held(holder));
        }
        let written = decide::written(
            Some(&spec),
            &self.identity,
            &claim,
            self.timing,
            Timestamp::now(),
        );
        self.write(lease.metadata.resource_version, &written).await
    }

    async fn create(&self) -> kube::Result<Look> {
        let spec = decide::written(
            None,
            &self.identity,
            &Claim::Create,
            self.timing,
            Timestamp::now(),
        );
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Look::Holding),
            // Another replica created it first: look again next time.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Look::Raced),
            Err(e) => Err(e),
        }
    }

    /// Write `spec` if the Lease is still at `version`; a conflict means
    /// another replica wrote first.
    async fn write(&self, version: Option<String>, spec: &LeaseSpec) -> kube::Result<Look> {
        let patch = json!({"metadata": {"resourceVersion": version}, "spec": spec});
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Look::Holding),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Look::Raced),
            Err(e) => Err(e),
        }
    }

    /// Give our Lease up so a standby takes over at its next look.
    async fn release(&self) {
        let result = async {
            let Some(lease) = self.api.get_opt(&self.name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.unwrap_or_default();
            if decide::holder(&spec) != Some(self.identity.as_str()) {
                return Ok(false);
            }
            let released = decide::released(&spec, Timestamp::now());
            self.write(lease.metadata.resource_version, &released)
                .await
                .map(|l| l == Look::Holding)
        }
        .await;
        match result {
            Ok(true) => tracing::info!(lease = %self.name, "leader election Lease released"),
            Ok(false) => {
                tracing::info!(lease = %self.name, "leader election Lease not ours any more; nothing to release")
            }
            Err(e) => tracing::warn!(lease = %self.name, error = %e,
                "releasing the leader election Lease failed; the successor waits for it to expire"),
        }
    }
}
