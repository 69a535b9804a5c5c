//! Running a plan: printing it (`--dry-run`) or executing it step by step, secrets filled in.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command as Process, ExitStatus, Stdio};

use anyhow::{Context, Result, bail};

use super::credentials::{credentials_path, existing, generate, write_credentials};
use super::{GENERATED, Secret, Step, relative};
use crate::project_root;

/// One argument for a POSIX shell: as is when it is plainly safe, else single-quoted.
pub(super) fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

pub(super) fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The dry-run text: for each step, `# <what>` then the shell-quoted command.
pub fn dry_run_text(steps: &[Step]) -> String {
    let mut text = String::new();
    for step in steps {
        match step.until {
            Some(seconds) => {
                let _ = writeln!(
                    text,
                    "# wait (again every 10 s, at most {}m): {}",
                    seconds / 60,
                    step.what
                );
            }
            None => {
                let _ = writeln!(text, "# {}", step.what);
            }
        }
        if !step.argv.is_empty() {
            let _ = writeln!(text, "{}", shell_line(&step.argv));
        }
    }
    text
}

/// Prints the plan (`dry_run`), or runs it from the project root, step by step, stopping at the
/// first failure with a message naming the step.
pub fn run(steps: &[Step], dry_run: bool) -> Result<()> {
    run_with(steps, dry_run, Credentials::Generate)
}

/// Where a run's secrets come from: made afresh (`up`), or the ones `up` wrote (`play`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    Generate,
    Existing,
}

pub fn run_with(steps: &[Step], dry_run: bool, credentials: Credentials) -> Result<()> {
    if dry_run {
        print!("{}", dry_run_text(steps));
        return Ok(());
    }
    let root = project_root();
    let captured: Vec<Secret> = steps.iter().filter_map(|s| s.captures).collect();
    let generated = steps
        .iter()
        .flat_map(|s| &s.secrets)
        .any(|secret| !captured.contains(secret))
        && credentials == Credentials::Generate;
    // Generated logins are written down only once the cluster exists: a run that stops
    // earlier (the cluster already exists) leaves the logins of the running cluster in place.
    let (mut values, mut logins) = match credentials {
        Credentials::Generate if generated => {
            let (values, logins) = generate()?;
            (values, Some(logins))
        }
        Credentials::Generate => (HashMap::new(), None),
        Credentials::Existing => (existing(&root)?, None),
    };
    let total = steps.len();
    for (index, step) in steps.iter().enumerate() {
        let number = index + 1;
        println!("# [{number}/{total}] {}", step.what);
        if step.argv.is_empty() {
            continue;
        }
        println!("{}", shell_line(&step.argv));
        let argv = fill(step, &values)
            .with_context(|| format!("step {number}/{total} ({})", step.what))?;
        if let Some(seconds) = step.until {
            wait_until(&root, &argv, seconds).with_context(|| {
                format!("step {number}/{total} ({}) did not come true", step.what)
            })?;
            continue;
        }
        let (status, stdout) = execute(&root, &argv, step.captures.is_some())
            .with_context(|| format!("step {number}/{total} ({}) could not start", step.what))?;
        if !status.success() {
            bail!(
                "step {number}/{total} failed: {} ({} ended with {status})",
                step.what,
                argv[0]
            );
        }
        if step.argv.get(..3) == Some(&argv!["kind", "create", "cluster"][..])
            && let Some(text) = logins.take()
        {
            write_credentials(&root, &text)?;
        }
        if let Some(secret) = step.captures {
            if stdout.is_empty() {
                bail!("step {number}/{total} ({}) printed nothing", step.what);
            }
            values.insert(secret, stdout);
        }
    }
    if let Some(text) = logins {
        // A plan without `kind create cluster` (none today) still keeps its logins.
        write_credentials(&root, &text)?;
    }
    if generated {
        println!(
            "kind: done. Logins: {}",
            relative(&root, &credentials_path(&root))
        );
    }
    Ok(())
}

/// The step's argv with its placeholders replaced by the secrets' values.
pub(super) fn fill(step: &Step, values: &HashMap<Secret, String>) -> Result<Vec<String>> {
    let mut secrets = step.secrets.iter();
    let mut argv = Vec::with_capacity(step.argv.len());
    for arg in &step.argv {
        let mut filled = String::new();
        let mut rest = arg.as_str();
        while let Some(at) = rest.find(GENERATED) {
            filled.push_str(&rest[..at]);
            let secret = secrets
                .next()
                .context("the command has more placeholders than secrets")?;
            let value = values
                .get(secret)
                .with_context(|| format!("{secret:?} is not known yet"))?;
            filled.push_str(value);
            rest = &rest[at + GENERATED.len()..];
        }
        filled.push_str(rest);
        argv.push(filled);
    }
    if secrets.next().is_some() {
        bail!("the command has fewer placeholders than secrets");
    }
    Ok(argv)
}

/// Runs one command from `root`. Standard input is closed and git never prompts, so a step
/// fails instead of waiting; with `capture`, standard output is returned instead of shown.
pub(super) fn execute(root: &Path, argv: &[String], capture: bool) -> Result<(ExitStatus, String)> {
    let (program, args) = argv.split_first().context("an empty command")?;
    let mut command = Process::new(program);
    command
        .args(args)
        .current_dir(root)
        .stdin(Stdio::null())
        .env("GIT_TERMINAL_PROMPT", "0");
    if capture {
        let output = command.stderr(Stdio::inherit()).output()?;
        let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
        Ok((output.status, stdout))
    } else {
        Ok((command.status()?, String::new()))
    }
}

/// Runs a condition again every 10 s until it succeeds or `seconds` have passed (the real
/// systems' time: Kargo, Argo CD and Gitea act at their own pace; a plan never sleeps a fixed
/// time and hopes).
fn wait_until(root: &Path, argv: &[String], seconds: u64) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let (status, _) = execute(root, argv, true)?;
        if status.success() {
            return Ok(());
        }
        if start.elapsed().as_secs() >= seconds {
            bail!("still false after {}m", seconds / 60);
        }
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
}
