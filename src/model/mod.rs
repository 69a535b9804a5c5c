//! The model seam: one call, a prompt and a JSON response schema in, a JSON value and token
//! usage out. Replies are structured output only: a proposed document comes back as a JSON
//! object inside the reply, never as YAML text the harness would have to parse.
//!
//! Providers (`bosun.yaml` `model.provider`): `anthropic` (the Messages API, the reply through a
//! forced tool call), `openai` (Chat Completions with `response_format: json_schema`; any
//! compatible server through `baseUrl`), `none` (the paths that would ask a model hand off).
//!
//! Whatever the provider returns is hostile until the harness has checked it: a reply that is
//! not JSON, does not match the schema, is empty, too large, too deep or late is a `Refusal`
//! with the reason, never a crash. Before anything leaves the process it is redacted
//! (`redact`): Secret data, values under credential keys or schema hints, token-shaped values
//! and the operator's `model.redact` rules never reach a provider.

pub mod redact;
pub mod remembered;

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::bosun::config::{ModelConfig, ModelProvider};

pub use redact::{Held, Rules, redact};

/// The most bytes a reply body may have; a larger one is refused unread.
pub const MAX_REPLY_BYTES: usize = 1 << 20;
/// The deepest nesting a reply's JSON may have.
pub const MAX_REPLY_DEPTH: usize = 64;

/// One question to a model.
#[derive(Debug, Clone)]
pub struct Request {
    /// Which path asks (`reshape`, `values-migration`): for logs and the ground's transcript.
    pub purpose: String,
    /// What the question is about (a document reference).
    pub subject: String,
    /// The instructions.
    pub system: String,
    /// The material (already redacted by the caller through `redact::Held`).
    pub prompt: String,
    /// The JSON Schema the reply object must match.
    pub schema: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Clone)]
pub struct Reply {
    pub value: Value,
    pub usage: Usage,
}

/// Why a call produced nothing the harness may look at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the model endpoint could not be reached: {0}")]
    Transport(String),
    #[error("the model endpoint answered {0}: {1}")]
    Status(u16, String),
    #[error("the model did not answer within {0} s")]
    Timeout(u64),
    #[error("the reply is empty")]
    Empty,
    #[error("the reply is not JSON: {0}")]
    NotJson(String),
    #[error("the reply does not match the response schema: {0}")]
    Schema(String),
    #[error("the reply is too large or too deep: {0}")]
    TooLarge(String),
    #[error("the model declined: {0}")]
    Declined(String),
}

/// A language model behind the harness.
#[async_trait]
pub trait Model: Send + Sync {
    async fn call(&self, request: &Request) -> Result<Reply, Refusal>;
}

/// The model `bosun.yaml` configures, or `None` for `provider: none`. The key is read from
/// the environment variable `apiKeyEnv` names.
pub fn from_config(config: &ModelConfig) -> Result<Option<Box<dyn Model>>, String> {
    let key_env = config
        .api_key_env
        .clone()
        .unwrap_or_else(|| match config.provider {
            ModelProvider::Anthropic => "ANTHROPIC_API_KEY".into(),
            _ => "OPENAI_API_KEY".into(),
        });
    let api_key = std::env::var(&key_env).ok().filter(|k| !k.is_empty());
    if config.provider == ModelProvider::Anthropic && api_key.is_none() {
        return Err(format!(
            "model.provider anthropic needs a key in ${key_env}"
        ));
    }
    with_key(config, api_key)
}

/// `from_config` with the key given (None: no key).
pub fn with_key(
    config: &ModelConfig,
    api_key: Option<String>,
) -> Result<Option<Box<dyn Model>>, String> {
    let provider = match config.provider {
        ModelProvider::None => return Ok(None),
        provider => provider,
    };
    let model = config
        .model
        .clone()
        .filter(|m| !m.trim().is_empty())
        .ok_or("model.model is required when model.provider is not none")?;
    let base_url = config
        .base_url
        .clone()
        .unwrap_or_else(|| match provider {
            ModelProvider::Anthropic => "https://api.anthropic.com".into(),
            _ => "https://api.openai.com/v1".into(),
        })
        .trim_end_matches('/')
        .to_string();
    // TLS needs a crypto provider; installing it twice is harmless.
    crate::forge::github::install_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(config.timeout_seconds.max(1)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    Ok(Some(Box::new(Http {
        provider,
        client,
        base_url,
        model,
        api_key,
        max_output_tokens: config.max_output_tokens,
        timeout_seconds: config.timeout_seconds.max(1),
        retries: 3,
    })))
}

struct Http {
    provider: ModelProvider,
    client: reqwest::Client,
    base_url: String,
    model: String,
    api_key: Option<String>,
    max_output_tokens: u32,
    timeout_seconds: u64,
    retries: u32,
}

impl Http {
    fn max_tokens_field(&self) -> &'static str {
        let host = self
            .base_url
            .split("://")
            .nth(1)
            .unwrap_or("")
            .split(['/', ':'])
            .next()
            .unwrap_or("");
        if host == "api.openai.com" {
            "max_completion_tokens"
        } else {
            "max_tokens"
        }
    }

    fn body(&self, request: &Request) -> (String, Value) {
        match self.provider {
            ModelProvider::Anthropic => (
                format!("{}/v1/messages", self.base_url),
                json!({
                    "model": self.model,
                    "max_tokens": self.max_output_tokens,
                    "system": request.system,
                    "messages": [{"role": "user", "content": request.prompt}],
                    "tools": [{
                        "name": "propose",
                        "description": "Return the proposal. Every field of the schema is required.",
                        "input_schema": request.schema,
                    }],
                    "tool_choice": {"type": "tool", "name": "propose"},
                }),
            ),
            _ => (
                format!("{}/chat/completions", self.base_url),
                json!({
                    "model": self.model,
                    // OpenAI's own API wants `max_completion_tokens` (its newer models refuse
                    // `max_tokens`); compatible servers (vLLM, Ollama, llama.cpp) read
                    // `max_tokens`.
                    self.max_tokens_field(): self.max_output_tokens,
                    "messages": [
                        {"role": "system", "content": request.system},
                        {"role": "user", "content": request.prompt},
                    ],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "proposal", "strict": false, "schema": request.schema},
                    },
                }),
            ),
        }
    }

    /// The structured output and usage out of a provider's response body.
    fn extract(&self, body: &Value) -> Result<(Value, Usage), Refusal> {
        match self.provider {
            ModelProvider::Anthropic => {
                let usage = Usage {
                    input_tokens: body["usage"]["input_tokens"].as_u64().unwrap_or(0),
                    output_tokens: body["usage"]["output_tokens"].as_u64().unwrap_or(0),
                };
                let content = body["content"].as_array().ok_or(Refusal::Empty)?;
                let input = content
                    .iter()
                    .find(|c| c["type"] == "tool_use" && c["name"] == "propose")
                    .map(|c| c["input"].clone());
                match input {
                    Some(value) => Ok((value, usage)),
                    None if body["stop_reason"] == "refusal" => {
                        Err(Refusal::Declined("stop_reason refusal".into()))
                    }
                    None => Err(Refusal::Empty),
                }
            }
            _ => {
                let usage = Usage {
                    input_tokens: body["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                    output_tokens: body["usage"]["completion_tokens"].as_u64().unwrap_or(0),
                };
                let message = &body["choices"][0]["message"];
                if let Some(refusal) = message["refusal"].as_str().filter(|r| !r.is_empty()) {
                    return Err(Refusal::Declined(clip(refusal)));
                }
                let text = message["content"].as_str().unwrap_or("");
                if text.trim().is_empty() {
                    return Err(Refusal::Empty);
                }
                let value = parse_reply(text.as_bytes())?;
                Ok((value, usage))
            }
        }
    }
}

#[async_trait]
impl Model for Http {
    async fn call(&self, request: &Request) -> Result<Reply, Refusal> {
        let (url, body) = self.body(request);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut call = self.client.post(&url).json(&body);
            call = match (self.provider, &self.api_key) {
                (ModelProvider::Anthropic, Some(key)) => call
                    .header("x-api-key", key)
                    .header("anthropic-version", "2023-06-01"),
                (_, Some(key)) => call.bearer_auth(key),
                (_, None) => call,
            };
            let response = match call.send().await {
                Ok(response) => response,
                Err(e) if e.is_timeout() => return Err(Refusal::Timeout(self.timeout_seconds)),
                Err(e) => {
                    if attempt <= self.retries && e.is_connect() {
                        tokio::time::sleep(backoff(attempt, None)).await;
                        continue;
                    }
                    return Err(Refusal::Transport(clip(&e.to_string())));
                }
            };
            let status = response.status();
            if status.as_u16() == 429 || status.is_server_error() {
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok());
                if attempt <= self.retries {
                    tokio::time::sleep(backoff(attempt, retry_after)).await;
                    continue;
                }
                return Err(Refusal::Status(
                    status.as_u16(),
                    format!("still failing after {} attempts", attempt),
                ));
            }
            let bytes = read_capped(response).await?;
            if !status.is_success() {
                return Err(Refusal::Status(
                    status.as_u16(),
                    clip(&String::from_utf8_lossy(&bytes)),
                ));
            }
            let body = parse_reply(&bytes)?;
            let (value, usage) = self.extract(&body)?;
            check_reply(&value, &request.schema)?;
            return Ok(Reply { value, usage });
        }
    }
}

/// Seconds to wait before retry `attempt`: the server's `retry-after` when it gives one (at
/// most 60 s), else 1, 2, 4 s.
fn backoff(attempt: u32, retry_after: Option<u64>) -> Duration {
    match retry_after {
        Some(seconds) => Duration::from_secs(seconds.min(60)),
        None => Duration::from_millis(500u64 << attempt.min(4)),
    }
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, Refusal> {
    if response
        .content_length()
        .is_some_and(|n| n as usize > MAX_REPLY_BYTES)
    {
        return Err(Refusal::TooLarge(format!(
            "the body is over {MAX_REPLY_BYTES} bytes"
        )));
    }
    let mut out = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                out.extend_from_slice(&chunk);
                if out.len() > MAX_REPLY_BYTES {
                    return Err(Refusal::TooLarge(format!(
                        "the body is over {MAX_REPLY_BYTES} bytes"
                    )));
                }
            }
            Ok(None) => return Ok(out),
            Err(e) if e.is_timeout() => return Err(Refusal::Timeout(0)),
            Err(e) => return Err(Refusal::Transport(clip(&e.to_string()))),
        }
    }
}

/// Parses a reply's JSON within the size and depth limits.
pub fn parse_reply(bytes: &[u8]) -> Result<Value, Refusal> {
    if bytes.len() > MAX_REPLY_BYTES {
        return Err(Refusal::TooLarge(format!(
            "the reply is over {MAX_REPLY_BYTES} bytes"
        )));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Refusal::Empty);
    }
    // serde_json stops at 128 levels by itself; the harness wants less.
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| Refusal::NotJson(clip(&e.to_string())))?;
    if depth(&value) > MAX_REPLY_DEPTH {
        return Err(Refusal::TooLarge(format!(
            "nesting deeper than {MAX_REPLY_DEPTH}"
        )));
    }
    Ok(value)
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The reply object against the request's response schema (a real JSON Schema validator,
/// with no remote references: the crate is built without its resolvers).
pub fn check_reply(value: &Value, schema: &Value) -> Result<(), Refusal> {
    if value.is_null() || value.as_object().is_some_and(|o| o.is_empty()) {
        return Err(Refusal::Empty);
    }
    if depth(value) > MAX_REPLY_DEPTH {
        return Err(Refusal::TooLarge(format!(
            "nesting deeper than {MAX_REPLY_DEPTH}"
        )));
    }
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| Refusal::Schema(format!("the response schema itself is invalid: {e}")))?;
    if let Some(error) = validator.iter_errors(value).next() {
        return Err(Refusal::Schema(clip(&format!(
            "{} at {}",
            error,
            error.instance_path()
        ))));
    }
    Ok(())
}

fn clip(s: &str) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() > 200 {
        format!("{}…", one_line.chars().take(200).collect::<String>())
    } else {
        one_line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "required": ["document"], "additionalProperties": false,
               "properties": {"document": {"type": "object"}}})
    }

    #[test]
    fn replies_that_are_not_a_proposal_are_refusals() {
        assert_eq!(parse_reply(b"  "), Err(Refusal::Empty));
        assert!(matches!(
            parse_reply(b"apiVersion: v1"),
            Err(Refusal::NotJson(_))
        ));
        let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
        assert!(matches!(
            parse_reply(deep.as_bytes()),
            Err(Refusal::TooLarge(_))
        ));
        let big = vec![b' '; MAX_REPLY_BYTES + 1];
        assert!(matches!(parse_reply(&big), Err(Refusal::TooLarge(_))));
        assert!(matches!(
            check_reply(&json!({"document": "apiVersion: v1"}), &schema()),
            Err(Refusal::Schema(_))
        ));
        assert!(matches!(
            check_reply(&json!({"document": {}, "also": 1}), &schema()),
            Err(Refusal::Schema(_))
        ));
        assert_eq!(check_reply(&json!({}), &schema()), Err(Refusal::Empty));
        assert!(check_reply(&json!({"document": {"a": 1}}), &schema()).is_ok());
    }

    #[test]
    fn openai_itself_gets_max_completion_tokens_and_compatible_servers_max_tokens() {
        crate::forge::github::install_crypto_provider();
        let http = |base_url: &str| Http {
            provider: ModelProvider::Openai,
            client: reqwest::Client::new(),
            base_url: base_url.into(),
            model: "m".into(),
            api_key: None,
            max_output_tokens: 100,
            timeout_seconds: 1,
            retries: 0,
        };
        let request = Request {
            purpose: "t".into(),
            subject: "t".into(),
            system: "s".into(),
            prompt: "p".into(),
            schema: schema(),
        };
        let (url, body) = http("https://api.openai.com/v1").body(&request);
        assert_eq!(url, "https://api.openai.com/v1/chat/completions");
        assert_eq!(body["max_completion_tokens"], 100);
        assert!(body.get("max_tokens").is_none());
        let (_, body) = http("http://127.0.0.1:8000/v1").body(&request);
        assert_eq!(body["max_tokens"], 100);
    }

    #[test]
    fn backoff_honours_retry_after_within_a_minute() {
        assert_eq!(backoff(1, Some(3)), Duration::from_secs(3));
        assert_eq!(backoff(1, Some(3600)), Duration::from_secs(60));
        assert!(backoff(2, None) > backoff(1, None));
    }
}
