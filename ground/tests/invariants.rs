//! The ground's invariants (ground/src/invariants.rs) see each broken state they name, and
//! nothing in a healthy one.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

use ground::forge::ForgeDouble;
use ground::invariants::violations;
use ground::kargo;
use ground::kube::store::User;
use ground::kube::{FaultPlan, KubeDouble};
use serde_json::json;

const NS: &str = "kargo-demo";
const SLUG: &str = "platform/gitops";

fn admin() -> User {
    User {
        name: "system:admin".into(),
        groups: vec!["system:masters".into()],
    }
}

async fn world() -> (KubeDouble, ForgeDouble, tempfile::TempDir) {
    let kube = KubeDouble::start(FaultPlan::none()).await.unwrap();
    kube.load_crds(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kind/crds"))
        .unwrap();
    kube.create_namespace(NS, &[(kargo::PROJECT_LABEL, "true")])
        .unwrap();
    let forge = ForgeDouble::start(None).await.unwrap();
    forge.add_user("gate-token", "addons-gate[bot]");
    let content = tempfile::tempdir().unwrap();
    std::fs::write(content.path().join("README.md"), "x\n").unwrap();
    forge.create_repo(SLUG, content.path()).unwrap();
    (kube, forge, content)
}

/// A Promotion to `stage` in `phase`, made by the observer when `observer` is set.
fn promotion(
    kube: &KubeDouble,
    name: &str,
    stage: &str,
    freight: &str,
    phase: &str,
    observer: bool,
) {
    let mut store = kube.store();
    let r = store
        .resource(kargo::GROUP, kargo::VERSION, "promotions")
        .cloned()
        .unwrap();
    let mut object = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Promotion",
        "metadata": {"name": name, "labels": {}}, "spec": {"stage": stage, "freight": freight, "steps": [{"uses": "noop"}]}});
    if observer {
        object["metadata"]["labels"][gitops_loop::observer::decision::MANAGED_BY_LABEL] =
            json!(gitops_loop::observer::decision::MANAGED_BY);
    }
    store.create(&r, NS, object, &admin()).unwrap();
    store
        .patch(
            &r,
            NS,
            name,
            ground::kube::store::PatchBody::Merge(json!({"status": {"phase": phase}})),
            &admin(),
            true,
        )
        .unwrap();
}

/// Writes `content` to the file `x` of a clone and commits it.
fn commit_file(clone: &std::path::Path, content: &str) {
    std::fs::write(clone.join("x"), content).unwrap();
    ground::git::git(clone, &["add", "x"]).unwrap();
    let identity = ["-c", "user.name=a", "-c", "user.email=a@b"];
    let commit = ["commit", "--quiet", "-m", content];
    ground::git::git(clone, &[&identity[..], &commit[..]].concat()).unwrap();
}

#[tokio::test]
async fn a_healthy_state_breaks_nothing() {
    let (kube, forge, _dir) = world().await;
    promotion(&kube, "a", "prod", "f1", "Succeeded", false);
    promotion(&kube, "b", "prod", "f2", "Running", false);
    promotion(&kube, "c", "prod", "f1", "Failed", true);
    assert_eq!(violations(&kube, &forge, NS, SLUG), Vec::<String>::new());
}

#[tokio::test]
async fn two_running_promotions_on_a_stage_are_a_violation() {
    let (kube, forge, _dir) = world().await;
    promotion(&kube, "a", "prod", "f1", "Running", false);
    promotion(&kube, "b", "prod", "f2", "Running", false);
    promotion(&kube, "c", "staging", "f2", "Running", false);
    let found = violations(&kube, &forge, NS, SLUG);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("Stage prod has 2 Promotions Running"),
        "{found:?}"
    );
}

#[tokio::test]
async fn a_second_observer_promotion_in_flight_is_a_violation() {
    let (kube, forge, _dir) = world().await;
    promotion(&kube, "a", "prod", "f1", "Running", true);
    promotion(&kube, "b", "prod", "f2", "Pending", true);
    let found = violations(&kube, &forge, NS, SLUG);
    assert!(
        found
            .iter()
            .any(|v| v.contains("2 Promotions in flight to Stage prod")),
        "{found:?}"
    );
}

#[tokio::test]
async fn the_observer_retrying_a_failed_promotion_is_a_violation() {
    let (kube, forge, _dir) = world().await;
    promotion(&kube, "a", "prod", "f1", "Failed", true);
    promotion(&kube, "b", "prod", "f1", "Errored", true);
    let found = violations(&kube, &forge, NS, SLUG);
    assert!(
        found
            .iter()
            .any(|v| v.contains("2 failed Promotions of Freight f1")),
        "{found:?}"
    );
}

#[tokio::test]
async fn a_second_report_comment_or_check_run_and_a_failing_bosun_status_are_violations() {
    gitops_loop::forge::github::install_crypto_provider();
    let (kube, forge, _dir) = world().await;
    let url = forge.url();
    let http = reqwest::Client::new();
    // A pull request to comment on.
    let clone = tempfile::tempdir().unwrap();
    ground::git::git(
        clone.path(),
        &["clone", "--quiet", &forge.git_url(SLUG).unwrap(), "."],
    )
    .unwrap();
    ground::git::git(clone.path(), &["checkout", "--quiet", "-b", "bump2"]).unwrap();
    commit_file(clone.path(), "y");
    ground::git::git(clone.path(), &["push", "--quiet", "origin", "bump2"]).unwrap();
    let created = http
        .post(format!("{url}/repos/{SLUG}/pulls"))
        .bearer_auth("gate-token")
        .json(&json!({"title": "t", "head": "bump2", "base": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let head = forge.open_pulls(SLUG)[0].1.clone();
    let marker = gitops_loop::gate::report::MARKER;
    for body in [format!("{marker}\none"), format!("{marker}\ntwo")] {
        http.post(format!("{url}/repos/{SLUG}/issues/1/comments"))
            .bearer_auth("gate-token")
            .json(&json!({"body": body}))
            .send()
            .await
            .unwrap();
    }
    for _ in 0..2 {
        http.post(format!("{url}/repos/{SLUG}/check-runs"))
            .bearer_auth("gate-token")
            .json(&json!({"name": "addons-gate", "head_sha": head, "conclusion": "success"}))
            .send()
            .await
            .unwrap();
    }
    http.post(format!("{url}/repos/{SLUG}/statuses/{head}"))
        .bearer_auth("gate-token")
        .json(&json!({"context": "bosun", "state": "failure"}))
        .send()
        .await
        .unwrap();
    let found = violations(&kube, &forge, NS, SLUG);
    assert!(
        found
            .iter()
            .any(|v| v.contains("#1 has 2 gate report comments by addons-gate[bot]")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|v| v.contains("2 addons-gate check runs")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|v| v.contains("`bosun` status failure")),
        "{found:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bosun_pushing_after_a_hand_off_or_writing_outside_its_scope_are_violations() {
    gitops_loop::forge::github::install_crypto_provider();
    let (kube, forge, _dir) = world().await;
    forge.add_user("bosun-token", "bosun[bot]");
    forge.add_user("alice-token", "alice");
    let url = forge.url();
    let http = reqwest::Client::new();
    // Pushes go over smart HTTP with a token, so the double knows who pushed.
    let clone = tempfile::tempdir().unwrap();
    let push_to = |token: &str, content: &str, branch: &str| {
        let remote = forge.http_git_url_as(SLUG, token);
        commit_file(clone.path(), content);
        ground::git::git(
            clone.path(),
            &[
                "push",
                "--quiet",
                &remote,
                &format!("HEAD:refs/heads/{branch}"),
            ],
        )
        .unwrap();
    };
    let push_as = |token: &str, content: &str| push_to(token, content, "bump");
    ground::git::git(
        clone.path(),
        &["clone", "--quiet", &forge.git_url(SLUG).unwrap(), "."],
    )
    .unwrap();
    push_as("alice-token", "one");
    let created = http
        .post(format!("{url}/repos/{SLUG}/pulls"))
        .bearer_auth("alice-token")
        .json(&json!({"title": "t", "head": "bump", "base": "main"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    // Before a hand-off, Bosun's push (a repair) is within its scope.
    push_as("bosun-token", "repair");
    assert_eq!(violations(&kube, &forge, NS, SLUG), Vec::<String>::new());
    // Bosun hands the pull request to a person, then pushes anyway.
    http.post(format!("{url}/repos/{SLUG}/issues/1/labels"))
        .bearer_auth("bosun-token")
        .json(&json!({"labels": ["needs-human"]}))
        .send()
        .await
        .unwrap();
    push_as("bosun-token", "after the hand-off");
    let found = violations(&kube, &forge, NS, SLUG);
    assert!(
        found
            .iter()
            .any(|v| v.contains("bosun pushed to bump after handing its pull request")),
        "{found:?}"
    );
    // A person's push makes a new head: Bosun may work on it again.
    push_as("alice-token", "a person's fix");
    let before = violations(&kube, &forge, NS, SLUG).len();
    push_as("bosun-token", "a new triage's repair");
    assert_eq!(violations(&kube, &forge, NS, SLUG).len(), before);
    // Bosun's pushes go to pull requests' head branches, never to their base.
    push_to("bosun-token", "straight to main", "main");
    let found = violations(&kube, &forge, NS, SLUG);
    assert!(
        found
            .iter()
            .any(|v| v.contains("bosun pushed outside its scope: refs/heads/main")),
        "{found:?}"
    );
    // A merge is never Bosun's to make.
    http.put(format!("{url}/repos/{SLUG}/pulls/1/merge"))
        .bearer_auth("bosun-token")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let found = violations(&kube, &forge, NS, SLUG);
    assert!(
        found.iter().any(|v| v
            .contains("bosun wrote outside its scope: PUT /repos/platform/gitops/pulls/1/merge")),
        "{found:?}"
    );
}
