//! A pull request alone must not be able to exhaust the gate through the schemas it ships: a
//! CustomResourceDefinition whose CEL rule copies a list inside a macro, or whose `pattern`
//! compiles to a large program met by many strings, together with one object of that kind. The
//! gate evaluates such rules in its own process (field-pruned-on-apply), so each attack is
//! played through `gate check` on the sample repository, and the gate's own peak RSS and CPU
//! (its stats line and `GATE_TRACE`) are held against a bound over an honest run of the same
//! shape: 256 MiB and 2 s of CPU. Past the bound the rule is not run, and the report says so
//! (a note naming the object), never a silent pass.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

/// What one `gate check` of a pull request cost and said.
struct Run {
    code: i32,
    report: String,
    /// Peak resident set of the gate process, in KiB.
    peak_kib: u64,
    /// The gate's own CPU (user + system), in ms, children (helm) excluded.
    cpu_ms: u64,
}

/// The ingress-lite chart of the sample repository (rendered by its Applications) gains a
/// Widget CRD with `schema` under `spec`, and one Widget with `spec`.
fn check(spec_schema: &str, spec: &str) -> Run {
    let overlay = tempfile::tempdir().unwrap();
    let templates = overlay.path().join("local-charts/ingress-lite/templates");
    std::fs::create_dir_all(&templates).unwrap();
    std::fs::write(
        templates.join("widget-crd.yaml"),
        format!(
            "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.test
spec:
  group: example.test
  scope: Namespaced
  names: {{kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec: {spec_schema}
"
        ),
    )
    .unwrap();
    std::fs::write(
        templates.join("widget.yaml"),
        format!(
            "apiVersion: example.test/v1
kind: Widget
metadata:
  name: hostile
spec: {spec}
"
        ),
    )
    .unwrap();
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(overlay.path(), "pr", "the pull request");
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = common::gate_check_sample(cache.path(), repo.path())
        .env("GATE_TRACE", "1")
        .arg("--report")
        .arg(out.path().join("report.md"))
        .output()
        .expect("gate runs");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let code = output.status.code().unwrap_or(-1);
    assert!(
        (0..=2).contains(&code),
        "the gate did not end with a verdict ({:?}): {}",
        output.status,
        stderr.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    let number_after = |marker: &str| -> u64 {
        let at = stderr
            .rfind(marker)
            .unwrap_or_else(|| panic!("no {marker:?} in {stderr}"));
        stderr[at + marker.len()..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number after {marker:?} in {stderr}"))
    };
    let user = number_after("CPU: own");
    let system = number_after("ms user +");
    Run {
        code,
        report: std::fs::read_to_string(out.path().join("report.md")).unwrap(),
        peak_kib: number_after("peak RSS"),
        cpu_ms: user + system,
    }
}

/// The bound over an honest run: 256 MiB of peak RSS and 2 s of the gate's own CPU.
fn assert_within_bound(attack: &Run, honest: &Run, what: &str) {
    assert!(
        attack.peak_kib <= honest.peak_kib + 256 * 1024,
        "{what}: peak RSS {} KiB against {} KiB for an honest run",
        attack.peak_kib,
        honest.peak_kib
    );
    assert!(
        attack.cpu_ms <= honest.cpu_ms + 2000,
        "{what}: {} ms of CPU against {} ms for an honest run",
        attack.cpu_ms,
        honest.cpu_ms
    );
}

fn zeros(n: usize) -> String {
    format!("{{l: [{}]}}", vec!["0"; n].join(","))
}

fn strings(n: usize) -> String {
    format!("{{s: [{}]}}", vec!["ab"; n].join(","))
}

fn list_rule(rule: &str) -> String {
    format!(
        "{{type: object, properties: {{l: {{type: array, items: {{type: integer}}}}}}, \
         x-kubernetes-validations: [{{rule: {rule:?}}}]}}"
    )
}

fn pattern_schema(pattern: &str) -> String {
    format!(
        "{{type: object, properties: {{s: {{type: array, items: {{type: string, pattern: {pattern:?}}}}}}}}}"
    )
}

#[test]
fn a_rule_copying_its_list_in_a_macro_is_not_run_and_is_said() {
    let honest = check(
        &list_rule("size(self.l.map(x, x + 1)) == size(self.l)"),
        &zeros(3000),
    );
    assert_eq!(honest.code, 0, "{}", honest.report);
    // The reviewer's attack: 16 copies of a 3,000-item list at every step of a map (3.1 GB and
    // 44 s before the cost bound counted the copies), and 100 (an abort).
    for copies in [16, 100] {
        let step = vec!["self.l"; copies].join(" + ");
        let attack = check(
            &list_rule(&format!("size(self.l.map(x, {step})) > 0")),
            &zeros(3000),
        );
        assert_within_bound(&attack, &honest, &format!("{copies} copies"));
        assert!(
            attack.report.contains("not checked")
                && attack.report.contains("Widget")
                && attack.report.contains("per rule"),
            "the report must say the rule was not run: {}",
            attack.report
        );
    }
}

#[test]
fn a_pattern_met_by_many_strings_is_compiled_once_and_bounded() {
    let honest = check(&pattern_schema("^[a-z]+$"), &strings(2000));
    assert_eq!(honest.code, 0, "{}", honest.report);
    // A pattern whose program is large (compiled once per string before: minutes of CPU from
    // a few kilobytes of YAML), and one past the regex size limit (not run, and said).
    for pattern in ["^((a|b)(a|b|c)){1,200}$", "^((\\w{30}){30}){30}$"] {
        let attack = check(&pattern_schema(pattern), &strings(2000));
        assert_within_bound(&attack, &honest, pattern);
    }
    // The reviewer's second attack: a large program met by long strings that never match
    // (the regex crate's worst case is program x text), charged and then not run.
    let long = format!(
        "{{s: [{}]}}",
        vec![format!("{:?}", "a".repeat(20_000)); 200].join(",")
    );
    let attack = check(&pattern_schema("[ab]{3000}c"), &long);
    assert_within_bound(&attack, &honest, "a large pattern over long strings");
    assert!(attack.report.contains("not checked"), "{}", attack.report);
    let attack = check(&pattern_schema("^((\\w{30}){30}){30}$"), &strings(2000));
    assert!(
        attack.report.contains("not checked") && attack.report.contains("pattern"),
        "{}",
        attack.report
    );
}

#[test]
fn a_pattern_compiled_at_every_call_of_matches_is_charged_per_call() {
    let honest = check(
        &format!(
            "{{type: object, properties: {{s: {{type: array, items: {{type: string}}}}}}, \
             x-kubernetes-validations: [{{rule: {:?}}}]}}",
            "self.s.all(x, x.matches('^[a-z]+$'))"
        ),
        &strings(2000),
    );
    assert_eq!(honest.code, 0, "{}", honest.report);
    let attack = check(
        &format!(
            "{{type: object, properties: {{s: {{type: array, items: {{type: string}}}}}}, \
             x-kubernetes-validations: [{{rule: {:?}}}]}}",
            "self.s.all(x, x.matches('^((a|b)(a|b|c)){1,300}$'))"
        ),
        &strings(2000),
    );
    assert_within_bound(&attack, &honest, "matches in a macro");
    assert!(attack.report.contains("not checked"), "{}", attack.report);
}
