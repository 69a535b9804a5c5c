//! The scenario interpreter: ticking the actors, settling, playing a timeline's actions
//! and waiting on conditions, with the invariants checked after every tick.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::argocd::Hold;
use crate::kube::store::Selector;
use crate::observers::http_get;
use crate::scenario::Action;
use crate::scenario::Service;
use crate::wiring::admin;
use crate::{Ground, argocd, invariants, kube};

/// Real time the ground gives Bosun's work: at most this long at the end of a tick for the
/// triage under way (`finish_work`), and this long without a change while settling. Each
/// round of a triage renders twice; a triage past it spills into later ticks.
const BOSUN_BUDGET: Duration = Duration::from_secs(120);

impl Ground {
    /// Every invariant the ground's state breaks now (see `invariants`).
    pub fn violations(&self) -> Vec<String> {
        invariants::violations_with(
            &self.kube,
            &self.forge,
            &self.scenario.kargo.project,
            &self.scenario.repository.slug,
            &self.exemptions,
        )
    }

    /// After each tick: counts it, records what became visible (when a ledger is kept) and
    /// checks the invariants.
    async fn after_tick(&mut self) -> Result<()> {
        self.ticks += 1;
        self.restart_faults().await?;
        if let Some(ledger) = &mut self.ledger {
            ledger.record(
                self.ticks,
                &self.kube,
                &self.forge,
                &self.scenario.kargo.project,
                &self.scenario.repository.slug,
            );
        }
        self.check_invariants()
    }

    /// Under a fault schedule, kills the observer and Bosun at seeded ticks (SIGKILL) and
    /// starts them again: what they had accepted must survive, what they were doing must
    /// converge.
    async fn restart_faults(&mut self) -> Result<()> {
        let tick = self.ticks;
        if !self.observers.is_empty() && self.kube.faults().restart("observer", tick) {
            let (mut child, _, _) = self.observers.remove(0);
            let args = self.observer_args.remove(0);
            let _ = child.kill();
            let _ = child.wait();
            self.transcript.say(
                "chaos",
                format!("tick {tick}: observer killed (SIGKILL), started again"),
            );
            self.start_observer(&args)?;
        }
        if let Some(killed) = self.bosun_killed.take()
            && let Some(bosun) = &mut self.bosun
        {
            killed.map_err(|e| anyhow::anyhow!("cannot kill bosun: {e}"))?;
            self.transcript.say(
                "chaos",
                format!("tick {tick}: bosun killed (SIGKILL), started again"),
            );
            bosun.restart().await?;
        }
        Ok(())
    }

    /// Stops the run when an invariant is broken, naming the seed, the tick and the
    /// transcript's tail.
    pub(crate) fn check_invariants(&self) -> Result<()> {
        let violations = self.violations();
        if violations.is_empty() {
            return Ok(());
        }
        let lines = self.transcript.lines();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        bail!(
            "invariant violated at tick {} (fault seed {}):\n  {}\ntranscript tail:\n{tail}",
            self.ticks,
            self.seed
                .map_or_else(|| "none".to_string(), |s| s.to_string()),
            violations.join("\n  ")
        )
    }

    /// One round of every actor, in a fixed order, one `clock::TICK` of simulated time after
    /// the last. True when anything changed.
    pub async fn tick(&mut self) -> bool {
        self.kube.clock().advance(crate::clock::TICK);
        let kargo = self.kargo.tick(&self.kube, &self.transcript).await;
        let ci = self.ci.tick(&self.forge, &self.transcript).await;
        let argocd = self.argocd.tick(&self.kube, &self.transcript).await;
        let rollouts = self.rollouts.tick(&self.kube, &self.transcript).await;
        let tick = self.ticks + 1;
        let bosun = match &mut self.bosun {
            Some(bosun) => {
                // Under a fault schedule, a kill drawn for this tick lands at a seeded moment
                // into the tick's triage (or once it is over, if sooner): part-way through a
                // round, after a push, or idle. `after_tick` starts Bosun again.
                let faults = self.kube.faults();
                if faults.restart("bosun", tick) {
                    bosun
                        .finish_work(faults.restart_moment("bosun", tick))
                        .await;
                    self.bosun_killed = Some(bosun.kill().map_err(|e| format!("{e:#}")));
                    false
                } else {
                    // Bosun's triage runs in real time: the tick ends when it has, so its
                    // writes land at the tick that set it off (at most `BOSUN_BUDGET`).
                    bosun.finish_work(BOSUN_BUDGET).await;
                    bosun.tick(&self.transcript).await
                }
            }
            None => false,
        };
        kargo || ci || argocd || rollouts || bosun
    }

    pub async fn bosun_busy(&self) -> bool {
        match &self.bosun {
            Some(bosun) => bosun.busy().await,
            None => false,
        }
    }

    /// Runs the actors until nothing changes. A promotion or verification that keeps waiting
    /// gets a short grace (work outside the ground, such as the observer, may still land)
    /// before the ground counts as settled; the scenario's expectations judge the outcome.
    pub async fn settle(&mut self) -> Result<()> {
        let mut quiet = 0;
        let mut waiting = 0;
        let budget = BOSUN_BUDGET;
        let mut bosun_deadline = std::time::Instant::now() + budget;
        loop {
            let changed = self.tick().await;
            self.after_tick().await?;
            if changed {
                quiet = 0;
                waiting = 0;
                bosun_deadline = std::time::Instant::now() + budget;
                continue;
            }
            // Bosun renders twice per round: give it the time it takes (bounded).
            if self.bosun_busy().await && std::time::Instant::now() < bosun_deadline {
                // Bosun works in real time: no tick passes until it has changed something or
                // gone idle, so how long it took does not move the ticks that follow.
                let mark = self.outside_mark();
                while self.outside_mark() == mark
                    && self.bosun_busy().await
                    && std::time::Instant::now() < bosun_deadline
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if self.outside_mark() != mark {
                    bosun_deadline = std::time::Instant::now() + budget;
                }
                continue;
            }
            if self.kargo.busy() && waiting < 40 {
                waiting += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
                continue;
            }
            quiet += 1;
            if quiet >= 2 {
                return Ok(());
            }
        }
    }

    pub async fn act(&mut self, action: &Action) -> Result<()> {
        match action {
            Action::Say(text) => self.transcript.say("scenario", text),
            Action::Publish(entry) => {
                let (chart, version) = entry
                    .split_once('@')
                    .with_context(|| format!("publish takes chart@version, got {entry}"))?;
                let repository = self
                    .chart_repositories
                    .iter()
                    .find(|r| {
                        r.available()
                            .map(|a| a.contains(&(chart.to_string(), version.to_string())))
                            .unwrap_or(false)
                    })
                    .with_context(|| format!("no chart repository holds {entry}"))?;
                repository.publish(chart, version)?;
                self.transcript.say(
                    "charts",
                    format!("{chart} {version} published to {}", repository.alias),
                );
            }
            Action::Refresh(warehouse) => self.kargo.refresh(warehouse),
            Action::Push(push) => self.push(push)?,
            Action::StallRollout(app) => {
                self.argocd.holds.insert(app.clone(), Hold::RolloutStalled);
                self.transcript.say(
                    "scenario",
                    format!("the rollout of {app} will stall half-way"),
                );
            }
            Action::ScaleToZero(app) => {
                self.argocd.holds.insert(app.clone(), Hold::ScaledToZero);
                self.argocd.resync();
                self.transcript
                    .say("scenario", format!("{app} is scaled to zero"));
            }
            Action::DegradeAfterSync(app) => {
                self.argocd
                    .holds
                    .insert(app.clone(), self::argocd::Hold::DegradesAfterSync);
                self.transcript.say(
                    "scenario",
                    format!(
                        "{app}'s next version will pass its first health check, then crash-loop"
                    ),
                );
            }
            Action::Sync(app) => {
                let resource = self
                    .kube
                    .store()
                    .resource("argoproj.io", "v1alpha1", "applications")
                    .cloned()
                    .context("Argo CD's Applications are not served")?;
                self.kube
                    .store()
                    .patch(
                        &resource,
                        "argocd",
                        app,
                        self::kube::store::PatchBody::Merge(json!({"operation": {
                            "initiatedBy": {"username": "alice"}, "sync": {}}})),
                        &admin(),
                        false,
                    )
                    .map_err(|e| anyhow::anyhow!("sync {app}: {e}"))?;
                self.transcript
                    .say("scenario", format!("a person syncs {app} in Argo CD"));
            }
            Action::Settle => self.settle().await?,
            Action::Merge(merge) => self.merge(merge).await?,
            Action::Comment(comment) => self.comment(comment).await?,
            Action::Outage(outage) => self.outage(outage)?,
            Action::PushImage(reference) => {
                let (name, digest) = reference
                    .split_once('@')
                    .map(|(n, d)| (n, d.to_string()))
                    .unwrap_or((reference.as_str(), String::new()));
                let (repo, tag) = name
                    .rsplit_once(':')
                    .with_context(|| format!("pushImage takes repo:tag, got {reference}"))?;
                self.kargo
                    .registry
                    .images
                    .entry(repo.to_string())
                    .or_default()
                    .push((tag.to_string(), digest));
                self.transcript
                    .say("registry", format!("{repo}:{tag} pushed"));
            }
            Action::StartObserver(args) => self.start_observer(args)?,
            Action::StopObserver => self.stop_observer()?,
            Action::AwaitObserversReady => self.await_observers_ready().await?,
            Action::AwaitPromotion(wanted) => self.await_promotion(wanted).await?,
            Action::AwaitObserverMetric(wanted) => {
                let target = match (wanted.at_least, wanted.increase) {
                    (Some(at_least), _) => at_least,
                    (None, Some(increase)) => self.observer_metric(&wanted.name) + increase,
                    (None, None) => bail!("awaitObserverMetric needs atLeast or increase"),
                };
                let what = format!("observer metric {} >= {target}", wanted.name);
                self.await_condition(&what, |ground| {
                    ground.observer_metric(&wanted.name) >= target
                })
                .await?;
            }
            Action::ExpectPromotions(wanted) => {
                let count = self
                    .kargo_objects("promotions")
                    .iter()
                    .filter(|p| {
                        p.pointer("/spec/stage").and_then(Value::as_str)
                            == Some(wanted.stage.as_str())
                    })
                    .count();
                if count != wanted.count {
                    bail!(
                        "Stage {} has {count} Promotions at this point, expected {}",
                        wanted.stage,
                        wanted.count
                    );
                }
                self.transcript.say(
                    "scenario",
                    format!("Stage {} has {count} Promotions, as expected", wanted.stage),
                );
            }
            Action::AwaitEvents(wanted) => self.await_events(wanted).await?,
        }
        Ok(())
    }

    /// A scripted outage: the next requests of one user answered with a server error.
    fn outage(&mut self, outage: &crate::scenario::Outage) -> Result<()> {
        let method = outage
            .method
            .as_deref()
            .map(|m| format!("{m} "))
            .unwrap_or_default();
        let (service, answer) = match outage.service {
            Service::Forge => ("forge", 502),
            Service::Api => ("kube", 500),
        };
        self.transcript.say(
            service,
            format!(
                "the next {} {method}requests of {}{} are answered {answer} (an outage)",
                outage.requests,
                outage.user,
                match (&outage.path, outage.after) {
                    (Some(path), after) => format!(" to *{path} after {after}"),
                    (None, 0) => String::new(),
                    (None, after) => format!(" after {after}"),
                }
            ),
        );
        let method = outage.method.as_deref();
        match outage.service {
            Service::Forge => self.forge.outage_on(
                &outage.user,
                method,
                outage.path.as_deref(),
                outage.after,
                outage.requests,
            ),
            Service::Api if outage.path.is_some() || outage.after > 0 => {
                anyhow::bail!("outage: path and after are for the forge only")
            }
            Service::Api => self
                .kube
                .faults()
                .outage(&outage.user, method, outage.requests),
        }
        Ok(())
    }

    /// Waits until every running observer answers /readyz with 200, and says so.
    async fn await_observers_ready(&mut self) -> Result<()> {
        // Readiness needs no tick (the API double answers on its own), and the line is
        // said the moment it holds: before the actors run what a ready observer set
        // off, so the transcript's order does not depend on timing.
        let count = self.observers.len();
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let ready = self.observers.iter().all(|(_, _, health)| {
                http_get(health, "/readyz")
                    .lines()
                    .next()
                    .is_some_and(|status| status.contains(" 200 "))
            });
            if ready {
                break;
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "timed out waiting for every observer's /readyz to answer 200; observer log:\n{}",
                    self.observer_log()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.transcript
            .say("observer", format!("{count} of {count} ready (/readyz)"));
        Ok(())
    }

    /// Ticks until the Stage reaches a Promotion of the phase wanted (or `count` of them).
    async fn await_promotion(&mut self, wanted: &crate::scenario::AwaitPromotion) -> Result<()> {
        self.await_condition(
            &format!(
                "Stage {} to reach a {} Promotion",
                wanted.stage, wanted.phase
            ),
            |ground| match wanted.count {
                Some(count) => {
                    ground
                        .kargo_objects("promotions")
                        .iter()
                        .filter(|p| {
                            p.pointer("/spec/stage").and_then(Value::as_str)
                                == Some(wanted.stage.as_str())
                        })
                        .filter(|p| {
                            p.pointer("/status/phase").and_then(Value::as_str)
                                == Some(wanted.phase.as_str())
                        })
                        .count()
                        >= count
                }
                None => {
                    ground
                        .kargo_objects("stages")
                        .iter()
                        .find(|s| {
                            s.pointer("/metadata/name").and_then(Value::as_str)
                                == Some(wanted.stage.as_str())
                        })
                        .and_then(|s| {
                            s.pointer("/status/lastPromotion/status/phase")
                                .and_then(Value::as_str)
                                .map(str::to_string)
                        })
                        .as_deref()
                        == Some(wanted.phase.as_str())
                }
            },
        )
        .await?;
        Ok(())
    }

    /// Ticks until the observer recorded the Events wanted; says which kinds they landed on.
    async fn await_events(&mut self, wanted: &crate::scenario::AwaitEvents) -> Result<()> {
        self.await_condition(
            &format!("{} {} Events", wanted.count, wanted.reason),
            |ground| {
                ground
                    .events(&wanted.reason)
                    .iter()
                    .map(|(_, count)| count)
                    .sum::<usize>()
                    >= wanted.count
            },
        )
        .await?;
        // Which Application an Event lands on, and whether the recorder folds a repeat
        // into one Event, depend on reconcile order: the transcript says how many.
        let kinds: std::collections::BTreeSet<String> = self
            .events(&wanted.reason)
            .iter()
            .filter_map(|(line, _)| {
                line.split(" on ")
                    .nth(1)
                    .and_then(|rest| rest.split(' ').next())
                    .map(str::to_string)
            })
            .collect();
        self.transcript.say(
            "events",
            format!(
                "{} {} recorded on {}",
                wanted.count,
                wanted.reason,
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            ),
        );
        Ok(())
    }

    /// Events (events.k8s.io) with a reason, as (`Type Reason on Kind ns/name: note`, how many
    /// times it was recorded: a repeated Event is one object with a series count).
    pub fn events(&self, reason: &str) -> Vec<(String, usize)> {
        let store = self.kube.store();
        let Some(resource) = store.resource("events.k8s.io", "v1", "events").cloned() else {
            return Vec::new();
        };
        store
            .list(&resource, "", &Selector::default(), &Selector::default())
            .into_iter()
            .filter(|e| e.get("reason").and_then(Value::as_str) == Some(reason))
            .map(|e| {
                let text = |p: &str| {
                    e.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                let count = e
                    .pointer("/series/count")
                    .and_then(Value::as_u64)
                    .unwrap_or(1)
                    .max(1) as usize;
                (
                    format!(
                        "{} {} on {} {}/{}: {}",
                        text("/type"),
                        text("/reason"),
                        text("/regarding/kind"),
                        text("/regarding/namespace"),
                        text("/regarding/name"),
                        text("/note")
                    ),
                    count,
                )
            })
            .collect()
    }

    /// Ticks the actors until `done` holds (bounded; the observer runs on its own meanwhile),
    /// checking the invariants after each tick, then lets them settle.
    pub async fn await_condition(
        &mut self,
        what: &str,
        done: impl Fn(&Ground) -> bool,
    ) -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let progress = self.tick().await;
            self.after_tick().await?;
            if done(self) {
                // Let the actors finish what the condition set off, unless something waits on
                // purpose (a promotion the scenario keeps running).
                return if self.kargo.busy() {
                    Ok(())
                } else {
                    self.settle().await
                };
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "timed out waiting for {what}; observer log:\n{}",
                    self.observer_log()
                );
            }
            if !progress {
                self.wait_for_outside(Duration::from_millis(500)).await;
            }
        }
    }

    /// What the products last changed: the API double's resourceVersion and the number of
    /// writes the forge double has been asked for.
    fn outside_mark(&self) -> (u64, usize) {
        (
            self.kube.store().resource_version(),
            self.forge.write_count(),
        )
    }

    /// After a tick in which the ground's own actors had nothing to do, waits (in real time,
    /// at most `at_most`) for a product to change something in a double before the next tick,
    /// so ticks count what happened rather than how long a product took to react; a product
    /// waiting on its own timer (a backoff, a resync) costs one tick per `at_most`.
    async fn wait_for_outside(&self, at_most: Duration) {
        let mark = self.outside_mark();
        let until = std::time::Instant::now() + at_most;
        while std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if self.outside_mark() != mark {
                return;
            }
        }
    }

    /// Plays the whole timeline, then checks the scenario's expectations.
    pub async fn play(&mut self) -> Result<()> {
        let timeline = self.scenario.timeline.clone();
        for action in &timeline {
            self.act(action).await?;
        }
        let failures = self.unmet_expectations();
        if !failures.is_empty() {
            bail!(
                "the scenario's expectations do not hold:\n  {}\nobserver log:\n{}",
                failures.join("\n  "),
                self.observer_log()
            );
        }
        Ok(())
    }
}
