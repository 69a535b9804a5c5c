//! Parsed render outputs, shared by every render of one run (a check renders the merge base
//! and the head with one store).
//!
//! A render output (keyed by its render key) is parsed once; inside outputs, each distinct
//! YAML document is parsed once too, so the 25 CRDs an operator chart renders identically on
//! 600 clusters are one allocation each. Equal documents are then the same `Arc`, and the diff
//! compares pointers before it compares values.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};

use serde_json::Value;

use super::directory::push_object;
use crate::yaml;

/// One rendered Kubernetes object, shared by every Application that renders it.
pub type Object = Arc<Value>;

/// The objects of one render output, or why it could not be read.
pub type Parsed = Result<Arc<Vec<Object>>, String>;

/// Process slots shared by every render of a run: `--jobs` bounds helm and kustomize
/// processes across the merge base's and the head's renders together.
#[derive(Default)]
struct Slots {
    busy: Mutex<usize>,
    freed: Condvar,
}

/// A held process slot, released on drop.
pub struct Slot<'a> {
    slots: &'a Slots,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut busy = self.slots.busy.lock().unwrap_or_else(|p| p.into_inner());
        *busy = busy.saturating_sub(1);
        drop(busy);
        self.slots.freed.notify_one();
    }
}

#[derive(Default)]
struct Store {
    renders: HashMap<String, Parsed>,
    /// Parsed documents by the SHA-256 of their text: hashed once per piece, where a map keyed
    /// by the text itself would hash megabytes of CRDs at every lookup.
    documents: HashMap<DocKey, Arc<Vec<Object>>>,
    /// Documents that did not parse, with why.
    /// (the line in the document, the parser's message): each output adds the lines before
    /// its own copy of the document.
    invalid: HashMap<DocKey, (u64, String)>,
    /// Documents a parse of this run is reading right now: another parse waits for them
    /// instead of reading them twice (the first outputs of both commits arrive together).
    reading: HashSet<DocKey>,
    /// How many documents were read (each distinct one once, if the claims work).
    read: usize,
    /// Parses waiting right now for a document another parse is reading.
    waiting: usize,
    /// Render keys a render of this run is producing right now.
    claimed: HashSet<String>,
}

impl Store {
    /// Keeps a document's objects (the first parse of a document wins, so every render
    /// shares it) or why it did not parse.
    fn publish(&mut self, key: DocKey, result: Result<Vec<Object>, (u64, String)>) {
        match result {
            Ok(objects) => {
                self.documents
                    .entry(key)
                    .or_insert_with(|| Arc::new(objects));
            }
            Err(message) => {
                self.invalid.insert(key, message);
            }
        }
    }
}

/// The store; cloning shares it. Two renders running at once (a check's merge base and
/// head) never run one render key twice: the first claims it, the second waits for it.
#[derive(Clone, Default)]
pub struct ParsedStore(Arc<(Mutex<Store>, Condvar)>, Arc<Slots>, Arc<Snapshots>);

/// The repository snapshots of a run, by repository and revision: a check reads its head
/// three times (its render, the chart moves' render, the rules' scan) and loads it once.
type Snapshots = Mutex<HashMap<(std::path::PathBuf, String), Arc<crate::git::Snapshot>>>;

/// What a render does about a key.
pub enum Claim {
    /// Already produced in this run.
    Done(Parsed),
    /// This render produces it (and must publish it, which `ClaimGuard` makes sure of).
    Mine,
    /// Another render is producing it: `wait` for it after running this render's own.
    Theirs,
}

/// Publishes an error for every claimed key left unpublished when dropped (a render that
/// stopped half-way), so a render waiting for one of them never waits forever.
pub struct ClaimGuard {
    store: ParsedStore,
    keys: Vec<String>,
}

impl ClaimGuard {
    pub fn new(store: &ParsedStore) -> Self {
        ClaimGuard {
            store: store.clone(),
            keys: Vec::new(),
        }
    }

    pub fn hold(&mut self, key: &str) {
        self.keys.push(key.to_string());
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        for key in &self.keys {
            if self.store.lock().claimed.contains(key) {
                self.store
                    .insert(key, Err("the render producing this stopped".to_string()));
            }
        }
    }
}

impl std::fmt::Debug for ParsedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ParsedStore")
    }
}

/// A render output to parse: its key, a label for errors, its text.
pub struct Output {
    pub key: String,
    pub label: String,
    pub text: String,
}

impl ParsedStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.0.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The snapshot of `revision` in `repo`, loaded once per run. Two renders asking at once
    /// may both load it; the first one stored is kept.
    pub fn snapshot(
        &self,
        repo: &std::path::Path,
        revision: &str,
    ) -> Result<Arc<crate::git::Snapshot>, crate::git::GitError> {
        let key = (repo.to_path_buf(), revision.to_string());
        if let Some(snapshot) = self.2.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(snapshot.clone());
        }
        let snapshot = Arc::new(crate::git::Snapshot::load(repo, revision)?);
        Ok(self
            .2
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(snapshot)
            .clone())
    }

    /// How many documents this run has read: each distinct document once.
    pub fn documents_read(&self) -> usize {
        self.lock().read
    }

    /// Waits for one of `jobs` process slots shared by the run's renders.
    pub fn slot(&self, jobs: usize) -> Slot<'_> {
        let slots = &*self.1;
        let mut busy = slots.busy.lock().unwrap_or_else(|p| p.into_inner());
        while *busy >= jobs.max(1) {
            busy = slots.freed.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
        *busy += 1;
        Slot { slots }
    }

    /// The parsed objects of a render key already seen in this run.
    pub fn get(&self, key: &str) -> Option<Parsed> {
        self.lock().renders.get(key).cloned()
    }

    /// Records a render key's result (an error, or objects that did not come from YAML) and
    /// wakes renders waiting for it.
    pub fn insert(&self, key: &str, parsed: Parsed) {
        let mut store = self.lock();
        store.renders.insert(key.to_string(), parsed);
        store.claimed.remove(key);
        drop(store);
        self.0.1.notify_all();
    }

    /// Decides who produces a key.
    pub fn claim(&self, key: &str) -> Claim {
        let mut store = self.lock();
        if let Some(parsed) = store.renders.get(key) {
            return Claim::Done(parsed.clone());
        }
        if store.claimed.insert(key.to_string()) {
            Claim::Mine
        } else {
            Claim::Theirs
        }
    }

    /// Waits until another render publishes a key it claimed.
    pub fn wait(&self, key: &str) -> Parsed {
        let mut store = self.lock();
        loop {
            if let Some(parsed) = store.renders.get(key) {
                return parsed.clone();
            }
            if !store.claimed.contains(key) {
                return Err(format!("render {key} was claimed but never produced"));
            }
            store = self.0.1.wait(store).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Parses outputs on up to `jobs` threads, each distinct document once across the run.
    /// Returns (key, result) in the order given.
    pub fn parse(&self, outputs: &[Output], jobs: usize) -> Vec<(String, Parsed)> {
        // Split every output into documents; a stream with directives is parsed whole.
        // An output over the document limit is refused before any of it is parsed.
        let split: Vec<Option<Vec<(usize, &str)>>> = outputs
            .iter()
            .map(|o| split_documents(&o.text).unwrap_or_else(|| vec![(0, o.text.as_str())]))
            .map(|pieces| (pieces.len() <= yaml::MAX_RENDERED_DOCUMENTS).then_some(pieces))
            .collect();
        let split: Vec<Option<Vec<Piece>>> = split
            .into_iter()
            .map(|pieces| {
                pieces.map(|pieces| {
                    pieces
                        .into_iter()
                        .map(|(line, text)| (line, text, doc_key(text)))
                        .collect()
                })
            })
            .collect();
        // What this parse reads, and what another parse is reading: (text, label).
        let mut wanted: HashMap<DocKey, (&str, &str)> = HashMap::new();
        let mut theirs: HashMap<DocKey, (&str, &str)> = HashMap::new();
        {
            let mut store = self.lock();
            for (output, segments) in outputs.iter().zip(&split) {
                for (_, segment, key) in segments.iter().flatten() {
                    if store.documents.contains_key(key)
                        || store.invalid.contains_key(key)
                        || wanted.contains_key(key)
                    {
                        continue;
                    }
                    if store.reading.contains(key) {
                        theirs.insert(*key, (segment, output.label.as_str()));
                    } else {
                        store.reading.insert(*key);
                        wanted.insert(*key, (segment, output.label.as_str()));
                    }
                }
            }
        }
        // Whatever happens to this parse (a panic included), what it claimed is released.
        let claimed = Reading {
            store: self,
            keys: wanted.keys().copied().collect(),
        };
        let parsed = super::parallel_map(
            wanted.into_iter().collect::<Vec<_>>(),
            jobs,
            |(key, (segment, label))| (key, parse_segment(segment, label)),
        );
        {
            let mut store = self.lock();
            store.read += parsed.len();
            for (key, result) in parsed {
                store.reading.remove(&key);
                store.publish(key, result);
            }
        }
        drop(claimed);
        // Documents another parse was reading: wait for them; one it gave up is read here.
        for (key, (segment, label)) in theirs {
            let mut store = self.lock();
            store.waiting += 1;
            while store.reading.contains(&key) {
                store = self.0.1.wait(store).unwrap_or_else(|p| p.into_inner());
            }
            store.waiting -= 1;
            if store.documents.contains_key(&key) || store.invalid.contains_key(&key) {
                continue;
            }
            drop(store);
            let result = parse_segment(segment, label);
            let mut store = self.lock();
            store.read += 1;
            store.publish(key, result);
        }
        let store = self.lock();
        let mut out = Vec::with_capacity(outputs.len());
        for (output, segments) in outputs.iter().zip(&split) {
            let result = (|| {
                let Some(segments) = segments else {
                    return Err(format!(
                        "{} printed invalid YAML: the render exceeds the limit of {} documents",
                        output.label,
                        yaml::MAX_RENDERED_DOCUMENTS
                    ));
                };
                let mut objects: Vec<Object> = Vec::new();
                for (line, _, key) in segments {
                    if let Some((at, message)) = store.invalid.get(key) {
                        return Err(format!(
                            "{} printed invalid YAML: line {}: {message}",
                            output.label,
                            at + *line as u64
                        ));
                    }
                    if let Some(parsed) = store.documents.get(key) {
                        objects.extend(parsed.iter().cloned());
                    }
                    // `...`-separated documents share a piece: count what was parsed.
                    if objects.len() > yaml::MAX_RENDERED_DOCUMENTS {
                        return Err(format!(
                            "{} printed invalid YAML: the render exceeds the limit of {} documents",
                            output.label,
                            yaml::MAX_RENDERED_DOCUMENTS
                        ));
                    }
                }
                Ok(Arc::new(objects))
            })();
            out.push((output.key.clone(), result));
        }
        drop(store);
        let mut store = self.lock();
        for (key, result) in &out {
            store.renders.insert(key.clone(), result.clone());
            store.claimed.remove(key);
        }
        drop(store);
        self.0.1.notify_all();
        out
    }
}

/// Documents one parse claimed; released (and waiters woken) when dropped.
struct Reading<'a> {
    store: &'a ParsedStore,
    keys: Vec<DocKey>,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        let mut store = self.store.lock();
        for key in &self.keys {
            store.reading.remove(key);
        }
        drop(store);
        self.store.0.1.notify_all();
    }
}

/// A piece of an output: the lines before it, its text, its key.
type Piece<'a> = (usize, &'a str, DocKey);

/// A document's identity: the SHA-256 of its text.
type DocKey = [u8; 32];

fn doc_key(text: &str) -> DocKey {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).into()
}

/// Parses one document (or, for a stream that could not be split, a whole stream).
fn parse_segment(segment: &str, label: &str) -> Result<Vec<Object>, (u64, String)> {
    let documents = yaml::parse_stream(segment, label, yaml::MAX_RENDERED_DOCUMENTS)
        .map_err(|e| (e.line, e.message))?;
    let mut objects = Vec::new();
    for document in documents {
        push_object(document, &mut objects);
    }
    Ok(objects.into_iter().map(Arc::new).collect())
}

/// Splits a YAML stream at its document start markers (`---` at the start of a line followed
/// by a space, a tab or the line's end): YAML forbids that line inside a document, in every
/// scalar style, so each piece holds whole documents. Returns each piece with the number of
/// lines before it. A stream with a directive (a line starting with `%`) is not split: a
/// directive belongs to the document after it.
pub fn split_documents(text: &str) -> Option<Vec<(usize, &str)>> {
    let mut pieces = Vec::new();
    let mut start = 0usize;
    let mut start_line = 0usize;
    let mut offset = 0usize;
    for (line_number, line) in text.split_inclusive('\n').enumerate() {
        if line.starts_with('%') {
            return None;
        }
        let marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\n', '\r']));
        if marker && offset > start {
            pieces.push((start_line, &text[start..offset]));
            start = offset;
            start_line = line_number;
        }
        offset += line.len();
    }
    if offset > start {
        pieces.push((start_line, &text[start..offset]));
    }
    Some(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outputs named (key and label) and holding the given texts.
    fn outputs(named: &[(&str, String)]) -> Vec<Output> {
        named
            .iter()
            .map(|(name, text)| Output {
                key: name.to_string(),
                label: name.to_string(),
                text: text.clone(),
            })
            .collect()
    }

    /// Parses `text` on another thread and returns once that parse waits for a document
    /// another parse is reading (or has finished, having read it itself).
    fn parse_until_it_waits(
        store: &ParsedStore,
        text: &str,
    ) -> std::thread::JoinHandle<Vec<(String, Parsed)>> {
        let waiter = {
            let store = store.clone();
            let text = text.to_string();
            std::thread::spawn(move || {
                store.parse(
                    &[Output {
                        key: "k".into(),
                        label: "helm template x".into(),
                        text,
                    }],
                    1,
                )
            })
        };
        while store.lock().waiting == 0 && !waiter.is_finished() {
            std::thread::yield_now();
        }
        waiter
    }

    #[test]
    fn splits_at_document_markers_only() {
        let text = "a: 1\n---\nb: |\n  --- not a marker\n---x: 1\n--- # c\nc: 2\n";
        let pieces: Vec<&str> = split_documents(text)
            .unwrap()
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        assert_eq!(
            pieces,
            vec![
                "a: 1\n",
                "---\nb: |\n  --- not a marker\n---x: 1\n",
                "--- # c\nc: 2\n"
            ]
        );
        assert!(split_documents("%YAML 1.2\n---\na: 1\n").is_none());
    }

    #[test]
    fn equal_documents_are_one_allocation_across_outputs() {
        let store = ParsedStore::default();
        let crd = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: shared}\n";
        let out = store.parse(
            &outputs(&[
                (
                    "a",
                    format!("{crd}---\nkind: Secret\nmetadata: {{name: a}}\n"),
                ),
                (
                    "b",
                    format!("{crd}---\nkind: Secret\nmetadata: {{name: b}}\n"),
                ),
            ]),
            2,
        );
        let a = out[0].1.clone().unwrap();
        let b = out[1].1.clone().unwrap();
        assert_eq!((a.len(), b.len()), (2, 2));
        assert!(Arc::ptr_eq(&a[0], &b[0]));
        assert!(!Arc::ptr_eq(&a[1], &b[1]));
        assert!(store.get("a").is_some());
    }

    /// Another parse is reading a document (its key is in `reading`): a parse that meets it
    /// waits for that parse's objects instead of reading the document again.
    #[test]
    fn a_document_another_parse_is_reading_is_waited_for_not_read_twice() {
        let store = ParsedStore::default();
        let crd = "---\nkind: CustomResourceDefinition\nmetadata: {name: a.example.com}\n";
        let key = doc_key(crd);
        store.lock().reading.insert(key);
        let theirs: Arc<Vec<Object>> = Arc::new(vec![Arc::new(
            serde_json::json!({"from": "the other parse"}),
        )]);
        // The other parse publishes once the waiter waits (a waiter that does not wait
        // finishes instead, having read the document itself).
        let waiter = parse_until_it_waits(&store, crd);
        {
            let mut inner = store.lock();
            inner.documents.insert(key, theirs.clone());
            inner.reading.remove(&key);
        }
        store.0.1.notify_all();
        let out = waiter.join().unwrap();
        let objects = out[0].1.clone().unwrap();
        assert_eq!(objects.len(), 1);
        assert!(Arc::ptr_eq(&objects[0], &theirs[0]), "{objects:?}");
        assert_eq!(
            store.documents_read(),
            0,
            "the document was read a second time"
        );
    }

    /// A parse that claimed a document and stopped without publishing it does not leave a
    /// waiter hanging: the waiter reads it itself.
    #[test]
    fn a_document_whose_reader_gave_up_is_read_by_the_waiter() {
        let store = ParsedStore::default();
        let doc = "---\nkind: ConfigMap\nmetadata: {name: c}\n";
        let key = doc_key(doc);
        store.lock().reading.insert(key);
        let waiter = parse_until_it_waits(&store, doc);
        drop(Reading {
            store: &store,
            keys: vec![key],
        });
        let out = waiter.join().unwrap();
        let objects = out[0].1.clone().unwrap();
        assert_eq!(objects[0]["metadata"]["name"], "c");
        assert_eq!(store.documents_read(), 1);
    }

    /// One invalid document in two outputs at different places: each error names the line in
    /// its own output, whichever output read the document first.
    #[test]
    fn a_shared_invalid_document_is_named_at_its_line_in_each_output() {
        let store = ParsedStore::default();
        let bad = "---\nbad: [\n";
        let out = store.parse(
            &outputs(&[
                ("base", format!("a: 1\n{bad}")),
                ("head", format!("a: 1\n---\nb: 2\nc: 3\n{bad}")),
            ]),
            2,
        );
        let line = |err: &str| -> u64 {
            let rest = err.split("line ").nth(1).unwrap();
            rest.split(':').next().unwrap().parse().unwrap()
        };
        let (base, head) = (out[0].1.clone().unwrap_err(), out[1].1.clone().unwrap_err());
        assert_eq!(line(&head) - line(&base), 3, "{base} / {head}");
    }

    #[test]
    fn an_invalid_document_fails_the_output_with_its_line() {
        let store = ParsedStore::default();
        let out = store.parse(
            &[Output {
                key: "k".into(),
                label: "helm template x".into(),
                text: "a: 1\n---\nb: [\n".into(),
            }],
            1,
        );
        let err = out[0].1.clone().unwrap_err();
        assert!(
            err.starts_with("helm template x printed invalid YAML: line "),
            "{err}"
        );
    }

    #[test]
    fn a_key_claimed_by_one_render_is_waited_for_by_the_other() {
        let store = ParsedStore::default();
        assert!(matches!(store.claim("k"), Claim::Mine));
        assert!(matches!(store.claim("k"), Claim::Theirs));
        let waiter = {
            let store = store.clone();
            std::thread::spawn(move || store.wait("k"))
        };
        store.insert("k", Ok(Arc::new(vec![])));
        assert!(waiter.join().unwrap().is_ok());
        assert!(matches!(store.claim("k"), Claim::Done(Ok(_))));
    }

    #[test]
    fn a_render_that_stops_releases_its_claims_with_an_error() {
        let store = ParsedStore::default();
        {
            let mut guard = ClaimGuard::new(&store);
            assert!(matches!(store.claim("k"), Claim::Mine));
            guard.hold("k");
        }
        let err = store.wait("k").unwrap_err();
        assert!(err.contains("stopped"), "{err}");
    }
}
