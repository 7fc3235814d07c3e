//! `DataPlane` over the real shards: partitions are handed to the shard their name hashes to
//! with `MirrorMsg::AddPartition` (their log lent out of the `LogDir`), and taken back with
//! `RemovePartition`, whose answer returns the log to the `LogDir`.
//!
//! Lives on the thread that started the `Runtime` (shard events unpark that thread).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::control::controller::{DataPlane, Fault, Progress};
use crate::control::leader_refresh::{LeaderRefresh, SourceAccess};
use crate::control::leader_store::LeaderStore;
use crate::control::mirror_def::{MirrorDefinition, StartFrom};
use crate::control::mirror_run::shard_for;
use crate::control::source_epochs::{promoted_epoch, SourceEpochs};
use crate::control::source_security::{fault_of, security_of};
use crate::control::state_log;
use crate::fetch::blocking::BlockingClient;
use crate::fetch::fetcher::{FetchConfig, PartitionStart};
use crate::fetch::list_offsets::{Listed, OffsetQuery};
use crate::fetch::security::AUTHENTICATION_FAILED;
use crate::ids::{Offset, ShardId, TopicPartition};
use crate::limits::{RETENTION_CHECK_INTERVAL_MS_DEFAULT, SHARD_REMOVE_WAIT_MS};
use crate::log::config::LogConfig;
use crate::log::io::StdIo;
use crate::log::log_dir::LogDir;
use crate::log::partition_log::Promotion;
use crate::log::read_view::ReadCatalog;
use crate::log::LogError;
use crate::ops::telemetry::{Telemetry, TelemetryError, TelemetryThread};
use crate::runtime::mirror_shard::{
    resume_point, MirrorEvent, MirrorMsg, MirrorShard, ReturnedLogs, SourceSpec,
};
use crate::runtime::progress::ProgressBoard;
use crate::runtime::{Runtime, RuntimeConfig, RuntimeError};

#[derive(Debug, thiserror::Error)]
pub enum ShardPlaneError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
}

/// The shards and the log dir they write into.
pub struct ShardDataPlane {
    rt: Option<Runtime<MirrorShard>>,
    logs: Option<LogDir>,
    returned: ReturnedLogs,
    fetch: FetchConfig,
    /// `fetch.request_timeout_ms`: how long past `max_wait_ms` a source response may take.
    request_timeout_ms: u32,
    /// Partitions a shard owns, with how to reach their source (for leader look-ups).
    lent: HashMap<TopicPartition, (ShardId, SourceAccess)>,
    /// What the shards publish about each partition (log end, source HW, newest timestamp).
    progress: ProgressBoard,
    /// Failures the shards reported (partition stopped for good), for the controller.
    failures: Vec<(TopicPartition, Fault)>,
    /// Failed-over partitions, written by clients through the Kafka endpoint.
    leaders: Arc<LeaderStore>,
    /// Latency collection and interval logs; stopped after the shards.
    telemetry: Option<TelemetryThread>,
    /// Leader look-ups the shards asked for.
    refresh: LeaderRefresh,
    /// Each topic's log config (from its copied source configs), for its partitions now and
    /// later; topics not here use the default.
    configs: HashMap<String, LogConfig>,
    /// Retention passes: how often, and when the next one is due.
    retention_every: Duration,
    next_retention: Instant,
    /// The highest leader epoch each partition's source leader was seen at (persisted), so a
    /// promotion leads above it even when the source moved on without writing.
    source_epochs: SourceEpochs,
}

impl ShardDataPlane {
    /// Opens the partition logs under `data_dir` and starts the shards. Call before opening
    /// `__mirror_state`: the log dir's scan finds that partition too and leaves it alone.
    pub fn start(
        data_dir: &Path,
        runtime: &RuntimeConfig,
        fetch: FetchConfig,
        request_timeout_ms: u32,
    ) -> Result<ShardDataPlane, ShardPlaneError> {
        let mut logs = LogDir::open(data_dir, LogConfig::default(), &mut StdIo)?;
        // `__mirror_state` belongs to the state log and `__consumer_offsets` to the group
        // coordinator; each reopens its own right after.
        drop(logs.take(&TopicPartition::new(state_log::TOPIC, 0)));
        drop(logs.take(&TopicPartition::new(
            crate::serve::groups::offsets::TOPIC,
            0,
        )));
        // ...and `__transaction_state` to the transaction coordinator.
        drop(logs.take(&TopicPartition::new(crate::serve::txn::store::TOPIC, 0)));
        let returned: ReturnedLogs = Arc::new(Mutex::new(Vec::new()));
        let shard_returned = Arc::clone(&returned);
        let progress = ProgressBoard::default();
        let board = progress.clone();
        let leaders = Arc::new(LeaderStore::new());
        let max_seen = logs
            .partitions()
            .filter_map(|(_, l)| l.max_producer_id())
            .max();
        leaders.open_producer_ids(data_dir, max_seen)?;
        let source_epochs = SourceEpochs::open(data_dir)?;
        let rt = Runtime::start(runtime, move |_| {
            MirrorShard::new(Arc::clone(&shard_returned)).with_progress(board.clone())
        })?;
        let telemetry = TelemetryThread::start(rt.stats().to_vec(), data_dir)?;
        Ok(ShardDataPlane {
            telemetry: Some(telemetry),
            rt: Some(rt),
            logs: Some(logs),
            returned,
            fetch,
            request_timeout_ms,
            lent: HashMap::new(),
            progress,
            failures: Vec::new(),
            leaders,
            refresh: LeaderRefresh::new(fetch),
            configs: HashMap::new(),
            retention_every: Duration::from_millis(RETENTION_CHECK_INTERVAL_MS_DEFAULT),
            next_retention: Instant::now()
                + Duration::from_millis(RETENTION_CHECK_INTERVAL_MS_DEFAULT),
            source_epochs,
        })
    }

    /// How often retention runs (`admin.retention_check_interval_ms`).
    pub fn set_retention_check_interval(&mut self, every: Duration) {
        self.retention_every = every;
        self.next_retention = Instant::now() + every;
    }

    /// A retention pass over every partition log: the shards get `EnforceRetention` for the
    /// logs they own (they delete between fetches, no lock), the logs held here (paused,
    /// failed) and the failed-over ones are done on this thread.
    pub fn enforce_retention(&mut self, now_ms: i64) {
        for shard in 0..self.rt().shard_count() {
            let shard = ShardId(shard as _);
            if self
                .rt()
                .send(shard, MirrorMsg::EnforceRetention { now_ms })
                .is_err()
            {
                tracing::warn!(shard = shard.0, "retention pass skipped: mailbox full");
            }
        }
        self.take_returned();
        let tps: Vec<TopicPartition> = self.logs().partitions().map(|(tp, _)| tp.clone()).collect();
        for tp in tps {
            if let Some(Err(e)) = self
                .logs()
                .get_mut(&tp)
                .map(|l| l.delete_old_segments(&mut StdIo, now_ms))
            {
                tracing::error!(partition = %tp, "retention failed: {e}");
            }
        }
        for why in self.leaders.enforce_retention(now_ms) {
            tracing::error!("{why}");
        }
    }

    /// The failed-over partitions, for the Kafka endpoint's writes.
    pub fn leaders(&self) -> Arc<LeaderStore> {
        Arc::clone(&self.leaders)
    }

    /// Announces every partition log (now and later) to the Kafka endpoint's catalog.
    pub fn attach_read_catalog(&mut self, catalog: Arc<ReadCatalog>) {
        self.logs().attach_catalog(catalog);
    }

    fn rt(&mut self) -> &mut Runtime<MirrorShard> {
        self.rt.as_mut().expect("runtime lives until stop")
    }

    fn logs(&mut self) -> &mut LogDir {
        self.logs.as_mut().expect("log dir lives until stop")
    }

    /// Logs the shards handed back go back into the log dir.
    fn take_returned(&mut self) {
        let back: Vec<_> = {
            let mut r = self.returned.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut *r)
        };
        for mut log in back {
            // A config sent while the log was on its way back never reached it.
            if let Some(config) = self.configs.get(&log.topic_partition().topic) {
                if let Err(e) = log.set_config(config.clone()) {
                    tracing::error!(partition = %log.topic_partition(), "topic configs not applied: {e}");
                }
            }
            self.logs().restore(log);
        }
    }

    /// Handles shard events until `until` says the awaited one came, or the wait ends.
    fn pump(&mut self, wait: Duration, mut until: impl FnMut(&MirrorEvent) -> bool) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((_, event)) = self.rt().next_event(left) else {
                return false;
            };
            let done = until(&event);
            match event {
                MirrorEvent::PartitionStopped { tp, why, retryable } => {
                    tracing::error!(partition = %tp, %why, "partition stopped");
                    self.lent.remove(&tp);
                    self.refresh.forget(&tp);
                    // A refused login or certificate stays refused until the operator acts.
                    let retryable = retryable && !why.starts_with(AUTHENTICATION_FAILED);
                    self.failures.push((
                        tp,
                        Fault {
                            message: why,
                            retryable,
                        },
                    ));
                }
                MirrorEvent::PartitionRemoved { tp, log_end } => {
                    tracing::info!(partition = %tp, %log_end, "partition handed back");
                    self.lent.remove(&tp);
                    self.refresh.forget(&tp);
                }
                MirrorEvent::LeaderWanted { tp, why } => {
                    tracing::info!(partition = %tp, %why, "looking up the source leader");
                    if let Some((_, access)) = self.lent.get(&tp) {
                        let access = access.clone();
                        self.refresh.want(tp, access, Instant::now());
                    }
                }
                MirrorEvent::Notice { what } => tracing::warn!("{what}"),
                MirrorEvent::PartitionAdded { tp } => {
                    tracing::info!(partition = %tp, "partition added")
                }
            }
            self.take_returned();
            if done {
                return true;
            }
        }
    }

    /// Looks up the leaders now due and sends each answer to the partition's shard.
    fn answer_leaders(&mut self) {
        if self.refresh.pending() == 0 {
            return;
        }
        let now = Instant::now();
        for (found, access) in self.refresh.run_due(now) {
            let Some((shard, _)) = self.lent.get(&found.tp) else {
                continue;
            };
            if let Err(e) = self.source_epochs.raise(&found.tp, found.leader_epoch) {
                tracing::error!(partition = %found.tp, "source leader epoch not persisted: {e}");
            }
            let msg = MirrorMsg::Releader {
                tp: found.tp.clone(),
                source: found.source.clone(),
                topic_id: found.topic_id,
                leader_epoch: found.leader_epoch,
            };
            let shard = *shard;
            if self.rt().send(shard, msg).is_err() {
                self.refresh.retry_soon(&found, access, now);
            }
        }
    }

    /// Stops the shards (they hand every log back) and closes the log dir cleanly.
    pub fn stop(mut self) -> Result<(), ShardPlaneError> {
        if let Some(rt) = self.rt.take() {
            rt.stop();
        }
        // After the shards: their last intervals are in the queues and get logged now.
        drop(self.telemetry.take());
        self.take_returned();
        for log in self.leaders.take_all() {
            self.logs().restore(log);
        }
        if let Some(logs) = self.logs.take() {
            logs.close(&mut StdIo)?;
        }
        Ok(())
    }

    fn source_for(
        &self,
        mirror: &MirrorDefinition,
        tp: &TopicPartition,
        start: StartFrom,
    ) -> Result<(SourceSpec, crate::ids::LeaderEpoch, Option<Offset>), Fault> {
        let client_id = &mirror.source.client_id;
        let security = std::sync::Arc::new(security_of(&mirror.source)?);
        let mut errors = Vec::new();
        for addr in &mirror.source.bootstrap_servers {
            let md = match BlockingClient::connect_secure(addr, client_id, &security)
                .and_then(|mut c| c.metadata(Some(&[tp.topic.as_str()])))
            {
                Ok(md) => md,
                Err(e) if e.is_authentication() => return Err(fault_of(addr, &e)),
                Err(e) => {
                    errors.push(format!("{addr}: {e}"));
                    continue;
                }
            };
            let p = md
                .partition(&tp.topic, tp.partition)
                .ok_or_else(|| format!("{tp} is not on the source"))?;
            let leader = p
                .leader
                .ok_or_else(|| format!("{tp} has no leader on the source"))?;
            let b = md
                .broker(leader)
                .ok_or_else(|| format!("leader {leader} of {tp} is not in the broker list"))?;
            let leader_addr = format!("{}:{}", b.host, b.port);
            let mut leader_client =
                BlockingClient::connect_secure(&leader_addr, client_id, &security)
                    .map_err(|e| fault_of(&leader_addr, &e))?;
            let versions = leader_client.versions;
            let start_offset = start_offset(&mut leader_client, tp, start)
                .map_err(|e| format!("{leader_addr}: ListOffsets for {tp}: {e}"))?;
            return Ok((
                SourceSpec {
                    broker_id: leader,
                    addr: leader_addr,
                    versions,
                    fetch: self.fetch,
                    client_id: client_id.clone(),
                    request_timeout_ms: self.request_timeout_ms,
                    security,
                },
                p.leader_epoch,
                start_offset,
            ));
        }
        Err(Fault::from(errors.join("; ")))
    }
}

/// Where a new partition starts on the source: `None` for earliest (the fetcher starts at the
/// log start), the high watermark for latest, the ListOffsets answer for a timestamp (the high
/// watermark when no record is that new).
fn start_offset(
    client: &mut BlockingClient,
    tp: &TopicPartition,
    start: StartFrom,
) -> Result<Option<Offset>, String> {
    let query = match start {
        StartFrom::Earliest => return Ok(None),
        StartFrom::Latest => OffsetQuery::Latest,
        StartFrom::Timestamp(t) => OffsetQuery::Timestamp(t),
    };
    let mut ask = |q| -> Result<Listed, String> {
        let answers = client
            .list_offsets(std::slice::from_ref(tp), q)
            .map_err(|e| e.to_string())?;
        Ok(answers
            .into_iter()
            .next()
            .map_or(Listed::Error(3), |(_, l)| l))
    };
    let listed = match ask(query)? {
        Listed::NoneAfter => ask(OffsetQuery::Latest)?,
        other => other,
    };
    match listed {
        Listed::At(o) => Ok(Some(o)),
        Listed::NoneAfter => Err("no offset".into()),
        Listed::Error(code) => Err(format!("error code {code}")),
    }
}

impl DataPlane for ShardDataPlane {
    fn add(
        &mut self,
        mirror: &MirrorDefinition,
        tp: &TopicPartition,
        topic_id: Uuid,
        start: StartFrom,
    ) -> Result<(), Fault> {
        if self.lent.contains_key(tp) {
            return Ok(());
        }
        // Mirroring a failed-over partition again: it stops being writable first.
        if let Some(log) = self.leaders.release(tp) {
            self.logs().restore(log);
        }
        let (spec, leader_epoch, start_offset) = self.source_for(mirror, tp, start)?;
        // Persisted before fetching starts: once records of this leader may be here, a
        // failover must lead above its epoch even if kmirror restarts without the source.
        self.source_epochs
            .raise(tp, leader_epoch)
            .map_err(|e| Fault::from(format!("{tp}: source leader epoch not persisted: {e}")))?;
        let security = Arc::clone(&spec.security);
        let id = (!topic_id.is_nil()).then_some(topic_id);
        let config = self.configs.get(&tp.topic).cloned();
        self.logs()
            .get_or_create(tp, id, config.clone())
            .map_err(|e| Fault::from(e.to_string()))?;
        let mut log = self.logs().take(tp).expect("just created or found");
        if let Some(config) = config {
            if let Err(e) = log.set_config(config) {
                self.logs().restore(log);
                return Err(format!("{tp}: topic configs not applied: {e}").into());
            }
        }
        // Only a partition with nothing mirrored yet starts at the start position; one with
        // data resumes from its log end.
        if let Some(at) = start_offset.filter(|o| *o > Offset::ZERO) {
            if log.log_end_offset() == Offset::ZERO {
                tracing::info!(partition = %tp, %start, offset = %at, "starting at the source offset");
                if let Err(e) = log.truncate_fully_and_start_at(&mut StdIo, at) {
                    self.logs().restore(log);
                    return Err(format!("{tp}: cannot start at {at}: {e}").into());
                }
            }
        }
        let (log_end, last_epoch) = resume_point(&log);
        let shard = shard_for(tp, self.rt().shard_count());
        let msg = MirrorMsg::AddPartition {
            source: spec,
            start: PartitionStart {
                tp: tp.clone(),
                topic_id,
                log_end,
                last_epoch,
                leader_epoch,
            },
            log: Box::new(log),
        };
        if let Err(full) = self.rt().send(shard, msg) {
            if let MirrorMsg::AddPartition { log, .. } = full.0 {
                self.logs().restore(*log);
            }
            return Err(format!("shard {} mailbox is full", shard.0).into());
        }
        let access = SourceAccess {
            bootstrap_servers: mirror.source.bootstrap_servers.clone(),
            client_id: mirror.source.client_id.clone(),
            request_timeout_ms: self.request_timeout_ms,
            security,
        };
        self.lent.insert(tp.clone(), (shard, access));
        Ok(())
    }

    fn configure(&mut self, topic: &str, config: &LogConfig) -> Result<(), String> {
        self.configs.insert(topic.to_owned(), config.clone());
        self.take_returned();
        let mut errors = Vec::new();
        let lent: Vec<(TopicPartition, ShardId)> = self
            .lent
            .iter()
            .filter(|(tp, _)| tp.topic == topic)
            .map(|(tp, (shard, _))| (tp.clone(), *shard))
            .collect();
        for (tp, shard) in lent {
            let msg = MirrorMsg::SetConfig {
                tp: tp.clone(),
                config: Box::new(config.clone()),
            };
            if self.rt().send(shard, msg).is_err() {
                // The log gets it when it comes back (take_returned) or is added again.
                errors.push(format!("{tp}: shard {} mailbox is full", shard.0));
            }
        }
        let here: Vec<TopicPartition> = self
            .logs()
            .partitions()
            .map(|(tp, _)| tp.clone())
            .filter(|tp| tp.topic == topic)
            .collect();
        for tp in here {
            if let Some(Err(e)) = self
                .logs()
                .get_mut(&tp)
                .map(|l| l.set_config(config.clone()))
            {
                errors.push(format!("{tp}: {e}"));
            }
        }
        for tp in self.leaders.partitions_of(topic) {
            if let Some(Err(e)) = self.leaders.set_config(&tp, config) {
                errors.push(format!("{tp}: {e}"));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    fn remove(&mut self, tp: &TopicPartition) -> Result<Offset, String> {
        if let Some(shard) = self.lent.get(tp).map(|(s, _)| *s) {
            self.rt()
                .send(shard, MirrorMsg::RemovePartition { tp: tp.clone() })
                .map_err(|_| format!("shard {} mailbox is full", shard.0))?;
            let wanted = tp.clone();
            let answered = self.pump(Duration::from_millis(SHARD_REMOVE_WAIT_MS), |e| {
                matches!(e, MirrorEvent::PartitionRemoved { tp, .. }
                    | MirrorEvent::PartitionStopped { tp, .. } if *tp == wanted)
            });
            if !answered {
                return Err(format!("shard {} did not hand {tp} back", shard.0));
            }
        }
        self.take_returned();
        Ok(self
            .logs()
            .get(tp)
            .map_or(Offset::ZERO, |l| l.log_end_offset()))
    }

    /// Promotes the handed-back log (the control thread owns it once its fetcher is gone) at
    /// one epoch above every epoch it holds and above the source leader's last known epoch
    /// (the source may have changed leaders after its last record), then checkpoints the recovery point so that no
    /// later recovery replays the source's producers (see `PartitionLog::promote`).
    fn promote(&mut self, tp: &TopicPartition) -> Result<Promotion, String> {
        if self.lent.contains_key(tp) {
            return Err(format!("{tp} is still being fetched"));
        }
        self.take_returned();
        let source = self.source_epochs.get(tp);
        let log = self
            .logs()
            .get_mut(tp)
            .ok_or_else(|| format!("{tp} has no local log"))?;
        let epoch = promoted_epoch(log.epoch_cache().latest_epoch(), source);
        let promotion = log.promote(&mut StdIo, epoch).map_err(|e| e.to_string())?;
        self.logs().write_checkpoints().map_err(|e| e.to_string())?;
        Ok(promotion)
    }

    fn writable(&mut self, tp: &TopicPartition) -> Result<(), String> {
        if self.leaders.contains(tp) {
            return Ok(());
        }
        if self.lent.contains_key(tp) {
            return Err(format!("{tp} is still being fetched"));
        }
        self.take_returned();
        let log = self
            .logs()
            .take(tp)
            .ok_or_else(|| format!("{tp} has no local log"))?;
        if log.epoch_cache().latest_epoch().is_none() {
            // Never promoted (e.g. a state written by an older kmirror): not writable.
            self.logs().restore(log);
            return Err(format!("{tp} was never promoted"));
        }
        self.leaders.lead(log);
        Ok(())
    }

    /// Drains pending shard events without waiting; returns the failures they reported.
    fn poll_failures(&mut self) -> Vec<(TopicPartition, Fault)> {
        self.pump(Duration::ZERO, |_| false);
        self.answer_leaders();
        let now = Instant::now();
        if now >= self.next_retention {
            self.next_retention = now + self.retention_every;
            self.enforce_retention(crate::log::partition_log::now_ms());
        }
        std::mem::take(&mut self.failures)
    }

    fn progress(&self, tp: &TopicPartition) -> Progress {
        // While a shard owns the log, its end is what the shard last published.
        let seen = self.progress.snapshot(tp);
        let local = if self.lent.contains_key(tp) {
            seen.log_end
        } else {
            self.logs
                .as_ref()
                .and_then(|d| d.get(tp))
                .map(|l| l.log_end_offset().0)
                // Failed over: the leader store has it, and clients may be writing to it.
                .or_else(|| self.leaders.log_end(tp).map(|o| o.0))
        };
        Progress {
            local_log_end: local,
            source_high_watermark: seen.high_watermark,
            newest_timestamp_ms: seen.newest_timestamp,
            throttled_ms: seen.throttled_ms,
            skipped_records: seen.skipped_records,
            stalled: seen.stalled,
        }
    }

    fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry.as_ref().map(|t| &t.telemetry)
    }
}
