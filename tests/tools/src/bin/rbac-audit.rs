//! `rbac-audit`: proves the manifests' RBAC is the least that works, from the
//! API server's audit log of an integration run.
//!
//! ```sh
//! rbac-audit --kustomize manifests/base --kustomize manifests/overlays/openshift \
//!   --audit-log .cluster/audit/audit.log --since 2026-01-01T10:00:00.000000Z \
//!   --allow tests/cluster/rbac-audit-allow.yaml --namespace-copy 'nmo-system-*=nmo-system'
//! ```
//! (`make test` runs it after the integration tests: tests/run-tests.sh.)
//!
//! The ServiceAccounts are those the manifests' Deployments run as; their
//! grants are every rule of every Role and ClusterRole the manifests bind to
//! them, each expanded into (verb, apiGroup, resource[/subresource],
//! namespace or cluster-wide, resourceNames). Their requests are the audit
//! events of that user since `--since` (tests/cluster/audit-policy.yaml logs
//! them at Metadata level). It fails, naming each, on:
//! - a request the authorizer refused (403 with decision "forbid"; a 403 from
//!   an admission plugin, e.g. a test's ValidatingAdmissionPolicy, is not a
//!   privilege problem and is only listed);
//! - a request no grant of the manifests covers (it only worked thanks to a
//!   grant from elsewhere, e.g. a test), except what every authenticated user
//!   may do (discovery, self-reviews);
//! - a grant no request used, unless the allowlist names it and says why;
//! - a cluster-wide grant whose requests were all in one namespace (it should
//!   be a Role there);
//! - an allowlist entry that excuses nothing (stale).
//!
//! `--namespace-copy 'PREFIX*=NS'`: requests in namespaces named PREFIX...
//! count as requests in NS. The tests give each controller a private copy of
//! nmo-system with the manifests' Roles of nmo-system in it (see
//! `nmo_tests::manifests::operator_namespace_copy`), so parallel tests elect
//! leaders apart under exactly those rules.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use jiff::Timestamp;
use serde::Deserialize;
use serde_yaml::Value;

#[derive(Parser, Debug)]
#[command(
    about = "Compare what the operator's ServiceAccounts did (API server audit log) with what the manifests grant them"
)]
struct Args {
    /// A kustomize directory to render with `$KUBECTL kustomize` (default
    /// kubectl: .cluster/bin/kubectl). Repeatable; the RBAC objects of all
    /// are merged (same kind, namespace and name: one object).
    #[arg(long)]
    kustomize: Vec<PathBuf>,
    /// Already rendered manifests (multi-document YAML). Repeatable.
    #[arg(long)]
    manifests: Vec<PathBuf>,
    /// The API server's audit log (JSON lines); rotated siblings
    /// (`<stem>-<time>.<ext>`) are read too.
    #[arg(long)]
    audit_log: PathBuf,
    /// Only requests received at or after this time (RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Allowlist of grants the run may leave unused (YAML, see
    /// tests/cluster/rbac-audit-allow.yaml).
    /// Repeatable: the entries of every file count.
    #[arg(long)]
    allow: Vec<PathBuf>,
    /// `PREFIX*=NAMESPACE`: namespaces named PREFIX... stand in for NAMESPACE.
    #[arg(long, value_name = "PREFIX*=NAMESPACE")]
    namespace_copy: Vec<String>,
    /// An OLM ClusterServiceVersion whose RBAC to judge instead of (or with)
    /// manifests: its `clusterPermissions` become cluster-wide grants, its
    /// `permissions` grants in `--csv-namespace`, its deployments' service
    /// accounts the ones judged (as OLM installs them).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// The namespace OLM installs the CSV into.
    #[arg(long, default_value = "nmo-system")]
    csv_namespace: String,
}

/// The RBAC objects OLM creates from a ClusterServiceVersion installed in
/// `namespace` (nmo_tests::olm::rbac_objects), plus a Deployment per install
/// deployment so its ServiceAccount is judged.
fn csv_objects(csv: &Value, namespace: &str) -> anyhow::Result<Vec<Value>> {
    let install = nmo_tests::olm::install_spec(csv)?;
    let mut out = Vec::new();
    for d in install
        .get("deployments")
        .and_then(Value::as_sequence)
        .cloned()
        .unwrap_or_default()
    {
        let name = get_str(&d, &["name"]).context("a CSV deployment without a name")?;
        let spec = d.get("spec").cloned().unwrap_or(Value::Null);
        out.push(serde_yaml::from_str::<Value>(&format!(
            "{{kind: Deployment, metadata: {{name: {name}, namespace: {namespace}}}}}"
        ))?);
        if let (Some(Value::Mapping(last)), Value::Mapping(spec)) = (out.last_mut(), spec) {
            last.insert("spec".into(), Value::Mapping(spec));
        }
    }
    out.extend(nmo_tests::olm::rbac_objects(csv, namespace)?);
    Ok(out)
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rbac-audit: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> anyhow::Result<bool> {
    let mut objects = Vec::new();
    for dir in &args.kustomize {
        let text = kustomize(dir)?;
        objects.extend(
            parse_documents(&text)
                .with_context(|| format!("the output of kubectl kustomize {}", dir.display()))?,
        );
    }
    for f in &args.manifests {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        objects.extend(parse_documents(&text).with_context(|| format!("{}", f.display()))?);
    }
    if let Some(path) = &args.csv {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let csv: Value =
            serde_yaml::from_str(&text).with_context(|| format!("{}", path.display()))?;
        objects.extend(
            csv_objects(&csv, &args.csv_namespace)
                .with_context(|| format!("the RBAC of {}", path.display()))?,
        );
    }
    ensure!(
        !objects.is_empty(),
        "no manifests: pass --kustomize manifests/base (or --manifests FILE, or --csv FILE)"
    );
    let rbac = Rbac::from_objects(&objects)?;
    let since = match &args.since {
        Some(s) => Some(
            s.parse::<Timestamp>()
                .with_context(|| format!("--since {s:?} is not an RFC 3339 time"))?,
        ),
        None => None,
    };
    let copies = args
        .namespace_copy
        .iter()
        .map(|c| NamespaceCopy::parse(c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut allow = Allowlist::default();
    for p in &args.allow {
        allow.entries.extend(Allowlist::read(p)?.entries);
    }
    let log = read_audit_log(&args.audit_log, &rbac.users(), since)?;
    let report = audit(&rbac, &log.requests, &allow, &copies);
    print!("{}", report.render(&log, since));
    Ok(report.failures.is_empty())
}

fn kustomize(dir: &Path) -> anyhow::Result<String> {
    let kubectl = std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| nmo_tests::repo_root().join(".cluster/bin/kubectl"));
    let out = Command::new(&kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| {
            format!(
                "running {} kustomize {} (set KUBECTL, or start the local plane: make cluster-up)",
                kubectl.display(),
                dir.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "{} kustomize {} failed: {}",
            kubectl.display(),
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("kustomize output is not UTF-8")
}

fn parse_documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(doc).with_context(|| format!("YAML document {i}"))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn get_str<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(v, |cur, k| cur.get(*k))
        .and_then(Value::as_str)
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

// ------------------------------------------------------------------ grants

/// One (verb, resource) a rule gives one ServiceAccount, in one scope.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    /// `namespace/name` of the ServiceAccount.
    sa: String,
    verb: String,
    what: Target,
    /// None: cluster-wide (a ClusterRoleBinding).
    namespace: Option<String>,
    /// resourceNames of the rule (empty: any name).
    names: Vec<String>,
    /// "ClusterRole x (ClusterRoleBinding y)".
    source: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// apiGroup and resource, `res/sub` for a subresource.
    Resource {
        group: String,
        resource: String,
    },
    NonResource(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Resource { group, resource } if group.is_empty() => write!(f, "{resource}"),
            Target::Resource { group, resource } => write!(f, "{group}/{resource}"),
            Target::NonResource(url) => write!(f, "URL {url}"),
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.what)?;
        if !self.names.is_empty() {
            write!(f, " named {}", self.names.join(","))?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}")?,
            None => write!(f, " cluster-wide")?,
        }
        write!(f, " [{}]", self.source)
    }
}

impl Grant {
    fn covers(&self, r: &Request) -> bool {
        if self.sa != r.sa || !(self.verb == "*" || self.verb == r.verb) {
            return false;
        }
        match (&self.what, &r.what) {
            (Target::NonResource(pattern), Target::NonResource(path)) => {
                pattern == path
                    || pattern == "*"
                    || pattern
                        .strip_suffix('*')
                        .is_some_and(|p| path.starts_with(p))
            }
            (
                Target::Resource { group, resource },
                Target::Resource {
                    group: rg,
                    resource: rr,
                },
            ) => {
                let group_ok = group == "*" || group == rg;
                let resource_ok = resource == "*"
                    || resource == rr
                    || resource
                        .strip_suffix("/*")
                        .is_some_and(|base| rr.split_once('/').is_some_and(|(b, _)| b == base))
                    || resource
                        .strip_prefix("*/")
                        .is_some_and(|sub| rr.split_once('/').is_some_and(|(_, s)| s == sub));
                let ns_ok = match &self.namespace {
                    None => true,
                    Some(ns) => r.namespace.as_deref() == Some(ns.as_str()),
                };
                // RBAC never lets a name-restricted rule allow a create (the
                // name is not known to the authorizer) or a collection request.
                let names_ok = self.names.is_empty()
                    || (r.verb != "create"
                        && r.name.as_ref().is_some_and(|n| self.names.contains(n)));
                group_ok && resource_ok && ns_ok && names_ok
            }
            _ => false,
        }
    }
}

/// The ServiceAccounts of the Deployments and what the manifests grant them.
struct Rbac {
    /// `namespace/name` of each ServiceAccount a Deployment runs as.
    service_accounts: BTreeSet<String>,
    grants: Vec<Grant>,
}

impl Rbac {
    fn from_objects(objects: &[Value]) -> anyhow::Result<Rbac> {
        // Same kind, namespace and name: one object (the overlays repeat base).
        let mut unique: BTreeMap<(String, String, String), &Value> = BTreeMap::new();
        for o in objects {
            let key = (
                get_str(o, &["kind"]).unwrap_or_default().to_string(),
                get_str(o, &["metadata", "namespace"])
                    .unwrap_or_default()
                    .to_string(),
                get_str(o, &["metadata", "name"])
                    .unwrap_or_default()
                    .to_string(),
            );
            if let Some(prev) = unique.insert(key.clone(), o) {
                ensure!(
                    prev.get("rules") == o.get("rules")
                        && prev.get("subjects") == o.get("subjects")
                        && prev.get("roleRef") == o.get("roleRef"),
                    "{} {}/{} differs between the rendered manifests: judge one variant at a time",
                    key.0,
                    key.1,
                    key.2
                );
            }
        }
        let of_kind = |k: &'static str| {
            unique
                .iter()
                .filter(move |((kind, _, _), _)| kind == k)
                .map(|(key, v)| (key, *v))
        };
        let mut service_accounts = BTreeSet::new();
        for ((_, ns, _), d) in of_kind("Deployment") {
            let sa = get_str(d, &["spec", "template", "spec", "serviceAccountName"])
                .unwrap_or("default");
            let ns = if ns.is_empty() { "default" } else { ns };
            service_accounts.insert(format!("{ns}/{sa}"));
        }
        ensure!(
            !service_accounts.is_empty(),
            "the manifests have no Deployment, so no ServiceAccount to judge"
        );

        let mut grants = Vec::new();
        for kind in ["ClusterRoleBinding", "RoleBinding"] {
            for ((_, bns, bname), b) in of_kind(kind) {
                let subjects: Vec<String> = b
                    .get("subjects")
                    .and_then(Value::as_sequence)
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter(|s| get_str(s, &["kind"]) == Some("ServiceAccount"))
                    .map(|s| {
                        format!(
                            "{}/{}",
                            get_str(s, &["namespace"]).unwrap_or(bns),
                            get_str(s, &["name"]).unwrap_or_default()
                        )
                    })
                    .filter(|sa| service_accounts.contains(sa))
                    .collect();
                if subjects.is_empty() {
                    continue;
                }
                let role_kind = get_str(b, &["roleRef", "kind"]).unwrap_or_default();
                let role_name = get_str(b, &["roleRef", "name"]).unwrap_or_default();
                let role_ns = if role_kind == "Role" {
                    bns.as_str()
                } else {
                    ""
                };
                ensure!(
                    !(kind == "ClusterRoleBinding" && role_kind == "Role"),
                    "{kind} {bname} refers to a Role: invalid"
                );
                let role = unique
                    .get(&(role_kind.to_string(), role_ns.to_string(), role_name.to_string()))
                    .with_context(|| {
                        format!(
                            "{kind} {bname} binds {role_kind} {role_name}, which the manifests do not define: rbac-audit cannot tell what it grants; define it in the manifests"
                        )
                    })?;
                let namespace = (kind == "RoleBinding").then(|| bns.clone());
                let source = match &namespace {
                    Some(ns) => format!("{role_kind} {role_name} ({kind} {ns}/{bname})"),
                    None => format!("{role_kind} {role_name} ({kind} {bname})"),
                };
                ensure!(
                    role.get("aggregationRule").is_none(),
                    "{role_kind} {role_name} aggregates other roles: rbac-audit does not follow aggregation"
                );
                let rules = role
                    .get("rules")
                    .and_then(Value::as_sequence)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                for rule in rules {
                    let verbs = strings(rule, "verbs");
                    let names = strings(rule, "resourceNames");
                    let mut targets = Vec::new();
                    for url in strings(rule, "nonResourceURLs") {
                        targets.push(Target::NonResource(url));
                    }
                    for group in strings(rule, "apiGroups") {
                        for resource in strings(rule, "resources") {
                            targets.push(Target::Resource {
                                group: group.clone(),
                                resource,
                            });
                        }
                    }
                    for sa in &subjects {
                        for verb in &verbs {
                            for what in &targets {
                                grants.push(Grant {
                                    sa: sa.clone(),
                                    verb: verb.clone(),
                                    what: what.clone(),
                                    namespace: namespace.clone(),
                                    names: names.clone(),
                                    source: source.clone(),
                                });
                            }
                        }
                    }
                }
            }
        }
        grants.sort();
        grants.dedup();
        Ok(Rbac {
            service_accounts,
            grants,
        })
    }

    /// Audit user name -> `namespace/name`.
    fn users(&self) -> BTreeMap<String, String> {
        self.service_accounts
            .iter()
            .filter_map(|sa| {
                let (ns, name) = sa.split_once('/')?;
                Some((format!("system:serviceaccount:{ns}:{name}"), sa.clone()))
            })
            .collect()
    }
}

// ---------------------------------------------------------------- requests

/// One request of one of our ServiceAccounts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    sa: String,
    verb: String,
    what: Target,
    namespace: Option<String>,
    name: Option<String>,
    code: Option<u16>,
    uri: String,
    time: String,
    message: String,
    /// The authorizer's reason (audit annotation authorization.k8s.io/reason),
    /// e.g. which binding allowed it.
    reason: String,
    /// The authorizer's decision (authorization.k8s.io/decision): "allow" or
    /// "forbid"; empty in logs without it.
    decision: String,
}

impl Request {
    /// Refused by RBAC: a 403 the authorizer did not allow. A 403 of a
    /// request the authorizer allowed came from admission (a policy or a
    /// webhook said no), which no grant could change.
    fn forbidden(&self) -> bool {
        self.code == Some(403) && self.decision != "allow"
    }

    fn describe(&self) -> String {
        let mut s = format!("{} {}", self.verb, self.what);
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => s.push_str(&format!(" {ns}/{n}")),
            (Some(ns), None) => s.push_str(&format!(" in namespace {ns}")),
            (None, Some(n)) => s.push_str(&format!(" {n}")),
            (None, None) => {}
        }
        s
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    #[serde(default)]
    stage: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    user: AuditUser,
    object_ref: Option<AuditObjectRef>,
    response_status: Option<AuditStatus>,
    #[serde(default)]
    request_received_timestamp: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
struct AuditUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditObjectRef {
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    api_group: Option<String>,
    subresource: Option<String>,
}

#[derive(Deserialize)]
struct AuditStatus {
    code: Option<u16>,
    #[serde(default)]
    message: String,
}

/// What was read from the audit log.
struct AuditLog {
    requests: Vec<Request>,
    files: Vec<PathBuf>,
    lines: usize,
    unreadable: usize,
}

/// The log file and its rotated siblings (`audit-<time>.log` next to
/// `audit.log`), oldest first.
fn audit_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .with_context(|| format!("{} is not a file name", path.display()))?;
    let (stem, ext) = match file.rsplit_once('.') {
        Some((s, e)) => (s.to_string(), format!(".{e}")),
        None => (file.to_string(), String::new()),
    };
    let mut rotated = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&format!("{stem}-")) && n.ends_with(&ext) {
                rotated.push(e.path());
            }
        }
    }
    rotated.sort();
    rotated.push(path.to_path_buf());
    Ok(rotated)
}

fn read_audit_log(
    path: &Path,
    users: &BTreeMap<String, String>,
    since: Option<Timestamp>,
) -> anyhow::Result<AuditLog> {
    if !path.exists() {
        bail!(
            "no audit log at {}: the running control plane was started without the audit flags. \
             tests/cluster/up.sh replaces such a plane (when nobody else is using it: \
             bash tests/cluster/up.sh), then run the suite again",
            path.display()
        );
    }
    let files = audit_files(path)?;
    let mut lines = 0;
    let mut unreadable = 0;
    let mut by_id: HashMap<String, (u8, Request)> = HashMap::new();
    for f in &files {
        let file = std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?;
        for line in BufReader::new(file).lines() {
            let line = line.with_context(|| format!("reading {}", f.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            lines += 1;
            let Ok(ev) = serde_json::from_str::<AuditEvent>(&line) else {
                // A line cut by a crash or being written right now.
                unreadable += 1;
                continue;
            };
            let Some(sa) = users.get(&ev.user.username) else {
                continue;
            };
            if let Some(since) = since {
                match ev.request_received_timestamp.parse::<Timestamp>() {
                    Ok(t) if t >= since => {}
                    Ok(_) => continue,
                    Err(_) => {
                        unreadable += 1;
                        continue;
                    }
                }
            }
            let rank = match ev.stage.as_str() {
                "ResponseComplete" | "Panic" => 2,
                "ResponseStarted" => 1,
                _ => 0,
            };
            let req = to_request(sa, &ev);
            match by_id.get(&ev.audit_id) {
                Some((r, _)) if *r >= rank => {}
                _ => {
                    by_id.insert(ev.audit_id.clone(), (rank, req));
                }
            }
        }
    }
    let mut requests: Vec<Request> = by_id.into_values().map(|(_, r)| r).collect();
    requests.sort_by(|a, b| a.time.cmp(&b.time));
    Ok(AuditLog {
        requests,
        files,
        lines,
        unreadable,
    })
}

fn to_request(sa: &str, ev: &AuditEvent) -> Request {
    let what = match &ev.object_ref {
        Some(o) if o.resource.is_some() => {
            let mut resource = o.resource.clone().unwrap_or_default();
            if let Some(sub) = o.subresource.as_deref().filter(|s| !s.is_empty()) {
                resource = format!("{resource}/{sub}");
            }
            Target::Resource {
                group: o.api_group.clone().unwrap_or_default(),
                resource,
            }
        }
        _ => Target::NonResource(
            ev.request_uri
                .split('?')
                .next()
                .unwrap_or_default()
                .to_string(),
        ),
    };
    let obj = ev.object_ref.as_ref();
    Request {
        sa: sa.to_string(),
        verb: ev.verb.clone(),
        what,
        namespace: obj
            .and_then(|o| o.namespace.clone())
            .filter(|n| !n.is_empty()),
        name: obj.and_then(|o| o.name.clone()).filter(|n| !n.is_empty()),
        code: ev.response_status.as_ref().and_then(|s| s.code),
        uri: ev.request_uri.clone(),
        time: ev.request_received_timestamp.clone(),
        message: ev
            .response_status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default(),
        reason: ev
            .annotations
            .get("authorization.k8s.io/reason")
            .cloned()
            .unwrap_or_default(),
        decision: ev
            .annotations
            .get("authorization.k8s.io/decision")
            .cloned()
            .unwrap_or_default(),
    }
}

/// `PREFIX*=NAMESPACE`.
#[derive(Debug, Clone)]
struct NamespaceCopy {
    prefix: String,
    namespace: String,
}

impl NamespaceCopy {
    fn parse(s: &str) -> anyhow::Result<NamespaceCopy> {
        let (pattern, namespace) = s
            .split_once('=')
            .with_context(|| format!("--namespace-copy {s:?}: expected PREFIX*=NAMESPACE"))?;
        let prefix = pattern.strip_suffix('*').with_context(|| {
            format!("--namespace-copy {s:?}: the pattern must end in * (PREFIX*=NAMESPACE)")
        })?;
        ensure!(
            !prefix.is_empty() && !namespace.is_empty(),
            "--namespace-copy {s:?}: empty prefix or namespace"
        );
        Ok(NamespaceCopy {
            prefix: prefix.to_string(),
            namespace: namespace.to_string(),
        })
    }

    fn apply(copies: &[NamespaceCopy], ns: &str) -> Option<String> {
        copies
            .iter()
            .find(|c| ns.starts_with(&c.prefix))
            .map(|c| c.namespace.clone())
    }
}

// --------------------------------------------------------------- allowlist

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AllowEntry {
    /// `namespace/name`.
    service_account: String,
    verb: String,
    #[serde(default)]
    api_group: String,
    resource: String,
    /// The grant's namespace; absent for a cluster-wide grant.
    #[serde(default)]
    namespace: Option<String>,
    why: String,
}

impl AllowEntry {
    fn matches(&self, g: &Grant) -> bool {
        self.service_account == g.sa
            && self.verb == g.verb
            && self.namespace == g.namespace
            && matches!(&g.what, Target::Resource { group, resource }
                if *group == self.api_group && *resource == self.resource)
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = Target::Resource {
            group: self.api_group.clone(),
            resource: self.resource.clone(),
        };
        write!(f, "{}: {} {what}", self.service_account, self.verb)?;
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " cluster-wide"),
        }
    }
}

#[derive(Debug, Default)]
struct Allowlist {
    entries: Vec<AllowEntry>,
}

impl Allowlist {
    fn parse(text: &str, origin: &str) -> anyhow::Result<Allowlist> {
        let entries: Option<Vec<AllowEntry>> =
            serde_yaml::from_str(text).with_context(|| format!("{origin}: not a list of entries (serviceAccount, verb, apiGroup, resource, namespace, why)"))?;
        let entries = entries.unwrap_or_default();
        for e in &entries {
            ensure!(
                !e.why.trim().is_empty(),
                "{origin}: entry {e} says no `why`: every allowed grant needs its reason"
            );
        }
        Ok(Allowlist { entries })
    }

    fn read(path: &Path) -> anyhow::Result<Allowlist> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the allowlist {}", path.display()))?;
        Allowlist::parse(&text, &path.display().to_string())
    }
}

// ------------------------------------------------------------------- audit

#[derive(Debug, PartialEq, Eq)]
enum Failure {
    Forbidden {
        sa: String,
        request: String,
        count: usize,
        first: String,
        message: String,
    },
    Ungranted {
        sa: String,
        request: String,
        count: usize,
        reason: String,
    },
    Unused {
        grant: String,
    },
    OneNamespace {
        grant: String,
        namespace: String,
        count: usize,
    },
    StaleAllow {
        entry: String,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Forbidden {
                sa,
                request,
                count,
                first,
                message,
            } => write!(
                f,
                "forbidden: {sa} was refused {request} ({count}x, first at {first}): {message}\n      fix: grant it in the manifests if the service needs it, or stop the service from asking"
            ),
            Failure::Ungranted {
                sa,
                request,
                count,
                reason,
            } => write!(
                f,
                "not granted by the manifests: {sa} did {request} ({count}x) and was allowed by some other grant (a test's?)\n      authorizer: {}\n      fix: add it to the manifests' RBAC, or remove the grant that let it through",
                if reason.is_empty() {
                    "(no reason logged)"
                } else {
                    reason
                }
            ),
            Failure::Unused { grant } => write!(
                f,
                "unused grant: {grant}\n      fix: remove it from the manifests, or (if needed outside the suite) list it with the reason in tests/cluster/rbac-audit-allow.yaml"
            ),
            Failure::OneNamespace {
                grant,
                namespace,
                count,
            } => write!(
                f,
                "cluster-wide grant used in one namespace only: {grant}: all {count} requests were in namespace {namespace}\n      fix: make it a Role + RoleBinding in {namespace}"
            ),
            Failure::StaleAllow { entry } => write!(
                f,
                "allowlist entry excuses nothing: {entry}\n      fix: the grant is used now (or gone): remove the entry from tests/cluster/rbac-audit-allow.yaml"
            ),
        }
    }
}

/// How one grant fared.
#[derive(Debug)]
struct GrantUse {
    grant: Grant,
    requests: usize,
    namespaces: BTreeSet<Option<String>>,
    allowed_by: Option<AllowEntry>,
}

struct Report {
    uses: Vec<GrantUse>,
    failures: Vec<Failure>,
    requests: usize,
    copies_seen: BTreeSet<String>,
}

/// Requests every authenticated user may make (bootstrap ClusterRoles
/// system:discovery, system:basic-user, system:public-info-viewer).
fn baseline(r: &Request) -> bool {
    match &r.what {
        Target::NonResource(path) => {
            r.verb == "get"
                && ([
                    "/api", "/apis", "/version", "/healthz", "/livez", "/readyz", "/openapi",
                ]
                .iter()
                .any(|p| path == p || path.starts_with(&format!("{p}/"))))
        }
        Target::Resource { group, resource } => {
            r.verb == "create"
                && ((group == "authorization.k8s.io"
                    && (resource == "selfsubjectaccessreviews"
                        || resource == "selfsubjectrulesreviews"))
                    || (group == "authentication.k8s.io" && resource == "selfsubjectreviews"))
        }
    }
}

fn audit(rbac: &Rbac, requests: &[Request], allow: &Allowlist, copies: &[NamespaceCopy]) -> Report {
    let mut failures = Vec::new();
    let mut copies_seen = BTreeSet::new();
    // Namespace copies stand in for their original.
    let requests: Vec<Request> = requests
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if let Some(ns) = r.namespace.as_deref()
                && let Some(orig) = NamespaceCopy::apply(copies, ns)
            {
                copies_seen.insert(ns.to_string());
                r.namespace = Some(orig);
            }
            r
        })
        .collect();

    // Forbidden answers, grouped by what was asked.
    let mut forbidden: BTreeMap<(String, String), (usize, String, String)> = BTreeMap::new();
    for r in requests.iter().filter(|r| r.forbidden()) {
        let e = forbidden.entry((r.sa.clone(), r.describe())).or_insert((
            0,
            r.time.clone(),
            r.message.clone(),
        ));
        e.0 += 1;
    }
    for ((sa, request), (count, first, message)) in forbidden {
        failures.push(Failure::Forbidden {
            sa,
            request,
            count,
            first,
            message,
        });
    }

    let mut uses: Vec<GrantUse> = rbac
        .grants
        .iter()
        .map(|g| GrantUse {
            grant: g.clone(),
            requests: 0,
            namespaces: BTreeSet::new(),
            allowed_by: None,
        })
        .collect();
    let mut ungranted: BTreeMap<(String, String), (usize, String)> = BTreeMap::new();
    for r in requests.iter().filter(|r| !r.forbidden()) {
        let mut covered = false;
        for u in uses.iter_mut().filter(|u| u.grant.covers(r)) {
            covered = true;
            u.requests += 1;
            u.namespaces.insert(r.namespace.clone());
        }
        if !covered && !baseline(r) {
            // Collections and objects alike: the name does not matter here.
            let mut key = r.clone();
            key.name = None;
            ungranted
                .entry((r.sa.clone(), key.describe()))
                .or_insert((0, r.reason.clone()))
                .0 += 1;
        }
    }
    for ((sa, request), (count, reason)) in ungranted {
        failures.push(Failure::Ungranted {
            sa,
            request,
            count,
            reason,
        });
    }

    let mut allow_used = vec![false; allow.entries.len()];
    for u in &mut uses {
        let finding = if u.requests == 0 {
            Some(Failure::Unused {
                grant: format!("{}: {}", u.grant.sa, u.grant),
            })
        } else if u.grant.namespace.is_none() && u.namespaces.len() == 1 {
            match u.namespaces.iter().next() {
                Some(Some(ns)) => Some(Failure::OneNamespace {
                    grant: format!("{}: {}", u.grant.sa, u.grant),
                    namespace: ns.clone(),
                    count: u.requests,
                }),
                _ => None,
            }
        } else {
            None
        };
        let Some(finding) = finding else { continue };
        match allow.entries.iter().position(|e| e.matches(&u.grant)) {
            Some(i) => {
                allow_used[i] = true;
                u.allowed_by = Some(allow.entries[i].clone());
            }
            None => failures.push(finding),
        }
    }
    for (e, used) in allow.entries.iter().zip(allow_used) {
        if !used {
            failures.push(Failure::StaleAllow {
                entry: e.to_string(),
            });
        }
    }
    Report {
        uses,
        failures,
        requests: requests.len(),
        copies_seen,
    }
}

impl Report {
    fn render(&self, log: &AuditLog, since: Option<Timestamp>) -> String {
        let mut out = String::new();
        let files: Vec<String> = log.files.iter().map(|f| f.display().to_string()).collect();
        out.push_str(&format!(
            "rbac-audit: {} requests of the operator's ServiceAccounts{} in {} ({} lines{})\n",
            self.requests,
            since.map(|s| format!(" since {s}")).unwrap_or_default(),
            files.join(", "),
            log.lines,
            if log.unreadable > 0 {
                format!(", {} unreadable skipped", log.unreadable)
            } else {
                String::new()
            }
        ));
        if !self.copies_seen.is_empty() {
            out.push_str(&format!(
                "  {} test copies of the operator's namespace counted as the original\n",
                self.copies_seen.len()
            ));
        }
        let mut by_sa: BTreeMap<&str, Vec<&GrantUse>> = BTreeMap::new();
        for u in &self.uses {
            by_sa.entry(u.grant.sa.as_str()).or_default().push(u);
        }
        for (sa, uses) in by_sa {
            out.push_str(&format!("{sa}: {} grants\n", uses.len()));
            for u in uses {
                let status = match (&u.allowed_by, u.requests) {
                    (Some(_), _) => "allowed".to_string(),
                    (None, 0) => "UNUSED".to_string(),
                    (None, n) => format!("{n}"),
                };
                let ns: Vec<String> = u
                    .namespaces
                    .iter()
                    .map(|n| n.clone().unwrap_or_else(|| "(cluster)".into()))
                    .collect();
                let spread = if u.grant.namespace.is_none() && !ns.is_empty() {
                    if ns.len() > 3 {
                        format!(" <- {} namespaces", ns.len())
                    } else {
                        format!(" <- {}", ns.join(", "))
                    }
                } else {
                    String::new()
                };
                out.push_str(&format!("  {status:>8}  {}{spread}\n", u.grant));
                if let Some(a) = &u.allowed_by {
                    out.push_str(&format!("            allowlisted: {}\n", a.why.trim()));
                }
            }
        }
        if self.failures.is_empty() {
            out.push_str(
                "rbac-audit: ok: every grant used, none wider than its use, no request forbidden\n",
            );
        } else {
            out.push_str(&format!("rbac-audit: FAILED ({}):\n", self.failures.len()));
            for f in &self.failures {
                out.push_str(&format!("  FAIL {f}\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: ctrl, namespace: op}
spec: {template: {spec: {serviceAccountName: ctrl}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ctrl}
rules:
- {apiGroups: [""], resources: [nodes], verbs: [get, patch]}
- {apiGroups: [""], resources: [pods/eviction], verbs: [create]}
- {apiGroups: [""], resources: [events], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ctrl}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ctrl}
subjects: [{kind: ServiceAccount, name: ctrl, namespace: op}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: le, namespace: op}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [lead], verbs: [get]}
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: le, namespace: op}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: le}
subjects: [{kind: ServiceAccount, name: ctrl, namespace: op}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: someone-else}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: not-defined}
subjects: [{kind: ServiceAccount, name: prometheus, namespace: mon}]
"#;

    fn rbac() -> Rbac {
        Rbac::from_objects(&parse_documents(MANIFESTS).expect("fixture")).expect("rbac")
    }

    fn req(
        verb: &str,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
        code: u16,
    ) -> Request {
        Request {
            sa: "op/ctrl".into(),
            verb: verb.into(),
            what: Target::Resource {
                group: group.into(),
                resource: resource.into(),
            },
            namespace: ns.map(str::to_string),
            name: name.map(str::to_string),
            code: Some(code),
            uri: format!("/{resource}"),
            time: "2026-01-01T00:00:00.000000Z".into(),
            message: if code == 403 {
                "nope".into()
            } else {
                String::new()
            },
            reason: String::new(),
            decision: if code == 403 { "forbid" } else { "allow" }.into(),
        }
    }

    /// A run that uses every grant as it should.
    fn clean_run() -> Vec<Request> {
        vec![
            req("get", "", "nodes", None, Some("n1"), 200),
            req("patch", "", "nodes", None, Some("n1"), 200),
            req("create", "", "pods/eviction", Some("a"), Some("p"), 201),
            req("create", "", "pods/eviction", Some("b"), Some("p"), 429),
            req("create", "", "events", Some("a"), None, 201),
            req("create", "", "events", Some("b"), None, 201),
            req(
                "get",
                "coordination.k8s.io",
                "leases",
                Some("op"),
                Some("lead"),
                404,
            ),
            req(
                "create",
                "coordination.k8s.io",
                "leases",
                Some("op"),
                Some("lead"),
                201,
            ),
        ]
    }

    fn failures(requests: &[Request], allow: &str) -> Vec<String> {
        let allow = Allowlist::parse(allow, "test").expect("allowlist");
        audit(&rbac(), requests, &allow, &[])
            .failures
            .iter()
            .map(|f| f.to_string().lines().next().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn grants_come_from_bindings_of_the_deployments_service_accounts() {
        let r = rbac();
        assert_eq!(r.service_accounts, BTreeSet::from(["op/ctrl".to_string()]));
        // 2 + 1 + 1 cluster-wide, 2 in namespace op; the binding of another
        // subject to an undefined role is ignored.
        assert_eq!(r.grants.len(), 6, "{:#?}", r.grants);
        assert!(r.grants.iter().all(|g| g.sa == "op/ctrl"));
    }

    /// An OLM CSV's RBAC, judged as OLM installs it (issue 22: prove the
    /// bundle's grants sufficient and no wider than OLM forces).
    #[test]
    fn a_csv_becomes_the_grants_olm_makes() {
        let csv: Value = serde_yaml::from_str(
            r#"
spec:
  install:
    spec:
      deployments:
        - name: ctrl
          spec: {template: {spec: {serviceAccountName: ctrl}}}
      clusterPermissions:
        - serviceAccountName: ctrl
          rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, delete]}]
      permissions:
        - serviceAccountName: ctrl
          rules: [{apiGroups: [""], resources: [configmaps], verbs: [get]}]
"#,
        )
        .expect("csv");
        let r = Rbac::from_objects(&csv_objects(&csv, "op").expect("objects")).expect("rbac");
        assert_eq!(r.service_accounts, BTreeSet::from(["op/ctrl".to_string()]));
        let grants: Vec<(String, Option<String>)> = r
            .grants
            .iter()
            .map(|g| (g.verb.clone(), g.namespace.clone()))
            .collect();
        assert_eq!(
            grants,
            vec![
                ("delete".to_string(), None),
                ("get".to_string(), Some("op".to_string())),
                ("get".to_string(), None),
            ],
            "{:#?}",
            r.grants
        );
    }

    #[test]
    fn clean_run_passes() {
        assert_eq!(failures(&clean_run(), ""), Vec::<String>::new());
    }

    #[test]
    fn unused_grant_is_named() {
        let run: Vec<Request> = clean_run()
            .into_iter()
            .filter(|r| r.verb != "patch")
            .collect();
        assert_eq!(
            failures(&run, ""),
            [
                "unused grant: op/ctrl: patch nodes cluster-wide [ClusterRole ctrl (ClusterRoleBinding ctrl)]"
            ]
        );
    }

    #[test]
    fn cluster_wide_grant_used_in_one_namespace_only() {
        let run: Vec<Request> = clean_run()
            .into_iter()
            .filter(|r| !(r.what.to_string() == "events" && r.namespace.as_deref() == Some("b")))
            .collect();
        assert_eq!(
            failures(&run, ""),
            [
                "cluster-wide grant used in one namespace only: op/ctrl: create events cluster-wide [ClusterRole ctrl (ClusterRoleBinding ctrl)]: all 1 requests were in namespace a"
            ]
        );
    }

    #[test]
    fn forbidden_answers_fail_with_the_request() {
        let mut run = clean_run();
        run.push(req("list", "", "pods", None, None, 403));
        run.push(req("list", "", "pods", None, None, 403));
        let f = failures(&run, "");
        assert_eq!(
            f,
            [
                "forbidden: op/ctrl was refused list pods (2x, first at 2026-01-01T00:00:00.000000Z): nope"
            ]
        );
    }

    #[test]
    fn an_admission_denial_is_no_rbac_failure() {
        let mut run = clean_run();
        let mut denied = req("patch", "", "nodes", None, Some("n1"), 403);
        denied.decision = "allow".into();
        run.push(denied);
        assert_eq!(failures(&run, ""), Vec::<String>::new());
    }

    #[test]
    fn requests_beyond_the_manifests_fail_but_baseline_ones_do_not() {
        let mut run = clean_run();
        // Another lease name than the Role's resourceNames: some other grant let it through.
        run.push(req(
            "get",
            "coordination.k8s.io",
            "leases",
            Some("op"),
            Some("other"),
            200,
        ));
        // Namespaced grant, request elsewhere.
        run.push(req(
            "create",
            "coordination.k8s.io",
            "leases",
            Some("elsewhere"),
            Some("x"),
            201,
        ));
        run.push(req(
            "create",
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            None,
            None,
            201,
        ));
        let mut discovery = req("get", "", "", None, None, 200);
        discovery.what = Target::NonResource("/apis".into());
        run.push(discovery);
        assert_eq!(
            failures(&run, ""),
            [
                "not granted by the manifests: op/ctrl did create coordination.k8s.io/leases in namespace elsewhere (1x) and was allowed by some other grant (a test's?)",
                "not granted by the manifests: op/ctrl did get coordination.k8s.io/leases in namespace op (1x) and was allowed by some other grant (a test's?)",
            ]
        );
    }

    #[test]
    fn a_name_restricted_rule_never_covers_create() {
        let g = rbac()
            .grants
            .into_iter()
            .find(|g| !g.names.is_empty())
            .expect("the get-by-name grant");
        assert!(g.covers(&req(
            "get",
            "coordination.k8s.io",
            "leases",
            Some("op"),
            Some("lead"),
            200
        )));
        assert!(!g.covers(&req(
            "create",
            "coordination.k8s.io",
            "leases",
            Some("op"),
            Some("lead"),
            201
        )));
        assert!(!g.covers(&req(
            "get",
            "coordination.k8s.io",
            "leases",
            Some("op2"),
            Some("lead"),
            200
        )));
    }

    #[test]
    fn namespace_copies_count_as_the_original() {
        let run: Vec<Request> = clean_run()
            .into_iter()
            .map(|mut r| {
                if r.namespace.as_deref() == Some("op") {
                    r.namespace = Some("op-test-1".into());
                }
                r
            })
            .collect();
        let allow = Allowlist::default();
        let copies = [NamespaceCopy::parse("op-*=op").expect("copy")];
        let report = audit(&rbac(), &run, &allow, &copies);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert_eq!(report.copies_seen.len(), 1);
        assert!(
            audit(&rbac(), &run, &allow, &[]).failures.len() > 1,
            "without the mapping it fails"
        );
        assert!(
            NamespaceCopy::parse("op=op").is_err(),
            "pattern must end in *"
        );
    }

    #[test]
    fn allowlist_excuses_a_named_unused_grant_and_must_stay_current() {
        let run: Vec<Request> = clean_run()
            .into_iter()
            .filter(|r| r.verb != "patch")
            .collect();
        let allow = "
- serviceAccount: op/ctrl
  verb: patch
  apiGroup: ''
  resource: nodes
  why: only outside the suite
";
        assert_eq!(failures(&run, allow), Vec::<String>::new());
        assert_eq!(
            failures(&clean_run(), allow),
            ["allowlist entry excuses nothing: op/ctrl: patch nodes cluster-wide"]
        );
        let no_reason = "[{serviceAccount: op/ctrl, verb: patch, resource: nodes, why: ' '}]";
        assert!(Allowlist::parse(no_reason, "t").is_err());
        let typo = "[{serviceAccount: op/ctrl, verb: patch, resource: nodes, why: x, namespac: y}]";
        assert!(
            Allowlist::parse(typo, "t").is_err(),
            "unknown keys are refused"
        );
    }

    #[test]
    fn audit_log_lines_dedupe_by_id_filter_by_user_and_time() {
        let dir = std::env::temp_dir().join(format!("rbac-audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let line = |id: &str, stage: &str, user: &str, t: &str, code: u16| {
            format!(
                r#"{{"kind":"Event","auditID":"{id}","stage":"{stage}","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{{"username":"{user}"}},"objectRef":{{"resource":"nodes","apiVersion":"v1"}},"responseStatus":{{"metadata":{{}},"code":{code}}},"requestReceivedTimestamp":"{t}"}}"#
            )
        };
        let me = "system:serviceaccount:op:ctrl";
        std::fs::write(
            dir.join("audit-2026-01-01T00-00-00.000.log"),
            line(
                "old",
                "ResponseComplete",
                me,
                "2025-12-31T23:59:59.000000Z",
                200,
            ) + "\n",
        )
        .expect("rotated");
        std::fs::write(
            dir.join("audit.log"),
            [
                line("w", "ResponseStarted", me, "2026-01-01T00:00:01.000000Z", 200),
                line("w", "ResponseComplete", me, "2026-01-01T00:00:01.000000Z", 200),
                line("f", "ResponseComplete", me, "2026-01-01T00:00:02.000000Z", 403),
                line("x", "ResponseComplete", "someone", "2026-01-01T00:00:02.000000Z", 200),
                format!(
                    r#"{{"auditID":"d","stage":"ResponseComplete","requestURI":"/apis?x=1","verb":"get","user":{{"username":"{me}"}},"responseStatus":{{"code":200}},"requestReceivedTimestamp":"2026-01-01T00:00:03.000000Z"}}"#
                ),
                "{\"cut".to_string(),
            ]
            .join("\n"),
        )
        .expect("log");
        let users = BTreeMap::from([(me.to_string(), "op/ctrl".to_string())]);
        let since: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let log = read_audit_log(&dir.join("audit.log"), &users, Some(since)).expect("read");
        assert_eq!(log.files.len(), 2, "rotated file read too");
        assert_eq!(log.unreadable, 1);
        assert_eq!(log.requests.len(), 3, "{:?}", log.requests);
        assert_eq!(log.requests[0].describe(), "watch nodes");
        assert_eq!(log.requests[0].uri, "/api/v1/nodes?watch=true");
        assert!(log.requests[1].forbidden());
        assert_eq!(log.requests[2].describe(), "get URL /apis");
        assert!(baseline(&log.requests[2]), "discovery is everyone's");
        let all = read_audit_log(&dir.join("audit.log"), &users, None).expect("read");
        assert_eq!(
            all.requests.len(),
            4,
            "without --since the rotated one counts"
        );
        let _ = std::fs::remove_dir_all(&dir);
        let err = read_audit_log(&dir.join("audit.log"), &users, None)
            .err()
            .expect("missing");
        assert!(
            format!("{err:#}").contains("started without the audit flags"),
            "{err:#}"
        );
    }

    #[test]
    fn an_undefined_bound_role_is_an_error() {
        let text = MANIFESTS.replace(
            "name: ctrl}\nsubjects: [{kind: ServiceAccount, name: ctrl",
            "name: gone}\nsubjects: [{kind: ServiceAccount, name: ctrl",
        );
        let err = Rbac::from_objects(&parse_documents(&text).expect("yaml"))
            .err()
            .expect("fails");
        assert!(
            format!("{err:#}").contains("ClusterRole gone, which the manifests do not define"),
            "{err:#}"
        );
    }
}
