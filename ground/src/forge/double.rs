//! The forge double's own API: start it, seed users and repositories, set faults, read back.

use std::collections::BTreeMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use anyhow::Result;

use crate::forge::{
    ForgeDouble, ForgeFaults, ForgeState, RecordedRequest, Repo, Shared, Write, lock, router,
};
use crate::git;

impl ForgeDouble {
    /// Starts the double on an ephemeral loopback port, keeping repositories in a temporary
    /// folder (or `root` when given).
    pub async fn start(root: Option<&Path>) -> Result<ForgeDouble> {
        let (root, root_dir) = match root {
            Some(root) => (root.to_path_buf(), None),
            None => {
                let dir = git::tempfile_dir()?;
                (dir.path().to_path_buf(), Some(dir))
            }
        };
        let state: Shared = Arc::new(Mutex::new(ForgeState {
            git_root: root.clone(),
            ..ForgeState::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = router(state.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ForgeDouble {
            state,
            addr,
            root,
            _root_dir: root_dir,
            server,
        })
    }

    /// Stamps what the double writes with the ground's clock from now on.
    pub fn set_clock(&self, clock: crate::clock::Clock) {
        lock(&self.state).clock = clock;
    }

    /// The API root, as a client's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A token that authenticates as `login`.
    /// Publishes a release of `owner/name` (a source repository an image names): GitHub's
    /// release object fields `tag_name`, `name`, `body`, `html_url`, `draft`, `prerelease`.
    pub fn add_release(&self, repository: &str, tag: &str, name: &str, body: &str) {
        let url = format!("https://github.com/{repository}/releases/tag/{tag}");
        lock(&self.state)
            .releases
            .entry(repository.to_string())
            .or_default()
            .insert(
                0,
                serde_json::json!({"tag_name": tag, "name": name, "body": body,
                    "html_url": url, "draft": false, "prerelease": tag.contains('-')}),
            );
    }

    pub fn add_user(&self, token: &str, login: &str) {
        lock(&self.state)
            .users
            .insert(token.to_string(), login.to_string());
    }

    /// An access token for `login` with these scopes: Gitea's (`read:user`, `write:issue`,
    /// `write:repository`, `all`, ...), as `gitea admin user generate-access-token --scopes`
    /// makes one, or GitLab's (`api`, `read_api`, `read_user`), each face reading its own.
    pub fn add_scoped_user(&self, token: &str, login: &str, scopes: &[&str]) {
        let mut state = lock(&self.state);
        state.users.insert(token.to_string(), login.to_string());
        state.scopes.insert(
            token.to_string(),
            scopes.iter().map(|s| s.to_string()).collect(),
        );
    }

    /// The GitLab face's API root (`/api/v4`).
    pub fn gitlab_url(&self) -> String {
        format!("{}/api/v4", self.url())
    }

    /// The Gitea face's API root (`/api/v1`).
    pub fn gitea_url(&self) -> String {
        format!("{}/api/v1", self.url())
    }

    /// Creates `owner/name` with `content` as the first commit of `main`; returns its git URL.
    /// On GitLab's face a slug may be a project in a subgroup, `group/sub/.../project`: the
    /// owner is then the namespace (`group/sub/...`), and the bare repository sits at the
    /// project's full path.
    pub fn create_repo(&self, slug: &str, content: &Path) -> Result<String> {
        let (owner, name) = slug.rsplit_once('/').context("slug is owner/name")?;
        anyhow::ensure!(
            slug.split('/')
                .all(|s| !s.is_empty() && s != "." && s != ".."),
            "slug {slug:?} holds an empty or dot segment"
        );
        let bare = self.root.join(owner).join(format!("{name}.git"));
        git::init_bare_from(&bare, content, "initial commit")?;
        let mut state = lock(&self.state);
        let id = state.id();
        state.repos.insert(
            slug.to_string(),
            Repo {
                id,
                owner: owner.to_string(),
                name: name.to_string(),
                bare: bare.clone(),
                pulls: Vec::new(),
                comments: Vec::new(),
                statuses: Vec::new(),
                check_runs: Vec::new(),
                protection: BTreeMap::new(),
                labels: Vec::new(),
            },
        );
        Ok(format!("file://{}", bare.display()))
    }

    /// The smart-HTTP URL of a repository, as GitHub serves it (`https://github.com/o/n.git`):
    /// `git http-backend` behind it, every request authenticated with a user's token the way
    /// GitHub takes one (HTTP Basic, any user name, the token as the password).
    pub fn http_git_url(&self, slug: &str) -> String {
        format!("{}/{slug}.git", self.url())
    }

    /// The smart-HTTP URL with a user's token in it, as a CI checkout or a person's clone
    /// keeps it (`https://x-access-token:<token>@github.com/o/n.git`).
    pub fn http_git_url_as(&self, slug: &str, token: &str) -> String {
        format!("http://x-access-token:{token}@{}/{slug}.git", self.addr)
    }

    /// The git URL of a repository (clone and push with real git).
    pub fn git_url(&self, slug: &str) -> Option<String> {
        lock(&self.state)
            .repos
            .get(slug)
            .map(|r| format!("file://{}", r.bare.display()))
    }

    /// Branch protection: merges into `branch` need these checks successful on the head.
    pub fn protect(&self, slug: &str, branch: &str, required_checks: &[&str]) {
        if let Some(repo) = lock(&self.state).repos.get_mut(slug) {
            repo.protection.insert(
                branch.to_string(),
                required_checks.iter().map(|s| s.to_string()).collect(),
            );
        }
    }

    /// The bare repository behind `owner/name`.
    pub fn bare_path(&self, slug: &str) -> Option<PathBuf> {
        lock(&self.state).repos.get(slug).map(|r| r.bare.clone())
    }

    /// Open pull requests with their live head commits: (number, head sha, head branch).
    pub fn open_pulls(&self, slug: &str) -> Vec<(u64, String, String)> {
        let state = lock(&self.state);
        let Some(repo) = state.repos.get(slug) else {
            return Vec::new();
        };
        repo.pulls
            .iter()
            .filter(|p| p.state == "open")
            .filter_map(|p| {
                Some((
                    p.number,
                    git::rev_parse(&repo.bare, &format!("refs/heads/{}", p.head_ref))?,
                    p.head_ref.clone(),
                ))
            })
            .collect()
    }

    /// What the ground's invariants read after every tick, in one lock: the comments that
    /// open with `marker` as (number, author) (never their bodies: a report is tens of
    /// kilobytes), every status ever set as (sha, context, state), and every check run as
    /// (sha, name).
    #[allow(clippy::type_complexity)]
    pub fn audit(
        &self,
        slug: &str,
        marker: &str,
    ) -> (
        Vec<(u64, String)>,
        Vec<(String, String, String)>,
        Vec<(String, String)>,
    ) {
        let state = lock(&self.state);
        let Some(repo) = state.repos.get(slug) else {
            return Default::default();
        };
        (
            repo.comments
                .iter()
                .filter(|c| c.body.starts_with(marker))
                .map(|c| (c.issue, c.user.clone()))
                .collect(),
            repo.statuses
                .iter()
                .map(|s| (s.sha.clone(), s.context.clone(), s.state.clone()))
                .collect(),
            repo.check_runs
                .iter()
                .map(|r| (r.head_sha.clone(), r.name.clone()))
                .collect(),
        )
    }

    /// A pull request's labels (empty when there is no such pull request).
    pub fn labels(&self, slug: &str, number: u64) -> Vec<String> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .and_then(|r| r.pulls.iter().find(|p| p.number == number))
            .map(|p| p.labels.clone())
            .unwrap_or_default()
    }

    /// A pull request's comments as (author, body), oldest first.
    pub fn comments(&self, slug: &str, number: u64) -> Vec<(String, String)> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.comments
                    .iter()
                    .filter(|c| c.issue == number)
                    .map(|c| (c.user.clone(), c.body.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every body the comments on pull request `number` starting with `marker` have had,
    /// oldest first (a comment's earlier bodies before its current one).
    pub fn comment_bodies(&self, slug: &str, number: u64, marker: &str) -> Vec<String> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.comments
                    .iter()
                    .filter(|c| c.issue == number && c.body.starts_with(marker))
                    .flat_map(|c| c.earlier.iter().chain(std::iter::once(&c.body)))
                    .filter(|body| body.starts_with(marker))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The commit statuses of a commit as (context, state, description), oldest first.
    pub fn statuses(&self, slug: &str, sha: &str) -> Vec<(String, String, String)> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.statuses
                    .iter()
                    .filter(|s| s.sha == sha)
                    .map(|s| (s.context.clone(), s.state.clone(), s.description.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Turns seeded faults on (or off with `ForgeFaults::default()`).
    pub fn set_faults(&self, faults: ForgeFaults) {
        let mut state = lock(&self.state);
        state.faults = faults;
    }

    /// Answers `user`'s next `requests` REST requests (of `method` only, when given) with 502
    /// Bad Gateway.
    pub fn outage(&self, user: &str, method: Option<&str>, requests: u32) {
        self.outage_on(user, method, None, 0, requests);
    }

    /// `user`'s requests of `method` to a path ending in `path`: the next `after` pass, then
    /// `requests` are answered 502.
    pub fn outage_on(
        &self,
        user: &str,
        method: Option<&str>,
        path: Option<&str>,
        after: u32,
        requests: u32,
    ) {
        lock(&self.state)
            .outages
            .set_on(user, method, path, after, requests);
    }

    /// How many faults were injected.
    pub fn injected_faults(&self) -> u64 {
        lock(&self.state).injected
    }

    /// Every request received so far.
    /// How many writes (anything but GET and HEAD) the double has been asked for: a cheap
    /// mark of a product changing something.
    pub fn write_count(&self) -> usize {
        lock(&self.state).writes
    }

    /// Every write (anything but GET and HEAD) `user` attempted, and every push by anyone,
    /// in order, each with whether the double applied it (answered 2xx).
    pub fn writes_and_pushes(&self, user: &str) -> Vec<Write> {
        lock(&self.state)
            .requests
            .iter()
            .filter(|r| r.method != "GET" && r.method != "HEAD")
            .filter(|r| r.user.as_deref() == Some(user) || r.path.ends_with("/git-receive-pack"))
            .map(|r| Write {
                user: r.user.clone(),
                method: r.method.clone(),
                path: r.path.clone(),
                body: r.body.clone(),
                applied: (200..300).contains(&r.status),
            })
            .collect()
    }

    /// The name of the repository label `id` (the Gitea face adds labels by id).
    pub fn label_name(&self, slug: &str, id: u64) -> Option<String> {
        let state = lock(&self.state);
        let repo = state.repos.get(slug)?;
        repo.labels
            .iter()
            .find(|l| l.id == id)
            .map(|l| l.name.clone())
    }

    /// Every pull request's number and head branch, open or not.
    pub fn pull_branches(&self, slug: &str) -> Vec<(u64, String)> {
        let state = lock(&self.state);
        state
            .repos
            .get(slug)
            .map(|r| {
                r.pulls
                    .iter()
                    .map(|p| (p.number, p.head_ref.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state).requests.clone()
    }

    /// Holds every request to `path` (recorded, then left unanswered) until `release`.
    pub fn hold(&self, path: &str) {
        lock(&self.state).holds.push(path.to_string());
    }

    /// Answers the requests to `path` held so far, and every later one.
    pub fn release(&self, path: &str) {
        let mut state = lock(&self.state);
        state.holds.retain(|p| p != path);
        state.released.notify_waiters();
    }

    /// Bytes of comment bodies the comment lists have served (GitHub's list, Gitea's list and
    /// timeline).
    pub fn comment_bytes_served(&self) -> usize {
        lock(&self.state).comment_bytes
    }

    /// Adds a comment by `login` to pull request `number`, as a person would post it.
    pub fn add_comment(&self, slug: &str, number: u64, login: &str, body: &str) {
        let mut state = lock(&self.state);
        let id = state.id();
        let now = state.now();
        if let Some(repo) = state.repos.get_mut(slug) {
            repo.add_comment(id, number, login.to_string(), body, now);
        }
    }

    pub fn clear_requests(&self) {
        lock(&self.state).requests.clear();
    }
}
