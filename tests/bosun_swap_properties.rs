//! The swap's promise, for arbitrary YAML: the output differs from the input only inside the
//! apiVersion values of the targeted kinds. Documents are generated from pieces whose
//! positions are known, so the expected output is built independently of the swap.

use gitops_loop::bosun::swap::{self, Swap};
use proptest::prelude::*;

const FROM: &str = "example.test/v1beta1";
const TO: &str = "example.test/v1";

#[derive(Debug, Clone)]
struct Doc {
    target: bool,
    quote: usize,
    trailing_comment: bool,
    api_version_position: usize,
    leading_comment: bool,
    block_scalar: bool,
    anchor: bool,
    empty_before: bool,
}

fn doc() -> impl Strategy<Value = Doc> {
    (
        any::<bool>(),
        0..3usize,
        any::<bool>(),
        0..3usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                target,
                quote,
                trailing_comment,
                api_version_position,
                leading_comment,
                block_scalar,
                anchor,
                empty_before,
            )| Doc {
                target,
                quote,
                trailing_comment,
                api_version_position,
                leading_comment,
                block_scalar,
                anchor,
                empty_before,
            },
        )
}

/// (input, expected output, swaps)
fn build(docs: &[Doc]) -> (String, String, Vec<Swap>) {
    let mut input = String::new();
    let mut expected = String::new();
    let mut swaps = Vec::new();
    let mut push = |text: &str, replaced: Option<&str>| {
        input.push_str(text);
        expected.push_str(replaced.unwrap_or(text));
    };
    for (i, d) in docs.iter().enumerate() {
        if i > 0 || d.empty_before {
            push("---\n", None);
        }
        if d.empty_before {
            push(
                "# nothing here but apiVersion: example.test/v1beta1\n---\n",
                None,
            );
        }
        if d.leading_comment {
            push(
                "# apiVersion: example.test/v1beta1 stays in comments\n",
                None,
            );
        }
        let kind = if d.target { "Widget" } else { "Gadget" };
        let q = ["", "\"", "'"][d.quote];
        let mut lines: Vec<Vec<(String, Option<String>)>> = vec![
            vec![(format!("kind: {kind}\n"), None)],
            vec![(format!("metadata:\n  name: n{i}\n"), None)],
        ];
        let api = vec![
            ("apiVersion: ".to_string(), None),
            (
                format!("{q}{FROM}{q}"),
                d.target.then(|| format!("{q}{TO}{q}")),
            ),
            (
                if d.trailing_comment {
                    "  # apiVersion: keep me\n".to_string()
                } else {
                    "\n".to_string()
                },
                None,
            ),
        ];
        lines.insert(d.api_version_position.min(lines.len()), api);
        for line in lines {
            for (text, replaced) in line {
                push(&text, replaced.as_deref());
            }
        }
        push("spec:\n", None);
        if d.block_scalar {
            push(
                "  note: |\n    apiVersion: example.test/v1beta1\n    kind: Widget\n",
                None,
            );
        }
        if d.anchor {
            push(
                "  labels: &shared {apiVersion: example.test/v1beta1}\n  copy: *shared\n",
                None,
            );
        }
        push("  size: 3\n", None);
        if d.target {
            swaps.push(Swap {
                path: "f.yaml".into(),
                // Every generated document holds something: the gate's index is `i`.
                document: i,
                kind: "Widget".into(),
                name: format!("n{i}"),
                from: FROM.into(),
                to: TO.into(),
                template: false,
            });
        }
    }
    (input, expected, swaps)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn only_targeted_api_version_values_change(docs in prop::collection::vec(doc(), 1..6)) {
        let (input, expected, swaps) = build(&docs);
        prop_assume!(!swaps.is_empty());
        let output = swap::apply(&input, &swaps).expect("the swap applies");
        prop_assert_eq!(output, expected);
    }
}

/// The text of a manifest file and a chart template, each declaring `FROM` for a Widget.
const MANIFEST: &str = "# keep\napiVersion: \"example.test/v1beta1\" # pinned\nkind: Widget\nmetadata:\n  name: n0\nspec:\n  size: 3\n";
const TEMPLATE: &str = "{{- if .Values.on }}\napiVersion: example.test/v1beta1\nkind: Widget\nmetadata:\n  name: {{ .Release.Name }}\n{{- end }}\n";

fn destination_swap(version: &str, template: bool) -> Swap {
    Swap {
        path: "f.yaml".into(),
        document: 0,
        kind: "Widget".into(),
        name: if template {
            "{{ x }}".into()
        } else {
            "n0".into()
        },
        from: FROM.into(),
        to: format!("example.test/{version}"),
        template,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A CRD version name is chart-controlled. Whatever it is, Bosun either refuses to write
    /// it, or every byte it writes is inside the apiVersion value: the file parses to the same
    /// documents, with only that value changed, to exactly the destination.
    #[test]
    fn a_chart_controlled_version_name_writes_nothing_outside_the_value(
        version in prop_oneof![
            "[a-z][a-z0-9-]{0,10}",
            any::<String>(),
            "v1[\n\r\"' #:{}\\[\\]&*!|>%@`-]{1,4}[a-zA-Z: \n-]{0,40}",
        ],
    ) {
        let valid = gitops_loop::names::is_dns1035_label(&version);
        // Plain manifest: the documents after the swap are the documents before, but for the
        // one value.
        match swap::apply(MANIFEST, &[destination_swap(&version, false)]) {
            Err(_) => prop_assert!(!valid, "a valid version {:?} was refused", version),
            Ok(output) => {
                prop_assert!(valid, "an invalid version {:?} was written", version);
                let before = gitops_loop::yaml::parse_documents(MANIFEST, "before").unwrap();
                let after = gitops_loop::yaml::parse_documents(&output, "after").unwrap();
                prop_assert_eq!(after.len(), before.len());
                let mut expected = before[0].clone();
                expected["apiVersion"] = format!("example.test/{version}").into();
                prop_assert_eq!(&after[0], &expected);
            }
        }
        // Template: only the one line changes, and it still reads as that key and value.
        match swap::apply(TEMPLATE, &[destination_swap(&version, true)]) {
            Err(_) => prop_assert!(!valid),
            Ok(output) => {
                prop_assert!(valid);
                let changed: Vec<(&str, &str)> = TEMPLATE
                    .lines()
                    .zip(output.lines())
                    .filter(|(a, b)| a != b)
                    .collect();
                prop_assert_eq!(output.lines().count(), TEMPLATE.lines().count());
                prop_assert_eq!(changed.len(), 1);
                let line = changed[0].1;
                let value = gitops_loop::yaml::parse_document(line, "line").unwrap();
                let expected = format!("example.test/{version}");
                prop_assert_eq!(value["apiVersion"].as_str(), Some(expected.as_str()));
            }
        }
    }
}
