//! The plans of `up` and `down`, and the command builders they share with `play`.

use std::path::Path;

use super::scenario::{KargoSource, WorkloadCluster};
use super::{
    BINARIES, CLUSTER, CONTEXT, GENERATED, GITEA_ADMIN, GITEA_IN_CLUSTER, GITEA_LOCAL, IMAGE_TAG,
    NODE_KUBE_VERSION, PROJECT, STAGED, Secret, Step, relative,
};

pub(super) fn kubectl(args: Vec<String>) -> Vec<String> {
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

/// Every command of `cargo xtask kind up --scenario <scenario>`, in order. Pure: nothing is
/// read or run, and the result does not depend on `root`, which only anchors the paths.
pub fn plan_up(
    root: &Path,
    scenario: &str,
    source: &KargoSource,
    clusters: &[WorkloadCluster],
) -> Vec<Step> {
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
    ];
    for cluster in clusters {
        steps.push(Step::new(
            format!(
                "the scenario's cluster {}: a kind cluster of its own (one node, Kubernetes v1.33, no ports on the host), which Argo CD deploys to over the kind network",
                cluster.name
            ),
            argv![
                "kind",
                "create",
                "cluster",
                "--name",
                workload_name(&cluster.name),
                "--config",
                path("kind/workload-cluster.yaml"),
                "--wait",
                "5m",
            ],
        ));
    }
    if !clusters.is_empty() {
        steps.push(Step::new(
            "kubectl's current context back to the main cluster (kind switched it to the last one made)",
            argv!["kubectl", "config", "use-context", CONTEXT],
        ));
    }
    steps.extend([
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
            "Argo CD v3.5.1 (images) on chart 9.4.3 and its CRDs, before Kargo (which enables its Argo CD integration only if they exist); controller metrics on for Prometheus",
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
    ]);
    for (index, cluster) in clusters.iter().enumerate() {
        steps.extend(register_cluster(index, cluster));
    }
    steps.extend([
        Step::new(
            "Prometheus, scraping Argo CD's argocd_app_info: the pipelines chart's verification asks it",
            helm_install(
                "prometheus",
                "prometheus-community/prometheus",
                "monitoring",
                argv![
                    "--version",
                    "29.27.0",
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
    ]);

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
            "Argo CD's admin password (kept, not printed), to make the token of Bosun's account",
            kubectl(argv![
                "get",
                "secret",
                "argocd-initial-admin-secret",
                "--namespace",
                "argocd",
                "--output",
                "go-template={{.data.password | base64decode}}"
            ]),
        )
        .capturing(Secret::ArgocdAdminPassword),
        Step::new(
            "a token of the Argo CD account bosun (kind/values/argo-cd.yaml: apiKey only, and a role that may only get clusters), kept, not printed: Bosun's inventory is Argo CD's API (ADR 0008), so its chart holds no Kubernetes permission",
            kubectl(argv![
                "exec",
                "--namespace",
                "argocd",
                "deploy/argocd-server",
                "--",
                "sh",
                "-c",
                r#"argocd login localhost:8080 --plaintext --username admin --password "$1" >/dev/null && argocd account generate-token --account bosun --server localhost:8080 --plaintext"#,
                "sh",
                GENERATED
            ]),
        )
        .with_secrets(&[Secret::ArgocdAdminPassword])
        .capturing(Secret::ArgocdBosunToken),
        Step::new(
            "Bosun's Argo CD token",
            generic_secret("bosun-argocd", "bosun", &[("token", GENERATED)]),
        )
        .with_secrets(&[Secret::ArgocdBosunToken]),
        Step::new(
            "Bosun, from its chart, running the loaded image against Gitea (commit statuses: Gitea has no check runs), its inventory read from Argo CD's API, its egress opened to the in-cluster Gitea",
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
                    "--set",
                    "inventory.argocd.server=http://argocd-server.argocd.svc",
                    "--set-json",
                    r#"networkPolicy.extraEgress=[{"to":[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"gitea"}}}],"ports":[{"protocol":"TCP","port":3000}]}]"#,
                    "--set-json",
                    format!(
                        r#"config={{"forge":{{"kind":"gitea","apiUrl":"{GITEA_IN_CLUSTER}/api/v1","checkMode":"status","gitUrl":"http://{GITEA_ADMIN}:{{token}}@gitea-http.gitea.svc.cluster.local:3000/{{slug}}.git"}},"repositories":[{{"slug":"platform/gitops","url":"{GITEA_IN_CLUSTER}/platform/gitops.git"}}]}}"#
                    ),
                ],
            ),
        ),
        Step::new(
            "the bootstrap Application and ApplicationSets of the sample repository, as staged (before the Kargo objects: the first Freight's argocd-update names Applications they generate)",
            kubectl(argv!["apply", "--filename", staged_bootstrap]),
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
    ]);
    steps
}

/// Every command of `cargo xtask kind down`.
pub fn plan_down(clusters: &[WorkloadCluster]) -> Vec<Step> {
    let mut steps = vec![Step::new(
        "delete the cluster and everything in it",
        argv!["kind", "delete", "cluster", "--name", CLUSTER],
    )];
    for cluster in clusters {
        steps.push(Step::new(
            format!("delete the scenario's cluster {}", cluster.name),
            argv![
                "kind",
                "delete",
                "cluster",
                "--name",
                workload_name(&cluster.name)
            ],
        ));
    }
    steps
}

/// The kind cluster that stands for a scenario's cluster.
fn workload_name(cluster: &str) -> String {
    format!("{CLUSTER}-{cluster}")
}

/// Registers a workload cluster in Argo CD as `argocd cluster add` would: a ServiceAccount
/// with cluster-admin in the workload cluster, its token and the cluster's CA (both kept, not
/// printed) in an Argo CD cluster Secret whose server is the node's name on the kind network,
/// labelled and annotated as the scenario's inventory says (the clusters generator selects on
/// the Secret's own labels), plus the Kubernetes version the gate's live inventory reads.
fn register_cluster(index: usize, cluster: &WorkloadCluster) -> Vec<Step> {
    let name = &cluster.name;
    let kind_name = workload_name(name);
    let context = format!("kind-{kind_name}");
    let in_workload = |args: Vec<String>| {
        let mut argv = argv!["kubectl", "--context", &context];
        argv.extend(args);
        argv
    };
    let secret = format!("cluster-{name}");
    let mut label = argv![
        "label",
        "secret",
        &secret,
        "--namespace",
        "argocd",
        "argocd.argoproj.io/secret-type=cluster"
    ];
    label.extend(cluster.labels.iter().map(|(k, v)| format!("{k}={v}")));
    let mut annotate = argv![
        "annotate",
        "secret",
        &secret,
        "--namespace",
        "argocd",
        format!("gitops-gate.io/kube-version={NODE_KUBE_VERSION}")
    ];
    annotate.extend(cluster.annotations.iter().map(|(k, v)| format!("{k}={v}")));
    vec![
        Step::new(
            format!("cluster {name}: a ServiceAccount for Argo CD"),
            in_workload(argv![
                "create",
                "serviceaccount",
                "argocd-manager",
                "--namespace",
                "kube-system"
            ]),
        ),
        Step::new(
            format!("cluster {name}: Argo CD may manage everything in it"),
            in_workload(argv![
                "create",
                "clusterrolebinding",
                "argocd-manager",
                "--clusterrole",
                "cluster-admin",
                "--serviceaccount",
                "kube-system:argocd-manager"
            ]),
        ),
        Step::new(
            format!("cluster {name}: a token for that ServiceAccount (kept, not printed)"),
            in_workload(argv![
                "create",
                "token",
                "argocd-manager",
                "--namespace",
                "kube-system",
                "--duration",
                "8760h"
            ]),
        )
        .capturing(Secret::ClusterToken(index)),
        Step::new(
            format!("cluster {name}: its CA certificate, from kind's kubeconfig (kept, not printed)"),
            argv![
                "kubectl",
                "config",
                "view",
                "--raw",
                "--minify",
                "--context",
                &context,
                "--output",
                "jsonpath={.clusters[0].cluster.certificate-authority-data}"
            ],
        )
        .capturing(Secret::ClusterCa(index)),
        Step::new(
            format!(
                "cluster {name}: Argo CD's cluster Secret, the server being the node's name on the kind network"
            ),
            generic_secret(
                &secret,
                "argocd",
                &[
                    ("name", name),
                    ("server", &format!("https://{kind_name}-control-plane:6443")),
                    (
                        "config",
                        &format!(
                            r#"{{"bearerToken":"{GENERATED}","tlsClientConfig":{{"insecure":false,"caData":"{GENERATED}"}}}}"#
                        ),
                    ),
                ],
            ),
        )
        .with_secrets(&[Secret::ClusterToken(index), Secret::ClusterCa(index)]),
        Step::new(
            format!(
                "cluster {name}: a cluster for Argo CD, with the scenario's labels (what the clusters generators select on)"
            ),
            kubectl(label),
        ),
        Step::new(
            format!(
                "cluster {name}: the scenario's annotations, and the nodes' Kubernetes version for the gate's live inventory"
            ),
            kubectl(annotate),
        ),
    ]
}
