//! The plan of `play`: a scenario's timeline and expectations, driven and checked on the cluster.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::plan::kubectl;
use super::scenario::plain;
use super::{
    GENERATED, GITEA_ADMIN, GITEA_LOCAL, PROJECT, SERVED_CHART_REPOSITORY, STAGED, Secret, Step,
    WAIT_SECONDS, relative,
};

/// Every command and request of `cargo xtask kind play`: the scenario's timeline driven against
/// the cluster `up` made (publish a chart version into the in-cluster chart repository, ask a
/// Warehouse to look again, merge as a person once branch protection allows it), then its
/// expectations checked against the real Kargo and Gitea, each a condition waited on with a
/// timeout. What only the ground can do (a seeded fault, a double's state) is said, not played.
pub fn plan_play(
    root: &Path,
    scenario: &str,
    scenario_yaml: &Value,
    stage_charts: &BTreeMap<String, String>,
) -> Result<Vec<Step>> {
    let slug = scenario_yaml
        .pointer("/repository/slug")
        .and_then(Value::as_str)
        .unwrap_or("platform/gitops");
    if !plain(slug, true) {
        bail!("scenarios/{scenario}/scenario.yaml: repository.slug {slug:?} is not OWNER/NAME");
    }
    let mut steps = vec![Step::new(
        format!("the cluster `cargo xtask kind up --scenario {scenario}` made answers"),
        kubectl(argv!["get", "namespace", PROJECT]),
    )];
    let published = timeline_steps(root, scenario, slug, scenario_yaml, &mut steps)?;
    expectation_steps(
        scenario,
        slug,
        &scenario_yaml["expect"],
        stage_charts,
        &published,
        &mut steps,
    )?;
    Ok(steps)
}

/// A Gitea API address of the scenario's repository.
fn gitea_api(slug: &str, tail: &str) -> String {
    format!("{GITEA_LOCAL}/api/v1/repos/{slug}/{tail}")
}

/// The steps of the scenario's timeline: a chart version published into the in-cluster chart
/// repository, a Warehouse asked to look again, a merge as a person once branch protection
/// allows it; what only the ground can do is said, not played. Returns the version each chart
/// was last published at.
fn timeline_steps(
    root: &Path,
    scenario: &str,
    slug: &str,
    scenario_yaml: &Value,
    steps: &mut Vec<Step>,
) -> Result<BTreeMap<String, String>> {
    let path = |p: &str| relative(root, &root.join(p));
    let staged_charts = relative(root, &root.join(STAGED).join(scenario).join("charts"));
    let gitea = |tail: &str| gitea_api(slug, tail);
    let push_url = {
        let host = GITEA_LOCAL.trim_start_matches("http://");
        format!("http://{GITEA_ADMIN}:{GENERATED}@{host}/platform/charts.git")
    };
    let timeline = scenario_yaml
        .get("timeline")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // The version each chart was last published at: a Stage promoting that chart has not
    // caught up until its last Promotion carries it.
    let mut published: BTreeMap<String, String> = Default::default();
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
                published.insert(name.to_string(), version.to_string());
                let chart = path(&format!(
                    "{STAGED}/{scenario}/mirror/{SERVED_CHART_REPOSITORY}/{name}/{version}"
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
    Ok(published)
}

/// The scenario's expectations, each a condition waited on with a timeout against the real
/// Kargo and Gitea: Promotions' phases (and the versions the timeline published), verified
/// Freight, merged pull requests; the others are the ground's.
fn expectation_steps(
    scenario: &str,
    slug: &str,
    expect: &Value,
    stage_charts: &BTreeMap<String, String>,
    published: &BTreeMap<String, String>,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let gitea = |tail: &str| gitea_api(slug, tail);
    if let Some(promotions) = expect.get("promotions").and_then(Value::as_object) {
        for (stage, phase) in promotions {
            let phase = phase.as_str().unwrap_or_default();
            if !plain(stage, false) || !plain(phase, false) {
                bail!("scenarios/{scenario}/scenario.yaml: expect.promotions {stage:?}: {phase:?}");
            }
            if let Some((chart, version)) = stage_charts
                .get(stage)
                .and_then(|chart| Some((chart, published.get(chart)?)))
            {
                steps.push(
                    Step::new(
                        format!(
                            "expect: Stage {stage}'s last finished Promotion carries {chart} {version}, the version the timeline published (an earlier Freight's Promotion does not count)"
                        ),
                        kubectl(argv![
                            "wait",
                            "stage",
                            stage,
                            "--namespace",
                            PROJECT,
                            format!(
                                "--for=jsonpath={{.status.lastPromotion.freight.charts[0].version}}={version}"
                            ),
                            "--timeout",
                            "30s"
                        ]),
                    )
                    .until(WAIT_SECONDS),
                );
            }
            steps.push(
                Step::new(
                    format!("expect: Stage {stage}'s last finished Promotion is {phase} (as the ground checks)"),
                    kubectl(argv![
                        "wait",
                        "stage",
                        stage,
                        "--namespace",
                        PROJECT,
                        format!("--for=jsonpath={{.status.lastPromotion.status.phase}}={phase}"),
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
    Ok(())
}
