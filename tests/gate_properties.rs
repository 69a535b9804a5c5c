//! Property tests of the gate's pure core: the diff and the report's machine blocks.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

use gitops_loop::gate::diff::{self, AppStatus};
use gitops_loop::gate::report;
use gitops_loop::gate::rules::{self, Consumer, DroppedServedVersion, Finding, Severity};
use gitops_loop::gate::verdict::{GateResult, Outcome, Verdict};
use gitops_loop::render::{ClusterRef, Origin, RenderedApplication, Rendering};
use proptest::prelude::*;
use serde_json::{Value, json};

fn object(kind: &str, name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "data": {"k": value}})
}

fn app(cluster: &str, name: &str, objects: Vec<Value>) -> RenderedApplication {
    RenderedApplication {
        name: name.to_string(),
        namespace: "argocd".into(),
        project: "default".into(),
        origin: Origin::File {
            path: "x.yaml".into(),
            document: 0,
        },
        cluster: ClusterRef {
            name: cluster.to_string(),
            server: format!("https://{cluster}"),
        },
        destination_namespace: "default".into(),
        sources: vec![],
        objects: objects.into_iter().map(std::sync::Arc::new).collect(),
        render_keys: vec![],
        manifest: serde_json::Value::Null,
        stored: serde_json::Value::Null,
        destination_unknown: None,
        values_files: Vec::new(),
    }
}

fn rendering_strategy() -> impl Strategy<Value = Rendering> {
    let objects =
        prop::collection::btree_map(("[a-c]", "[a-d]"), "[a-z]{0,3}", 0..6).prop_map(|m| {
            m.into_iter()
                .map(|((kind, name), value)| object(&kind.to_uppercase(), &name, &value))
                .collect::<Vec<_>>()
        });
    prop::collection::btree_map(("[xy]", "[a-d]"), objects, 0..5).prop_map(|apps| Rendering {
        revision: "0".into(),
        applications: apps
            .into_iter()
            .map(|((cluster, name), objects)| app(&cluster, &name, objects))
            .collect(),
        diagnostics: vec![],
        stats: Default::default(),
    })
}

proptest! {
    #[test]
    fn a_render_diffed_with_itself_is_empty(rendering in rendering_strategy()) {
        let d = diff::diff(&rendering, &rendering);
        prop_assert!(d.applications.is_empty());
        prop_assert_eq!(d.counts, Default::default());
    }

    #[test]
    fn swapping_base_and_head_swaps_added_and_removed(base in rendering_strategy(), head in rendering_strategy()) {
        let forward = diff::diff(&base, &head);
        let backward = diff::diff(&head, &base);
        prop_assert_eq!(forward.applications.len(), backward.applications.len());
        prop_assert_eq!(forward.counts.applications_added, backward.counts.applications_removed);
        prop_assert_eq!(forward.counts.objects_added, backward.counts.objects_removed);
        prop_assert_eq!(forward.counts.objects_changed, backward.counts.objects_changed);
        for (f, b) in forward.applications.iter().zip(&backward.applications) {
            prop_assert_eq!(&f.app, &b.app);
            prop_assert_eq!(&f.objects.added, &b.objects.removed);
            prop_assert_eq!(&f.objects.removed, &b.objects.added);
            let expected = match f.status { AppStatus::Added => AppStatus::Removed, AppStatus::Removed => AppStatus::Added, s => s };
            prop_assert_eq!(b.status, expected);
        }
    }

    #[test]
    fn the_diff_json_round_trips(base in rendering_strategy(), head in rendering_strategy()) {
        let d = diff::diff(&base, &head);
        let json = serde_json::to_value(&d).unwrap();
        let back: diff::RenderDiff = serde_json::from_value(json.clone()).unwrap();
        prop_assert_eq!(&back, &d);
        // Every change an Application names exists once in the table and names it back.
        let changes = json["changes"].as_array().unwrap();
        for (i, change) in changes.iter().enumerate() {
            prop_assert_eq!(change["id"].as_u64(), Some(i as u64));
        }
        for app in json["applications"].as_array().unwrap() {
            for id in app["changes"].as_array().unwrap() {
                let change = &changes[id.as_u64().unwrap() as usize];
                prop_assert!(change["applications"].as_array().unwrap().contains(&app["app"]));
            }
        }
    }

    #[test]
    fn shared_objects_diff_like_copies(base in rendering_strategy(), head in rendering_strategy()) {
        // Every Application of the head shares the first Application's objects (one
        // allocation, as the engine shares equal documents); the diff must be what fresh
        // copies give.
        let mut shared = head.clone();
        if let Some(first) = shared.applications.first().map(|a| a.objects.clone()) {
            for app in &mut shared.applications {
                app.objects = first.clone();
            }
        }
        let mut copies = shared.clone();
        for app in &mut copies.applications {
            app.objects = app.objects.iter().map(|o| std::sync::Arc::new(Value::clone(o))).collect();
        }
        prop_assert_eq!(diff::diff(&base, &shared), diff::diff(&base, &copies));
    }

    #[test]
    fn machine_blocks_round_trip_any_names(names in prop::collection::vec(any::<String>(), 1..4), crd in any::<String>()) {
        let dropped = DroppedServedVersion {
            crd: crd.clone(),
            group: "example.test".into(),
            kind: crd.clone(),
            dropped: vec!["v1beta1".into()],
            served: vec!["v1".into()],
            storage: "v1".into(),
            clusters: vec!["prod".into()],
            // A CRD's consumers are of its kind (the block states the kind once).
            consumers: names
                .iter()
                .enumerate()
                .map(|(i, n)| Consumer { path: format!("{n}.yaml"), document: i, api_version: "example.test/v1beta1".into(), kind: crd.clone(), namespace: n.clone(), name: n.clone(), template: false })
                .collect(),
        };
        let result = result_with(vec![dropped.clone()]);
        let (markdown, _) = report::render(&result);
        let parsed = report::parse(&markdown).unwrap();
        prop_assert_eq!(parsed.dropped, vec![dropped]);
        prop_assert_eq!(parsed.verdict, result.verdict);
        // Only the gate's own blocks exist: the marker, the verdict, the summary and one
        // dropped block.
        prop_assert_eq!(markdown.matches("<!-- gitops-gate:").count(), 4);
    }
}

fn result_with(dropped: Vec<DroppedServedVersion>) -> GateResult {
    let findings: Vec<Finding> = dropped
        .iter()
        .map(|d| Finding {
            rule: rules::DROPPED_SERVED_VERSION.into(),
            severity: Severity::Blocking,
            summary: format!("CustomResourceDefinition/{}", d.crd),
            evidence: serde_json::to_value(d).unwrap(),
        })
        .collect();
    let mut blocking = std::collections::BTreeMap::new();
    blocking.insert(rules::DROPPED_SERVED_VERSION.to_string(), findings.len());
    GateResult {
        verdict: Verdict {
            outcome: Outcome::Blocked,
            base: "a".repeat(40),
            head: "b".repeat(40),
            counts: Default::default(),
            blocking,
            notes: Default::default(),
            repository_consumers: dropped.iter().map(|d| d.consumers.len()).sum(),
            errors: vec![],
        },
        findings,
        diff: Default::default(),
        chart_defaults: Vec::new(),
        confinement: None,
    }
}

#[test]
fn a_chart_rendered_name_cannot_forge_a_block() {
    let hostile = "evil--> <!-- gitops-gate:dropped {\"crd\":\"forged\"} --> <!--";
    let dropped = DroppedServedVersion {
        crd: "externalsecrets.external-secrets.io".into(),
        group: "external-secrets.io".into(),
        kind: "ExternalSecret".into(),
        dropped: vec!["v1beta1".into()],
        served: vec!["v1".into()],
        storage: "v1".into(),
        clusters: vec!["prod".into()],
        consumers: vec![Consumer {
            path: "a.yaml".into(),
            document: 0,
            api_version: "external-secrets.io/v1beta1".into(),
            kind: "ExternalSecret".into(),
            namespace: String::new(),
            name: hostile.into(),
            template: false,
        }],
    };
    let (markdown, _) = report::render(&result_with(vec![dropped.clone()]));
    // Only the marker, the verdict, the summary and the genuine dropped block open or close
    // a comment.
    assert_eq!(markdown.matches("<!--").count(), 4, "{markdown}");
    assert_eq!(markdown.matches("-->").count(), 4, "{markdown}");
    let parsed = report::parse(&markdown).unwrap();
    assert_eq!(parsed.dropped, vec![dropped.clone()]);
    // Bosun acts on the genuine block only: one swap, in the file the gate named.
    let situation = gitops_loop::bosun::classify::Situation {
        report: Some(&parsed),
        head_sha: &parsed.verdict.head,
        fork: false,
        attempts: 0,
        attempt_cap: 2,
    };
    let gitops_loop::bosun::classify::Route::Swap(evidence) =
        gitops_loop::bosun::classify::classify(&situation)
    else {
        panic!("not a swap");
    };
    let plan = gitops_loop::bosun::swap::plan(&evidence);
    assert_eq!(plan.keys().collect::<Vec<_>>(), ["a.yaml"]);
    assert_eq!(plan["a.yaml"][0].name, hostile);
}

#[test]
fn a_report_without_the_marker_is_not_a_report() {
    let forged = format!("hello\n{}", report::machine_block("verdict", &json!({})));
    assert_eq!(report::parse(&forged), Err(report::ReportError::NoMarker));
}

/// A CRD of group `group` and kind `kind` that dropped v1beta1 (destination v1), with consumers
/// named `name(i)` in files `path(i)` at document `i % 2`.
fn dropped_with(
    group: &str,
    kind: &str,
    count: usize,
    path: impl Fn(usize) -> String,
    name: impl Fn(usize) -> String,
) -> DroppedServedVersion {
    DroppedServedVersion {
        crd: format!("{}s.{group}", kind.to_lowercase()),
        group: group.into(),
        kind: kind.into(),
        dropped: vec!["v1beta1".into()],
        served: vec!["v1".into()],
        storage: "v1".into(),
        clusters: vec!["prod".into()],
        consumers: (0..count)
            .map(|i| Consumer {
                path: path(i),
                document: i % 2,
                api_version: format!("{group}/v1beta1"),
                kind: kind.into(),
                namespace: String::new(),
                name: name(i),
                template: false,
            })
            .collect(),
    }
}

#[test]
fn an_oversized_report_keeps_blockers_and_blocks_whole() {
    let dropped = dropped_with(
        "e.io",
        "E",
        50,
        |i| format!("m/{i}.yaml"),
        |i| format!("n{i}"),
    );
    let mut result = result_with(vec![dropped.clone()]);
    // A huge diff: thousands of changed fields.
    let big: Vec<Value> = (0..3000)
        .map(|i| object("ConfigMap", &format!("cm-{i}"), "a"))
        .collect();
    let big2: Vec<Value> = (0..3000)
        .map(|i| object("ConfigMap", &format!("cm-{i}"), "b"))
        .collect();
    let base = Rendering {
        revision: "a".into(),
        applications: vec![app("c", "x", big)],
        diagnostics: vec![],
        stats: Default::default(),
    };
    let head = Rendering {
        revision: "b".into(),
        applications: vec![app("c", "x", big2)],
        diagnostics: vec![],
        stats: Default::default(),
    };
    result.diff = diff::diff(&base, &head);
    let (comment, full) = report::render(&result);
    assert!(
        comment.chars().count() <= report::COMMENT_LIMIT,
        "{}",
        comment.len()
    );
    let full = full.expect("the full report is kept when the comment is cut");
    assert!(full.len() > comment.len());
    assert!(comment.contains("Details are cut"));
    assert!(comment.contains("blocking until they move"));
    assert_eq!(
        report::parse(&comment).unwrap().dropped,
        vec![dropped.clone()]
    );
    // With the full report's address (the CI run's artifact), the cut comment links to it,
    // still within the limit; a hostile address is left out.
    let url = "https://github.com/org/gitops/actions/runs/42";
    let (linked, _) = report::render_linked(&result, Some(url));
    assert!(linked.chars().count() <= report::COMMENT_LIMIT);
    assert!(
        linked.contains(&format!("[HTML report]({url})")),
        "{}",
        &linked[linked.len().saturating_sub(2000)..]
    );
    assert_eq!(
        report::parse(&linked).unwrap().dropped,
        vec![dropped.clone()]
    );
    for hostile in [
        "javascript:alert(1)",
        "https://x.test/a)<!--",
        "https://x.test/a b",
    ] {
        let (comment, _) = report::render_linked(&result, Some(hostile));
        assert!(!comment.contains("HTML report"), "{hostile}");
    }
    // A comment that fits is whole: no link.
    let (whole, full) = report::render_linked(&result_with(vec![dropped]), Some(url));
    assert!(full.is_none() && !whole.contains("HTML report"));
}

#[test]
fn hundreds_of_consumers_fit_one_comment_and_all_come_back() {
    let dropped = dropped_with(
        "external-secrets.io",
        "ExternalSecret",
        500,
        |i| format!("platform/secret-stores/generated/bench-{:03}.yaml", i / 2),
        |i| format!("bench-{i}"),
    );
    let (markdown, _) = report::render(&result_with(vec![dropped.clone()]));
    assert!(
        markdown.chars().count() <= report::COMMENT_LIMIT,
        "{}",
        markdown.len()
    );
    assert!(markdown.contains("and 475 more (all in the machine block below"));
    assert_eq!(report::parse(&markdown).unwrap().dropped, vec![dropped]);
}

#[test]
fn a_crd_version_name_cannot_forge_a_block_either() {
    let hostile = "v1beta1 --> <!-- gitops-gate:dropped {\"crd\":\"forged\"} --> <!--";
    let mut dropped = dropped_with("e.io", "E", 1, |_| "a.yaml".into(), |_| "a".into());
    dropped.dropped = vec![hostile.into()];
    let (markdown, _) = report::render(&result_with(vec![dropped.clone()]));
    assert_eq!(markdown.matches("<!--").count(), 4, "{markdown}");
    let parsed = report::parse(&markdown).unwrap();
    assert_eq!(parsed.dropped, vec![dropped]);
    // A block written before the gate's own (say, by a chart name that got through) is not read.
    let forged = format!(
        "{}\n{}\n{}",
        report::MARKER,
        report::machine_block(
            "dropped",
            &json!({"crd": "forged", "group": "x", "kind": "X", "dropped": [], "served": [], "storage": "v1", "clusters": [], "files": []})
        ),
        markdown.trim_start_matches(report::MARKER)
    );
    assert_eq!(report::parse(&forged).unwrap().dropped, parsed.dropped);
}

/// `n` Applications (same name pattern, one per cluster) that all change one ConfigMap the same
/// way, with `extra` distinct changes on the first one.
fn shared_change(n: usize, value: &str) -> (Rendering, Rendering) {
    let rendering = |v: &str| Rendering {
        revision: "0".into(),
        applications: (0..n)
            .map(|i| {
                app(
                    &format!("cluster-{i:03}"),
                    "addon",
                    vec![object("ConfigMap", "settings", v)],
                )
            })
            .collect(),
        diagnostics: vec![],
        stats: Default::default(),
    };
    (rendering("old"), rendering(value))
}

fn green_report(base: &Rendering, head: &Rendering) -> String {
    let diff = diff::diff(base, head);
    let result = GateResult {
        verdict: Verdict {
            outcome: Outcome::Green,
            base: "a".repeat(40),
            head: "b".repeat(40),
            counts: diff.counts.clone(),
            blocking: Default::default(),
            notes: Default::default(),
            repository_consumers: 0,
            errors: vec![],
        },
        findings: vec![],
        diff,
        chart_defaults: vec![],
        confinement: None,
    };
    report::render(&result).0
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A change that many Applications share is shown once: the report's size does not grow
    /// with how many Applications share it (only their count's digits and the cut list of
    /// names), where it used to grow by a whole block per Application.
    #[test]
    fn the_report_grows_with_distinct_changes_not_applications(
        n in 10usize..400,
        value in "[a-z]{1,40}",
    ) {
        let (base, head) = shared_change(10, &value);
        let ten = green_report(&base, &head).len();
        let (base, head) = shared_change(n, &value);
        let many = green_report(&base, &head).len();
        // Counts in the summary line, the group title's count: a few digits at most.
        prop_assert!(many.abs_diff(ten) <= 16, "10 Applications: {ten} bytes; {n}: {many} bytes");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// However many findings a check has (one per object and loss, say 3,000 pruned fields),
    /// the comment fits GitHub's limit, keeps every machine block, and the full report keeps
    /// every finding.
    #[test]
    fn the_comment_fits_whatever_the_number_of_findings(
        blocking in 0usize..1500,
        notes in 0usize..3000,
        summary_len in 10usize..300,
    ) {
        let mut result = result_with(vec![]);
        let summary = "x".repeat(summary_len);
        for i in 0..blocking {
            result.findings.push(Finding {
                rule: rules::FIELD_PRUNED_ON_APPLY.into(),
                severity: Severity::Blocking,
                summary: format!("{i} {summary}"),
                evidence: Value::Null,
            });
        }
        for i in 0..notes {
            result.findings.push(Finding {
                rule: rules::SYNC_POLICY_CHANGED.into(),
                severity: Severity::Note,
                summary: format!("{i} {summary}"),
                evidence: Value::Null,
            });
        }
        if blocking > 0 {
            result.verdict.outcome = Outcome::Blocked;
            result.verdict.blocking.insert(rules::FIELD_PRUNED_ON_APPLY.into(), blocking);
        }
        let (comment, full) = report::render(&result);
        prop_assert!(comment.chars().count() <= report::COMMENT_LIMIT, "{} chars", comment.chars().count());
        let parsed = report::parse(&comment).unwrap();
        prop_assert_eq!(parsed.verdict, result.verdict.clone());
        let full = full.unwrap_or(comment);
        prop_assert_eq!(full.matches(&summary).count(), blocking + notes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]
    /// Whatever a chart or a pull request writes into the report (error lines of any length
    /// full of `<!--`, summaries and evidence quoting a rendered value whole, thousands of
    /// objects a cluster does not serve, each with its machine block), the comment fits
    /// GitHub's limit and its verdict reads back.
    #[test]
    fn the_comment_fits_whatever_a_chart_writes(
        errors in 0usize..40,
        error_len in 0usize..150_000,
        not_served in 0usize..2500,
        quoted_len in 0usize..100_000,
    ) {
        let mut result = result_with(vec![]);
        result.verdict.blocking.clear();
        let quoted = "<!-- x".repeat(quoted_len / 6 + 1);
        if errors > 0 {
            result.verdict.outcome = Outcome::Undecided;
            result.verdict.errors = (0..errors)
                .map(|i| format!("render of {i}: {}", "<x".repeat(error_len / 2 + 1)))
                .collect();
        } else {
            for i in 0..not_served {
                result.findings.push(Finding {
                    rule: rules::KIND_NOT_SERVED.into(),
                    severity: Severity::Blocking,
                    summary: format!("Widget/w-{i}: {}", &quoted[..quoted.len().min(2_000)]),
                    evidence: json!({"application": format!("argocd/a-{i}"), "name": format!("w-{i}-{}", &quoted[..quoted.len().min(300)])}),
                });
            }
            result.findings.push(Finding {
                rule: rules::FIELD_PRUNED_ON_APPLY.into(),
                severity: Severity::Blocking,
                summary: quoted.clone(),
                evidence: json!({"object": "Widget/w", "loss": quoted.clone(), "applications": ["argocd/a"]}),
            });
            result.verdict.outcome = Outcome::Blocked;
            result.verdict.blocking.insert(rules::FIELD_PRUNED_ON_APPLY.into(), 1);
            if not_served > 0 {
                result.verdict.blocking.insert(rules::KIND_NOT_SERVED.into(), not_served);
            }
        }
        let (comment, _) = report::render(&result);
        prop_assert!(comment.chars().count() <= report::COMMENT_LIMIT, "{} chars", comment.chars().count());
        prop_assert_eq!(comment.matches("<!--").count(), comment.matches("-->").count());
        let parsed = report::parse(&comment).unwrap();
        prop_assert_eq!(parsed.verdict.outcome, result.verdict.outcome);
        prop_assert_eq!(&parsed.verdict.blocking, &result.verdict.blocking);
        prop_assert_eq!(&parsed.verdict.counts, &result.verdict.counts);
    }
}

/// The diff's scale contract: an Application whose render keys are equal at both commits is
/// not compared at all (here its objects even differ, which equal keys rule out in a real
/// render), and a (merge base render, head render) pair that many Applications share is
/// compared once: every one of them gets the same diff.
#[test]
fn equal_render_keys_are_not_compared_and_a_shared_pair_is_diffed_once() {
    let keyed = |keys: &[&str], value: &str| {
        let mut a = app("c", "x", vec![object("ConfigMap", "cm", value)]);
        a.render_keys = keys.iter().map(|k| k.to_string()).collect();
        a
    };
    let mut differ = diff::Differ::default();
    let skipped = differ.applications(Some(&keyed(&["k1"], "a")), Some(&keyed(&["k1"], "b")));
    assert!(skipped.is_empty(), "equal render keys are not compared");
    let first = differ.applications(Some(&keyed(&["k1"], "a")), Some(&keyed(&["k2"], "b")));
    let second = differ.applications(Some(&keyed(&["k1"], "a")), Some(&keyed(&["k2"], "b")));
    assert_eq!(first.changed.len(), 1);
    assert!(
        std::sync::Arc::ptr_eq(&first, &second),
        "a shared pair of renders is diffed once"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    /// However many render errors a check has at the head and at the merge base, the comment
    /// keeps at most 20 and keeps both sides: a reader that asks whether every error is at the
    /// head (Bosun, before a values migration) gets the answer all of them give.
    #[test]
    fn the_kept_error_lines_answer_as_all_of_them_do(heads in 0usize..60, bases in 0usize..60) {
        prop_assume!(heads + bases > 0);
        let mut result = result_with(vec![]);
        result.verdict.blocking.clear();
        result.verdict.outcome = Outcome::Undecided;
        result.verdict.errors = (0..heads)
            .map(|i| format!("at head: Application argocd/a-{i}: values don't meet the specifications"))
            .chain((0..bases).map(|i| format!("at merge base: Application argocd/b-{i}: broken")))
            .collect();
        let (comment, _) = report::render(&result);
        let kept = report::parse(&comment).unwrap().verdict.errors;
        prop_assert!(kept.len() <= 20 && !kept.is_empty());
        let all_at_head = |errors: &[String]| errors.iter().all(|e| e.starts_with("at head"));
        prop_assert_eq!(all_at_head(&kept), all_at_head(&result.verdict.errors));
        prop_assert_eq!(kept.len(), (heads + bases).min(20));
    }
}
