//! The report's room for the details: each Application's changes, grouped by distinct change.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use super::escape::{code, text, value_text};
use crate::gate::diff::{
    AppDiff, AppStatus, CrdVersion, FieldChange, ObjectChange, ObjectsDiff, is_crd_version_field,
};
use crate::gate::text::clip;
use crate::gate::verdict::{GateResult, Outcome};

/// The Markdown text of an `ObjectsDiff`, made once per shared diff: Applications whose pair
/// of renders is the same share one `Arc` (see `Differ`), and a CRD-heavy chart's changes
/// hold thousands of schema fields to filter.
#[derive(Default)]
struct ObjectsText {
    chart_only: HashMap<*const ObjectsDiff, String>,
    objects: HashMap<*const ObjectsDiff, String>,
}

impl ObjectsText {
    fn chart_only(&mut self, diff: &Arc<ObjectsDiff>) -> &str {
        self.chart_only
            .entry(Arc::as_ptr(diff))
            .or_insert_with(|| chart_only_lines(diff))
    }

    fn objects(&mut self, diff: &Arc<ObjectsDiff>) -> &str {
        self.objects
            .entry(Arc::as_ptr(diff))
            .or_insert_with(|| object_lines(diff))
    }
}

/// The fields of a change listed line by line: for a CRD, those the CRD table does not
/// summarise (versions, served and storage flags, schemas).
fn listed_fields(change: &ObjectChange) -> impl Iterator<Item = &FieldChange> {
    change
        .fields
        .iter()
        .filter(|f| change.crd.is_none() || !is_crd_version_field(&f.path))
}

/// A line per object added and per object removed, indented by `indent`.
fn added_and_removed(out: &mut String, diff: &ObjectsDiff, indent: &str) {
    for object in &diff.added {
        let _ = writeln!(out, "{indent}- added {}", code(&object.to_string()));
    }
    for object in &diff.removed {
        let _ = writeln!(out, "{indent}- removed {}", code(&object.to_string()));
    }
}

/// The chart's own change, as the nested lines under its heading.
fn chart_only_lines(chart_only: &ObjectsDiff) -> String {
    let mut out = String::new();
    added_and_removed(&mut out, chart_only, "  ");
    for change in &chart_only.changed {
        let fields: Vec<String> = listed_fields(change)
            .take(20)
            .map(|f| code(&f.path))
            .collect();
        if change.crd.is_some() && fields.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "  - changed {}: {}",
            code(&change.object.to_string()),
            fields.join(", ")
        );
    }
    crd_table(&mut out, &chart_only.changed, "  ");
    out
}

/// Every object added, removed and changed, with the CRD table.
fn object_lines(objects: &ObjectsDiff) -> String {
    let mut out = String::new();
    added_and_removed(&mut out, objects, "");
    for change in &objects.changed {
        // A CRD's schema diff runs to thousands of lines on real charts: its versions and
        // schema field counts are in the table below (`--json` has every field); its other
        // fields (labels, names, conversion) are listed here.
        let shown: Vec<_> = listed_fields(change).collect();
        if change.crd.is_some() && shown.is_empty() {
            continue;
        }
        let _ = writeln!(out, "- changed {}", code(&change.object.to_string()));
        for field in shown {
            let _ = writeln!(
                out,
                "  - {}: {} → {}",
                code(&field.path),
                code(&clip(&value_text(&field.old), 80)),
                code(&clip(&value_text(&field.new), 80))
            );
        }
    }
    crd_table(&mut out, &objects.changed, "");
    out
}

/// The Markdown lines of one Application's changes (identical for Applications that change the
/// same way, whatever their names).
fn app_changes(app: &AppDiff, texts: &mut ObjectsText) -> String {
    let mut out = String::new();
    if !app.application_fields.is_empty() {
        let paths: Vec<String> = app
            .application_fields
            .iter()
            .take(10)
            .map(|f| code(&f.path))
            .collect();
        let _ = writeln!(
            out,
            "- the Application itself: {}{}",
            paths.join(", "),
            if app.application_fields.len() > paths.len() {
                format!(" and {} more", app.application_fields.len() - paths.len())
            } else {
                String::new()
            }
        );
    }
    for chart_move in &app.chart_moves {
        let _ = writeln!(
            out,
            "- chart {} {} → {}",
            code(&chart_move.chart),
            code(&chart_move.from),
            code(&chart_move.to)
        );
    }
    if let Some(chart_only) = &app.chart_only {
        let _ = writeln!(
            out,
            "- the chart's own change (this change's values at both versions):"
        );
        out.push_str(texts.chart_only(chart_only));
        let _ = writeln!(out, "- everything this change deploys differently:");
    }
    out.push_str(texts.objects(&app.objects));
    out
}

/// The CustomResourceDefinitions among `changes` as one table: versions (served, storage)
/// at both commits and schema fields added, removed and changed.
fn crd_table(out: &mut String, changes: &[ObjectChange], indent: &str) {
    let rows: Vec<_> = changes
        .iter()
        .filter_map(|c| Some((c, c.crd.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let versions = |list: &[CrdVersion]| -> String {
        let shown: Vec<String> = list
            .iter()
            .map(|v| {
                let flags = match (v.served, v.storage) {
                    (true, true) => "served, storage",
                    (true, false) => "served",
                    (false, true) => "not served, storage",
                    (false, false) => "not served",
                };
                format!("{} ({flags})", code(&v.name))
            })
            .collect();
        if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join(", ")
        }
    };
    let _ = writeln!(
        out,
        "\n{indent}| CustomResourceDefinition | versions at the merge base | versions at the head | schema fields added / removed / changed (versions at both) |\n{indent}|---|---|---|---|"
    );
    for (change, crd) in rows {
        let _ = writeln!(
            out,
            "{indent}| {} | {} | {} | {} / {} / {} |",
            code(&change.object.name),
            versions(&crd.before),
            versions(&crd.after),
            crd.schema_fields_added,
            crd.schema_fields_removed,
            crd.schema_fields_changed
        );
    }
    out.push('\n');
}

pub(super) fn details_section(result: &GateResult) -> String {
    if result.verdict.outcome == Outcome::Undecided {
        return String::new();
    }
    let diff = &result.diff;
    if diff.applications.is_empty() {
        return "\nThe render is identical at both commits.\n".to_string();
    }
    let mut out = String::new();
    // The generated Applications themselves: each distinct field change once, with the
    // Applications it applies to (an ApplicationSet change reaches many at once).
    let mut groups: Vec<(String, String, String, Vec<String>)> = Vec::new();
    let mut index: HashMap<(String, String, String), usize> = HashMap::new();
    for app in &diff.applications {
        for field in &app.application_fields {
            let (old, new) = (
                clip(&value_text(&field.old), 80),
                clip(&value_text(&field.new), 80),
            );
            let name = format!("{}/{}", app.app.namespace, app.app.name);
            let key = (field.path.clone(), old, new);
            match index.get(&key) {
                Some(&at) => groups[at].3.push(name),
                None => {
                    index.insert(key.clone(), groups.len());
                    groups.push((key.0, key.1, key.2, vec![name]));
                }
            }
        }
    }
    if !groups.is_empty() {
        let _ = writeln!(out, "\n**The generated Applications change**\n");
        for (path, old, new, apps) in &groups {
            let shown: Vec<String> = apps.iter().take(5).map(|a| code(a)).collect();
            let more = if apps.len() > shown.len() {
                format!(" and {} more", apps.len() - shown.len())
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "- {} Application{}: {} {} → {} ({}{more})",
                apps.len(),
                crate::plural(apps.len()),
                code(path),
                code(&clip(old, 80)),
                code(&clip(new, 80)),
                shown.join(", ")
            );
        }
    }
    let _ = writeln!(
        out,
        "\n<details><summary>What this change deploys ({} Applications)</summary>\n",
        diff.applications.len()
    );
    // Applications whose changes read the same (one ApplicationSet's change on every
    // cluster) are shown once, with the list of where they apply: the report grows with the
    // distinct changes, not with the Applications.
    let mut groups: Vec<(String, String, Vec<String>)> = Vec::new();
    let mut index: HashMap<(&'static str, String), usize> = HashMap::new();
    let mut texts = ObjectsText::default();
    for app in &diff.applications {
        let status = match app.status {
            AppStatus::Added => "added",
            AppStatus::Removed => "removed",
            AppStatus::Changed => "changed",
        };
        let body = app_changes(app, &mut texts);
        let name = format!(
            "{}/{} on {}",
            app.app.namespace, app.app.name, app.app.cluster
        );
        match index.get(&(status, body.clone())) {
            Some(&at) => groups[at].2.push(name),
            None => {
                index.insert((status, body.clone()), groups.len());
                groups.push((status.to_string(), body, vec![name]));
            }
        }
    }
    for (status, body, apps) in &groups {
        if apps.len() == 1 {
            let _ = writeln!(out, "#### {} ({status})\n", text(&apps[0]));
        } else {
            let shown: Vec<String> = apps.iter().take(8).map(|a| text(a)).collect();
            let _ = writeln!(
                out,
                "#### {} Applications ({status}): {}{}\n",
                apps.len(),
                shown.join(", "),
                if apps.len() > shown.len() {
                    format!(" and {} more", apps.len() - shown.len())
                } else {
                    String::new()
                }
            );
        }
        out.push_str(body);
        out.push('\n');
    }
    let _ = writeln!(out, "</details>");
    out
}
