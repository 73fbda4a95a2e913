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

/// The CRD, namespace nmo-system and the given RBAC files, then wait for the
/// CRD to be established. Tests running in parallel apply the same objects at
/// the same moment and can get a conflict: each apply is retried until it holds.
pub async fn install_prereqs(client: &Client, rbac_files: &[&str]) -> anyhow::Result<()> {
    use crate::wait::{Poll, until};
    let mut docs = vec![
        (
            "the NodeMaintenance CRD".to_string(),
            read("manifests/crd/nodemaintenance.medik8s.io_nodemaintenances.yaml")?,
        ),
        (
            "namespace nmo-system".to_string(),
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: nmo-system\n".to_string(),
        ),
    ];
    for f in rbac_files {
        docs.push((f.to_string(), read(f)?));
    }
    for (what, yaml) in &docs {
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
        .await?;
    }
    wait_crd_established(client).await
}

fn read(rel: &str) -> anyhow::Result<String> {
    let path = crate::repo_root().join(rel);
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// What every controller test needs.
pub async fn install_controller_prereqs(client: &Client) -> anyhow::Result<()> {
    install_prereqs(client, &["manifests/controller/rbac.yaml"]).await
}

/// What every webhook test needs.
pub async fn install_webhook_prereqs(client: &Client) -> anyhow::Result<()> {
    install_prereqs(client, &["manifests/webhook/rbac.yaml"]).await
}
async fn wait_crd_established(client: &Client) -> anyhow::Result<()> {
    use crate::wait::{Poll, until};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    until(
        "the NodeMaintenance CRD to be established",
        std::time::Duration::from_secs(30),
        || {
            let api = api.clone();
            async move {
                let crd = api
                    .get("nodemaintenances.nodemaintenance.medik8s.io")
                    .await?;
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
        },
    )
    .await
}
