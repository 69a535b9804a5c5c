//! The argocd-update step, and the revision an Application runs for a source.

use serde_json::Value;
use serde_json::json;

use crate::kargo::steps::{Outcome, StepContext, text};
use crate::kube::store::Resource;

/// The revision an Application runs for the source a `sources[]` update names (matched by
/// repoURL and chart): `status.sync.revisions[i]` for a multi-source Application, else
/// `status.sync.revision`.
pub fn synced_revision(app: &Value, wanted: &Value) -> Option<String> {
    let (repo, chart) = (text(wanted, "repoURL"), text(wanted, "chart"));
    let matches =
        |s: &Value| text(s, "repoURL") == repo && (chart.is_empty() || text(s, "chart") == chart);
    match app.pointer("/spec/sources").and_then(Value::as_array) {
        Some(list) => {
            let at = list.iter().position(matches)?;
            app.pointer(&format!("/status/sync/revisions/{at}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        None => app
            .pointer("/spec/source")
            .filter(|s| matches(s))
            .and_then(|_| app.pointer("/status/sync/revision"))
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// The operation info naming the Promotion that started a sync.
const PROMOTION_INFO: &str = "Promotion";

/// [K pkg/promotion/runner/builtin/argocd_updater.go]: every Application must exist and carry
/// `kargo.akuity.io/authorized-stage: <project>:<stage>` (comma-separated list allowed; globs
/// refused) naming this Stage, or the step Errors; then a sync operation is started on each
/// (initiated by kargo-controller, its info naming the Promotion) and the step waits until
/// Argo CD reports each operation's result: Succeeded completes it, Failed or Error Errors it.
pub(super) fn argocd_update(ctx: &StepContext, config: &Value) -> Outcome {
    let errored = |said: String| Outcome::Errored { said };
    let Some(resource) = ctx
        .kube
        .store()
        .resource("argoproj.io", "v1alpha1", "applications")
        .cloned()
    else {
        return errored(
            "Argo CD integration is disabled on this controller; cannot update Argo CD Application resources".into(),
        );
    };
    let mut waiting = Vec::new();
    let mut synced = Vec::new();
    for update in config
        .get("apps")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(update, "name");
        let namespace = match text(update, "namespace") {
            "" => "argocd",
            n => n,
        };
        match update_application(ctx, &resource, update, name, namespace) {
            Ok(SyncState::Succeeded) => synced.push(name.to_string()),
            Ok(SyncState::Running) => waiting.push(name.to_string()),
            Err(said) => return errored(said),
        }
    }
    if waiting.is_empty() {
        Outcome::Done {
            output: json!({}),
            said: format!(
                "sync operations Succeeded for {}; Applications will be verified Synced and Healthy",
                synced.join(", ")
            ),
        }
    } else {
        Outcome::Waiting {
            said: format!("Argo CD is syncing {}", waiting.join(", ")),
        }
    }
}

/// Where one Application's sync for this Promotion stands.
enum SyncState {
    /// Our operation Succeeded at the desired revision of every named source.
    Succeeded,
    /// Our operation (or another) runs or is queued, or ours was just started.
    Running,
}

/// One Application of the step: found, permitting this Stage, its source updates matched;
/// then its sync: started when none of ours runs (or ours finished short of the desired
/// revisions) and no other operation is queued. The error is the step's message.
fn update_application(
    ctx: &StepContext,
    resource: &Resource,
    update: &Value,
    name: &str,
    namespace: &str,
) -> Result<SyncState, String> {
    let Ok(app) = ctx.kube.store().get(resource, namespace, name) else {
        return Err(format!(
            "unable to find Argo CD Application {name:?} in namespace {namespace:?}"
        ));
    };
    authorize(ctx, &app, name, namespace)?;
    match_sources(&app, update, name, namespace)?;
    let ours = |state: &Value| {
        state
            .pointer("/operation/info")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|i| text(i, "name") == PROMOTION_INFO && text(i, "value") == ctx.promotion)
    };
    let state = app
        .pointer("/status/operationState")
        .cloned()
        .unwrap_or(Value::Null);
    // [K argocd_updater.go mustPerformUpdate]: a finished sync whose result is not the
    // desired revision of every named source is started again.
    let reached = update
        .get("sources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|w| !text(w, "desiredRevision").is_empty())
        .all(|w| synced_revision(&app, w).as_deref() == Some(text(w, "desiredRevision")));
    if ours(&state) {
        match text(&state, "phase") {
            "Succeeded" if reached => return Ok(SyncState::Succeeded),
            "Succeeded" => {}
            "Failed" | "Error" => {
                return Err(format!(
                    "sync operation of Argo CD Application {name:?} {}: {}",
                    text(&state, "phase"),
                    text(&state, "message")
                ));
            }
            _ => return Ok(SyncState::Running),
        }
    }
    if app.get("operation").is_some_and(|o| !o.is_null()) {
        // Our operation is queued, or another one runs: wait for it.
        return Ok(SyncState::Running);
    }
    let operation = json!({"operation": {
        "initiatedBy": {"username": "kargo-controller", "automated": false},
        "info": [{"name": "Reason", "value": "Promotion triggered a sync of this Application resource."},
                 {"name": PROMOTION_INFO, "value": ctx.promotion}],
        "sync": {"revision": app.pointer("/spec/source/targetRevision").cloned().unwrap_or(json!("HEAD"))}}});
    let patched = ctx.kube.store().patch(
        resource,
        namespace,
        name,
        crate::kube::store::PatchBody::Merge(operation),
        &crate::kargo::controller_user(),
        false,
    );
    if let Err(e) = patched {
        return Err(format!(
            "unable to update Argo CD Application {name:?}: {e}"
        ));
    }
    Ok(SyncState::Running)
}

/// The Application's `kargo.akuity.io/authorized-stage` annotation names this Stage of this
/// project (a comma-separated list of `<project>:<stage>`; globs and malformed entries refused).
fn authorize(ctx: &StepContext, app: &Value, name: &str, namespace: &str) -> Result<(), String> {
    let project = &ctx.kargo.namespace;
    let refused = format!(
        "Argo CD Application {name:?} in namespace {namespace:?} does not permit mutation by Kargo Stage {} in namespace {project}",
        ctx.stage
    );
    let annotation = app
        .pointer("/metadata/annotations")
        .and_then(|a| a.get("kargo.akuity.io/authorized-stage"))
        .and_then(Value::as_str);
    let Some(annotation) = annotation else {
        return Err(refused);
    };
    let mut allowed = false;
    for entry in annotation
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        match entry.split_once(':').map(|(p, s)| (p.trim(), s.trim())) {
            Some((p, s)) if !p.is_empty() && !s.is_empty() && !entry.contains('*') => {
                allowed |= p == project && s == ctx.stage;
            }
            _ => {
                return Err(format!(
                    "unable to parse value of annotation \"kargo.akuity.io/authorized-stage\" ({annotation:?}) on Argo CD Application {name:?} in namespace {namespace:?}: invalid authorized Stage {entry:?}"
                ));
            }
        }
    }
    if !allowed {
        return Err(refused);
    }
    Ok(())
}

/// [K argocd_updater.go buildDesiredSources]: every source update must match one of the
/// Application's sources exactly (repoURL, and chart when given).
fn match_sources(app: &Value, update: &Value, name: &str, namespace: &str) -> Result<(), String> {
    let sources: Vec<Value> = match app.pointer("/spec/sources").and_then(Value::as_array) {
        Some(list) => list.clone(),
        None => app.pointer("/spec/source").cloned().into_iter().collect(),
    };
    for wanted in update
        .get("sources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (repo, chart) = (text(wanted, "repoURL"), text(wanted, "chart"));
        let matched = sources
            .iter()
            .any(|s| text(s, "repoURL") == repo && (chart.is_empty() || text(s, "chart") == chart));
        if !matched {
            return Err(if chart.is_empty() {
                format!(
                    "no source of Argo CD Application {name:?} in namespace {namespace:?} matched update for source with repoURL {repo}"
                )
            } else {
                format!(
                    "no source of Argo CD Application {name:?} in namespace {namespace:?} matched update for source with repoURL {repo} and chart {chart:?}"
                )
            });
        }
    }
    Ok(())
}
