//! Apply YAML manifests (multi-document) with server-side apply, as the admin.

use anyhow::Context as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::{Client, ResourceExt};
use serde::Deserialize;

/// Apply every document of `yaml`. Namespaced objects without a namespace go to `default`.
pub async fn apply_yaml(client: &Client, yaml: &str) -> anyhow::Result<()> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("API discovery")?;
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_yaml::from_value(value).context("manifest document")?;
        let types = obj
            .types
            .clone()
            .context("manifest document without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .with_context(|| format!("the API server does not serve {gvk:?}"))?;
        let api: Api<DynamicObject> = if caps.scope == Scope::Namespaced {
            let ns = obj.namespace().unwrap_or_else(|| "default".to_string());
            Api::namespaced_with(client.clone(), &ns, &ar)
        } else {
            Api::all_with(client.clone(), &ar)
        };
        let name = obj.name_any();
        api.patch(
            &name,
            &PatchParams::apply("nmo-tests").force(),
            &Patch::Apply(&obj),
        )
        .await
        .with_context(|| format!("applying {} {name}", types.kind))?;
    }
    Ok(())
}

/// Apply a file of the repository (path relative to the repo root).
pub async fn apply_file(client: &Client, rel: &str) -> anyhow::Result<()> {
    let path = crate::repo_root().join(rel);
    let yaml =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    apply_yaml(client, &yaml)
        .await
        .with_context(|| format!("applying {}", path.display()))
}

/// Whose RBAC the operator's service accounts get in the tests:
/// manifests/' (the default) or, with `NMO_TEST_RBAC=bundle`, what the OLM
/// bundle grants (tests/src/olm.rs). `make test` runs a part of the suite the
/// second way and audits it against the CSV (tests/run-tests.sh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RbacSource {
    Manifests,
    Bundle,
}

/// The environment variable that picks the [`RbacSource`].
pub const RBAC_ENV: &str = "NMO_TEST_RBAC";

/// The [`RbacSource`] this run uses.
pub fn rbac_source() -> anyhow::Result<RbacSource> {
    match std::env::var(RBAC_ENV).as_deref() {
        Err(_) | Ok("") | Ok("manifests") => Ok(RbacSource::Manifests),
        Ok("bundle") => Ok(RbacSource::Bundle),
        Ok(other) => anyhow::bail!(
            "{RBAC_ENV}={other:?}: expected `manifests` (the default) or `bundle` (the OLM bundle's RBAC)"
        ),
    }
}

/// The controller's main ClusterRole under the [`RbacSource`] in use, for a
/// test that binds a service account of its own to it.
pub fn controller_cluster_role() -> anyhow::Result<String> {
    Ok(match rbac_source()? {
        RbacSource::Manifests => "nmo-controller".to_string(),
        RbacSource::Bundle => format!("{}nmo-controller", crate::olm::NAME_PREFIX),
    })
}

/// The operator's own RBAC in manifests/: what `NMO_TEST_RBAC=bundle`
/// replaces with the bundle's (their ServiceAccounts stay).
const OPERATOR_RBAC: &[&str] = &[
    "manifests/controller/rbac.yaml",
    "manifests/controller/node-leases.yaml",
    "manifests/webhook/rbac.yaml",
    "manifests/overlays/openshift/webhook-etcd-rbac.yaml",
];

/// The CRD, namespace nmo-system and the given RBAC files, then wait for the
/// bindings to take effect and the CRD to be established. Tests running in
/// parallel apply the same objects at the same moment and can get a
/// conflict: each apply is retried until it holds. Under
/// `NMO_TEST_RBAC=bundle` the operator's files ([`OPERATOR_RBAC`]) give only
/// their ServiceAccounts and the bundle's RBAC is applied instead; either
/// way the other source's bindings are removed first, so the services run
/// under one of them only.
pub async fn install_prereqs(client: &Client, rbac_files: &[&str]) -> anyhow::Result<()> {
    let source = rbac_source()?;
    let mut docs = vec![
        (
            "the NodeMaintenance CRD".to_string(),
            read("manifests/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml")?,
        ),
        (
            "the NodeDrainRule CRD".to_string(),
            read("manifests/crd/nodemaintenance.medik8s.io_nodedrainrules.yaml")?,
        ),
        (
            "namespace nmo-system".to_string(),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: nmo-system\n".to_string(),
        ),
    ];
    let mut bundle = false;
    for f in rbac_files {
        if source == RbacSource::Bundle && OPERATOR_RBAC.contains(f) {
            bundle = true;
            let accounts = keep_kinds(&read(f)?, &["ServiceAccount"])?;
            if !accounts.is_empty() {
                docs.push((format!("{f}: its ServiceAccounts"), accounts));
            }
        } else {
            docs.push((f.to_string(), read(f)?));
        }
    }
    if bundle {
        docs.push(bundle_rbac_doc()?);
    }
    remove_other_rbac(client, source).await?;
    for (what, yaml) in &docs {
        apply_until_it_holds(client, what, yaml).await?;
    }
    for (what, yaml) in &docs {
        wait_bindings_effective(client, what, yaml).await?;
    }
    wait_crd_established(client).await
}

/// The bundle's RBAC for an install in nmo-system, as a document to apply.
fn bundle_rbac_doc() -> anyhow::Result<(String, String)> {
    let objects = crate::olm::bundle_rbac(shared::kube::namespace::DEFAULT_NAMESPACE)?;
    Ok((
        format!(
            "the OLM bundle's RBAC ({RBAC_ENV}=bundle, {})",
            crate::olm::CSV
        ),
        crate::olm::to_yaml(&objects)?,
    ))
}

/// The documents of `yaml` whose kind is one of `kinds`.
fn keep_kinds(yaml: &str, kinds: &[&str]) -> anyhow::Result<String> {
    let mut kept = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = serde_yaml::Value::deserialize(doc)?;
        if v.get("kind")
            .and_then(|k| k.as_str())
            .is_some_and(|k| kinds.contains(&k))
        {
            kept.push(v);
        }
    }
    crate::olm::to_yaml(&kept)
}

/// Delete the bindings of the RBAC source not in use: the bundle's
/// (`nmo-olm-*`) under manifests/, the manifests' operator bindings under
/// the bundle. A run of one leaves the other's grants behind otherwise, and
/// the services would run with both.
async fn remove_other_rbac(client: &Client, source: RbacSource) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
    let mut yaml = String::new();
    match source {
        RbacSource::Manifests => yaml = bundle_rbac_doc()?.1,
        RbacSource::Bundle => {
            for f in OPERATOR_RBAC {
                yaml.push_str("\n---\n");
                yaml.push_str(&read(f)?);
            }
        }
    }
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let v = serde_yaml::Value::deserialize(doc)?;
        let meta = |k: &str| {
            v.get("metadata")
                .and_then(|m| m.get(k))
                .and_then(|x| x.as_str())
                .map(str::to_string)
        };
        let (Some(name), kind) = (meta("name"), v.get("kind").and_then(|k| k.as_str())) else {
            continue;
        };
        let dp = kube::api::DeleteParams::default();
        let gone = match (kind, meta("namespace")) {
            (Some("ClusterRoleBinding"), _) => Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&name, &dp)
                .await
                .map(|_| ()),
            (Some("RoleBinding"), Some(ns)) => Api::<RoleBinding>::namespaced(client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
            _ => continue,
        };
        match gone {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "removing {} {name} (the RBAC source not in use, {RBAC_ENV}={source:?})",
                        kind.unwrap_or_default()
                    )
                });
            }
        }
    }
    Ok(())
}

/// Apply `yaml`, retrying for 30 s (parallel tests apply the same objects).
async fn apply_until_it_holds(client: &Client, what: &str, yaml: &str) -> anyhow::Result<()> {
    use crate::wait::{Poll, until};
    until(
        &format!("{what} to be applied"),
        std::time::Duration::from_secs(30),
        || async {
            Ok(match apply_yaml(client, yaml).await {
                Ok(()) => Poll::Ready(()),
                Err(e) => Poll::Pending(format!("{e:#}")),
            })
        },
    )
    .await
}

/// Wait until the API server's authorizer knows every (Cluster)RoleBinding
/// of `yaml` that names a ServiceAccount: a SubjectAccessReview of the first
/// rule of its role must say allowed. RBAC objects reach the authorizer
/// through a watch, a moment after they are written; a service started in
/// between would be answered "forbidden", which the RBAC audit after the
/// suite (tests/tools/src/bin/rbac-audit.rs) rightly counts as a failure.
pub async fn wait_bindings_effective(
    client: &Client,
    what: &str,
    yaml: &str,
) -> anyhow::Result<()> {
    use crate::wait::{Poll, until};
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use kube::api::PostParams;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = serde_yaml::Value::deserialize(doc).with_context(|| format!("{what}: YAML"))?;
        docs.push(v);
    }
    let str_at = |v: &serde_yaml::Value, path: &[&str]| -> Option<String> {
        path.iter()
            .try_fold(v, |cur, k| cur.get(*k))
            .and_then(|x| x.as_str())
            .map(str::to_string)
    };
    let first = |v: &serde_yaml::Value, key: &str| -> Option<String> {
        v.get(key)
            .and_then(|x| x.as_sequence())
            .and_then(|s| s.first())
            .and_then(|x| x.as_str())
            .map(str::to_string)
    };
    for b in &docs {
        let kind = str_at(b, &["kind"]).unwrap_or_default();
        if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
            continue;
        }
        let namespace = str_at(b, &["metadata", "namespace"]);
        let role_kind = str_at(b, &["roleRef", "kind"]).unwrap_or_default();
        let role_name = str_at(b, &["roleRef", "name"]).unwrap_or_default();
        let Some(rule) = docs
            .iter()
            .find(|r| {
                str_at(r, &["kind"]).as_deref() == Some(role_kind.as_str())
                    && str_at(r, &["metadata", "name"]).as_deref() == Some(role_name.as_str())
                    && (role_kind == "ClusterRole"
                        || str_at(r, &["metadata", "namespace"]) == namespace)
            })
            .and_then(|r| r.get("rules"))
            .and_then(|r| r.as_sequence())
            .and_then(|r| r.first())
        else {
            continue; // role defined elsewhere: nothing to judge here
        };
        let (Some(verb), Some(resource)) = (first(rule, "verbs"), first(rule, "resources")) else {
            continue; // a non-resource rule
        };
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r.to_string(), Some(s.to_string())),
            None => (resource, None),
        };
        let attrs = ResourceAttributes {
            verb: Some(verb),
            group: first(rule, "apiGroups"),
            resource: Some(resource),
            subresource,
            name: first(rule, "resourceNames"),
            namespace: namespace.clone(),
            ..Default::default()
        };
        let subjects = b
            .get("subjects")
            .and_then(|s| s.as_sequence())
            .cloned()
            .unwrap_or_default();
        for s in subjects {
            if str_at(&s, &["kind"]).as_deref() != Some("ServiceAccount") {
                continue;
            }
            let user = format!(
                "system:serviceaccount:{}:{}",
                str_at(&s, &["namespace"]).unwrap_or_default(),
                str_at(&s, &["name"]).unwrap_or_default()
            );
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.clone()),
                    resource_attributes: Some(attrs.clone()),
                    ..Default::default()
                },
                ..Default::default()
            };
            let api: Api<SubjectAccessReview> = Api::all(client.clone());
            until(
                &format!(
                    "{what}: {kind} {} to take effect for {user} ({attrs:?})",
                    name_of(b)
                ),
                std::time::Duration::from_secs(30),
                || async {
                    let answer = api.create(&PostParams::default(), &review).await?;
                    Ok(match answer.status {
                        Some(st) if st.allowed => Poll::Ready(()),
                        other => Poll::Pending(format!("{other:?}")),
                    })
                },
            )
            .await?;
        }
    }
    Ok(())
}

fn name_of(v: &serde_yaml::Value) -> String {
    v.get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("?")
        .to_string()
}

fn read(rel: &str) -> anyhow::Result<String> {
    let path = crate::repo_root().join(rel);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// What every controller test needs: its RBAC, namespace medik8s-leases and
/// the Role there.
pub async fn install_controller_prereqs(client: &Client) -> anyhow::Result<()> {
    install_prereqs(
        client,
        &[
            "manifests/controller/rbac.yaml",
            "manifests/controller/node-leases.yaml",
        ],
    )
    .await
}

/// The webhook's Role in openshift-etcd (overlays/openshift), once that
/// namespace exists; returns when the authorizer applies it.
/// Under `NMO_TEST_RBAC=bundle`, the bundle's RBAC (it grants the same
/// cluster-wide).
pub async fn install_webhook_openshift_rbac(client: &Client) -> anyhow::Result<()> {
    let rel = "manifests/overlays/openshift/webhook-etcd-rbac.yaml";
    let source = rbac_source()?;
    let (what, yaml) = match source {
        RbacSource::Manifests => (rel.to_string(), read(rel)?),
        RbacSource::Bundle => bundle_rbac_doc()?,
    };
    remove_other_rbac(client, source).await?;
    apply_until_it_holds(client, &what, &yaml).await?;
    wait_bindings_effective(client, &what, &yaml).await
}

/// Names of a test's private copy of the operator's namespace:
/// `nmo-system-<group>` (see [`operator_namespace_copy`]).
pub const OPERATOR_NAMESPACE_COPY_PREFIX: &str = "nmo-system-";

/// A private stand-in for the operator's namespace for one test: namespace
/// `nmo-system-<group>` holding the rendered manifests' own Roles and
/// RoleBindings of nmo-system, unchanged but for their namespace. A
/// controller run with `--leader-election-namespace=<it>` elects on Lease
/// 135b1886.medik8s.io (upstream's name) under exactly the manifests' rules,
/// resourceNames included, and parallel tests do not share a leader. The RBAC
/// audit after the suite (tests/tools/src/bin/rbac-audit.rs, `--namespace-copy`)
/// judges requests there against nmo-system's grants. Labelled with the
/// test's group; [`delete_operator_namespace_copy`] removes it.
pub async fn operator_namespace_copy(client: &Client, group: &str) -> anyhow::Result<String> {
    let ns = format!("{OPERATOR_NAMESPACE_COPY_PREFIX}{group}");
    // The Roles of nmo-system: manifests/base's, or the bundle's `permissions`.
    let rendered = match rbac_source()? {
        RbacSource::Manifests => crate::deployment::render("base")?,
        RbacSource::Bundle => bundle_rbac_doc()?.1,
    };
    let mut yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    {}: {group}\n",
        crate::fixtures::GROUP_KEY
    );
    let mut copied = 0;
    for doc in serde_yaml::Deserializer::from_str(&rendered) {
        let mut v = serde_yaml::Value::deserialize(doc).context("rendered manifests/base")?;
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        let in_operator_ns = v
            .get("metadata")
            .and_then(|m| m.get("namespace"))
            .and_then(|n| n.as_str())
            == Some(shared::kube::namespace::DEFAULT_NAMESPACE);
        if (kind == "Role" || kind == "RoleBinding") && in_operator_ns {
            if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_mapping_mut()) {
                m.insert("namespace".into(), ns.clone().into());
            }
            yaml.push_str("---\n");
            yaml.push_str(&serde_yaml::to_string(&v).context("writing a Role copy")?);
            copied += 1;
        }
    }
    anyhow::ensure!(
        copied > 0,
        "no Role or RoleBinding in namespace nmo-system to copy into {ns} ({RBAC_ENV}={:?})",
        rbac_source()?
    );
    let what = format!("the nmo-system Roles copied into {ns}");
    apply_until_it_holds(client, &what, &yaml).await?;
    wait_bindings_effective(client, &what, &yaml).await?;
    Ok(ns)
}

/// Delete a namespace made by [`operator_namespace_copy`] (best effort).
pub async fn delete_operator_namespace_copy(client: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &kube::api::DeleteParams::default())
        .await;
}

/// What every webhook test needs.
/// The admin client, with what a webhook of the tests needs installed
/// ([`install_webhook_prereqs`]); panics saying what failed.
pub async fn admin_with_webhook_prereqs() -> Client {
    let client = crate::admin_client()
        .await
        .unwrap_or_else(|e| panic!("local control plane: {e:#}"));
    install_webhook_prereqs(&client)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    client
}

pub async fn install_webhook_prereqs(client: &Client) -> anyhow::Result<()> {
    install_prereqs(client, &["manifests/webhook/rbac.yaml"]).await
}

async fn wait_crd_established(client: &Client) -> anyhow::Result<()> {
    wait_established(
        client,
        "nodemaintenances.nodemaintenance.medik8s.io",
        std::time::Duration::from_secs(30),
    )
    .await
}

/// Wait until CustomResourceDefinition `name` is Established (served).
pub async fn wait_established(
    client: &Client,
    name: &str,
    deadline: std::time::Duration,
) -> anyhow::Result<()> {
    use crate::wait::{Poll, until};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    until(&format!("CRD {name} to be established"), deadline, || {
        let api = api.clone();
        async move {
            let crd = api.get(name).await?;
            let ok = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            Ok(if ok {
                Poll::Ready(())
            } else {
                Poll::Pending("not established".into())
            })
        }
    })
    .await
}
