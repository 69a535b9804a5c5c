//! The HTTP side every forge client shares: one reqwest client, the token, retries of
//! idempotent requests on 5xx and of any request on a rate limit, error bodies read for their
//! `message`, and JSON answers decoded.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use super::ForgeError;

/// Installs the process-wide TLS crypto provider (ring) once; later calls are no-ops.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// How a forge wants its token and which media type it answers.
#[derive(Clone, Copy)]
pub(crate) struct Dialect {
    /// The header the token goes in: `Authorization` (GitHub, Gitea, GitLab's OAuth tokens)
    /// or GitLab's `PRIVATE-TOKEN`.
    pub auth_header: &'static str,
    /// `<header>: <scheme> <token>`, or the bare token when empty.
    pub auth_scheme: &'static str,
    /// Extra request headers.
    pub headers: &'static [(&'static str, &'static str)],
}

#[derive(Clone)]
pub(crate) struct Http {
    client: reqwest::Client,
    base: String,
    token: String,
    dialect: Dialect,
    /// Retries for idempotent requests that meet 5xx or a rate limit.
    retries: u32,
}

/// An answer: the decoded body (`Null` when empty) and the total a list endpoint announces
/// (`X-Total-Count`), when it does.
pub(crate) struct Answer {
    pub body: Value,
    pub total: Option<usize>,
    /// The `Link` header (GitHub's pages: `rel="prev"`, `rel="last"`, ...).
    pub link: Option<String>,
    /// The bytes of the body read.
    pub bytes: usize,
    /// GitLab's `x-next-page`: the next page's number, `None` on the last page (empty header)
    /// or when the server sends none.
    pub next_page: Option<u64>,
}

impl Http {
    /// `base` is the API root (`https://api.github.com`, `https://gitea.example/api/v1`, or
    /// a double on loopback).
    pub fn new(base: &str, token: &str, dialect: Dialect) -> Result<Http, ForgeError> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .user_agent(concat!("gitops-loop/", env!("CARGO_PKG_VERSION")))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ForgeError::Transport {
                method: "-".into(),
                path: base.into(),
                message: e.to_string(),
            })?;
        Ok(Http {
            client,
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            dialect,
            retries: 3,
        })
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ForgeError> {
        Ok(self.exchange(method, path, body).await?.body)
    }

    pub async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ForgeError> {
        let idempotent = method != Method::POST;
        let mut attempt = 0;
        loop {
            let mut request = self
                .client
                .request(method.clone(), format!("{}{path}", self.base));
            for (name, value) in self.dialect.headers {
                request = request.header(*name, *value);
            }
            if !self.token.is_empty() {
                let value = if self.dialect.auth_scheme.is_empty() {
                    self.token.clone()
                } else {
                    format!("{} {}", self.dialect.auth_scheme, self.token)
                };
                request = request.header(self.dialect.auth_header, value);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let outcome = request.send().await;
            let error = |message: String| ForgeError::Transport {
                method: method.to_string(),
                path: path.to_string(),
                message,
            };
            let response = match outcome {
                Ok(response) => response,
                Err(_) if idempotent && attempt < self.retries => {
                    attempt += 1;
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                // reqwest's error names the URL, never the Authorization header.
                Err(e) => return Err(error(e.to_string())),
            };
            let status = response.status();
            let rate_limited = status == StatusCode::TOO_MANY_REQUESTS
                || (status == StatusCode::FORBIDDEN
                    && response
                        .headers()
                        .get("x-ratelimit-remaining")
                        .is_some_and(|v| v == "0"));
            // A rate-limited request was not processed, so even a POST may be retried.
            let retry = (rate_limited || (idempotent && status.is_server_error()))
                && attempt < self.retries;
            if retry {
                attempt += 1;
                let wait = rate_limit_wait(response.headers()).unwrap_or_else(|| backoff(attempt));
                tokio::time::sleep(wait).await;
                continue;
            }
            let total = response
                .headers()
                .get("x-total-count")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<usize>().ok());
            let link = response
                .headers()
                .get(reqwest::header::LINK)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let next_page = response
                .headers()
                .get("x-next-page")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let text = response.text().await.map_err(|e| error(e.to_string()))?;
            let bytes = text.len();
            if !status.is_success() {
                let message = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_else(|| text.chars().take(200).collect());
                return Err(ForgeError::Http {
                    method: method.to_string(),
                    path: path.to_string(),
                    status: status.as_u16(),
                    message,
                });
            }
            if text.trim().is_empty() {
                return Ok(Answer {
                    body: Value::Null,
                    total,
                    link,
                    bytes,
                    next_page,
                });
            }
            let body = serde_json::from_str(&text).map_err(|e| ForgeError::Decode {
                method: method.to_string(),
                path: path.to_string(),
                message: e.to_string(),
            })?;
            return Ok(Answer {
                body,
                total,
                link,
                bytes,
                next_page,
            });
        }
    }

    /// One request whose answer decodes into `T`.
    pub async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ForgeError> {
        let value = self.request(method.clone(), path, body).await?;
        decode(value, method.as_str(), path)
    }

    /// Every page of a list endpoint: `size` items a page asked with `size_param`, until a
    /// page comes back short or empty, or the announced total is reached. A server may cap the
    /// page size below the one asked (Gitea's `MAX_RESPONSE_ITEMS`), so a short page ends the
    /// walk only when no total says otherwise.
    pub async fn list(
        &self,
        path: &str,
        size_param: &str,
        size: usize,
    ) -> Result<Vec<Value>, ForgeError> {
        // A server that ignores `page` (or announces a huge total) must not keep the client
        // looping: never more than 200 pages (10,000 statuses or labels at Gitea's cap).
        const MAX_PAGES: usize = 200;
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let separator = if path.contains('?') { '&' } else { '?' };
            let answer = self
                .exchange(
                    Method::GET,
                    &format!("{path}{separator}{size_param}={size}&page={page}"),
                    None,
                )
                .await?;
            let items = match answer.body {
                Value::Array(items) => items,
                Value::Null => Vec::new(),
                other => {
                    return Err(ForgeError::Decode {
                        method: "GET".into(),
                        path: path.into(),
                        message: format!("expected a list, got {other}"),
                    });
                }
            };
            let count = items.len();
            all.extend(items);
            let done = match answer.total {
                Some(total) => count == 0 || all.len() >= total,
                None => count < size,
            };
            if done {
                return Ok(all);
            }
        }
        Err(ForgeError::Decode {
            method: "GET".into(),
            path: path.into(),
            message: format!("more than {MAX_PAGES} pages: refusing to read further"),
        })
    }
}

/// The page number a `Link` header gives for `rel` (`prev`, `last`, ...): only the number is
/// taken, never the URL (a client does not follow a server's URL with its token).
pub(crate) fn link_page(link: &str, rel: &str) -> Option<u64> {
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        let named = params
            .split(';')
            .any(|p| p.trim() == format!("rel=\"{rel}\""));
        if !named {
            return None;
        }
        let url = url.trim().strip_prefix('<')?.strip_suffix('>')?;
        let (_, query) = url.split_once('?')?;
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix("page="))
            .and_then(|n| n.parse().ok())
    })
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    value: Value,
    method: &str,
    path: &str,
) -> Result<T, ForgeError> {
    serde_json::from_value(value).map_err(|e| ForgeError::Decode {
        method: method.into(),
        path: path.into(),
        message: e.to_string(),
    })
}

/// How long a rate-limited answer asks the client to wait, at most ten seconds: `retry-after`
/// in seconds, else GitLab's `ratelimit-reset` (the Unix time the window reopens; see
/// GitLab's doc/administration/settings/user_and_ip_rate_limits.md, "Response headers").
/// A value that is no number is ignored (a hostile server cannot make the client wait long).
fn rate_limit_wait(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    const MAX_WAIT: u64 = 10;
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if let Some(seconds) = number("retry-after") {
        return Some(Duration::from_secs(seconds.min(MAX_WAIT)));
    }
    let reset = number("ratelimit-reset")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Some(Duration::from_secs(reset.saturating_sub(now).min(MAX_WAIT)))
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(200 * 2u64.pow(attempt.min(5)))
}

/// Cuts `text` to at most `max` characters (forges refuse longer fields).
pub(crate) fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        text.chars().take(max).collect()
    }
}

/// RFC 3986's unreserved characters stay; everything else is encoded.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A path segment or query value, percent-encoded (a label name may hold `/`, spaces or `?`).
pub(crate) fn segment(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_limit_waits_as_the_server_says_and_never_long() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let headers = |pairs: &[(&'static str, String)]| {
            let mut map = reqwest::header::HeaderMap::new();
            for (name, value) in pairs {
                map.insert(
                    *name,
                    reqwest::header::HeaderValue::from_str(value).expect("a header value"),
                );
            }
            map
        };
        let wait = |pairs: &[(&'static str, String)]| rate_limit_wait(&headers(pairs));
        assert_eq!(
            wait(&[("retry-after", "3".into())]),
            Some(Duration::from_secs(3))
        );
        // GitLab's `ratelimit-reset`: the Unix time the window reopens.
        let soon = wait(&[("ratelimit-reset", (now + 5).to_string())]).expect("a wait");
        assert!(soon <= Duration::from_secs(5) && soon >= Duration::from_secs(4));
        assert_eq!(
            wait(&[("ratelimit-reset", (now + 100_000).to_string())]),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            wait(&[("ratelimit-reset", "1".into())]),
            Some(Duration::ZERO)
        );
        assert_eq!(wait(&[("ratelimit-reset", "soon".into())]), None);
        assert_eq!(
            wait(&[("retry-after", "99999".into())]),
            Some(Duration::from_secs(10))
        );
    }
}
