//! Sharded checks: every shard's partial (through its JSON form) merged is exactly the
//! verdict and report of one unsharded check, for the check cases and for generated fleets
//! (helm-rendered parents, Applications that move between parents, CRD versions served on one
//! Application and used by others), for any number of shards; the merge refuses partials that
//! are not every shard of one check; the binary's `check --shard` + `merge` equals `check`.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::Path;
use std::process::Command;

use gitops_loop::gate::shard::{self, Partial};
use gitops_loop::gate::verdict::GateResult;
use gitops_loop::gate::{check, report};
use gitops_loop::render::{self, RenderConfig, Shard, cache::RenderCache};
use proptest::prelude::*;

fn config(repo: &std::path::Path, cache: &std::path::Path) -> RenderConfig {
    common::sample_render_config(repo, cache)
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.test"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A shared render cache for the whole test binary: the cases render the same charts.
fn cache() -> &'static Path {
    static CACHE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

/// Every shard's partial, each through its JSON form, merged.
fn sharded(
    config: &RenderConfig,
    base: &str,
    head: &str,
    count: usize,
) -> Result<GateResult, shard::MergeError> {
    let parts: Vec<Partial> = (0..count)
        .map(|index| {
            let partial = shard::check_shard(
                config,
                base.to_string(),
                head.to_string(),
                Shard { index, count },
            );
            serde_json::from_slice(&serde_json::to_vec(&partial).unwrap()).unwrap()
        })
        .collect();
    shard::merge(parts, &config.repo_dir)
}

fn assert_same(unsharded: &GateResult, merged: &GateResult) {
    assert_eq!(
        serde_json::to_value(unsharded).unwrap(),
        serde_json::to_value(merged).unwrap(),
        "the merged verdict differs from the unsharded one"
    );
    assert_eq!(report::render(unsharded), report::render(merged));
}

/// The sample repository with a check case's `base/` on main and `head/` on `pr`.
fn case_repo(case: &str) -> (common::TestRepo, String, String) {
    let dir = common::project_root().join("tests/check-cases").join(case);
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    if dir.join("base").is_dir() {
        repo.commit_overlay(&dir.join("base"), "main", "base change");
    }
    let base = repo.head();
    let head = repo.commit_overlay(&dir.join("head"), "pr", "the pull request");
    (repo, base, head)
}

const CLUSTERS: [&str; 3] = ["prod-eu", "prod-us", "staging"];
const VERSIONS: [&str; 3] = ["v1alpha1", "v1beta1", "v1"];

/// One Application of a generated fleet at one commit.
#[derive(Debug, Clone)]
struct FleetApp {
    cluster: usize,
    /// The Widget version its manifests use.
    version: usize,
    /// Rendered by the helm parent (else declared in a file).
    under_parent: bool,
    /// Rendered by the repository's helm chart (else plain manifests).
    helm: Option<u8>,
}

/// A generated fleet at one commit: Applications by index, the Widget CRD's served versions.
#[derive(Debug, Clone)]
struct Fleet {
    apps: Vec<Option<FleetApp>>,
    served: Vec<bool>,
}

fn fleet_strategy() -> impl Strategy<Value = Fleet> {
    let app = (
        0..3usize,
        0..3usize,
        any::<bool>(),
        prop::option::weighted(0.3, 1u8..3),
    )
        .prop_map(|(cluster, version, under_parent, helm)| FleetApp {
            cluster,
            version,
            under_parent,
            helm,
        });
    (
        prop::collection::vec(prop::option::weighted(0.8, app), 10),
        prop::collection::vec(any::<bool>(), 3),
    )
        .prop_map(|(apps, mut served)| {
            if !served.iter().any(|s| *s) {
                served[2] = true;
            }
            Fleet { apps, served }
        })
}

fn source(app: &FleetApp, name: &str) -> String {
    match app.helm {
        Some(replicas) => format!(
            "repoURL: {}\n    targetRevision: HEAD\n    path: local-charts/ingress-lite\n    helm:\n      valuesObject:\n        replicaCount: {replicas}",
            common::SAMPLE_REPO_URL
        ),
        None => format!(
            "repoURL: {}\n    targetRevision: HEAD\n    path: fleet/apps/{name}",
            common::SAMPLE_REPO_URL
        ),
    }
}

/// Writes a fleet's files (replacing the last commit's) and commits them on the current branch.
fn commit_fleet(repo: &Path, fleet: &Fleet, message: &str) -> String {
    let root = repo.join("fleet");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("roots")).unwrap();
    std::fs::create_dir_all(root.join("parent/templates")).unwrap();
    std::fs::create_dir_all(root.join("crds")).unwrap();
    let served: Vec<&str> = VERSIONS
        .iter()
        .zip(&fleet.served)
        .filter(|(_, s)| **s)
        .map(|(v, _)| *v)
        .collect();
    let versions: String = VERSIONS
        .iter()
        .zip(&fleet.served)
        .map(|(v, s)| {
            format!(
                "    - name: {v}\n      served: {s}\n      storage: {}\n      schema:\n        openAPIV3Schema:\n          type: object\n          x-kubernetes-preserve-unknown-fields: true\n",
                *v == served[0]
            )
        })
        .collect();
    std::fs::write(
        root.join("crds/widgets.yaml"),
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.example.test\nspec:\n  group: example.test\n  scope: Namespaced\n  names:\n    plural: widgets\n    singular: widget\n    kind: Widget\n    listKind: WidgetList\n  versions:\n{versions}"
        ),
    )
    .unwrap();
    let mut children = String::new();
    for (cluster, name) in CLUSTERS.iter().enumerate() {
        std::fs::write(
            root.join(format!("roots/crds-{name}.yaml")),
            format!(
                "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: widget-crds-{cluster}\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: {}\n    targetRevision: HEAD\n    path: fleet/crds\n  destination:\n    name: {name}\n    namespace: widgets\n",
                common::SAMPLE_REPO_URL
            ),
        )
        .unwrap();
    }
    for (index, app) in fleet.apps.iter().enumerate() {
        let Some(app) = app else { continue };
        let name = format!("fleet-{index}");
        let dir = root.join("apps").join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("widget.yaml"),
            format!(
                "apiVersion: example.test/{}\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n  size: {index}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  version: \"{}\"\n",
                VERSIONS[app.version], app.version
            ),
        )
        .unwrap();
        let manifest = format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: {name}\n  namespace: argocd\nspec:\n  project: default\n  source:\n    {}\n  destination:\n    name: {}\n    namespace: widgets\n",
            source(app, &name),
            CLUSTERS[app.cluster]
        );
        if app.under_parent {
            children.push_str("---\n");
            children.push_str(&manifest);
        } else {
            std::fs::write(root.join(format!("roots/{name}.yaml")), manifest).unwrap();
        }
    }
    // The helm parent: a chart of this repository whose render is Applications.
    std::fs::write(
        root.join("parent/Chart.yaml"),
        "apiVersion: v2\nname: fleet-parent\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(root.join("parent/values.yaml"), "enabled: true\n").unwrap();
    std::fs::write(
        root.join("parent/templates/children.yaml"),
        format!("{{{{- if .Values.enabled }}}}\n{children}{{{{- end }}}}\n"),
    )
    .unwrap();
    std::fs::write(
        root.join("roots/parent.yaml"),
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: fleet-parent\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: {}\n    targetRevision: HEAD\n    path: fleet/parent\n  destination:\n    name: in-cluster\n    namespace: argocd\n",
            common::SAMPLE_REPO_URL
        ),
    )
    .unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "--allow-empty", "-m", message]);
    git(repo, &["rev-parse", "HEAD"])
}

fn case_names() -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(common::project_root().join("tests/check-cases"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
    names.sort();
    names
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("GATE_SHARD_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(6),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A generated fleet at both commits, split into 1 to 6 shards.
    #[test]
    fn a_generated_fleet_merges_into_the_unsharded_verdict(
        base in fleet_strategy(),
        head in fleet_strategy(),
        count in 1usize..=6,
    ) {
        let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
        let base_commit = commit_fleet(repo.path(), &base, "fleet at the base");
        git(repo.path(), &["checkout", "-q", "-b", "pr"]);
        let head_commit = commit_fleet(repo.path(), &head, "fleet at the head");
        let config = config(repo.path(), cache());
        let unsharded = check::check_commits(&config, base_commit.clone(), head_commit.clone());
        prop_assert_ne!(unsharded.verdict.outcome, gitops_loop::gate::verdict::Outcome::Undecided, "{:?}", unsharded.verdict.errors);
        let merged = sharded(&config, &base_commit, &head_commit, count).unwrap();
        assert_same(&unsharded, &merged);
    }

    /// A check case (the sample repository and one pull request), split into 1 to 6 shards.
    #[test]
    fn a_check_case_merges_into_the_unsharded_verdict(
        case in prop::sample::select(case_names()),
        count in 1usize..=6,
    ) {
        let (repo, base, head) = case_repo(&case);
        let config = config(repo.path(), cache());
        let unsharded = check::check_commits(&config, base.clone(), head.clone());
        let merged = sharded(&config, &base, &head, count).unwrap();
        assert_same(&unsharded, &merged);
    }
}

#[test]
fn the_merge_refuses_partials_that_are_not_every_shard_of_one_check() {
    let (repo, base, head) = case_repo("kind-not-served");
    let config = config(repo.path(), cache());
    let part = |index: usize, count: usize| -> Partial {
        let partial =
            shard::check_shard(&config, base.clone(), head.clone(), Shard { index, count });
        serde_json::from_slice(&serde_json::to_vec(&partial).unwrap()).unwrap()
    };
    let refusal = |parts: Vec<Partial>| shard::merge(parts, repo.path()).unwrap_err().to_string();
    assert!(refusal(vec![part(0, 3), part(2, 3)]).contains("shard 2/3 is missing"));
    assert!(refusal(vec![part(0, 2), part(1, 2), part(1, 2)]).contains("shard 2/2 is given twice"));
    assert!(refusal(vec![part(0, 2), part(1, 3)]).contains("split the fleet differently"));
    let mut other_commit = part(1, 2);
    other_commit.base = head.clone();
    assert!(refusal(vec![part(0, 2), other_commit]).contains("one pull request's partials only"));
    let mut other_inventory = part(1, 2);
    other_inventory.inventory.clusters.pop();
    other_inventory.inventory_digest = shard::inventory_digest(&other_inventory.inventory);
    assert!(refusal(vec![part(0, 2), other_inventory]).contains("read different inventories"));
    let mut tampered = part(1, 2);
    tampered.inventory.clusters.pop();
    assert!(refusal(vec![part(0, 2), tampered]).contains("read different inventories"));
    assert!(refusal(Vec::new()).contains("no partial results given"));
    for message in [
        refusal(vec![part(0, 3)]),
        refusal(vec![part(0, 2), part(0, 2)]),
    ] {
        assert!(!message.contains('\n'), "one line: {message}");
    }
}

/// The shards deal the head's keys by what their renders cost, read from the chart mirror
/// each is given (a chart's bytes and a process's start): at a shard count where that is not
/// where dealing in turn would put them, each shard holds the head's Applications the
/// weighted stripes give it (some of them elsewhere than in turn), and the merge binds them
/// so. Partials whose costs put an Application in another shard are refused in one line
/// naming it and both shards, before any Application is bound to its shard (it could be held
/// by two shards, or none); a mirror whose charts are each a byte larger weighs alike (bytes
/// are rounded up to 64 KiB), and costs that differ but deal alike merge into the unsharded
/// verdict.
#[test]
fn shards_deal_by_cost_and_partials_that_deal_otherwise_are_refused() {
    let (repo, base, head) = case_repo("kind-not-served");
    let config = config(repo.path(), cache());
    let part = |config: &RenderConfig, index: usize, count: usize| -> Partial {
        let partial =
            shard::check_shard(config, base.clone(), head.clone(), Shard { index, count });
        serde_json::from_slice(&serde_json::to_vec(&partial).unwrap()).unwrap()
    };
    let (head_keys, weights) = render::shard_keys_weighed(&config, &head).unwrap();
    assert!(
        weights.values().any(|&w| w > render::PROCESS_WEIGHT),
        "a mirrored chart weighs its bytes: {weights:?}"
    );
    let count = (2..=6)
        .find(|&count| {
            let (by_cost, in_turn) = (
                render::Stripes::weighted(head_keys.values(), &weights, count),
                render::Stripes::new(head_keys.values(), count),
            );
            head_keys.values().any(|k| by_cost.of(k) != in_turn.of(k))
        })
        .expect("for some count the costs deal otherwise than in turn");
    let stripes = render::Stripes::weighted(head_keys.values(), &weights, count);
    let in_turn = render::Stripes::new(head_keys.values(), count);
    let honest: Vec<Partial> = (0..count).map(|i| part(&config, i, count)).collect();
    let mut elsewhere_than_in_turn = 0;
    for (index, partial) in honest.iter().enumerate() {
        assert_eq!(partial.head_weights, weights);
        for app in &partial.head_applications {
            let id = format!("Application {}/{}", app.namespace, app.name);
            if let Some(key) = head_keys.get(&id) {
                assert_eq!(stripes.of(key), index, "{id} over {count}");
                elsewhere_than_in_turn += usize::from(in_turn.of(key) != index);
            }
        }
    }
    assert!(elsewhere_than_in_turn > 0);
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    let merged = shard::merge(honest, repo.path()).unwrap();
    assert_same(&unsharded, &merged);
    // Another mirror for every shard but the first, each chart a byte larger: a chart's
    // bytes are rounded up to 64 KiB, so the same costs, and the verdict is the unsharded one.
    let mirror = tempfile::tempdir().unwrap();
    common::copy_tree(config.charts.as_deref().unwrap(), mirror.path());
    for chart_yaml in walk_files(mirror.path())
        .into_iter()
        .filter(|p| p.ends_with("Chart.yaml"))
    {
        let mut grown = std::fs::read(&chart_yaml).unwrap();
        grown.push(b'\n');
        std::fs::write(&chart_yaml, grown).unwrap();
    }
    let elsewhere = RenderConfig {
        charts: Some(mirror.path().to_path_buf()),
        ..config.clone()
    };
    let mixed: Vec<Partial> = (0..count)
        .map(|i| part(if i == 0 { &config } else { &elsewhere }, i, count))
        .collect();
    assert!(mixed.iter().all(|p| p.head_weights == weights));
    assert_same(&unsharded, &shard::merge(mixed, repo.path()).unwrap());
    // Other costs that deal alike (every cost doubled in the last partial) merge.
    let mut doubled: Vec<Partial> = (0..count).map(|i| part(&config, i, count)).collect();
    for weight in doubled[count - 1].head_weights.values_mut() {
        *weight *= 2;
    }
    assert_same(&unsharded, &shard::merge(doubled, repo.path()).unwrap());
    // Costs that move an Application: in the last partial, the lightest key of the last
    // shard made the costliest (it goes to the first shard).
    let (_, moved_key) = head_keys
        .iter()
        .filter(|(_, key)| stripes.of(key) == count - 1)
        .min_by_key(|(_, key)| weights[*key])
        .unwrap();
    let mut forged: Vec<Partial> = (0..count).map(|i| part(&config, i, count)).collect();
    forged[count - 1]
        .head_weights
        .insert(moved_key.clone(), u64::MAX / 4);
    let refusal = shard::merge(forged, repo.path()).unwrap_err().to_string();
    // The first Application (by namespace and name) the two dealings place apart is named.
    let forged_weights = std::collections::BTreeMap::from_iter(
        weights
            .iter()
            .map(|(k, &w)| (k.clone(), if k == moved_key { u64::MAX / 4 } else { w })),
    );
    let forged_stripes = render::Stripes::weighted(head_keys.values(), &forged_weights, count);
    let (first_moved, key) = head_keys
        .iter()
        .filter(|(_, key)| stripes.of(key) != forged_stripes.of(key))
        .min_by(|a, b| a.0.cmp(b.0))
        .unwrap();
    let first_moved = first_moved.trim_start_matches("Application ");
    let (from, to) = (stripes.of(key) + 1, forged_stripes.of(key) + 1);
    assert_eq!(
        refusal,
        format!(
            "shard 1/{count} deals Application {first_moved} to shard {from}/{count} and shard {count}/{count} deals it to shard {to}/{count}: their chart or git mirrors give the head's renders other costs (give every shard the same --charts and --git-mirror)"
        )
    );
}

/// A pull request adds an Application naming `..` as its chart and its version, with a chart
/// planted in the folder above the shards' chart mirror (what `..` twice would reach): the
/// shards' cost of its key reads nothing there (a process's start alone, as for a chart the
/// mirror lacks), planning refuses the chart, and the sharded check is the unsharded one:
/// undecided, never green, the chart named.
#[test]
fn a_chart_named_as_a_path_costs_nothing_outside_the_mirror() {
    let (repo, base, _) = case_repo("kind-not-served");
    let root = tempfile::tempdir().unwrap();
    let mirror = root.path().join("mirror");
    common::copy_tree(
        common::sample_render_config(repo.path(), cache())
            .charts
            .as_deref()
            .unwrap(),
        &mirror,
    );
    std::fs::write(
        root.path().join("Chart.yaml"),
        "apiVersion: v2\nname: outside\nversion: 1.0.0\n",
    )
    .unwrap();
    std::fs::write(root.path().join("outside.yaml"), "x".repeat(1 << 20)).unwrap();
    let overlay = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(overlay.path().join("apps")).unwrap();
    std::fs::write(
        overlay.path().join("apps/escape.yaml"),
        "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: escape\n  namespace: argocd\nspec:\n  project: default\n  destination:\n    name: prod-eu\n    namespace: escape\n  source:\n    repoURL: https://charts.example.test\n    chart: \"..\"\n    targetRevision: \"..\"\n",
    )
    .unwrap();
    let head = repo.commit_overlay(overlay.path(), "pr", "a chart named as a path");
    // Joined as the mirror joins a chart, `..` as name and version reaches the planted chart.
    let planted = mirror.join("charts.example.test").join("..").join("..");
    assert_eq!(
        planted.join("Chart.yaml").canonicalize().unwrap(),
        root.path().join("Chart.yaml").canonicalize().unwrap()
    );
    let config = RenderConfig {
        charts: Some(mirror),
        ..config(repo.path(), cache())
    };
    let (head_keys, weights) = render::shard_keys_weighed(&config, &head).unwrap();
    let key = &head_keys["Application argocd/escape"];
    assert_eq!(weights[key], render::PROCESS_WEIGHT, "{weights:?}");
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    assert_ne!(
        unsharded.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Green
    );
    assert!(
        unsharded
            .verdict
            .errors
            .iter()
            .any(|e| e.contains("not a chart name")),
        "{:?}",
        unsharded.verdict.errors
    );
    let merged = sharded(&config, &base, &head, 2).unwrap();
    assert_same(&unsharded, &merged);
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            files.extend(walk_files(&entry.path()));
        } else {
            files.push(entry.path());
        }
    }
    files.sort();
    files
}

/// The binary: `check --shard I/N --partial` per shard, then `merge`, writes the report and
/// the JSON `check` writes, with its exit code; `publish --result` is exercised in
/// tests/github_action.rs' style elsewhere.
#[test]
fn the_binary_merges_shards_into_the_check_report() {
    let (repo, _, _) = case_repo("crd-stored-version-removed");
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let unsharded = common::gate_check_sample(cache.path(), repo.path())
        .arg("--quiet")
        .arg("--report")
        .arg(out.path().join("report.md"))
        .arg("--json")
        .arg(out.path().join("verdict.json"))
        .output()
        .unwrap();
    let parts = partials(cache.path(), repo.path(), out.path(), "part", 3);
    let merged = common::gate(cache.path())
        .args(["--quiet", "merge"])
        .args(&parts)
        .arg("--repo")
        .arg(repo.path())
        .arg("--report")
        .arg(out.path().join("merged.md"))
        .arg("--json")
        .arg(out.path().join("merged.json"))
        .output()
        .unwrap();
    assert_eq!(
        merged.status.code(),
        unsharded.status.code(),
        "{}",
        String::from_utf8_lossy(&merged.stderr)
    );
    assert_eq!(merged.stdout, unsharded.stdout);
    let read = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap();
    assert_eq!(read("merged.md"), read("report.md"));
    assert_eq!(read("merged.json"), read("verdict.json"));
    // Two partials of one shard: one line, exit 2.
    let refused = common::gate(cache.path())
        .args(["merge"])
        .args([&parts[0], &parts[0], &parts[1]])
        .arg("--repo")
        .arg(repo.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("shard 1/3 is given twice"), "{stderr}");
    // A partial that left out one of its Applications: exit 2 (could not decide), one line,
    // never a verdict.
    let forged = (0..3)
        .find_map(|i| {
            let mut part: Partial =
                serde_json::from_slice(&std::fs::read(&parts[i]).unwrap()).unwrap();
            part.head_applications.pop()?;
            let path = out.path().join("forged.json");
            std::fs::write(&path, serde_json::to_vec(&part).unwrap()).unwrap();
            Some((i, path))
        })
        .unwrap();
    let mut given = parts.clone();
    given[forged.0] = forged.1;
    let _ = std::fs::remove_file(out.path().join("forged-verdict.json"));
    let refused = common::gate(cache.path())
        .args(["merge"])
        .args(&given)
        .arg("--repo")
        .arg(repo.path())
        .arg("--json")
        .arg(out.path().join("forged-verdict.json"))
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("left it out"), "{stderr}");
    assert!(!out.path().join("forged-verdict.json").exists());
    // A forged partial whose Application's name carries a newline and a terminal escape: the
    // refusal quotes it on one line of printable characters (no forged log line, no escape).
    let mut part: Partial = serde_json::from_slice(&std::fs::read(&parts[1]).unwrap()).unwrap();
    let mut app: shard::WireApp = serde_json::from_value(
        serde_json::to_value(part.head_applications.first().expect("shard 2/3 holds one")).unwrap(),
    )
    .unwrap();
    app.name = "evil\n\u{1b}[2Kaddons-gate: green\r".into();
    part.head_applications.push(app);
    let path = out.path().join("escaped.json");
    std::fs::write(&path, serde_json::to_vec(&part).unwrap()).unwrap();
    let refused = common::gate(cache.path())
        .args(["merge"])
        .args([&parts[0], &path, &parts[2]])
        .arg("--repo")
        .arg(repo.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("evil ?[2Kaddons-gate: green"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\r'),
        "{stderr:?}"
    );
    // A partial over the cap (sparse: no disk used) is refused before it is read, in one
    // line; so is one that is no regular file (a device: endless).
    let huge = out.path().join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(shard::MAX_PARTIAL_BYTES + 1)
        .unwrap();
    for given in [huge.as_path(), Path::new("/dev/zero")] {
        let refused = common::gate(cache.path())
            .args(["merge"])
            .arg(&parts[0])
            .arg(given)
            .arg(&parts[2])
            .arg("--repo")
            .arg(repo.path())
            .arg("--json")
            .arg(out.path().join("forged-verdict.json"))
            .output()
            .unwrap();
        assert_ne!(refused.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        let why = if given == huge {
            "is over the 2048 MiB a partial may be"
        } else {
            "is not a regular file"
        };
        assert!(
            stderr.contains(&format!("partial {} {why}", given.display())),
            "{stderr}"
        );
        assert!(!out.path().join("forged-verdict.json").exists());
    }
}

/// The work is split: with no cache, each of three shards runs fewer helm and kustomize
/// processes than one unsharded render, and together they keep every Application once.
#[test]
fn each_shard_renders_only_part_of_the_fleet() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let mut config = config(repo.path(), cache());
    config.cache = RenderCache::disabled();
    let whole = render::render(&config, "HEAD").unwrap();
    let runs = |r: &render::Rendering| r.stats.helm_runs + r.stats.kustomize_runs;
    assert!(runs(&whole) >= 3, "the sample renders charts");
    let mut apps = 0;
    for index in 0..3 {
        let mut fresh = config.clone();
        fresh.parsed = Default::default();
        let part = render::render_shard(&fresh, "HEAD", Shard { index, count: 3 }).unwrap();
        assert!(
            runs(&part) < runs(&whole),
            "shard {index}: {} of {} processes",
            runs(&part),
            runs(&whole)
        );
        apps += part.applications.len();
    }
    assert_eq!(apps, whole.applications.len());
}

/// Writes a nest (a helm parent whose chart deploys a plain app-of-apps, whose directory
/// deploys a helm leaf and a plain leaf) at `replicas`, and commits it.
fn commit_nest(repo: &Path, replicas: u8, message: &str) -> String {
    let root = repo.join("nest");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("parent/templates")).unwrap();
    std::fs::create_dir_all(root.join("mid")).unwrap();
    std::fs::create_dir_all(root.join("plain")).unwrap();
    let url = common::SAMPLE_REPO_URL;
    std::fs::write(
        root.join("root.yaml"),
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: nest-parent\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: {url}\n    targetRevision: HEAD\n    path: nest/parent\n  destination:\n    name: in-cluster\n    namespace: argocd\n"
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("parent/Chart.yaml"),
        "apiVersion: v2\nname: nest-parent\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        root.join("parent/templates/mid.yaml"),
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: nest-mid\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: {url}\n    targetRevision: HEAD\n    path: nest/mid\n  destination:\n    name: in-cluster\n    namespace: argocd\n"
        ),
    )
    .unwrap();
    // JSON: a directory source reads it, the scan for the repository's own Applications
    // (YAML files) does not, so only the mid Application deploys the leaves.
    let leaf = |name: &str, source: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": "argocd"},
            "spec": {
                "project": "default",
                "source": source,
                "destination": {"name": "prod-eu", "namespace": "nest"},
            },
        })
    };
    for (name, source) in [
        (
            "nest-leaf-helm",
            serde_json::json!({
                "repoURL": url, "targetRevision": "HEAD", "path": "local-charts/ingress-lite",
                "helm": {"valuesObject": {"replicaCount": replicas}},
            }),
        ),
        (
            "nest-leaf-plain",
            serde_json::json!({"repoURL": url, "targetRevision": "HEAD", "path": "nest/plain"}),
        ),
    ] {
        std::fs::write(
            root.join(format!("mid/{name}.json")),
            leaf(name, source).to_string(),
        )
        .unwrap();
    }
    std::fs::write(
        root.join("plain/config.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: nest\ndata:\n  replicas: \"{replicas}\"\n"
        ),
    )
    .unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", message]);
    git(repo, &["rev-parse", "HEAD"])
}

/// A helm parent deploys a plain app-of-apps whose directory deploys two leaves: only the
/// parent's shard renders the parent, so only that shard reaches the app-of-apps and its
/// leaves, and they stay in that shard. Before, a leaf went to its own key's shard, which
/// never saw it: the merged verdict lost the leaves' change.
#[test]
fn what_an_app_of_apps_under_a_helm_parent_deploys_stays_in_the_parents_shard() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let base = commit_nest(repo.path(), 1, "the nest at the base");
    git(repo.path(), &["checkout", "-q", "-b", "pr"]);
    let head = commit_nest(repo.path(), 2, "the leaves change");
    let config = config(repo.path(), cache());
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    let changed: Vec<&str> = unsharded
        .diff
        .applications
        .iter()
        .map(|a| a.app.name.as_str())
        .collect();
    for leaf in ["nest-leaf-helm", "nest-leaf-plain"] {
        assert!(
            changed.contains(&leaf),
            "{changed:?} {:?}",
            unsharded.verdict.errors
        );
    }
    let at_head = render::render(&config, &head).unwrap();
    let spec = |name: &str| {
        at_head
            .applications
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.manifest.clone())
            .unwrap()
    };
    let (parent, leaf) = (spec("nest-parent"), spec("nest-leaf-helm"));
    let (head_keys, weights) = render::shard_keys_weighed(&config, &head).unwrap();
    let mut apart = 0;
    for count in 1..=6 {
        let stripes = render::Stripes::weighted(head_keys.values(), &weights, count);
        let shard_of = |app| stripes.of(&render::shard_key(app));
        if shard_of(&parent) != shard_of(&leaf) {
            apart += 1;
        }
        let merged = sharded(&config, &base, &head, count).unwrap();
        assert_same(&unsharded, &merged);
    }
    assert!(apart > 0, "the parent and a leaf hash to different shards");
}

/// A partial's Application, copied with the objects it names into another partial's table.
fn copy_app(from: &Partial, app: &shard::WireApp, to: &mut Partial) -> shard::WireApp {
    let mut copy: shard::WireApp =
        serde_json::from_value(serde_json::to_value(app).unwrap()).unwrap();
    copy.objects = app
        .objects
        .iter()
        .map(|&at| {
            to.objects.push(from.objects[at].clone());
            to.objects.len() - 1
        })
        .collect();
    copy
}

/// Honest partials of the sample repository's `kind-not-served` pull request, through JSON.
fn honest_parts(count: usize) -> (common::TestRepo, Vec<Partial>) {
    let (repo, base, head) = case_repo("kind-not-served");
    let config = config(repo.path(), cache());
    let parts = shard_parts(&config, &base, &head, count);
    (repo, parts)
}

/// Every shard's partial of one check, through JSON (as `gate merge` reads them).
fn shard_parts(config: &RenderConfig, base: &str, head: &str, count: usize) -> Vec<Partial> {
    (0..count)
        .map(|index| {
            let partial = shard::check_shard(
                config,
                base.to_string(),
                head.to_string(),
                Shard { index, count },
            );
            serde_json::from_slice(&serde_json::to_vec(&partial).unwrap()).unwrap()
        })
        .collect()
}

/// The attack of a forged (or misconfigured) shard: its partial holds an Application of
/// another shard, a copy of one under an origin of its own, or one whose owner left it out.
/// The merge refuses each (exit 2 in the binary): a partial holds its own shard's
/// Applications only, and every Application is held by its shard.
#[test]
fn a_partial_holding_or_dropping_another_shards_application_is_refused() {
    let count = 3;
    let (repo, honest) = honest_parts(count);
    let merge = |parts: Vec<Partial>| shard::merge(parts, repo.path());
    let again = || -> Vec<Partial> {
        honest
            .iter()
            .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
            .collect()
    };
    assert!(merge(again()).is_ok(), "the honest partials merge");
    // An Application of shard A (one the repository's files declare, and one an
    // ApplicationSet generates) and a shard B that is not A.
    let picks: [fn(&shard::WireApp) -> bool; 2] = [
        |a| matches!(a.origin, render::Origin::File { .. }),
        |a| matches!(a.origin, render::Origin::ApplicationSet { .. }),
    ];
    for (generated, pick) in picks.into_iter().enumerate() {
        let a = (0..count)
            .find(|&i| honest[i].head_applications.iter().any(pick))
            .unwrap();
        let b = (a + 1) % count;
        let app = honest[a]
            .head_applications
            .iter()
            .find(|x| pick(x))
            .unwrap();
        let who = format!("Application {}/{}", app.namespace, app.name);

        // B holds a copy of it.
        let mut parts = again();
        let copy = copy_app(&honest[a], app, &mut parts[b]);
        parts[b].head_applications.push(copy);
        let refusal = merge(parts).unwrap_err().to_string();
        assert!(
            refusal.contains(&format!("holds {who} at the head")),
            "{refusal}"
        );

        // B holds it instead of A.
        let mut parts = again();
        let copy = copy_app(&honest[a], app, &mut parts[b]);
        parts[b].head_applications.push(copy);
        parts[a]
            .head_applications
            .retain(|x| (&x.namespace, &x.name) != (&app.namespace, &app.name));
        let refusal = merge(parts).unwrap_err().to_string();
        assert!(
            refusal.contains(&format!("{who} is at the head")) && refusal.contains("left it out"),
            "{refusal}"
        );

        // B shadows it: a copy whose origin is an Application B holds that renders no
        // process (a parent's copy wins over a file's in the reassembly).
        if let Some(parent) = honest[b]
            .head_applications
            .iter()
            .find(|x| x.render_keys.iter().all(|k| k.starts_with("objects-")))
        {
            let mut parts = again();
            let mut copy = copy_app(&honest[a], app, &mut parts[b]);
            copy.origin = render::Origin::Application {
                namespace: parent.namespace.clone(),
                name: parent.name.clone(),
            };
            parts[b].head_applications.push(copy);
            let refusal = merge(parts).unwrap_err().to_string();
            assert!(refusal.contains("a partial holds its own"), "{refusal}");
        }

        // B shadows it with a made-up parent: an Application of B's that says a file
        // declares it and that runs a helm render of its own (the review's attack).
        {
            let mut parts = again();
            let mut parent = copy_app(&honest[b], &honest[b].head_applications[0], &mut parts[b]);
            parent.name = (0..)
                .map(|i| format!("forged-parent-{i}"))
                .find(|n| {
                    parent.manifest["metadata"]["name"] = serde_json::json!(n);
                    parent.manifest["spec"]["destination"]["namespace"] = serde_json::json!(n);
                    render::Shard::of(&parent.manifest, count) == b
                })
                .unwrap();
            parent.origin = render::Origin::File {
                path: "apps/forged.yaml".into(),
                document: 0,
            };
            parent.render_keys = vec!["helm-forged".into()];
            let mut copy = copy_app(&honest[a], app, &mut parts[b]);
            copy.origin = render::Origin::Application {
                namespace: parent.namespace.clone(),
                name: parent.name.clone(),
            };
            let base_parent: shard::WireApp =
                serde_json::from_value(serde_json::to_value(&parent).unwrap()).unwrap();
            parts[b].base_applications.push(base_parent);
            parts[b].head_applications.push(parent);
            parts[b].head_applications.push(copy);
            let refusal = merge(parts).unwrap_err().to_string();
            assert!(
                refusal.contains("which does not declare it there"),
                "{refusal}"
            );
        }

        // A drops it, and from the Applications it says it reached too: the repository's
        // files (the merge reads them), or another shard's list, still name it.
        let mut parts = again();
        parts[a]
            .head_applications
            .retain(|x| (&x.namespace, &x.name) != (&app.namespace, &app.name));
        parts[a]
            .head_known
            .retain(|k| (&k.namespace, &k.name) != (&app.namespace, &app.name));
        let refusal = merge(parts).unwrap_err().to_string();
        if refusal.contains("reached different Applications or ApplicationSets at the head") {
            // Another shard's list names it (every shard's lists are compared first).
        } else if generated == 1 {
            assert!(refusal.contains("left it out"), "{refusal}");
        } else {
            assert!(
                refusal.contains(&format!("did not read {who} (file ")),
                "{refusal}"
            );
        }
        assert!(!refusal.contains('\n'), "one line: {refusal}");
    }
}

/// The partials are bound to the repository: the merge lists the Applications and
/// ApplicationSets of the repository's files at both commits itself. Even one forged
/// partial of one shard (nothing to compare it with) cannot leave out an Application the
/// files declare, nor pass for a partial of other commits or another repository; the
/// commits must be commit ids the repository holds.
#[test]
fn the_merge_binds_the_partials_to_the_repositorys_files_and_commits() {
    let (repo, honest) = honest_parts(1);
    let merge = |parts: Vec<Partial>| {
        shard::merge(parts, repo.path())
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let again = || -> Partial {
        serde_json::from_value(serde_json::to_value(&honest[0]).unwrap()).unwrap()
    };
    // A root Application (apps/ingress.yaml at both commits) left out at the base.
    let mut forged = again();
    forged
        .base_applications
        .retain(|a| (a.namespace.as_str(), a.name.as_str()) != ("argocd", "ingress"));
    forged
        .base_known
        .retain(|k| (k.namespace.as_str(), k.name.as_str()) != ("argocd", "ingress"));
    let refusal = merge(vec![forged]);
    assert!(
        refusal.contains("did not read Application argocd/ingress (file apps/ingress.yaml)")
            && refusal.contains("the merge base"),
        "{refusal}"
    );
    // Listed as read, but not held.
    let mut forged = again();
    forged
        .head_applications
        .retain(|a| (a.namespace.as_str(), a.name.as_str()) != ("argocd", "ingress"));
    let refusal = merge(vec![forged]);
    assert!(
        refusal.contains("Application argocd/ingress is at the head")
            && refusal.contains("left it out"),
        "{refusal}"
    );
    // A root ApplicationSet (bootstrap/addons.yaml) its partial did not expand.
    let mut forged = again();
    forged
        .head_known
        .retain(|k| (k.kind.as_str(), k.name.as_str()) != ("ApplicationSet", "addons"));
    assert!(merge(vec![forged]).contains("did not read ApplicationSet argocd/addons"));
    // Commits that are not commit ids, or that the repository does not hold.
    let mut named = again();
    named.head = "pr".into();
    assert!(merge(vec![named]).contains("not a commit id"));
    let mut elsewhere = again();
    elsewhere.head = "0123456789abcdef0123456789abcdef01234567".into();
    assert!(merge(vec![elsewhere]).contains("cannot read the head"));
}

/// A partial's renders at a moved chart's old version count for its own Applications only:
/// one for an Application another shard holds cannot stand in for that shard's (the chart's
/// own change the report shows).
#[test]
fn a_partials_old_version_render_of_another_shards_application_is_not_used() {
    let (repo, base, head) = case_repo("bump-with-values");
    let config = config(repo.path(), cache());
    let count = 2;
    let parts = || -> Vec<Partial> {
        (0..count)
            .map(|index| {
                let partial =
                    shard::check_shard(&config, base.clone(), head.clone(), Shard { index, count });
                serde_json::from_slice(&serde_json::to_vec(&partial).unwrap()).unwrap()
            })
            .collect()
    };
    let honest = shard::merge(parts(), repo.path()).unwrap();
    let mut forged = parts();
    let owner = (0..count)
        .find(|&i| !forged[i].old_versions.is_empty())
        .expect("the case moves a chart");
    let other = (owner + 1) % count;
    // The other shard claims the moved Application rendered at its old version as nothing.
    let mut stand_in: shard::WireApp =
        serde_json::from_value(serde_json::to_value(&forged[owner].old_versions[0]).unwrap())
            .unwrap();
    stand_in.objects.clear();
    stand_in.render_keys = vec!["objects-forged".into()];
    forged[other].old_versions.push(stand_in);
    // Given last, so that nothing the owner gives is read after it.
    let last = forged.remove(other);
    forged.push(last);
    let merged = shard::merge(forged, repo.path()).unwrap();
    assert_same(&honest, &merged);
}

/// The shard key leaves `targetRevision` out, and an Application the head holds goes where
/// the head's spec puts it at both commits: a pull request that bumps a chart and moves its
/// Applications to another namespace (another key at each commit) is rendered, at both
/// commits, by one shard per Application, so the chart's own change is isolated as in one
/// check. Keyed by each commit's own spec, the two sides of some Application fall in two
/// shards and the merge refuses ("check this pull request unsharded").
#[test]
fn an_application_whose_spec_changes_is_rendered_at_both_commits_by_the_heads_shard() {
    let case = common::project_root().join("tests/check-cases/bump-with-values");
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let base = repo.head();
    repo.commit_overlay(&case.join("head"), "pr", "the bump");
    let targets = repo.path().join("targets/addons.yaml");
    let text = std::fs::read_to_string(&targets).unwrap();
    assert!(text.contains("namespace: cert-manager\n"));
    std::fs::write(
        &targets,
        text.replace(
            "namespace: cert-manager\n",
            "namespace: cert-manager-system\n",
        ),
    )
    .unwrap();
    git(
        repo.path(),
        &["commit", "-q", "-am", "and another namespace"],
    );
    let head = git(repo.path(), &["rev-parse", "HEAD"]);
    let config = config(repo.path(), cache());
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    assert!(
        unsharded
            .diff
            .applications
            .iter()
            .any(|a| a.app.name.starts_with("cert-manager-lite-")),
        "{:?}",
        unsharded.verdict.errors
    );
    let manifests = |revision: &str| -> Vec<(String, serde_json::Value)> {
        render::render(&config, revision)
            .unwrap()
            .applications
            .into_iter()
            .filter(|a| a.name.starts_with("cert-manager-lite-"))
            .map(|a| (a.name, a.manifest))
            .collect()
    };
    let (before, after) = (manifests(&base), manifests(&head));
    let (head_keys, weights) = render::shard_keys_weighed(&config, &head).unwrap();
    let mut apart = 0;
    for count in 1..=6 {
        let stripes = render::Stripes::weighted(head_keys.values(), &weights, count);
        let shard_of = |app| stripes.of(&render::shard_key(app));
        for (name, spec) in &after {
            let (_, old) = before.iter().find(|(n, _)| n == name).unwrap();
            assert_ne!(render::shard_key(old), render::shard_key(spec));
            if shard_of(old) != shard_of(spec) {
                apart += 1;
            }
        }
        let merged = sharded(&config, &base, &head, count).unwrap();
        assert_same(&unsharded, &merged);
    }
    assert!(apart > 0, "some Application's keys fall in two shards");
}

/// The partials `gate check --shard I/count --partial` writes for every shard of the sample
/// check on `repo`, as `dir/{name}-I.json` (each run must succeed).
fn partials(
    cache: &Path,
    repo: &Path,
    dir: &Path,
    name: &str,
    count: usize,
) -> Vec<std::path::PathBuf> {
    (1..=count)
        .map(|index| {
            let part = dir.join(format!("{name}-{index}.json"));
            let output = common::gate_check_sample(cache, repo)
                .arg("--quiet")
                .args(["--shard", &format!("{index}/{count}"), "--partial"])
                .arg(&part)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            part
        })
        .collect()
}

/// Honest partials of the sample's `kind-not-served` pull request for `count` shards, and the
/// shard holding a head Application that `pick` chooses, with that Application.
fn holder(parts: &[Partial], pick: impl Fn(&shard::WireApp) -> bool) -> Option<(usize, usize)> {
    parts.iter().enumerate().find_map(|(i, part)| {
        part.head_applications
            .iter()
            .position(&pick)
            .map(|at| (i, at))
    })
}

/// The review's leftover (a): a helm parent of the forging shard's own "deploys" another
/// shard's file-declared Application. With another spec the forger's copy would have won the
/// reassembly (a parent's copy wins over a file's in one render): refused. With the same spec
/// and forged objects, the file's holder's objects count, as one render keeps the file's
/// (and forged objects of plain manifests are refused whoever holds them).
#[test]
fn a_parents_copy_of_another_shards_file_declared_application_never_wins() {
    let mut found = None;
    for count in 2..=6 {
        let (repo, honest) = honest_parts(count);
        let file = holder(&honest, |a| matches!(a.origin, render::Origin::File { .. }));
        let Some((x, _)) = file else { continue };
        let helm = (0..count).filter(|&y| y != x).find_map(|y| {
            honest[y]
                .head_applications
                .iter()
                .position(|a| {
                    a.render_keys.iter().any(|k| !k.starts_with("objects-"))
                        && matches!(a.origin, render::Origin::ApplicationSet { .. })
                })
                .map(|at| (y, at))
        });
        if let Some(helm) = helm {
            found = Some((repo, honest, count, x, helm));
            break;
        }
    }
    let (repo, honest, _, x, (y, parent_at)) =
        found.expect("a file's Application and a helm Application in another shard");
    let again = || -> Vec<Partial> {
        honest
            .iter()
            .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
            .collect()
    };
    let honest_verdict = shard::merge(again(), repo.path()).unwrap();
    let (_, file_at) = holder(&honest[x..=x], |a| {
        matches!(a.origin, render::Origin::File { .. })
    })
    .unwrap();
    let target = &honest[x].head_applications[file_at];
    let parent = &honest[y].head_applications[parent_at];
    let forge = |spec_changed: bool, objects_forged: bool| {
        let mut parts = again();
        let mut copy = copy_app(&honest[x], target, &mut parts[y]);
        if objects_forged {
            copy.objects.clear();
            copy.render_keys = vec!["helm-forged".into()];
        }
        copy.origin = render::Origin::Application {
            namespace: parent.namespace.clone(),
            name: parent.name.clone(),
        };
        if spec_changed {
            copy.manifest["spec"]["project"] = serde_json::json!("forged");
            copy.stored["spec"]["project"] = serde_json::json!("forged");
            copy.project = "forged".into();
        }
        parts[y].head_applications.push(copy);
        shard::merge(parts, repo.path())
    };
    let refusal = forge(true, false).map(|_| ()).unwrap_err().to_string();
    assert!(
        refusal.contains(&format!(
            "Application {}/{} at the head is declared in",
            target.namespace, target.name
        )) && refusal.contains("with another spec")
            && refusal.contains("check this pull request unsharded"),
        "{refusal}"
    );
    assert!(!refusal.contains('\n'), "one line: {refusal}");
    // The same spec: the owner's copy counts, or, where the copy stands in for a parent
    // another shard credits (its render then is the copy's word), the partial is refused.
    match forge(false, false) {
        Ok(merged) => assert_same(&honest_verdict, &merged),
        Err(refusal) => assert!(
            refusal
                .to_string()
                .contains("a partial credits only its own renders"),
            "{refusal}"
        ),
    }
    // Forged objects: the file's holder's count when a render runs helm or kustomize for
    // it; for plain manifests, the merge reads them itself and refuses the copy.
    let plain = target.render_keys.iter().all(|k| k.starts_with("objects-"));
    match forge(false, true) {
        // Where the copy stands in for a parent another shard credits: refused first for that.
        Err(refusal)
            if refusal
                .to_string()
                .contains("a partial credits only its own renders") => {}
        Ok(merged) if !plain => assert_same(&honest_verdict, &merged),
        Err(refusal) if plain => assert!(
            refusal
                .to_string()
                .contains("with other objects than the plain manifests"),
            "{refusal}"
        ),
        Ok(_) => panic!("a forged copy of plain manifests merged"),
        Err(refusal) => panic!("{refusal}"),
    }
}

/// The review's leftover (b): whether a parent's render runs helm or kustomize (so that what
/// it deploys stays in its shard) is read from its sources and the repository, not from the
/// render keys its partial claims. A shard that says its Application of plain manifests is a
/// helm render cannot pass off an Application of its own making, of another shard's key, as
/// that render's child; nor one of its own key that no render deploys.
#[test]
fn a_plain_parent_claimed_as_a_helm_render_deploys_nothing_the_merge_believes() {
    let count = 3;
    let (repo, honest) = honest_parts(count);
    let again = || -> Vec<Partial> {
        honest
            .iter()
            .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
            .collect()
    };
    shard::merge(again(), repo.path()).unwrap();
    // A plain parent some shard b holds (every shard renders it; b holds it by its key).
    let plain = |a: &shard::WireApp| a.render_keys.iter().all(|k| k.starts_with("objects-"));
    let (b, parent_at) = holder(&honest, |a| plain(a) && !a.objects.is_empty()).unwrap();
    let parent = &honest[b].head_applications[parent_at];
    // A made-up Application copied from a generated one, renamed, its key in `wanted`.
    let (from, model_at) = holder(&honest, |a| {
        matches!(a.origin, render::Origin::ApplicationSet { .. })
    })
    .unwrap();
    let model = &honest[from].head_applications[model_at];
    let forge = |wanted: &dyn Fn(usize) -> bool, listed: bool| {
        let mut parts = again();
        let at = parts[b]
            .head_applications
            .iter()
            .position(|a| a.name == parent.name)
            .unwrap();
        parts[b].head_applications[at].render_keys = vec!["helm-forged".into()];
        let mut made_up = copy_app(&honest[from], model, &mut parts[b]);
        made_up.origin = render::Origin::Application {
            namespace: parent.namespace.clone(),
            name: parent.name.clone(),
        };
        made_up.name = (0..)
            .map(|i| format!("made-up-{i}"))
            .find(|n| {
                made_up.manifest["metadata"]["name"] = serde_json::json!(n);
                made_up.manifest["spec"]["destination"]["namespace"] = serde_json::json!(n);
                wanted(Shard::of(&made_up.manifest, count))
            })
            .unwrap();
        if listed {
            // And says it reached it on the path every shard follows.
            parts[b].head_known.push(render::Known {
                kind: "Application".into(),
                namespace: made_up.namespace.clone(),
                name: made_up.name.clone(),
            });
        }
        parts[b].head_applications.push(made_up);
        shard::merge(parts, repo.path())
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let refusal = forge(&|shard| shard != b, false);
    assert!(
        refusal.contains("Application argocd/made-up-")
            && refusal.contains("no render of shard")
            && refusal.contains("a partial holds its own shard's Applications only"),
        "{refusal}"
    );
    let refusal = forge(&|shard| shard == b, false);
    assert!(
        refusal.contains("Application argocd/made-up-")
            && refusal.contains("no file declares")
            && refusal.contains("a partial holds only what the repository holds"),
        "{refusal}"
    );
    let refusal = forge(&|shard| shard == b, true);
    assert!(
        refusal.contains("reached different Applications or ApplicationSets at the head")
            && refusal.contains("on the path every shard follows: one run's partials only"),
        "{refusal}"
    );
}

/// A root Application is bound to its file: a shard holding one as that file's with another
/// spec (the Application as stored, which the diff shows, and its key) is refused.
#[test]
fn a_files_application_held_with_another_spec_is_refused() {
    let (repo, honest) = honest_parts(2);
    let (x, at) = holder(&honest, |a| matches!(a.origin, render::Origin::File { .. })).unwrap();
    let mut parts: Vec<Partial> = honest
        .iter()
        .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
        .collect();
    let app = &mut parts[x].head_applications[at];
    app.manifest["spec"]["project"] = serde_json::json!("forged");
    app.stored["spec"]["project"] = serde_json::json!("forged");
    let refusal = shard::merge(parts, repo.path())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains("with another spec than the file's")
            || refusal.contains("with another spec than every shard's render keeps for it"),
        "{refusal}"
    );
    // The same forgery under another claimed origin (a parent nobody holds, an
    // ApplicationSet): a file's Application is held with a file's spec whatever its origin,
    // so a claimed origin cannot free it from its file (nor move its shard key).
    for origin in [
        render::Origin::Application {
            namespace: "argocd".into(),
            name: "ghost".into(),
        },
        render::Origin::ApplicationSet {
            namespace: "argocd".into(),
            name: "addons".into(),
        },
    ] {
        let mut parts: Vec<Partial> = honest
            .iter()
            .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
            .collect();
        let app = &mut parts[x].head_applications[at];
        app.origin = origin.clone();
        // A spec consistent in itself (what the merge reads again from it agrees).
        app.manifest["spec"]["project"] = serde_json::json!("forged");
        app.stored = render::stored_application(&app.manifest);
        app.project = "forged".into();
        let refusal = shard::merge(parts, repo.path())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            refusal.contains("with another spec than the file that declares it"),
            "{origin}: {refusal}"
        );
    }
}

/// The review's leftover (c): the merge computes the merge base itself. Partials that all
/// judge the head against itself (every shard run with `--base` of the pull request's own
/// head: nothing changed, green) are refused; `--base` given to the merge as to the shards is
/// believed, as `check --base` is.
#[test]
fn the_merge_computes_the_merge_base_itself() {
    let (repo, base, head) = case_repo("kind-not-served");
    let config = config(repo.path(), cache());
    let against_itself: Vec<Partial> = (0..2)
        .map(|index| {
            let partial = shard::check_shard(
                &config,
                head.clone(),
                head.clone(),
                Shard { index, count: 2 },
            );
            serde_json::from_slice(&serde_json::to_vec(&partial).unwrap()).unwrap()
        })
        .collect();
    let again = || -> Vec<Partial> {
        against_itself
            .iter()
            .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
            .collect()
    };
    let refusal = shard::merge(again(), repo.path())
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        refusal.contains(&format!(
            "the partials name {head} as the merge base, but the merge base of the head {head} is {base}"
        )),
        "{refusal}"
    );
    let given = shard::MergeOptions {
        base: Some(head.clone()),
        ..Default::default()
    };
    let merged = shard::merge_with(again(), repo.path(), &given).unwrap();
    assert_eq!(merged.verdict.base, head);
    let other_branch = shard::MergeOptions {
        default_branch: Some("pr".into()),
        ..Default::default()
    };
    assert!(shard::merge_with(again(), repo.path(), &other_branch).is_ok());
}

/// A fleet of plain manifests whose pull request stops serving `v1alpha1` of the Widget CRD
/// (plain manifests: `fleet/crds`, one file-declared Application per cluster) while `fleet-0`
/// (plain manifests, declared in a file) still holds a `v1alpha1` Widget: a red change, every
/// Application on the path every shard follows, none rendered by helm.
fn unserved_fleet() -> (common::TestRepo, String, String) {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let app = |cluster, version| {
        Some(FleetApp {
            cluster,
            version,
            under_parent: false,
            helm: None,
        })
    };
    let fleet = |served: Vec<bool>| Fleet {
        apps: vec![app(0, 0), app(1, 2)],
        served,
    };
    let base = commit_fleet(repo.path(), &fleet(vec![true, true, true]), "the fleet");
    git(repo.path(), &["checkout", "-q", "-b", "pr"]);
    let head = commit_fleet(
        repo.path(),
        &fleet(vec![false, true, true]),
        "v1alpha1 no longer served",
    );
    (repo, base, head)
}

/// The objects of Application `name` in a partial, at the head (and the merge base when
/// `base`), replaced by what `edit` makes of them: new entries of the partial's object table,
/// so no other Application sharing one changes.
fn edit_objects(
    part: &mut Partial,
    name: &str,
    base: bool,
    edit: &dyn Fn(&mut Vec<serde_json::Value>),
) {
    let Partial {
        objects,
        head_applications,
        base_applications,
        ..
    } = part;
    let sides: Vec<&mut Vec<shard::WireApp>> = if base {
        vec![head_applications, base_applications]
    } else {
        vec![head_applications]
    };
    for apps in sides {
        let app = apps.iter_mut().find(|a| a.name == name).unwrap();
        let mut values: Vec<serde_json::Value> = app
            .objects
            .iter()
            .map(|&at| serde_json::Value::clone(&objects[at]))
            .collect();
        edit(&mut values);
        app.objects = values
            .into_iter()
            .map(|value| {
                objects.push(std::sync::Arc::new(value));
                objects.len() - 1
            })
            .collect();
    }
}

/// The review's M2: the shard owning an Application of plain manifests on the path every
/// shard follows could say it renders other objects than its manifests, and the merge
/// believed it: leave out the CRD that stops serving a version, or the resource still
/// declaring it, or serve the version again, and the red change merged green. The merge reads
/// those manifests itself: each forgery, played against the binary, is one line, exit 2, and
/// no verdict.
#[test]
fn a_forged_render_of_plain_manifests_on_the_common_path_is_refused() {
    let (repo, _, _) = unserved_fleet();
    let out = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let unsharded = common::gate_check_sample(cache.path(), repo.path())
        .arg("--quiet")
        .output()
        .unwrap();
    assert_eq!(
        unsharded.status.code(),
        Some(1),
        "the change is red: {}",
        String::from_utf8_lossy(&unsharded.stdout)
    );
    let count = 3;
    let parts = partials(cache.path(), repo.path(), out.path(), "part", count);
    let merge = |given: &[std::path::PathBuf]| {
        let verdict = out.path().join("merged.json");
        let _ = std::fs::remove_file(&verdict);
        let output = common::gate(cache.path())
            .args(["--quiet", "merge"])
            .args(given)
            .arg("--repo")
            .arg(repo.path())
            .arg("--json")
            .arg(&verdict)
            .output()
            .unwrap();
        (output, verdict.exists())
    };
    let (honest, _) = merge(&parts);
    assert_eq!(
        honest.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&honest.stderr)
    );
    let read =
        |path: &Path| -> Partial { serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap() };
    let is_crd = |o: &serde_json::Value| o["kind"] == "CustomResourceDefinition";
    fn serve_again(objects: &mut [serde_json::Value]) {
        for o in objects
            .iter_mut()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
        {
            for version in o["spec"]["versions"].as_array_mut().unwrap() {
                version["served"] = serde_json::json!(true);
            }
        }
    }
    type Forgery = (&'static str, bool, Box<dyn Fn(&mut Vec<serde_json::Value>)>);
    let forgeries: Vec<Forgery> = vec![
        // The CRD left out, at both commits (so no CRD was removed either).
        (
            "widget-crds-0",
            true,
            Box::new(move |objects| objects.retain(|o| !is_crd(o))),
        ),
        // The CRD changed: v1alpha1 served again.
        (
            "widget-crds-0",
            false,
            Box::new(|objects| serve_again(objects)),
        ),
        // The resource still declaring v1alpha1 left out.
        (
            "fleet-0",
            false,
            Box::new(|objects| objects.retain(|o| o["kind"] != "Widget")),
        ),
        // An object added.
        (
            "fleet-0",
            false,
            Box::new(|objects| {
                objects.push(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "added", "namespace": "widgets"},
                }))
            }),
        ),
    ];
    for (name, both, edit) in &forgeries {
        // The shard holding the Application at the head forges its own partial.
        let owner = (0..count)
            .find(|&i| {
                read(&parts[i])
                    .head_applications
                    .iter()
                    .any(|a| a.name == *name)
            })
            .unwrap();
        let mut forged = read(&parts[owner]);
        edit_objects(&mut forged, name, *both, edit.as_ref());
        let path = out.path().join("forged.json");
        std::fs::write(&path, serde_json::to_vec(&forged).unwrap()).unwrap();
        let mut given = parts.clone();
        given[owner] = path;
        let (refused, written) = merge(&given);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!(
                "shard {}/{count} holds Application argocd/{name} at the ",
                owner + 1
            )) && stderr.contains("with other objects than the plain manifests"),
            "{stderr}"
        );
        assert!(!written, "{name}: no verdict is written");
    }
    // One shard holding every Application (the owner of all three CRD Applications) serves
    // v1alpha1 again in each at the head: believed, the red change would merge green.
    let whole = partials(cache.path(), repo.path(), out.path(), "part-whole", 1).remove(0);
    let mut forged = read(&whole);
    for name in ["widget-crds-0", "widget-crds-1", "widget-crds-2"] {
        edit_objects(&mut forged, name, false, &|objects| serve_again(objects));
    }
    std::fs::write(&whole, serde_json::to_vec(&forged).unwrap()).unwrap();
    let (refused, written) = merge(std::slice::from_ref(&whole));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "one shard serving v1alpha1 again: {stderr}"
    );
    assert!(
        stderr.contains("shard 1/1 holds Application argocd/widget-crds-")
            && stderr.contains("with other objects than the plain manifests"),
        "{stderr}"
    );
    assert!(!written, "no verdict is written");
}

/// The fleet with a copy of `fleet-0`'s file (a helm Application declared in a file) among
/// the helm parent's templates: the parent deploys the same Application with the same spec,
/// so one render keeps the file's and credits the parent (a shard that does not render
/// `fleet-0` says so in its credits).
fn credited_fleet() -> (common::TestRepo, String, String) {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let app = |cluster, version, helm| {
        Some(FleetApp {
            cluster,
            version,
            under_parent: false,
            helm,
        })
    };
    let commit = |fleet: &Fleet, message: &str| {
        commit_fleet(repo.path(), fleet, message);
        let root = repo.path().join("fleet");
        std::fs::copy(
            root.join("roots/fleet-0.yaml"),
            root.join("parent/templates/copy.yaml"),
        )
        .unwrap();
        git(repo.path(), &["add", "-A"]);
        git(repo.path(), &["commit", "-q", "-m", "the parent's copy"]);
        git(repo.path(), &["rev-parse", "HEAD"])
    };
    let base = commit(
        &Fleet {
            apps: vec![app(0, 2, Some(1)), app(1, 2, Some(2)), app(2, 2, None)],
            served: vec![true, true, true],
        },
        "the fleet",
    );
    git(repo.path(), &["checkout", "-q", "-b", "pr"]);
    let head = commit(
        &Fleet {
            apps: vec![app(0, 2, Some(1)), app(1, 2, Some(1)), app(2, 1, None)],
            served: vec![true, true, true],
        },
        "the fleet changes",
    );
    (repo, base, head)
}

/// The review's L1: a partial's credits (a parent credited with another shard's
/// Application) changed that Application's origin, whatever the parent. A shard credits only
/// a render it ran (an Application it holds, or one of plain manifests every shard renders)
/// whose objects deploy that Application with its spec, or an ApplicationSet it expanded.
#[test]
fn a_partials_credits_name_only_its_own_renders() {
    let (repo, base, head) = credited_fleet();
    let config = config(repo.path(), cache());
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    assert_ne!(
        unsharded.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Undecided,
        "{:?}",
        unsharded.verdict.errors
    );
    let parts = |count: usize| shard_parts(&config, &base, &head, count);
    // Honest credits merge into the unsharded verdict.
    let mut credited = None;
    for count in 1..=6 {
        let honest = parts(count);
        let crediting = honest
            .iter()
            .position(|p| p.head_credits.contains_key("Application argocd/fleet-0"));
        assert_same(&unsharded, &shard::merge(honest, repo.path()).unwrap());
        if let Some(at) = crediting {
            credited.get_or_insert((count, at));
        }
    }
    let (count, at) = credited.expect("a shard that does not hold fleet-0 credits its parent");
    let honest = parts(count);
    assert_eq!(
        honest[at].head_credits["Application argocd/fleet-0"],
        render::Origin::Application {
            namespace: "argocd".into(),
            name: "fleet-parent".into()
        }
    );
    let refusal = |edit: &dyn Fn(&mut Vec<Partial>)| {
        let mut forged: Vec<Partial> = honest
            .iter()
            .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
            .collect();
        edit(&mut forged);
        let refusal = shard::merge(forged, repo.path())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(!refusal.contains('\n'), "one line: {refusal}");
        refusal
    };
    let credit_to = |name: &str| {
        let name = name.to_string();
        move |parts: &mut Vec<Partial>| {
            parts[at].head_credits.insert(
                "Application argocd/fleet-0".into(),
                render::Origin::Application {
                    namespace: "argocd".into(),
                    name: name.clone(),
                },
            );
        }
    };
    // A parent of plain manifests every shard renders, which does not deploy fleet-0.
    let message = refusal(&credit_to("widget-crds-0"));
    assert!(
        message.contains(&format!(
            "shard {}/{count} credits Application argocd/fleet-0 at the head ",
            at + 1
        )) && message.contains(
            "to Application argocd/widget-crds-0, whose render does not deploy it with that spec: a partial credits only its own renders"
        ),
        "{message}"
    );
    // A helm Application the crediting shard does not hold (fleet-1 is another shard's, or
    // the crediting shard's own render does not deploy fleet-0).
    let message = refusal(&credit_to("fleet-1"));
    assert!(
        message.contains("to Application argocd/fleet-1, ")
            && message.contains("a partial credits only its own renders"),
        "{message}"
    );
    // An ApplicationSet no shard expanded, and a file.
    let message = refusal(&|parts| {
        parts[at].head_credits.insert(
            "Application argocd/fleet-0".into(),
            render::Origin::ApplicationSet {
                namespace: "argocd".into(),
                name: "made-up".into(),
            },
        );
    });
    assert!(
        message.contains("which shard") && message.contains("did not expand"),
        "{message}"
    );
    let message = refusal(&|parts| {
        parts[at].head_credits.insert(
            "Application argocd/fleet-0".into(),
            render::Origin::File {
                path: "fleet/roots/fleet-1.yaml".into(),
                document: 0,
            },
        );
    });
    assert!(message.contains("a file, not a parent"), "{message}");
}

/// Partials again, each through its JSON form (a forgery edits its own copy).
fn through_json(parts: &[Partial]) -> Vec<Partial> {
    parts
        .iter()
        .map(|p| serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap())
        .collect()
}

/// An Application's spec forged "consistent in itself": `edit` applied to it, and what the
/// merge reads again from the spec (the Application as stored, its project, destination
/// cluster and namespace) made to agree, so that only the spec itself is false.
fn respec(
    app: &mut shard::WireApp,
    inventory: &render::inventory::Inventory,
    edit: &dyn Fn(&mut serde_json::Value),
) {
    edit(&mut app.manifest);
    app.stored = render::stored_application(&app.manifest);
    let text = |pointer: &str| {
        app.manifest
            .pointer(pointer)
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
    };
    app.project = text("/spec/project").unwrap_or_default();
    app.destination_namespace = text("/spec/destination/namespace").unwrap_or_default();
    let cluster = inventory
        .destination(
            text("/spec/destination/server").as_deref(),
            text("/spec/destination/name").as_deref(),
        )
        .unwrap();
    app.cluster = render::ClusterRef {
        name: cluster.name.clone(),
        server: cluster.server.clone(),
    };
}

/// Application `name` in `part`, forged with [`respec`] at the head (and the merge base when
/// `base`).
fn forge_spec(part: &mut Partial, name: &str, base: bool, edit: &dyn Fn(&mut serde_json::Value)) {
    let inventory = part.inventory.clone();
    let mut sides = vec![&mut part.head_applications];
    if base {
        sides.push(&mut part.base_applications);
    }
    for apps in sides {
        let app = apps.iter_mut().find(|a| a.name == name).unwrap();
        respec(app, &inventory, edit);
    }
}

fn refusal_of(parts: Vec<Partial>, repo: &Path) -> String {
    let refusal = shard::merge(parts, repo)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(!refusal.contains('\n'), "one line: {refusal}");
    refusal
}

/// Issue 34 (a): an Application an ApplicationSet generates is on the path every shard
/// follows, but only its holder held it, and the merge believed the spec it was held with (the
/// merge does not expand ApplicationSets). Every shard records the digest of each Application
/// it keeps on that path; all must agree, and the holder holds it with that spec: another
/// chart version, another destination namespace, another destination cluster (which hid a
/// kind prod-us does not serve: one blocking finding fewer) are refused, before the merge
/// reads the Application's shard key from its spec; and so is a partial that also rewrites
/// its own digests.
#[test]
fn a_generated_applications_spec_is_the_one_every_shard_generates() {
    let generated = |a: &shard::WireApp| {
        matches!(a.origin, render::Origin::ApplicationSet { .. })
            && a.manifest.pointer("/spec/sources/0/chart").is_some()
    };
    let count = 3;
    let (repo, honest) = honest_parts(count);
    let (x, at) = holder(&honest, generated).unwrap();
    let name = honest[x].head_applications[at].name.clone();
    let honest_verdict = shard::merge(through_json(&honest), repo.path()).unwrap();
    let who = |at: &str| {
        format!(
            "shard {}/{count} holds Application argocd/{name} at {at}",
            x + 1
        )
    };
    let kept =
        "with another spec than every shard's render keeps for it on the path every shard follows";

    // Another chart version, at both commits (no chart move to account for).
    let other_version = |m: &mut serde_json::Value| {
        m["spec"]["sources"][0]["targetRevision"] = serde_json::json!("0.0.1");
    };
    let mut parts = through_json(&honest);
    forge_spec(&mut parts[x], &name, true, &other_version);
    let refusal = refusal_of(parts, repo.path());
    assert!(
        refusal.contains(&who("the merge base")) && refusal.contains(kept),
        "{refusal}"
    );

    // Another destination namespace, at the head.
    let mut parts = through_json(&honest);
    forge_spec(&mut parts[x], &name, false, &|m| {
        m["spec"]["destination"]["namespace"] = serde_json::json!("elsewhere");
    });
    let refusal = refusal_of(parts, repo.path());
    assert!(
        refusal.contains(&who("the head")) && refusal.contains(kept),
        "{refusal}"
    );

    // The Application the pull request adds on prod-us, which does not serve its
    // ServiceMonitor, sent to prod-eu, which does: one blocking finding fewer.
    let monitoring = "team-monitoring-prod-us";
    let y = holder(&honest, |a| a.name == monitoring).unwrap().0;
    let mut parts = through_json(&honest);
    forge_spec(&mut parts[y], monitoring, false, &|m| {
        m["spec"]["destination"]["server"] = serde_json::json!("https://prod-eu.k8s.example.test");
    });
    let refusal = refusal_of(parts, repo.path());
    assert!(
        refusal.contains(&format!(
            "shard {}/{count} holds Application argocd/{monitoring} at the head",
            y + 1
        )) && refusal.contains(kept),
        "{refusal}"
    );

    // The holder also records the forged spec's digest as the one it kept: the other shards
    // kept another.
    let mut parts = through_json(&honest);
    forge_spec(&mut parts[x], &name, true, &other_version);
    let id = format!("Application argocd/{name}");
    let forged = parts[x]
        .head_applications
        .iter()
        .find(|a| a.name == name)
        .map(|a| render::application_digest(&a.manifest))
        .unwrap();
    let part = &mut parts[x];
    for specs in [&mut part.base_common_specs, &mut part.head_common_specs] {
        assert!(specs.insert(id.clone(), forged.clone()).is_some());
    }
    let refusal = refusal_of(parts, repo.path());
    assert!(
        refusal.contains("kept different specs for the Applications at the merge base")
            && refusal.contains("on the path every shard follows: one run's partials only"),
        "{refusal}"
    );

    // The honest partials still merge into the same verdict.
    assert_same(
        &honest_verdict,
        &shard::merge(through_json(&honest), repo.path()).unwrap(),
    );
}

/// The sample repository with a parent of plain manifests (`family`, a root file) whose
/// directory deploys, in JSON (not the repository's own Applications), `family-child` (a
/// chart) and `family-redeployed`, which a file also declares with another destination
/// cluster (the parent's wins, as in Argo CD's one Application per name). The pull request
/// changes the ConfigMap `family-redeployed` deploys.
fn family_repo() -> (common::TestRepo, String, String) {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let url = common::SAMPLE_REPO_URL;
    let root = repo.path().join("family");
    std::fs::create_dir_all(root.join("children")).unwrap();
    std::fs::create_dir_all(root.join("config")).unwrap();
    std::fs::write(
        root.join("root.yaml"),
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: family\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: {url}\n    targetRevision: HEAD\n    path: family/children\n  destination:\n    name: in-cluster\n    namespace: argocd\n"
        ),
    )
    .unwrap();
    let redeployed = |cluster: &str| {
        serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "family-redeployed", "namespace": "argocd"},
            "spec": {
                "project": "default",
                "source": {"repoURL": url, "targetRevision": "HEAD", "path": "family/config"},
                "destination": {"name": cluster, "namespace": "family"},
            },
        })
    };
    std::fs::write(
        root.join("redeployed.yaml"),
        // JSON is YAML: the repository's own Application.
        redeployed("prod-eu").to_string(),
    )
    .unwrap();
    std::fs::write(
        root.join("children/redeployed.json"),
        redeployed("staging").to_string(),
    )
    .unwrap();
    std::fs::write(
        root.join("children/child.json"),
        serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "family-child", "namespace": "argocd"},
            "spec": {
                "project": "default",
                "source": {
                    "repoURL": "https://charts.example.test/stable",
                    "chart": "cert-manager-lite",
                    "targetRevision": "1.19.2",
                },
                "destination": {"name": "prod-eu", "namespace": "family"},
            },
        })
        .to_string(),
    )
    .unwrap();
    let config = |data: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: family\ndata:\n  value: \"{data}\"\n"
        )
    };
    std::fs::write(root.join("config/config.yaml"), config("base")).unwrap();
    git(repo.path(), &["add", "-A"]);
    git(repo.path(), &["commit", "-q", "-m", "the family"]);
    let base = repo.head();
    git(repo.path(), &["checkout", "-q", "-b", "pr"]);
    std::fs::write(root.join("config/config.yaml"), config("head")).unwrap();
    git(
        repo.path(),
        &["commit", "-q", "-am", "the family's config changes"],
    );
    let head = repo.head();
    (repo, base, head)
}

/// Issue 34 (a), the other way onto the path every shard follows: an Application a parent of
/// plain manifests deploys (every shard renders the parent) was held with its holder's word
/// on its spec. Another destination cluster is refused. And a file's Application that such a
/// parent deploys with another spec (the parent's wins in one render) merges as the
/// unsharded check (the merge refused it, as held with another spec than its file's), while
/// held with its file's spec under the parent's name it is refused.
#[test]
fn an_application_a_plain_parent_deploys_is_held_with_the_spec_every_shard_renders() {
    let (repo, base, head) = family_repo();
    let config = config(repo.path(), cache());
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    assert_ne!(
        unsharded.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Undecided,
        "{:?}",
        unsharded.verdict.errors
    );
    let at_head = render::render(&config, &head).unwrap();
    let redeployed = at_head
        .applications
        .iter()
        .find(|a| a.name == "family-redeployed")
        .unwrap();
    assert_eq!(
        (redeployed.cluster.name.as_str(), &redeployed.origin),
        (
            "staging",
            &render::Origin::Application {
                namespace: "argocd".into(),
                name: "family".into()
            }
        ),
        "the parent's copy wins"
    );
    let parts = |count: usize| shard_parts(&config, &base, &head, count);
    for count in 1..=4 {
        let merged = shard::merge(parts(count), repo.path())
            .unwrap_or_else(|e| panic!("{count} shards: {e}"));
        assert_same(&unsharded, &merged);
    }
    let count = 3;
    let honest = parts(count);
    let holder_of = |name: &str| holder(&honest, |a| a.name == name).unwrap().0;
    let kept =
        "with another spec than every shard's render keeps for it on the path every shard follows";

    // The chart child sent to another cluster, at the head.
    let x = holder_of("family-child");
    let mut forged = through_json(&honest);
    forge_spec(&mut forged[x], "family-child", false, &|m| {
        m["spec"]["destination"]["name"] = serde_json::json!("staging");
    });
    let refusal = refusal_of(forged, repo.path());
    assert!(
        refusal.contains(&format!(
            "shard {}/{count} holds Application argocd/family-child at the head",
            x + 1
        )) && refusal.contains(kept),
        "{refusal}"
    );

    // The file's Application held with its file's spec, under the parent's name.
    let x = holder_of("family-redeployed");
    let mut forged = through_json(&honest);
    forge_spec(&mut forged[x], "family-redeployed", true, &|m| {
        m["spec"]["destination"]["name"] = serde_json::json!("prod-eu");
    });
    let refusal = refusal_of(forged, repo.path());
    assert!(
        refusal.contains(&format!(
            "shard {}/{count} holds Application argocd/family-redeployed at the merge base",
            x + 1
        )) && refusal.contains(
            "with its file's spec (family/redeployed.yaml), which a parent of plain manifests every shard renders replaces"
        ),
        "{refusal}"
    );

    // The same, but under the file's own origin (this stop's review, H1): the file's spec,
    // stored form, cluster and plain objects, all as the file alone gives them; only the
    // digest every shard keeps tells that the parent's copy replaces it.
    let mut forged = through_json(&honest);
    forge_spec(&mut forged[x], "family-redeployed", true, &|m| {
        m["spec"]["destination"]["name"] = serde_json::json!("prod-eu");
    });
    let part = &mut forged[x];
    for apps in [&mut part.head_applications, &mut part.base_applications] {
        let app = apps
            .iter_mut()
            .find(|a| a.name == "family-redeployed")
            .unwrap();
        app.origin = render::Origin::File {
            path: "family/redeployed.yaml".into(),
            document: 0,
        };
    }
    let refusal = refusal_of(forged, repo.path());
    assert!(
        refusal.contains(&format!(
            "shard {}/{count} holds Application argocd/family-redeployed at the merge base",
            x + 1
        )) && refusal.contains(kept),
        "{refusal}"
    );
}

/// The fleet of [`unserved_fleet`] with each CRD Application mixed: the chart
/// `local-charts/ingress-lite` and, beside it, the directory `fleet/crds` (plain manifests).
fn mixed_fleet() -> (common::TestRepo, String, String) {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let app = |cluster, version| {
        Some(FleetApp {
            cluster,
            version,
            under_parent: false,
            helm: None,
        })
    };
    let commit = |served: Vec<bool>, message: &str| {
        let fleet = Fleet {
            apps: vec![app(0, 0), app(1, 2)],
            served,
        };
        commit_fleet(repo.path(), &fleet, message);
        for (cluster, name) in CLUSTERS.iter().enumerate() {
            std::fs::write(
                repo.path().join(format!("fleet/roots/crds-{name}.yaml")),
                format!(
                    "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: widget-crds-{cluster}\n  namespace: argocd\nspec:\n  project: default\n  sources:\n    - repoURL: {url}\n      targetRevision: HEAD\n      path: local-charts/ingress-lite\n    - repoURL: {url}\n      targetRevision: HEAD\n      path: fleet/crds\n  destination:\n    name: {name}\n    namespace: widgets\n",
                    url = common::SAMPLE_REPO_URL
                ),
            )
            .unwrap();
        }
        git(
            repo.path(),
            &["commit", "-q", "-am", "the CRDs beside a chart"],
        );
        git(repo.path(), &["rev-parse", "HEAD"])
    };
    let base = commit(vec![true, true, true], "the fleet");
    git(repo.path(), &["checkout", "-q", "-b", "pr"]);
    let head = commit(vec![false, true, true], "v1alpha1 no longer served");
    (repo, base, head)
}

/// Issue 34 (b): the plain sources of an Application that also has a helm or kustomize source
/// were read with that render, as its shard's word: beside a chart, the CRD that stops serving
/// a version could be left out or serve it again, and the red change merged green. The merge
/// reads those directories itself: each of their objects must be among the Application's, as
/// it is. What the chart renders stays the shard's word.
#[test]
fn the_plain_sources_beside_a_chart_are_read_again() {
    let (repo, base, head) = mixed_fleet();
    let config = config(repo.path(), cache());
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    assert_eq!(
        unsharded.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Blocked,
        "the change is red: {:?}",
        unsharded.verdict.errors
    );
    let parts = |count: usize| shard_parts(&config, &base, &head, count);
    for count in 1..=3 {
        assert_same(
            &unsharded,
            &shard::merge(parts(count), repo.path()).unwrap(),
        );
    }
    let count = 3;
    let honest = parts(count);
    let x = holder(&honest, |a| a.name == "widget-crds-0").unwrap().0;
    let held = &honest[x].head_applications[holder(&honest[x..=x], |a| a.name == "widget-crds-0")
        .unwrap()
        .1];
    assert!(
        held.render_keys.iter().any(|k| k.starts_with("objects-"))
            && held.render_keys.iter().any(|k| !k.starts_with("objects-")),
        "a chart and a directory: {:?}",
        held.render_keys
    );
    let is_crd = |o: &serde_json::Value| o["kind"] == "CustomResourceDefinition";
    let serve_again = move |objects: &mut Vec<serde_json::Value>| {
        for o in objects.iter_mut().filter(|o| is_crd(o)) {
            for version in o["spec"]["versions"].as_array_mut().unwrap() {
                version["served"] = serde_json::json!(true);
            }
        }
    };
    type Forgery = (&'static str, bool, Box<dyn Fn(&mut Vec<serde_json::Value>)>);
    let forgeries: Vec<Forgery> = vec![
        (
            "the CRD left out, at both commits",
            true,
            Box::new(move |objects| objects.retain(|o| !is_crd(o))),
        ),
        ("v1alpha1 served again", false, Box::new(serve_again)),
    ];
    for (what, both, edit) in &forgeries {
        let mut forged = through_json(&honest);
        edit_objects(&mut forged[x], "widget-crds-0", *both, edit.as_ref());
        let refusal = refusal_of(forged, repo.path());
        assert!(
            refusal.contains(&format!(
                "shard {}/{count} holds Application argocd/widget-crds-0 at the ",
                x + 1
            )) && refusal
                .contains("without each object of the plain manifests its directory sources name"),
            "{what}: {refusal}"
        );
    }
    // One shard holding every Application serves v1alpha1 again beside each chart, at the
    // head: believed, the red change would merge green.
    let mut whole = parts(1);
    for name in ["widget-crds-0", "widget-crds-1", "widget-crds-2"] {
        edit_objects(&mut whole[0], name, false, &serve_again);
    }
    let refusal = refusal_of(whole, repo.path());
    assert!(
        refusal.contains("shard 1/1 holds Application argocd/widget-crds-")
            && refusal.contains("without each object of the plain manifests"),
        "{refusal}"
    );
    // What the chart renders is the shard's word: an object of it left out, or one added,
    // merges.
    let mut forged = through_json(&honest);
    edit_objects(&mut forged[x], "widget-crds-0", false, &|objects| {
        objects.retain(|o| o["kind"] != "Service");
        objects.push(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "added", "namespace": "widgets"},
        }));
    });
    assert!(shard::merge(forged, repo.path()).is_ok());
}

/// An Application on the path every shard follows (`edge-a`, generated by an ApplicationSet
/// that a parent of plain manifests deploys) that a helm parent's chart (`edge-helm`) also
/// deploys, the same object: only the chart's shard renders the chart, and reaches the name
/// there first. What every shard records of that path counts that path's objects alone, so
/// the shards agree; where the chart's shard also holds `edge-a` by its key, the merge is the
/// unsharded verdict.
#[test]
fn what_a_shards_own_chart_deploys_first_leaves_the_common_path_as_every_shard_sees_it() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let url = common::SAMPLE_REPO_URL;
    let root = repo.path().join("edge");
    for dir in ["sets", "config", "chart/templates"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let application = |name: &str, path: &str| {
        format!(
            "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: {name}\n  namespace: argocd\nspec:\n  project: default\n  source:\n    repoURL: {url}\n    targetRevision: HEAD\n    path: {path}\n  destination:\n    name: in-cluster\n    namespace: argocd\n"
        )
    };
    std::fs::write(
        root.join("plain.yaml"),
        application("edge-plain", "edge/sets"),
    )
    .unwrap();
    std::fs::write(
        root.join("sets/set.json"),
        serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "ApplicationSet",
            "metadata": {"name": "edge-set", "namespace": "argocd"},
            "spec": {
                "generators": [{"list": {"elements": [{"app": "edge-a"}]}}],
                "template": {
                    "metadata": {"name": "{{app}}"},
                    "spec": {
                        "project": "default",
                        "source": {"repoURL": url, "targetRevision": "HEAD", "path": "edge/config"},
                        "destination": {"name": "prod-eu", "namespace": "edge"},
                    },
                },
            },
        })
        .to_string(),
    )
    .unwrap();
    let config_map = |value: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: edge\ndata:\n  value: \"{value}\"\n"
        )
    };
    std::fs::write(root.join("config/cm.yaml"), config_map("base")).unwrap();
    git(repo.path(), &["add", "-A"]);
    git(repo.path(), &["commit", "-q", "-m", "the ApplicationSet"]);
    let config = config(repo.path(), cache());
    // The chart deploys edge-a exactly as the ApplicationSet generates it.
    let generated = render::render(&config, "HEAD")
        .unwrap()
        .applications
        .into_iter()
        .find(|a| a.name == "edge-a")
        .unwrap();
    assert!(matches!(
        generated.origin,
        render::Origin::ApplicationSet { .. }
    ));
    std::fs::write(
        root.join("chart/Chart.yaml"),
        "apiVersion: v2\nname: edge\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        root.join("chart/templates/a.yaml"),
        generated.manifest.to_string(),
    )
    .unwrap();
    std::fs::write(
        root.join("helm.yaml"),
        application("edge-helm", "edge/chart"),
    )
    .unwrap();
    git(repo.path(), &["add", "-A"]);
    git(
        repo.path(),
        &["commit", "-q", "-m", "and a chart deploying it"],
    );
    let base = repo.head();
    git(repo.path(), &["checkout", "-q", "-b", "pr"]);
    std::fs::write(root.join("config/cm.yaml"), config_map("head")).unwrap();
    git(repo.path(), &["commit", "-q", "-am", "the config changes"]);
    let head = repo.head();
    let unsharded = check::check_commits(&config, base.clone(), head.clone());
    assert_ne!(
        unsharded.verdict.outcome,
        gitops_loop::gate::verdict::Outcome::Undecided,
        "{:?}",
        unsharded.verdict.errors
    );
    let at_head = render::render(&config, &head).unwrap();
    let spec = |name: &str| {
        at_head
            .applications
            .iter()
            .find(|a| a.name == name)
            .map(|a| a.manifest.clone())
            .unwrap()
    };
    let (parent, child) = (spec("edge-helm"), spec("edge-a"));
    let (head_keys, weights) = render::shard_keys_weighed(&config, &head).unwrap();
    let together: Vec<usize> = (2..=8)
        .filter(|&count| {
            let stripes = render::Stripes::weighted(head_keys.values(), &weights, count);
            let shard_of = |app| stripes.of(&render::shard_key(app));
            shard_of(&parent) == shard_of(&child)
        })
        .collect();
    assert!(!together.is_empty(), "a count puts both in one shard");
    for count in std::iter::once(1).chain(together) {
        let merged =
            sharded(&config, &base, &head, count).unwrap_or_else(|e| panic!("{count} shards: {e}"));
        assert_same(&unsharded, &merged);
    }
}
