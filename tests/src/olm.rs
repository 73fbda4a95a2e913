//! The OLM bundle's RBAC as OLM installs it: the ClusterServiceVersion's
//! `clusterPermissions` become a ClusterRole and ClusterRoleBinding per
//! service account, its `permissions` a Role and RoleBinding in the install
//! namespace. The RBAC audit judges the suite's requests against them
//! (tests/tools/src/bin/rbac-audit.rs `--csv`), and with `NMO_TEST_RBAC=bundle` the
//! tests install them instead of manifests/' RBAC, so the services run under
//! exactly what the bundle grants (tests/src/manifests.rs).

use anyhow::Context as _;
use serde_yaml::Value;

/// The bundle's ClusterServiceVersion (tests/tools/src/bin/bundle-gen.rs writes it).
pub const CSV: &str = "bundle/manifests/node-maintenance-operator-rs.clusterserviceversion.yaml";

/// Names of the RBAC objects made from the CSV (`nmo-olm-<service account>`):
/// OLM generates names of its own; this prefix tells ours apart from the
/// manifests' so either set can be removed when the other is installed.
pub const NAME_PREFIX: &str = "nmo-olm-";

/// Read and parse the bundle's CSV.
pub fn read_csv() -> anyhow::Result<Value> {
    let path = crate::repo_root().join(CSV);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The install strategy (`spec.install.spec`) of a CSV.
pub fn install_spec(csv: &Value) -> anyhow::Result<&Value> {
    csv.get("spec")
        .and_then(|s| s.get("install"))
        .and_then(|i| i.get("spec"))
        .context("the CSV has no spec.install.spec")
}

/// The RBAC objects OLM creates from `csv` installed in `namespace`, ready
/// to apply: one ClusterRole and ClusterRoleBinding per `clusterPermissions`
/// entry, one Role and RoleBinding (in `namespace`) per `permissions` entry,
/// each bound to the entry's service account in `namespace`.
pub fn rbac_objects(csv: &Value, namespace: &str) -> anyhow::Result<Vec<Value>> {
    let install = install_spec(csv)?;
    let mut out = Vec::new();
    for (key, cluster) in [("clusterPermissions", true), ("permissions", false)] {
        let entries = install
            .get(key)
            .and_then(Value::as_sequence)
            .cloned()
            .unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in entries.iter().enumerate() {
            let sa = p
                .get("serviceAccountName")
                .and_then(Value::as_str)
                .with_context(|| format!("CSV {key}[{i}] without serviceAccountName"))?;
            anyhow::ensure!(
                seen.insert(sa.to_string()),
                "CSV {key} lists service account {sa} twice: OLM would merge them, fold them into one entry"
            );
            let rules = p.get("rules").cloned().unwrap_or(Value::Sequence(vec![]));
            let (role_kind, binding_kind) = if cluster {
                ("ClusterRole", "ClusterRoleBinding")
            } else {
                ("Role", "RoleBinding")
            };
            let name = format!("{NAME_PREFIX}{sa}");
            let meta = if cluster {
                format!("{{name: {name}}}")
            } else {
                format!("{{name: {name}, namespace: {namespace}}}")
            };
            let mut role: Value = serde_yaml::from_str(&format!(
                "{{apiVersion: rbac.authorization.k8s.io/v1, kind: {role_kind}, metadata: {meta}}}"
            ))?;
            if let Value::Mapping(m) = &mut role {
                m.insert("rules".into(), rules);
            }
            out.push(role);
            out.push(serde_yaml::from_str(&format!(
                "{{apiVersion: rbac.authorization.k8s.io/v1, kind: {binding_kind}, metadata: {meta}, \
                 roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: {role_kind}, name: {name}}}, \
                 subjects: [{{kind: ServiceAccount, name: {sa}, namespace: {namespace}}}]}}"
            ))?);
        }
    }
    Ok(out)
}

/// What an OLM install of the bundle grants: [`rbac_objects`] of its CSV
/// installed in `namespace`, and the RBAC objects the bundle ships as plain
/// manifests (ClusterRole nmo-metrics-reader).
pub fn bundle_rbac(namespace: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = rbac_objects(&read_csv()?, namespace)?;
    let dir = crate::repo_root().join("bundle/manifests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let v: Value = serde_yaml::from_str(&text).with_context(|| format!("{}", f.display()))?;
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        if matches!(
            kind,
            "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
        ) {
            out.push(v);
        }
    }
    Ok(out)
}

/// `objects` as one multi-document YAML text.
pub fn to_yaml(objects: &[Value]) -> anyhow::Result<String> {
    let mut yaml = String::new();
    for o in objects {
        yaml.push_str("---\n");
        yaml.push_str(&serde_yaml::to_string(o).context("writing an RBAC object")?);
    }
    Ok(yaml)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv() -> Value {
        serde_yaml::from_str(
            r#"
spec:
  install:
    spec:
      clusterPermissions:
        - serviceAccountName: ctl
          rules: [{apiGroups: [""], resources: [nodes], verbs: [get]}]
      permissions:
        - serviceAccountName: ctl
          rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get]}]
"#,
        )
        .expect("csv")
    }

    #[test]
    fn each_entry_becomes_a_role_and_a_binding_of_its_service_account() {
        let objects = rbac_objects(&csv(), "op").expect("objects");
        let kinds: Vec<(&str, &str, Option<&str>)> = objects
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default(),
                    o["metadata"]["namespace"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("ClusterRole", "nmo-olm-ctl", None),
                ("ClusterRoleBinding", "nmo-olm-ctl", None),
                ("Role", "nmo-olm-ctl", Some("op")),
                ("RoleBinding", "nmo-olm-ctl", Some("op")),
            ]
        );
        assert_eq!(objects[1]["subjects"][0]["namespace"].as_str(), Some("op"));
        assert_eq!(
            objects[2]["rules"][0]["resources"][0].as_str(),
            Some("leases")
        );
    }

    #[test]
    fn a_service_account_listed_twice_is_an_error() {
        let mut c = csv();
        let perms = c["spec"]["install"]["spec"]["permissions"].clone();
        let doubled = Value::Sequence(
            perms
                .as_sequence()
                .into_iter()
                .flatten()
                .chain(perms.as_sequence().into_iter().flatten())
                .cloned()
                .collect(),
        );
        c["spec"]["install"]["spec"]["permissions"] = doubled;
        let err = rbac_objects(&c, "op").expect_err("twice");
        assert!(format!("{err:#}").contains("twice"), "{err:#}");
    }
}
