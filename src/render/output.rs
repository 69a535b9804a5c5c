//! Printing a rendering: a readable summary, a YAML stream, or the JSON document scripts read.

use std::fmt::Write;

use serde_json::Value;

use super::{Rendering, object_sort_key};
use crate::yaml;

/// One line per object: `group/Kind namespace/name`.
pub fn object_line(object: &Value) -> String {
    let (group, kind, namespace, name) = object_sort_key(object);
    let kind = if group.is_empty() {
        kind
    } else {
        format!("{group}/{kind}")
    };
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// What an Application renders from, in a few words.
pub fn source_line(source: &Value) -> String {
    let text = |k: &str| source.get(k).and_then(Value::as_str).unwrap_or("");
    if let Some(reference) = source.get("ref").and_then(Value::as_str)
        && source.get("path").is_none()
        && source.get("chart").is_none()
    {
        return format!("${reference} = {}", text("repoURL"));
    }
    if !text("chart").is_empty() {
        format!(
            "chart {} {} from {}",
            text("chart"),
            text("targetRevision"),
            text("repoURL")
        )
    } else {
        format!(
            "{} path {}",
            text("repoURL"),
            if text("path").is_empty() {
                "."
            } else {
                text("path")
            }
        )
    }
}

pub fn summary(rendering: &Rendering) -> String {
    let mut out = String::new();
    let clusters: std::collections::BTreeSet<&str> = rendering
        .applications
        .iter()
        .map(|a| a.cluster.name.as_str())
        .collect();
    let objects: usize = rendering.applications.iter().map(|a| a.objects.len()).sum();
    let _ = writeln!(
        out,
        "revision {}: {} applications on {} clusters, {} objects",
        &rendering.revision[..rendering.revision.len().min(12)],
        rendering.applications.len(),
        clusters.len(),
        objects
    );
    let mut current_cluster = "";
    for app in &rendering.applications {
        if app.cluster.name != current_cluster {
            current_cluster = &app.cluster.name;
            let _ = writeln!(
                out,
                "\ncluster {} ({})",
                app.cluster.name, app.cluster.server
            );
        }
        let _ = writeln!(
            out,
            "  {}/{} -> namespace {:?}, project {}, from {} ({} objects)",
            app.namespace,
            app.name,
            app.destination_namespace,
            app.project,
            app.origin,
            app.objects.len()
        );
        if let Some(destination) = &app.destination_unknown {
            let _ = writeln!(
                out,
                "    destination {destination} is no cluster of the inventory: Argo CD reports \"cluster not found\"; nothing rendered"
            );
        }
        for source in &app.sources {
            let _ = writeln!(out, "    source: {}", source_line(source));
        }
        for object in &app.objects {
            let _ = writeln!(out, "      {}", object_line(object));
        }
    }
    for diagnostic in &rendering.diagnostics {
        let _ = writeln!(out, "{diagnostic}");
    }
    out
}

/// Every generated Application (as Argo CD stores it) and every object it renders, as a YAML
/// stream, each document introduced by a comment. Written as it goes: a fleet's render is
/// never one string in memory.
pub fn write_yaml_stream(
    rendering: &Rendering,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    for app in &rendering.applications {
        writeln!(
            out,
            "---\n# Application {}/{} on cluster {}: the Application itself",
            app.namespace, app.name, app.cluster.name
        )?;
        out.write_all(yaml::to_string(&app.stored).as_bytes())?;
        for object in &app.objects {
            writeln!(
                out,
                "---\n# Application {}/{} on cluster {}",
                app.namespace, app.name, app.cluster.name
            )?;
            out.write_all(yaml::to_string(object).as_bytes())?;
        }
    }
    Ok(())
}

/// The rendering as pretty JSON, written as it goes.
pub fn write_json(rendering: &Rendering, out: &mut impl std::io::Write) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, rendering)?;
    writeln!(out)
}
