//! GitLab's merge request webhook (`POST /webhooks/gitlab`), so that a merge request opened by
//! hand is triaged as one Kargo's `http` step delivers (doc/user/project/integrations/
//! webhook_events.md, "Merge request events"; webhooks.md, "Custom headers" and "Secret
//! token").
//!
//! GitLab sends the webhook's secret token as-is in `X-Gitlab-Token` (no signature): it is
//! compared in constant time with the token bosun.yaml names (`webhook.gitlabTokenEnv`), and a
//! delivery without it or with another is 401 with no other effect. Everything else in the
//! body is hostile until checked here: the event (`X-Gitlab-Event`, which GitLab always sends:
//! missing is a 400), the project's full path (a group's or a subgroup's project: GitLab's
//! path characters, at most 255 characters and 20 levels of subgroups), the merge
//! request's `iid` (a positive JSON integer), the action, the state (`opened`) and the last
//! commit (a commit id). Only then is it queued, as an intake delivery with that head.
//!
//! Past the token, whatever Bosun does not act on is answered 200 with `"status": "ignored"`
//! and why: another event, a project bosun.yaml does not list (a group's hook sends every
//! project's events), an action or state that puts no new head in front of the gate, a head
//! quarantined, a full queue. GitLab counts every other answer as a failure and disables a
//! hook after four failures in a row (doc/user/project/integrations/webhooks.md, "Auto-disabled
//! webhooks": for a growing while, for good after 40; before the self-healing change of late
//! 2024, a 4xx disabled it for good at once), and an event it failed to deliver is sent again
//! only by a person from the hook's log: a 4xx for an event Bosun has no use for would silence
//! the hook for the merge requests it has. A 400 is left for a body that is not GitLab's (no
//! event header, a hostile path, a malformed merge request of a listed project).
//!
//! GitLab finds a project by its path case-insensitively (`Route.find_by_full_path`), and a
//! hook's payload spells the path as the project was named, so a path is compared with
//! bosun.yaml's slugs ignoring ASCII case (GitLab paths are ASCII), and the delivery is
//! queued under bosun.yaml's spelling: one pull request, one queue entry, whoever delivers it.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use super::{Intake, Shared, answer, read_body};
use crate::forge::RepoSlug;

/// The route GitLab's webhook is pointed at.
pub const ROUTE: &str = "/webhooks/gitlab";

/// The `X-Gitlab-Event` of a merge request event.
pub const MERGE_REQUEST_HOOK: &str = "Merge Request Hook";

/// The actions that put a new or changed head in front of the gate.
pub const TRIAGED_ACTIONS: [&str; 3] = ["open", "reopen", "update"];

/// What a webhook body asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Triage this merge request (of this repository of bosun.yaml, as bosun.yaml spells it)
    /// at this head.
    Triage {
        project: RepoSlug,
        iid: u64,
        head: String,
    },
    /// A project bosun.yaml does not list (why): nothing to do.
    OtherProject(String),
    /// Nothing to do (why): another event, another action, a merge request not open.
    Ignored(String),
}

impl Event {
    /// Why nothing is done, when nothing is.
    pub fn ignored(&self) -> Option<&str> {
        match self {
            Event::Triage { .. } => None,
            Event::OtherProject(why) | Event::Ignored(why) => Some(why),
        }
    }
}

/// Why a webhook body is not a merge request event GitLab sent (a 400, with this line).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "X-Gitlab-Event is missing (GitLab names every event it sends; a merge request event is {:?})",
        MERGE_REQUEST_HOOK
    )]
    NoEventHeader,
    #[error("the body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error("the body is not a JSON object")]
    NotAnObject,
    /// The kind the body names (clipped).
    #[error(
        "object_kind {kind:?} is not merge_request, which X-Gitlab-Event {:?} says",
        MERGE_REQUEST_HOOK
    )]
    OtherKind { kind: String },
    #[error("object_kind is missing or not a string")]
    NoKind,
    /// The field (`project.path_with_namespace`, `object_attributes.action`...).
    #[error("{0} is missing or not a string")]
    NotAString(String),
    #[error("object_attributes is missing or not an object")]
    NoAttributes,
    #[error("object_attributes.iid is not a positive integer")]
    BadIid,
    /// The id the body gives (clipped).
    #[error(
        "object_attributes.last_commit.id {0:?} is not a commit id (40 or 64 lowercase hex digits)"
    )]
    NotACommit(String),
    /// Why the project path the body gives is not one (the path clipped, and the reason).
    #[error("project.path_with_namespace {0}")]
    NotAProjectPath(String),
}

/// Whether `token` (the `X-Gitlab-Token` header) is the configured one; never for an empty one.
pub fn token_matches(expected: &[u8], token: Option<&[u8]>) -> bool {
    match token {
        Some(token) if !expected.is_empty() => bool::from(token.ct_eq(expected)),
        _ => false,
    }
}

/// A project's full path as a webhook names it (`project.path_with_namespace`, subgroups
/// included), checked as GitLab allows one ([`crate::forge::gitlab::project_path`]).
pub fn project_path(text: &str) -> Result<RepoSlug, HookError> {
    crate::forge::gitlab::project_path(text).map_err(HookError::NotAProjectPath)
}

/// The repository of `repositories` a GitLab project path names, compared as GitLab finds
/// projects: ignoring ASCII case (GitLab paths are ASCII). bosun.yaml cannot list two
/// repositories that differ in case only (`Config::parse`), so there is at most one.
pub fn configured<'a>(
    repositories: impl IntoIterator<Item = &'a RepoSlug>,
    project: &RepoSlug,
) -> Option<RepoSlug> {
    repositories
        .into_iter()
        .find(|known| known.same_ignoring_case(project))
        .cloned()
}

/// Reads a merge request event: `event_header` is the `X-Gitlab-Event` header, `known` the
/// repository of bosun.yaml a project names, if any ([`configured`]). A project bosun.yaml
/// does not list is [`Event::OtherProject`] before anything else of the body is read.
pub fn parse(
    event_header: Option<&str>,
    body: &[u8],
    known: impl Fn(&RepoSlug) -> Option<RepoSlug>,
) -> Result<Event, HookError> {
    match event_header {
        None => return Err(HookError::NoEventHeader),
        Some(event) if event != MERGE_REQUEST_HOOK => {
            return Ok(Event::Ignored(format!(
                "a {:?} event, not a merge request event",
                event.chars().take(40).collect::<String>()
            )));
        }
        Some(_) => {}
    }
    let body: Value = serde_json::from_slice(body).map_err(HookError::NotJson)?;
    let Some(body) = body.as_object() else {
        return Err(HookError::NotAnObject);
    };
    match body.get("object_kind") {
        Some(Value::String(kind)) if kind == "merge_request" => {}
        Some(Value::String(kind)) => {
            return Err(HookError::OtherKind {
                kind: kind.chars().take(40).collect(),
            });
        }
        _ => return Err(HookError::NoKind),
    }
    let path = body
        .get("project")
        .and_then(|p| p.get("path_with_namespace"))
        .and_then(Value::as_str)
        .ok_or_else(|| HookError::NotAString("project.path_with_namespace".into()))?;
    // Listed repositories passed the same check when bosun.yaml was read, and the check does
    // not depend on case: a path it refuses names no listed repository. Such a project is
    // another project of a group hook (GitLab's older paths allow what today's refuse), so it
    // is answered as one, never as a failure that would count towards GitLab disabling the
    // hook for the projects Bosun does list.
    let Some(project) = project_path(path).ok().and_then(|slug| known(&slug)) else {
        return Ok(Event::OtherProject(format!(
            "project {path:?} is not a repository of bosun.yaml"
        )));
    };
    let attributes = body
        .get("object_attributes")
        .and_then(Value::as_object)
        .ok_or(HookError::NoAttributes)?;
    let text = |key: &str| -> Result<&str, HookError> {
        attributes
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| HookError::NotAString(format!("object_attributes.{key}")))
    };
    let action = text("action")?;
    if !TRIAGED_ACTIONS.contains(&action) {
        return Ok(Event::Ignored(format!(
            "action {:?} does not change the head",
            action.chars().take(40).collect::<String>()
        )));
    }
    let state = text("state")?;
    if state != "opened" {
        return Ok(Event::Ignored(format!(
            "the merge request is {:?}, not open",
            state.chars().take(40).collect::<String>()
        )));
    }
    // A JSON integer, 1 or more: never a string, a fraction or a negative number.
    let iid = match attributes.get("iid") {
        Some(Value::Number(n)) => n.as_u64().filter(|&n| n > 0 && n <= i64::MAX as u64),
        _ => None,
    }
    .ok_or(HookError::BadIid)?;
    let head = attributes
        .get("last_commit")
        .and_then(|c| c.get("id"))
        .and_then(Value::as_str)
        .ok_or_else(|| HookError::NotAString("object_attributes.last_commit.id".into()))?;
    if !crate::git::is_commit_id(head) {
        return Err(HookError::NotACommit(head.chars().take(80).collect()));
    }
    Ok(Event::Triage {
        project,
        iid,
        head: head.to_string(),
    })
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(super) async fn webhook(
    State(server): State<Shared>,
    request: axum::extract::Request,
) -> Response {
    let (headers, body) = match read_body(&server, request).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let expected: &[u8] = server.gitlab_token.as_deref().unwrap_or_default();
    let token = headers.get("x-gitlab-token").map(|v| v.as_bytes());
    if !token_matches(expected, token) {
        server.count("unauthorized");
        return answer(
            StatusCode::UNAUTHORIZED,
            json!({"error": "missing or wrong X-Gitlab-Token"}),
        );
    }
    let repositories = server.bosun.config.repositories.iter().map(|r| &r.slug);
    let event = match header(&headers, "x-gitlab-event") {
        // Not text (a header value of other bytes) is no event GitLab names.
        None if headers.contains_key("x-gitlab-event") => Ok(Event::Ignored(
            "an event whose name is not text, not a merge request event".into(),
        )),
        event => parse(event, &body, |project| {
            configured(repositories.clone(), project)
        }),
    };
    match event {
        Err(e) => {
            server.count("invalid");
            answer(StatusCode::BAD_REQUEST, json!({"error": e.to_string()}))
        }
        Ok(Event::Triage { project, iid, head }) => {
            server.accept_as(&project, iid, &head, Intake::GitlabHook)
        }
        Ok(ignored) => {
            server.count(match ignored {
                Event::OtherProject(_) => "unknown_repository",
                _ => "ignored",
            });
            let why = ignored.ignored().unwrap_or_default();
            answer(StatusCode::OK, json!({"status": "ignored", "reason": why}))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(project: Value, iid: Value, action: &str, head: &str) -> Vec<u8> {
        json!({
            "object_kind": "merge_request",
            "event_type": "merge_request",
            "project": {"id": 7, "path_with_namespace": project},
            "object_attributes": {
                "iid": iid, "action": action, "state": "opened",
                "last_commit": {"id": head}, "target_branch": "main",
            },
        })
        .to_string()
        .into_bytes()
    }

    const HEAD: &str = "0123456789abcdef0123456789abcdef01234567";

    /// bosun.yaml's one repository, spelt as bosun.yaml spells it.
    fn known(project: &RepoSlug) -> Option<RepoSlug> {
        let listed: RepoSlug = "platform/gitops".parse().unwrap();
        configured([&listed], project)
    }

    /// A merge request event as GitLab sends it.
    fn hook(body: &[u8]) -> Result<Event, HookError> {
        parse(Some(MERGE_REQUEST_HOOK), body, known)
    }

    #[test]
    fn an_opened_updated_or_reopened_merge_request_is_triaged_at_its_last_commit() {
        for action in TRIAGED_ACTIONS {
            let event = hook(&body("platform/gitops".into(), 3.into(), action, HEAD)).unwrap();
            assert_eq!(
                event,
                Event::Triage {
                    project: "platform/gitops".parse().unwrap(),
                    iid: 3,
                    head: HEAD.into(),
                }
            );
        }
    }

    /// GitLab finds a project by its path ignoring case, and a payload spells the path as the
    /// project was named: the repository bosun.yaml lists is triaged, under its spelling.
    #[test]
    fn a_project_path_names_bosuns_repository_whatever_its_case() {
        for path in ["Platform/GitOps", "PLATFORM/gitops", "platform/GITOPS"] {
            let event = hook(&body(path.into(), 3.into(), "open", HEAD)).unwrap();
            assert_eq!(
                event,
                Event::Triage {
                    project: "platform/gitops".parse().unwrap(),
                    iid: 3,
                    head: HEAD.into(),
                },
                "{path}"
            );
        }
        // Case only: another spelling of other letters is another project.
        for path in ["platform/gitops2", "platform/git0ps", "platform-x/gitops"] {
            let event = hook(&body(path.into(), 3.into(), "open", HEAD)).unwrap();
            assert!(matches!(event, Event::OtherProject(_)), "{path}");
        }
    }

    /// A project in a subgroup that bosun.yaml lists is triaged, whatever the case of its
    /// path, under bosun.yaml's spelling; its parent group's project, a sibling or a deeper
    /// project of the same name is another project.
    #[test]
    fn a_subgroup_project_bosun_lists_is_triaged_by_its_whole_path() {
        let listed: RepoSlug = crate::forge::gitlab::project_path("platform/team/gitops").unwrap();
        let known = |project: &RepoSlug| configured([&listed], project);
        for path in ["platform/team/gitops", "Platform/Team/GitOps"] {
            let b = body(path.into(), 4.into(), "update", HEAD);
            let event = parse(Some(MERGE_REQUEST_HOOK), &b, known).unwrap();
            assert_eq!(
                event,
                Event::Triage {
                    project: listed.clone(),
                    iid: 4,
                    head: HEAD.into(),
                },
                "{path}"
            );
        }
        for path in [
            "platform/gitops",
            "platform/team",
            "platform/other/gitops",
            "platform/team/sub/gitops",
            "team/gitops",
        ] {
            let b = body(path.into(), 4.into(), "open", HEAD);
            let event = parse(Some(MERGE_REQUEST_HOOK), &b, known).unwrap();
            assert!(matches!(event, Event::OtherProject(_)), "{path}: {event:?}");
        }
    }

    /// A group's hook sends every project's events: one bosun.yaml does not list (in a
    /// subgroup too) is ignored before anything else of its body is read, so GitLab is
    /// answered 200 and keeps the hook.
    #[test]
    fn another_projects_events_are_ignored_whatever_else_they_hold() {
        for path in ["elsewhere/gitops", "platform/sub/gitops", "a/b/c/d"] {
            for iid in [json!(3), json!("3"), Value::Null] {
                let event = hook(&body(path.into(), iid.clone(), "open", "main")).unwrap();
                let Event::OtherProject(why) = &event else {
                    panic!("{path} {iid}: {event:?}")
                };
                assert!(why.contains("not a repository of bosun.yaml"), "{why}");
                assert_eq!(event.ignored(), Some(why.as_str()));
            }
        }
    }

    #[test]
    fn other_events_actions_and_states_are_ignored() {
        let open = body("platform/gitops".into(), 3.into(), "open", HEAD);
        for event in ["Push Hook", "Note Hook", "merge request hook", ""] {
            assert!(
                matches!(parse(Some(event), &open, known), Ok(Event::Ignored(_))),
                "{event:?}"
            );
        }
        for action in ["close", "merge", "approved", "unapproved"] {
            let b = body("platform/gitops".into(), 3.into(), action, HEAD);
            assert!(matches!(hook(&b), Ok(Event::Ignored(_))), "{action}");
        }
        let closed = String::from_utf8(open)
            .unwrap()
            .replace("\"opened\"", "\"closed\"");
        assert!(matches!(hook(closed.as_bytes()), Ok(Event::Ignored(_))));
    }

    /// GitLab names every event it sends (`X-Gitlab-Event`), and a merge request event's
    /// body says so too: a delivery without the header, or whose body is another event's,
    /// is not GitLab's (400).
    #[test]
    fn a_delivery_without_the_event_header_or_with_another_events_body_is_refused() {
        let open = body("platform/gitops".into(), 3.into(), "open", HEAD);
        let refusal = parse(None, &open, known).unwrap_err().to_string();
        assert!(refusal.contains("X-Gitlab-Event is missing"), "{refusal}");
        let note =
            json!({"object_kind": "note", "project": {"path_with_namespace": "platform/gitops"}})
                .to_string();
        assert_eq!(
            hook(note.as_bytes()).unwrap_err().to_string(),
            "object_kind \"note\" is not merge_request, which X-Gitlab-Event \"Merge Request Hook\" says"
        );
        assert_eq!(
            refusal,
            "X-Gitlab-Event is missing (GitLab names every event it sends; a merge request event is \"Merge Request Hook\")"
        );
    }

    #[test]
    fn hostile_paths_iids_heads_and_shapes_are_refused() {
        for path in [
            json!("../gitops"),
            json!("platform/../gitops"),
            json!("platform/gitops?x=1"),
            json!("platform%2Fgitops"),
            json!("platform/gitops\n"),
            json!("platform/-gitops"),
            json!("platform/gitops.git"),
            json!("platform/gitøps"),
            json!("/platform/gitops"),
            json!("platform//gitops"),
            json!("platform/team/"),
            json!("platform/%2e%2e/gitops"),
            json!("platform/team/../gitops"),
            json!("platform/te\u{1b}am/gitops"),
            json!(vec!["g"; crate::forge::gitlab::MAX_SEGMENTS + 1].join("/")),
            json!("platform"),
            json!(format!("platform/{}", "a".repeat(300))),
        ] {
            // No listed repository: another project, answered so, never triaged.
            let b = body(path.clone(), 3.into(), "open", HEAD);
            assert!(
                matches!(hook(&b), Ok(Event::OtherProject(_))),
                "{path}: {:?}",
                hook(&b)
            );
            assert!(project_path(path.as_str().unwrap()).is_err(), "{path}");
        }
        for path in [json!(7), Value::Null] {
            let b = body(path.clone(), 3.into(), "open", HEAD);
            assert!(hook(&b).is_err(), "{path}");
        }
        for iid in [
            json!("3"),
            json!(-3),
            json!(0),
            json!(3.5),
            json!(1e30),
            json!(u64::MAX),
            json!([3]),
            Value::Null,
        ] {
            let b = body("platform/gitops".into(), iid.clone(), "open", HEAD);
            assert!(hook(&b).is_err(), "{iid}");
        }
        for head in ["main", "--upload-pack=x", &HEAD.to_uppercase(), &HEAD[..12]] {
            let b = body("platform/gitops".into(), 3.into(), "open", head);
            assert!(hook(&b).is_err(), "{head}");
        }
        for shape in [
            "[]",
            "\"merge_request\"",
            "{\"object_kind\": \"merge_request\"}",
            "{\"object_kind\": \"merge_request\", \"object_attributes\": []}",
            "{\"object_kind\": 1}",
            "not json",
        ] {
            assert!(hook(shape.as_bytes()).is_err(), "{shape}");
        }
        // Every refusal is one line.
        let b = body("platform/gitops".into(), 3.into(), "open", "abc\nX");
        assert!(!hook(&b).unwrap_err().to_string().contains('\n'));
    }

    #[test]
    fn only_the_configured_token_passes_and_an_empty_one_never() {
        assert!(token_matches(b"s3cret", Some(b"s3cret")));
        assert!(!token_matches(b"s3cret", Some(b"s3cre")));
        assert!(!token_matches(b"s3cret", Some(b"s3cret ")));
        assert!(!token_matches(b"s3cret", None));
        assert!(!token_matches(b"", Some(b"")));
        assert!(!token_matches(b"", None));
    }
}
