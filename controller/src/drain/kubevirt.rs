//! KubeVirt: a live-migratable VM's virt-launcher pod is answered 429 and
//! KubeVirt starts a live migration; the pod leaves once the VM runs
//! elsewhere. Such a pod is [`super::PodOutcome::Migrating`], progress
//! rather than a blocker, until the migration has run longer than
//! `--migration-warning-after` (see [`Migrations`]).

use shared::rules::sync::LockExt;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Label KubeVirt puts on the pod that runs a VM.
const VIRT_LAUNCHER_LABEL: (&str, &str) = ("kubevirt.io", "virt-launcher");

/// KubeVirt's eviction webhook (virt-api, pod-eviction-admitter) answers 429
/// with `Eviction triggered evacuation of VMI "<ns>/<name>"` when it starts a
/// live migration, and with `Evacuation in progress: ` before the same words
/// while it runs. The API server wraps either as `admission webhook
/// "virt-launcher-eviction-interceptor.kubevirt.io" denied the request: ...`.
const KUBEVIRT_EVACUATION: &str = "Eviction triggered evacuation of VMI";
const KUBEVIRT_EVACUATION_IN_PROGRESS: &str = "Evacuation in progress";
/// Its 429 for a virt-launcher pod on another node than its VM: the target
/// pod of a live migration under way.
const KUBEVIRT_MIGRATION_TARGET: &str = "Eviction request for target Pod";
/// KubeVirt's own PodDisruptionBudgets (generateName) guard a VM while it
/// migrates; older KubeVirt lets the eviction through its webhook once the
/// migration is started and leaves the "not now" to them.
const KUBEVIRT_PDB: &str = "kubevirt-disruption-budget-";

/// Whether the pod runs a KubeVirt VM (label `kubevirt.io=virt-launcher`).
pub fn is_virt_launcher(pod: &ObjectMeta) -> bool {
    pod.labels
        .as_ref()
        .and_then(|l| l.get(VIRT_LAUNCHER_LABEL.0))
        .map(String::as_str)
        == Some(VIRT_LAUNCHER_LABEL.1)
}

/// Whether a 429 with `message` (the API server's message and causes) to the
/// eviction of a pod is KubeVirt live-migrating the pod's VM away: KubeVirt's
/// own words, or, for a virt-launcher pod, its "in progress" and migration
/// target answers or one of its PodDisruptionBudgets.
pub fn is_kubevirt_evacuation(virt_launcher: bool, message: &str) -> bool {
    message.contains(KUBEVIRT_EVACUATION)
        || (virt_launcher
            && [
                KUBEVIRT_EVACUATION_IN_PROGRESS,
                KUBEVIRT_MIGRATION_TARGET,
                KUBEVIRT_PDB,
            ]
            .iter()
            .any(|w| message.contains(w)))
}

/// `nmo-controller --migration-warning-after`'s default.
pub const DEFAULT_MIGRATION_WARNING_AFTER: Duration = Duration::from_secs(10 * 60);

/// Since when KubeVirt has been migrating each pod's VM, as seen by this
/// process: the time of its first evacuation answer for the pod, by pod uid.
///
/// Neither the pod nor the eviction answer says when the migration began
/// (that is on KubeVirt's VirtualMachineInstanceMigration, which the
/// controller is not allowed to read), so the drain remembers it across
/// rounds. An entry goes when the pod's eviction is answered otherwise
/// (accepted, gone, terminating, a real blocker) and, for a pod that went
/// away (its uid is never seen again), after [`Migrations::STALE`] without a
/// round asking. A restarted or new leader starts the clock again: a warning
/// may come late, never early.
#[derive(Debug, Default)]
pub(super) struct Migrations {
    seen: Mutex<HashMap<String, Seen>>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    first: Instant,
    last: Instant,
}

impl Migrations {
    /// Entries no round asked about for this long are dropped.
    pub const STALE: Duration = Duration::from_secs(60 * 60);

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.seen.locked()
    }

    /// KubeVirt answered "evacuation" for pod `uid` at `now`: how long since
    /// its first such answer (zero the first time).
    pub fn observe(&self, uid: &str, now: Instant) -> Duration {
        let mut seen = self.entries();
        seen.retain(|_, s| now.saturating_duration_since(s.last) < Self::STALE);
        let entry = seen.entry(uid.to_string()).or_insert(Seen {
            first: now,
            last: now,
        });
        entry.last = now;
        now.saturating_duration_since(entry.first)
    }

    /// The pod's eviction was answered otherwise: its migration is over.
    pub fn forget(&self, uid: &str) {
        self.entries().remove(uid);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries().len()
    }
}
