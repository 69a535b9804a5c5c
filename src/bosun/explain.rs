//! Green gates explained: what a change does, in a few lines a reviewer reads before merging,
//! grounded only in the gate's published report (its `summary` and `verdict` blocks). Every
//! name, version and value in it comes from a chart or the repository, so each is escaped.

use crate::gate::report::{Summary, code, text};
use crate::gate::verdict::Verdict;

/// How many chart defaults the comment lists (the report has the rest).
const DEFAULTS_SHOWN: usize = 5;

fn value(v: &serde_json::Value) -> String {
    let s = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "(unset)".into(),
        other => other.to_string(),
    };
    if s.chars().count() > 60 {
        format!("{}…", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

/// The explanation's lines (Markdown), or none when the report carries no summary.
pub fn lines(summary: &Summary, verdict: &Verdict) -> Vec<String> {
    let mut out = Vec::new();
    for c in &summary.charts {
        out.push(format!(
            "Chart {} {} → {} ({} Application{} on {})",
            code(&c.chart),
            code(&c.from),
            code(&c.to),
            c.applications,
            crate::plural(c.applications),
            c.clusters
                .iter()
                .map(|x| text(x))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !summary.images.is_empty() {
        out.push(format!(
            "Images: {}",
            summary
                .images
                .iter()
                .map(|i| format!("{} {} → {}", code(&i.image), code(&i.from), code(&i.to)))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if !summary.crds.is_empty() {
        out.push(format!(
            "CustomResourceDefinitions: {}",
            summary
                .crds
                .iter()
                .map(|c| {
                    let list = |v: &[String]| {
                        if v.is_empty() {
                            "none".to_string()
                        } else {
                            v.iter().map(|x| text(x)).collect::<Vec<_>>().join(", ")
                        }
                    };
                    format!(
                        "{} served {} → {}",
                        code(&c.name),
                        list(&c.before),
                        list(&c.after)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if summary.rbac_added + summary.rbac_removed > 0 {
        out.push(format!(
            "RBAC: {} object{} added, {} removed",
            summary.rbac_added,
            crate::plural(summary.rbac_added),
            summary.rbac_removed
        ));
    }
    let c = &verdict.counts;
    out.push(format!(
        "Rendered objects: {} added, {} removed, {} changed, in {} Application{}",
        c.objects_added,
        c.objects_removed,
        c.objects_changed,
        c.applications_changed + c.applications_added + c.applications_removed,
        crate::plural(c.applications_changed + c.applications_added + c.applications_removed)
    ));
    if !summary.defaults.is_empty() {
        let shown: Vec<String> = summary
            .defaults
            .iter()
            .take(DEFAULTS_SHOWN)
            .map(|d| {
                format!(
                    "{} {} → {}",
                    code(&d.path),
                    code(&value(&d.old)),
                    code(&value(&d.new))
                )
            })
            .collect();
        let more = summary.defaults.len().saturating_sub(DEFAULTS_SHOWN);
        out.push(format!(
            "Chart defaults that changed: {}{}",
            shown.join("; "),
            if more > 0 {
                format!(" (and {more} more in the gate's report)")
            } else {
                String::new()
            }
        ));
    }
    if summary.more > 0 {
        out.push(format!(
            "…and {} more items in the gate's report",
            summary.more
        ));
    }
    out
}

/// The comment's section: a heading line, then the lines as a list.
pub fn section(summary: &Summary, verdict: &Verdict) -> String {
    let mut out = String::from("What this change does (from the gate's report):\n\n");
    for line in lines(summary, verdict) {
        out.push_str("- ");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::report::{SummaryChart, SummaryCrd, SummaryDefault, SummaryImage};
    use serde_json::json;

    #[test]
    fn chart_controlled_text_cannot_open_a_heading_a_link_or_a_comment() {
        let summary = Summary {
            charts: vec![SummaryChart {
                chart: "c\n# Approved".into(),
                from: "1.0.0".into(),
                to: "[x](https://evil)".into(),
                clusters: vec!["<!-- bosun:triage".into()],
                applications: 1,
            }],
            images: vec![SummaryImage {
                image: "repo".into(),
                from: "v1".into(),
                to: "v2`<b>".into(),
            }],
            crds: vec![SummaryCrd {
                name: "x.example".into(),
                before: vec!["v1".into()],
                after: vec![],
            }],
            rbac_added: 1,
            rbac_removed: 2,
            defaults: vec![SummaryDefault {
                chart: "c".into(),
                path: "a.b".into(),
                old: json!(false),
                new: json!(true),
            }],
            more: 0,
        };
        let verdict: Verdict = serde_json::from_value(json!({
            "outcome": "green", "base": "b", "head": "h",
            "counts": {"applicationsAdded": 0, "applicationsRemoved": 0, "applicationsChanged": 1,
                       "objectsAdded": 1, "objectsRemoved": 2, "objectsChanged": 3},
            "blocking": {}, "repositoryConsumers": 0, "errors": []
        }))
        .unwrap();
        let text = section(&summary, &verdict);
        assert!(
            !text.contains("<!--") && !text.contains("\n#") && !text.contains("[x]("),
            "{text}"
        );
        assert!(text.contains("RBAC: 1 object added, 2 removed"), "{text}");
        assert!(
            text.contains("Rendered objects: 1 added, 2 removed, 3 changed, in 1 Application\n"),
            "{text}"
        );
    }
}
