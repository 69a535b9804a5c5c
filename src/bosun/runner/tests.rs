//! Tests of `runner`.

use super::COMMENT_MARKER;
use super::comments::{attempts_of, refused_value_places};
use super::git_ops::{CREDENTIAL_HELPER, git};
use super::model_calls::{
    MODEL_CALLS_COMMENT, MODEL_CALLS_MARK, calls_allowed, model_calls_body, model_calls_made,
};

/// `git credential fill` through Bosun's helper, for a protocol and host.
fn fill(protocol: &str, host: &str) -> String {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("git")
        .current_dir(dir.path())
        .args(["-c", "credential.helper=", "-c", CREDENTIAL_HELPER])
        .args(["credential", "fill"])
        .env("BOSUN_GIT_HOST", "forge.example.test")
        .env("BOSUN_GIT_PROTOCOL", "https")
        .env("BOSUN_GIT_USERNAME", "x-access-token")
        .env("BOSUN_GIT_TOKEN", "the-token")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "/bin/false")
        .env("SSH_ASKPASS", "/bin/false")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("protocol={protocol}\nhost={host}\n\n").as_bytes())
        .unwrap();
    String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
}

#[test]
fn the_credential_helper_answers_the_forge_only() {
    assert!(fill("https", "forge.example.test").contains("password=the-token"));
    assert!(!fill("https", "evil.example.test").contains("the-token"));
    assert!(!fill("http", "forge.example.test").contains("the-token"));
}

#[test]
fn model_calls_are_counted_per_head_from_bosuns_own_comment_only() {
    use crate::forge::Comment;
    let me = "bosun[bot]";
    let body = model_calls_body(&[], me, "aaa", 2, 5);
    let mut comments = vec![Comment {
        id: 1,
        author: me.into(),
        body: body.clone(),
    }];
    assert_eq!(model_calls_made(&comments, me, "aaa"), 2);
    assert_eq!(model_calls_made(&comments, me, "bbb"), 0);
    // Another head's count is kept when this head's is written.
    comments[0].body = model_calls_body(&comments, me, "bbb", 1, 5);
    assert_eq!(model_calls_made(&comments, me, "aaa"), 2);
    assert_eq!(model_calls_made(&comments, me, "bbb"), 1);
    // A person's comment with the same markers counts for nothing.
    comments.push(Comment {
        id: 2,
        author: "mallory".into(),
        body: format!("{MODEL_CALLS_COMMENT}\n{MODEL_CALLS_MARK}aaa 0 -->"),
    });
    assert_eq!(model_calls_made(&comments, me, "aaa"), 2);
    // Bosun's triage comment (replaced by every handoff) is not where calls are counted.
    comments.push(Comment {
        id: 3,
        author: me.into(),
        body: format!("{COMMENT_MARKER}\n{MODEL_CALLS_MARK}ccc 9 -->"),
    });
    assert_eq!(model_calls_made(&comments, me, "ccc"), 0);
}

#[test]
fn the_pull_requests_cap_holds_across_a_persons_pushes_and_says_which_cap_stopped() {
    use crate::forge::Comment;
    let me = "bosun[bot]";
    let model = crate::bosun::config::ModelConfig {
        max_calls_per_pull_request: 6,
        max_calls_per_head: 4,
        ..Default::default()
    };
    // Four heads, each under the per-head cap; the fourth push finds the pull request's cap
    // used by the three before it.
    let mut comments = vec![Comment {
        id: 1,
        author: me.into(),
        body: model_calls_body(&[], me, "aaa", 3, 6),
    }];
    assert_eq!(calls_allowed(&comments, me, "bbb", 2, &model), Ok(()));
    comments[0].body = model_calls_body(&comments, me, "bbb", 2, 6);
    assert_eq!(calls_allowed(&comments, me, "ccc", 1, &model), Ok(()));
    comments[0].body = model_calls_body(&comments, me, "ccc", 1, 6);
    let hit = calls_allowed(&comments, me, "ddd", 1, &model).unwrap_err();
    assert_eq!(
        hit,
        crate::bosun::repair::CapHit {
            made: 6,
            cap: 6,
            per_head: false
        }
    );
    assert!(
        hit.to_string().contains("model.maxCallsPerPullRequest"),
        "{hit}"
    );
    // Within the pull request's cap, the head's own cap still holds, and says so.
    let roomy = crate::bosun::config::ModelConfig {
        max_calls_per_pull_request: 100,
        ..model
    };
    let hit = calls_allowed(&comments, me, "aaa", 2, &roomy).unwrap_err();
    assert_eq!((hit.made, hit.cap, hit.per_head), (3, 4, true));
    assert!(hit.to_string().contains("model.maxCallsPerHead"), "{hit}");
}

#[test]
fn attempts_count_the_highest_label_so_removing_one_does_not_reset_the_cap() {
    let labels = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let prefix = "bosun/attempt-";
    assert_eq!(attempts_of(&labels(&[]), prefix), 0);
    assert_eq!(
        attempts_of(&labels(&["bosun/attempt-1", "other"]), prefix),
        1
    );
    assert_eq!(attempts_of(&labels(&["bosun/attempt-2"]), prefix), 2);
    assert_eq!(
        attempts_of(&labels(&["bosun/attempt-x", "bosun/attempt-y"]), prefix),
        2
    );
}

#[test]
fn values_schema_keys_point_at_the_files_that_set_them() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| git(dir.path(), args).unwrap();
    run(&["init", "--quiet"]);
    std::fs::create_dir_all(dir.path().join("values")).unwrap();
    std::fs::write(
        dir.path().join("values/a.yaml"),
        "legacyCrdsEnabled: true\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("values/b.yaml"), "other: 1\n").unwrap();
    run(&["add", "."]);
    run(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "--quiet",
        "-m",
        "v",
    ]);
    let places = refused_value_places(
        dir.path(),
        "HEAD",
        "values don't meet the specifications: at '': additional properties 'legacyCrdsEnabled' not allowed; additional properties '$(rm -rf)' not allowed",
    );
    assert_eq!(places, ["values/a.yaml (key legacyCrdsEnabled)"]);
}
