//! Tests of `tree`.

use crate::render::kustomize::tree::{check_confined, helm_charts};

fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let target = dir.path().join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, text).unwrap();
    }
    dir
}

fn check(files: &[(&str, &str)], start: &str) -> Result<(), String> {
    let dir = tree(files);
    check_confined(dir.path(), &dir.path().join(start), false).map(|_| ())
}

#[test]
fn entries_inside_the_tree_pass() {
    let ok = check(
        &[
            (
                "app/kustomization.yaml",
                "resources: [../base, cm.yaml]\nconfigMapGenerator:\n- name: x\n  files: [k=conf.txt]\npatches:\n- path: p.yaml\n",
            ),
            ("app/cm.yaml", "kind: ConfigMap"),
            ("app/conf.txt", "x"),
            ("app/p.yaml", "x"),
            ("base/kustomization.yaml", "resources: [d.yaml]\n"),
            ("base/d.yaml", "kind: Deployment"),
        ],
        "app",
    );
    assert_eq!(ok, Ok(()));
}

#[test]
fn every_way_out_is_refused_with_file_and_entry() {
    let cases = [
        ("resources: [http://127.0.0.1:1/x.yaml]", "remote location"),
        (
            "resources: [github.com/org/repo//base?ref=v1]",
            "remote location",
        ),
        (
            "resources: [git@github.com:org/repo.git]",
            "remote location",
        ),
        ("resources: [/etc]", "absolute path"),
        ("bases: [../../..]", "leaves the repository"),
        ("components: [../nowhere]", "not a file or folder"),
        (
            "configMapGenerator:\n- name: t\n  files: [token=../../../.git/config]",
            "leaves the repository",
        ),
        (
            "secretGenerator:\n- name: t\n  envs: [/proc/self/environ]",
            "absolute path",
        ),
        ("replacements:\n- path: ../../../x", "leaves the repository"),
        ("openapi:\n  path: /tmp/schema.json", "absolute path"),
        ("crds: [../../../crd.yaml]", "leaves the repository"),
        ("patches:\n- path: ssh://host/p.yaml", "remote location"),
        ("RESOURCES: [/etc]", "\"resources\" in another case"),
        ("Bases: [../../..]", "\"bases\" in another case"),
        ("re\u{17f}ources: [/etc]", "not a kustomization field"),
        (
            "configMapGenerator:\n- name: t\n  Files: [k=/etc/passwd]",
            "configMapGenerator[0]: key \"Files\" is \"files\" in another case",
        ),
        ("patches:\n- PATH: /etc/x", "\"path\" in another case"),
        ("resources: [github.com/org/repo]", "remote location"),
        ("resources: [base//sub]", "remote location"),
        (
            "helmCharts:\n- name: x\n  repo: https://charts.example.test",
            "--kustomize-enable-helm",
        ),
    ];
    for (kustomization, why) in cases {
        let err = check(&[("a/app/kustomization.yaml", kustomization)], "a/app")
            .expect_err(kustomization);
        assert!(err.starts_with("a/app/kustomization.yaml: "), "{err}");
        assert!(err.contains(why), "{kustomization}: {err}");
    }
}

#[test]
fn a_base_reached_through_another_is_checked_too() {
    let err = check(
        &[
            ("app/kustomization.yaml", "resources: [../base]"),
            (
                "base/kustomization.yaml",
                "resources: [https://example.test/x.yaml]",
            ),
        ],
        "app",
    )
    .unwrap_err();
    assert!(
        err.starts_with("base/kustomization.yaml: resources entry"),
        "{err}"
    );
}

#[test]
fn a_plugin_configuration_file_is_scanned_too() {
    let kustomization = "resources: [cm.yaml]\ntransformers: [t.yaml]\n";
    for (plugin, why) in [
        (
            "apiVersion: builtin\nkind: PatchTransformer\nmetadata: {name: x}\npath: http://127.0.0.1:9/p.yaml\n",
            "remote location",
        ),
        (
            "apiVersion: builtin\nkind: ReplacementTransformer\nmetadata: {name: x}\nreplacements:\n- path: /etc/passwd\n",
            "absolute path",
        ),
        (
            "apiVersion: builtin\nkind: ConfigMapGenerator\nmetadata: {name: x}\nfiles: [k=../../../x]\n",
            "leaves the repository",
        ),
        (
            "apiVersion: builtin\nkind: PatchTransformer\nmetadata: {name: x}\nPath: /etc/x\n",
            "another case",
        ),
        (
            "apiVersion: example.test/v1\nkind: Exfiltrator\nmetadata: {name: x}\n",
            "not a built-in plugin",
        ),
    ] {
        let err = check(
            &[
                ("a/app/kustomization.yaml", kustomization),
                ("a/app/cm.yaml", "kind: ConfigMap"),
                ("a/app/t.yaml", plugin),
            ],
            "a/app",
        )
        .expect_err(plugin);
        assert!(err.starts_with("a/app/t.yaml: document 0: "), "{err}");
        assert!(err.contains(why), "{plugin}: {err}");
    }
    let fine = check(
        &[
            ("a/app/kustomization.yaml", kustomization),
            ("a/app/cm.yaml", "kind: ConfigMap"),
            ("a/app/p.yaml", "kind: ConfigMap"),
            (
                "a/app/t.yaml",
                "apiVersion: builtin\nkind: PatchTransformer\nmetadata: {name: x}\npath: p.yaml\ntarget: {kind: ConfigMap}\n",
            ),
        ],
        "a/app",
    );
    assert_eq!(fine, Ok(()));
}

#[test]
fn inline_strategic_merge_patches_are_not_paths() {
    let ok = check(
        &[(
            "app/kustomization.yaml",
            "patchesStrategicMerge:\n- |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: x}\n",
        )],
        "app",
    );
    assert_eq!(ok, Ok(()));
}

#[test]
fn a_helm_chart_name_or_version_that_is_a_path_is_refused() {
    let chart = |name: &str, version: &str| serde_json::json!({"helmCharts": [{"name": name, "repo": "https://charts.example.test", "version": version}]});
    assert!(helm_charts(&chart("probe", "1.0.0"), true).is_ok());
    for (name, version, why) in [
        ("../../etc", "1.0.0", "not a chart name"),
        ("/abs", "1.0.0", "not a chart name"),
        ("probe", "../..", "not a pinned chart version"),
        ("probe", "^1.0", "not a pinned chart version"),
    ] {
        let err = helm_charts(&chart(name, version), true).unwrap_err();
        assert!(err.contains(why), "{name} {version}: {err}");
    }
}
