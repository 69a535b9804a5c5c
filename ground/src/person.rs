//! A person's actions: pushes, comments, pull requests and merges through the forge.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::{FORGE_PERSON_TOKEN, FORGE_USERS, Ground, git, scenario};

impl Ground {
    pub fn forge_token(login: &str) -> Result<&'static str> {
        FORGE_USERS
            .iter()
            .find(|(_, l)| *l == login)
            .map(|(token, _)| *token)
            .with_context(|| format!("the forge double has no user {login}"))
    }

    /// A person merges through the forge's API; branch protection decides.
    pub(crate) async fn merge(&mut self, merge: &scenario::Merge) -> Result<()> {
        let token = Self::forge_token(&merge.by)?;
        let client = crate::http::client();
        let gitlab = self.scenario.forge == scenario::Face::Gitlab;
        let url = if gitlab {
            // GitLab: `PUT /projects/:id/merge_requests/:iid/merge`, 405 until the pipeline
            // (the statuses `protect` names) succeeded.
            format!(
                "{}/api/v4/projects/{}/merge_requests/{}/merge",
                self.forge.url(),
                self.scenario.repository.slug.replace('/', "%2F"),
                merge.pr
            )
        } else {
            format!(
                "{}/repos/{}/pulls/{}/merge",
                self.forge.url(),
                self.scenario.repository.slug,
                merge.pr
            )
        };
        // A person clicks again when the forge answers a 5xx or a rate limit (a seeded fault
        // is not the person's story): up to five tries.
        let mut tries = 0;
        let response = loop {
            tries += 1;
            let response = client
                .put(&url)
                .bearer_auth(token)
                .json(&if gitlab {
                    json!({})
                } else {
                    json!({"merge_method": "merge"})
                })
                .send()
                .await?;
            let status = response.status();
            let limited = status == reqwest::StatusCode::TOO_MANY_REQUESTS
                || (status == reqwest::StatusCode::FORBIDDEN
                    && response
                        .headers()
                        .get("x-ratelimit-remaining")
                        .is_some_and(|v| v == "0"));
            if tries < 5 && (status.is_server_error() || limited) {
                continue;
            }
            break response;
        };
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let said = if status.is_success() {
            format!("{} merged #{}", merge.by, merge.pr)
        } else {
            format!(
                "{} could not merge #{}: {} ({})",
                merge.by,
                merge.pr,
                body["message"].as_str().unwrap_or(""),
                status.as_u16()
            )
        };
        self.transcript.say("forge", said);
        Ok(())
    }

    /// A person comments (a scenario uses it to spoof a report).
    pub(crate) async fn comment(&mut self, comment: &scenario::CommentSpec) -> Result<()> {
        let token = Self::forge_token(&comment.by)?;
        let body = std::fs::read_to_string(self.scenario.path(&comment.body_file))
            .with_context(|| format!("comment body {}", comment.body_file))?;
        // On GitLab's face a note, through `/api/v4` (the project may be in a subgroup).
        let kind = match self.scenario.forge {
            scenario::Face::Gitlab => gitops_loop::forge::ForgeKind::Gitlab,
            scenario::Face::Github => gitops_loop::forge::ForgeKind::Github,
        };
        let api = match kind {
            gitops_loop::forge::ForgeKind::Gitlab => self.forge.gitlab_url(),
            _ => self.forge.url(),
        };
        let forge = kind.connect(&api, token)?;
        let slug = gitops_loop::forge::RepoSlug::for_forge(kind, &self.scenario.repository.slug)
            .map_err(|e| anyhow::anyhow!(e))?;
        gitops_loop::forge::Forge::create_comment(forge.as_ref(), &slug, comment.pr, &body).await?;
        self.transcript.say(
            "forge",
            format!(
                "{} commented on #{} ({})",
                comment.by, comment.pr, comment.body_file
            ),
        );
        Ok(())
    }

    /// A person commits a folder of files over `branch` (created from `from` when missing)
    /// and pushes it. Returns the commit.
    pub fn commit_overlay(
        &self,
        branch: &str,
        from: &str,
        overlay: &Path,
        message: &str,
    ) -> Result<String> {
        let work = self.person_clone(from, "person-overlay")?;
        if branch != from {
            git::git(&work, &["checkout", "--quiet", "-B", branch])?;
        }
        git::copy_tree(overlay, &work)?;
        git::git(&work, &["add", "--all"])?;
        git::git(&work, &["commit", "--quiet", "-m", message])?;
        git::git(&work, &["push", "--quiet", "origin", branch])?;
        git::git(&work, &["rev-parse", "HEAD"])
    }

    /// A person opens a pull request through the forge's API. Returns its number.
    pub async fn open_pull(&self, head: &str, title: &str, by: &str) -> Result<u64> {
        self.open_pull_into(head, "main", title, by).await
    }

    /// A person opens a pull request from `head` into `base`. Returns its number.
    pub async fn open_pull_into(
        &self,
        head: &str,
        base: &str,
        title: &str,
        by: &str,
    ) -> Result<u64> {
        let slug = &self.scenario.repository.slug;
        let gitlab = self.scenario.forge == scenario::Face::Gitlab;
        let request = if gitlab {
            // A merge request opened by hand on GitLab: its number is the iid.
            crate::http::client()
                .post(format!(
                    "{}/api/v4/projects/{}/merge_requests",
                    self.forge.url(),
                    slug.replace('/', "%2F")
                ))
                .json(&json!({"source_branch": head, "target_branch": base, "title": title}))
        } else {
            crate::http::client()
                .post(format!("{}/repos/{slug}/pulls", self.forge.url()))
                .json(&json!({"head": head, "base": base, "title": title}))
        };
        let response = request.bearer_auth(Self::forge_token(by)?).send().await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if !status.is_success() {
            bail!("cannot open a pull request from {head}: {status} {body}");
        }
        body[if gitlab { "iid" } else { "number" }]
            .as_u64()
            .context("pull request number")
    }

    /// A fresh clone of the scenario's repository at `branch`, as a person makes it, in the
    /// ground's folder `folder`.
    pub(crate) fn person_clone(&self, branch: &str, folder: &str) -> Result<PathBuf> {
        let url = self
            .forge
            .http_git_url_as(&self.scenario.repository.slug, FORGE_PERSON_TOKEN);
        let work = self.dir.path().join(folder);
        let _ = std::fs::remove_dir_all(&work);
        git::git(
            self.dir.path(),
            &["clone", "--quiet", "--branch", branch, &url, folder],
        )?;
        Ok(work)
    }

    pub(crate) fn push(&mut self, push: &scenario::Push) -> Result<()> {
        let work = self.person_clone(&push.branch, "person")?;
        let mut changes = Vec::new();
        for (file, keys) in &push.set {
            let path = work.join(file);
            let mut text = std::fs::read_to_string(&path).with_context(|| file.to_string())?;
            for (key, value) in keys {
                let segments = gitops_loop::yaml::edit::parse_key_path(key);
                let sites = gitops_loop::yaml::edit::scalar_sites(&text, file)?;
                let site = gitops_loop::yaml::edit::find_site(&sites, 0, &segments)
                    .with_context(|| format!("{file}: no value at {key}"))?
                    .clone();
                changes.push(format!("{file} {key}: {} -> {value}", site.value));
                text = gitops_loop::yaml::edit::splice(
                    &text,
                    &[(
                        site.start,
                        site.end,
                        gitops_loop::yaml::edit::render_scalar(value, site.quoted),
                    )],
                );
            }
            std::fs::write(&path, text)?;
        }
        git::git(
            &work,
            &[
                "-c",
                "user.name=Alice",
                "-c",
                "user.email=alice@example.test",
                "commit",
                "--quiet",
                "-am",
                &push.message,
            ],
        )?;
        git::git(&work, &["push", "--quiet", "origin", &push.branch])?;
        let commit = git::git(&work, &["rev-parse", "HEAD"])?;
        self.transcript.say(
            "person",
            format!(
                "alice pushed {} to {}: {} ({})",
                &commit[..7],
                push.branch,
                push.message,
                changes.join(", ")
            ),
        );
        Ok(())
    }
}
