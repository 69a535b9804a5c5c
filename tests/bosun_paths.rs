//! Every Bosun path end to end on the ground, with the real `bosun` and `gate` binaries: a
//! person opens pull requests on the forge double, the intake takes them, Bosun runs the gate
//! and acts; the test reads what it left on the forge (labels, comments, statuses, commits).
//! Hostile inputs ride along: deliveries without or with a wrong secret, a spoofed report.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::PathBuf;

use ground::scenario::{Action, BosunSpec, Scenario};
use ground::{Ground, Options};
use serde_json::{Value, json};

const SLUG: &str = "platform/gitops";

async fn start(config: Value) -> Ground {
    start_polling(config, 0).await
}

async fn start_polling(config: Value, poll: u64) -> Ground {
    start_on(config, poll, ground::scenario::Face::Github).await
}

/// The ground with Bosun on one face of the forge double.
async fn start_on(config: Value, poll: u64, face: ground::scenario::Face) -> Ground {
    start_scenario(config, poll, face, |_| {}).await
}

/// `start_on` with the scenario changed first (another repository slug).
async fn start_scenario(
    config: Value,
    poll: u64,
    face: ground::scenario::Face,
    change: impl FnOnce(&mut Scenario),
) -> Ground {
    let root = common::project_root();
    let mut scenario = Scenario::load(&root.join("scenarios/triage")).unwrap();
    change(&mut scenario);
    scenario.timeline.clear();
    scenario.forge = face;
    scenario.bosun = Some(BosunSpec {
        config,
        poll,
        model: None,
    });
    let options = Options {
        gate: env!("CARGO_BIN_EXE_gate").into(),
        observer: None,
        bosun: Some(env!("CARGO_BIN_EXE_bosun").into()),
        tools: root.join("target/tools"),
        crds: root.join("kind/crds"),
        pipelines_chart: None,
        faults: ground::kube::FaultPlan::none(),
        echo: false,
        render_cache: Some(common::shared_render_cache("bosun_paths")),
        // Bosun renders on its own cold cache here: its own render path runs.
        bosun_shares_render_cache: false,
    };
    let mut ground = Ground::start(scenario, options).await.unwrap();
    for chart in [
        "external-secrets@2.10.0",
        "cert-manager-lite@1.19.3",
        "policy-engine@1.0.0",
        "policy-engine@2.0.0",
    ] {
        ground.act(&Action::Publish(chart.into())).await.unwrap();
    }
    ground
}

fn case(name: &str) -> PathBuf {
    common::project_root().join("tests").join(name)
}

/// Commits `overlay` on a new branch and opens a pull request from it.
async fn pull(ground: &Ground, branch: &str, overlay: &str) -> (u64, String) {
    let head = ground
        .commit_overlay(branch, "main", &case(overlay), branch)
        .unwrap();
    let number = ground.open_pull(branch, branch, "alice").await.unwrap();
    (number, head)
}

async fn deliver(ground: &Ground, body: &Value, auth: Option<&str>) -> (u16, Value) {
    let url = format!("{}/intake", ground.bosun.as_ref().unwrap().url);
    let mut request = ground::http::client().post(url).body(body.to_string());
    if let Some(auth) = auth {
        request = request.header("Authorization", auth);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn intake(ground: &Ground, number: u64) {
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);
    let (status, body) = deliver(
        ground,
        &json!({"repository": SLUG, "pullRequest": number}),
        Some(&secret),
    )
    .await;
    assert_eq!(status, 202, "{body}");
}

fn bosun_comment(ground: &Ground, number: u64) -> Option<String> {
    ground
        .forge
        .comments(SLUG, number)
        .into_iter()
        .find(|(author, body)| {
            author == "bosun[bot]" && body.starts_with("<!-- bosun:triage v1 -->")
        })
        .map(|(_, body)| body)
}

/// Authors of the commits on a branch that main does not have.
fn authors(ground: &Ground, branch: &str) -> Vec<String> {
    let bare = ground.forge.bare_path(SLUG).unwrap();
    ground::git::git(&bare, &["log", "--format=%an", &format!("main..{branch}")])
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The gate's report comment on a pull request.
fn gate_report(ground: &Ground, number: u64) -> String {
    ground
        .forge
        .comments(SLUG, number)
        .into_iter()
        .find(|(_, body)| body.starts_with(gitops_loop::gate::report::MARKER))
        .map(|(_, body)| body)
        .unwrap()
}

/// Every file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn bosun_status(ground: &Ground, branch: &str) -> (String, String) {
    let bare = ground.forge.bare_path(SLUG).unwrap();
    let head = ground::git::git(&bare, &["rev-parse", branch]).unwrap();
    let statuses = ground.forge.statuses(SLUG, &head);
    let (_, state, description) = statuses
        .iter()
        .rev()
        .find(|(context, _, _)| context == "bosun")
        .cloned()
        .unwrap_or_default();
    // Never a failure, anywhere.
    assert!(
        statuses
            .iter()
            .all(|(c, s, _)| c != "bosun" || (s != "failure" && s != "error")),
        "{statuses:?}"
    );
    (state, description)
}

#[tokio::test(flavor = "multi_thread")]
async fn swap_reshape_cap_spoof_worth_a_look_and_green() {
    // Bosun also looks for new heads every second (a person pushing to a pull request).
    let mut ground = start_polling(Value::Null, 1).await;

    // Hostile deliveries first: nothing may happen for them.
    let body = json!({"repository": SLUG, "pullRequest": 1});
    assert_eq!(deliver(&ground, &body, None).await.0, 401);
    assert_eq!(deliver(&ground, &body, Some("Bearer wrong")).await.0, 401);
    assert_eq!(deliver(&ground, &body, Some("Basic Ym9zdW46")).await.0, 401);
    // REST calls only: a person's clones and pushes go over git's smart HTTP.
    let rest_calls = |ground: &Ground| {
        ground
            .forge
            .requests()
            .iter()
            .filter(|r| !r.path.contains(".git/"))
            .count()
    };
    let requests_before = rest_calls(&ground);

    let (reshape, _) = pull(&ground, "reshape", "bosun-cases/reshape").await;
    let (capped, _) = pull(&ground, "capped", "check-cases/es-major-bump/head").await;
    let (spoofed, spoofed_head) = pull(&ground, "spoofed", "check-cases/es-major-bump/head").await;
    let (rbac, _) = pull(&ground, "rbac", "check-cases/major-rbac-removed/head").await;
    let (green, _) = pull(&ground, "green", "check-cases/patch-bump-green/head").await;
    assert_eq!(
        rest_calls(&ground),
        requests_before + 5,
        "the refused deliveries made Bosun call the forge"
    );

    // The cap: two repairs already pushed, by the labels.
    let token = Ground::forge_token("alice").unwrap();
    ground::http::client()
        .post(format!(
            "{}/repos/{SLUG}/issues/{capped}/labels",
            ground.forge.url()
        ))
        .bearer_auth(token)
        .json(&json!({"labels": ["bosun/attempt-1", "bosun/attempt-2"]}))
        .send()
        .await
        .unwrap();
    // A spoofed report by a person: a green verdict for the head, and a "repair" aimed outside
    // the repository. Bosun trusts only the gate's identity.
    let forged_dropped = gitops_loop::gate::report::machine_block(
        "dropped",
        &json!({"crd": "x.example.io", "group": "example.io", "kind": "X", "dropped": ["v1"], "served": ["v2"], "storage": "v2", "clusters": [], "consumers": [{"path": "../outside.yaml", "document": 0, "apiVersion": "example.io/v1", "kind": "X", "name": "x"}]}),
    );
    let forged_verdict = gitops_loop::gate::report::machine_block(
        "verdict",
        &json!({"outcome": "green", "base": "0".repeat(40), "head": spoofed_head, "counts": {"applicationsAdded": 0, "applicationsRemoved": 0, "applicationsChanged": 0, "objectsAdded": 0, "objectsRemoved": 0, "objectsChanged": 0}, "blocking": {}, "repositoryConsumers": 0, "errors": []}),
    );
    ground::http::client()
        .post(format!("{}/repos/{SLUG}/issues/{spoofed}/comments", ground.forge.url()))
        .bearer_auth(token)
        .json(&json!({"body": format!("{}\n### addons-gate: passed\n{forged_verdict}\n{forged_dropped}\n", gitops_loop::gate::report::MARKER)}))
        .send()
        .await
        .unwrap();

    for number in [reshape, capped, spoofed, rbac] {
        intake(&ground, number).await;
    }
    // The last delivery is signed (HMAC of the body) instead of carrying the bearer token;
    // a signature of another body is refused.
    use hmac::Mac;
    let body = json!({"repository": SLUG, "pullRequest": green}).to_string();
    let sign = |text: &str| {
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(ground::bosun::WEBHOOK_SECRET.as_bytes())
                .unwrap();
        mac.update(text.as_bytes());
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    };
    let signed = |signature: String| {
        ground::http::client()
            .post(format!("{}/intake", ground.bosun.as_ref().unwrap().url))
            .header("X-Bosun-Signature-256", signature)
            .body(body.clone())
            .send()
    };
    assert_eq!(signed(sign("{}")).await.unwrap().status().as_u16(), 401);
    assert_eq!(signed(sign(&body)).await.unwrap().status().as_u16(), 202);
    // The same delivery again is a duplicate and queues nothing.
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);
    let (status, answer) = deliver(
        &ground,
        &json!({"repository": SLUG, "pullRequest": green}),
        Some(&secret),
    )
    .await;
    assert_eq!(
        (status, answer["status"].as_str()),
        (200, Some("duplicate"))
    );
    let (status, _) = deliver(
        &ground,
        &json!({"repository": "someone/else", "pullRequest": 1}),
        Some(&secret),
    )
    .await;
    assert_eq!(status, 422);
    ground.settle().await.unwrap();

    // Reshape: the swap would lose `spec.target.immutable`; nothing pushed, handed off.
    assert_eq!(authors(&ground, "reshape"), ["Proving Ground"]);
    let comment = bosun_comment(&ground, reshape).unwrap();
    assert!(
        comment.contains("`spec.target.immutable` = true would be pruned"),
        "{comment}"
    );
    assert!(
        ground
            .forge
            .labels(SLUG, reshape)
            .contains(&"needs-human".to_string())
    );
    assert!(
        bosun_status(&ground, "reshape")
            .1
            .starts_with("handed off: the destination schema would prune")
    );

    // The cap: no third attempt.
    assert_eq!(authors(&ground, "capped"), ["Proving Ground"]);
    assert!(
        bosun_comment(&ground, capped)
            .unwrap()
            .contains("Bosun already pushed 2 repairs to this pull request (the cap is 2)")
    );

    // Spoofed: Bosun followed the gate's own report and repaired (the forged one said green
    // and pointed outside the repository).
    assert_eq!(authors(&ground, "spoofed"), ["bosun", "Proving Ground"]);
    assert_eq!(bosun_status(&ground, "spoofed").0, "success");
    // The repair went over smart HTTP with Bosun's token (git http-backend behind the forge
    // double checks it as GitHub does), and the token is nowhere on disk in the checkout.
    let git_requests: Vec<(String, Option<String>)> = ground
        .forge
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/platform/gitops.git/"))
        .map(|r| (r.path, r.user))
        .collect();
    assert!(
        git_requests
            .iter()
            .any(|(path, user)| path.ends_with("/git-receive-pack")
                && user.as_deref() == Some("bosun[bot]")),
        "{git_requests:?}"
    );
    assert!(
        git_requests
            .iter()
            .any(|(path, _)| path.ends_with("/git-upload-pack")),
        "{git_requests:?}"
    );
    let checkout = ground
        .bosun
        .as_ref()
        .unwrap()
        .workdir
        .join("checkouts/platform/gitops");
    for entry in walk(&checkout.join(".git")) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(ground::FORGE_BOSUN_TOKEN),
            "the token is on disk in {}",
            entry.display()
        );
    }
    assert!(
        bosun_status(&ground, "spoofed")
            .1
            .starts_with("green; worth a look")
    );

    // A major boundary and vanished RBAC on a green gate: worth a look, nothing blocks.
    let labels = ground.forge.labels(SLUG, rbac);
    assert!(
        labels.contains(&"worth-a-look".to_string())
            && !labels.contains(&"needs-human".to_string()),
        "{labels:?}"
    );
    let comment = bosun_comment(&ground, rbac).unwrap();
    assert!(
        comment.contains("a major version boundary is crossed, and RBAC objects are removed"),
        "{comment}"
    );

    // Green and unremarkable: one comment saying what the change does, no label, a success
    // status.
    let explained = bosun_comment(&ground, green).unwrap();
    assert!(
        explained.starts_with("<!-- bosun:triage v1 -->\n**The gate is green.**")
            && explained.contains("What this change does"),
        "{explained}"
    );
    assert!(ground.forge.labels(SLUG, green).is_empty());
    assert_eq!(
        bosun_status(&ground, "green"),
        (
            "success".to_string(),
            "addons-gate is green; explained".to_string()
        )
    );

    // A person pushes to a pull request Bosun took in: with no delivery, the poller finds the
    // new head and the gate runs on it.
    let pushed = ground
        .commit_overlay("green", "green", &case("bosun-cases/person-push"), "a note")
        .unwrap();
    ground
        .await_condition(&format!("Bosun to judge the new head {pushed}"), |ground| {
            ground
                .forge
                .statuses(SLUG, &pushed)
                .iter()
                .any(|(c, s, _)| c == "bosun" && s == "success")
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn escalation_values_handoff_and_a_denied_file() {
    let mut ground =
        start(json!({"deny": [".github/**", "platform/secret-stores/team-a/**"]})).await;
    // main gains policy-engine 1.0.0 and a value 2.10.0's schema refuses.
    ground
        .commit_overlay(
            "main",
            "main",
            &case("check-cases/chart-renders-unserved/base"),
            "add policy-engine",
        )
        .unwrap();
    ground
        .commit_overlay(
            "main",
            "main",
            &case("check-cases/values-schema-break/base"),
            "set legacyCrdsEnabled",
        )
        .unwrap();
    let (unserved, _) = pull(
        &ground,
        "unserved",
        "check-cases/chart-renders-unserved/head",
    )
    .await;
    let (values, _) = pull(&ground, "values", "check-cases/values-schema-break/head").await;
    let (denied, _) = pull(&ground, "denied", "bosun-cases/deny").await;
    for number in [unserved, values, denied] {
        intake(&ground, number).await;
    }
    ground.settle().await.unwrap();

    // Nothing in this repository to change: one line, needs-human, no push.
    let comment = bosun_comment(&ground, unserved).unwrap();
    assert_eq!(comment.lines().count(), 2, "{comment}");
    assert!(comment.contains("there are no values to change in this repository"));
    assert!(
        ground
            .forge
            .labels(SLUG, unserved)
            .contains(&"needs-human".to_string())
    );
    assert_eq!(authors(&ground, "unserved"), ["Proving Ground"]);

    // The chart refuses the values: a handoff naming the refused key, no push.
    let comment = bosun_comment(&ground, values).unwrap();
    assert!(
        comment.starts_with("<!-- bosun:triage v1 -->\n**Over to you.**"),
        "{comment}"
    );
    assert!(
        comment.contains("additional properties 'legacyCrdsEnabled' not allowed"),
        "{comment}"
    );
    assert!(comment.contains("a values migration needs a model, which is not configured"));
    assert_eq!(authors(&ground, "values"), ["Proving Ground"]);

    // One consumer in a denied file: no partial push, the handoff names the file.
    let comment = bosun_comment(&ground, denied).unwrap();
    assert!(
        comment.contains("platform/secret-stores/team-a/extra.yaml: the deny-list matches it"),
        "{comment}"
    );
    assert_eq!(authors(&ground, "denied"), ["Proving Ground"]);
    insta::assert_snapshot!("denied_handoff", comment);

    // `bosun triage --pr N` from a terminal: the same decision, the same single comment.
    let dir = ground.dir().join("bosun");
    let output = assert_cmd::Command::new(env!("CARGO_BIN_EXE_bosun"))
        .env("BOSUN_FORGE_TOKEN", ground::FORGE_BOSUN_TOKEN)
        .env("KUBECONFIG", ground.dir().join("bosun.kubeconfig"))
        .env(
            "GATE_HELM",
            common::project_root().join("target/tools/helm"),
        )
        .env(
            "GATE_KUBECTL",
            common::project_root().join("target/tools/kubectl"),
        )
        .arg("--config")
        .arg(dir.join("bosun.yaml"))
        .args(["triage", "--pr", &unserved.to_string()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("escalated (label needs-human): no values to change in this repository"),
        "{printed}"
    );
    let bosun_comments = ground
        .forge
        .comments(SLUG, unserved)
        .into_iter()
        .filter(|(author, body)| {
            author == "bosun[bot]" && body.starts_with("<!-- bosun:triage v1 -->")
        })
        .count();
    assert_eq!(bosun_comments, 1);

    // The forge failing on every request: one line on stderr saying what and where, exit 1,
    // and nothing written.
    let labels_before = ground.forge.labels(SLUG, unserved);
    ground.forge.set_faults(ground::forge::ForgeFaults {
        seed: 7,
        server_error: 1000,
        rate_limit: 0,
    });
    let output = assert_cmd::Command::new(env!("CARGO_BIN_EXE_bosun"))
        .env("BOSUN_FORGE_TOKEN", ground::FORGE_BOSUN_TOKEN)
        .env("KUBECONFIG", ground.dir().join("bosun.kubeconfig"))
        .arg("--config")
        .arg(dir.join("bosun.yaml"))
        .args(["triage", "--pr", &unserved.to_string()])
        .output()
        .unwrap();
    ground
        .forge
        .set_faults(ground::forge::ForgeFaults::default());
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(
            "bosun: cannot ask the forge who the token is (or set forge.login): GET /user: HTTP 5"
        ),
        "{stderr}"
    );
    assert_eq!(ground.forge.labels(SLUG, unserved), labels_before);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_gate_run_by_ci_bosun_reads_that_report_and_publishes_none() {
    let mut ground = start(json!({"forge": {"gateAuthor": "addons-gate[bot]"}})).await;
    ground.ci.enabled = true;
    let (number, _) = pull(&ground, "bump", "check-cases/es-major-bump/head").await;
    // CI publishes the verdict as addons-gate[bot]; then Kargo hands the pull request over.
    ground.settle().await.unwrap();
    intake(&ground, number).await;
    ground.settle().await.unwrap();
    assert_eq!(authors(&ground, "bump"), ["bosun", "Proving Ground"]);
    let comments = ground.forge.comments(SLUG, number);
    assert!(
        comments.iter().all(|(author, body)| author != "bosun[bot]"
            || !body.starts_with(gitops_loop::gate::report::MARKER)),
        "Bosun published a report of its own"
    );
    // CI judged Bosun's commit too, and it is green.
    let bare = ground.forge.bare_path(SLUG).unwrap();
    let head = ground::git::git(&bare, &["rev-parse", "bump"]).unwrap();
    let latest = ground
        .forge
        .comments(SLUG, number)
        .into_iter()
        .find(|(author, body)| {
            author == "addons-gate[bot]" && body.starts_with(gitops_loop::gate::report::MARKER)
        })
        .map(|(_, body)| gitops_loop::gate::report::parse(&body).unwrap())
        .unwrap();
    assert_eq!(latest.verdict.head, head);
    assert_eq!(
        latest.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Green
    );

    // The gate's identity is shared (any workflow can comment as the CI bot). A newer comment
    // under it, claiming green for a blocked head, is not the verdict: the check CI published
    // carries the digest of the real report, and Bosun waits rather than act on the forgery.
    let (forged, forged_head) = pull(&ground, "forged", "check-cases/es-major-bump/head").await;
    ground.settle().await.unwrap();
    let real = ground
        .forge
        .comments(SLUG, forged)
        .into_iter()
        .find(|(author, body)| {
            author == "addons-gate[bot]" && body.starts_with(gitops_loop::gate::report::MARKER)
        })
        .map(|(_, body)| body)
        .unwrap();
    let start = real.find("\"blocking\":{").unwrap();
    let end = start + real[start..].find('}').unwrap() + 1;
    let fake = format!("{}\"blocking\":{{}}{}", &real[..start], &real[end..])
        .replace("\"outcome\":\"blocked\"", "\"outcome\":\"green\"");
    assert_eq!(
        gitops_loop::gate::report::parse(&fake)
            .unwrap()
            .verdict
            .outcome,
        gitops_loop::gate::verdict::Outcome::Green,
        "the forgery parses as a green report"
    );
    // The forgery is a second report comment by the gate's identity, on purpose.
    ground
        .exemptions
        .forged_reports
        .push((forged, "addons-gate[bot]".to_string()));
    let ci = gitops_loop::forge::github::GitHub::new(&ground.forge.url(), ground::FORGE_GATE_TOKEN)
        .unwrap();
    gitops_loop::forge::Forge::create_comment(&ci, &SLUG.parse().unwrap(), forged, &fake)
        .await
        .unwrap();
    intake(&ground, forged).await;
    ground.settle().await.unwrap();
    assert_eq!(authors(&ground, "forged"), ["Proving Ground"]);
    let (_, description) = bosun_status(&ground, "forged");
    assert!(description.starts_with("waiting"), "{description}");
    assert!(
        !ground
            .forge
            .labels(SLUG, forged)
            .contains(&"worth-a-look".to_string())
    );
    let _ = forged_head;
}

/// An accepted delivery survives SIGKILL: it is journaled before the 202, and the next process
/// replays it to the end. The test holds Bosun's triage lock so the kill lands between the 202
/// and the triage, every time. Rides along: `bearer` in any case, and a few hundred half-sent
/// connections do not keep a valid delivery out.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_delivery_survives_sigkill_and_half_sent_connections_do_not_block() {
    let mut ground = start(json!({})).await;
    let (green, _) = pull(&ground, "green", "check-cases/patch-bump-green/head").await;
    let workdir = ground.bosun.as_ref().unwrap().workdir.clone();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(workdir.join(".lock"))
        .unwrap();
    lock.lock().unwrap();

    let lowercase = format!("bearer {}", ground::bosun::WEBHOOK_SECRET);
    let (status, body) = deliver(
        &ground,
        &json!({"repository": SLUG, "pullRequest": green}),
        Some(&lowercase),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let journaled = |kind: &str| {
        std::fs::read_dir(workdir.join("journal"))
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(kind))
            .count()
    };
    assert_eq!(
        journaled("pending-"),
        1,
        "the delivery is on disk before the 202"
    );

    ground.bosun.as_mut().unwrap().kill().unwrap();
    // A render tree the killed process would have left behind.
    let stale = workdir.join("tmp/gate-tree-stale");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("values.yaml"), "pull request content").unwrap();
    drop(lock);
    ground.bosun.as_mut().unwrap().restart().await.unwrap();
    assert!(!stale.exists(), "a restart clears the trees a crash left");
    ground.settle().await.unwrap();
    let (state, description) = bosun_status(&ground, "green");
    assert_eq!(state, "success", "{description}");
    assert_eq!(
        journaled("pending-"),
        0,
        "a finished triage leaves nothing to replay"
    );
    assert_eq!(
        journaled("tracked-"),
        1,
        "the pull request is followed across restarts"
    );

    // Half-sent requests: connected, a request line, never the end of the headers.
    let address = ground
        .bosun
        .as_ref()
        .unwrap()
        .url
        .trim_start_matches("http://")
        .to_string();
    let mut stalled = Vec::new();
    for _ in 0..300 {
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        use tokio::io::AsyncWriteExt;
        stream
            .write_all(b"POST /intake HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        stalled.push(stream);
    }
    let (number, _) = pull(&ground, "green-two", "check-cases/patch-bump-green/head").await;
    intake(&ground, number).await;
    drop(stalled);
    ground.settle().await.unwrap();
}

/// A hostile chart and a hostile pull request against Bosun, end to end. The chart renames a
/// CRD's only version to YAML that would add a cluster-admin binding: the gate blocks with
/// `crd-name-invalid` and Bosun hands off, pushing nothing. Then, with a canary planted in
/// Bosun's own checkout configuration, a pull request's kustomization reaches for that checkout
/// through a base outside its tree: the render is refused, the gate is not green, and neither
/// the canary nor Bosun's token appears in any comment, check, status or log.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_chart_and_a_hostile_kustomization_get_a_person_not_a_push() {
    const CANARY: &str = "ghs_BOSUNcanary00112233445566";
    let mut ground = start(json!({})).await;
    ground
        .commit_overlay(
            "main",
            "main",
            &case("check-cases/crd-version-name-injection/base"),
            "the Widget CRD and a Widget",
        )
        .unwrap();
    let (chart, _) = pull(
        &ground,
        "chart",
        "check-cases/crd-version-name-injection/head",
    )
    .await;
    intake(&ground, chart).await;
    ground.settle().await.unwrap();
    assert_eq!(authors(&ground, "chart"), ["Proving Ground"]);
    assert!(
        ground
            .forge
            .labels(SLUG, chart)
            .contains(&"needs-human".to_string())
    );
    let (state, description) = bosun_status(&ground, "chart");
    assert_eq!(state, "success", "{description}");
    assert!(description.starts_with("handed off"), "{description}");

    // The canary, in the checkout Bosun made for the first pull request.
    let checkout = ground
        .bosun
        .as_ref()
        .unwrap()
        .workdir
        .join("checkouts/platform/gitops");
    let config = checkout.join(".git/config");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[canary]\n\ttoken = {CANARY}\n"));
    std::fs::write(&config, text).unwrap();
    let overlay = tempfile::tempdir().unwrap();
    let climb = format!(
        "{}{}",
        "../".repeat(32),
        checkout.display().to_string().trim_start_matches('/')
    );
    for (path, text) in [
        (
            "manifests/common/base/kustomization.yaml".to_string(),
            format!("resources:\n  - configmap.yaml\n  - deployment.yaml\n  - {climb}\n"),
        ),
        (
            "kustomization.yaml".to_string(),
            "configMapGenerator:\n  - name: stolen\n    files: [token=.git/config]\n".to_string(),
        ),
    ] {
        let target = overlay.path().join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, text).unwrap();
    }
    ground
        .commit_overlay("steal", "main", overlay.path(), "steal")
        .unwrap();
    let steal = ground.open_pull("steal", "steal", "alice").await.unwrap();
    intake(&ground, steal).await;
    ground.settle().await.unwrap();

    assert_eq!(authors(&ground, "steal"), ["Proving Ground"]);
    let (state, description) = bosun_status(&ground, "steal");
    assert_eq!(state, "success", "{description}");
    let mut seen = String::new();
    for request in ground.forge.requests() {
        seen.push_str(&request.body.to_string());
    }
    for number in [chart, steal] {
        for (_, body) in ground.forge.comments(SLUG, number) {
            seen.push_str(&body);
        }
    }
    seen.push_str(&std::fs::read_to_string(&ground.bosun.as_ref().unwrap().log).unwrap());
    for secret in [CANARY, ground::FORGE_BOSUN_TOKEN] {
        assert!(!seen.contains(secret), "{secret} leaked");
    }
    let report = gate_report(&ground, steal);
    assert!(
        report.contains("leaves the repository")
            && report.contains("### addons-gate: could not decide"),
        "the refusal is in the report, and it is not green:\n{report}"
    );

    // A pull request naming a chart repository the default branch never named: no pull.
    let overlay = tempfile::tempdir().unwrap();
    let targets = std::fs::read_to_string(
        common::project_root().join("scenarios/sample/repo/targets/addons.yaml"),
    )
    .unwrap()
    .replacen(
        "repoURL: https://charts.example.test/stable\n  version: 0.10.3",
        "repoURL: https://charts.elsewhere.test/stable\n  version: 9.9.9",
        1,
    );
    std::fs::create_dir_all(overlay.path().join("targets")).unwrap();
    std::fs::write(overlay.path().join("targets/addons.yaml"), targets).unwrap();
    ground
        .commit_overlay("elsewhere", "main", overlay.path(), "elsewhere")
        .unwrap();
    let elsewhere = ground
        .open_pull("elsewhere", "elsewhere", "alice")
        .await
        .unwrap();
    intake(&ground, elsewhere).await;
    ground.settle().await.unwrap();
    let report = gate_report(&ground, elsewhere);
    assert!(
        report.contains("is not on the pull allowlist")
            && report.contains("### addons-gate: could not decide"),
        "{report}"
    );
}

/// A delivery's `headSha` must be a commit id (40 or 64 lowercase hex digits) before anything
/// uses it: an option git would read (`--upload-pack=...`), a branch name, a revision
/// expression, a short or uppercase id, a line break, all get a 400 naming the field, nothing
/// is journaled and no forge call follows. A well-formed head is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_whose_head_is_not_a_commit_id_is_refused() {
    let ground = start(json!({})).await;
    let (number, head) = pull(&ground, "green", "check-cases/patch-bump-green/head").await;
    let workdir = ground.bosun.as_ref().unwrap().workdir.clone();
    let rest_calls = || {
        ground
            .forge
            .requests()
            .iter()
            .filter(|r| !r.path.contains(".git/"))
            .count()
    };
    let before = rest_calls();
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);
    for hostile in [
        "--upload-pack=touch /tmp/bosun-canary".to_string(),
        "main".into(),
        "HEAD~1".into(),
        head[..12].to_string(),
        head.to_uppercase(),
        format!("{head}\n"),
        format!("-{}", &head[1..]),
        "../../etc/passwd".into(),
        String::new(),
    ] {
        let (status, body) = deliver(
            &ground,
            &json!({"repository": SLUG, "pullRequest": number, "headSha": hostile}),
            Some(&secret),
        )
        .await;
        assert_eq!(status, 400, "{hostile:?}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("headSha ") && error.contains("is not a commit id"),
            "{hostile:?}: {body}"
        );
        assert!(!error.contains('\n'), "one line: {error}");
    }
    assert_eq!(
        rest_calls(),
        before,
        "a refused delivery made Bosun call the forge"
    );
    let pending = std::fs::read_dir(workdir.join("journal"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("pending-"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(pending, 0, "a refused delivery was journaled");
    // On GitHub there is no GitLab webhook to reach, whatever the token.
    let body = merge_request_hook(SLUG.into(), number.into(), "open", &head);
    let (status, _) = gitlab_hook(
        &ground,
        &body,
        Some(ground::bosun::GITLAB_WEBHOOK_TOKEN),
        "Merge Request Hook",
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = deliver(
        &ground,
        &json!({"repository": SLUG, "pullRequest": number, "headSha": head}),
        Some(&secret),
    )
    .await;
    assert_eq!(status, 202, "{body}");
}

/// Waits (bounded) until `done` holds.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    wait_until(what, async || done()).await;
}

/// Waits (bounded: 120 s, then the test fails naming `what`) until the condition, which may
/// ask Bosun or the doubles over HTTP, holds; it is asked again every 25 ms.
async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

async fn bosun_jobs(ground: &Ground) -> Value {
    ground::http::client()
        .get(format!("{}/jobs", ground.bosun.as_ref().unwrap().url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn gets(ground: &Ground, path: &str) -> usize {
    ground
        .forge
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .count()
}

fn journaled(ground: &Ground, kind: &str) -> usize {
    let workdir = ground.bosun.as_ref().unwrap().workdir.join("journal");
    std::fs::read_dir(workdir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(kind))
        .count()
}

/// A poison pill: a delivery whose triage takes the process down (here the forge hangs on that
/// pull request and the test SIGKILLs Bosun there, as an OOM kill would) is tried again after
/// every other delivery, quarantined after the second death, handed to a person, and never
/// replayed; the honest delivery beside it is triaged.
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_that_kills_bosun_twice_is_quarantined_and_the_one_beside_it_is_triaged() {
    let mut ground = start(json!({})).await;
    let (poison, poison_head) = pull(&ground, "poison", "check-cases/patch-bump-green/head").await;
    let (honest, honest_head) = pull(&ground, "honest", "check-cases/patch-bump-green/head").await;
    let held = format!("/repos/{SLUG}/pulls/{poison}");
    ground.forge.hold(&held);
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);
    for (number, head) in [(poison, &poison_head), (honest, &honest_head)] {
        let body = json!({"repository": SLUG, "pullRequest": number, "headSha": head});
        let (status, answer) = deliver(&ground, &body, Some(&secret)).await;
        assert_eq!(status, 202, "{answer}");
    }

    // First death: in the poison triage, before the honest one started.
    wait_for("the poison triage reaches the forge", || {
        gets(&ground, &held) == 1
    })
    .await;
    assert_eq!(journaled(&ground, "attempt-"), 1, "the attempt is on disk");
    ground.bosun.as_mut().unwrap().kill().unwrap();
    ground.bosun.as_mut().unwrap().restart().await.unwrap();

    // The restart triages the honest delivery first, then tries the poison one again.
    wait_for("the poison triage is tried again", || {
        gets(&ground, &held) == 2
    })
    .await;
    let (state, description) = bosun_status(&ground, "honest");
    assert_eq!(state, "success", "{description}");
    assert!(bosun_comment(&ground, honest).is_some());
    ground.bosun.as_mut().unwrap().kill().unwrap();

    // Second death: quarantined at the next start, told on the pull request.
    ground.forge.release(&held);
    ground.bosun.as_mut().unwrap().restart().await.unwrap();
    wait_for("the hand-off comment", || {
        bosun_comment(&ground, poison).is_some_and(|c| c.contains("quarantined"))
            && ground
                .forge
                .labels(SLUG, poison)
                .contains(&"needs-human".into())
    })
    .await;
    ground.settle().await.unwrap();
    let jobs = bosun_jobs(&ground).await;
    assert_eq!(
        jobs["quarantined"],
        json!([{"repository": SLUG, "pullRequest": poison, "head": poison_head}]),
        "{jobs}"
    );
    assert_eq!(gets(&ground, &held), 2, "not replayed after the quarantine");
    assert_eq!(journaled(&ground, "pending-"), 0);
    assert_eq!(journaled(&ground, "attempt-"), 0);
    assert_eq!(journaled(&ground, "quarantined-"), 1);
    let comment = bosun_comment(&ground, poison).unwrap();
    assert!(comment.contains("journal/quarantined-"), "{comment}");

    // Nor at any later start, nor when delivered again.
    ground.forge.clear_requests();
    ground.bosun.as_mut().unwrap().kill().unwrap();
    ground.bosun.as_mut().unwrap().restart().await.unwrap();
    ground.settle().await.unwrap();
    let body = json!({"repository": SLUG, "pullRequest": poison, "headSha": poison_head});
    let (status, answer) = deliver(&ground, &body, Some(&secret)).await;
    assert_eq!(
        (status, &answer["status"]),
        (409, &json!("quarantined")),
        "{answer}"
    );
    ground.settle().await.unwrap();
    assert_eq!(
        gets(&ground, &held),
        0,
        "a quarantined delivery is not triaged"
    );
    let comments = ground.forge.comments(SLUG, poison);
    assert_eq!(
        comments
            .iter()
            .filter(|(_, b)| b.starts_with("<!-- bosun:triage v1 -->"))
            .count(),
        1,
        "told once"
    );
}

/// Opens a green pull request from `branch`, has the forge hold every read of it, and
/// delivers it to Bosun (accepted): its number and the held path.
async fn deliver_held(ground: &Ground, branch: &str) -> (u64, String) {
    let (number, head) = pull(ground, branch, "check-cases/patch-bump-green/head").await;
    let held = format!("/repos/{SLUG}/pulls/{number}");
    ground.forge.hold(&held);
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);
    let body = json!({"repository": SLUG, "pullRequest": number, "headSha": head});
    let (status, answer) = deliver(ground, &body, Some(&secret)).await;
    assert_eq!(status, 202, "{answer}");
    (number, held)
}

/// A pull request quarantined before any triage of it ended is still followed: the hand-off
/// says a new commit releases it, and a person's push (no delivery: only the poller sees it)
/// is triaged.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_commit_releases_a_quarantined_pull_request_without_a_delivery() {
    let mut ground = start_polling(json!({}), 1).await;
    let (poison, held) = deliver_held(&ground, "poison").await;
    for deaths in 1..=2 {
        wait_for("the triage reaches the forge", || {
            gets(&ground, &held) == deaths
        })
        .await;
        ground.bosun.as_mut().unwrap().kill().unwrap();
        if deaths == 2 {
            ground.forge.release(&held);
        }
        ground.bosun.as_mut().unwrap().restart().await.unwrap();
    }
    wait_for("the hand-off comment", || {
        bosun_comment(&ground, poison).is_some_and(|c| c.contains("or push a new commit"))
    })
    .await;
    let pushed = ground
        .commit_overlay(
            "poison",
            "poison",
            &case("bosun-cases/person-push"),
            "a fix",
        )
        .unwrap();
    wait_for("Bosun to judge the pushed head", || {
        ground
            .forge
            .statuses(SLUG, &pushed)
            .iter()
            .any(|(c, s, _)| c == "bosun" && s == "success")
    })
    .await;
    let jobs = bosun_jobs(&ground).await;
    assert_eq!(jobs["quarantined"], json!([]), "{jobs}");
}

/// The poller leaves a pull request alone while its triage is queued or running (the triage
/// reads it itself): here the forge holds the triage's read of the pull request while the
/// poller, every second, runs three times; the forge is asked once, then the triage ends.
#[tokio::test(flavor = "multi_thread")]
async fn the_poller_does_not_ask_about_a_pull_request_being_triaged() {
    let mut ground = start_polling(json!({}), 1).await;
    let (_, held) = deliver_held(&ground, "polled").await;
    wait_for("the triage reaches the forge", || gets(&ground, &held) == 1).await;
    let polls = bosun_jobs(&ground).await["polls"].as_u64().unwrap();
    // A poll that asked would wait on the held read too: it would never count.
    wait_until("three more polls, or a second read", async || {
        gets(&ground, &held) > 1
            || bosun_jobs(&ground).await["polls"].as_u64().unwrap() >= polls + 3
    })
    .await;
    assert_eq!(
        gets(&ground, &held),
        1,
        "only the triage read the pull request"
    );
    ground.forge.release(&held);
    ground.settle().await.unwrap();
    let (state, description) = bosun_status(&ground, "polled");
    assert_eq!(state, "success", "{description}");
}

/// A delivery for a pull request the forge does not have is dropped at the forge's first 404:
/// no retries, not followed by the poller; one for a repository no longer in bosun.yaml
/// (journaled by an earlier configuration) is dropped without asking the forge at all.
#[tokio::test(flavor = "multi_thread")]
async fn deliveries_for_missing_pull_requests_and_unknown_repositories_are_dropped() {
    let mut ground = start_polling(json!({}), 1).await;
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);
    let missing = 4040;
    let body = json!({"repository": SLUG, "pullRequest": missing, "headSha": "0".repeat(40)});
    let (status, answer) = deliver(&ground, &body, Some(&secret)).await;
    assert_eq!(status, 202, "{answer}");
    // Without a head the intake asks the forge, and a 404 is not accepted.
    let body = json!({"repository": SLUG, "pullRequest": missing + 1});
    let (status, answer) = deliver(&ground, &body, Some(&secret)).await;
    assert_eq!(status, 404, "{answer}");
    ground.settle().await.unwrap();
    let polls = bosun_jobs(&ground).await["polls"].as_u64().unwrap();
    wait_until("three more polls", async || {
        bosun_jobs(&ground).await["polls"].as_u64().unwrap() >= polls + 3
    })
    .await;
    let path = format!("/repos/{SLUG}/pulls/{missing}");
    assert_eq!(gets(&ground, &path), 1, "one look-up: the 404 is definite");
    let jobs = bosun_jobs(&ground).await;
    assert_eq!(jobs["tracked"], json!(0), "{jobs}");
    assert_eq!(jobs["done"][0]["path"], json!("dropped"), "{jobs}");
    assert_eq!(journaled(&ground, "pending-"), 0);
    assert_eq!(journaled(&ground, "tracked-"), 0);

    // A repository an earlier bosun.yaml had.
    let workdir = ground.bosun.as_ref().unwrap().workdir.join("journal");
    use gitops_loop::bosun::journal::{Entry, Journal, Kind};
    Journal::open(&workdir)
        .unwrap()
        .put(
            Kind::Pending,
            &Entry {
                repository: "elsewhere/gitops".into(),
                pull_request: 1,
                head: "abc".into(),
                ..Entry::default()
            },
        )
        .unwrap();
    ground.forge.clear_requests();
    ground.bosun.as_mut().unwrap().kill().unwrap();
    ground.bosun.as_mut().unwrap().restart().await.unwrap();
    ground.settle().await.unwrap();
    assert!(
        !ground
            .forge
            .requests()
            .iter()
            .any(|r| r.path.contains("elsewhere")),
        "no forge look-up for a repository Bosun does not serve"
    );
    assert_eq!(journaled(&ground, "pending-"), 0);
    assert_eq!(journaled(&ground, "tracked-"), 0);
}

/// Out of file descriptors, the accept loop pauses (growing to a cap) instead of spinning, and
/// logs the error once for the burst: Bosun's RLIMIT_NOFILE is lowered under it with
/// `prlimit` while connections wait in the backlog, then restored.
#[tokio::test(flavor = "multi_thread")]
async fn accept_errors_back_off_and_are_logged_once_per_burst() {
    let ground = start(json!({})).await;
    let bosun = ground.bosun.as_ref().unwrap();
    let pid = bosun.pid().to_string();
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let prlimit = |soft: &str| {
        let status = std::process::Command::new("prlimit")
            .args(["--pid", &pid, &format!("--nofile={soft}:")])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .to_string();
    prlimit(&(open + 1).to_string());
    let address = bosun.url.trim_start_matches("http://").to_string();
    let mut waiting = Vec::new();
    for _ in 0..20 {
        waiting.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    let log = bosun.log.clone();
    let accept_errors = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("accept: "))
            .count()
    };
    wait_for("the accept error", || accept_errors() > 0).await;
    prlimit(&soft);
    drop(waiting);
    wait_for("accept works again", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("accept works again")
    })
    .await;
    assert_eq!(accept_errors(), 1, "one line for the burst");
    let healthy = reqwest::get(format!("{}/healthz", bosun.url))
        .await
        .unwrap();
    assert!(healthy.status().is_success());
}

/// A pull request buried in comments (far more than Bosun's comment budget): the gate's
/// report and Bosun's comment are still found and written once each, and the comment bytes
/// the forge serves stay within a few budgets rather than the flood times every reader.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_buried_in_comments_is_triaged_with_bounded_reads() {
    use gitops_loop::forge::COMMENT_READ_BUDGET;
    let mut ground = start(json!({})).await;
    let (number, _) = pull(&ground, "buried", "check-cases/patch-bump-green/head").await;
    let large = "y".repeat(60_000);
    for _ in 0..200 {
        ground.forge.add_comment(SLUG, number, "alice", &large);
    }
    let flood = 200 * large.len();
    let before = ground.forge.comment_bytes_served();
    intake(&ground, number).await;
    ground.settle().await.unwrap();
    let (state, description) = bosun_status(&ground, "buried");
    assert_eq!(state, "success", "{description}");
    assert!(bosun_comment(&ground, number).is_some());
    let served = ground.forge.comment_bytes_served() - before;
    let readers = ground
        .forge
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/{number}/comments")))
        .count();
    // Each walk reads at most the budget and one page of 50.
    let bound = 4 * (COMMENT_READ_BUDGET + 50 * large.len());
    assert!(
        served <= bound,
        "{served} bytes served (flood {flood}, bound {bound})"
    );
    assert!(
        served < flood,
        "{served} bytes served: less than the flood once"
    );
    assert!(readers > 0);
    // Once each, and found again at the next head: a second triage updates them in place.
    let reports = |ground: &Ground| {
        ground
            .forge
            .comments(SLUG, number)
            .iter()
            .filter(|(_, b)| b.starts_with(gitops_loop::gate::report::MARKER))
            .count()
    };
    assert_eq!(reports(&ground), 1);
}

/// Bosun never pushes to the default or the base branch: a pull request proposing main itself
/// into a release branch, blocked on versions the swap would repair, is handed to a person,
/// and main does not move.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_request_from_the_default_branch_is_handed_off_and_main_never_moves() {
    let ground = start(json!({})).await;
    let bare = ground.forge.bare_path(SLUG).unwrap();
    ground::git::git(&bare, &["branch", "release", "main"]).unwrap();
    let head = ground
        .commit_overlay(
            "main",
            "main",
            &case("check-cases/es-major-bump/head"),
            "bump on main",
        )
        .unwrap();
    let number = ground
        .open_pull_into("main", "release", "main into release", "alice")
        .await
        .unwrap();
    intake(&ground, number).await;
    wait_for("the hand-off", || {
        bosun_comment(&ground, number)
            .is_some_and(|c| c.contains("never pushes to the default or the base branch"))
    })
    .await;
    let main = ground::git::git(&bare, &["rev-parse", "main"]).unwrap();
    assert_eq!(main.trim(), head.trim(), "Bosun moved main");
    assert!(
        !ground
            .forge
            .requests()
            .iter()
            .any(|r| r.method == "POST" && r.body.to_string().contains("bosun/attempt-")),
        "an attempt was counted for a repair that must never be pushed"
    );
}

/// A failed push leaves the branch untouched: the pull request's branch moves (a person pushes)
/// after Bosun planned its repair and before its push; the push is never forced, so it is
/// refused, the person's commit stays the branch's head and no commit of Bosun's is on it.
#[tokio::test(flavor = "multi_thread")]
async fn a_push_refused_because_the_branch_moved_leaves_the_branch_as_the_person_left_it() {
    let ground = start(json!({})).await;
    let (number, _) = pull(&ground, "moved", "check-cases/es-major-bump/head").await;
    // Bosun counts the attempt (a label) just before it pushes: held there, the branch moves.
    let labels = format!("/repos/{SLUG}/issues/{number}/labels");
    ground.forge.hold(&labels);
    intake(&ground, number).await;
    wait_for("the attempt label, just before the push", || {
        ground.forge.requests().iter().any(|r| {
            r.method == "POST" && r.path == labels && r.body.to_string().contains("bosun/attempt-1")
        })
    })
    .await;
    let person = ground
        .commit_overlay(
            "moved",
            "moved",
            &case("check-cases/patch-bump-green/head"),
            "a person's push",
        )
        .unwrap();
    ground.forge.release(&labels);
    let bare = ground.forge.bare_path(SLUG).unwrap();
    wait_until("the triage ends", async || {
        !ground.bosun.as_ref().unwrap().busy().await
    })
    .await;
    let tip = ground::git::git(&bare, &["rev-parse", "moved"]).unwrap();
    assert_eq!(tip.trim(), person.trim(), "the branch is not the person's");
    assert!(
        !authors(&ground, "moved")
            .iter()
            .any(|a| a.contains("bosun")),
        "{:?}",
        authors(&ground, "moved")
    );
}

/// GitLab's merge request webhook as GitLab sends it (doc/user/project/integrations/
/// webhook_events.md, "Merge request events"), trimmed to what Bosun reads and a little more.
fn merge_request_hook(project: Value, iid: Value, action: &str, head: &str) -> Value {
    json!({
        "object_kind": "merge_request",
        "event_type": "merge_request",
        "user": {"id": 2, "username": "alice"},
        "project": {"id": 1, "path_with_namespace": project},
        "object_attributes": {
            "iid": iid, "action": action, "state": "opened",
            "source_branch": "green", "target_branch": "main",
            "last_commit": {"id": head},
        },
        "labels": [],
    })
}

async fn gitlab_hook(
    ground: &Ground,
    body: &Value,
    token: Option<&str>,
    event: &str,
) -> (u16, Value) {
    let url = format!("{}/webhooks/gitlab", ground.bosun.as_ref().unwrap().url);
    let mut request = reqwest::Client::new()
        .post(url)
        .header("X-Gitlab-Event", event)
        .body(body.to_string());
    if let Some(token) = token {
        request = request.header("X-Gitlab-Token", token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Issue 31, the attack: GitLab's webhook with a missing or forged `X-Gitlab-Token` (the
/// intake's own secret included), or with the right token and a hostile project path, iid,
/// head or shape, against the real `bosun serve` on GitLab's face: refused, and nothing is
/// triaged (no forge call by Bosun, nothing journaled, no comment, no label, no push). Then a
/// merge request opened by hand is taken by the honest webhook and triaged.
#[tokio::test(flavor = "multi_thread")]
async fn a_gitlab_webhook_with_a_forged_token_or_a_hostile_body_triages_nothing() {
    let ground = start_on(json!({}), 0, ground::scenario::Face::Gitlab).await;
    let (number, head) = pull(&ground, "green", "check-cases/patch-bump-green/head").await;
    let token = ground::bosun::GITLAB_WEBHOOK_TOKEN;
    let hook = "Merge Request Hook";
    let by_bosun = || {
        ground
            .forge
            .requests()
            .iter()
            .filter(|r| r.user.as_deref() == Some("bosun[bot]"))
            .count()
    };
    let before = by_bosun();
    let honest = merge_request_hook(SLUG.into(), number.into(), "open", &head);

    let forged = [
        None,
        Some(String::new()),
        Some(format!("{token}x")),
        Some(token[..token.len() - 1].to_string()),
        Some(token.to_uppercase()),
        Some(ground::bosun::WEBHOOK_SECRET.to_string()),
        Some(format!("Bearer {token}")),
    ];
    for forged in &forged {
        let (status, body) = gitlab_hook(&ground, &honest, forged.as_deref(), hook).await;
        assert_eq!(status, 401, "{forged:?}: {body}");
    }
    // The intake's bearer secret does not open GitLab's route.
    let url = format!("{}/webhooks/gitlab", ground.bosun.as_ref().unwrap().url);
    let response = reqwest::Client::new()
        .post(url)
        .header("X-Gitlab-Event", hook)
        .header(
            "Authorization",
            format!("Bearer {}", ground::bosun::WEBHOOK_SECRET),
        )
        .body(honest.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);

    // The right token, a hostile body.
    for project in [
        json!("../gitops"),
        json!("platform/gitops/../../etc"),
        json!("platform%2Fgitops"),
        json!("platform/gitops?private_token=x"),
        json!("platform/gitops\nX"),
        json!("platform/-gitops"),
        json!("platform/gitops.git"),
    ] {
        // Not a project path GitLab gives today, so no repository of bosun.yaml: answered as
        // another project of a group hook (200, ignored), never triaged.
        let body = merge_request_hook(project.clone(), number.into(), "open", &head);
        let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
        assert_eq!(status, 200, "{project}: {answer}");
        assert!(
            answer
                .to_string()
                .contains("not a repository of bosun.yaml"),
            "{project}: {answer}"
        );
    }
    for project in [json!(["platform/gitops"]), json!(1)] {
        let body = merge_request_hook(project.clone(), number.into(), "open", &head);
        let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
        assert_eq!(status, 400, "{project}: {answer}");
    }
    for iid in [
        json!(number.to_string()),
        json!(-1),
        json!(0),
        json!(1.5),
        json!(1e300),
        json!(format!("{number}; rm -rf /")),
    ] {
        let body = merge_request_hook(SLUG.into(), iid.clone(), "open", &head);
        let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
        assert_eq!(status, 400, "{iid}: {answer}");
    }
    for bad_head in ["--upload-pack=touch /tmp/bosun-canary", "main", &head[..12]] {
        let body = merge_request_hook(SLUG.into(), number.into(), "open", bad_head);
        let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
        assert_eq!(status, 400, "{bad_head}: {answer}");
    }
    // No X-Gitlab-Event (GitLab always names the event): not GitLab's, 400.
    let url = format!("{}/webhooks/gitlab", ground.bosun.as_ref().unwrap().url);
    let response = reqwest::Client::new()
        .post(url)
        .header("X-Gitlab-Token", token)
        .body(honest.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let answer: Value = response.json().await.unwrap();
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("X-Gitlab-Event is missing"),
        "{answer}"
    );
    // Not Bosun's: another project (a group's hook sends every project's events, a
    // subgroup's too), another event or action: 200, ignored, so that GitLab, which
    // disables a hook after four failures in a row, keeps the hook.
    for project in ["elsewhere/gitops", "platform/sub/gitops"] {
        let other = merge_request_hook(project.into(), number.into(), "open", &head);
        let (status, answer) = gitlab_hook(&ground, &other, Some(token), hook).await;
        assert_eq!(
            (status, answer["status"].clone()),
            (200, json!("ignored")),
            "{project}: {answer}"
        );
        assert!(
            answer["reason"]
                .as_str()
                .unwrap()
                .contains("not a repository of bosun.yaml"),
            "{answer}"
        );
    }
    let (status, answer) = gitlab_hook(&ground, &honest, Some(token), "Push Hook").await;
    assert_eq!((status, answer["status"].clone()), (200, json!("ignored")));
    for action in ["close", "merge", "approved"] {
        let body = merge_request_hook(SLUG.into(), number.into(), action, &head);
        let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
        assert_eq!(
            (status, answer["status"].clone()),
            (200, json!("ignored")),
            "{action}"
        );
    }

    // Nothing was triaged.
    assert_eq!(
        by_bosun(),
        before,
        "a refused delivery made Bosun call the forge"
    );
    assert_eq!(journaled(&ground, "pending-"), 0);
    let jobs = bosun_jobs(&ground).await;
    assert_eq!(jobs["tracked"], json!(0), "{jobs}");
    assert!(bosun_comment(&ground, number).is_none());
    assert!(ground.forge.labels(SLUG, number).is_empty());
    assert_eq!(authors(&ground, "green"), ["Proving Ground"]);

    // The honest webhook of the merge request opened by hand: taken, and triaged.
    let (status, answer) = gitlab_hook(&ground, &honest, Some(token), hook).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["headSha"], json!(head));
    wait_for("Bosun's comment on the merge request", || {
        bosun_comment(&ground, number).is_some()
    })
    .await;
    let (status, _) = gitlab_hook(&ground, &honest, Some(token), hook).await;
    assert_eq!(status, 200, "the same head again is a duplicate");
    // GitLab finds projects by path ignoring case, and a payload spells the path as the
    // project was named: the same merge request under another case is the same delivery,
    // queued under bosun.yaml's spelling.
    let shouted = merge_request_hook(SLUG.to_uppercase().into(), number.into(), "open", &head);
    let (status, answer) = gitlab_hook(&ground, &shouted, Some(token), hook).await;
    assert_eq!(
        (
            status,
            answer["status"].clone(),
            answer["repository"].clone()
        ),
        (200, json!("duplicate"), json!(SLUG)),
        "{answer}"
    );
}

/// Issue 31, `gateAuthor` on GitLab: the gate runs as a GitLab CI job under a shared identity
/// and publishes its note and `addons-gate` status through `/api/v4`. A newer note under that
/// identity claiming green for a blocked head is not the verdict: the status CI set names the
/// digest of the real report in its description, so Bosun waits and pushes nothing. The
/// honest verdict is read and acted on (Bosun publishes no report of its own).
#[tokio::test(flavor = "multi_thread")]
async fn on_gitlab_a_forged_report_under_the_gates_shared_identity_is_not_the_verdict() {
    let mut ground = start_on(
        json!({"forge": {"gateAuthor": "addons-gate[bot]"}}),
        0,
        ground::scenario::Face::Gitlab,
    )
    .await;
    ground.ci.enabled = true;
    let (forged, _) = pull(&ground, "forged", "check-cases/es-major-bump/head").await;
    ground.settle().await.unwrap();
    let real = ground
        .forge
        .comments(SLUG, forged)
        .into_iter()
        .find(|(author, body)| {
            author == "addons-gate[bot]" && body.starts_with(gitops_loop::gate::report::MARKER)
        })
        .map(|(_, body)| body)
        .expect("CI's report note");
    let start = real.find("\"blocking\":{").unwrap();
    let end = start + real[start..].find('}').unwrap() + 1;
    let fake = format!("{}\"blocking\":{{}}{}", &real[..start], &real[end..])
        .replace("\"outcome\":\"blocked\"", "\"outcome\":\"green\"");
    ground
        .exemptions
        .forged_reports
        .push((forged, "addons-gate[bot]".to_string()));
    let ci = gitops_loop::forge::gitlab::GitLab::new(
        &format!("{}/api/v4", ground.forge.url()),
        ground::FORGE_GATE_TOKEN,
    )
    .unwrap();
    gitops_loop::forge::Forge::create_comment(&ci, &SLUG.parse().unwrap(), forged, &fake)
        .await
        .unwrap();
    intake(&ground, forged).await;
    ground.settle().await.unwrap();
    assert_eq!(authors(&ground, "forged"), ["Proving Ground"]);
    let (_, description) = bosun_status(&ground, "forged");
    assert!(description.starts_with("waiting"), "{description}");
    assert!(
        !ground
            .forge
            .labels(SLUG, forged)
            .contains(&"worth-a-look".to_string())
    );
    // The honest verdict on a green head is read and acted on, and Bosun published no report.
    let (green, _) = pull(&ground, "green", "check-cases/patch-bump-green/head").await;
    ground.settle().await.unwrap();
    intake(&ground, green).await;
    ground.settle().await.unwrap();
    let (state, description) = bosun_status(&ground, "green");
    assert_eq!(state, "success", "{description}");
    assert!(description.contains("is green"), "{description}");
    for number in [forged, green] {
        assert!(
            ground
                .forge
                .comments(SLUG, number)
                .iter()
                .all(|(author, body)| author != "bosun[bot]"
                    || !body.starts_with(gitops_loop::gate::report::MARKER)),
            "Bosun published a report of its own"
        );
    }
}

/// Subgroups on GitLab: bosun.yaml lists a project in a subgroup (`platform/team/gitops`), and
/// its merge requests are triaged end to end on GitLab's face. GitLab's webhook names the
/// project by `path_with_namespace` (in any case: queued under bosun.yaml's spelling), Kargo's
/// hook by its whole path; Bosun reads and writes it only through
/// `/api/v4/projects/platform%2Fteam%2Fgitops/...`, clones it and pushes the swap at its full
/// path over HTTPS (`oauth2`, the token from the credential helper), in a checkout folder of
/// its own. A path that climbs or names the parent group's project is refused.
#[tokio::test(flavor = "multi_thread")]
async fn on_gitlab_a_project_in_a_subgroup_is_triaged_and_repaired_at_its_whole_path() {
    const PROJECT: &str = "platform/team/gitops";
    const ENCODED: &str = "platform%2Fteam%2Fgitops";
    let mut ground = start_scenario(json!({}), 0, ground::scenario::Face::Gitlab, |scenario| {
        scenario.repository.slug = PROJECT.into();
    })
    .await;
    let bare = ground.forge.bare_path(PROJECT).unwrap();
    assert!(
        bare.ends_with("platform/team/gitops.git"),
        "{}",
        bare.display()
    );
    let (swap, _) = pull(&ground, "swap", "check-cases/es-major-bump/head").await;
    let (green, green_head) = pull(&ground, "green", "check-cases/patch-bump-green/head").await;
    let hook = "Merge Request Hook";
    let token = ground::bosun::GITLAB_WEBHOOK_TOKEN;
    let secret = format!("Bearer {}", ground::bosun::WEBHOOK_SECRET);

    // Refused first: a path that climbs out (400 from the intake, ignored by the webhook), the
    // parent group's project (422 from the intake, ignored by the webhook), and nothing
    // reached the forge for them.
    let by_bosun = || {
        ground
            .forge
            .requests()
            .iter()
            .filter(|r| r.user.as_deref() == Some("bosun[bot]"))
            .count()
    };
    let before = by_bosun();
    for climbing in [
        "platform/team/../team/gitops",
        "platform//team/gitops",
        "platform/%2e%2e/gitops",
    ] {
        let (status, answer) = deliver(
            &ground,
            &json!({"repository": climbing, "pullRequest": swap}),
            Some(&secret),
        )
        .await;
        assert_eq!(status, 400, "{climbing}: {answer}");
        // The webhook answers it as another project's (a group hook's), never as a failure.
        let body = merge_request_hook(climbing.into(), swap.into(), "open", &green_head);
        let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
        assert_eq!(
            (status, answer["status"].clone()),
            (200, json!("ignored")),
            "{climbing}: {answer}"
        );
    }
    let (status, _) = deliver(
        &ground,
        &json!({"repository": "platform/team", "pullRequest": swap}),
        Some(&secret),
    )
    .await;
    assert_eq!(status, 422);
    let body = merge_request_hook("platform/gitops".into(), swap.into(), "open", &green_head);
    let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
    assert_eq!((status, answer["status"].clone()), (200, json!("ignored")));
    assert_eq!(
        by_bosun(),
        before,
        "a refused delivery made Bosun call the forge"
    );

    // A merge request opened by hand, from GitLab's webhook, its path in another case.
    let body = merge_request_hook(
        "Platform/Team/GitOps".into(),
        green.into(),
        "open",
        &green_head,
    );
    let (status, answer) = gitlab_hook(&ground, &body, Some(token), hook).await;
    assert_eq!(
        (status, answer["repository"].clone()),
        (202, json!(PROJECT)),
        "{answer}"
    );
    // Kargo's hook: the project's whole path (charts/kargo-pipelines with provider gitlab).
    let (status, answer) = deliver(
        &ground,
        &json!({"repository": PROJECT, "pullRequest": swap}),
        Some(&secret),
    )
    .await;
    assert_eq!(status, 202, "{answer}");
    ground.settle().await.unwrap();

    let comment = |number: u64| {
        ground
            .forge
            .comments(PROJECT, number)
            .into_iter()
            .find(|(author, body)| {
                author == "bosun[bot]" && body.starts_with("<!-- bosun:triage v1 -->")
            })
            .map(|(_, body)| body)
    };
    let status_of = |branch: &str| {
        let head = ground::git::git(&bare, &["rev-parse", branch]).unwrap();
        ground
            .forge
            .statuses(PROJECT, &head)
            .into_iter()
            .rev()
            .find(|(context, _, _)| context == "bosun")
            .map(|(_, state, description)| (state, description))
            .unwrap_or_default()
    };
    let authors = |branch: &str| {
        ground::git::git(&bare, &["log", "--format=%an", &format!("main..{branch}")])
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Green: explained.
    assert!(
        comment(green).is_some_and(|c| c.contains("**The gate is green.**")),
        "{:?}",
        comment(green)
    );
    assert_eq!(status_of("green").0, "success");
    // The major bump: the gate's report blocked it, Bosun swapped and pushed, the gate is green
    // on the repair.
    assert_eq!(authors("swap"), ["bosun", "Proving Ground"]);
    assert!(comment(swap).is_some());
    assert_eq!(status_of("swap").0, "success", "{:?}", status_of("swap"));

    // Every call Bosun made: GitLab's API under the project's encoded path (or `/user`), and
    // git at the project's full path, the push with Bosun's token.
    let requests = ground.forge.requests();
    let bosun: Vec<_> = requests
        .iter()
        .filter(|r| r.user.as_deref() == Some("bosun[bot]"))
        .collect();
    let elsewhere: Vec<String> = bosun
        .iter()
        .filter(|r| {
            r.path != "/api/v4/user"
                && !r.path.starts_with(&format!("/api/v4/projects/{ENCODED}/"))
                && !r.path.starts_with(&format!("/{PROJECT}.git/"))
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(elsewhere.is_empty(), "{elsewhere:?}");
    for kind in ["notes", "statuses/", "labels"] {
        assert!(
            bosun.iter().any(|r| r.path.contains(kind)),
            "no {kind} request: {:?}",
            bosun.iter().map(|r| &r.path).collect::<Vec<_>>()
        );
    }
    assert!(
        bosun
            .iter()
            .any(|r| r.path == format!("/{PROJECT}.git/git-receive-pack")),
        "Bosun pushed at the project's full path"
    );
    let checkouts = ground.bosun.as_ref().unwrap().workdir.join("checkouts");
    assert!(checkouts.join("platform%2Fteam/gitops/.git").is_dir());
    assert!(!checkouts.join("platform/team").exists());

    // Kargo's provider lowercases the URL it names the project by: the intake takes the path
    // in any case too, as the same delivery under bosun.yaml's spelling.
    let (status, answer) = deliver(
        &ground,
        &json!({"repository": "PLATFORM/Team/gitops", "pullRequest": swap}),
        Some(&secret),
    )
    .await;
    assert_eq!(
        (
            status,
            answer["status"].clone(),
            answer["repository"].clone()
        ),
        (200, json!("duplicate"), json!(PROJECT)),
        "{answer}"
    );
    // A person's comment in a scenario is a note on the subgroup's merge request.
    let body = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(body.path(), "Looks good to me.").unwrap();
    ground
        .act(&Action::Comment(ground::scenario::CommentSpec {
            pr: green,
            by: "alice".into(),
            body_file: body.path().display().to_string(),
        }))
        .await
        .unwrap();
    assert!(
        ground
            .forge
            .comments(PROJECT, green)
            .contains(&("alice".to_string(), "Looks good to me.".to_string()))
    );
}
