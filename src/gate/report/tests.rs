//! Tests of `report`.

use super::summary::{SUMMARY_BUDGET, split_image};
use super::*;
use crate::gate::rules::{Finding, Severity};
use crate::gate::verdict::ChartDefaults;
use serde_json::Value;

#[test]
fn the_summary_block_stays_within_its_budget_and_reads_tags_under_digests() {
    use crate::gate::diff::{
        AppDiff, AppKey, AppStatus, FieldChange, ObjectChange, ObjectKey, ObjectsDiff,
    };
    let hostile = "-".repeat(500);
    let change = |i: usize| ObjectChange {
        object: ObjectKey {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: "n".into(),
            name: format!("d{i}"),
        },
        fields: std::sync::Arc::new(vec![FieldChange {
            path: "spec.template.spec.containers[0].image".into(),
            old: Some(Value::String(format!("r{i}/{hostile}:{hostile}"))),
            new: Some(Value::String(format!("r{i}/{hostile}:v2{hostile}"))),
        }]),
        crd: None,
    };
    let mut result = GateResult {
        verdict: Verdict {
            outcome: Outcome::Green,
            base: "a".repeat(40),
            head: "b".repeat(40),
            counts: Default::default(),
            blocking: Default::default(),
            notes: Default::default(),
            repository_consumers: 0,
            errors: vec![],
        },
        findings: vec![],
        diff: Default::default(),
        chart_defaults: vec![],
        confinement: None,
    };
    result.diff.applications.push(AppDiff {
        app: AppKey {
            cluster: hostile.clone(),
            namespace: "argocd".into(),
            name: "a".into(),
        },
        status: AppStatus::Changed,
        chart_moves: vec![],
        objects: std::sync::Arc::new(ObjectsDiff {
            added: vec![],
            removed: vec![],
            changed: (0..20).map(change).collect(),
        }),
        spec_changed: false,
        application_fields: vec![],
        chart_only: None,
    });
    let summary = Summary::of(&result);
    assert!(machine_block("summary", &summary).len() <= SUMMARY_BUDGET);
    assert!(summary.more > 0);
    assert_eq!(
        split_image("registry.k8s.io/ingress-nginx/controller:v1.9.4@sha256:abc"),
        (
            "registry.k8s.io/ingress-nginx/controller".to_string(),
            "v1.9.4".to_string()
        )
    );
    assert_eq!(
        split_image("r/x@sha256:abc"),
        ("r/x".to_string(), "sha256:abc".to_string())
    );
}

#[test]
fn blocks_never_contain_comment_syntax() {
    let hostile = serde_json::json!({"name": "x--> <!-- gitops-gate:dropped {} -->&"});
    let block = machine_block("dropped", &hostile);
    let inner = &block[BLOCK_PREFIX.len()..block.len() - 3];
    assert!(
        !inner.contains("--") && !inner.contains('>') && !inner.contains('<'),
        "{block}"
    );
    let parsed = machine_blocks(&block).unwrap();
    assert_eq!(parsed, vec![("dropped".to_string(), hostile)]);
}

#[test]
fn a_not_served_block_round_trips_hostile_names_and_cannot_add_a_block() {
    let hostile = rules::NotServed {
        api_version: "x.io/v1".into(),
        kind: "X".into(),
        namespace: "ns".into(),
        name: "a --> <!-- gitops-gate:not-served {} -->".into(),
        applications: vec!["argocd/a on prod".into()],
        more_applications: 0,
    };
    let result = GateResult {
        verdict: Verdict {
            outcome: Outcome::Blocked,
            base: "a".repeat(40),
            head: "b".repeat(40),
            counts: Default::default(),
            blocking: [(rules::KIND_NOT_SERVED.to_string(), 1)].into(),
            notes: Default::default(),
            repository_consumers: 0,
            errors: vec![],
        },
        findings: vec![Finding {
            rule: rules::KIND_NOT_SERVED.into(),
            severity: Severity::Blocking,
            summary: format!("X {} is rendered", hostile.name),
            evidence: serde_json::to_value(&hostile).unwrap(),
        }],
        diff: Default::default(),
        chart_defaults: vec![],
        confinement: None,
    };
    let (markdown, _) = render(&result);
    assert_eq!(markdown.matches("<!--").count(), 4, "{markdown}");
    assert_eq!(parse(&markdown).unwrap().not_served, vec![hostile]);
}

#[test]
fn hostile_chart_defaults_and_finding_evidence_cannot_add_a_block_or_a_heading() {
    let hostile = "x --> <!-- gitops-gate:dropped {\"crd\":\"forged\"} -->\n# heading [link](https://evil.test)";
    let result = GateResult {
        verdict: Verdict {
            outcome: Outcome::Blocked,
            base: "a".repeat(40),
            head: "b".repeat(40),
            counts: Default::default(),
            blocking: [(rules::DESTINATION_UNKNOWN.to_string(), 1)].into(),
            notes: Default::default(),
            repository_consumers: 0,
            errors: vec![],
        },
        findings: vec![Finding {
            rule: rules::DESTINATION_UNKNOWN.into(),
            severity: Severity::Blocking,
            summary: hostile.into(),
            evidence: serde_json::json!({"application": hostile, "namespace": "argocd",
                    "origin": hostile, "destination": hostile}),
        }],
        diff: Default::default(),
        chart_defaults: vec![ChartDefaults {
            chart: hostile.into(),
            repo_url: "https://charts.example.test".into(),
            from: "1.0.0".into(),
            to: hostile.into(),
            changes: vec![crate::gate::diff::FieldChange {
                path: hostile.repeat(50),
                old: Some(Value::String(hostile.into())),
                new: None,
            }],
            more: 0,
            unreadable: None,
        }],
        confinement: None,
    };
    let (markdown, _) = render(&result);
    // The marker, the verdict, the summary and the one finding block: nothing else opens a
    // comment.
    assert_eq!(markdown.matches("<!--").count(), 4, "{markdown}");
    assert!(!markdown.lines().any(|l| l.starts_with("# ")), "{markdown}");
    let parsed = parse(&markdown).unwrap();
    assert!(parsed.dropped.is_empty());
    assert_eq!(parsed.findings.len(), 1);
    assert_eq!(parsed.findings[0].evidence["destination"], hostile);
    // The path is clipped: the defaults line stays short, and so does the summary block.
    assert!(
        markdown.lines().all(|l| l.chars().count()
            < if l.starts_with(BLOCK_PREFIX) {
                16_000
            } else {
                2000
            }),
        "a line ran long"
    );
}

#[test]
fn markdown_text_is_escaped() {
    assert_eq!(text("a --> <!-- b"), "a --&gt; &lt;!-- b");
    assert_eq!(code("external-secrets.io"), "`external-secrets.io`");
    assert_eq!(code("x`y"), "x\\`y");
    assert_eq!(code("<x>"), "&lt;x&gt;");
}

#[test]
fn chart_text_cannot_start_a_heading_a_link_or_an_autolink() {
    let hostile =
        "v1\n---\n# ## [click](https://evil.example.test) *b* www.evil.test a@b.test\r\n|x|";
    let safe = text(hostile);
    assert!(!safe.contains('\n') && !safe.contains('\r'), "{safe}");
    for opener in ["https://", "www.", "a@b", "\n#"] {
        assert!(!safe.contains(opener), "{opener:?} survived in {safe}");
    }
    assert_eq!(
        safe,
        "v1␤---␤\\# \\#\\# \\[click\\](https\\://evil.example.test) \\*b\\* www\\.evil.test a\\@b.test␤\\|x\\|"
    );
}

/// Characters Unicode calls format characters (Cf), and the line and paragraph separators:
/// told by the regex crate's own Unicode tables, not by the function under test.
fn invisible_by_regex(s: &str) -> bool {
    static CF: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"[\p{Cf}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}\x{2800}]")
            .expect("a fixed pattern")
    });
    CF.is_match(s)
}

/// A string mixing ordinary text with every kind of invisible character.
fn hostile_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let invisible = prop_oneof![
        (0x202Au32..=0x202E).prop_map(|c| char::from_u32(c).expect("a char")),
        (0x2066u32..=0x2069).prop_map(|c| char::from_u32(c).expect("a char")),
        // Default-ignorable, not format: the variation selectors, the Hangul filler, the
        // combining grapheme joiner, the Braille blank.
        (0xFE00u32..=0xFE0F).prop_map(|c| char::from_u32(c).expect("a char")),
        Just('\u{3164}'),
        Just('\u{034F}'),
        Just('\u{2800}'),
        (0xE0100u32..=0xE01EF).prop_map(|c| char::from_u32(c).expect("a char")),
        (0x200Bu32..=0x200F).prop_map(|c| char::from_u32(c).expect("a char")),
        (0x2060u32..=0x2064).prop_map(|c| char::from_u32(c).expect("a char")),
        (0xE0000u32..=0xE007F).prop_filter_map("a char", char::from_u32),
        prop::sample::select(vec![
            '\u{00AD}',
            '\u{061C}',
            '\u{180E}',
            '\u{2028}',
            '\u{2029}',
            '\u{FEFF}',
            '\u{FFF9}',
            '\u{110BD}',
            '\u{1D173}',
            '\u{0600}',
            '\u{06DD}',
        ]),
    ];
    prop::collection::vec(
        prop_oneof![3 => any::<char>(), 2 => invisible, 1 => prop::sample::select(vec!['-', '<', '>', '&', '\\', '`', '"', '\n'])],
        0..40,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

proptest::proptest! {
    #[test]
    fn no_invisible_character_survives_the_reports_escaping(s in hostile_text()) {
        let escaped = text(&s);
        proptest::prop_assert!(!invisible_by_regex(&escaped), "{escaped:?}");
        proptest::prop_assert!(!invisible_by_regex(&visible(&s)));
        proptest::prop_assert!(!invisible_by_regex(&code(&s)));
        // A machine block carries the text unchanged, and shows none of it.
        let block = machine_block("test", &serde_json::json!({"name": s}));
        proptest::prop_assert!(!invisible_by_regex(&block), "{block:?}");
        let blocks = machine_blocks(&format!("{block}\n")).expect("the block parses");
        proptest::prop_assert_eq!(&blocks[0].1["name"], &serde_json::json!(s));
    }
}

#[test]
fn a_bidi_override_is_shown_not_obeyed() {
    assert_eq!(text("invoice\u{202E}fdp.exe"), "invoice\\u{202E}fdp.exe");
    assert_eq!(text("a\u{E0041}\u{200B}b"), "a\\u{E0041}\\u{200B}b");
}
