//! The model double: a language model provider on loopback speaking both wire formats Bosun's
//! client speaks (Anthropic's Messages API at `/v1/messages`, OpenAI's Chat Completions at
//! `/v1/chat/completions`), so the product's real client code runs. A scenario scripts the
//! replies in order; every request goes into the transcript (the path that asked, the
//! document, the bytes). A call with no scripted reply answers 500 and is recorded as a
//! failure the scenario reports.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::transcript::Transcript;

/// The key the ground gives Bosun for the double; the double refuses any other.
pub const MODEL_KEY: &str = "ground-model-key";

/// A scenario's scripted model (`bosun.model`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelScript {
    /// `openai` or `anthropic`: which wire format Bosun is configured for.
    pub provider: String,
    /// Replies, in the order calls arrive.
    #[serde(default)]
    pub replies: Vec<ScriptedReply>,
    /// Strings no request may contain (canary secrets): a request holding one fails the run.
    #[serde(default)]
    pub never: Vec<String>,
    /// Keys merged over the `model:` section of bosun.yaml (maxCallsPerPullRequest, ...).
    #[serde(default)]
    pub config: Value,
}

/// One scripted reply.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedReply {
    /// A YAML or JSON file (relative to the scenario) holding the structured output object.
    #[serde(default)]
    pub file: Option<String>,
    /// The structured output object itself.
    #[serde(default)]
    pub value: Option<Value>,
    /// Raw text as the reply's content (not JSON, say).
    #[serde(default)]
    pub text: Option<String>,
    /// An HTTP status to answer instead (429, 500...), with an optional `retry-after`.
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// Answer nothing: the request is held until the client gives up (its timeout), as a
    /// provider that never answers would.
    #[serde(default)]
    pub stall: bool,
}

enum Reply {
    Value(Value),
    Text(String),
    Status(u16, Option<u64>),
    Stall,
}

#[derive(Default)]
struct Inner {
    replies: VecDeque<Reply>,
    requests: Vec<String>,
    failures: Vec<String>,
    /// Seeded timeouts (`FaultPlan::model_timeout`): the seed, per mille, the draws.
    faults: Option<(u64, u32)>,
    draws: crate::draws::Draws,
    /// Requests held past the client's timeout by a seeded fault.
    timeouts: u64,
}

#[derive(Clone)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    transcript: Transcript,
    never: Arc<Vec<String>>,
}

pub struct ModelDouble {
    addr: SocketAddr,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for ModelDouble {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl ModelDouble {
    pub async fn start(
        script: &ModelScript,
        scenario_dir: &std::path::Path,
        transcript: Transcript,
    ) -> Result<ModelDouble> {
        let mut replies = VecDeque::new();
        for (i, reply) in script.replies.iter().enumerate() {
            let parsed = match (&reply.file, &reply.value, &reply.text, reply.status) {
                _ if reply.stall => {
                    let given = reply.file.is_some()
                        || reply.value.is_some()
                        || reply.text.is_some()
                        || reply.status.is_some();
                    if given {
                        anyhow::bail!("model reply {i}: a stall answers nothing else");
                    }
                    Reply::Stall
                }
                (Some(file), None, None, None) => {
                    let path = scenario_dir.join(file);
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("model reply {i}: {}", path.display()))?;
                    let value: Value = serde_saphyr::from_str(&text).with_context(|| {
                        format!("model reply {i}: {} is not YAML", path.display())
                    })?;
                    Reply::Value(value)
                }
                (None, Some(value), None, None) => Reply::Value(value.clone()),
                (None, None, Some(text), None) => Reply::Text(text.clone()),
                (None, None, None, Some(status)) => Reply::Status(status, reply.retry_after),
                _ => {
                    anyhow::bail!(
                        "model reply {i}: give exactly one of file, value, text, status, stall"
                    )
                }
            };
            replies.push_back(parsed);
        }
        let shared = Shared {
            inner: Arc::new(Mutex::new(Inner {
                replies,
                ..Inner::default()
            })),
            transcript,
            never: Arc::new(script.never.clone()),
        };
        let app = Router::new()
            .route("/v1/messages", post(anthropic))
            .route("/v1/chat/completions", post(openai))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ModelDouble {
            addr,
            shared,
            server,
        })
    }

    /// Holds `per_mille` of the requests past the client's timeout, each decided by a draw
    /// keyed by the wire and the request's subject (`crate::draws`).
    pub fn set_timeouts(&self, seed: u64, per_mille: u32) {
        let mut inner = self.shared.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.faults = (per_mille > 0).then_some((seed, per_mille));
    }

    /// How many requests a seeded fault held past the client's timeout.
    pub fn injected_timeouts(&self) -> u64 {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .timeouts
    }

    /// The `baseUrl` for a provider.
    pub fn base_url(&self, provider: &str) -> String {
        match provider {
            "anthropic" => format!("http://{}", self.addr),
            _ => format!("http://{}/v1", self.addr),
        }
    }

    /// What went wrong: calls with no scripted reply, requests holding a forbidden string.
    pub fn failures(&self) -> Vec<String> {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .failures
            .clone()
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<String> {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .requests
            .clone()
    }

    /// Scripted replies nobody asked for.
    pub fn unused(&self) -> usize {
        self.shared
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replies
            .len()
    }
}

/// Takes the next reply for a request, recording it; None when the key is wrong.
fn next(shared: &Shared, wire: &str, headers: &HeaderMap, body: &Bytes) -> Option<Reply> {
    let key_ok = match wire {
        "anthropic" => {
            headers.get("x-api-key").and_then(|v| v.to_str().ok()) == Some(MODEL_KEY)
                && headers.get("anthropic-version").is_some()
        }
        _ => {
            headers.get("authorization").and_then(|v| v.to_str().ok())
                == Some(&format!("Bearer {MODEL_KEY}"))
        }
    };
    let text = String::from_utf8_lossy(body).into_owned();
    let request: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    // The document a reshape asks about: the first `"name":` of the prompt's metadata.
    let prompt = match wire {
        "anthropic" => request["messages"][0]["content"].as_str().unwrap_or(""),
        _ => request["messages"][1]["content"].as_str().unwrap_or(""),
    };
    // A values migration asks about a chart: its `"chart":` line.
    let subject = prompt
        .split("\"metadata\"")
        .nth(1)
        .and_then(|rest| rest.split("\"name\": \"").nth(1))
        .or_else(|| prompt.split("\"chart\": \"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("?")
        .to_string();
    let mut inner = shared.inner.lock().unwrap_or_else(|p| p.into_inner());
    for canary in shared.never.iter() {
        if text.contains(canary.as_str()) {
            inner.failures.push(format!(
                "a {wire} request carried the forbidden string {canary:?}"
            ));
        }
    }
    inner.requests.push(text.clone());
    // What the real APIs refuse with 400, the double refuses too.
    let missing: Vec<&str> = match wire {
        "anthropic" => ["model", "max_tokens", "messages"].to_vec(),
        _ => ["model", "messages"].to_vec(),
    }
    .into_iter()
    .filter(|k| request.get(*k).is_none_or(Value::is_null))
    .collect();
    if !missing.is_empty() {
        inner.failures.push(format!(
            "a {wire} request without {} (the real API answers 400)",
            missing.join(", ")
        ));
        return None;
    }
    if !key_ok {
        inner
            .failures
            .push(format!("a {wire} request came without the ground's key"));
        return None;
    }
    if let Some((seed, per_mille)) = inner.faults
        && inner
            .draws
            .roll(seed, &format!("model {wire} {subject}"), per_mille)
    {
        inner.timeouts += 1;
        shared.transcript.say(
            "model",
            format!("{wire} call about {subject}: held past the client's timeout (injected fault)"),
        );
        return Some(Reply::Stall);
    }
    let reply = inner.replies.pop_front();
    if reply.is_none() {
        inner.failures.push(format!(
            "a {wire} request for {subject} had no scripted reply"
        ));
    }
    shared.transcript.say(
        "model",
        format!(
            "{wire} call about {subject} ({} bytes){}",
            text.len(),
            if reply.is_none() {
                ": no scripted reply, answering 500"
            } else {
                ""
            }
        ),
    );
    reply
}

fn status_reply(status: u16, retry_after: Option<u64>) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(json!({"error": {"message": "scripted failure"}})),
    )
        .into_response();
    if let Some(seconds) = retry_after
        && let Ok(value) = seconds.to_string().parse()
    {
        response.headers_mut().insert("retry-after", value);
    }
    response
}

/// Never answers: the connection stays open until the client drops it (its timeout), and the
/// server then drops this future.
async fn stall() -> Response {
    std::future::pending::<()>().await;
    StatusCode::GATEWAY_TIMEOUT.into_response()
}

async fn anthropic(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    match next(&shared, "anthropic", &headers, &body) {
        None => status_reply(500, None),
        Some(Reply::Stall) => stall().await,
        Some(Reply::Status(status, retry_after)) => status_reply(status, retry_after),
        Some(Reply::Value(value)) => axum::Json(json!({
            "id": "msg_ground",
            "type": "message",
            "role": "assistant",
            "model": "ground",
            "content": [{"type": "tool_use", "id": "toolu_ground", "name": "propose", "input": value}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": body.len() / 4, "output_tokens": 100},
        }))
        .into_response(),
        Some(Reply::Text(text)) => axum::Json(json!({
            "id": "msg_ground",
            "type": "message",
            "role": "assistant",
            "model": "ground",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": body.len() / 4, "output_tokens": 100},
        }))
        .into_response(),
    }
}

async fn openai(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let content = match next(&shared, "openai", &headers, &body) {
        None => return status_reply(500, None),
        Some(Reply::Stall) => return stall().await,
        Some(Reply::Status(status, retry_after)) => return status_reply(status, retry_after),
        Some(Reply::Value(value)) => value.to_string(),
        Some(Reply::Text(text)) => text,
    };
    axum::Json(json!({
        "id": "chatcmpl-ground",
        "object": "chat.completion",
        "model": "ground",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": null}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": body.len() / 4, "completion_tokens": 100, "total_tokens": body.len() / 4 + 100},
    }))
    .into_response()
}
