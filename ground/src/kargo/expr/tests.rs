//! Tests of `expr`.

use serde_json::{Map, Value, json};

use crate::kargo::expr::Scope;
use crate::kargo::expr::eval::{evaluate, evaluate_in};
use crate::kargo::expr::functions::semver_diff;
use crate::kargo::expr::templates::evaluate_template;

fn with_scope<T>(f: impl FnOnce(&Scope) -> T) -> T {
    let vars: Map<String, Value> = [("repo".to_string(), json!("https://git/x"))]
        .into_iter()
        .collect();
    let outputs: Map<String, Value> = [
        ("open-pr".to_string(), json!({"pr": {"id": 7}})),
        ("push".to_string(), json!({"branch": "kargo/p"})),
        ("current".to_string(), json!({"version": "0.4.1"})),
    ]
    .into_iter()
    .collect();
    let freight =
        json!({"charts": [{"repoURL": "https://charts/stable", "name": "c", "version": "1.20"}]});
    let statuses = [("step-1".to_string(), "Succeeded".to_string())];
    let scope = Scope {
        ctx: json!({"stage": "prod"}),
        vars: &vars,
        outputs: &outputs,
        freight: &freight,
        secrets: &Map::new(),
        statuses: &statuses,
    };
    f(&scope)
}

#[test]
fn templates_are_typed_as_kargo_types_them() {
    // [K pkg/expressions/json_templates.go EvaluateTemplate]
    with_scope(|scope| {
        let t = |s: &str| evaluate_template(s, scope).unwrap();
        assert_eq!(t("${{ outputs['open-pr'].pr.id }}"), json!(7));
        assert_eq!(
            t("branch ${{ outputs.push.branch }} for ${{ ctx.stage }}"),
            json!("branch kargo/p for prod")
        );
        assert_eq!(t("${{ vars.repo }}"), json!("https://git/x"));
        // No delimiter: never typed.
        assert_eq!(t("42"), json!("42"));
        assert_eq!(t("true"), json!("true"));
        // A version that looks like a number becomes one unless quoted.
        assert_eq!(
            t("${{ chartFrom('https://charts/stable', 'c').Version }}"),
            json!(1.2)
        );
        assert_eq!(
            t("${{ quote(chartFrom('https://charts/stable', 'c').Version) }}"),
            json!("1.20")
        );
        // The trap docs/bosun.md fell into: JSON-looking text becomes an object ...
        assert_eq!(
            t(
                r#"{"repository": "platform/gitops", "pullRequest": ${{ outputs['open-pr'].pr.id }}}"#
            ),
            json!({"repository": "platform/gitops", "pullRequest": 7})
        );
        // ... quoting one field still leaves JSON ...
        assert!(t(r#"{"pullRequest": ${{ quote(outputs['open-pr'].pr.id) }}}"#).is_object());
        // ... quoting the whole object keeps a string.
        assert_eq!(
            t(
                r#"${{ quote({"repository": "platform/gitops", "pullRequest": outputs['open-pr'].pr.id}) }}"#
            ),
            json!(r#"{"pullRequest":7,"repository":"platform/gitops"}"#)
        );
        assert_eq!(t("${{ 1 + 1 }}"), json!(2));
        assert_eq!(t("${{ ctx.stage == 'prod' }}"), json!(true));
        assert_eq!(t("${% ctx.stage %}"), json!("prod"));
        assert_eq!(t("${{ quote(true) }}"), json!("true"));
        assert!(evaluate_template("${{ ctx.stage ", scope).is_err());
        assert!(evaluate_template("${{ nope( }}", scope).is_err());
    });
}

#[test]
fn operators_bind_as_expr_lang_binds_them() {
    // [expr-lang Language Definition: operators and precedence]
    with_scope(|scope| {
        let e = |s: &str| evaluate(s, scope).unwrap();
        assert_eq!(e("1 + 2 * 3"), json!(7));
        assert_eq!(e("(1 + 2) * 3"), json!(9));
        assert_eq!(e("1 < 2 && 2 < 3 || false"), json!(true));
        assert_eq!(e("not (1 == 1) or 2 != 2"), json!(false));
        assert_eq!(e("ctx.stage == 'prod' ? 'hold' : 'merge'"), json!("hold"));
        assert_eq!(e("'prod' in ['staging', 'prod']"), json!(true));
        assert_eq!(e("'x' not in {'x': 1}"), json!(false));
        assert_eq!(e("outputs.nope?.id ?? 'none'"), json!("none"));
        // ?? binds tightest: `a ?? b == c` is `(a ?? b) == c`.
        assert_eq!(e("outputs.nope?.id ?? 'x' == 'x'"), json!(true));
        // Comparisons share one level, left to right.
        assert_eq!(e("1 < 2 == true"), json!(true));
        assert_eq!(e("outputs.current.version startsWith '0.'"), json!(true));
        assert_eq!(e("[1, 2][-1]"), json!(2));
        assert_eq!(
            e("{a: 1, 'b-c': [ctx.stage]}"),
            json!({"a": 1, "b-c": ["prod"]})
        );
        assert_eq!(e("1 == 1.0"), json!(true));
        assert!(evaluate("outputs.nope.id", scope).is_err());
        assert!(evaluate("1 + 'a'", scope).is_err());
        assert!(evaluate("unknownFn()", scope).is_err());
        assert!(evaluate(&format!("{}1{}", "(".repeat(100), ")".repeat(100)), scope).is_err());
        assert!(evaluate(&format!("{}true", "!".repeat(100)), scope).is_err());
    });
    assert_eq!(
        evaluate_in(
            "spec.source.targetRevision",
            &json!({"spec": {"source": {"targetRevision": "1.2.3"}}})
        )
        .unwrap(),
        json!("1.2.3")
    );
}

#[test]
fn semver_diff_and_step_status_functions() {
    // [K functions.go semverDiff, always, failure, success, status]
    assert_eq!(semver_diff("1.2.3", "2.0.0"), "Major");
    assert_eq!(semver_diff("0.4.1", "0.5.0"), "Minor");
    assert_eq!(semver_diff("v1.2.3", "1.2.4"), "Patch");
    assert_eq!(semver_diff("1.2.3+a", "1.2.3+b"), "Metadata");
    assert_eq!(semver_diff("1.2.3", "1.2.3"), "None");
    assert_eq!(semver_diff("1.2", "x"), "Incomparable");
    assert_eq!(semver_diff("1.2", "1.2.1"), "Patch");
    assert_eq!(semver_diff("v1", "1.1"), "Minor");
    with_scope(|scope| {
        let t = |s: &str| evaluate_template(s, scope).unwrap();
        assert_eq!(
            t("${{ semverDiff(outputs.current.version, '0.5.0') }}"),
            json!("Minor")
        );
        assert_eq!(t("${{ status('step-1') }}"), json!("Succeeded"));
        assert_eq!(t("${{ success() && always() && !failure() }}"), json!(true));
        assert_eq!(
            t("${{ warehouse('w') }}"),
            json!({"kind": "Warehouse", "name": "w"})
        );
    });
}
