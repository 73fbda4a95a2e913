//! Kubernetes events as upstream writes them: core/v1 Events with source
//! component `NodeMaintenance`, so `kubectl describe` and existing alerting on
//! event reasons see exactly what they saw before. Failing to write an event
//! is logged, never fatal: it must not block a maintenance.
//!
//! Events are sent in the background (as client-go's recorder does): a
//! maintenance never waits for its event's round trip, so the give-back and
//! the next node's start are not held by it. Unit tests send them inline, so
//! a scenario reads its requests in order.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use shared::api::consts::{EVENT_COMPONENT, EventSpec};

#[derive(Clone)]
pub struct Events {
    client: Client,
    instance: String,
    /// Send each event from a task of its own (false: within the call).
    background: bool,
}

/// A reference to any object for an event's `involvedObject`.
pub fn reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).to_string()),
        kind: Some(K::kind(&()).to_string()),
        name: obj.meta().name.clone(),
        namespace: obj.meta().namespace.clone(),
        uid: obj.meta().uid.clone(),
        resource_version: obj.meta().resource_version.clone(),
        ..Default::default()
    }
}

impl Events {
    pub fn new(client: Client, instance: String) -> Self {
        Events {
            client,
            instance,
            background: true,
        }
    }

    /// These events sent within the call that records them (unit tests).
    pub fn inline(mut self) -> Self {
        self.background = false;
        self
    }

    pub async fn publish(&self, on: ObjectReference, ev: EventSpec) {
        self.send(on, ev.reason, ev.warning, ev.message).await;
    }

    async fn send(&self, on: ObjectReference, reason: &str, warning: bool, message: &str) {
        let (client, event) = (
            self.client.clone(),
            self.event(on, reason, warning, message),
        );
        if self.background {
            tokio::spawn(create(client, event));
        } else {
            create(client, event).await;
        }
    }

    fn event(&self, on: ObjectReference, reason: &str, warning: bool, message: &str) -> Event {
        let now = Timestamp::now();
        let obj_name = on.name.clone().unwrap_or_default();
        // Cluster-scoped objects (Node, NodeMaintenance) get their events in "default".
        let ns = on
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{obj_name}.{:x}", now.as_nanosecond())),
                namespace: Some(ns),
                ..Default::default()
            },
            involved_object: on,
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_string()),
            source: Some(EventSource {
                component: Some(EVENT_COMPONENT.to_string()),
                host: None,
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            action: Some(reason.to_string()),
            reporting_component: Some(EVENT_COMPONENT.to_string()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }

    pub async fn on<K: Resource<DynamicType = ()> + ResourceExt>(&self, obj: &K, ev: EventSpec) {
        self.publish(reference(obj), ev).await;
    }

    /// A Normal event whose message is built at run time (beyond upstream's
    /// fixed set, e.g. CordonKept naming the node).
    pub async fn note<K: Resource<DynamicType = ()> + ResourceExt>(
        &self,
        obj: &K,
        reason: &'static str,
        message: &str,
    ) {
        self.send(reference(obj), reason, false, message).await;
    }

    /// A Warning event whose message is built at run time (beyond upstream's
    /// fixed set, e.g. DrainBlocked naming the pods in the way).
    pub async fn warn<K: Resource<DynamicType = ()> + ResourceExt>(
        &self,
        obj: &K,
        reason: &'static str,
        message: &str,
    ) {
        self.send(reference(obj), reason, true, message).await;
    }
}

/// Create `event`; a failure is logged (an event never holds anything back).
async fn create(client: Client, event: Event) {
    let ns = event.metadata.namespace.clone().unwrap_or_default();
    let obj_name = event.involved_object.name.clone().unwrap_or_default();
    let reason = event.reason.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(client, &ns);
    match api.create(&PostParams::default(), &event).await {
        Err(e) => tracing::warn!(
            object = %obj_name, %reason, error = %e,
            "could not record event; check the controller may create events in namespace {ns}"
        ),
        Ok(_) => tracing::debug!(object = %obj_name, %reason, "event recorded"),
    }
}
