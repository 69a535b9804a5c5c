//! Promotions running their steps: start, advance, step failures, finish.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};
use sha1::{Digest, Sha1};

use crate::kargo::{Kargo, Run, Verification, controller_user, expr, hex, schemas, steps, text};
use crate::kube::KubeDouble;
use crate::transcript::Transcript;

/// `vars` entries (`[{name, value}]`) as (name, value) pairs, in order.
pub(super) fn named_values(list: Option<&Value>) -> Vec<(String, Value)> {
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            Some((
                v.get("name")?.as_str()?.to_string(),
                v.get("value").cloned().unwrap_or(Value::Null),
            ))
        })
        .collect()
}

/// Go's `time.ParseDuration` for the units a step timeout uses (`30m`, `5m0s`, `1h30m`, `1ms`).
pub(super) fn go_duration(text: &str) -> Option<std::time::Duration> {
    static WHOLE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+$").expect("a fixed pattern")
    });
    static PART: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)").expect("a fixed pattern")
    });
    if !WHOLE.is_match(text) {
        return None;
    }
    let part = &*PART;
    let mut seconds = 0.0;
    for c in part.captures_iter(text) {
        let n: f64 = c[1].parse().ok()?;
        seconds += n * match &c[2] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            _ => 3600.0,
        };
    }
    Some(std::time::Duration::from_secs_f64(seconds))
}

/// [K pkg/promotion/local_orchestrator.go]: a step still running or erroring past its
/// `retry.timeout` (argocd-update's default: 5 minutes; none for the others here) Errors.
/// Returns the timeout as written when it has passed.
pub(super) fn timed_out(
    run: &mut Run,
    index: usize,
    step: &Value,
    uses: &str,
    now: u64,
) -> Option<String> {
    let written = step
        .pointer("/retry/timeout")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| (uses == "argocd-update").then(|| "5m0s".to_string()))?;
    let timeout = go_duration(&written).filter(|t| !t.is_zero())?;
    let started = match run.started {
        Some((i, at)) if i == index => at,
        _ => {
            run.started = Some((index, now));
            now
        }
    };
    (now.saturating_sub(started) > timeout.as_secs()).then_some(written)
}

pub(super) fn push(object: &mut Value, field: &str, item: Value) {
    match object.get_mut(field).and_then(Value::as_array_mut) {
        Some(list) => list.push(item),
        None => object[field] = json!([item]),
    }
}

impl Kargo {
    pub(super) async fn promote(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        let mut promotions = self.list(kube, "promotions");
        promotions.sort_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")));
        // A new Promotion has an empty phase until the controller marks it Pending.
        for promotion in &promotions {
            if text(promotion, "/status/phase").is_empty() {
                let name = text(promotion, "/metadata/name");
                let _ = Self::patch_status(
                    kube,
                    "promotions",
                    &self.namespace,
                    name,
                    json!({"phase": "Pending"}),
                );
                progress = true;
            }
        }
        let promotions = self.list(kube, "promotions");
        let mut by_stage: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for promotion in promotions {
            by_stage
                .entry(text(&promotion, "/spec/stage").to_string())
                .or_default()
                .push(promotion);
        }
        for (stage, mut list) in by_stage {
            list.sort_by(|a, b| text(a, "/metadata/name").cmp(text(b, "/metadata/name")));
            let running = list
                .iter()
                .find(|p| text(p, "/status/phase") == "Running")
                .cloned();
            let promotion = match running {
                Some(p) => p,
                None => {
                    let Some(next) = list
                        .iter()
                        .find(|p| text(p, "/status/phase") == "Pending")
                        .cloned()
                    else {
                        continue;
                    };
                    let name = text(&next, "/metadata/name").to_string();
                    // [K pkg/controller/stages/regular_stages.go syncPromotions]: a current
                    // Freight with a non-terminal verification holds the next Promotion; so
                    // does a healthy Stage whose current Freight is not verified yet, while an
                    // unhealthy one lets it run (it may be the fix). The ground starts the
                    // AnalysisRun in the tick its Applications turn healthy, so "healthy and
                    // not verified yet" is "an AnalysisRun runs"; a verification still waiting
                    // for health is an unhealthy Stage. (Upstream also holds a Stage whose
                    // health is unknown; the ground has no such state.)
                    if let Some(v) = self
                        .verifications
                        .iter()
                        .find(|v| v.stage == stage && v.analysis_run.is_some())
                    {
                        if self.held_for_verification.insert(name.clone()) {
                            let alias = Self::get(kube, "freights", &self.namespace, &v.freight)
                                .map(|f| text(&f, "/alias").to_string())
                                .unwrap_or_else(|_| v.freight.clone());
                            transcript.say(
                                "kargo",
                                format!(
                                    "Promotion {name} to Stage {stage} waits: Freight {alias} is still being verified there"
                                ),
                            );
                        }
                        continue;
                    }
                    // The superseded Freight's wait for health ends with the new Promotion.
                    self.verifications
                        .retain(|v| v.stage != stage || v.analysis_run.is_some());
                    let _ = Self::patch_status(
                        kube,
                        "promotions",
                        &self.namespace,
                        &name,
                        json!({"phase": "Running", "startedAt": kube.clock().rfc3339()}),
                    );
                    let freight = self.freight_reference(kube, text(&next, "/spec/freight"));
                    let _ = Self::patch_status(
                        kube,
                        "stages",
                        &self.namespace,
                        &stage,
                        json!({
                            "currentPromotion": {"name": name, "freight": freight},
                            "conditions": [{"type": "Promoting", "status": "True", "reason": "ActivePromotion", "message": format!("Promotion \"{name}\" is currently Running"), "lastTransitionTime": kube.clock().rfc3339()}],
                        }),
                    );
                    transcript.say(
                        "kargo",
                        format!("Promotion {name} to Stage {stage}: Running"),
                    );
                    progress = true;
                    let Ok(p) = Self::get(kube, "promotions", &self.namespace, &name) else {
                        continue;
                    };
                    p
                }
            };
            progress |= self.advance(kube, transcript, &stage, &promotion).await;
        }
        progress
    }

    pub(super) fn freight_reference(&self, kube: &KubeDouble, name: &str) -> Value {
        let freight = Self::get(kube, "freights", &self.namespace, name).unwrap_or(Value::Null);
        json!({
            "name": name,
            "origin": freight.get("origin").cloned().unwrap_or(Value::Null),
            "images": freight.get("images").cloned().unwrap_or(json!([])),
            "charts": freight.get("charts").cloned().unwrap_or(json!([])),
            "commits": freight.get("commits").cloned().unwrap_or(json!([])),
        })
    }

    /// Runs the promotion's steps from where it stopped until one waits or all are done.
    pub(super) async fn advance(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        stage: &str,
        promotion: &Value,
    ) -> bool {
        let promotion = PromotionSteps::read(self, kube, stage, promotion);
        let mut progress = false;
        loop {
            match self.advance_step(kube, transcript, &promotion).await {
                Advanced::Stepped => progress = true,
                Advanced::Finished => return true,
                Advanced::Waiting { said } => return progress || said,
            }
        }
    }

    /// Runs the promotion's current step once: prepared, checked against its schema, run, and
    /// its outcome recorded.
    async fn advance_step(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        promotion: &PromotionSteps<'_>,
    ) -> Advanced {
        let name = &promotion.name;
        let stage = promotion.stage;
        let run = self.runs.entry(name.clone()).or_default();
        if run.workdir.is_none() {
            let dir = self.workdir.join(name.replace('.', "-"));
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::create_dir_all(&dir);
            run.workdir = Some(dir);
        }
        let index = run.step;
        if index >= promotion.steps.len() {
            let (phase, message) = run
                .failure
                .clone()
                .unwrap_or_else(|| ("Succeeded".into(), "All steps completed".into()));
            self.finish(kube, transcript, stage, name, &phase, &message);
            return Advanced::Finished;
        }
        if self.failing_stages.iter().any(|s| s == stage) {
            self.finish(
                kube,
                transcript,
                stage,
                name,
                "Failed",
                "step 1 failed: the scenario makes this Stage's promotions fail",
            );
            return Advanced::Finished;
        }
        let at = promotion.step(index);
        let (outputs, workdir, statuses) = self
            .runs
            .get(name)
            .map(|r| {
                (
                    r.outputs.clone(),
                    r.workdir.clone().unwrap_or_default(),
                    r.statuses.clone(),
                )
            })
            .unwrap_or_default();
        let prepared = self.prepare_step(
            at.step,
            &promotion.vars,
            &outputs,
            &statuses,
            &promotion.freight,
            stage,
            name,
        );
        let config = match prepared {
            Ok(Some(c)) => c,
            Ok(None) => {
                let why = if at
                    .step
                    .get("if")
                    .and_then(Value::as_str)
                    .is_some_and(|c| !c.is_empty())
                {
                    "its if: condition is false"
                } else {
                    "a step before it failed"
                };
                promotion.say(transcript, &at, format!("skipped ({why})"));
                let run = self.runs.entry(name.clone()).or_default();
                run.statuses.push((at.alias, "Skipped".into()));
                run.step += 1;
                return Advanced::Stepped;
            }
            Err(e) => {
                let message = format!("step {} ({}): {e}", index + 1, at.uses);
                self.step_failed(
                    transcript,
                    name,
                    at.alias,
                    "Errored",
                    message,
                    promotion.total(),
                );
                return Advanced::Stepped;
            }
        };
        // [K http_requester.go and every builtin: a config that fails its schema is a
        // terminal failure].
        if let Err(e) = schemas::validate(&at.uses, &config) {
            let message = format!("step {} ({}): {e}", index + 1, at.uses);
            self.step_failed(
                transcript,
                name,
                at.alias,
                "Failed",
                message,
                promotion.total(),
            );
            return Advanced::Stepped;
        }
        let context = steps::StepContext {
            kargo: self,
            kube,
            workdir: &workdir,
            promotion: name,
            stage,
        };
        let outcome = steps::run(&context, &at.uses, &config).await;
        self.record_outcome(kube, transcript, promotion, at, &config, outcome)
    }

    /// Records what a step's run came to: its outputs and status, the Applications an
    /// `argocd-update` named, a wait or retry, or a failure.
    fn record_outcome(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        promotion: &PromotionSteps<'_>,
        at: StepAt<'_>,
        config: &Value,
        outcome: steps::Outcome,
    ) -> Advanced {
        let name = &promotion.name;
        let run = self.runs.entry(name.clone()).or_default();
        match outcome {
            steps::Outcome::Done { output, said } => {
                promotion.say(transcript, &at, said);
                if at.uses == "argocd-update" {
                    run.desired = desired_sources(config);
                    run.apps = updated_apps(config);
                }
                run.outputs.insert(at.alias.clone(), output);
                run.statuses.push((at.alias, "Succeeded".into()));
                run.errors = 0;
                run.step += 1;
                run.waiting_said = false;
                let _ = Self::patch_status(
                    kube,
                    "promotions",
                    &self.namespace,
                    name,
                    json!({"currentStep": run.step}),
                );
                Advanced::Stepped
            }
            steps::Outcome::Skipped { output, said } => {
                promotion.say(transcript, &at, format!("skipped ({said})"));
                run.outputs.insert(at.alias.clone(), output);
                run.statuses.push((at.alias, "Skipped".into()));
                run.step += 1;
                Advanced::Stepped
            }
            steps::Outcome::Waiting { said } => {
                self.wait_or_fail(kube, transcript, promotion, at, said, false)
            }
            steps::Outcome::Errored { said } => {
                self.wait_or_fail(kube, transcript, promotion, at, said, true)
            }
            steps::Outcome::Failed { said } => {
                // A terminal failure's message is the step's error, as Kargo words it.
                let message = said;
                self.step_failed(
                    transcript,
                    name,
                    at.alias,
                    "Failed",
                    message,
                    promotion.total(),
                );
                Advanced::Stepped
            }
        }
    }

    /// [K pkg/promotion/local_orchestrator.go determineStepCompletion]: a step still
    /// running, or erroring below `retry.errorThreshold` (default 1: the first error
    /// ends the Promotion as Errored), is retried until `retry.timeout`.
    fn wait_or_fail(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        promotion: &PromotionSteps<'_>,
        at: StepAt<'_>,
        said: String,
        errored: bool,
    ) -> Advanced {
        let name = &promotion.name;
        let run = self.runs.entry(name.clone()).or_default();
        let threshold = at
            .step
            .pointer("/retry/errorThreshold")
            .and_then(Value::as_u64)
            .filter(|t| *t > 0)
            .unwrap_or(1);
        if errored {
            run.errors += 1;
            if u64::from(run.errors) >= threshold {
                // [K local_orchestrator.go determineStepCompletion]: the step's
                // message is the Promotion's.
                let message = format!(
                    "step {:?} met error threshold of {threshold}: {said}",
                    at.alias
                );
                self.step_failed(
                    transcript,
                    name,
                    at.alias,
                    "Errored",
                    message,
                    promotion.total(),
                );
                return Advanced::Stepped;
            }
        }
        if let Some(timeout) = timed_out(run, at.index, at.step, &at.uses, kube.clock().seconds()) {
            let message = format!("step {:?} timed out after {timeout}", at.alias);
            self.step_failed(
                transcript,
                name,
                at.alias,
                "Errored",
                message,
                promotion.total(),
            );
            return Advanced::Stepped;
        }
        if run.waiting_said {
            return Advanced::Waiting { said: false };
        }
        let line = if errored {
            format!("{said}; step will be retried (error threshold {threshold})")
        } else {
            format!("waiting: {said}")
        };
        promotion.say(transcript, &at, line);
        run.waiting_said = true;
        Advanced::Waiting { said: true }
    }

    /// A step Errored or Failed: it is recorded, the first failure decides the Promotion's
    /// phase, and the run goes on ([K pkg/promotion/local_orchestrator.go]: later steps run
    /// only if their `if:` says so).
    pub(super) fn step_failed(
        &mut self,
        transcript: &Transcript,
        name: &str,
        alias: String,
        phase: &str,
        message: String,
        total: usize,
    ) {
        let run = self.runs.entry(name.to_string()).or_default();
        transcript.say(
            "kargo",
            format!("{name} step {}/{total}: {phase}: {message}", run.step + 1),
        );
        run.statuses.push((alias, phase.to_string()));
        // [K pkg/promotion/orchestrator.go]: the Promotion takes the worst step status,
        // Errored over Failed; the first of the worst keeps its message.
        let worse = match &run.failure {
            None => true,
            Some((held, _)) => held == "Failed" && phase == "Errored",
        };
        if worse {
            run.failure = Some((phase.to_string(), message));
        }
        run.errors = 0;
        run.waiting_said = false;
        run.step += 1;
    }

    /// A step's vars, `if:` and config, as Kargo's step evaluator prepares them
    /// ([K pkg/promotion/evaluator.go Vars, ShouldSkip, Config]): the Promotion's vars then the
    /// step's own (only those see earlier outputs), each a template seeing the vars before it;
    /// a step whose `if:` is false is
    /// skipped (`None`), one whose `if:` is not a bool errors; without `if:`, a step after a
    /// failure is skipped.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn prepare_step(
        &self,
        step: &Value,
        promotion_vars: &Map<String, Value>,
        outputs: &Map<String, Value>,
        statuses: &[(String, String)],
        freight: &Value,
        stage: &str,
        name: &str,
    ) -> Result<Option<Value>, String> {
        let ctx = json!({"project": self.namespace, "stage": stage, "promotion": name, "targetFreight": {"name": text(freight, "/metadata/name"), "alias": text(freight, "/alias"), "origin": {"name": text(freight, "/origin/name")}}});
        let mut vars = Map::new();
        let step_vars = named_values(step.get("vars"));
        // [K evaluator.go Vars]: the Promotion's vars do not see outputs; a step's own do.
        let no_outputs = Map::new();
        let promotion_count = promotion_vars.len();
        for (i, (key, raw)) in promotion_vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(step_vars)
            .enumerate()
        {
            let (seen, seen_statuses) = if i < promotion_count {
                (&no_outputs, &[][..])
            } else {
                (outputs, statuses)
            };
            let scope = expr::Scope {
                ctx: ctx.clone(),
                vars: &vars,
                outputs: seen,
                freight,
                secrets: &self.secrets,
                statuses: seen_statuses,
            };
            let value =
                expr::evaluate_value(&raw, &scope).map_err(|e| format!("var {key}: {e}"))?;
            vars.insert(key, value);
        }
        let scope = expr::Scope {
            ctx,
            vars: &vars,
            outputs,
            freight,
            secrets: &self.secrets,
            statuses,
        };
        let condition = step
            .get("if")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty());
        if condition.is_none()
            && statuses
                .iter()
                .any(|(_, s)| s == "Errored" || s == "Failed")
        {
            return Ok(None);
        }
        if let Some(condition) = condition {
            match expr::evaluate_template(condition, &scope)? {
                Value::Bool(true) => {}
                Value::Bool(false) => return Ok(None),
                other => {
                    return Err(format!(
                        "if: expression must evaluate to a boolean, got {}",
                        match other {
                            Value::String(_) => "string",
                            Value::Number(_) => "float64",
                            Value::Null => "<nil>",
                            Value::Array(_) => "[]interface {}",
                            _ => "map[string]interface {}",
                        }
                    ));
                }
            }
        }
        expr::evaluate_value(step.get("config").unwrap_or(&Value::Null), &scope).map(Some)
    }

    pub(super) fn finish(
        &mut self,
        kube: &KubeDouble,
        transcript: &Transcript,
        stage: &str,
        name: &str,
        phase: &str,
        message: &str,
    ) {
        let run = self.runs.remove(name).unwrap_or_default();
        let promotion = Self::get(kube, "promotions", &self.namespace, name).unwrap_or(Value::Null);
        let freight_name = text(&promotion, "/spec/freight").to_string();
        let freight_ref = self.freight_reference(kube, &freight_name);
        let finished = kube.clock().rfc3339();
        let _ = Self::patch_status(
            kube,
            "promotions",
            &self.namespace,
            name,
            json!({"phase": phase, "message": message, "finishedAt": finished, "freight": freight_ref}),
        );
        let stage_object = Self::get(kube, "stages", &self.namespace, stage).unwrap_or(Value::Null);
        let mut history: Vec<Value> = stage_object
            .pointer("/status/freightHistory")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut status = json!({
            "currentPromotion": null,
            "lastPromotion": {"name": name, "freight": freight_ref, "status": {"phase": phase, "message": message}, "finishedAt": finished},
            "conditions": [{"type": "Promoting", "status": "False", "reason": format!("LastPromotion{phase}"), "message": message, "lastTransitionTime": finished}],
        });
        if phase == "Succeeded" {
            // A new collection: this origin's Freight, the other origins carried forward.
            let origin_key = format!("Warehouse/{}", text(&freight_ref, "/origin/name"));
            let mut items = history
                .first()
                .and_then(|c| c.get("items"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let previous = items
                .get(&origin_key)
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string);
            items.insert(origin_key, freight_ref.clone());
            let mut names: Vec<&str> = items
                .values()
                .filter_map(|f| f.get("name").and_then(Value::as_str))
                .collect();
            names.sort();
            let id = hex(&Sha1::digest(names.join(",").as_bytes()));
            history.insert(0, json!({"id": id, "items": items}));
            history.truncate(10);
            status["freightHistory"] = json!(history);
            status["freightSummary"] = json!(freight_name);
            let freights = Self::resource(kube, "freights");
            if let Some(previous) = previous.filter(|p| *p != freight_name) {
                let _ = kube.store().patch(
                    &freights,
                    &self.namespace,
                    &previous,
                    crate::kube::store::PatchBody::Merge(
                        json!({"status": {"currentlyIn": {stage: null}}}),
                    ),
                    &controller_user(),
                    true,
                );
            }
            let _ = Self::patch_status(
                kube,
                "freights",
                &self.namespace,
                &freight_name,
                json!({"currentlyIn": {stage: {"since": finished}}}),
            );
            self.verifications.push(Verification {
                stage: stage.to_string(),
                freight: freight_name.clone(),
                apps: run.apps.clone(),
                // [K pkg/health/checker/builtin/argocd.go]: Kargo checks the revision an
                // Application runs only when argocd-update names a desiredRevision; it never
                // compares with the merge commit.
                desired: run.desired.clone(),
                analysis_run: None,
            });
        }
        let _ = Self::patch_status(kube, "stages", &self.namespace, stage, status);
        transcript.say(
            "kargo",
            format!(
                "Promotion {name}: {phase}{}",
                if phase == "Succeeded" {
                    String::new()
                } else {
                    format!(" ({message})")
                }
            ),
        );
    }
}

/// A Promotion whose steps run: what its spec asks, read once per advance.
struct PromotionSteps<'a> {
    name: String,
    stage: &'a str,
    steps: Vec<Value>,
    /// The Freight it promotes (null when it is gone).
    freight: Value,
    /// The Promotion's own `vars`, in order.
    vars: Map<String, Value>,
}

/// One step of a Promotion, where it stands.
struct StepAt<'a> {
    index: usize,
    step: &'a Value,
    uses: String,
    /// The step's alias, for outputs and `status()`.
    alias: String,
}

/// What one pass over the current step came to.
enum Advanced {
    /// The step ended (done, skipped or failed): the next one may run.
    Stepped,
    /// The Promotion ended.
    Finished,
    /// The step waits (or is retried); `said` when this pass wrote its line.
    Waiting { said: bool },
}

impl<'a> PromotionSteps<'a> {
    fn read(kargo: &Kargo, kube: &KubeDouble, stage: &'a str, promotion: &Value) -> Self {
        let steps = promotion
            .pointer("/spec/steps")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let freight = Kargo::get(
            kube,
            "freights",
            &kargo.namespace,
            text(promotion, "/spec/freight"),
        )
        .unwrap_or(Value::Null);
        PromotionSteps {
            name: text(promotion, "/metadata/name").to_string(),
            stage,
            steps,
            freight,
            vars: named_values(promotion.pointer("/spec/vars"))
                .into_iter()
                .collect(),
        }
    }

    fn total(&self) -> usize {
        self.steps.len()
    }

    fn step(&self, index: usize) -> StepAt<'_> {
        let step = &self.steps[index];
        StepAt {
            index,
            step,
            uses: text(step, "/uses").to_string(),
            // [K api/v1alpha1/promotion_types.go GetAlias]: `step-<i+1>` when `as` is unset.
            alias: step
                .get("as")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| format!("step-{}", index + 1)),
        }
    }

    /// `<promotion> step <i>/<n> <uses>: <what>` in the transcript.
    fn say(&self, transcript: &Transcript, at: &StepAt<'_>, what: String) {
        transcript.say(
            "kargo",
            format!(
                "{} step {}/{} {}: {what}",
                self.name,
                at.index + 1,
                self.total(),
                at.uses
            ),
        );
    }
}

/// What an `argocd-update` step's `sources[].desiredRevision` asks each Application to run:
/// (namespace, application, repoURL, chart, revision).
fn desired_sources(config: &Value) -> Vec<(String, String, String, String, String)> {
    config
        .get("apps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|a| {
            let namespace = a
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or("argocd")
                .to_string();
            let app = text(a, "/name").to_string();
            a.get("sources")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|s| !text(s, "/desiredRevision").is_empty())
                .map(move |s| {
                    (
                        namespace.clone(),
                        app.clone(),
                        text(&s, "/repoURL").to_string(),
                        text(&s, "/chart").to_string(),
                        text(&s, "/desiredRevision").to_string(),
                    )
                })
        })
        .collect()
}

/// The Applications an `argocd-update` step names: (namespace, name).
fn updated_apps(config: &Value) -> Vec<(String, String)> {
    config
        .get("apps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a.get("namespace")
                    .and_then(Value::as_str)
                    .unwrap_or("argocd")
                    .to_string(),
                text(a, "/name").to_string(),
            )
        })
        .collect()
}
