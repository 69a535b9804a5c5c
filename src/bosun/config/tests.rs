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
    for url in ["gs://gate-cache/fleet", "az://gate-cache/fleet"] {
        let config = Config::parse(
            &format!("{base}render: {{cacheUrl: '{url}', cachePublicKey: '{public}'}}\n"),
            "b.yaml",
        )
        .unwrap();
        assert_eq!(config.render.cache_url.as_deref(), Some(url));
    }
    for (render, says) in [
        (
            "{cacheUrl: 'gs://goog-cache/fleet', cachePublicKey: 'x'}",
            "not a Cloud Storage bucket name",
        ),
        (
            "{cacheUrl: 'az://gate_cache/fleet', cachePublicKey: 'x'}",
            "not an Azure container name",
        ),
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

/// Issue 31 follow-up: on GitLab a repository may be a project in a subgroup, named by its
/// full path; the push URL carries that path and the credential helper's user name, never the
/// token. GitHub and Gitea keep exactly OWNER/NAME.
#[test]
fn a_gitlab_repository_may_live_in_a_subgroup_and_github_keeps_owner_name() {
    let gitlab = |slug: &str| {
        format!(
            "forge: {{kind: gitlab, apiUrl: https://gitlab.example.com/api/v4, gitUrl: 'https://oauth2:{{token}}@gitlab.example.com/{{slug}}.git'}}\nrepositories: [{{slug: '{slug}', url: u}}]\ninventory: {{file: i.yaml}}\n"
        )
    };
    let config = Config::parse(&gitlab("platform/team/addons/gitops"), "bosun.yaml").unwrap();
    let slug = &config.repositories[0].slug;
    assert_eq!(
        (slug.owner.as_str(), slug.name.as_str()),
        ("platform/team/addons", "gitops")
    );
    assert_eq!(
        config.git_remote(slug),
        GitRemote {
            url: "https://gitlab.example.com/platform/team/addons/gitops.git".into(),
            username: Some("oauth2".into()),
        }
    );
    // Named by a delivery: whatever its case on GitLab, under this file's spelling.
    for text in ["platform/team/addons/gitops", "Platform/TEAM/addons/GitOps"] {
        assert_eq!(config.named(text), Ok(Some(slug.clone())), "{text}");
    }
    for text in [
        "platform/team/gitops",
        "platform/team/addons",
        "team/addons/gitops",
    ] {
        assert_eq!(config.named(text), Ok(None), "{text}");
    }
    assert!(config.named("platform/team/../gitops").is_err());
    // Hostile paths: one line naming the field and the text.
    for hostile in [
        "a/../b",
        "a//b",
        "/a/b",
        "a/b/",
        "%2e%2e/b",
        "a/b\\tc",
        &vec!["g"; 23].join("/"),
    ] {
        let err = Config::parse(&gitlab(hostile), "bosun.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("bosun.yaml: repositories[0].slug: ")
                && err.contains("is not a GitLab project path")
                && !err.contains('\n'),
            "{hostile}: {err}"
        );
    }
    // GitHub and Gitea: one owner, one name.
    for kind in ["github", "gitea"] {
        let text = gitlab("platform/team/gitops").replace("kind: gitlab", &format!("kind: {kind}"));
        let err = Config::parse(&text, "bosun.yaml").unwrap_err().to_string();
        assert!(
            err.starts_with(
                "bosun.yaml: repositories[0].slug: \"platform/team/gitops\" is not OWNER/NAME"
            ),
            "{kind}: {err}"
        );
        for hostile in ["a/..", "../b", "a/b c", "a/b?x", "a/b\\n"] {
            let text = gitlab(hostile).replace("kind: gitlab", &format!("kind: {kind}"));
            let err = Config::parse(&text, "bosun.yaml").unwrap_err().to_string();
            assert!(
                err.contains("is not OWNER/NAME") && !err.contains('\n'),
                "{kind} {hostile:?}: {err}"
            );
        }
        let github = Config::parse(
            &gitlab("platform/gitops").replace("kind: gitlab", &format!("kind: {kind}")),
            "bosun.yaml",
        )
        .unwrap();
        // Exactly as listed off GitLab.
        assert_eq!(github.named("Platform/GitOps"), Ok(None));
        assert!(github.named("platform/gitops").unwrap().is_some());
    }
}

/// Two repositories that differ in ASCII case only are one repository to the forge (and to
/// GitLab's webhook, which would take the first): refused when the file is read.
#[test]
fn two_repositories_that_differ_in_case_only_are_refused() {
    for (kind, first, second) in [
        ("gitlab", "platform/team/gitops", "Platform/Team/GitOps"),
        ("gitlab", "platform/gitops", "platform/gitops"),
        ("github", "platform/gitops", "PLATFORM/gitops"),
        ("gitea", "platform/gitops", "platform/GitOps"),
    ] {
        let text = format!(
            "forge: {{kind: {kind}, apiUrl: x}}\nrepositories: [{{slug: a/b, url: u}}, {{slug: '{first}', url: u1}}, {{slug: '{second}', url: u2}}]\ninventory: {{file: i.yaml}}\n"
        );
        let err = Config::parse(&text, "bosun.yaml").unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "bosun.yaml: repositories[2].slug {second:?} names the repository of repositories[1].slug {first:?} (the forge ignores case in names): list it once"
            ),
            "{kind}"
        );
    }
    // Another path is another repository, a subgroup's project of the same name included.
    let text = "forge: {kind: gitlab, apiUrl: x}\nrepositories: [{slug: platform/gitops, url: u1}, {slug: platform/team/gitops, url: u2}]\ninventory: {file: i.yaml}\n";
    assert_eq!(
        Config::parse(text, "bosun.yaml")
            .unwrap()
            .repositories
            .len(),
        2
    );
}
