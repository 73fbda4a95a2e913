//! The reconciler's writes of objects' metadata and nodes: each checked
//! against the version read (a stale copy gets a conflict and the pass is
//! decided again on a fresh read), each remembered for read-your-writes.

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use shared::NodeMaintenance;

use super::error::node_patch_error;
use super::{Ctx, Error};

/// Write the finalizer list, checked against the version we read.
pub(super) async fn set_finalizers(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    finalizers: Vec<String>,
) -> Result<NodeMaintenance, Error> {
    let field = json!({ "finalizers": finalizers });
    patch_metadata(ctx, nm, field, "update the finalizer of").await
}

/// Merge `fields` into the metadata of `nm`, checked against the version we
/// read, and remember the version written (read-your-writes).
pub(super) async fn patch_metadata(
    ctx: &Ctx,
    nm: &NodeMaintenance,
    mut fields: Value,
    action: &'static str,
) -> Result<NodeMaintenance, Error> {
    let name = nm.name_any();
    let based_on = nm.metadata.resource_version.clone();
    fields["resourceVersion"] = json!(based_on);
    let mut written = ctx
        .nms()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": fields })),
        )
        .await
        .map_err(|source| Error::NodeMaintenance {
            action,
            name: name.clone(),
            source,
        })?;
    shared::kube::partial::forget_managed_fields(&mut written.metadata);
    ctx.wrote(&name, based_on.as_deref(), &written);
    Ok(written)
}

/// Apply the JSON patch `ops` (which opens with a `test` of what we read)
/// to `node`; the node cache follows the answer.
pub(super) async fn patch_node(
    ctx: &Ctx,
    node: &str,
    ops: Vec<Value>,
    action: &'static str,
) -> Result<(), Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(|e| Error::Node {
            action,
            node: node.to_string(),
            source: kube::Error::SerdeError(e),
        })?;
    let result = ctx
        .nodes()
        .patch(node, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await;
    match &result {
        Ok(written) => ctx.node_cache.wrote(written),
        // Whatever went wrong, the next attempt starts from a live read.
        Err(_) => ctx.node_cache.forget(node),
    }
    result
        .map(|_| ())
        .map_err(|source| node_patch_error(node, action, source))
}
