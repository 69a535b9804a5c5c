//! charts/kargo-pipelines, rendered with the real helm: the objects it renders, checked against
//! the ground's CRDs with the product's structural-schema code, every step config evaluated
//! with the ground's Kargo expressions and checked against Kargo's step schemas, the merge
//! policy agreeing with the gate's major-version boundary, and the values schema refusing a
//! malformed target with a clear message.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap what they set up themselves

mod common;

use ground::kargo::{expr, schemas};
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use std::path::PathBuf;

const CHART: &str = "kargo-pipelines";
const EXAMPLE: &str = "charts/kargo-pipelines/examples/addons.yaml";

fn example() -> PathBuf {
    common::project_root().join(EXAMPLE)
}

fn template(args: &[&str]) -> std::process::Output {
    let example = example();
    let mut all = vec!["-f", example.to_str().unwrap()];
    all.extend_from_slice(args);
    common::helm_template(CHART, "platform-addons", &all)
}

fn objects(args: &[&str]) -> Vec<Value> {
    common::rendered_objects(&template(args))
}

fn stage<'a>(objects: &'a [Value], name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == "Stage" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Stage {name}"))
}

#[test]
fn the_example_renders_as_snapshotted() {
    let output = template(&[]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    insta::assert_snapshot!(String::from_utf8_lossy(&output.stdout));
}

#[test]
fn the_readme_shows_the_example_values_verbatim() {
    let readme =
        std::fs::read_to_string(common::project_root().join("charts/kargo-pipelines/README.md"))
            .unwrap();
    let example = std::fs::read_to_string(example()).unwrap();
    assert!(
        readme.contains(example.trim()),
        "README.md and {EXAMPLE} differ"
    );
}

#[test]
fn every_rendered_object_fits_the_grounds_crds() {
    let crds = common::project_root().join("kind/crds");
    let mut schemas_by_kind = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&crds).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let crd: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let group = crd["spec"]["group"].as_str().unwrap().to_string();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
        schemas_by_kind.insert((group, kind), crd);
    }
    let rendered = objects(&[]);
    assert!(!rendered.is_empty());
    for object in &rendered {
        let (group, version) = object["apiVersion"]
            .as_str()
            .unwrap()
            .split_once('/')
            .unwrap();
        let kind = object["kind"].as_str().unwrap();
        let crd = schemas_by_kind
            .get(&(group.to_string(), kind.to_string()))
            .unwrap_or_else(|| panic!("the ground has no CRD for {group}/{kind}"));
        let schema = gitops_loop::schema::version_schema(crd, version).unwrap();
        let mut copy = object.clone();
        let outcome = gitops_loop::schema::prune_and_validate(&mut copy, schema);
        let name = &object["metadata"]["name"];
        assert!(
            outcome.pruned.is_empty(),
            "{kind} {name}: pruned {:?}",
            outcome.pruned
        );
        assert!(
            outcome.errors.is_empty(),
            "{kind} {name}: {:?}",
            outcome.errors
        );
        assert!(
            outcome.unevaluated.is_empty(),
            "{kind} {name}: {:?}",
            outcome.unevaluated
        );
    }
}

/// Plays a Stage's steps through the ground's expression evaluator with the outputs Kargo's
/// steps would give, checking every evaluated config against the step's schema. Returns the
/// aliases of the steps that would run.
fn play_steps(stage: &Value, from: &str, to: &str) -> Vec<String> {
    play_steps_with(
        stage,
        from,
        to,
        "https://charts.external-secrets.io",
        "external-secrets",
    )
}

fn play_steps_with(stage: &Value, from: &str, to: &str, repo: &str, name: &str) -> Vec<String> {
    let freight = json!({"charts": [
        {"repoURL": "https://charts.jetstack.io", "name": "cert-manager", "version": to},
        {"repoURL": repo, "name": name, "version": to}]});
    let secrets: Map<String, Value> = [("bosun".to_string(), json!({"token": "t"}))]
        .into_iter()
        .collect();
    let mut outputs = Map::new();
    let mut statuses: Vec<(String, String)> = Vec::new();
    let mut ran = Vec::new();
    let steps = stage["spec"]["promotionTemplate"]["spec"]["steps"]
        .as_array()
        .unwrap();
    for (i, step) in steps.iter().enumerate() {
        let uses = step["uses"].as_str().unwrap();
        let alias = step["as"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("step-{}", i + 1));
        let vars = Map::new();
        let scope = expr::Scope {
            ctx: json!({"project": "platform-addons", "stage": stage["metadata"]["name"]}),
            vars: &vars,
            outputs: &outputs,
            freight: &freight,
            secrets: &secrets,
            statuses: &statuses,
        };
        if let Some(condition) = step["if"].as_str() {
            match expr::evaluate_template(condition, &scope).unwrap() {
                Value::Bool(true) => {}
                Value::Bool(false) => {
                    statuses.push((alias, "Skipped".into()));
                    continue;
                }
                other => panic!("step {alias}: if: gave {other}, not a bool"),
            }
        }
        let config = expr::evaluate_value(&step["config"], &scope)
            .unwrap_or_else(|e| panic!("step {alias} ({uses}): {e}"));
        schemas::validate(uses, &config).unwrap_or_else(|e| panic!("step {alias}: {e}"));
        let output = match uses {
            "yaml-parse" => json!({"version": from}),
            "compose-output" => config.clone(),
            "yaml-update" => json!({"commitMessage": "Updated"}),
            "git-push" => json!({"branch": "kargo/promotion/x"}),
            "git-open-pr" => {
                json!({"pr": {"id": 7, "url": "https://github.com/example-org/gitops/pull/7"}})
            }
            _ => json!({}),
        };
        outputs.insert(alias.clone(), output);
        statuses.push((alias.clone(), "Succeeded".into()));
        ran.push(alias);
    }
    ran
}

#[test]
fn every_step_config_evaluates_to_what_kargos_step_schemas_accept() {
    let rendered = objects(&[]);
    // A trusted patch: merged by Kargo, Bosun not asked.
    let ran = play_steps(
        stage(&rendered, "cert-manager-staging"),
        "v1.19.3",
        "v1.19.4",
    );
    assert!(ran.contains(&"merge".to_string()), "{ran:?}");
    assert!(
        !ran.contains(&"bosun".to_string()) && !ran.contains(&"wait".to_string()),
        "{ran:?}"
    );
    // A trusted minor with autoMerge: patch waits for a person, and Bosun is told.
    let ran = play_steps(stage(&rendered, "cert-manager-prod"), "v1.19.4", "v1.20.0");
    assert!(
        ran.contains(&"bosun".to_string()) && ran.contains(&"wait".to_string()),
        "{ran:?}"
    );
    assert!(!ran.contains(&"merge".to_string()), "{ran:?}");
    // hold: always: even a patch waits.
    let ran = play_steps(
        stage(&rendered, "external-secrets-prod"),
        "0.10.0",
        "0.10.1",
    );
    assert!(
        ran.contains(&"wait".to_string()) && !ran.contains(&"merge".to_string()),
        "{ran:?}"
    );
}

#[test]
fn a_chain_takes_freight_from_the_stage_before_it_once_verified_there() {
    let rendered = objects(&[]);
    let staging = stage(&rendered, "cert-manager-staging");
    let prod = stage(&rendered, "cert-manager-prod");
    assert_eq!(
        staging["spec"]["requestedFreight"][0]["sources"],
        json!({"direct": true})
    );
    assert_eq!(
        prod["spec"]["requestedFreight"][0]["sources"],
        json!({"stages": ["cert-manager-staging"]})
    );
    assert_eq!(
        prod["spec"]["verification"],
        json!({"analysisTemplates": [{"name": "cert-manager-healthy"}],
            "args": [{"name": "applications", "value": "cert-manager-prod-eu|cert-manager-prod-us"},
                     {"name": "namespaces", "value": "argocd"},
                     {"name": "expected", "value": "2"}]})
    );
    let config = rendered
        .iter()
        .find(|o| o["kind"] == "ProjectConfig")
        .unwrap();
    let stages: Vec<&str> = config["spec"]["promotionPolicies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["stageSelector"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "cert-manager-staging",
            "cert-manager-prod",
            "external-secrets-prod"
        ]
    );
}

#[test]
fn malformed_values_are_refused_with_the_field_named() {
    for (args, expected) in [
        (vec!["--set", "targets[0].name=Cert_Manager"], "name"),
        (vec!["--set", "targets[0].hold=sometimes"], "hold"),
        (
            vec!["--set", "targets[0].chart.repoURL=file:///etc/passwd"],
            "repoURL",
        ),
        (
            vec!["--set", "targets[0].stages[0].file=/etc/passwd"],
            "file",
        ),
        (
            vec!["--set", "targets[0].stages[0].file=clusters/../../x.yaml"],
            "leaves the repository",
        ),
        (vec!["--set", "targets[1].name=cert-manager"], "used twice"),
        (
            vec!["--set", "targets[0].stages[0].applications=null"],
            "applications",
        ),
        (vec!["--set", "targets[0].surprise=1"], "surprise"),
        (
            vec![
                "--set",
                "targets[1].stages[0].stageName=cert-manager-staging",
            ],
            "used twice",
        ),
        (vec!["--set", "bosun.url=https://evil.example/x\"y"], "url"),
        (
            vec![
                "--set-string",
                "bosun.url=https://evil.example/?t=${{secret(`git`).password}}",
            ],
            "url",
        ),
        (
            vec!["--set-string", "targets[0].chart.repoURL=https://x/}}${{"],
            "repoURL",
        ),
        (
            vec![
                "--set",
                "targets[0].stages[1].applications[1].name=cert-manager-prod-eu",
            ],
            "are equal",
        ),
    ] {
        let output = template(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

fn hold_of(stage: &Value, from: &str, to: &str) -> bool {
    let ran = play_steps(stage, from, to);
    assert_ne!(
        ran.contains(&"merge".to_string()),
        ran.contains(&"wait".to_string())
    );
    ran.contains(&"wait".to_string())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The merge policy and the gate's `major-version-boundary` note follow one rule: with
    /// `autoMerge: minor`, a trusted target waits for a person exactly when the gate calls the
    /// bump a major boundary (0.x counts its minor as its major).
    #[test]
    fn the_merge_policy_holds_exactly_where_the_gate_sees_a_major_boundary(
        a in (0u64..3, 0u64..3, 0u64..3), b in (0u64..3, 0u64..3, 0u64..3), v in any::<bool>(),
    ) {
        static RENDERED: std::sync::LazyLock<Vec<Value>> = std::sync::LazyLock::new(|| {
            objects(&["--set", "targets[0].autoMerge=minor"])
        });
        let prefix = if v { "v" } else { "" };
        // A bare major (`0`, `v1`) as well as x.y.z.
        let from = if a.2 == 2 { format!("{prefix}{}", a.0) } else { format!("{prefix}{}.{}.{}", a.0, a.1, a.2) };
        let to = format!("{}.{}.{}", b.0, b.1, b.2);
        let hold = hold_of(stage(&RENDERED, "cert-manager-staging"), &from, &to);
        prop_assert_eq!(hold, gitops_loop::gate::rules::crosses_major(&from, &to), "{} -> {}", from, to);
    }
}

#[test]
fn an_oci_target_names_no_chart_in_its_warehouse_and_every_name_renders_as_a_string() {
    // [K pkg/subscription/chart.go]: an oci:// repoURL names the chart; a name beside it is
    // refused. YAML 1.1 would read `on` as a bool: every name is quoted.
    let rendered = objects(&[
        "--set",
        "targets[1].chart.repoURL=oci://ghcr.io/external-secrets/charts/external-secrets",
        "--set",
        "targets[1].name=on",
    ]);
    let warehouse = rendered
        .iter()
        .find(|o| o["kind"] == "Warehouse" && o["metadata"]["name"] == "on")
        .expect("the Warehouse is named the string \"on\"");
    assert!(
        warehouse["spec"]["subscriptions"][0]["chart"]
            .get("name")
            .is_none(),
        "{warehouse}"
    );
    let on_prod = stage(&rendered, "on-prod");
    let apps = &on_prod["spec"]["promotionTemplate"]["spec"]["steps"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["config"]["apps"];
    assert!(apps[0].get("sources").is_none(), "{apps}");
    let ran = play_steps_with(
        on_prod,
        "0.10.0",
        "0.10.1",
        "oci://ghcr.io/external-secrets/charts/external-secrets",
        "",
    );
    assert!(ran.contains(&"wait".to_string()), "{ran:?}");
    // A trusted oci target: the merge policy's expression finds the chart by its URL alone.
    let rendered = objects(&[
        "--set",
        "targets[0].chart.repoURL=oci://quay.io/jetstack/charts/cert-manager",
    ]);
    let ran = play_steps_with(
        stage(&rendered, "cert-manager-staging"),
        "v1.19.3",
        "v1.19.4",
        "oci://quay.io/jetstack/charts/cert-manager",
        "",
    );
    assert!(ran.contains(&"merge".to_string()), "{ran:?}");
}

/// Issue 31: a repository on GitLab. Every pull request step renders with Kargo's GitLab
/// provider, the configs still evaluate to what Kargo's step schemas accept, and the triage
/// hook carries the project's whole path and the merge request's iid (Kargo's GitLab provider
/// gives the iid as `pr.id`), subgroups included.
#[test]
fn a_gitlab_repository_renders_the_pull_request_steps_with_kargos_gitlab_provider() {
    let gitlab = |url: &str| {
        objects(&[
            "--set",
            "gitops.provider=gitlab",
            "--set",
            &format!("gitops.repoURL={url}"),
        ])
    };
    let rendered = gitlab("https://gitlab.example.com/platform/gitops.git");
    let prod = stage(&rendered, "external-secrets-prod");
    let steps = prod["spec"]["promotionTemplate"]["spec"]["steps"]
        .as_array()
        .unwrap();
    for uses in ["git-push", "git-open-pr", "git-wait-for-pr", "git-merge-pr"] {
        let step = steps.iter().find(|s| s["uses"] == uses).unwrap();
        assert_eq!(step["config"]["provider"], "gitlab", "{uses}");
    }
    insta::assert_yaml_snapshot!(
        "gitlab_pull_request_steps",
        steps
            .iter()
            .filter(|s| {
                let uses = s["uses"].as_str().unwrap_or("");
                uses.starts_with("git-") && uses.ends_with("-pr") || uses == "http"
            })
            .collect::<Vec<_>>()
    );
    let ran = play_steps(prod, "0.10.0", "0.10.1");
    assert!(
        ran.contains(&"bosun".to_string()) && ran.contains(&"wait".to_string()),
        "{ran:?}"
    );
    let hook = |rendered: &[Value]| {
        let steps =
            stage(rendered, "external-secrets-prod")["spec"]["promotionTemplate"]["spec"]["steps"]
                .as_array()
                .unwrap()
                .clone();
        let http = steps.iter().find(|s| s["as"] == "bosun").unwrap().clone();
        http["config"]["body"].as_str().unwrap().to_string()
    };
    let body = hook(&rendered);
    assert!(
        body.contains(r#""repository": "platform/gitops""#)
            && body.contains(r#""pullRequest": outputs['open-pr'].pr.id"#),
        "{body}"
    );
    // A project in a subgroup is named by its whole path, as GitLab and Kargo name it.
    let body = hook(&gitlab(
        "https://gitlab.example.com/platform/addons/gitops.git",
    ));
    assert!(
        body.contains(r#""repository": "platform/addons/gitops""#),
        "{body}"
    );
    // With no provider, Kargo takes a host holding "gitlab" for GitLab (its provider's
    // predicate), and so does the hook: the whole path, user info and port aside.
    for url in [
        "https://gitlab.example.com/platform/addons/gitops.git",
        "https://oauth2@gitlab.example.com:8443/platform/addons/gitops/",
    ] {
        let body = hook(&objects(&[
            "--set",
            "gitops.provider=",
            "--set",
            &format!("gitops.repoURL={url}"),
        ]));
        assert!(
            body.contains(r#""repository": "platform/addons/gitops""#),
            "{url}: {body}"
        );
    }
    // Elsewhere the last two segments, as before.
    let body = hook(&objects(&[
        "--set",
        "gitops.provider=",
        "--set",
        "gitops.repoURL=https://git.example.com/platform/addons/gitops.git",
    ]));
    assert!(body.contains(r#""repository": "addons/gitops""#), "{body}");
}

/// On GitLab the project's path is checked where it enters: a `repoURL` (or `repository`)
/// whose path is not a GitLab project path fails the render with one line naming the field.
#[test]
fn a_gitlab_repository_that_is_no_gitlab_project_path_is_refused() {
    let deepest = vec!["g"; 22].join("/");
    let too_deep = vec!["g"; 23].join("/");
    let url = |path: &str| format!("gitops.repoURL=https://gitlab.example.com/{path}.git");
    let accepted = template(&["--set", "gitops.provider=gitlab", "--set", &url(&deepest)]);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    for (set, field) in [
        (url("platform/../gitops"), "gitops.repoURL"),
        (url("gitops"), "gitops.repoURL"),
        (url("platform//gitops"), "gitops.repoURL"),
        (url("platform/%2e%2e/gitops"), "gitops.repoURL"),
        (url("platform/-gitops"), "gitops.repoURL"),
        (url(&too_deep), "gitops.repoURL"),
        (
            "gitops.repository=platform/team/../gitops".to_string(),
            "gitops.repository",
        ),
        (
            "gitops.repository=platform/gitops.git/x".to_string(),
            "gitops.repository",
        ),
    ] {
        let output = template(&["--set", "gitops.provider=gitlab", "--set-string", &set]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{set} was accepted");
        // One line says it (helm adds its own hint about --debug below).
        let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("Error:")).collect();
        assert!(
            said.len() == 1
                && said[0].contains(&format!("{field}: "))
                && said[0].contains("is not a GitLab project path"),
            "{set}: {stderr}"
        );
    }
}
