//! Operator commands: `create`, `start`, `pause`/`resume`/`stop`, `stop --promote`, `delete`,
//! and `check_source`. A command that needs the source is split in two: `*_ask` validates,
//! changes nothing and hands out the source call (`SourceAsk`), `*_finish` applies the answer.
//! The admin API runs the ask on a source worker while the controller is free; the one-call
//! forms (`create`, `start`, ...) run it on the caller's thread.

use std::collections::BTreeMap;

use super::*;
use crate::control::group_sync::{GroupSyncError, SourceGroup};
use crate::control::mirror_def::{split_patterns, TopicFilter};
use crate::control::source_catalog::DescribedConfigs;
use crate::control::source_worker::JobKind;
use crate::control::state::Command;
use crate::fetch::list_offsets::{Listed, OffsetQuery};

/// What `start` asked for, between its ask and its finish.
#[derive(Debug, Clone)]
pub struct StartPlan {
    name: MirrorName,
    include: Vec<String>,
    extra_exclude: Vec<String>,
    /// This start's patterns with the mirror's and the extra excludes.
    this_start: TopicFilter,
    /// Local logs holding data that this start may take into the mirror (left by an earlier
    /// mirror): they join only if the source holds their history (`control::lineage`).
    adopt: Vec<(TopicPartition, crate::control::lineage::LocalTail)>,
}

/// `start`'s source answer: the scan, and the source's tails of the logs it may adopt.
pub struct StartReply {
    pub scan: StartAnswer,
    pub history:
        Option<Result<BTreeMap<TopicPartition, crate::control::lineage::SourceTail>, Fault>>,
}

/// The source's answer for `start` (and the periodic sync): its topics, and the configs of
/// the topics the mirror may mirror (none when the metadata did not come).
pub struct StartAnswer {
    pub view: Result<SourceView, Fault>,
    pub configs: Option<Result<DescribedConfigs, Fault>>,
}

/// What `stop --promote` checks: the partitions not yet STOPPED.
#[derive(Debug, Clone)]
pub struct PromotePlan {
    name: MirrorName,
    live: Vec<TopicPartition>,
}

/// Source listing of a promote.
pub type Listing = Result<Vec<(TopicPartition, Listed)>, Fault>;

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// `create`, first half: validates the definition; the ask reads the source's metadata.
    pub fn create_ask(
        &self,
        name: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<(MirrorDefinition, SourceAsk<Result<SourceView, Fault>>), ControlError> {
        let name = MirrorName::new(name)?;
        if self.mirrors.contains_key(&name) {
            return Err(ControlError::MirrorExists(name.to_string()));
        }
        let definition = MirrorDefinition::from_properties(name.clone(), properties)?;
        let source = self.source.clone();
        let def = definition.clone();
        let ask = SourceAsk::new(
            JobKey::new(name.as_str(), JobKind::Describe),
            self.source_timeout_ms,
            move |by| source.describe(&def, by),
        );
        Ok((definition, ask))
    }

    /// `create`, second half: the source answered, the mirror is stored.
    pub fn create_finish(
        &mut self,
        definition: MirrorDefinition,
        view: Result<SourceView, Fault>,
    ) -> Result<MirrorSummary, ControlError> {
        let name = definition.name.clone();
        // Another create of the same name may have finished while the source was asked.
        if self.mirrors.contains_key(&name) {
            return Err(ControlError::MirrorExists(name.to_string()));
        }
        let view = view.map_err(|fault| self.source_error(&name, fault))?;
        let record = MirrorRecord {
            definition,
            source_cluster_id: view.cluster_id,
            lineage: Vec::new(),
        };
        self.store.put(
            &StateKey::Mirror(name.clone()),
            &StateValue::Mirror(Box::new(record.clone())),
        )?;
        self.mirrors.insert(
            name.clone(),
            MirrorEntry {
                record,
                epoch: MirrorEpoch(0),
                partitions: BTreeMap::new(),
                configs: BTreeMap::new(),
                config_errors: BTreeMap::new(),
                lineages: BTreeMap::new(),
            },
        );
        self.bump_epoch(&name)?;
        Ok(self.summary(&name))
    }

    /// `create`: validates the definition, checks the source answers, stores the mirror.
    pub fn create(
        &mut self,
        name: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<MirrorSummary, ControlError> {
        let (definition, ask) = self.create_ask(name, properties)?;
        let view = ask.run_here();
        self.create_finish(definition, view)
    }

    /// `check_source`, first half: the ask connects with the mirror's own settings.
    pub fn check_source_ask(
        &self,
        name: &str,
    ) -> Result<(MirrorDefinition, SourceAsk<Result<SourceView, Fault>>), ControlError> {
        let def = self.entry(name)?.1.record.definition.clone();
        let source = self.source.clone();
        let asked = def.clone();
        let ask = SourceAsk::new(
            JobKey::new(def.name.as_str(), JobKind::Describe),
            self.source_timeout_ms,
            move |by| source.describe(&asked, by),
        );
        Ok((def, ask))
    }

    /// The report of a source check (needs no controller: nothing changes).
    pub fn source_check(def: &MirrorDefinition, outcome: Result<SourceView, Fault>) -> SourceCheck {
        let source = &def.source;
        let (cluster_id, topics, error, retryable) = match outcome {
            Ok(view) => (view.cluster_id, Some(view.topics.len()), None, true),
            Err(fault) => (None, None, Some(fault.message), fault.retryable),
        };
        SourceCheck {
            mirror: def.name.to_string(),
            bootstrap_servers: source.bootstrap_servers.join(","),
            security_protocol: source.security_protocol.to_string(),
            sasl_mechanism: source.sasl.as_ref().map(|c| c.mechanism.to_string()),
            sasl_username: source.sasl.as_ref().map(|c| c.username.clone()),
            cluster_id,
            topics,
            error,
            retryable,
        }
    }

    /// Connects to a mirror's source with the mirror's own settings, for `kmirror doctor`.
    /// A check only reports: it never changes the mirror's state, and the credentials stay in
    /// this process.
    pub fn check_source(&mut self, name: &str) -> Result<SourceCheck, ControlError> {
        let (def, ask) = self.check_source_ask(name)?;
        Ok(Self::source_check(&def, ask.run_here()))
    }

    /// The source's answer, failing the whole mirror when its credentials were refused or its
    /// cluster id changed.
    pub(super) fn check_view(
        &mut self,
        name: &MirrorName,
        answer: Result<SourceView, Fault>,
    ) -> Result<SourceView, ControlError> {
        let view = match answer {
            Ok(v) => v,
            Err(fault) => {
                if !fault.retryable {
                    self.fail_mirror(name, &fault.message)?;
                }
                return Err(self.source_error(name, fault));
            }
        };
        let stored = self.entry_mut(name)?.record.source_cluster_id.clone();
        if let (Some(stored), Some(seen)) = (stored, view.cluster_id.clone()) {
            if stored != seen {
                let message = format!("source cluster id changed from {stored} to {seen}");
                let tps: Vec<TopicPartition> =
                    self.entry_mut(name)?.partitions.keys().cloned().collect();
                for tp in tps {
                    let _ = self.data.remove(&tp);
                    self.apply_event(
                        name,
                        &tp,
                        Event::Failed {
                            message: message.clone(),
                            retryable: false,
                            now_ms: now_ms(),
                        },
                    )?;
                }
                return Err(ControlError::ClusterChanged {
                    mirror: name.to_string(),
                    stored,
                    seen,
                });
            }
        }
        Ok(view)
    }

    /// Fails every partition of a mirror that is not STOPPED for good (a refused login, a changed
    /// cluster id), removing its fetcher.
    pub(super) fn fail_mirror(
        &mut self,
        name: &MirrorName,
        message: &str,
    ) -> Result<(), ControlError> {
        let tps: Vec<TopicPartition> = self.entry_mut(name)?.partitions.keys().cloned().collect();
        for tp in tps {
            let p = &self.mirrors[name].partitions[&tp];
            let already = p
                .machine
                .failure()
                .is_some_and(|f| f.message == message && f.retry.as_kip_value() == -1);
            if already || p.machine.state() == Some(StateName::Stopped) {
                continue;
            }
            if p.machine.wants_fetcher() {
                let _ = self.data.remove(&tp);
            }
            self.apply_event(
                name,
                &tp,
                Event::Failed {
                    message: message.to_owned(),
                    retryable: false,
                    now_ms: now_ms(),
                },
            )?;
        }
        Ok(())
    }

    /// `start`, first half: checks the patterns; the ask reads the source's topics and the
    /// configs of those this start (or the mirror) mirrors.
    pub fn start_ask(
        &self,
        mirror: &str,
        topics: &str,
        exclude: Option<&str>,
    ) -> Result<(StartPlan, SourceAsk<StartReply>), ControlError> {
        let name = self.entry(mirror)?.0.clone();
        self.failback_check_start(&name)?;
        let include = split_patterns(topics);
        if include.is_empty() {
            return Err(ControlError::NoTopics);
        }
        let filter = &self.mirrors[&name].record.definition.topics;
        let extra_exclude = exclude.map(split_patterns).unwrap_or_default();
        let this_start = TopicFilter::new(
            include.clone(),
            filter
                .exclude
                .iter()
                .cloned()
                .chain(extra_exclude.clone())
                .collect(),
        )?;
        let scan = self.scan_ask(&name, JobKind::Describe, Some(this_start.clone()));
        let adopt = self.adoptable(&name, &this_start)?;
        let source = self.source.clone();
        let def = self.mirrors[&name].record.definition.clone();
        let asked = adopt.clone();
        let ask = SourceAsk::new(scan.key.clone(), scan.timeout_ms, move |by| {
            let scan = (scan.job)(by);
            let history =
                (!asked.is_empty() && scan.view.is_ok()).then(|| source.history(&def, &asked, by));
            StartReply { scan, history }
        });
        Ok((
            StartPlan {
                name,
                include,
                extra_exclude,
                this_start,
                adopt,
            },
            ask,
        ))
    }

    /// `start`, second half: saves the patterns for auto-discovery and starts every matching
    /// partition that is new, STOPPED or FAILED.
    pub fn start_finish(
        &mut self,
        plan: StartPlan,
        reply: StartReply,
    ) -> Result<CommandReport, ControlError> {
        let StartPlan {
            name,
            include,
            extra_exclude,
            this_start,
            adopt,
        } = plan;
        let StartReply {
            scan: answer,
            history,
        } = reply;
        self.entry_mut(&name)?;
        let this_start = this_start.compile()?;
        let view = self.check_view(&name, answer.view)?;
        self.check_adopted(&name, &view, &adopt, history)?;
        let mut filter = self.mirrors[&name].record.definition.topics.clone();
        for p in include {
            if !filter.include.contains(&p) {
                filter.include.push(p);
            }
        }
        for p in extra_exclude {
            if !filter.exclude.contains(&p) {
                filter.exclude.push(p);
            }
        }
        let entry = self.entry_mut(&name)?;
        entry.record.definition.topics = filter;
        let record = entry.record.clone();
        self.store.put(
            &StateKey::Mirror(name.clone()),
            &StateValue::Mirror(Box::new(record)),
        )?;
        let mut report = CommandReport {
            mirror: name.to_string(),
            changed: Vec::new(),
            unchanged: Vec::new(),
            group_sync: None,
        };
        let matching: Vec<&SourceTopic> = view
            .topics
            .iter()
            .filter(|t| !t.internal && this_start.matches(&t.name))
            .collect();
        for t in &matching {
            if let Some(other) = self.active_elsewhere(&name, &t.name) {
                return Err(ControlError::TopicInOtherMirror {
                    topic: t.name.clone(),
                    other,
                });
            }
        }
        // One `__mirror_state` write for every partition's transition.
        self.batched(|c| {
            for t in matching {
                for partition in 0..t.partitions {
                    let tp = TopicPartition::new(t.name.clone(), partition);
                    let entry = c.entry_mut(&name)?;
                    let p = entry.partitions.entry(tp.clone()).or_insert(PartEntry {
                        topic_id: t.topic_id,
                        machine: PartitionMachine::new(),
                        last: None,
                    });
                    p.topic_id = t.topic_id;
                    match p.machine.command(Command::Start) {
                        Ok(Outcome::Moved(..)) => report.changed.push(tp.to_string()),
                        Ok(Outcome::Unchanged) => report.unchanged.push(tp.to_string()),
                        Err(source) => {
                            return Err(ControlError::State {
                                partition: tp,
                                source,
                            })
                        }
                    }
                    c.persist(&name, &tp)?;
                }
            }
            Ok(())
        })?;
        self.apply_topic_configs(&name, answer.configs)?;
        self.batched(|c| c.reconcile(&name))?;
        Ok(report)
    }

    /// `start`: matches the patterns against the source's topics, saves them for
    /// auto-discovery, and starts every matching partition that is new, STOPPED or FAILED.
    pub fn start(
        &mut self,
        mirror: &str,
        topics: &str,
        exclude: Option<&str>,
    ) -> Result<CommandReport, ControlError> {
        let (plan, ask) = self.start_ask(mirror, topics, exclude)?;
        let answer = ask.run_here();
        self.start_finish(plan, answer)
    }

    /// Local logs with data whose topic this start matches and which this mirror does not
    /// hold yet: what it would take over from an earlier mirror.
    fn adoptable(
        &self,
        name: &MirrorName,
        this_start: &TopicFilter,
    ) -> Result<Vec<(TopicPartition, crate::control::lineage::LocalTail)>, ControlError> {
        let matcher = this_start.compile()?;
        let mine = &self.mirrors[name].partitions;
        let mut out = Vec::new();
        for tp in self.data.local_partitions() {
            if mine.contains_key(&tp) || !matcher.matches(&tp.topic) {
                continue;
            }
            match self.data.local_tail(&tp) {
                Some(Ok(t)) if t.last_batch.is_some() => out.push((tp, t)),
                Some(Err(why)) => {
                    return Err(ControlError::HistoryRefused {
                        action: "start",
                        mirror: name.to_string(),
                        partitions: format!("{tp}: {why}"),
                    })
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Every adopted log the source's topics include must hold a history the source holds;
    /// otherwise the start is refused with the reasons before anything changes.
    fn check_adopted(
        &self,
        name: &MirrorName,
        view: &SourceView,
        adopt: &[(TopicPartition, crate::control::lineage::LocalTail)],
        history: Option<
            Result<BTreeMap<TopicPartition, crate::control::lineage::SourceTail>, Fault>,
        >,
    ) -> Result<(), ControlError> {
        let adopted: Vec<&(TopicPartition, crate::control::lineage::LocalTail)> = adopt
            .iter()
            .filter(|(tp, _)| {
                view.topics
                    .iter()
                    .any(|t| t.name == tp.topic && !t.internal && tp.partition < t.partitions)
                    // Another mirror fetching it: `start` refuses that on its own.
                    && self.active_elsewhere(name, &tp.topic).is_none()
            })
            .collect();
        if adopted.is_empty() {
            return Ok(());
        }
        let history = match history {
            Some(Ok(h)) => h,
            Some(Err(fault)) => return Err(self.source_error(name, fault)),
            None => BTreeMap::new(),
        };
        let refused: Vec<String> = adopted
            .iter()
            .filter_map(|(tp, local)| {
                let theirs = history.get(tp).cloned().unwrap_or_else(|| {
                    crate::control::lineage::SourceTail {
                        error: Some("the source did not answer for it".into()),
                        ..Default::default()
                    }
                });
                crate::control::lineage::agree(local, &theirs)
                    .err()
                    .map(|why| format!("{tp} (local data from an earlier mirror): {why}"))
            })
            .collect();
        if refused.is_empty() {
            Ok(())
        } else {
            Err(ControlError::HistoryRefused {
                action: "start",
                mirror: name.to_string(),
                partitions: refused.join("; "),
            })
        }
    }

    pub(super) fn active_elsewhere(&self, mirror: &MirrorName, topic: &str) -> Option<String> {
        self.mirrors.iter().find_map(|(n, e)| {
            (n != mirror
                && e.partitions.iter().any(|(tp, p)| {
                    tp.topic == topic && p.machine.state() != Some(StateName::Stopped)
                }))
            .then(|| n.to_string())
        })
    }

    /// `pause`, `resume`, `stop`: patterns are matched against the mirror's local topics.
    /// The mirror's partitions whose topic matches one of the comma-separated `topics` regexes.
    pub(super) fn matching_partitions(
        &self,
        mirror: &str,
        topics: &str,
    ) -> Result<(MirrorName, Vec<TopicPartition>), ControlError> {
        let name = self.entry(mirror)?.0.clone();
        let patterns = split_patterns(topics);
        if patterns.is_empty() {
            return Err(ControlError::NoTopics);
        }
        let filter = TopicFilter::new(patterns, Vec::new())?.compile()?;
        let tps: Vec<TopicPartition> = self.mirrors[&name]
            .partitions
            .keys()
            .filter(|tp| filter.matches(&tp.topic))
            .cloned()
            .collect();
        if tps.is_empty() {
            return Err(ControlError::NoMatch {
                mirror: name.to_string(),
                patterns: topics.to_owned(),
            });
        }
        Ok((name, tps))
    }

    /// `stop --promote`, first half: the partitions not yet STOPPED, and the ask that lists
    /// their source high watermarks now (none when every partition is STOPPED already).
    #[allow(clippy::type_complexity)]
    pub fn promote_ask(
        &self,
        mirror: &str,
        topics: &str,
    ) -> Result<(PromotePlan, Option<SourceAsk<Listing>>), ControlError> {
        let (name, tps) = self.matching_partitions(mirror, topics)?;
        let live: Vec<TopicPartition> = tps
            .into_iter()
            .filter(|tp| {
                self.mirrors[&name].partitions[tp].machine.state() != Some(StateName::Stopped)
            })
            .collect();
        let ask = (!live.is_empty()).then(|| {
            let def = self.mirrors[&name].record.definition.clone();
            let source = self.source.clone();
            let asked = live.clone();
            SourceAsk::new(
                JobKey::new(name.as_str(), JobKind::Promote),
                self.source_timeout_ms,
                move |by| source.list_offsets(&def, &asked, OffsetQuery::Latest, by),
            )
        });
        Ok((PromotePlan { name, live }, ask))
    }

    /// `stop --promote`, the check: every live partition holds what the source listed, else
    /// `Lagging` (nothing changed; the caller asks again until its own timeout). A source that
    /// did not answer in time is `SourceTimeout`: a frozen source cannot confirm anything.
    pub fn promote_check(
        &self,
        plan: &PromotePlan,
        listed: Option<Listing>,
    ) -> Result<(), ControlError> {
        let name = &plan.name;
        let lagging = |behind: Vec<String>| ControlError::Lagging {
            mirror: name.to_string(),
            partitions: behind.join(", "),
        };
        let Some(listed) = listed else {
            return Ok(());
        };
        let listed = match listed {
            Ok(l) => l,
            Err(f) if f.timed_out => return Err(self.source_error(name, f)),
            Err(f) => return Err(lagging(vec![format!("source offsets unavailable: {f}")])),
        };
        let mut behind = Vec::new();
        for (tp, l) in listed {
            if !plan.live.contains(&tp) {
                continue;
            }
            let end = self.data.progress(&tp).local_log_end;
            match (l, end) {
                (Listed::At(hw), Some(end)) if end >= hw.0 => {}
                (Listed::At(hw), end) => behind.push(format!(
                    "{tp} holds {} of {}",
                    end.map_or("nothing".to_owned(), |e| e.to_string()),
                    hw.0
                )),
                (Listed::NoneAfter, _) => behind.push(format!("{tp}: no source offset")),
                (Listed::Error(code), _) => behind.push(format!("{tp}: source error code {code}")),
            }
        }
        if !behind.is_empty() {
            return Err(lagging(behind));
        }
        Ok(())
    }

    /// `stop --promote`, the planned failover: stops the partitions only when each one already
    /// holds everything the source has, by a ListOffsets asked now (not the high watermark of
    /// the last fetch). Otherwise it answers `Lagging`, changes nothing, and the caller asks
    /// again until its own timeout. Producers on the source are expected to be stopped first;
    /// what they write between this check and the fetchers' removal is still mirrored if it
    /// arrives first, and the recorded end offset says exactly what kmirror holds.
    pub fn promote(&mut self, mirror: &str, topics: &str) -> Result<CommandReport, ControlError> {
        let (plan, ask) = self.promote_ask(mirror, topics)?;
        let listed = ask.map(SourceAsk::run_here);
        self.promote_check(&plan, listed)?;
        self.command(mirror, topics, Command::Stop)
    }

    /// `pause`, `resume`, `stop`, first half: every matching partition takes the command
    /// (persisted). A `stop` that moved partitions returns the last group sync still to run
    /// (`FinalSync`): its partitions stay STOPPING, fetching, until `command_finish`; without
    /// one, the failover ran already.
    pub fn command_begin(
        &mut self,
        mirror: &str,
        topics: &str,
        command: Command,
    ) -> Result<(CommandReport, Option<FinalSync>), ControlError> {
        let (name, tps) = self.matching_partitions(mirror, topics)?;
        // All or nothing: check every partition accepts the command before changing any.
        for tp in &tps {
            let mut probe = self.mirrors[&name].partitions[tp].machine.clone();
            probe
                .command(command)
                .map_err(|source| ControlError::State {
                    partition: tp.clone(),
                    source,
                })?;
        }
        let mut report = CommandReport {
            mirror: name.to_string(),
            changed: Vec::new(),
            unchanged: Vec::new(),
            group_sync: None,
        };
        // One `__mirror_state` write for every partition's transition.
        self.batched(|c| {
            for tp in tps {
                let p = c
                    .entry_mut(&name)?
                    .partitions
                    .get_mut(&tp)
                    .expect("listed above");
                let outcome = p
                    .machine
                    .command(command)
                    .map_err(|source| ControlError::State {
                        partition: tp.clone(),
                        source,
                    })?;
                match outcome {
                    Outcome::Moved(..) => report.changed.push(tp.to_string()),
                    Outcome::Unchanged => report.unchanged.push(tp.to_string()),
                }
                c.persist(&name, &tp)?;
            }
            Ok(())
        })?;
        let mut last = None;
        if command == Command::Stop && !report.changed.is_empty() {
            // Failover: the consumers about to move here get the source's latest commits.
            match self.final_sync_ask(&name) {
                Ok(f) => last = Some(f),
                Err(why) => report.group_sync = Some(why),
            }
        }
        if last.is_none() {
            self.batched(|c| c.reconcile(&name))?;
        }
        Ok((report, last))
    }

    /// `stop`, second half: the last group sync's answer (`None`: the source did not answer
    /// within the final group-sync timeout) is applied or reported as skipped, then the
    /// partitions fail over.
    pub fn command_finish(
        &mut self,
        mut report: CommandReport,
        last: FinalSync,
        answer: Option<Result<Vec<SourceGroup>, GroupSyncError>>,
    ) -> Result<CommandReport, ControlError> {
        let name = last.name.clone();
        report.group_sync = Some(self.finish_final_sync(last, answer));
        self.stop_holds.remove(&name);
        if self.mirrors.contains_key(&name) {
            self.batched(|c| c.reconcile(&name))?;
        }
        Ok(report)
    }

    pub fn command(
        &mut self,
        mirror: &str,
        topics: &str,
        command: Command,
    ) -> Result<CommandReport, ControlError> {
        let (report, last) = self.command_begin(mirror, topics, command)?;
        match last {
            None => Ok(report),
            Some(mut last) => {
                let answer = last.ask.take().map(SourceAsk::run_here);
                self.command_finish(report, last, answer)
            }
        }
    }

    /// `delete`: only when every partition is STOPPED; writes tombstones for all its records.
    pub fn delete(&mut self, mirror: &str) -> Result<(), ControlError> {
        let name = self.entry(mirror)?.0.clone();
        let busy: Vec<String> = self.mirrors[&name]
            .partitions
            .iter()
            .filter(|(_, p)| p.machine.state() != Some(StateName::Stopped))
            .map(|(tp, p)| {
                format!(
                    "{tp} ({})",
                    p.machine.state().map_or("NONE", |s| s.as_str())
                )
            })
            .collect();
        if !busy.is_empty() {
            return Err(ControlError::NotEmpty {
                mirror: name.to_string(),
                partitions: busy.join(", "),
            });
        }
        // Its synced ACLs stay in force (as kmirror's own) before its records go.
        self.forget_synced_acls(&name)?;
        let entry = self.mirrors.remove(&name).expect("found above");
        for tp in entry.partitions.keys() {
            self.store
                .delete(&StateKey::Partition(name.clone(), tp.clone()))?;
            self.store
                .delete(&StateKey::LastMirrorEpoch(name.clone(), tp.clone()))?;
        }
        for topic in entry.configs.keys() {
            self.store
                .delete(&StateKey::TopicConfigs(name.clone(), topic.clone()))?;
        }
        self.store.delete(&StateKey::MirrorEpoch(name.clone()))?;
        self.store.delete(&StateKey::Mirror(name))?;
        Ok(())
    }
}
