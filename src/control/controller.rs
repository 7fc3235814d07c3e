//! The owner of all mirror state: applies operator commands and data-plane observations to the
//! per-partition state machines, persists every change in `__mirror_state` before acting on
//! it, and tells the data plane which partitions to fetch.
//!
//! The source cluster and the data plane are traits so the lifecycle rules are tested on their
//! own; `source_catalog` implements the source side with the blocking Kafka client.

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

use crate::control::group_sync::{
    self, GroupSyncError, GroupSyncSchedule, LocalLogs, OffsetSink, SourceGroups, SyncReport,
};
use crate::control::mirror_def::{
    split_patterns, DefinitionError, MirrorDefinition, MirrorName, StartFrom, TopicFilter,
};
use crate::control::records::{
    last_mirror_epoch, LastMirrorEpochValue, MirrorRecord, PartitionStateValue, StateKey,
    StateValue,
};
use crate::control::state::{
    Command, Event, Outcome, PartitionMachine, RetryPolicy, StateError, StateName,
};
use crate::control::state_log::{StateLog, StateLogError};
use crate::control::topic_configs::{self, SourceConfigEntry, TopicConfigs};
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::ids::{MirrorEpoch, Offset, TopicPartition};
use crate::limits::{GROUP_SYNC_ROUND_TIMEOUT_MS, MIRROR_SYNC_INTERVAL_MS_DEFAULT};
use crate::log::config::LogConfig;
use crate::log::partition_log::Promotion;

/// One source topic as the control plane needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTopic {
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: i32,
    pub internal: bool,
}

/// What the source cluster looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceView {
    pub cluster_id: Option<String>,
    pub topics: Vec<SourceTopic>,
}

/// Why the source or the data plane could not do something, and whether trying again can help
/// (a wrong password or certificate cannot; an unreachable broker can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub message: String,
    pub retryable: bool,
}

impl Fault {
    pub fn permanent(message: impl Into<String>) -> Fault {
        Fault {
            message: message.into(),
            retryable: false,
        }
    }
}

impl From<String> for Fault {
    fn from(message: String) -> Fault {
        Fault {
            message,
            retryable: true,
        }
    }
}

impl From<&str> for Fault {
    fn from(message: &str) -> Fault {
        Fault::from(message.to_owned())
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Asks a mirror's source cluster what it has (with the mirror's own connection settings).
pub trait SourceCatalog {
    fn describe(&mut self, mirror: &MirrorDefinition) -> Result<SourceView, Fault>;
    /// DescribeConfigs of `topics`: each topic's entries, or the source's error for it.
    fn topic_configs(
        &mut self,
        mirror: &MirrorDefinition,
        topics: &[&str],
    ) -> Result<BTreeMap<String, Result<Vec<SourceConfigEntry>, String>>, Fault>;
    /// ListOffsets on each partition's leader.
    fn list_offsets(
        &mut self,
        mirror: &MirrorDefinition,
        tps: &[TopicPartition],
        query: OffsetQuery,
    ) -> Result<Vec<(TopicPartition, Listed)>, Fault>;
}

/// What the data plane knows about one partition it fetches (or fetched).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Progress {
    pub local_log_end: Option<i64>,
    pub source_high_watermark: Option<i64>,
    /// Max timestamp (ms) of the newest batch stored, when the data plane saw one stored.
    pub newest_timestamp_ms: Option<i64>,
    /// Throttle time the source's quotas imposed on the partition's connection, summed (ms).
    pub throttled_ms: Option<i64>,
    /// Offsets never mirrored because the source's log start passed our log end (an offset
    /// gap in the local log), summed since this process started.
    pub skipped_records: i64,
    /// Why appends are paused and retried (a full disk), while they are.
    pub stalled: Option<String>,
}

/// The shards, as the control plane drives them.
pub trait DataPlane {
    /// Start fetching `tp` for `mirror` from the local log end (or `start` when new).
    fn add(
        &mut self,
        mirror: &MirrorDefinition,
        tp: &TopicPartition,
        topic_id: Uuid,
        start: StartFrom,
    ) -> Result<(), Fault>;
    /// Stop fetching `tp` and return its local log end.
    fn remove(&mut self, tp: &TopicPartition) -> Result<Offset, String>;
    /// Sets the log config of every partition of `topic`, present and created later (already
    /// validated: the controller builds it with `topic_configs::apply`). A partition a shard
    /// owns gets it by message.
    fn configure(&mut self, topic: &str, config: &LogConfig) -> Result<(), String>;
    fn progress(&self, tp: &TopicPartition) -> Progress;
    /// Failover of a partition whose fetcher is gone (KIP-1279 §9): open transactions
    /// aborted, the leader epoch raised above the source's, producer state reset, all durable
    /// before the partition may become STOPPED (and writable). Safe to repeat after a crash.
    fn promote(&mut self, tp: &TopicPartition) -> Result<Promotion, String>;
    /// Makes a STOPPED (promoted) partition writable for clients; repeatable (a restart calls
    /// it for every STOPPED partition).
    fn writable(&mut self, tp: &TopicPartition) -> Result<(), String>;
    /// Partitions whose fetching stopped on its own since the last call, with the reason.
    fn poll_failures(&mut self) -> Vec<(TopicPartition, Fault)> {
        Vec::new()
    }
    /// The shards' counters and latency histograms for `/metrics`, when there are shards.
    fn telemetry(&self) -> Option<&std::sync::Arc<crate::ops::telemetry::Telemetry>> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("unknown mirror {0:?}")]
    UnknownMirror(String),
    #[error("mirror {0:?} already exists")]
    MirrorExists(String),
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    #[error("source of mirror {mirror} is unreachable: {reason}")]
    Source { mirror: String, reason: String },
    /// The source refused the mirror's credentials or certificates; the reason says which.
    #[error("source of mirror {mirror} refused the connection: {reason}")]
    Refused { mirror: String, reason: String },
    #[error("source cluster id changed from {stored} to {seen}; mirror {mirror} is FAILED")]
    ClusterChanged {
        mirror: String,
        stored: String,
        seen: String,
    },
    #[error("--topics is required")]
    NoTopics,
    #[error("topic {topic} is already mirrored by {other}")]
    TopicInOtherMirror { topic: String, other: String },
    #[error("mirror {mirror} has no topic matching {patterns:?}")]
    NoMatch { mirror: String, patterns: String },
    #[error("mirror {mirror} still has partitions that are not STOPPED: {partitions}")]
    NotEmpty { mirror: String, partitions: String },
    #[error("{partition}: {source}")]
    State {
        partition: TopicPartition,
        source: StateError,
    },
    /// `stop --promote` found partitions behind the source; nothing was changed.
    #[error("mirror {mirror} is not caught up: {partitions}")]
    Lagging { mirror: String, partitions: String },
    #[error(transparent)]
    Store(#[from] StateLogError),
}

impl ControlError {
    /// The HTTP status the admin API answers with.
    pub fn status(&self) -> u16 {
        match self {
            ControlError::UnknownMirror(_) | ControlError::NoMatch { .. } => 404,
            ControlError::MirrorExists(_)
            | ControlError::TopicInOtherMirror { .. }
            | ControlError::NotEmpty { .. }
            | ControlError::State { .. } => 409,
            ControlError::Definition(_) | ControlError::NoTopics => 400,
            ControlError::Source { .. } | ControlError::ClusterChanged { .. } => 502,
            ControlError::Refused { .. } => 401,
            // "Not yet": the CLI asks again until its --promote-timeout-ms.
            ControlError::Lagging { .. } => 503,
            ControlError::Store(_) => 500,
        }
    }
}

#[derive(Debug, Clone)]
struct PartEntry {
    topic_id: Uuid,
    machine: PartitionMachine,
    last: Option<LastMirrorEpochValue>,
}

#[derive(Debug, Clone)]
struct MirrorEntry {
    record: MirrorRecord,
    epoch: MirrorEpoch,
    partitions: BTreeMap<TopicPartition, PartEntry>,
    /// Each topic's configs as last copied from the source (and applied).
    configs: BTreeMap<String, TopicConfigs>,
    /// Topics whose latest source configs could not be applied, with why (the previous
    /// configs stay in force).
    config_errors: BTreeMap<String, String>,
}

/// A row of `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct MirrorSummary {
    pub mirror: String,
    pub topics: usize,
    pub source_cluster_id: Option<String>,
    pub source_bootstrap_servers: String,
    pub mirror_epoch: i32,
}

/// The answer of `check_source`: whether the source answered Metadata over the mirror's own
/// connection (TLS, SASL), or why not. `retryable: false` means credentials or certificates
/// were refused: trying again cannot help.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SourceCheck {
    pub mirror: String,
    pub bootstrap_servers: String,
    pub security_protocol: String,
    pub sasl_mechanism: Option<String>,
    pub sasl_username: Option<String>,
    pub cluster_id: Option<String>,
    pub topics: Option<usize>,
    pub error: Option<String>,
    pub retryable: bool,
}

/// A row of `describe` (field names as KIP-1279's `--describe --json`, plus kmirror's extras).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionRow {
    pub mirror: String,
    pub topic: String,
    pub partition: i32,
    pub state: StateName,
    pub source_offset: Option<i64>,
    pub destination_offset: Option<i64>,
    pub lag: Option<i64>,
    pub lag_seconds: Option<f64>,
    /// Throttle time (ms) the source's quotas imposed on this partition's fetch connection.
    #[serde(default)]
    pub throttle_time_ms: Option<i64>,
    /// -1 non-retryable, n the attempt, 0 when not FAILED.
    pub retry_attempt: i32,
    pub error_message: Option<String>,
    pub last_mirror_epoch: Option<i32>,
    pub last_end_offset: Option<i64>,
    /// Why the topic's latest source configs were not applied (the previous ones are).
    #[serde(default)]
    pub config_error: Option<String>,
    /// Offsets skipped since this process started because the source's retention passed the
    /// local log end: the log keeps its batches and has an offset gap (issue 11 item 5).
    #[serde(default)]
    pub skipped_records: i64,
    /// While MIRRORING, why appends are paused and retried (a full disk: issue 11 item 6).
    #[serde(default)]
    pub stalled: Option<String>,
}

/// What a command changed, for the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CommandReport {
    pub mirror: String,
    pub changed: Vec<String>,
    pub unchanged: Vec<String>,
    /// `stop` only: what the last group-offset sync did, or why it was skipped (the consumers
    /// moving to kmirror then resume from the last periodic sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_sync: Option<String>,
}

fn source_error(name: &MirrorName, fault: Fault) -> ControlError {
    if fault.retryable {
        ControlError::Source {
            mirror: name.to_string(),
            reason: fault.message,
        }
    } else {
        ControlError::Refused {
            mirror: name.to_string(),
            reason: fault.message,
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Owns every mirror; runs on the control thread.
pub struct Controller<S, D> {
    store: StateLog,
    mirrors: BTreeMap<MirrorName, MirrorEntry>,
    policy: RetryPolicy,
    source: S,
    data: D,
    sync_interval_ms: i64,
    next_sync_ms: i64,
    /// Group-offset sync, once the group coordinator exists (`attach_group_sync`).
    group_sync: Option<GroupSyncPlane>,
}

/// What the controller needs to run the group-offset sync (`control::group_sync`).
pub struct GroupSyncPlane {
    pub source: Box<dyn SourceGroups + Send>,
    pub local: Box<dyn LocalLogs + Send>,
    pub sink: Box<dyn OffsetSink + Send>,
    pub schedule: GroupSyncSchedule,
}

/// The message of the non-retryable failure of a partition whose source topic is gone.
pub const SOURCE_TOPIC_DELETED: &str = "source topic is deleted";

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Loads every mirror from `__mirror_state`, bumps each mirror's epoch (it grows on every
    /// start of kmirror) and hands the partitions that were being mirrored back to the data
    /// plane.
    pub fn open(
        store: StateLog,
        policy: RetryPolicy,
        source: S,
        data: D,
    ) -> Result<Self, ControlError> {
        let mut mirrors: BTreeMap<MirrorName, MirrorEntry> = BTreeMap::new();
        let records = store.records()?;
        for (key, value) in &records {
            if let (StateKey::Mirror(name), StateValue::Mirror(rec)) = (key, value) {
                mirrors.insert(
                    name.clone(),
                    MirrorEntry {
                        record: (**rec).clone(),
                        epoch: MirrorEpoch(0),
                        partitions: BTreeMap::new(),
                        configs: BTreeMap::new(),
                        config_errors: BTreeMap::new(),
                    },
                );
            }
        }
        // Partition records first: the last-mirror-epoch records (type 1) sort before them.
        let (lmes, others): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|(k, _)| matches!(k, StateKey::LastMirrorEpoch(..)));
        for (key, value) in others.into_iter().chain(lmes) {
            let Some(entry) = mirrors.get_mut(key.mirror()) else {
                tracing::warn!(
                    ?key,
                    "__mirror_state record of a mirror that does not exist"
                );
                continue;
            };
            match (key, value) {
                (StateKey::MirrorEpoch(_), StateValue::MirrorEpoch(e)) => entry.epoch = e,
                (StateKey::Partition(_, tp), StateValue::Partition(v)) => {
                    let Some(machine) = v.to_machine() else {
                        tracing::warn!(partition = %tp, ?v, "__mirror_state holds a contradictory partition state; leaving the partition out");
                        continue;
                    };
                    entry.partitions.insert(
                        tp,
                        PartEntry {
                            topic_id: v.topic_id,
                            machine,
                            last: None,
                        },
                    );
                }
                (StateKey::LastMirrorEpoch(_, tp), StateValue::LastMirrorEpoch(v)) => {
                    if let Some(p) = entry.partitions.get_mut(&tp) {
                        p.last = Some(v);
                    }
                }
                (StateKey::TopicConfigs(_, topic), StateValue::TopicConfigs(v)) => {
                    entry.configs.insert(topic, v.configs);
                }
                _ => {}
            }
        }
        let mut c = Controller {
            store,
            mirrors,
            policy,
            source,
            data,
            sync_interval_ms: MIRROR_SYNC_INTERVAL_MS_DEFAULT as i64,
            next_sync_ms: 0,
            group_sync: None,
        };
        let names: Vec<MirrorName> = c.mirrors.keys().cloned().collect();
        for name in names {
            c.bump_epoch(&name)?;
            // The copied configs are in force before any partition is handed to a shard.
            c.apply_stored_configs(&name);
            c.reconcile(&name)?;
        }
        Ok(c)
    }

    /// Applies each topic's stored configs to the data plane (at start).
    fn apply_stored_configs(&mut self, name: &MirrorName) {
        let stored: Vec<(String, TopicConfigs)> = self.mirrors[name]
            .configs
            .iter()
            .map(|(t, c)| (t.clone(), c.clone()))
            .collect();
        for (topic, configs) in stored {
            match topic_configs::apply(&LogConfig::default(), &configs) {
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

    /// Copies the source's configs of the mirror's live topics (those with a partition not
    /// STOPPED and not failed as deleted): the changed ones are persisted, then applied. A
    /// source that does not answer, or a topic it cannot describe, keeps the configs in force;
    /// a value kmirror cannot apply keeps them too and is reported in `describe`.
    fn sync_topic_configs(&mut self, name: &MirrorName) -> Result<(), ControlError> {
        let entry = &self.mirrors[name];
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
        if topics.is_empty() {
            return Ok(());
        }
        let def = entry.record.definition.clone();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let described = match self.source.topic_configs(&def, &names) {
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
            let entry = self.entry_mut(name)?;
            if entry.configs.get(&topic) == Some(&copied) {
                continue;
            }
            let config = match topic_configs::apply(&LogConfig::default(), &copied) {
                Ok(config) => config,
                Err(e) => {
                    let why = e.to_string();
                    if entry.config_errors.get(&topic) != Some(&why) {
                        tracing::error!(mirror = %name, %topic, "source sync: {why}; the previous configs stay");
                    }
                    entry.config_errors.insert(topic, why);
                    continue;
                }
            };
            entry.config_errors.remove(&topic);
            entry.configs.insert(topic.clone(), copied.clone());
            self.store.put(
                &StateKey::TopicConfigs(name.clone(), topic.clone()),
                &StateValue::TopicConfigs(crate::control::records::TopicConfigsValue {
                    configs: copied.clone(),
                }),
            )?;
            tracing::info!(mirror = %name, %topic, configs = ?copied, "source sync: topic configs copied");
            if let Err(why) = self.data.configure(&topic, &config) {
                tracing::error!(mirror = %name, %topic, %why, "topic configs not applied");
                self.entry_mut(name)?.config_errors.insert(topic, why);
            }
        }
        Ok(())
    }

    fn bump_epoch(&mut self, name: &MirrorName) -> Result<MirrorEpoch, ControlError> {
        let entry = self.entry_mut(name)?;
        entry.epoch = MirrorEpoch(entry.epoch.0 + 1);
        let epoch = entry.epoch;
        self.store.put(
            &StateKey::MirrorEpoch(name.clone()),
            &StateValue::MirrorEpoch(epoch),
        )?;
        Ok(epoch)
    }

    fn entry(&self, name: &str) -> Result<(&MirrorName, &MirrorEntry), ControlError> {
        self.mirrors
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .ok_or_else(|| ControlError::UnknownMirror(name.to_owned()))
    }

    fn entry_mut(&mut self, name: &MirrorName) -> Result<&mut MirrorEntry, ControlError> {
        self.mirrors
            .get_mut(name)
            .ok_or_else(|| ControlError::UnknownMirror(name.to_string()))
    }

    pub fn mirror_names(&self) -> Vec<String> {
        self.mirrors.keys().map(|n| n.to_string()).collect()
    }

    pub fn partition_state(&self, mirror: &str, tp: &TopicPartition) -> Option<StateName> {
        let (_, e) = self.entry(mirror).ok()?;
        e.partitions.get(tp)?.machine.state()
    }

    pub fn mirror_epoch(&self, mirror: &str) -> Option<MirrorEpoch> {
        self.entry(mirror).ok().map(|(_, e)| e.epoch)
    }

    /// Persists a partition's machine; always before the data plane is told to act on it.
    fn persist(&mut self, name: &MirrorName, tp: &TopicPartition) -> Result<(), ControlError> {
        let entry = self.entry_mut(name)?;
        let Some(p) = entry.partitions.get(tp) else {
            return Ok(());
        };
        if let Some(v) = PartitionStateValue::from_machine(p.topic_id, &p.machine) {
            self.store.put(
                &StateKey::Partition(name.clone(), tp.clone()),
                &StateValue::Partition(v),
            )?;
        }
        Ok(())
    }

    fn apply_event(
        &mut self,
        name: &MirrorName,
        tp: &TopicPartition,
        event: Event,
    ) -> Result<Outcome, ControlError> {
        let policy = self.policy;
        let entry = self.entry_mut(name)?;
        let Some(p) = entry.partitions.get_mut(tp) else {
            return Ok(Outcome::Unchanged);
        };
        let outcome = p
            .machine
            .event(event, &policy)
            .map_err(|source| ControlError::State {
                partition: tp.clone(),
                source,
            })?;
        if outcome != Outcome::Unchanged {
            self.persist(name, tp)?;
        }
        Ok(outcome)
    }

    /// Drives each partition of a mirror through the steps that need no operator: alignment,
    /// fetcher removal for PAUSING/STOPPING, fetcher start for MIRRORING.
    fn reconcile(&mut self, name: &MirrorName) -> Result<(), ControlError> {
        let entry = self.entry_mut(name)?;
        let def = entry.record.definition.clone();
        let epoch = entry.epoch;
        let work: Vec<(TopicPartition, Uuid, Option<StateName>)> = entry
            .partitions
            .iter()
            .map(|(tp, p)| (tp.clone(), p.topic_id, p.machine.state()))
            .collect();
        for (tp, topic_id, state) in work {
            match state {
                Some(StateName::LogAlignment) => {
                    // Nothing to truncate yet: kmirror is the only writer of its logs and the
                    // failover issue adds the LME exchange with the source.
                    self.apply_event(name, &tp, Event::Aligned)?;
                    self.start_fetcher(name, &def, &tp, topic_id)?;
                }
                Some(StateName::Mirroring) => self.start_fetcher(name, &def, &tp, topic_id)?,
                Some(StateName::Pausing) => {
                    self.stop_fetcher(name, &tp)?;
                }
                Some(StateName::Stopping) => self.fail_over(name, &tp, epoch)?,
                Some(StateName::Stopped) => {
                    if let Err(why) = self.data.writable(&tp) {
                        tracing::error!(mirror = %name, partition = %tp, %why, "stopped partition not writable");
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn start_fetcher(
        &mut self,
        name: &MirrorName,
        def: &MirrorDefinition,
        tp: &TopicPartition,
        topic_id: Uuid,
    ) -> Result<(), ControlError> {
        if let Err(fault) = self.data.add(def, tp, topic_id, def.start_from) {
            self.apply_event(
                name,
                tp,
                Event::Failed {
                    message: fault.message,
                    retryable: fault.retryable,
                    now_ms: now_ms(),
                },
            )?;
        }
        Ok(())
    }

    /// STOPPING → STOPPED: the fetcher removed, the partition promoted, the last mirror epoch
    /// and mirrored end offset recorded, then STOPPED. Each step is repeatable, so a crash or
    /// a failed step leaves the partition STOPPING and the next reconcile finishes it.
    fn fail_over(
        &mut self,
        name: &MirrorName,
        tp: &TopicPartition,
        epoch: MirrorEpoch,
    ) -> Result<(), ControlError> {
        let end = match self.data.remove(tp) {
            Ok(end) => end,
            Err(message) => {
                tracing::warn!(mirror = %name, partition = %tp, %message, "stop: fetcher not removed yet");
                return Ok(());
            }
        };
        let promotion = match self.data.promote(tp) {
            Ok(p) => p,
            Err(message) => {
                tracing::error!(mirror = %name, partition = %tp, %message, "stop: promotion failed; retrying");
                return Ok(());
            }
        };
        tracing::info!(
            mirror = %name,
            partition = %tp,
            mirrored_end = %end,
            leader_epoch = %promotion.leader_epoch,
            aborted_transactions = promotion.aborted.len(),
            log_end = %promotion.log_end,
            "stop: partition promoted, writable"
        );
        let v = last_mirror_epoch(epoch, end);
        self.store
            .put(&StateKey::LastMirrorEpoch(name.clone(), tp.clone()), &v)?;
        if let StateValue::LastMirrorEpoch(lme) = v {
            if let Some(p) = self.entry_mut(name)?.partitions.get_mut(tp) {
                p.last = Some(lme);
            }
        }
        self.apply_event(name, tp, Event::FetcherRemoved)?;
        if let Err(why) = self.data.writable(tp) {
            tracing::error!(mirror = %name, partition = %tp, %why, "stopped partition not writable");
        }
        Ok(())
    }

    /// Removes the fetcher and completes PAUSING/STOPPING; returns the local log end.
    fn stop_fetcher(
        &mut self,
        name: &MirrorName,
        tp: &TopicPartition,
    ) -> Result<Option<Offset>, ControlError> {
        match self.data.remove(tp) {
            Ok(end) => {
                self.apply_event(name, tp, Event::FetcherRemoved)?;
                Ok(Some(end))
            }
            Err(message) => {
                self.apply_event(
                    name,
                    tp,
                    Event::Failed {
                        message,
                        retryable: true,
                        now_ms: now_ms(),
                    },
                )?;
                Ok(None)
            }
        }
    }

    /// `create`: validates the definition, checks the source answers, stores the mirror.
    pub fn create(
        &mut self,
        name: &str,
        properties: &BTreeMap<String, String>,
    ) -> Result<MirrorSummary, ControlError> {
        let name = MirrorName::new(name)?;
        if self.mirrors.contains_key(&name) {
            return Err(ControlError::MirrorExists(name.to_string()));
        }
        let definition = MirrorDefinition::from_properties(name.clone(), properties)?;
        let view = self
            .source
            .describe(&definition)
            .map_err(|fault| source_error(&name, fault))?;
        let record = MirrorRecord {
            definition,
            source_cluster_id: view.cluster_id,
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
            },
        );
        self.bump_epoch(&name)?;
        Ok(self.summary(&name))
    }

    fn summary(&self, name: &MirrorName) -> MirrorSummary {
        let e = &self.mirrors[name];
        let mut topics: Vec<&str> = e.partitions.keys().map(|tp| tp.topic.as_str()).collect();
        topics.dedup();
        MirrorSummary {
            mirror: name.to_string(),
            topics: topics.len(),
            source_cluster_id: e.record.source_cluster_id.clone(),
            source_bootstrap_servers: e.record.definition.source.bootstrap_servers.join(","),
            mirror_epoch: e.epoch.0,
        }
    }

    pub fn list(&self) -> Vec<MirrorSummary> {
        self.mirrors.keys().map(|n| self.summary(n)).collect()
    }

    /// Connects to a mirror's source with the mirror's own settings, for `kmirror doctor`.
    /// A check only reports: it never changes the mirror's state, and the credentials stay in
    /// this process.
    pub fn check_source(&mut self, name: &str) -> Result<SourceCheck, ControlError> {
        let def = self.entry(name)?.1.record.definition.clone();
        let outcome = self.source.describe(&def);
        let source = &def.source;
        let (cluster_id, topics, error, retryable) = match outcome {
            Ok(view) => (view.cluster_id, Some(view.topics.len()), None, true),
            Err(fault) => (None, None, Some(fault.message), fault.retryable),
        };
        Ok(SourceCheck {
            mirror: name.to_owned(),
            bootstrap_servers: source.bootstrap_servers.join(","),
            security_protocol: source.security_protocol.to_string(),
            sasl_mechanism: source.sasl.as_ref().map(|c| c.mechanism.to_string()),
            sasl_username: source.sasl.as_ref().map(|c| c.username.clone()),
            cluster_id,
            topics,
            error,
            retryable,
        })
    }

    /// Reads the source, failing the whole mirror when its cluster id changed.
    fn source_view(&mut self, name: &MirrorName) -> Result<SourceView, ControlError> {
        let def = self.entry_mut(name)?.record.definition.clone();
        let view = match self.source.describe(&def) {
            Ok(v) => v,
            Err(fault) => {
                if !fault.retryable {
                    self.fail_mirror(name, &fault.message)?;
                }
                return Err(source_error(name, fault));
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
    fn fail_mirror(&mut self, name: &MirrorName, message: &str) -> Result<(), ControlError> {
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

    /// `start`: matches the patterns against the source's topics, saves them for
    /// auto-discovery, and starts every matching partition that is new, STOPPED or FAILED.
    pub fn start(
        &mut self,
        mirror: &str,
        topics: &str,
        exclude: Option<&str>,
    ) -> Result<CommandReport, ControlError> {
        let name = self.entry(mirror)?.0.clone();
        let include = split_patterns(topics);
        if include.is_empty() {
            return Err(ControlError::NoTopics);
        }
        let mut filter = self.mirrors[&name].record.definition.topics.clone();
        let extra_exclude = exclude.map(split_patterns).unwrap_or_default();
        let this_start = TopicFilter::new(
            include.clone(),
            filter
                .exclude
                .iter()
                .cloned()
                .chain(extra_exclude.clone())
                .collect(),
        )?
        .compile()?;
        let view = self.source_view(&name)?;
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
        for t in matching {
            for partition in 0..t.partitions {
                let tp = TopicPartition::new(t.name.clone(), partition);
                let entry = self.entry_mut(&name)?;
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
                self.persist(&name, &tp)?;
            }
        }
        self.sync_topic_configs(&name)?;
        self.reconcile(&name)?;
        Ok(report)
    }

    fn active_elsewhere(&self, mirror: &MirrorName, topic: &str) -> Option<String> {
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
    fn matching_partitions(
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

    /// `stop --promote`, the planned failover: stops the partitions only when each one already
    /// holds everything the source has, by a ListOffsets asked now (not the high watermark of
    /// the last fetch). Otherwise it answers `Lagging`, changes nothing, and the caller asks
    /// again until its own timeout. Producers on the source are expected to be stopped first;
    /// what they write between this check and the fetchers' removal is still mirrored if it
    /// arrives first, and the recorded end offset says exactly what kmirror holds.
    pub fn promote(&mut self, mirror: &str, topics: &str) -> Result<CommandReport, ControlError> {
        let (name, tps) = self.matching_partitions(mirror, topics)?;
        let live: Vec<TopicPartition> = tps
            .into_iter()
            .filter(|tp| {
                self.mirrors[&name].partitions[tp].machine.state() != Some(StateName::Stopped)
            })
            .collect();
        let lagging = |behind: Vec<String>| ControlError::Lagging {
            mirror: name.to_string(),
            partitions: behind.join(", "),
        };
        if !live.is_empty() {
            let def = self.mirrors[&name].record.definition.clone();
            let listed = self
                .source
                .list_offsets(&def, &live, OffsetQuery::Latest)
                .map_err(|f| lagging(vec![format!("source offsets unavailable: {f}")]))?;
            let mut behind = Vec::new();
            for (tp, l) in listed {
                let end = self.data.progress(&tp).local_log_end;
                match (l, end) {
                    (Listed::At(hw), Some(end)) if end >= hw.0 => {}
                    (Listed::At(hw), end) => behind.push(format!(
                        "{tp} holds {} of {}",
                        end.map_or("nothing".to_owned(), |e| e.to_string()),
                        hw.0
                    )),
                    (Listed::NoneAfter, _) => behind.push(format!("{tp}: no source offset")),
                    (Listed::Error(code), _) => {
                        behind.push(format!("{tp}: source error code {code}"))
                    }
                }
            }
            if !behind.is_empty() {
                return Err(lagging(behind));
            }
        }
        self.command(mirror, topics, Command::Stop)
    }

    pub fn command(
        &mut self,
        mirror: &str,
        topics: &str,
        command: Command,
    ) -> Result<CommandReport, ControlError> {
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
        for tp in tps {
            let p = self
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
            self.persist(&name, &tp)?;
        }
        if command == Command::Stop && !report.changed.is_empty() {
            // Failover: the consumers about to move here get the source's latest commits.
            // A source that does not answer within the bound is skipped, never waited for.
            let groups = &self.mirrors[&name].record.definition.groups;
            let timeout = std::time::Duration::from_millis(groups.final_timeout_ms);
            report.group_sync = Some(if !groups.enabled {
                "disabled for this mirror".to_owned()
            } else {
                match self.sync_group_offsets_now(name.as_str(), timeout) {
                    Ok(r) => {
                        tracing::info!(mirror = %name, ?r, "stop: last group-offset sync");
                        format!(
                            "done: {} group(s) read, {} offset(s) written, {} unchanged, {} \
                             clamped, {} group(s) left alone (active on kmirror)",
                            r.groups_seen, r.written, r.unchanged, r.clamped, r.groups_active
                        )
                    }
                    Err(e) => {
                        tracing::warn!(mirror = %name, "stop: last group-offset sync skipped: {e}");
                        format!("skipped: {e}")
                    }
                }
            });
        }
        self.reconcile(&name)?;
        Ok(report)
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

    /// The source's high watermarks of a mirror's partitions that have no fetcher (paused,
    /// failed): the shards only know them while fetching. A source that does not answer
    /// leaves them as last seen.
    fn idle_watermarks(&mut self, name: &MirrorName) -> BTreeMap<TopicPartition, i64> {
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
            return BTreeMap::new();
        }
        let def = e.record.definition.clone();
        match self.source.list_offsets(&def, &idle, OffsetQuery::Latest) {
            Ok(listed) => listed
                .into_iter()
                .filter_map(|(tp, l)| match l {
                    Listed::At(o) => Some((tp, o.0)),
                    _ => None,
                })
                .collect(),
            Err(fault) => {
                tracing::warn!(mirror = %name, %fault, "describe: source offsets unavailable");
                BTreeMap::new()
            }
        }
    }

    /// `describe`: one row per partition of one mirror, or of all. Lag is the source's high
    /// watermark minus the local log end; lag in seconds is 0 when caught up, else the age
    /// (now minus its batch's max timestamp) of the newest record stored.
    pub fn describe(&mut self, mirror: Option<&str>) -> Result<Vec<PartitionRow>, ControlError> {
        let names: Vec<MirrorName> = match mirror {
            Some(m) => vec![self.entry(m)?.0.clone()],
            None => self.mirrors.keys().cloned().collect(),
        };
        let now = now_ms();
        let mut rows = Vec::new();
        for name in names {
            let fresh = self.idle_watermarks(&name);
            let e = &self.mirrors[&name];
            for (tp, p) in &e.partitions {
                let Some(state) = p.machine.state() else {
                    continue;
                };
                let mut progress = self.data.progress(tp);
                if let Some(hw) = fresh.get(tp) {
                    progress.source_high_watermark = Some(*hw);
                }
                let lag = match (progress.source_high_watermark, progress.local_log_end) {
                    (Some(hw), Some(end)) => Some(hw.saturating_sub(end).max(0)),
                    _ => None,
                };
                let lag_seconds = match lag {
                    Some(0) => Some(0.0),
                    Some(_) => progress
                        .newest_timestamp_ms
                        .map(|ts| (now - ts).max(0) as f64 / 1000.0),
                    None => None,
                };
                rows.push(PartitionRow {
                    mirror: name.to_string(),
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    state,
                    source_offset: progress.source_high_watermark,
                    destination_offset: progress.local_log_end,
                    lag,
                    lag_seconds,
                    throttle_time_ms: progress.throttled_ms,
                    retry_attempt: p.machine.failure().map_or(0, |f| f.retry.as_kip_value()),
                    error_message: p.machine.failure().map(|f| f.message.clone()),
                    last_mirror_epoch: p.last.map(|l| l.mirror_epoch),
                    last_end_offset: p.last.map(|l| l.end_offset),
                    config_error: e.config_errors.get(&tp.topic).cloned(),
                    skipped_records: progress.skipped_records,
                    stalled: progress.stalled.clone(),
                });
            }
        }
        Ok(rows)
    }

    /// Every partition's state, without asking any source (for `/metrics`, which is scraped
    /// often and must not send ListOffsets to the sources the way `describe` does).
    pub fn partition_states(&self) -> Vec<(MirrorName, TopicPartition, StateName)> {
        let mut out = Vec::new();
        for (name, e) in &self.mirrors {
            for (tp, p) in &e.partitions {
                if let Some(state) = p.machine.state() {
                    out.push((name.clone(), tp.clone(), state));
                }
            }
        }
        out
    }

    /// A data-plane failure for one partition (retryable unless `retryable` is false).
    pub fn partition_failed(
        &mut self,
        tp: &TopicPartition,
        message: String,
        retryable: bool,
    ) -> Result<(), ControlError> {
        let owners: Vec<MirrorName> = self
            .mirrors
            .iter()
            .filter(|(_, e)| e.partitions.contains_key(tp))
            .map(|(n, _)| n.clone())
            .collect();
        for name in owners {
            self.apply_event(
                &name,
                tp,
                Event::Failed {
                    message: message.clone(),
                    retryable,
                    now_ms: now_ms(),
                },
            )?;
        }
        Ok(())
    }

    /// How often `tick` runs the source sync (default 30 s).
    pub fn set_sync_interval_ms(&mut self, ms: u64) {
        self.sync_interval_ms = i64::try_from(ms).unwrap_or(i64::MAX);
        self.next_sync_ms = 0;
    }

    /// Source sync for every mirror: new topics matching the patterns saved by `start` (and
    /// `mirror.topics.include`) are started, added partitions follow, partitions whose source
    /// topic is gone become FAILED non-retryable, and a changed cluster id fails the mirror.
    /// A source that does not answer is skipped until the next round: the fetchers report
    /// their own connection failures.
    pub fn sync(&mut self) -> Result<(), ControlError> {
        let names: Vec<MirrorName> = self.mirrors.keys().cloned().collect();
        for name in names {
            match self.sync_mirror(&name) {
                Ok(()) => {}
                Err(
                    e @ (ControlError::Source { .. }
                    | ControlError::Refused { .. }
                    | ControlError::ClusterChanged { .. }),
                ) => {
                    tracing::warn!(mirror = %name, "source sync: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn sync_mirror(&mut self, name: &MirrorName) -> Result<(), ControlError> {
        let entry = &self.mirrors[name];
        // Nothing to discover or check before the first start.
        if entry.partitions.is_empty() && entry.record.definition.topics.include.is_empty() {
            return Ok(());
        }
        let filter = entry.record.definition.topics.compile()?;
        let view = self.source_view(name)?;
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
        self.sync_topic_configs(name)?;
        if started {
            self.reconcile(name)?;
        }
        Ok(())
    }

    /// Periodic work: failures the data plane reported, retries whose backoff elapsed, and
    /// the source sync when due.
    pub fn tick(&mut self, now_ms: i64) -> Result<(), ControlError> {
        for (tp, fault) in self.data.poll_failures() {
            tracing::warn!(partition = %tp, why = %fault, "fetching stopped");
            self.partition_failed(&tp, fault.message, fault.retryable)?;
        }
        if now_ms >= self.next_sync_ms {
            self.next_sync_ms = now_ms.saturating_add(self.sync_interval_ms);
            self.sync()?;
        }
        let names: Vec<MirrorName> = self.mirrors.keys().cloned().collect();
        for name in names {
            let tps: Vec<TopicPartition> = self.mirrors[&name].partitions.keys().cloned().collect();
            let mut moved = false;
            for tp in tps {
                if let Outcome::Moved(..) = self.apply_event(&name, &tp, Event::Tick { now_ms })? {
                    moved = true;
                }
            }
            // A stop interrupted by a failed step (or a crash) is finished here.
            let stopping = self.mirrors[&name]
                .partitions
                .values()
                .any(|p| p.machine.state() == Some(StateName::Stopping));
            if moved || stopping {
                self.reconcile(&name)?;
            }
        }
        self.tick_group_sync(now_ms);
        Ok(())
    }

    /// Starts the periodic group-offset sync of every mirror.
    pub fn attach_group_sync(&mut self, plane: GroupSyncPlane) {
        self.group_sync = Some(plane);
    }

    /// The partitions whose group offsets a mirror syncs: those in MIRRORING, plus those being
    /// stopped when `stopping` (the last sync at failover).
    fn group_sync_partitions(
        &self,
        name: &MirrorName,
        stopping: bool,
    ) -> std::collections::BTreeSet<TopicPartition> {
        self.mirrors[name]
            .partitions
            .iter()
            .filter(|(_, p)| match p.machine.state() {
                Some(StateName::Mirroring) => true,
                Some(StateName::Stopping) => stopping,
                _ => false,
            })
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    fn tick_group_sync(&mut self, now_ms: i64) {
        let Some(mut plane) = self.group_sync.take() else {
            return;
        };
        let names: Vec<MirrorName> = self.mirrors.keys().cloned().collect();
        for name in names {
            let def = &self.mirrors[&name].record.definition;
            if !plane.schedule.due(def, now_ms) {
                continue;
            }
            let parts = self.group_sync_partitions(&name, false);
            let deadline = std::time::Instant::now()
                + std::time::Duration::from_millis(GROUP_SYNC_ROUND_TIMEOUT_MS);
            match group_sync::sync_mirror(
                def,
                &parts,
                plane.source.as_mut(),
                plane.local.as_ref(),
                plane.sink.as_mut(),
                deadline,
            ) {
                Ok(r) if r.written > 0 => {
                    tracing::info!(mirror = %name, ?r, "group offsets synced")
                }
                Ok(r) => tracing::debug!(mirror = %name, ?r, "group offsets unchanged"),
                Err(e) => tracing::warn!(mirror = %name, "group-offset sync: {e}"),
            }
        }
        self.group_sync = Some(plane);
    }

    /// One group-offset sync of `mirror` now, for its MIRRORING and STOPPING partitions, giving
    /// up after `timeout` (the failover path calls this once; a dead source is an error the
    /// caller logs and moves past).
    pub fn sync_group_offsets_now(
        &mut self,
        mirror: &str,
        timeout: std::time::Duration,
    ) -> Result<SyncReport, GroupSyncError> {
        let Some(name) = self.entry(mirror).ok().map(|(n, _)| n.clone()) else {
            return Ok(SyncReport::default());
        };
        let Some(mut plane) = self.group_sync.take() else {
            return Ok(SyncReport::default());
        };
        let parts = self.group_sync_partitions(&name, true);
        let def = &self.mirrors[&name].record.definition;
        let result = group_sync::sync_mirror(
            def,
            &parts,
            plane.source.as_mut(),
            plane.local.as_ref(),
            plane.sink.as_mut(),
            std::time::Instant::now() + timeout,
        );
        self.group_sync = Some(plane);
        result
    }

    /// Closes `__mirror_state` cleanly.
    pub fn close(self) -> Result<(), ControlError> {
        self.store.close()?;
        Ok(())
    }

    /// Closes `__mirror_state` cleanly and hands back the data plane (for its own shutdown).
    pub fn shutdown(self) -> Result<D, ControlError> {
        self.store.close()?;
        Ok(self.data)
    }

    pub fn data_plane(&self) -> &D {
        &self.data
    }

    pub fn data_plane_mut(&mut self) -> &mut D {
        &mut self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use std::rc::Rc;

    #[derive(Clone)]
    struct FakeSource(
        Rc<RefCell<Result<SourceView, Fault>>>,
        /// Each topic's DescribeConfigs entries (a topic not here: the source's error).
        Rc<RefCell<BTreeMap<String, Vec<SourceConfigEntry>>>>,
    );

    impl SourceCatalog for FakeSource {
        fn describe(&mut self, _: &MirrorDefinition) -> Result<SourceView, Fault> {
            self.0.borrow().clone()
        }
        fn topic_configs(
            &mut self,
            _: &MirrorDefinition,
            topics: &[&str],
        ) -> Result<BTreeMap<String, Result<Vec<SourceConfigEntry>, String>>, Fault> {
            self.0.borrow().clone()?;
            let known = self.1.borrow();
            Ok(topics
                .iter()
                .map(|t| {
                    let e = known
                        .get(*t)
                        .cloned()
                        .ok_or_else(|| "UNKNOWN_TOPIC_OR_PARTITION".to_owned());
                    ((*t).to_owned(), e)
                })
                .collect())
        }
        fn list_offsets(
            &mut self,
            _: &MirrorDefinition,
            tps: &[TopicPartition],
            _: OffsetQuery,
        ) -> Result<Vec<(TopicPartition, Listed)>, Fault> {
            self.0.borrow().clone()?;
            Ok(tps
                .iter()
                .map(|tp| (tp.clone(), Listed::At(Offset(120))))
                .collect())
        }
    }

    /// Records which partitions have a fetcher; each removal reports log end 100.
    #[derive(Clone, Default)]
    struct FakeData {
        active: Rc<RefCell<BTreeSet<TopicPartition>>>,
        adds: Rc<RefCell<u32>>,
        fail_adds: Rc<RefCell<bool>>,
        failures: Rc<RefCell<Vec<(TopicPartition, Fault)>>>,
        promoted: Rc<RefCell<Vec<TopicPartition>>>,
        fail_promotes: Rc<RefCell<bool>>,
        writable: Rc<RefCell<BTreeSet<TopicPartition>>>,
        /// The config each topic was last given.
        configs: Rc<RefCell<BTreeMap<String, LogConfig>>>,
    }

    impl DataPlane for FakeData {
        fn add(
            &mut self,
            _: &MirrorDefinition,
            tp: &TopicPartition,
            _: Uuid,
            _: StartFrom,
        ) -> Result<(), Fault> {
            if *self.fail_adds.borrow() {
                return Err("connection refused".into());
            }
            *self.adds.borrow_mut() += 1;
            self.active.borrow_mut().insert(tp.clone());
            Ok(())
        }
        fn remove(&mut self, tp: &TopicPartition) -> Result<Offset, String> {
            self.active.borrow_mut().remove(tp);
            Ok(Offset(100))
        }
        fn configure(&mut self, topic: &str, config: &LogConfig) -> Result<(), String> {
            self.configs
                .borrow_mut()
                .insert(topic.to_owned(), config.clone());
            Ok(())
        }
        fn promote(&mut self, tp: &TopicPartition) -> Result<Promotion, String> {
            if *self.fail_promotes.borrow() {
                return Err(format!("{tp}: disk full"));
            }
            self.promoted.borrow_mut().push(tp.clone());
            Ok(Promotion {
                leader_epoch: crate::ids::LeaderEpoch(1),
                aborted: Vec::new(),
                log_end: Offset(100),
            })
        }
        fn writable(&mut self, tp: &TopicPartition) -> Result<(), String> {
            self.writable.borrow_mut().insert(tp.clone());
            Ok(())
        }
        fn poll_failures(&mut self) -> Vec<(TopicPartition, Fault)> {
            std::mem::take(&mut *self.failures.borrow_mut())
        }
        fn progress(&self, _: &TopicPartition) -> Progress {
            Progress {
                local_log_end: Some(90),
                source_high_watermark: Some(100),
                newest_timestamp_ms: Some(now_ms() - 1500),
                throttled_ms: None,
                skipped_records: 0,
                stalled: None,
            }
        }
    }

    fn topic(name: &str, partitions: i32) -> SourceTopic {
        SourceTopic {
            name: name.into(),
            topic_id: Uuid::from_u128(name.len() as u128 + 1),
            partitions,
            internal: false,
        }
    }

    fn view(cluster: &str) -> SourceView {
        SourceView {
            cluster_id: Some(cluster.into()),
            topics: vec![
                topic("orders", 2),
                topic("payments", 1),
                topic("__consumer_offsets", 3),
            ],
        }
    }

    fn props() -> BTreeMap<String, String> {
        [("bootstrap.servers".to_owned(), "src:9092".to_owned())].into()
    }

    struct Rig {
        dir: tempfile::TempDir,
        source: FakeSource,
        data: FakeData,
    }

    impl Rig {
        fn new() -> Rig {
            Rig {
                dir: tempfile::tempdir().unwrap(),
                source: FakeSource(
                    Rc::new(RefCell::new(Ok(view("c1")))),
                    Rc::new(RefCell::new(
                        ["orders", "payments", "orders-eu", "refunds"]
                            .into_iter()
                            .map(|t| (t.to_owned(), Vec::new()))
                            .collect(),
                    )),
                ),
                data: FakeData::default(),
            }
        }

        fn open(&self) -> Controller<FakeSource, FakeData> {
            // Each open is a fresh process: the data plane starts empty.
            self.data.active.borrow_mut().clear();
            let store = StateLog::open(self.dir.path()).unwrap();
            Controller::open(
                store,
                RetryPolicy::default(),
                self.source.clone(),
                self.data.clone(),
            )
            .unwrap()
        }

        fn active(&self) -> Vec<String> {
            self.data
                .active
                .borrow()
                .iter()
                .map(|t| t.to_string())
                .collect()
        }
    }

    fn state(c: &Controller<FakeSource, FakeData>, t: &str, p: i32) -> Option<StateName> {
        c.partition_state("m1", &TopicPartition::new(t, p))
    }

    #[test]
    fn lifecycle_persists_across_restarts_in_every_state() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        assert_eq!(c.mirror_epoch("m1"), Some(MirrorEpoch(1)));
        let r = c.start("m1", "orders,__.*", None).unwrap();
        assert_eq!(
            r.changed,
            ["orders-0", "orders-1"],
            "internal topics stay excluded"
        );
        assert_eq!(state(&c, "orders", 0), Some(StateName::Mirroring));
        assert_eq!(rig.active(), ["orders-0", "orders-1"]);
        drop(c); // kill -9 while MIRRORING

        let mut c = rig.open();
        assert_eq!(
            c.mirror_epoch("m1"),
            Some(MirrorEpoch(2)),
            "epoch grows per start"
        );
        assert_eq!(state(&c, "orders", 1), Some(StateName::Mirroring));
        assert_eq!(
            rig.active(),
            ["orders-0", "orders-1"],
            "fetchers handed back"
        );

        c.command("m1", "orders", Command::Pause).unwrap();
        assert_eq!(state(&c, "orders", 0), Some(StateName::Paused));
        assert!(rig.active().is_empty());
        drop(c);
        let mut c = rig.open();
        assert_eq!(state(&c, "orders", 0), Some(StateName::Paused));
        assert!(
            rig.active().is_empty(),
            "a paused partition stays without fetcher"
        );

        c.command("m1", "ord.*", Command::Resume).unwrap();
        assert_eq!(state(&c, "orders", 0), Some(StateName::Mirroring));
        assert_eq!(rig.active().len(), 2);

        let err = c.delete("m1").unwrap_err();
        assert!(err.to_string().contains("orders-0 (MIRRORING)"), "{err}");

        c.command("m1", ".*", Command::Stop).unwrap();
        assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
        let rows = c.describe(Some("m1")).unwrap();
        assert_eq!(rows[0].last_mirror_epoch, Some(3));
        assert_eq!(rows[0].last_end_offset, Some(100));
        drop(c);
        let mut c = rig.open();
        assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
        assert_eq!(
            c.describe(Some("m1")).unwrap()[1].last_end_offset,
            Some(100)
        );
        c.delete("m1").unwrap();
        c.close().unwrap();
        let c = rig.open();
        assert!(c.list().is_empty(), "tombstones removed the mirror");
    }

    /// A source with one group that committed offset 42 on every partition it is asked about
    /// (or no answer at all), counting its rounds.
    #[derive(Clone, Default)]
    struct FakeGroups {
        rounds: Arc<Mutex<u32>>,
        dead: Arc<Mutex<bool>>,
    }

    impl group_sync::SourceGroups for FakeGroups {
        fn read(
            &mut self,
            _: &MirrorDefinition,
            _: &dyn Fn(&str) -> bool,
            topics: &BTreeSet<String>,
            _: std::time::Instant,
        ) -> Result<Vec<group_sync::SourceGroup>, String> {
            *self.rounds.lock().unwrap() += 1;
            if *self.dead.lock().unwrap() {
                return Err("connection refused".into());
            }
            let offsets = topics
                .iter()
                .flat_map(|t| (0..2).map(move |p| TopicPartition::new(t.as_str(), p)))
                .map(|tp| group_sync::SourceOffset {
                    tp,
                    offset: Offset(42),
                    leader_epoch: crate::ids::LeaderEpoch(1),
                    metadata: String::new(),
                })
                .collect();
            Ok(vec![group_sync::SourceGroup {
                group: "app".into(),
                offsets,
            }])
        }
    }

    struct Bounds;
    impl LocalLogs for Bounds {
        fn bounds(&self, _: &TopicPartition) -> Option<group_sync::LocalBounds> {
            Some(group_sync::LocalBounds {
                log_start: Offset(0),
                log_end: Offset(100),
                leader_epoch: crate::ids::LeaderEpoch(1),
            })
        }
        fn epoch_before(&self, _: &TopicPartition, _: Offset) -> crate::ids::LeaderEpoch {
            crate::ids::LeaderEpoch(1)
        }
    }

    type Coord = crate::serve::groups::GroupCoordinator<crate::serve::groups::MemoryStore>;

    fn attach(c: &mut Controller<FakeSource, FakeData>, groups: &FakeGroups) -> Arc<Mutex<Coord>> {
        let coord = Arc::new(Mutex::new(
            Coord::open(
                crate::serve::groups::CoordinatorConfig::new(0, "h", 1),
                crate::serve::groups::MemoryStore::default(),
            )
            .unwrap(),
        ));
        c.attach_group_sync(GroupSyncPlane {
            source: Box::new(groups.clone()),
            local: Box::new(Bounds),
            sink: Box::new(Arc::clone(&coord)),
            schedule: GroupSyncSchedule::default(),
        });
        coord
    }

    use std::sync::{Arc, Mutex};

    #[test]
    fn group_offsets_sync_on_tick_for_mirroring_partitions_and_once_more_at_stop() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "orders", None).unwrap();
        let groups = FakeGroups::default();
        let coord = attach(&mut c, &groups);
        let committed = |p: i32| {
            coord
                .lock()
                .unwrap()
                .committed("app", &TopicPartition::new("orders", p))
                .map(|o| o.offset)
        };
        c.tick(1_000).unwrap();
        assert_eq!(
            (committed(0), committed(1)),
            (Some(Offset(42)), Some(Offset(42)))
        );
        c.tick(2_000).unwrap();
        assert_eq!(
            *groups.rounds.lock().unwrap(),
            1,
            "next round only after 30 s"
        );
        c.tick(31_000).unwrap();
        assert_eq!(*groups.rounds.lock().unwrap(), 2);
        // Stop: one more sync before the partitions fail over, even off-schedule.
        c.command("m1", "orders", Command::Stop).unwrap();
        assert_eq!(*groups.rounds.lock().unwrap(), 3);
        assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
    }

    #[test]
    fn stop_with_a_dead_source_skips_the_last_group_sync() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "orders", None).unwrap();
        let groups = FakeGroups::default();
        let coord = attach(&mut c, &groups);
        *groups.dead.lock().unwrap() = true;
        c.command("m1", "orders", Command::Stop).unwrap();
        assert_eq!(*groups.rounds.lock().unwrap(), 1, "tried once");
        assert_eq!(
            state(&c, "orders", 0),
            Some(StateName::Stopped),
            "failover went on"
        );
        assert!(coord
            .lock()
            .unwrap()
            .committed("app", &TopicPartition::new("orders", 0))
            .is_none());
    }

    #[test]
    fn stop_promotes_before_stopped_and_a_failed_promotion_is_finished_later() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "orders", None).unwrap();
        *rig.data.fail_promotes.borrow_mut() = true;
        c.command("m1", "orders", Command::Stop).unwrap();
        assert!(rig.active().is_empty(), "fetchers are removed first");
        assert_eq!(
            state(&c, "orders", 0),
            Some(StateName::Stopping),
            "never STOPPED (writable) without promotion"
        );
        c.tick(now_ms()).unwrap();
        assert_eq!(state(&c, "orders", 0), Some(StateName::Stopping));
        drop(c); // kill -9 while STOPPING

        *rig.data.fail_promotes.borrow_mut() = false;
        let mut c = rig.open();
        c.tick(now_ms()).unwrap();
        assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
        assert_eq!(state(&c, "orders", 1), Some(StateName::Stopped));
        let promoted: BTreeSet<String> = rig
            .data
            .promoted
            .borrow()
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(
            promoted,
            BTreeSet::from(["orders-0".into(), "orders-1".into()])
        );
        assert_eq!(
            c.describe(Some("m1")).unwrap()[0].last_end_offset,
            Some(100)
        );
    }

    #[test]
    fn describe_reports_lag_and_list_the_source() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "payments", None).unwrap();
        let rows = c.describe(None).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].lag, Some(10));
        let secs = rows[0].lag_seconds.unwrap();
        assert!(
            (1.5..60.0).contains(&secs),
            "lag of a record stored 1.5 s ago: {secs}"
        );
        // Paused: no fetcher, so the high watermark comes from the source (ListOffsets).
        c.command("m1", "payments", Command::Pause).unwrap();
        let rows = c.describe(None).unwrap();
        assert_eq!((rows[0].source_offset, rows[0].lag), (Some(120), Some(30)));
        let list = c.list();
        assert_eq!(list[0].topics, 1);
        assert_eq!(list[0].source_cluster_id.as_deref(), Some("c1"));
        assert_eq!(list[0].source_bootstrap_servers, "src:9092");
    }

    #[test]
    fn errors_name_the_problem() {
        let rig = Rig::new();
        let mut c = rig.open();
        assert_eq!(
            c.start("nope", "x", None).unwrap_err().to_string(),
            "unknown mirror \"nope\""
        );
        c.create("m1", &props()).unwrap();
        assert!(matches!(
            c.create("m1", &props()),
            Err(ControlError::MirrorExists(_))
        ));
        assert!(c
            .start("m1", "orders-(", None)
            .unwrap_err()
            .to_string()
            .starts_with("bad regex \"orders-(\""));
        assert!(matches!(
            c.command("m1", "orders", Command::Pause),
            Err(ControlError::NoMatch { .. })
        ));
        c.create("m2", &props()).unwrap();
        c.start("m1", "orders", None).unwrap();
        assert_eq!(
            c.start("m2", "orders", None).unwrap_err().to_string(),
            "topic orders is already mirrored by m1"
        );
        *rig.source.0.borrow_mut() = Err("connection refused".into());
        assert_eq!(
            c.create("m3", &props()).unwrap_err().to_string(),
            "source of mirror m3 is unreachable: connection refused"
        );
        // A rejected command changes nothing: resume of a MIRRORING partition is a no-op,
        // pause of a STOPPED one is refused for all.
        c.command("m1", "orders", Command::Stop).unwrap();
        let err = c.command("m1", "orders", Command::Pause).unwrap_err();
        assert_eq!(err.status(), 409);
        assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
    }

    #[test]
    fn changed_cluster_id_fails_the_mirror_for_good() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "orders", None).unwrap();
        *rig.source.0.borrow_mut() = Ok(view("other"));
        let err = c.start("m1", "payments", None).unwrap_err();
        assert!(matches!(err, ControlError::ClusterChanged { .. }));
        let rows = c.describe(Some("m1")).unwrap();
        assert!(rows
            .iter()
            .all(|r| r.state == StateName::Failed && r.retry_attempt == -1));
        assert!(rig.active().is_empty());
        c.tick(i64::MAX).unwrap();
        assert_eq!(state(&c, "orders", 0), Some(StateName::Failed));
    }

    #[test]
    fn sync_follows_new_topics_added_partitions_and_deletions() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "orders.*", None).unwrap();
        assert_eq!(rig.active(), ["orders-0", "orders-1"]);
        {
            let mut v = rig.source.0.borrow_mut();
            let v = v.as_mut().unwrap();
            v.topics[0].partitions = 3; // orders grew
            v.topics.push(topic("orders-eu", 1)); // a new matching topic
            v.topics.push(topic("refunds", 1)); // not matching
        }
        c.sync().unwrap();
        assert_eq!(
            rig.active(),
            ["orders-0", "orders-1", "orders-2", "orders-eu-0"]
        );
        assert_eq!(state(&c, "orders", 2), Some(StateName::Mirroring));
        assert_eq!(state(&c, "refunds", 0), None);
        // The saved patterns survive a restart and keep being followed.
        drop(c);
        let mut c = rig.open();
        rig.source
            .0
            .borrow_mut()
            .as_mut()
            .unwrap()
            .topics
            .retain(|t| t.name != "orders-eu");
        c.sync().unwrap();
        let row = c
            .describe(Some("m1"))
            .unwrap()
            .into_iter()
            .find(|r| r.topic == "orders-eu")
            .unwrap();
        assert_eq!(row.state, StateName::Failed);
        assert_eq!(row.retry_attempt, -1);
        assert_eq!(row.error_message.as_deref(), Some(SOURCE_TOPIC_DELETED));
        assert!(!rig.active().contains(&"orders-eu-0".to_owned()));
        // A deleted topic is not resurrected by the next round, and stop still works.
        c.sync().unwrap();
        assert_eq!(state(&c, "orders-eu", 0), Some(StateName::Failed));
        c.command("m1", "orders-eu", Command::Stop).unwrap();
        assert_eq!(state(&c, "orders-eu", 0), Some(StateName::Stopped));
    }

    #[test]
    fn data_plane_failures_fail_the_partition_and_retry() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "payments", None).unwrap();
        let tp = TopicPartition::new("payments", 0);
        rig.data.active.borrow_mut().remove(&tp);
        rig.data.failures.borrow_mut().push((
            tp.clone(),
            Fault {
                message: "append failed: disk full".into(),
                retryable: true,
            },
        ));
        let now = now_ms();
        c.tick(now).unwrap();
        let row = &c.describe(Some("m1")).unwrap()[0];
        assert_eq!(row.state, StateName::Failed);
        assert_eq!(
            row.error_message.as_deref(),
            Some("append failed: disk full")
        );
        assert_eq!(row.retry_attempt, 1);
        // Survives a restart, then retries once the backoff has passed.
        drop(c);
        let mut c = rig.open();
        assert_eq!(state(&c, "payments", 0), Some(StateName::Failed));
        c.tick(now + 5_000).unwrap();
        assert_eq!(state(&c, "payments", 0), Some(StateName::Mirroring));
        assert_eq!(rig.active(), ["payments-0"]);
    }

    #[test]
    fn divergence_fails_the_partition_without_retry() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "payments", None).unwrap();
        let tp = TopicPartition::new("payments", 0);
        rig.data.active.borrow_mut().remove(&tp);
        let why = "source log diverged from ours: the source topic was deleted and recreated";
        rig.data.failures.borrow_mut().push((
            tp.clone(),
            Fault {
                message: why.into(),
                retryable: false,
            },
        ));
        c.tick(now_ms()).unwrap();
        let row = &c.describe(Some("m1")).unwrap()[0];
        assert_eq!(row.state, StateName::Failed);
        assert_eq!(row.error_message.as_deref(), Some(why));
        assert_eq!(row.retry_attempt, -1);
        // No automatic retry, however long we wait: fetching again would not help.
        c.tick(i64::MAX).unwrap();
        assert_eq!(state(&c, "payments", 0), Some(StateName::Failed));
        assert!(rig.active().is_empty());
    }

    #[test]
    fn failed_fetcher_start_retries_after_backoff() {
        let rig = Rig::new();
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        *rig.data.fail_adds.borrow_mut() = true;
        c.start("m1", "payments", None).unwrap();
        let row = &c.describe(Some("m1")).unwrap()[0];
        assert_eq!(row.state, StateName::Failed);
        assert_eq!(row.retry_attempt, 1);
        assert_eq!(row.error_message.as_deref(), Some("connection refused"));
        *rig.data.fail_adds.borrow_mut() = false;
        c.tick(now_ms() + 1_000).unwrap();
        assert_eq!(state(&c, "payments", 0), Some(StateName::Mirroring));
        assert_eq!(rig.active(), ["payments-0"]);
    }

    fn dynamic(name: &str, value: &str) -> SourceConfigEntry {
        SourceConfigEntry {
            name: name.into(),
            value: Some(value.into()),
            source: topic_configs::SOURCE_DYNAMIC_TOPIC,
        }
    }

    #[test]
    fn topic_configs_are_copied_persisted_replayed_and_bad_ones_kept_out() {
        let rig = Rig::new();
        rig.source.1.borrow_mut().insert(
            "orders".into(),
            vec![
                dynamic("retention.ms", "60000"),
                dynamic("cleanup.policy", "compact"),
                dynamic("min.insync.replicas", "2"),
            ],
        );
        let mut c = rig.open();
        c.create("m1", &props()).unwrap();
        c.start("m1", "orders", None).unwrap();
        let applied = rig.data.configs.borrow()["orders"].clone();
        assert_eq!(applied.retention_ms, Some(60_000));
        assert!(!applied.cleanup.delete && applied.cleanup.compact);
        assert_eq!(
            applied.topic_configs.keys().collect::<Vec<_>>(),
            ["cleanup.policy", "retention.ms"],
            "min.insync.replicas is never copied"
        );
        // A change on the source is applied by the next sync.
        rig.source.1.borrow_mut().get_mut("orders").unwrap()[0] = dynamic("retention.ms", "120000");
        c.sync().unwrap();
        assert_eq!(
            rig.data.configs.borrow()["orders"].retention_ms,
            Some(120_000)
        );
        // A value kmirror cannot apply leaves the previous config and shows in describe.
        rig.source.1.borrow_mut().get_mut("orders").unwrap()[0] = dynamic("retention.ms", "0");
        c.sync().unwrap();
        assert_eq!(
            rig.data.configs.borrow()["orders"].retention_ms,
            Some(120_000)
        );
        let row = c.describe(Some("m1")).unwrap().remove(0);
        let why = row.config_error.expect("the refused config is reported");
        assert!(why.starts_with("retention.ms=0"), "{why}");
        assert_eq!(row.state, StateName::Mirroring);
        // A restart applies the stored configs before the partitions get fetchers, without
        // asking the source.
        drop(c);
        rig.data.configs.borrow_mut().clear();
        *rig.source.0.borrow_mut() = Err("connection refused".into());
        let c = rig.open();
        assert_eq!(
            rig.data.configs.borrow()["orders"].retention_ms,
            Some(120_000)
        );
        assert_eq!(rig.active(), ["orders-0", "orders-1"]);
        // Deleting the mirror drops its stored configs.
        drop(c);
        *rig.source.0.borrow_mut() = Ok(view("c1"));
        let mut c = rig.open();
        c.command("m1", "orders", Command::Stop).unwrap();
        c.delete("m1").unwrap();
        drop(c);
        rig.data.configs.borrow_mut().clear();
        let _c = rig.open();
        assert!(rig.data.configs.borrow().is_empty());
    }
}
