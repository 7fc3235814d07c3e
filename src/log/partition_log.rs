//! One partition's log: an ordered run of segments in a `<topic>-<partition>` directory,
//! appended byte-for-byte at the offsets the batches carry (kafka-formats.md §1.4, §3).
//!
//! The log is driven by one thread (a shard or a tool); it has no locks. Writes go through the
//! caller's `LogIo` so that a shard can issue them on its io_uring straight from the registered
//! buffer that holds the fetched bytes: the record bytes are never copied here.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use uuid::Uuid;

use crate::ids::{FilePosition, Offset, TimestampMs, TopicPartition};
use crate::log::checkpoint::{sync_dir, write_atomically_with};
use crate::log::checkpoint_cell::{CheckpointCell, CheckpointEntry};
pub(crate) use crate::log::clock::now_ms;
use crate::log::config::{FlushPolicy, LogConfig};
use crate::log::epoch_cache::{assign_epoch, LeaderEpochCache};
use crate::log::flush_plan::{FlushPlan, PlannedSync};
use crate::log::io::{LogIo, OwnedWriteOp, WriteOp};
use crate::log::lazy_file::FileRef;
use crate::log::producer_state::{
    delete_snapshots_above, delete_snapshots_below, snapshot_path, ProducerStateManager,
};
use crate::log::read_view::{LogState, PartitionHandle, Publisher};
use crate::log::recovery::{self, rebuild_producer_state, LoadOptions, SyncAfter};
use crate::log::retention::{deletable_prefix, SegmentFacts};
use crate::log::segment::{AppendMark, ChunkStats, Recovered, Segment};
use crate::log::{partition_meta, LogError};
use crate::wire::batch::{Batch, Batches, Codec, Peek, ValidatedBatches};

mod leader;

pub use leader::{AbortedOpen, ProduceError, ProduceOutcome, Promotion};

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// First offset of the first batch (for a legacy entry, its offset).
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub bytes: u64,
    /// Largest batch max timestamp (NONE when no batch carries one).
    pub max_timestamp: TimestampMs,
    pub batches: u32,
}

/// A stretch of one segment's `.log` holding whole batches: what a fetch response sends, e.g.
/// with `sendfile` from `file` at `position`.
#[derive(Debug)]
pub struct LogSlice<'a> {
    pub segment_base: Offset,
    pub file: FileRef<'a>,
    pub path: &'a Path,
    pub position: FilePosition,
    pub length: u64,
}

/// An append applied to the log's in-memory state whose writes are still to be performed
/// (`PartitionLog::stage_append`). Must be completed with `finish_append` before anything else
/// is done with the log.
#[derive(Debug)]
#[must_use = "a staged append must be completed with finish_append"]
pub struct StagedAppend {
    info: AppendInfo,
    before: BeforeAppend,
    mark: AppendMark,
}

impl StagedAppend {
    pub fn info(&self) -> &AppendInfo {
        &self.info
    }
}

/// What an append restores when it fails.
#[derive(Debug, Clone, Copy)]
struct BeforeAppend {
    log_end: Offset,
    unflushed: u64,
}

/// For a rollback that needs no I/O of its own: the staged append's files were cut back by
/// the segment, and truncating to an unchanged log end writes nothing.
struct NoIo;

impl LogIo for NoIo {
    fn write_all_at(&mut self, _: &File, _: u64, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other(
            "a staged append's rollback writes nothing",
        ))
    }

    fn sync_data(&mut self, _: &File) -> std::io::Result<()> {
        Err(std::io::Error::other(
            "a staged append's rollback syncs nothing",
        ))
    }
}

#[derive(Debug)]
pub struct PartitionLog {
    dir: PathBuf,
    tp: TopicPartition,
    topic_id: Option<Uuid>,
    config: LogConfig,
    /// Sorted by base offset; never empty (the last one is the active segment).
    segments: Vec<Segment>,
    log_start: Offset,
    /// Everything below this offset is known to be on disk (fdatasync'ed).
    recovery_point: Offset,
    /// The recovery point an open left for its caller to confirm (`SyncAfter::Caller`).
    awaiting_sync: Option<Offset>,
    epochs: LeaderEpochCache,
    producers: ProducerStateManager,
    unflushed_messages: u64,
    last_flush_ms: i64,
    /// Set, with the error, when a disk error took the log offline (Kafka's rule for log dirs:
    /// an I/O error other than a full disk, any fsync error, or a rollback that failed). An
    /// offline log refuses appends, flushes and a clean close until it is reopened (recovered).
    offline: Option<String>,
    /// Where this log publishes read views for the Kafka endpoint, once attached.
    publisher: Option<Publisher>,
    /// Opening revalidated segments batch by batch (see `recovered_at_open`).
    recovered_at_open: bool,
    /// What that revalidation re-read.
    revalidated_at_open: Recovered,
    /// This log's checkpoint lines, shared with the log dir (see `checkpoint_cell`).
    checkpoint: Arc<CheckpointCell>,
    /// A staged append waits for `finish_append`; nothing else may change the log meanwhile.
    staged: bool,
    /// Flushes: the target of the one its owner performs now, whether another is wanted, and
    /// whether the owner starts wanted flushes itself (`set_deferred_flushes`).
    flushes: FlushState,
    /// Rolls' producer snapshots waiting for their flush (oldest first).
    pending_snapshots: VecDeque<PendingSnapshot>,
}

/// The log's side of flushes whose syncs its owner performs (`log::flush_plan`).
#[derive(Debug, Default, Clone, Copy)]
struct FlushState {
    /// `begin_flush` handed out a plan for this target; `finish_flush` has not come back.
    in_flight: Option<Offset>,
    /// A roll (or a flush policy that came due while one was in flight) asked for a flush
    /// that has not begun.
    wanted: bool,
    /// A roll created segment files since the last flush planned a sync of the directory.
    dir_unsynced: bool,
    /// The owner starts wanted flushes (`begin_flush`) and performs them without waiting; a
    /// log not deferred flushes synchronously at the end of the append that rolled.
    deferred: bool,
}

/// A producer-state snapshot a roll took (named after the new segment's base), written only
/// once the flush that makes the rolled segment durable succeeded: recovery reads a snapshot
/// at a segment's base as proof that everything before that base reached the disk
/// (`recovery::load`, which cuts a log at a hole a crash left before an unsnapshotted roll).
#[derive(Debug, Clone)]
struct PendingSnapshot {
    base: Offset,
    bytes: Vec<u8>,
}

impl PartitionLog {
    /// Creates a new, empty partition directory (it must not exist yet) starting at offset 0.
    pub fn create(
        dir: &Path,
        tp: TopicPartition,
        topic_id: Option<Uuid>,
        config: LogConfig,
    ) -> Result<PartitionLog, LogError> {
        Self::create_with(dir, tp, topic_id, config, true)
    }

    /// `create`; with `sync` false nothing is made durable and `partition.metadata` is only
    /// staged (`partition_meta::stage`): the caller makes the whole batch durable and publishes
    /// the metadata before any partition is used (`LogDir::create_missing`, which says why
    /// that is safe).
    pub fn create_with(
        dir: &Path,
        tp: TopicPartition,
        topic_id: Option<Uuid>,
        config: LogConfig,
        sync: bool,
    ) -> Result<PartitionLog, LogError> {
        config.validate()?;
        std::fs::create_dir(dir).map_err(|e| LogError::io(dir, e))?;
        if let Some(id) = topic_id {
            if sync {
                partition_meta::write(dir, id)?;
            } else {
                partition_meta::stage(dir, id)?;
            }
        }

        let now = now_ms();
        let segment = Segment::create(dir, Offset::ZERO, &config, now)?;
        if sync {
            if let Some(parent) = dir.parent() {
                sync_dir(parent)?;
            }
            sync_dir(dir)?;
        }
        Ok(PartitionLog {
            dir: dir.to_path_buf(),
            tp,
            topic_id,
            epochs: LeaderEpochCache::load(dir)?,
            producers: ProducerStateManager::new(),
            config,
            segments: vec![segment],
            log_start: Offset::ZERO,
            recovery_point: Offset::ZERO,
            awaiting_sync: None,
            unflushed_messages: 0,
            last_flush_ms: now,
            offline: None,
            publisher: None,
            recovered_at_open: false,
            revalidated_at_open: Recovered::default(),
            staged: false,
            flushes: FlushState::default(),
            pending_snapshots: VecDeque::new(),
            checkpoint: Arc::new(CheckpointCell::new(CheckpointEntry {
                recovery_point: Offset::ZERO,
                log_start_above_first_segment: None,
                high_watermark: Offset::ZERO,
            })),
        })
    }

    /// Opens an existing partition directory, recovering it as `load` says (§4): segments from
    /// the recovery point on are revalidated unless the log dir was shut down cleanly, and any
    /// segment with missing or bad indexes is rebuilt.
    pub fn open(
        dir: &Path,
        tp: TopicPartition,
        topic_id: Option<Uuid>,
        config: LogConfig,
        load: LoadOptions,
        io: &mut impl LogIo,
    ) -> Result<PartitionLog, LogError> {
        Self::open_syncing(dir, tp, topic_id, config, load, io, SyncAfter::Load)
    }

    /// `open`, with `sync` saying who makes re-read batches durable: with
    /// `SyncAfter::Caller` the recovery point stays where it was until the caller made them
    /// durable and called `synced_after_open`.
    pub(crate) fn open_syncing(
        dir: &Path,
        tp: TopicPartition,
        topic_id: Option<Uuid>,
        config: LogConfig,
        load: LoadOptions,
        io: &mut impl LogIo,
        sync: SyncAfter,
    ) -> Result<PartitionLog, LogError> {
        config.validate()?;
        let stored_id = partition_meta::read(dir)?;
        let topic_id = match (stored_id, topic_id) {
            (Some(stored), Some(wanted)) if stored != wanted => {
                return Err(LogError::corrupt(
                    dir.join("partition.metadata"),
                    format!("topic id {stored} differs from the expected {wanted}"),
                ))
            }
            (None, Some(wanted)) => {
                partition_meta::write(dir, wanted)?;
                Some(wanted)
            }
            (stored, wanted) => stored.or(wanted),
        };
        let mut epochs = LeaderEpochCache::load(dir)?;
        let mut producers = ProducerStateManager::new();
        let mut loaded =
            recovery::load(dir, &config, &load, io, &mut epochs, &mut producers, sync)?;
        // Opening and recovery held the files; an idle partition holds none (`lazy_file`).
        for seg in &mut loaded.segments {
            seg.release_files();
        }
        Ok(PartitionLog {
            dir: dir.to_path_buf(),
            tp,
            topic_id,
            config,
            segments: loaded.segments,
            log_start: loaded.log_start,
            recovery_point: loaded.recovery_point,
            awaiting_sync: loaded.awaiting_sync,
            epochs,
            producers,
            unflushed_messages: 0,
            last_flush_ms: now_ms(),
            offline: None,
            publisher: None,
            recovered_at_open: loaded.recovered,
            revalidated_at_open: loaded.revalidated,
            staged: false,
            flushes: FlushState::default(),
            pending_snapshots: VecDeque::new(),
            checkpoint: Arc::new(CheckpointCell::new(CheckpointEntry {
                recovery_point: Offset::ZERO,
                log_start_above_first_segment: None,
                high_watermark: Offset::ZERO,
            })),
        }
        .with_checkpoint_published())
    }

    /// The caller made everything this log's open wrote durable: the recovery point moves to
    /// the recovered end, as `open` would have moved it after its own fsyncs.
    pub(crate) fn synced_after_open(&mut self) {
        if let Some(end) = self.awaiting_sync.take() {
            assert!(
                end <= self.log_end_offset(),
                "recovery point past the log end"
            );
            self.recovery_point = self.recovery_point.max(end);
            self.checkpoint.publish(self.checkpoint_entry());
        }
    }

    /// Whether opening had to revalidate batches (no clean shutdown, or a bad index): after a
    /// clean shutdown this is false and the open only read indexes and snapshots.
    pub fn recovered_at_open(&self) -> bool {
        self.recovered_at_open
    }

    /// The bytes and batches opening revalidated (only those above the recovery point after an
    /// unclean stop; none after a clean one).
    pub fn revalidated_at_open(&self) -> Recovered {
        self.revalidated_at_open
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn topic_partition(&self) -> &TopicPartition {
        &self.tp
    }

    pub fn topic_id(&self) -> Option<Uuid> {
        self.topic_id
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Replaces the log's settings (a topic config changed on the source). An invalid config
    /// is refused and the current one stays. Rolls and retention use the new settings from the
    /// next append or retention pass; readers see them in the next published view.
    pub fn set_config(&mut self, config: LogConfig) -> Result<(), crate::log::config::ConfigError> {
        config.validate()?;
        if config == self.config {
            return Ok(());
        }
        self.config = config;
        if let Some(p) = self.publisher.as_mut() {
            p.set_config(&self.config);
        }
        self.publish_view();
        Ok(())
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn epoch_cache(&self) -> &LeaderEpochCache {
        &self.epochs
    }

    pub fn producer_state(&self) -> &ProducerStateManager {
        &self.producers
    }

    /// The first offset of the earliest open transaction, else the log end (what a
    /// READ_COMMITTED fetch may read up to).
    pub fn last_stable_offset(&self) -> Offset {
        self.producers
            .first_unstable_offset()
            .unwrap_or(self.log_end_offset())
    }

    pub fn log_start_offset(&self) -> Offset {
        self.log_start
    }

    pub fn log_end_offset(&self) -> Offset {
        self.active().next_offset()
    }

    /// A mirror exposes everything it has stored: its high watermark is its log end.
    pub fn high_watermark(&self) -> Offset {
        self.log_end_offset()
    }

    pub fn recovery_point(&self) -> Offset {
        self.recovery_point
    }

    /// Total bytes in all `.log` files.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(Segment::size).sum()
    }

    /// Starts publishing read views of this log (see `read_view`) and returns the handle
    /// readers load them from. Every later change (append, roll, truncation, retention) is
    /// published by the thread that makes it, whichever thread owns the log at the time.
    pub fn attach_read_view(&mut self) -> Arc<PartitionHandle> {
        if self.publisher.is_none() {
            self.publisher = Some(Publisher::new(&self.log_state()));
        }
        Arc::clone(self.publisher.as_ref().expect("attached").handle())
    }

    fn log_state(&self) -> LogState<'_> {
        LogState {
            tp: &self.tp,
            topic_id: self.topic_id,
            dir: &self.dir,
            config: &self.config,
            segments: &self.segments,
            log_start: self.log_start,
            high_watermark: self.high_watermark(),
            last_stable_offset: self.last_stable_offset(),
            epochs: self.epochs.entries(),
        }
    }

    /// What this log's lines in the log dir's checkpoint files say now.
    pub fn checkpoint_entry(&self) -> CheckpointEntry {
        let first_base = self.segments[0].base_offset();
        CheckpointEntry {
            recovery_point: self.recovery_point,
            log_start_above_first_segment: (self.log_start > first_base).then_some(self.log_start),
            high_watermark: self.high_watermark(),
        }
    }

    /// The cell the log dir reads this log's checkpoint lines from.
    pub fn checkpoint_cell(&self) -> Arc<CheckpointCell> {
        Arc::clone(&self.checkpoint)
    }

    fn with_checkpoint_published(self) -> PartitionLog {
        self.checkpoint.publish(self.checkpoint_entry());
        self
    }

    fn publish_view(&mut self) {
        self.checkpoint.publish(self.checkpoint_entry());
        if let Some(mut p) = self.publisher.take() {
            p.publish(&self.log_state());
            self.publisher = Some(p);
        }
    }

    fn active(&self) -> &Segment {
        self.segments
            .last()
            .expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .last_mut()
            .expect("a log always has an active segment")
    }

    fn name(&self) -> String {
        self.tp.to_string()
    }

    /// Appends `records` (one or more complete batches, any magic) at the offsets they carry.
    ///
    /// Every batch is checked first (framing, CRC, offsets at or past the log end and
    /// increasing); if any fails nothing is written. The bytes then go to the active segment
    /// unchanged, rolling first when Kafka would. An append larger than `segment.bytes` (a big
    /// fetch into small segments) is split at batch boundaries into several segment appends.
    ///
    /// A failed append leaves nothing behind: whether a write or the fsync the flush policy
    /// asks for failed, the log is truncated back to where it was, so the records are never
    /// applied later (a keyed log's command fails for good). A full disk (`ENOSPC`, `EDQUOT`)
    /// on a write is then retryable: the log stays usable and the caller may append the same
    /// records again once there is space. Any other I/O error, any fsync error (the kernel may
    /// already have dropped the pages) and a rollback that fails take the log offline
    /// (`offline_reason`), as Kafka takes a log dir offline: appends are refused until the log
    /// is reopened, which recovers it from the recovery point.
    pub fn append(&mut self, io: &mut impl LogIo, records: &[u8]) -> Result<AppendInfo, LogError> {
        self.assert_not_staged();
        if self.offline.is_some() {
            return Err(self.offline_error());
        }
        let info = self.validate_append(records, true)?;
        if info.batches == 0 {
            return Ok(info);
        }
        let before = self.before_append();
        let result = self
            .write_chunks(io, records)
            .map_err(|e| (e, true))
            .and_then(|()| self.after_write(io, &info));
        self.settle(io, info, before, result)
    }

    /// The first half of an append whose writes the caller performs, e.g. together with other
    /// partitions' appends in one ring submission: validates `records` like `append`, applies
    /// them to the active segment's in-memory state and returns the staged append, whose
    /// writes are `staged_writes`; `finish_append` completes it with their outcome. Readers see
    /// nothing of it before `finish_append` succeeded.
    ///
    /// `Ok(None)`: this append is not staged (it needs a segment roll, spans segments, or
    /// holds no batch); call `append` instead. An error is final, as from `append` (a staged
    /// append that fails its index checks is rolled back and takes the log offline).
    pub fn stage_append(&mut self, records: &[u8]) -> Result<Option<StagedAppend>, LogError> {
        self.stage_checked(records, true)
    }

    /// `stage_append` of batches whose CRCs were already checked on receipt: framing, offsets
    /// and sizes are checked as always, the CRC-32C is not computed a second time.
    pub fn stage_validated_append(
        &mut self,
        records: &ValidatedBatches,
    ) -> Result<Option<StagedAppend>, LogError> {
        self.stage_checked(records, false)
    }

    fn stage_checked(
        &mut self,
        records: &[u8],
        check_crc: bool,
    ) -> Result<Option<StagedAppend>, LogError> {
        self.assert_not_staged();
        if self.offline.is_some() {
            return Err(self.offline_error());
        }
        let info = self.validate_append(records, check_crc)?;
        if info.batches == 0 {
            return Ok(None);
        }
        let (end, stats) = self.next_chunk(records, 0);
        if end != records.len()
            || self
                .active()
                .roll_reason(&stats, &self.config, now_ms())
                .is_some()
        {
            return Ok(None);
        }
        let before = self.before_append();
        match self.active_mut().stage_append(records) {
            Ok(mark) => {
                self.staged = true;
                Ok(Some(StagedAppend { info, before, mark }))
            }
            Err(e) => self
                .settle(&mut NoIo, info, before, Err((e, true)))
                .map(|_| None),
        }
    }

    /// The writes of a staged append (its `.log` bytes, then its index entries), to be
    /// performed in this order or with each `after_previous` op ordered after its predecessor.
    pub fn staged_writes<'a>(
        &'a self,
        staged: &StagedAppend,
        records: &'a [u8],
    ) -> impl Iterator<Item = WriteOp<'a>> {
        self.active().staged_writes(&staged.mark, records)
    }

    /// `staged_writes` as owned ops (`Segment::staged_writes_owned`).
    pub fn staged_writes_owned(
        &self,
        staged: &StagedAppend,
        records: &bytes::Bytes,
    ) -> impl Iterator<Item = OwnedWriteOp> {
        self.active().staged_writes_owned(&staged.mark, records)
    }

    /// Completes a staged append once its writes were performed, with their outcome (the first
    /// error among them): the same result, rollback and offline rules as `append`.
    pub fn finish_append(
        &mut self,
        io: &mut impl LogIo,
        staged: StagedAppend,
        records: &[u8],
        written: std::io::Result<()>,
    ) -> Result<AppendInfo, LogError> {
        let StagedAppend { info, before, mark } = staged;
        assert!(self.staged, "finish_append without a staged append");
        self.staged = false;
        let result = self
            .active_mut()
            .finish_append(mark, written)
            .and_then(|()| {
                for item in Batches::new(records) {
                    let (_, batch) = item.expect("validated when staged");
                    self.on_appended_batch(io, &batch)?;
                }
                Ok(())
            })
            .map_err(|e| (e, true))
            .and_then(|()| self.after_write(io, &info));
        self.settle(io, info, before, result)
    }

    /// Whether a staged append waits for `finish_append`.
    pub fn has_staged_append(&self) -> bool {
        self.staged
    }

    /// The log's own state must not change under a staged append (its in-memory state is
    /// ahead of its files until `finish_append`).
    fn assert_not_staged(&self) {
        assert!(!self.staged, "log changed while an append was staged");
    }

    fn before_append(&self) -> BeforeAppend {
        BeforeAppend {
            log_end: self.log_end_offset(),
            unflushed: self.unflushed_messages,
        }
    }

    /// After an append's writes: count its messages and flush if the policy says so.
    fn after_write(
        &mut self,
        io: &mut impl LogIo,
        info: &AppendInfo,
    ) -> Result<(), (LogError, bool)> {
        self.unflushed_messages += (info.last_offset.0 - info.first_offset.0 + 1) as u64;
        match self.maybe_flush(io) {
            Ok(()) => Ok(()),
            // Only the epoch checkpoint's full disk leaves the log online (see `flush`).
            Err(e) => {
                let retryable = e.is_disk_full() && self.offline.is_none();
                Err((e, retryable))
            }
        }
    }

    /// The end of every append: on success the new view is published; on failure (`true`:
    /// a write failed, `false`: the flush) the log is truncated back to where it was, and is
    /// taken offline unless a write (or the flush's epoch checkpoint, see `after_write`) found
    /// the disk full.
    fn settle(
        &mut self,
        io: &mut impl LogIo,
        info: AppendInfo,
        before: BeforeAppend,
        result: Result<(), (LogError, bool)>,
    ) -> Result<AppendInfo, LogError> {
        if let Err((error, on_write)) = result {
            let retryable = on_write && error.is_disk_full();
            self.unflushed_messages = before.unflushed;
            match self.truncate_to(io, before.log_end) {
                Err(rollback) => {
                    self.take_offline(format!("{error}; rolling it back failed too: {rollback}"))
                }
                Ok(()) if !retryable => self.take_offline(error.to_string()),
                Ok(()) => {}
            }
            return Err(error);
        }
        self.publish_view();
        Ok(info)
    }

    /// Why the log is offline, if a disk error took it offline.
    pub fn offline_reason(&self) -> Option<&str> {
        self.offline.as_deref()
    }

    fn offline_error(&self) -> LogError {
        LogError::Failed {
            partition: self.name(),
            reason: self.offline.clone().unwrap_or_default(),
        }
    }

    fn take_offline(&mut self, reason: String) {
        if self.offline.is_none() {
            tracing::error!(partition = %self.tp, %reason, "log offline after a disk error");
            self.offline = Some(reason);
        }
    }

    /// `check_crc` false only for `ValidatedBatches` (see `stage_validated_append`).
    fn validate_append(&self, records: &[u8], check_crc: bool) -> Result<AppendInfo, LogError> {
        let mut info = AppendInfo {
            first_offset: Offset(-1),
            last_offset: Offset(-1),
            bytes: records.len() as u64,
            max_timestamp: TimestampMs::NONE,
            batches: 0,
        };
        let mut batches = Batches::new(records);
        for item in batches.by_ref() {
            let (_, batch) = item?;
            if check_crc {
                batch.validate()?;
            }
            if batch.size() as u64 > self.config.segment_bytes {
                return Err(LogError::BatchLargerThanSegment {
                    partition: self.name(),
                    offset: batch.base_offset(),
                    size: batch.size(),
                    max: self.config.segment_bytes,
                });
            }
            if info.batches == 0 {
                // Kafka's follower check: the first offset (v2) or the first entry's offset
                // (legacy, which only carries its last offset) must not be below the log end.
                let first = batch.base_offset();
                if first < self.log_end_offset() {
                    return Err(LogError::UnexpectedAppendOffset {
                        partition: self.name(),
                        first,
                        log_end: self.log_end_offset(),
                    });
                }
                info.first_offset = first;
            } else if batch.base_offset() <= info.last_offset {
                return Err(LogError::NonIncreasingOffsets {
                    partition: self.name(),
                    offset: batch.base_offset(),
                    previous: info.last_offset,
                });
            }
            info.last_offset = batch.last_offset();
            info.max_timestamp = info.max_timestamp.max(batch.max_timestamp());
            info.batches += 1;
        }
        if batches.trailing_bytes() != 0 {
            return Err(LogError::PartialBatch {
                partition: self.name(),
                trailing: batches.trailing_bytes(),
            });
        }
        Ok(info)
    }

    /// Writes validated `records` in chunks that each fit one segment.
    fn write_chunks(&mut self, io: &mut impl LogIo, records: &[u8]) -> Result<(), LogError> {
        let mut start = 0;
        while start < records.len() {
            let (end, stats) = self.next_chunk(records, start);
            let now = now_ms();
            if let Some(reason) = self.active().roll_reason(&stats, &self.config, now) {
                // Legacy entries do not carry their first offset; Kafka then takes the lowest
                // base that still fits the last offset in an int32.
                let candidate = stats
                    .first_offset
                    .unwrap_or(Offset(stats.last_offset.0 - i32::MAX as i64));
                let base = candidate.max(self.log_end_offset());
                tracing::debug!(partition = %self.tp, ?reason, new_base = %base, "rolling segment");
                self.roll(io, base, now)?;
            }
            let chunk = &records[start..end];
            self.active_mut().append(io, chunk)?;
            for item in Batches::new(chunk) {
                let (_, batch) = item.expect("validated above");
                self.on_appended_batch(io, &batch)?;
            }
            start = end;
        }
        Ok(())
    }

    /// The longest run of batches from `start` that one segment can take: at most
    /// `segment.bytes`, with every offset within int32 of the run's first offset.
    fn next_chunk(&self, records: &[u8], start: usize) -> (usize, ChunkStats) {
        let mut end = start;
        let mut stats: Option<ChunkStats> = None;
        let mut first_base = Offset::ZERO;
        for item in Batches::new(&records[start..]) {
            let (_, batch) = item.expect("validated above");
            let size = batch.size() as u64;
            if let Some(s) = &stats {
                let too_big = s.bytes + size > self.config.segment_bytes;
                let too_far = batch.last_offset().0 - first_base.0 > i32::MAX as i64;
                if too_big || too_far {
                    break;
                }
            }
            let s = stats.get_or_insert_with(|| {
                first_base = batch.base_offset();
                ChunkStats {
                    bytes: 0,
                    first_offset: (!batch.is_legacy()).then(|| batch.base_offset()),
                    last_offset: batch.last_offset(),
                    max_timestamp: TimestampMs::NONE,
                }
            });
            s.bytes += size;
            s.last_offset = batch.last_offset();
            s.max_timestamp = s.max_timestamp.max(batch.max_timestamp());
            end += batch.size();
        }
        (end, stats.expect("at least one batch per chunk"))
    }

    /// Epoch cache and producer state see every appended batch in offset order; an ABORT
    /// marker that completes a transaction is indexed in the segment that holds it.
    fn on_appended_batch(
        &mut self,
        io: &mut impl LogIo,
        batch: &Batch<'_>,
    ) -> Result<(), LogError> {
        // The checkpoint file is written (and synced) when the recovery point next moves
        // (`sync_epochs`), not here: a new epoch at a batch above the recovery point is
        // rebuilt from that batch by recovery (as Kafka's recovery reassigns epochs of the
        // segments it revalidates), so until the batch is flushed the file may lag. Writing
        // it here cost two fsyncs per partition's first append (a thousand partitions
        // starting to mirror paid seconds of synchronous fsyncs on the shard).
        assign_epoch(&mut self.epochs, batch);
        if let Some(txn) = self.producers.on_batch(batch) {
            self.active_mut().append_aborted(io, &txn)?;
        }
        Ok(())
    }

    /// Makes a new active segment at `base`. The old one gets its final time-index entry; its
    /// files are made durable by the flush the roll asks for (Kafka flushes rolled segments
    /// too, on its scheduler rather than on the append path): a log whose owner defers
    /// flushes (a shard) has the owner start it and go on appending meanwhile, any other log
    /// flushes at the end of this append (`maybe_flush`). The recovery point moves only when
    /// that flush succeeded, and only then is the producer snapshot at `base` written, which
    /// tells recovery that the rolled segment is whole (the new segment's directory entry may
    /// reach the disk before the rolled segment's tail does).
    fn roll(&mut self, io: &mut impl LogIo, base: Offset, now: i64) -> Result<(), LogError> {
        let active = self.active();
        if active.is_empty() && active.base_offset() == base {
            return Ok(());
        }
        assert!(base >= self.log_end_offset(), "roll base below the log end");
        let active = self.active_mut();
        active.write_final_time_entry(io)?;
        active.release_reserved();
        // A sealed segment is only read (through descriptors opened per read) or deleted; the
        // flush syncs its files through descriptors of its own (`LazyFile::sync_ticket`).
        active.release_files();
        let segment = Segment::create(&self.dir, base, &self.config, now)?;
        self.segments.push(segment);
        // Kafka snapshots producer state on every roll, named after the new segment; the file
        // is written by the flush (`finish_flush`), the state is taken now.
        self.pending_snapshots.push_back(PendingSnapshot {
            base,
            bytes: self.producers.snapshot_bytes(),
        });
        self.flushes.dir_unsynced = true;
        self.flushes.wanted = true;
        Ok(())
    }

    /// Writes the epoch checkpoint if an append assigned an epoch since it was last written:
    /// before the recovery point moves over that append's batches, below which recovery no
    /// longer rebuilds epochs.
    fn sync_epochs(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.epochs.flush_if_dirty_with(io)
    }

    /// At the end of an append: the flush a roll asked for (unless the owner starts it,
    /// `set_deferred_flushes`), else the flush policy's.
    fn maybe_flush(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        if self.flushes.wanted && !self.flushes.deferred && self.flushes.in_flight.is_none() {
            return self.flush(io);
        }
        self.flush_if_due(io, now_ms()).map(|_| ())
    }

    /// Applies `flush.ms` without an append: the owner calls this from its timer so that an
    /// idle partition's tail still reaches the disk. Returns whether it flushed. A flush that
    /// comes due while the owner performs one is wanted instead (`wants_flush`).
    pub fn flush_if_due(&mut self, io: &mut impl LogIo, now_ms: i64) -> Result<bool, LogError> {
        let due = match self.config.flush {
            FlushPolicy::PageCache => false,
            FlushPolicy::EveryAppend => self.unflushed_messages > 0,
            FlushPolicy::Interval { messages, ms } => {
                self.unflushed_messages >= messages
                    || (self.unflushed_messages > 0 && now_ms - self.last_flush_ms >= ms)
            }
        };
        if !due {
            return Ok(false);
        }
        if self.flushes.in_flight.is_some() {
            self.flushes.wanted = true;
            return Ok(false);
        }
        self.flush(io)?;
        Ok(true)
    }

    /// fdatasyncs every segment holding data above the recovery point, then moves the
    /// recovery point to the log end: `begin_flush`, every planned sync through `io`, and
    /// `finish_flush`, before returning.
    ///
    /// A failed fsync takes the log offline and leaves the recovery point where it was: after
    /// a failed fsync the kernel may have dropped the dirty pages, so a later fsync that
    /// succeeds proves nothing about them, and only recovery at the next open may vouch for
    /// that data again.
    pub fn flush(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        assert!(
            self.flushes.in_flight.is_none(),
            "a synchronous flush while the owner performs one: finish that first"
        );
        let plan = self
            .begin_flush(io)?
            .expect("no flush in flight, so begin_flush plans one");
        let synced = plan.syncs.iter().try_for_each(|s| {
            io.sync_data(s.file())
                .map_err(|e| LogError::io(s.path(), e))
        });
        self.finish_flush(io, plan, synced)
    }

    /// The first half of a flush whose syncs the owner performs (`log::flush_plan`): writes
    /// the epoch checkpoint if an append changed the epochs (synchronously, through `io`; the
    /// recovery point must not pass a new epoch before the file has it), then plans an
    /// fdatasync of every file written since its last sync in every segment holding data
    /// above the recovery point, for a recovery point at the current log end. Appends may go
    /// on while the syncs run; `finish_flush` completes it. `Ok(None)`: a flush is in flight
    /// already; this one is wanted and begins once that one finished (`wants_flush`).
    ///
    /// Errors are as `flush`'s: a full disk at the epoch checkpoint leaves the log online with
    /// nothing synced; any other error takes it offline.
    pub fn begin_flush(&mut self, io: &mut impl LogIo) -> Result<Option<FlushPlan>, LogError> {
        self.assert_not_staged();
        if self.offline.is_some() {
            return Err(self.offline_error());
        }
        if self.flushes.in_flight.is_some() {
            self.flushes.wanted = true;
            return Ok(None);
        }
        let target = self.log_end_offset();
        if let Err(e) = self.sync_epochs(io) {
            if !e.is_disk_full() {
                self.take_offline(format!("epoch checkpoint failed: {e}"));
            }
            return Err(e);
        }
        let mut syncs = Vec::new();
        for seg in &self.segments {
            if seg.next_offset() > self.recovery_point || seg.base_offset() >= self.recovery_point {
                if let Err(e) = seg.plan_syncs(&mut syncs) {
                    self.take_offline(format!("fsync failed: {e}"));
                    return Err(e);
                }
            }
        }
        if self.flushes.dir_unsynced {
            // The rolls' new segment files: their directory entries.
            match PlannedSync::directory(&self.dir) {
                Ok(sync) => syncs.push(sync),
                Err(e) => {
                    self.take_offline(format!("fsync failed: {e}"));
                    return Err(e);
                }
            }
            self.flushes.dir_unsynced = false;
        }
        self.flushes.in_flight = Some(target);
        self.flushes.wanted = false;
        Ok(Some(FlushPlan {
            target,
            messages: self.unflushed_messages,
            syncs,
        }))
    }

    /// Completes `begin_flush` with the outcome of its syncs (the first error among them):
    /// on success the files are clean up to what the plan covered and the recovery point
    /// moves to the plan's target and is published; a failed sync takes the log offline (as
    /// in `flush`) and leaves the recovery point where it was, as does a log that went
    /// offline while the syncs ran.
    pub fn finish_flush(
        &mut self,
        io: &mut impl LogIo,
        plan: FlushPlan,
        synced: Result<(), LogError>,
    ) -> Result<(), LogError> {
        let target = self
            .flushes
            .in_flight
            .take()
            .expect("finish_flush without a flush in flight");
        assert_eq!(target, plan.target, "finish_flush of another plan");
        if let Err(e) = synced {
            self.take_offline(format!("fsync failed: {e}"));
            return Err(e);
        }
        if self.offline.is_some() {
            return Err(self.offline_error());
        }
        debug_assert!(target <= self.log_end_offset(), "flushed past the log end");
        for s in plan.syncs {
            let Some(which) = s.which else { continue };
            if let Some(seg) = self
                .segments
                .iter_mut()
                .find(|g| g.base_offset() == s.segment)
            {
                seg.synced_through(which, s.ticket.covers);
            }
        }
        // The rolled segments below the target are durable: their rolls' snapshots may say so
        // now (each written atomically and synced before the recovery point moves).
        while self
            .pending_snapshots
            .front()
            .is_some_and(|p| p.base <= target)
        {
            let p = self.pending_snapshots.pop_front().expect("front checked");
            let path = snapshot_path(&self.dir, p.base);
            if let Err(e) = write_atomically_with(io, &path, &p.bytes) {
                if !e.is_disk_full() {
                    self.take_offline(format!("producer snapshot failed: {e}"));
                }
                // Retried by the next flush; the recovery point waits for it.
                self.pending_snapshots.push_front(p);
                self.flushes.wanted = true;
                return Err(e);
            }
        }
        self.recovery_point = self.recovery_point.max(target);
        self.unflushed_messages = self.unflushed_messages.saturating_sub(plan.messages);
        self.last_flush_ms = now_ms();
        self.checkpoint.publish(self.checkpoint_entry());
        Ok(())
    }

    /// Whether a flush was asked for (a roll) that has not begun and may begin now: the
    /// owner of a log with deferred flushes calls `begin_flush`.
    pub fn wants_flush(&self) -> bool {
        self.flushes.wanted && self.flushes.in_flight.is_none() && self.offline.is_none()
    }

    /// Whether `begin_flush` handed out a plan that `finish_flush` has not completed.
    pub fn flush_in_flight(&self) -> bool {
        self.flushes.in_flight.is_some()
    }

    /// Whether the owner starts the flushes a roll asks for (`wants_flush`, `begin_flush`)
    /// and performs them while it goes on appending (a shard does). Off by default: the
    /// append that rolled flushes before it returns. The owner must finish a flush in flight
    /// before it turns this off or hands the log on.
    pub fn set_deferred_flushes(&mut self, deferred: bool) {
        assert!(
            deferred || self.flushes.in_flight.is_none(),
            "flushes no longer deferred while one is in flight"
        );
        self.flushes.deferred = deferred;
    }

    /// Whether data above the recovery point waits for a flush (what a periodic checkpoint
    /// pass flushes; an idle partition costs nothing).
    pub fn has_unflushed(&self) -> bool {
        self.recovery_point < self.log_end_offset()
    }

    fn check_range(&self, offset: Offset) -> Result<(), LogError> {
        if offset < self.log_start || offset > self.log_end_offset() {
            return Err(LogError::OffsetOutOfRange {
                partition: self.name(),
                requested: offset,
                log_start: self.log_start,
                log_end: self.log_end_offset(),
            });
        }
        Ok(())
    }

    /// Whole batches starting with the one that contains `from` (or the next one after a gap):
    /// at least one batch, then more while within `max_bytes`, never past one segment. `None`
    /// at the log end; `OffsetOutOfRange` outside [log start, log end].
    pub fn read(&self, from: Offset, max_bytes: u64) -> Result<Option<LogSlice<'_>>, LogError> {
        self.check_range(from)?;
        let first = self
            .segments
            .partition_point(|s| s.base_offset() <= from)
            .saturating_sub(1);
        for seg in &self.segments[first..] {
            if let Some((position, length)) = seg.read(from, max_bytes)? {
                return Ok(Some(LogSlice {
                    segment_base: seg.base_offset(),
                    file: seg.log_file()?,
                    path: seg.log_path(),
                    position,
                    length,
                }));
            }
        }
        Ok(None)
    }

    /// `read`, returning the bytes.
    pub fn read_bytes(&self, from: Offset, max_bytes: u64) -> Result<Vec<u8>, LogError> {
        let Some(slice) = self.read(from, max_bytes)? else {
            return Ok(Vec::new());
        };
        let mut buf = vec![0u8; slice.length as usize];
        slice
            .file
            .read_exact_at(&mut buf, slice.position.0 as u64)
            .map_err(|e| LogError::io(slice.path, e))?;
        Ok(buf)
    }

    /// Kafka's ListOffsets by timestamp: the first offset at or after the log start whose
    /// record timestamp is ≥ `target`, with that timestamp; `None` if no record is that late.
    /// Special targets: -1 latest (log end), -2 earliest (log start), -3 the batch holding the
    /// largest timestamp. For compressed batches the answer is the batch's first offset
    /// (kmirror does not decompress), which a consumer seeking there reads through correctly.
    pub fn offset_for_timestamp(
        &self,
        target: TimestampMs,
    ) -> Result<Option<(Offset, TimestampMs)>, LogError> {
        match target.0 {
            -1 => return Ok(Some((self.log_end_offset(), TimestampMs::NONE))),
            -2 => return Ok(Some((self.log_start, TimestampMs::NONE))),
            -3 => {
                let best = self
                    .segments
                    .iter()
                    .filter_map(|s| s.max_timestamp().map(|ts| (ts, s)))
                    .fold(None::<(TimestampMs, &Segment)>, |acc, (ts, s)| match acc {
                        Some((best, _)) if best >= ts => acc,
                        _ => Some((ts, s)),
                    });
                let Some((ts, seg)) = best else {
                    return Ok(None);
                };
                let found = seg.find_batch_by_timestamp(ts, self.log_start)?;
                return Ok(found.map(|h| (h.last_offset, ts)));
            }
            t if t < 0 => return Ok(None),
            _ => {}
        }
        for seg in &self.segments {
            if seg.max_timestamp().is_none_or(|ts| ts < target) {
                continue;
            }
            let Some(h) = seg.find_batch_by_timestamp(target, self.log_start)? else {
                continue;
            };
            let mut buf = vec![0u8; h.size as usize];
            seg.log_file()?
                .read_exact_at(&mut buf, h.position.0 as u64)
                .map_err(|e| LogError::io(seg.log_path(), e))?;
            let batch = match Batch::peek(&buf)? {
                Peek::Complete(b) => b,
                Peek::Incomplete { .. } => {
                    return Err(LogError::corrupt(
                        seg.log_path(),
                        "batch shorter than its header",
                    ))
                }
            };
            return Ok(Some(first_record_at_or_after(
                &batch,
                target,
                self.log_start,
            )));
        }
        Ok(None)
    }

    /// Removes everything at offsets ≥ `offset` (divergence or rollback). Whole segments above
    /// it are deleted; the one containing it is cut at a batch boundary, so the new log end is
    /// the end of the last batch that lies entirely below `offset`.
    pub fn truncate_to(&mut self, io: &mut impl LogIo, offset: Offset) -> Result<(), LogError> {
        self.assert_not_staged();
        // A flush in flight makes everything below its target durable; only what was appended
        // after it began (an append rolled back) may be cut meanwhile.
        assert!(
            self.flushes.in_flight.is_none_or(|t| offset >= t),
            "truncating below a flush in flight"
        );
        if offset >= self.log_end_offset() {
            return Ok(());
        }
        if offset < self.log_start || offset < self.segments[0].base_offset() {
            return self.truncate_fully_and_start_at(io, offset.max(Offset::ZERO));
        }
        while self.segments.len() > 1 && self.active().base_offset() > offset {
            let seg = self.segments.pop().expect("more than one segment");
            seg.delete_files()?;
        }
        self.active_mut().truncate_to(offset, now_ms())?;
        let end = self.log_end_offset();
        self.pending_snapshots.retain(|p| p.base <= end);
        self.epochs.truncate_from_end(end);
        self.epochs.flush_if_dirty_with(io)?;
        // Synced: a deleted snapshot that came back after a crash would vouch for a later
        // roll at the same base (`recovery::unflushed_roll_hole`).
        if delete_snapshots_above(&self.dir, end)? > 0 {
            sync_dir(&self.dir)?;
        }
        rebuild_producer_state(&self.dir, &self.segments, &mut self.producers, end)?;
        self.recovery_point = self.recovery_point.min(end);
        self.publish_view();
        Ok(())
    }

    /// Deletes every segment and starts an empty log at `offset` (the source's log start
    /// moved past our end, or we diverged below our own start).
    pub fn truncate_fully_and_start_at(
        &mut self,
        io: &mut impl LogIo,
        offset: Offset,
    ) -> Result<(), LogError> {
        assert!(
            self.flushes.in_flight.is_none(),
            "deleting every segment under a flush in flight"
        );
        let fresh = Segment::create(&self.dir, offset, &self.config, now_ms());
        // Build the new segment before deleting: if its base equals an old segment's, the old
        // files are simply replaced by the create.
        let old = std::mem::take(&mut self.segments);
        let fresh = fresh?;
        for seg in old {
            if seg.base_offset() != offset {
                seg.delete_files()?;
            }
        }
        self.segments.push(fresh);
        sync_dir(&self.dir)?;
        self.pending_snapshots.clear();
        self.log_start = offset;
        self.recovery_point = offset;
        self.epochs.clear();
        self.epochs.flush_with(io)?;
        delete_snapshots_above(&self.dir, Offset(-1))?;
        self.producers.reset(offset);
        self.offline = None;
        self.publish_view();
        Ok(())
    }

    /// Moves the log start forward to `offset` (≤ log end), e.g. when the source's log start
    /// advanced. Segments entirely below it are deleted by the next `delete_old_segments`.
    pub fn increase_log_start_offset(&mut self, offset: Offset) -> Result<bool, LogError> {
        if offset <= self.log_start {
            return Ok(false);
        }
        self.check_range(offset)?;
        self.log_start = offset;
        self.epochs.truncate_from_start(offset);
        self.epochs.flush_if_dirty()?;
        self.publish_view();
        Ok(true)
    }

    /// Applies retention.ms, retention.bytes and the log start offset; returns how many
    /// segments were deleted. The log start moves to the first remaining segment's base.
    pub fn delete_old_segments(
        &mut self,
        io: &mut impl LogIo,
        now_ms: i64,
    ) -> Result<usize, LogError> {
        let mut facts = Vec::with_capacity(self.segments.len());
        for (i, seg) in self.segments.iter().enumerate() {
            let next_base = self
                .segments
                .get(i + 1)
                .map_or(self.log_end_offset(), Segment::base_offset);
            facts.push(SegmentFacts {
                size: seg.size(),
                largest_timestamp_ms: seg.largest_timestamp()?,
                next_base: next_base.0,
            });
        }
        let (retention_ms, retention_bytes) = self.config.effective_retention();
        let n = deletable_prefix(
            &facts,
            now_ms,
            retention_ms,
            retention_bytes,
            self.log_start.0,
        );
        if n == 0 {
            return Ok(0);
        }
        if n == self.segments.len() {
            // Kafka rolls first so that the log keeps an (empty) active segment at its end.
            let end = self.log_end_offset();
            self.roll(io, end, now_ms)?;
        }
        let doomed: Vec<Segment> = self.segments.drain(..n).collect();
        for seg in doomed {
            seg.delete_files()?;
        }
        let new_start = self.segments[0].base_offset().max(self.log_start);
        self.log_start = new_start;
        self.epochs.truncate_from_start(new_start);
        self.epochs.flush_if_dirty_with(io)?;
        delete_snapshots_below(&self.dir, self.segments[0].base_offset())?;
        let first = self.segments[0].base_offset();
        self.pending_snapshots.retain(|p| p.base >= first);
        self.publish_view();
        Ok(n)
    }

    /// Final time-index entry, fsync of everything, epoch checkpoint: the state a clean
    /// shutdown marker may vouch for.
    pub fn close(mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.assert_not_staged();
        if self.offline.is_some() {
            return Err(self.offline_error());
        }
        self.active_mut().write_final_time_entry(io)?;
        self.flush(io)?;
        self.epochs.flush_if_dirty_with(io)?;
        // A clean-shutdown marker makes Kafka trust the latest snapshot instead of rebuilding
        // producer state, so one must exist for the log end.
        let end = self.log_end_offset();
        self.producers.take_snapshot_with(io, &self.dir, end)?;
        Ok(())
    }

    /// Writes a producer snapshot at every segment base after the first that has none, from
    /// the batches before it. For a log whose segments before the active one are known to be
    /// durable although their rolls' snapshots are missing (a drill clone copied while the
    /// mirror's last roll was still being flushed): without them recovery would take the
    /// segments for an unflushed roll and cut them (`recovery::unflushed_roll_hole`).
    pub fn snapshot_segment_bases(&mut self, io: &mut impl LogIo) -> Result<usize, LogError> {
        let mut written = 0;
        for i in 1..self.segments.len() {
            let base = self.segments[i].base_offset();
            if snapshot_path(&self.dir, base).exists() {
                continue;
            }
            let mut state = ProducerStateManager::new();
            rebuild_producer_state(&self.dir, &self.segments[..i], &mut state, base)?;
            state.take_snapshot_with(io, &self.dir, base)?;
            written += 1;
        }
        Ok(written)
    }

    /// Deletes the whole partition directory.
    pub fn delete(self) -> Result<(), LogError> {
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(&dir).map_err(|e| LogError::io(&dir, e))
    }
}

/// Within a batch known to reach `target`: the first record with timestamp ≥ `target` and
/// offset ≥ `min_offset`. Uncompressed v2 records are walked; compressed batches and legacy
/// entries answer with the batch itself.
pub(crate) fn first_record_at_or_after(
    batch: &Batch<'_>,
    target: TimestampMs,
    min_offset: Offset,
) -> (Offset, TimestampMs) {
    let fallback = (batch.base_offset().max(min_offset), batch.max_timestamp());
    if batch.is_legacy() || batch.codec() != Codec::None || batch.is_log_append_time() {
        return fallback;
    }
    let bytes = batch.bytes();
    let base_ts = batch.base_timestamp().0;
    let base = batch.base_offset().0;
    let mut at = crate::limits::RECORD_BATCH_V2_HEADER_BYTES;
    for _ in 0..batch.records_count() {
        let Some((len, body)) = varint(bytes, at) else {
            return fallback;
        };
        let Some((ts_delta, next)) = varint(bytes, body + 1) else {
            return fallback;
        };
        let Some((off_delta, _)) = varint(bytes, next) else {
            return fallback;
        };
        // Deltas come from the source's bytes: a sum that does not fit means a corrupt
        // record, answered like a compressed batch.
        let (Some(offset), Some(ts)) = (base.checked_add(off_delta), base_ts.checked_add(ts_delta))
        else {
            return fallback;
        };
        if ts >= target.0 && offset >= min_offset.0 {
            return (Offset(offset), TimestampMs(ts));
        }
        at = body + len.max(0) as usize;
    }
    fallback
}

/// A zigzag varint at `at`: (value, next position).
fn varint(buf: &[u8], mut at: usize) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *buf.get(at)?;
        at += 1;
        raw |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some((((raw >> 1) as i64) ^ -((raw & 1) as i64), at));
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
}
