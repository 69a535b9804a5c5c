//! The remote render cache (`gate --cache-url s3://...`) against a real S3-protocol server on
//! loopback (`ground::s3`: s3s-fs with SigV4 authentication), with the real gate binary on the
//! sample repository and a pull request that blocks (`chart-renders-unserved`). The stories
//! are tests/common/remote.rs's, which Google Cloud Storage and Azure play too
//! (tests/remote_cache_cloud.rs):
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
//! - a remote cache without a key to trust by, or a URL that is not `s3://`, `gs://` or
//!   `az://` with a bucket name its provider takes, is refused (exit 2).

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;
#[path = "common/remote.rs"]
mod remote;

use ground::s3::S3Server;
use remote::{Fleet, Store, keygen};

const BUCKET: &str = "gate-cache";
const URL: &str = "s3://gate-cache/fleet";

/// `ground::s3`'s bucket: objects are files (`<root>/<bucket>/<key>`), read and written in
/// place.
struct S3 {
    server: S3Server,
    _root: tempfile::TempDir,
}

impl Store for S3 {
    fn url(&self) -> String {
        URL.to_string()
    }
    fn env(&self) -> Vec<(String, String)> {
        self.server
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }
    fn endpoint_variable(&self) -> &'static str {
        "AWS_ENDPOINT_URL"
    }
    fn keys(&self) -> Vec<String> {
        self.server.objects(BUCKET)
    }
    fn read(&self, key: &str) -> Vec<u8> {
        std::fs::read(self.server.object_file(BUCKET, key)).unwrap()
    }
    fn write(&self, key: &str, bytes: &[u8]) {
        std::fs::write(self.server.object_file(BUCKET, key), bytes).unwrap();
    }
}

fn fleet() -> Fleet {
    let root = tempfile::tempdir().unwrap();
    let server = S3Server::start(root.path()).unwrap();
    server.create_bucket(BUCKET).unwrap();
    remote::fleet(Box::new(S3 {
        server,
        _root: root,
    }))
}

#[test]
fn a_new_runner_with_a_warm_remote_cache_renders_nothing_and_judges_the_same() {
    remote::a_new_runner_with_a_warm_remote_cache_renders_nothing_and_judges_the_same(&fleet());
}

#[test]
fn a_corrupted_truncated_or_foreign_object_is_a_miss_and_rendered_again() {
    remote::a_corrupted_truncated_or_foreign_object_is_a_miss_and_rendered_again(&fleet());
}

#[test]
fn an_honest_header_over_another_body_is_a_miss() {
    remote::an_honest_header_over_another_body_is_a_miss(&fleet());
}

#[test]
fn a_pull_request_run_cannot_poison_the_cache() {
    remote::a_pull_request_run_cannot_poison_the_cache(&fleet());
}

#[test]
fn an_unreachable_store_degrades_to_the_local_cache_with_one_warning() {
    remote::an_unreachable_store_degrades_to_the_local_cache_with_one_warning(&fleet());
}

#[test]
fn a_remote_cache_without_a_key_to_trust_or_a_url_it_takes_is_refused() {
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
        "gs://goog-cache/x",
        "gs://bucket/a//b",
        "az://gate--cache/x",
        "abfss://cache@account.dfs.core.windows.net/x",
    ] {
        let (code, _, stderr) = run(
            &["--cache-url", url, "--cache-public-key", &other_public],
            None,
        );
        assert_eq!(code, 2, "{url}: {stderr}");
        assert!(stderr.contains("--cache-url"), "{url}: {stderr}");
        assert!(stderr.contains(url), "{url}: the URL named: {stderr}");
    }
}
