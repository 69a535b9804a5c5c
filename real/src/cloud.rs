//! Object storage emulators on loopback for the remote render cache's Google Cloud Storage and
//! Azure tests (tests/remote_cache_cloud.rs), started by the test and stopped when dropped,
//! as `ground::s3` is for S3. Not doubles of ours: each is someone else's reading of its
//! provider's protocol.
//!
//! - Azurite ([`Azurite`]), Microsoft's Azure Storage emulator, from npm: the package and lock
//!   pinned in `real/node/azurite`, installed by `cargo xtask real build` into
//!   `target/tools/azurite`; its Blob service on a free loopback port, its state in a folder of
//!   the test's. Shared Key authentication with the emulator's well-known account.
//! - fake-gcs-server ([`FakeGcs`]), built from `real/go/fake-gcs-server` by `cargo xtask real
//!   build`, with its filesystem backend in a folder of the test's. It serves the JSON API and
//!   the XML API's GET, but not the XML API's plain object PUT that object_store writes with
//!   (cloud.google.com/storage/docs/xml-api/put-object-upload): fake-gcs-server 1.56.1 routes
//!   `PUT /BUCKET/OBJECT` to its JSON insert, which answers 400 "invalid uploadType" unless
//!   the request is a signed URL's (`X-Goog-Algorithm` in the query: `insertObject` in its
//!   fakestorage/upload.go), and its answer carries no `ETag` header where real Cloud Storage
//!   sends one. A relay in front of it ([`FakeGcs::endpoint`]) makes those two requests
//!   what the emulator understands and nothing else: a PUT without a query gets
//!   `X-Goog-Algorithm` (the emulator then stores the body as the XML PUT would), and the
//!   200 of such a PUT gets the `ETag` header from the object's own `etag`. Every other
//!   request and answer passes unchanged.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::Layout;

/// The Azurite `cargo xtask real build` installs (real/node/azurite/package.json).
pub const AZURITE_VERSION: &str = "3.37.0";
/// The emulator's account and its published key (learn.microsoft.com, "Use the Azurite
/// emulator": the well-known storage account and key).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The Blob service API version the container is created with.
const AZURE_API_VERSION: &str = "2021-08-06";
/// How long a server may take to come up.
const START_LIMIT: Duration = Duration::from_secs(60);

/// Azurite's Blob service entry point, run with node.
pub fn azurite_main(project: &Path) -> PathBuf {
    project.join("target/tools/azurite/node_modules/azurite/dist/src/blob/main.js")
}

/// The fake-gcs-server binary `build` makes.
pub fn fake_gcs_server(layout: &Layout) -> PathBuf {
    layout.bin().join("fake-gcs-server")
}

/// A server process in a process group of its own, killed with its group when dropped.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(mut command: Command, log: &Path, stdout: Stdio) -> Result<Process> {
        let out = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("start {:?}", command.get_program()))?;
        Ok(Process {
            child,
            log: log.to_path_buf(),
        })
    }

    /// Fails with the log's end when the process has exited.
    fn check_alive(&mut self, name: &str) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{name} exited ({status}) before it was ready; the end of {}:\n{}",
                self.log.display(),
                crate::log_tail(&self.log, 30)
            );
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }
}

/// Azurite's Blob service on loopback.
pub struct Azurite {
    endpoint: String,
    _process: Process,
}

impl Azurite {
    /// Starts `node <main>` on a free loopback port (`--blobPort 0`: the port is read from the
    /// line it prints once it listens), its state under `dir`. Telemetry off; neither `--loose`
    /// nor `--skipApiVersionCheck`: object_store's requests are strict ones of an API version
    /// this Azurite serves.
    pub fn start(main: &Path, dir: &Path) -> Result<Azurite> {
        if !main.is_file() {
            bail!(
                "{} is missing: cargo xtask real build installs Azurite",
                main.display()
            );
        }
        let data = dir.join("azurite");
        fs::create_dir_all(&data)?;
        let log = dir.join("azurite.log");
        let mut command = Command::new("node");
        command
            .arg(main)
            .args(["--blobHost", "127.0.0.1", "--blobPort", "0", "--location"])
            .arg(&data)
            .args(["--disableTelemetry", "--silent"]);
        let mut process = Process::spawn(command, &log, Stdio::piped())?;
        let stdout = process.child.stdout.take().context("Azurite's stdout")?;
        // Its lines, read on a thread of their own (which keeps reading, so the pipe never
        // fills): the one that says where it listens is the readiness signal.
        let (tx, rx) = std::sync::mpsc::channel();
        let echo = log.with_extension("stdout.log");
        std::thread::spawn(move || {
            let mut echo = fs::File::create(echo).ok();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(echo) = echo.as_mut() {
                    let _ = writeln!(echo, "{line}");
                }
                let _ = tx.send(line);
            }
        });
        let started = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(line) => {
                    if let Some(url) = line
                        .split_once("successfully listens on ")
                        .map(|(_, url)| url.trim().to_string())
                    {
                        return Ok(Azurite {
                            endpoint: url,
                            _process: process,
                        });
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    process.check_alive("Azurite")?;
                    bail!("Azurite closed its output without saying where it listens");
                }
            }
            process.check_alive("Azurite")?;
            if started.elapsed() > START_LIMIT {
                bail!("Azurite did not listen within {START_LIMIT:?}");
            }
        }
    }

    /// `http://127.0.0.1:PORT`, the Blob service (path-style: the account is the path's first
    /// segment).
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The variables that point object_store's Azure client (the gate's) at it: the emulator
    /// mode, with the well-known account and key, at this endpoint.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
            ("AZURITE_BLOB_STORAGE_URL", self.endpoint()),
        ]
    }

    /// Creates a container (Create Container, signed with the account's Shared Key:
    /// learn.microsoft.com, "Authorize with Shared Key").
    pub fn create_container(&self, name: &str) -> Result<()> {
        let date = http_date(SystemTime::now());
        let resource = format!("/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{name}\nrestype:container");
        // The verb, eleven empty standard headers, the x-ms- headers, the resource.
        let signed = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{AZURE_API_VERSION}\n{resource}"
        );
        let key = base64::engine::general_purpose::STANDARD.decode(AZURITE_KEY)?;
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).context("an HMAC key")?;
        mac.update(signed.as_bytes());
        let signature =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let url = format!(
            "{}/{AZURITE_ACCOUNT}/{name}?restype=container",
            self.endpoint
        );
        ureq::put(&url)
            .header("x-ms-date", &date)
            .header("x-ms-version", AZURE_API_VERSION)
            .header(
                "Authorization",
                &format!("SharedKey {AZURITE_ACCOUNT}:{signature}"),
            )
            .send_empty()
            .with_context(|| format!("create container {name} on Azurite ({url})"))?;
        Ok(())
    }
}

/// An HTTP date (RFC 7231's IMF-fixdate), as Shared Key signs it.
fn http_date(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let (hour, minute, second) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {hour:02}:{minute:02}:{second:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize]
    )
}

/// fake-gcs-server on loopback, behind the relay the module documentation describes.
pub struct FakeGcs {
    server: SocketAddr,
    relay: Relay,
    _process: Process,
}

impl FakeGcs {
    /// Starts `program` (plain HTTP, the filesystem backend under `dir`) on a free loopback
    /// port and waits for its health check; then the relay in front of it.
    pub fn start(program: &Path, dir: &Path) -> Result<FakeGcs> {
        if !program.is_file() {
            bail!(
                "{} is missing: cargo xtask real build compiles it from real/go/fake-gcs-server",
                program.display()
            );
        }
        let data = dir.join("fake-gcs-server");
        fs::create_dir_all(&data)?;
        let [port] = crate::free_ports::<1>()?;
        let mut command = Command::new(program);
        // `-public-host 127.0.0.1` without a port: the emulator then takes the XML API's
        // path-style requests to 127.0.0.1 on any port (its publicHostMatcher), the relay's
        // included.
        command
            .args(["-scheme", "http", "-host", "127.0.0.1", "-port"])
            .arg(port.to_string())
            .args(["-public-host", "127.0.0.1", "-backend", "filesystem"])
            .arg("-filesystem-root")
            .arg(&data)
            .args(["-log-level", "warn"]);
        let log = dir.join("fake-gcs-server.log");
        let mut process = Process::spawn(
            command,
            &log,
            Stdio::from(fs::File::create(dir.join("fake-gcs-server.stdout.log"))?),
        )?;
        let server = SocketAddr::from(([127, 0, 0, 1], port));
        let health = format!("http://{server}/_internal/healthcheck");
        let started = Instant::now();
        loop {
            if ureq::get(&health).call().is_ok() {
                break;
            }
            process.check_alive("fake-gcs-server")?;
            if started.elapsed() > START_LIMIT {
                bail!(
                    "fake-gcs-server not ready within {START_LIMIT:?} ({health}); the end of {}:\n{}",
                    log.display(),
                    crate::log_tail(&log, 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(FakeGcs {
            server,
            relay: Relay::start(server)?,
            _process: process,
        })
    }

    /// `http://127.0.0.1:PORT`: the relay, where clients go.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.relay.addr)
    }

    /// The variables that point object_store's Cloud Storage client (the gate's) at it: the
    /// endpoint, plain HTTP, and a service account key with OAuth off (object_store's
    /// `disable_oauth`: no token is asked of Google, requests carry an empty bearer).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("GOOGLE_BASE_URL", self.endpoint()),
            ("GOOGLE_ALLOW_HTTP", "true".to_string()),
            (
                "GOOGLE_SERVICE_ACCOUNT_KEY",
                SERVICE_ACCOUNT_KEY.to_string(),
            ),
        ]
    }

    /// Creates a bucket (the JSON API's buckets.insert).
    pub fn create_bucket(&self, name: &str) -> Result<()> {
        let url = format!("http://{}/storage/v1/b", self.server);
        ureq::post(&url)
            .content_type("application/json")
            .send(serde_json::json!({ "name": name }).to_string())
            .with_context(|| format!("create bucket {name} on fake-gcs-server ({url})"))?;
        Ok(())
    }
}

/// A service account key for an emulator: no private key is used with OAuth off.
pub const SERVICE_ACCOUNT_KEY: &str =
    r#"{"private_key":"","private_key_id":"","client_email":"","disable_oauth":true}"#;

/// The relay in front of fake-gcs-server: one request per connection (it asks the server to
/// close after answering, and closes the client's connection after the answer).
struct Relay {
    addr: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

impl Relay {
    fn start(server: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                std::thread::spawn(move || {
                    let _ = relay(client, server);
                });
            }
        });
        Ok(Relay { addr, stopped })
    }
}

/// One request from `client` to `server` and its answer back, translated as the module
/// documentation says.
fn relay(mut client: TcpStream, server: SocketAddr) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = client.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.splitn(3, ' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let plain_put = method == "PUT" && !target.contains('?');
    let mut out = if plain_put {
        format!("{method} {target}?X-Goog-Algorithm=GOOG4-RSA-SHA256 {version}\r\n")
    } else {
        format!("{request_line}\r\n")
    };
    let mut length = 0usize;
    for line in lines {
        let name = line
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        match name.as_str() {
            "connection" | "keep-alive" => continue,
            "transfer-encoding" => {
                client.write_all(
                    b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )?;
                return Ok(());
            }
            "content-length" => {
                length = line
                    .split_once(':')
                    .and_then(|(_, v)| v.trim().parse().ok())
                    .unwrap_or(0);
            }
            _ => {}
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut upstream = TcpStream::connect(server)?;
    upstream.set_read_timeout(Some(Duration::from_secs(30)))?;
    upstream.write_all(out.as_bytes())?;
    let body = &buffer[head_end..];
    upstream.write_all(body)?;
    let rest = length.saturating_sub(body.len()) as u64;
    std::io::copy(&mut (&mut client).take(rest), &mut upstream)?;
    let mut answer = Vec::new();
    upstream.read_to_end(&mut answer)?;
    if plain_put {
        answer = with_etag(answer);
    }
    client.write_all(&answer)?;
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}

/// A 200 answer with an `ETag` header taken from its JSON body's `etag`, when it has none.
fn with_etag(answer: Vec<u8>) -> Vec<u8> {
    let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return answer;
    };
    let head = String::from_utf8_lossy(&answer[..at]).to_string();
    let ok = head.starts_with("HTTP/1.1 200 ");
    let has = head
        .split("\r\n")
        .any(|l| l.to_ascii_lowercase().starts_with("etag:"));
    let etag = serde_json::from_slice::<serde_json::Value>(&answer[at + 4..])
        .ok()
        .and_then(|v| v["etag"].as_str().map(str::to_string));
    match etag {
        Some(etag) if ok && !has => {
            let mut out = format!("{head}\r\nETag: \"{etag}\"\r\n\r\n").into_bytes();
            out.extend_from_slice(&answer[at + 4..]);
            out
        }
        _ => answer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_are_imf_fixdates() {
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(784_111_777)),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "Tue, 29 Feb 2000 00:00:00 GMT"
        );
    }

    #[test]
    fn the_relay_adds_an_etag_to_a_put_answer_only_where_missing() {
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"etag\":\"abc\"}".to_vec();
        let out = String::from_utf8(with_etag(answer)).unwrap_or_default();
        assert!(out.contains("\r\nETag: \"abc\"\r\n\r\n{"), "{out}");
        let failed = b"HTTP/1.1 400 Bad Request\r\n\r\n{\"etag\":\"abc\"}".to_vec();
        assert_eq!(with_etag(failed.clone()), failed);
        let has = b"HTTP/1.1 200 OK\r\nEtag: \"x\"\r\n\r\n{\"etag\":\"abc\"}".to_vec();
        assert_eq!(with_etag(has.clone()), has);
    }
}
