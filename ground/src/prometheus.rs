//! A Prometheus double: `GET|POST /api/v1/query` (the HTTP API's instant query) over Argo CD's
//! `argocd_app_info` series, built from the Applications in the API double at the moment of
//! the query, as Argo CD's application controller exports them (one series per Application,
//! value 1, labels `name`, `namespace`, `project`, `dest_server`, `dest_namespace`, `repo`,
//! `sync_status`, `health_status`, `operation`, `autosync_enabled`).
//!
//! The query language is the part the kargo-pipelines chart emits, each answered as Prometheus
//! answers it: an instant vector selector with `=`, `!=`, `=~`, `!~` matchers (regular
//! expressions fully anchored), optionally inside `count(...)` or `sum(...)`. An aggregation
//! over nothing is an empty vector, not 0. Anything else is `bad_data` with HTTP 400, as a
//! real server answers a query it cannot parse; a query the double does not model is refused,
//! never guessed.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use anyhow::Result;
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::kube::KubeDouble;

/// One series: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// `argocd_app_info` for every Application the API double holds.
pub fn argocd_app_info(kube: &KubeDouble) -> Vec<Sample> {
    let store = kube.store();
    let Some(resource) = store
        .resource("argoproj.io", "v1alpha1", "applications")
        .cloned()
    else {
        return Vec::new();
    };
    let text = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    store
        .list(
            &resource,
            "",
            &crate::kube::store::Selector::default(),
            &crate::kube::store::Selector::default(),
        )
        .into_iter()
        .map(|app| {
            let labels: BTreeMap<String, String> = [
                ("__name__", "argocd_app_info".to_string()),
                ("name", text(&app, "/metadata/name")),
                ("namespace", text(&app, "/metadata/namespace")),
                ("project", text(&app, "/spec/project")),
                ("dest_server", text(&app, "/spec/destination/server")),
                ("dest_namespace", text(&app, "/spec/destination/namespace")),
                ("repo", text(&app, "/spec/source/repoURL")),
                ("sync_status", text(&app, "/status/sync/status")),
                ("health_status", text(&app, "/status/health/status")),
                ("operation", text(&app, "/status/operationState/phase")),
                (
                    "autosync_enabled",
                    app.pointer("/spec/syncPolicy/automated")
                        .is_some_and(|a| !a.is_null())
                        .to_string(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            (labels, 1.0)
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Matcher {
    Eq(String, String),
    Ne(String, String),
    Re(String, regex::Regex),
    NotRe(String, regex::Regex),
}

impl Matcher {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = |name: &str| labels.get(name).map(String::as_str).unwrap_or("");
        match self {
            Matcher::Eq(n, v) => value(n) == v,
            Matcher::Ne(n, v) => value(n) != v,
            Matcher::Re(n, r) => r.is_match(value(n)),
            Matcher::NotRe(n, r) => !r.is_match(value(n)),
        }
    }
}

/// A parsed query: the aggregation (if any) and the selector's matchers.
#[derive(Debug)]
pub struct Parsed {
    aggregation: Option<&'static str>,
    matchers: Vec<Matcher>,
}

fn bad(message: impl Into<String>) -> String {
    message.into()
}

/// Parses the query shapes the double models.
pub fn parse(query: &str) -> Result<Parsed, String> {
    let query = query.trim();
    let (aggregation, inner) = ["count", "sum"]
        .iter()
        .find_map(|agg| {
            let rest = query.strip_prefix(agg)?.trim_start();
            let inner = rest.strip_prefix('(')?.strip_suffix(')')?;
            Some((Some(*agg), inner.trim()))
        })
        .unwrap_or((None, query));
    let (metric, rest) = match inner.find('{') {
        Some(at) => (&inner[..at], Some(&inner[at..])),
        None => (inner, None),
    };
    let metric = metric.trim();
    let mut matchers = Vec::new();
    if !metric.is_empty() {
        if !metric
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(bad(format!(
                "unexpected character in metric name {metric:?}"
            )));
        }
        matchers.push(Matcher::Eq("__name__".into(), metric.into()));
    }
    if let Some(block) = rest {
        let body = block
            .strip_prefix('{')
            .and_then(|b| b.strip_suffix('}'))
            .ok_or_else(|| bad("unclosed label matchers"))?;
        let chars: Vec<char> = body.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
                i += 1;
            }
            if i >= chars.len() {
                break;
            }
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            if name.is_empty() {
                return Err(bad(format!("unexpected {:?} in label matchers", chars[i])));
            }
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            let op: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|o| op.starts_with(o))
                .ok_or_else(|| bad(format!("expected a matcher operator after {name}")))?;
            i += op.len();
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            if chars.get(i) != Some(&'"') {
                return Err(bad(format!("expected a quoted value for {name}")));
            }
            i += 1;
            let mut value = String::new();
            loop {
                let c = *chars.get(i).ok_or_else(|| bad("unterminated string"))?;
                i += 1;
                match c {
                    '"' => break,
                    '\\' => {
                        let e = *chars.get(i).ok_or_else(|| bad("unterminated string"))?;
                        i += 1;
                        value.push(match e {
                            'n' => '\n',
                            't' => '\t',
                            '\\' | '"' | '\'' => e,
                            other => {
                                return Err(bad(format!("unknown escape sequence \\{other}")));
                            }
                        });
                    }
                    other => value.push(other),
                }
            }
            let anchored = |v: &str| {
                regex::Regex::new(&format!("^(?:{v})$"))
                    .map_err(|e| bad(format!("invalid regular expression {v:?}: {e}")))
            };
            matchers.push(match op {
                "=" => Matcher::Eq(name, value),
                "!=" => Matcher::Ne(name, value),
                "=~" => Matcher::Re(name, anchored(&value)?),
                _ => Matcher::NotRe(name, anchored(&value)?),
            });
        }
    }
    if matchers.is_empty() {
        return Err(bad("vector selector must contain at least one matcher"));
    }
    Ok(Parsed {
        aggregation,
        matchers,
    })
}

/// The instant query's answer (`data`), as Prometheus's HTTP API writes it.
pub fn answer(parsed: &Parsed, samples: &[Sample], at: f64) -> Value {
    let selected: Vec<&Sample> = samples
        .iter()
        .filter(|(labels, _)| parsed.matchers.iter().all(|m| m.matches(labels)))
        .collect();
    let number = |x: f64| {
        if x.fract() == 0.0 {
            format!("{x:.0}")
        } else {
            x.to_string()
        }
    };
    let result: Vec<Value> = match parsed.aggregation {
        Some(_) if selected.is_empty() => Vec::new(),
        Some(agg) => {
            let value = if agg == "count" {
                selected.len() as f64
            } else {
                selected.iter().map(|(_, v)| v).sum()
            };
            vec![json!({"metric": {}, "value": [at, number(value)]})]
        }
        None => selected
            .iter()
            .map(|(labels, v)| json!({"metric": labels, "value": [at, number(*v)]}))
            .collect(),
    };
    json!({"resultType": "vector", "result": result})
}

/// The samples now and the evaluation time (the ground's clock, in seconds).
type Source = std::sync::Arc<dyn Fn() -> (Vec<Sample>, f64) + Send + Sync>;

pub struct PrometheusDouble {
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PrometheusDouble {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn query_get(
    State(source): State<Source>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Response {
    respond(&source, params)
}

async fn query_post(
    State(source): State<Source>,
    Form(params): Form<BTreeMap<String, String>>,
) -> Response {
    respond(&source, params)
}

fn respond(source: &Source, params: BTreeMap<String, String>) -> Response {
    let Some(query) = params.get("query") else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"status": "error", "errorType": "bad_data", "error": "invalid parameter \"query\": empty query"})),
        )
            .into_response();
    };
    match parse(query) {
        Ok(parsed) => {
            let (samples, at) = source();
            Json(json!({"status": "success", "data": answer(&parsed, &samples, at)}))
                .into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"status": "error", "errorType": "bad_data", "error": format!("invalid parameter \"query\": {e}")})),
        )
            .into_response(),
    }
}

impl PrometheusDouble {
    /// Starts the double on an ephemeral loopback port; every query reads `kube` afresh.
    pub async fn start(kube: KubeDouble) -> Result<PrometheusDouble> {
        let source: Source =
            std::sync::Arc::new(move || (argocd_app_info(&kube), kube.clock().seconds_f64()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .route("/api/v1/query", get(query_get).post(query_post))
            .with_state(source);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(PrometheusDouble { addr, server })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str, sync: &str, health: &str) -> Sample {
        (
            [
                ("__name__", "argocd_app_info"),
                ("name", name),
                ("sync_status", sync),
                ("health_status", health),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            1.0,
        )
    }

    #[test]
    fn the_charts_query_counts_synced_and_healthy_applications() {
        // [Prometheus docs: querying/basics (matchers, anchored regexes), querying/api
        // (instant query JSON), querying/operators (aggregation over no series is empty)]
        let samples = [
            sample("cm-prod-eu", "Synced", "Healthy"),
            sample("cm-prod-us", "Synced", "Degraded"),
            sample("cm-prod-eux", "Synced", "Healthy"),
            sample("cm.prod", "Synced", "Healthy"),
        ];
        let q = |query: &str| answer(&parse(query).unwrap(), &samples, 1.0);
        let query = r#"count(argocd_app_info{name=~"cm-prod-eu|cm-prod-us",sync_status="Synced",health_status="Healthy"})"#;
        assert_eq!(
            q(query)["result"],
            json!([{"metric": {}, "value": [1.0, "1"]}])
        );
        // Anchored: cm-prod-eux does not match cm-prod-eu.
        assert_eq!(
            q(r#"count(argocd_app_info{name=~"cm-prod-e"})"#)["result"],
            json!([])
        );
        // An escaped dot in the chart's arg.
        assert_eq!(
            q(r#"count(argocd_app_info{name=~"cm\\.prod"})"#)["result"][0]["value"][1],
            json!("1")
        );
        assert_eq!(
            q(r#"sum(argocd_app_info{health_status!="Healthy"})"#)["result"][0]["value"][1],
            json!("1")
        );
        assert_eq!(
            q(r#"argocd_app_info{name="cm-prod-us"}"#)["result"][0]["metric"]["health_status"],
            json!("Degraded")
        );
        for refused in [
            "rate(argocd_app_info[5m])",
            r#"argocd_app_info{name~"x"}"#,
            r#"argocd_app_info{name="x}"#,
            r#"{name=~"(unclosed"}"#,
            "",
        ] {
            assert!(parse(refused).is_err(), "{refused}");
        }
    }
}
