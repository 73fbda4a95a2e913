//! The per-node medik8s lease against the API server. The rules themselves
//! (validity, when to renew, take over or wait, what a write sets, what a
//! release deletes) live in `shared::rules::lease`, matching the medik8s common
//! library; this module reads, writes and deletes the Lease.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use shared::api::consts::{LEASE_DURATION_SECONDS, LEASE_HOLDER_IDENTITY, lease_name};
use shared::rules::lease::{
    LeaseDecision, ReleaseDecision, decide, decide_release, new_spec, written_spec,
};
use shared::rules::sync::LockExt;

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{}", shared::api::consts::msg_lease_held_by_other(.0))]
    HeldByOther(String),
    #[error("failed to {action} lease {namespace}/{name}: {source}; {hint}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        hint: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// What to do about a failed lease call, for the error text.
const HINT_RETRY: &str = "retried on the next reconcile; if it persists check the API server \
     and that the controller's Role in that namespace (manifests/controller/node-leases.yaml) \
     allows get, create, update and delete on leases";
const HINT_NAMESPACE: &str = "the lease namespace is missing and could not be created: create it \
     (manifests/controller/node-leases.yaml, with its Role) or point LEASE_NAMESPACE at an \
     existing one";

pub struct NodeLeases {
    client: Client,
    namespace: String,
    /// The lease as we last wrote it, per lease name: the next renewal
    /// replaces it without reading it first (its resourceVersion is the
    /// precondition; on a conflict the lease is read and judged again).
    ours: std::sync::Mutex<std::collections::HashMap<String, Lease>>,
    /// The time the lease rules judge by (set by unit tests).
    pub(crate) clock: crate::clock::Clock,
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl LeaseError {
    /// The API server answered with HTTP status `code`.
    fn is_code(&self, code: u16) -> bool {
        matches!(self, LeaseError::Api { source: kube::Error::Api(s), .. } if s.code == code)
    }
}

impl NodeLeases {
    pub fn new(client: Client, namespace: String) -> Self {
        NodeLeases {
            client,
            namespace,
            ours: Default::default(),
            clock: crate::clock::Clock::system(),
        }
    }

    /// The namespace of the node leases (`LEASE_NAMESPACE`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn err(&self, action: &'static str, name: &str, source: kube::Error) -> LeaseError {
        LeaseError::Api {
            action,
            namespace: self.namespace.clone(),
            name: name.to_string(),
            hint: HINT_RETRY,
            source,
        }
    }

    /// Keep `lease` as our last write (its managedFields dropped: a replace
    /// without them leaves the API server's as they are).
    fn keep(&self, name: &str, mut lease: Lease) {
        shared::kube::partial::forget_managed_fields(&mut lease.metadata);
        self.ours().insert(name.to_string(), lease);
    }

    /// Drop our last write of the lease of every node not in `named` (its
    /// maintenance went without our release, e.g. a finalizer removed by
    /// someone else). The lease itself stays until it expires.
    pub fn forget_unnamed(&self, named: &std::collections::HashSet<String>) {
        let keep: std::collections::HashSet<String> = named.iter().map(|n| lease_name(n)).collect();
        self.ours().retain(|lease, _| keep.contains(lease));
    }

    /// How many leases we hold a last write of.
    pub fn kept(&self) -> usize {
        self.ours().len()
    }

    fn ours(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Lease>> {
        self.ours.locked()
    }

    /// Take, renew or keep the lease of `node` for us.
    pub async fn request(&self, node: &Node) -> Result<(), LeaseError> {
        let name = lease_name(&node.name_any());
        let Some(cached) = self.ours().remove(&name) else {
            // Most nodes have no lease yet: create it without reading
            // first; one that exists (409) is read and judged.
            return match self.create(node, &name, self.clock.now()).await {
                Err(e) if e.is_code(409) => self.request_on(node, &name, None).await,
                other => other,
            };
        };
        match self.request_on(node, &name, Some(cached)).await {
            // Someone wrote the lease since our last write: judge it as it is now.
            Err(e) if e.is_code(409) || e.is_code(404) => self.request_on(node, &name, None).await,
            other => other,
        }
    }

    /// [`Self::request`] on `known` (our last write) or, when None, on the lease read live.
    async fn request_on(
        &self,
        node: &Node,
        name: &str,
        known: Option<Lease>,
    ) -> Result<(), LeaseError> {
        let existing = match known {
            Some(l) => Some(l),
            None => match self.api().get_opt(name).await {
                Ok(l) => l,
                Err(e) => return Err(self.err("read", name, e)),
            },
        };
        // The clock is read after the lease: taken before, a renewal that lands
        // in between would look "renewed in the future", which the rules treat
        // as invalid, and we would take over a lease that is really held.
        let now = self.clock.now();
        let Some(mut lease) = existing else {
            return self.create(node, name, now).await;
        };
        let spec = lease.spec.take().unwrap_or_default();
        let reacquire = match decide(&spec, LEASE_HOLDER_IDENTITY, LEASE_DURATION_SECONDS, now) {
            LeaseDecision::Keep => {
                lease.spec = Some(spec);
                self.keep(name, lease);
                return Ok(());
            }
            LeaseDecision::HeldByOther(holder) => return Err(LeaseError::HeldByOther(holder)),
            LeaseDecision::Renew { reacquire } => reacquire,
            LeaseDecision::TakeOver => {
                tracing::info!(lease = %name, holder = ?spec.holder_identity,
                    "taking over an expired lease");
                true
            }
        };
        lease.spec = Some(written_spec(
            &spec,
            reacquire,
            LEASE_HOLDER_IDENTITY,
            LEASE_DURATION_SECONDS,
            now,
        ));
        // Every write makes the Node the lease's only owner, whoever owned it before.
        lease.metadata.owner_references = Some(vec![shared::rules::nodes::owner_reference(node)]);
        // Replace carries the resourceVersion we read (or last wrote): a
        // concurrent writer wins; `request` then reads the lease and judges
        // again once, or the next reconcile does.
        let written = self
            .api()
            .replace(name, &PostParams::default(), &lease)
            .await
            .map_err(|e| self.err("update", name, e))?;
        self.keep(name, written);
        Ok(())
    }

    async fn create(&self, node: &Node, name: &str, now: Timestamp) -> Result<(), LeaseError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                owner_references: Some(vec![shared::rules::nodes::owner_reference(node)]),
                ..Default::default()
            },
            spec: Some(new_spec(LEASE_HOLDER_IDENTITY, LEASE_DURATION_SECONDS, now)),
        };
        match self.api().create(&PostParams::default(), &lease).await {
            Ok(written) => {
                self.keep(name, written);
                Ok(())
            }
            Err(e) if is_not_found(&e) => {
                // The namespace is missing: create it, then the lease.
                self.ensure_namespace(name).await?;
                let written = self
                    .api()
                    .create(&PostParams::default(), &lease)
                    .await
                    .map_err(|e| self.err("create", name, e))?;
                self.keep(name, written);
                Ok(())
            }
            Err(e) => Err(self.err("create", name, e)),
        }
    }

    async fn ensure_namespace(&self, lease: &str) -> Result<(), LeaseError> {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = %self.namespace, "created the lease namespace");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(LeaseError::Api {
                action: "create the namespace of",
                namespace: self.namespace.clone(),
                name: lease.to_string(),
                hint: HINT_NAMESPACE,
                source: e,
            }),
        }
    }

    /// Release the lease of `node_name`: deleted when ours or naming no
    /// holder; a lease naming another holder is left alone (upstream logs
    /// that and goes on, so this is not an error).
    pub async fn release(&self, node_name: &str) -> Result<(), LeaseError> {
        let name = lease_name(node_name);
        // Our last write, when we have it, is the lease as it stands unless
        // someone wrote it since (then the delete's precondition fails).
        let known = self.ours().remove(&name);
        if let Some(ours) = known {
            match self.delete(&name, &ours).await {
                Err(e) if e.is_code(409) => {}
                done => return done,
            }
        }
        let lease = match self.api().get_opt(&name).await {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(()),
            Err(e) => return Err(self.err("read", &name, e)),
        };
        if let ReleaseDecision::HeldByOther(holder) =
            decide_release(lease.spec.as_ref(), LEASE_HOLDER_IDENTITY)
        {
            tracing::info!(lease = %name, %holder, "lease held by someone else: left alone");
            return Ok(());
        }
        self.delete(&name, &lease).await
    }

    /// Delete `lease` as judged: one written since (taken over, say) is
    /// not ours to delete, so its version and uid are the precondition.
    async fn delete(&self, name: &str, lease: &Lease) -> Result<(), LeaseError> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..Default::default()
        };
        match self.api().delete(name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.err("delete", name, e)),
        }
    }
}
