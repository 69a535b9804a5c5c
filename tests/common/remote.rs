//! The remote render cache's stories, played by the real gate binary on the sample repository
//! and a pull request that blocks (`chart-renders-unserved`), against any object store a
//! [`Store`] puts on loopback: S3 (tests/remote_cache.rs, `ground::s3`), Google Cloud Storage
//! and Azure (tests/remote_cache_cloud.rs, fake-gcs-server and Azurite). Each story is one
//! function taking the store, so every provider plays the same one.
//!
//! Included with `#[path = "common/remote.rs"] mod remote;` beside `mod common;` by the files
//! that use it, not by every test binary.

use std::path::Path;

use serde_json::Value;

use crate::common;

/// The prefix every store's cache URL names: `<scheme>://<bucket>/fleet`.
pub const PREFIX: &str = "fleet";

/// A bucket (container) on a server of the provider's protocol, on loopback.
pub trait Store {
    /// The `--cache-url`: `<scheme>://<bucket>/fleet`.
    fn url(&self) -> String;
    /// The variables the gate's client needs to reach it (endpoint, credentials).
    fn env(&self) -> Vec<(String, String)>;
    /// The variable that names the endpoint (`AWS_ENDPOINT_URL`, ...): set to a closed port,
    /// the store is unreachable.
    fn endpoint_variable(&self) -> &'static str;
    /// Every object's key, sorted.
    fn keys(&self) -> Vec<String>;
    /// An object's bytes.
    fn read(&self, key: &str) -> Vec<u8>;
    /// Replaces (or makes) an object, as someone who can write the bucket would.
    fn write(&self, key: &str, bytes: &[u8]);
}

/// A pull request on the sample repository that blocks, and a store with an empty bucket.
pub struct Fleet {
    pub repo: common::TestRepo,
    pub store: Box<dyn Store>,
    pub url: String,
    pub signing: String,
    pub public: String,
}

pub fn fleet(store: Box<dyn Store>) -> Fleet {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let case = common::project_root().join("tests/check-cases/chart-renders-unserved");
    repo.commit_overlay(&case.join("base"), "main", "base change");
    repo.commit_overlay(&case.join("head"), "pr", "the pull request");
    let (signing, public) = keygen();
    Fleet {
        repo,
        url: store.url(),
        store,
        signing,
        public,
    }
}

/// `gate cache keygen`: (signing key, public key).
pub fn keygen() -> (String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(["cache", "keygen"])
        .output()
        .expect("gate cache keygen runs");
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let value = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .expect("a key line")
            .to_string()
    };
    (
        value("GATE_CACHE_SIGNING_KEY="),
        value("GATE_CACHE_PUBLIC_KEY="),
    )
}

/// Who runs the check: a default-branch run holds the signing key, a pull request's run the
/// public key only.
pub enum Runner<'a> {
    Writer(&'a str),
    Reader(&'a str),
    /// No remote cache at all.
    Local,
}

pub struct Run {
    pub code: i32,
    pub verdict: Value,
    pub stderr: String,
    url: String,
}

impl Run {
    /// (done, planned, from cache) of the progress line's last state.
    pub fn progress(&self) -> (usize, usize, usize) {
        let line = regex::Regex::new(r"gate: check: (\d+)/(\d+) renders, (\d+) from cache")
            .expect("a regex");
        let last = line.captures_iter(&self.stderr).last().expect(&self.stderr);
        let n = |i: usize| last[i].parse().expect("a count");
        (n(1), n(2), n(3))
    }

    /// The remote cache's stats line: (hits, misses, rejected, written or None when read-only,
    /// write failures).
    pub fn remote(&self) -> (usize, usize, usize, Option<(usize, usize)>) {
        let line = regex::Regex::new(&format!(
            r"gate: remote cache {}: (\d+) hits, (\d+) misses \((\d+) rejected\), (?:read-only|(\d+) written, (\d+) write failures)",
            regex::escape(&self.url)
        ))
        .expect("a regex");
        let c = line.captures(&self.stderr).expect(&self.stderr);
        let n = |i: usize| c.get(i).map(|m| m.as_str().parse().expect("a count"));
        (
            n(1).expect("hits"),
            n(2).expect("misses"),
            n(3).expect("rejected"),
            n(4).map(|written| (written, n(5).expect("write failures"))),
        )
    }
}

pub fn check(fleet: &Fleet, local: &Path, runner: Runner, env: &[(String, String)]) -> Run {
    let out = tempfile::tempdir().expect("a temp dir");
    let mut command = common::gate_check_sample(local, fleet.repo.path());
    command
        .arg("--json")
        .arg(out.path().join("verdict.json"))
        .env("GATE_PROGRESS", "always")
        .env_remove("GATE_CACHE_SIGNING_KEY")
        .env_remove("GATE_CACHE_PUBLIC_KEY")
        .env_remove("GATE_CACHE_URL");
    match runner {
        Runner::Writer(key) => {
            command
                .args(["--cache-url", &fleet.url])
                .env("GATE_CACHE_SIGNING_KEY", key);
        }
        Runner::Reader(key) => {
            command.args(["--cache-url", &fleet.url, "--cache-public-key", key]);
        }
        Runner::Local => {}
    }
    for (name, value) in fleet.store.env().iter().chain(env.iter()) {
        command.env(name, value);
    }
    let output = command.output().expect("the gate runs");
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let verdict = std::fs::read_to_string(out.path().join("verdict.json"))
        .map(|text| serde_json::from_str(&text).expect("the verdict is JSON"))
        .unwrap_or_else(|_| panic!("no verdict: {stderr}"));
    Run {
        code: output.status.code().expect("an exit code"),
        verdict,
        stderr,
        url: fleet.url.clone(),
    }
}

/// The keys of the bucket's render entries.
pub fn entries(fleet: &Fleet) -> Vec<String> {
    fleet
        .store
        .keys()
        .into_iter()
        .filter(|key| key.starts_with(&format!("{PREFIX}/render/")))
        .collect()
}

fn empty_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temp dir")
}

/// A cold run with the signing key writes every render it made; a new runner (an empty local
/// cache) that only holds the public key then renders nothing, every render a remote hit, and
/// gives the same verdict; what it read is on its disk afterwards; `gate render` on another
/// new runner runs no helm or kustomize.
pub fn a_new_runner_with_a_warm_remote_cache_renders_nothing_and_judges_the_same(fleet: &Fleet) {
    let cold_disk = empty_dir();
    let cold = check(fleet, cold_disk.path(), Runner::Writer(&fleet.signing), &[]);
    assert_eq!(cold.code, 1, "the pull request blocks: {}", cold.stderr);
    let (hits, misses, rejected, written) = cold.remote();
    assert!(misses > 0, "{}", cold.stderr);
    assert_eq!((hits, rejected), (0, 0), "{}", cold.stderr);
    assert_eq!(
        written,
        Some((misses, 0)),
        "every render written: {}",
        cold.stderr
    );
    assert_eq!(entries(fleet).len(), misses, "one object per render");
    let (done, planned, from_cache) = cold.progress();
    assert_eq!((done, from_cache), (planned, 0), "{}", cold.stderr);

    // A new runner: an empty disk, the public key only.
    let warm_disk = empty_dir();
    let warm = check(fleet, warm_disk.path(), Runner::Reader(&fleet.public), &[]);
    assert_eq!(warm.code, cold.code);
    assert_eq!(
        warm.verdict, cold.verdict,
        "the same verdict, byte for byte"
    );
    // Every render key the run needed was looked up (the other commit's render takes what
    // one claimed) and answered: no helm or kustomize ran.
    assert_eq!(warm.remote(), (misses, 0, 0, None), "{}", warm.stderr);
    let (done, planned, from_cache) = warm.progress();
    assert_eq!((done, from_cache), (planned, misses), "{}", warm.stderr);
    assert_eq!(entries(fleet).len(), misses, "a reader writes nothing");

    // What it read is on its disk: the next run there needs no remote.
    let again = check(fleet, warm_disk.path(), Runner::Reader(&fleet.public), &[]);
    assert_eq!(again.remote(), (0, 0, 0, None), "{}", again.stderr);
    assert_eq!(again.verdict, cold.verdict);

    // `gate render` on another new runner: no helm, no kustomize.
    let render_disk = empty_dir();
    let mut render = common::gate(render_disk.path());
    render
        .args([
            "render",
            "--revision",
            "pr",
            "--repo-url",
            common::SAMPLE_REPO_URL,
        ])
        .arg("--repo")
        .arg(fleet.repo.path())
        .arg("--inventory")
        .arg(common::sample_dir().join("inventory.yaml"))
        .arg("--charts")
        .arg(common::sample_dir().join("charts"))
        .args([
            "--cache-url",
            &fleet.url,
            "--cache-public-key",
            &fleet.public,
        ])
        .env_remove("GATE_CACHE_SIGNING_KEY");
    for (name, value) in fleet.store.env() {
        render.env(name, value);
    }
    let output = render.output().expect("the gate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(": 0 helm, 0 kustomize,"), "{stderr}");
    assert!(
        stderr.contains(" 0 misses (0 rejected), read-only"),
        "{stderr}"
    );
}

/// An object corrupted, truncated or replaced by another entry's is a miss (counted, named)
/// and rendered again, the verdict unchanged; a writer heals it.
pub fn a_corrupted_truncated_or_foreign_object_is_a_miss_and_rendered_again(fleet: &Fleet) {
    let cold = check(
        fleet,
        empty_dir().path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
    let objects = entries(fleet);
    assert!(objects.len() >= 4, "{objects:?}");
    let store = &fleet.store;
    // One byte of the (compressed) output changed.
    let mut corrupted = store.read(&objects[0]);
    let last = corrupted.len() - 2;
    corrupted[last] ^= 0x5a;
    store.write(&objects[0], &corrupted);
    // The last bytes cut off.
    let truncated = store.read(&objects[1]);
    store.write(&objects[1], &truncated[..truncated.len() - 10]);
    // Another entry's honest, signed object under this name.
    store.write(&objects[2], &store.read(&objects[3]));

    let total = objects.len();
    let run = three_misses_named(
        fleet,
        &cold,
        [
            (&objects[0], "corrupted?"),
            (&objects[1], "truncated"),
            (&objects[2], "another entry's name"),
        ],
    );
    let (_, _, from_cache) = run.progress();
    assert_eq!(
        from_cache,
        total - 3,
        "three rendered again: {}",
        run.stderr
    );

    // A writer that meets them renders them and writes them whole again.
    let heal = check(
        fleet,
        empty_dir().path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
    assert_eq!(
        heal.remote(),
        (total - 3, 3, 3, Some((3, 0))),
        "{}",
        heal.stderr
    );
    let healed = check(
        fleet,
        empty_dir().path(),
        Runner::Reader(&fleet.public),
        &[],
    );
    assert_eq!(healed.remote(), (total, 0, 0, None), "{}", healed.stderr);
    assert_eq!(healed.verdict, cold.verdict);
}

/// Whoever can write the bucket copies an honest header over another body: one that expands
/// to 64 MiB, or the honest body padded with a skippable zstd frame (a little, and past what
/// the output compressed may be). Each is a miss, named, and rendered again, the verdict
/// unchanged: the decoder never reads a byte the signature does not cover, and the padding
/// is refused as it arrives.
pub fn an_honest_header_over_another_body_is_a_miss(fleet: &Fleet) {
    let cold = check(
        fleet,
        empty_dir().path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
    let store = &fleet.store;
    let signed_size = |object: &[u8]| -> usize {
        let header = std::str::from_utf8(&object[..body_at(object)]).expect("a text header");
        header
            .lines()
            .find_map(|l| l.strip_prefix("size "))
            .and_then(|n| n.parse().ok())
            .expect("a size line")
    };
    // The largest output first: the bomb must fit what its header's size allows.
    let mut objects: Vec<(String, Vec<u8>)> = entries(fleet)
        .into_iter()
        .map(|key| {
            let object = store.read(&key);
            (key, object)
        })
        .collect();
    objects.sort_by_key(|(_, object)| std::cmp::Reverse(signed_size(object)));
    assert!(objects.len() >= 3, "{}", objects.len());
    let skippable = |n: usize| {
        let mut frame = vec![0x50, 0x2a, 0x4d, 0x18];
        frame.extend_from_slice(&u32::try_from(n).expect("a u32").to_le_bytes());
        frame.resize(8 + n, 0);
        frame
    };
    let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).expect("zstd");
    let (largest, honest) = &objects[0];
    assert!(signed_size(honest) >= bomb.len(), "{}", bomb.len());
    store.write(largest, &[&honest[..body_at(honest)], &bomb].concat());
    let (padded, honest) = &objects[1];
    store.write(padded, &[honest.as_slice(), &skippable(16)].concat());
    let (overlong, honest) = &objects[2];
    store.write(overlong, &[honest.as_slice(), &skippable(4 << 20)].concat());

    three_misses_named(
        fleet,
        &cold,
        [
            (largest, "digest differs"),
            (padded, "digest differs"),
            (overlong, "longer than its output compressed may be"),
        ],
    );
}

/// A new runner reading the remote cache after three of its objects were spoiled: the
/// verdict and exit code of `cold`, the three objects misses, each named with why it was not
/// believed, every other object a hit.
fn three_misses_named(fleet: &Fleet, cold: &Run, spoiled: [(&String, &str); 3]) -> Run {
    let run = check(
        fleet,
        empty_dir().path(),
        Runner::Reader(&fleet.public),
        &[],
    );
    assert_eq!(run.code, cold.code);
    assert_eq!(run.verdict, cold.verdict, "the verdict unchanged");
    let total = entries(fleet).len();
    assert_eq!(run.remote(), (total - 3, 3, 3, None), "{}", run.stderr);
    for (key, why) in spoiled {
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains(&format!("{key} not believed")) && l.contains(why)),
            "{key}: {why}: {}",
            run.stderr
        );
    }
    run
}

/// Where an object's body begins: after its header's blank line.
fn body_at(object: &[u8]) -> usize {
    object
        .windows(2)
        .position(|w| w == b"\n\n")
        .expect("a header")
        + 2
}

/// An object as someone who can write the bucket but holds no trusted key would make it:
/// `forge`'s output under the honest header's entry, compressed as the gate writes it, with
/// its body's digest and its size, and the signature line `sign` gives for the five signed
/// lines.
fn forged(honest: &[u8], forge: impl Fn(&str) -> String, sign: impl Fn(&str) -> String) -> Vec<u8> {
    use sha2::Digest as _;
    let body_at = body_at(honest);
    let header = std::str::from_utf8(&honest[..body_at]).expect("a text header");
    let lines: Vec<&str> = header.lines().collect();
    let (magic, entry, encoding) = (lines[0], lines[1], lines[4]);
    let honest_signature = lines[5].to_string();
    let honest_output = zstd::bulk::decompress(&honest[body_at..], 1 << 30).expect("a zstd frame");
    let output = forge(std::str::from_utf8(&honest_output).expect("UTF-8"));
    let body = zstd::bulk::compress(output.as_bytes(), 3).expect("zstd");
    let signed = format!(
        "{magic}\n{entry}\nsha256 {}\nsize {}\n{encoding}\n",
        hex::encode(sha2::Sha256::digest(&body)),
        output.len()
    );
    let signature = match sign(&signed) {
        s if s.is_empty() => honest_signature,
        s => format!("signature {s}"),
    };
    let mut object = format!("{signed}{signature}\n\n").into_bytes();
    object.extend_from_slice(&body);
    object
}

/// A pull request's run (no signing key) writes nothing, and objects planted by whoever can
/// write the bucket without the key (a forgery that would turn the red verdict green, signed
/// with another key or carrying an honest signature) are not believed.
pub fn a_pull_request_run_cannot_poison_the_cache(fleet: &Fleet) {
    use base64::Engine as _;
    // A pull request's run against an empty bucket renders everything and writes nothing.
    let pr = check(
        fleet,
        empty_dir().path(),
        Runner::Reader(&fleet.public),
        &[],
    );
    assert_eq!(pr.code, 1, "{}", pr.stderr);
    let (hits, misses, _, written) = pr.remote();
    assert!(
        hits == 0 && misses > 0 && written.is_none(),
        "{}",
        pr.stderr
    );
    assert!(entries(fleet).is_empty(), "nothing written");

    // The default branch fills it.
    let honest = check(
        fleet,
        empty_dir().path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
    assert_eq!(honest.verdict, pr.verdict);
    let objects = entries(fleet);

    // Whoever can write the bucket (a pull request's job given write credentials) but holds
    // no signing key rewrites every object: the CRD serves v1alpha1 again in the render, the
    // finding that blocks is gone. First signed with the attacker's own key.
    let (attacker_signing, attacker_public) = keygen();
    let seed: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&attacker_signing)
        .expect("base64")
        .try_into()
        .expect("32 bytes");
    let attacker =
        ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).expect("an Ed25519 key");
    let forgery = |output: &str| output.replace("served: false", "served: true");
    let honest_objects: Vec<Vec<u8>> = objects.iter().map(|key| fleet.store.read(key)).collect();
    let plant = |sign: &dyn Fn(&str) -> String| {
        let mut changed = 0;
        for (key, honest_object) in objects.iter().zip(&honest_objects) {
            let object = forged(honest_object, forgery, sign);
            changed += usize::from(object != *honest_object);
            fleet.store.write(key, &object);
        }
        assert!(changed > 0, "some render serves v1alpha1 no longer");
        changed
    };
    plant(&|signed: &str| {
        base64::engine::general_purpose::STANDARD.encode(attacker.sign(signed.as_bytes()).as_ref())
    });

    // The forgery matters: a runner that trusted the attacker's key would judge the pull
    // request otherwise.
    let fooled = check(
        fleet,
        empty_dir().path(),
        Runner::Reader(&attacker_public),
        &[],
    );
    assert_eq!(fooled.remote().0, objects.len(), "{}", fooled.stderr);
    assert_ne!(fooled.verdict, honest.verdict, "{}", fooled.stderr);

    // Every runner that trusts the default branch's key believes none of it: signed with
    // another key, or (planted next) carrying the honest signature over other lines (the
    // objects whose output the forgery left alone are the honest ones again, and believed).
    let total = objects.len();
    for variant in ["another key", "the honest signature"] {
        let planted = if variant == "the honest signature" {
            plant(&|_: &str| String::new())
        } else {
            total
        };
        let run = check(
            fleet,
            empty_dir().path(),
            Runner::Reader(&fleet.public),
            &[],
        );
        assert_eq!(run.code, 1, "{variant}: {}", run.stderr);
        assert_eq!(
            run.verdict, honest.verdict,
            "{variant}: the pull request still blocks"
        );
        assert_eq!(
            run.remote(),
            (total - planted, planted, planted, None),
            "{variant}: {}",
            run.stderr
        );
        assert!(
            run.stderr.contains("not signed by the trusted key"),
            "{variant}: {}",
            run.stderr
        );
    }
}

/// An unreachable store (its endpoint a loopback port nothing listens on) degrades to the
/// local cache with one warning, same verdict.
pub fn an_unreachable_store_degrades_to_the_local_cache_with_one_warning(fleet: &Fleet) {
    let baseline = check(fleet, empty_dir().path(), Runner::Local, &[]);
    // A loopback port nothing listens on: connections are refused.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("an address").port()
    };
    let started = std::time::Instant::now();
    let run = check(
        fleet,
        empty_dir().path(),
        Runner::Writer(&fleet.signing),
        &[(
            fleet.store.endpoint_variable().to_string(),
            format!("http://127.0.0.1:{closed}"),
        )],
    );
    let took = started.elapsed();
    assert_eq!(run.code, baseline.code, "{}", run.stderr);
    assert_eq!(run.verdict, baseline.verdict);
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(" unreachable ("))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning line: {}", run.stderr);
    assert!(
        warnings[0].contains("rendering with the local cache only"),
        "{}",
        warnings[0]
    );
    let (hits, misses, _, written) = run.remote();
    assert_eq!((hits, written.map(|w| w.0)), (0, Some(0)), "{}", run.stderr);
    assert_eq!(
        written.map(|w| w.1),
        Some(misses),
        "every write skipped, counted"
    );
    assert!(
        run.stderr.contains("; unreachable, the local cache only"),
        "{}",
        run.stderr
    );
    // Refused connections cost retries of a fraction of a second, not the render deadline.
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
}
