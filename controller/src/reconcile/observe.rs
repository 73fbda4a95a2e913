//! Observe: read what one pass decides on, once, into an [`Observed`]: the
//! maintenance (the live copy when a cleanup may already be over), its
//! turn (decided by [`super::admit`] from the caches), and its node when
//! the pass needs it. The node is read once, when the finalizer is added
//! (its owner reference goes in the same write), and then comes from the
//! node cache: a queue of waiting maintenances costs no API requests.
//! The node's pods are listed by the steps that act on them (the drain round
//! lists after the cordon, so Succeeded rests on a list taken after it).

use kube::ResourceExt;
use shared::NodeMaintenance;
use shared::api::consts::FINALIZER;

use super::{Ctx, Error};
use crate::plan::{Admission, Lifecycle, NodeSeen, Observed};

pub(super) async fn observe(mut nm: NodeMaintenance, ctx: &Ctx) -> Result<Observed, Error> {
    // A live read carries them; the copy is held for the whole pass.
    shared::kube::partial::forget_managed_fields(&mut nm.metadata);
    let lifecycle = Observed::lifecycle_of(&nm);
    if lifecycle == Lifecycle::Cleanup {
        return Ok(match cleanup_due(&nm, ctx).await? {
            Some(live) => with_node(observed(live, lifecycle, ctx), ctx).await?,
            None => observed(nm, Lifecycle::Done, ctx),
        });
    }
    let mut seen = observed(nm, lifecycle, ctx);
    if lifecycle == Lifecycle::Apply {
        seen = super::admit::admit(seen, ctx).await;
    }
    with_node(seen, ctx).await
}

/// `seen` with its node, when the pass needs it. A new maintenance is not
/// held back by a failed read: its owner reference then comes later.
async fn with_node(mut seen: Observed, ctx: &Ctx) -> Result<Observed, Error> {
    if seen.needs_node() {
        seen.node = match ctx.read_node(&seen.nm.spec.node_name).await {
            Ok(Some(node)) => NodeSeen::Present(Box::new(node)),
            Ok(None) => NodeSeen::Gone,
            Err(_) if seen.lifecycle == Lifecycle::AddFinalizer => NodeSeen::NotRead,
            Err(e) => return Err(e),
        };
    }
    Ok(seen)
}

fn observed(nm: NodeMaintenance, lifecycle: Lifecycle, ctx: &Ctx) -> Observed {
    Observed {
        nm,
        lifecycle,
        admission: Admission::Final,
        node: NodeSeen::NotRead,
        now: ctx.clock.now(),
    }
}

/// The live object of a deleted maintenance whose cleanup is still due. The
/// cache can hand us an object whose cleanup already finished (our own node
/// patch re-queues it); a later maintenance of the same node may hold the
/// node by now. Only the live object says whether this cleanup is due.
async fn cleanup_due(nm: &NodeMaintenance, ctx: &Ctx) -> Result<Option<NodeMaintenance>, Error> {
    Ok(match ctx.read_live(&nm.name_any()).await? {
        Some(mut live)
            if live.metadata.uid == nm.metadata.uid
                && live.finalizers().iter().any(|f| f == FINALIZER) =>
        {
            shared::kube::partial::forget_managed_fields(&mut live.metadata);
            Some(live)
        }
        _ => None,
    })
}
