//! Verification after a promotion: health first, then an AnalysisRun's verdict.

use serde_json::{Value, json};

use crate::kargo::freight::stage_label_value;
use crate::kargo::webhooks::next_ulid;
use crate::kargo::{Kargo, Verification, controller_user, text};
use crate::kube::KubeDouble;
use crate::transcript::Transcript;

/// Whether Kargo's Argo CD health check finds an Application Healthy
/// ([K pkg/health/checker/builtin/argocd.go getApplicationHealth]); the error is its issue.
/// Kargo never asks for `Synced`: it asks that Argo CD reconciled after the last operation
/// finished (`status.reconciledAt` not before `operationState.finishedAt`), that no
/// `ComparisonError` or `InvalidSpecError` condition stands, that, when argocd-update named a
/// desired revision, no sync runs and each source runs its desired revision (sources matched
/// by repoURL and chart, as the step matched them), and that the health is `Healthy`.
/// `desired`: (repoURL, chart, revision) per source update.
pub fn argocd_app_health(app: &Value, desired: &[(String, String, String)]) -> Result<(), String> {
    let name = text(app, "/metadata/name");
    let namespace = text(app, "/metadata/namespace");
    let finished = text(app, "/status/operationState/finishedAt");
    let reconciled = text(app, "/status/reconciledAt");
    if !finished.is_empty() && (reconciled.is_empty() || reconciled < finished) {
        return Err(format!(
            "Argo CD Application {name:?} in namespace {namespace:?} was not reconciled after its most recent operation completed; Application health status not trusted"
        ));
    }
    for condition in app
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = text(condition, "/type");
        if matches!(kind, "ComparisonError" | "InvalidSpecError") {
            return Err(format!(
                "Argo CD Application {name:?} in namespace {namespace:?} has {kind:?} condition: {}",
                text(condition, "/message")
            ));
        }
    }
    let sources: Vec<Value> = match app.pointer("/spec/sources").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => list.clone(),
        _ => app.pointer("/spec/source").cloned().into_iter().collect(),
    };
    let revisions: Vec<&str> = sources
        .iter()
        .map(|s| {
            desired
                .iter()
                .find(|(repo, chart, _)| text(s, "/repoURL") == repo && text(s, "/chart") == chart)
                .map_or("", |(.., revision)| revision.as_str())
        })
        .collect();
    if revisions.iter().any(|r| !r.is_empty()) {
        let operation = app.pointer("/operation/sync").is_some_and(|o| !o.is_null());
        if operation || finished.is_empty() {
            return Err(format!(
                "Argo CD Application {name:?} in namespace {namespace:?} is being synced"
            ));
        }
        let observed: Vec<&str> = match app
            .pointer("/status/sync/revisions")
            .and_then(Value::as_array)
        {
            Some(list) if !list.is_empty() => {
                list.iter().map(|r| r.as_str().unwrap_or("")).collect()
            }
            _ => vec![text(app, "/status/sync/revision")],
        };
        if observed.len() != revisions.len() {
            return Err(format!(
                "Argo CD Application {name:?} in namespace {namespace:?} has {} observed revisions but {} desired revisions",
                observed.len(),
                revisions.len()
            ));
        }
        let issues: Vec<String> = revisions
            .iter()
            .zip(&observed)
            .enumerate()
            .filter(|(_, (want, got))| !want.is_empty() && want != got)
            .map(|(i, (want, _))| {
                format!(
                    "Source {i} with RepoURL {} of Application {name:?} in namespace {namespace:?} does not match the desired revision {want:?}.",
                    text(&sources[i], "/repoURL")
                )
            })
            .collect();
        if !issues.is_empty() {
            return Err(format!(
                "Not all sources of Application {name:?} in namespace {namespace:?} are synced to the desired revisions. Issues: {}",
                issues.join("; ")
            ));
        }
    }
    match text(app, "/status/health/status") {
        "Healthy" => Ok(()),
        "Progressing" | "" => Err(format!(
            "Argo CD Application {name:?} in namespace {namespace:?} is progressing"
        )),
        "Suspended" => Err(format!(
            "Argo CD Application {name:?} in namespace {namespace:?} is suspended"
        )),
        other => Err(format!(
            "Argo CD Application {name:?} in namespace {namespace:?} has health state {other:?}"
        )),
    }
}

/// Where one verification stands after a round.
enum VerifyStep {
    /// Still waiting: for health, or for the AnalysisRun's verdict.
    Waiting(Verification),
    /// Its AnalysisRun was created this round.
    Started(Verification),
    /// Its outcome is recorded on the Stage (and the Freight when it passed).
    Decided,
}

impl Kargo {
    /// After a successful promotion: wait until the Applications an `argocd-update` step named
    /// pass Kargo's Argo CD health check (`argocd_app_health`) ([K docs 60-verification]:
    /// Kargo waits for them before verification, and without verification success is health).
    /// With `spec.verification.analysisTemplates`, an AnalysisRun is then created from them and
    /// the Stage's args, and its verdict decides: Successful verifies the Freight in the Stage
    /// (so a Stage that requests it from this one may take it); Failed, Error or Inconclusive
    /// records the failure and the Freight stays unverified.
    pub(super) fn verify(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        let mut remaining = Vec::new();
        for verification in std::mem::take(&mut self.verifications) {
            match self.verification_step(kube, transcript, verification) {
                VerifyStep::Waiting(verification) => remaining.push(verification),
                VerifyStep::Started(verification) => {
                    remaining.push(verification);
                    progress = true;
                }
                VerifyStep::Decided => progress = true,
            }
        }
        self.verifications = remaining;
        progress
    }

    /// One verification's next step: wait for health, start the AnalysisRun, wait for its
    /// verdict, or record the outcome.
    fn verification_step(
        &self,
        kube: &KubeDouble,
        transcript: &Transcript,
        mut verification: Verification,
    ) -> VerifyStep {
        if !Self::applications_healthy(kube, &verification) && verification.analysis_run.is_none() {
            return VerifyStep::Waiting(verification);
        }
        let stage_object =
            Self::get(kube, "stages", &self.namespace, &verification.stage).unwrap_or(Value::Null);
        let templates: Vec<Value> = stage_object
            .pointer("/spec/verification/analysisTemplates")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = verification.apps.iter().map(|(_, n)| n.as_str()).collect();
        let healthy = format!(
            "{} Synced and Healthy{}",
            if names.is_empty() {
                "no Applications named".to_string()
            } else {
                names.join(", ")
            },
            verification
                .desired
                .first()
                .map(|(.., r)| format!(" running {r}"))
                .unwrap_or_default()
        );
        let outcome: Result<String, (String, String)> = if templates.is_empty() {
            Ok(format!("verification passed: {healthy}"))
        } else {
            match &verification.analysis_run {
                None => match self.start_analysis(kube, &stage_object, &templates, &verification) {
                    Ok(run) => {
                        transcript.say(
                            "kargo",
                            format!(
                                "Stage {}: {healthy}; verification started: AnalysisRun {run}",
                                verification.stage
                            ),
                        );
                        verification.analysis_run = Some(run);
                        return VerifyStep::Started(verification);
                    }
                    Err(e) => Err(("Error".to_string(), e)),
                },
                Some(run) => {
                    let runs = kube
                        .store()
                        .resource("argoproj.io", "v1alpha1", "analysisruns")
                        .cloned();
                    let object = runs
                        .and_then(|r| kube.store().get(&r, &self.namespace, run).ok())
                        .unwrap_or(Value::Null);
                    match text(&object, "/status/phase") {
                        "Successful" => {
                            Ok(format!("verification passed: AnalysisRun {run} Successful"))
                        }
                        phase @ ("Failed" | "Error" | "Inconclusive") => Err((
                            phase.to_string(),
                            format!("AnalysisRun {run}: {}", text(&object, "/status/message")),
                        )),
                        _ => return VerifyStep::Waiting(verification),
                    }
                }
            }
        };
        self.record_verification(
            kube,
            transcript,
            &verification,
            stage_object,
            templates.is_empty(),
            &outcome,
        );
        VerifyStep::Decided
    }

    /// Whether every Application the verification names passes Kargo's Argo CD health check
    /// at the revisions its `argocd-update` step desired.
    fn applications_healthy(kube: &KubeDouble, verification: &Verification) -> bool {
        let resource = kube
            .store()
            .resource("argoproj.io", "v1alpha1", "applications")
            .cloned();
        verification.apps.iter().all(|(namespace, app)| {
            let Some(resource) = &resource else {
                return false;
            };
            let Ok(object) = kube.store().get(resource, namespace, app) else {
                return false;
            };
            let desired: Vec<(String, String, String)> = verification
                .desired
                .iter()
                .filter(|(ns, name, ..)| ns == namespace && name == app)
                .map(|(_, _, repo, chart, revision)| {
                    (repo.clone(), chart.clone(), revision.clone())
                })
                .collect();
            argocd_app_health(&object, &desired).is_ok()
        })
    }

    /// A decided verification on the Stage and the Freight: verified in the Stage and the
    /// Stage Healthy, or the failure in its verification history and the Stage Unhealthy.
    /// `health_only`: no AnalysisTemplates, health was the verification.
    fn record_verification(
        &self,
        kube: &KubeDouble,
        transcript: &Transcript,
        verification: &Verification,
        stage_object: Value,
        health_only: bool,
        outcome: &Result<String, (String, String)>,
    ) {
        let now = kube.clock().rfc3339();
        let mut history: Vec<Value> = stage_object
            .pointer("/status/freightHistory")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let id = format!("verification-{}", &verification.freight[..7]);
        let run_ref = verification
            .analysis_run
            .as_ref()
            .map(|r| json!({"namespace": self.namespace, "name": r}));
        let alias = Self::get(kube, "freights", &self.namespace, &verification.freight)
            .map(|f| text(&f, "/alias").to_string())
            .unwrap_or_default();
        match outcome {
            Ok(said) => {
                let _ = Self::patch_status(
                    kube,
                    "freights",
                    &self.namespace,
                    &verification.freight,
                    json!({"verifiedIn": {verification.stage.clone(): {"verifiedAt": now}}}),
                );
                if let Some(first) = history.first_mut() {
                    first["verificationHistory"] = json!([{"id": id, "actor": "kargo", "phase": "Successful", "startTime": now, "finishTime": now, "message": said, "analysisRun": run_ref}]);
                }
                let _ = Self::patch_status(
                    kube,
                    "stages",
                    &self.namespace,
                    &verification.stage,
                    json!({"freightHistory": history, "health": {"status": "Healthy"}}),
                );
                let said = if health_only {
                    said.clone()
                } else {
                    format!("{said}; Freight {alias} is verified")
                };
                transcript.say("kargo", format!("Stage {}: {said}", verification.stage));
            }
            Err((phase, why)) => {
                if let Some(first) = history.first_mut() {
                    first["verificationHistory"] = json!([{"id": id, "actor": "kargo", "phase": phase, "startTime": now, "finishTime": now, "message": why, "analysisRun": run_ref}]);
                }
                let _ = Self::patch_status(
                    kube,
                    "stages",
                    &self.namespace,
                    &verification.stage,
                    json!({"freightHistory": history, "health": {"status": "Unhealthy"}}),
                );
                transcript.say(
                    "kargo",
                    format!(
                        "Stage {}: verification {phase}: {why}; Freight {alias} is not verified here, so no Stage that requests it from {} receives it",
                        verification.stage, verification.stage
                    ),
                );
            }
        }
    }

    /// Creates the AnalysisRun for a Stage's verification.
    pub(super) fn start_analysis(
        &self,
        kube: &KubeDouble,
        stage: &Value,
        references: &[Value],
        verification: &Verification,
    ) -> Result<String, String> {
        let resource = |plural: &str| {
            kube.store()
                .resource("argoproj.io", "v1alpha1", plural)
                .cloned()
                .ok_or_else(|| format!("Argo Rollouts' {plural} are not served"))
        };
        let templates_resource = resource("analysistemplates")?;
        let runs_resource = resource("analysisruns")?;
        let mut templates = Vec::new();
        for reference in references {
            if !matches!(text(reference, "/kind"), "" | "AnalysisTemplate") {
                return Err(format!(
                    "{} {} is not modelled by the ground",
                    text(reference, "/kind"),
                    text(reference, "/name")
                ));
            }
            let name = text(reference, "/name");
            let template = kube
                .store()
                .get(&templates_resource, &self.namespace, name)
                .map_err(|_| format!("AnalysisTemplate {name} not found in {}", self.namespace))?;
            templates.push(template);
        }
        let args: Vec<Value> = stage
            .pointer("/spec/verification/args")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let stage_name = &verification.stage;
        let name = format!(
            "{}.{}.{}",
            stage_name,
            next_ulid(&self.ulids),
            &verification.freight[..7]
        );
        let run = crate::rollouts::run_for(
            &templates,
            &args,
            &name,
            &self.namespace,
            json!({"kargo.akuity.io/stage": stage_label_value(stage_name), "kargo.akuity.io/freight-collection": verification.freight}),
            json!({}),
        )?;
        kube.store()
            .create(&runs_resource, &self.namespace, run, &controller_user())
            .map_err(|e| format!("AnalysisRun not created: {e}"))?;
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(status: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "argocd"},
            "spec": {"source": {"repoURL": "https://charts.example.test/stable", "chart": "web", "targetRevision": "1.0.1"}},
            "status": status})
    }

    #[test]
    fn argo_cd_health_never_asks_for_synced() {
        // [K pkg/health/checker/builtin/argocd.go]: an OutOfSync Application that Argo CD
        // reconciled after its last operation, runs the desired revision and is Healthy is
        // healthy to Kargo. (The ground used to wait for Synced.)
        let desired = vec![(
            "https://charts.example.test/stable".to_string(),
            "web".to_string(),
            "1.0.1".to_string(),
        )];
        let finished = json!({"phase": "Succeeded", "finishedAt": "2026-01-01T00:00:05Z"});
        let healthy = app(json!({"sync": {"status": "OutOfSync", "revision": "1.0.1"},
            "health": {"status": "Healthy"}, "operationState": finished,
            "reconciledAt": "2026-01-01T00:00:05Z"}));
        assert_eq!(argocd_app_health(&healthy, &desired), Ok(()));
        assert_eq!(argocd_app_health(&healthy, &[]), Ok(()));

        // A reconcile older than the operation's end is not trusted.
        let mut stale = healthy.clone();
        stale["status"]["reconciledAt"] = json!("2026-01-01T00:00:04Z");
        let issue = argocd_app_health(&stale, &desired).unwrap_err();
        assert!(issue.contains("not reconciled"), "{issue}");
        // Another revision, a sync still running, a comparison error, or Degraded are not healthy.
        let mut other = healthy.clone();
        other["status"]["sync"]["revision"] = json!("1.0.0");
        let issue = argocd_app_health(&other, &desired).unwrap_err();
        assert!(
            issue.contains("does not match the desired revision \"1.0.1\""),
            "{issue}"
        );
        let mut syncing = healthy.clone();
        syncing["operation"] = json!({"sync": {}});
        let issue = argocd_app_health(&syncing, &desired).unwrap_err();
        assert!(issue.contains("is being synced"), "{issue}");
        let mut broken = healthy.clone();
        broken["status"]["conditions"] = json!([{"type": "ComparisonError", "message": "boom"}]);
        let issue = argocd_app_health(&broken, &[]).unwrap_err();
        assert!(
            issue.contains("\"ComparisonError\" condition: boom"),
            "{issue}"
        );
        let mut degraded = healthy.clone();
        degraded["status"]["health"]["status"] = json!("Degraded");
        let issue = argocd_app_health(&degraded, &[]).unwrap_err();
        assert!(issue.contains("has health state \"Degraded\""), "{issue}");
    }
}
