//! A model whose answers are kept in Bosun's work folder, so a question asked once is not
//! asked again: a triage tried again after a forge fault, or started again after a restart,
//! finds the reply the first one was given (the model-calls comment already counted that
//! call). Only replies the provider's checks accepted are kept; a refusal (a timeout, a 500)
//! is asked again. A kept reply is hostile as any other: the harness checks it on every use.
//!
//! The key is the SHA-256 of the whole request (purpose, subject, instructions, the redacted
//! prompt, the schema): a new head, a changed document or a changed prompt is a new question.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{MAX_REPLY_BYTES, Model, Refusal, Reply, Request, Usage};

/// The most replies kept; the oldest go first.
pub const KEPT_REPLIES: usize = 256;

/// One kept reply, as written in the folder.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kept {
    value: Value,
    input_tokens: u64,
    output_tokens: u64,
}

/// `inner` with its accepted replies kept in `dir`.
pub struct Remembered {
    inner: Arc<dyn Model>,
    dir: PathBuf,
}

impl Remembered {
    /// Keeps `inner`'s replies in `dir` (created, owner-only).
    pub fn new(inner: Arc<dyn Model>, dir: PathBuf) -> std::io::Result<Remembered> {
        std::fs::create_dir_all(&dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(Remembered { inner, dir })
    }

    fn key(request: &Request) -> String {
        let whole = serde_json::json!([
            request.purpose,
            request.subject,
            request.system,
            request.prompt,
            request.schema,
        ]);
        let digest = Sha256::digest(whole.to_string().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn file(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.json"))
    }

    /// The kept reply for `key`; a file too large or that does not parse is no reply.
    fn read(&self, key: &str) -> Option<Reply> {
        let path = self.file(key);
        let size = std::fs::metadata(&path).ok()?.len();
        if size > 2 * MAX_REPLY_BYTES as u64 {
            return None;
        }
        let kept: Kept = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
        Some(Reply {
            value: kept.value,
            usage: Usage {
                input_tokens: kept.input_tokens,
                output_tokens: kept.output_tokens,
            },
        })
    }

    /// Keeps `reply` under `key` (atomically: a temporary file renamed), then drops the
    /// oldest beyond [`KEPT_REPLIES`]. A failure only means the question may be asked again.
    fn write(&self, key: &str, reply: &Reply) -> std::io::Result<()> {
        let kept = Kept {
            value: reply.value.clone(),
            input_tokens: reply.usage.input_tokens,
            output_tokens: reply.usage.output_tokens,
        };
        let mut file = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempfile_in(&self.dir)?;
        file.write_all(&serde_json::to_vec(&kept).map_err(std::io::Error::other)?)?;
        file.as_file().sync_all()?;
        file.persist(self.file(key)).map_err(|e| e.error)?;
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&self.dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() > KEPT_REPLIES {
            files.sort();
            for (_, path) in &files[..files.len() - KEPT_REPLIES] {
                let _ = std::fs::remove_file(path);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Model for Remembered {
    async fn call(&self, request: &Request) -> Result<Reply, Refusal> {
        let key = Self::key(request);
        if let Some(reply) = self.read(&key) {
            return Ok(reply);
        }
        let reply = self.inner.call(request).await?;
        // Not kept is not a failure of the call: the next asking asks the model again.
        let _ = self.write(&key, &reply);
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A model that counts its calls and answers each with its count.
    struct Counting(AtomicU32);

    #[async_trait]
    impl Model for Counting {
        async fn call(&self, request: &Request) -> Result<Reply, Refusal> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            if request.subject == "refused" {
                return Err(Refusal::Status(500, "no".into()));
            }
            Ok(Reply {
                value: serde_json::json!({ "n": n }),
                usage: Usage::default(),
            })
        }
    }

    fn request(subject: &str, prompt: &str) -> Request {
        Request {
            purpose: "reshape".into(),
            subject: subject.into(),
            system: "s".into(),
            prompt: prompt.into(),
            schema: serde_json::json!({}),
        }
    }

    #[tokio::test]
    async fn a_question_asked_once_is_answered_from_the_folder_even_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let inner = Arc::new(Counting(AtomicU32::new(0)));
        let first = Remembered::new(inner.clone(), dir.path().join("r")).unwrap();
        let a = first.call(&request("doc", "p")).await.unwrap();
        // A new process: a new Remembered over the same folder.
        let again = Remembered::new(inner.clone(), dir.path().join("r")).unwrap();
        let b = again.call(&request("doc", "p")).await.unwrap();
        assert_eq!(a.value, b.value);
        assert_eq!(inner.0.load(Ordering::SeqCst), 1);
        // Another prompt is another question.
        let c = again.call(&request("doc", "p2")).await.unwrap();
        assert_ne!(a.value, c.value);
        assert_eq!(inner.0.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refusal_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let inner = Arc::new(Counting(AtomicU32::new(0)));
        let model = Remembered::new(inner.clone(), dir.path().to_path_buf()).unwrap();
        assert!(model.call(&request("refused", "p")).await.is_err());
        assert!(model.call(&request("refused", "p")).await.is_err());
        assert_eq!(inner.0.load(Ordering::SeqCst), 2);
    }
}
