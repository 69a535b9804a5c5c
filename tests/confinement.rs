//! The attacks of a hostile pull request on the gate, played end to end with the real `gate`,
//! helm and kubectl: kustomizations that reach for the checkout's credentials or the network.
//! A canary token sits in the checkout's `.git/config` (as a CI checkout keeps it) and in the
//! gate's environment; neither may appear in any report, JSON or log, no render may be green,
//! and the loopback watch the proxy variables point at (and the hostile URLs name) must see no
//! connection.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use assert_cmd::prelude::*;

use std::path::Path;
use std::process::Command;

const CONFIG_CANARY: &str = "ghs_CONFIGcanary0123456789abcdef";
const ENV_CANARY: &str = "ghp_ENVcanary9876543210fedcba";

/// (name, the overlay's files) for each way a kustomization may try to leave its tree.
fn attacks(checkout: &Path, port: u16) -> Vec<(&'static str, Vec<(String, String)>)> {
    let checkout = checkout.display().to_string();
    let base = "manifests/common/base/kustomization.yaml".to_string();
    let keep = "resources:\n  - configmap.yaml\n  - deployment.yaml\n";
    let read_config = "configMapGenerator:\n  - name: stolen\n    files: [token=.git/config]\n";
    // From manifests/common/base, enough `..` to reach `/`, then the checkout's path.
    let climb = format!("{}{}", "../".repeat(24), checkout.trim_start_matches('/'));
    vec![
        (
            "a base at the checkout's absolute path",
            vec![
                (base.clone(), format!("{keep}  - {checkout}\n")),
                ("kustomization.yaml".into(), read_config.into()),
            ],
        ),
        (
            "a base climbing out of the tree to the checkout",
            vec![
                (base.clone(), format!("{keep}  - {climb}\n")),
                ("kustomization.yaml".into(), read_config.into()),
            ],
        ),
        (
            "a generator file at the checkout's absolute path",
            vec![(
                base.clone(),
                format!(
                    "{keep}configMapGenerator:\n  - name: stolen\n    files: [token={checkout}/.git/config]\n"
                ),
            )],
        ),
        (
            "the environment of the process",
            vec![(
                base.clone(),
                format!(
                    "{keep}configMapGenerator:\n  - name: stolen\n    envs: [/proc/self/environ]\n"
                ),
            )],
        ),
        (
            "a remote resource",
            vec![(
                base.clone(),
                format!("{keep}  - http://127.0.0.1:{port}/stolen.yaml\n"),
            )],
        ),
        (
            "a remote git base",
            vec![(
                base.clone(),
                format!("{keep}  - git::http://127.0.0.1:{port}/org/repo.git//base?ref=main\n"),
            )],
        ),
        (
            "a Helm chart inflated by kustomize",
            vec![(
                base.clone(),
                format!(
                    "{keep}helmCharts:\n  - name: stolen\n    repo: http://127.0.0.1:{port}\n    version: 1.0.0\n"
                ),
            )],
        ),
        (
            "a transformer configuration file naming a URL",
            vec![
                (base.clone(), format!("{keep}transformers: [t.yaml]\n")),
                (
                    "manifests/common/base/t.yaml".into(),
                    format!(
                        "apiVersion: builtin\nkind: PatchTransformer\nmetadata: {{name: x}}\npath: http://127.0.0.1:{port}/patch.yaml\n"
                    ),
                ),
            ],
        ),
        (
            "a folder kustomize would clone from github.com",
            vec![
                (base.clone(), format!("{keep}  - github.com/org/repo\n")),
                (
                    "manifests/common/base/github.com/org/repo/kustomization.yaml".into(),
                    "resources: []\n".into(),
                ),
            ],
        ),
        (
            "a miscased key kustomize reads as resources",
            vec![
                (
                    base,
                    format!(
                        "resources:\n  - configmap.yaml\n  - deployment.yaml\nRESOURCES:\n  - {climb}\n"
                    ),
                ),
                ("kustomization.yaml".into(), read_config.into()),
            ],
        ),
    ]
}

/// The gate on `repo` (read as the sample repository's URL), with `args` first.
fn gate_on(cache: &Path, repo: &Path, args: &[&str]) -> Command {
    let mut command = common::gate(cache);
    command
        .args(args)
        .args(["--repo-url", common::SAMPLE_REPO_URL])
        .arg("--repo")
        .arg(repo);
    command
}

/// The sample repository's inventory and chart mirror.
fn sample_inputs(command: &mut Command) -> &mut Command {
    command
        .arg("--inventory")
        .arg(common::sample_dir().join("inventory.yaml"))
        .arg("--charts")
        .arg(common::sample_dir().join("charts"))
}

/// A repository whose first commit holds `files` (path, text).
fn repo_with(files: &[(&str, &str)]) -> common::TestRepo {
    let fixture = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let target = fixture.path().join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, text).unwrap();
    }
    common::TestRepo::from_fixture(fixture.path())
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

fn assert_clean(what: &str, text: &str) {
    for canary in [CONFIG_CANARY, ENV_CANARY] {
        assert!(!text.contains(canary), "{what}: the canary leaked:\n{text}");
    }
}

#[test]
fn a_pull_request_cannot_read_a_credential_or_reach_the_network() {
    let watch = common::NetworkWatch::get();
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    // A CI checkout keeps the token in its remote URL.
    git(
        repo.path(),
        &[
            "remote",
            "add",
            "origin",
            &format!("https://x-access-token:{CONFIG_CANARY}@github.com/platform/gitops.git"),
        ],
    );
    let mut unnamed = Vec::new();
    for (index, (name, files)) in attacks(repo.path(), watch.port).into_iter().enumerate() {
        let overlay = tempfile::tempdir().unwrap();
        for (path, text) in &files {
            let target = overlay.path().join(path);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(target, text).unwrap();
        }
        let branch = format!("attack-{index}");
        git(repo.path(), &["checkout", "-q", "main"]);
        // The work tree stays at the pull request's head, as a CI checkout's does.
        repo.commit_overlay(overlay.path(), &branch, name);
        let cache = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        // Without the network namespace (opted in): the pre-scan alone must keep every
        // attack out.
        let mut check = gate_on(
            cache.path(),
            repo.path(),
            &["check", "--head", &branch, "--default-branch", "main"],
        );
        let output = sample_inputs(&mut check)
            .env("GITHUB_TOKEN", ENV_CANARY)
            .env("GATE_NO_NETNS", "1")
            .arg("--allow-unconfined")
            .arg("--report")
            .arg(out.path().join("report.md"))
            .arg("--json")
            .arg(out.path().join("verdict.json"))
            .output()
            .unwrap();
        let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
        let json = std::fs::read_to_string(out.path().join("verdict.json")).unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        for (what, text) in [
            ("report", report.as_str()),
            ("json", json.as_str()),
            ("stdout", &stdout),
            ("stderr", &stderr),
        ] {
            assert_clean(&format!("{name}: {what}"), text);
        }
        // Never green: the render is refused, and the refusal names the kustomization.
        assert_eq!(output.status.code(), Some(2), "{name}: {report}");
        for format in ["yaml", "json"] {
            let mut render = gate_on(
                cache.path(),
                repo.path(),
                &["render", "--revision", &branch, "--format", format],
            );
            let output = sample_inputs(&mut render)
                .env("GITHUB_TOKEN", ENV_CANARY)
                .output()
                .unwrap();
            assert!(!output.status.success(), "{name}: render {format}");
            assert_clean(
                &format!("{name}: render {format}"),
                &String::from_utf8_lossy(&output.stdout),
            );
            assert_clean(
                &format!("{name}: render {format}"),
                &String::from_utf8_lossy(&output.stderr),
            );
        }
        if !(report.contains("kustomization.yaml: ")
            || report.contains("t.yaml: document 0: ")
            || report.contains("--enable-helm"))
        {
            unnamed.push(format!("{name}:\n{report}"));
        }
    }
    assert_eq!(watch.connections(), 0, "a render reached the network");
    // Every refusal names the kustomization file and its entry.
    assert!(unnamed.is_empty(), "{}", unnamed.join("\n"));
}

/// A chart whose template loops for minutes: with `--render-timeout 1` the call is killed
/// after a second, and the render is an error naming the chart and the limit, never a result.
#[test]
fn a_render_past_its_deadline_is_killed_and_fails_closed() {
    let files = [
        (
            "apps/slow.yaml",
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: slow\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: charts/slow\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: slow\n",
        ),
        (
            "charts/slow/Chart.yaml",
            "apiVersion: v2\nname: slow\nversion: 0.1.0\n",
        ),
        (
            "charts/slow/templates/loop.yaml",
            "{{- range $i := until 20000 }}{{- range $j := until 20000 }}{{- end }}{{- end }}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slow\n",
        ),
    ];
    let repo = repo_with(&files);
    let cache = tempfile::tempdir().unwrap();
    let output = gate_on(
        cache.path(),
        repo.path(),
        &["render", "--render-timeout", "1"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("helm template of chart at charts/slow")
            && stderr.contains("did not finish within 1 s (the render timeout)"),
        "{stderr}"
    );
}

/// A chart that prints without end (here 3 MiB, with `--render-output-mib 1`) is stopped at
/// the cap, its pipe drained so helm is never blocked, and the pull request's check is
/// undecided (exit 2) naming the chart and the limit: never green, never a partial render.
#[test]
fn a_chart_printing_past_the_output_cap_is_stopped_and_fails_closed() {
    let application = |name: &str| {
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: {name}\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: charts/{name}\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: {name}\n"
        )
    };
    let chart = |name: &str| format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n");
    let quiet = application("quiet");
    let quiet_chart = chart("quiet");
    let repo = repo_with(&[
        ("apps/quiet.yaml", quiet.as_str()),
        ("charts/quiet/Chart.yaml", quiet_chart.as_str()),
        (
            "charts/quiet/templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: quiet\n",
        ),
    ]);
    let overlay = tempfile::tempdir().unwrap();
    for (path, text) in [
        ("apps/loud.yaml", application("loud")),
        ("charts/loud/Chart.yaml", chart("loud")),
        (
            "charts/loud/templates/flood.yaml",
            "{{- range $i := until 3000 }}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: flood-{{ $i }}\ndata:\n  pad: {{ repeat 1000 \"x\" | quote }}\n{{- end }}\n".into(),
        ),
    ] {
        let target = overlay.path().join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, text).unwrap();
    }
    repo.commit_overlay(overlay.path(), "flood", "a chart that floods");
    let cache = tempfile::tempdir().unwrap();
    let output = gate_on(
        cache.path(),
        repo.path(),
        &[
            "check",
            "--head",
            "flood",
            "--default-branch",
            "main",
            "--render-output-mib",
            "1",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stdout}{stderr}");
    let said = format!("{stdout}{stderr}");
    assert!(
        said.contains("charts/loud")
            && said.contains("printed more than 1048576 bytes (the render output limit)"),
        "{said}"
    );
    // The same chart under the default cap renders: the limit, not the chart, stopped it.
    gate_on(
        cache.path(),
        repo.path(),
        &[
            "--quiet",
            "render",
            "--revision",
            "flood",
            "--format",
            "summary",
        ],
    )
    .assert()
    .success();
}

/// A revision a pull request's branch or a CI variable hands the gate is never read by git as
/// an option: `--output=FILE` as the head, the base or the default branch writes no file and
/// the check is undecided, saying it is not a revision.
#[test]
fn a_revision_that_reads_as_an_option_writes_nothing_and_fails_closed() {
    let repo = repo_with(&[("README.md", "x\n")]);
    let cache = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let written = scratch.path().join("written");
    let option = format!("--output={}", written.display());
    for args in [
        vec![format!("--head={option}"), "--default-branch=main".into()],
        vec!["--head=main".into(), format!("--base={option}")],
        vec!["--head=main".into(), format!("--default-branch={option}")],
    ] {
        let mut check = gate_on(cache.path(), repo.path(), &["check"]);
        let output = check.args(&args).output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains("not a revision"), "{args:?}: {said}");
        assert!(!written.exists(), "{args:?} made git write a file");
    }
}

/// Limits sized for real charts: a chart rendering 50,000 objects (5 MB) renders; the parser's
/// budgets apply per document, not to the whole stream.
#[test]
fn a_chart_rendering_fifty_thousand_objects_renders() {
    let files = [
        (
            "apps/big.yaml",
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: big\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: charts/big\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: big\n",
        ),
        (
            "charts/big/Chart.yaml",
            "apiVersion: v2\nname: big\nversion: 0.1.0\n",
        ),
        (
            "charts/big/templates/config-maps.yaml",
            "{{- range $i := until 50000 }}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{{ $i }}\n  labels: {app: big, index: \"{{ $i }}\"}\ndata:\n  a: \"1\"\n{{- end }}\n",
        ),
    ];
    let repo = repo_with(&files);
    let cache = tempfile::tempdir().unwrap();
    let output = gate_on(
        cache.path(),
        repo.path(),
        &["--quiet", "render", "--format", "json"],
    )
    .output()
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let objects = rendered["applications"][0]["objects"].as_array().unwrap();
    assert_eq!(objects.len(), 50_000);
}

/// helm reads `--set-file a=x,b=y` as two files: a fileParameters name that carries `,` or
/// `=` would read any file on the machine into the values. It is refused, and no byte of the
/// file reaches the output.
#[test]
fn a_file_parameter_name_cannot_read_a_file_outside_the_repository() {
    let repo = repo_with(&[
        (
            "apps/app.yaml",
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: reader\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: charts/echo\n    helm:\n      fileParameters:\n        - name: stolen=/etc/hostname,note\n          path: note.txt\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: echo\n",
        ),
        (
            "charts/echo/Chart.yaml",
            "apiVersion: v2\nname: echo\nversion: 0.1.0\n",
        ),
        ("charts/echo/note.txt", "a note\n"),
        (
            "charts/echo/templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: echo\ndata:\n  stolen: {{ .Values.stolen | default \"\" | quote }}\n",
        ),
    ]);
    let cache = tempfile::tempdir().unwrap();
    let output = gate_on(cache.path(), repo.path(), &["render", "--format", "yaml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("helm.fileParameters name"), "{stderr}");
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    if !hostname.trim().is_empty() {
        assert!(!String::from_utf8_lossy(&output.stdout).contains(hostname.trim()));
    }
}

/// Hostile `helmCharts` under `--kustomize-enable-helm`: a values path whose name carries a
/// comma (helm splits `--values` on commas) reads nothing outside the tree; a release name
/// that is a template, a field of the wrong type and a chart committed under `charts/` (which
/// kustomize would render instead of the mirror's) are refused.
#[test]
fn hostile_helm_charts_in_a_kustomization_are_confined() {
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(
        secret.path().join("secret.yaml"),
        "source: SECRET-OUTSIDE-THE-REPOSITORY\n",
    )
    .unwrap();
    let outside = format!("values.yaml,{}/secret.yaml", secret.path().display());
    let app = "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: inflated\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: base\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: probes\n";
    let chart = "helmCharts:\n  - name: probe\n    repo: https://charts.example.test/cases\n    version: 1.0.0\n";
    // (what, the files it adds, the refusal expected; None: renders, reading nothing outside)
    type Case = (String, Vec<(String, String)>, Option<&'static str>);
    let cases: Vec<Case> = vec![
        (
            "a comma in a values path".into(),
            vec![
                (
                    "base/kustomization.yaml".into(),
                    format!("{chart}    valuesFile: {outside:?}\n"),
                ),
                (
                    format!("base/{outside}").replace("//", "/"),
                    "source: decoy\n".into(),
                ),
            ],
            None,
        ),
        (
            "a release name that is a template".into(),
            vec![(
                "base/kustomization.yaml".into(),
                format!("{chart}    releaseName: '{{{{ env \"HOME\" }}}}'\n"),
            )],
            Some("not a release name"),
        ),
        (
            "a field of the wrong type".into(),
            vec![(
                "base/kustomization.yaml".into(),
                format!("{chart}    valuesFile: [values.yaml]\n"),
            )],
            Some("the wrong type"),
        ),
        (
            "a committed chart kustomize would render instead".into(),
            vec![
                ("base/kustomization.yaml".into(), chart.to_string()),
                (
                    "base/charts/probe/Chart.yaml".into(),
                    "apiVersion: v2\nname: probe\nversion: 1.0.0\n".into(),
                ),
            ],
            Some("is committed under charts/"),
        ),
    ];
    for (name, files, refusal) in cases {
        let mut all: Vec<(String, String)> = vec![
            ("apps/app.yaml".into(), app.into()),
            ("base/values.yaml".into(), "source: values\n".into()),
        ];
        all.extend(files);
        let borrowed: Vec<(&str, &str)> =
            all.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
        let repo = repo_with(&borrowed);
        let cache = tempfile::tempdir().unwrap();
        let output = gate_on(
            cache.path(),
            repo.path(),
            &["render", "--format", "yaml", "--kustomize-enable-helm"],
        )
        .arg("--charts")
        .arg(common::project_root().join("tests/render-cases/_charts"))
        .output()
        .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !stdout.contains("SECRET-OUTSIDE") && !stderr.contains("SECRET-OUTSIDE"),
            "{name}: {stdout}{stderr}"
        );
        match refusal {
            Some(why) => assert!(
                !output.status.success() && stderr.contains(why),
                "{name}: {stderr}"
            ),
            None => assert!(output.status.success(), "{name}: {stderr}"),
        }
    }
}

/// A hostile chart's CRD whose CEL rules would exhaust the gate: nested list macros over
/// literal lists (billions of values), a rule nested thousands of levels deep (a stack
/// overflow in the parser), and a rule that copies a large string in a loop. The gate reads
/// the CRD and checks the chart's own custom resource against it: the rules are not run
/// (reported unevaluated, never passed), the process neither aborts nor exhausts memory,
/// and a real violation of an evaluable rule beside them is still reported.
#[test]
fn a_charts_cel_rules_cannot_exhaust_the_gate() {
    let list = format!("[{}]", vec!["0"; 600].join(","));
    let bomb = format!("size({list}.map(x, {list}.map(y, {list}))) > 0");
    let deep = format!("{}true{}", "(".repeat(2040), ")".repeat(2040));
    let copy = "size(self.l.map(x, self.s + self.s)) > 0";
    // JSON is YAML: the CRD is written as JSON so no rule needs YAML quoting.
    let crd = serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "bombs.example.test"},
        "spec": {"group": "example.test", "scope": "Namespaced",
            "names": {"kind": "Bomb", "plural": "bombs", "singular": "bomb", "listKind": "BombList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object",
                    "x-kubernetes-validations": [{"rule": bomb}, {"rule": deep}, {"rule": copy},
                        {"rule": "self.min <= self.max", "message": "min above max"}],
                    "properties": {"min": {"type": "integer"}, "max": {"type": "integer"},
                        "l": {"type": "array", "items": {"type": "integer"}}, "s": {"type": "string"}}}}}}}]}})
    .to_string();
    let cr = format!(
        "apiVersion: example.test/v1\nkind: Bomb\nmetadata:\n  name: b\nspec:\n  min: 3\n  max: 2\n  l: [{}]\n  s: {}\n",
        vec!["0"; 100].join(","),
        "x".repeat(1 << 20)
    );
    let files = [
        (
            "apps/bomb.yaml",
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: bomb\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: charts/bomb\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: bomb\n",
        ),
        (
            "charts/bomb/Chart.yaml",
            "apiVersion: v2\nname: bomb\nversion: 0.1.0\n",
        ),
        ("charts/bomb/crds/bomb.yaml", crd.as_str()),
        ("charts/bomb/templates/bomb.yaml", cr.as_str()),
    ];
    let repo = repo_with(&files);
    let cache = tempfile::tempdir().unwrap();
    let report = cache.path().join("report.md");
    let head = repo.head();
    let mut command = gate_on(cache.path(), repo.path(), &["check"]);
    sample_inputs(&mut command)
        .args(["--base", &head, "--head", &head])
        .arg("--report")
        .arg(&report);
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Exit 0, 1 or 2: a verdict, not a crash (a stack overflow aborts with SIGABRT, the OOM
    // killer with SIGKILL: no exit code at all).
    assert!(
        matches!(output.status.code(), Some(0..=2)),
        "{:?}: {stderr}",
        output.status
    );
    let report = std::fs::read_to_string(&report).unwrap_or_default();
    assert!(report.contains("min above max"), "{report}\n{stderr}");
}

/// A chart mirror holding `charts.example.test/leaky/1.0.0`: a chart whose template prints
/// `secret.txt` and `environ`, both symbolic links (to a canary file on the host and to the
/// process's environment). Returns the mirror and the canary text.
fn leaky_mirror() -> (tempfile::TempDir, tempfile::TempDir, String) {
    let host = tempfile::tempdir().unwrap();
    let canary = "HOST-CANARY-7f3a9c1e5b".to_string();
    std::fs::write(host.path().join("secret"), format!("stolen: {canary}\n")).unwrap();
    let mirror = tempfile::tempdir().unwrap();
    let chart = mirror.path().join("charts.example.test/leaky/1.0.0");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: leaky\nversion: 1.0.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.join("templates/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: leaky\ndata:\n  secret: {{ .Files.Get \"secret.txt\" | quote }}\n  environ: {{ .Files.Get \"environ\" | quote }}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(host.path().join("secret"), chart.join("secret.txt")).unwrap();
    std::os::unix::fs::symlink("/proc/self/environ", chart.join("environ")).unwrap();
    (host, mirror, canary)
}

/// A symbolic link inside a mirrored chart is never followed, whichever path inflates the
/// chart: a Helm source naming it, and a kustomization's `helmCharts` naming it. Played with
/// and without the network namespace; the canary host file and the environment's token never
/// reach the render, the report or the verdict, and the check is never green.
#[test]
fn a_symbolic_link_in_a_mirrored_chart_is_refused_by_both_paths() {
    let (_host, mirror, canary) = leaky_mirror();
    let helm_app = "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: leaky\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://charts.example.test\n    chart: leaky\n    targetRevision: 1.0.0\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: leaky\n";
    let kustomize_app = "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: leaky\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: base\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: leaky\n";
    let kustomization =
        "helmCharts:\n  - name: leaky\n    repo: https://charts.example.test\n    version: 1.0.0\n";
    let paths: [(&str, Vec<(&str, &str)>); 2] = [
        ("a Helm source", vec![("apps/leaky.yaml", helm_app)]),
        (
            "a kustomization's helmCharts",
            vec![
                ("apps/leaky.yaml", kustomize_app),
                ("base/kustomization.yaml", kustomization),
            ],
        ),
    ];
    for (path, files) in paths {
        let repo = repo_with(&[("README.md", "x\n")]);
        let overlay = tempfile::tempdir().unwrap();
        for (file, text) in &files {
            let target = overlay.path().join(file);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(target, text).unwrap();
        }
        repo.commit_overlay(overlay.path(), "leak", path);
        for no_netns in [false, true] {
            let what = format!("{path} (GATE_NO_NETNS={no_netns})");
            let cache = tempfile::tempdir().unwrap();
            let out = tempfile::tempdir().unwrap();
            let mut check = gate_on(
                cache.path(),
                repo.path(),
                &[
                    "check",
                    "--head",
                    "leak",
                    "--default-branch",
                    "main",
                    "--kustomize-enable-helm",
                ],
            );
            check
                .arg("--inventory")
                .arg(common::sample_dir().join("inventory.yaml"))
                .arg("--charts")
                .arg(mirror.path())
                .arg("--report")
                .arg(out.path().join("report.md"))
                .arg("--json")
                .arg(out.path().join("verdict.json"))
                .env("GITHUB_TOKEN", ENV_CANARY);
            if no_netns {
                check.env("GATE_NO_NETNS", "1").arg("--allow-unconfined");
            }
            let output = check.output().unwrap();
            let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
            let json = std::fs::read_to_string(out.path().join("verdict.json")).unwrap();
            let mut render = gate_on(
                cache.path(),
                repo.path(),
                &[
                    "render",
                    "--revision",
                    "leak",
                    "--format",
                    "yaml",
                    "--kustomize-enable-helm",
                ],
            );
            render
                .arg("--charts")
                .arg(mirror.path())
                .env("GITHUB_TOKEN", ENV_CANARY);
            if no_netns {
                render.env("GATE_NO_NETNS", "1").arg("--allow-unconfined");
            }
            let rendered = render.output().unwrap();
            for (name, text) in [
                ("report", report.clone()),
                ("json", json),
                (
                    "check stdout",
                    String::from_utf8_lossy(&output.stdout).into(),
                ),
                (
                    "check stderr",
                    String::from_utf8_lossy(&output.stderr).into(),
                ),
                (
                    "render stdout",
                    String::from_utf8_lossy(&rendered.stdout).into(),
                ),
                (
                    "render stderr",
                    String::from_utf8_lossy(&rendered.stderr).into(),
                ),
            ] {
                assert!(
                    !text.contains(&canary),
                    "{what}: {name}: the host file leaked:\n{text}"
                );
                assert_clean(&format!("{what}: {name}"), &text);
            }
            assert_eq!(
                output.status.code(),
                Some(2),
                "{what}: never green:\n{report}"
            );
            assert!(!rendered.status.success(), "{what}: the render succeeded");
            assert!(
                report.contains("symbolic link inside a chart"),
                "{what}: the refusal names the link:\n{report}"
            );
        }
    }
}

/// A kustomization's inflated chart is part of its render key: the same commit rendered
/// again after the mirror's chart changed (re-pulled, or edited by hand) is rendered anew,
/// not answered from the cache with the old chart's output.
#[test]
fn a_kustomize_helm_chart_that_changes_in_the_mirror_is_rendered_anew() {
    let mirror = tempfile::tempdir().unwrap();
    let chart = mirror.path().join("charts.example.test/plain/1.0.0");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: plain\nversion: 1.0.0\n",
    )
    .unwrap();
    let template = |value: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain\ndata:\n  v: {value}\n")
    };
    std::fs::write(chart.join("templates/cm.yaml"), template("first-chart")).unwrap();
    let repo = repo_with(&[
        (
            "apps/plain.yaml",
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: plain\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: https://git.example.test/platform/gitops.git\n    targetRevision: HEAD\n    path: base\n  destination:\n    server: https://kubernetes.default.svc\n    namespace: plain\n",
        ),
        (
            "base/kustomization.yaml",
            "helmCharts:\n  - name: plain\n    repo: https://charts.example.test\n    version: 1.0.0\n",
        ),
    ]);
    let cache = tempfile::tempdir().unwrap();
    let render = || {
        let output = gate_on(
            cache.path(),
            repo.path(),
            &["render", "--format", "yaml", "--kustomize-enable-helm"],
        )
        .arg("--charts")
        .arg(mirror.path())
        .output()
        .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    assert!(render().contains("first-chart"));
    std::fs::write(chart.join("templates/cm.yaml"), template("second-chart")).unwrap();
    let again = render();
    assert!(
        again.contains("second-chart") && !again.contains("first-chart"),
        "the cache answered with the old chart:\n{again}"
    );
    // A symbolic link added to the cached chart is refused, not answered from the cache.
    std::os::unix::fs::symlink("/etc/hostname", chart.join("templates/link.yaml")).unwrap();
    let output = gate_on(
        cache.path(),
        repo.path(),
        &["render", "--format", "yaml", "--kustomize-enable-helm"],
    )
    .arg("--charts")
    .arg(mirror.path())
    .output()
    .unwrap();
    assert!(!output.status.success(), "a cached render hid the link");
}

/// Runs `command` under a python3 parent that reports its children's peak resident memory
/// (`getrusage(RUSAGE_CHILDREN)`: only the gate and what it ran). Returns (exit code, stdout,
/// stderr, peak in KiB).
fn run_measured(command: &Command) -> (Option<i32>, String, String, i64) {
    let out = tempfile::tempdir().unwrap();
    let mut measured = Command::new("python3");
    measured
        .arg("-c")
        .arg("import resource, subprocess, sys\nrc = subprocess.call(sys.argv[2:])\nopen(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\nsys.exit(rc)")
        .arg(out.path().join("peak"))
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => measured.env(key, value),
            None => measured.env_remove(key),
        };
    }
    let output = measured.output().unwrap();
    let peak = std::fs::read_to_string(out.path().join("peak"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into(),
        String::from_utf8_lossy(&output.stderr).into(),
        peak,
    )
}

/// A 300 MiB file in the pull request (zeros, a few hundred KiB in git's object store) is
/// refused by the size git lists for it, before it is read: the check is undecided with one
/// line naming the file and the budget, and the gate's peak memory stays far below the file.
#[test]
fn a_repository_file_over_the_yaml_budget_is_refused_before_it_is_read() {
    let repo = repo_with(&[("README.md", "x\n")]);
    let big = repo.path().join("charts/blob.yaml");
    std::fs::create_dir_all(big.parent().unwrap()).unwrap();
    let file = std::fs::File::create(&big).unwrap();
    file.set_len(300 << 20).unwrap(); // sparse: no disk, no memory
    drop(file);
    let identity = [
        "-c",
        "user.name=Test",
        "-c",
        "user.email=test@example.test",
        "-c",
        "core.bigFileThreshold=1m",
    ];
    for args in [
        vec!["checkout", "-q", "-b", "big"],
        vec!["add", "charts/blob.yaml"],
        vec!["commit", "-q", "-m", "a large file"],
    ] {
        let mut all: Vec<&str> = identity.to_vec();
        all.extend(args);
        git(repo.path(), &all);
    }
    std::fs::remove_file(&big).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut check = gate_on(
        cache.path(),
        repo.path(),
        &["check", "--head", "big", "--default-branch", "main"],
    );
    check
        .arg("--inventory")
        .arg(common::sample_dir().join("inventory.yaml"));
    let (code, stdout, stderr, peak_kib) = run_measured(&check);
    let said = format!("{stdout}{stderr}");
    assert_eq!(code, Some(2), "never green, never a crash: {said}");
    let line = said
        .lines()
        .find(|l| l.contains("over the 256 MiB a repository file may hold"))
        .unwrap_or_else(|| panic!("no refusal naming the budget: {said}"));
    assert!(line.contains("\"charts/blob.yaml\""), "{line}");
    assert!(line.contains(&(300u64 << 20).to_string()), "{line}");
    assert!(
        peak_kib < 150 * 1024,
        "the gate's peak memory was {peak_kib} KiB for a 300 MiB file"
    );
}

/// A gate run removes what killed runs left in the temp dir (their folders hold a pull
/// request's files): a folder named for a PID that no longer runs, or for a PID now reused by
/// a process started at another time, is removed; one of a live process is kept, as are
/// folders of other names and a symbolic link of the owned shape (never followed).
#[test]
fn a_gate_run_removes_the_temporary_folders_of_killed_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(dir.join("apps")).unwrap();
        std::fs::write(dir.join("apps/values.yaml"), "pull request content\n").unwrap();
        dir
    };
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let start: u64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let me = std::process::id();
    // This PID namespace (the gate's too): a folder of another namespace is never swept.
    let ns: u64 = std::fs::read_link("/proc/self/ns/pid")
        .unwrap()
        .to_string_lossy()
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .parse()
        .unwrap();
    let dead = folder(&format!("gate-4194309.12345.{ns}-tree-AbC123"));
    let reused = folder(&format!("gate-{me}.{}.{ns}-render-XyZ789", start + 1));
    let live = folder(&format!("gate-{me}.{start}.{ns}-tree-Live00"));
    let other = folder("gate-tree-unowned");
    let elsewhere = folder(&format!("gate-4194309.12345.{}-tree-OtherNs", ns + 1));
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), "x").unwrap();
    let link = tmp.path().join(format!("gate-4194310.1.{ns}-tree-Link00"));
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();

    // A SIGKILLed check of its own leaves folders too: a check started, killed once its
    // render tree exists.
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let cache = tempfile::tempdir().unwrap();
    let mut slow = gate_on(
        cache.path(),
        repo.path(),
        &[
            "check",
            "--head",
            "main",
            "--default-branch",
            "main",
            "--no-cache",
        ],
    );
    let mut child = sample_inputs(&mut slow)
        .env("TMPDIR", tmp.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let killed_prefix = format!("gate-{}.", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = false;
    while std::time::Instant::now() < deadline {
        seen = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&killed_prefix));
        if seen || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::yield_now();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let killed_left = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&killed_prefix))
            .count()
    };
    assert!(
        seen && killed_left() > 0,
        "the killed check left no folder to remove"
    );

    let mut check = gate_on(
        cache.path(),
        repo.path(),
        &["check", "--head", "main", "--default-branch", "main"],
    );
    let output = sample_inputs(&mut check)
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        killed_left(),
        0,
        "the SIGKILLed check's folders are removed"
    );
    assert!(!dead.exists(), "a dead owner's folder is removed");
    assert!(!reused.exists(), "a reused PID's folder is removed");
    assert!(
        live.join("apps/values.yaml").exists(),
        "a live owner's folder is kept"
    );
    assert!(other.exists(), "a folder of another shape is kept");
    assert!(
        elsewhere.exists(),
        "a folder of another PID namespace is kept (its owner may be alive there)"
    );
    assert!(
        outside.path().join("keep").exists() && link.symlink_metadata().is_ok(),
        "a link is never followed"
    );
}

/// Where no network namespace can be made (`GATE_NO_NETNS=1` plays a machine without user
/// namespaces), a render fails closed unless the operator opted in: `gate check` cannot decide
/// (exit 2, never green) with one line saying why and how, `gate render` fails, and nothing
/// runs helm. Opted in, the check runs with a scrubbed environment and its report says so.
#[test]
fn without_a_network_namespace_a_render_refuses_unless_opted_in() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(
        &common::project_root().join("tests/check-cases/es-major-bump/head"),
        "pr",
        "bump external-secrets",
    );
    let cache = tempfile::tempdir().unwrap();
    let check = |extra: &[&str], env: &[(&str, &str)]| {
        let out = tempfile::tempdir().unwrap();
        let mut check = gate_on(
            cache.path(),
            repo.path(),
            &["check", "--head", "pr", "--default-branch", "main"],
        );
        let output = sample_inputs(&mut check)
            .env("GATE_NO_NETNS", "1")
            .env_remove("GATE_ALLOW_UNCONFINED")
            .envs(env.iter().copied())
            .args(extra)
            .arg("--report")
            .arg(out.path().join("report.md"))
            .arg("--json")
            .arg(out.path().join("verdict.json"))
            .output()
            .unwrap();
        let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.path().join("verdict.json")).unwrap(),
        )
        .unwrap();
        (output, report, json)
    };
    // Refused: could not decide, one error line that names the cause and both ways out.
    let (output, report, json) = check(&[], &[]);
    assert_eq!(output.status.code(), Some(2), "{report}");
    assert_eq!(json["verdict"]["outcome"], "undecided", "{json}");
    let errors = json["verdict"]["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = errors[0].as_str().unwrap();
    assert!(!error.contains('\n'), "{error}");
    for needed in [
        "renders refused",
        "network namespace",
        "GATE_NO_NETNS=1",
        "--allow-unconfined",
        "render.allowUnconfined",
    ] {
        assert!(error.contains(needed), "{needed}: {error}");
    }
    assert!(report.contains("could not decide"), "{report}");
    assert!(!report.contains("Renders unconfined"), "{report}");
    // `gate render` fails too (exit 1), with that line on stderr and nothing on stdout.
    let mut render = gate_on(cache.path(), repo.path(), &["render", "--revision", "pr"]);
    let rendered = sample_inputs(&mut render)
        .env("GATE_NO_NETNS", "1")
        .env_remove("GATE_ALLOW_UNCONFINED")
        .output()
        .unwrap();
    assert_eq!(rendered.status.code(), Some(1));
    assert!(rendered.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&rendered.stderr).contains("renders refused"),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    // Opted in (the flag, or the variable): the check decides, and its report says how the
    // renders ran.
    for (extra, env) in [
        (&["--allow-unconfined"][..], &[][..]),
        (&[][..], &[("GATE_ALLOW_UNCONFINED", "1")][..]),
    ] {
        let (output, report, json) = check(extra, env);
        assert_eq!(output.status.code(), Some(1), "{report}");
        assert_eq!(json["verdict"]["outcome"], "blocked", "{json}");
        assert_eq!(json["confinement"], "scrubbedEnvironmentOnly", "{json}");
        assert!(
            report.contains(
                "_Renders unconfined (opted in): scrubbed environment only, no network namespace._"
            ),
            "{report}"
        );
        // The footer is outside every machine block.
        assert!(
            gitops_loop::gate::report::parse(&report).is_ok(),
            "{report}"
        );
    }
}

/// Where the machine makes network namespaces, the report says the renders were confined
/// (and the opt-in changes nothing).
#[test]
fn with_a_network_namespace_the_report_says_the_renders_were_confined() {
    if !gitops_loop::render::confine::network_namespace_available() {
        eprintln!("no network namespace here: the confined footer cannot be shown");
        return;
    }
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    repo.commit_overlay(
        &common::project_root().join("tests/check-cases/es-major-bump/head"),
        "pr",
        "bump external-secrets",
    );
    let cache = tempfile::tempdir().unwrap();
    for extra in [&[][..], &["--allow-unconfined"][..]] {
        let out = tempfile::tempdir().unwrap();
        let mut check = gate_on(
            cache.path(),
            repo.path(),
            &["check", "--head", "pr", "--default-branch", "main"],
        );
        let output = sample_inputs(&mut check)
            .env_remove("GATE_NO_NETNS")
            .args(extra)
            .arg("--report")
            .arg(out.path().join("report.md"))
            .output()
            .unwrap();
        let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
        assert_eq!(output.status.code(), Some(1), "{report}");
        assert!(
            report.contains(
                "_Renders confined: network namespace (no network) and a scrubbed environment._"
            ),
            "{report}"
        );
    }
}
