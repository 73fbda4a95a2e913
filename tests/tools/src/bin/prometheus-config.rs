//! prometheus-config: turns nmo-rs' rendered monitoring manifests into what a
//! plain Prometheus reads, the way the Prometheus Operator does, so the local
//! Prometheus (tests/companions/up.sh) scrapes and alerts exactly as a
//! cluster's would:
//!
//! - each ServiceMonitor endpoint becomes a scrape job (`serviceMonitor/NS/NAME/I`)
//!   with the endpoint's scheme, path, interval, bearer token file and TLS
//!   settings; its targets come from one file per selected Service
//!   (`TARGETS/NS_SERVICE.json`, written by whoever runs that Service's pods
//!   locally) labelled as the operator labels them: `job` = the Service name,
//!   `namespace`, `service`, `endpoint`;
//! - each PrometheusRule's groups become a rule file (`promtool check rules`
//!   and `promtool test rules` read it too);
//! - `OUT/rules.d/*.yaml` is read as well: the rules a test raises an alert
//!   with (`nmo_tests::companions::TestAlert`).
//!
//! A ServiceMonitor field this tool does not translate is an error naming it:
//! a manifest change must never be silently left out of what is proven.
//!
//!   kubectl kustomize manifests/monitoring > mon.yaml
//!   kubectl kustomize manifests/base > base.yaml
//!   prometheus-config --monitoring mon.yaml --services base.yaml --out DIR \
//!     --targets DIR/targets --file /var/run/secrets/kubernetes.io/serviceaccount/token=TOKEN
//!
//! `--proxy-url URL` sends the ServiceMonitors' scrapes through an HTTP
//! CONNECT proxy (the real node's pods are reached so, tests/node/stage.sh).
//!
//! `--file IN_POD_PATH=LOCAL` maps a file a pod would have (the token, a CA)
//! to the local one; `--secret NS/NAME/KEY=LOCAL` does the same for a Secret
//! or ConfigMap key a tlsConfig names (or `--secrets-dir DIR`: each such key
//! read from DIR/NS_NAME_KEY, listed on stdout for the caller to fill). `--interval` and `--rule-for` override
//! scrape intervals and alert `for:` durations (printed when used): the live
//! test stage uses them to see an alert fire in seconds; the rule file written
//! for promtool (`rules.yaml`) always keeps the manifest's durations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Parser;
use serde_yaml::{Mapping, Value};

#[derive(Parser, Debug)]
#[command(about = "Render ServiceMonitors and PrometheusRules as a plain Prometheus configuration")]
struct Args {
    /// `kubectl kustomize manifests/monitoring` output (ServiceMonitors, PrometheusRules).
    #[arg(long)]
    monitoring: PathBuf,
    /// Rendered manifests holding the Services the ServiceMonitors select.
    #[arg(long)]
    services: PathBuf,
    /// Output directory: prometheus.yml, rules.yaml, rules-unit.yaml (summaries
    /// only, for promtool's unit tests), rules-live.yaml.
    #[arg(long)]
    out: PathBuf,
    /// Directory of the per-Service target files (file_sd).
    #[arg(long)]
    targets: PathBuf,
    /// IN_POD_PATH=LOCAL_PATH for a file a ServiceMonitor names (bearerTokenFile, caFile).
    #[arg(long = "file")]
    files: Vec<String>,
    /// NS/NAME/KEY=LOCAL_PATH for a Secret or ConfigMap key a tlsConfig names.
    #[arg(long = "secret")]
    secrets: Vec<String>,
    /// Where a Secret or ConfigMap key with no --secret goes:
    /// DIR/NS_NAME_KEY (listed on stdout as `secret NS/NAME/KEY PATH`, for the
    /// caller to fill: the Prometheus Operator mounts them the same way).
    #[arg(long)]
    secrets_dir: Option<PathBuf>,
    /// JOB=HOST:PORT: a plain-HTTP scrape job of something the stack runs
    /// itself (kube-state-metrics), beside the ServiceMonitors' jobs.
    #[arg(long = "static-job")]
    static_jobs: Vec<String>,
    /// Scrape interval for every job instead of the endpoints' own.
    #[arg(long)]
    interval: Option<String>,
    /// An HTTP CONNECT proxy for the ServiceMonitors' jobs (`proxy_url`):
    /// where the targets' addresses exist only behind it (the real node's
    /// pods, tests/node/up.sh). What is scraped and how stays the manifests'.
    #[arg(long)]
    proxy_url: Option<String>,
    /// `for:` of every alert in rules-live.yaml instead of the manifest's.
    #[arg(long)]
    rule_for: Option<String>,
    /// evaluation_interval of the rule groups.
    #[arg(long, default_value = "30s")]
    evaluation_interval: String,
}

/// Where in-pod files and Secret keys are on this machine.
#[derive(Default, Debug)]
struct Paths {
    files: BTreeMap<String, String>,
    secrets: BTreeMap<String, String>,
    secrets_dir: Option<PathBuf>,
    /// Keys mapped into `secrets_dir`, for the caller to fill.
    wanted: std::cell::RefCell<BTreeMap<String, String>>,
}

impl Paths {
    fn parse(files: &[String], secrets: &[String]) -> anyhow::Result<Self> {
        let split = |s: &String| -> anyhow::Result<(String, String)> {
            let (k, v) = s
                .split_once('=')
                .with_context(|| format!("'{s}' is not KEY=LOCAL_PATH"))?;
            Ok((k.to_string(), v.to_string()))
        };
        Ok(Paths {
            files: files.iter().map(split).collect::<anyhow::Result<_>>()?,
            secrets: secrets.iter().map(split).collect::<anyhow::Result<_>>()?,
            ..Paths::default()
        })
    }

    fn file(&self, in_pod: &str, what: &str) -> anyhow::Result<String> {
        self.files.get(in_pod).cloned().with_context(|| {
            format!("{what} names {in_pod}: say where it is here with --file {in_pod}=LOCAL_PATH")
        })
    }

    fn key(&self, ns: &str, sel: &Value, what: &str) -> anyhow::Result<String> {
        let (kind, r) = match (sel.get("secret"), sel.get("configMap")) {
            (Some(r), _) => ("Secret", r),
            (_, Some(r)) => ("ConfigMap", r),
            _ => bail!("{what}: neither secret nor configMap given"),
        };
        let name = str_of(r, "name")?;
        let key = str_of(r, "key")?;
        let id = format!("{ns}/{name}/{key}");
        if let Some(p) = self.secrets.get(&id) {
            return Ok(p.clone());
        }
        if let Some(dir) = &self.secrets_dir {
            let p = dir.join(format!("{ns}_{name}_{key}")).display().to_string();
            self.wanted.borrow_mut().insert(id, p.clone());
            return Ok(p);
        }
        self.secrets.get(&id).cloned().with_context(|| {
            format!("{what} reads {kind} {ns}/{name} key {key}: say where it is here with --secret {id}=LOCAL_PATH")
        })
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> anyhow::Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .with_context(|| format!("'{key}' missing or not a string"))
}

fn docs(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)
            .with_context(|| format!("parsing {}", path.display()))?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn kind(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

fn meta<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A Service a ServiceMonitor selected: its namespace, name and port names.
#[derive(Debug, Clone, PartialEq)]
struct Service {
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    ports: Vec<String>,
}

fn services(all: &[Value]) -> Vec<Service> {
    all.iter()
        .filter(|v| kind(v) == "Service")
        .map(|v| Service {
            namespace: meta(v, "namespace").to_string(),
            name: meta(v, "name").to_string(),
            labels: v
                .get("metadata")
                .and_then(|m| m.get("labels"))
                .and_then(|l| serde_yaml::from_value(l.clone()).ok())
                .unwrap_or_default(),
            ports: v
                .get("spec")
                .and_then(|s| s.get("ports"))
                .and_then(Value::as_sequence)
                .map(|ps| {
                    ps.iter()
                        .filter_map(|p| p.get("name").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// The Services a ServiceMonitor's selector and namespaceSelector pick.
fn selected<'a>(sm: &Value, all: &'a [Service]) -> anyhow::Result<Vec<&'a Service>> {
    let spec = sm.get("spec").context("no spec")?;
    let sel = spec.get("selector").context("no spec.selector")?;
    if sel.get("matchExpressions").is_some() {
        bail!("spec.selector.matchExpressions is not translated");
    }
    let want: BTreeMap<String, String> = sel
        .get("matchLabels")
        .map(|m| serde_yaml::from_value(m.clone()))
        .transpose()
        .context("spec.selector.matchLabels")?
        .unwrap_or_default();
    let namespaces: Vec<String> = match spec.get("namespaceSelector") {
        Some(ns) if ns.get("any").and_then(Value::as_bool) == Some(true) => Vec::new(),
        Some(ns) => serde_yaml::from_value(ns.get("matchNames").cloned().unwrap_or_default())
            .context("spec.namespaceSelector.matchNames")?,
        None => vec![meta(sm, "namespace").to_string()],
    };
    Ok(all
        .iter()
        .filter(|s| namespaces.is_empty() || namespaces.contains(&s.namespace))
        .filter(|s| want.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .collect())
}

const ENDPOINT_KEYS: &[&str] = &[
    "port",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "bearerTokenFile",
    "tlsConfig",
    "honorLabels",
];
const TLS_KEYS: &[&str] = &["insecureSkipVerify", "serverName", "ca", "caFile"];

fn check_keys(v: &Value, allowed: &[&str], what: &str) -> anyhow::Result<()> {
    for k in v.as_mapping().into_iter().flat_map(Mapping::keys) {
        let k = k.as_str().unwrap_or("?");
        if !allowed.contains(&k) {
            bail!(
                "{what}: field '{k}' is not translated by prometheus-config (tests/tools/src/bin/prometheus-config.rs); add it there"
            );
        }
    }
    Ok(())
}

fn tls_config(ep: &Value, ns: &str, paths: &Paths, what: &str) -> anyhow::Result<Mapping> {
    let mut out = Mapping::new();
    let Some(tls) = ep.get("tlsConfig") else {
        return Ok(out);
    };
    check_keys(tls, TLS_KEYS, &format!("{what} tlsConfig"))?;
    if let Some(b) = tls.get("insecureSkipVerify").and_then(Value::as_bool) {
        out.insert("insecure_skip_verify".into(), b.into());
    }
    if let Some(s) = tls.get("serverName").and_then(Value::as_str) {
        out.insert("server_name".into(), s.into());
    }
    if let Some(ca) = tls.get("ca") {
        out.insert(
            "ca_file".into(),
            paths.key(ns, ca, &format!("{what} tlsConfig.ca"))?.into(),
        );
    }
    if let Some(f) = tls.get("caFile").and_then(Value::as_str) {
        out.insert(
            "ca_file".into(),
            paths.file(f, &format!("{what} tlsConfig.caFile"))?.into(),
        );
    }
    Ok(out)
}

/// One scrape job per endpoint of one ServiceMonitor.
fn scrape_jobs(
    sm: &Value,
    svcs: &[Service],
    paths: &Paths,
    targets: &Path,
    interval: Option<&str>,
) -> anyhow::Result<Vec<Value>> {
    let (ns, name) = (meta(sm, "namespace"), meta(sm, "name"));
    let eps = sm
        .get("spec")
        .and_then(|s| s.get("endpoints"))
        .and_then(Value::as_sequence)
        .with_context(|| format!("ServiceMonitor {ns}/{name}: no spec.endpoints"))?;
    let chosen = selected(sm, svcs).with_context(|| format!("ServiceMonitor {ns}/{name}"))?;
    if chosen.is_empty() {
        bail!("ServiceMonitor {ns}/{name} selects no Service of the rendered manifests");
    }
    let mut jobs = Vec::new();
    for (i, ep) in eps.iter().enumerate() {
        let what = format!("ServiceMonitor {ns}/{name} endpoint {i}");
        check_keys(ep, ENDPOINT_KEYS, &what)?;
        let port = str_of(ep, "port").with_context(|| what.clone())?;
        let mut job = Mapping::new();
        job.insert(
            "job_name".into(),
            format!("serviceMonitor/{ns}/{name}/{i}").into(),
        );
        job.insert(
            "honor_labels".into(),
            ep.get("honorLabels").cloned().unwrap_or(false.into()),
        );
        let every = interval.or(ep.get("interval").and_then(Value::as_str));
        if let Some(every) = every {
            job.insert("scrape_interval".into(), every.into());
        }
        if let Some(t) = ep.get("scrapeTimeout").and_then(Value::as_str) {
            job.insert("scrape_timeout".into(), t.into());
        }
        job.insert(
            "metrics_path".into(),
            ep.get("path").cloned().unwrap_or("/metrics".into()),
        );
        job.insert(
            "scheme".into(),
            ep.get("scheme").cloned().unwrap_or("http".into()),
        );
        if let Some(f) = ep.get("bearerTokenFile").and_then(Value::as_str) {
            let local = paths.file(f, &format!("{what} bearerTokenFile"))?;
            let mut auth = Mapping::new();
            auth.insert("type".into(), "Bearer".into());
            auth.insert("credentials_file".into(), local.into());
            job.insert("authorization".into(), auth.into());
        }
        job.insert(
            "tls_config".into(),
            tls_config(ep, ns, paths, &what)?.into(),
        );
        let files: Vec<Value> = chosen
            .iter()
            .filter(|s| s.ports.iter().any(|p| p == port))
            .map(|s| target_file(targets, s).display().to_string().into())
            .collect();
        if files.is_empty() {
            bail!("{what}: no selected Service has a port named '{port}'");
        }
        let mut sd = Mapping::new();
        sd.insert("files".into(), files.into());
        sd.insert("refresh_interval".into(), "5s".into());
        job.insert("file_sd_configs".into(), vec![Value::from(sd)].into());
        jobs.push(job.into());
    }
    Ok(jobs)
}

/// A plain-HTTP job of one target, from `JOB=HOST:PORT`.
fn static_job(spec: &str, interval: Option<&str>) -> anyhow::Result<Value> {
    let (name, addr) = spec
        .split_once('=')
        .with_context(|| format!("--static-job '{spec}' is not JOB=HOST:PORT"))?;
    let mut target = Mapping::new();
    target.insert("targets".into(), vec![Value::from(addr)].into());
    let mut job = Mapping::new();
    job.insert("job_name".into(), name.into());
    if let Some(every) = interval {
        job.insert("scrape_interval".into(), every.into());
    }
    job.insert("static_configs".into(), vec![Value::from(target)].into());
    Ok(job.into())
}

/// The file a local run writes a Service's targets into.
fn target_file(dir: &Path, s: &Service) -> PathBuf {
    dir.join(format!("{}_{}.json", s.namespace, s.name))
}

/// The rule groups of every PrometheusRule, `for:` replaced when asked.
fn rule_groups(
    all: &[Value],
    for_override: Option<&str>,
    only_annotation: Option<&str>,
) -> anyhow::Result<Value> {
    let mut groups = Vec::new();
    for r in all.iter().filter(|v| kind(v) == "PrometheusRule") {
        let gs = r
            .get("spec")
            .and_then(|s| s.get("groups"))
            .and_then(Value::as_sequence)
            .with_context(|| format!("PrometheusRule {}: no spec.groups", meta(r, "name")))?;
        for g in gs {
            let mut g = g.clone();
            let rules = g.get_mut("rules").and_then(Value::as_sequence_mut);
            for rule in rules
                .into_iter()
                .flatten()
                .filter_map(Value::as_mapping_mut)
            {
                if let Some(f) = for_override.filter(|_| rule.contains_key("alert")) {
                    if rule.contains_key("for") {
                        rule.insert("for".into(), f.into());
                    }
                }
                if let (Some(keep), Some(Value::Mapping(ann))) =
                    (only_annotation, rule.get_mut("annotations"))
                {
                    ann.retain(|k, _| k.as_str() == Some(keep));
                }
            }
            groups.push(g);
        }
    }
    if groups.is_empty() {
        bail!("no PrometheusRule in the monitoring manifests");
    }
    let mut m = Mapping::new();
    m.insert("groups".into(), groups.into());
    Ok(m.into())
}

fn run(args: Args) -> anyhow::Result<()> {
    let mut paths = Paths::parse(&args.files, &args.secrets)?;
    paths.secrets_dir = args.secrets_dir.clone();
    let mon = docs(&args.monitoring)?;
    let svcs = services(&docs(&args.services)?);
    let mut jobs = Vec::new();
    for sm in mon.iter().filter(|v| kind(v) == "ServiceMonitor") {
        jobs.extend(scrape_jobs(
            sm,
            &svcs,
            &paths,
            &args.targets,
            args.interval.as_deref(),
        )?);
    }
    if jobs.is_empty() {
        bail!("no ServiceMonitor in {}", args.monitoring.display());
    }
    if let Some(proxy) = &args.proxy_url {
        through_proxy(&mut jobs, proxy);
    }
    for j in &args.static_jobs {
        jobs.push(static_job(j, args.interval.as_deref())?);
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::create_dir_all(&args.targets)?;
    let live = args.out.join("rules-live.yaml");
    // Rules a test adds for itself (an alert it raises and clears: the fleet
    // gates' alert gate), read from here on each reload.
    let test_rules = args.out.join("rules.d");
    std::fs::create_dir_all(&test_rules)
        .with_context(|| format!("creating {}", test_rules.display()))?;
    let config = serde_json::json!({
        "global": {"evaluation_interval": args.evaluation_interval},
        "rule_files": [live.display().to_string(), test_rules.join("*.yaml").display().to_string()],
        "scrape_configs": serde_json::to_value(&jobs)?,
    });
    write(
        &args.out.join("prometheus.yml"),
        &serde_yaml::to_string(&config)?,
    )?;
    let groups =
        |f, a| -> anyhow::Result<String> { Ok(serde_yaml::to_string(&rule_groups(&mon, f, a)?)?) };
    write(&args.out.join("rules.yaml"), &groups(None, None)?)?;
    // promtool's unit tests compare every annotation: they check the
    // summaries (label templating); `promtool check rules` the rest.
    write(
        &args.out.join("rules-unit.yaml"),
        &groups(None, Some("summary"))?,
    )?;
    let for_override = args.rule_for.as_deref();
    write(&live, &groups(for_override, None)?)?;
    // Empty target lists until a local run writes its ports.
    for s in &svcs {
        let f = target_file(&args.targets, s);
        if !f.exists() {
            write(&f, "[]\n")?;
        }
    }
    if let Some(i) = &args.interval {
        eprintln!(
            "prometheus-config: scrape interval {i} for every job (the ServiceMonitors say otherwise)"
        );
    }
    if let Some(f) = for_override {
        eprintln!(
            "prometheus-config: alerts' for: {f} in {} (rules.yaml keeps the manifest's)",
            live.display()
        );
    }
    for (id, path) in paths.wanted.borrow().iter() {
        println!("secret {id} {path}");
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("prometheus-config: {e:#}");
        std::process::exit(1);
    }
}

/// Every job scrapes through the HTTP CONNECT proxy at `proxy`.
fn through_proxy(jobs: &mut [Value], proxy: &str) {
    for job in jobs.iter_mut().filter_map(Value::as_mapping_mut) {
        job.insert("proxy_url".into(), proxy.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> Value {
        serde_yaml::from_str(s).expect("test yaml")
    }

    fn svc() -> Vec<Service> {
        services(&[yaml(
            "kind: Service\nmetadata: {name: m, namespace: ns, labels: {app: a}}\nspec: {ports: [{name: https}]}",
        )])
    }

    fn paths() -> Paths {
        Paths::parse(
            &["/tok=/local/tok".into()],
            &["ns/ca/ca.crt=/local/ca".into()],
        )
        .expect("paths")
    }

    #[test]
    fn a_proxy_reaches_every_job_and_changes_nothing_else() {
        let sm = yaml(
            "kind: ServiceMonitor\nmetadata: {name: s, namespace: ns}\nspec:\n  selector: {matchLabels: {app: a}}\n  endpoints:\n  - {port: https, scheme: https}\n  - {port: https, scheme: https, path: /other}",
        );
        let mut jobs = scrape_jobs(&sm, &svc(), &paths(), Path::new("/t"), None).expect("jobs");
        let before = jobs.clone();
        through_proxy(&mut jobs, "http://127.0.0.1:23128");
        for (j, b) in jobs.iter().zip(&before) {
            assert_eq!(j["proxy_url"], Value::from("http://127.0.0.1:23128"));
            let mut j = j.as_mapping().expect("job").clone();
            j.remove("proxy_url");
            assert_eq!(&Value::from(j), b);
        }
    }

    #[test]
    fn an_endpoint_becomes_a_job_with_token_tls_and_target_file() {
        let sm = yaml(
            "kind: ServiceMonitor\nmetadata: {name: s, namespace: ns}\nspec:\n  selector: {matchLabels: {app: a}}\n  endpoints:\n  - {port: https, scheme: https, path: /metrics, interval: 30s, bearerTokenFile: /tok, tlsConfig: {serverName: m.ns.svc, ca: {secret: {name: ca, key: ca.crt}}}}",
        );
        let jobs = scrape_jobs(&sm, &svc(), &paths(), Path::new("/t"), None).expect("jobs");
        let j = &jobs[0];
        assert_eq!(j["job_name"], Value::from("serviceMonitor/ns/s/0"));
        assert_eq!(j["scheme"], Value::from("https"));
        assert_eq!(j["scrape_interval"], Value::from("30s"));
        assert_eq!(
            j["authorization"]["credentials_file"],
            Value::from("/local/tok")
        );
        assert_eq!(j["tls_config"]["ca_file"], Value::from("/local/ca"));
        assert_eq!(j["tls_config"]["server_name"], Value::from("m.ns.svc"));
        assert_eq!(
            j["file_sd_configs"][0]["files"][0],
            Value::from("/t/ns_m.json")
        );
    }

    #[test]
    fn untranslated_fields_and_unmapped_files_are_errors_naming_them() {
        for (ep, want) in [
            ("{port: https, metricRelabelings: []}", "metricRelabelings"),
            ("{port: https, bearerTokenFile: /other}", "--file /other="),
            ("{port: https, tlsConfig: {cert: {}}}", "'cert'"),
            (
                "{port: http}",
                "no selected Service has a port named 'http'",
            ),
        ] {
            let sm = yaml(&format!(
                "kind: ServiceMonitor\nmetadata: {{name: s, namespace: ns}}\nspec:\n  selector: {{matchLabels: {{app: a}}}}\n  endpoints: [{ep}]"
            ));
            let err = scrape_jobs(&sm, &svc(), &paths(), Path::new("/t"), None)
                .expect_err(ep)
                .to_string();
            let chain = format!("{err:#}");
            assert!(chain.contains(want), "{ep}: {chain}");
        }
    }

    #[test]
    fn an_unmapped_secret_key_goes_to_the_secrets_dir_and_is_listed() {
        let sm = yaml(
            "kind: ServiceMonitor\nmetadata: {name: s, namespace: ns}\nspec:\n  selector: {matchLabels: {app: a}}\n  endpoints:\n  - {port: https, tlsConfig: {ca: {secret: {name: other, key: ca.crt}}}}",
        );
        let mut p = paths();
        p.secrets_dir = Some(PathBuf::from("/s"));
        let jobs = scrape_jobs(&sm, &svc(), &p, Path::new("/t"), None).expect("jobs");
        assert_eq!(
            jobs[0]["tls_config"]["ca_file"],
            Value::from("/s/ns_other_ca.crt")
        );
        assert_eq!(
            p.wanted.borrow().get("ns/other/ca.crt").map(String::as_str),
            Some("/s/ns_other_ca.crt")
        );
    }

    #[test]
    fn a_static_job_scrapes_one_address() {
        let j = static_job("ksm=127.0.0.1:9", Some("2s")).expect("job");
        assert_eq!(j["job_name"], Value::from("ksm"));
        assert_eq!(
            j["static_configs"][0]["targets"][0],
            Value::from("127.0.0.1:9")
        );
        assert!(static_job("no-address", None).is_err());
    }

    #[test]
    fn a_selector_matching_nothing_is_an_error() {
        let sm = yaml(
            "kind: ServiceMonitor\nmetadata: {name: s, namespace: ns}\nspec:\n  selector: {matchLabels: {app: other}}\n  endpoints: [{port: https}]",
        );
        let err = scrape_jobs(&sm, &svc(), &paths(), Path::new("/t"), None).expect_err("none");
        assert!(err.to_string().contains("selects no Service"), "{err}");
    }

    #[test]
    fn rule_for_is_replaced_only_in_the_live_copy() {
        let r = [yaml(
            "kind: PrometheusRule\nmetadata: {name: r}\nspec:\n  groups:\n  - name: g\n    rules:\n    - {alert: A, expr: up == 0, for: 5m, annotations: {summary: s, description: d}}\n    - {record: r, expr: up}",
        )];
        assert_eq!(
            rule_groups(&r, None, None).expect("g")["groups"][0]["rules"][0]["for"],
            Value::from("5m")
        );
        let live = rule_groups(&r, Some("2s"), None).expect("g");
        assert_eq!(live["groups"][0]["rules"][0]["for"], Value::from("2s"));
        assert!(live["groups"][0]["rules"][1].get("for").is_none());
        let unit = rule_groups(&r, None, Some("summary")).expect("g");
        let ann = &unit["groups"][0]["rules"][0]["annotations"];
        assert_eq!(ann["summary"], Value::from("s"));
        assert!(ann.get("description").is_none());
    }
}
