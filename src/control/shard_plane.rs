//! `DataPlane` over the real shards: partitions are handed to the shard their name hashes to
//! with `MirrorMsg::AddPartition` (their log lent out of the `LogDir`), and taken back with
//! `RemovePartition`, whose answer returns the log to the `LogDir`.
//!
//! Lives on the thread that started the `Runtime` (shard events unpark that thread). It never
//! calls a source itself: a partition being added waits here (`pending`) until a source worker
//! found its leader (and its start offset), then goes to its shard; leaders the shards ask
//! for again are looked up on workers too. Answers come back on a channel drained by
//! `poll_failures` (the controller's tick). One look-up per source and kind is in flight.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::control::controller::{DataPlane, Fault, Progress};
use crate::control::leader_refresh::{self, LeaderFound, LeaderRefresh, LookUp, SourceAccess};
use crate::control::leader_store::LeaderStore;
use crate::control::mirror_def::{MirrorDefinition, StartFrom};
use crate::control::mirror_run::shard_for;
use crate::control::source_catalog::Deadline;
use crate::control::source_epochs::{promoted_epoch, SourceEpochs};
use crate::control::source_security::SecurityCache;
use crate::control::source_worker::{JobKey, JobKind, SourceWorkers};
use crate::control::start_offsets;
use crate::control::state_log;
use crate::control::unclean_recovery::{self, UncleanRecoveries};
use crate::fetch::fetcher::{FetchConfig, PartitionStart};
use crate::fetch::security::AUTHENTICATION_FAILED;
use crate::ids::{LeaderEpoch, Offset, ShardId, TopicPartition};
use crate::limits::{
    LEADER_REFRESH_MS_MAX, LEADER_REFRESH_MS_MIN, RECOVERY_CHECKPOINT_INTERVAL_MS_DEFAULT,
    RECOVERY_CHECKPOINT_WRITE_LAG_MS, RETENTION_CHECK_INTERVAL_MS_DEFAULT, SHARD_REMOVE_WAIT_MS,
    SHARD_STALL_MS,
};
use crate::log::config::LogConfig;
use crate::log::io::StdIo;
use crate::log::log_dir::LogDir;
use crate::log::on_threads::{on_threads, AfterError};
use crate::log::partition_log::{PartitionLog, Promotion};
use crate::log::quarantine::Quarantine;
use crate::log::read_view::ReadCatalog;
use crate::log::LogError;
use crate::ops::telemetry::{Telemetry, TelemetryError, TelemetryThread};
use crate::runtime::health::ShardHealth;
use crate::runtime::mirror_shard::{
    resume_point, MirrorEvent, MirrorMsg, MirrorShard, ReturnedLogs,
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

/// A partition to be handed to a shard once its leader is known.
#[derive(Debug)]
struct PendingAdd {
    access: SourceAccess,
    topic_id: Uuid,
    start: StartFrom,
    /// In a look-up that has not answered yet.
    asked: bool,
    /// Set when the partition comes back after its source log diverged by leader epoch and
    /// the mirror recovers unclean elections: the log is cut once the leader (and the topic
    /// id) is known again (`control::unclean_recovery`).
    recover: Option<Recover>,
    attempts: u32,
    next: Instant,
}

/// A divergence to recover from: the source leader's (epoch, end offset) answer, and the
/// stop's reason (the failure if recovery is refused).
#[derive(Debug, Clone)]
struct Recover {
    source: (LeaderEpoch, Offset),
    why: String,
}

/// Per partition: its leader and where it starts (`None`: the log end or the log start).
type Resolved = Result<Vec<Result<(LeaderFound, Option<Offset>), String>>, Fault>;

impl PendingAdd {
    fn new(access: SourceAccess, topic_id: Uuid, recover: Option<Recover>) -> PendingAdd {
        PendingAdd {
            access,
            topic_id,
            start: StartFrom::Earliest,
            asked: false,
            recover,
            attempts: 0,
            next: Instant::now(),
        }
    }
}

/// A source worker's answer to the shard plane.
enum PlaneAnswer {
    Resolved {
        tps: Vec<TopicPartition>,
        answer: Resolved,
    },
    Leaders {
        access: SourceAccess,
        tps: Vec<TopicPartition>,
        answer: LookUp,
    },
}

/// The worker scope of a source: its bootstrap servers and client id.
fn scope_of(access: &SourceAccess) -> String {
    format!(
        "{} ({})",
        access.bootstrap_servers.join(","),
        access.client_id
    )
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
    /// Logs cut by unclean-election recoveries (new log end), for the controller's audit.
    truncations: Vec<(TopicPartition, Offset)>,
    /// Failed-over partitions, written by clients through the Kafka endpoint.
    leaders: Arc<LeaderStore>,
    /// Each mirror's source security, built once per start or resume, not once per partition.
    securities: SecurityCache,
    /// Latency collection and interval logs; stopped after the shards.
    telemetry: Option<TelemetryThread>,
    /// The endpoint's catalog, where drill clones are announced (`control::drill`).
    drill_catalog: Option<Arc<ReadCatalog>>,
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
    /// Partitions added but not yet with a shard: their leader is being looked up.
    pending: HashMap<TopicPartition, PendingAdd>,
    /// Where look-ups run, and the channel their answers come back on.
    workers: SourceWorkers,
    answers_tx: mpsc::Sender<PlaneAnswer>,
    answers_rx: mpsc::Receiver<PlaneAnswer>,
    /// Recovery-point checkpoint rounds: how often, when the next flush round is due, and
    /// when the checkpoint file of the round in progress is to be written.
    checkpoint_every: Duration,
    next_checkpoint: Instant,
    checkpoint_write_at: Option<Instant>,
    /// The shards' heartbeats, checked on every poll.
    health: ShardHealth,
    /// Partitions whose mirror recovers unclean elections
    /// (`mirror.support.unclean.leader.election`).
    recovers: HashSet<TopicPartition>,
    /// Each partition's unclean-election recoveries (from the quarantine at start, then as
    /// they happen), for `describe` and `/metrics`.
    unclean: HashMap<TopicPartition, UncleanRecoveries>,
    /// Set with the reason once a shard failed: the process must exit for a restart.
    shard_failed: Arc<OnceLock<String>>,
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
        let mut logs = open_log_dir(data_dir)?;
        // `__mirror_state` belongs to the state log and `__consumer_offsets` to the group
        // coordinator; each reopens its own right after.
        logs.hand_off(&TopicPartition::new(state_log::TOPIC, 0));
        logs.hand_off(&TopicPartition::new(
            crate::serve::groups::offsets::TOPIC,
            0,
        ));
        // ...and `__transaction_state` to the transaction coordinator.
        logs.hand_off(&TopicPartition::new(crate::serve::txn::store::TOPIC, 0));
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
        let unclean = unclean_recovery::load(&Quarantine::new(data_dir))?
            .into_iter()
            .collect();
        let rt = Runtime::start(runtime, move |_| {
            MirrorShard::new(Arc::clone(&shard_returned)).with_progress(board.clone())
        })?;
        let telemetry = TelemetryThread::start(rt.stats().to_vec(), data_dir)?;
        let (answers_tx, answers_rx) = mpsc::channel();
        let health = ShardHealth::new(
            rt.stats(),
            Duration::from_millis(SHARD_STALL_MS),
            Instant::now(),
        );
        let checkpoint_every = Duration::from_millis(RECOVERY_CHECKPOINT_INTERVAL_MS_DEFAULT);
        Ok(ShardDataPlane {
            pending: HashMap::new(),
            workers: SourceWorkers::threaded(),
            answers_tx,
            answers_rx,
            checkpoint_every,
            next_checkpoint: Instant::now() + checkpoint_every,
            checkpoint_write_at: None,
            health,
            recovers: HashSet::new(),
            unclean,
            shard_failed: Arc::default(),
            telemetry: Some(telemetry),
            drill_catalog: None,
            rt: Some(rt),
            logs: Some(logs),
            returned,
            fetch,
            request_timeout_ms,
            lent: HashMap::new(),
            progress,
            failures: Vec::new(),
            truncations: Vec::new(),
            leaders,
            securities: SecurityCache::default(),
            refresh: LeaderRefresh::new(fetch),
            configs: HashMap::new(),
            retention_every: Duration::from_millis(RETENTION_CHECK_INTERVAL_MS_DEFAULT),
            next_retention: Instant::now()
                + Duration::from_millis(RETENTION_CHECK_INTERVAL_MS_DEFAULT),
            source_epochs,
        })
    }

    /// How often recovery points are checkpointed (`storage.recovery_checkpoint_interval_ms`).
    pub fn set_recovery_checkpoint_interval(&mut self, every: Duration) {
        self.checkpoint_every = every;
        self.next_checkpoint = Instant::now() + every;
    }

    /// A checkpoint round: every owner flushes its logs that have new data (the shards on
    /// their rings without waiting, `mirror_shard_flush`; the logs held here and the
    /// failed-over ones on this thread), and a little later the checkpoint files are
    /// rewritten from every partition's cell. A shard's flush still under way by then moves
    /// its recovery point into the next round's file: the file may lag, never lead.
    fn checkpoint_round(&mut self, now: Instant) {
        if now >= self.next_checkpoint {
            self.next_checkpoint = now + self.checkpoint_every;
            for shard in 0..self.rt().shard_count() {
                let shard = ShardId(shard as _);
                if self.health.is_failed(shard) {
                    continue;
                }
                if self.rt().send(shard, MirrorMsg::Flush).is_err() {
                    tracing::warn!(shard = shard.0, "checkpoint flush skipped: mailbox full");
                }
            }
            self.take_returned();
            let mut failed = self.logs().flush_unflushed(&mut StdIo);
            failed.extend(self.leaders.flush_unflushed());
            for why in failed {
                tracing::error!("{why}");
            }
            self.checkpoint_write_at =
                Some(now + Duration::from_millis(RECOVERY_CHECKPOINT_WRITE_LAG_MS));
        }
        if self.checkpoint_write_at.is_some_and(|at| now >= at) {
            self.checkpoint_write_at = None;
            if let Err(e) = self.logs().write_checkpoints() {
                tracing::error!("writing the recovery-point checkpoint: {e}");
            }
        }
    }

    /// Where the reason goes once a shard failed (the caller stops the process on it).
    pub fn report_shard_failure_to(&mut self, to: Arc<OnceLock<String>>) {
        self.shard_failed = to;
    }

    /// Checks every shard's heartbeat. A failed shard's partitions are FAILED (retryable: the
    /// restart that follows recovers their logs and mirrors them on) and the failure is
    /// reported, so the process exits; the watchdog pings only while every shard is healthy.
    fn check_shards(&mut self) {
        let failed = self.health.check(Instant::now());
        crate::ops::sd_notify::shards_checked(self.health.all_healthy());
        for f in failed {
            let tps: Vec<TopicPartition> = self
                .lent
                .iter()
                .filter(|(_, (shard, _))| *shard == f.shard)
                .map(|(tp, _)| tp.clone())
                .collect();
            tracing::error!(
                shard = f.shard.0,
                partitions = tps.len(),
                why = %f.why,
                "shard failed: its partitions are FAILED and kmirror exits to be restarted"
            );
            for tp in tps {
                self.lent.remove(&tp);
                self.refresh.forget(&tp);
                self.failures.push((
                    tp,
                    Fault {
                        message: f.why.clone(),
                        retryable: true,
                        timed_out: false,
                    },
                ));
            }
            crate::ops::sd_notify::shard_failed(&f.why);
            let _ = self.shard_failed.set(f.why);
        }
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
        self.drill_catalog = Some(Arc::clone(&catalog));
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
                MirrorEvent::PartitionStopped {
                    tp,
                    why,
                    retryable,
                    source_epoch_end,
                } => {
                    let lent = self.lent.remove(&tp);
                    self.refresh.forget(&tp);
                    if let (Some(source), Some((_, access))) = (source_epoch_end, lent) {
                        if self.recovers.contains(&tp) {
                            tracing::warn!(partition = %tp, %why, "source log diverged by leader epoch: recovering the unclean election once the source leader is known");
                            let recover = Recover { source, why };
                            // The log came back before the event: fetch it again by its id.
                            self.take_returned();
                            let id = self.logs().get(&tp).and_then(PartitionLog::topic_id);
                            let id = id.unwrap_or_else(Uuid::nil);
                            self.pending
                                .insert(tp, PendingAdd::new(access, id, Some(recover)));
                            if done {
                                return true;
                            }
                            continue;
                        }
                    }
                    tracing::error!(partition = %tp, %why, "partition stopped");
                    // A refused login or certificate stays refused until the operator acts.
                    let retryable = retryable && !why.starts_with(AUTHENTICATION_FAILED);
                    self.failures.push((
                        tp,
                        Fault {
                            message: why,
                            retryable,
                            timed_out: false,
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

    /// Starts the look-ups now due on the workers: leaders the shards asked for, and leaders
    /// and start offsets of partitions waiting to go to a shard (one job per source each).
    fn dispatch_look_ups(&mut self) {
        let now = Instant::now();
        let fetch = self.fetch;
        for (access, tps) in self.refresh.take_due(now) {
            let tx = self.answers_tx.clone();
            let versions = self.refresh.versions();
            let (a, t) = (access.clone(), tps.clone());
            let key = JobKey::new(scope_of(&access), JobKind::Leaders);
            if let Err(busy) = self.workers.spawn(key, move || {
                let answer = leader_refresh::look_up(fetch, &versions, &a, &t);
                let _ = tx.send(PlaneAnswer::Leaders {
                    access: a,
                    tps: t,
                    answer,
                });
            }) {
                self.refresh
                    .settle(&access, &tps, Err(Fault::from(busy.to_string())), now);
            }
        }
        let mut due: HashMap<String, (SourceAccess, Vec<(TopicPartition, StartFrom)>)> =
            HashMap::new();
        for (tp, p) in &self.pending {
            if !p.asked && p.next <= now {
                due.entry(scope_of(&p.access))
                    .or_insert_with(|| (p.access.clone(), Vec::new()))
                    .1
                    .push((tp.clone(), p.start));
            }
        }
        for (scope, (access, wanted)) in due {
            let tx = self.answers_tx.clone();
            let versions = self.refresh.versions();
            let tps: Vec<TopicPartition> = wanted.iter().map(|(tp, _)| tp.clone()).collect();
            let asked = tps.clone();
            let spawned = self
                .workers
                .spawn(JobKey::new(scope, JobKind::Resolve), move || {
                    let answer = resolve(fetch, &versions, &access, &wanted);
                    let _ = tx.send(PlaneAnswer::Resolved { tps: asked, answer });
                });
            if spawned.is_ok() {
                for tp in &tps {
                    if let Some(p) = self.pending.get_mut(tp) {
                        p.asked = true;
                    }
                }
            }
        }
    }

    /// Applies the answers the workers sent back.
    fn take_answers(&mut self) {
        while let Ok(answer) = self.answers_rx.try_recv() {
            match answer {
                PlaneAnswer::Leaders {
                    access,
                    tps,
                    answer,
                } => {
                    let now = Instant::now();
                    let found = self.refresh.settle(&access, &tps, answer, now);
                    // One write of the epochs file for the whole answer (releader's own
                    // raise then finds nothing higher).
                    if let Err(e) = self
                        .source_epochs
                        .raise_all(found.iter().map(|(f, _)| (&f.tp, f.leader_epoch)))
                    {
                        tracing::error!(
                            partitions = found.len(),
                            "source leader epochs not persisted: {e}"
                        );
                    }
                    for (found, access) in found {
                        self.releader(found, access, now);
                    }
                }
                PlaneAnswer::Resolved { tps, answer } => self.apply_resolved(tps, answer),
            }
        }
    }

    /// Sends a found leader to the partition's shard.
    fn releader(&mut self, found: LeaderFound, access: SourceAccess, now: Instant) {
        let Some((shard, _)) = self.lent.get(&found.tp) else {
            return;
        };
        let shard = *shard;
        if let Err(e) = self.source_epochs.raise(&found.tp, found.leader_epoch) {
            tracing::error!(partition = %found.tp, "source leader epoch not persisted: {e}");
        }
        let msg = MirrorMsg::Releader {
            tp: found.tp.clone(),
            source: found.source.clone(),
            topic_id: found.topic_id,
            leader_epoch: found.leader_epoch,
        };
        if self.rt().send(shard, msg).is_err() {
            self.refresh.retry_soon(&found, access, now);
        }
    }

    /// Partitions whose leader look-up answered go to their shard; a refused login or a
    /// partition the source says it lacks fails it (the controller retries per its policy); a
    /// source that did not answer keeps them waiting, asked again after a growing delay.
    fn apply_resolved(&mut self, tps: Vec<TopicPartition>, answer: Resolved) {
        let now = Instant::now();
        match answer {
            Ok(answers) => {
                // The epochs of every partition answered are persisted with one write before
                // any of them goes to its shard (hand_to_shard's own raise then writes nothing).
                // A failed write is left to hand_to_shard, which fails the partition.
                let _ = self.source_epochs.raise_all(
                    answers
                        .iter()
                        .flatten()
                        .map(|(found, _)| (&found.tp, found.leader_epoch)),
                );
                for (tp, answer) in tps.into_iter().zip(answers) {
                    let Some(p) = self.pending.remove(&tp) else {
                        continue;
                    };
                    if !p.asked {
                        // Removed and added again while asked: ask again.
                        self.pending.insert(tp, p);
                        continue;
                    }
                    match answer {
                        Ok((found, start_offset)) => {
                            if let Err(fault) = self.hand_to_shard(&tp, p, found, start_offset) {
                                self.failures.push((tp, fault));
                            }
                        }
                        Err(why) => self.failures.push((tp, Fault::from(why))),
                    }
                }
            }
            Err(fault) => {
                // One line per look-up, not per partition: a source down with 16,384
                // partitions waiting logged 16,384 lines per retry.
                let (mut waiting, mut first, mut longest) = (0usize, None, 0u64);
                for tp in tps {
                    let Some(p) = self.pending.get_mut(&tp) else {
                        continue;
                    };
                    if !fault.retryable {
                        self.pending.remove(&tp);
                        self.failures.push((tp, fault.clone()));
                        continue;
                    }
                    p.asked = false;
                    let wait = LEADER_REFRESH_MS_MIN
                        .saturating_mul(1 << p.attempts.min(16))
                        .min(LEADER_REFRESH_MS_MAX);
                    p.attempts = p.attempts.saturating_add(1);
                    p.next = now + Duration::from_millis(wait);
                    waiting += 1;
                    longest = longest.max(wait);
                    first.get_or_insert(tp);
                }
                if let Some(first) = first {
                    tracing::warn!(partitions = waiting, first = %first, %fault, retry_in_ms = longest, "source leaders not known yet; the partitions wait");
                }
            }
        }
    }

    /// The rest of `add` once the leader is known: the log opened (or created) with its
    /// topic's config, moved to the start offset when new, and lent to its shard.
    fn hand_to_shard(
        &mut self,
        tp: &TopicPartition,
        p: PendingAdd,
        found: LeaderFound,
        start_offset: Option<Offset>,
    ) -> Result<(), Fault> {
        let leader_epoch = found.leader_epoch;
        let spec = found.source.clone();
        let topic_id = p.topic_id;
        let start = p.start;
        let shard = shard_for(tp, self.rt().shard_count());
        if self.health.is_failed(shard) {
            return Err(format!("shard {} failed; kmirror exits to be restarted", shard.0).into());
        }
        // Persisted before fetching starts: once records of this leader may be here, a
        // failover must lead above its epoch even if kmirror restarts without the source.
        self.source_epochs
            .raise(tp, leader_epoch)
            .map_err(|e| Fault::from(format!("{tp}: source leader epoch not persisted: {e}")))?;
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
        let log = match p.recover {
            Some(recover) => self.recover_unclean(log, &found, recover)?,
            None => log,
        };
        let (log_end, last_epoch) = resume_point(&log);
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
        self.lent.insert(tp.clone(), (shard, p.access));
        Ok(())
    }

    /// Cuts `log` to where the source's log diverges (its cut batches to the quarantine) before
    /// it goes back to its shard. A source topic that now has another topic id was deleted and
    /// recreated, not uncleanly elected: the partition fails as without recovery, untouched.
    fn recover_unclean(
        &mut self,
        mut log: PartitionLog,
        found: &LeaderFound,
        recover: Recover,
    ) -> Result<PartitionLog, Fault> {
        let tp = log.topic_partition().clone();
        if let Some(ours) = log.topic_id() {
            if !found.topic_id.is_nil() && found.topic_id != ours {
                self.logs().restore(log);
                return Err(Fault::permanent(format!(
                    "{}; the source topic was deleted and recreated (topic id {ours} is now {}), \
                     which is not an unclean leader election: nothing is truncated",
                    recover.why, found.topic_id
                )));
            }
        }
        let quarantine = Quarantine::new(self.logs().root());
        let now = crate::log::partition_log::now_ms();
        let before = log.log_end_offset();
        match unclean_recovery::recover(&mut log, &mut StdIo, &quarantine, recover.source, now) {
            Ok(Some(r)) => {
                tracing::warn!(
                    partition = %tp,
                    source_epoch = r.source_epoch,
                    source_end_offset = r.source_end_offset,
                    cut_from = r.first_offset,
                    log_end_before = before.0,
                    records = r.records,
                    batches = r.batches,
                    epochs = ?r.epochs,
                    quarantine = %r.segment_file.display(),
                    complete = r.complete,
                    "unclean leader election on the source: our log was truncated to its \
                     divergence point; the cut records are kept in the quarantine and \
                     mirroring continues from there"
                );
                self.truncations.push((tp.clone(), log.log_end_offset()));
                self.unclean.entry(tp).or_default().add(r);
                if let Err(e) = self.logs().write_checkpoints() {
                    tracing::error!("writing the recovery-point checkpoint: {e}");
                }
                Ok(log)
            }
            Ok(None) => {
                self.logs().restore(log);
                Err(Fault::permanent(recover.why))
            }
            Err(e) => {
                self.logs().restore(log);
                Err(Fault::permanent(format!(
                    "{}; unclean-election recovery failed: {e}",
                    recover.why
                )))
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
}

/// On a source worker: the leaders of `wanted` (one metadata request), then the start offsets
/// of those that need one (one ListOffsets per leader and start position), all within the
/// source's request timeout.
fn resolve(
    fetch: FetchConfig,
    versions: &leader_refresh::VersionsCache,
    access: &SourceAccess,
    wanted: &[(TopicPartition, StartFrom)],
) -> Resolved {
    let tps: Vec<TopicPartition> = wanted.iter().map(|(tp, _)| tp.clone()).collect();
    let found = leader_refresh::look_up(fetch, versions, access, &tps)?;
    let by = Deadline::after_ms(u64::from(access.request_timeout_ms));
    // Partitions to ask about, by leader and start position (a source has few leaders, and
    // one resolve usually one start position, so a list beats a map here).
    let mut asks: Vec<(&str, StartFrom, Vec<usize>)> = Vec::new();
    for (i, (f, (_, start))) in found.iter().zip(wanted).enumerate() {
        let Ok(f) = f else { continue };
        if *start == StartFrom::Earliest {
            continue;
        }
        let addr = f.source.addr.as_str();
        match asks.iter_mut().find(|(a, s, _)| *a == addr && s == start) {
            Some((_, _, members)) => members.push(i),
            None => asks.push((addr, *start, vec![i])),
        }
    }
    let mut starts: Vec<start_offsets::Start> = vec![Ok(None); wanted.len()];
    for (addr, start, members) in asks {
        let asked: Vec<TopicPartition> = members.iter().map(|&i| tps[i].clone()).collect();
        let answers = by
            .connect(addr, &access.client_id, &access.security)
            .map_err(|e| by.fault(addr, &e).message)
            .and_then(|mut client| {
                start_offsets::start_offsets(&mut client, &asked, start)
                    .map_err(|e| format!("{addr}: ListOffsets: {e}"))
            });
        match answers {
            Ok(answers) => {
                for (&i, answer) in members.iter().zip(answers) {
                    starts[i] =
                        answer.map_err(|e| format!("{addr}: ListOffsets for {}: {e}", tps[i]));
                }
            }
            Err(why) => {
                for &i in &members {
                    starts[i] = Err(why.clone());
                }
            }
        }
    }
    Ok(found
        .into_iter()
        .zip(starts)
        .map(|(f, start)| Ok((f?, start?)))
        .collect())
}

/// Opens (and after a crash recovers) the log dir, telling systemd as partitions get done so
/// its start timeout cannot expire while recovery makes progress (READY=1 comes after).
pub fn open_log_dir(data_dir: &Path) -> Result<LogDir, LogError> {
    let opened = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let _extend =
        crate::ops::sd_notify::StartExtension::start("opening partition logs", Arc::clone(&opened));
    let default = LogConfig::default();
    LogDir::open_reporting(
        data_dir,
        default.clone(),
        |_| default.clone(),
        &mut StdIo,
        &opened,
    )
}

impl DataPlane for ShardDataPlane {
    /// Registers the partition; it goes to its shard once a source worker found its leader
    /// (`poll_failures` applies the answer). Nothing here waits on the source.
    fn add(
        &mut self,
        mirror: &MirrorDefinition,
        tp: &TopicPartition,
        topic_id: Uuid,
        start: StartFrom,
    ) -> Result<(), Fault> {
        if self.lent.contains_key(tp) || self.pending.contains_key(tp) {
            return Ok(());
        }
        // Mirroring a failed-over partition again: it stops being writable first.
        if let Some(log) = self.leaders.release(tp) {
            self.logs().restore(log);
        }
        let security = self.securities.get(&mirror.name, &mirror.source)?;
        // The log exists from now on (describe shows its end, a pause or stop finds it).
        let id = (!topic_id.is_nil()).then_some(topic_id);
        let config = self.configs.get(&tp.topic).cloned();
        let log_end = self
            .logs()
            .get_or_create(tp, id, config)
            .map_err(|e| Fault::from(e.to_string()))?
            .log_end_offset();
        // Lag is unknown until this fetcher's first response: the high watermark seen before
        // a pause is stale (describe showed lag 0 for partitions still behind).
        self.progress.cell(tp).forget_high_watermark();
        let access = SourceAccess {
            bootstrap_servers: mirror.source.bootstrap_servers.clone(),
            client_id: mirror.source.client_id.clone(),
            request_timeout_ms: self.request_timeout_ms,
            security,
        };
        if mirror.unclean.applies_to(&tp.topic) {
            self.recovers.insert(tp.clone());
        } else {
            self.recovers.remove(tp);
        }
        let resolving = JobKey::new(scope_of(&access), JobKind::Resolve);
        let mut pending = PendingAdd::new(access, topic_id, None);
        // Only a log with nothing in it starts at the start position (`hand_to_shard`); one
        // with records goes on from its own end, so a resume or restart of a `latest` or
        // timestamp mirror asks the source for no start offsets.
        if log_end == Offset::ZERO {
            pending.start = start;
        }
        self.pending.insert(tp.clone(), pending);
        // Asked at once (on a worker); while a look-up of the same source is out, the rest
        // wait for the next tick, which asks for all of them together. (Trying anyway went
        // over every pending partition per add: quadratic when a start adds thousands.)
        if !self.workers.is_busy(&resolving) {
            self.dispatch_look_ups();
        }
        Ok(())
    }

    fn prepare_logs(&mut self, partitions: &[(TopicPartition, Uuid)]) -> Result<usize, String> {
        self.take_returned();
        // A lent or failed-over (leader store) partition has its log already.
        let wanted: Vec<(TopicPartition, Option<Uuid>)> = partitions
            .iter()
            .filter(|(tp, _)| !self.lent.contains_key(tp) && !self.leaders.contains(tp))
            .map(|(tp, id)| (tp.clone(), (!id.is_nil()).then_some(*id)))
            .collect();
        // The fields apart (not `logs()`): the configs are borrowed, not copied.
        self.logs
            .as_mut()
            .expect("log dir lives until stop")
            .create_missing_configured(&wanted, &self.configs)
            .map_err(|e| e.to_string())
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
        // Never handed to a shard (its leader look-up may still be out: its answer is dropped).
        self.pending.remove(tp);
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
            // A divergence crossing the removal must not bring it back for recovery.
            self.pending.remove(tp);
        }
        self.take_returned();
        Ok(self
            .logs()
            .get(tp)
            .map_or(Offset::ZERO, |l| l.log_end_offset()))
    }

    /// Promotes the handed-back log (the control thread owns it once its fetcher is gone) at
    /// one epoch above every epoch it holds and above the source leader's last known epoch
    /// (the source may have changed leaders after its last record). `checkpoint_promotions`
    /// then checkpoints the recovery point, once for a whole stop, so that no later recovery
    /// replays the source's producers (see `PartitionLog::promote`).
    fn promote(&mut self, tp: &TopicPartition) -> Result<Promotion, String> {
        self.promote_many(std::slice::from_ref(tp))
            .pop()
            .expect("one result for one partition")
    }

    /// Promotions on threads (`log::on_threads`): each creates a segment, a producer snapshot
    /// and an epoch checkpoint, and 5,000 of them one after another took 7-9 s of a stop on
    /// this project's test box (ext4 inode allocation). The logs are taken out of the dir for
    /// it and put back before this returns.
    fn promote_many(&mut self, tps: &[TopicPartition]) -> Vec<Result<Promotion, String>> {
        self.take_returned();
        let mut out: Vec<Option<Result<Promotion, String>>> = tps.iter().map(|_| None).collect();
        let mut work = Vec::with_capacity(tps.len());
        for (i, tp) in tps.iter().enumerate() {
            if self.lent.contains_key(tp) {
                out[i] = Some(Err(format!("{tp} is still being fetched")));
                continue;
            }
            let source = self.source_epochs.get(tp);
            match self.logs().take(tp) {
                Some(log) => work.push((i, log, source)),
                None => out[i] = Some(Err(format!("{tp} has no local log"))),
            }
        }
        let threads = crate::log::log_dir::recovery_threads(work.len());
        let done = on_threads(
            work,
            threads,
            &mut StdIo,
            AfterError::Continue,
            |(i, mut log, source), io| {
                let epoch = promoted_epoch(log.epoch_cache().latest_epoch(), source);
                let promotion = log.promote(io, epoch).map_err(|e| e.to_string());
                Ok((i, log, promotion))
            },
        );
        for result in done.into_iter().flatten() {
            let Ok((i, log, promotion)) = result else {
                unreachable!("a promotion's error is its result, not the thread's")
            };
            self.logs().restore(log);
            out[i] = Some(promotion);
        }
        out.into_iter()
            .map(|r| r.expect("every partition has its result"))
            .collect()
    }

    fn checkpoint_promotions(&mut self) -> Result<(), String> {
        self.logs().write_checkpoints().map_err(|e| e.to_string())
    }

    fn cut_at_timestamp(
        &mut self,
        tp: &TopicPartition,
        ts: crate::ids::TimestampMs,
        label: &str,
    ) -> Result<crate::control::consistent_cut::CutReport, String> {
        if self.lent.contains_key(tp) {
            return Err(format!("{tp} is still being fetched"));
        }
        self.take_returned();
        let logs = self.logs();
        let quarantine = crate::log::quarantine::Quarantine::new(logs.root());
        let log = logs
            .get_mut(tp)
            .ok_or_else(|| format!("{tp} has no local log"))?;
        let report = crate::control::consistent_cut::cut(log, &mut StdIo, ts, &quarantine, label)
            .map_err(|e| e.to_string())?;
        self.logs().write_checkpoints().map_err(|e| e.to_string())?;
        Ok(report)
    }

    fn local_partitions(&self) -> Vec<TopicPartition> {
        self.drill_catalog
            .as_ref()
            .map(|c| c.snapshot().keys().cloned().collect())
            .unwrap_or_default()
    }

    fn own_cluster_id(&self) -> Option<String> {
        self.drill_catalog.as_ref()?.cluster_id().map(str::to_owned)
    }

    fn local_tail(
        &self,
        tp: &TopicPartition,
    ) -> Option<Result<crate::control::lineage::LocalTail, String>> {
        // The published view: a log a shard is appending to is read without asking it.
        let view = self.drill_catalog.as_ref()?.get(tp)?.view();
        Some(crate::control::lineage::probe::local_tail(&view))
    }

    fn drill_clone(
        &mut self,
        tp: &TopicPartition,
        clone_tp: &TopicPartition,
        clone_topic_id: Uuid,
    ) -> Result<(i64, crate::control::drill::CloneCost), String> {
        let catalog = self
            .drill_catalog
            .clone()
            .ok_or("drills need the [kafka] listener (clients rehearse on it)")?;
        let view = catalog
            .get(tp)
            .ok_or_else(|| format!("{tp} has no published log"))?
            .view();
        let root = self.logs().root().to_path_buf();
        let (mut log, cost) =
            crate::control::drill::clone_partition(&root, &view, clone_tp, clone_topic_id)
                .map_err(|e| e.to_string())?;
        let end = crate::control::drill::view_end(&view).0;
        let epoch = promoted_epoch(log.epoch_cache().latest_epoch(), self.source_epochs.get(tp));
        if let Err(e) = log.promote(&mut StdIo, epoch) {
            let _ = log.delete();
            return Err(e.to_string());
        }
        catalog.insert(clone_tp.clone(), log.attach_read_view());
        self.leaders.lead(log);
        Ok((end, cost))
    }

    /// Repeatable: the clone is served (the leader store has it), or was left in the log dir
    /// by a restart (never served again), or is only a directory (a clone whose building a
    /// crash cut short), or is gone already.
    fn drill_drop(&mut self, clone_tp: &TopicPartition) -> Result<(), String> {
        assert!(
            clone_tp
                .topic
                .starts_with(crate::control::drill::TOPIC_PREFIX),
            "only drill clones are dropped: {clone_tp}"
        );
        if let Some(c) = &self.drill_catalog {
            c.remove(clone_tp);
        }
        if let Some(log) = self.leaders.release(clone_tp) {
            log.delete().map_err(|e| e.to_string())?;
            // Served after a restart: the log dir still keeps its checkpoint lines.
            self.logs().hand_off(clone_tp);
            return Ok(());
        }
        self.take_returned();
        if self
            .logs()
            .delete_partition(clone_tp)
            .map_err(|e| e.to_string())?
        {
            return Ok(());
        }
        let dir = self.logs().root().join(clone_tp.dir_name());
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", dir.display())),
        }
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
        self.check_shards();
        self.take_answers();
        self.dispatch_look_ups();
        let now = Instant::now();
        self.checkpoint_round(now);
        if now >= self.next_retention {
            self.next_retention = now + self.retention_every;
            self.enforce_retention(crate::log::partition_log::now_ms());
        }
        std::mem::take(&mut self.failures)
    }

    fn poll_truncations(&mut self) -> Vec<(TopicPartition, Offset)> {
        std::mem::take(&mut self.truncations)
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
            source_high_watermark_at_ms: seen.high_watermark_at_ms,
            newest_timestamp_ms: seen.newest_timestamp,
            throttled_ms: seen.throttled_ms,
            skipped_records: seen.skipped_records,
            stalled: seen.stalled,
            unclean: self.unclean.get(tp).cloned().unwrap_or_default(),
        }
    }

    fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry.as_ref().map(|t| &t.telemetry)
    }
}
