//! `bundle-gen`: writes the OLM bundle (`bundle/`) from the rendered
//! manifests (overlays/openshift: base plus the webhook's openshift-etcd
//! Role), so the bundle and `kubectl apply -k manifests/...` install the same
//! Deployments, RBAC and CRD.
//!
//! ```sh
//! kubectl kustomize manifests/overlays/openshift | cargo run -p nmo-tools --bin bundle-gen -- --out bundle
//! ```
//! (`make bundle`; `tests/release/check-bundle.sh` regenerates into a temporary
//! directory and fails on any difference from the committed `bundle/`.)
//!
//! What becomes what:
//! - CustomResourceDefinition: a bundle manifest of its own, and the CSV's
//!   `customresourcedefinitions.owned`, whose descriptors take their
//!   descriptions from the CRD schema (a descriptor for a field the schema
//!   lacks is an error);
//! - Deployments: `spec.install.spec.deployments`. The webhook's serving
//!   certificate comes from OLM (mounted at `/apiserver.local.config/certificates`
//!   and `/tmp/k8s-webhook-server/serving-certs`), so `--cert-dir` and the
//!   volume mounted there are dropped; `runAsUser`/`runAsGroup` are dropped
//!   so OpenShift's restricted-v2 SCC can assign the UID (the image's
//!   `USER 65532:65532` applies elsewhere);
//! - ClusterRoles bound to the Deployments' ServiceAccounts: `clusterPermissions`;
//!   Roles (or ClusterRoles) bound by RoleBindings in the operator's namespace:
//!   `permissions`; other ClusterRoles (e.g. a metrics reader): bundle manifests;
//! - Roles bound in another namespace (the controller's in medik8s-leases and
//!   default): a CSV cannot grant rights in a namespace other than the
//!   operator's, so their rules become `clusterPermissions`, cluster-wide: the
//!   OLM install is wider there than `kubectl apply -k` (README.md, Security).
//!   If the manifests create that namespace, OLM cannot (a bundle carries no
//!   Namespace): the operator makes it itself (the controller creates
//!   medik8s-leases when missing), so `create` on namespaces is added;
//! - ValidatingWebhookConfiguration: `webhookdefinitions` (OLM creates the
//!   Service `<deployment>-service`, the configuration and the certificate, and
//!   rotates it); the webhook's own Service is dropped;
//! - other Services, PodDisruptionBudgets, ConfigMaps, ServiceMonitors,
//!   PrometheusRules: bundle manifests, namespace removed;
//! - Namespace and ServiceAccounts: dropped (OLM installs into the
//!   OperatorGroup's namespace and creates the ServiceAccounts);
//! - NetworkPolicies: dropped. OLM v0 carries them only from 0.32 on and OLM
//!   v1 refuses bundles with them; manifests/README.md says how to apply them
//!   next to an OLM install.
//!
//! Anything else is an error naming the object: nothing is lost silently.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use serde::Deserialize as _;
use serde_yaml::{Mapping, Value};

/// OLM package name: different from upstream's `node-maintenance-operator`,
/// so both can sit in one catalog (only one can be installed at a time: they
/// own the same CRD).
const PACKAGE: &str = "node-maintenance-operator-rs";
const CHANNEL: &str = "stable";
/// The oldest Kubernetes the operator is built for (k8s-openapi feature v1_33).
const MIN_KUBE_VERSION: &str = "1.33.0";
/// OpenShift releases whose Kubernetes is at least MIN_KUBE_VERSION ("v4.20" =
/// 4.20 and later; OpenShift 4.20 ships Kubernetes 1.33).
const OPENSHIFT_VERSIONS: &str = "v4.20";
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");
const UPSTREAM: &str = "https://github.com/medik8s/node-maintenance-operator";
const CSV_FILE: &str = "node-maintenance-operator-rs.clusterserviceversion.yaml";

#[derive(Parser, Debug)]
#[command(
    about = "Write the OLM bundle from the rendered manifests (kubectl kustomize manifests/overlays/openshift)"
)]
struct Args {
    /// Rendered manifests (multi-document YAML); `-` = stdin.
    #[arg(long, default_value = "-")]
    manifests: String,
    /// Bundle directory to (re)write: manifests/, metadata/, bundle.Containerfile.
    #[arg(long, default_value = "bundle")]
    out: PathBuf,
    /// Operator version (CSV name and spec.version). Default: the workspace version.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    version: String,
    /// Replace a Deployment's image: DEPLOYMENT=IMAGE (e.g. a digest-pinned
    /// reference for a release). Repeatable.
    #[arg(long = "image", value_name = "DEPLOYMENT=IMAGE")]
    images: Vec<String>,
    /// CSV `createdAt` annotation (RFC 3339); left out when not given, so the
    /// committed bundle does not change with time.
    #[arg(long)]
    created_at: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut text = String::new();
    if args.manifests == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the rendered manifests from stdin")?;
    } else {
        text = fs::read_to_string(&args.manifests)
            .with_context(|| format!("reading {}", args.manifests))?;
    }
    let objects = parse_documents(&text)?;
    ensure!(
        !objects.is_empty(),
        "no objects in the input: pipe `kubectl kustomize manifests/overlays/openshift` into bundle-gen"
    );
    let mut images = BTreeMap::new();
    for i in &args.images {
        let (d, r) = i
            .split_once('=')
            .with_context(|| format!("--image {i:?}: expected DEPLOYMENT=IMAGE"))?;
        images.insert(d.to_string(), r.to_string());
    }
    let opts = Options {
        version: args.version,
        images,
        created_at: args.created_at,
    };
    let files = generate(&objects, &opts)?;
    write_bundle(&args.out, &files)?;
    eprintln!(
        "bundle-gen: wrote {} files of {PACKAGE}.v{} into {}",
        files.len(),
        opts.version,
        args.out.display()
    );
    Ok(())
}

struct Options {
    version: String,
    images: BTreeMap<String, String>,
    created_at: Option<String>,
}

// ------------------------------------------------------------------ helpers

fn parse_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let v =
            Value::deserialize(doc).with_context(|| format!("YAML document {i} of the input"))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

/// Builds a mapping from (key, value) pairs, in order.
fn map<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    let mut m = Mapping::new();
    for (k, v) in pairs {
        m.insert(s(k), v);
    }
    Value::Mapping(m)
}

fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(*k))
}

fn get_str<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    get(v, path).and_then(Value::as_str)
}

fn seq<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    get(v, path)
        .and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn kind(o: &Value) -> &str {
    get_str(o, &["kind"]).unwrap_or("")
}

fn name(o: &Value) -> &str {
    get_str(o, &["metadata", "name"]).unwrap_or("")
}

fn describe(o: &Value) -> String {
    format!("{} {}", kind(o), name(o))
}

fn remove(v: &mut Value, path: &[&str]) {
    let (last, parent) = match path.split_last() {
        Some(x) => x,
        None => return,
    };
    let mut cur = v;
    for k in parent {
        match cur.get_mut(*k) {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(m) = cur.as_mapping_mut() {
        // shift_remove keeps the order of the other keys.
        m.shift_remove(*last);
    }
}

fn yaml(v: &Value) -> anyhow::Result<String> {
    serde_yaml::to_string(v).context("writing YAML")
}

// ---------------------------------------------------------------- generation

/// A Deployment of the operator and the ServiceAccount it runs as.
struct Workload<'a> {
    deployment: &'a Value,
    service_account: String,
}

fn generate(objects: &[Value], opts: &Options) -> anyhow::Result<BTreeMap<String, String>> {
    let by_kind = |k: &'static str| objects.iter().filter(move |o| kind(o) == k);
    // The operator's namespace is its Deployments' (the manifests create other
    // namespaces too, e.g. medik8s-leases).
    let namespace = by_kind("Deployment")
        .find_map(|d| get_str(d, &["metadata", "namespace"]))
        .context("the rendered manifests have no Deployment with a namespace: render manifests/overlays/openshift")?
        .to_string();
    ensure!(
        by_kind("Namespace").any(|n| name(n) == namespace),
        "the rendered manifests do not create the Deployments' namespace {namespace}: render manifests/overlays/openshift"
    );
    let other_namespaces: BTreeSet<&str> = by_kind("Namespace")
        .map(name)
        .filter(|n| *n != namespace)
        .collect();

    let workloads: Vec<Workload> = by_kind("Deployment")
        .map(|d| {
            let sa = get_str(d, &["spec", "template", "spec", "serviceAccountName"])
                .with_context(|| format!("Deployment {} sets no serviceAccountName", name(d)))?;
            Ok(Workload {
                deployment: d,
                service_account: sa.to_string(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        !workloads.is_empty(),
        "the rendered manifests have no Deployment"
    );
    for d in opts.images.keys() {
        ensure!(
            workloads.iter().any(|w| name(w.deployment) == d),
            "--image {d}=...: there is no Deployment {d}"
        );
    }
    let our_sas: BTreeSet<&str> = workloads
        .iter()
        .map(|w| w.service_account.as_str())
        .collect();

    let crds: Vec<&Value> = by_kind("CustomResourceDefinition").collect();
    ensure!(
        !crds.is_empty(),
        "the rendered manifests have no CustomResourceDefinition"
    );

    // The webhook configuration and the Service it calls.
    let webhook_configs: Vec<&Value> = by_kind("ValidatingWebhookConfiguration").collect();
    let webhook_services: BTreeSet<&str> = webhook_configs
        .iter()
        .flat_map(|c| seq(c, &["webhooks"]))
        .filter_map(|w| get_str(w, &["clientConfig", "service", "name"]))
        .collect();

    let mut files = BTreeMap::new();
    let mut cluster_permissions: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut permissions: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut bound_cluster_roles = BTreeSet::new();
    let mut bound_roles = BTreeSet::new();

    let cluster_role_rules = |role: &str| -> anyhow::Result<Vec<Value>> {
        if let Some(r) = by_kind("ClusterRole").find(|r| name(r) == role) {
            return Ok(seq(r, &["rules"]).to_vec());
        }
        well_known_cluster_role(role).with_context(|| {
            format!("ClusterRole {role} is bound to the operator but is not in the manifests; OLM needs its rules in the CSV: add the ClusterRole to the manifests")
        })
    };
    let our_subjects = |b: &Value| -> Vec<String> {
        seq(b, &["subjects"])
            .iter()
            .filter(|s| get_str(s, &["kind"]) == Some("ServiceAccount"))
            .filter(|s| get_str(s, &["namespace"]).unwrap_or(&namespace) == namespace)
            .filter_map(|s| get_str(s, &["name"]))
            .filter(|n| our_sas.contains(n))
            .map(str::to_string)
            .collect()
    };

    for b in by_kind("ClusterRoleBinding") {
        let subjects = our_subjects(b);
        if subjects.is_empty() {
            continue;
        }
        ensure!(
            subjects.len() == seq(b, &["subjects"]).len(),
            "{} binds the operator's and other subjects: split it (OLM grants the operator's part itself)",
            describe(b)
        );
        let role =
            get_str(b, &["roleRef", "name"]).context("ClusterRoleBinding without roleRef.name")?;
        let rules = cluster_role_rules(role)?;
        bound_cluster_roles.insert(role.to_string());
        for sa in subjects {
            cluster_permissions
                .entry(sa)
                .or_default()
                .extend(rules.iter().cloned());
        }
    }
    // What the CSV grants wider than `kubectl apply -k` does, for its description.
    let mut widened: Vec<String> = Vec::new();
    for b in by_kind("RoleBinding") {
        let subjects = our_subjects(b);
        if subjects.is_empty() {
            continue;
        }
        let ns = get_str(b, &["metadata", "namespace"]).unwrap_or(&namespace);
        let role = get_str(b, &["roleRef", "name"]).context("RoleBinding without roleRef.name")?;
        let rules = if get_str(b, &["roleRef", "kind"]) == Some("ClusterRole") {
            cluster_role_rules(role)?
        } else {
            bound_roles.insert((ns.to_string(), role.to_string()));
            by_kind("Role")
                .find(|r| {
                    name(r) == role
                        && get_str(r, &["metadata", "namespace"]).unwrap_or(&namespace) == ns
                })
                .map(|r| seq(r, &["rules"]).to_vec())
                .with_context(|| {
                    format!(
                        "{} refers to Role {role} in namespace {ns}, which is not in the manifests",
                        describe(b)
                    )
                })?
        };
        if ns == namespace {
            for sa in subjects {
                permissions
                    .entry(sa)
                    .or_default()
                    .extend(rules.iter().cloned());
            }
            continue;
        }
        // Another namespace: only cluster-wide in a CSV (see the top of the file).
        for sa in &subjects {
            let what: Vec<String> = rules.iter().map(rule_text).collect();
            widened.push(format!(
                "- {sa}: {} in namespace {ns} (Role {role}) becomes cluster-wide: a CSV \
                 grants namespaced rights only in the operator's own namespace",
                what.join("; ")
            ));
            if other_namespaces.contains(ns) {
                widened.push(format!(
                    "- {sa}: create on namespaces, since the bundle cannot create namespace \
                     {ns}: the operator creates it when it is missing"
                ));
            }
        }
        let create_namespace = other_namespaces.contains(ns).then(|| {
            map([
                ("apiGroups", Value::Sequence(vec![s("")])),
                ("resources", Value::Sequence(vec![s("namespaces")])),
                ("verbs", Value::Sequence(vec![s("create")])),
            ])
        });
        for sa in subjects {
            let perms = cluster_permissions.entry(sa).or_default();
            perms.extend(rules.iter().cloned());
            if let Some(rule) = &create_namespace
                && !perms.contains(rule)
            {
                perms.push(rule.clone());
            }
        }
    }

    // Objects that go into the bundle as they are (namespace removed).
    for o in objects {
        let pass = match kind(o) {
            "Namespace" | "Deployment" | "ValidatingWebhookConfiguration" | "NetworkPolicy" => {
                false
            }
            // OLM creates the Deployments' ServiceAccounts; any other ships as is.
            "ServiceAccount" => !our_sas.contains(name(o)),
            "CustomResourceDefinition" => {
                let group = get_str(o, &["spec", "group"]).unwrap_or("");
                let plural = get_str(o, &["spec", "names", "plural"]).unwrap_or("");
                files.insert(format!("manifests/{group}_{plural}.yaml"), yaml(o)?);
                false
            }
            "Service" => !webhook_services.contains(name(o)),
            "ClusterRoleBinding" | "RoleBinding" => our_subjects(o).is_empty(),
            "ClusterRole" => !bound_cluster_roles.contains(name(o)),
            "Role" => !bound_roles.contains(&(
                get_str(o, &["metadata", "namespace"])
                    .unwrap_or(&namespace)
                    .to_string(),
                name(o).to_string(),
            )),
            "PodDisruptionBudget"
            | "ConfigMap"
            | "ServiceMonitor"
            | "PrometheusRule"
            | "PriorityClass" => true,
            other => bail!(
                "{} ({other}): bundle-gen does not know how to carry this kind into an OLM bundle; teach it (tests/tools/src/bin/bundle-gen.rs)",
                describe(o)
            ),
        };
        if pass {
            let mut o = o.clone();
            remove(&mut o, &["metadata", "namespace"]);
            let api = get_str(&o, &["apiVersion"]).unwrap_or("").replace('/', "_");
            let file = format!(
                "manifests/{}_{}_{}.yaml",
                name(&o),
                api,
                kind(&o).to_ascii_lowercase()
            );
            ensure!(
                !files.contains_key(&file),
                "two objects would be written to {file}"
            );
            files.insert(file, yaml(&o)?);
        }
    }

    // Deployments.
    let mut deployments = Vec::new();
    let mut related = Vec::new();
    let mut container_image = None;
    for w in &workloads {
        let dname = name(w.deployment).to_string();
        let mut spec = get(w.deployment, &["spec"])
            .cloned()
            .with_context(|| format!("Deployment {dname} has no spec"))?;
        olm_pod_spec(&mut spec, &dname, objects)?;
        // Images: override, record as related images.
        let containers = spec
            .get_mut("template")
            .and_then(|t| t.get_mut("spec"))
            .and_then(|t| t.get_mut("containers"))
            .and_then(Value::as_sequence_mut)
            .with_context(|| format!("Deployment {dname} has no containers"))?;
        for c in containers.iter_mut() {
            if let Some(img) = opts.images.get(&dname) {
                if let Some(m) = c.as_mapping_mut() {
                    m.insert(s("image"), s(img));
                }
            }
            let img = get_str(c, &["image"])
                .with_context(|| format!("a container of Deployment {dname} has no image"))?
                .to_string();
            related.push(map([("name", s(&dname)), ("image", s(&img))]));
            if container_image.is_none() {
                container_image = Some(img);
            }
        }
        let label = get(w.deployment, &["metadata", "labels"])
            .cloned()
            .unwrap_or(Value::Mapping(Mapping::new()));
        deployments.push(map([("name", s(&dname)), ("label", label), ("spec", spec)]));
    }

    let to_perm = |m: BTreeMap<String, Vec<Value>>| -> Value {
        Value::Sequence(
            m.into_iter()
                .map(|(sa, rules)| {
                    map([
                        ("serviceAccountName", s(&sa)),
                        ("rules", Value::Sequence(rules)),
                    ])
                })
                .collect(),
        )
    };
    let mut install_spec = Mapping::new();
    install_spec.insert(s("clusterPermissions"), to_perm(cluster_permissions));
    if !permissions.is_empty() {
        install_spec.insert(s("permissions"), to_perm(permissions));
    }
    install_spec.insert(s("deployments"), Value::Sequence(deployments));

    let webhooks = webhook_definitions(&webhook_configs, objects, &workloads)?;
    let owned = crds
        .iter()
        .map(|c| owned_crd(c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let container_image = container_image.context("no container image")?;
    let alm_examples = serde_json::to_string_pretty(&serde_json::json!([{
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": "nodemaintenance-sample"},
        "spec": {"nodeName": "worker-0", "reason": "Replace a failed disk"},
    }, {
        "apiVersion": "nodemaintenance.medik8s.io/v1alpha1",
        "kind": "NodeDrainRule",
        "metadata": {"name": "batch-jobs-finish"},
        "spec": {
            "drain": {"behavior": "WaitCompleted"},
            "pods": [{"namespaceSelector": {"matchLabels": {"team": "batch"}}}],
        },
    }]))?;

    let mut annotations = Mapping::new();
    for (k, v) in [
        ("alm-examples", alm_examples.as_str()),
        ("capabilities", "Basic Install"),
        ("categories", "OpenShift Optional"),
        ("containerImage", container_image.as_str()),
    ] {
        annotations.insert(s(k), s(v));
    }
    if let Some(t) = &opts.created_at {
        annotations.insert(s("createdAt"), s(t));
    }
    for (k, v) in [
        (
            "description",
            "Puts nodes into maintenance (cordon, taint, drain) for NodeMaintenance objects; a drop-in for the medik8s Node Maintenance Operator.",
        ),
        ("features.operators.openshift.io/disconnected", "true"),
        ("features.operators.openshift.io/fips-compliant", "false"),
        ("features.operators.openshift.io/proxy-aware", "false"),
        ("features.operators.openshift.io/tls-profiles", "false"),
        ("features.operators.openshift.io/token-auth-aws", "false"),
        ("features.operators.openshift.io/token-auth-azure", "false"),
        ("features.operators.openshift.io/token-auth-gcp", "false"),
        ("features.operators.openshift.io/cnf", "false"),
        ("features.operators.openshift.io/cni", "false"),
        ("features.operators.openshift.io/csi", "false"),
        (
            "operatorframework.io/suggested-namespace",
            namespace.as_str(),
        ),
        ("repository", REPOSITORY),
        ("support", "nmo-rs"),
    ] {
        annotations.insert(s(k), s(v));
    }

    let install_modes = Value::Sequence(
        [
            ("OwnNamespace", false),
            ("SingleNamespace", false),
            ("MultiNamespace", false),
            ("AllNamespaces", true),
        ]
        .into_iter()
        .map(|(t, ok)| map([("type", s(t)), ("supported", Value::Bool(ok))]))
        .collect(),
    );

    let csv_name = format!("{PACKAGE}.v{}", opts.version);
    let mut spec = Mapping::new();
    let entries: Vec<(&str, Value)> = vec![
        ("displayName", s("Node Maintenance Operator (nmo-rs)")),
        ("description", s(&description(&widened))),
        ("version", s(&opts.version)),
        ("minKubeVersion", s(MIN_KUBE_VERSION)),
        ("maturity", s("alpha")),
        (
            "provider",
            map([("name", s("nmo-rs")), ("url", s(REPOSITORY))]),
        ),
        (
            "maintainers",
            Value::Sequence(vec![map([
                ("name", s("nmo-rs maintainers")),
                ("email", s("nmo-rs@example.invalid")),
            ])]),
        ),
        (
            "links",
            Value::Sequence(vec![
                map([("name", s("Source Code")), ("url", s(REPOSITORY))]),
                map([
                    ("name", s("Upstream Node Maintenance Operator")),
                    ("url", s(UPSTREAM)),
                ]),
            ]),
        ),
        (
            "keywords",
            Value::Sequence(
                ["medik8s", "node-maintenance", "nmo", "drain", "cordon"]
                    .map(s)
                    .to_vec(),
            ),
        ),
        (
            "icon",
            Value::Sequence(vec![map([
                ("base64data", s(&icon_base64())),
                ("mediatype", s("image/svg+xml")),
            ])]),
        ),
        ("installModes", install_modes),
        (
            "customresourcedefinitions",
            map([("owned", Value::Sequence(owned))]),
        ),
        (
            "install",
            map([
                ("strategy", s("deployment")),
                ("spec", Value::Mapping(install_spec)),
            ]),
        ),
        ("webhookdefinitions", Value::Sequence(webhooks)),
        ("relatedImages", Value::Sequence(related)),
    ];
    for (k, v) in entries {
        spec.insert(s(k), v);
    }
    let csv = map([
        ("apiVersion", s("operators.coreos.com/v1alpha1")),
        ("kind", s("ClusterServiceVersion")),
        (
            "metadata",
            map([
                ("name", s(&csv_name)),
                ("namespace", s("placeholder")),
                ("annotations", Value::Mapping(annotations)),
                (
                    "labels",
                    map([
                        // The images are indexes of linux/amd64 and linux/arm64 (make images).
                        ("operatorframework.io/arch.amd64", s("supported")),
                        ("operatorframework.io/arch.arm64", s("supported")),
                        ("operatorframework.io/os.linux", s("supported")),
                    ]),
                ),
            ]),
        ),
        ("spec", Value::Mapping(spec)),
    ]);
    files.insert(format!("manifests/{CSV_FILE}"), yaml(&csv)?);

    let bundle_annotations: [(&str, &str); 7] = [
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1",
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/",
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/",
        ),
        ("operators.operatorframework.io.bundle.package.v1", PACKAGE),
        ("operators.operatorframework.io.bundle.channels.v1", CHANNEL),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            CHANNEL,
        ),
        ("com.redhat.openshift.versions", OPENSHIFT_VERSIONS),
    ];
    let mut ann = Mapping::new();
    for (k, v) in bundle_annotations {
        ann.insert(s(k), s(v));
    }
    files.insert(
        "metadata/annotations.yaml".to_string(),
        yaml(&map([("annotations", Value::Mapping(ann))]))?,
    );
    files.insert(
        "bundle.Containerfile".to_string(),
        containerfile(&bundle_annotations, &opts.version),
    );
    Ok(files)
}

const DESCRIPTION: &str = "\
nmo-rs is a Rust re-implementation of the medik8s Node Maintenance Operator (NMO),
a drop-in replacement for it: same NodeMaintenance API, node taints, labels,
leases, events and admission rules.

Create a NodeMaintenance naming a node and the operator cordons the node, taints
it, marks it excluded from remediation (Node Health Check, Self Node Remediation)
and evicts its pods through the Eviction API, honouring PodDisruptionBudgets.
Delete the NodeMaintenance and the node is given back.

Beyond upstream: only one node drains at a time by default (further maintenances
wait their turn), and progress, failures and stuck drains are exported as
Prometheus metrics with ready-made alerts.

Only one of nmo-rs and upstream's node-maintenance-operator can be installed at a
time: both own the NodeMaintenance CRD. Existing NodeMaintenance objects are kept
when switching.
";

/// The CSV's description: [`DESCRIPTION`], then each grant OLM makes wider
/// than the kustomize install, and where least privilege is.
fn description(widened: &[String]) -> String {
    let mut text = DESCRIPTION.to_string();
    if !widened.is_empty() {
        text.push_str(
            "\nPermissions: this bundle grants more than the kustomize install \
             (manifests/ in the nmo-rs repository), because of what a CSV can express:\n",
        );
        for w in widened {
            text.push_str(w);
            text.push('\n');
        }
        text.push_str(
            "For least privilege (namespaced Roles in those namespaces), install with kustomize \
             instead.\n",
        );
    }
    text.push_str(
        "\nForcing pods past their PodDisruptionBudgets (drainTimeoutAction: Force) is off and \
         not granted: a cluster admin enables it by granting the operator's ServiceAccount \
         delete on pods (manifests/components/force-drain/rbac.yaml) and setting \
         ALLOW_FORCE_DRAIN=true in the Subscription's spec.config.env.\n",
    );
    text
}

/// One RBAC rule in words: "get, create on leases".
fn rule_text(rule: &Value) -> String {
    let list = |key: &str| -> String {
        seq(rule, &[key])
            .iter()
            .filter_map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!("{} on {}", list("verbs"), list("resources"));
    let names = list("resourceNames");
    if !names.is_empty() {
        text.push_str(&format!(" named {names}"));
    }
    text
}

/// Rules of built-in ClusterRoles that a manifest may bind without shipping.
fn well_known_cluster_role(role: &str) -> Option<Vec<Value>> {
    let rule = |group: &str, resource: &str| {
        map([
            ("apiGroups", Value::Sequence(vec![s(group)])),
            ("resources", Value::Sequence(vec![s(resource)])),
            ("verbs", Value::Sequence(vec![s("create")])),
        ])
    };
    match role {
        "system:auth-delegator" => Some(vec![
            rule("authentication.k8s.io", "tokenreviews"),
            rule("authorization.k8s.io", "subjectaccessreviews"),
        ]),
        _ => None,
    }
}

/// Pod spec changes for an OLM install (see the module docs).
fn olm_pod_spec(spec: &mut Value, deployment: &str, objects: &[Value]) -> anyhow::Result<()> {
    let pod = spec
        .get_mut("template")
        .and_then(|t| t.get_mut("spec"))
        .with_context(|| format!("Deployment {deployment} has no pod template"))?;
    remove(pod, &["securityContext", "runAsUser"]);
    remove(pod, &["securityContext", "runAsGroup"]);

    let mut dropped_mounts = BTreeSet::new();
    if let Some(containers) = pod.get_mut("containers").and_then(Value::as_sequence_mut) {
        for c in containers.iter_mut() {
            // --cert-dir=DIR or --cert-dir DIR
            let mut cert_dirs = Vec::new();
            if let Some(args) = c.get_mut("args").and_then(Value::as_sequence_mut) {
                let mut kept = Vec::new();
                let mut it = std::mem::take(args).into_iter();
                while let Some(a) = it.next() {
                    match a.as_str() {
                        Some(x) if x.starts_with("--cert-dir=") || x.starts_with("-cert-dir=") => {
                            cert_dirs.push(
                                x.split_once('=')
                                    .map(|p| p.1.to_string())
                                    .unwrap_or_default(),
                            );
                        }
                        Some("--cert-dir") | Some("-cert-dir") => {
                            let v = it
                                .next()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default();
                            cert_dirs.push(v);
                        }
                        _ => kept.push(a),
                    }
                }
                *args = kept;
            }
            if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_sequence_mut) {
                mounts.retain(|m| {
                    let path = get_str(m, &["mountPath"]).unwrap_or("");
                    let drop = cert_dirs
                        .iter()
                        .any(|d| d.trim_end_matches('/') == path.trim_end_matches('/'));
                    if drop {
                        if let Some(n) = get_str(m, &["name"]) {
                            dropped_mounts.insert(n.to_string());
                        }
                    }
                    !drop
                });
                if mounts.is_empty() {
                    remove(c, &["volumeMounts"]);
                }
            }
        }
    }
    if let Some(volumes) = pod.get_mut("volumes").and_then(Value::as_sequence_mut) {
        volumes.retain(|v| !dropped_mounts.contains(get_str(v, &["name"]).unwrap_or("")));
        if volumes.is_empty() {
            remove(pod, &["volumes"]);
        }
    }
    // A Secret volume nothing in an OLM install creates would keep the pod in
    // ContainerCreating forever.
    for v in seq(pod, &["volumes"]) {
        if let Some(secret) = get_str(v, &["secret", "secretName"]) {
            let optional = get(v, &["secret", "optional"]).and_then(Value::as_bool) == Some(true);
            let shipped = objects
                .iter()
                .any(|o| kind(o) == "Secret" && name(o) == secret);
            ensure!(
                optional || shipped,
                "Deployment {deployment} mounts Secret {secret}, which an OLM install does not create; make the volume optional or teach bundle-gen where it comes from"
            );
        }
    }
    Ok(())
}

fn webhook_definitions(
    configs: &[&Value],
    objects: &[Value],
    workloads: &[Workload],
) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for cfg in configs {
        for w in seq(cfg, &["webhooks"]) {
            let wname = get_str(w, &["name"]).context("a webhook without a name")?;
            let svc_name = get_str(w, &["clientConfig", "service", "name"])
                .with_context(|| format!("webhook {wname} is not served by a Service"))?;
            let svc_port = get(w, &["clientConfig", "service", "port"])
                .and_then(Value::as_i64)
                .unwrap_or(443);
            let path = get_str(w, &["clientConfig", "service", "path"])
                .with_context(|| format!("webhook {wname} has no path"))?;
            let svc = objects
                .iter()
                .find(|o| kind(o) == "Service" && name(o) == svc_name)
                .with_context(|| {
                    format!(
                        "webhook {wname} calls Service {svc_name}, which is not in the manifests"
                    )
                })?;
            let selector = get(svc, &["spec", "selector"])
                .and_then(Value::as_mapping)
                .with_context(|| format!("Service {svc_name} has no selector"))?;
            let workload = workloads
                .iter()
                .find(|wl| {
                    let labels = get(wl.deployment, &["spec", "template", "metadata", "labels"]);
                    selector
                        .iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
                .with_context(|| {
                    format!("no Deployment's pods match the selector of Service {svc_name}")
                })?;
            let port = seq(svc, &["spec", "ports"])
                .iter()
                .find(|p| get(p, &["port"]).and_then(Value::as_i64) == Some(svc_port))
                .with_context(|| format!("Service {svc_name} has no port {svc_port}"))?;
            let target = match get(port, &["targetPort"]) {
                Some(Value::Number(n)) => n.as_i64().context("targetPort")?,
                Some(Value::String(pname)) => seq(
                    workload.deployment,
                    &["spec", "template", "spec", "containers"],
                )
                .iter()
                .flat_map(|c| seq(c, &["ports"]))
                .find(|p| get_str(p, &["name"]) == Some(pname))
                .and_then(|p| get(p, &["containerPort"]).and_then(Value::as_i64))
                .with_context(|| {
                    format!(
                        "Service {svc_name} targets port {pname}, which no container of {} names",
                        name(workload.deployment)
                    )
                })?,
                _ => svc_port,
            };
            let mut m = Mapping::new();
            m.insert(s("type"), s("ValidatingAdmissionWebhook"));
            m.insert(s("generateName"), s(wname));
            m.insert(s("deploymentName"), s(name(workload.deployment)));
            // OLM: containerPort is the Service port the API server calls,
            // targetPort the pod's port (as in the manifests' Service).
            m.insert(s("containerPort"), Value::Number(svc_port.into()));
            m.insert(s("targetPort"), Value::Number(target.into()));
            m.insert(s("webhookPath"), s(path));
            for k in [
                "admissionReviewVersions",
                "rules",
                "failurePolicy",
                "sideEffects",
                "matchPolicy",
                "timeoutSeconds",
                "objectSelector",
            ] {
                if let Some(v) = w.get(k) {
                    m.insert(s(k), v.clone());
                }
            }
            out.push(Value::Mapping(m));
        }
    }
    Ok(out)
}

/// Descriptors shown by OLM consoles: (path in spec/status, display name, x-descriptor).
const SPEC_DESCRIPTORS: &[(&str, &str, &str)] = &[
    (
        "nodeName",
        "Node Name",
        "urn:alm:descriptor:com.tectonic.ui:text",
    ),
    (
        "reason",
        "Reason",
        "urn:alm:descriptor:com.tectonic.ui:text",
    ),
];
const STATUS_DESCRIPTORS: &[(&str, &str, &str)] = &[
    ("phase", "Phase", "urn:alm:descriptor:io.kubernetes.phase"),
    ("drainProgress", "Drain Progress", "urn:alm:descriptor:text"),
    ("lastUpdate", "Last Update", "urn:alm:descriptor:text"),
    ("lastError", "Last Error", "urn:alm:descriptor:text"),
    ("pendingPods", "Pending Pods", "urn:alm:descriptor:text"),
    (
        "pendingPodsRefs",
        "Pending Pod References",
        "urn:alm:descriptor:text",
    ),
    ("totalpods", "Total Pods", "urn:alm:descriptor:text"),
    ("evictionPods", "Eviction Pods", "urn:alm:descriptor:text"),
    (
        "errorOnLeaseCount",
        "Error On Lease Count",
        "urn:alm:descriptor:text",
    ),
];

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The NodeDrainRule's spec fields shown by the console.
const DRAIN_RULE_SPEC_DESCRIPTORS: &[(&str, &str, &str)] = &[
    ("drain", "Drain", "urn:alm:descriptor:com.tectonic.ui:text"),
    ("nodes", "Nodes", "urn:alm:descriptor:com.tectonic.ui:text"),
    ("pods", "Pods", "urn:alm:descriptor:com.tectonic.ui:text"),
];

/// What the CSV says of an owned CRD of `kind`: display name, the kinds it
/// works on (console "Resources" tab), spec and status descriptors.
type OwnedFacts = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str, &'static str)],
    &'static [(&'static str, &'static str, &'static str)],
);

fn owned_facts(kind: &str) -> OwnedFacts {
    match kind {
        "NodeDrainRule" => (
            "Node Drain Rule",
            &[
                ("Node", "nodes"),
                ("Pod", "pods"),
                ("Namespace", "namespaces"),
            ],
            DRAIN_RULE_SPEC_DESCRIPTORS,
            &[],
        ),
        // What a NodeMaintenance works on. Listing PodDisruptionBudget at v1
        // also tells the removed-API validator that the PDB read permission
        // is not for policy/v1beta1.
        _ => (
            "Node Maintenance",
            &[
                ("Node", "nodes"),
                ("Pod", "pods"),
                ("PodDisruptionBudget", "poddisruptionbudgets"),
                ("Lease", "leases"),
            ],
            SPEC_DESCRIPTORS,
            STATUS_DESCRIPTORS,
        ),
    }
}

fn owned_crd(crd: &Value) -> anyhow::Result<Value> {
    let crd_name = name(crd);
    let crd_kind =
        get_str(crd, &["spec", "names", "kind"]).context("CRD without spec.names.kind")?;
    let version = seq(crd, &["spec", "versions"])
        .iter()
        .find(|v| get(v, &["storage"]).and_then(Value::as_bool) == Some(true))
        .with_context(|| format!("CRD {crd_name} has no storage version"))?;
    let vname = get_str(version, &["name"]).context("CRD version without name")?;
    let schema = get(version, &["schema", "openAPIV3Schema"])
        .with_context(|| format!("CRD {crd_name} {vname} has no schema"))?;
    let descriptors = |part: &str, list: &[(&str, &str, &str)]| -> anyhow::Result<Value> {
        let mut out = Vec::new();
        for (path, display, xd) in list {
            let field = get(schema, &["properties", part, "properties", path]).with_context(|| {
                format!("CRD {crd_name} has no field {part}.{path}: update the descriptors in bundle-gen")
            })?;
            let desc = get_str(field, &["description"]).unwrap_or(display);
            out.push(map([
                ("path", s(path)),
                ("displayName", s(display)),
                ("description", s(&one_line(desc))),
                ("x-descriptors", Value::Sequence(vec![s(xd)])),
            ]));
        }
        Ok(Value::Sequence(out))
    };
    let description = get_str(schema, &["description"]).unwrap_or(crd_kind);
    let (display, resources, spec, status) = owned_facts(crd_kind);
    Ok(map([
        ("name", s(crd_name)),
        ("version", s(vname)),
        ("kind", s(crd_kind)),
        ("displayName", s(display)),
        ("description", s(&one_line(description))),
        (
            "resources",
            Value::Sequence(
                (resources.iter())
                    .map(|(k, n)| map([("kind", s(k)), ("name", s(n)), ("version", s("v1"))]))
                    .collect(),
            ),
        ),
        ("specDescriptors", descriptors("spec", spec)?),
        ("statusDescriptors", descriptors("status", status)?),
    ]))
}

/// A plain SVG icon: a node (rounded box) with a wrench bar.
fn icon_base64() -> String {
    use base64::Engine as _;
    const SVG: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"><rect x="6" y="14" width="52" height="36" rx="6" fill="#2b6cb0"/><rect x="14" y="22" width="36" height="4" rx="2" fill="#fff"/><rect x="14" y="30" width="24" height="4" rx="2" fill="#fff"/><circle cx="46" cy="40" r="6" fill="#f6ad55"/></svg>"##;
    base64::engine::general_purpose::STANDARD.encode(SVG)
}

fn containerfile(annotations: &[(&str, &str)], version: &str) -> String {
    let mut lines = vec![
        "# GENERATED by tests/tools/src/bin/bundle-gen.rs (make bundle): do not edit.".to_string(),
        format!("# The OLM bundle image of nmo-rs {version}. Build context: this directory."),
        format!(
            "#   podman build -f bundle/bundle.Containerfile -t quay.io/nmo-rs/nmo-bundle:{version} bundle"
        ),
        "# (make release builds it without a daemon into dist/nmo-bundle.oci.tar.)".to_string(),
        "FROM scratch".to_string(),
        "ARG REVISION=unknown".to_string(),
        "ARG CREATED=1970-01-01T00:00:00Z".to_string(),
    ];
    let mut labels: Vec<(String, String)> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in [
        ("title", "nmo-bundle".to_string()),
        (
            "description",
            "OLM bundle of nmo-rs, the Node Maintenance Operator in Rust".to_string(),
        ),
        ("version", version.to_string()),
        ("revision", "${REVISION}".to_string()),
        ("source", REPOSITORY.to_string()),
        ("licenses", "Apache-2.0".to_string()),
        ("created", "${CREATED}".to_string()),
    ] {
        labels.push((format!("org.opencontainers.image.{k}"), v));
    }
    let n = labels.len();
    for (i, (k, v)) in labels.iter().enumerate() {
        let head = if i == 0 { "LABEL" } else { "     " };
        let tail = if i + 1 < n { " \\" } else { "" };
        lines.push(format!("{head} {k}=\"{v}\"{tail}"));
    }
    lines.push("COPY manifests /manifests/".to_string());
    lines.push("COPY metadata /metadata/".to_string());
    lines.join("\n") + "\n"
}

/// Rewrites `out/manifests`, `out/metadata` and `out/bundle.Containerfile`:
/// files from an older generation never linger.
fn write_bundle(out: &Path, files: &BTreeMap<String, String>) -> anyhow::Result<()> {
    for d in ["manifests", "metadata"] {
        let p = out.join(d);
        if p.exists() {
            fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    for (rel, content) in files {
        let p = out.join(rel);
        if let Some(dir) = p.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        fs::write(&p, content).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The image tags of the base manifests are the workspace version:
    /// `make images` tags the images with it, and a release never says latest.
    #[test]
    fn manifest_image_tags_are_the_workspace_version() {
        let version = env!("CARGO_PKG_VERSION");
        let k = fs::read_to_string(repo().join("manifests/base/kustomization.yaml"))
            .expect("kustomization");
        let k: Value = serde_yaml::from_str(&k).expect("yaml");
        let images = seq(&k, &["images"]);
        assert_eq!(images.len(), 2, "one images: entry per service");
        for svc in ["controller", "webhook"] {
            let img = images
                .iter()
                .find(|i| {
                    get_str(i, &["name"]).is_some_and(|n| n.ends_with(&format!("/nmo-{svc}")))
                })
                .unwrap_or_else(|| panic!("kustomization images: has no */nmo-{svc}"));
            assert_eq!(
                get_str(img, &["newTag"]),
                Some(version),
                "kustomization newTag of nmo-{svc}"
            );
            let d =
                fs::read_to_string(repo().join(format!("manifests/base/{svc}-deployment.yaml")))
                    .expect("deployment");
            let image = d
                .lines()
                .find_map(|l| l.trim().strip_prefix("image: "))
                .expect("an image: line");
            assert_eq!(
                image,
                format!("{}:{version}", get_str(img, &["name"]).expect("name")),
                "{svc}-deployment.yaml image"
            );
        }
    }

    const FIXTURE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: nmo-system}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: nodemaintenances.nodemaintenance.medik8s.io}
spec:
  group: nodemaintenance.medik8s.io
  names: {kind: NodeMaintenance, plural: nodemaintenances}
  versions:
  - name: v1beta1
    storage: true
    schema:
      openAPIV3Schema:
        description: A maintenance.
        properties:
          spec:
            properties:
              nodeName: {type: string, description: "The node."}
              reason: {type: string}
          status:
            properties:
              phase: {type: string}
              drainProgress: {type: integer}
              lastUpdate: {type: string}
              lastError: {type: string}
              pendingPods: {type: array}
              pendingPodsRefs: {type: array}
              totalpods: {type: integer}
              evictionPods: {type: integer}
              errorOnLeaseCount: {type: integer}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: nmo-webhook, namespace: nmo-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nmo-webhook}
rules: [{apiGroups: [""], resources: [nodes], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-reader}
rules: [{nonResourceURLs: [/metrics], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nmo-webhook}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: nmo-webhook}
subjects: [{kind: ServiceAccount, name: nmo-webhook, namespace: nmo-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: nmo-webhook-auth}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:auth-delegator"}
subjects: [{kind: ServiceAccount, name: nmo-webhook, namespace: nmo-system}]
---
apiVersion: v1
kind: Service
metadata: {name: nmo-webhook-service, namespace: nmo-system}
spec:
  selector: {app: webhook}
  ports: [{name: https, port: 443, targetPort: webhook-server}]
---
apiVersion: v1
kind: Service
metadata: {name: nmo-webhook-metrics, namespace: nmo-system}
spec:
  selector: {app: webhook}
  ports: [{name: metrics, port: 8443, targetPort: metrics}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: nmo-webhook, namespace: nmo-system, labels: {app: webhook}}
spec:
  template:
    metadata: {labels: {app: webhook}}
    spec:
      serviceAccountName: nmo-webhook
      securityContext: {runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532}
      containers:
      - name: webhook
        image: quay.io/nmo-rs/nmo-webhook:0.1.0
        args: [--webhook-bind-address=:9443, --cert-dir=/certs/, --metrics-bind-address=:8443]
        ports: [{name: webhook-server, containerPort: 9443}, {name: metrics, containerPort: 8443}]
        volumeMounts: [{name: cert, mountPath: /certs}]
      volumes: [{name: cert, secret: {secretName: nmo-webhook-cert}}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: nmo-webhook, namespace: nmo-system}
spec: {minAvailable: 1}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: nmo-validating-webhook}
webhooks:
- name: vnodemaintenance.kb.io
  admissionReviewVersions: [v1]
  clientConfig:
    service: {namespace: nmo-system, name: nmo-webhook-service, path: /validate-x, port: 443}
  rules: [{apiGroups: [nodemaintenance.medik8s.io], apiVersions: [v1beta1], operations: [CREATE, UPDATE], resources: [nodemaintenances]}]
  failurePolicy: Fail
  sideEffects: None
"#;

    fn fixture_files(opts: &Options) -> BTreeMap<String, String> {
        generate(&parse_documents(FIXTURE).expect("fixture parses"), opts).expect("generates")
    }

    fn default_opts() -> Options {
        Options {
            version: "0.1.0".into(),
            images: BTreeMap::new(),
            created_at: None,
        }
    }

    #[test]
    fn csv_from_fixture() {
        let files = fixture_files(&default_opts());
        let names: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "bundle.Containerfile",
                "manifests/metrics-reader_rbac.authorization.k8s.io_v1_clusterrole.yaml",
                "manifests/nmo-webhook-metrics_v1_service.yaml",
                "manifests/nmo-webhook_policy_v1_poddisruptionbudget.yaml",
                "manifests/node-maintenance-operator-rs.clusterserviceversion.yaml",
                "manifests/nodemaintenance.medik8s.io_nodemaintenances.yaml",
                "metadata/annotations.yaml",
            ]
        );
        let csv: Value =
            serde_yaml::from_str(&files[&format!("manifests/{CSV_FILE}")]).expect("csv");
        assert_eq!(name(&csv), "node-maintenance-operator-rs.v0.1.0");
        let wh = &seq(&csv, &["spec", "webhookdefinitions"])[0];
        assert_eq!(get_str(wh, &["deploymentName"]), Some("nmo-webhook"));
        assert_eq!(
            get(wh, &["containerPort"]).and_then(Value::as_i64),
            Some(443)
        );
        assert_eq!(get(wh, &["targetPort"]).and_then(Value::as_i64), Some(9443));
        assert_eq!(get_str(wh, &["webhookPath"]), Some("/validate-x"));
        assert_eq!(get_str(wh, &["failurePolicy"]), Some("Fail"));
        let dep = &seq(&csv, &["spec", "install", "spec", "deployments"])[0];
        let pod = get(dep, &["spec", "template", "spec"]).expect("pod spec");
        let args = seq(pod, &["containers"])[0].get("args").expect("args");
        assert_eq!(
            args,
            &serde_yaml::from_str::<Value>(
                "[--webhook-bind-address=:9443, --metrics-bind-address=:8443]"
            )
            .expect("yaml")
        );
        assert!(get(pod, &["volumes"]).is_none(), "cert volume dropped");
        assert!(
            get(&seq(pod, &["containers"])[0], &["volumeMounts"]).is_none(),
            "cert mount dropped"
        );
        assert!(get(pod, &["securityContext", "runAsUser"]).is_none());
        assert_eq!(
            get(pod, &["securityContext", "runAsNonRoot"]).and_then(Value::as_bool),
            Some(true)
        );
        let perms = seq(&csv, &["spec", "install", "spec", "clusterPermissions"]);
        assert_eq!(perms.len(), 1);
        assert_eq!(
            seq(&perms[0], &["rules"]).len(),
            3,
            "own ClusterRole + system:auth-delegator"
        );
        let owned = &seq(&csv, &["spec", "customresourcedefinitions", "owned"])[0];
        assert_eq!(
            get_str(&seq(owned, &["specDescriptors"])[0], &["description"]),
            Some("The node.")
        );
        assert_eq!(
            seq(owned, &["statusDescriptors"]).len(),
            STATUS_DESCRIPTORS.len()
        );
        assert!(!files[&format!("manifests/{CSV_FILE}")].contains("createdAt"));
        let meta = &files["metadata/annotations.yaml"];
        assert!(meta.contains(
            "operators.operatorframework.io.bundle.package.v1: node-maintenance-operator-rs"
        ));
        for line in meta.lines().skip(1) {
            let key = line.trim().split(':').next().expect("key");
            assert!(
                files["bundle.Containerfile"].contains(&format!("{key}=")),
                "label {key}"
            );
        }
    }

    #[test]
    fn image_override_and_version() {
        let mut opts = default_opts();
        opts.version = "1.2.3".into();
        opts.images
            .insert("nmo-webhook".into(), "r.example/w@sha256:abc".into());
        opts.created_at = Some("2026-01-01T00:00:00Z".into());
        let files = fixture_files(&opts);
        let csv = &files[&format!("manifests/{CSV_FILE}")];
        assert!(csv.contains("name: node-maintenance-operator-rs.v1.2.3"));
        assert!(csv.contains("image: r.example/w@sha256:abc"));
        assert!(!csv.contains("nmo-webhook:0.1.0"));
        assert!(csv.contains("createdAt: "));
    }

    #[test]
    fn unknown_kinds_and_foreign_secrets_fail() {
        let mut objs = parse_documents(FIXTURE).expect("fixture");
        objs.push(
            serde_yaml::from_str("{apiVersion: v1, kind: Pod, metadata: {name: p}}").expect("yaml"),
        );
        let err = generate(&objs, &default_opts()).expect_err("fails");
        assert!(format!("{err:#}").contains("Pod p"), "{err:#}");

        let text = FIXTURE.replace("--cert-dir=/certs/, ", "");
        let err =
            generate(&parse_documents(&text).expect("yaml"), &default_opts()).expect_err("fails");
        assert!(
            format!("{err:#}").contains("mounts Secret nmo-webhook-cert"),
            "{err:#}"
        );
    }

    /// Roles in namespaces other than the operator's become cluster-wide
    /// rules (plus `create` on namespaces for one the manifests create), the
    /// operator's namespace is the Deployments' even when another Namespace
    /// sorts first, and NetworkPolicies stay out of the bundle.
    #[test]
    fn foreign_namespace_roles_become_cluster_permissions() {
        let extra = r#"
apiVersion: v1
kind: Namespace
metadata: {name: medik8s-leases}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leases, namespace: medik8s-leases}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leases, namespace: medik8s-leases}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects: [{kind: ServiceAccount, name: nmo-webhook, namespace: nmo-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: events, namespace: default}
rules: [{apiGroups: [""], resources: [events], verbs: [create]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: events, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: events}
subjects: [{kind: ServiceAccount, name: nmo-webhook, namespace: nmo-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: own, namespace: nmo-system}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [x], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: own, namespace: nmo-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: own}
subjects: [{kind: ServiceAccount, name: nmo-webhook, namespace: nmo-system}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: nmo-webhook, namespace: nmo-system}
spec: {podSelector: {}, policyTypes: [Ingress]}
"#;
        let text = format!("{extra}---{FIXTURE}");
        let files =
            generate(&parse_documents(&text).expect("yaml"), &default_opts()).expect("generates");
        assert!(
            !files
                .keys()
                .any(|f| f.contains("networkpolicy") || f.contains("_role.yaml")),
            "{:?}",
            files.keys().collect::<Vec<_>>()
        );
        let csv: Value =
            serde_yaml::from_str(&files[&format!("manifests/{CSV_FILE}")]).expect("csv");
        assert!(
            files[&format!("manifests/{CSV_FILE}")]
                .contains("operatorframework.io/suggested-namespace: nmo-system")
        );
        let cluster = seq(&csv, &["spec", "install", "spec", "clusterPermissions"]);
        assert_eq!(cluster.len(), 1);
        let rules: Vec<String> = seq(&cluster[0], &["rules"])
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        // own ClusterRole (1) + auth-delegator (2) + leases + namespaces create + events
        assert_eq!(rules.len(), 6, "{rules:#?}");
        assert!(
            rules
                .iter()
                .any(|r| r.contains("leases") && r.contains("create"))
        );
        assert!(
            rules
                .iter()
                .any(|r| r.contains("namespaces") && r.contains("create"))
        );
        assert!(rules.iter().any(|r| r.contains("events")));
        // The description names each widened grant and why (issue 22).
        let description = get_str(&csv, &["spec", "description"]).expect("description");
        for line in [
            "- nmo-webhook: get, create on leases in namespace medik8s-leases (Role leases) \
             becomes cluster-wide",
            "- nmo-webhook: create on namespaces, since the bundle cannot create namespace \
             medik8s-leases",
            "- nmo-webhook: create on events in namespace default (Role events) becomes cluster-wide",
            "install with kustomize",
        ] {
            assert!(description.contains(line), "{line:?} in:\n{description}");
        }
        assert!(
            !description.contains("Role own"),
            "the own namespace is not widened"
        );
        let own = seq(&csv, &["spec", "install", "spec", "permissions"]);
        assert_eq!(
            own.len(),
            1,
            "the operator namespace's Role stays a permission"
        );
        assert!(
            serde_json::to_string(&own[0])
                .expect("json")
                .contains("resourceNames")
        );
    }
}
