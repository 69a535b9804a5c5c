//! An S3-protocol server on loopback, for the gate's remote render cache (`--cache-url`): its
//! tests and the fleet benchmark. Not a double of ours: `s3s-fs` (crates.io), an S3
//! implementation over a folder, behind `s3s`'s request parsing and SigV4 authentication,
//! served with hyper. The cache is so tested against someone else's reading of the S3 protocol
//! (signed requests, path-style addressing, NoSuchKey, Content-Length), not against what we
//! believe S3 does.
//!
//! Why not MinIO: it is a Go program (a module build of several minutes and hundreds of MB
//! where Go is present, none where it is not), under the AGPL, and a process to start, wait
//! for and stop; `s3s-fs` is a library that starts in-process in milliseconds on every machine
//! that builds the tests.
//!
//! Buckets are folders of the root and objects files (`<root>/<bucket>/<key>`), so a test can
//! corrupt, truncate or replace one in place.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};

/// The one credential the server accepts.
pub const ACCESS_KEY: &str = "ground-access-key";
pub const SECRET_KEY: &str = "ground-secret-key";
/// The region requests are signed for (s3s accepts any; the client must name one).
pub const REGION: &str = "us-east-1";

pub struct S3Server {
    addr: SocketAddr,
    root: PathBuf,
    connections: Arc<AtomicUsize>,
    /// Its own runtime (one worker thread), so the server runs whatever the caller is: a plain
    /// test, a tokio test, the `ground` binary. Shut down without waiting when dropped.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl S3Server {
    /// Serves the buckets under `root` (created if missing) on 127.0.0.1, on a free port,
    /// until dropped.
    pub fn start(root: &Path) -> Result<S3Server> {
        std::fs::create_dir_all(root).with_context(|| format!("{}", root.display()))?;
        let fs = s3s_fs::FileSystem::new(root)
            .map_err(|e| anyhow::anyhow!("s3s-fs on {}: {e:?}", root.display()))?;
        let service = {
            let mut builder = s3s::service::S3ServiceBuilder::new(fs);
            builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
            builder.build()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind loopback")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ground-s3")
            .enable_all()
            .build()?;
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        runtime.spawn(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let service = service.clone();
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(S3Server {
            addr,
            root: root.to_path_buf(),
            connections,
            runtime: Some(runtime),
        })
    }

    /// `http://127.0.0.1:PORT`, for `AWS_ENDPOINT_URL`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The variables a client needs to reach it: endpoint, credential, region, plain HTTP.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
    }

    /// Makes a bucket (a folder of the root).
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))
    }

    /// The file that holds an object.
    pub fn object_file(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key)
    }

    /// Every object of a bucket, by key, sorted (metadata files of the server left out).
    pub fn objects(&self, bucket: &str) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(base, &path, out);
                } else if let Ok(key) = path.strip_prefix(base) {
                    out.push(key.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        let mut keys = Vec::new();
        let base = self.root.join(bucket);
        walk(&base, &base, &mut keys);
        keys.sort();
        keys
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}
