//! Source sync: topic discovery (new matching topics, added partitions, deleted topics, a
//! changed cluster id), the copied topic configs, and the source high watermarks of partitions
//! without a fetcher (for `describe`). The source calls run on workers; `apply_*` take their
//! answers on the control thread.

use super::*;
use crate::control::lineage::chain;
use crate::control::mirror_def::{CompiledFilter, TopicFilter};
use crate::control::source_catalog::DescribedConfigs;
use crate::control::source_worker::JobKind;
use crate::control::state::Command;
use crate::control::topic_configs;
use crate::fetch::list_offsets::{Listed, OffsetQuery};

/// A periodic source sync's answer.
pub(super) struct SyncAnswer {
    mirror: MirrorName,
    answer: StartAnswer,
}

/// The source high watermarks of a mirror's idle partitions, listed at `at_ms`.
pub(super) struct IdleAnswer {
    mirror: MirrorName,
    at_ms: i64,
    listed: Result<Vec<(TopicPartition, Listed)>, Fault>,
}

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Applies each topic's stored configs to the data plane (at start), with its lineage.
    pub(super) fn apply_stored_configs(&mut self, name: &MirrorName) {
        let stored: Vec<(String, TopicConfigs)> = self.mirrors[name]
            .configs
            .iter()
            .map(|(t, c)| (t.clone(), c.clone()))
            .collect();
        for (topic, configs) in stored {
            match self.served_config(name, &topic, &configs) {
                Ok(config) => {
                    if let Err(why) = self.data.configure(&topic, &config) {
                        tracing::error!(mirror = %name, %topic, %why, "stored topic configs not applied");
                    }
                }
                // Stored configs were valid when copied; a newer kmirror may be stricter.
                Err(e) => {
                    tracing::error!(mirror = %name, %topic, "stored topic configs not applied: {e}");
                }
            }
        }
    }

    /// The log config of `topic` from its copied configs, with its lineage as the read-only
    /// `kmirror.lineage` our own downstream reads (`control::lineage::chain`).
    fn served_config(
        &self,
        name: &MirrorName,
        topic: &str,
        configs: &TopicConfigs,
    ) -> Result<LogConfig, topic_configs::TopicConfigError> {
        let mut config = topic_configs::apply(&LogConfig::default(), configs)?;
        if let Some(chain) = self.mirrors[name].lineages.get(topic) {
            config
                .topic_configs
                .insert(chain::LINEAGE_CONFIG.to_owned(), chain::encode(chain));
        }
        Ok(config)
    }

    /// A topic's lineage on `start`, a sync or a re-point: what is stored, updated with the
    /// source's chain (`kmirror.lineage` in its DescribeConfigs) and our own link.
    fn lineage_now(
        &self,
        name: &MirrorName,
        topic: &str,
        entries: &[topic_configs::SourceConfigEntry],
    ) -> Vec<chain::Link> {
        let e = &self.mirrors[name];
        let stored = e.lineages.get(topic).map_or(&[][..], Vec::as_slice);
        let upstream = match chain::upstream_of(entries) {
            Ok(u) => u,
            Err(why) => {
                // Nothing from it is taken: the stored chain (and our own link) stays.
                tracing::warn!(mirror = %name, %topic, %why, "source sync: lineage not read");
                Vec::new()
            }
        };
        chain::merged(
            stored,
            &upstream,
            e.record.source_cluster_id.as_deref(),
            e.epoch.0,
        )
    }

    /// The mirror's live topics (those with a partition not STOPPED and not failed as
    /// deleted): the ones whose configs are copied.
    pub(super) fn live_topics(&self, name: &MirrorName) -> Vec<String> {
        let Some(entry) = self.mirrors.get(name) else {
            return Vec::new();
        };
        let mut topics: Vec<String> = entry
            .partitions
            .iter()
            .filter(|(_, p)| {
                p.machine.state() != Some(StateName::Stopped)
                    && p.machine
                        .failure()
                        .is_none_or(|f| f.message != SOURCE_TOPIC_DELETED)
            })
            .map(|(tp, _)| tp.topic.clone())
            .collect();
        topics.dedup();
        topics
    }

    /// The source call of `start` and of the periodic sync: the source's topics, then the
    /// configs of the live topics and of those `this_start` (or the mirror's filter) matches,
    /// both within one deadline.
    pub(super) fn scan_ask(
        &self,
        name: &MirrorName,
        kind: JobKind,
        this_start: Option<TopicFilter>,
    ) -> SourceAsk<StartAnswer> {
        let def = self.mirrors[name].record.definition.clone();
        let filter = this_start.unwrap_or_else(|| def.topics.clone());
        let live = self.live_topics(name);
        let source = self.source.clone();
        SourceAsk::new(
            JobKey::new(name.as_str(), kind),
            self.source_timeout_ms,
            move |by| {
                let view = source.describe(&def, by);
                let configs = view.as_ref().ok().map(|v| {
                    let matcher = filter.compile().ok();
                    let mine = def.topics.compile().ok();
                    let wanted: Vec<&str> = v
                        .topics
                        .iter()
                        .filter(|t| {
                            live.contains(&t.name)
                                || (!t.internal
                                    && (matcher.as_ref().is_some_and(|f| f.matches(&t.name))
                                        || mine.as_ref().is_some_and(|f| f.matches(&t.name))))
                        })
                        .map(|t| t.name.as_str())
                        .collect();
                    source.topic_configs(&def, &wanted, by)
                });
                StartAnswer { view, configs }
            },
        )
    }

    /// Copies the source's configs of the mirror's live topics: the changed ones are
    /// persisted, then applied. A source that did not answer, or a topic it cannot describe,
    /// keeps the configs in force; a value kmirror cannot apply keeps them too and is reported
    /// in `describe`.
    pub(super) fn apply_topic_configs(
        &mut self,
        name: &MirrorName,
        described: Option<Result<DescribedConfigs, Fault>>,
    ) -> Result<(), ControlError> {
        let topics = self.live_topics(name);
        if topics.is_empty() {
            return Ok(());
        }
        let Some(described) = described else {
            return Ok(());
        };
        let def = self.entry_mut(name)?.record.definition.clone();
        let described = match described {
            Ok(d) => d,
            Err(fault) => {
                tracing::warn!(mirror = %name, %fault, "source sync: topic configs unavailable");
                return Ok(());
            }
        };
        for topic in topics {
            let entries = match described.get(&topic) {
                Some(Ok(entries)) => entries,
                Some(Err(why)) => {
                    tracing::warn!(mirror = %name, %topic, %why, "source sync: topic configs not described");
                    continue;
                }
                None => continue,
            };
            let copied = topic_configs::copied(&def, entries);
            let lineage = self.lineage_now(name, &topic, entries);
            let entry = self.entry_mut(name)?;
            let lineage_changed = entry.lineages.get(&topic) != Some(&lineage);
            if entry.configs.get(&topic) == Some(&copied) && !lineage_changed {
                continue;
            }
            if lineage_changed {
                tracing::info!(mirror = %name, %topic, lineage = %chain::show(&lineage), "source sync: topic lineage recorded");
                entry.lineages.insert(topic.clone(), lineage.clone());
            }
            let config = match self.served_config(name, &topic, &copied) {
                Ok(config) => config,
                Err(e) => {
                    let why = e.to_string();
                    let entry = self.entry_mut(name)?;
                    if entry.config_errors.get(&topic) != Some(&why) {
                        tracing::error!(mirror = %name, %topic, "source sync: {why}; the previous configs stay");
                    }
                    entry.config_errors.insert(topic.clone(), why);
                    if lineage_changed {
                        // The lineage is kept (and served) even so, with the configs in force.
                        let kept = entry.configs.entry(topic.clone()).or_default().clone();
                        self.persist_topic(name, &topic, &kept)?;
                        if let Ok(config) = self.served_config(name, &topic, &kept) {
                            let _ = self.data.configure(&topic, &config);
                        }
                    }
                    continue;
                }
            };
            let entry = self.entry_mut(name)?;
            entry.config_errors.remove(&topic);
            let configs_changed = entry.configs.get(&topic) != Some(&copied);
            entry.configs.insert(topic.clone(), copied.clone());
            self.persist_topic(name, &topic, &copied)?;
            if configs_changed {
                tracing::info!(mirror = %name, %topic, configs = ?copied, "source sync: topic configs copied");
            }
            if let Err(why) = self.data.configure(&topic, &config) {
                tracing::error!(mirror = %name, %topic, %why, "topic configs not applied");
                self.entry_mut(name)?.config_errors.insert(topic, why);
            }
        }
        Ok(())
    }

    /// Writes a topic's configs and lineage record (`__mirror_state` type 102).
    fn persist_topic(
        &mut self,
        name: &MirrorName,
        topic: &str,
        configs: &TopicConfigs,
    ) -> Result<(), ControlError> {
        let lineage = self.mirrors[name]
            .lineages
            .get(topic)
            .cloned()
            .unwrap_or_default();
        self.store.put(
            &StateKey::TopicConfigs(name.clone(), topic.to_owned()),
            &StateValue::TopicConfigs(crate::control::records::TopicConfigsValue {
                configs: configs.clone(),
                lineage,
            }),
        )?;
        Ok(())
    }

    /// How often `tick` runs the source sync (default 30 s).
    pub fn set_sync_interval_ms(&mut self, ms: u64) {
        self.sync_interval_ms = i64::try_from(ms).unwrap_or(i64::MAX);
        self.next_sync_ms = 0;
    }

    /// Source sync for every mirror, on the workers: new topics matching the patterns saved by
    /// `start` (and `mirror.topics.include`) are started, added partitions follow, partitions
    /// whose source topic is gone become FAILED non-retryable, and a changed cluster id fails
    /// the mirror (`apply_sync`, when the answer is back). A source that does not answer is
    /// skipped until it does: the fetchers report their own connection failures.
    pub fn sync(&mut self) {
        let names: Vec<MirrorName> = self
            .mirrors
            .iter()
            // Nothing to discover or check before the first start.
            .filter(|(_, e)| {
                !(e.partitions.is_empty() && e.record.definition.topics.include.is_empty())
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let ask = self.scan_ask(&name, JobKind::Sync, None);
            let key = ask.key.clone();
            let mirror = name.clone();
            self.run_periodic(key, move |by| {
                SourceResult::Sync(SyncAnswer {
                    mirror,
                    answer: (ask.job)(by),
                })
            });
        }
    }

    /// A source sync's answer, applied.
    pub(super) fn apply_sync(&mut self, a: SyncAnswer) -> Result<(), ControlError> {
        if !self.mirrors.contains_key(&a.mirror) {
            return Ok(());
        }
        match self.sync_mirror(&a.mirror, a.answer) {
            Ok(()) => Ok(()),
            Err(
                e @ (ControlError::Source { .. }
                | ControlError::SourceTimeout { .. }
                | ControlError::Refused { .. }
                | ControlError::ClusterChanged { .. }),
            ) => {
                tracing::warn!(mirror = %a.mirror, "source sync: {e}");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn sync_mirror(
        &mut self,
        name: &MirrorName,
        answer: StartAnswer,
    ) -> Result<(), ControlError> {
        let filter = self.mirrors[name].record.definition.topics.compile()?;
        let view = self.check_view(name, answer.view)?;
        // Deleted (or deleted and re-created: a new topic id) source topics.
        let gone: Vec<TopicPartition> = self.mirrors[name]
            .partitions
            .iter()
            .filter(|(tp, p)| {
                let already = p
                    .machine
                    .failure()
                    .is_some_and(|f| f.message == SOURCE_TOPIC_DELETED);
                p.machine.state() != Some(StateName::Stopped)
                    && !already
                    && !view.topics.iter().any(|t| {
                        t.name == tp.topic && (p.topic_id.is_nil() || t.topic_id == p.topic_id)
                    })
            })
            .map(|(tp, _)| tp.clone())
            .collect();
        // The partitions that left and the ones that appeared are written with one append,
        // and their reconcile with another, as a lifecycle command's are: a topic grown by
        // thousands of partitions was one `__mirror_state` write and sync per partition (twice:
        // the new state, then the alignment), 10,004 writes in 11 s for 5,000 new partitions,
        // with the control thread held all along.
        let started = self.batched(|c| c.apply_topic_changes(name, &filter, &view, gone))?;
        self.apply_topic_configs(name, answer.configs)?;
        if started {
            self.batched(|c| c.reconcile(name))?;
        }
        Ok(())
    }

    /// Fails the partitions whose source topic is gone and starts the ones that are new;
    /// whether any started.
    fn apply_topic_changes(
        &mut self,
        name: &MirrorName,
        filter: &CompiledFilter,
        view: &SourceView,
        gone: Vec<TopicPartition>,
    ) -> Result<bool, ControlError> {
        for tp in gone {
            if self.mirrors[name].partitions[&tp].machine.wants_fetcher() {
                let _ = self.data.remove(&tp);
            }
            self.apply_event(
                name,
                &tp,
                Event::Failed {
                    message: SOURCE_TOPIC_DELETED.into(),
                    retryable: false,
                    now_ms: now_ms(),
                },
            )?;
        }
        let mut started = false;
        for t in view
            .topics
            .iter()
            .filter(|t| !t.internal && filter.matches(&t.name))
        {
            if self.active_elsewhere(name, &t.name).is_some() {
                continue;
            }
            for partition in 0..t.partitions {
                let tp = TopicPartition::new(t.name.clone(), partition);
                let entry = self.entry_mut(name)?;
                if entry.partitions.contains_key(&tp) {
                    continue;
                }
                let mut machine = PartitionMachine::new();
                machine
                    .command(Command::Start)
                    .map_err(|source| ControlError::State {
                        partition: tp.clone(),
                        source,
                    })?;
                entry.partitions.insert(
                    tp.clone(),
                    PartEntry {
                        topic_id: t.topic_id,
                        machine,
                        last: None,
                    },
                );
                tracing::info!(mirror = %name, partition = %tp, "source sync: new partition");
                self.persist(name, &tp)?;
                started = true;
            }
        }
        Ok(started)
    }

    /// Asks the source for the high watermarks of a mirror's partitions that have no fetcher
    /// (paused, failed: the shards only know them while fetching), on a worker. `describe`
    /// calls it and shows what the last answer said, with its age; it never waits.
    pub(super) fn refresh_idle_offsets(&self, name: &MirrorName) {
        let e = &self.mirrors[name];
        let idle: Vec<TopicPartition> = e
            .partitions
            .iter()
            .filter(|(_, p)| {
                !p.machine.wants_fetcher()
                    && !matches!(p.machine.state(), None | Some(StateName::Stopped))
            })
            .map(|(tp, _)| tp.clone())
            .collect();
        if idle.is_empty() {
            return;
        }
        let def = e.record.definition.clone();
        let source = self.source.clone();
        let mirror = name.clone();
        self.run_periodic(
            JobKey::new(name.as_str(), JobKind::IdleOffsets),
            move |by| {
                let listed = source.list_offsets(&def, &idle, OffsetQuery::Latest, by);
                SourceResult::IdleOffsets(IdleAnswer {
                    mirror,
                    at_ms: now_ms(),
                    listed,
                })
            },
        );
    }

    pub(super) fn apply_idle_offsets(&mut self, a: IdleAnswer) {
        match a.listed {
            Ok(listed) => {
                for (tp, l) in listed {
                    if let Listed::At(o) = l {
                        self.idle_offsets.insert(tp, (o.0, a.at_ms));
                    }
                }
            }
            Err(fault) => {
                tracing::warn!(mirror = %a.mirror, %fault, "describe: source offsets unavailable");
            }
        }
    }
}
