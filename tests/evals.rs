//! Scores the recorded incidents in evals/ (see evals/README.md): gate verdict, Bosun's path,
//! and for a swap the exact files it would rewrite, each checked through the same code a triage
//! runs. Prints a score table; anything below 100% fails.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::collections::BTreeMap;

use gitops_loop::bosun::applier::{self, Policy};
use gitops_loop::bosun::classify::{self, Route, Situation};
use gitops_loop::bosun::swap;
use gitops_loop::gate::{check, report};
use gitops_loop::render::{self, RenderConfig};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[allow(dead_code)]
    description: String,
    expect: Expect,
}

#[derive(Deserialize, PartialEq, Debug)]
#[serde(deny_unknown_fields)]
struct Expect {
    outcome: String,
    path: String,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    mentions: Option<String>,
}

fn config(repo: &std::path::Path, cache: &std::path::Path) -> RenderConfig {
    common::sample_render_config(repo, cache)
}

/// (outcome, path, files, text) as a triage would leave them.
fn score(dir: &std::path::Path, cache: &std::path::Path) -> Expect {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    if dir.join("base").is_dir() {
        repo.commit_overlay(&dir.join("base"), "main", "base");
    }
    repo.commit_overlay(&dir.join("head"), "pr", "the pull request");
    let config = config(repo.path(), cache);
    let result = check::check(
        &config,
        &check::Revisions {
            base: None,
            head: "pr".into(),
            target: Some("main".into()),
        },
    );
    // Bosun reads the report as published, not the in-memory result.
    let (markdown, _) = report::render(&result);
    let parsed = report::parse(&markdown).unwrap();
    let outcome = serde_json::to_value(parsed.verdict.outcome)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    let situation = Situation {
        report: Some(&parsed),
        head_sha: &parsed.verdict.head,
        fork: false,
        attempts: 0,
        attempt_cap: 2,
    };
    let (path, files, text) = match classify::classify(&situation) {
        Route::Wait(why) => ("wait", vec![], why),
        Route::Green => ("green", vec![], String::new()),
        Route::WorthALook(reasons) => ("worth-a-look", vec![], reasons.join(", and ")),
        Route::Escalate(line) => ("escalate", vec![], line),
        Route::Handoff(h) => (
            "handoff",
            vec![],
            format!("{} {} {}", h.open, h.choice, h.fact),
        ),
        // Without a model: the mechanical fix's plan and the handoff it gives.
        Route::Fix(not_served) => {
            use gitops_loop::bosun::repair;
            let text = |h: &gitops_loop::bosun::classify::Handoff| {
                format!("{} {} {}", h.open, h.choice, h.fact)
            };
            match repair::fix_plan(&config, "pr", &parsed.verdict.base, &not_served, &markdown) {
                Ok((fix, _)) => match gitops_loop::bosun::scalar_fix::decide(&fix, false, None) {
                    gitops_loop::bosun::scalar_fix::Step::Done(Err((h, _))) => {
                        ("handoff", vec![], text(&h))
                    }
                    _ => ("fix", vec![], String::new()),
                },
                Err((h, _)) => ("handoff", vec![], text(&h)),
            }
        }
        // Without a model, as the evals run: the migration's precheck and plan, then the
        // handoff `migration::decide` gives (a model's replies are scored by migration_evals).
        Route::Migrate(_) => {
            use gitops_loop::bosun::{migration, repair};
            let text = |h: &gitops_loop::bosun::classify::Handoff| {
                format!("{} {} {}", h.open, h.choice, h.fact)
            };
            match repair::migration_plan(&config, "pr", &parsed.verdict.base) {
                Ok(Some(migrations)) => {
                    match migration::decide(&migrations, false, &[], &|_| Ok(())) {
                        migration::Step::Done(Err((h, _))) => ("handoff", vec![], text(&h)),
                        _ => ("migrate", vec![], String::new()),
                    }
                }
                Ok(None) => ("wait", vec![], "the head renders".into()),
                Err((h, _)) => ("handoff", vec![], text(&h)),
            }
        }
        Route::Swap(dropped) => {
            let plan = swap::plan(&dropped);
            let policy = Policy::new(
                &[".github/**".into()],
                &["**/*.yaml".into(), "**/*.yml".into()],
                None,
            )
            .unwrap();
            match applier::prepare(repo.path(), &policy, &plan) {
                Err(refusals) => (
                    "handoff",
                    vec![],
                    refusals
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                Ok(rewrites) => {
                    let rendering = render::render(&config, "pr").unwrap();
                    let losses = gitops_loop::bosun::reshape::reshape_losses(
                        &rewrites, &plan, &dropped, &rendering,
                    );
                    if losses.is_empty() {
                        (
                            "swap",
                            rewrites.iter().map(|r| r.path.clone()).collect(),
                            String::new(),
                        )
                    } else {
                        (
                            "handoff",
                            vec![],
                            losses
                                .iter()
                                .map(|(d, l)| format!("{d}: {l}"))
                                .collect::<Vec<_>>()
                                .join("; "),
                        )
                    }
                }
            }
        }
    };
    Expect {
        outcome,
        path: path.into(),
        files,
        mentions: Some(text),
    }
}

#[test]
fn evals() {
    let root = common::project_root().join("evals");
    let cache = tempfile::tempdir().unwrap();
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("case.yaml").is_file())
        .map(|e| e.path())
        .collect();
    cases.sort();
    let mut results: BTreeMap<String, Result<(), String>> = BTreeMap::new();
    for dir in &cases {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let case: Case =
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
                .unwrap();
        let got = score(dir, cache.path());
        let want = case.expect;
        let mut misses = Vec::new();
        if got.outcome != want.outcome {
            misses.push(format!("outcome {} (want {})", got.outcome, want.outcome));
        }
        if got.path != want.path {
            misses.push(format!("path {} (want {})", got.path, want.path));
        }
        if got.files != want.files {
            misses.push(format!("files {:?} (want {:?})", got.files, want.files));
        }
        let text = got.mentions.unwrap_or_default();
        if let Some(wanted) = &want.mentions
            && !text.contains(wanted.as_str())
        {
            misses.push(format!("text {text:?} lacks {wanted:?}"));
        }
        results.insert(
            name,
            if misses.is_empty() {
                Ok(())
            } else {
                Err(misses.join("; "))
            },
        );
    }
    let passed = results.values().filter(|r| r.is_ok()).count();
    println!("evals: {passed}/{} passed", results.len());
    for (name, result) in &results {
        match result {
            Ok(()) => println!("  pass  {name}"),
            Err(why) => println!("  FAIL  {name}: {why}"),
        }
    }
    assert_eq!(passed, results.len(), "evals below 100%: {results:#?}");
    assert!(results.len() >= 7, "evals went missing");
}

/// A repair plan holding one document as the swap left it (at `version`), with the CRD on a
/// cluster: what `repair::decide` needs to judge a reshape reply for it.
fn plan_for(
    text: &str,
    original: &serde_json::Value,
    crd: &serde_json::Value,
    from: &str,
    version: &str,
) -> (
    gitops_loop::bosun::repair::Planned,
    Vec<gitops_loop::gate::rules::DroppedServedVersion>,
) {
    use gitops_loop::bosun::{applier::Rewrite, reshape};
    use gitops_loop::gate::rules::{Consumer, DroppedServedVersion};
    let api_version = original["apiVersion"].as_str().unwrap();
    let group = api_version.split('/').next().unwrap().to_string();
    let kind = original["kind"].as_str().unwrap().to_string();
    let text_of = |k: &str| original["metadata"][k].as_str().unwrap_or("").to_string();
    let dropped = vec![DroppedServedVersion {
        crd: "eval".into(),
        group: group.clone(),
        kind: kind.clone(),
        dropped: vec![from.to_string()],
        served: vec![version.to_string()],
        storage: version.to_string(),
        clusters: vec!["prod".into()],
        consumers: vec![Consumer {
            path: "document.yaml".into(),
            document: 0,
            api_version: format!("{group}/{from}"),
            kind,
            namespace: text_of("namespace"),
            name: text_of("name"),
            template: false,
        }],
    }];
    let plan = gitops_loop::bosun::swap::plan(&dropped);
    let rewrites = vec![Rewrite {
        path: "document.yaml".into(),
        before: text.replace(api_version, &format!("{group}/{from}")),
        after: text.to_string(),
    }];
    let rendering = ground::bench::one_cluster_rendering([crd.clone()]);
    let lossy = reshape::lossy_documents(&rewrites, &plan, &dropped, &rendering);
    assert_eq!(
        lossy.len(),
        1,
        "the case's document loses values under the destination"
    );
    (
        gitops_loop::bosun::repair::Planned {
            plan,
            rendering,
            rewrites,
            lossy,
            redaction: Default::default(),
        },
        dropped,
    )
}

/// The score of a model path's evals: one row per reply, the failures, the unsafe acceptances
/// (a refusal expected, an acceptance got), and which replies need which rule.
/// The case folders under an evals folder, in name order.
fn case_dirs(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    dirs
}

#[derive(Default)]
struct Scoreboard {
    rows: Vec<String>,
    failures: Vec<String>,
    unsafe_acceptances: usize,
    needed: BTreeMap<String, Vec<String>>,
}

impl Scoreboard {
    /// `reply` is accepted when `rule` alone is switched off: the rule is needed.
    fn need(&mut self, rule: &str, reply: &str) {
        self.needed
            .entry(rule.to_string())
            .or_default()
            .push(reply.to_string());
    }

    /// One reply's outcome against its expectation (`accept`, or a refusal by `rule`).
    fn record(
        &mut self,
        case: &str,
        reply: &str,
        expect: &str,
        rule: &Option<String>,
        got: Result<(), String>,
    ) {
        let expected = match (expect, rule) {
            ("accept", _) => Ok(()),
            (_, Some(rule)) => Err(rule.clone()),
            _ => panic!("{reply}: a refusal names its rule"),
        };
        if got.is_ok() && expected.is_err() {
            self.unsafe_acceptances += 1;
        }
        let shown = |r: &Result<(), String>| match r {
            Ok(()) => "accept".to_string(),
            Err(rule) => format!("refuse ({rule})"),
        };
        if got != expected {
            self.failures.push(format!(
                "{case} / {reply}: expected {}, got {}",
                shown(&expected),
                shown(&got)
            ));
        }
        self.rows.push(format!(
            "| {case} | {reply} | {} | {} |",
            shown(&expected),
            shown(&got)
        ));
    }

    /// Prints the table and the score, and holds the threshold: every reply as expected, no
    /// unsafe acceptance, every rule in `rules` needed by some reply.
    fn finish(self, rules: &[&str]) {
        println!("| case | reply | expected | got |\n|---|---|---|---|");
        for row in &self.rows {
            println!("{row}");
        }
        println!(
            "score: {}/{} as expected, {} unsafe acceptances",
            self.rows.len() - self.failures.len(),
            self.rows.len(),
            self.unsafe_acceptances
        );
        for rule in rules {
            println!(
                "rule {rule} needed by: {}",
                self.needed
                    .get(*rule)
                    .map(|v| v.join(", "))
                    .unwrap_or_default()
            );
        }
        assert_eq!(self.unsafe_acceptances, 0, "unsafe acceptances");
        assert!(self.failures.is_empty(), "{}", self.failures.join("\n"));
        for rule in rules {
            assert!(
                self.needed.contains_key(*rule),
                "no reply needs rule {rule}: removing it would fail nothing"
            );
        }
    }
}

/// The reshape's harness on recorded replies (evals/reshape/*/case.yaml): good, subtly wrong
/// and hostile. Each reply goes through what Bosun runs on a model's reply body: the reply
/// limits (`model::parse_reply`), then `reshape::check_proposal`. Prints a table; the
/// threshold is every reply as expected and no unsafe acceptance, and each harness rule must
/// be needed: some reply is accepted when only that rule is switched off.
#[test]
fn reshape_evals() {
    use gitops_loop::bosun::reshape::{self, rule};
    use gitops_loop::model;
    use serde_json::{Value, json};

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ReshapeCase {
        #[allow(dead_code)]
        description: String,
        original: String,
        crd: String,
        /// The version the document leaves (the CRD lists it, perhaps no longer served).
        from: String,
        version: String,
        /// Strings the request must never carry (canary credentials in the document).
        #[serde(default)]
        never: Vec<String>,
        good: Value,
        replies: Vec<ReplyCase>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ReplyCase {
        name: String,
        #[serde(default)]
        set: BTreeMap<String, Value>,
        #[serde(default)]
        remove: Vec<String>,
        #[serde(default)]
        reply: Option<Value>,
        #[serde(default)]
        reply_extra: Option<serde_json::Map<String, Value>>,
        #[serde(default)]
        raw: Option<String>,
        #[serde(default)]
        generate: Option<String>,
        expect: String,
        #[serde(default)]
        rule: Option<String>,
    }
    fn set_at(target: &mut Value, pointer: &str, value: Value) {
        let (parent, last) = pointer.rsplit_once('/').unwrap();
        let parent = target.pointer_mut(parent).unwrap();
        match parent {
            Value::Array(items) => {
                let index: usize = last.parse().unwrap();
                if index == items.len() {
                    items.push(value);
                } else {
                    items[index] = value;
                }
            }
            Value::Object(map) => {
                map.insert(last.to_string(), value);
            }
            _ => panic!("{pointer}: not a container"),
        }
    }

    let root = common::project_root().join("evals/reshape");
    let mut board = Scoreboard::default();
    let rules = [
        rule::SHAPE,
        rule::IDENTITY,
        rule::SCHEMA,
        rule::KEPT,
        rule::ACCOUNTED,
    ];
    let dirs = case_dirs(&root);
    for dir in dirs {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let case: ReshapeCase = serde_saphyr::from_str(&read("case.yaml")).unwrap();
        let original: Value = serde_saphyr::from_str(&read(&case.original)).unwrap();
        let crd: Value = serde_saphyr::from_str(&read(&case.crd)).unwrap();
        let case_name = dir.file_name().unwrap().to_string_lossy().to_string();
        // The case as a triage would meet it: the swap left the document at the destination
        // version, and Bosun's repair decision (`repair::decide`, what triage and `bosun
        // repair` run) judges each reply.
        let planned_case = plan_for(
            &read(&case.original),
            &original,
            &crd,
            &case.from,
            &case.version,
        );
        // What the model is sent: none of the case's canaries, in the prompt Bosun builds.
        let gitops_loop::bosun::repair::Step::Ask(requests) =
            gitops_loop::bosun::repair::decide(&planned_case.0, &planned_case.1, true, &[])
        else {
            panic!("{case_name}: the repair asks no model");
        };
        for canary in &case.never {
            for request in &requests {
                assert!(
                    !request.prompt.contains(canary.as_str())
                        && !request.system.contains(canary.as_str()),
                    "{case_name}: the request carries the canary {canary:?}"
                );
            }
        }
        let schema = gitops_loop::schema::version_schema(&crd, &case.version).unwrap();
        let (_, held) = reshape::prompt(
            &original,
            schema,
            gitops_loop::schema::version_schema(&crd, &case.from),
            &reshape::losses(&original, &crd, &case.version),
            &Default::default(),
        );
        for reply in &case.replies {
            let mut document = case.good.clone();
            for (pointer, value) in &reply.set {
                set_at(&mut document, pointer, value.clone());
            }
            for pointer in &reply.remove {
                let (parent, last) = pointer.rsplit_once('/').unwrap();
                document
                    .pointer_mut(parent)
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove(last);
            }
            let mut whole = reply.reply.clone().unwrap_or(json!({"document": document}));
            if let Some(extra) = &reply.reply_extra {
                whole.as_object_mut().unwrap().extend(extra.clone());
            }
            let bytes: Vec<u8> = match (&reply.raw, reply.generate.as_deref()) {
                (Some(raw), _) => raw.clone().into_bytes(),
                (None, Some("ten-megabyte-string")) => {
                    let mut big = whole.clone();
                    big["document"]["spec"]["target"]["name"] = "x".repeat(10 << 20).into();
                    serde_json::to_vec(&big).unwrap()
                }
                (None, Some("deep-nesting")) => {
                    format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()
                }
                (None, Some("padded-good")) => {
                    let mut text = serde_json::to_vec(&whole).unwrap();
                    text.extend(std::iter::repeat_n(b' ', model::MAX_REPLY_BYTES));
                    text
                }
                (None, Some(other)) => panic!("unknown generator {other}"),
                (None, None) => serde_json::to_vec(&whole).unwrap(),
            };
            let (planned, dropped) = &planned_case;
            let reply_result = model::parse_reply(&bytes).map(|value| model::Reply {
                value,
                usage: Default::default(),
            });
            let client_refused = reply_result.is_err();
            let got =
                match gitops_loop::bosun::repair::decide(planned, dropped, true, &[reply_result]) {
                    gitops_loop::bosun::repair::Step::Done(Ok(_)) => Ok(()),
                    gitops_loop::bosun::repair::Step::Done(Err((handoff, details))) => {
                        // What a person reads names a held value, never shows it.
                        for canary in &case.never {
                            assert!(
                                !handoff.fact.contains(canary.as_str())
                                    && details.iter().all(|d| !d.contains(canary.as_str())),
                                "{case_name} / {}: the handoff shows the canary {canary:?}",
                                reply.name
                            );
                        }
                        Err(if client_refused {
                            "reply-limits".to_string()
                        } else {
                            handoff
                                .fact
                                .split("(rule ")
                                .nth(1)
                                .and_then(|rest| rest.split(')').next())
                                .unwrap_or("?")
                                .to_string()
                        })
                    }
                    gitops_loop::bosun::repair::Step::Ask(_) => Err("asked again".to_string()),
                };
            // Which rules this reply needs: switched off alone, the reply is accepted.
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                for rule in rules {
                    if got.as_ref().err().map(String::as_str) == Some(rule)
                        && reshape::check_proposal_without(
                            &original,
                            &held.restore(&value),
                            &crd,
                            &case.from,
                            &case.version,
                            &[rule],
                        )
                        .is_ok()
                    {
                        board.need(rule, &reply.name);
                    }
                }
                if got == Err("reply-limits".to_string())
                    && reshape::check_proposal(
                        &original,
                        &held.restore(&value),
                        &crd,
                        &case.from,
                        &case.version,
                    )
                    .is_ok()
                {
                    board.need("reply-limits", &reply.name);
                }
            }
            board.record(&case_name, &reply.name, &reply.expect, &reply.rule, got);
        }
    }
    let all: Vec<&str> = rules.iter().copied().chain(["reply-limits"]).collect();
    board.finish(&all);
}

/// Each reshape case's original document sent to `config`'s provider through Bosun's own
/// client and prompt, the reply scored by the harness: one table row per case.
fn live_rows(config: &gitops_loop::bosun::config::ModelConfig, key: Option<String>) -> Vec<String> {
    use gitops_loop::bosun::reshape;
    use gitops_loop::model::{self, Request};
    use serde_json::Value;

    let client = match key {
        Some(key) => model::with_key(config, Some(key)),
        None => model::from_config(config),
    }
    .expect("model configuration")
    .expect("a provider");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = common::project_root().join("evals/reshape");
    let dirs = case_dirs(&root);
    let mut rows = Vec::new();
    for dir in dirs {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let case: Value = serde_saphyr::from_str(&read("case.yaml")).unwrap();
        let original: Value =
            serde_saphyr::from_str(&read(case["original"].as_str().unwrap())).unwrap();
        let crd: Value = serde_saphyr::from_str(&read(case["crd"].as_str().unwrap())).unwrap();
        let version = case["version"].as_str().unwrap();
        let from = case["from"].as_str().unwrap();
        let schema = gitops_loop::schema::version_schema(&crd, version).unwrap();
        let losses = reshape::losses(&original, &crd, version);
        let (prompt, held) = reshape::prompt(
            &original,
            schema,
            gitops_loop::schema::version_schema(&crd, from),
            &losses,
            &Default::default(),
        );
        let request = Request {
            purpose: "reshape".into(),
            subject: dir.display().to_string(),
            system: reshape::SYSTEM.into(),
            prompt,
            schema: reshape::reply_schema(),
        };
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let row = match runtime.block_on(client.call(&request)) {
            Ok(reply) => {
                let restored = held.restore(&reply.value);
                let got = match reshape::check_proposal(&original, &restored, &crd, from, version) {
                    Ok(accepted) => format!(
                        "accept ({} moved, {} dropped)",
                        accepted.moved.len(),
                        accepted.dropped.len()
                    ),
                    Err(refused) => format!("refuse ({}: {})", refused.rule, refused.detail),
                };
                format!(
                    "| {name} | {got} | {} / {} |",
                    reply.usage.input_tokens, reply.usage.output_tokens
                )
            }
            Err(model::Refusal::Transport(e)) => panic!("{name}: {e}"),
            Err(refusal) => format!("| {name} | refused by the client: {refusal} | - |"),
        };
        println!("{row}");
        rows.push(row);
    }
    rows
}

/// The reshape cases against a real model (`cargo xtask evals --live`; never in CI). Prints
/// the table; a refusal is a result, not a failure (the harness holds either way), but a
/// transport error fails loudly.
#[test]
#[ignore = "calls a real model provider: cargo xtask evals --live"]
fn reshape_evals_live() {
    use gitops_loop::bosun::config::{ModelConfig, ModelProvider};
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let provider = match env("BOSUN_LIVE_PROVIDER").as_deref() {
        Some("anthropic") => ModelProvider::Anthropic,
        Some("openai") => ModelProvider::Openai,
        other => panic!("set BOSUN_LIVE_PROVIDER to anthropic or openai (got {other:?})"),
    };
    println!("| case | got | tokens in / out |\n|---|---|---|");
    live_rows(
        &ModelConfig {
            provider,
            base_url: env("BOSUN_LIVE_BASE_URL"),
            model: Some(env("BOSUN_LIVE_MODEL").expect("set BOSUN_LIVE_MODEL")),
            api_key_env: env("BOSUN_LIVE_KEY_ENV"),
            ..ModelConfig::default()
        },
        None,
    );
}

/// The live runner, pointed at the ground's model double (both wire formats) scripted with
/// each case's good reply: the client, prompt and harness path `--live` uses works.
#[test]
fn the_live_evals_run_end_to_end_against_the_model_double() {
    use gitops_loop::bosun::config::{ModelConfig, ModelProvider};
    use serde_json::{Value, json};

    let root = common::project_root().join("evals/reshape");
    let dirs = case_dirs(&root);
    let replies: Vec<Value> = dirs
        .iter()
        .map(|dir| {
            let case: Value =
                serde_saphyr::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
                    .unwrap();
            json!({"value": {"document": case["good"]}})
        })
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (provider, wire) in [
        (ModelProvider::Anthropic, "anthropic"),
        (ModelProvider::Openai, "openai"),
    ] {
        let script: ground::model::ModelScript =
            serde_json::from_value(json!({"provider": wire, "replies": replies})).unwrap();
        let double = runtime
            .block_on(ground::model::ModelDouble::start(
                &script,
                &root,
                Default::default(),
            ))
            .unwrap();
        let rows = live_rows(
            &ModelConfig {
                provider,
                base_url: Some(double.base_url(wire)),
                model: Some("ground-model".into()),
                ..ModelConfig::default()
            },
            Some(ground::model::MODEL_KEY.into()),
        );
        assert_eq!(rows.len(), dirs.len());
        assert!(rows.iter().all(|r| r.contains("| accept (")), "{rows:?}");
        assert!(double.failures().is_empty(), "{:?}", double.failures());
    }
}

/// The values migration's harness on recorded replies (evals/values-migration/*/case.yaml),
/// judged by `migration::decide` (what triage and `bosun repair` run) with the real helm for
/// the render check. Same threshold as the reshape: every reply as expected, no unsafe
/// acceptance, and every rule needed by some reply.
#[test]
fn migration_evals() {
    use gitops_loop::bosun::migration::{self, Migration, ValuesFile, rule};
    use gitops_loop::model;
    use gitops_loop::render::source::{ChartLocation, HelmJob, ValuesFile as Place, ValuesInput};
    use serde_json::Value;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct MigrationCase {
        #[allow(dead_code)]
        description: String,
        chart: String,
        files: Vec<FileCase>,
        good: Value,
        replies: Vec<ReplyCase>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FileCase {
        path: String,
        from: String,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ReplyCase {
        name: String,
        #[serde(default)]
        set: BTreeMap<String, Value>,
        #[serde(default)]
        remove: Vec<String>,
        #[serde(default)]
        reply: Option<Value>,
        #[serde(default)]
        reply_extra: Option<serde_json::Map<String, Value>>,
        #[serde(default)]
        raw: Option<String>,
        #[serde(default)]
        generate: Option<String>,
        expect: String,
        #[serde(default)]
        rule: Option<String>,
    }

    let cache = tempfile::tempdir().unwrap();
    let render_config = config(&common::sample_dir().join("repo"), cache.path());
    let render = |job: &HelmJob| -> Result<(), gitops_loop::render::HelmRunError> {
        gitops_loop::render::run_helm(&render_config, job).map(|_| ())
    };
    let root = common::project_root().join("evals/values-migration");
    let dirs = case_dirs(&root);
    let rules = [rule::SHAPE, rule::KEPT, rule::ACCOUNTED, rule::SCHEMA];
    let mut board = Scoreboard::default();
    for dir in dirs {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let case: MigrationCase = serde_saphyr::from_str(&read("case.yaml")).unwrap();
        let case_name = dir.file_name().unwrap().to_string_lossy().to_string();
        let chart = dir.join(&case.chart).canonicalize().unwrap();
        let files: Vec<ValuesFile> = case
            .files
            .iter()
            .map(|f| {
                let text = read(&f.from);
                ValuesFile {
                    path: f.path.clone(),
                    value: serde_saphyr::from_str::<Value>(&text).unwrap(),
                    text,
                    place: Place {
                        repo_dir: "/repo".into(),
                        commit: "head".into(),
                        path: f.path.clone(),
                    },
                }
            })
            .collect();
        let job = HelmJob {
            chart: ChartLocation::Mirror(chart.clone()),
            chart_label: case_name.clone(),
            chart_digest: case_name.clone(),
            release: "eval".into(),
            namespace: "eval".into(),
            kube_version: None,
            api_versions: vec![],
            values: files
                .iter()
                .map(|f| ValuesInput {
                    name: f.path.clone(),
                    content: f.text.clone().into_bytes(),
                    file: Some(Place {
                        repo_dir: "/repo".into(),
                        commit: "head".into(),
                        path: f.path.clone(),
                    }),
                })
                .collect(),
            set: vec![],
            set_string: vec![],
            set_file: vec![],
            include_crds: true,
            skip_tests: true,
            skip_schema_validation: false,
        };
        // The case as a triage meets it: helm refuses the original values.
        let refused = render(&job)
            .expect_err("the chart refuses the original values")
            .to_string();
        let m = Migration {
            chart: case_name.clone(),
            error: refused.clone(),
            new_schema: serde_json::from_str(
                &std::fs::read_to_string(chart.join("values.schema.json")).unwrap(),
            )
            .unwrap(),
            new_defaults: serde_saphyr::from_str(
                &std::fs::read_to_string(chart.join("values.yaml")).unwrap(),
            )
            .unwrap(),
            old_schema: None,
            files,
            failures: vec![gitops_loop::render::HelmFailure {
                application: format!("Application argocd/{case_name}"),
                cluster: "prod".into(),
                job,
                message: refused,
            }],
            redaction: Default::default(),
        };
        let migrations = [m];
        for reply in &case.replies {
            let mut whole = reply.reply.clone().unwrap_or_else(|| case.good.clone());
            for (pointer, value) in &reply.set {
                let (parent, last) = pointer.rsplit_once('/').unwrap();
                match whole.pointer_mut(parent).unwrap() {
                    Value::Array(items) => items.push(value.clone()),
                    Value::Object(map) => {
                        map.insert(last.to_string(), value.clone());
                    }
                    _ => panic!("{pointer}"),
                }
            }
            for pointer in &reply.remove {
                let (parent, last) = pointer.rsplit_once('/').unwrap();
                whole
                    .pointer_mut(parent)
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove(last);
            }
            if let Some(extra) = &reply.reply_extra {
                whole.as_object_mut().unwrap().extend(extra.clone());
            }
            let bytes: Vec<u8> = match (&reply.raw, reply.generate.as_deref()) {
                (Some(raw), _) => raw.clone().into_bytes(),
                (None, Some("ten-megabyte-string")) => {
                    let mut big = whole.clone();
                    big["files"][0]["values"]["crds"]["install"] = "x".repeat(10 << 20).into();
                    serde_json::to_vec(&big).unwrap()
                }
                (None, Some("deep-nesting")) => {
                    format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes()
                }
                (None, Some("padded-good")) => {
                    let mut text = serde_json::to_vec(&whole).unwrap();
                    text.extend(std::iter::repeat_n(b' ', model::MAX_REPLY_BYTES));
                    text
                }
                (None, Some(other)) => panic!("unknown generator {other}"),
                (None, None) => serde_json::to_vec(&whole).unwrap(),
            };
            // The reply limits only, as in the reshape evals: the response schema is the
            // harness's `reply-shape` rule here, so that rule is shown to be needed.
            let reply_result = model::parse_reply(&bytes).map(|value| model::Reply {
                value,
                usage: Default::default(),
            });
            let client_refused = reply_result.is_err();
            let got = match migration::decide(&migrations, true, &[reply_result], &render) {
                migration::Step::Done(Ok(_)) => Ok(()),
                migration::Step::Done(Err((handoff, _))) => Err(if client_refused {
                    "reply-limits".to_string()
                } else {
                    handoff
                        .fact
                        .split("(rule ")
                        .nth(1)
                        .and_then(|rest| rest.split(')').next())
                        .unwrap_or("?")
                        .to_string()
                }),
                migration::Step::Ask(_) => Err("asked again".to_string()),
            };
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                for rule in rules {
                    if got.as_ref().err().map(String::as_str) == Some(rule)
                        && migration::check_reply(
                            &migrations[0],
                            &value,
                            &Default::default(),
                            &[rule],
                        )
                        .is_ok()
                    {
                        board.need(rule, &reply.name);
                    }
                }
                // Needed by `renders`: every other rule holds.
                if got.as_ref().err().map(String::as_str) == Some(rule::RENDERS)
                    && migration::check_reply(&migrations[0], &value, &Default::default(), &[])
                        .is_ok()
                {
                    board.need(rule::RENDERS, &reply.name);
                }
                if got == Err("reply-limits".to_string())
                    && migration::check_reply(&migrations[0], &value, &Default::default(), &[])
                        .is_ok()
                {
                    board.need("reply-limits", &reply.name);
                }
            }
            board.record(&case_name, &reply.name, &reply.expect, &reply.rule, got);
        }
    }
    let all: Vec<&str> = rules
        .iter()
        .copied()
        .chain([rule::RENDERS, "reply-limits"])
        .collect();
    board.finish(&all);
}

/// The mechanical fix's harness on recorded replies (evals/mechanical-fix/*/case.yaml),
/// judged by `scalar_fix::decide` (what triage and `bosun repair` run). Same threshold: every
/// reply as expected, no unsafe acceptance, every rule needed by some reply, and no credential
/// of the files in the request.
#[test]
fn mechanical_evals() {
    use gitops_loop::bosun::scalar_fix::{self, AppInputs, ChangedDefault, rule};
    use gitops_loop::model;
    use serde_json::Value;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct FixCase {
        #[allow(dead_code)]
        description: String,
        report: String,
        not_served: Vec<gitops_loop::gate::rules::NotServed>,
        files: Vec<FileCase>,
        defaults: Vec<DefaultCase>,
        #[serde(default)]
        changed: Vec<ChangedCase>,
        #[serde(default)]
        shared: Vec<String>,
        #[serde(default)]
        never: Vec<String>,
        good: Value,
        replies: Vec<ReplyCase>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FileCase {
        path: String,
        from: String,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ChangedCase {
        path: String,
        from: String,
        base: String,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct DefaultCase {
        chart: String,
        from: String,
        to: String,
        key: Vec<String>,
        #[serde(default)]
        old: Option<Value>,
        #[serde(default)]
        new: Option<Value>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ReplyCase {
        name: String,
        #[serde(default)]
        set: BTreeMap<String, Value>,
        #[serde(default)]
        reply_extra: Option<serde_json::Map<String, Value>>,
        #[serde(default)]
        raw: Option<String>,
        #[serde(default)]
        generate: Option<String>,
        expect: String,
        #[serde(default)]
        rule: Option<String>,
    }

    let root = common::project_root().join("evals/mechanical-fix");
    let dirs = case_dirs(&root);
    let rules = [rule::SHAPE, rule::INVENTORY, rule::SOURCED];
    let mut board = Scoreboard::default();
    for dir in dirs {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let case: FixCase = serde_saphyr::from_str(&read("case.yaml")).unwrap();
        let case_name = dir.file_name().unwrap().to_string_lossy().to_string();
        let app = AppInputs {
            values_files: case
                .files
                .iter()
                .map(|f| (f.path.clone(), read(&f.from)))
                .collect(),
            defaults: case
                .defaults
                .iter()
                .map(|d| ChangedDefault {
                    chart: d.chart.clone(),
                    from: d.from.clone(),
                    to: d.to.clone(),
                    key: d.key.clone(),
                    old: d.old.clone(),
                    new: d.new.clone(),
                })
                .collect(),
        };
        let changed: Vec<scalar_fix::ChangedFile> = case
            .changed
            .iter()
            .map(|f| scalar_fix::ChangedFile {
                path: f.path.clone(),
                text: read(&f.from),
                base: Some(read(&f.base)),
            })
            .collect();
        let shared = case.shared.iter().cloned().collect();
        let fix =
            scalar_fix::build(&case.not_served, &[app], &changed, &shared, &case.report).unwrap();
        let request = fix.request();
        for canary in &case.never {
            assert!(
                !request.prompt.contains(canary.as_str()),
                "{case_name}: the request holds {canary}"
            );
        }
        for reply in &case.replies {
            let mut whole = case.good.clone();
            for (pointer, value) in &reply.set {
                let (parent, last) = pointer.rsplit_once('/').unwrap();
                match whole.pointer_mut(parent).unwrap() {
                    Value::Array(items) => {
                        let index: usize = last.parse().unwrap();
                        if index == items.len() {
                            items.push(value.clone());
                        } else {
                            items[index] = value.clone();
                        }
                    }
                    Value::Object(map) => {
                        map.insert(last.to_string(), value.clone());
                    }
                    _ => panic!("{pointer}"),
                }
            }
            if let Some(extra) = &reply.reply_extra {
                whole.as_object_mut().unwrap().extend(extra.clone());
            }
            let bytes: Vec<u8> = match (&reply.raw, reply.generate.as_deref()) {
                (Some(raw), _) => raw.clone().into_bytes(),
                (None, Some("padded-good")) => {
                    let mut text = serde_json::to_vec(&whole).unwrap();
                    text.extend(std::iter::repeat_n(b' ', model::MAX_REPLY_BYTES));
                    text
                }
                (None, Some(other)) => panic!("unknown generator {other}"),
                (None, None) => serde_json::to_vec(&whole).unwrap(),
            };
            let reply_result = model::parse_reply(&bytes).map(|value| model::Reply {
                value,
                usage: Default::default(),
            });
            let client_refused = reply_result.is_err();
            let got = match scalar_fix::decide(&fix, true, Some(&reply_result)) {
                scalar_fix::Step::Done(Ok(_)) => Ok(()),
                scalar_fix::Step::Done(Err((handoff, _))) => Err(if client_refused {
                    "reply-limits".to_string()
                } else {
                    handoff
                        .fact
                        .split("(rule ")
                        .nth(1)
                        .and_then(|rest| rest.split(')').next())
                        .unwrap_or("?")
                        .to_string()
                }),
                scalar_fix::Step::Ask(_) => Err("asked again".to_string()),
            };
            if let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
                for rule in rules {
                    if got.as_ref().err().map(String::as_str) == Some(rule)
                        && scalar_fix::check_reply_without(&fix, &value, &[rule])
                            .is_ok_and(|edits| scalar_fix::rewrite(&fix, &edits).is_ok())
                    {
                        board.need(rule, &reply.name);
                    }
                }
                if got == Err("reply-limits".to_string())
                    && scalar_fix::check_reply(&fix, &value).is_ok()
                {
                    board.need("reply-limits", &reply.name);
                }
            }
            board.record(&case_name, &reply.name, &reply.expect, &reply.rule, got);
        }
    }
    let all: Vec<&str> = rules.iter().copied().chain(["reply-limits"]).collect();
    board.finish(&all);
}

/// The green summary's harness on recorded replies (evals/green-summary/*/case.yaml): every
/// reply as expected, 0 unsafe acceptances, and each rule needed by some reply.
#[test]
fn green_summary_evals() {
    use gitops_loop::bosun::green_summary::{self, rule};
    use serde_json::Value;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct SummaryCase {
        #[allow(dead_code)]
        description: String,
        material: Value,
        replies: Vec<ReplyCase>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ReplyCase {
        name: String,
        #[serde(default)]
        reply: Option<Value>,
        #[serde(default)]
        generate: Option<String>,
        expect: String,
        #[serde(default)]
        rule: Option<String>,
    }
    let root = common::project_root().join("evals/green-summary");
    let dirs = case_dirs(&root);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut unsafe_acceptances = 0;
    let mut seen_rules = std::collections::BTreeSet::new();
    for dir in dirs {
        let case: SummaryCase =
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
                .unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        for reply in &case.replies {
            let value = match reply.generate.as_deref() {
                Some("long") => {
                    serde_json::json!({"summary": "Moves cert-manager-lite. ".repeat(60)})
                }
                Some(other) => panic!("unknown generator {other}"),
                None => reply.reply.clone().unwrap(),
            };
            let got = green_summary::check(&value, &case.material)
                .map(|_| ())
                .map_err(|r| r.rule.to_string());
            let expected = match (reply.expect.as_str(), &reply.rule) {
                ("accept", _) => Ok(()),
                (_, Some(rule)) => Err(rule.clone()),
                _ => panic!("{}: a refusal names its rule", reply.name),
            };
            if got.is_ok() && expected.is_err() {
                unsafe_acceptances += 1;
            }
            if let Err(rule) = &got {
                seen_rules.insert(rule.clone());
            }
            if got != expected {
                failures.push(format!(
                    "{name} / {}: expected {expected:?}, got {got:?}",
                    reply.name
                ));
            }
            rows.push(format!(
                "| {name} | {} | {expected:?} | {got:?} |",
                reply.name
            ));
        }
    }
    println!("| case | reply | expected | got |\n|---|---|---|---|");
    for row in &rows {
        println!("{row}");
    }
    println!(
        "score: {}/{} as expected, {unsafe_acceptances} unsafe acceptances",
        rows.len() - failures.len(),
        rows.len()
    );
    assert_eq!(unsafe_acceptances, 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for rule in [rule::SHAPE, rule::GROUNDED] {
        assert!(seen_rules.contains(rule), "no reply is refused by {rule}");
    }
}
