//! Argo Rollouts' analysis controller, for the AnalysisRuns Kargo's verification creates
//! ([R analysis/analysis.go, utils/evaluate/evaluate.go, metricproviders/prometheus], v1.8):
//! each metric's `{{args.*}}` resolved from the run's args (an unresolved one Errors the run),
//! one measurement per metric per ground tick (the tick stands in for `interval`), the
//! Prometheus provider's instant query over HTTP (a vector becomes a list of floats, a scalar a
//! float), `successCondition` / `failureCondition` evaluated as Argo Rollouts evaluates them
//! (only success: false fails; only failure: false succeeds; neither true: inconclusive), and
//! the metric assessed: failed > failureLimit (default 0) is Failed, inconclusive >
//! inconclusiveLimit (default 0) Inconclusive, consecutive errors > consecutiveErrorLimit
//! (default 4) Error, `count` measurements otherwise Successful (no `count` and no
//! `interval`: one). The run takes the worst metric phase once every metric is done, or as
//! soon as one fails.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::kube::KubeDouble;
use crate::kube::store::{PatchBody, Selector};
use crate::transcript::Transcript;

pub const GROUP: &str = "argoproj.io";
pub const VERSION: &str = "v1alpha1";

fn text<'v>(value: &'v Value, pointer: &str) -> &'v str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A phase that ends a run or a metric.
pub fn terminal(phase: &str) -> bool {
    matches!(phase, "Successful" | "Failed" | "Error" | "Inconclusive")
}

/// Worse phases come later ([R analysis_types.go: IsWorse]).
fn rank(phase: &str) -> u8 {
    match phase {
        "Pending" => 0,
        "Running" => 1,
        "Successful" => 2,
        "Inconclusive" => 3,
        "Error" => 4,
        "Failed" => 5,
        _ => 0,
    }
}

fn int(value: &Value, key: &str) -> Option<i64> {
    match value.get(key)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Replaces `{{args.NAME}}` (spaces allowed) with the run's argument values.
fn resolve(text: &str, args: &BTreeMap<String, String>) -> Result<String, String> {
    static ARG: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\{\{\s*args\.([A-Za-z0-9_-]+)\s*\}\}").expect("a fixed pattern")
    });
    let re = &*ARG;
    let mut missing = None;
    let out = re.replace_all(text, |c: &regex::Captures| match args.get(&c[1]) {
        Some(v) => v.clone(),
        None => {
            missing = Some(c[1].to_string());
            String::new()
        }
    });
    if let Some(name) = missing {
        return Err(format!("failed to resolve {{{{args.{name}}}}}"));
    }
    // [R utils/analysis/helpers.go ResolveArgs, fasttemplate]: any other tag is unresolved too.
    if let Some(at) = out.find("{{") {
        let tag: String = out[at..].chars().take(40).collect();
        return Err(format!("failed to resolve {tag}"));
    }
    Ok(out.into_owned())
}

/// The analysis controller.
#[derive(Default)]
pub struct Rollouts {
    /// URL prefixes a metric names (e.g. `http://prometheus.example.test:9090`) -> the double.
    pub http_aliases: BTreeMap<String, String>,
}

impl Rollouts {
    /// Takes one measurement of every running metric of every AnalysisRun; true when anything
    /// changed.
    pub async fn tick(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let Some(resource) = kube
            .store()
            .resource(GROUP, VERSION, "analysisruns")
            .cloned()
        else {
            return false;
        };
        let runs = kube
            .store()
            .list(&resource, "", &Selector::default(), &Selector::default());
        let mut progress = false;
        for run in runs {
            if terminal(text(&run, "/status/phase")) {
                continue;
            }
            let status = self.advance(&run, &kube.clock()).await;
            let phase = text(&status, "/phase").to_string();
            let namespace = text(&run, "/metadata/namespace").to_string();
            let name = text(&run, "/metadata/name").to_string();
            let patched = kube.store().patch(
                &resource,
                &namespace,
                &name,
                PatchBody::Merge(json!({"status": status})),
                &crate::kargo::controller_user(),
                false,
            );
            if let Err(e) = patched {
                transcript.say(
                    "rollouts",
                    format!("AnalysisRun {name}: status not written: {e}"),
                );
                continue;
            }
            for result in status
                .get("metricResults")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let before = run
                    .pointer("/status/metricResults")
                    .and_then(Value::as_array)
                    .and_then(|r| r.iter().find(|b| b["name"] == result["name"]))
                    .and_then(|b| b.get("count"))
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let count = result.get("count").and_then(Value::as_i64).unwrap_or(0);
                if count > before
                    && let Some(last) = result
                        .get("measurements")
                        .and_then(Value::as_array)
                        .and_then(|m| m.last())
                {
                    transcript.say(
                        "rollouts",
                        format!(
                            "AnalysisRun {name}: {} measurement {count}: {}{}",
                            text(result, "/name"),
                            text(last, "/phase"),
                            match (text(last, "/value"), text(last, "/message")) {
                                ("", "") => String::new(),
                                ("", m) => format!(" ({m})"),
                                (v, _) => format!(" (result {v})"),
                            }
                        ),
                    );
                }
            }
            if terminal(&phase) {
                transcript.say(
                    "rollouts",
                    format!(
                        "AnalysisRun {name}: {phase}{}",
                        match text(&status, "/message") {
                            "" => String::new(),
                            m => format!(" ({m})"),
                        }
                    ),
                );
            }
            progress = true;
        }
        progress
    }

    /// The run's next status.
    async fn advance(&self, run: &Value, clock: &crate::clock::Clock) -> Value {
        let now = clock.rfc3339();
        let mut status = run.get("status").cloned().unwrap_or_else(|| json!({}));
        if status.get("startedAt").is_none() {
            status["startedAt"] = json!(now);
        }
        let args: BTreeMap<String, String> = run
            .pointer("/spec/args")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| {
                Some((
                    text(a, "/name").to_string(),
                    a.get("value")?.as_str()?.to_string(),
                ))
            })
            .collect();
        let metrics = run
            .pointer("/spec/metrics")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut results: Vec<Value> = status
            .get("metricResults")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut worst: Option<(String, String)> = None;
        let mut all_done = true;
        for metric in &metrics {
            let name = text(metric, "/name").to_string();
            let index = match results.iter().position(|r| text(r, "/name") == name) {
                Some(i) => i,
                None => {
                    results.push(json!({"name": name, "phase": "Pending", "count": 0,
                        "successful": 0, "failed": 0, "inconclusive": 0, "error": 0,
                        "consecutiveError": 0, "measurements": []}));
                    results.len() - 1
                }
            };
            let result = &mut results[index];
            if !terminal(text(result, "/phase")) {
                let (phase, value, message) = match self.measure(metric, &args).await {
                    Ok((phase, value)) => (phase, value, String::new()),
                    Err(message) => ("Error".to_string(), String::new(), message),
                };
                let bump = |r: &mut Value, key: &str| {
                    r[key] = json!(r.get(key).and_then(Value::as_i64).unwrap_or(0) + 1);
                };
                bump(result, "count");
                match phase.as_str() {
                    "Successful" => bump(result, "successful"),
                    "Failed" => bump(result, "failed"),
                    "Inconclusive" => bump(result, "inconclusive"),
                    _ => bump(result, "error"),
                }
                if phase == "Error" {
                    bump(result, "consecutiveError");
                } else {
                    result["consecutiveError"] = json!(0);
                }
                let mut measurement = json!({"phase": phase, "startedAt": now, "finishedAt": now});
                if !value.is_empty() {
                    measurement["value"] = json!(value);
                }
                if !message.is_empty() {
                    measurement["message"] = json!(message);
                    result["message"] = json!(message);
                }
                if let Some(list) = result.get_mut("measurements").and_then(Value::as_array_mut) {
                    list.push(measurement);
                    // [R measurementRetention default]: the newest 10 are kept.
                    if list.len() > 10 {
                        let extra = list.len() - 10;
                        list.drain(..extra);
                    }
                }
                let (assessed, why) = assess(metric, result);
                result["phase"] = json!(assessed);
                if !why.is_empty() {
                    result["message"] = json!(why);
                }
            }
            let phase = text(result, "/phase").to_string();
            if !terminal(&phase) {
                all_done = false;
            }
            if terminal(&phase) && phase != "Successful" {
                let why = format!(
                    "Metric \"{name}\" assessed {phase} due to {}",
                    text(result, "/message")
                );
                if worst.as_ref().is_none_or(|(p, _)| rank(&phase) > rank(p)) {
                    worst = Some((phase, why));
                }
            }
        }
        status["metricResults"] = Value::Array(results);
        match worst {
            Some((phase, why)) => {
                status["phase"] = json!(phase);
                status["message"] = json!(why);
                status["completedAt"] = json!(now);
            }
            None if all_done && !metrics.is_empty() => {
                status["phase"] = json!("Successful");
                status["completedAt"] = json!(now);
            }
            None if metrics.is_empty() => {
                status["phase"] = json!("Error");
                status["message"] = json!("the run has no metrics");
            }
            None => status["phase"] = json!("Running"),
        }
        status
    }

    /// One measurement: the provider's answer and the conditions' verdict.
    async fn measure(
        &self,
        metric: &Value,
        args: &BTreeMap<String, String>,
    ) -> Result<(String, String), String> {
        let Some(prometheus) = metric.pointer("/provider/prometheus") else {
            return Err(
                "the ground's analysis controller models only the prometheus provider".into(),
            );
        };
        let address = resolve(text(prometheus, "/address"), args)?;
        let query = resolve(text(prometheus, "/query"), args)?;
        let address = self
            .http_aliases
            .iter()
            .find_map(|(alias, actual)| {
                address
                    .strip_prefix(alias.as_str())
                    .map(|rest| format!("{actual}{rest}"))
            })
            .unwrap_or(address);
        gitops_loop::forge::github::install_crypto_provider();
        let mut url =
            reqwest::Url::parse(&format!("{}/api/v1/query", address.trim_end_matches('/')))
                .map_err(|e| format!("address {address:?}: {e}"))?;
        url.query_pairs_mut().append_pair("query", &query);
        let response = crate::http::client()
            .get(url)
            .timeout(std::time::Duration::from_secs(5))
            .send()
            .await
            .map_err(|e| {
                format!(
                    "Post \"{address}/api/v1/query\": {}",
                    if e.is_connect() {
                        "connection refused"
                    } else {
                        "the request failed"
                    }
                )
            })?;
        let body: Value = response
            .json()
            .await
            .map_err(|_| "the Prometheus answer is not JSON".to_string())?;
        if text(&body, "/status") != "success" {
            return Err(format!(
                "{}: {}",
                text(&body, "/errorType"),
                text(&body, "/error")
            ));
        }
        let (result, shown) = match text(&body, "/data/resultType") {
            "vector" => {
                let values: Vec<f64> = body
                    .pointer("/data/result")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.pointer("/value/1")?.as_str()?.parse().ok())
                    .collect();
                let shown = format!(
                    "[{}]",
                    values
                        .iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                );
                (json!(values), shown)
            }
            "scalar" => {
                let v: f64 = body
                    .pointer("/data/result/1")
                    .and_then(Value::as_str)
                    .and_then(|s| s.parse().ok())
                    .ok_or("a scalar without a value")?;
                (json!(v), v.to_string())
            }
            other => return Err(format!("Prometheus metric type not supported: {other}")),
        };
        let env = json!({"result": result});
        let condition = |key: &str| -> Result<Option<bool>, String> {
            let text = metric.get(key).and_then(Value::as_str).unwrap_or("");
            if text.is_empty() {
                return Ok(None);
            }
            let resolved = resolve(text, args)?;
            match crate::kargo::expr::evaluate_in(&resolved, &env)? {
                Value::Bool(b) => Ok(Some(b)),
                other => Err(format!("{key} {resolved:?} gave {other}, not a bool")),
            }
        };
        let (success, failure) = (
            condition("successCondition")?,
            condition("failureCondition")?,
        );
        let phase = match (success, failure) {
            (None, None) => "Successful",
            (Some(s), None) => {
                if s {
                    "Successful"
                } else {
                    "Failed"
                }
            }
            (None, Some(f)) => {
                if f {
                    "Failed"
                } else {
                    "Successful"
                }
            }
            (Some(_), Some(true)) => "Failed",
            (Some(true), Some(false)) => "Successful",
            (Some(false), Some(false)) => "Inconclusive",
        };
        Ok((phase.to_string(), shown))
    }
}

/// A metric's phase after a measurement, and why ([R assessMetricStatus]).
fn assess(metric: &Value, result: &Value) -> (String, String) {
    let get = |k: &str| result.get(k).and_then(Value::as_i64).unwrap_or(0);
    let failure_limit = int(metric, "failureLimit").unwrap_or(0);
    let inconclusive_limit = int(metric, "inconclusiveLimit").unwrap_or(0);
    let error_limit = int(metric, "consecutiveErrorLimit").unwrap_or(4);
    let mut verdict: Option<(String, String)> = None;
    if failure_limit >= 0 && get("failed") > failure_limit {
        verdict = Some((
            "Failed".into(),
            format!(
                "failed ({}) > failureLimit ({failure_limit})",
                get("failed")
            ),
        ));
    }
    if get("inconclusive") > inconclusive_limit {
        verdict = Some((
            "Inconclusive".into(),
            format!(
                "inconclusive ({}) > inconclusiveLimit ({inconclusive_limit})",
                get("inconclusive")
            ),
        ));
    }
    if get("consecutiveError") > error_limit {
        verdict = Some((
            "Error".into(),
            format!(
                "consecutiveErrors ({}) > consecutiveErrorLimit ({error_limit})",
                get("consecutiveError")
            ),
        ));
    }
    if let Some(v) = verdict {
        return v;
    }
    let count = match int(metric, "count").filter(|c| *c > 0) {
        Some(c) => Some(c),
        None if text(metric, "/interval").is_empty() => Some(1),
        None => None,
    };
    match count {
        Some(c) if get("count") >= c => ("Successful".into(), String::new()),
        _ => ("Running".into(), String::new()),
    }
}

/// An AnalysisRun for a Stage's verification ([K pkg/controller/stages: the run takes the
/// templates' metrics and args, the Stage's args fill or override them; an arg the templates do
/// not declare is an error]).
pub fn run_for(
    templates: &[Value],
    stage_args: &[Value],
    name: &str,
    namespace: &str,
    labels: Value,
    annotations: Value,
) -> Result<Value, String> {
    let mut metrics = Vec::new();
    let mut args: Map<String, Value> = Map::new();
    for template in templates {
        for metric in template
            .pointer("/spec/metrics")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            metrics.push(metric.clone());
        }
        for arg in template
            .pointer("/spec/args")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            args.insert(text(arg, "/name").to_string(), arg.clone());
        }
    }
    for arg in stage_args {
        let name = text(arg, "/name");
        if !args.contains_key(name) {
            return Err(format!(
                "argument {name:?} is not declared by the AnalysisTemplates"
            ));
        }
        args.insert(
            name.to_string(),
            json!({"name": name, "value": text(arg, "/value")}),
        );
    }
    Ok(
        json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {"metrics": metrics, "args": args.into_iter().map(|(_, v)| v).collect::<Vec<_>>()}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_assessed_as_argo_rollouts_assesses_them() {
        let metric = json!({"name": "m", "count": 5, "interval": "30s", "failureLimit": 1});
        let r = |failed: i64, count: i64| json!({"failed": failed, "count": count, "inconclusive": 0, "consecutiveError": 0});
        assert_eq!(assess(&metric, &r(1, 3)).0, "Running");
        assert_eq!(assess(&metric, &r(2, 3)).0, "Failed");
        assert_eq!(assess(&metric, &r(1, 5)).0, "Successful");
        let no_count = json!({"name": "m"});
        assert_eq!(assess(&no_count, &r(0, 1)).0, "Successful");
        let forever = json!({"name": "m", "interval": "1m"});
        assert_eq!(assess(&forever, &r(0, 100)).0, "Running");
        let errors = json!({"failed": 0, "count": 5, "inconclusive": 0, "consecutiveError": 5});
        assert_eq!(assess(&metric, &errors).0, "Error");
        assert_eq!(
            resolve(
                "x{{ args.apps }}y{{args.n}}",
                &[
                    ("apps".to_string(), "a|b".to_string()),
                    ("n".to_string(), "2".to_string())
                ]
                .into_iter()
                .collect()
            )
            .unwrap(),
            "xa|by2"
        );
        assert!(resolve("{{args.missing}}", &BTreeMap::new()).is_err());
    }
}
