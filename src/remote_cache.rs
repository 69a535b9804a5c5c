//! The remote render cache: the second level behind the disk cache
//! (`render::cache::SecondLevel`), in object storage every runner shares (`gate --cache-url
//! s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`; bosun.yaml
//! `render.cacheUrl`). The render never sees it: it asks the trait, and this room answers from
//! S3 (or an S3-compatible store), Google Cloud Storage or Azure Blob Storage through
//! `object_store`. The three differ only in the client [`RemoteCache::open`] builds: the
//! objects, their signatures and the degrade-on-unreachable behaviour are the same.
//!
//! An entry is one object, `<prefix>/render/<aa>/<entry>`, named by the disk cache's entry
//! (`RenderCache::entry`: the render key, a digest of every input of the render, and the
//! versions of the tools that make it). Its body is a header, then the render's output as
//! one zstd frame:
//!
//! ```text
//! gitops-gate render cache v3
//! entry <the entry: 64 hex digits>
//! sha256 <SHA-256 of the body below, the compressed output: 64 hex digits>
//! size <the output's length in bytes>
//! encoding zstd
//! signature <Ed25519 signature of the five lines above, base64>
//!
//! <the output, compressed>
//! ```
//!
//! Compressed because a render is YAML that repeats itself (CRD schemas above all): the bytes
//! a runner fetches, the store keeps and the store's server reads shrink tenfold or more, for
//! about a millisecond of decompression per megabyte.
//!
//! A read believes an object only when every line holds: the entry asked for (an honest
//! object stored under another name is foreign), a signature by the trusted public key (a
//! writer without the signing key, such as a pull request's run: docs/safety-model.md), the
//! body's length and digest (a truncated, padded or corrupted one), then the output's size.
//! The signature is checked as soon as the header is whole and the body's digest before a
//! byte is decompressed: the zstd decoder only ever reads bytes the default branch signed
//! (hashing the compressed body is also a tenth of the work of hashing the output), and it
//! never writes more than the signed size. Anything else is a miss, counted and logged, and
//! the render runs as if the store were empty. Objects of earlier formats (`v1`,
//! uncompressed; `v2`, a zstd frame under a digest of the output) are not an entry of this
//! one: misses, written again by the next default-branch run.
//!
//! The store is reached on a runtime of this room's own (one worker thread), so neither the
//! render nor the gate's binary needs async: a lookup is one batch, read [`CONCURRENCY`]
//! objects at a time, each object checked as its bytes arrive and its answer handed over a
//! channel as soon as it is known (the render parses it while the rest arrive); a write, and
//! the local disk's copy of what was read, are handed to the runtime and the caller goes on;
//! [`RemoteCache::finish`] waits for them a bounded time before the process exits. A store that cannot be reached (refused
//! connection, timeout, credentials refused) turns the remote cache off with one warning line:
//! the run goes on with the disk cache only, and is retried after [`DEGRADED_FOR`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt as _;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, ObjectStore, PutOptions, PutPayload, RetryConfig,
};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use sha2::{Digest as _, Sha256};

use crate::git::hex;
use crate::render::cache::{Answers, SecondLevel};

/// The first line of every object.
const MAGIC: &str = "gitops-gate render cache v3";
/// The zstd level objects are written with (zstd's default: the writer is the default
/// branch's run, and its writes are off the verdict's path).
const ZSTD_LEVEL: i32 = 3;
/// Reads (and writes) in flight at once.
const CONCURRENCY: usize = 16;
/// One read's whole time, retries included, before the store counts as unreachable.
const READ_DEADLINE: Duration = Duration::from_secs(10);
/// One write's whole time, retries included.
const WRITE_DEADLINE: Duration = Duration::from_secs(60);
/// Output bytes waiting to be written at once; past it a write is skipped (counted).
const MAX_PENDING_BYTES: usize = 256 << 20;
/// How long an unreachable store stays off (a long-running Bosun tries again after it).
pub const DEGRADED_FOR: Duration = Duration::from_secs(300);
/// Rejected objects named one by one on the log; the rest are counted.
const REJECTIONS_LOGGED: usize = 10;

/// Where a line for the operator goes (the gate's stderr, Bosun's log).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Whom the remote cache believes, and whether this run may write it.
pub struct Trust {
    /// The Ed25519 public key an object's signature must verify with.
    public: [u8; 32],
    /// The signing key: held only by the runs that write (the default branch's).
    signer: Option<Ed25519KeyPair>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("public", &B64.encode(self.public))
            .field("writes", &self.signer.is_some())
            .finish()
    }
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A 32-byte key in base64 (surrounding whitespace ignored).
fn key_bytes(text: &str, what: &str) -> Result<[u8; 32], String> {
    let bytes = B64
        .decode(text.trim())
        .map_err(|_| format!("{what} is not base64"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{what} is {} bytes, not 32", bytes.len()))
}

impl Trust {
    /// From the public key (`--cache-public-key`, `GATE_CACHE_PUBLIC_KEY`) and the signing
    /// key (`GATE_CACHE_SIGNING_KEY`: the Ed25519 seed), both base64. With the signing key the
    /// run writes, and its public key is the one trusted (a public key given beside it must be
    /// that one); with the public key only it reads; with neither there is no trust to read by.
    pub fn from_keys(public: Option<&str>, signing: Option<&str>) -> Result<Trust, String> {
        let public = public
            .filter(|k| !k.trim().is_empty())
            .map(|k| key_bytes(k, "the cache's public key"))
            .transpose()?;
        let signer = signing
            .filter(|k| !k.trim().is_empty())
            .map(|k| {
                let seed = key_bytes(k, "GATE_CACHE_SIGNING_KEY")?;
                Ed25519KeyPair::from_seed_unchecked(&seed)
                    .map_err(|_| "GATE_CACHE_SIGNING_KEY is no Ed25519 key".to_string())
            })
            .transpose()?;
        match (public, signer) {
            (_, Some(signer)) => {
                let own = <[u8; 32]>::try_from(signer.public_key().as_ref())
                    .map_err(|_| "an Ed25519 public key of another length".to_string())?;
                if public.is_some_and(|p| p != own) {
                    return Err(
                        "GATE_CACHE_SIGNING_KEY is not the key of the cache's public key"
                            .to_string(),
                    );
                }
                Ok(Trust {
                    public: own,
                    signer: Some(signer),
                })
            }
            (Some(public), None) => Ok(Trust {
                public,
                signer: None,
            }),
            (None, None) => Err(
                "a remote cache needs the key its entries are signed with: --cache-public-key KEY (GATE_CACHE_PUBLIC_KEY) to read, GATE_CACHE_SIGNING_KEY to write too (docs/gate.md, remote render cache)"
                    .to_string(),
            ),
        }
    }

    /// Whether this run writes the remote cache.
    pub fn writes(&self) -> bool {
        self.signer.is_some()
    }

    /// The trusted public key, base64.
    pub fn public_key(&self) -> String {
        B64.encode(self.public)
    }

    /// The object for `output` under `entry`: its signed header and the compressed output;
    /// `None` without the signing key (or if zstd fails, which it does not on a buffer).
    fn seal(&self, entry: &str, output: &[u8]) -> Option<Vec<u8>> {
        let signer = self.signer.as_ref()?;
        let body = zstd::bulk::compress(output, ZSTD_LEVEL).ok()?;
        let signed = signed_lines(entry, &hex(&Sha256::digest(&body)), output.len());
        let signature = B64.encode(signer.sign(signed.as_bytes()).as_ref());
        let mut object = format!("{signed}signature {signature}\n\n").into_bytes();
        object.extend_from_slice(&body);
        Some(object)
    }

    /// The output an object holds for `entry`, when it is whole, its own and signed by the
    /// trusted key; otherwise why not.
    #[cfg(test)]
    fn open(&self, entry: &str, object: &[u8]) -> Result<String, &'static str> {
        let mut opening = Opening::new(self, entry, object.len(), 1 << 30);
        opening.push(object)?;
        opening.finish()
    }
}

/// The lines of a header, the blank one that ends it included.
const HEADER_LINES: usize = 7;
/// The most a header may take: seven lines of at most 512 bytes before their newline.
const HEADER_MAX: usize = HEADER_LINES * 513;

/// An object's header, read.
struct Header {
    /// The first five lines, as written: what the signature covers.
    signed: Vec<u8>,
    digest: String,
    size: usize,
    signature: String,
}

/// An object being read, piece by piece as the store sends it: its header checked once
/// whole (its signature included), its body (the compressed output) digested and kept as it
/// arrives (one buffer, no longer than zstd's bound for the signed size: padding is refused
/// as it arrives), its digest checked once whole; nothing is decompressed before, and
/// nothing believed before [`decode`] has decompressed it to the signed size
/// ([`Trust::open`] on a whole object is the same with one piece).
struct Opening<'a> {
    trust: &'a Trust,
    entry: &'a str,
    /// The object's length as the store states it.
    length: usize,
    /// The largest output believed: a render's cap.
    max_output: usize,
    /// The bytes so far, while the header is incomplete.
    start: Vec<u8>,
    header: Option<Header>,
    /// The longest body the signed size allows (`ZSTD_compressBound`).
    bound: usize,
    compressed: Vec<u8>,
    hasher: Sha256,
}

/// An object's body whose digest the trusted key signed: what [`decode`] decompresses.
struct Body {
    size: usize,
    compressed: Vec<u8>,
}

impl<'a> Opening<'a> {
    fn new(trust: &'a Trust, entry: &'a str, length: usize, max_output: usize) -> Opening<'a> {
        Opening {
            trust,
            entry,
            length,
            max_output,
            start: Vec::new(),
            header: None,
            bound: 0,
            compressed: Vec::new(),
            hasher: Sha256::new(),
        }
    }

    /// The next bytes of the object; an error as soon as it cannot be believed.
    fn push(&mut self, piece: &[u8]) -> Result<(), &'static str> {
        if self.header.is_some() {
            return self.take_body(piece);
        }
        self.start.extend_from_slice(piece);
        let Some(at) = header_end(&self.start)? else {
            return Ok(());
        };
        let header = read_header(self.entry, &self.start[..at])?;
        let signature = B64
            .decode(&header.signature)
            .map_err(|_| "its signature is not base64")?;
        UnparsedPublicKey::new(&ED25519, &self.trust.public)
            .verify(&header.signed, &signature)
            .map_err(|_| "not signed by the trusted key")?;
        if header.size > self.max_output {
            return Err("larger than a render may be");
        }
        let rest = self.start.split_off(at);
        self.start = Vec::new();
        self.bound = zstd::compress_bound(header.size);
        self.compressed = Vec::with_capacity(self.length.saturating_sub(at).min(self.bound));
        self.header = Some(header);
        self.take_body(&rest)
    }

    fn take_body(&mut self, piece: &[u8]) -> Result<(), &'static str> {
        if self.compressed.len() + piece.len() > self.bound {
            return Err("its body is longer than its output compressed may be (padded?)");
        }
        self.hasher.update(piece);
        self.compressed.extend_from_slice(piece);
        Ok(())
    }

    /// The body, when the whole header held and the body is the one it signed; [`decode`]
    /// judges the rest.
    fn into_body(self) -> Result<Body, &'static str> {
        let Some(header) = self.header else {
            return Err("not an entry of the gate's render cache");
        };
        if hex(&self.hasher.finalize()) != header.digest {
            return Err("its digest differs from its header's (truncated, padded or corrupted?)");
        }
        Ok(Body {
            size: header.size,
            compressed: self.compressed,
        })
    }

    #[cfg(test)]
    fn finish(self) -> Result<String, &'static str> {
        self.into_body().and_then(decode)
    }
}

/// The output a signed body holds: decompressed to no more than the signed size, and of
/// that size. Milliseconds a megabyte: run off the runtime's one worker.
fn decode(body: Body) -> Result<String, &'static str> {
    // Never more than the signed size: a longer output fails to fit, whatever the frame
    // claims of itself.
    let mut output = Vec::with_capacity(body.size);
    zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(&body.compressed, &mut output))
        .map_err(|_| "its output does not decompress")?;
    if output.len() != body.size {
        return Err("its output's size differs from its header's");
    }
    String::from_utf8(output).map_err(|_| "its output is not UTF-8")
}

/// Where the header's lines end in `start` (the output's first byte), `None` while they may
/// still come; an error when a line runs past 512 bytes before its newline.
fn header_end(start: &[u8]) -> Result<Option<usize>, &'static str> {
    let mut at = 0;
    for _ in 0..HEADER_LINES {
        let window = &start[at..start.len().min(at + 513)];
        match window.iter().position(|b| *b == b'\n') {
            Some(end) => at += end + 1,
            None if window.len() == 513 => {
                return Err("not an entry of the gate's render cache");
            }
            None => return Ok(None),
        }
    }
    Ok(Some(at))
}

/// The header of an object for `entry`: `header` is its lines, whole.
fn read_header(entry: &str, header: &[u8]) -> Result<Header, &'static str> {
    let not_an_entry = "not an entry of the gate's render cache";
    let lines: Vec<&[u8]> = header
        .strip_suffix(b"\n")
        .unwrap_or(header)
        .split(|b| *b == b'\n')
        .collect();
    if lines.len() != HEADER_LINES {
        return Err(not_an_entry);
    }
    fn text(line: &[u8]) -> &str {
        std::str::from_utf8(line).unwrap_or("")
    }
    let field = |line: &[u8], name: &str| -> Option<String> {
        text(line)
            .strip_prefix(name)
            .and_then(|v| v.strip_prefix(' '))
            .map(str::to_string)
    };
    if text(lines[0]) != MAGIC || text(lines[4]) != "encoding zstd" || !lines[6].is_empty() {
        return Err(not_an_entry);
    }
    let (Some(stated_entry), Some(digest), Some(size), Some(signature)) = (
        field(lines[1], "entry"),
        field(lines[2], "sha256"),
        field(lines[3], "size").and_then(|size| size.parse::<usize>().ok()),
        field(lines[5], "signature"),
    ) else {
        return Err(not_an_entry);
    };
    if stated_entry != entry {
        return Err("stored under another entry's name");
    }
    // The first five lines, as written.
    let signed_end: usize = lines[..5].iter().map(|l| l.len() + 1).sum();
    Ok(Header {
        signed: header[..signed_end].to_vec(),
        digest,
        size,
        signature,
    })
}

/// The lines a signature covers.
fn signed_lines(entry: &str, digest: &str, size: usize) -> String {
    format!("{MAGIC}\nentry {entry}\nsha256 {digest}\nsize {size}\nencoding zstd\n")
}

/// A fresh signing key and its public key, both base64 (`gate cache keygen`).
pub fn generate_keys() -> Result<(String, String), String> {
    let mut seed = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
        .map_err(|_| "no randomness from the system".to_string())?;
    let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
        .map_err(|_| "no Ed25519 key from the seed".to_string())?;
    Ok((B64.encode(seed), B64.encode(pair.public_key().as_ref())))
}

/// The object store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// `s3://`: Amazon S3 or an S3-compatible store (`AWS_ENDPOINT_URL`).
    S3,
    /// `gs://`: Google Cloud Storage.
    Gcs,
    /// `az://` (or `azure://`): Azure Blob Storage, the account from `AZURE_STORAGE_ACCOUNT_NAME`.
    Azure,
}

/// The URL forms taken, for messages.
const URL_FORMS: &str = "s3://BUCKET/PREFIX (S3, or an S3-compatible store through AWS_ENDPOINT_URL), gs://BUCKET/PREFIX (Google Cloud Storage) or az://CONTAINER/PREFIX (Azure Blob Storage)";

/// `s3://bucket/prefix`, `gs://bucket/prefix` or `az://container/prefix`, checked: a bucket
/// (container) name its provider accepts, a prefix of plain path segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub provider: Provider,
    /// The scheme as written (`az` and `azure` name the same provider).
    pub scheme: &'static str,
    /// The bucket, or Azure's container.
    pub bucket: String,
    pub prefix: String,
}

/// A provider's naming rule for buckets (containers): what it asks, when a name breaks it.
type NameRule = fn(&str) -> Result<(), &'static str>;

/// S3's bucket rules: 3 to 63 lowercase letters, digits, dots and hyphens, a letter or digit
/// at each end.
fn s3_bucket(name: &str) -> Result<(), &'static str> {
    let ok = (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err("3 to 63 lowercase letters, digits, dots and hyphens")
    }
}

/// Google Cloud Storage's bucket rules (cloud.google.com/storage/docs/buckets#naming):
/// lowercase letters, digits, hyphens, underscores and dots, a letter or digit at each end;
/// 3 to 63 characters, or up to 222 with dots when no dot-separated part is over 63; not an IP
/// address; not starting with "goog" nor holding "google".
fn gcs_bucket(name: &str) -> Result<(), &'static str> {
    let rule = "3 to 63 lowercase letters, digits, hyphens, underscores and dots (up to 222 with dots, 63 between them), a letter or digit at each end, not \"goog...\" nor holding \"google\"";
    let charset = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_'));
    let length = if name.contains('.') {
        (3..=222).contains(&name.len()) && name.split('.').all(|part| part.len() <= 63)
    } else {
        (3..=63).contains(&name.len())
    };
    let ends = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let address = name.parse::<std::net::Ipv4Addr>().is_ok();
    let google = name.starts_with("goog") || name.contains("google");
    if charset && length && ends && !address && !google {
        Ok(())
    } else {
        Err(rule)
    }
}

/// Azure's container rules (learn.microsoft.com, "Naming and referencing containers"): 3 to 63
/// lowercase letters, digits and hyphens, a letter or digit first, every hyphen between two
/// letters or digits.
fn azure_container(name: &str) -> Result<(), &'static str> {
    let ok = (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err("3 to 63 lowercase letters, digits and single hyphens, a letter or digit at each end")
    }
}

impl Location {
    pub fn parse(url: &str) -> Result<Location, String> {
        let (provider, scheme, rest) = [
            (Provider::S3, "s3"),
            (Provider::Gcs, "gs"),
            (Provider::Azure, "az"),
            (Provider::Azure, "azure"),
        ]
        .into_iter()
        .find_map(|(provider, scheme)| {
            url.strip_prefix(scheme)
                .and_then(|r| r.strip_prefix("://"))
                .map(|rest| (provider, scheme, rest))
        })
        .ok_or_else(|| format!("{url:?}: the remote cache takes {URL_FORMS}"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let (what, check): (&str, NameRule) = match provider {
            Provider::S3 => ("an S3 bucket name", s3_bucket),
            Provider::Gcs => ("a Cloud Storage bucket name", gcs_bucket),
            Provider::Azure => ("an Azure container name", azure_container),
        };
        check(bucket).map_err(|rule| format!("{url:?}: {bucket:?} is not {what} ({rule})"))?;
        let prefix = prefix.trim_end_matches('/');
        let prefix_ok = prefix.is_empty()
            || prefix.split('/').all(|segment| {
                !segment.is_empty()
                    && segment != "."
                    && segment != ".."
                    && segment
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
            });
        if !prefix_ok {
            return Err(format!(
                "{url:?}: the prefix must be path segments of letters, digits, '.', '-' and '_'"
            ));
        }
        Ok(Location {
            provider,
            scheme,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The object of an entry.
    fn object(&self, entry: &str) -> ObjectPath {
        let name = format!("render/{}/{entry}", &entry[..2.min(entry.len())]);
        if self.prefix.is_empty() {
            ObjectPath::from(name)
        } else {
            ObjectPath::from(format!("{}/{name}", self.prefix))
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "{}://{}", self.scheme, self.bucket)
        } else {
            write!(f, "{}://{}/{}", self.scheme, self.bucket, self.prefix)
        }
    }
}

/// What a run's remote cache did, for the stats line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub location: String,
    /// Entries read and believed.
    pub hits: usize,
    /// Entries asked for and not believed: absent, rejected, or the store unreachable.
    pub misses: usize,
    /// Of the misses, objects that were there and were not believed.
    pub rejected: usize,
    /// Entries written.
    pub written: usize,
    /// Writes that failed, were skipped (the store unreachable, too much waiting) or did not
    /// finish in time.
    pub write_failures: usize,
    pub read_only: bool,
    /// The store could not be reached at some point of the run.
    pub unreachable: bool,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "remote cache {}: {} hits, {} misses ({} rejected), ",
            self.location, self.hits, self.misses, self.rejected
        )?;
        if self.read_only {
            write!(f, "read-only")?;
        } else {
            write!(
                f,
                "{} written, {} write failures",
                self.written, self.write_failures
            )?;
        }
        if self.unreachable {
            write!(f, "; unreachable, the local cache only")?;
        }
        Ok(())
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicUsize,
    misses: AtomicUsize,
    rejected: AtomicUsize,
    written: AtomicUsize,
    write_failures: AtomicUsize,
    /// Writes handed to the runtime and not finished.
    in_flight: AtomicUsize,
    pending_bytes: AtomicUsize,
}

/// What the runtime's tasks share.
struct Shared {
    store: Arc<dyn ObjectStore>,
    location: Location,
    trust: Trust,
    /// The largest object read: zstd's bound for the largest output, and a header.
    max_object_bytes: u64,
    /// The largest output believed (the render output cap).
    max_output: usize,
    counters: Counters,
    /// Until when the store counts as unreachable.
    degraded_until: Mutex<Option<Instant>>,
    /// Ever unreachable in this process.
    was_unreachable: std::sync::atomic::AtomicBool,
    log: Log,
    limit: tokio::sync::Semaphore,
}

impl Shared {
    fn degraded(&self) -> bool {
        self.degraded_until
            .lock()
            .map(|until| until.is_some_and(|t| Instant::now() < t))
            .unwrap_or(false)
    }

    /// The store is unreachable: off for [`DEGRADED_FOR`], said once.
    fn degrade(&self, why: &str) {
        let Ok(mut until) = self.degraded_until.lock() else {
            return;
        };
        let now = Instant::now();
        let already = until.is_some_and(|t| now < t);
        *until = Some(now + DEGRADED_FOR);
        self.was_unreachable.store(true, Ordering::Relaxed);
        if !already {
            (self.log)(&format!(
                "remote cache {} unreachable ({}): rendering with the local cache only",
                self.location,
                one_line(why)
            ));
        }
    }

    fn reject(&self, entry: &str, why: &str) {
        let n = self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        if n < REJECTIONS_LOGGED {
            (self.log)(&format!(
                "remote cache {}: {} not believed, rendered instead: {why}",
                self.location,
                self.location.object(entry)
            ));
        } else if n == REJECTIONS_LOGGED {
            (self.log)(&format!(
                "remote cache {}: more objects not believed (counted, not named)",
                self.location
            ));
        }
    }

    /// One entry: its output when the store has an object for it that [`Trust::open`] believes.
    async fn read(self: Arc<Self>, entry: String) -> Option<String> {
        let miss = || {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            None
        };
        if self.degraded() {
            return miss();
        }
        // Waiting for a free request is within the read's deadline too: writes a stalled
        // store holds must not hold the render longer than a read may take.
        let Ok(permit) = tokio::time::timeout(READ_DEADLINE, self.limit.acquire()).await else {
            self.degrade(&format!(
                "no free request in {} s (writes are stalled)",
                READ_DEADLINE.as_secs()
            ));
            return miss();
        };
        let Ok(_permit) = permit else {
            return miss();
        };
        if self.degraded() {
            return miss();
        }
        let path = self.location.object(&entry);
        // The body is checked as it arrives (`Opening`): one copy into one buffer, its digest
        // taken on the way, and nothing believed before the whole object holds.
        let got = tokio::time::timeout(READ_DEADLINE, async {
            // The trait's own methods: their futures are Send (the runtime's tasks need it).
            let got = self.store.get_opts(&path, GetOptions::default()).await?;
            if got.meta.size > self.max_object_bytes {
                return Ok(Err("larger than a render may be"));
            }
            let length = usize::try_from(got.meta.size).unwrap_or(usize::MAX);
            let mut opening = Opening::new(&self.trust, &entry, length, self.max_output);
            let mut body = got.into_stream();
            while let Some(piece) = body.next().await {
                if let Err(why) = opening.push(&piece?) {
                    return Ok(Err(why));
                }
            }
            Ok::<_, object_store::Error>(opening.into_body())
        })
        .await;
        let body = match got {
            Err(_) => {
                self.degrade(&format!("no answer in {} s", READ_DEADLINE.as_secs()));
                return miss();
            }
            // S3 answers 403, not 404, for a missing key to a role without s3:ListBucket:
            // a least-privilege reader's miss, not a store to stop asking.
            Ok(Err(
                object_store::Error::NotFound { .. } | object_store::Error::PermissionDenied { .. },
            )) => return miss(),
            Ok(Err(error)) => {
                self.degrade(&error.to_string());
                return miss();
            }
            Ok(Ok(Err(why))) => {
                self.reject(&entry, why);
                return None;
            }
            Ok(Ok(Ok(body))) => body,
        };
        // Decompressed on a blocking thread (the body was digested as it arrived): a large
        // render must not hold the other reads' streams and deadlines on the runtime's one
        // worker.
        let Ok(decoded) = tokio::task::spawn_blocking(move || decode(body)).await else {
            // The decoder panicked: nothing said of the object.
            return miss();
        };
        match decoded {
            Ok(output) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                Some(output)
            }
            Err(why) => {
                self.reject(&entry, why);
                None
            }
        }
    }

    async fn write(self: Arc<Self>, entry: String, output: String) {
        let len = output.len();
        let done = async {
            let _permit = self.limit.acquire().await.ok()?;
            if self.degraded() {
                return None;
            }
            // Compressing a render takes milliseconds: off the runtime's one worker.
            let sealing = self.clone();
            let named = entry.clone();
            let object =
                tokio::task::spawn_blocking(move || sealing.trust.seal(&named, output.as_bytes()))
                    .await
                    .ok()??;
            let payload = PutPayload::from(Bytes::from(object));
            let path = self.location.object(&entry);
            let put = self.store.put_opts(&path, payload, PutOptions::default());
            match tokio::time::timeout(WRITE_DEADLINE, put).await {
                Ok(Ok(_)) => Some(()),
                Ok(Err(error)) => {
                    self.write_failed(&error.to_string());
                    None
                }
                Err(_) => {
                    // A store that stalls a write stalls the next ones too: local only.
                    let why = format!("no answer in {} s", WRITE_DEADLINE.as_secs());
                    self.write_failed(&why);
                    self.degrade(&format!("a write got {why}"));
                    None
                }
            }
        }
        .await;
        match done {
            Some(()) => self.counters.written.fetch_add(1, Ordering::Relaxed),
            None => self.counters.write_failures.fetch_add(1, Ordering::Relaxed),
        };
        self.counters
            .pending_bytes
            .fetch_sub(len, Ordering::Relaxed);
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// The first write failure is said; the rest are counted for the stats line.
    fn write_failed(&self, why: &str) {
        if self.counters.write_failures.load(Ordering::Relaxed) == 0 {
            (self.log)(&format!(
                "remote cache {}: a write failed ({}); failures are counted",
                self.location,
                one_line(why)
            ));
        }
    }
}

/// The process's variables whose names start with one of `prefixes`, names lowercased (the
/// form object_store's configuration keys parse from), in the process's order.
fn provider_env(prefixes: &[&str]) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(key, _)| prefixes.iter().any(|p| key.starts_with(p)))
        .map(|(key, value)| (key.to_ascii_lowercase(), value))
        .collect()
}

fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect()
}

/// The remote render cache of one process: give it to the render as its second level
/// (`RenderCache::with_second_level`), and call [`RemoteCache::finish`] before exiting.
pub struct RemoteCache {
    shared: Arc<Shared>,
    handle: tokio::runtime::Handle,
    /// Kept for its threads; shut down without waiting when dropped (possibly inside another
    /// runtime, where a blocking shutdown is not allowed).
    runtime: Option<tokio::runtime::Runtime>,
    writes: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for RemoteCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteCache")
            .field("location", &self.shared.location.to_string())
            .field("trust", &self.shared.trust)
            .finish()
    }
}

impl Drop for RemoteCache {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl RemoteCache {
    /// The remote cache at `url`, its client configured from the provider's usual variables
    /// (object_store's `from_env` of each, read the same way):
    ///
    /// - `s3://bucket/prefix`: `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    ///   `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`, web identity...;
    /// - `gs://bucket/prefix`: `GOOGLE_SERVICE_ACCOUNT` (a key file), `GOOGLE_SERVICE_ACCOUNT_KEY`
    ///   (the key), `GOOGLE_APPLICATION_CREDENTIALS`, else the metadata server;
    ///   `GOOGLE_BASE_URL` (an emulator's endpoint), `GOOGLE_ALLOW_HTTP`...;
    /// - `az://container/prefix`: `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY`,
    ///   a SAS (`AZURE_STORAGE_SAS_KEY`), a service principal, workload or managed identity;
    ///   `AZURE_STORAGE_ENDPOINT`; `AZURE_STORAGE_USE_EMULATOR=true` for Azurite, at
    ///   `AZURITE_BLOB_STORAGE_URL` (default `http://127.0.0.1:10000`).
    ///
    /// The bucket (container) is the URL's, whatever a variable says. Nothing is asked of the
    /// store yet. `max_object_bytes`: the largest object read (the render output cap).
    pub fn open(
        url: &str,
        trust: Trust,
        max_object_bytes: u64,
        log: Log,
    ) -> Result<RemoteCache, String> {
        let location = Location::parse(url)?;
        crate::forge::github::install_crypto_provider();
        let client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(30));
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(1),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
        };
        let failed = |e: object_store::Error| {
            format!("remote cache {location}: {}", one_line(&e.to_string()))
        };
        let store: Arc<dyn ObjectStore> = match location.provider {
            Provider::S3 => {
                let mut builder = AmazonS3Builder::new()
                    .with_client_options(client)
                    .with_retry(retry);
                for (key, value) in provider_env(&["AWS_"]) {
                    if let Ok(key) = key.parse::<AmazonS3ConfigKey>()
                        && key != AmazonS3ConfigKey::Bucket
                    {
                        builder = builder.with_config(key, value);
                    }
                }
                Arc::new(
                    builder
                        .with_bucket_name(&location.bucket)
                        .build()
                        .map_err(failed)?,
                )
            }
            Provider::Gcs => {
                let mut builder = GoogleCloudStorageBuilder::new()
                    .with_client_options(client)
                    .with_retry(retry);
                // `SERVICE_ACCOUNT` too, as object_store's `from_env` reads it.
                if let Ok(path) = std::env::var("SERVICE_ACCOUNT") {
                    builder = builder.with_service_account_path(path);
                }
                for (key, value) in provider_env(&["GOOGLE_"]) {
                    if let Ok(key) = key.parse::<GoogleConfigKey>()
                        && key != GoogleConfigKey::Bucket
                    {
                        builder = builder.with_config(key, value);
                    }
                }
                Arc::new(
                    builder
                        .with_bucket_name(&location.bucket)
                        .build()
                        .map_err(failed)?,
                )
            }
            Provider::Azure => {
                let mut builder = MicrosoftAzureBuilder::new()
                    .with_client_options(client)
                    .with_retry(retry);
                for (key, value) in provider_env(&["AZURE_"]) {
                    if let Ok(key) = key.parse::<AzureConfigKey>()
                        && key != AzureConfigKey::ContainerName
                    {
                        builder = builder.with_config(key, value);
                    }
                }
                // The managed identity's endpoint, as object_store's `from_env` reads it.
                if let Ok(endpoint) = std::env::var("IDENTITY_ENDPOINT") {
                    builder = builder.with_msi_endpoint(endpoint);
                }
                Arc::new(
                    builder
                        .with_container_name(&location.bucket)
                        .build()
                        .map_err(failed)?,
                )
            }
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gate-remote-cache")
            .enable_all()
            .build()
            .map_err(|e| format!("remote cache: no runtime: {e}"))?;
        Ok(RemoteCache {
            shared: Arc::new(Shared {
                store,
                location,
                trust,
                max_object_bytes: u64::try_from(zstd::compress_bound(
                    usize::try_from(max_object_bytes).unwrap_or(usize::MAX),
                ))
                .unwrap_or(u64::MAX)
                .saturating_add(HEADER_MAX as u64),
                max_output: usize::try_from(max_object_bytes).unwrap_or(usize::MAX),
                counters: Counters::default(),
                degraded_until: Mutex::new(None),
                was_unreachable: Default::default(),
                log,
                limit: tokio::sync::Semaphore::new(CONCURRENCY),
            }),
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
            writes: Mutex::new(Vec::new()),
        })
    }

    pub fn location(&self) -> String {
        self.shared.location.to_string()
    }

    /// Waits at most `within` for the writes handed over so far (to the store, and to the local
    /// disk: [`SecondLevel::in_background`]); store writes still running then are counted as
    /// failures (an object is written whole or not at all). The counts so far.
    pub fn finish(&self, within: Duration) -> Summary {
        let writes = self
            .writes
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        if !writes.is_empty() {
            let (tx, rx) = std::sync::mpsc::channel();
            self.handle.spawn(async move {
                let all = futures::future::join_all(writes);
                let _ = tx.send(tokio::time::timeout(within, all).await.is_ok());
            });
            let finished = rx
                .recv_timeout(within + Duration::from_secs(1))
                .unwrap_or(false);
            if !finished {
                let left = self.shared.counters.in_flight.load(Ordering::Relaxed);
                (self.shared.log)(&format!(
                    "remote cache {}: {left} writes still running after {} s, left unfinished",
                    self.shared.location,
                    within.as_secs()
                ));
                self.shared
                    .counters
                    .write_failures
                    .fetch_add(left, Ordering::Relaxed);
            }
        }
        self.summary()
    }

    /// The counts so far.
    pub fn summary(&self) -> Summary {
        let c = &self.shared.counters;
        Summary {
            location: self.shared.location.to_string(),
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            written: c.written.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            read_only: !self.shared.trust.writes(),
            unreachable: self.shared.was_unreachable.load(Ordering::Relaxed),
        }
    }
}

impl SecondLevel for RemoteCache {
    fn fetch(&self, entries: &[String]) -> Vec<Option<String>> {
        let mut found: Vec<Option<String>> = entries.iter().map(|_| None).collect();
        self.fetch_each(entries, &mut |answers| {
            for (i, answer) in answers {
                found[i] = answer;
            }
        });
        found
    }

    /// [`CONCURRENCY`] reads at a time, each answer handed over as soon as it is believed (or
    /// not), whatever the order: the caller parses while the rest arrive.
    fn fetch_each(&self, entries: &[String], each: &mut dyn FnMut(Answers<String>)) {
        if entries.is_empty() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = self.shared.clone();
        let asked = entries.to_vec();
        self.handle.spawn(async move {
            let mut reads =
                futures::stream::iter(asked.into_iter().enumerate().map(|(i, entry)| {
                    let shared = shared.clone();
                    async move { (i, shared.read(entry).await) }
                }))
                .buffer_unordered(CONCURRENCY);
            while let Some(answer) = reads.next().await {
                if tx.send(answer).is_err() {
                    break;
                }
            }
        });
        let mut unanswered: Vec<bool> = vec![true; entries.len()];
        let mut left = entries.len();
        while left > 0 {
            let Ok(first) = rx.recv() else { break };
            let answers: Answers<String> = std::iter::once(first).chain(rx.try_iter()).collect();
            for (i, _) in &answers {
                unanswered[*i] = false;
            }
            left -= answers.len();
            each(answers);
        }
        // The runtime gone before every answer (it cannot be, short of a panic): misses,
        // counted.
        if left > 0 {
            self.shared
                .counters
                .misses
                .fetch_add(left, Ordering::Relaxed);
            each(
                unanswered
                    .iter()
                    .enumerate()
                    .filter(|(_, u)| **u)
                    .map(|(i, _)| (i, None))
                    .collect(),
            );
        }
    }

    fn offer(&self, entry: &str, text: String) {
        let shared = &self.shared;
        if !shared.trust.writes() {
            return;
        }
        let c = &shared.counters;
        if shared.degraded() {
            c.write_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if c.pending_bytes.fetch_add(text.len(), Ordering::Relaxed) + text.len() > MAX_PENDING_BYTES
        {
            c.pending_bytes.fetch_sub(text.len(), Ordering::Relaxed);
            shared.write_failed(&format!(
                "over {} MiB waiting to be written",
                MAX_PENDING_BYTES >> 20
            ));
            c.write_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        c.in_flight.fetch_add(1, Ordering::Relaxed);
        let task = self
            .handle
            .spawn(shared.clone().write(entry.to_string(), text));
        if let Ok(mut writes) = self.writes.lock() {
            writes.retain(|w| !w.is_finished());
            writes.push(task);
        }
    }

    /// The disk's copy of this cache's answers, on the runtime's blocking threads: waited for
    /// by [`RemoteCache::finish`], as the writes to the store are.
    fn in_background(&self, work: Box<dyn FnOnce() + Send>) {
        let task = self.handle.spawn_blocking(work);
        if let Ok(mut writes) = self.writes.lock() {
            writes.retain(|w| !w.is_finished());
            writes.push(task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = "0f1e2d3c4b5a69780f1e2d3c4b5a69780f1e2d3c4b5a69780f1e2d3c4b5a6978";
    const OTHER: &str = "aa1e2d3c4b5a69780f1e2d3c4b5a69780f1e2d3c4b5a69780f1e2d3c4b5a6978";

    fn writer() -> (Trust, String) {
        let (signing, public) = generate_keys().unwrap();
        (Trust::from_keys(None, Some(&signing)).unwrap(), public)
    }

    fn object(trust: &Trust, entry: &str, output: &str) -> Vec<u8> {
        trust.seal(entry, output.as_bytes()).unwrap()
    }

    #[test]
    fn a_sealed_output_opens_for_its_entry_under_the_trusted_key_only() {
        let (trust, public) = writer();
        let reader = Trust::from_keys(Some(&public), None).unwrap();
        assert!(trust.writes() && !reader.writes());
        assert_eq!(reader.public_key(), public);
        let output = "kind: ConfigMap\nmetadata:\n  name: a\n";
        let sealed = object(&trust, ENTRY, output);
        assert_eq!(reader.open(ENTRY, &sealed).as_deref(), Ok(output));
        // An empty output is an output.
        assert_eq!(
            reader.open(ENTRY, &object(&trust, ENTRY, "")).as_deref(),
            Ok("")
        );
        // Another entry's honest object, stored under this name.
        assert_eq!(
            reader.open(OTHER, &sealed),
            Err("stored under another entry's name")
        );
        // Corrupted: one byte of the compressed output changed.
        let mut corrupted = sealed.clone();
        let last = corrupted.len() - 2;
        corrupted[last] ^= 0x5a;
        assert_eq!(
            reader.open(ENTRY, &corrupted),
            Err("its digest differs from its header's (truncated, padded or corrupted?)")
        );
        // Truncated, in the output or in the header.
        assert_eq!(
            reader.open(ENTRY, &sealed[..sealed.len() - 5]),
            Err("its digest differs from its header's (truncated, padded or corrupted?)")
        );
        for cut in [0, 10, 100] {
            assert!(reader.open(ENTRY, &sealed[..cut]).is_err(), "{cut}");
        }
        // Someone who can write the bucket but holds no key: a forged output with its own
        // digest and size and a signature by another key, or the honest signature kept.
        let (attacker, _) = writer();
        let forged = "kind: ConfigMap\nmetadata:\n  name: forged\n";
        assert_eq!(
            reader.open(ENTRY, &object(&attacker, ENTRY, forged)),
            Err("not signed by the trusted key")
        );
        let honest_header = String::from_utf8_lossy(&sealed).into_owned();
        let signature_line = honest_header
            .lines()
            .find(|l| l.starts_with("signature "))
            .unwrap();
        let replayed = format!(
            "{}{signature_line}\n\n{forged}",
            signed_lines(
                ENTRY,
                &hex(&Sha256::digest(forged.as_bytes())),
                forged.len()
            )
        );
        assert_eq!(
            reader.open(ENTRY, replayed.as_bytes()),
            Err("not signed by the trusted key")
        );
        // Not an entry at all.
        assert!(reader.open(ENTRY, b"kind: ConfigMap\n").is_err());
        assert!(reader.open(ENTRY, &[0xff; 2000]).is_err());
        // The first format (uncompressed, no encoding line), even signed by the trusted key.
        let v1_lines = format!(
            "gitops-gate render cache v1\nentry {ENTRY}\nsha256 {}\nsize {}\n",
            hex(&Sha256::digest(output.as_bytes())),
            output.len()
        );
        let v1_signature = B64.encode(trust.signer.as_ref().unwrap().sign(v1_lines.as_bytes()));
        let v1 = format!("{v1_lines}signature {v1_signature}\n\n{output}");
        assert_eq!(
            reader.open(ENTRY, v1.as_bytes()),
            Err("not an entry of the gate's render cache")
        );
    }

    /// Behind an honest header (bucket writers can copy one), only the body it signed is
    /// decompressed: another body (one that expands to 64 MiB, the honest one padded with a
    /// skippable frame before or after) is refused by its digest, one longer than the output
    /// compressed may be as it arrives (before it is held whole). The decoder itself never
    /// writes past the signed size, and a header signing a size past the render's cap is
    /// refused before a byte of the body is read.
    #[test]
    fn a_body_never_decompresses_past_its_signed_size() {
        let (trust, public) = writer();
        let reader = Trust::from_keys(Some(&public), None).unwrap();
        let output = "x".repeat(4096);
        let sealed = object(&trust, ENTRY, &output);
        let body_at = sealed.windows(2).position(|w| w == b"\n\n").unwrap() + 2;
        let header = &sealed[..body_at];
        let refused = Err("its digest differs from its header's (truncated, padded or corrupted?)");
        // 64 MiB in a few KiB.
        let bomb = zstd::bulk::compress(&vec![b'a'; 64 << 20], 19).unwrap();
        assert!(bomb.len() < zstd::compress_bound(4096), "{}", bomb.len());
        assert_eq!(
            reader.open(ENTRY, &[header, bomb.as_slice()].concat()),
            refused
        );
        // Padded with a skippable frame, a little (after or before) or past the bound.
        let skippable = |n: usize| {
            let mut frame = vec![0x50, 0x2a, 0x4d, 0x18];
            frame.extend_from_slice(&u32::try_from(n).unwrap().to_le_bytes());
            frame.resize(8 + n, 0);
            frame
        };
        assert_eq!(
            reader.open(ENTRY, &[sealed.as_slice(), &skippable(16)].concat()),
            refused
        );
        assert_eq!(
            reader.open(
                ENTRY,
                &[header, &skippable(16), &sealed[body_at..]].concat()
            ),
            refused
        );
        let padded = [sealed.as_slice(), &skippable(1 << 20)].concat();
        let mut opening = Opening::new(&reader, ENTRY, padded.len(), 1 << 30);
        let pushed = padded.chunks(4096).try_for_each(|p| opening.push(p));
        assert_eq!(
            pushed,
            Err("its body is longer than its output compressed may be (padded?)")
        );
        assert!(opening.compressed.capacity() <= zstd::compress_bound(4096));
        // The decoder, even on a body a signer vouched for, stops at the signed size.
        let body = |size: usize, compressed: &[u8]| Body {
            size,
            compressed: compressed.to_vec(),
        };
        assert_eq!(
            decode(body(4096, &bomb)),
            Err("its output does not decompress")
        );
        let honest = &sealed[body_at..];
        assert_eq!(
            decode(body(4095, honest)),
            Err("its output does not decompress")
        );
        assert_eq!(
            decode(body(4097, honest)),
            Err("its output's size differs from its header's")
        );
        assert_eq!(decode(body(4096, honest)), Ok(output.clone()));
        // The signed size against the render's cap.
        let mut opening = Opening::new(&reader, ENTRY, sealed.len(), 4095);
        assert_eq!(opening.push(&sealed), Err("larger than a render may be"));
        let mut opening = Opening::new(&reader, ENTRY, sealed.len(), 4096);
        opening.push(&sealed).unwrap();
        assert_eq!(opening.finish(), Ok(output));
    }

    #[test]
    fn an_object_read_piece_by_piece_is_judged_as_it_is_whole() {
        let (trust, public) = writer();
        let reader = Trust::from_keys(Some(&public), None).unwrap();
        let output = "kind: ConfigMap\nmetadata:\n  name: a\n".repeat(300);
        let sealed = object(&trust, ENTRY, &output);
        let mut corrupted = sealed.clone();
        let last = corrupted.len() - 2;
        corrupted[last] ^= 0x5a;
        let (attacker, _) = writer();
        // What is read, how, under which entry, and the judgement.
        type Case<'a> = (&'a str, &'a [u8], &'a str, Result<String, &'static str>);
        let cases: Vec<Case> = vec![
            ("whole", &sealed, ENTRY, Ok(output.clone())),
            (
                "foreign",
                &sealed,
                OTHER,
                Err("stored under another entry's name"),
            ),
            (
                "corrupted",
                &corrupted,
                ENTRY,
                Err("its digest differs from its header's (truncated, padded or corrupted?)"),
            ),
            (
                "truncated",
                &sealed[..sealed.len() - 5],
                ENTRY,
                Err("its digest differs from its header's (truncated, padded or corrupted?)"),
            ),
            (
                "header cut",
                &sealed[..100],
                ENTRY,
                Err("not an entry of the gate's render cache"),
            ),
            (
                "no header",
                &[b'x'; 2000],
                ENTRY,
                Err("not an entry of the gate's render cache"),
            ),
        ];
        let forged = object(&attacker, ENTRY, &output);
        let longer = [sealed.as_slice(), b"more"].concat();
        let cases = cases.into_iter().chain([
            (
                "forged",
                forged.as_slice(),
                ENTRY,
                Err("not signed by the trusted key"),
            ),
            (
                "longer",
                longer.as_slice(),
                ENTRY,
                Err("its digest differs from its header's (truncated, padded or corrupted?)"),
            ),
        ]);
        for (what, bytes, entry, expected) in cases {
            assert_eq!(reader.open(entry, bytes), expected, "{what}, whole");
            for piece in [1, 7, 64, 4096] {
                let mut opening = Opening::new(&reader, entry, bytes.len(), 1 << 30);
                let pushed = bytes.chunks(piece).try_for_each(|p| opening.push(p));
                let judged = pushed.and_then(|()| opening.finish());
                assert_eq!(judged, expected, "{what}, in pieces of {piece}");
            }
        }
    }

    #[test]
    fn keys_are_checked_where_they_enter() {
        let (signing, public) = generate_keys().unwrap();
        let (_, other_public) = generate_keys().unwrap();
        assert!(Trust::from_keys(Some(&public), Some(&signing)).is_ok());
        let err = Trust::from_keys(Some(&other_public), Some(&signing)).unwrap_err();
        assert!(err.contains("not the key of"), "{err}");
        let err = Trust::from_keys(None, None).unwrap_err();
        assert!(err.contains("--cache-public-key"), "{err}");
        assert!(Trust::from_keys(Some(""), Some("  ")).is_err());
        let err = Trust::from_keys(Some("not base64!"), None).unwrap_err();
        assert!(err.contains("not base64"), "{err}");
        let err = Trust::from_keys(Some(&B64.encode([1u8; 16])), None).unwrap_err();
        assert!(err.contains("16 bytes"), "{err}");
        // The signing key's debug form never shows it.
        let trust = Trust::from_keys(None, Some(&signing)).unwrap();
        assert!(!format!("{trust:?}").contains(&signing));
    }

    #[test]
    fn only_plain_s3_gcs_and_azure_urls_are_taken() {
        assert_eq!(
            Location::parse("s3://gate-cache/fleet/renders/").unwrap(),
            Location {
                provider: Provider::S3,
                scheme: "s3",
                bucket: "gate-cache".into(),
                prefix: "fleet/renders".into()
            }
        );
        let bare = Location::parse("s3://gate-cache").unwrap();
        assert_eq!(bare.prefix, "");
        assert_eq!(bare.to_string(), "s3://gate-cache");
        assert_eq!(bare.object(ENTRY).to_string(), format!("render/0f/{ENTRY}"));
        assert_eq!(
            Location::parse("s3://b12/p")
                .unwrap()
                .object(ENTRY)
                .to_string(),
            format!("p/render/0f/{ENTRY}")
        );
        for (url, provider, bucket) in [
            ("gs://gate-cache/fleet", Provider::Gcs, "gate-cache"),
            (
                "gs://gate_cache.example.com/x",
                Provider::Gcs,
                "gate_cache.example.com",
            ),
            ("az://gate-cache/fleet", Provider::Azure, "gate-cache"),
            ("azure://gate-cache/fleet", Provider::Azure, "gate-cache"),
        ] {
            let location = Location::parse(url).unwrap();
            assert_eq!(
                (location.provider, location.bucket.as_str()),
                (provider, bucket)
            );
            assert_eq!(location.to_string(), url, "said as written");
        }
        // A dotted Cloud Storage name may be longer than 63, each part not.
        let long = format!("{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63));
        assert!(Location::parse(&format!("gs://{long}")).is_ok());
        assert!(Location::parse(&format!("s3://{long}")).is_err());
        for bad in [
            "https://bucket/prefix",
            "gcs://bucket",
            "abfss://container@account.dfs.core.windows.net/x",
            "S3://bucket",
            "s3://",
            "s3://ab",
            "s3://Bucket",
            "s3://-bucket",
            "s3://under_score",
            "s3://user@bucket/x",
            "s3://bucket/../x",
            "s3://bucket/a//b",
            "s3://bucket/a?b",
            "s3://bucket/a b",
            "gs://",
            "gs://ab",
            "gs://Bucket",
            "gs://bucket-",
            "gs://goog-cache",
            "gs://my-google-cache",
            "gs://192.168.5.4",
            &format!("gs://{}", "a".repeat(64)),
            &format!("gs://{}.b", "a".repeat(64)),
            "gs://bucket/../x",
            "az://",
            "az://ab",
            "az://Container",
            "az://gate--cache",
            "az://gate-cache-",
            "az://gate.cache",
            "az://gate_cache",
            "az://$root",
            "az://container/a?b",
            "azure://container/..",
        ] {
            let err = Location::parse(bad).unwrap_err();
            assert!(err.starts_with(&format!("{bad:?}: ")), "{bad}: {err}");
            assert_eq!(err.lines().count(), 1, "{bad}: {err}");
        }
    }

    #[test]
    fn the_summary_line_says_what_happened() {
        let mut summary = Summary {
            location: "s3://b/p".into(),
            hits: 3,
            misses: 2,
            rejected: 1,
            written: 2,
            ..Default::default()
        };
        assert_eq!(
            summary.to_string(),
            "remote cache s3://b/p: 3 hits, 2 misses (1 rejected), 2 written, 0 write failures"
        );
        summary.read_only = true;
        summary.unreachable = true;
        assert_eq!(
            summary.to_string(),
            "remote cache s3://b/p: 3 hits, 2 misses (1 rejected), read-only; unreachable, the local cache only"
        );
    }
}
