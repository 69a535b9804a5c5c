//! `gate check --html`: the self-contained HTML report, played end to end through the real
//! binary on check cases. A hostile pull request (tests/check-cases/html-hostile-names) writes
//! markup into annotation keys and values, an object's name and a file's name: every piece
//! must reach the page as text. The browser test loads a page in Debian's chromium
//! (installed by `cargo xtask tools`), asserts on the DOM it built and keeps a screenshot in
//! `target/gate-html/`.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use std::path::{Path, PathBuf};

/// The case's pull request in a fresh copy of the sample repository.
fn case_repo(case: &str) -> common::TestRepo {
    let case_dir = common::project_root().join("tests/check-cases").join(case);
    let repo = common::TestRepo::from_fixture(&common::sample_dir().join("repo"));
    if case_dir.join("base").is_dir() {
        repo.commit_overlay(&case_dir.join("base"), "main", "base change");
    }
    repo.commit_overlay(&case_dir.join("head"), "pr", "the pull request");
    repo
}

/// Runs `gate check --html` on the case (extra arguments after) and returns the page and the
/// exit code.
fn html_of(case: &str, out: &Path, extra: &[&str]) -> (String, i32) {
    let repo = case_repo(case);
    let cache = tempfile::tempdir().unwrap();
    let page = out.join(format!("{case}.html"));
    let mut command = common::gate(cache.path());
    command
        .args([
            "--quiet",
            "check",
            "--head",
            "pr",
            "--default-branch",
            "main",
        ])
        .arg("--repo")
        .arg(repo.path())
        .arg("--inventory")
        .arg(common::sample_dir().join("inventory.yaml"))
        .arg("--charts")
        .arg(common::sample_dir().join("charts"))
        .arg("--html")
        .arg(&page);
    if !extra.contains(&"--repo-url") {
        command.args(["--repo-url", common::SAMPLE_REPO_URL]);
    }
    for arg in extra {
        command.arg(arg.replace("{repo}", &repo.path().display().to_string()));
    }
    let output = command.output().unwrap();
    assert!(
        page.exists(),
        "no page written: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        std::fs::read_to_string(&page).unwrap(),
        output.status.code().unwrap_or(-1),
    )
}

/// What a hostile pull request's markup must never become in the page: an element, an
/// attribute, a second script, a closed `<details>`.
fn assert_inert(page: &str) {
    assert_eq!(
        page.matches("<script").count(),
        1,
        "one script, the page's own"
    );
    assert!(!page.contains("<img"), "an injected image element");
    // Every raw `<` opens a tag the page wrote (text has `&lt;`): none of them carries a
    // handler attribute or a tag name the page does not use.
    // The page's own script is constant text (it compares with `<`): left out of the scan.
    let markup = match (page.find("<script>"), page.find("</script>")) {
        (Some(start), Some(end)) => format!("{}{}", &page[..start], &page[end..]),
        _ => page.to_string(),
    };
    for tag in markup
        .split('<')
        .skip(1)
        .map(|s| &s[..s.find('>').unwrap_or(s.len())])
    {
        assert!(
            !tag.contains(" onerror=") && !tag.contains(" onmouseover="),
            "an injected handler attribute: <{tag}>"
        );
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '!')
            .collect();
        assert!(
            [
                "!DOCTYPE", "html", "head", "meta", "title", "style", "body", "header", "h1", "h2",
                "h3", "p", "code", "table", "tbody", "tr", "th", "td", "span", "br", "ul", "li",
                "pre", "nav", "label", "select", "option", "section", "details", "summary", "a",
                "footer", "em", "script",
            ]
            .contains(&name.as_str()),
            "an element the page does not write: <{tag}>"
        );
    }
    assert_eq!(
        page.matches("<details").count(),
        page.matches("</details>").count(),
        "a <details> closed by a chart's text"
    );
    assert!(!page.contains("href=\"javascript:"), "a javascript: link");
    assert!(
        !page.contains("http-equiv=\"refresh\""),
        "a meta refresh from a chart"
    );
    // Nothing is loaded from elsewhere: no src, no stylesheet link; the policy says so too.
    assert!(!page.contains(" src=\""), "something loaded from elsewhere");
    assert!(!page.contains("<link"), "a stylesheet from elsewhere");
    assert!(page.contains("content=\"default-src 'none';"), "the policy");
}

#[test]
fn hostile_names_reach_the_html_report_as_text() {
    let out = tempfile::tempdir().unwrap();
    let (page, code) = html_of("html-hostile-names", out.path(), &[]);
    assert_eq!(code, 0, "the case is green");
    assert_inert(&page);
    // Each hostile string is there, escaped: a reader sees it as it was written.
    for escaped in [
        // an annotation key closing an attribute and opening an image
        "metadata.annotations[&quot;\\&quot;&gt;&lt;img src=x onerror=alert(1)&gt;&quot;]",
        // a value closing the diff's <details> and opening a script
        "&lt;/details&gt;&lt;script&gt;alert(1)&lt;/script&gt;",
        "javascript:alert(1)",
        "' onmouseover='alert(1)",
        // an object's name in a finding, and the file's name
        "ingress/&lt;/details&gt;&lt;script&gt;alert(3)&lt;/script&gt;",
        "fleet-objects/widgets/x&quot;&gt;&lt;img src=x onerror=alert(2)&gt;.yaml",
    ] {
        assert!(page.contains(escaped), "{escaped} is not in the page");
    }
    // The verdict, the counts, the finding and a collapsed diff.
    assert!(page.contains("<h1 id=\"outcome\" class=\"green\">addons-gate: passed</h1>"));
    assert!(page.contains("<span id=\"objects-changed\">1</span>"));
    assert!(page.contains("field-pruned-on-apply"));
    assert!(page.contains("<details class=\"object\" data-kind=\"ResourceQuota\">"));
    // The sample repository is not on a forge's web: its files are named, not linked.
    assert!(!page.contains("<a "), "a link for a repository off the web");
}

/// On a forge's web address, a file the evidence names links to it at the head, its name
/// percent-encoded; a `javascript:` repository URL links nothing.
#[test]
fn repository_files_link_to_the_forge_at_the_head_and_nothing_else_links() {
    let out = tempfile::tempdir().unwrap();
    let mirror = format!("{}={{repo}}", common::SAMPLE_REPO_URL);
    let (page, _) = html_of(
        "html-hostile-names",
        out.path(),
        &[
            "--repo-url",
            "https://github.com/org/gitops.git",
            "--git-mirror",
            &mirror,
        ],
    );
    assert_inert(&page);
    let links: Vec<&str> = page
        .split("<a href=\"")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect();
    assert!(!links.is_empty(), "no link to the file");
    for link in &links {
        assert!(
            link.starts_with("https://github.com/org/gitops/blob/")
                && link.ends_with(
                    "/fleet-objects/widgets/x%22%3E%3Cimg%20src%3Dx%20onerror%3Dalert%282%29%3E.yaml"
                ),
            "{link}"
        );
    }
    let (page, _) = html_of(
        "html-hostile-names",
        out.path(),
        &[
            "--repo-url",
            "javascript:alert(1)//github.com/org/gitops",
            "--git-mirror",
            &mirror,
        ],
    );
    assert_inert(&page);
    assert!(!page.contains("<a "), "a link from a javascript: URL");
}

/// `--html-url` is written into a comment: anything but a plain http(s) URL is refused on
/// the command line.
#[test]
fn a_hostile_html_url_is_refused() {
    for url in [
        "javascript:alert(1)",
        "https://x.test/a)<script>",
        "https://x.test/a b",
    ] {
        let cache = tempfile::tempdir().unwrap();
        let output = common::gate(cache.path())
            .args(["check", "--html-url", url])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{url}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("--html-url"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Debian's chromium, as `cargo xtask tools` installs it.
fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
    })
}

/// Runs chromium headless with a deadline; its stdout.
fn run_chromium(chromium: &Path, args: &[String]) -> String {
    use wait_timeout::ChildExt;
    let profile = tempfile::tempdir().unwrap();
    let stdout = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .stdout(stdout.reopen().unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = match child
        .wait_timeout(std::time::Duration::from_secs(120))
        .unwrap()
    {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish in 120 s: {args:?}");
        }
    };
    assert!(status.success(), "chromium {args:?}: {status}");
    std::fs::read_to_string(stdout.path()).unwrap()
}

#[test]
fn the_html_report_in_a_real_browser() {
    let Some(chromium) = chromium() else {
        eprintln!(
            "SKIPPED the_html_report_in_a_real_browser: chromium is not installed (`cargo xtask tools` installs Debian's chromium; it could not here)"
        );
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let (_, code) = html_of("html-hostile-names", out.path(), &[]);
    assert_eq!(code, 0);
    let page = out.path().join("html-hostile-names.html");
    let url = format!("file://{}", page.display());
    let dom = run_chromium(&chromium, &["--dump-dom".to_string(), url.clone()]);
    // The DOM the browser built: the verdict, the counts, the finding, a collapsed diff.
    assert!(
        dom.contains("<h1 id=\"outcome\" class=\"green\">addons-gate: passed</h1>"),
        "{dom}"
    );
    assert!(
        dom.contains("<span id=\"objects-changed\">1</span>"),
        "{dom}"
    );
    assert!(dom.contains("<span id=\"applications-changed\">1</span>"));
    assert!(dom.contains("Findings (1)"));
    assert!(dom.contains("<code class=\"rule\">field-pruned-on-apply</code>"));
    assert!(
        dom.contains("<details class=\"object\" data-kind=\"ResourceQuota\"><summary>"),
        "a collapsed diff (no `open`)"
    );
    // The hostile names are text in the browser's DOM: no element came of them, and the
    // serialised text holds them escaped.
    assert_inert(&dom);
    assert!(dom.contains("&lt;/details&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(dom.contains("x\"&gt;&lt;img src=x onerror=alert(2)&gt;.yaml"));
    // A screenshot, kept as an artifact (not compared).
    let shots = common::project_root().join("target/gate-html");
    std::fs::create_dir_all(&shots).unwrap();
    let shot = shots.join("html-hostile-names.png");
    let _ = std::fs::remove_file(&shot);
    run_chromium(
        &chromium,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,1600".to_string(),
            url,
        ],
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    eprintln!("screenshot: {}", shot.display());
}
