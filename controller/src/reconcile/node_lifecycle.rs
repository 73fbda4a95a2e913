//! The node lifecycle conditions of a pass, written after its status
//! (`plan::node_conditions` decides what they say). A stage is written
//! once per node: the node is read live only when the stage changes, and
//! the conditions go as a strategic merge patch of `status.conditions`,
//! merged by type, carrying only our types. A failed write never holds a
//! maintenance back: it is logged (a warning when its cause is new),
//! counted in `nmo_node_condition_write_errors_total`, and tried again on
//! the next pass.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use shared::NodeMaintenance;
use shared::rules::sync::LockExt;

use super::Ctx;
use crate::plan::node_conditions::{self, Stage};

/// What was last written (or failed) per node.
#[derive(Default)]
pub struct NodeSignals(Mutex<HashMap<String, Entry>>);

struct Entry {
    nm: String,
    stage: Option<Stage>,
    /// The last failure's words, so a repeated one is not warned again.
    failed: Option<String>,
}

impl NodeSignals {
    fn written(&self, node: &str, nm: &str, stage: Stage) -> bool {
        self.0
            .locked()
            .get(node)
            .is_some_and(|e| e.nm == nm && e.stage == Some(stage))
    }

    fn done(&self, node: &str, nm: &str, stage: Stage) {
        let mut m = self.0.locked();
        if stage == Stage::Ended {
            m.remove(node);
            return;
        }
        m.insert(
            node.to_string(),
            Entry {
                nm: nm.to_string(),
                stage: Some(stage),
                failed: None,
            },
        );
    }

    /// Record a failure; true when its words are new for this node.
    fn failed(&self, node: &str, nm: &str, error: &str) -> bool {
        let mut m = self.0.locked();
        let e = m.entry(node.to_string()).or_insert_with(|| Entry {
            nm: nm.to_string(),
            stage: None,
            failed: None,
        });
        let new = e.failed.as_deref() != Some(error);
        e.nm = nm.to_string();
        e.stage = None;
        e.failed = Some(error.to_string());
        new
    }

    /// Drop the nodes no maintenance in `named` names.
    pub fn retire_unnamed(&self, named: &std::collections::HashSet<String>) {
        self.0.locked().retain(|node, _| named.contains(node));
    }

    pub fn len(&self) -> usize {
        self.0.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Bring the conditions of `nm`'s node to `stage` (None: this pass says
/// nothing), unless `--node-lifecycle-conditions=false`.
pub(super) async fn sync(ctx: &Ctx, nm: &NodeMaintenance, stage: Option<Stage>) {
    let Some(stage) = stage else { return };
    if !ctx.node_lifecycle_conditions {
        return;
    }
    let (name, node) = (nm.name_any(), nm.spec.node_name.as_str());
    if ctx.node_signals.written(node, &name, stage) {
        return;
    }
    match write(ctx, node, &name, stage).await {
        Ok(()) => ctx.node_signals.done(node, &name, stage),
        Err(e) => {
            ctx.metrics.node_condition_write_failed(node);
            let error = e.to_string();
            if ctx.node_signals.failed(node, &name, &error) {
                tracing::warn!(nodemaintenance = %name, %node, %error, stage = ?stage,
                    "could not write the node lifecycle conditions (MaintenancePlanned, MaintenanceInProgress, \
                     DrainInProgress, Drained) on the node; the maintenance goes on and the write is retried. \
                     Check the controller's ClusterRole grants patch on nodes/status, or turn them off with \
                     --node-lifecycle-conditions=false");
            } else {
                tracing::debug!(nodemaintenance = %name, %node, %error, "node lifecycle conditions still not written");
            }
        }
    }
}

/// Read the node's conditions and patch those that differ (a node that
/// is gone has nothing to say).
async fn write(ctx: &Ctx, node: &str, nm: &str, stage: Stage) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let Some(current) = api.get_opt(node).await? else {
        return Ok(());
    };
    let conditions = current
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    let wants = node_conditions::wanted(stage, nm);
    let changes = node_conditions::changes(&conditions, &wants, &Time(ctx.clock.now()));
    if changes.is_empty() {
        return Ok(());
    }
    let body = json!({"status": {"conditions": changes}});
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(body))
        .await?;
    let said: Vec<String> = changes
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    tracing::debug!(nodemaintenance = %nm, %node, conditions = %said.join(","), "node lifecycle conditions written");
    Ok(())
}
