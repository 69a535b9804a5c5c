//! GitLab's merge request webhook (`POST /webhooks/gitlab`), so that a merge request opened by
//! hand is triaged as one Kargo's `http` step delivers (doc/user/project/integrations/
//! webhook_events.md, "Merge request events"; webhooks.md, "Custom headers" and "Secret
//! token").
//!
//! GitLab sends the webhook's secret token as-is in `X-Gitlab-Token` (no signature): it is
//! compared in constant time with the token bosun.yaml names (`webhook.gitlabTokenEnv`), and a
//! delivery without it or with another is 401 with no other effect. Everything else in the
//! body is hostile until checked here: the project's path (GitLab's path characters, at most
//! 255, the `group/project` Bosun knows), the merge request's `iid` (a positive JSON integer),
//! the action (`open`, `reopen` and `update` triage; the others are answered 200 and ignored,
//! as are other events: GitLab disables a hook that keeps failing), the state (`opened`) and
//! the last commit (a commit id). Only then is it queued, as an intake delivery with that head.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use super::{Server, Shared, answer, read_body};
use crate::forge::RepoSlug;

/// The route GitLab's webhook is pointed at.
pub const ROUTE: &str = "/webhooks/gitlab";

/// The `X-Gitlab-Event` of a merge request event.
pub const MERGE_REQUEST_HOOK: &str = "Merge Request Hook";

/// The actions that put a new or changed head in front of the gate.
pub const TRIAGED_ACTIONS: [&str; 3] = ["open", "reopen", "update"];

/// GitLab's longest path (a namespace's or a project's full path).
const MAX_PATH: usize = 255;

/// What a webhook body asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Triage this merge request at this head.
    Triage {
        project: RepoSlug,
        iid: u64,
        head: String,
    },
    /// Nothing to do (why): another event, another action, a merge request not open.
    Ignored(String),
}

/// Whether `token` (the `X-Gitlab-Token` header) is the configured one; never for an empty one.
pub fn token_matches(expected: &[u8], token: Option<&[u8]>) -> bool {
    match token {
        Some(token) if !expected.is_empty() => bool::from(token.ct_eq(expected)),
        _ => false,
    }
}

/// A project's full path as GitLab allows it (`lib/gitlab/path_regex.rb`: each segment starts
/// with a letter, a digit or `_`, then letters, digits, `_`, `-` and `.`, and does not end in
/// `.git` or `.atom`), as the `group/project` Bosun names repositories by.
pub fn project_path(text: &str) -> Result<RepoSlug, String> {
    let shown = || text.chars().take(80).collect::<String>();
    let segment_ok = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && !s.ends_with(".git")
            && !s.ends_with(".atom")
    };
    if text.len() > MAX_PATH || !text.split('/').all(segment_ok) {
        return Err(format!(
            "project.path_with_namespace {:?} is not a GitLab project path",
            shown()
        ));
    }
    text.parse::<RepoSlug>().map_err(|_| {
        format!(
            "project.path_with_namespace {:?} is not GROUP/PROJECT (Bosun names no subgroup)",
            shown()
        )
    })
}

/// Reads a merge request event's body (the headers' event name beside it).
pub fn parse(event_header: Option<&str>, body: &[u8]) -> Result<Event, String> {
    if let Some(event) = event_header
        && event != MERGE_REQUEST_HOOK
    {
        return Ok(Event::Ignored(format!(
            "a {:?} event, not a merge request event",
            event.chars().take(40).collect::<String>()
        )));
    }
    let body: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Some(body) = body.as_object() else {
        return Err("the body is not a JSON object".into());
    };
    match body.get("object_kind") {
        Some(Value::String(kind)) if kind == "merge_request" => {}
        Some(Value::String(_)) => {
            return Ok(Event::Ignored("not a merge request event".into()));
        }
        _ => return Err("object_kind is missing or not a string".into()),
    }
    let attributes = body
        .get("object_attributes")
        .and_then(Value::as_object)
        .ok_or("object_attributes is missing or not an object")?;
    let text = |key: &str| -> Result<&str, String> {
        attributes
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("object_attributes.{key} is missing or not a string"))
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
    .ok_or("object_attributes.iid is not a positive integer")?;
    let path = body
        .get("project")
        .and_then(|p| p.get("path_with_namespace"))
        .and_then(Value::as_str)
        .ok_or("project.path_with_namespace is missing or not a string")?;
    let project = project_path(path)?;
    let head = attributes
        .get("last_commit")
        .and_then(|c| c.get("id"))
        .and_then(Value::as_str)
        .ok_or("object_attributes.last_commit.id is missing or not a string")?;
    if !crate::git::is_commit_id(head) {
        return Err(format!(
            "object_attributes.last_commit.id {:?} is not a commit id (40 or 64 lowercase hex digits)",
            head.chars().take(80).collect::<String>()
        ));
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
    match parse(header(&headers, "x-gitlab-event"), &body) {
        Err(e) => {
            server.count("invalid");
            answer(StatusCode::BAD_REQUEST, json!({"error": e}))
        }
        Ok(Event::Ignored(why)) => {
            server.count("ignored");
            answer(StatusCode::OK, json!({"status": "ignored", "reason": why}))
        }
        Ok(Event::Triage { project, iid, head }) => {
            if let Some(refused) = Server::unknown_repository(&server, &project) {
                return refused;
            }
            server.accept(&project, iid, &head)
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

    #[test]
    fn an_opened_updated_or_reopened_merge_request_is_triaged_at_its_last_commit() {
        for action in TRIAGED_ACTIONS {
            let event = parse(
                Some(MERGE_REQUEST_HOOK),
                &body("platform/gitops".into(), 3.into(), action, HEAD),
            )
            .unwrap();
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

    #[test]
    fn other_events_actions_and_states_are_ignored() {
        let open = body("platform/gitops".into(), 3.into(), "open", HEAD);
        assert!(matches!(
            parse(Some("Push Hook"), &open),
            Ok(Event::Ignored(_))
        ));
        for action in ["close", "merge", "approved", "unapproved"] {
            let b = body("platform/gitops".into(), 3.into(), action, HEAD);
            assert!(
                matches!(parse(Some(MERGE_REQUEST_HOOK), &b), Ok(Event::Ignored(_))),
                "{action}"
            );
        }
        let closed = String::from_utf8(open)
            .unwrap()
            .replace("\"opened\"", "\"closed\"");
        assert!(matches!(
            parse(None, closed.as_bytes()),
            Ok(Event::Ignored(_))
        ));
        let note = json!({"object_kind": "note"}).to_string();
        assert!(matches!(
            parse(None, note.as_bytes()),
            Ok(Event::Ignored(_))
        ));
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
            json!("platform"),
            json!("platform/sub/gitops"),
            json!(format!("platform/{}", "a".repeat(300))),
            json!(7),
            Value::Null,
        ] {
            let b = body(path.clone(), 3.into(), "open", HEAD);
            assert!(parse(None, &b).is_err(), "{path}");
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
            assert!(parse(None, &b).is_err(), "{iid}");
        }
        for head in ["main", "--upload-pack=x", &HEAD.to_uppercase(), &HEAD[..12]] {
            let b = body("platform/gitops".into(), 3.into(), "open", head);
            assert!(parse(None, &b).is_err(), "{head}");
        }
        for shape in [
            "[]",
            "\"merge_request\"",
            "{\"object_kind\": \"merge_request\"}",
            "{\"object_kind\": \"merge_request\", \"object_attributes\": []}",
            "{\"object_kind\": 1}",
            "not json",
        ] {
            assert!(parse(None, shape.as_bytes()).is_err(), "{shape}");
        }
        // Every refusal is one line.
        let b = body("platform/gitops\nX".into(), 3.into(), "open", HEAD);
        assert!(!parse(None, &b).unwrap_err().contains('\n'));
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
