//! The drain rules as the controller's drain rounds and the webhook's
//! warnings read them: every `NodeDrainRule` and the labels of every
//! namespace (for the rules' namespaceSelectors), each from a watch
//! (namespaces as metadata only). What a rule means is decided in
//! `rules::drain`; this holds the caches.
//!
//! Until both caches are filled [`DrainRules::current`] waits (then fails,
//! and a drain round is retried): a restart must never evict a pod that a
//! rule keeps or waits for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::api::drain_rule::NodeDrainRule;
use crate::rules::drain::{Rule, Rules};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

/// Objects per page of the watches' full lists.
const LIST_PAGE: u32 = 100;

/// How long a round waits for the caches' first list before it gives up
/// (and is retried).
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The caches of rules and namespaces; cheap to clone.
#[derive(Clone)]
pub struct DrainRules {
    rules: Store<NodeDrainRule>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
}

/// A watch's error, in the log (the watch retries on its own).
fn logged<T>(what: &str, event: watcher::Result<T>) -> std::future::Ready<()> {
    if let Err(e) = event {
        tracing::warn!(error = %e, "the {what} watch failed: retried (drains wait until it has listed)");
    }
    std::future::ready(())
}

/// The caches are not filled yet (just started, or the API server is away).
#[derive(Debug, thiserror::Error)]
#[error(
    "the NodeDrainRules or namespaces are not read yet (their watch has not listed them within {}s); \
     a drain waits and retries so that no pod a rule keeps is evicted \
     (is the NodeDrainRule CRD installed, and may this service list and watch nodedrainrules and namespaces?)",
    SYNC_WAIT.as_secs()
)]
pub struct NotSynced;

impl DrainRules {
    /// Filled caches holding nothing: no rule, upstream's drain (unit tests).
    pub fn none() -> DrainRules {
        DrainRules::fixed(Vec::new(), Vec::new())
    }

    /// Filled once with `rules` and the namespaces' labels, no watch (tests
    /// and tools: what a cluster holding these would give).
    pub fn fixed(
        rules: Vec<NodeDrainRule>,
        namespaces: Vec<(String, BTreeMap<String, String>)>,
    ) -> DrainRules {
        let (store, mut rw) = reflector::store();
        let (ns_store, mut nw) = reflector::store();
        rw.apply_watcher_event(&watcher::Event::Init);
        for r in rules {
            rw.apply_watcher_event(&watcher::Event::InitApply(r));
        }
        rw.apply_watcher_event(&watcher::Event::InitDone);
        nw.apply_watcher_event(&watcher::Event::Init);
        for (name, labels) in namespaces {
            let mut ns = PartialObjectMeta::<Namespace>::default();
            ns.metadata.name = Some(name);
            ns.metadata.labels = Some(labels);
            nw.apply_watcher_event(&watcher::Event::InitApply(ns));
        }
        nw.apply_watcher_event(&watcher::Event::InitDone);
        DrainRules {
            rules: store,
            namespaces: ns_store,
        }
    }

    /// The caches, and the task that fills them (run it for the process' life).
    pub fn watch(client: &Client) -> (DrainRules, impl Future<Output = ()> + Send + 'static) {
        let (rules, rules_writer) = reflector::store();
        let (namespaces, ns_writer) = reflector::store();
        let page = watcher::Config::default().page_size(LIST_PAGE);
        let rule_watch = crate::kube::watch::reconnecting(watcher(
            Api::<NodeDrainRule>::all(client.clone()),
            page.clone(),
        ))
        .reflect(rules_writer);
        let ns_watch = crate::kube::watch::reconnecting(watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            page,
        ))
        .modify(|ns| crate::kube::partial::forget_managed_fields(&mut ns.metadata))
        .reflect(ns_writer);
        let task = async move {
            futures::join!(
                rule_watch.for_each(|e| logged("NodeDrainRule", e)),
                ns_watch.for_each(|e| logged("namespace", e)),
            );
        };
        (DrainRules { rules, namespaces }, task)
    }

    /// The rules now, once the caches are filled; a rule that does not
    /// check (the webhook was bypassed) is left out and logged.
    pub async fn current(&self) -> Result<Arc<Rules>, NotSynced> {
        let ready = async {
            let _ = self.rules.wait_until_ready().await;
            let _ = self.namespaces.wait_until_ready().await;
        };
        tokio::time::timeout(SYNC_WAIT, ready)
            .await
            .map_err(|_| NotSynced)?;
        let state = self.rules.state();
        let compiled = state
            .iter()
            .filter_map(|r| match Rule::compile(&r.name_any(), &r.spec) {
                Ok(rule) => Some(rule),
                Err(errors) => {
                    let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                    tracing::warn!(nodedrainrule = %r.name_any(), errors = %errors.join("; "),
                        "NodeDrainRule left out: it does not check (fix or delete it; the webhook denies such a rule)");
                    None
                }
            })
            .collect();
        Ok(Arc::new(Rules::new(compiled)))
    }

    /// The labels of namespace `name` (empty when not known).
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        self.namespaces
            .get(&ObjectRef::new(name))
            .map(|ns| ns.labels().clone())
            .unwrap_or_default()
    }
}
