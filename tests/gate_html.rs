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

/// A check's verdict with findings added: a blocking finding that names no cluster, notes on
/// `prod-eu` and on `prod-us`, a note naming no cluster, and a note whose cluster (a chart
/// chooses such text) holds a line break between two real cluster names. Its merge base is
/// not a commit id and not ASCII (a verdict from elsewhere). The page, and the findings'
/// summaries.
fn filter_page(out: &Path) -> PathBuf {
    let json = out.join("verdict.json");
    let (_, code) = html_of(
        "html-hostile-names",
        out,
        &["--json", json.to_str().unwrap()],
    );
    assert_eq!(code, 0);
    let mut result: gitops_loop::gate::verdict::GateResult =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    use gitops_loop::gate::rules::{Finding, Severity};
    let finding = |severity, summary: &str, evidence| Finding {
        rule: "filter-probe".into(),
        severity,
        summary: summary.into(),
        evidence,
    };
    result.findings.extend([
        finding(
            Severity::Blocking,
            "blocking naming no cluster",
            serde_json::json!({"file": "fleet/x.yaml", "kind": "Widget"}),
        ),
        finding(
            Severity::Note,
            "note on prod-eu",
            serde_json::json!({"cluster": "prod-eu"}),
        ),
        finding(
            Severity::Note,
            "note on prod-us",
            serde_json::json!({"cluster": "prod-us"}),
        ),
        finding(
            Severity::Note,
            "note naming no cluster",
            serde_json::json!({"file": "fleet/y.yaml"}),
        ),
        finding(
            Severity::Note,
            "note on a cluster named with a line break",
            serde_json::json!({"cluster": "prod-eu\nprod-us"}),
        ),
    ]);
    result.verdict.outcome = gitops_loop::gate::verdict::Outcome::Blocked;
    result.verdict.base = "aaaaaaaaaaa€€".into();
    let page = gitops_loop::gate::html::render(&result, &gitops_loop::gate::html::Links::default());
    let path = out.join("filter.html");
    std::fs::write(&path, page).unwrap();
    path
}

/// The number the filter's list gives a value of a facet.
fn option_number(page: &str, facet: &str, shown: &str) -> String {
    let start = page.find(&format!("data-filter=\"{facet}\"")).unwrap();
    let list = &page[start..start + page[start..].find("</select>").unwrap()];
    let at = list
        .find(&format!("\">{shown}</option>"))
        .unwrap_or_else(|| panic!("{shown} is not in the {facet} list: {list}"));
    let value = &list[..at];
    value[value.rfind("value=\"").unwrap() + 7..].to_string()
}

/// The opening tag of the finding whose summary is `summary`.
fn finding_tag<'a>(page: &'a str, summary: &str) -> &'a str {
    let at = page
        .find(&format!(">{summary}<"))
        .unwrap_or_else(|| panic!("no finding {summary}"));
    let start = page[..at].rfind("<details").unwrap();
    &page[start..start + page[start..].find('>').unwrap()]
}

/// The filter's facets are numbers, never a chart's text; a blocking finding is pinned; a
/// finding naming no cluster has no cluster facet; a merge base that is not a commit id is
/// shown, not sliced.
#[test]
fn the_filter_names_values_by_number_and_pins_blocking_findings() {
    let out = tempfile::tempdir().unwrap();
    let page = std::fs::read_to_string(filter_page(out.path())).unwrap();
    assert_inert(&page);
    let eu = option_number(&page, "cluster", "prod-eu");
    let us = option_number(&page, "cluster", "prod-us");
    let both = option_number(&page, "cluster", "prod-eu\\u{000A}prod-us");
    assert!(eu != us && us != both && eu != both);
    let blocking = finding_tag(&page, "blocking naming no cluster");
    assert!(blocking.contains("data-pinned=\"\""), "{blocking}");
    assert!(!blocking.contains("data-cluster"), "{blocking}");
    assert!(!finding_tag(&page, "note naming no cluster").contains("data-cluster"));
    assert!(finding_tag(&page, "note on prod-eu").contains(&format!("data-cluster=\"{eu}\"")));
    assert!(
        finding_tag(&page, "note on a cluster named with a line break")
            .contains(&format!("data-cluster=\"{both}\""))
    );
    assert!(!finding_tag(&page, "note on prod-eu").contains("data-pinned"));
    // No chart text in a facet: every facet of every filtered element is numbers.
    let mut filtered = 0;
    for tag in page.split("data-facets=\"\"").skip(1) {
        let tag = &tag[..tag.find('>').unwrap()];
        filtered += 1;
        for facet in ["data-cluster", "data-application", "data-kind", "data-rule"] {
            let Some(at) = tag.find(&format!("{facet}=\"")) else {
                continue;
            };
            let value = &tag[at + facet.len() + 2..];
            let value = &value[..value.find('"').unwrap()];
            assert!(
                value.chars().all(|c| c.is_ascii_digit() || c == ' '),
                "{facet}={value:?}"
            );
        }
    }
    assert!(filtered >= 7, "{filtered} filtered elements");
    assert!(page.contains("<code>aaaaaaaaaaa€€</code> (merge base)"));
}

/// The filter in a real browser, chosen by the page's address: a cluster shows its own
/// findings, the blocking finding and the findings naming no cluster, and hides the others,
/// the finding whose cluster holds a line break among them (it named `prod-eu` too when
/// the facets were text split at line breaks). Before, the blocking finding naming no
/// cluster disappeared as soon as a cluster was chosen.
#[test]
fn the_filter_in_a_real_browser_never_hides_a_blocking_finding() {
    let Some(chromium) = chromium() else {
        eprintln!(
            "SKIPPED the_filter_in_a_real_browser_never_hides_a_blocking_finding: chromium is not installed"
        );
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let path = filter_page(out.path());
    let page = std::fs::read_to_string(&path).unwrap();
    let eu = option_number(&page, "cluster", "prod-eu");
    let both = option_number(&page, "cluster", "prod-eu\\u{000A}prod-us");
    let hidden = |dom: &str, summary: &str| finding_tag(dom, summary).contains("hidden");
    let dom = run_chromium(
        &chromium,
        &[
            "--dump-dom".to_string(),
            format!("file://{}#cluster={eu}", path.display()),
        ],
    );
    assert!(dom.contains("shown</span>"), "the script ran: {dom}");
    for (summary, is_hidden) in [
        ("blocking naming no cluster", false),
        ("note on prod-eu", false),
        ("note naming no cluster", false),
        ("note on prod-us", true),
        ("note on a cluster named with a line break", true),
    ] {
        assert_eq!(hidden(&dom, summary), is_hidden, "{summary}");
    }
    let dom = run_chromium(
        &chromium,
        &[
            "--dump-dom".to_string(),
            format!("file://{}#cluster={both}&rule=999", path.display()),
        ],
    );
    for (summary, is_hidden) in [
        ("blocking naming no cluster", false),
        ("note on prod-eu", true),
        ("note on prod-us", true),
        ("note on a cluster named with a line break", false),
    ] {
        assert_eq!(hidden(&dom, summary), is_hidden, "{summary}");
    }
}

/// A head that does not resolve is named in the page as given: a name that is not ASCII
/// (git allows it) is shown, not sliced inside a character (the page used to panic).
#[test]
fn an_unresolved_head_of_any_name_is_shown_in_the_page() {
    let out = tempfile::tempdir().unwrap();
    let repo = case_repo("patch-bump-green");
    let cache = tempfile::tempdir().unwrap();
    let page = out.path().join("undecided.html");
    let output = common::gate(cache.path())
        .args([
            "--quiet",
            "check",
            "--head",
            "brånch-€€€€-no-such",
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
        .arg(&page)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "could not decide: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let page = std::fs::read_to_string(&page).unwrap();
    assert!(
        page.contains("<code>brånch-€€€€-no-such</code> (head)"),
        "{page}"
    );
    assert!(page.contains("addons-gate: could not decide"));
}
