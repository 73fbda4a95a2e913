//! The node lifecycle conditions of a pass, written after its status
//! (`plan::node_conditions` decides what they say). A stage is written
//! once per node, as a strategic merge patch of `status.conditions`,
//! merged by type, carrying only our types. The node is not read for it:
//! the conditions of our four types are remembered from the node's last
//! live read (the reconcile's, when it first needed the node) and from
//! each patch's answer; only a node nothing is known of is read first. A
//! failed write never holds a maintenance back: it is logged (a warning
//! when its cause is new), counted in `nmo_node_condition_write_errors_total`,
//! and tried again on the next pass, from a fresh read.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Node, NodeCondition};
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

#[derive(Default)]
struct Entry {
    /// The maintenance and the stage last written for it.
    written: Option<(String, Stage)>,
    /// The last failure's words, so a repeated one is not warned again.
    failed: Option<String>,
    /// The node's conditions of our four types, as last read or written.
    known: Option<Vec<NodeCondition>>,
}

/// The conditions of `node` of the four lifecycle types.
fn lifecycle_conditions(node: &Node) -> Vec<NodeCondition> {
    let all = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    all.into_iter()
        .flatten()
        .filter(|c| node_conditions::TYPES.contains(&c.type_.as_str()))
        .cloned()
        .collect()
}

impl NodeSignals {
    fn written(&self, node: &str, nm: &str, stage: Stage) -> bool {
        self.0
            .locked()
            .get(node)
            .and_then(|e| e.written.as_ref())
            .is_some_and(|(n, s)| n == nm && *s == stage)
    }

    /// `node` as read live (or as our patch returned it): its lifecycle
    /// conditions are known from here on.
    pub fn read(&self, node: &Node) {
        let name = node.name_any();
        let mut m = self.0.locked();
        m.entry(name).or_default().known = Some(lifecycle_conditions(node));
    }

    fn known(&self, node: &str) -> Option<Vec<NodeCondition>> {
        self.0.locked().get(node).and_then(|e| e.known.clone())
    }

    fn done(&self, node: &str, nm: &str, stage: Stage) {
        let mut m = self.0.locked();
        if stage == Stage::Ended {
            m.remove(node);
            return;
        }
        let e = m.entry(node.to_string()).or_default();
        e.written = Some((nm.to_string(), stage));
        e.failed = None;
    }

    /// Record a failure (what was known is dropped: the retry reads the
    /// node); true when its words are new for this node.
    fn failed(&self, node: &str, error: &str) -> bool {
        let mut m = self.0.locked();
        let e = m.entry(node.to_string()).or_default();
        let new = e.failed.as_deref() != Some(error);
        e.written = None;
        e.known = None;
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
            if ctx.node_signals.failed(node, &error) {
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

/// Patch the conditions of `node` that differ from what `stage` wants
/// (a node that is gone has nothing to say).
async fn write(ctx: &Ctx, node: &str, nm: &str, stage: Stage) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let conditions = match ctx.node_signals.known(node) {
        Some(known) => known,
        None => match api.get_opt(node).await? {
            Some(current) => lifecycle_conditions(&current),
            None => return Ok(()),
        },
    };
    let wants = node_conditions::wanted(stage, nm);
    let changes = node_conditions::changes(&conditions, &wants, &Time(ctx.clock.now()));
    if changes.is_empty() {
        return Ok(());
    }
    let body = json!({"status": {"conditions": changes}});
    let written = match api
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(body))
        .await
    {
        Ok(written) => written,
        // Gone since it was last read: nothing to say on it.
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(e),
    };
    ctx.node_signals.read(&written);
    // Its echo wakes no reconcile (only while the node is cached: a given
    // back node is not taken back into the cache).
    ctx.node_cache.wrote_if_cached(&written);
    let said: Vec<String> = changes
        .iter()
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    tracing::debug!(nodemaintenance = %nm, %node, conditions = %said.join(","), "node lifecycle conditions written");
    Ok(())
}
