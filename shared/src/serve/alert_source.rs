//! The alert gate's input (`--block-on-alerts-url`): the alerts firing now,
//! read from a Prometheus (`GET /api/v1/alerts`) or an Alertmanager
//! (`GET /api/v2/alerts`), with one request bounded in time. Which of the
//! two answers is told from the shape of the answer, so one URL flag serves
//! both. Anything but a clear answer is an error the gate treats as
//! "blocked" (fail closed), its words naming the URL and what to check.
//!
//! The alerts come back with their state (an Alertmanager's `active` is
//! `firing`); which firing ones match `--block-on-alerts-filter` is the
//! gate's pure decision.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::rules::gates::Alert;

/// The labels of one alert.
pub type Labels = BTreeMap<String, String>;

/// Bound of one query (the gate is read at most every few seconds).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read (a Prometheus with thousands of alerts stays under).
const MAX_BODY: usize = 16 << 20;

/// Where the alerts are read, and the client reading them.
#[derive(Clone)]
pub struct AlertSource {
    base: String,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl AlertSource {
    /// A source for `base` (`http://prometheus.monitoring:9090`, no path
    /// needed). Only `http://` is accepted: the images carry no CA bundle,
    /// and a query through `kubectl proxy`-style sidecars or an in-cluster
    /// Service is plain HTTP on the pod network.
    pub fn new(base: &str) -> Result<AlertSource, String> {
        let trimmed = base.trim_end_matches('/');
        let rest = trimmed.strip_prefix("http://").ok_or_else(|| {
            format!(
                "--block-on-alerts-url={base}: only http:// URLs are supported \
                 (e.g. http://prometheus-operated.monitoring.svc:9090)"
            )
        })?;
        if rest.is_empty() || rest.contains(char::is_whitespace) {
            return Err(format!(
                "--block-on-alerts-url={base}: not a URL (e.g. http://prometheus-operated.monitoring.svc:9090)"
            ));
        }
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(QUERY_TIMEOUT));
        Ok(AlertSource {
            base: trimmed.to_string(),
            client: Client::builder(TokioExecutor::new()).build(http),
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    /// The alerts as Prometheus (or Alertmanager) lists them now; matching
    /// them is the gate's ([`AlertFilter::firing`](crate::rules::gates::AlertFilter::firing)).
    /// Prometheus is asked first; an Alertmanager answers its path with 404,
    /// and is then asked its own.
    pub async fn alerts(&self) -> Result<Vec<Alert>, String> {
        let prometheus = format!("{}/api/v1/alerts", self.base);
        match self.get(&prometheus).await? {
            (404, _) => {
                let am = format!(
                    "{}/api/v2/alerts?active=true&silenced=false&inhibited=false",
                    self.base
                );
                match self.get(&am).await? {
                    (200, body) => parse_alerts(&body).map_err(|e| format!("{am}: {e}")),
                    (code, _) => Err(format!(
                        "{prometheus} and {am} answered 404 and {code}: neither a Prometheus nor \
                         an Alertmanager; check --block-on-alerts-url"
                    )),
                }
            }
            (200, body) => parse_alerts(&body).map_err(|e| format!("{prometheus}: {e}")),
            (code, body) => Err(format!(
                "{prometheus} answered {code}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )),
        }
    }

    async fn get(&self, url: &str) -> Result<(u16, Bytes), String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("{url}: not a URL ({e}); check --block-on-alerts-url"))?;
        let request = async {
            let response = self.client.get(uri).await.map_err(|e| {
                format!("{url}: {e}; is the Prometheus reachable from this pod (network policies, the Service name)?")
            })?;
            let code = response.status().as_u16();
            let body = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("{url}: reading the answer: {e}"))?
                .to_bytes();
            Ok((code, body))
        };
        tokio::time::timeout(QUERY_TIMEOUT, request)
            .await
            .map_err(|_| format!("{url}: no answer within {QUERY_TIMEOUT:?}"))?
    }
}

/// The alerts in a Prometheus `/api/v1/alerts` answer (an object) or an
/// Alertmanager `/api/v2/alerts` one (an array).
pub fn parse_alerts(body: &[u8]) -> Result<Vec<Alert>, String> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'[') {
        return parse_prometheus(body);
    }
    parse_alertmanager(body)
}

/// Prometheus' `GET /api/v1/alerts`: `data.alerts[]`, each `firing` or
/// `pending`; a `status` other than `success` is an error.
fn parse_prometheus(body: &[u8]) -> Result<Vec<Alert>, String> {
    let response: PromResponse =
        serde_json::from_slice(body).map_err(|e| format!("not a Prometheus alerts answer: {e}"))?;
    if response.status != "success" {
        return Err(format!(
            "Prometheus answered status {:?}: {}",
            response.status,
            response.error.unwrap_or_default()
        ));
    }
    let alerts = response.data.map(|d| d.alerts).unwrap_or_default();
    Ok(alerts
        .into_iter()
        .map(|a| Alert {
            labels: a.labels,
            state: a.state,
        })
        .collect())
}

#[derive(Deserialize)]
struct PromResponse {
    status: String,
    #[serde(default)]
    data: Option<PromData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct PromData {
    #[serde(default)]
    alerts: Vec<PromAlert>,
}

#[derive(Deserialize)]
struct PromAlert {
    #[serde(default)]
    labels: Labels,
    #[serde(default)]
    state: String,
}

/// Alertmanager's `GET /api/v2/alerts`: an array; an `active` alert counts
/// as firing.
fn parse_alertmanager(body: &[u8]) -> Result<Vec<Alert>, String> {
    let items: Vec<AmAlert> = serde_json::from_slice(body)
        .map_err(|e| format!("not an Alertmanager alerts answer: {e}"))?;
    Ok(items
        .into_iter()
        .map(|a| Alert {
            labels: a.labels,
            state: if a.status.state == "active" {
                "firing".to_string()
            } else {
                a.status.state
            },
        })
        .collect())
}

/// One alert of Alertmanager's `GET /api/v2/alerts`.
#[derive(Deserialize)]
struct AmAlert {
    #[serde(default)]
    labels: Labels,
    #[serde(default)]
    status: AmStatus,
}

#[derive(Deserialize, Default)]
struct AmStatus {
    #[serde(default)]
    state: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the firing ones.
    fn names(v: &[Alert]) -> Vec<String> {
        v.iter()
            .filter(|a| a.state == "firing")
            .map(|a| a.labels.get("alertname").cloned().unwrap_or_default())
            .collect()
    }

    /// (case, answer, the firing alerts' names or the error's words).
    type Case = (
        &'static str,
        &'static str,
        Result<Vec<&'static str>, &'static str>,
    );

    #[test]
    fn answers_of_prometheus_and_alertmanager() {
        let cases: &[Case] = &[
            (
                "Prometheus: firing only, pending left out",
                r#"{"status":"success","data":{"alerts":[
                    {"labels":{"alertname":"NodeDown","severity":"critical"},"state":"firing"},
                    {"labels":{"alertname":"Slow"},"state":"pending"}]}}"#,
                Ok(vec!["NodeDown"]),
            ),
            (
                "Prometheus: none",
                r#"{"status":"success","data":{"alerts":[]}}"#,
                Ok(vec![]),
            ),
            (
                "Alertmanager: active only",
                r#"[{"labels":{"alertname":"DiskFull"},"status":{"state":"active"}},
                    {"labels":{"alertname":"Old"},"status":{"state":"suppressed"}}]"#,
                Ok(vec!["DiskFull"]),
            ),
            (
                "Prometheus error",
                r#"{"status":"error","error":"bad request"}"#,
                Err("status \"error\": bad request"),
            ),
            ("not JSON", "<html>", Err("not a Prometheus alerts answer")),
            ("a number", "42", Err("not a Prometheus alerts answer")),
            (
                "Prometheus without data: none",
                r#"{"status":"success"}"#,
                Ok(vec![]),
            ),
        ];
        for (name, body, want) in cases {
            let got = parse_alerts(body.as_bytes());
            match (want, got) {
                (Ok(want), Ok(got)) => assert_eq!(names(&got), *want, "{name}"),
                (Err(want), Err(got)) => assert!(got.contains(want), "{name}: {got}"),
                (want, got) => panic!("{name}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn only_http_urls() {
        for (url, ok) in [
            ("http://prometheus:9090", true),
            ("http://prometheus:9090/", true),
            ("https://prometheus:9090", false),
            ("prometheus:9090", false),
            ("http://", false),
        ] {
            assert_eq!(AlertSource::new(url).is_ok(), ok, "{url}");
        }
        let e = AlertSource::new("https://p:9090").err().unwrap_or_default();
        assert!(e.contains("--block-on-alerts-url=https://p:9090"), "{e}");
    }

    #[tokio::test]
    async fn nothing_listening_is_an_error_naming_the_url() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(9);
        let source = AlertSource::new(&format!("http://127.0.0.1:{port}")).expect("a URL");
        let e = source.alerts().await.expect_err("nothing answers");
        assert!(
            e.contains(&format!("127.0.0.1:{port}/api/v1/alerts")),
            "{e}"
        );
    }

    #[test]
    fn prometheus_answers_are_read() {
        let ok = br#"{"status":"success","data":{"alerts":[
            {"labels":{"alertname":"Watchdog","severity":"none"},"annotations":{},
             "state":"firing","activeAt":"2026-12-12T00:00:00Z","value":"1e+00"}]}}"#;
        let cases: [(&str, &[u8], Result<usize, &str>); 5] = [
            ("one alert", ok, Ok(1)),
            (
                "none",
                br#"{"status":"success","data":{"alerts":[]}}"#,
                Ok(0),
            ),
            ("no data", br#"{"status":"success"}"#, Ok(0)),
            (
                "an error answer",
                br#"{"status":"error","errorType":"bad_data","error":"boom"}"#,
                Err("status \"error\": boom"),
            ),
            ("not json", b"<html>", Err("not a Prometheus alerts answer")),
        ];
        for (case, body, want) in cases {
            match (parse_alerts(body), want) {
                (Ok(alerts), Ok(n)) => assert_eq!(alerts.len(), n, "{case}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{case}: {e}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
        let alerts = parse_alerts(ok).expect("parses");
        assert_eq!(alerts[0].state, "firing");
        assert_eq!(alerts[0].labels["alertname"], "Watchdog");
    }
}
