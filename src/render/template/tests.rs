//! Tests of `template`.

use serde_json::Value;
use serde_json::json;

use crate::render::template::{
    Params, fasttemplate, first_missing_key, go_render_batch, hoist_defines, map_strings,
    mentions_function, rewrite_function,
};
use crate::render::tools::Tool;

fn params(v: Value) -> Params {
    v.as_object().cloned().unwrap()
}

#[test]
fn fasttemplate_leaves_unknown_keys_verbatim() {
    let p = params(json!({"name": "prod", "values.tier": "gold"}));
    assert_eq!(
        fasttemplate("{{name}}-{{ values.tier }}", &p).unwrap(),
        "prod-gold"
    );
    assert_eq!(
        fasttemplate("{{ nope }}/{{name}}", &p).unwrap(),
        "{{ nope }}/prod"
    );
    assert!(fasttemplate("{{name", &p).is_err());
}

#[test]
fn missing_keys_found_at_top_level_only() {
    let p = params(json!({"path": {"basename": "web"}, "name": "x"}));
    assert_eq!(first_missing_key("{{.path.basename}}-{{.name}}", &p), None);
    assert_eq!(
        first_missing_key("{{ .path.nope }}", &p).as_deref(),
        Some("nope")
    );
    assert_eq!(
        first_missing_key("{{ .cluster }}", &p).as_deref(),
        Some("cluster")
    );
    assert_eq!(
        first_missing_key("{{ index .metadata.labels \"env\" }}", &p).as_deref(),
        Some("metadata")
    );
    assert_eq!(
        first_missing_key("{{ range .path }}{{ .x }}{{ end }}", &p),
        None
    );
    assert_eq!(first_missing_key("{{ \".nope\" }}", &p), None);
    assert_eq!(first_missing_key("{{ $.name | upper }}", &p), None);
}

#[test]
fn functions_argo_cd_does_not_have_are_refused_by_name() {
    let helm = Tool {
        name: "helm",
        path: "/nonexistent/helm".into(),
        source: crate::render::tools::ToolSource::Flag,
        limits: Default::default(),
    };
    let work = tempfile::tempdir().unwrap();
    let p = vec![params(json!({"name": "prod"}))];
    for (template, function) in [
        (
            "{{ getHostByName \"metadata.google.internal\" }}",
            "getHostByName",
        ),
        ("{{ env \"GITHUB_TOKEN\" }}", "env"),
        ("{{ include \"x\" . }}", "include"),
        ("{{ .name | required \"n\" }}", "required"),
        ("{{ lookup \"v1\" \"Secret\" \"argocd\" \"x\" }}", "lookup"),
        ("{{ block \"x\" . }}y{{ end }}", "block"),
    ] {
        let err = go_render_batch(&helm, work.path(), &[template.into()], &p, false).unwrap_err();
        assert!(
            err.contains(&format!(
                "`{function}` is not a function of Argo CD's goTemplate"
            )),
            "{template}: {err}"
        );
    }
    // A field or a variable of that name is not the function.
    assert!(!mentions_function("{{ .env }}-{{ $template }}", "env"));
    // A rune constant holding a quote, or `}}` inside a string, does not hide what follows.
    assert!(mentions_function(
        "{{ index (list '\"' (toToml (dict \"a\" \"b\"))) 1 }}",
        "toToml"
    ));
    assert!(mentions_function(
        "{{ printf \"}}\" | getHostByName }}",
        "getHostByName"
    ));
    assert!(mentions_function(
        "{{ /* }} */ getHostByName \"x\" }}",
        "getHostByName"
    ));
}

#[test]
fn defines_are_hoisted_and_named_per_field() {
    let (body, defines) = hoist_defines(
            "{{- define \"host\" }}{{ if .x }}{{ .name }}.example.test{{ end }}{{ end -}}\n{{ template \"host\" . }}/x",
            "s3",
        )
        .unwrap();
    assert_eq!(body, "{{ template \"s3.host\" . }}/x");
    assert_eq!(
        defines,
        "{{ define \"s3.host\" }}{{ if .x }}{{ .name }}.example.test{{ end }}{{ end }}\n"
    );
    assert!(hoist_defines("{{ define \"x\" }}open", "s0").is_err());
    for refused in [
        "{{ if true }}{{ define \"a\" }}team{{ end }}{{ end }}{{ template \"a\" }}",
        "team{{ end }}{{ if true }}",
        "ns-{{ template \"s0\" . }}",
        "{{ template \"argocd.normalize\" .name }}",
        "{{ if .x }}open",
    ] {
        assert!(hoist_defines(refused, "s1").is_err(), "{refused}");
    }
}

#[test]
fn normalize_is_rewritten_outside_strings() {
    assert_eq!(
        rewrite_function(
            "{{ normalize .name }} {{ \"normalize\" }}",
            "normalize",
            "include \"n\""
        ),
        "{{ include \"n\" .name }} {{ \"normalize\" }}"
    );
    assert_eq!(
        rewrite_function("{{ .normalize }}", "normalize", "X"),
        "{{ .normalize }}"
    );
}

#[test]
fn map_strings_templates_keys_and_values() {
    let p = params(json!({"env": "prod"}));
    let out = map_strings(
        &json!({"labels": {"{{env}}": "{{env}}-x"}, "n": 1}),
        &mut |s| fasttemplate(s, &p),
    )
    .unwrap();
    assert_eq!(out, json!({"labels": {"prod": "prod-x"}, "n": 1}));
}
