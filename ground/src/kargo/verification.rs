//! Verification after a promotion: health first, then an AnalysisRun's verdict.

use super::*;

impl Kargo {
    /// After a successful promotion: wait until the Applications an `argocd-update` step named
    /// are Synced (at the merged revision, when known) and Healthy ([K docs 60-verification]:
    /// Kargo waits for them before verification, and without verification success is health).
    /// With `spec.verification.analysisTemplates`, an AnalysisRun is then created from them and
    /// the Stage's args, and its verdict decides: Successful verifies the Freight in the Stage
    /// (so a Stage that requests it from this one may take it); Failed, Error or Inconclusive
    /// records the failure and the Freight stays unverified.
    pub(super) fn verify(&mut self, kube: &KubeDouble, transcript: &Transcript) -> bool {
        let mut progress = false;
        let mut remaining = Vec::new();
        for mut verification in std::mem::take(&mut self.verifications) {
            let resource = kube
                .store()
                .resource("argoproj.io", "v1alpha1", "applications")
                .cloned();
            let ready = verification.apps.iter().all(|(namespace, app)| {
                let Some(resource) = &resource else {
                    return false;
                };
                let Ok(object) = kube.store().get(resource, namespace, app) else {
                    return false;
                };
                // [K pkg/health/checker/builtin/argocd.go]: the revision each named source
                // runs (status.sync.revision or revisions[i]) must be the desired one.
                let runs_desired = verification
                    .desired
                    .iter()
                    .filter(|(ns, name, ..)| ns == namespace && name == app)
                    .all(|(_, _, repo, chart, revision)| {
                        let wanted = json!({"repoURL": repo, "chart": chart});
                        steps::synced_revision(&object, &wanted).as_deref()
                            == Some(revision.as_str())
                    });
                text(&object, "/status/sync/status") == "Synced"
                    && text(&object, "/status/health/status") == "Healthy"
                    && runs_desired
            });
            if !ready && verification.analysis_run.is_none() {
                remaining.push(verification);
                continue;
            }
            let stage_object = Self::get(kube, "stages", &self.namespace, &verification.stage)
                .unwrap_or(Value::Null);
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
                    None => {
                        match self.start_analysis(kube, &stage_object, &templates, &verification) {
                            Ok(run) => {
                                transcript.say(
                                    "kargo",
                                    format!(
                                        "Stage {}: {healthy}; verification started: AnalysisRun {run}",
                                        verification.stage
                                    ),
                                );
                                verification.analysis_run = Some(run);
                                remaining.push(verification);
                                progress = true;
                                continue;
                            }
                            Err(e) => Err(("Error".to_string(), e)),
                        }
                    }
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
                            _ => {
                                remaining.push(verification);
                                continue;
                            }
                        }
                    }
                }
            };
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
            match &outcome {
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
                    let said = if templates.is_empty() {
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
            progress = true;
        }
        self.verifications = remaining;
        progress
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
