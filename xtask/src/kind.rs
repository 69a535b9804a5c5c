//! `cargo xtask kind ...`: the kind path. The promotion loop of the embedded ground, on a real
//! cluster: kind, cert-manager, Argo CD, Argo Rollouts, Kargo, Gitea and our own images.
//!
//! `up` is a plan: the list of every command it runs, computed without side effects by
//! [`plan_up`]. [`run`] either prints it (`--dry-run`, snapshot-tested here, since Docker is not
//! on every machine) or runs it in order from the project root. Paths in a plan are relative to
//! the project root, so the text is the same wherever the project lives.
//!
//! Secrets never appear in a plan. An argument holds the placeholder [`GENERATED`] where one
//! goes, and the step lists the secrets that fill its placeholders, in order of appearance.
//! [`run`] generates them (or takes one from the output of a step that creates it) and puts
//! them only into the argv it executes. See kind/README.md.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitStatus, Stdio};

use anyhow::{Context, Result, bail};
use clap::Subcommand;

use crate::project_root;

#[derive(Subcommand)]
pub enum Command {
    /// Create the kind cluster, install everything and load a scenario (needs Docker).
    Up {
        /// The scenario folder under scenarios/.
        #[arg(long, default_value = "happy-path")]
        scenario: String,
        /// Print every command, in order, and run none.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete the kind cluster.
    Down {
        /// Print the command and run nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Play the scenario's timeline against the cluster `up` made, and check its expectations
    /// there (waiting on conditions with timeouts; ground-only actions are skipped, said so).
    Play {
        /// The scenario folder under scenarios/ (the one `up` loaded).
        #[arg(long, default_value = "happy-path")]
        scenario: String,
        /// Print every command and request, in order, and run none.
        #[arg(long)]
        dry_run: bool,
    },
    /// A step of `up`: write target/kind/<scenario>/ (repositories for Gitea, Kargo objects).
    Stage {
        /// The scenario folder under scenarios/.
        #[arg(long, default_value = "happy-path")]
        scenario: String,
    },
}

pub fn main(command: Command) -> Result<()> {
    let root = project_root();
    match command {
        Command::Up { scenario, dry_run } => {
            let source = kargo_source(&read_scenario(&root, &scenario)?, &scenario)?;
            run(&plan_up(&root, &scenario, &source), dry_run)
        }
        Command::Play { scenario, dry_run } => {
            let plan = plan_play(&root, &scenario, &read_scenario(&root, &scenario)?)?;
            run_with(&plan, dry_run, Credentials::Existing)
        }
        Command::Down { dry_run } => run(&plan_down(), dry_run),
        Command::Stage { scenario } => stage(&root, &scenario),
    }
}

/// The kind cluster's name; kubectl and helm address it through its context.
const CLUSTER: &str = "gitops-loop";
const CONTEXT: &str = "kind-gitops-loop";
/// Gitea from the host (kind/cluster.yaml publishes the NodePort on loopback).
const GITEA_LOCAL: &str = "http://127.0.0.1:31082";
/// Gitea from inside the cluster: what Argo CD, Kargo and the staged repository use.
const GITEA_IN_CLUSTER: &str = "http://gitea-http.gitea.svc.cluster.local:3000";
const GITEA_ADMIN: &str = "gitops-admin";
/// The Kargo Project (and namespace) of the scenarios, declared in kind/project.yaml.
const PROJECT: &str = "kargo-demo";
/// Our binaries, one image each, tagged `gitops-loop/<binary>:kind`.
const BINARIES: [&str; 3] = ["gate", "observer", "bosun"];
const IMAGE_TAG: &str = "kind";
/// Where `stage` writes, under the project root.
const STAGED: &str = "target/kind";
/// The scenarios' GitOps repository and chart mirror.
const SAMPLE_REPO: &str = "scenarios/sample/repo";
const SAMPLE_CHARTS: &str = "scenarios/sample/charts";
/// The one chart repository of the mirror that is served on kind (the Gitea repository
/// platform/charts); the OCI registry `registry.example.test/charts` is not.
const SERVED_CHART_REPOSITORY: &str = "charts.example.test/stable";

/// The hosts the scenarios name, and what stands for them on kind. `stage` rewrites every
/// staged file with these, so Argo CD and Kargo reach Gitea, and Kargo's git-open-pr step infers
/// the `gitea` provider from the host.
const URL_MAP: [(&str, &str); 4] = [
    (
        "https://git.example.test/",
        "http://gitea-http.gitea.svc.cluster.local:3000/",
    ),
    (
        "https://charts.example.test/stable",
        "http://gitea-http.gitea.svc.cluster.local:3000/platform/charts/raw/branch/main",
    ),
    // Kargo's `http` step hands held pull requests to Bosun's intake.
    ("https://bosun.example.test", BOSUN_IN_CLUSTER),
    // Verification's AnalysisTemplates ask Prometheus (kind/values/prometheus.yaml).
    ("http://prometheus.example.test:9090", PROMETHEUS_IN_CLUSTER),
];
/// The Prometheus server from inside the cluster (chart prometheus-community/prometheus).
const PROMETHEUS_IN_CLUSTER: &str = "http://prometheus-server.monitoring.svc.cluster.local";
/// How long a `play` wait lasts before the play fails, naming what it waited for.
const WAIT_SECONDS: u64 = 20 * 60;
/// Bosun's intake from inside the cluster (charts/bosun's Service in namespace bosun).
const BOSUN_IN_CLUSTER: &str = "http://bosun.bosun.svc.cluster.local:8080";

/// The placeholder a plan holds where a secret goes.
pub const GENERATED: &str = "<generated>";

/// A value `run` makes at run time and never prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Secret {
    /// bcrypt hash of the generated Kargo admin password (`api.adminAccount.passwordHash`).
    KargoPasswordHash,
    /// Kargo's `api.adminAccount.tokenSigningKey`: 32 random bytes, hex.
    KargoTokenSigningKey,
    /// The Gitea admin's password.
    GiteaPassword,
    /// A Gitea access token for Kargo, printed by the step that creates it.
    GiteaToken,
    /// The shared secret of Bosun's intake (Kargo's `http` step sends it): 32 random bytes, hex.
    BosunWebhook,
}

/// One command of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the command does, for the reader of the plan.
    pub what: String,
    /// The command; relative paths are relative to the project root.
    pub argv: Vec<String>,
    /// The secrets that replace the [`GENERATED`] placeholders of `argv`, in order.
    pub secrets: Vec<Secret>,
    /// When set, the command's standard output (trimmed) becomes this secret, unprinted.
    pub captures: Option<Secret>,
    /// When set, the command is a condition: run again every 10 s until it succeeds, failing
    /// the plan after this many seconds. A plan waits on conditions, never on sleeps.
    pub until: Option<u64>,
}

impl Step {
    fn new(what: impl Into<String>, argv: Vec<String>) -> Step {
        Step {
            what: what.into(),
            argv,
            secrets: Vec::new(),
            captures: None,
            until: None,
        }
    }

    /// A line for the reader that runs nothing (what `play` does not play, and why).
    fn note(what: impl Into<String>) -> Step {
        Step::new(what, Vec::new())
    }

    fn until(mut self, seconds: u64) -> Step {
        self.until = Some(seconds);
        self
    }

    fn with_secrets(mut self, secrets: &[Secret]) -> Step {
        self.secrets = secrets.to_vec();
        self
    }

    fn capturing(mut self, secret: Secret) -> Step {
        self.captures = Some(secret);
        self
    }
}

/// `argv![a, b, ...]`: a `Vec<String>` from `&str`s and `String`s.
macro_rules! argv {
    ($($arg:expr),* $(,)?) => {
        vec![$(String::from($arg)),*]
    };
}

fn kubectl(args: Vec<String>) -> Vec<String> {
    let mut argv = argv!["kubectl", "--context", CONTEXT];
    argv.extend(args);
    argv
}

/// `kubectl create secret generic NAME --namespace NAMESPACE --from-literal=KEY=VALUE...`.
fn generic_secret(name: &str, namespace: &str, literals: &[(&str, &str)]) -> Vec<String> {
    let mut args = argv![
        "create",
        "secret",
        "generic",
        name,
        "--namespace",
        namespace
    ];
    args.extend(
        literals
            .iter()
            .map(|(key, value)| format!("--from-literal={key}={value}")),
    );
    kubectl(args)
}

/// `helm upgrade --install` into the kind cluster, waiting until the release is ready.
fn helm_install(release: &str, chart: &str, namespace: &str, flags: Vec<String>) -> Vec<String> {
    let mut argv = argv![
        "helm",
        "upgrade",
        "--install",
        release,
        chart,
        "--kube-context",
        CONTEXT,
        "--namespace",
        namespace,
        "--create-namespace",
    ];
    argv.extend(flags);
    argv.extend(argv!["--wait", "--timeout", "10m"]);
    argv
}

/// A POST to Gitea's REST API from the host, as the admin.
fn gitea_post(path: &str, body: &str) -> Vec<String> {
    argv![
        "curl",
        "--fail",
        "--silent",
        "--show-error",
        "--output",
        "/dev/null",
        "--user",
        format!("{GITEA_ADMIN}:{GENERATED}"),
        "--header",
        "Content-Type: application/json",
        "--data",
        body,
        format!("{GITEA_LOCAL}/api/v1/{path}"),
    ]
}

fn image(binary: &str) -> String {
    format!("gitops-loop/{binary}:{IMAGE_TAG}")
}

/// `path` (a path under `root`) as written in a plan: relative to the project root.
fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// How a scenario declares its Kargo objects (`kargo:` in scenario.yaml).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KargoSource {
    /// `kargo.pipelines: FILE`: values of charts/kargo-pipelines, installed with helm.
    Pipelines(String),
    /// `kargo.objects: FILE`: hand-written Warehouses and Stages, applied with kubectl.
    Objects(String),
}

impl KargoSource {
    /// The file `stage` writes under target/kind/<scenario>/.
    fn staged_name(&self) -> &'static str {
        match self {
            KargoSource::Pipelines(_) => "pipelines.yaml",
            KargoSource::Objects(_) => "kargo.yaml",
        }
    }

    fn describe(&self) -> String {
        match self {
            KargoSource::Pipelines(file) => format!("pipelines values ({file})"),
            KargoSource::Objects(file) => format!("Kargo objects ({file})"),
        }
    }

    fn file(&self) -> &str {
        match self {
            KargoSource::Pipelines(file) | KargoSource::Objects(file) => file,
        }
    }
}

/// scenarios/<scenario>/scenario.yaml, parsed.
pub fn read_scenario(root: &Path, scenario: &str) -> Result<serde_json::Value> {
    if scenario.is_empty() || scenario.contains(['/', '\\']) || scenario.starts_with('.') {
        bail!("{scenario:?} is not a folder name under scenarios/");
    }
    let path = root.join("scenarios").join(scenario).join("scenario.yaml");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no scenario {scenario}: cannot read {}", path.display()))?;
    serde_saphyr::from_str(&text).with_context(|| format!("{}: not YAML", path.display()))
}

/// True for a relative path of plain names that, read from scenarios/<scenario>/, stays under
/// scenarios/ (`pipelines.yaml`, `../sample/pipelines-x.yaml`).
fn inside_scenarios(path: &str) -> bool {
    let mut depth = 1i32;
    let parts: Vec<&str> = path.split('/').collect();
    for (index, part) in parts.iter().enumerate() {
        if *part == ".." && index + 1 < parts.len() {
            depth -= 1;
        } else if plain(part, false) {
            depth += 1;
        } else {
            return false;
        }
        if depth < 0 {
            return false;
        }
    }
    depth >= 1
}

/// Where the scenario's Kargo objects come from.
pub fn kargo_source(scenario_yaml: &serde_json::Value, scenario: &str) -> Result<KargoSource> {
    let kargo = &scenario_yaml["kargo"];
    let file = |key: &str| -> Result<Option<String>> {
        match kargo.get(key) {
            None => Ok(None),
            Some(serde_json::Value::String(file)) if inside_scenarios(file) => {
                Ok(Some(file.clone()))
            }
            Some(other) => bail!(
                "scenarios/{scenario}/scenario.yaml: kargo.{key} must name a file under scenarios/, relative to the scenario, not {other}"
            ),
        }
    };
    match (file("pipelines")?, file("objects")?) {
        (Some(pipelines), None) => Ok(KargoSource::Pipelines(pipelines)),
        (None, Some(objects)) => Ok(KargoSource::Objects(objects)),
        _ => bail!(
            "scenarios/{scenario}/scenario.yaml: kargo names neither or both of `pipelines` and `objects`"
        ),
    }
}

/// Every command of `cargo xtask kind up --scenario <scenario>`, in order. Pure: nothing is
/// read or run, and the result does not depend on `root`, which only anchors the paths.
pub fn plan_up(root: &Path, scenario: &str, source: &KargoSource) -> Vec<Step> {
    let path = |p: &str| relative(root, &root.join(p));
    let staged = root.join(STAGED).join(scenario);
    let staged_dir = relative(root, &staged);
    let staged_repo = relative(root, &staged.join("repo"));
    let staged_charts = relative(root, &staged.join("charts"));
    let staged_kargo = relative(root, &staged.join(source.staged_name()));
    let staged_bootstrap = relative(root, &staged.join("repo").join("bootstrap"));
    let push_url = |repo: &str| {
        let host = GITEA_LOCAL.trim_start_matches("http://");
        format!("http://{GITEA_ADMIN}:{GENERATED}@{host}/platform/{repo}.git")
    };

    let mut steps = vec![
        Step::new("check that Docker runs", argv!["docker", "version"]),
        Step::new(
            "check kind (v0.31.0 or later: kind/cluster.yaml pins its node image)",
            argv!["kind", "version"],
        ),
        Step::new("check kubectl", argv!["kubectl", "version", "--client"]),
        Step::new(
            "check helm (v3.8 or later: Kargo's chart is an OCI artifact)",
            argv!["helm", "version"],
        ),
        Step::new("check git", argv!["git", "version"]),
        Step::new("check curl", argv!["curl", "--version"]),
        Step::new(
            "the pinned helm and kubectl that the gate image bundles, into target/tools",
            argv!["cargo", "xtask", "tools"],
        ),
        Step::new(
            format!(
                "stage {staged_dir}: the sample repository and the scenario's {} with their URLs pointed at Gitea, Bosun and Prometheus in the cluster, the scenario's published charts as a chart repository",
                source.describe()
            ),
            argv!["cargo", "xtask", "kind", "stage", "--scenario", scenario],
        ),
        Step::new(
            "create the cluster: one node, Kubernetes v1.33, ports 31080-31082 on 127.0.0.1",
            argv![
                "kind",
                "create",
                "cluster",
                "--name",
                CLUSTER,
                "--config",
                path("kind/cluster.yaml"),
                "--wait",
                "5m",
            ],
        ),
        Step::new(
            "chart repository: cert-manager",
            argv![
                "helm",
                "repo",
                "add",
                "jetstack",
                "https://charts.jetstack.io",
                "--force-update"
            ],
        ),
        Step::new(
            "chart repository: Argo CD and Argo Rollouts",
            argv![
                "helm",
                "repo",
                "add",
                "argo",
                "https://argoproj.github.io/argo-helm",
                "--force-update"
            ],
        ),
        Step::new(
            "chart repository: Prometheus",
            argv![
                "helm",
                "repo",
                "add",
                "prometheus-community",
                "https://prometheus-community.github.io/helm-charts",
                "--force-update"
            ],
        ),
        Step::new(
            "chart repository: Gitea",
            argv![
                "helm",
                "repo",
                "add",
                "gitea-charts",
                "https://dl.gitea.com/charts/",
                "--force-update"
            ],
        ),
        Step::new(
            "cert-manager first: Kargo's webhooks server certificate is a cert-manager Certificate",
            helm_install(
                "cert-manager",
                "jetstack/cert-manager",
                "cert-manager",
                argv![
                    "--version",
                    "v1.19.3",
                    "--values",
                    path("kind/values/cert-manager.yaml"),
                    "--set",
                    "crds.enabled=true",
                ],
            ),
        ),
        Step::new(
            "Argo CD v3.5.2 (images) on chart 9.4.3 and its CRDs, before Kargo (which enables its Argo CD integration only if they exist); controller metrics on for Prometheus",
            helm_install(
                "argocd",
                "argo/argo-cd",
                "argocd",
                argv![
                    "--version",
                    "9.4.3",
                    "--values",
                    path("kind/values/argo-cd.yaml")
                ],
            ),
        ),
        Step::new(
            "Prometheus, scraping Argo CD's argocd_app_info: the pipelines chart's verification asks it",
            helm_install(
                "prometheus",
                "prometheus-community/prometheus",
                "monitoring",
                argv![
                    "--version",
                    "29.27.2",
                    "--values",
                    path("kind/values/prometheus.yaml"),
                ],
            ),
        ),
        Step::new(
            "Argo Rollouts, before Kargo: verification runs its AnalysisTemplates",
            helm_install(
                "argo-rollouts",
                "argo/argo-rollouts",
                "argo-rollouts",
                argv![
                    "--version",
                    "2.40.6",
                    "--values",
                    path("kind/values/argo-rollouts.yaml"),
                ],
            ),
        ),
        Step::new(
            "Kargo, with a generated admin password hash and token signing key",
            helm_install(
                "kargo",
                "oci://ghcr.io/akuity/kargo-charts/kargo",
                "kargo",
                argv![
                    "--version",
                    "1.11.2",
                    "--values",
                    path("kind/values/kargo.yaml"),
                    "--set-string",
                    format!("api.adminAccount.passwordHash={GENERATED}"),
                    "--set-string",
                    format!("api.adminAccount.tokenSigningKey={GENERATED}"),
                ],
            ),
        )
        .with_secrets(&[Secret::KargoPasswordHash, Secret::KargoTokenSigningKey]),
        Step::new(
            "Gitea's namespace",
            kubectl(argv!["create", "namespace", "gitea"]),
        ),
        Step::new(
            "Gitea's admin user, with a generated password",
            generic_secret(
                "gitea-admin",
                "gitea",
                &[("username", GITEA_ADMIN), ("password", GENERATED)],
            ),
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            "Gitea, the forge",
            helm_install(
                "gitea",
                "gitea-charts/gitea",
                "gitea",
                argv![
                    "--version",
                    "12.7.0",
                    "--values",
                    path("kind/values/gitea.yaml")
                ],
            ),
        ),
    ];

    for binary in BINARIES {
        steps.push(Step::new(
            format!("image {}", image(binary)),
            argv![
                "docker",
                "build",
                "--file",
                path("kind/Dockerfile"),
                "--target",
                binary,
                "--tag",
                image(binary),
                ".",
            ],
        ));
    }
    let mut load = argv!["kind", "load", "docker-image", "--name", CLUSTER];
    load.extend(BINARIES.map(image));
    steps.push(Step::new(
        "copy the images into the cluster's node (no registry)",
        load,
    ));
    steps.push(Step::new(
        "the observer, from its chart, running the loaded image",
        helm_install(
            "kargo-argocd-observer",
            &path("charts/kargo-argocd-observer"),
            "kargo-observer",
            argv![
                "--set",
                "image.repository=gitops-loop/observer",
                "--set",
                format!("image.tag={IMAGE_TAG}"),
                "--set",
                "image.pullPolicy=Never",
                "--set",
                "replicaCount=1",
            ],
        ),
    ));

    steps.extend([
        Step::new(
            "a Gitea access token for Kargo and Bosun (the output of this command is kept, not printed): read:user lets Bosun ask who it is, write:repository and write:issue open pull requests, comment, label and set statuses",
            kubectl(argv![
                "exec",
                "--namespace",
                "gitea",
                "deploy/gitea",
                "--",
                "gitea",
                "admin",
                "user",
                "generate-access-token",
                "--username",
                GITEA_ADMIN,
                "--token-name",
                "kargo",
                "--scopes",
                "read:user,write:repository,write:issue",
                "--raw",
            ]),
        )
        .capturing(Secret::GiteaToken),
        Step::new(
            "Gitea organization platform",
            gitea_post("orgs", r#"{"username":"platform","visibility":"public"}"#),
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            "Gitea repository platform/gitops (public: Argo CD reads it without credentials)",
            gitea_post(
                "orgs/platform/repos",
                r#"{"name":"gitops","private":false}"#,
            ),
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            "Gitea repository platform/charts, served as a Helm chart repository by Gitea's raw file URLs",
            gitea_post(
                "orgs/platform/repos",
                r#"{"name":"charts","private":false}"#,
            ),
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            "push the staged sample repository",
            argv![
                "git",
                "-C",
                staged_repo,
                "push",
                "--quiet",
                push_url("gitops"),
                "main"
            ],
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            "branch protection on platform/gitops main: the commit status addons-gate must be green before a merge (administration: the Forge trait Bosun holds cannot do this)",
            gitea_post(
                "repos/platform/gitops/branch_protections",
                r#"{"rule_name":"main","enable_status_check":true,"status_check_contexts":["addons-gate"]}"#,
            ),
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            "push the staged chart repository",
            argv![
                "git",
                "-C",
                staged_charts,
                "push",
                "--quiet",
                push_url("charts"),
                "main"
            ],
        )
        .with_secrets(&[Secret::GiteaPassword]),
        Step::new(
            format!("the Kargo Project's namespace {PROJECT}"),
            kubectl(argv!["create", "namespace", PROJECT]),
        ),
        Step::new(
            "label it, so that the Project adopts it",
            kubectl(argv![
                "label",
                "namespace",
                PROJECT,
                "kargo.akuity.io/project=true"
            ]),
        ),
        Step::new(
            "the Project, which adopts the namespace",
            kubectl(argv!["apply", "--filename", path("kind/project.yaml")]),
        ),
        Step::new(
            "Bosun's namespace",
            kubectl(argv!["create", "namespace", "bosun"]),
        ),
        Step::new(
            "Kargo's credentials for the GitOps repository: the Gitea token",
            generic_secret("gitea-credentials", PROJECT, &[("repoURL", &format!("{GITEA_IN_CLUSTER}/platform/gitops.git")), ("username", GITEA_ADMIN), ("password", GENERATED)]),
        )
        .with_secrets(&[Secret::GiteaToken]),
        Step::new(
            "mark them as git credentials for Kargo",
            kubectl(argv![
                "label",
                "secret",
                "gitea-credentials",
                "--namespace",
                PROJECT,
                "kargo.akuity.io/cred-type=git"
            ]),
        ),
        Step::new(
            "Bosun's forge token: the Gitea token (Bosun speaks Gitea's API: forge.kind gitea)",
            generic_secret("bosun-forge", "bosun", &[("token", GENERATED)]),
        )
        .with_secrets(&[Secret::GiteaToken]),
        Step::new(
            "Bosun's intake secret",
            generic_secret("bosun-webhook", "bosun", &[("secret", GENERATED)]),
        )
        .with_secrets(&[Secret::BosunWebhook]),
        Step::new(
            "the same secret for Kargo's http step, read with secret('bosun').token",
            generic_secret("bosun", PROJECT, &[("token", GENERATED)]),
        )
        .with_secrets(&[Secret::BosunWebhook]),
        Step::new(
            "mark it as a generic credential for Kargo's expressions",
            kubectl(argv![
                "label",
                "secret",
                "bosun",
                "--namespace",
                PROJECT,
                "kargo.akuity.io/cred-type=generic"
            ]),
        ),
        Step::new(
            "Bosun, from its chart, running the loaded image against Gitea (commit statuses: Gitea has no check runs)",
            helm_install(
                "bosun",
                &path("charts/bosun"),
                "bosun",
                argv![
                    "--set",
                    "image.repository=gitops-loop/bosun",
                    "--set",
                    format!("image.tag={IMAGE_TAG}"),
                    "--set",
                    "image.pullPolicy=Never",
                    "--set-json",
                    format!(
                        r#"config={{"forge":{{"kind":"gitea","apiUrl":"{GITEA_IN_CLUSTER}/api/v1","checkMode":"status","gitUrl":"http://{GITEA_ADMIN}:{{token}}@gitea-http.gitea.svc.cluster.local:3000/{{slug}}.git"}},"repositories":[{{"slug":"platform/gitops","url":"{GITEA_IN_CLUSTER}/platform/gitops.git"}}]}}"#
                    ),
                ],
            ),
        ),
        match source {
            KargoSource::Pipelines(file) => Step::new(
                format!(
                    "the scenario's pipelines: charts/kargo-pipelines with scenarios/{scenario}/{file} as staged (ProjectConfig, Warehouses, Stages, AnalysisTemplates)"
                ),
                helm_install(
                    "kargo-pipelines",
                    &path("charts/kargo-pipelines"),
                    PROJECT,
                    argv!["--values", staged_kargo],
                ),
            ),
            KargoSource::Objects(file) => Step::new(
                format!("the Warehouses and Stages of scenarios/{scenario}/{file}, as staged"),
                kubectl(argv![
                    "apply",
                    "--namespace",
                    PROJECT,
                    "--filename",
                    staged_kargo
                ]),
            ),
        },
        Step::new(
            "the bootstrap Application and ApplicationSets of the sample repository, as staged",
            kubectl(argv!["apply", "--filename", staged_bootstrap]),
        ),
    ]);
    steps
}

/// Every command and request of `cargo xtask kind play`: the scenario's timeline driven against
/// the cluster `up` made (publish a chart version into the in-cluster chart repository, ask a
/// Warehouse to look again, merge as a person once branch protection allows it), then its
/// expectations checked against the real Kargo and Gitea, each a condition waited on with a
/// timeout. What only the ground can do (a seeded fault, a double's state) is said, not played.
pub fn plan_play(
    root: &Path,
    scenario: &str,
    scenario_yaml: &serde_json::Value,
) -> Result<Vec<Step>> {
    use serde_json::Value;
    let path = |p: &str| relative(root, &root.join(p));
    let staged_charts = relative(root, &root.join(STAGED).join(scenario).join("charts"));
    let slug = scenario_yaml
        .pointer("/repository/slug")
        .and_then(Value::as_str)
        .unwrap_or("platform/gitops");
    if !plain(slug, true) {
        bail!("scenarios/{scenario}/scenario.yaml: repository.slug {slug:?} is not OWNER/NAME");
    }
    let gitea = |tail: &str| format!("{GITEA_LOCAL}/api/v1/repos/{slug}/{tail}");
    let push_url = {
        let host = GITEA_LOCAL.trim_start_matches("http://");
        format!("http://{GITEA_ADMIN}:{GENERATED}@{host}/platform/charts.git")
    };
    let mut steps = vec![Step::new(
        format!("the cluster `cargo xtask kind up --scenario {scenario}` made answers"),
        kubectl(argv!["get", "namespace", PROJECT]),
    )];
    let timeline = scenario_yaml
        .get("timeline")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (index, entry) in timeline.iter().enumerate() {
        let at = index + 1;
        let (action, argument) = match entry {
            Value::String(action) => (action.as_str(), Value::Null),
            Value::Object(map) if map.len() == 1 => {
                let (action, argument) = map.iter().next().expect("one entry");
                (action.as_str(), argument.clone())
            }
            other => bail!(
                "scenarios/{scenario}/scenario.yaml: timeline entry {at} is neither an action nor {{action: argument}}: {other}"
            ),
        };
        match action {
            // The ground's quiescence; on kind the waits that follow stand for it.
            "settle" => {}
            "say" => steps.push(Step::note(format!(
                "say: {}",
                argument.as_str().unwrap_or_default()
            ))),
            "publish" => {
                let id = argument.as_str().unwrap_or_default();
                let Some((name, version)) = id
                    .split_once('@')
                    .filter(|(n, v)| plain(n, false) && plain(v, false))
                else {
                    bail!(
                        "scenarios/{scenario}/scenario.yaml: timeline entry {at}: publish {id:?} is not NAME@VERSION"
                    );
                };
                let chart = path(&format!(
                    "{SAMPLE_CHARTS}/{SERVED_CHART_REPOSITORY}/{name}/{version}"
                ));
                let git = |args: Vec<String>| {
                    let mut argv = argv!["git", "-C", &staged_charts];
                    argv.extend(args);
                    argv
                };
                steps.extend([
                    Step::new(
                        format!("publish {name} {version}: package it into the staged chart repository"),
                        argv!["helm", "package", chart, "--destination", &staged_charts],
                    ),
                    Step::new(
                        format!("publish {name} {version}: index the chart repository"),
                        argv!["helm", "repo", "index", &staged_charts],
                    ),
                    Step::new(
                        format!("publish {name} {version}: add it to the next commit"),
                        git(argv!["add", "--all"]),
                    ),
                    Step::new(
                        format!("publish {name} {version}: commit it"),
                        git(argv![
                            "-c",
                            "user.name=gitops-loop",
                            "-c",
                            "user.email=kind@example.test",
                            "commit",
                            "--quiet",
                            "--message",
                            format!("publish {name} {version}")
                        ]),
                    ),
                    Step::new(
                        format!("publish {name} {version}: push platform/charts, which Gitea serves as the chart repository"),
                        git(argv!["push", "--quiet", &push_url, "main"]),
                    )
                    .with_secrets(&[Secret::GiteaPassword]),
                ]);
            }
            "refresh" => {
                let warehouse = argument.as_str().unwrap_or_default();
                if !plain(warehouse, false) {
                    bail!(
                        "scenarios/{scenario}/scenario.yaml: timeline entry {at}: refresh {warehouse:?} is not a Warehouse name"
                    );
                }
                steps.push(Step::new(
                    format!("ask Warehouse {warehouse} to look for new versions now (Kargo's refresh annotation)"),
                    kubectl(argv![
                        "annotate",
                        "--overwrite",
                        "warehouse",
                        warehouse,
                        "--namespace",
                        PROJECT,
                        format!("kargo.akuity.io/refresh=play-{at}")
                    ]),
                ));
            }
            "merge" => {
                let number = argument.get("pr").and_then(Value::as_u64).with_context(|| {
                    format!("scenarios/{scenario}/scenario.yaml: timeline entry {at}: merge names no pr")
                })?;
                let by = argument.get("by").and_then(Value::as_str).unwrap_or("a person");
                steps.push(
                    Step::new(
                        format!(
                            "{by} merges pull request #{number} (as the Gitea admin) once branch protection allows it: Gitea answers 405 until addons-gate is green on its head"
                        ),
                        argv![
                            "curl",
                            "--fail",
                            "--silent",
                            "--show-error",
                            "--output",
                            "/dev/null",
                            "--user",
                            format!("{GITEA_ADMIN}:{GENERATED}"),
                            "--header",
                            "Content-Type: application/json",
                            "--data",
                            r#"{"Do":"merge"}"#,
                            gitea(&format!("pulls/{number}/merge")),
                        ],
                    )
                    .with_secrets(&[Secret::GiteaPassword])
                    .until(WAIT_SECONDS),
                );
            }
            other => steps.push(Step::note(format!(
                "not played on kind: timeline entry {at} `{other}` belongs to the ground (a seeded fault or a double's own state)"
            ))),
        }
    }
    let expect = &scenario_yaml["expect"];
    if let Some(promotions) = expect.get("promotions").and_then(Value::as_object) {
        for (stage, phase) in promotions {
            let phase = phase.as_str().unwrap_or_default();
            if !plain(stage, false) || !plain(phase, false) {
                bail!("scenarios/{scenario}/scenario.yaml: expect.promotions {stage:?}: {phase:?}");
            }
            steps.push(
                Step::new(
                    format!("expect: the Promotions to Stage {stage} are {phase}"),
                    kubectl(argv![
                        "wait",
                        "promotions",
                        "--namespace",
                        PROJECT,
                        "--selector",
                        format!("kargo.akuity.io/stage={stage}"),
                        format!("--for=jsonpath={{.status.phase}}={phase}"),
                        "--timeout",
                        "30s"
                    ]),
                )
                .until(WAIT_SECONDS),
            );
        }
    }
    for stage in expect
        .get("verified")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !plain(stage, false) {
            bail!("scenarios/{scenario}/scenario.yaml: expect.verified {stage:?}");
        }
        steps.push(
            Step::new(
                format!("expect: Stage {stage}'s current Freight is verified (its AnalysisRun asked Prometheus)"),
                kubectl(argv![
                    "wait",
                    "stage",
                    stage,
                    "--namespace",
                    PROJECT,
                    "--for=jsonpath={.status.freightHistory[0].verificationHistory[0].phase}=Successful",
                    "--timeout",
                    "30s"
                ]),
            )
            .until(WAIT_SECONDS),
        );
    }
    for number in expect
        .get("merged")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
    {
        steps.push(
            Step::new(
                format!("expect: pull request #{number} is merged (Gitea answers 204, else 404)"),
                argv![
                    "curl",
                    "--fail",
                    "--silent",
                    "--show-error",
                    "--output",
                    "/dev/null",
                    "--user",
                    format!("{GITEA_ADMIN}:{GENERATED}"),
                    gitea(&format!("pulls/{number}/merge")),
                ],
            )
            .with_secrets(&[Secret::GiteaPassword])
            .until(WAIT_SECONDS),
        );
    }
    if let Some(map) = expect.as_object() {
        for key in map.keys() {
            if !["promotions", "verified", "merged"].contains(&key.as_str()) {
                steps.push(Step::note(format!(
                    "checked on the ground only: expect.{key}"
                )));
            }
        }
    }
    Ok(steps)
}

/// A name a plan may put into a command: letters, digits, `.`, `_`, `-` (and one `/` for an
/// OWNER/NAME slug), nothing a shell or a URL would read otherwise.
fn plain(text: &str, slug: bool) -> bool {
    let parts: Vec<&str> = if slug {
        text.split('/').collect()
    } else {
        vec![text]
    };
    (!slug || parts.len() == 2)
        && parts.iter().all(|part| {
            !part.is_empty()
                && !part.starts_with(['.', '-'])
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

/// Every command of `cargo xtask kind down`.
pub fn plan_down() -> Vec<Step> {
    vec![Step::new(
        "delete the cluster and everything in it",
        argv!["kind", "delete", "cluster", "--name", CLUSTER],
    )]
}

/// One argument for a POSIX shell: as is when it is plainly safe, else single-quoted.
fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The dry-run text: for each step, `# <what>` then the shell-quoted command.
pub fn dry_run_text(steps: &[Step]) -> String {
    let mut text = String::new();
    for step in steps {
        match step.until {
            Some(seconds) => {
                let _ = writeln!(
                    text,
                    "# wait (again every 10 s, at most {}m): {}",
                    seconds / 60,
                    step.what
                );
            }
            None => {
                let _ = writeln!(text, "# {}", step.what);
            }
        }
        if !step.argv.is_empty() {
            let _ = writeln!(text, "{}", shell_line(&step.argv));
        }
    }
    text
}

/// Prints the plan (`dry_run`), or runs it from the project root, step by step, stopping at the
/// first failure with a message naming the step.
pub fn run(steps: &[Step], dry_run: bool) -> Result<()> {
    run_with(steps, dry_run, Credentials::Generate)
}

/// Where a run's secrets come from: made afresh (`up`), or the ones `up` wrote (`play`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    Generate,
    Existing,
}

pub fn run_with(steps: &[Step], dry_run: bool, credentials: Credentials) -> Result<()> {
    if dry_run {
        print!("{}", dry_run_text(steps));
        return Ok(());
    }
    let root = project_root();
    let captured: Vec<Secret> = steps.iter().filter_map(|s| s.captures).collect();
    let generated = steps
        .iter()
        .flat_map(|s| &s.secrets)
        .any(|secret| !captured.contains(secret))
        && credentials == Credentials::Generate;
    // Generated logins are written down only once the cluster exists: a run that stops
    // earlier (the cluster already exists) leaves the logins of the running cluster in place.
    let (mut values, mut logins) = match credentials {
        Credentials::Generate if generated => {
            let (values, logins) = generate()?;
            (values, Some(logins))
        }
        Credentials::Generate => (HashMap::new(), None),
        Credentials::Existing => (existing(&root)?, None),
    };
    let total = steps.len();
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        println!("# [{number}/{total}] {}", step.what);
        if step.argv.is_empty() {
            continue;
        }
        println!("{}", shell_line(&step.argv));
        let argv = fill(step, &values)
            .with_context(|| format!("step {number}/{total} ({})", step.what))?;
        if let Some(seconds) = step.until {
            wait_until(&root, &argv, seconds).with_context(|| {
                format!("step {number}/{total} ({}) did not come true", step.what)
            })?;
            continue;
        }
        let (status, stdout) = execute(&root, &argv, step.captures.is_some())
            .with_context(|| format!("step {number}/{total} ({}) could not start", step.what))?;
        if !status.success() {
            bail!(
                "step {number}/{total} failed: {} ({} ended with {status})",
                step.what,
                argv[0]
            );
        }
        if step.argv.get(..3) == Some(&argv!["kind", "create", "cluster"][..])
            && let Some(text) = logins.take()
        {
            write_credentials(&root, &text)?;
        }
        if let Some(secret) = step.captures {
            if stdout.is_empty() {
                bail!("step {number}/{total} ({}) printed nothing", step.what);
            }
            values.insert(secret, stdout);
        }
    }
    if let Some(text) = logins {
        // A plan without `kind create cluster` (none today) still keeps its logins.
        write_credentials(&root, &text)?;
    }
    if generated {
        println!(
            "kind: done. Logins: {}",
            relative(&root, &credentials_path(&root))
        );
    }
    Ok(())
}

/// The step's argv with its placeholders replaced by the secrets' values.
fn fill(step: &Step, values: &HashMap<Secret, String>) -> Result<Vec<String>> {
    let mut secrets = step.secrets.iter();
    let mut argv = Vec::with_capacity(step.argv.len());
    for arg in &step.argv {
        let mut filled = String::new();
        let mut rest = arg.as_str();
        while let Some(at) = rest.find(GENERATED) {
            filled.push_str(&rest[..at]);
            let secret = secrets
                .next()
                .context("the command has more placeholders than secrets")?;
            let value = values
                .get(secret)
                .with_context(|| format!("{secret:?} is not known yet"))?;
            filled.push_str(value);
            rest = &rest[at + GENERATED.len()..];
        }
        filled.push_str(rest);
        argv.push(filled);
    }
    if secrets.next().is_some() {
        bail!("the command has fewer placeholders than secrets");
    }
    Ok(argv)
}

/// Runs one command from `root`. Standard input is closed and git never prompts, so a step
/// fails instead of waiting; with `capture`, standard output is returned instead of shown.
fn execute(root: &Path, argv: &[String], capture: bool) -> Result<(ExitStatus, String)> {
    let (program, args) = argv.split_first().context("an empty command")?;
    let mut command = Process::new(program);
    command
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .env("GIT_TERMINAL_PROMPT", "0");
    if capture {
        let output = command.stderr(Stdio::inherit()).output()?;
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
        Ok((output.status, stdout))
    } else {
        Ok((command.status()?, String::new()))
    }
}

/// Runs a condition again every 10 s until it succeeds or `seconds` have passed (the real
/// systems' time: Kargo, Argo CD and Gitea act at their own pace; a plan never sleeps a fixed
/// time and hopes).
fn wait_until(root: &Path, argv: &[String], seconds: u64) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let (status, _) = execute(root, argv, true)?;
        if status.success() {
            return Ok(());
        }
        if start.elapsed().as_secs() >= seconds {
            bail!("still false after {}m", seconds / 60);
        }
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
}

/// Runs one command of `stage`, failing unless it succeeds.
fn execute_ok(root: &Path, argv: Vec<String>) -> Result<()> {
    let (status, _) = execute(root, &argv, false)
        .with_context(|| format!("could not start {}", shell_line(&argv)))?;
    if !status.success() {
        bail!("{} ended with {status}", shell_line(&argv));
    }
    Ok(())
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buffer = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buffer))
        .context("reading /dev/urandom")?;
    Ok(buffer.iter().map(|b| format!("{b:02x}")).collect())
}

fn credentials_path(root: &Path) -> PathBuf {
    root.join(STAGED).join("credentials")
}

/// The Gitea admin password `up` wrote to target/kind/credentials (what `play` pushes and
/// merges with).
fn existing(root: &Path) -> Result<HashMap<Secret, String>> {
    let path = credentials_path(root);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: no credentials; run `cargo xtask kind up` first",
            relative(root, &path)
        )
    })?;
    let password = text
        .lines()
        .find(|line| line.starts_with("Gitea "))
        .and_then(|line| line.rsplit_once("password "))
        .map(|(_, password)| password.trim().to_string())
        .filter(|password| !password.is_empty())
        .with_context(|| format!("{}: no Gitea password line", relative(root, &path)))?;
    Ok(HashMap::from([(Secret::GiteaPassword, password)]))
}

/// Writes the logins to target/kind/credentials (readable by the user only).
fn write_credentials(root: &Path, text: &str) -> Result<()> {
    let path = credentials_path(root);
    std::fs::create_dir_all(root.join(STAGED))?;
    let _ = std::fs::remove_file(&path);
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?
    };
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// Generates every secret a plan needs but the captured ones, and the text of the logins file.
/// The Kargo admin password is random; the chart gets its bcrypt hash (cost 10, as Kargo's docs
/// make it with `htpasswd -bnBC 10`).
fn generate() -> Result<(HashMap<Secret, String>, String)> {
    let kargo_password = random_hex(16)?;
    let gitea_password = random_hex(16)?;
    let hash = bcrypt::hash(&kargo_password, 10).context("hashing the Kargo admin password")?;
    let logins = format!(
        "# Logins of the kind cluster {CLUSTER}, written by `cargo xtask kind up`. Keep private.\n\
         Argo CD  http://127.0.0.1:31080  user admin, password: kubectl --context {CONTEXT} --namespace argocd get secret argocd-initial-admin-secret --output jsonpath='{{.data.password}}' | base64 -d\n\
         Kargo    http://127.0.0.1:31081  user admin, password {kargo_password}\n\
         Gitea    {GITEA_LOCAL}  user {GITEA_ADMIN}, password {gitea_password}\n"
    );
    let values = HashMap::from([
        (Secret::KargoPasswordHash, hash),
        (Secret::KargoTokenSigningKey, random_hex(32)?),
        (Secret::GiteaPassword, gitea_password),
        (Secret::BosunWebhook, random_hex(32)?),
    ]);
    Ok((values, logins))
}

/// `text` with the scenarios' forge and chart repository URLs pointed at Gitea.
fn rewrite(text: &str) -> String {
    URL_MAP
        .iter()
        .fold(text.to_string(), |text, (from, to)| text.replace(from, to))
}

/// The `name@version` entries of every `unpublished:` list of a scenario.yaml, block or flow
/// style (the charts that are not served until the scenario's timeline publishes them).
fn unpublished(scenario_yaml: &str) -> Vec<String> {
    let clean = |item: &str| {
        let item = item.split(" #").next().unwrap_or("").trim();
        item.trim_matches(['"', '\'']).to_string()
    };
    let mut found = Vec::new();
    let mut lines = scenario_yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix("unpublished:") else {
            continue;
        };
        let rest = rest.split(" #").next().unwrap_or("").trim();
        if let Some(flow) = rest.strip_prefix('[') {
            let flow = flow.trim_end().trim_end_matches(']');
            found.extend(flow.split(',').map(clean).filter(|s| !s.is_empty()));
            continue;
        }
        let indent = line.len() - trimmed.len();
        while let Some(&next) = lines.peek() {
            let item = next.trim_start();
            if item.is_empty() || item.starts_with('#') {
                lines.next();
                continue;
            }
            // A block sequence may sit at the key's own indentation.
            match item.strip_prefix("- ") {
                Some(entry) if next.len() - item.len() >= indent => {
                    found.push(clean(entry));
                    lines.next();
                }
                _ => break,
            }
        }
    }
    found
}

/// The charts of the mirror's served repository: (name, version, folder), sorted.
fn mirror_charts(mirror: &Path) -> Result<Vec<(String, String, PathBuf)>> {
    let repository = mirror.join(SERVED_CHART_REPOSITORY);
    let sorted_dirs = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut dirs = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                dirs.push(entry.path());
            }
        }
        dirs.sort();
        Ok(dirs)
    };
    let mut charts = Vec::new();
    for chart in sorted_dirs(&repository)? {
        for version in sorted_dirs(&chart)? {
            if version.join("Chart.yaml").is_file() {
                let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
                charts.push((
                    name(&chart).unwrap_or_default(),
                    name(&version).unwrap_or_default(),
                    version,
                ));
            }
        }
    }
    Ok(charts)
}

/// Copies a folder, rewriting every UTF-8 file with [`rewrite`]; `.git` is left out.
fn copy_rewritten(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    let mut entries = std::fs::read_dir(from)
        .with_context(|| format!("reading {}", from.display()))?
        .collect::<std::io::Result<Vec<_>>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name() == ".git" {
            continue;
        }
        let source = entry.path();
        let target = to.join(entry.file_name());
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            copy_rewritten(&source, &target)?;
        } else if file_type.is_file() {
            match String::from_utf8(std::fs::read(&source)?) {
                Ok(text) => std::fs::write(&target, rewrite(&text))?,
                Err(raw) => std::fs::write(&target, raw.into_bytes())?,
            }
        } else {
            bail!(
                "{}: neither a file nor a folder (symbolic links are not staged)",
                source.display()
            );
        }
    }
    Ok(())
}

/// `cargo xtask kind stage`: writes target/kind/<scenario>/ from scratch. Local files only;
/// nothing leaves the machine.
///
/// - `repo/`: the sample repository, URLs rewritten, committed on `main` (pushed to
///   platform/gitops);
/// - `charts/`: every chart of the mirror's `charts.example.test/stable` that the scenario does
///   not hold back as `unpublished`, packaged with `helm package`, with the `index.yaml` of
///   `helm repo index`, committed on `main` (pushed to platform/charts);
/// - `pipelines.yaml` (the scenario's charts/kargo-pipelines values) or `kargo.yaml` (its
///   hand-written Warehouses and Stages), URLs rewritten.
pub fn stage(root: &Path, scenario: &str) -> Result<()> {
    let scenario_dir = root.join("scenarios").join(scenario);
    let scenario_yaml = std::fs::read_to_string(scenario_dir.join("scenario.yaml"))
        .with_context(|| format!("no scenario {scenario} in {}", scenario_dir.display()))?;
    let source = kargo_source(&read_scenario(root, scenario)?, scenario)?;
    let kargo_path = scenario_dir.join(source.file());
    let kargo = std::fs::read_to_string(&kargo_path)
        .with_context(|| format!("reading {}", kargo_path.display()))?;
    let out = root.join(STAGED).join(scenario);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let repo = out.join("repo");
    copy_rewritten(&root.join(SAMPLE_REPO), &repo)?;
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join(source.staged_name()), rewrite(&kargo))?;

    let held_back = unpublished(&scenario_yaml);
    let charts = out.join("charts");
    std::fs::create_dir_all(&charts)?;
    let charts_arg = charts.display().to_string();
    let mut published = Vec::new();
    for (name, version, dir) in mirror_charts(&root.join(SAMPLE_CHARTS))? {
        let id = format!("{name}@{version}");
        if held_back.contains(&id) {
            continue;
        }
        execute_ok(
            root,
            argv![
                "helm",
                "package",
                dir.display().to_string(),
                "--destination",
                &charts_arg
            ],
        )?;
        published.push(id);
    }
    execute_ok(root, argv!["helm", "repo", "index", &charts_arg])?;

    for (dir, message) in [
        (&repo, format!("{scenario}: the sample repository")),
        (&charts, format!("{scenario}: {}", published.join(", "))),
    ] {
        let dir = dir.display().to_string();
        let git = |args: Vec<String>| {
            let mut argv = argv!["git", "-C", &dir];
            argv.extend(args);
            argv
        };
        execute_ok(
            root,
            git(argv!["init", "--quiet", "--initial-branch", "main"]),
        )?;
        execute_ok(root, git(argv!["add", "--all"]))?;
        execute_ok(
            root,
            git(argv![
                "-c",
                "user.name=gitops-loop",
                "-c",
                "user.email=kind@example.test",
                "commit",
                "--quiet",
                "--message",
                message
            ]),
        )?;
    }
    println!(
        "kind stage: {} (published: {}; held back: {})",
        relative(root, &out),
        published.join(", "),
        if held_back.is_empty() {
            "none".to_string()
        } else {
            held_back.join(", ")
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn happy() -> KargoSource {
        KargoSource::Pipelines("pipelines.yaml".into())
    }

    /// The real scenario files, read from this checkout.
    fn scenario(name: &str) -> serde_json::Value {
        read_scenario(&project_root(), name).expect("scenario")
    }

    #[test]
    fn plan_up_triage_dry_run() {
        let source = kargo_source(&scenario("triage"), "triage").unwrap();
        assert_eq!(source, KargoSource::Pipelines("pipelines.yaml".into()));
        let text = dry_run_text(&plan_up(Path::new("/work/gitops-loop"), "triage", &source));
        insta::assert_snapshot!(text);
    }

    #[test]
    fn plan_play_triage_dry_run() {
        let steps = plan_play(
            Path::new("/work/gitops-loop"),
            "triage",
            &scenario("triage"),
        )
        .unwrap();
        insta::assert_snapshot!(dry_run_text(&steps));
    }

    #[test]
    fn every_scenario_has_a_play_plan_and_says_what_it_skips() {
        let root = project_root();
        for entry in std::fs::read_dir(root.join("scenarios")).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().to_string();
            if !entry.path().join("scenario.yaml").exists() {
                continue;
            }
            let yaml = scenario(&name);
            kargo_source(&yaml, &name).unwrap();
            let steps = plan_play(Path::new("/r"), &name, &yaml).unwrap();
            let timeline = yaml["timeline"].as_array().map_or(0, Vec::len);
            assert!(
                timeline == 0 || steps.len() > 1,
                "{name}: the timeline was not planned"
            );
        }
    }

    #[test]
    fn hostile_scenario_values_do_not_reach_a_command() {
        let yaml = |timeline: serde_json::Value| serde_json::json!({"timeline": timeline});
        for bad in [
            serde_json::json!([{"publish": "x@1.0.0; rm -rf /"}]),
            serde_json::json!([{"publish": "../../etc@1"}]),
            serde_json::json!([{"refresh": "a b"}]),
            serde_json::json!([{"merge": {"by": "x"}}]),
            serde_json::json!([7]),
        ] {
            assert!(
                plan_play(Path::new("/r"), "s", &yaml(bad.clone())).is_err(),
                "{bad}"
            );
        }
        let slug = serde_json::json!({"repository": {"slug": "a/b/../c"}, "timeline": []});
        assert!(plan_play(Path::new("/r"), "s", &slug).is_err());
        for (kargo, ok) in [
            (serde_json::json!({"pipelines": "../../x.yaml"}), false),
            (serde_json::json!({"pipelines": "/etc/x.yaml"}), false),
            (serde_json::json!({"pipelines": "a/../../../x"}), false),
            (serde_json::json!({"pipelines": "a", "objects": "b"}), false),
            (serde_json::json!({"pipelines": "../sample/p.yaml"}), true),
        ] {
            let source = kargo_source(&serde_json::json!({ "kargo": kargo }), "s");
            assert_eq!(source.is_ok(), ok, "{kargo}");
        }
        assert!(read_scenario(Path::new("/r"), "../etc").is_err());
    }

    #[test]
    fn plan_up_dry_run() {
        let text = dry_run_text(&plan_up(
            Path::new("/work/gitops-loop"),
            "happy-path",
            &happy(),
        ));
        insta::assert_snapshot!(text);
    }

    #[test]
    fn plan_does_not_depend_on_the_root() {
        let here = plan_up(Path::new("/work/gitops-loop"), "happy-path", &happy());
        let there = plan_up(
            Path::new("/home/someone/src/gitops-loop"),
            "happy-path",
            &happy(),
        );
        assert_eq!(here, there);
        for step in &here {
            for arg in &step.argv {
                assert!(
                    !arg.starts_with('/') || arg == "/dev/null",
                    "{arg} in {step:?}"
                );
            }
        }
    }

    #[test]
    fn plan_down_deletes_the_cluster() {
        assert_eq!(
            dry_run_text(&plan_down()),
            "# delete the cluster and everything in it\nkind delete cluster --name gitops-loop\n"
        );
    }

    /// Every placeholder has its secret, and every secret is known before a step uses it:
    /// generated ones from the start, captured ones once the capturing step has run.
    #[test]
    fn secrets_fill_every_placeholder_in_order() {
        let mut values: HashMap<Secret, String> = HashMap::from([
            (Secret::KargoPasswordHash, "hash".to_string()),
            (Secret::KargoTokenSigningKey, "key".to_string()),
            (Secret::GiteaPassword, "pw".to_string()),
            (Secret::BosunWebhook, "hook".to_string()),
        ]);
        let steps = plan_up(Path::new("/r"), "happy-path", &happy());
        for step in &steps {
            let placeholders: usize = step.argv.iter().map(|a| a.matches(GENERATED).count()).sum();
            assert_eq!(placeholders, step.secrets.len(), "{}", step.what);
            let argv = fill(step, &values).expect("filled");
            assert!(argv.iter().all(|a| !a.contains(GENERATED)));
            if let Some(secret) = step.captures {
                values.insert(secret, "token".to_string());
            }
        }
        let kargo = steps
            .iter()
            .find(|s| s.what.starts_with("Kargo,"))
            .expect("kargo");
        let argv = fill(kargo, &values).expect("filled");
        assert!(argv.contains(&"api.adminAccount.passwordHash=hash".to_string()));
        assert!(argv.contains(&"api.adminAccount.tokenSigningKey=key".to_string()));
        let push = steps
            .iter()
            .find(|s| s.what == "push the staged sample repository")
            .expect("push");
        assert!(
            fill(push, &values)
                .expect("filled")
                .contains(&"http://gitops-admin:pw@127.0.0.1:31082/platform/gitops.git".into())
        );
    }

    #[test]
    fn a_secret_used_before_it_is_known_is_an_error() {
        let step = Step::new("x", argv!["echo", GENERATED]).with_secrets(&[Secret::GiteaToken]);
        assert!(fill(&step, &HashMap::new()).is_err());
        let step = Step::new("x", argv!["echo", GENERATED]);
        assert!(fill(&step, &HashMap::new()).is_err());
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("kind/cluster.yaml"), "kind/cluster.yaml");
        assert_eq!(quote("crds.enabled=true"), "crds.enabled=true");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("x=<generated>"), "'x=<generated>'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn rewrite_points_the_scenario_urls_at_gitea() {
        let text = "repoURL: https://git.example.test/platform/gitops.git\n\
                    chart: https://charts.example.test/stable\n\
                    oci: registry.example.test/charts\n";
        assert_eq!(
            rewrite(text),
            "repoURL: http://gitea-http.gitea.svc.cluster.local:3000/platform/gitops.git\n\
             chart: http://gitea-http.gitea.svc.cluster.local:3000/platform/charts/raw/branch/main\n\
             oci: registry.example.test/charts\n"
        );
        assert!(
            URL_MAP
                .iter()
                .all(|(_, to)| to.starts_with(GITEA_IN_CLUSTER)
                    || *to == BOSUN_IN_CLUSTER
                    || *to == PROMETHEUS_IN_CLUSTER)
        );
    }

    #[test]
    fn unpublished_reads_block_and_flow_lists() {
        let block = "charts:\n  repositories:\n    - url: https://charts.example.test/stable\n      unpublished:\n        - cert-manager-lite@1.19.3\n        # a comment\n        - \"reloader@1.2.0\"  # quoted\n    - url: https://other.example.test\n      unpublished: [a@1, 'b@2']\nkargo:\n  project: x\n";
        assert_eq!(
            unpublished(block),
            ["cert-manager-lite@1.19.3", "reloader@1.2.0", "a@1", "b@2"]
        );
        let same_indent = "unpublished:\n- a@1\n- b@2\nnext: 1\n";
        assert_eq!(unpublished(same_indent), ["a@1", "b@2"]);
        assert!(unpublished("unpublished: []\n").is_empty());
    }

    #[test]
    fn happy_path_holds_back_its_unpublished_charts() {
        let yaml =
            std::fs::read_to_string(project_root().join("scenarios/happy-path/scenario.yaml"))
                .expect("scenario");
        assert!(unpublished(&yaml).contains(&"cert-manager-lite@1.19.3".to_string()));
    }
}
