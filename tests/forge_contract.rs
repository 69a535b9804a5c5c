//! The project's forge clients (GitHub, Gitea and GitLab) and `gate publish` against the forge
//! double (GitHub's REST subset, Gitea's `/api/v1` and GitLab's `/api/v4` over the same real
//! git): requests asserted by method, path and body, and the trait's behaviour played on all
//! three.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use gitops_loop::forge::github::GitHub;
use gitops_loop::forge::{
    CheckRun, CommitStatus, Conclusion, Forge, ForgeKind, RepoSlug, StatusState,
    upsert_marked_comment,
};
use ground::forge::ForgeDouble;
use serde_json::json;

const SLUG: &str = "platform/gitops";

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    ground::git::git(dir, args).unwrap()
}

/// A forge with the sample repository, a bump branch and an open pull request (#1).
async fn forge_with_pull(version: &str) -> (ForgeDouble, tempfile::TempDir) {
    let forge = ForgeDouble::start(None).await.unwrap();
    forge.add_user("gate-token", "addons-gate[bot]");
    forge.add_user("kargo-token", "kargo");
    let url = forge
        .create_repo(SLUG, &common::sample_dir().join("repo"))
        .unwrap();
    forge.protect(SLUG, "main", &["addons-gate"]);
    let clone = tempfile::tempdir().unwrap();
    git(clone.path(), &["clone", "--quiet", &url, "."]);
    git(clone.path(), &["checkout", "--quiet", "-b", "kargo/bump"]);
    let targets = clone.path().join("targets/addons.yaml");
    let text = std::fs::read_to_string(&targets)
        .unwrap()
        .replace("version: 0.10.3", &format!("version: {version}"));
    std::fs::write(&targets, text).unwrap();
    git(
        clone.path(),
        &["commit", "--quiet", "-am", "bump external-secrets"],
    );
    git(clone.path(), &["push", "--quiet", "origin", "kargo/bump"]);
    let response = reqwest::Client::new()
        .post(format!("{}/repos/{SLUG}/pulls", forge.url()))
        .bearer_auth("kargo-token")
        .json(&json!({"title": "Promote external-secrets", "head": "kargo/bump", "base": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    (forge, clone)
}

#[tokio::test(flavor = "multi_thread")]
async fn client_reads_pull_requests_with_live_shas() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let pull = client.pull_request(&slug, 1).await.unwrap();
    assert_eq!(pull.head_sha, git(clone.path(), &["rev-parse", "HEAD"]));
    assert_eq!(
        pull.base_sha,
        git(clone.path(), &["rev-parse", "origin/main"])
    );
    assert_eq!(
        (
            pull.head_ref.as_str(),
            pull.base_ref.as_str(),
            pull.author.as_str()
        ),
        ("kargo/bump", "main", "kargo")
    );
    assert_eq!(client.current_user().await.unwrap(), "addons-gate[bot]");
    let bad = GitHub::new(&forge.url(), "wrong").unwrap();
    let err = bad.pull_request(&slug, 1).await.unwrap_err();
    assert_eq!(err.status(), Some(401));
    assert!(err.to_string().contains("Bad credentials"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn marked_comment_is_created_once_then_updated() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    // Someone else's comment with the same marker is not ours to update.
    let kargo = GitHub::new(&forge.url(), "kargo-token").unwrap();
    kargo
        .create_comment(&slug, 1, "<!-- gitops-gate:report v1 -->\nspoofed")
        .await
        .unwrap();
    forge.clear_requests();
    let first = upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        "<!-- gitops-gate:report v1 -->",
        "<!-- gitops-gate:report v1 -->\none",
    )
    .await
    .unwrap();
    let second = upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        "<!-- gitops-gate:report v1 -->",
        "<!-- gitops-gate:report v1 -->\ntwo",
    )
    .await
    .unwrap();
    assert_eq!(first.id, second.id);
    let requests: Vec<(String, String, serde_json::Value)> = forge
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path, r.body))
        .collect();
    assert_eq!(
        requests,
        vec![
            (
                "GET".into(),
                format!("/repos/{SLUG}/issues/1/comments"),
                serde_json::Value::Null
            ),
            (
                "POST".into(),
                format!("/repos/{SLUG}/issues/1/comments"),
                json!({"body": "<!-- gitops-gate:report v1 -->\none"})
            ),
            // Two comments now: one of one a page learns the count, then the last page.
            (
                "GET".into(),
                format!("/repos/{SLUG}/issues/1/comments"),
                serde_json::Value::Null
            ),
            (
                "GET".into(),
                format!("/repos/{SLUG}/issues/1/comments"),
                serde_json::Value::Null
            ),
            (
                "PATCH".into(),
                format!("/repos/{SLUG}/issues/comments/{}", first.id),
                json!({"body": "<!-- gitops-gate:report v1 -->\ntwo"})
            ),
        ]
    );
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 2);
    assert!(
        comments
            .iter()
            .any(|c| c.author == "kargo" && c.body.ends_with("spoofed")),
        "the other comment is untouched"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn check_runs_statuses_and_labels() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let head = git(clone.path(), &["rev-parse", "HEAD"]);
    let run = |conclusion| CheckRun {
        name: "addons-gate".into(),
        head_sha: head.clone(),
        conclusion,
        title: "t".into(),
        summary: "s".into(),
        external_id: "addons-gate-report:0123456789abcdef".into(),
        app: String::new(),
    };
    let first = client
        .upsert_check_run(&slug, &run(Conclusion::Failure))
        .await
        .unwrap();
    forge.clear_requests();
    let second = client
        .upsert_check_run(&slug, &run(Conclusion::Success))
        .await
        .unwrap();
    assert_eq!(
        first, second,
        "the same check on the same commit is updated, not duplicated"
    );
    let requests = forge.requests();
    assert_eq!(requests[0].method, "GET");
    assert_eq!(
        requests[0].path,
        format!("/repos/{SLUG}/commits/{head}/check-runs")
    );
    assert_eq!(requests[0].query, "check_name=addons-gate");
    assert_eq!(requests[1].method, "PATCH");
    assert_eq!(
        requests[1].path,
        format!("/repos/{SLUG}/check-runs/{first}")
    );
    assert_eq!(
        requests[1].body,
        json!({"name": "addons-gate", "head_sha": head, "status": "completed", "conclusion": "success", "output": {"title": "t", "summary": "s"}, "external_id": "addons-gate-report:0123456789abcdef"})
    );
    let runs = client.check_runs(&slug, &head).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].conclusion, Conclusion::Success);
    // Read back: who wrote it (the app's slug) and the publisher's reference.
    assert_eq!(runs[0].external_id, "addons-gate-report:0123456789abcdef");
    assert!(!runs[0].app.is_empty());

    let status = CommitStatus {
        context: "bosun".into(),
        state: StatusState::Pending,
        description: "reading addons-gate".into(),
        creator: String::new(),
    };
    client.set_status(&slug, &head, &status).await.unwrap();
    let read = client.statuses(&slug, &head).await.unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(
        (&read[0].context, read[0].state, &read[0].description),
        (&status.context, status.state, &status.description)
    );
    assert!(!read[0].creator.is_empty(), "the creator is read back");

    client
        .add_labels(&slug, 1, &["needs-human".to_string()])
        .await
        .unwrap();
    client.remove_label(&slug, 1, "needs-human").await.unwrap();
    client.remove_label(&slug, 1, "never-there").await.unwrap();
    assert!(
        client
            .pull_request(&slug, 1)
            .await
            .unwrap()
            .labels
            .is_empty()
    );
}

fn publish(
    forge: &ForgeDouble,
    clone: &std::path::Path,
    cache: &std::path::Path,
) -> std::process::Output {
    publish_to(&["--forge-url", &forge.url()], clone, cache)
}

/// `gate publish` on pull request #1 with these forge arguments.
fn publish_to(
    forge_args: &[&str],
    clone: &std::path::Path,
    cache: &std::path::Path,
) -> std::process::Output {
    publish_slug(SLUG, forge_args, clone, cache)
}

/// `gate publish` on pull request #1 of `slug` with these forge arguments.
fn publish_slug(
    slug: &str,
    forge_args: &[&str],
    clone: &std::path::Path,
    cache: &std::path::Path,
) -> std::process::Output {
    common::gate(cache)
        .args(["--quiet", "publish", "--repo-slug", slug, "--pr", "1"])
        .args(forge_args)
        .args(["--repo-url", common::SAMPLE_REPO_URL])
        .arg("--repo")
        .arg(clone)
        .arg("--inventory")
        .arg(common::sample_dir().join("inventory.yaml"))
        .arg("--charts")
        .arg(common::sample_dir().join("charts"))
        .env("GITHUB_TOKEN", "gate-token")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn gate_publish_blocks_a_breaking_bump_and_branch_protection_holds() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let cache = tempfile::tempdir().unwrap();
    let output = publish(&forge, clone.path(), cache.path());
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Publishing again updates the same comment.
    let again = publish(&forge, clone.path(), cache.path());
    assert_eq!(again.status.code(), Some(1));
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 1, "one report comment, updated in place");
    let parsed = gitops_loop::gate::report::parse(&comments[0].body).unwrap();
    assert_eq!(parsed.dropped.len(), 4);
    let pull = client.pull_request(&slug, 1).await.unwrap();
    assert_eq!(parsed.verdict.head, pull.head_sha);
    let runs = client.check_runs(&slug, &pull.head_sha).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].conclusion, Conclusion::Failure);
    assert!(
        runs[0]
            .title
            .starts_with("blocked: 4 dropped-served-version"),
        "{}",
        runs[0].title
    );
    let merge = reqwest::Client::new()
        .put(format!("{}/repos/{SLUG}/pulls/1/merge", forge.url()))
        .bearer_auth("kargo-token")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 405);
    assert!(
        merge
            .text()
            .await
            .unwrap()
            .contains("Required status check \\\"addons-gate\\\" is expected.")
    );
}

/// A sharded check (two shards' partials merged) published with `publish --result`: the
/// comment and check the unsharded publish gives; a verdict of another head is refused.
#[tokio::test(flavor = "multi_thread")]
async fn gate_publish_publishes_a_merged_sharded_verdict() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let check = |extra: &[&str]| {
        common::gate(cache.path())
            .args(["--quiet", "check", "--head", "kargo/bump"])
            .args(["--default-branch", "origin/main"])
            .args(["--repo-url", common::SAMPLE_REPO_URL])
            .arg("--repo")
            .arg(clone.path())
            .arg("--inventory")
            .arg(common::sample_dir().join("inventory.yaml"))
            .arg("--charts")
            .arg(common::sample_dir().join("charts"))
            .args(extra)
            .output()
            .unwrap()
    };
    let mut parts = Vec::new();
    for shard in ["1/2", "2/2"] {
        let part = out.path().join(format!("part-{}.json", &shard[..1]));
        let part_arg = part.to_str().unwrap().to_string();
        let output = check(&["--shard", shard, "--partial", &part_arg]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        parts.push(part);
    }
    let merged = out.path().join("merged.json");
    let output = common::gate(cache.path())
        .args(["--quiet", "merge"])
        .args(&parts)
        .arg("--repo")
        .arg(clone.path())
        .arg("--json")
        .arg(&merged)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let publish_result = |file: &std::path::Path| {
        common::gate(cache.path())
            .args(["--quiet", "publish", "--repo-slug", SLUG, "--pr", "1"])
            .args(["--forge-url", &forge.url()])
            .arg("--result")
            .arg(file)
            .env("GITHUB_TOKEN", "gate-token")
            .output()
            .unwrap()
    };
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    // A verdict of another commit: exit 2, nothing published.
    let mut stale: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    stale["verdict"]["head"] = json!(git(clone.path(), &["rev-parse", "origin/main"]));
    let stale_file = out.path().join("stale.json");
    std::fs::write(&stale_file, stale.to_string()).unwrap();
    let refused = publish_result(&stale_file);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(client.comments(&slug, 1).await.unwrap().is_empty());
    // A forged green over the merged verdict's blocking findings: exit 2, nothing published.
    let mut forged: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    forged["verdict"]["outcome"] = json!("green");
    let forged_file = out.path().join("forged.json");
    std::fs::write(&forged_file, forged.to_string()).unwrap();
    let refused = publish_result(&forged_file);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not a consistent verdict"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(client.comments(&slug, 1).await.unwrap().is_empty());
    // The merged verdict: published as the unsharded one would be.
    let published = publish_result(&merged);
    assert_eq!(
        published.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&published.stderr)
    );
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 1);
    let parsed = gitops_loop::gate::report::parse(&comments[0].body).unwrap();
    assert_eq!(parsed.dropped.len(), 4);
    let pull = client.pull_request(&slug, 1).await.unwrap();
    let runs = client.check_runs(&slug, &pull.head_sha).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0]
            .title
            .starts_with("blocked: 4 dropped-served-version"),
        "{}",
        runs[0].title
    );
    // The unsharded publish finds the same comment and leaves the same body.
    let body = comments[0].body.clone();
    let again = publish(&forge, clone.path(), cache.path());
    assert_eq!(again.status.code(), Some(1));
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 1);
    assert_eq!(
        comments[0].body, body,
        "the merged verdict's comment is the unsharded one's"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gate_publish_passes_a_patch_bump_and_the_merge_lands() {
    gitops_loop::forge::github::install_crypto_provider();
    let forge = ForgeDouble::start(None).await.unwrap();
    forge.add_user("gate-token", "addons-gate[bot]");
    forge.add_user("kargo-token", "kargo");
    let url = forge
        .create_repo(SLUG, &common::sample_dir().join("repo"))
        .unwrap();
    forge.protect(SLUG, "main", &["addons-gate"]);
    let clone = tempfile::tempdir().unwrap();
    git(clone.path(), &["clone", "--quiet", &url, "."]);
    git(clone.path(), &["checkout", "--quiet", "-b", "kargo/patch"]);
    let targets = clone.path().join("targets/addons.yaml");
    let text = std::fs::read_to_string(&targets)
        .unwrap()
        .replace("version: 1.19.2", "version: 1.19.3");
    std::fs::write(&targets, text).unwrap();
    git(
        clone.path(),
        &["commit", "--quiet", "-am", "bump cert-manager-lite"],
    );
    git(clone.path(), &["push", "--quiet", "origin", "kargo/patch"]);
    let http = reqwest::Client::new();
    http.post(format!("{}/repos/{SLUG}/pulls", forge.url()))
        .bearer_auth("kargo-token")
        .json(&json!({"title": "Promote cert-manager-lite", "head": "kargo/patch", "base": "main"}))
        .send()
        .await
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let output = publish(&forge, clone.path(), cache.path());
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let merge = http
        .put(format!("{}/repos/{SLUG}/pulls/1/merge", forge.url()))
        .bearer_auth("kargo-token")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 200);
    git(clone.path(), &["fetch", "--quiet", "origin"]);
    let merged = git(clone.path(), &["show", "origin/main:targets/addons.yaml"]);
    assert!(merged.contains("version: 1.19.3"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_rides_out_server_errors_and_rate_limits() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    // 500s/502s on a fifth of the requests, rate limits on a tenth of the rest: idempotent
    // requests are retried on both, a POST only on a rate limit (it was not processed). The
    // draws are keyed by `METHOD path`, so the ten reads below meet the same answers on every
    // run; without retries the first fault would fail a read.
    forge.set_faults(ground::forge::ForgeFaults {
        seed: 42,
        server_error: 200,
        rate_limit: 100,
    });
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    for _ in 0..10 {
        let pull = client.pull_request(&slug, 1).await.unwrap();
        assert_eq!(pull.number, 1);
    }
    assert!(forge.injected_faults() > 0);
    forge.set_faults(ground::forge::ForgeFaults::default());
    assert_eq!(client.comments(&slug, 1).await.unwrap().len(), 0);
}

/// The trait's clients on every face of the double (GitHub, Gitea, GitLab), for one token.
fn both(forge: &ForgeDouble, token: &str) -> Vec<(ForgeKind, std::sync::Arc<dyn Forge>)> {
    vec![
        (
            ForgeKind::Github,
            ForgeKind::Github.connect(&forge.url(), token).unwrap(),
        ),
        (
            ForgeKind::Gitea,
            ForgeKind::Gitea.connect(&forge.gitea_url(), token).unwrap(),
        ),
        (
            ForgeKind::Gitlab,
            ForgeKind::Gitlab
                .connect(&forge.gitlab_url(), token)
                .unwrap(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn the_trait_reads_and_writes_the_same_on_github_and_gitea() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let head = git(clone.path(), &["rev-parse", "HEAD"]);
    for (kind, client) in both(&forge, "gate-token") {
        let pull = client.pull_request(&slug, 1).await.unwrap();
        assert_eq!(pull.head_sha, head, "{kind:?}");
        assert_eq!(
            (
                pull.head_ref.as_str(),
                pull.base_ref.as_str(),
                pull.author.as_str()
            ),
            ("kargo/bump", "main", "kargo"),
            "{kind:?}"
        );
        assert_eq!(client.current_user().await.unwrap(), "addons-gate[bot]");
        // One marked comment, updated in place, on either face.
        let marker = format!("<!-- contract {kind:?} -->");
        let first = upsert_marked_comment(
            client.as_ref(),
            &slug,
            1,
            "addons-gate[bot]",
            &marker,
            &format!("{marker}\none"),
        )
        .await
        .unwrap();
        let second = upsert_marked_comment(
            client.as_ref(),
            &slug,
            1,
            "addons-gate[bot]",
            &marker,
            &format!("{marker}\ntwo"),
        )
        .await
        .unwrap();
        assert_eq!(first.id, second.id, "{kind:?}");
        assert_eq!(second.body, format!("{marker}\ntwo"), "{kind:?}");
        // Statuses: the newest per context stands, with its creator.
        let context = format!("bosun-{kind:?}");
        for state in [StatusState::Pending, StatusState::Success] {
            let status = CommitStatus {
                context: context.clone(),
                state,
                description: "reading addons-gate".into(),
                creator: String::new(),
            };
            client.set_status(&slug, &head, &status).await.unwrap();
        }
        let read = client.statuses(&slug, &head).await.unwrap();
        let ours: Vec<_> = read.iter().filter(|s| s.context == context).collect();
        assert_eq!(ours.len(), 1, "{kind:?}: {read:?}");
        assert_eq!(ours[0].state, StatusState::Success, "{kind:?}");
        assert_eq!(ours[0].creator, "addons-gate[bot]", "{kind:?}");
        // Labels, a name with a slash and a space included; removing one twice is no error.
        let labels = ["needs human".to_string(), "bosun/held".to_string()];
        client.add_labels(&slug, 1, &labels).await.unwrap();
        client.add_labels(&slug, 1, &labels[..1]).await.unwrap();
        let on = client.pull_request(&slug, 1).await.unwrap().labels;
        assert_eq!(on, labels, "{kind:?}");
        for label in &labels {
            client.remove_label(&slug, 1, label).await.unwrap();
            client.remove_label(&slug, 1, label).await.unwrap();
        }
        assert!(
            client
                .pull_request(&slug, 1)
                .await
                .unwrap()
                .labels
                .is_empty(),
            "{kind:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gitea_labels_are_created_once_then_added_by_id() {
    gitops_loop::forge::github::install_crypto_provider();
    // [G routers/api/v1/repo/issue_label.go]: a name the repository lacks is dropped without a
    // word, so the client creates it first and adds by id.
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let client = ForgeKind::Gitea
        .connect(&forge.gitea_url(), "gate-token")
        .unwrap();
    forge.clear_requests();
    client
        .add_labels(&slug, 1, &["bosun/held".to_string()])
        .await
        .unwrap();
    client
        .add_labels(&slug, 1, &["bosun/held".to_string()])
        .await
        .unwrap();
    let requests: Vec<(String, String, serde_json::Value)> = forge
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path, r.body))
        .collect();
    let created: Vec<_> = requests
        .iter()
        .filter(|(m, p, _)| m == "POST" && p == &format!("/api/v1/repos/{SLUG}/labels"))
        .collect();
    assert_eq!(created.len(), 1, "{requests:#?}");
    assert_eq!(created[0].2["name"], "bosun/held");
    let added: Vec<_> = requests
        .iter()
        .filter(|(m, p, _)| m == "POST" && p == &format!("/api/v1/repos/{SLUG}/issues/1/labels"))
        .collect();
    assert_eq!(added.len(), 2);
    assert!(
        added.iter().all(|(_, _, body)| body["labels"][0].is_u64()),
        "{added:?}"
    );
    // A name sent as GitHub sends it is silently dropped by Gitea: the reason for ids.
    let raw = reqwest::Client::new()
        .post(format!(
            "{}/repos/{SLUG}/issues/1/labels",
            forge.gitea_url()
        ))
        .header("Authorization", "token gate-token")
        .json(&json!({"labels": ["never-created"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(
        client.pull_request(&slug, 1).await.unwrap().labels,
        ["bosun/held"]
    );
    // Ids and names together are refused.
    let mixed = reqwest::Client::new()
        .post(format!(
            "{}/repos/{SLUG}/issues/1/labels",
            forge.gitea_url()
        ))
        .header("Authorization", "token gate-token")
        .json(&json!({"labels": [1, "x"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(mixed.status(), 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn gitea_pages_are_followed_past_the_servers_cap() {
    gitops_loop::forge::github::install_crypto_provider();
    // [G services/convert/utils.go ToCorrectPageSize]: at most 50 a page whatever is asked;
    // a client that stops at the first page shorter than it asked would lose statuses.
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let head = git(clone.path(), &["rev-parse", "HEAD"]);
    let client = ForgeKind::Gitea
        .connect(&forge.gitea_url(), "gate-token")
        .unwrap();
    for i in 0..120 {
        let status = CommitStatus {
            context: format!("ci/{i:03}"),
            state: StatusState::Success,
            description: String::new(),
            creator: String::new(),
        };
        client.set_status(&slug, &head, &status).await.unwrap();
    }
    forge.clear_requests();
    let read = client.statuses(&slug, &head).await.unwrap();
    assert_eq!(read.len(), 120);
    let pages = forge
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(&format!("/statuses/{head}")))
        .count();
    assert_eq!(pages, 3, "50 + 50 + 20");
}

#[tokio::test(flavor = "multi_thread")]
async fn gitea_scopes_and_check_runs_fail_with_their_cause() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    // A token made without read:user cannot say who it is (the kind path's first Bosun bug).
    forge.add_scoped_user("narrow", "bosun", &["write:repository", "write:issue"]);
    let narrow = ForgeKind::Gitea
        .connect(&forge.gitea_url(), "narrow")
        .unwrap();
    let err = narrow.current_user().await.unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    assert!(err.to_string().contains("[read:user]"), "{err}");
    // The repository and issue scopes are enough for the rest.
    narrow.pull_request(&slug, 1).await.unwrap();
    narrow.comments(&slug, 1).await.unwrap();
    forge.add_scoped_user(
        "wide",
        "bosun",
        &["read:user", "write:repository", "write:issue"],
    );
    let wide = ForgeKind::Gitea
        .connect(&forge.gitea_url(), "wide")
        .unwrap();
    assert_eq!(wide.current_user().await.unwrap(), "bosun");
    // A wrong token is Gitea's 401.
    let bad = ForgeKind::Gitea
        .connect(&forge.gitea_url(), "wrong")
        .unwrap();
    let err = bad.pull_request(&slug, 1).await.unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    // There are no check runs on Gitea: asking for one says so, reading finds none.
    let run = CheckRun {
        name: "addons-gate".into(),
        head_sha: "0".repeat(40),
        conclusion: Conclusion::Success,
        title: String::new(),
        summary: String::new(),
        external_id: String::new(),
        app: String::new(),
    };
    let err = wide.upsert_check_run(&slug, &run).await.unwrap_err();
    assert!(err.to_string().contains("commit status"), "{err}");
    assert!(
        wide.check_runs(&slug, &run.head_sha)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gate_publish_on_gitea_sets_the_addons_gate_status_and_the_merge_waits_for_it() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let cache = tempfile::tempdir().unwrap();
    let url = forge.gitea_url();
    let output = publish_to(
        &["--forge", "gitea", "--forge-url", &url],
        clone.path(),
        cache.path(),
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let client = ForgeKind::Gitea.connect(&url, "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 1, "one report comment");
    let pull = client.pull_request(&slug, 1).await.unwrap();
    let statuses = client.statuses(&slug, &pull.head_sha).await.unwrap();
    let gate: Vec<_> = statuses
        .iter()
        .filter(|s| s.context == "addons-gate")
        .collect();
    assert_eq!(gate.len(), 1, "{statuses:?}");
    assert_eq!(gate[0].state, StatusState::Failure);
    // Branch protection (an administrator's merge, not the Forge trait): Gitea's 405.
    let merge = reqwest::Client::new()
        .post(format!("{url}/repos/{SLUG}/pulls/1/merge"))
        .header("Authorization", "token kargo-token")
        .json(&json!({"Do": "merge"}))
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 405);
    assert!(
        merge
            .text()
            .await
            .unwrap()
            .contains("Not all required status checks successful")
    );
    // Asking for a check run on Gitea is refused before anything is published.
    let refused = publish_to(
        &[
            "--forge",
            "gitea",
            "--forge-url",
            &url,
            "--check-mode",
            "check-run",
        ],
        clone.path(),
        cache.path(),
    );
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("no check runs"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forge_that_ignores_paging_cannot_keep_the_client_reading() {
    gitops_loop::forge::github::install_crypto_provider();
    // The attack: a server that answers every page with the same full page and announces a
    // total it never reaches. The client stops at its page cap with an error, never loops.
    gitops_loop::forge::github::install_crypto_provider();
    let page: Vec<serde_json::Value> = (0..50)
        .map(|i| json!({"id": i, "context": format!("c{i}"), "status": "success"}))
        .collect();
    let (url, requests) = common::same_answer(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Total-Count: 100000000\r\nConnection: close\r\n\r\n",
        std::sync::Arc::new(serde_json::to_vec(&page).unwrap()),
    )
    .await;
    let client = ForgeKind::Gitea.connect(&url, "token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let err = client.statuses(&slug, "abc").await.unwrap_err().to_string();
    assert!(err.contains("more than 200 pages"), "{err}");
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_hits_one_client_and_method_for_so_many_requests() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    forge.outage("addons-gate[bot]", Some("post"), 1);
    let http = reqwest::Client::new();
    let comment = |token: &'static str| {
        http.post(format!("{}/repos/{SLUG}/issues/1/comments", forge.url()))
            .bearer_auth(token)
            .json(&json!({"body": "x"}))
            .send()
    };
    let read = http
        .get(format!("{}/repos/{SLUG}/pulls/1", forge.url()))
        .bearer_auth("gate-token")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200, "a GET is not the outage's method");
    assert_eq!(comment("kargo-token").await.unwrap().status(), 201);
    assert_eq!(comment("gate-token").await.unwrap().status(), 502);
    assert_eq!(comment("gate-token").await.unwrap().status(), 201);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_marked_comment_survives_a_failed_write_and_stays_one() {
    gitops_loop::forge::github::install_crypto_provider();
    // Found by `ground chaos` (structural, seed 3): Bosun's repair comment met an injected 500
    // after the push, and the person never read what the repair dropped. The upsert lists the
    // comments again and writes again.
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    forge.outage("addons-gate[bot]", Some("POST"), 1);
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let marker = "<!-- test-marker -->";
    let body = format!("{marker}\nhello");
    let written = gitops_loop::forge::upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        marker,
        &body,
    )
    .await
    .unwrap();
    assert_eq!(written.body, body);
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(
        comments
            .iter()
            .filter(|c| c.body.starts_with(marker))
            .count(),
        1
    );
    // Three failures in a row are an error, said as the forge said it.
    forge.outage("addons-gate[bot]", None, 100);
    let failed = gitops_loop::forge::upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        marker,
        "other",
    )
    .await;
    assert!(failed.is_err());
}

/// A pull request whose chart fails with 70,000 characters of its own text (`fail`): the gate
/// still publishes a report GitHub accepts (the double refuses a comment over 65,536
/// characters, as GitHub does) and a red check; the chart's text is clipped, never whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_chart_failing_with_megabytes_of_text_still_gets_a_report_and_a_red_check() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("0.10.4").await;
    let template = clone
        .path()
        .join("local-charts/ingress-lite/templates/boom.yaml");
    std::fs::write(
        &template,
        "{{- fail (printf \"%s%s\" \"boom \" (repeat 70000 \"<!-- x\")) }}\n",
    )
    .unwrap();
    git(clone.path(), &["add", "-A"]);
    git(
        clone.path(),
        &["commit", "--quiet", "-m", "a chart that fails loudly"],
    );
    git(clone.path(), &["push", "--quiet", "origin", "kargo/bump"]);
    let cache = tempfile::tempdir().unwrap();
    let output = publish(&forge, clone.path(), cache.path());
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let client = GitHub::new(&forge.url(), "gate-token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 1, "the report is published");
    let body = &comments[0].body;
    assert!(body.chars().count() <= gitops_loop::gate::report::COMMENT_LIMIT);
    assert!(body.contains("boom"), "the chart's error is quoted");
    // Only the report's own markers open a comment: the chart's `<!--` is escaped.
    let parsed = gitops_loop::gate::report::parse(body).unwrap();
    assert_eq!(
        parsed.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Undecided
    );
    assert!(
        parsed
            .verdict
            .errors
            .iter()
            .all(|e| e.chars().count() <= 2_001)
    );
    let pull = client.pull_request(&slug, 1).await.unwrap();
    let runs = client.check_runs(&slug, &pull.head_sha).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].conclusion, Conclusion::Failure);
}

/// Bounded comment reads on both faces: a marked comment under a flood of large comments is
/// found, and the walk reads no more than the budget (plus a page): newest first on GitHub
/// (its `Link` header's `last` and `prev`), forward through the timeline on Gitea.
#[tokio::test(flavor = "multi_thread")]
async fn comment_walks_find_the_marker_and_stop_at_the_byte_budget() {
    gitops_loop::forge::github::install_crypto_provider();
    use gitops_loop::forge::{COMMENT_READ_BUDGET, find_comments};
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let large = "x".repeat(20_000);
    forge.add_comment(SLUG, 1, "addons-gate[bot]", "<!-- old -->\nthe oldest");
    for _ in 0..150 {
        forge.add_comment(SLUG, 1, "kargo", &large);
    }
    forge.add_comment(SLUG, 1, "addons-gate[bot]", "<!-- mark -->\nfirst");
    forge.add_comment(SLUG, 1, "kargo", "<!-- mark -->\nnot the gate's");
    for _ in 0..3 {
        forge.add_comment(SLUG, 1, "kargo", &large);
    }
    let flood = 153 * large.len();
    assert!(flood > COMMENT_READ_BUDGET);
    for (kind, client) in both(&forge, "gate-token") {
        let mark = |c: &gitops_loop::forge::Comment| {
            c.author == "addons-gate[bot]" && c.body.starts_with("<!-- mark -->")
        };
        let before = forge.comment_bytes_served();
        let found = find_comments(client.as_ref(), &slug, 1, COMMENT_READ_BUDGET, 1, mark)
            .await
            .unwrap();
        let served = forge.comment_bytes_served() - before;
        // At most the budget and one page of 50 large comments.
        assert!(
            served <= COMMENT_READ_BUDGET + 50 * large.len(),
            "{kind:?}: {served}"
        );
        if kind == ForgeKind::Github {
            assert_eq!(found.found.len(), 1, "{kind:?}");
            assert!(found.found[0].body.ends_with("first"), "{kind:?}");
            // One comment (which says where the last page is) and the last page.
            assert!(served < 10 * large.len(), "newest first: {served}");
        } else if kind == ForgeKind::Gitlab {
            // GitLab lists notes newest first itself: the first page holds the marker.
            assert_eq!(found.found.len(), 1, "{kind:?}");
            assert!(found.found[0].body.ends_with("first"), "{kind:?}");
            assert!(served <= 50 * large.len() + 1000, "one page: {served}");
        } else {
            // Forward on Gitea: the budget ends the walk before the marker, and says so.
            assert!(found.found.is_empty() && !found.complete, "{found:?}");
        }
        // The oldest is past the budget: the walk says it could not see everything.
        let before = forge.comment_bytes_served();
        let old = find_comments(client.as_ref(), &slug, 1, COMMENT_READ_BUDGET, 1, |c| {
            c.body.starts_with("<!-- old -->")
        })
        .await
        .unwrap();
        let served = forge.comment_bytes_served() - before;
        assert!(
            served <= COMMENT_READ_BUDGET + 50 * large.len(),
            "{kind:?}: {served}"
        );
        if kind != ForgeKind::Gitea {
            assert!(!old.complete && old.found.is_empty(), "{kind:?}: {old:?}");
        } else {
            // Forward on Gitea: the oldest comes first.
            assert_eq!(old.found.len(), 1, "{kind:?}");
        }
        // With room, every comment is seen.
        let all = find_comments(client.as_ref(), &slug, 1, usize::MAX, usize::MAX, |_| true)
            .await
            .unwrap();
        assert!(all.complete, "{kind:?}");
        assert_eq!(all.found.len(), 156, "{kind:?}");
        assert!(
            all.found[0].body.len() == large.len() && all.found[155].body.ends_with("the oldest")
        );
    }
}

/// The GitLab client over the double's `/api/v4`.
fn gitlab(forge: &ForgeDouble, token: &str) -> gitops_loop::forge::gitlab::GitLab {
    gitops_loop::forge::gitlab::GitLab::new(&forge.gitlab_url(), token).unwrap()
}

/// The project's path, URL-encoded, as GitLab names a project in a path.
const PROJECT: &str = "platform%2Fgitops";

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_names_the_project_by_its_encoded_path_and_sends_the_token_as_gitlab_takes_it() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let client = gitlab(&forge, "gate-token");
    forge.clear_requests();
    let pull = client.pull_request(&slug, 1).await.unwrap();
    assert_eq!(pull.head_sha, git(clone.path(), &["rev-parse", "HEAD"]));
    assert_eq!(
        pull.base_sha,
        git(clone.path(), &["rev-parse", "origin/main"])
    );
    assert_eq!((pull.state.as_str(), pull.merged), ("open", false));
    assert_eq!(pull.head_repo, SLUG, "a branch of the project itself");
    let requests = forge.requests();
    assert_eq!(
        requests[0].path,
        format!("/api/v4/projects/{PROJECT}/merge_requests/1")
    );
    // The access token went as PRIVATE-TOKEN (the double recorded who sent it).
    assert_eq!(requests[0].user.as_deref(), Some("addons-gate[bot]"));
    // An OAuth token goes as `Authorization: Bearer`.
    let oauth = gitlab(&forge, "oauth2:gate-token");
    assert_eq!(oauth.current_user().await.unwrap(), "addons-gate[bot]");
    let raw = reqwest::Client::new()
        .get(format!("{}/user", forge.gitlab_url()))
        .header("Authorization", "Bearer gate-token")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    // The merge request's changed files, from `/diffs`.
    let diffs = client.diffs(&slug, 1, 1 << 20).await.unwrap();
    assert!(diffs.complete);
    assert_eq!(diffs.files.len(), 1, "{diffs:?}");
    assert_eq!(diffs.files[0].new_path, "targets/addons.yaml");
    assert!(
        diffs.files[0].diff.contains("+    version: 2.10.0")
            || diffs.files[0].diff.contains("version: 2.10.0"),
        "{}",
        diffs.files[0].diff
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_scopes_fail_with_their_cause() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    // read_api reads everything and writes nothing: GitLab's 403 insufficient_scope.
    forge.add_scoped_user("reader", "bosun", &["read_api"]);
    let reader = gitlab(&forge, "reader");
    assert_eq!(reader.current_user().await.unwrap(), "bosun");
    reader.pull_request(&slug, 1).await.unwrap();
    reader.comments(&slug, 1).await.unwrap();
    let err = reader.create_comment(&slug, 1, "hello").await.unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    assert!(err.to_string().contains("insufficient_scope"), "{err}");
    // read_user says who it is and nothing more.
    forge.add_scoped_user("who", "bosun", &["read_user"]);
    let who = gitlab(&forge, "who");
    assert_eq!(who.current_user().await.unwrap(), "bosun");
    assert_eq!(
        who.pull_request(&slug, 1).await.unwrap_err().status(),
        Some(403)
    );
    // api does everything.
    forge.add_scoped_user("full", "bosun", &["api"]);
    gitlab(&forge, "full")
        .create_comment(&slug, 1, "hello")
        .await
        .unwrap();
    // A wrong token is GitLab's 401.
    let err = gitlab(&forge, "wrong")
        .pull_request(&slug, 1)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(err.to_string().contains("401 Unauthorized"), "{err}");
    // No check runs on GitLab: asking says so, reading finds none.
    let run = CheckRun {
        name: "addons-gate".into(),
        head_sha: "0".repeat(40),
        conclusion: Conclusion::Success,
        title: String::new(),
        summary: String::new(),
        external_id: String::new(),
        app: String::new(),
    };
    let full = gitlab(&forge, "full");
    let err = full.upsert_check_run(&slug, &run).await.unwrap_err();
    assert!(err.to_string().contains("commit status"), "{err}");
    assert!(
        full.check_runs(&slug, &run.head_sha)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_pages_follow_x_next_page() {
    gitops_loop::forge::github::install_crypto_provider();
    // GitLab pages with `page`/`per_page` (at most 100) and names the next page in
    // `x-next-page`, empty on the last.
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let head = git(clone.path(), &["rev-parse", "HEAD"]);
    let client = gitlab(&forge, "gate-token");
    for i in 0..230 {
        let status = CommitStatus {
            context: format!("ci/{i:03}"),
            state: StatusState::Success,
            description: String::new(),
            creator: String::new(),
        };
        client.set_status(&slug, &head, &status).await.unwrap();
    }
    forge.clear_requests();
    let read = client.statuses(&slug, &head).await.unwrap();
    assert_eq!(read.len(), 230);
    let pages: Vec<String> = forge
        .requests()
        .into_iter()
        .filter(|r| {
            r.path
                .ends_with(&format!("/repository/commits/{head}/statuses"))
        })
        .map(|r| r.query)
        .collect();
    assert_eq!(
        pages,
        [
            "per_page=100&page=1",
            "per_page=100&page=2",
            "per_page=100&page=3"
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gitlab_that_names_the_same_next_page_cannot_keep_the_client_reading() {
    gitops_loop::forge::github::install_crypto_provider();
    // The attack: every answer says `x-next-page: 2`. The client follows a next page only
    // when it is later than the one it read.
    gitops_loop::forge::github::install_crypto_provider();
    let page: Vec<serde_json::Value> = (0..100)
        .map(|i| json!({"id": i, "name": format!("c{i}"), "status": "success"}))
        .collect();
    let (url, requests) = common::same_answer(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Next-Page: 2\r\nConnection: close\r\n\r\n",
        std::sync::Arc::new(serde_json::to_vec(&page).unwrap()),
    )
    .await;
    let client = ForgeKind::Gitlab.connect(&url, "token").unwrap();
    let slug: RepoSlug = SLUG.parse().unwrap();
    let read = client.statuses(&slug, &"a".repeat(40)).await.unwrap();
    assert_eq!(read.len(), 100);
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_labels_are_created_once_and_system_notes_are_no_comments() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let client = gitlab(&forge, "gate-token");
    forge.clear_requests();
    let held = ["bosun/held".to_string()];
    client.add_labels(&slug, 1, &held).await.unwrap();
    client.add_labels(&slug, 1, &held).await.unwrap();
    let requests: Vec<(String, String, serde_json::Value)> = forge
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path, r.body))
        .collect();
    let created: Vec<_> = requests
        .iter()
        .filter(|(m, p, _)| m == "POST" && p == &format!("/api/v4/projects/{PROJECT}/labels"))
        .collect();
    assert_eq!(created.len(), 1, "{requests:#?}");
    assert_eq!(
        created[0].2,
        json!({"name": "bosun/held", "color": "#ededed"})
    );
    let updates: Vec<_> = requests
        .iter()
        .filter(|(m, p, _)| {
            m == "PUT" && p == &format!("/api/v4/projects/{PROJECT}/merge_requests/1")
        })
        .collect();
    assert_eq!(updates.len(), 2);
    assert_eq!(updates[0].2, json!({"add_labels": "bosun/held"}));
    assert_eq!(forge.labels(SLUG, 1), ["bosun/held"]);
    // GitLab wrote a system note for the label; it is no comment of anyone's.
    let raw: Vec<serde_json::Value> = reqwest::Client::new()
        .get(format!(
            "{}/projects/{PROJECT}/merge_requests/1/notes",
            forge.gitlab_url()
        ))
        .header("PRIVATE-TOKEN", "gate-token")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(raw.iter().any(|n| n["system"] == true), "{raw:?}");
    assert!(client.comments(&slug, 1).await.unwrap().is_empty());
    // A title with a comma would split `add_labels`: refused before any request.
    forge.clear_requests();
    let err = client
        .add_labels(&slug, 1, &["a,b".to_string()])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("without commas"), "{err}");
    assert!(forge.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_statuses_move_in_place_and_a_repeated_pending_is_no_error() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let head = git(clone.path(), &["rev-parse", "HEAD"]);
    let client = gitlab(&forge, "gate-token");
    let status = |state| CommitStatus {
        context: "addons-gate".into(),
        state,
        description: "x".repeat(300),
        creator: String::new(),
    };
    forge.clear_requests();
    client
        .set_status(&slug, &head, &status(StatusState::Pending))
        .await
        .unwrap();
    // GitLab refuses pending -> pending (400); the client takes it as done.
    client
        .set_status(&slug, &head, &status(StatusState::Pending))
        .await
        .unwrap();
    let requests = forge.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].status, 400,
        "the double refuses it as GitLab does"
    );
    assert_eq!(requests[0].body["name"], "addons-gate");
    assert_eq!(requests[0].body["state"], "pending");
    assert_eq!(requests[0].body["description"].as_str().unwrap().len(), 255);
    client
        .set_status(&slug, &head, &status(StatusState::Failure))
        .await
        .unwrap();
    let read = client.statuses(&slug, &head).await.unwrap();
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0].state, StatusState::Failure);
    assert_eq!(read[0].creator, "addons-gate[bot]");
    assert_eq!(
        forge.statuses(SLUG, &head),
        [(
            "addons-gate".to_string(),
            "failed".to_string(),
            "x".repeat(255)
        )]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_notes_hold_a_million_characters_and_the_client_sends_no_quick_action() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    let slug: RepoSlug = SLUG.parse().unwrap();
    let note = |body: String| {
        reqwest::Client::new()
            .post(format!(
                "{}/projects/{PROJECT}/merge_requests/1/notes",
                forge.gitlab_url()
            ))
            .header("PRIVATE-TOKEN", "gate-token")
            .json(&json!({ "body": body }))
            .send()
    };
    let limit = gitops_loop::forge::gitlab::NOTE_LIMIT;
    assert_eq!(note("é".repeat(limit)).await.unwrap().status(), 201);
    let refused = note("x".repeat(limit + 1)).await.unwrap();
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("is too long"));
    // The report is clipped below GitLab's limit.
    const { assert!(gitops_loop::gate::report::COMMENT_LIMIT <= gitops_loop::forge::gitlab::NOTE_LIMIT) };
    // A line GitLab would run as a quick action is never sent.
    let client = gitlab(&forge, "gate-token");
    forge.clear_requests();
    let err = client
        .create_comment(&slug, 1, "<!-- marker -->\nreport\n/merge")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("quick action"), "{err}");
    assert!(forge.requests().is_empty());
    // Someone else's note with the marker is not the client's to edit: a new one is written.
    let kargo = gitlab(&forge, "kargo-token");
    kargo
        .create_comment(&slug, 1, "<!-- gitops-gate:report v1 -->\nspoofed")
        .await
        .unwrap();
    let ours = upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        "<!-- gitops-gate:report v1 -->",
        "<!-- gitops-gate:report v1 -->\nours",
    )
    .await
    .unwrap();
    assert!(ours.body.ends_with("ours"));
    let bodies = forge.comment_bodies(SLUG, 1, "<!-- gitops-gate:report v1 -->");
    assert_eq!(bodies.len(), 2, "{bodies:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn gitlab_rate_limits_and_server_errors_are_ridden_out() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, _clone) = forge_with_pull("2.10.0").await;
    forge.set_faults(ground::forge::ForgeFaults {
        seed: 7,
        server_error: 200,
        rate_limit: 200,
    });
    let client = gitlab(&forge, "gate-token");
    let slug: RepoSlug = SLUG.parse().unwrap();
    for _ in 0..10 {
        assert_eq!(client.pull_request(&slug, 1).await.unwrap().number, 1);
    }
    assert!(forge.injected_faults() > 0);
    let limited = forge
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/api/v4/"))
        .count();
    assert!(limited >= 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn gate_publish_on_gitlab_writes_the_note_and_the_status_and_the_merge_waits_for_it() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = forge_with_pull("2.10.0").await;
    let cache = tempfile::tempdir().unwrap();
    let url = forge.gitlab_url();
    for _ in 0..2 {
        let output = publish_to(
            &["--forge", "gitlab", "--forge-url", &url],
            clone.path(),
            cache.path(),
        );
        assert_eq!(
            output.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let client = gitlab(&forge, "gate-token");
    let slug: RepoSlug = SLUG.parse().unwrap();
    let comments = client.comments(&slug, 1).await.unwrap();
    assert_eq!(comments.len(), 1, "one report note, updated in place");
    let parsed = gitops_loop::gate::report::parse(&comments[0].body).unwrap();
    assert_eq!(parsed.dropped.len(), 4);
    let pull = client.pull_request(&slug, 1).await.unwrap();
    let statuses = client.statuses(&slug, &pull.head_sha).await.unwrap();
    let gate: Vec<_> = statuses
        .iter()
        .filter(|s| s.context == "addons-gate")
        .collect();
    assert_eq!(gate.len(), 1, "{statuses:?}");
    assert_eq!(gate[0].state, StatusState::Failure);
    assert!(
        gate[0].description.ends_with(&format!(
            " · report {}",
            gitops_loop::gate::report::digest(&comments[0].body)
        )),
        "{}",
        gate[0].description
    );
    // "Pipelines must succeed" (administration, not the Forge trait): GitLab's 405.
    let merge = reqwest::Client::new()
        .put(format!("{url}/projects/{PROJECT}/merge_requests/1/merge"))
        .header("PRIVATE-TOKEN", "kargo-token")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 405);
    // A check run is refused on GitLab before anything is published.
    let refused = publish_to(
        &[
            "--forge",
            "gitlab",
            "--forge-url",
            &url,
            "--check-mode",
            "check-run",
        ],
        clone.path(),
        cache.path(),
    );
    assert_eq!(refused.status.code(), Some(2));
}

/// A project in a subgroup, as GitLab holds one.
const SUBGROUP_SLUG: &str = "platform/team/gitops";
/// Its path as GitLab's API takes it: one segment, every `/` encoded.
const SUBGROUP_PROJECT: &str = "platform%2Fteam%2Fgitops";

/// The forge with `SUBGROUP_SLUG` (the sample repository), a bump branch and merge request !1
/// opened through GitLab's API.
async fn gitlab_with_subgroup_merge_request() -> (ForgeDouble, tempfile::TempDir) {
    let forge = ForgeDouble::start(None).await.unwrap();
    forge.add_user("gate-token", "addons-gate[bot]");
    forge.add_user("kargo-token", "kargo");
    let url = forge
        .create_repo(SUBGROUP_SLUG, &common::sample_dir().join("repo"))
        .unwrap();
    forge.protect(SUBGROUP_SLUG, "main", &["addons-gate"]);
    let clone = tempfile::tempdir().unwrap();
    git(clone.path(), &["clone", "--quiet", &url, "."]);
    git(clone.path(), &["checkout", "--quiet", "-b", "kargo/bump"]);
    let targets = clone.path().join("targets/addons.yaml");
    let text = std::fs::read_to_string(&targets)
        .unwrap()
        .replace("version: 0.10.3", "version: 2.10.0");
    std::fs::write(&targets, text).unwrap();
    git(
        clone.path(),
        &["commit", "--quiet", "-am", "bump external-secrets"],
    );
    git(clone.path(), &["push", "--quiet", "origin", "kargo/bump"]);
    let response = reqwest::Client::new()
        .post(format!(
            "{}/projects/{SUBGROUP_PROJECT}/merge_requests",
            forge.gitlab_url()
        ))
        .header("PRIVATE-TOKEN", "kargo-token")
        .json(&json!({"title": "Promote external-secrets", "source_branch": "kargo/bump", "target_branch": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    (forge, clone)
}

/// Subgroups: a project in a subgroup is named by its whole path, encoded as one segment, in
/// every call the trait makes (merge requests, notes, statuses, labels, diffs), and the GitLab
/// face serves it the way GitLab does: the path decoded once, found ignoring case, or the
/// numeric id; the path with its slashes unencoded is another route (404), a bare project
/// name or a path that climbs out names nothing (404).
#[tokio::test(flavor = "multi_thread")]
async fn gitlab_names_a_subgroup_project_by_its_whole_encoded_path_everywhere() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = gitlab_with_subgroup_merge_request().await;
    let slug = RepoSlug::for_forge(ForgeKind::Gitlab, SUBGROUP_SLUG).unwrap();
    assert_eq!(
        (slug.owner.as_str(), slug.name.as_str()),
        ("platform/team", "gitops")
    );
    let client = gitlab(&forge, "gate-token");
    forge.clear_requests();
    let pull = client.pull_request(&slug, 1).await.unwrap();
    assert_eq!(pull.head_sha, git(clone.path(), &["rev-parse", "HEAD"]));
    assert_eq!(
        pull.head_repo, SUBGROUP_SLUG,
        "a branch of the project itself"
    );
    let note = upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        "<!-- m -->",
        "<!-- m -->\none",
    )
    .await
    .unwrap();
    let again = upsert_marked_comment(
        &client,
        &slug,
        1,
        "addons-gate[bot]",
        "<!-- m -->",
        "<!-- m -->\ntwo",
    )
    .await
    .unwrap();
    assert_eq!(note.id, again.id, "the note is updated in place");
    assert_eq!(client.comments(&slug, 1).await.unwrap().len(), 1);
    let status = CommitStatus {
        context: "addons-gate".into(),
        state: StatusState::Success,
        description: "green".into(),
        creator: String::new(),
    };
    client
        .set_status(&slug, &pull.head_sha, &status)
        .await
        .unwrap();
    let statuses = client.statuses(&slug, &pull.head_sha).await.unwrap();
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].state, StatusState::Success);
    client
        .add_labels(&slug, 1, &["bosun/held".to_string()])
        .await
        .unwrap();
    assert_eq!(forge.labels(SUBGROUP_SLUG, 1), ["bosun/held"]);
    client.remove_label(&slug, 1, "bosun/held").await.unwrap();
    assert!(forge.labels(SUBGROUP_SLUG, 1).is_empty());
    let diffs = client.diffs(&slug, 1, 1 << 20).await.unwrap();
    assert_eq!(diffs.files.len(), 1);
    let requests = forge.requests();
    assert!(requests.len() > 10, "{requests:#?}");
    for request in &requests {
        assert!(
            request
                .path
                .starts_with(&format!("/api/v4/projects/{SUBGROUP_PROJECT}/")),
            "{} {}",
            request.method,
            request.path
        );
        assert_eq!(
            request.status / 100,
            2,
            "{} {}",
            request.method,
            request.path
        );
    }
    // The face, as GitLab serves `:id`.
    let get = |path: String| {
        let url = format!("{}{path}", forge.gitlab_url());
        async move {
            let response = reqwest::Client::new()
                .get(url)
                .header("PRIVATE-TOKEN", "gate-token")
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, project) = get(format!("/projects/{SUBGROUP_PROJECT}")).await;
    assert_eq!(status, 200);
    assert_eq!(project["path_with_namespace"], SUBGROUP_SLUG);
    assert_eq!(project["namespace"]["full_path"], "platform/team");
    let id = project["id"].as_u64().unwrap();
    for found in [
        format!("/projects/{id}/merge_requests/1"),
        "/projects/Platform%2FTeam%2FGitOps/merge_requests/1".to_string(),
        // Any byte may come percent-encoded (go-gitlab, Kargo's client, writes `.` as `%2E`),
        // in either case of hex: decoded once all the same.
        "/projects/platform%2fteam%2fgit%6Fps/merge_requests/1".to_string(),
    ] {
        let (status, mr) = get(found.clone()).await;
        assert_eq!((status, mr["iid"].clone()), (200, json!(1)), "{found}");
    }
    // Unencoded slashes: no route takes them, GitLab's catch-all 404.
    let (status, body) = get(format!("/projects/{SUBGROUP_SLUG}/merge_requests/1")).await;
    assert_eq!((status, body), (404, json!({"error": "404 Not Found"})));
    for missing in [
        "/projects/gitops/merge_requests/1",
        "/projects/team%2Fgitops/merge_requests/1",
        "/projects/platform%2Fteam%2F..%2Fteam%2Fgitops/merge_requests/1",
        "/projects/platform%2Fteam%2F%252e%252e%2Fgitops/merge_requests/1",
        "/projects/platform%252Fteam%252Fgitops/merge_requests/1",
    ] {
        let (status, body) = get(missing.to_string()).await;
        assert_eq!(
            (status, body),
            (404, json!({"message": "404 Project Not Found"})),
            "{missing}"
        );
    }
}

/// `gate publish --forge gitlab --repo-slug group/sub/project`: the note and the status on
/// the subgroup's project, and "Pipelines must succeed" holds its merge. A hostile or wrong
/// `--repo-slug` is one line on stderr and exit 2, before anything reaches the forge.
#[tokio::test(flavor = "multi_thread")]
async fn gate_publish_on_gitlab_names_a_subgroup_project_and_refuses_a_hostile_path() {
    gitops_loop::forge::github::install_crypto_provider();
    let (forge, clone) = gitlab_with_subgroup_merge_request().await;
    let cache = tempfile::tempdir().unwrap();
    let url = forge.gitlab_url();
    let gitlab_args = ["--forge", "gitlab", "--forge-url", url.as_str()];
    let output = publish_slug(SUBGROUP_SLUG, &gitlab_args, clone.path(), cache.path());
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let client = gitlab(&forge, "gate-token");
    let slug = RepoSlug::for_forge(ForgeKind::Gitlab, SUBGROUP_SLUG).unwrap();
    let notes = client.comments(&slug, 1).await.unwrap();
    assert_eq!(notes.len(), 1);
    let pull = client.pull_request(&slug, 1).await.unwrap();
    let gate: Vec<_> = client
        .statuses(&slug, &pull.head_sha)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.context == "addons-gate")
        .collect();
    assert_eq!(gate.len(), 1);
    assert_eq!(gate[0].state, StatusState::Failure);
    let merge = reqwest::Client::new()
        .put(format!(
            "{url}/projects/{SUBGROUP_PROJECT}/merge_requests/1/merge"
        ))
        .header("PRIVATE-TOKEN", "kargo-token")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 405);

    forge.clear_requests();
    let too_deep = vec!["g"; 23].join("/");
    for (hostile, args) in [
        ("platform/../gitops", &gitlab_args[..]),
        ("platform//gitops", &gitlab_args[..]),
        ("/platform/gitops", &gitlab_args[..]),
        ("platform/gitops/", &gitlab_args[..]),
        ("%2e%2e/gitops", &gitlab_args[..]),
        ("platform/%2e%2e/gitops", &gitlab_args[..]),
        ("platform%2Fgitops", &gitlab_args[..]),
        (too_deep.as_str(), &gitlab_args[..]),
        ("platform/git\nops", &gitlab_args[..]),
        ("platform/\u{1b}[31mgitops", &gitlab_args[..]),
        ("platform/gitops?private_token=x", &gitlab_args[..]),
        // GitHub and Gitea have no subgroups.
        (SUBGROUP_SLUG, &["--forge-url", url.as_str()][..]),
        (
            SUBGROUP_SLUG,
            &["--forge", "gitea", "--forge-url", url.as_str()][..],
        ),
        ("platform/..", &["--forge-url", url.as_str()][..]),
    ] {
        let output = publish_slug(hostile, args, clone.path(), cache.path());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{hostile:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{hostile:?}: {stderr}");
        assert!(
            stderr.starts_with("gate: --repo-slug: \""),
            "{hostile:?}: {stderr}"
        );
        assert!(
            stderr.contains("is not a GitLab project path") || stderr.contains("is not OWNER/NAME"),
            "{hostile:?}: {stderr}"
        );
    }
    assert!(forge.requests().is_empty(), "{:#?}", forge.requests());
}
