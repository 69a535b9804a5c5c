//! The maintainers' release notes for an image a change moves: the image's
//! `org.opencontainers.image.source` (manifest or index annotations, else the config labels;
//! an index is followed to its linux/amd64 manifest) read through the registry's v2 API with
//! the anonymous bearer-token flow, then that repository's releases between the two tags from
//! GitHub's REST API. Every host a chart controls is checked against allowlists first; every
//! answer is size-capped and time-limited; every note is hostile text (the caller escapes it).
//! Nothing here can fail a triage: a note that cannot be read is a line saying so.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::config::NotesConfig;

/// The media types a manifest request accepts (OCI and Docker, single and multi-arch).
const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// The label or annotation naming the source repository.
pub const SOURCE_LABEL: &str = "org.opencontainers.image.source";

/// At most this many releases are read between two tags.
pub const MAX_RELEASES: usize = 5;

/// One release's notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub tag: String,
    pub name: String,
    pub url: String,
    pub body: String,
}

/// What could be learnt about one image move.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageNotes {
    pub source: Option<String>,
    pub releases: Vec<Release>,
    /// Why something could not be read (shown as a note, never an error).
    pub unread: Option<String>,
}

/// An image reference's registry host and repository name (`nginx` is Docker Hub's
/// `library/nginx`).
pub fn split_reference(image: &str) -> (String, String) {
    let (host, name) = split_host(image);
    // Docker Hub's official images live under `library/`.
    if host == "docker.io" && !name.contains('/') {
        return (host, format!("library/{name}"));
    }
    (host, name)
}

fn split_host(image: &str) -> (String, String) {
    let (first, rest) = image.split_once('/').unwrap_or(("", image));
    if !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost") {
        (first.to_string(), rest.to_string())
    } else if first.is_empty() {
        ("docker.io".into(), format!("library/{rest}"))
    } else {
        ("docker.io".into(), image.to_string())
    }
}

/// `https://github.com/owner/repo(.git)` -> (host, owner/repo).
pub fn source_repository(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("https://")?;
    let (host, path) = rest.split_once('/')?;
    let mut parts = path
        .trim_end_matches('/')
        .trim_end_matches(".git")
        .split('/');
    let (owner, repo) = (parts.next()?, parts.next()?);
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 100
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && s != "."
            && s != ".."
    };
    (ok(owner) && ok(repo)).then(|| (host.to_ascii_lowercase(), format!("{owner}/{repo}")))
}

/// A version's numbers for ordering tags (`v1.2.3-rc.1` -> [1, 2, 3] and a pre-release flag).
fn version_key(tag: &str) -> Option<(Vec<u64>, bool)> {
    let t = tag.trim_start_matches('v');
    let (core, pre) = match t.split_once(['-', '+']) {
        Some((core, _)) => (core, true),
        None => (t, false),
    };
    let numbers: Option<Vec<u64>> = core.split('.').map(|p| p.parse().ok()).collect();
    numbers.filter(|n| !n.is_empty()).map(|n| (n, pre))
}

/// The releases after `from` up to and including `to`, newest first (every one: the caller
/// shows the first `MAX_RELEASES` and reads them all for manual steps).
pub fn between(releases: &[Release], from: &str, to: &str) -> Vec<Release> {
    let (Some(lo), Some(hi)) = (version_key(from), version_key(to)) else {
        return releases
            .iter()
            .filter(|r| r.tag == to)
            .take(1)
            .cloned()
            .collect();
    };
    let mut picked: Vec<(Vec<u64>, Release)> = releases
        .iter()
        .filter_map(|r| {
            let (v, pre) = version_key(&r.tag)?;
            (v > lo.0 && v <= hi.0 && (!pre || r.tag == to)).then(|| (v, r.clone()))
        })
        .collect();
    picked.sort_by(|a, b| b.0.cmp(&a.0));
    picked.into_iter().map(|(_, r)| r).collect()
}

/// The documented phrase rule for release notes that describe a manual step: whole phrases,
/// case-insensitive. Returns the phrase found.
pub fn manual_step(body: &str) -> Option<&'static str> {
    const PHRASES: [&str; 8] = [
        "breaking changes",
        "breaking change",
        "manual step",
        "action required",
        "migration guide",
        "before upgrading",
        "must be migrated",
        "upgrade notes",
    ];
    let lower = body.to_lowercase();
    PHRASES.iter().copied().find(|p| {
        lower.match_indices(p).any(|(i, _)| {
            // "no breaking changes", "not a breaking change", "non-breaking change",
            // "without a manual step", "Breaking changes: none": a negation is not a step.
            let words: Vec<&str> = lower[..i]
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .rev()
                .take(3)
                .collect();
            let after: String = lower[i + p.len()..]
                .trim_start_matches([':', ' ', '\n', '#', '-', '*'])
                .chars()
                .take(4)
                .collect();
            let negated = words
                .iter()
                .any(|w| ["no", "not", "non", "without", "never", "zero"].contains(w))
                || after == "none";
            !negated
                && !lower[..i]
                    .chars()
                    .next_back()
                    .is_some_and(char::is_alphanumeric)
                && !lower[i + p.len()..]
                    .chars()
                    .next()
                    .is_some_and(char::is_alphanumeric)
        })
    })
}

/// Why a registry's or GitHub's answer could not be read (said as a note, never a failure).
#[derive(Debug, thiserror::Error)]
pub enum NotesError {
    #[error("{0}")]
    Client(reqwest::Error),
    #[error("unreachable ({0})")]
    Unreachable(Transport),
    #[error("token endpoint unreachable ({0})")]
    TokenUnreachable(Transport),
    #[error("answered {0}")]
    Status(u16),
    #[error("the answer is too large")]
    TooLarge,
    /// The body broke off while it was read.
    #[error("{0}")]
    Body(reqwest::Error),
    #[error("answered 401 without a token realm")]
    NoRealm,
    /// The realm, clipped.
    #[error("its token realm {0} is not on the allowlist")]
    RealmNotAllowed(String),
    /// The realm is no URL: the parser's message.
    #[error("{0}")]
    RealmUrl(String),
    #[error("the token endpoint answered no token")]
    NoToken,
    #[error("the registry {0} is not on the allowlist")]
    RegistryNotAllowed(String),
    #[error("the image reference is not one a registry serves")]
    BadReference,
    #[error("{digest} is not a sha256 digest this reader checks")]
    NotSha256 { digest: String },
    #[error("the content served for {digest} does not match it")]
    DigestMismatch { digest: String },
    #[error("the manifest is not JSON")]
    ManifestNotJson,
    #[error("the index lists no manifest")]
    EmptyIndex,
    #[error("the manifest names no config")]
    NoConfig,
    #[error("the image config is not JSON")]
    ConfigNotJson,
    #[error("rate limited")]
    RateLimited,
    #[error("the releases are not a JSON list")]
    ReleasesNotAList,
}

/// How a request failed to get an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Transport {
    #[error("timed out")]
    TimedOut,
    #[error("connection failed")]
    ConnectionFailed,
    #[error("request failed")]
    RequestFailed,
}

impl Transport {
    fn of(e: &reqwest::Error) -> Transport {
        if e.is_timeout() {
            Transport::TimedOut
        } else if e.is_connect() {
            Transport::ConnectionFailed
        } else {
            Transport::RequestFailed
        }
    }
}

/// Content fetched by digest must hash to it: what is cached per manifest digest is then bound
/// to that digest all the way down (a registry or CDN cannot swap the config behind it).
fn verify(bytes: &[u8], digest: &str) -> Result<(), NotesError> {
    let Some(expected) = digest.strip_prefix("sha256:") else {
        return Err(NotesError::NotSha256 {
            digest: digest.to_string(),
        });
    };
    let actual = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes));
    if actual.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(NotesError::DigestMismatch {
            digest: digest.to_string(),
        })
    }
}

/// A repository name, tag or digest a registry serves: no path tricks, no URL syntax.
fn valid_reference(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@+".contains(c))
        && !s.contains("..")
}

/// The reader, with its caches: image sources per manifest digest, releases per
/// repository. One per Bosun process.
pub struct Notes {
    config: NotesConfig,
    client: reqwest::Client,
    sources: Mutex<HashMap<String, (std::time::Instant, Option<String>)>>,
    releases: Mutex<HashMap<String, (std::time::Instant, Vec<Release>)>>,
}

/// How long an answer is reused: a release published after it is seen at the next look.
const CACHE_TTL: Duration = Duration::from_secs(600);
/// At most this many answers are kept per cache (then it starts over).
const CACHE_ENTRIES: usize = 512;

fn cached<T: Clone>(
    cache: &Mutex<HashMap<String, (std::time::Instant, T)>>,
    key: &str,
) -> Option<T> {
    let cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(key)
        .filter(|(at, _)| at.elapsed() < CACHE_TTL)
        .map(|(_, v)| v.clone())
}

/// Only answers are kept: an error (a timeout, a 5xx, a rate limit) is asked again next time.
fn remember<T>(cache: &Mutex<HashMap<String, (std::time::Instant, T)>>, key: &str, value: T) {
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() >= CACHE_ENTRIES {
        cache.clear();
    }
    cache.insert(key.to_string(), (std::time::Instant::now(), value));
}

#[derive(Deserialize)]
struct TokenAnswer {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl Notes {
    pub fn new(config: NotesConfig) -> Result<Notes, NotesError> {
        crate::forge::github::install_crypto_provider();
        let allowed = config.allowed_hosts();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.timeout_seconds.max(1)))
            // Only to https, only to an allowlisted host (a registry, its token or redirect
            // hosts, the releases API), at most 3 redirects (`previous()` holds the first URL).
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                let host = attempt.url().host_str().unwrap_or("").to_ascii_lowercase();
                if attempt.previous().len() > 3
                    || attempt.url().scheme() != "https"
                    || !allowed.contains(&host)
                {
                    attempt.stop()
                } else {
                    attempt.follow()
                }
            }))
            .user_agent("bosun-release-notes")
            .build()
            .map_err(NotesError::Client)?;
        Ok(Notes {
            config,
            client,
            sources: Mutex::new(HashMap::new()),
            releases: Mutex::new(HashMap::new()),
        })
    }

    /// A body, capped: past `maxBytes` the answer is refused unread.
    async fn body(&self, response: reqwest::Response) -> Result<Vec<u8>, NotesError> {
        let status = response.status();
        if !status.is_success() {
            return Err(NotesError::Status(status.as_u16()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > self.config.max_bytes as u64)
        {
            return Err(NotesError::TooLarge);
        }
        let mut out = Vec::new();
        let mut response = response;
        while let Some(chunk) = response.chunk().await.map_err(NotesError::Body)? {
            out.extend_from_slice(&chunk);
            if out.len() > self.config.max_bytes {
                return Err(NotesError::TooLarge);
            }
        }
        Ok(out)
    }

    /// GET with the registry's anonymous token flow: a 401 naming a Bearer realm is answered by
    /// fetching a token there (same allowlisted endpoint) and asking again once.
    async fn registry_get(&self, url: &str, accept: &str) -> Result<Vec<u8>, NotesError> {
        let first = self
            .client
            .get(url)
            .header("Accept", accept)
            .send()
            .await
            .map_err(|e| NotesError::Unreachable(Transport::of(&e)))?;
        if first.status().as_u16() != 401 {
            return self.body(first).await;
        }
        let challenge = first
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let param = |name: &str| -> Option<String> {
            let at = challenge.find(&format!("{name}=\""))? + name.len() + 2;
            let end = challenge[at..].find('"')? + at;
            Some(challenge[at..end].to_string())
        };
        let realm = param("realm").ok_or(NotesError::NoRealm)?;
        if !self.allowed_realm(&realm) {
            return Err(NotesError::RealmNotAllowed(
                realm.chars().take(120).collect(),
            ));
        }
        let mut token_url =
            reqwest::Url::parse(&realm).map_err(|e| NotesError::RealmUrl(e.to_string()))?;
        {
            let mut query = token_url.query_pairs_mut();
            if let Some(service) = param("service") {
                query.append_pair("service", &service);
            }
            if let Some(scope) = param("scope") {
                query.append_pair("scope", &scope);
            }
        }
        let answer = self
            .client
            .get(token_url)
            .send()
            .await
            .map_err(|e| NotesError::TokenUnreachable(Transport::of(&e)))?;
        let token: TokenAnswer =
            serde_json::from_slice(&self.body(answer).await?).map_err(|_| NotesError::NoToken)?;
        let token = token
            .token
            .or(token.access_token)
            .ok_or(NotesError::NoToken)?;
        let second = self
            .client
            .get(url)
            .header("Accept", accept)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| NotesError::Unreachable(Transport::of(&e)))?;
        self.body(second).await
    }

    /// A token realm must be an https URL (or the endpoint's own scheme and host for a
    /// configured endpoint) of an allowlisted registry or its known auth host.
    fn allowed_realm(&self, realm: &str) -> bool {
        let Ok(url) = reqwest::Url::parse(realm) else {
            return false;
        };
        let host = url.host_str().unwrap_or("").to_ascii_lowercase();
        self.config.registries.iter().any(|r| {
            reqwest::Url::parse(&r.url)
                .ok()
                .is_some_and(|u| u.host_str() == Some(&host) && u.scheme() == url.scheme())
                || r.token_hosts.contains(&host) && url.scheme() == "https"
        })
    }

    /// The image's source repository URL (`org.opencontainers.image.source`), or None when it
    /// names none. An error says why it could not be read.
    ///
    /// The tag is resolved on every call (one manifest request: a tag can move); what the
    /// image says is cached per manifest digest, computed here from the bytes received (a
    /// registry's `Docker-Content-Digest` header is not trusted), so a re-pushed tag is read
    /// again and an unchanged one costs one request.
    pub async fn source(&self, image: &str, tag: &str) -> Result<Option<String>, NotesError> {
        let (host, name) = split_reference(image);
        let endpoint = self
            .config
            .registries
            .iter()
            .find(|r| r.host.eq_ignore_ascii_case(&host))
            .ok_or_else(|| NotesError::RegistryNotAllowed(host.clone()))?;
        if !valid_reference(&name) || !valid_reference(tag) {
            return Err(NotesError::BadReference);
        }
        let base = endpoint.url.trim_end_matches('/').to_string();
        let bytes = self
            .registry_get(&format!("{base}/v2/{name}/manifests/{tag}"), ACCEPT)
            .await?;
        let digest = format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))
        );
        let key = format!("{}/{name}@{digest}", host.to_ascii_lowercase());
        if let Some(hit) = cached(&self.sources, &key) {
            return Ok(hit);
        }
        let result = self
            .read_source(&base, &name, &bytes)
            .await
            .map(|s| s.map(|s| s.chars().take(300).collect::<String>()));
        if let Ok(source) = &result {
            remember(&self.sources, &key, source.clone());
        }
        result
    }

    async fn read_source(
        &self,
        base: &str,
        name: &str,
        manifest: &[u8],
    ) -> Result<Option<String>, NotesError> {
        let valid = valid_reference;
        let manifest_url = |reference: &str| format!("{base}/v2/{name}/manifests/{reference}");
        let manifest: Value =
            serde_json::from_slice(manifest).map_err(|_| NotesError::ManifestNotJson)?;
        let annotation = |m: &Value| {
            m.pointer("/annotations")
                .and_then(|a| a.get(SOURCE_LABEL))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        if let Some(source) = annotation(&manifest) {
            return Ok(Some(source));
        }
        // An index: its linux/amd64 manifest (else the first).
        let manifest = if let Some(list) = manifest.get("manifests").and_then(Value::as_array) {
            let chosen = list
                .iter()
                .find(|m| {
                    m.pointer("/platform/os").and_then(Value::as_str) == Some("linux")
                        && m.pointer("/platform/architecture").and_then(Value::as_str)
                            == Some("amd64")
                })
                .or_else(|| list.first())
                .and_then(|m| m.get("digest"))
                .and_then(Value::as_str)
                .filter(|d| valid(d))
                .ok_or(NotesError::EmptyIndex)?;
            let bytes = self.registry_get(&manifest_url(chosen), ACCEPT).await?;
            verify(&bytes, chosen)?;
            let platform: Value =
                serde_json::from_slice(&bytes).map_err(|_| NotesError::ManifestNotJson)?;
            if let Some(source) = annotation(&platform) {
                return Ok(Some(source));
            }
            platform
        } else {
            manifest
        };
        let config_digest = manifest
            .pointer("/config/digest")
            .and_then(Value::as_str)
            .filter(|d| valid(d))
            .ok_or(NotesError::NoConfig)?;
        let bytes = self
            .registry_get(
                &format!("{base}/v2/{name}/blobs/{config_digest}"),
                "application/json",
            )
            .await?;
        verify(&bytes, config_digest)?;
        let config: Value =
            serde_json::from_slice(&bytes).map_err(|_| NotesError::ConfigNotJson)?;
        Ok(config
            .pointer("/config/Labels")
            .and_then(|l| l.get(SOURCE_LABEL))
            .and_then(Value::as_str)
            .map(str::to_string))
    }

    /// A repository's releases (the first page of 100), from GitHub's REST API.
    pub async fn releases(&self, repository: &str) -> Result<Vec<Release>, NotesError> {
        if let Some(hit) = cached(&self.releases, repository) {
            return Ok(hit);
        }
        let result = self.read_releases(repository).await;
        if let Ok(list) = &result {
            remember(&self.releases, repository, list.clone());
        }
        result
    }

    async fn read_releases(&self, repository: &str) -> Result<Vec<Release>, NotesError> {
        let url = format!(
            "{}/repos/{repository}/releases?per_page=30",
            self.config.github_api_url.trim_end_matches('/')
        );
        let mut request = self
            .client
            .get(url)
            .header("Accept", "application/vnd.github+json");
        if let Some(token) = self
            .config
            .token_env
            .as_deref()
            .and_then(|v| std::env::var(v).ok())
            .filter(|t| !t.is_empty())
        {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| NotesError::Unreachable(Transport::of(&e)))?;
        if response.status().as_u16() == 403 || response.status().as_u16() == 429 {
            // Rate limited: say so; the cache keeps the answer for this process.
            return Err(NotesError::RateLimited);
        }
        let list: Vec<Value> = serde_json::from_slice(&self.body(response).await?)
            .map_err(|_| NotesError::ReleasesNotAList)?;
        Ok(list
            .iter()
            .filter(|r| r.get("draft").and_then(Value::as_bool) != Some(true))
            .filter_map(|r| {
                Some(Release {
                    tag: r.get("tag_name")?.as_str()?.chars().take(100).collect(),
                    name: r
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .chars()
                        .take(200)
                        .collect(),
                    url: r
                        .get("html_url")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .chars()
                        .take(300)
                        .collect(),
                    body: r
                        .get("body")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .chars()
                        .take(20_000)
                        .collect(),
                })
            })
            .collect())
    }

    /// The notes for one image move, never an error: what could not be read is said.
    pub async fn for_image(&self, image: &str, from: &str, to: &str) -> ImageNotes {
        let source = match self.source(image, to).await {
            Ok(Some(source)) => source,
            Ok(None) => {
                return ImageNotes {
                    unread: Some(format!("{image}:{to} names no {SOURCE_LABEL}")),
                    ..Default::default()
                };
            }
            Err(why) => {
                return ImageNotes {
                    unread: Some(format!("{image}:{to}: {why}")),
                    ..Default::default()
                };
            }
        };
        let Some((host, repository)) = source_repository(&source) else {
            return ImageNotes {
                unread: Some(format!(
                    "{image}: its source is not a repository URL Bosun reads"
                )),
                ..Default::default()
            };
        };
        if !self
            .config
            .source_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&host))
        {
            return ImageNotes {
                source: Some(source),
                unread: Some(format!("{host} is not on the release-notes allowlist")),
                ..Default::default()
            };
        }
        match self.releases(&repository).await {
            Ok(all) => {
                let releases = between(&all, from, to);
                let unread = releases.is_empty().then(|| {
                    format!(
                        "{repository} has no release between {from} and {to} among its {} newest",
                        all.len()
                    )
                });
                ImageNotes {
                    source: Some(source),
                    releases,
                    unread,
                }
            }
            Err(why) => ImageNotes {
                source: Some(source),
                unread: Some(format!("the releases of {repository}: {why}")),
                ..Default::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_like_docker() {
        assert_eq!(
            split_reference("quay.io/jetstack/cert-manager-controller"),
            ("quay.io".into(), "jetstack/cert-manager-controller".into())
        );
        assert_eq!(
            split_reference("nginx"),
            ("docker.io".into(), "library/nginx".into())
        );
        assert_eq!(
            split_reference("bitnami/redis"),
            ("docker.io".into(), "bitnami/redis".into())
        );
        assert_eq!(
            source_repository("https://github.com/jetstack/cert-manager.git"),
            Some(("github.com".into(), "jetstack/cert-manager".into()))
        );
        assert_eq!(source_repository("http://github.com/a/b"), None);
        assert_eq!(source_repository("https://github.com/../b"), None);
    }

    /// What a note says when a read fails is its error's text, word for word.
    #[test]
    fn a_failed_read_says_why_in_one_line() {
        let said = [
            (
                NotesError::Unreachable(Transport::TimedOut),
                "unreachable (timed out)",
            ),
            (
                NotesError::TokenUnreachable(Transport::ConnectionFailed),
                "token endpoint unreachable (connection failed)",
            ),
            (NotesError::Status(503), "answered 503"),
            (
                NotesError::RegistryNotAllowed("ghcr.io".into()),
                "the registry ghcr.io is not on the allowlist",
            ),
            (
                verify(b"x", "md5:00").unwrap_err(),
                "md5:00 is not a sha256 digest this reader checks",
            ),
            (
                verify(b"x", "sha256:00").unwrap_err(),
                "the content served for sha256:00 does not match it",
            ),
        ];
        for (error, text) in said {
            assert_eq!(error.to_string(), text);
        }
    }

    #[test]
    fn releases_between_two_tags_newest_first() {
        let r = |tag: &str| Release {
            tag: tag.into(),
            name: tag.into(),
            url: String::new(),
            body: String::new(),
        };
        let all = [
            r("v1.19.1"),
            r("v1.19.2"),
            r("v1.19.3-rc.1"),
            r("v1.19.3"),
            r("v1.20.0"),
        ];
        let tags: Vec<String> = between(&all, "v1.19.1", "v1.19.3")
            .into_iter()
            .map(|r| r.tag)
            .collect();
        assert_eq!(tags, ["v1.19.3", "v1.19.2"]);
    }

    #[test]
    fn the_manual_step_rule_fires_on_phrases_not_on_every_note() {
        assert_eq!(
            manual_step("## Upgrading\nAction required: run the CRD migration first."),
            Some("action required")
        );
        assert_eq!(
            manual_step("See the Migration Guide."),
            Some("migration guide")
        );
        assert_eq!(manual_step("Fixed a breaking-change detector bug"), None);
        assert_eq!(
            manual_step("### Bug fixes\n- fix leader election\n- bump Go to 1.24"),
            None
        );
        assert_eq!(manual_step("no breaking changes in this release"), None);
        assert_eq!(
            manual_step("## BREAKING CHANGES\n- x"),
            Some("breaking changes")
        );
        for quiet in [
            "No known breaking changes.",
            "This is a non-breaking change.",
            "This is not a breaking change.",
            "Breaking changes: None",
        ] {
            assert_eq!(manual_step(quiet), None, "{quiet}");
        }
        assert_eq!(
            manual_step("Played the piano. Breaking change: x"),
            Some("breaking change")
        );
    }
}
