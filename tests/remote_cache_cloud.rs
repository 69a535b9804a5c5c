//! The remote render cache on Google Cloud Storage (`gs://`) and Azure Blob Storage (`az://`),
//! against real-protocol servers on loopback: fake-gcs-server (built from
//! real/go/fake-gcs-server) and Azurite (Microsoft's emulator, from npm), both started here
//! (`real_cluster::cloud`). The stories are the S3 test's (tests/common/remote.rs): a signed
//! write then a new runner reading every render as a hit with the same verdict; corrupted,
//! truncated and foreign objects; planted forgeries not believed; an unreachable endpoint
//! degrading with one warning.
//!
//! The real tier (`cargo xtask test --real`, or `cargo xtask real build` then
//! `GITOPS_LOOP_REAL=1`): without it each test says it is skipped and why; with it a missing
//! program is a failure.
//!
//! Where the emulators differ from the real services, as far as these stories go:
//! - fake-gcs-server takes any bearer token (object_store's `disable_oauth` sends an empty
//!   one); real Cloud Storage refuses it with 401, which the cache reads as an unreachable
//!   store (one warning, the local cache only), as it does any refused credential but 403.
//! - A missing object is 404 on both emulators, as on both services for a principal that may
//!   read the bucket. Real Cloud Storage answers 403 instead to a principal without
//!   `storage.objects.get`, and Azure 403 (AuthorizationPermissionMismatch) to a SAS or role
//!   without read: object_store's PermissionDenied, which the cache counts as a miss, not an
//!   outage (src/remote_cache.rs), as for S3 without s3:ListBucket.
//! - fake-gcs-server lacks the XML API's plain object PUT that object_store writes with; the
//!   harness relays it as the emulator's signed-URL upload and adds the ETag real Cloud
//!   Storage answers with (real/src/cloud.rs says exactly what and why).

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;
#[path = "common/remote.rs"]
mod remote;

use std::sync::Arc;

use futures::StreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use real_cluster::cloud::{self, Azurite, FakeGcs};
use remote::{Fleet, PREFIX, Store};

const BUCKET: &str = "gate-cache";

/// Whether the real tier runs; if not, says which test is skipped and why.
fn real_tier(test: &str) -> bool {
    if std::env::var("GITOPS_LOOP_REAL").as_deref() == Ok("1") {
        return true;
    }
    eprintln!(
        "skipped {test}: needs fake-gcs-server and Azurite; run `cargo xtask test --real` (or `cargo xtask real build`, then GITOPS_LOOP_REAL=1)"
    );
    false
}

/// A bucket reached through object_store's own client for the provider, as whoever holds the
/// bucket's credentials would reach it (the tests' reads and plants).
struct Objects {
    url: String,
    env: Vec<(String, String)>,
    endpoint_variable: &'static str,
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    /// The server: stopped when the store is dropped.
    _server: Box<dyn std::any::Any>,
    _dir: tempfile::TempDir,
}

impl Store for Objects {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn env(&self) -> Vec<(String, String)> {
        self.env.clone()
    }
    fn endpoint_variable(&self) -> &'static str {
        self.endpoint_variable
    }
    fn keys(&self) -> Vec<String> {
        let prefix = ObjectPath::from(PREFIX);
        let mut keys: Vec<String> = self.runtime.block_on(async {
            self.store
                .list(Some(&prefix))
                .map(|meta| meta.unwrap().location.to_string())
                .collect()
                .await
        });
        keys.sort();
        keys
    }
    fn read(&self, key: &str) -> Vec<u8> {
        self.runtime.block_on(async {
            let got = self.store.get(&ObjectPath::from(key)).await.unwrap();
            got.bytes().await.unwrap().to_vec()
        })
    }
    fn write(&self, key: &str, bytes: &[u8]) {
        self.runtime.block_on(async {
            self.store
                .put(&ObjectPath::from(key), bytes.to_vec().into())
                .await
                .unwrap();
        });
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn pairs(env: Vec<(&'static str, String)>) -> Vec<(String, String)> {
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// fake-gcs-server with an empty bucket, for `gs://gate-cache/fleet`.
fn gcs() -> Fleet {
    gitops_loop::forge::github::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let layout = real_cluster::Layout::new(&common::project_root());
    let server = FakeGcs::start(&cloud::fake_gcs_server(&layout), dir.path()).unwrap();
    server.create_bucket(BUCKET).unwrap();
    let store = object_store::gcp::GoogleCloudStorageBuilder::new()
        .with_bucket_name(BUCKET)
        .with_config(
            object_store::gcp::GoogleConfigKey::BaseUrl,
            server.endpoint(),
        )
        .with_service_account_key(cloud::SERVICE_ACCOUNT_KEY)
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .unwrap();
    remote::fleet(Box::new(Objects {
        url: format!("gs://{BUCKET}/{PREFIX}"),
        env: pairs(server.env()),
        endpoint_variable: "GOOGLE_BASE_URL",
        store: Arc::new(store),
        runtime: runtime(),
        _server: Box::new(server),
        _dir: dir,
    }))
}

/// Azurite with an empty container, for `az://gate-cache/fleet`.
fn azure() -> Fleet {
    gitops_loop::forge::github::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = Azurite::start(&cloud::azurite_main(&common::project_root()), dir.path()).unwrap();
    server.create_container(BUCKET).unwrap();
    // The account's endpoint given as such (not the emulator mode, which reads its URL from
    // this process's environment).
    let store = object_store::azure::MicrosoftAzureBuilder::new()
        .with_account(cloud::AZURITE_ACCOUNT)
        .with_access_key(cloud::AZURITE_KEY)
        .with_endpoint(format!("{}/{}", server.endpoint(), cloud::AZURITE_ACCOUNT))
        .with_container_name(BUCKET)
        .with_allow_http(true)
        .build()
        .unwrap();
    remote::fleet(Box::new(Objects {
        url: format!("az://{BUCKET}/{PREFIX}"),
        env: pairs(server.env()),
        endpoint_variable: "AZURITE_BLOB_STORAGE_URL",
        store: Arc::new(store),
        runtime: runtime(),
        _server: Box::new(server),
        _dir: dir,
    }))
}

/// One test per story and provider.
macro_rules! stories {
    ($provider:ident) => {
        mod $provider {
            #[test]
            fn a_new_runner_with_a_warm_remote_cache_renders_nothing_and_judges_the_same() {
                if super::real_tier(concat!(stringify!($provider), "::warm runner")) {
                    super::remote::a_new_runner_with_a_warm_remote_cache_renders_nothing_and_judges_the_same(&super::$provider());
                }
            }

            #[test]
            fn a_corrupted_truncated_or_foreign_object_is_a_miss_and_rendered_again() {
                if super::real_tier(concat!(stringify!($provider), "::corrupted objects")) {
                    super::remote::a_corrupted_truncated_or_foreign_object_is_a_miss_and_rendered_again(&super::$provider());
                }
            }

            #[test]
            fn an_honest_header_over_another_body_is_a_miss() {
                if super::real_tier(concat!(stringify!($provider), "::another body")) {
                    super::remote::an_honest_header_over_another_body_is_a_miss(&super::$provider());
                }
            }

            #[test]
            fn a_pull_request_run_cannot_poison_the_cache() {
                if super::real_tier(concat!(stringify!($provider), "::poison")) {
                    super::remote::a_pull_request_run_cannot_poison_the_cache(&super::$provider());
                }
            }

            #[test]
            fn an_unreachable_store_degrades_to_the_local_cache_with_one_warning() {
                if super::real_tier(concat!(stringify!($provider), "::unreachable")) {
                    super::remote::an_unreachable_store_degrades_to_the_local_cache_with_one_warning(&super::$provider());
                }
            }
        }
    };
}

stories!(gcs);
stories!(azure);
