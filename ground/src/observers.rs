//! The observer processes a scenario starts, stops and reads (logs, metrics).

use std::time::Duration;

use anyhow::{Context, Result};

use crate::Ground;

impl Ground {
    /// The sum of a metric's samples (lines starting with `name`) over running observers.
    pub fn observer_metric(&self, name: &str) -> f64 {
        let mut total = 0.0;
        for (_, address, _) in &self.observers {
            let text = http_get(address, "/metrics");
            for line in text.lines().filter(|l| l.starts_with(name)) {
                total += line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0);
            }
        }
        total
    }

    /// Everything the observers have logged.
    pub fn observer_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("observer.log")).unwrap_or_default()
    }

    pub(crate) fn start_observer(&mut self, args: &[String]) -> Result<()> {
        let binary = self
            .observer_binary
            .clone()
            .context("this scenario starts the observer: pass its binary (--observer)")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("observer.log"))?;
        // Free loopback ports for its metrics and health servers.
        let port = || -> Result<String> {
            Ok(std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .to_string())
        };
        let (metrics_addr, health_addr) = (port()?, port()?);
        let child = std::process::Command::new(binary)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAME", format!("observer-{}", self.observer_starts))
            .env("POD_NAMESPACE", "kargo-observer")
            .env(
                "RUST_LOG",
                std::env::var("GROUND_OBSERVER_LOG")
                    .unwrap_or_else(|_| "info,kube=warn".to_string()),
            )
            .args([
                "--metrics-addr",
                &metrics_addr,
                "--health-addr",
                &health_addr,
                "--log-format",
                "text",
            ])
            // The ground's resync unless the scenario names one.
            .args(
                (!args.iter().any(|a| a.starts_with("--resync")))
                    .then_some(["--resync", "30s"])
                    .into_iter()
                    .flatten(),
            )
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start the observer")?;
        self.observer_starts += 1;
        self.observer_args.push(args.to_vec());
        self.observers.push((child, metrics_addr, health_addr));
        self.transcript.say(
            "observer",
            format!(
                "started{}",
                if args.is_empty() {
                    String::new()
                } else {
                    format!(" with {}", args.join(" "))
                }
            ),
        );
        Ok(())
    }

    /// Stops the first running observer (SIGTERM, as Kubernetes does).
    pub(crate) fn stop_observer(&mut self) -> Result<()> {
        if !self.observers.is_empty() {
            let (mut child, _, _) = self.observers.remove(0);
            self.observer_args.remove(0);
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let status = child.wait()?;
            if !status.success() {
                eprintln!(
                    "observer exited with {status}; its log:\n{}",
                    self.observer_log()
                );
            }
            self.transcript.say(
                "observer",
                format!(
                    "stopped ({})",
                    if status.success() {
                        "clean exit"
                    } else {
                        "killed"
                    }
                ),
            );
        }
        Ok(())
    }
}

/// The raw response to a plain HTTP/1.0 GET on loopback ("" when nothing answers).
pub(crate) fn http_get(address: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(address) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}
