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
