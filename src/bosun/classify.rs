//! Which path a pull request takes, decided from the gate's published verdict alone (plus the
//! pull request's own facts). Pure: every branch has a unit test; docs/classification.md is
//! the same table in prose, with worked examples.

use crate::gate::report::ParsedReport;
use crate::gate::rules::{self, DroppedServedVersion};
use crate::gate::verdict::Outcome;

/// What Bosun knows when it decides.
#[derive(Debug, Clone)]
pub struct Situation<'a> {
    /// The gate's report, read from the comment the gate's identity wrote (None: not yet).
    pub report: Option<&'a ParsedReport>,
    /// The pull request's head now.
    pub head_sha: &'a str,
    /// The head branch lives in another repository (a fork).
    pub fork: bool,
    /// Repairs already pushed to this pull request (from its labels).
    pub attempts: u32,
    pub attempt_cap: u32,
}

/// A handoff: written for the person who picks it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handoff {
    /// Which file and key to open.
    pub open: String,
    /// What the choice is.
    pub choice: String,
    /// The one fact that stopped a mechanical fix.
    pub fact: String,
}

/// The route a pull request takes, one per row of docs/classification.md.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// No verdict for this head yet (none published, or one for another commit).
    Wait(String),
    /// Green, and nothing a reviewer needs pointed at.
    Green,
    /// Green, but the render shows something worth a look before merging.
    WorthALook(Vec<String>),
    /// Only dropped served versions with consumers: swap the apiVersions.
    Swap(Vec<DroppedServedVersion>),
    /// Blocked with nothing in this repository to change: say so in one line.
    Escalate(String),
    /// The head does not render because the new chart's values schema refuses this
    /// repository's values: migrate the values files (the error as the gate gave it).
    Migrate(String),
    /// Only `kind-not-served-on-cluster`: the mechanical fix (a scalar the render proves).
    Fix(Vec<rules::NotServed>),
    /// Everything else: a person decides.
    Handoff(Handoff),
}

/// The notes that make a green gate worth a look, and how a person reads each.
const WORTH_A_LOOK: [(&str, &str); 5] = [
    (rules::MAJOR_VERSION, "a major version boundary is crossed"),
    (
        rules::APPLICATIONS_REMOVED,
        "Applications are no longer generated and Argo CD deletes them",
    ),
    (rules::RBAC_REMOVED, "RBAC objects are removed"),
    (rules::CRD_REMOVED, "CustomResourceDefinitions are removed"),
    (
        rules::SYNC_POLICY_CHANGED,
        "generated Applications may now delete or overwrite by themselves",
    ),
];

pub fn classify(situation: &Situation) -> Route {
    let Some(report) = situation.report else {
        return Route::Wait("no report from the gate yet".into());
    };
    let verdict = &report.verdict;
    if verdict.head != situation.head_sha {
        return Route::Wait(format!(
            "the report is for {}, the branch is at {}",
            short(&verdict.head),
            short(situation.head_sha)
        ));
    }
    match verdict.outcome {
        Outcome::Green => {
            let reasons: Vec<String> = WORTH_A_LOOK
                .iter()
                .filter(|(rule, _)| verdict.notes.get(*rule).copied().unwrap_or(0) > 0)
                .map(|(_, reason)| reason.to_string())
                .collect();
            if reasons.is_empty() {
                Route::Green
            } else {
                Route::WorthALook(reasons)
            }
        }
        Outcome::Undecided => {
            let error = verdict
                .errors
                .first()
                .cloned()
                .unwrap_or_else(|| "the render failed".into());
            let values_schema = error.contains("values don't meet the specifications")
                || error.contains("values.schema.json");
            let at_head = verdict.errors.iter().all(|e| e.starts_with("at head"));
            if values_schema && at_head {
                let open = "the values the failing Application layers (named in the error)";
                if situation.fork {
                    return Route::Handoff(Handoff {
                        open: open.into(),
                        choice: "which settings to remove, rename or add so the new chart's values schema accepts them".into(),
                        fact: format!("the branch lives in a fork, and Bosun pushes only to branches of the repository itself: {error}"),
                    });
                }
                if situation.attempts >= situation.attempt_cap {
                    return Route::Handoff(Handoff {
                        open: open.into(),
                        choice: "why the new chart still refuses the values after the repair"
                            .into(),
                        fact: format!(
                            "Bosun already pushed {} repair{} to this pull request (the cap is {}): {error}",
                            situation.attempts,
                            crate::plural(situation.attempts),
                            situation.attempt_cap
                        ),
                    });
                }
                return Route::Migrate(error);
            }
            Route::Handoff(Handoff {
                open: if values_schema {
                    "the values the failing Application layers (named in the error)".into()
                } else {
                    "the Application or source the error names".into()
                },
                choice: if values_schema {
                    "which settings to remove, rename or add so the new chart's values schema accepts them".into()
                } else {
                    "how to make the head render again".into()
                },
                fact: if values_schema {
                    format!(
                        "the new chart refuses this repository's values, and a values migration needs a model, which is not configured: {error}"
                    )
                } else {
                    format!("the gate could not render the change: {error}")
                },
            })
        }
        Outcome::Blocked => {
            let only = |rule: &str| {
                verdict.blocking.keys().all(|r| r == rule) && verdict.blocking.contains_key(rule)
            };
            if only(rules::DROPPED_SERVED_VERSION) && verdict.repository_consumers > 0 {
                let files: Vec<&str> = report
                    .dropped
                    .iter()
                    .flat_map(|d| d.consumers.iter().map(|c| c.path.as_str()))
                    .collect();
                if situation.fork {
                    return Route::Handoff(Handoff {
                        open: files.join(", "),
                        choice: "move each manifest's apiVersion to the version the gate names".into(),
                        fact: "the branch lives in a fork, and Bosun pushes only to branches of the repository itself".into(),
                    });
                }
                if situation.attempts >= situation.attempt_cap {
                    return Route::Handoff(Handoff {
                        open: files.join(", "),
                        choice: "why the gate still blocks after the repair".into(),
                        fact: format!(
                            "Bosun already pushed {} repair{} to this pull request (the cap is {})",
                            situation.attempts,
                            crate::plural(situation.attempts),
                            situation.attempt_cap
                        ),
                    });
                }
                if report.dropped.is_empty() {
                    return Route::Handoff(Handoff {
                        open: "the gate's report".into(),
                        choice: "which manifests to move".into(),
                        fact: "the report counts consumers but carries no repair evidence".into(),
                    });
                }
                return Route::Swap(report.dropped.clone());
            }
            if only(rules::CHART_RENDERS_UNSERVED_VERSION) && verdict.repository_consumers == 0 {
                return Route::Escalate(
                    "The chart itself renders an apiVersion the cluster no longer serves, and no manifest in this repository declares it: there are no values to change in this repository.".into(),
                );
            }
            if only(rules::KIND_NOT_SERVED) && !report.not_served.is_empty() {
                // A scalar the render proves may fix it: the mechanical fix, unless Bosun may
                // not push here.
                if situation.fork || situation.attempts >= situation.attempt_cap {
                    return Route::Handoff(not_served_handoff(&report.not_served));
                }
                return Route::Fix(report.not_served.clone());
            }
            let block = |rule: &str| report.findings.iter().find(|f| f.rule == rule);
            if only(rules::DESTINATION_UNKNOWN)
                && let Some(finding) = block(rules::DESTINATION_UNKNOWN)
            {
                let field = |k: &str| finding.evidence[k].as_str().unwrap_or("?").to_string();
                return Route::Handoff(Handoff {
                    open: format!(
                        "{} (it generates the Application {}/{})",
                        field("origin"),
                        field("namespace"),
                        field("application")
                    ),
                    choice: "point the Application at a cluster Argo CD knows (its destination server or name), or add that cluster to Argo CD (its cluster Secret, which the inventory is read from)".into(),
                    fact: format!(
                        "the Application {}/{} targets {}, which is no cluster of the inventory: Argo CD would report \"cluster not found\" and deploy nothing",
                        field("namespace"),
                        field("application"),
                        field("destination")
                    ),
                });
            }
            if only(rules::CRD_NAME_INVALID)
                && let Some(finding) = block(rules::CRD_NAME_INVALID)
            {
                let field = |k: &str| finding.evidence[k].as_str().unwrap_or("?").to_string();
                return Route::Handoff(Handoff {
                    open: format!(
                        "the chart the Application {} on {} renders, at the version this change moves it to",
                        field("application"),
                        field("cluster")
                    ),
                    choice: "keep the previous chart version until its maintainers publish CustomResourceDefinitions Kubernetes accepts (or fix the chart, if it is this repository's own)".into(),
                    fact: format!(
                        "the chart renders a CustomResourceDefinition the API server would reject ({}), so none of its versions would be served",
                        field("reason")
                    ),
                });
            }
            if only(rules::FIELD_PRUNED_ON_APPLY)
                && let Some(finding) = block(rules::FIELD_PRUNED_ON_APPLY)
            {
                let field = |k: &str| finding.evidence[k].as_str().unwrap_or("?").to_string();
                let apps: Vec<String> = finding.evidence["applications"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .take(5)
                    .collect();
                let others = report
                    .findings
                    .iter()
                    .filter(|f| f.rule == rules::FIELD_PRUNED_ON_APPLY)
                    .count()
                    - 1;
                return Route::Handoff(Handoff {
                    open: format!(
                        "the manifest or values that render {} (in {})",
                        field("object"),
                        apps.join(", ")
                    ),
                    choice: "move the value to the field the schema of that version declares, or remove it if the version no longer has that setting".into(),
                    fact: format!(
                        "{}: {}{}; the API server would accept the object and quietly lose the value",
                        field("object"),
                        field("loss"),
                        if others > 0 {
                            format!(" (and {others} more such finding{} in the report)", crate::plural(others))
                        } else {
                            String::new()
                        }
                    ),
                });
            }
            let rules: Vec<&str> = verdict.blocking.keys().map(String::as_str).collect();
            Route::Handoff(Handoff {
                open: "the files the gate's blocking findings name".into(),
                choice: "how to resolve each blocking finding".into(),
                fact: format!(
                    "the gate blocks on {}, which no repair Bosun makes covers",
                    rules.join(", ")
                ),
            })
        }
    }
}

/// A handoff a person acts on in one read for `kind-not-served-on-cluster`: the objects, where
/// they render, and the two ways out.
/// The comment a handoff leaves (after Bosun's marker): which file and key to open, the
/// choice, the one fact that stopped a mechanical fix, and the details. Every part a chart or a
/// pull request controls is escaped; each detail was made safe where it was written.
pub fn handoff_comment(handoff: &Handoff, details: &[String]) -> String {
    use std::fmt::Write as _;
    let mut body = format!(
        "**Over to you.** Open {}. The choice: {}. What stopped a mechanical fix: {}.\n",
        crate::gate::report::text(&handoff.open),
        crate::gate::report::text(&handoff.choice),
        crate::gate::report::text(&handoff.fact)
    );
    if !details.is_empty() {
        body.push('\n');
        for line in details {
            // Escaped where they were written; an invisible character is shown all the same.
            let _ = writeln!(body, "- {}", crate::gate::report::visible(line));
        }
    }
    body.push_str("\nBosun has stopped here; nothing was pushed by this step.\n");
    body
}

/// The handoff when the applier refuses rewrites a harness accepted: the files, and each
/// reason.
pub fn applier_handoff(refusals: &[super::applier::Refusal], choice: &str) -> Handoff {
    Handoff {
        open: refusals
            .iter()
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
            .join(", "),
        choice: choice.to_string(),
        fact: format!(
            "the applier refused {} (nothing was pushed)",
            refusals
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

pub fn not_served_handoff(objects: &[rules::NotServed]) -> Handoff {
    let first = &objects[0];
    let name = |o: &rules::NotServed| {
        if o.namespace.is_empty() {
            format!("{} {} ({})", o.kind, o.name, o.api_version)
        } else {
            format!("{} {}/{} ({})", o.kind, o.namespace, o.name, o.api_version)
        }
    };
    let apps: Vec<String> = first.applications.iter().take(5).cloned().collect();
    let more = first.applications.len().saturating_sub(5) + first.more_applications;
    Handoff {
        open: format!(
            "the values or manifests of {}{}",
            apps.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ),
        choice: "stop rendering it there (the chart value that turns it on, often a default the new chart version changed: the report lists them under \"Chart defaults that changed\"), or make the cluster serve it (install its CRD, or list the API in the cluster's inventory entry if the cluster already serves it)".into(),
        fact: format!(
            "{} {} rendered where the cluster serves no such kind, so Argo CD would fail the sync;",
            objects.iter().map(name).collect::<Vec<_>>().join(", "),
            if objects.len() == 1 { "is" } else { "are" }
        ),
    }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(7)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::rules::Consumer;
    use crate::gate::verdict::Verdict;
    use std::collections::BTreeMap;

    const HEAD: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn report(outcome: Outcome, blocking: &[(&str, usize)], consumers: usize) -> ParsedReport {
        let dropped = (consumers > 0)
            .then(|| DroppedServedVersion {
                crd: "externalsecrets.external-secrets.io".into(),
                group: "external-secrets.io".into(),
                kind: "ExternalSecret".into(),
                dropped: vec!["v1beta1".into()],
                served: vec!["v1".into()],
                storage: "v1".into(),
                clusters: vec!["prod".into()],
                consumers: (0..consumers)
                    .map(|i| Consumer {
                        path: format!("m/{i}.yaml"),
                        document: 0,
                        api_version: "external-secrets.io/v1beta1".into(),
                        kind: "ExternalSecret".into(),
                        namespace: String::new(),
                        name: format!("n{i}"),
                        template: false,
                    })
                    .collect(),
            })
            .into_iter()
            .collect();
        ParsedReport {
            summary: None,
            verdict: Verdict {
                outcome,
                base: "a".repeat(40),
                head: HEAD.into(),
                counts: Default::default(),
                blocking: blocking.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
                notes: BTreeMap::new(),
                repository_consumers: consumers,
                errors: vec![],
            },
            dropped,
            not_served: vec![],
            findings: vec![],
        }
    }

    fn situation(report: Option<&ParsedReport>) -> Situation<'_> {
        Situation {
            report,
            head_sha: HEAD,
            fork: false,
            attempts: 0,
            attempt_cap: 2,
        }
    }

    #[test]
    fn no_report_or_a_stale_one_waits() {
        assert!(matches!(classify(&situation(None)), Route::Wait(_)));
        let mut stale = report(Outcome::Green, &[], 0);
        stale.verdict.head = "c".repeat(40);
        let Route::Wait(why) = classify(&situation(Some(&stale))) else {
            panic!("stale report acted on");
        };
        assert_eq!(why, "the report is for ccccccc, the branch is at bbbbbbb");
    }

    #[test]
    fn green_is_quiet_unless_a_note_is_worth_a_look() {
        let green = report(Outcome::Green, &[], 0);
        assert_eq!(classify(&situation(Some(&green))), Route::Green);
        let mut major = green.clone();
        major.verdict.notes.insert(rules::MAJOR_VERSION.into(), 1);
        major.verdict.notes.insert(rules::ADDON_ADDED.into(), 1);
        assert_eq!(
            classify(&situation(Some(&major))),
            Route::WorthALook(vec!["a major version boundary is crossed".into()])
        );
        let mut removed = green.clone();
        removed
            .verdict
            .notes
            .insert(rules::APPLICATIONS_REMOVED.into(), 1);
        assert_eq!(
            classify(&situation(Some(&removed))),
            Route::WorthALook(vec![
                "Applications are no longer generated and Argo CD deletes them".into()
            ])
        );
    }

    #[test]
    fn only_dropped_versions_with_consumers_swap() {
        let blocked = report(Outcome::Blocked, &[(rules::DROPPED_SERVED_VERSION, 1)], 3);
        assert!(
            matches!(classify(&situation(Some(&blocked))), Route::Swap(d) if d[0].consumers.len() == 3)
        );
    }

    #[test]
    fn a_fork_or_the_attempt_cap_hands_off_instead_of_swapping() {
        let blocked = report(Outcome::Blocked, &[(rules::DROPPED_SERVED_VERSION, 1)], 1);
        let mut fork = situation(Some(&blocked));
        fork.fork = true;
        assert!(matches!(classify(&fork), Route::Handoff(h) if h.fact.contains("fork")));
        let mut capped = situation(Some(&blocked));
        capped.attempts = 2;
        assert!(
            matches!(classify(&capped), Route::Handoff(h) if h.fact.contains("already pushed 2 repairs"))
        );
    }

    #[test]
    fn dropped_versions_mixed_with_another_blocker_hand_off() {
        let mixed = report(
            Outcome::Blocked,
            &[
                (rules::DROPPED_SERVED_VERSION, 1),
                (rules::CHART_RENDERS_UNSERVED_VERSION, 1),
            ],
            1,
        );
        assert!(
            matches!(classify(&situation(Some(&mixed))), Route::Handoff(h)
            if h.fact.contains("chart-renders-unserved-version, dropped-served-version"))
        );
    }

    #[test]
    fn nothing_to_change_here_escalates_in_one_line() {
        let unserved = report(
            Outcome::Blocked,
            &[(rules::CHART_RENDERS_UNSERVED_VERSION, 2)],
            0,
        );
        let Route::Escalate(line) = classify(&situation(Some(&unserved))) else {
            panic!("not escalated");
        };
        assert!(!line.contains('\n'));
        assert!(line.contains("no values to change in this repository"));
        // A chart of this repository computing the apiVersion is something to change.
        let local = report(
            Outcome::Blocked,
            &[(rules::REPOSITORY_CHART_RENDERS_UNSERVED_VERSION, 1)],
            0,
        );
        assert!(matches!(
            classify(&situation(Some(&local))),
            Route::Handoff(_)
        ));
    }

    #[test]
    fn a_values_schema_refusal_at_head_is_a_migration_unless_a_fork_or_the_cap() {
        let mut failed = report(Outcome::Undecided, &[(rules::RENDER_FAILED, 1)], 0);
        failed.verdict.errors = vec!["at head: argocd/x: helm template: values don't meet the specifications of the schema(s) in the following chart(s):\n- at '/webhook': additional properties 'create' not allowed".into()];
        let Route::Migrate(error) = classify(&situation(Some(&failed))) else {
            panic!("not a migration");
        };
        assert!(error.contains("/webhook"));
        let mut fork = situation(Some(&failed));
        fork.fork = true;
        assert!(matches!(classify(&fork), Route::Handoff(h) if h.fact.contains("fork")));
        let mut capped = situation(Some(&failed));
        capped.attempts = capped.attempt_cap;
        assert!(
            matches!(classify(&capped), Route::Handoff(h) if h.fact.contains("already pushed"))
        );
        // At the base too: not this pull request's values to migrate.
        let mut both = failed.clone();
        both.verdict
            .errors
            .push("at base: argocd/x: helm template: values don't meet the specifications".into());
        assert!(matches!(
            classify(&situation(Some(&both))),
            Route::Handoff(_)
        ));
        let mut other = failed.clone();
        other.verdict.errors = vec!["at head: chart not found".into()];
        assert!(
            matches!(classify(&situation(Some(&other))), Route::Handoff(h) if h.fact.starts_with("the gate could not render"))
        );
    }

    #[test]
    fn a_kind_no_cluster_serves_gets_the_mechanical_fix_or_in_a_fork_a_handoff_naming_the_way_out()
    {
        let mut r = report(Outcome::Blocked, &[(rules::KIND_NOT_SERVED, 1)], 0);
        r.not_served = vec![rules::NotServed {
            api_version: "monitoring.coreos.com/v1".into(),
            kind: "ServiceMonitor".into(),
            namespace: "monitoring".into(),
            name: "metrics-agent".into(),
            applications: vec!["argocd/metrics-agent-prod-us on prod-us".into()],
            more_applications: 0,
        }];
        let Route::Fix(objects) = classify(&situation(Some(&r))) else {
            panic!("expected the mechanical fix");
        };
        assert_eq!(objects, r.not_served);
        // In a fork (or at the attempt cap): the handoff.
        let mut fork = situation(Some(&r));
        fork.fork = true;
        let Route::Handoff(handoff) = classify(&fork) else {
            panic!("expected a handoff");
        };
        assert!(
            handoff
                .open
                .contains("argocd/metrics-agent-prod-us on prod-us"),
            "{}",
            handoff.open
        );
        assert!(
            handoff.fact.starts_with(
                "ServiceMonitor monitoring/metrics-agent (monitoring.coreos.com/v1) is rendered"
            ),
            "{}",
            handoff.fact
        );
        assert!(handoff.choice.contains("Chart defaults that changed"));
    }

    #[test]
    fn an_unknown_destination_and_a_pruned_value_get_handoffs_naming_what_to_open() {
        let mut r = report(Outcome::Blocked, &[(rules::DESTINATION_UNKNOWN, 1)], 0);
        r.findings = vec![crate::gate::report::BlockFinding {
            rule: rules::DESTINATION_UNKNOWN.into(),
            evidence: serde_json::json!({"application": "web-lab", "namespace": "argocd",
                "origin": "ApplicationSet argocd/web", "destination": "server https://lab.example.test"}),
        }];
        let Route::Handoff(h) = classify(&situation(Some(&r))) else {
            panic!("expected a handoff");
        };
        assert!(
            h.open.starts_with("ApplicationSet argocd/web"),
            "{}",
            h.open
        );
        assert!(
            h.fact.contains("server https://lab.example.test"),
            "{}",
            h.fact
        );
        let mut r = report(Outcome::Blocked, &[(rules::FIELD_PRUNED_ON_APPLY, 1)], 0);
        r.findings = vec![crate::gate::report::BlockFinding {
            rule: rules::FIELD_PRUNED_ON_APPLY.into(),
            evidence: serde_json::json!({"object": "example.test/v1 Widget web/a",
                "loss": "spec.size = 3 would be pruned (the v1 schema has no such field)",
                "applications": ["argocd/web-prod on prod"]}),
        }];
        let Route::Handoff(h) = classify(&situation(Some(&r))) else {
            panic!("expected a handoff");
        };
        assert!(
            h.open.contains("example.test/v1 Widget web/a"),
            "{}",
            h.open
        );
        assert!(
            h.fact.contains("spec.size = 3 would be pruned"),
            "{}",
            h.fact
        );
    }
}
