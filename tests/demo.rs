//! `cargo xtask demo`'s scenarios, played in-process on the ground with the real gate binary;
//! the transcripts are snapshots. Nothing needs redacting: git commits use fixed dates and the
//! ground's Promotion ULIDs come from a fixed clock, so a run repeats byte for byte.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use ground::kube::FaultPlan;
use ground::scenario::Scenario;
use ground::{Ground, Options};

pub async fn play(name: &str) -> Ground {
    let root = common::project_root();
    let scenario = Scenario::load(&root.join("scenarios").join(name)).unwrap();
    let options = Options {
        gate: env!("CARGO_BIN_EXE_gate").into(),
        tools: root.join("target/tools"),
        crds: root.join("kind/crds"),
        faults: FaultPlan::none(),
        echo: false,
    };
    let mut ground = Ground::start(scenario, options).await.unwrap();
    if let Err(e) = ground.play().await {
        panic!("{e:#}\n--- transcript\n{}", ground.transcript.text());
    }
    ground
}

#[tokio::test(flavor = "multi_thread")]
async fn happy_path() {
    let ground = play("happy-path").await;
    insta::assert_snapshot!(ground.transcript.text());
    // The pull request changed exactly the one pinned line.
    let bare = ground.forge.bare_path("platform/gitops").unwrap();
    let diff = ground::git::git(&bare, &["diff", "main~1", "main", "--", "."]).unwrap();
    let changed: Vec<&str> = diff
        .lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
        })
        .collect();
    assert_eq!(changed, vec!["-  version: 1.19.2", "+  version: 1.19.3"]);
}
