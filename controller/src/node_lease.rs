//! The per-node medik8s lease against the API server. The rules themselves
//! live in `shared::lease`; this module reads, writes and deletes the Lease.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ObjectMeta, PostParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use shared::consts::{LEASE_DURATION_SECONDS, LEASE_HOLDER_IDENTITY, lease_name};
use shared::lease::{LeaseDecision, decide};

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{}", shared::consts::msg_lease_held_by_other(.0))]
    HeldByOther(String),
    #[error("failed to {action} lease {namespace}/{name}: {source}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

pub struct NodeLeases {
    client: Client,
    namespace: String,
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

fn node_owner_ref(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.name_any(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    }
}

impl NodeLeases {
    pub fn new(client: Client, namespace: String) -> Self {
        NodeLeases { client, namespace }
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn err(&self, action: &'static str, name: &str, source: kube::Error) -> LeaseError {
        LeaseError::Api {
            action,
            namespace: self.namespace.clone(),
            name: name.to_string(),
            source,
        }
    }

    /// Take, renew or keep the lease of `node` for us.
    pub async fn request(&self, node: &Node) -> Result<(), LeaseError> {
        let name = lease_name(&node.name_any());
        let existing = match self.api().get_opt(&name).await {
            Ok(l) => l,
            Err(e) => return Err(self.err("read", &name, e)),
        };
        // The clock is read after the lease: taken before, a renewal that lands
        // in between would look "renewed in the future", which the rules treat
        // as invalid, and we would take over a lease that is really held.
        let now = Timestamp::now();
        let Some(mut lease) = existing else {
            return self.create(node, &name, now).await;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let new_spec = match decide(&spec, LEASE_HOLDER_IDENTITY, LEASE_DURATION_SECONDS, now) {
            LeaseDecision::Keep => return Ok(()),
            LeaseDecision::HeldByOther(holder) => return Err(LeaseError::HeldByOther(holder)),
            LeaseDecision::Renew { reacquire } => LeaseSpec {
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                acquire_time: if reacquire {
                    Some(MicroTime(now))
                } else {
                    spec.acquire_time.clone()
                },
                lease_transitions: if reacquire {
                    Some(spec.lease_transitions.unwrap_or(0) + 1)
                } else {
                    spec.lease_transitions
                },
                ..spec.clone()
            },
            LeaseDecision::TakeOver => LeaseSpec {
                holder_identity: Some(LEASE_HOLDER_IDENTITY.to_string()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + 1),
                ..spec.clone()
            },
        };
        lease.spec = Some(new_spec);
        // Replace carries the resourceVersion we read: a concurrent writer wins
        // and we retry on the next reconcile.
        self.api()
            .replace(&name, &PostParams::default(), &lease)
            .await
            .map(|_| ())
            .map_err(|e| self.err("update", &name, e))
    }

    async fn create(&self, node: &Node, name: &str, now: Timestamp) -> Result<(), LeaseError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                owner_references: Some(vec![node_owner_ref(node)]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(LEASE_HOLDER_IDENTITY.to_string()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        match self.api().create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => {
                // The namespace is missing: create it, then the lease.
                self.ensure_namespace().await?;
                self.api()
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
                    .map_err(|e| self.err("create", name, e))
            }
            Err(e) => Err(self.err("create", name, e)),
        }
    }

    async fn ensure_namespace(&self) -> Result<(), LeaseError> {
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
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(LeaseError::Api {
                action: "create the namespace of",
                namespace: self.namespace.clone(),
                name: self.namespace.clone(),
                source: e,
            }),
        }
    }

    /// Release the lease of `node_name` if we hold it; a foreign one is left alone.
    pub async fn release(&self, node_name: &str) -> Result<(), LeaseError> {
        let name = lease_name(node_name);
        let lease = match self.api().get_opt(&name).await {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(()),
            Err(e) => return Err(self.err("read", &name, e)),
        };
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref());
        if holder != Some(LEASE_HOLDER_IDENTITY) {
            tracing::info!(lease = %name, holder = ?holder, "lease held by someone else: left alone");
            return Ok(());
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..Default::default()
        };
        match self.api().delete(&name, &dp).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(self.err("delete", &name, e)),
        }
    }
}
