//! Git over HTTP: `git http-backend` behind Basic auth, and the refs a push asks for.

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::forge::{Shared, error, face_not_found, lock};

/// For a push (`git-receive-pack`), the ref updates it asks for as
/// `{"refs": [{"old": OID, "new": OID, "ref": NAME}]}` (read from the command pkt-lines before
/// the pack); `null` for anything else that is not JSON.
pub(super) fn pushed_refs(path: &str, bytes: &[u8]) -> Value {
    if !path.ends_with("/git-receive-pack") {
        return Value::Null;
    }
    let mut refs = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 4 {
        let Some(length) = std::str::from_utf8(&rest[..4])
            .ok()
            .and_then(|h| usize::from_str_radix(h, 16).ok())
        else {
            break;
        };
        if length < 4 || length > rest.len() {
            break; // "0000" ends the commands; the pack follows
        }
        let line = String::from_utf8_lossy(&rest[4..length]);
        let command = line.split('\0').next().unwrap_or("").trim_end();
        let mut fields = command.split(' ');
        if let (Some(old), Some(new), Some(name)) = (fields.next(), fields.next(), fields.next()) {
            refs.push(json!({"old": old, "new": new, "ref": name}));
        }
        rest = &rest[length..];
    }
    json!({ "refs": refs })
}

/// The user a git client authenticates as: HTTP Basic with the token as the password (GitHub
/// takes any user name, `x-access-token` for installation tokens).
pub(super) fn git_user(state: &Shared, headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (_, token) = decoded.split_once(':')?;
    lock(state).users.get(token).cloned()
}

/// A smart-HTTP path, `owner/name.git/rest` or (GitLab, a project in a subgroup)
/// `group/sub/.../project.git/rest`: the repository's slug and the rest, split at the first
/// segment ending in `.git`. None when no segment does, or the slug would hold an empty or
/// dot segment.
fn split_git_path(path: &str) -> Option<(String, &str)> {
    let mut start = 0;
    for (index, segment) in path.split('/').enumerate() {
        let end = start + segment.len();
        if let Some(name) = segment.strip_suffix(".git")
            && index > 0
        {
            let slug = format!("{}{name}", &path[..start]);
            let ok = slug
                .split('/')
                .all(|s| !s.is_empty() && s != "." && s != "..");
            let rest = path.get(end + 1..).unwrap_or("");
            return ok.then_some((slug, rest));
        }
        start = end + 1;
    }
    None
}

/// git's smart HTTP protocol, served by the real `git http-backend` (CGI) over the bare
/// repositories. Without valid credentials: 401 with a Basic challenge, as GitHub answers a
/// private repository, so git asks its credential helper.
pub(super) async fn smart_http(
    State(state): State<Shared>,
    UrlPath((owner, rest)): UrlPath<(String, String)>,
    request: axum::extract::Request,
) -> Response {
    let Some((slug, rest)) =
        split_git_path(&format!("{owner}/{rest}")).map(|(slug, rest)| (slug, rest.to_string()))
    else {
        // Not git: a path the REST routes did not take (`/api/v4/projects/a/b/...` with its
        // slashes unencoded lands here), answered as its face answers one.
        return face_not_found(&format!("/{owner}/{rest}"));
    };
    let (root, known) = {
        let guard = lock(&state);
        (guard.git_root.clone(), guard.repos.contains_key(&slug))
    };
    let (parts, body) = request.into_parts();
    let Some(login) = git_user(&state, &parts.headers) else {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Basic realm=\"GitHub\"")],
            "Invalid username or token.\n",
        )
            .into_response();
    };
    if !known || rest.contains("..") {
        return (StatusCode::NOT_FOUND, "Repository not found.\n").into_response();
    }
    let body = axum::body::to_bytes(body, 256 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", &root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{slug}.git/{rest}"))
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        // http-backend allows receive-pack (push) to an authenticated user only.
        .env("REMOTE_USER", &login)
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let Ok(mut child) = command.spawn() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot run git http-backend",
        );
    };
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(&body).await;
    }
    let Ok(output) = child.wait_with_output().await else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend failed");
    };
    cgi_response(&output.stdout)
}

/// A CGI answer (headers, a blank line, the body) as an HTTP response.
fn cgi_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| {
            raw.windows(2)
                .position(|w| w == b"\n\n")
                .map(|i| (i, i + 2))
        });
    let Some((end, body_start)) = split else {
        return error(
            StatusCode::BAD_GATEWAY,
            "git http-backend printed no headers",
        );
    };
    let mut builder = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(&raw[..end]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value
                .split_whitespace()
                .next()
                .and_then(|c| c.parse::<u16>().ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            builder = builder.status(code);
        } else {
            builder = builder.header(name.trim(), value);
        }
    }
    builder
        .body(axum::body::Body::from(raw[body_start..].to_vec()))
        .unwrap_or_else(|_| error(StatusCode::BAD_GATEWAY, "bad CGI headers"))
}

#[cfg(test)]
mod tests {
    use super::split_git_path;

    #[test]
    fn a_git_path_names_its_repository_at_any_depth() {
        assert_eq!(
            split_git_path("platform/gitops.git/info/refs"),
            Some(("platform/gitops".into(), "info/refs"))
        );
        assert_eq!(
            split_git_path("platform/team/gitops.git/git-upload-pack"),
            Some(("platform/team/gitops".into(), "git-upload-pack"))
        );
        for path in [
            "platform/gitops/info/refs",
            "gitops.git/info/refs",
            "platform//gitops.git/info/refs",
            "platform/../gitops.git/info/refs",
        ] {
            assert_eq!(split_git_path(path), None, "{path}");
        }
    }
}
