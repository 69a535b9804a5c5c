//! The report's room for the `summary` block: what a change did, bounded and clipped.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::blocks::machine_block;
use crate::gate::diff::{CrdVersion, ObjectChange, ObjectKey};
use crate::gate::text::clip;
use crate::gate::verdict::GateResult;
use crate::names::{is_dns1035_label, is_dns1123_subdomain};

/// What a change did, compactly, for a reader who explains a green gate (the `summary` block):
/// the chart moves, the images whose tags moved, CRDs whose served versions changed or that
/// came and went, RBAC objects added and removed, and the first chart defaults that changed.
/// Bounded: at most `SUMMARY_ITEMS` of each list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    #[serde(default)]
    pub charts: Vec<SummaryChart>,
    #[serde(default)]
    pub images: Vec<SummaryImage>,
    #[serde(default)]
    pub crds: Vec<SummaryCrd>,
    #[serde(default)]
    pub rbac_added: usize,
    #[serde(default)]
    pub rbac_removed: usize,
    #[serde(default)]
    pub defaults: Vec<SummaryDefault>,
    /// Items left out of the lists above.
    #[serde(default)]
    pub more: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SummaryChart {
    pub chart: String,
    pub from: String,
    pub to: String,
    pub clusters: Vec<String>,
    pub applications: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryImage {
    pub image: String,
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryCrd {
    pub name: String,
    /// Served versions at the base (empty: the CRD is new).
    pub before: Vec<String>,
    /// Served versions at the head (empty: the CRD is gone).
    pub after: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryDefault {
    pub chart: String,
    pub path: String,
    pub old: Value,
    pub new: Value,
}

/// At most this many items per list of the `summary` block.
pub const SUMMARY_ITEMS: usize = 20;

/// The most characters the `summary` block may take, as written.
pub(super) const SUMMARY_BUDGET: usize = 12_000;

/// Each text of the `summary` block is clipped to this many characters, so the block stays a
/// few kilobytes whatever a chart holds.
const SUMMARY_TEXT: usize = 120;

fn clip_text(s: &str) -> String {
    clip(s, SUMMARY_TEXT)
}

fn clip_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(clip_text(&s)),
        Value::Array(_) | Value::Object(_) => {
            let text = v.to_string();
            if text.chars().count() > SUMMARY_TEXT {
                Value::String(clip_text(&text))
            } else {
                v
            }
        }
        other => other,
    }
}

/// An image reference split at its tag or digest: (repository, tag).
pub(super) fn split_image(image: &str) -> (String, String) {
    // `name:tag@digest`: the tag is what moved (the digest pins it).
    let (image, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let tagged = image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/'));
    if let (None, Some(digest)) = (tagged, digest) {
        return (image.to_string(), digest.to_string());
    }
    match tagged {
        Some((repo, tag)) if !tag.contains('/') => (repo.to_string(), tag.to_string()),
        _ => (image.to_string(), "latest".to_string()),
    }
}

impl Summary {
    /// The summary of a check's result.
    pub fn of(result: &GateResult) -> Summary {
        let objects = ObjectChanges::of(result);
        let (mut charts, mut images, mut crds) =
            (chart_moves(result), objects.images, objects.crds);
        let (mut defaults, mut more) = chart_defaults(result);
        for (len, keep) in [
            (charts.len(), SUMMARY_ITEMS),
            (images.len(), SUMMARY_ITEMS),
            (crds.len(), SUMMARY_ITEMS),
            (defaults.len(), SUMMARY_ITEMS),
        ] {
            more += len.saturating_sub(keep);
        }
        charts.truncate(SUMMARY_ITEMS);
        images.truncate(SUMMARY_ITEMS);
        crds.truncate(SUMMARY_ITEMS);
        defaults.truncate(SUMMARY_ITEMS);
        let mut summary = Summary {
            charts,
            images,
            crds,
            rbac_added: objects.rbac_added,
            rbac_removed: objects.rbac_removed,
            defaults,
            more,
        };
        summary.fit_budget();
        summary
    }

    /// A budget on the block as written (escaping can grow a text sixfold): the longest lists
    /// give way first, and `more` counts what went.
    fn fit_budget(&mut self) {
        while machine_block("summary", &*self).len() > SUMMARY_BUDGET {
            let lists = [
                self.defaults.len(),
                self.images.len(),
                self.crds.len(),
                self.charts.len(),
            ];
            let Some((longest, _)) = lists.iter().enumerate().max_by_key(|(_, n)| **n) else {
                break;
            };
            match longest {
                0 if !self.defaults.is_empty() => drop(self.defaults.pop()),
                1 if !self.images.is_empty() => drop(self.images.pop()),
                2 if !self.crds.is_empty() => drop(self.crds.pop()),
                3 if !self.charts.is_empty() => drop(self.charts.pop()),
                _ => break,
            }
            self.more += 1;
        }
    }
}

/// Each chart version move once, with the Applications that make it and their first clusters.
fn chart_moves(result: &GateResult) -> Vec<SummaryChart> {
    let mut charts: Vec<SummaryChart> = Vec::new();
    for app in &result.diff.applications {
        for m in &app.chart_moves {
            match charts
                .iter_mut()
                .find(|c| c.chart == m.chart && c.from == m.from && c.to == m.to)
            {
                Some(c) => {
                    c.applications += 1;
                    let cluster = clip_text(&app.app.cluster);
                    if c.clusters.len() < 10 && !c.clusters.contains(&cluster) {
                        c.clusters.push(cluster);
                    }
                }
                None => charts.push(SummaryChart {
                    chart: clip_text(&m.chart),
                    from: clip_text(&m.from),
                    to: clip_text(&m.to),
                    clusters: vec![clip_text(&app.app.cluster)],
                    applications: 1,
                }),
            }
        }
    }
    charts
}

/// The chart defaults that changed, clipped, and how many more each move has.
fn chart_defaults(result: &GateResult) -> (Vec<SummaryDefault>, usize) {
    let mut defaults = Vec::new();
    let mut more = 0;
    for d in &result.chart_defaults {
        for change in &d.changes {
            defaults.push(SummaryDefault {
                chart: clip_text(&d.chart),
                path: clip_text(&change.path),
                old: clip_value(change.old.clone().unwrap_or(Value::Null)),
                new: clip_value(change.new.clone().unwrap_or(Value::Null)),
            });
        }
        more += d.more;
    }
    (defaults, more)
}

const RBAC: [&str; 4] = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];

fn is_rbac(k: &ObjectKey) -> bool {
    k.group == "rbac.authorization.k8s.io" && RBAC.contains(&k.kind.as_str())
}

fn is_crd(k: &ObjectKey) -> bool {
    k.group == "apiextensions.k8s.io" && k.kind == "CustomResourceDefinition"
}

/// What the objects of a change did: images whose tags moved, CRDs that came, went or serve
/// other versions, RBAC objects added and removed.
#[derive(Default)]
struct ObjectChanges {
    images: Vec<SummaryImage>,
    crds: Vec<SummaryCrd>,
    rbac_added: usize,
    rbac_removed: usize,
}

impl ObjectChanges {
    fn of(result: &GateResult) -> ObjectChanges {
        let mut out = ObjectChanges::default();
        let mut seen_objects = BTreeSet::new();
        let mut diffs_read = HashSet::new();
        for app in &result.diff.applications {
            // Each object once across clusters (the same RBAC on three clusters is one change
            // to explain). Applications sharing one diff (one chart on many clusters) add
            // nothing after the first: it is read once.
            if !diffs_read.insert(Arc::as_ptr(&app.objects)) {
                continue;
            }
            for key in &app.objects.added {
                if is_rbac(key) && seen_objects.insert(("+", key.clone())) {
                    out.rbac_added += 1;
                }
                if is_crd(key)
                    && is_dns1123_subdomain(&key.name)
                    && seen_objects.insert(("+", key.clone()))
                {
                    out.crds.push(SummaryCrd {
                        name: clip_text(&key.name),
                        before: vec![],
                        after: vec!["(new)".into()],
                    });
                }
            }
            for key in &app.objects.removed {
                if is_rbac(key) && seen_objects.insert(("-", key.clone())) {
                    out.rbac_removed += 1;
                }
                if is_crd(key)
                    && is_dns1123_subdomain(&key.name)
                    && seen_objects.insert(("-", key.clone()))
                {
                    out.crds.push(SummaryCrd {
                        name: clip_text(&key.name),
                        before: vec!["(removed)".into()],
                        after: vec![],
                    });
                }
            }
            for change in &app.objects.changed {
                out.image_moves(change);
                if let Some(crd) = served_versions_moved(change)
                    && seen_objects.insert(("~", change.object.clone()))
                {
                    out.crds.push(crd);
                }
            }
        }
        out
    }

    /// The images of a changed object whose tag (or repository) moved, each once.
    fn image_moves(&mut self, change: &ObjectChange) {
        for field in change.fields.iter() {
            if !(field.path.ends_with(".image") || field.path == "image") {
                continue;
            }
            let (Some(Value::String(old)), Some(Value::String(new))) = (&field.old, &field.new)
            else {
                continue;
            };
            let ((repo, from), (new_repo, to)) = (split_image(old), split_image(new));
            let image = if repo == new_repo {
                repo
            } else {
                format!("{repo} → {new_repo}")
            };
            let item = SummaryImage {
                image: clip_text(&image),
                from: clip_text(&from),
                to: clip_text(&to),
            };
            if !self.images.contains(&item) {
                self.images.push(item);
            }
        }
    }
}

/// A changed CRD whose served versions differ between the commits, when its names are ones
/// Kubernetes accepts.
fn served_versions_moved(change: &ObjectChange) -> Option<SummaryCrd> {
    let crd = change.crd.as_ref()?;
    let served = |v: &[CrdVersion]| -> Vec<String> {
        v.iter()
            .filter(|x| x.served)
            .map(|x| clip_text(&x.name))
            .collect()
    };
    let (before, after) = (served(&crd.before), served(&crd.after));
    // A name Kubernetes would reject never reaches a machine block (the `crd-name-invalid`
    // finding names it, quoted and cut, for people).
    let valid = is_dns1123_subdomain(&change.object.name)
        && crd
            .before
            .iter()
            .chain(&crd.after)
            .all(|v| is_dns1035_label(&v.name));
    (valid && before != after).then(|| SummaryCrd {
        name: clip_text(&change.object.name),
        before,
        after,
    })
}
