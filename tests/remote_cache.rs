//! The remote render cache (`gate --cache-url s3://...`) against a real S3-protocol server on
//! loopback (`ground::s3`: s3s-fs with SigV4 authentication), with the real gate binary on the
//! sample repository and a pull request that blocks (`chart-renders-unserved`):
//!
//! - a cold run with the signing key writes every render it made; a new runner (an empty
//!   local cache) that only holds the public key then renders nothing, every render a remote
//!   hit, and gives the same verdict; what it read is on its disk afterwards;
//! - an object corrupted, truncated or replaced by another entry's is a miss (counted, named)
//!   and rendered again, the verdict unchanged; a writer heals it;
//! - a pull request's run (no signing key) writes nothing, and objects planted by whoever can
//!   write the bucket without the key (a forgery that would turn the red verdict green, signed
//!   with another key or carrying an honest signature) are not believed;
//! - an unreachable store degrades to the local cache with one warning, same verdict;
//! - a remote cache without a key to trust by, or a URL that is not `s3://`, is refused (exit 2).

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::Path;

use ground::s3::S3Server;
use serde_json::Value;

const BUCKET: &str = "gate-cache";
const URL: &str = "s3://gate-cache/fleet";

/// A pull request on the sample repository that blocks, and an S3 server with an empty bucket.
struct Fleet {
    repo: common::TestRepo,
    s3: S3Server,
    _root: tempfile::TempDir,
    signing: String,
    public: String,
}

fn fleet() -> Fleet {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let case = common::project_root().join("tests/check-cases/chart-renders-unserved");
    repo.commit_overlay(&case.join("base"), "main", "base change");
    repo.commit_overlay(&case.join("head"), "pr", "the pull request");
    let root = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(root.path()).unwrap();
    s3.create_bucket(BUCKET).unwrap();
    let (signing, public) = keygen();
    Fleet {
        repo,
        s3,
        _root: root,
        signing,
        public,
    }
}

/// `gate cache keygen`: (signing key, public key).
fn keygen() -> (String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gate"))
        .args(["cache", "keygen"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    let value = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .to_string()
    };
    (
        value("GATE_CACHE_SIGNING_KEY="),
        value("GATE_CACHE_PUBLIC_KEY="),
    )
}

/// Who runs the check: a default-branch run holds the signing key, a pull request's run the
/// public key only.
enum Runner<'a> {
    Writer(&'a str),
    Reader(&'a str),
    /// No remote cache at all.
    Local,
}

struct Run {
    code: i32,
    verdict: Value,
    stderr: String,
}

impl Run {
    /// (done, planned, from cache) of the progress line's last state.
    fn progress(&self) -> (usize, usize, usize) {
        let line =
            regex::Regex::new(r"gate: check: (\d+)/(\d+) renders, (\d+) from cache").unwrap();
        let last = line.captures_iter(&self.stderr).last().expect(&self.stderr);
        let n = |i: usize| last[i].parse().unwrap();
        (n(1), n(2), n(3))
    }

    /// The remote cache's stats line: (hits, misses, rejected, written or None when read-only,
    /// write failures).
    fn remote(&self) -> (usize, usize, usize, Option<(usize, usize)>) {
        let line = regex::Regex::new(&format!(
            r"gate: remote cache {URL}: (\d+) hits, (\d+) misses \((\d+) rejected\), (?:read-only|(\d+) written, (\d+) write failures)"
        ))
        .unwrap();
        let c = line.captures(&self.stderr).expect(&self.stderr);
        let n = |i: usize| c.get(i).map(|m| m.as_str().parse().unwrap());
        (
            n(1).unwrap(),
            n(2).unwrap(),
            n(3).unwrap(),
            n(4).map(|written| (written, n(5).unwrap())),
        )
    }
}

fn check(fleet: &Fleet, local: &Path, runner: Runner, env: &[(&str, String)]) -> Run {
    let out = tempfile::tempdir().unwrap();
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
                .args(["--cache-url", URL])
                .env("GATE_CACHE_SIGNING_KEY", key);
        }
        Runner::Reader(key) => {
            command.args(["--cache-url", URL, "--cache-public-key", key]);
        }
        Runner::Local => {}
    }
    for (name, value) in fleet.s3.env().iter().chain(env.iter()) {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let verdict = std::fs::read_to_string(out.path().join("verdict.json"))
        .map(|text| serde_json::from_str(&text).unwrap())
        .unwrap_or_else(|_| panic!("no verdict: {stderr}"));
    Run {
        code: output.status.code().unwrap(),
        verdict,
        stderr,
    }
}

/// The object files of the bucket's render entries.
fn entries(fleet: &Fleet) -> Vec<String> {
    fleet
        .s3
        .objects(BUCKET)
        .into_iter()
        .filter(|key| key.starts_with("fleet/render/"))
        .collect()
}

#[test]
fn a_new_runner_with_a_warm_remote_cache_renders_nothing_and_judges_the_same() {
    let fleet = fleet();
    let cold_disk = tempfile::tempdir().unwrap();
    let cold = check(
        &fleet,
        cold_disk.path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
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
    assert_eq!(entries(&fleet).len(), misses, "one object per render");
    let (done, planned, from_cache) = cold.progress();
    assert_eq!((done, from_cache), (planned, 0), "{}", cold.stderr);

    // A new runner: an empty disk, the public key only.
    let warm_disk = tempfile::tempdir().unwrap();
    let warm = check(&fleet, warm_disk.path(), Runner::Reader(&fleet.public), &[]);
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
    assert_eq!(entries(&fleet).len(), misses, "a reader writes nothing");

    // What it read is on its disk: the next run there needs no remote.
    let again = check(&fleet, warm_disk.path(), Runner::Reader(&fleet.public), &[]);
    assert_eq!(again.remote(), (0, 0, 0, None), "{}", again.stderr);
    assert_eq!(again.verdict, cold.verdict);

    // `gate render` on another new runner: no helm, no kustomize.
    let render_disk = tempfile::tempdir().unwrap();
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
        .args(["--cache-url", URL, "--cache-public-key", &fleet.public])
        .env_remove("GATE_CACHE_SIGNING_KEY");
    for (name, value) in fleet.s3.env() {
        render.env(name, value);
    }
    let output = render.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(": 0 helm, 0 kustomize,"), "{stderr}");
    assert!(
        stderr.contains(" 0 misses (0 rejected), read-only"),
        "{stderr}"
    );
}

#[test]
fn a_corrupted_truncated_or_foreign_object_is_a_miss_and_rendered_again() {
    let fleet = fleet();
    let cold = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
    let objects = entries(&fleet);
    assert!(objects.len() >= 4, "{objects:?}");
    let file = |key: &str| fleet.s3.object_file(BUCKET, key);
    // One byte of the output changed.
    let mut corrupted = std::fs::read(file(&objects[0])).unwrap();
    let last = corrupted.len() - 2;
    corrupted[last] ^= 0x01;
    std::fs::write(file(&objects[0]), corrupted).unwrap();
    // The last bytes cut off.
    let truncated = std::fs::read(file(&objects[1])).unwrap();
    std::fs::write(file(&objects[1]), &truncated[..truncated.len() - 10]).unwrap();
    // Another entry's honest, signed object under this name.
    std::fs::copy(file(&objects[3]), file(&objects[2])).unwrap();

    let run = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
        Runner::Reader(&fleet.public),
        &[],
    );
    assert_eq!(run.code, cold.code);
    assert_eq!(run.verdict, cold.verdict, "the verdict unchanged");
    let total = objects.len();
    assert_eq!(run.remote(), (total - 3, 3, 3, None), "{}", run.stderr);
    let (_, _, from_cache) = run.progress();
    assert_eq!(
        from_cache,
        total - 3,
        "three rendered again: {}",
        run.stderr
    );
    for (key, why) in [
        (&objects[0], "digest differs"),
        (&objects[1], "size differs"),
        (&objects[2], "another entry's name"),
    ] {
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains(&format!("{key} not believed")) && l.contains(why)),
            "{key}: {why}: {}",
            run.stderr
        );
    }

    // A writer that meets them renders them and writes them whole again.
    let heal = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
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
        &fleet,
        tempfile::tempdir().unwrap().path(),
        Runner::Reader(&fleet.public),
        &[],
    );
    assert_eq!(healed.remote(), (total, 0, 0, None), "{}", healed.stderr);
    assert_eq!(healed.verdict, cold.verdict);
}

/// An object as someone who can write the bucket but holds no trusted key would make it:
/// `forge`'s output under the honest header's entry, with its own digest and size, and the
/// signature line `sign` gives for the four signed lines.
fn forged(honest: &[u8], forge: impl Fn(&str) -> String, sign: impl Fn(&str) -> String) -> Vec<u8> {
    use sha2::Digest as _;
    let text = String::from_utf8(honest.to_vec()).unwrap();
    let (header, output) = text.split_once("\n\n").unwrap();
    let mut lines = header.lines();
    let (magic, entry) = (lines.next().unwrap(), lines.next().unwrap());
    let honest_signature = header.lines().nth(4).unwrap().to_string();
    let output = forge(output);
    let signed = format!(
        "{magic}\n{entry}\nsha256 {}\nsize {}\n",
        hex::encode(sha2::Sha256::digest(output.as_bytes())),
        output.len()
    );
    let signature = match sign(&signed) {
        s if s.is_empty() => honest_signature,
        s => format!("signature {s}"),
    };
    format!("{signed}{signature}\n\n{output}").into_bytes()
}

#[test]
fn a_pull_request_run_cannot_poison_the_cache() {
    use base64::Engine as _;
    let fleet = fleet();
    // A pull request's run against an empty bucket renders everything and writes nothing.
    let pr = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
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
    assert!(entries(&fleet).is_empty(), "nothing written");

    // The default branch fills it.
    let honest = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
        Runner::Writer(&fleet.signing),
        &[],
    );
    assert_eq!(honest.verdict, pr.verdict);
    let objects = entries(&fleet);

    // Whoever can write the bucket (a pull request's job given write credentials) but holds
    // no signing key rewrites every object: the CRD serves v1alpha1 again in the render, the
    // finding that blocks is gone. First signed with the attacker's own key.
    let (attacker_signing, attacker_public) = keygen();
    let seed: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&attacker_signing)
        .unwrap()
        .try_into()
        .unwrap();
    let attacker = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
    let forgery = |output: &str| output.replace("served: false", "served: true");
    let honest_objects: Vec<Vec<u8>> = objects
        .iter()
        .map(|key| std::fs::read(fleet.s3.object_file(BUCKET, key)).unwrap())
        .collect();
    let plant = |sign: &dyn Fn(&str) -> String| {
        let mut changed = 0;
        for (key, honest_object) in objects.iter().zip(&honest_objects) {
            let object = forged(honest_object, forgery, sign);
            changed += usize::from(object != *honest_object);
            std::fs::write(fleet.s3.object_file(BUCKET, key), object).unwrap();
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
        &fleet,
        tempfile::tempdir().unwrap().path(),
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
            &fleet,
            tempfile::tempdir().unwrap().path(),
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

#[test]
fn an_unreachable_store_degrades_to_the_local_cache_with_one_warning() {
    let fleet = fleet();
    let baseline = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
        Runner::Local,
        &[],
    );
    // A loopback port nothing listens on: connections are refused.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = std::time::Instant::now();
    let run = check(
        &fleet,
        tempfile::tempdir().unwrap().path(),
        Runner::Writer(&fleet.signing),
        &[("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{closed}"))],
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

#[test]
fn a_remote_cache_without_a_key_to_trust_or_an_s3_url_is_refused() {
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    let cache = tempfile::tempdir().unwrap();
    let (signing, _) = keygen();
    let (_, other_public) = keygen();
    let run = |args: &[&str], signing: Option<&str>| {
        let mut command = common::gate(cache.path());
        command
            .args(["render", "--repo-url", common::SAMPLE_REPO_URL])
            .arg("--repo")
            .arg(repo.path())
            .args(args)
            .env_remove("GATE_CACHE_PUBLIC_KEY")
            .env_remove("GATE_CACHE_URL");
        match signing {
            Some(key) => command.env("GATE_CACHE_SIGNING_KEY", key),
            None => command.env_remove("GATE_CACHE_SIGNING_KEY"),
        };
        let output = command.output().unwrap();
        (
            output.status.code().unwrap(),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let (code, stdout, stderr) = run(&["--cache-url", URL], None);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--cache-public-key"), "{stderr}");
    let (code, _, stderr) = run(
        &["--cache-url", URL, "--cache-public-key", &other_public],
        Some(&signing),
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not the key of"), "{stderr}");
    for url in [
        "https://bucket.example/prefix",
        "s3://Bad_Bucket/x",
        "s3://bucket/../x",
    ] {
        let (code, _, stderr) = run(
            &["--cache-url", url, "--cache-public-key", &other_public],
            None,
        );
        assert_eq!(code, 2, "{url}: {stderr}");
        assert!(stderr.contains("--cache-url"), "{url}: {stderr}");
    }
}
