//! `bosun.yaml`: everything Bosun is allowed to do, in one file (documented in
//! docs/bosun.md). Secrets are never in the file: it names the environment variables that hold
//! them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::forge::RepoSlug;
use crate::gate::publish::CheckMode;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    pub forge: ForgeConfig,
    pub repositories: Vec<RepositoryConfig>,
    /// Where the cluster inventory comes from.
    pub inventory: InventoryConfig,
    #[serde(default)]
    pub charts: ChartsConfig,
    /// Limits of every helm and kustomize call of a render.
    #[serde(default)]
    pub render: RenderLimitsConfig,
    /// Globs (repository-relative) Bosun never writes, whatever else allows it.
    #[serde(default = "default_deny")]
    pub deny: Vec<String>,
    /// Globs Bosun may write; a file matching none is refused.
    #[serde(default = "default_allow")]
    pub allow: Vec<String>,
    /// Which files a repair may touch beyond the lists above.
    #[serde(default)]
    pub promotion_scope: PromotionScope,
    #[serde(default)]
    pub labels: Labels,
    /// Repairs pushed to one pull request before Bosun hands off instead.
    #[serde(default = "default_attempt_cap")]
    pub attempt_cap: u32,
    /// The language model behind the harness (`none`: the paths that would ask one hand off).
    #[serde(default)]
    pub model: ModelConfig,
    /// Release notes for the images a green change moves (explained gates).
    #[serde(default)]
    pub release_notes: NotesConfig,
    #[serde(default)]
    pub webhook: WebhookConfig,
    /// The identity of Bosun's commits.
    #[serde(default)]
    pub commit: CommitIdentity,
    /// Checkouts and the render cache (default: a folder in the system's temp dir).
    #[serde(default)]
    pub workdir: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForgeConfig {
    /// Which API the forge speaks: `github` (default), `gitea` (Gitea and Forgejo) or
    /// `gitlab` (GitLab's v4: a pull request is a merge request, the slug its project path).
    #[serde(default)]
    pub kind: crate::forge::ForgeKind,
    /// The forge's REST API root (GitHub: `https://api.github.com`; Gitea:
    /// `https://gitea.example/api/v1`).
    pub api_url: String,
    /// The environment variable holding Bosun's token.
    #[serde(default = "default_token_env")]
    pub token_env: String,
    /// How to clone and push a repository: `{slug}` (on GitLab the project's full path,
    /// subgroups included) and `{token}` are replaced (default
    /// `https://x-access-token:{token}@github.com/{slug}.git`).
    #[serde(default = "default_git_url")]
    pub git_url: String,
    /// The login the gate publishes its report as. Default: Bosun's own login (Bosun runs
    /// the gate). A report by anyone else is ignored.
    #[serde(default)]
    pub gate_author: Option<String>,
    /// How the gate's verdict is published: a check run (GitHub App) or a commit status.
    /// Default: a check run on GitHub, a commit status on Gitea (which has no check runs).
    #[serde(default)]
    pub check_mode: Option<CheckMode>,
    /// The login Bosun's token acts as. Default: asked from the forge (`GET /user`), which a
    /// GitHub App installation token cannot answer: set it to `<app-slug>[bot]` then.
    #[serde(default)]
    pub login: Option<String>,
}

impl ForgeConfig {
    /// How the gate's verdict is published on this forge.
    pub fn check_mode(&self) -> CheckMode {
        self.check_mode.unwrap_or(if self.kind.has_check_runs() {
            CheckMode::CheckRun
        } else {
            CheckMode::Status
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RepositoryConfig {
    /// `owner/name` on the forge; on GitLab the project's full path (`group/project`,
    /// `group/sub/.../project`). Checked for the forge's kind when the file is read.
    #[serde(deserialize_with = "slug")]
    pub slug: RepoSlug,
    /// The URL Applications write for this repository (`repoURL`).
    pub url: String,
    /// The branch pull requests merge into (default `main`).
    #[serde(default = "default_branch")]
    pub default_branch: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    deny_unknown_fields
)]
pub enum InventoryConfig {
    /// Argo CD's cluster Secrets, read live through the Kubernetes API (ADR 0008).
    Kubernetes {
        #[serde(default = "default_argocd_namespace")]
        namespace: String,
    },
    /// A file in the gate's inventory format (for a run from a workstation).
    File(PathBuf),
    /// Argo CD's API (`GET /api/v1/clusters`): the versions Argo CD discovered, no annotations
    /// needed once a cluster has an Application (ADR 0008).
    Argocd {
        /// Argo CD's URL, e.g. `https://argocd-server.argocd.svc`.
        server: String,
        /// The environment variable holding an Argo CD token that may `get` clusters.
        #[serde(default = "default_argocd_token_env")]
        token_env: String,
    },
}

fn default_argocd_token_env() -> String {
    "ARGOCD_AUTH_TOKEN".into()
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartsConfig {
    /// The chart mirror the gate reads and `helm pull` fills.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// Pull-through mirrors: charts of `from` are pulled from `to`.
    #[serde(default)]
    pub mirrors: Vec<ChartMirror>,
    /// The chart repositories Bosun may pull a missing chart from. Default: the repositories
    /// the default branch already names (every `repoURL` in its YAML); a pull request that
    /// names another gets a render error, never a fetch.
    #[serde(default)]
    pub pull_from: Option<Vec<String>>,
}

/// `render:` in bosun.yaml.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RenderLimitsConfig {
    /// Seconds one helm or kustomize call may run before it is killed (a render error).
    #[serde(default = "default_render_timeout")]
    pub timeout_seconds: u64,
    /// Address space one call may take, in MiB.
    #[serde(default = "default_render_memory")]
    pub memory_mib: u64,
    /// Inflate kustomizations' `helmCharts` from the chart mirror (Argo CD's
    /// `kustomize.buildOptions` include `--enable-helm`).
    #[serde(default)]
    pub kustomize_enable_helm: bool,
    /// Where no network namespace can be made (a pod without user namespaces), render with a
    /// scrubbed environment only; without it such a render is refused (the gate cannot
    /// decide, never green).
    #[serde(default)]
    pub allow_unconfined: bool,
    /// The remote render cache the gate's default-branch runs fill (`s3://bucket/prefix`,
    /// `gs://bucket/prefix` or `az://container/prefix`; endpoint and credentials from the AWS,
    /// GOOGLE or AZURE variables of Bosun's environment, as for the gate). Bosun
    /// only reads it: it renders pull requests, and never holds the signing key
    /// (docs/safety-model.md).
    #[serde(default)]
    pub cache_url: Option<String>,
    /// The public key the remote cache's entries must be signed with (base64); required with
    /// `cacheUrl`.
    #[serde(default)]
    pub cache_public_key: Option<String>,
}

impl Default for RenderLimitsConfig {
    fn default() -> Self {
        RenderLimitsConfig {
            timeout_seconds: default_render_timeout(),
            memory_mib: default_render_memory(),
            kustomize_enable_helm: false,
            allow_unconfined: false,
            cache_url: None,
            cache_public_key: None,
        }
    }
}

impl RenderLimitsConfig {
    pub fn limits(&self) -> crate::render::confine::Limits {
        crate::render::confine::Limits {
            timeout: std::time::Duration::from_secs(self.timeout_seconds.max(1)),
            memory_bytes: self.memory_mib.max(64) << 20,
            allow_unconfined: self.allow_unconfined,
            ..Default::default()
        }
    }
}

fn default_render_timeout() -> u64 {
    120
}
fn default_render_memory() -> u64 {
    4096
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChartMirror {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PromotionScope {
    /// Only files some Application deploys at the head: under a source's path, or a values
    /// file it layers.
    #[default]
    Deployed,
    /// Any file of the repository the lists allow.
    Repository,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Labels {
    #[serde(default = "needs_human")]
    pub needs_human: String,
    #[serde(default = "worth_a_look")]
    pub worth_a_look: String,
    /// Attempt N is recorded as the label `<prefix>N`.
    #[serde(default = "attempt_prefix")]
    pub attempt_prefix: String,
}

impl Default for Labels {
    fn default() -> Self {
        Labels {
            needs_human: needs_human(),
            worth_a_look: worth_a_look(),
            attempt_prefix: attempt_prefix(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelConfig {
    /// `none` (default): no model; every path that would ask one hands off to a person.
    /// `anthropic`: the Messages API. `openai`: Chat Completions (any compatible server).
    #[serde(default)]
    pub provider: ModelProvider,
    /// The API root (default `https://api.anthropic.com`, `https://api.openai.com/v1`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The model name the provider knows.
    #[serde(default)]
    pub model: Option<String>,
    /// The environment variable holding the key (default `ANTHROPIC_API_KEY`,
    /// `OPENAI_API_KEY`; an OpenAI-compatible local server may need none).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// One call's deadline, retries excluded.
    #[serde(default = "default_model_timeout")]
    pub timeout_seconds: u64,
    #[serde(default = "default_max_output_tokens")]
    pub max_output_tokens: u32,
    /// Calls per pull request, across all its heads (counted from Bosun's own comment on it,
    /// so neither a restart nor a person's push resets the count).
    #[serde(default = "default_max_calls")]
    pub max_calls_per_pull_request: u32,
    /// Calls per head of a pull request, within the pull request's cap.
    #[serde(default = "default_max_calls_per_head")]
    pub max_calls_per_head: u32,
    /// More values to hold back from every prompt, beyond the built-in rules.
    #[serde(default)]
    pub redact: RedactConfig,
}

/// `model.redact`: the operator's additions to what never reaches a model.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedactConfig {
    /// Key names whose values are held back (compared ignoring case, `_` and `-`).
    #[serde(default)]
    pub keys: Vec<String>,
    /// Regular expressions: a string value matching one anywhere is held back.
    #[serde(default)]
    pub values: Vec<String>,
}

impl ModelConfig {
    /// The redaction rules every prompt goes through: the built-in ones and `model.redact`
    /// (checked when bosun.yaml is read).
    pub fn redaction(&self) -> crate::model::Rules {
        crate::model::Rules::new(&self.redact.keys, &self.redact.values)
            .expect("model.redact is checked when bosun.yaml is read")
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            provider: ModelProvider::None,
            base_url: None,
            model: None,
            api_key_env: None,
            timeout_seconds: default_model_timeout(),
            max_output_tokens: default_max_output_tokens(),
            max_calls_per_pull_request: default_max_calls(),
            max_calls_per_head: default_max_calls_per_head(),
            redact: RedactConfig::default(),
        }
    }
}

/// Where Bosun may read release notes: registries (by the host image references name) and
/// source hosts, both allowlists; every answer time-limited and size-capped.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotesConfig {
    /// Off: green gates are explained from the report alone.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The registries whose images' labels Bosun reads, by the host references write, with the
    /// URL it asks (a pull-through mirror may stand in) and the hosts their token endpoints may
    /// be on.
    #[serde(default = "default_registries")]
    pub registries: Vec<RegistryEndpoint>,
    /// The hosts of source repositories whose releases Bosun reads (GitHub's REST API).
    #[serde(default = "default_source_hosts")]
    pub source_hosts: Vec<String>,
    #[serde(default = "default_github_api")]
    pub github_api_url: String,
    /// The environment variable holding a GitHub token (optional: anonymous reads are rate
    /// limited to 60 an hour).
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default = "default_notes_timeout")]
    pub timeout_seconds: u64,
    #[serde(default = "default_notes_bytes")]
    pub max_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryEndpoint {
    pub host: String,
    pub url: String,
    #[serde(default)]
    pub token_hosts: Vec<String>,
    /// Hosts it may redirect a download to (its CDN).
    #[serde(default)]
    pub redirect_hosts: Vec<String>,
}

impl NotesConfig {
    /// Every host a release-notes request may reach (lowercase): the registries' URLs, their
    /// token and redirect hosts, and the releases API.
    pub fn allowed_hosts(&self) -> std::collections::BTreeSet<String> {
        let host = |url: &str| {
            url.split_once("://").map(|(_, rest)| {
                rest.split(['/', ':'])
                    .next()
                    .unwrap_or("")
                    .to_ascii_lowercase()
            })
        };
        let mut hosts: std::collections::BTreeSet<String> = self
            .registries
            .iter()
            .flat_map(|r| {
                host(&r.url)
                    .into_iter()
                    .chain(r.token_hosts.iter().map(|h| h.to_ascii_lowercase()))
                    .chain(r.redirect_hosts.iter().map(|h| h.to_ascii_lowercase()))
            })
            .collect();
        hosts.extend(host(&self.github_api_url));
        hosts
    }
}

impl Default for NotesConfig {
    fn default() -> Self {
        NotesConfig {
            enabled: true,
            registries: default_registries(),
            source_hosts: default_source_hosts(),
            github_api_url: default_github_api(),
            token_env: None,
            timeout_seconds: default_notes_timeout(),
            max_bytes: default_notes_bytes(),
        }
    }
}

fn yes() -> bool {
    true
}

fn default_registries() -> Vec<RegistryEndpoint> {
    let r = |host: &str, url: &str, tokens: &[&str], redirects: &[&str]| RegistryEndpoint {
        host: host.into(),
        url: url.into(),
        token_hosts: tokens.iter().map(|t| t.to_string()).collect(),
        redirect_hosts: redirects.iter().map(|t| t.to_string()).collect(),
    };
    vec![
        r(
            "docker.io",
            "https://registry-1.docker.io",
            &["auth.docker.io"],
            &["production.cloudflare.docker.com"],
        ),
        r(
            "ghcr.io",
            "https://ghcr.io",
            &[],
            &["pkg-containers.githubusercontent.com"],
        ),
        r(
            "quay.io",
            "https://quay.io",
            &[],
            &["cdn01.quay.io", "cdn02.quay.io", "cdn03.quay.io"],
        ),
        r("gcr.io", "https://gcr.io", &[], &["storage.googleapis.com"]),
        r("public.ecr.aws", "https://public.ecr.aws", &[], &[]),
    ]
}

fn default_source_hosts() -> Vec<String> {
    vec!["github.com".into()]
}

fn default_github_api() -> String {
    "https://api.github.com".into()
}

fn default_notes_timeout() -> u64 {
    5
}

fn default_notes_bytes() -> usize {
    1 << 20
}

fn default_model_timeout() -> u64 {
    120
}

fn default_max_output_tokens() -> u32 {
    8192
}

fn default_max_calls() -> u32 {
    10
}

fn default_max_calls_per_head() -> u32 {
    5
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ModelProvider {
    #[default]
    None,
    Anthropic,
    Openai,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookConfig {
    /// The environment variable holding the shared secret the intake checks.
    #[serde(default = "default_secret_env")]
    pub secret_env: String,
    /// With `forge.kind: gitlab`: the environment variable holding the secret token GitLab's
    /// merge request webhook sends as `X-Gitlab-Token` (`/webhooks/gitlab`). Unset or empty:
    /// that route refuses every delivery.
    #[serde(default = "default_gitlab_token_env")]
    pub gitlab_token_env: String,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            secret_env: default_secret_env(),
            gitlab_token_env: default_gitlab_token_env(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommitIdentity {
    #[serde(default = "commit_name")]
    pub name: String,
    #[serde(default = "commit_email")]
    pub email: String,
}

impl CommitIdentity {
    /// The git arguments that commit what is staged as this identity, running no hook: the
    /// one commit line of both runners (the triage's checkout, `bosun repair`'s worktree).
    pub fn commit_args(&self, message: &str) -> Vec<String> {
        vec![
            "-c".into(),
            format!("user.name={}", self.name),
            "-c".into(),
            format!("user.email={}", self.email),
            "commit".into(),
            "--quiet".into(),
            "--no-verify".into(),
            "-m".into(),
            message.into(),
        ]
    }
}

impl Default for CommitIdentity {
    fn default() -> Self {
        CommitIdentity {
            name: commit_name(),
            email: commit_email(),
        }
    }
}

/// A repository's path, split at its last `/` (a GitLab namespace holds more); what the
/// forge's kind allows is checked by `Config::parse`, which knows the kind.
fn slug<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<RepoSlug, D::Error> {
    let text = String::deserialize(deserializer)?;
    match text.rsplit_once('/') {
        Some((owner, name)) => Ok(RepoSlug {
            owner: owner.to_string(),
            name: name.to_string(),
        }),
        None => Err(serde::de::Error::custom(format!(
            "slug {:?} is not OWNER/NAME",
            text.chars().take(80).collect::<String>()
        ))),
    }
}

fn default_deny() -> Vec<String> {
    vec![".github/**".into(), ".git/**".into()]
}
fn default_allow() -> Vec<String> {
    vec!["**/*.yaml".into(), "**/*.yml".into()]
}
fn default_attempt_cap() -> u32 {
    2
}
fn default_token_env() -> String {
    "GITHUB_TOKEN".into()
}
fn default_git_url() -> String {
    "https://x-access-token:{token}@github.com/{slug}.git".into()
}

/// Where git reaches a repository, without the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRemote {
    pub url: String,
    /// The user name to give with the token (`x-access-token` for GitHub); None: no
    /// credentials (a `file://` remote).
    pub username: Option<String>,
}

/// `scheme://USER:{token}@rest` -> (USER, `scheme://rest`).
fn split_token_userinfo(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let (userinfo, host) = rest.split_once('@')?;
    let user = userinfo.strip_suffix(":{token}")?;
    if user.is_empty() || user.contains(['/', ':', '{']) || host.contains("{token}") {
        return None;
    }
    Some((user.to_string(), format!("{scheme}://{host}")))
}
fn default_branch() -> String {
    "main".into()
}
fn default_argocd_namespace() -> String {
    "argocd".into()
}
fn needs_human() -> String {
    "needs-human".into()
}
fn worth_a_look() -> String {
    "worth-a-look".into()
}
fn attempt_prefix() -> String {
    "bosun/attempt-".into()
}
fn default_secret_env() -> String {
    "BOSUN_WEBHOOK_SECRET".into()
}
fn default_gitlab_token_env() -> String {
    "BOSUN_GITLAB_WEBHOOK_TOKEN".into()
}
fn commit_name() -> String {
    "bosun".into()
}
fn commit_email() -> String {
    "bosun@users.noreply.github.com".into()
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// The remote render cache `render.cacheUrl` names cannot be opened (its key or its URL):
    /// the remote cache's message.
    #[error("bosun.yaml: render.cacheUrl: {0}")]
    RemoteCache(String),
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let mut config: Config = serde_saphyr::from_str(text).map_err(|e| {
            let message = e.to_string();
            let first = message
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            ConfigError::Invalid(format!("{origin}: {first}"))
        })?;
        if config.repositories.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{origin}: `repositories` lists no repository"
            )));
        }
        // Each slug as the forge names repositories (GitHub and Gitea: OWNER/NAME; GitLab: a
        // project's full path, subgroups included), and no two the forge would take for one:
        // forges find repositories ignoring ASCII case, and so does GitLab's webhook here.
        for index in 0..config.repositories.len() {
            let text = config.repositories[index].slug.to_string();
            let slug = RepoSlug::for_forge(config.forge.kind, &text).map_err(|e| {
                ConfigError::Invalid(format!("{origin}: repositories[{index}].slug: {e}"))
            })?;
            if let Some(first) = config.repositories[..index]
                .iter()
                .position(|r| r.slug.same_ignoring_case(&slug))
            {
                return Err(ConfigError::Invalid(format!(
                    "{origin}: repositories[{index}].slug {text:?} names the repository of repositories[{first}].slug {:?} (the forge ignores case in names): list it once",
                    config.repositories[first].slug.to_string()
                )));
            }
            config.repositories[index].slug = slug;
        }
        let url = &config.forge.git_url;
        if url.contains("{token}") && split_token_userinfo(url).is_none() {
            return Err(ConfigError::Invalid(format!(
                "{origin}: forge.gitUrl: {{token}} may only stand as the password of the URL's user info (https://USER:{{token}}@host/...)"
            )));
        }
        if config.forge.check_mode == Some(CheckMode::CheckRun)
            && !config.forge.kind.has_check_runs()
        {
            return Err(ConfigError::Invalid(format!(
                "{origin}: forge.checkMode: check-run, but a {:?} forge has no check runs (use status)",
                config.forge.kind
            )));
        }
        if let InventoryConfig::Argocd { server, .. } = &config.inventory
            && !(server.starts_with("https://") || server.starts_with("http://"))
        {
            return Err(ConfigError::Invalid(format!(
                "{origin}: inventory.argocd.server {server:?} is not an http(s) URL"
            )));
        }
        for glob in config.deny.iter().chain(&config.allow) {
            globset::Glob::new(glob)
                .map_err(|e| ConfigError::Invalid(format!("{origin}: glob {glob:?}: {e}")))?;
        }
        if let Some(url) = &config.render.cache_url {
            crate::remote_cache::Location::parse(url)
                .map_err(|e| ConfigError::Invalid(format!("{origin}: render.cacheUrl: {e}")))?;
            if config.render.cache_public_key.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "{origin}: render.cacheUrl needs render.cachePublicKey, the key its entries are signed with"
                )));
            }
        }
        if let Some(key) = &config.render.cache_public_key {
            crate::remote_cache::Trust::from_keys(Some(key), None).map_err(|e| {
                ConfigError::Invalid(format!("{origin}: render.cachePublicKey: {e}"))
            })?;
        }
        let model = &config.model;
        crate::model::Rules::new(&model.redact.keys, &model.redact.values)
            .map_err(|e| ConfigError::Invalid(format!("{origin}: {e}")))?;
        if model.provider != ModelProvider::None {
            if model.model.as_deref().is_none_or(|m| m.trim().is_empty()) {
                return Err(ConfigError::Invalid(format!(
                    "{origin}: model.model names no model (required with provider {:?})",
                    model.provider
                )));
            }
            if let Some(url) = &model.base_url
                && !(url.starts_with("https://") || url.starts_with("http://"))
            {
                return Err(ConfigError::Invalid(format!(
                    "{origin}: model.baseUrl {url:?} is not an http(s) URL"
                )));
            }
        }
        Ok(config)
    }

    pub fn repository(&self, slug: &RepoSlug) -> Option<&RepositoryConfig> {
        self.repositories.iter().find(|r| &r.slug == slug)
    }

    /// The repository of this file a delivery, a journal entry or a command line names:
    /// `Err` when `text` is no repository the forge could have (one line, naming it), `None`
    /// when it is not listed here. On GitLab, which finds projects ignoring ASCII case, a path
    /// names the repository whatever its case, and the slug returned is this file's spelling.
    pub fn named(&self, text: &str) -> Result<Option<RepoSlug>, crate::forge::SlugError> {
        let slug = RepoSlug::for_forge(self.forge.kind, text)?;
        Ok(self
            .repositories
            .iter()
            .find(|r| match self.forge.kind {
                crate::forge::ForgeKind::Gitlab => r.slug.same_ignoring_case(&slug),
                _ => r.slug == slug,
            })
            .map(|r| r.slug.clone()))
    }

    /// How to reach a repository with git: the URL (never holding the token, so nothing on
    /// disk does) and the user name git gives with the token, which a credential helper of
    /// that one git process supplies. A `gitUrl` written as `https://USER:{token}@host/...`
    /// keeps working: the user info is taken out of the URL and becomes the user name.
    pub fn git_remote(&self, slug: &RepoSlug) -> GitRemote {
        let url = self.forge.git_url.replace("{slug}", &slug.to_string());
        match split_token_userinfo(&url) {
            Some((user, bare)) => GitRemote {
                url: bare,
                username: Some(user),
            },
            None => GitRemote {
                url,
                username: None,
            },
        }
    }

    pub fn gate_author<'a>(&'a self, me: &'a str) -> &'a str {
        self.forge.gate_author.as_deref().unwrap_or(me)
    }
}

#[cfg(test)]
mod tests;
