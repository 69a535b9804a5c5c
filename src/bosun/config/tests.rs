//! Tests of `config`.

use super::*;

#[test]
fn a_minimal_file_takes_the_documented_defaults() {
    let config = Config::parse(
            "forge: {apiUrl: https://api.github.com}\nrepositories: [{slug: platform/gitops, url: https://github.com/platform/gitops.git}]\ninventory: {kubernetes: {}}\n",
            "bosun.yaml",
        )
        .unwrap();
    assert_eq!(config.attempt_cap, 2);
    assert_eq!(config.labels.needs_human, "needs-human");
    assert_eq!(config.deny, [".github/**", ".git/**"]);
    assert_eq!(config.model.provider, ModelProvider::None);
    assert_eq!(config.promotion_scope, PromotionScope::Deployed);
    assert!(
        matches!(config.inventory, InventoryConfig::Kubernetes { ref namespace } if namespace == "argocd")
    );
    assert_eq!(
        config.git_remote(&"platform/gitops".parse().unwrap()),
        GitRemote {
            url: "https://github.com/platform/gitops.git".into(),
            username: Some("x-access-token".into()),
        }
    );
}

#[test]
fn the_inventory_can_come_from_argo_cds_api() {
    let base = "forge: {apiUrl: x}\nrepositories: [{slug: a/b, url: u}]\n";
    let config = Config::parse(
        &format!("{base}inventory: {{argocd: {{server: https://argocd.example}}}}\n"),
        "b.yaml",
    )
    .unwrap();
    assert!(matches!(
        config.inventory,
        InventoryConfig::Argocd { ref server, ref token_env }
            if server == "https://argocd.example" && token_env == "ARGOCD_AUTH_TOKEN"
    ));
    let err = Config::parse(
        &format!("{base}inventory: {{argocd: {{server: argocd.example}}}}\n"),
        "b.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("not an http(s) URL"), "{err}");
}

#[test]
fn a_gitea_forge_publishes_a_status_and_refuses_check_runs() {
    let gitea = "forge: {kind: gitea, apiUrl: https://gitea.example/api/v1}\nrepositories: [{slug: a/b, url: u}]\ninventory: {file: i.yaml}\n";
    let config = Config::parse(gitea, "bosun.yaml").unwrap();
    assert_eq!(config.forge.kind, crate::forge::ForgeKind::Gitea);
    assert_eq!(config.forge.check_mode(), CheckMode::Status);
    let github = gitea.replace("kind: gitea, ", "");
    assert_eq!(
        Config::parse(&github, "bosun.yaml")
            .unwrap()
            .forge
            .check_mode(),
        CheckMode::CheckRun
    );
    let err = Config::parse(
        &gitea.replace("kind: gitea,", "kind: gitea, checkMode: check-run,"),
        "bosun.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("has no check runs"), "{err}");
    let gitlab = Config::parse(
        &gitea
            .replace("gitea,", "gitlab,")
            .replace("/api/v1", "/api/v4"),
        "bosun.yaml",
    )
    .unwrap();
    assert_eq!(gitlab.forge.kind, crate::forge::ForgeKind::Gitlab);
    assert_eq!(gitlab.forge.check_mode(), CheckMode::Status);
    assert_eq!(
        gitlab.webhook.gitlab_token_env,
        "BOSUN_GITLAB_WEBHOOK_TOKEN"
    );
    let err = Config::parse(
        &gitea.replace("kind: gitea,", "kind: gitlab, checkMode: check-run,"),
        "bosun.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("has no check runs"), "{err}");
}

#[test]
fn unknown_keys_and_bad_globs_are_refused() {
    let base =
        "forge: {apiUrl: x}\nrepositories: [{slug: a/b, url: u}]\ninventory: {file: i.yaml}\n";
    assert!(Config::parse(&format!("{base}attemptCaps: 3\n"), "b.yaml").is_err());
    let err = Config::parse(&format!("{base}deny: ['a/[']\n"), "b.yaml").unwrap_err();
    assert!(err.to_string().starts_with("b.yaml: glob \"a/[\""), "{err}");
    assert!(Config::parse(&format!("{base}model: {{provider: openai}}\n"), "b.yaml").is_err());
    assert!(
        Config::parse(
            &format!("{base}model: {{provider: gemini, model: m}}\n"),
            "b.yaml"
        )
        .is_err()
    );
    let config = Config::parse(
        &format!(
            "{base}model: {{provider: openai, model: qwen, baseUrl: 'http://127.0.0.1:8000/v1'}}\n"
        ),
        "b.yaml",
    )
    .unwrap();
    assert_eq!(config.model.max_calls_per_pull_request, 10);
    assert_eq!(config.model.max_calls_per_head, 5);
}

#[test]
fn the_operators_redaction_rules_are_read_and_a_bad_pattern_is_refused() {
    let base =
        "forge: {apiUrl: x}\nrepositories: [{slug: a/b, url: u}]\ninventory: {file: i.yaml}\n";
    let config = Config::parse(
        &format!("{base}model: {{redact: {{keys: [licenceKey, seat], values: ['^corp-']}}}}\n"),
        "b.yaml",
    )
    .unwrap();
    let rules = config.model.redaction();
    assert!(rules.key("LICENCE_KEY") && rules.key("seat") && !rules.key("replicas"));
    assert!(rules.value("corp-123") && !rules.value("public-123"));
    let err = Config::parse(
        &format!("{base}model: {{redact: {{values: ['(']}}}}\n"),
        "b.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("model.redact.values"), "{err}");
}

#[test]
fn a_remote_render_cache_needs_the_public_key_its_entries_are_signed_with() {
    let base =
        "forge: {apiUrl: x}\nrepositories: [{slug: a/b, url: u}]\ninventory: {kubernetes: {}}\n";
    let (_, public) = crate::remote_cache::generate_keys().unwrap();
    let config = Config::parse(
        &format!(
            "{base}render: {{cacheUrl: 's3://gate-cache/fleet', cachePublicKey: '{public}'}}\n"
        ),
        "b.yaml",
    )
    .unwrap();
    assert_eq!(
        config.render.cache_url.as_deref(),
        Some("s3://gate-cache/fleet")
    );
    assert_eq!(
        config.render.cache_public_key.as_deref(),
        Some(public.as_str())
    );
    for (render, says) in [
        (
            "{cacheUrl: 's3://gate-cache/fleet'}",
            "needs render.cachePublicKey",
        ),
        (
            "{cacheUrl: 'https://gate-cache/fleet', cachePublicKey: 'x'}",
            "render.cacheUrl",
        ),
        (
            "{cacheUrl: 's3://gate-cache', cachePublicKey: 'not a key'}",
            "render.cachePublicKey",
        ),
    ] {
        let err = Config::parse(&format!("{base}render: {render}\n"), "b.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{render}: {err}");
    }
}
