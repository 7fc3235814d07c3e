//! The owner of all mirror state: applies operator commands and data-plane observations to the
//! per-partition state machines, persists every change in `__mirror_state` before acting on
//! it, and tells the data plane which partitions to fetch.
//!
//! The controller never waits on a source. Every source call is a job for a source worker
//! (`control::source_worker`): the periodic ones (source sync, group-offset sync, `describe`'s
//! offsets of idle partitions) are started by `tick` and their answers come back as
//! `SourceResult` messages that a later `tick` applies; the ones an operator command needs
//! (`create`, `start`, `check_source`, `stop --promote`, the last group sync at `stop`) are
//! split in two: the command hands out a `SourceAsk` and the admin API runs it on a worker
//! without holding the controller, then gives the answer back (`*_finish`). The blocking
//! wrappers (`create`, `start`, ...) run the ask on the caller's thread, for tools and tests.
//!
//! | module           | job                                                              |
//! |------------------|------------------------------------------------------------------|
//! | (this)           | state, persistence, data-plane orders, the tick                  |
//! | `lifecycle`      | operator commands: create, start, pause/resume/stop, promote, delete |
//! | `source_sync`    | topic discovery, copied topic configs, source offsets of idle partitions |
//! | `group_schedule` | when group-offset syncs run, and the last one at `stop`          |
//! | `acl_schedule`   | when ACL syncs run; synced ACLs stored and put in force          |
//! | `reporting`      | `list`, `describe`, the states for `/metrics`                    |
//!
//! The source cluster and the data plane are traits so the lifecycle rules are tested on their
//! own; `source_catalog` implements the source side with the blocking Kafka client.

mod acl_schedule;
mod audit_schedule;

mod drills;
mod failback;
mod group_schedule;
mod lifecycle;
mod loss;
mod repoint;
mod reporting;
mod source_sync;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::mpsc;

use serde::Serialize;
use uuid::Uuid;

use crate::control::mirror_def::{DefinitionError, MirrorDefinition, MirrorName, StartFrom};
use crate::control::records::{
    last_mirror_epoch, LastMirrorEpochValue, MirrorRecord, PartitionStateValue, StateKey,
    StateValue,
};
use crate::control::source_catalog::Deadline;
use crate::control::source_worker::{Busy, JobKey, SourceWorkers};
use crate::control::state::{Event, Outcome, PartitionMachine, RetryPolicy, StateError, StateName};
use crate::control::state_log::{StateLog, StateLogError};
use crate::control::topic_configs::TopicConfigs;
use crate::ids::{MirrorEpoch, Offset, TopicPartition};
use crate::limits::{MIRROR_SYNC_INTERVAL_MS_DEFAULT, SOURCE_REQUEST_TIMEOUT_MS_DEFAULT};
use crate::log::config::LogConfig;
use crate::log::partition_log::Promotion;

pub use crate::control::fault::Fault;
pub use crate::control::source_catalog::{SourceCatalog, SourceTopic, SourceView};
pub use acl_schedule::{AclSyncPlane, AclSyncStatus};
pub use group_schedule::{FinalSync, GroupSyncPlane};
pub use lifecycle::{PromotePlan, StartAnswer, StartPlan, StartReply};
pub use loss::{LossListing, LossPlan};
pub use repoint::{RepointAnswer, RepointPlan, RepointReport};
pub use reporting::{CommandReport, MirrorSummary, PartitionRow, SourceCheck};

/// What the data plane knows about one partition it fetches (or fetched).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Progress {
    pub local_log_end: Option<i64>,
    pub source_high_watermark: Option<i64>,
    /// When (wall-clock ms) a fetch response last carried `source_high_watermark`.
    #[serde(default)]
    pub source_high_watermark_at_ms: Option<i64>,
    /// Max timestamp (ms) of the newest batch stored, when the data plane saw one stored.
    pub newest_timestamp_ms: Option<i64>,
    /// Throttle time the source's quotas imposed on the partition's connection, summed (ms).
    pub throttled_ms: Option<i64>,
    /// Offsets never mirrored because the source's log start passed our log end (an offset
    /// gap in the local log), summed since this process started.
    pub skipped_records: i64,
    /// Why appends are paused and retried (a full disk), while they are.
    pub stalled: Option<String>,
    /// Unclean-election recoveries: cuts to the source's divergence point, the cut records
    /// in the quarantine (`control::unclean_recovery`).
    #[serde(default)]
    pub unclean: crate::control::unclean_recovery::UncleanRecoveries,
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
    /// Creates the local logs of `partitions` that have none yet, all together (a start of
    /// thousands of partitions; `add` would create each on its own, with its own syncs).
    /// Returns how many it created. A failure leaves `add` to create (and report) them.
    fn prepare_logs(&mut self, partitions: &[(TopicPartition, Uuid)]) -> Result<usize, String>;
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
    /// `promote` for every partition of `tps` (a stop of thousands: each promotion creates a
    /// segment, a snapshot and an epoch file, which a data plane may do on threads). One result
    /// per partition, in the order of `tps`.
    fn promote_many(&mut self, tps: &[TopicPartition]) -> Vec<Result<Promotion, String>> {
        tps.iter().map(|tp| self.promote(tp)).collect()
    }
    /// Makes the promotions since the last call durable: the recovery-point checkpoint, written
    /// once for all of them (it lists every partition). Until it is written a restart promotes
    /// them again, so a partition becomes STOPPED only after it.
    fn checkpoint_promotions(&mut self) -> Result<(), String>;
    /// Makes a STOPPED (promoted) partition writable for clients; repeatable (a restart calls
    /// it for every STOPPED partition).
    fn writable(&mut self, tp: &TopicPartition) -> Result<(), String>;
    /// The consistent cut of a partition whose fetcher is gone, before its promotion
    /// (`control::consistent_cut`): batches newer than `ts` to the quarantine under `label`.
    fn cut_at_timestamp(
        &mut self,
        tp: &TopicPartition,
        ts: crate::ids::TimestampMs,
        label: &str,
    ) -> Result<crate::control::consistent_cut::CutReport, String> {
        let _ = (tp, ts, label);
        Err("this data plane cannot cut logs".to_owned())
    }
    /// A drill's writable clone of `tp` as `clone_tp` (`control::drill`), promoted and served:
    /// the mirrored end it was taken at and what it cost on disk.
    fn drill_clone(
        &mut self,
        tp: &TopicPartition,
        clone_tp: &TopicPartition,
        clone_topic_id: Uuid,
    ) -> Result<(i64, crate::control::drill::CloneCost), String> {
        let _ = (tp, clone_tp, clone_topic_id);
        Err("this data plane cannot clone logs".to_owned())
    }
    /// Deletes a drill's clone (only its own files: shared ones keep the mirror's link).
    fn drill_drop(&mut self, clone_tp: &TopicPartition) -> Result<(), String> {
        let _ = clone_tp;
        Err("this data plane cannot clone logs".to_owned())
    }
    /// This kmirror's own cluster id as its Kafka endpoint tells it (`serve::cluster_id`);
    /// `None` without an endpoint (then no mirror can follow us, nor make a loop through us).
    fn own_cluster_id(&self) -> Option<String> {
        None
    }
    /// Our tail of `tp` for a re-point's history check (`control::lineage`): `None` when no
    /// local log exists, `Err` when its last batch cannot be read back.
    fn local_tail(
        &self,
        tp: &TopicPartition,
    ) -> Option<Result<crate::control::lineage::LocalTail, String>> {
        let _ = tp;
        None
    }
    /// Every partition with a local log (mirrored, failed over or left by an earlier mirror).
    fn local_partitions(&self) -> Vec<TopicPartition> {
        Vec::new()
    }
    /// Partitions whose fetching stopped on its own since the last call, with the reason.
    fn poll_failures(&mut self) -> Vec<(TopicPartition, Fault)> {
        Vec::new()
    }
    /// Partitions whose log was truncated on its own since the last call (an unclean-election
    /// recovery, `control::unclean_recovery`), with the new log end.
    fn poll_truncations(&mut self) -> Vec<(TopicPartition, Offset)> {
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
    /// The source did not answer within the call's deadline (black-holed, frozen).
    #[error("source of mirror {mirror} did not answer within {ms} ms: {reason}")]
    SourceTimeout {
        mirror: String,
        ms: u64,
        reason: String,
    },
    /// The same kind of source call for this mirror is still waiting for its answer.
    #[error("source of mirror {mirror}: {reason}")]
    SourceBusy { mirror: String, reason: String },
    /// The source refused the mirror's credentials or certificates; the reason says which.
    #[error("source of mirror {mirror} refused the connection: {reason}")]
    Refused { mirror: String, reason: String },
    #[error("source cluster id changed from {stored} to {seen}; mirror {mirror} is FAILED")]
    ClusterChanged {
        mirror: String,
        stored: String,
        seen: String,
    },
    /// `repoint` (or a `start` taking over local data) found a partition whose history the
    /// source does not hold, or could not tell; nothing was changed.
    #[error("{action} of mirror {mirror} refused, nothing changed: {partitions}")]
    HistoryRefused {
        action: &'static str,
        mirror: String,
        partitions: String,
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
    /// `stop --max-loss-seconds S` would lose more than S seconds; nothing was changed.
    #[error("stop of mirror {mirror} refused: it may lose more than {max_seconds} s (use --force to fail over anyway): {partitions}")]
    LossTooHigh {
        mirror: String,
        max_seconds: f64,
        partitions: String,
    },
    /// The stored loss reports could not be read.
    #[error("{0}")]
    LossReports(String),
    /// A drill could not be started or stopped; the message says why.
    #[error("{0}")]
    Drill(String),
    #[error("no drill named {0:?}")]
    UnknownDrill(String),
    /// A consistent cut could not be recorded; the stop was not begun.
    #[error("{0}")]
    Cut(String),
    /// Synced ACLs could not be kept (the authorizer's store failed).
    #[error("{0}")]
    Acls(String),
    /// `mirrors failback ...` (`control::failback`).
    #[error(transparent)]
    Failback(#[from] crate::control::failback::FailbackError),
}

impl ControlError {
    /// The HTTP status the admin API answers with.
    pub fn status(&self) -> u16 {
        match self {
            ControlError::UnknownMirror(_) | ControlError::NoMatch { .. } => 404,
            ControlError::MirrorExists(_)
            | ControlError::TopicInOtherMirror { .. }
            | ControlError::NotEmpty { .. }
            | ControlError::State { .. }
            | ControlError::HistoryRefused { .. } => 409,
            ControlError::Definition(_) | ControlError::NoTopics => 400,
            ControlError::Source { .. } | ControlError::ClusterChanged { .. } => 502,
            ControlError::Refused { .. } => 401,
            ControlError::SourceTimeout { .. } => 504,
            ControlError::SourceBusy { .. } => 503,
            // "Not yet": the CLI asks again until its --promote-timeout-ms.
            ControlError::Lagging { .. } => 503,
            ControlError::Store(_) => 500,
            ControlError::LossTooHigh { .. } => 409,
            ControlError::LossReports(_) => 500,
            ControlError::Drill(_) => 409,
            ControlError::UnknownDrill(_) => 404,
            ControlError::Cut(_) => 500,
            ControlError::Acls(_) => 500,
            ControlError::Failback(e) => e.status(),
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
    /// Each topic's upstream chain (`control::lineage::chain`), kept with its configs.
    lineages: BTreeMap<String, Vec<crate::control::lineage::chain::Link>>,
}

fn source_error(name: &MirrorName, fault: Fault, ms: u64) -> ControlError {
    if fault.timed_out {
        ControlError::SourceTimeout {
            mirror: name.to_string(),
            ms,
            reason: fault.message,
        }
    } else if fault.retryable {
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
    /// Where source calls run, and the queue their answers come back on.
    workers: SourceWorkers,
    results_tx: mpsc::Sender<SourceResult>,
    results_rx: mpsc::Receiver<SourceResult>,
    /// Deadline of every source call (`fetch.request_timeout_ms`).
    source_timeout_ms: u64,
    /// Mirrors whose `stop` waits for its last group sync: their STOPPING partitions are not
    /// failed over by `tick` until the stop finishes (or this time, in ms, passes).
    stop_holds: BTreeMap<MirrorName, i64>,
    /// The source high watermark of partitions without a fetcher, as last listed, with when.
    idle_offsets: BTreeMap<TopicPartition, (i64, i64)>,
    /// While a lifecycle command runs (`batched`): the `__mirror_state` records it wrote so
    /// far, held back to be written with one append.
    deferred: Option<Vec<(StateKey, StateValue)>>,

    /// The integrity audit, once attached (`attach_audit`).
    audit: Option<crate::control::audit::AuditPlane>,

    /// `stop --cut-at-timestamp`: the mirror's cut while its partitions fail over (`loss.rs`).
    cuts: BTreeMap<MirrorName, loss::PendingCut>,
    /// Failover drills in progress, by name (`drills.rs`; recorded in `kmirror-drills/`).
    drills: BTreeMap<String, crate::control::drill::DrillSummary>,
    /// ACL sync, once attached (`attach_acl_sync`), and each mirror's synced ACLs as stored.
    acl_sync: Option<acl_schedule::AclSyncPlane>,
    synced_acls: BTreeMap<MirrorName, acl_schedule::MirrorAcls>,
    /// Failback to the original clusters, once attached (`failback.rs`).
    failback: Option<crate::control::failback::FailbackPlane>,
}

/// A source call a command needs before it can finish: run it on a source worker (the admin
/// API) or here (`run_here`, tools and tests), then hand the answer to the command's finish.
pub struct SourceAsk<T> {
    pub key: JobKey,
    /// The call's whole deadline.
    pub timeout_ms: u64,
    job: Box<dyn FnOnce(Deadline) -> T + Send>,
}

impl<T> SourceAsk<T> {
    fn new(key: JobKey, timeout_ms: u64, job: impl FnOnce(Deadline) -> T + Send + 'static) -> Self {
        SourceAsk {
            key,
            timeout_ms,
            job: Box::new(job),
        }
    }

    /// Runs the call on this thread, with its deadline.
    pub fn run_here(self) -> T {
        (self.job)(Deadline::after_ms(self.timeout_ms))
    }

    /// Runs the call on a source worker; the answer is sent on the returned channel.
    pub fn spawn(self, workers: &SourceWorkers) -> Result<tokio::sync::oneshot::Receiver<T>, Busy>
    where
        T: Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let timeout_ms = self.timeout_ms;
        let job = self.job;
        workers.spawn(self.key, move || {
            let _ = tx.send(job(Deadline::after_ms(timeout_ms)));
        })?;
        Ok(rx)
    }
}

/// The answer of a periodic source call, applied by the next `tick`.
enum SourceResult {
    Sync(source_sync::SyncAnswer),
    IdleOffsets(source_sync::IdleAnswer),
    Groups(group_schedule::GroupsAnswer),
    Audit(crate::control::audit::RoundAnswer),
    Acls(acl_schedule::AclsAnswer),
}

/// The message of the non-retryable failure of a partition whose source topic is gone.
pub const SOURCE_TOPIC_DELETED: &str = "source topic is deleted";

impl<S: SourceCatalog, D: DataPlane> Controller<S, D> {
    /// Loads every mirror from `__mirror_state`, bumps each mirror's epoch (it grows on every
    /// start of kmirror) and hands the partitions that were being mirrored back to the data
    /// plane. Contacts no source: the data plane looks leaders up on its own workers.
    pub fn open(
        store: StateLog,
        policy: RetryPolicy,
        source: S,
        data: D,
    ) -> Result<Self, ControlError> {
        let mut mirrors: BTreeMap<MirrorName, MirrorEntry> = BTreeMap::new();
        let mut synced_acls: BTreeMap<MirrorName, acl_schedule::MirrorAcls> = BTreeMap::new();
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
                        lineages: BTreeMap::new(),
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
                    if !v.lineage.is_empty() {
                        entry.lineages.insert(topic.clone(), v.lineage);
                    }
                    entry.configs.insert(topic, v.configs);
                }
                (StateKey::SyncedAcl(m, acl), StateValue::SyncedAcl(v)) => {
                    synced_acls
                        .entry(m)
                        .or_default()
                        .acls
                        .insert(acl, v.synced_at_ms);
                }
                _ => {}
            }
        }
        let (results_tx, results_rx) = mpsc::channel();
        let mut c = Controller {
            store,
            mirrors,
            policy,
            source,
            data,
            sync_interval_ms: MIRROR_SYNC_INTERVAL_MS_DEFAULT as i64,
            next_sync_ms: 0,
            group_sync: None,
            workers: SourceWorkers::threaded(),
            results_tx,
            results_rx,
            source_timeout_ms: u64::from(SOURCE_REQUEST_TIMEOUT_MS_DEFAULT),
            stop_holds: BTreeMap::new(),
            idle_offsets: BTreeMap::new(),
            deferred: None,

            audit: None,

            cuts: BTreeMap::new(),
            drills: BTreeMap::new(),
            acl_sync: None,
            synced_acls,
            failback: None,
        };
        // Before the reconcile: a cut under way applies to the failovers it finishes.
        c.restore_cuts();
        let names: Vec<MirrorName> = c.mirrors.keys().cloned().collect();
        for name in names {
            c.bump_epoch(&name)?;
            // The copied configs are in force before any partition is handed to a shard.
            c.apply_stored_configs(&name);
            c.reconcile(&name)?;
        }
        c.settle_cuts();
        // After the mirrors: a drill's clones take their drilled topics' copied configs.
        c.restore_drills();
        Ok(c)
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
            self.put_state(
                StateKey::Partition(name.clone(), tp.clone()),
                StateValue::Partition(v),
            )?;
        }
        Ok(())
    }

    /// A `__mirror_state` write: held back while a command runs `batched`, else at once.
    fn put_state(&mut self, key: StateKey, value: StateValue) -> Result<(), ControlError> {
        match &mut self.deferred {
            Some(records) => records.push((key, value)),
            None => self.store.put(&key, &value)?,
        }
        Ok(())
    }

    /// Runs one step of a lifecycle command with its `__mirror_state` writes held back, then
    /// writes them with one append and one sync, so a command over thousands of partitions
    /// costs one write, not one per partition (`pause` of 5,000 partitions used to take
    /// 5,000 fsyncs under the controller lock). What `f` changed in memory before failing is
    /// still written, as the per-partition writes were. A step must end here before anything
    /// a crash must not outlive happens on the strength of its records (failover promotes
    /// partitions only after STOPPING is on disk: `command_begin` is its own step).
    fn batched<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, ControlError>,
    ) -> Result<T, ControlError> {
        assert!(self.deferred.is_none(), "batched steps do not nest");
        self.deferred = Some(Vec::new());
        let result = f(self);
        let records = self.deferred.take().unwrap_or_default();
        let written = self.store.put_many(&records);
        let value = result?;
        written?;
        Ok(value)
    }

    /// `__mirror_state` appends since the controller opened (tests count them per command).
    pub fn state_writes(&self) -> u64 {
        self.store.writes()
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
        let starting: Vec<(TopicPartition, Uuid)> = work
            .iter()
            .filter(|(_, _, state)| {
                matches!(state, Some(StateName::LogAlignment | StateName::Mirroring))
            })
            .map(|(tp, id, _)| (tp.clone(), *id))
            .collect();
        if starting.len() > 1 {
            if let Err(why) = self.data.prepare_logs(&starting) {
                tracing::warn!(mirror = %name, partitions = starting.len(), %why, "local logs not created together; each is created as it starts");
            }
        }
        let mut to_promote = Vec::new();
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
                Some(StateName::Stopping) => {
                    if let Some(end) = self.prepare_failover(name, &tp) {
                        to_promote.push((tp, end));
                    }
                }
                Some(StateName::Stopped) => {
                    if let Err(why) = self.data.writable(&tp) {
                        tracing::error!(mirror = %name, partition = %tp, %why, "stopped partition not writable");
                    }
                }
                _ => {}
            }
        }
        let promoted = self.promote_all(name, to_promote);
        self.finish_failovers(name, epoch, promoted)
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

    /// STOPPING, first half of a failover: the fetcher removed and the cut made
    /// (`stop --cut-at-timestamp`); returns the mirrored end. `promote_all` then promotes every
    /// partition so prepared at once. Each step is repeatable, so a crash or a failed step
    /// (`None`) leaves the partition STOPPING and the next reconcile finishes it. It becomes
    /// STOPPED in `finish_failovers`, once its promotion is durable.
    fn prepare_failover(&mut self, name: &MirrorName, tp: &TopicPartition) -> Option<Offset> {
        let end = match self.data.remove(tp) {
            Ok(end) => end,
            Err(message) => {
                tracing::warn!(mirror = %name, partition = %tp, %message, "stop: fetcher not removed yet");
                return None;
            }
        };
        // A consistent cut between the fetcher's removal and the promotion; a failed cut
        // leaves the partition STOPPING, retried like a promotion.
        match self.cut_before_promotion(name, tp) {
            Ok(Some(after)) => Some(after),
            Ok(None) => Some(end),
            Err(message) => {
                tracing::error!(mirror = %name, partition = %tp, %message, "stop: consistent cut failed; retrying");
                None
            }
        }
    }

    /// Promotes every prepared partition in one `promote_many` (a failed one stays STOPPING and
    /// is promoted again by the next reconcile).
    fn promote_all(
        &mut self,
        name: &MirrorName,
        prepared: Vec<(TopicPartition, Offset)>,
    ) -> Vec<(TopicPartition, (Offset, Promotion))> {
        if prepared.is_empty() {
            return Vec::new();
        }
        let tps: Vec<TopicPartition> = prepared.iter().map(|(tp, _)| tp.clone()).collect();
        let results = self.data.promote_many(&tps);
        assert_eq!(
            results.len(),
            tps.len(),
            "one promotion result per partition"
        );
        let mut promoted = Vec::with_capacity(tps.len());
        for ((tp, end), result) in prepared.into_iter().zip(results) {
            match result {
                Ok(promotion) => promoted.push((tp, (end, promotion))),
                Err(message) => {
                    tracing::error!(mirror = %name, partition = %tp, %message, "stop: promotion failed; retrying");
                }
            }
        }
        promoted
    }

    /// Promoted → STOPPED for every partition this reconcile promoted: one recovery-point
    /// checkpoint makes all their promotions durable (one per partition made a stop of 5,000
    /// partitions write 5,000 × 5,000 checkpoint lines: 42 s), then each records its last
    /// mirror epoch and mirrored end offset and becomes STOPPED and writable. A failed
    /// checkpoint leaves them all STOPPING; the next reconcile promotes them again (repeatable).
    fn finish_failovers(
        &mut self,
        name: &MirrorName,
        epoch: MirrorEpoch,
        promoted: Vec<(TopicPartition, (Offset, Promotion))>,
    ) -> Result<(), ControlError> {
        if promoted.is_empty() {
            return Ok(());
        }
        if let Err(message) = self.data.checkpoint_promotions() {
            tracing::error!(mirror = %name, partitions = promoted.len(), %message, "stop: promotions not checkpointed; retrying");
            return Ok(());
        }
        for (tp, (end, promotion)) in promoted {
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
            self.put_state(
                StateKey::LastMirrorEpoch(name.clone(), tp.clone()),
                v.clone(),
            )?;
            if let StateValue::LastMirrorEpoch(lme) = v {
                if let Some(p) = self.entry_mut(name)?.partitions.get_mut(&tp) {
                    p.last = Some(lme);
                }
            }
            self.apply_event(name, &tp, Event::FetcherRemoved)?;
            if let Err(why) = self.data.writable(&tp) {
                tracing::error!(mirror = %name, partition = %tp, %why, "stopped partition not writable");
            }
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

    /// Periodic work: failures the data plane reported, answers of source calls, retries whose
    /// backoff elapsed, and the source and group syncs when due (started on workers; never
    /// waited for).
    pub fn tick(&mut self, now_ms: i64) -> Result<(), ControlError> {
        for (tp, fault) in self.data.poll_failures() {
            tracing::warn!(partition = %tp, why = %fault, "fetching stopped");
            self.partition_failed(&tp, fault.message, fault.retryable)?;
        }
        for (tp, end) in self.data.poll_truncations() {
            if let Some(audit) = self.audit.as_mut() {
                audit.truncated(&tp, end);
            }
        }
        if now_ms >= self.next_sync_ms {
            self.next_sync_ms = now_ms.saturating_add(self.sync_interval_ms);
            self.sync();
        }
        self.start_group_syncs(now_ms);
        self.start_audits(now_ms);
        self.start_acl_syncs(now_ms);
        self.apply_results()?;
        self.stop_holds.retain(|_, until| *until > now_ms);
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
            // ...unless its stop still waits for the last group sync.
            let held = self.stop_holds.contains_key(&name);
            if moved || (stopping && !held) {
                self.reconcile(&name)?;
            }
        }
        self.settle_cuts();
        Ok(())
    }

    /// Applies every source answer that came back since the last call.
    fn apply_results(&mut self) -> Result<(), ControlError> {
        while let Ok(result) = self.results_rx.try_recv() {
            match result {
                SourceResult::Sync(a) => self.apply_sync(a)?,
                SourceResult::IdleOffsets(a) => self.apply_idle_offsets(a),
                SourceResult::Groups(a) => self.apply_group_sync(a),
                SourceResult::Audit(a) => self.apply_audit(a)?,
                SourceResult::Acls(a) => self.apply_acl_sync(a)?,
            }
        }
        Ok(())
    }

    /// Runs a periodic source call on a worker; its answer is applied by a later tick. A call
    /// of the same kind for the same mirror still in flight (a source that does not answer)
    /// means this round is skipped.
    fn run_periodic(
        &self,
        key: JobKey,
        job: impl FnOnce(Deadline) -> SourceResult + Send + 'static,
    ) {
        let tx = self.results_tx.clone();
        let ms = self.source_timeout_ms;
        let what = key.clone();
        if let Err(busy) = self.workers.spawn(key, move || {
            let _ = tx.send(job(Deadline::after_ms(ms)));
        }) {
            tracing::debug!(?what, "source call skipped this round: {busy}");
        }
    }

    /// Where this controller's source calls run (the admin API runs command asks there).
    pub fn workers(&self) -> &SourceWorkers {
        &self.workers
    }

    /// Runs every periodic source call on the calling thread (unit tests and tools without a
    /// control loop).
    pub fn use_inline_workers(&mut self) {
        self.workers = SourceWorkers::inline();
    }

    /// The deadline of each source call (`fetch.request_timeout_ms`).
    pub fn set_source_timeout_ms(&mut self, ms: u64) {
        self.source_timeout_ms = ms.max(1);
    }

    pub fn source_timeout_ms(&self) -> u64 {
        self.source_timeout_ms
    }

    fn source_error(&self, name: &MirrorName, fault: Fault) -> ControlError {
        source_error(name, fault, self.source_timeout_ms)
    }

    /// Closes `__mirror_state` cleanly.
    pub fn close(mut self) -> Result<(), ControlError> {
        self.failback_shutdown();
        self.store.close()?;
        Ok(())
    }

    /// Closes `__mirror_state` cleanly and hands back the data plane (for its own shutdown).
    pub fn shutdown(mut self) -> Result<D, ControlError> {
        self.failback_shutdown();
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
