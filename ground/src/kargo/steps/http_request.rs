//! The http step: a request to a service the scenario names.

use serde_json::Value;
use serde_json::json;

use crate::kargo::steps::{Outcome, StepContext, http_client, text};

pub(super) async fn http(ctx: &StepContext<'_>, config: &Value) -> Outcome {
    let method = if text(config, "method").is_empty() {
        "GET"
    } else {
        text(config, "method")
    };
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return Outcome::Failed {
            said: format!("unknown method {method}"),
        };
    };
    // Hosts the scenario names (e.g. https://bosun.example.test) reach their loopback servers.
    let written = text(config, "url");
    let url = ctx
        .kargo
        .http_aliases
        .iter()
        .find_map(|(alias, actual)| {
            written
                .strip_prefix(alias.as_str())
                .map(|rest| format!("{actual}{rest}"))
        })
        .unwrap_or_else(|| written.to_string());
    let mut request = http_client().request(method.clone(), url);
    for header in config
        .get("headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        request = request.header(text(header, "name"), text(header, "value"));
    }
    if !text(config, "body").is_empty() {
        request = request.body(text(config, "body").to_string());
    }
    match request.send().await {
        Ok(response) if response.status().is_success() => {
            let status = response.status().as_u16();
            // [K http_requester.go buildOutputs]: the output holds only the configured
            // `outputs` (this double models none).
            Outcome::Done {
                output: json!({}),
                said: format!("{method} {} answered {status}", text(config, "url")),
            }
        }
        // Without success/failure expressions a non-2xx answer is retried.
        Ok(response) => Outcome::Waiting {
            said: format!(
                "{method} {} answered {}",
                text(config, "url"),
                response.status()
            ),
        },
        // [K http_requester.go]: a request that cannot be sent (connection refused, DNS) is
        // Errored, not retried by itself: `retry.errorThreshold` decides.
        Err(e) => Outcome::Errored {
            said: format!(
                "error sending HTTP request: {method} {}: {}",
                text(config, "url"),
                if e.is_connect() {
                    "connection refused"
                } else if e.is_timeout() {
                    "timed out"
                } else {
                    "the request failed"
                }
            ),
        },
    }
}
