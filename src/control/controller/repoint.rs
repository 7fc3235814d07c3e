//! `repoint`: a mirror follows a new source (new connection properties) without copying
//! again what it holds, when the new source's history contains ours (`control::lineage`).
//!
//! The ask reads our tail of every partition that is not STOPPED (from the published views)
//! and asks the new source for its metadata and its tails; the finish stops the fetchers,
//! checks each partition's agreement against the log end the fetcher stopped at, and either
//! changes nothing (any refusal, or a log that moved past what was checked) or writes the new
//! definition with the old source appended to the lineage and a new mirror epoch, then lets
//! every fetching (or FAILED) partition resume from its local log end on the new source.

use super::*;
use crate::control::lineage::{agree, chain, Hop, LocalTail, SourceTail};
use crate::control::source_worker::JobKind;
use crate::limits::LINEAGE_HOPS_MAX;

/// What `repoint` checks, between its ask and its finish.
#[derive(Debug, Clone)]
pub struct RepointPlan {
    name: MirrorName,
    definition: MirrorDefinition,
    tails: Vec<(TopicPartition, LocalTail)>,
}

/// The new source's answer: its metadata, its tail of each partition checked, and its
/// configs of the mirror's topics (their `kmirror.lineage`, and what the mirror copies).
pub struct RepointAnswer {
    pub view: Result<SourceView, Fault>,
    pub history: Result<BTreeMap<TopicPartition, SourceTail>, Fault>,
    pub configs: Option<Result<crate::control::source_catalog::DescribedConfigs, Fault>>,
}

/// What a re-point did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RepointReport {
    pub mirror: String,
    pub source_cluster_id: Option<String>,
    pub source_bootstrap_servers: String,
    pub mirror_epoch: i32,
    /// Each partition checked, with the offset it resumes from (its local log end).
    pub partitions: Vec<(String, i64)>,
    pub lineage: Vec<Hop>,
    /// STOPPED partitions, left as they are, with why (`control::lineage`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<(String, String)>,
    /// Each topic's chain after the re-point (`control::lineage::chain`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topic_lineage: BTreeMap<String, Vec<crate::control::lineage::chain::Link>>,
}

/// Why a re-point leaves a STOPPED partition alone.
pub const STOPPED_NOT_REPOINTED: &str = "STOPPED (failed over): it takes local writes and is no longer a copy of any source; re-pointing it would be a new mirror over them (failback sends them back), so it stays as it is";

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// `repoint`, first half: validates the new properties and reads our tails; the ask
    /// reads the new source's metadata and its tails of the same partitions.
    pub fn repoint_ask(
        &self,
        mirror: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<(RepointPlan, SourceAsk<RepointAnswer>), ControlError> {
        let (name, entry) = self.entry(mirror)?;
        let name = name.clone();
        let mut definition = MirrorDefinition::from_properties(name.clone(), properties)?;
        // The topics stay those the mirror's `start`s chose.
        definition.topics = entry.record.definition.topics.clone();
        let mut tails = Vec::new();
        let mut unreadable = Vec::new();
        for (tp, p) in &entry.partitions {
            if p.machine.state() == Some(StateName::Stopped) {
                continue;
            }
            match self.data.local_tail(tp) {
                Some(Ok(t)) => tails.push((tp.clone(), t)),
                Some(Err(why)) => unreadable.push(format!("{tp}: {why}")),
                // No local log yet: nothing to contradict, it starts on the new source.
                None => {}
            }
        }
        if !unreadable.is_empty() {
            return Err(ControlError::HistoryRefused {
                action: "repoint",
                mirror: name.to_string(),
                partitions: unreadable.join("; "),
            });
        }
        let source = self.source.clone();
        let def = definition.clone();
        let asked = tails.clone();
        let mut topics: Vec<String> = entry.partitions.keys().map(|tp| tp.topic.clone()).collect();
        topics.dedup();
        let ask = SourceAsk::new(
            JobKey::new(name.as_str(), JobKind::Describe),
            self.source_timeout_ms,
            move |by| {
                let view = source.describe(&def, by);
                let history = match &view {
                    Ok(_) => source.history(&def, &asked, by),
                    Err(f) => Err(f.clone()),
                };
                let configs = view.as_ref().ok().map(|_| {
                    let wanted: Vec<&str> = topics.iter().map(String::as_str).collect();
                    source.topic_configs(&def, &wanted, by)
                });
                RepointAnswer {
                    view,
                    history,
                    configs,
                }
            },
        );
        Ok((
            RepointPlan {
                name,
                definition,
                tails,
            },
            ask,
        ))
    }

    /// `repoint`, second half: all partitions agree and the mirror moves, or nothing changes.
    pub fn repoint_finish(
        &mut self,
        plan: RepointPlan,
        answer: RepointAnswer,
    ) -> Result<RepointReport, ControlError> {
        let RepointPlan {
            name,
            definition,
            tails,
        } = plan;
        self.entry_mut(&name)?;
        let view = answer
            .view
            .map_err(|fault| self.source_error(&name, fault))?;
        let history = answer
            .history
            .map_err(|fault| self.source_error(&name, fault))?;
        let own_id = self.data.own_cluster_id();
        let their_chains = self.their_chains(&name, answer.configs.as_ref());
        let mut refused = Vec::new();
        for (tp, local) in &tails {
            let theirs = history.get(tp).cloned().unwrap_or_else(|| SourceTail {
                error: Some("the new source did not answer for it".into()),
                ..SourceTail::default()
            });
            if let Err(why) = agree(local, &theirs) {
                refused.push(format!("{tp}: {why}"));
                continue;
            }
            let ours = self.mirrors[&name]
                .lineages
                .get(&tp.topic)
                .map_or(&[][..], Vec::as_slice);
            let theirs = their_chains.get(&tp.topic).map_or(&[][..], Vec::as_slice);
            if let Some(why) = chain::repoint_refusal(
                ours,
                own_id.as_deref(),
                theirs,
                view.cluster_id.as_deref(),
                local.last_batch.is_some(),
            ) {
                refused.push(format!("{tp}: {why}"));
            }
        }
        if !refused.is_empty() {
            return Err(ControlError::HistoryRefused {
                action: "repoint",
                mirror: name.to_string(),
                partitions: refused.join("; "),
            });
        }
        // The fetchers stop here, so no log moves between the check and the switch; a log that
        // moved while the new source was asked (the old one still answering) was not checked
        // that far, and the re-point is refused (its fetcher resumes on the old source).
        let fetching: Vec<TopicPartition> = self.mirrors[&name]
            .partitions
            .iter()
            .filter(|(_, p)| p.machine.wants_fetcher())
            .map(|(tp, _)| tp.clone())
            .collect();
        let mut moved = Vec::new();
        for tp in &fetching {
            let end = self.data.remove(tp);
            let checked = tails.iter().find(|(t, _)| t == tp).map(|(_, l)| l.log_end);
            if let (Ok(end), Some(checked)) = (end, checked) {
                if end != checked {
                    moved.push(format!(
                        "{tp}: the log moved from {} to {} while the new source was checked (pause the mirror first)",
                        checked.0, end.0
                    ));
                }
            }
        }
        if !moved.is_empty() {
            self.batched(|c| c.reconcile(&name))?;
            return Err(ControlError::HistoryRefused {
                action: "repoint",
                mirror: name.to_string(),
                partitions: moved.join("; "),
            });
        }
        let entry = self.entry_mut(&name)?;
        let old = entry.record.clone();
        let hop = Hop {
            cluster_id: old.source_cluster_id.clone(),
            bootstrap_servers: old.definition.source.bootstrap_servers.join(","),
            until_mirror_epoch: entry.epoch.0,
            until_ms: now_ms(),
        };
        let mut lineage = old.lineage;
        lineage.push(hop);
        if lineage.len() > LINEAGE_HOPS_MAX {
            lineage.drain(..lineage.len() - LINEAGE_HOPS_MAX);
        }
        let record = MirrorRecord {
            definition,
            source_cluster_id: view.cluster_id.clone(),
            lineage,
        };
        for (tp, p) in entry.partitions.iter_mut() {
            if let Some(id) = history.get(tp).and_then(|s| s.topic_id) {
                p.topic_id = id;
            }
        }
        entry.record = record.clone();
        self.store.put(
            &StateKey::Mirror(name.clone()),
            &StateValue::Mirror(Box::new(record.clone())),
        )?;
        let epoch = self.bump_epoch(&name)?;
        // Each topic's chain gets the new source's and our new link; its configs are copied
        // from the new source at once (the sync would within its interval).
        self.apply_topic_configs(&name, answer.configs)?;
        tracing::info!(
            mirror = %name,
            source = %record.definition.source.bootstrap_servers.join(","),
            cluster_id = ?record.source_cluster_id,
            partitions = tails.len(),
            "mirror re-pointed: every partition resumes from its local log end"
        );
        // FAILED partitions (a dead source's) start again at once on the new one: re-pointing
        // is the operator's answer to that failure. PAUSED ones stay paused.
        let failed: Vec<TopicPartition> = self.mirrors[&name]
            .partitions
            .iter()
            .filter(|(_, p)| p.machine.state() == Some(StateName::Failed))
            .map(|(tp, _)| tp.clone())
            .collect();
        self.batched(|c| {
            for tp in &failed {
                let p = c
                    .entry_mut(&name)?
                    .partitions
                    .get_mut(tp)
                    .expect("listed above");
                p.machine
                    .command(crate::control::state::Command::Start)
                    .map_err(|source| ControlError::State {
                        partition: tp.clone(),
                        source,
                    })?;
                c.persist(&name, tp)?;
            }
            c.reconcile(&name)
        })?;
        Ok(RepointReport {
            mirror: name.to_string(),
            source_cluster_id: record.source_cluster_id,
            source_bootstrap_servers: record.definition.source.bootstrap_servers.join(","),
            mirror_epoch: epoch.0,
            partitions: tails
                .iter()
                .map(|(tp, l)| (tp.to_string(), l.log_end.0))
                .collect(),
            lineage: record.lineage,
            stopped: self.mirrors[&name]
                .partitions
                .iter()
                .filter(|(_, p)| p.machine.state() == Some(StateName::Stopped))
                .map(|(tp, _)| (tp.to_string(), STOPPED_NOT_REPOINTED.to_owned()))
                .collect(),
            topic_lineage: self.mirrors[&name].lineages.clone(),
        })
    }

    /// The new source's chain of each topic it described (`kmirror.lineage`; none from a
    /// stock Kafka source). A topic it could not describe, or an unreadable value, counts as
    /// no chain: the lineage check then sees only the source's cluster id.
    fn their_chains(
        &self,
        name: &MirrorName,
        configs: Option<&Result<crate::control::source_catalog::DescribedConfigs, Fault>>,
    ) -> BTreeMap<String, Vec<chain::Link>> {
        let mut out = BTreeMap::new();
        let Some(Ok(described)) = configs else {
            return out;
        };
        for (topic, entries) in described {
            let Ok(entries) = entries else { continue };
            match chain::upstream_of(entries) {
                Ok(c) => {
                    out.insert(topic.clone(), c);
                }
                Err(why) => {
                    tracing::warn!(mirror = %name, %topic, %why, "repoint: the new source's lineage not read");
                }
            }
        }
        out
    }

    /// `repoint` in one call, the source asked on this thread.
    pub fn repoint(
        &mut self,
        mirror: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<RepointReport, ControlError> {
        let (plan, ask) = self.repoint_ask(mirror, properties)?;
        let answer = ask.run_here();
        self.repoint_finish(plan, answer)
    }
}
