//! One log segment: a `.log` file of complete batches and its `.index` and `.timeindex`
//! (kafka-formats.md §3.1–3.3, §3.9), with Kafka's indexing and roll rules.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::ids::{FilePosition, Offset, TimestampMs};
use crate::log::config::LogConfig;
use crate::log::flush_plan::{PlannedSync, SegmentFile};
use crate::log::index_pending::PendingIndex;
use crate::log::io::{LogIo, OwnedWriteOp, WriteOp};
use crate::log::lazy_file::{FileRef, Hold, LazyFile};
use crate::log::offset_index::{relative, OffsetIndex};
use crate::log::preallocate::{self, Reserved};
use crate::log::scan::{for_each_batch, read_header, BatchHeader, ScanEnd};
use crate::log::time_index::TimeIndex;
use crate::log::txn_index::{AbortedTxn, TxnIndex};
use crate::log::LogError;
use crate::wire::batch::{Batch, Batches};

pub const LOG_SUFFIX: &str = ".log";
pub const INDEX_SUFFIX: &str = ".index";
pub const TIME_INDEX_SUFFIX: &str = ".timeindex";
pub const TXN_INDEX_SUFFIX: &str = ".txnindex";

/// `<dir>/<base padded to 20 digits><suffix>`, Kafka's file naming.
pub fn segment_file(dir: &Path, base: Offset, suffix: &str) -> PathBuf {
    dir.join(format!("{:020}{suffix}", base.0))
}

/// The base offset in a segment file name (the digits before the first `.`).
pub fn parse_base_offset(file_name: &str) -> Option<Offset> {
    let digits = file_name.split('.').next()?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<i64>().ok().map(Offset)
}

/// Aggregate facts about batches about to be appended, used for the roll decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkStats {
    pub bytes: u64,
    /// First offset of the first batch when it is v2; legacy entries do not carry it.
    pub first_offset: Option<Offset>,
    pub last_offset: Offset,
    pub max_timestamp: TimestampMs,
}

/// Why a segment is being rolled (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollReason {
    Size,
    Time,
    OffsetIndexFull,
    TimeIndexFull,
    OffsetOverflow,
}

#[derive(Debug)]
pub struct Segment {
    base: Offset,
    log_path: PathBuf,
    /// Held while the segment is active and written (`lazy_file`); sealed segments are read
    /// through a descriptor opened per call.
    log: LazyFile,
    size: u64,
    offset_index: OffsetIndex,
    time_index: TimeIndex,
    txn_index: TxnIndex,
    index_interval_bytes: u32,
    /// Log bytes written since the last offset-index entry (Kafka's bytesSinceLastIndexEntry).
    bytes_since_last_index_entry: u64,
    /// Largest batch max timestamp in the segment and the last offset of its batch.
    max_timestamp_so_far: (TimestampMs, Offset),
    /// maxTimestamp of the first batch: the clock for segment.ms.
    first_batch_max_timestamp: Option<TimestampMs>,
    created_ms: i64,
    next_offset: Offset,
    /// `segment.bytes` when the segment was made: how far ahead of the end blocks may be
    /// reserved.
    segment_bytes: u64,
    /// Blocks reserved past the `.log`'s end (`log::preallocate`); given back on roll.
    reserved: Reserved,
}

/// A segment's in-memory state before a staged append, restored if the append's writes fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendMark {
    size: u64,
    bytes_since_last_index_entry: u64,
    max_timestamp_so_far: (TimestampMs, Offset),
    first_batch_max_timestamp: Option<TimestampMs>,
    next_offset: Offset,
}

/// What recovering a segment re-read, and cut.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Bytes of the valid batches revalidated (CRC, framing, offsets) and re-indexed.
    pub bytes: u64,
    pub batches: u64,
    /// Bytes cut off the end (a partial or invalid batch and everything after it).
    pub cut: u64,
}

impl Segment {
    /// Creates an empty segment (all files replaced).
    pub fn create(
        dir: &Path,
        base: Offset,
        config: &LogConfig,
        now_ms: i64,
    ) -> Result<Segment, LogError> {
        let log_path = segment_file(dir, base, LOG_SUFFIX);
        let log =
            LazyFile::create(&log_path, Hold::Always).map_err(|e| LogError::io(&log_path, e))?;
        let offset_index = OffsetIndex::create(
            &segment_file(dir, base, INDEX_SUFFIX),
            base,
            config.offset_index_max_entries(),
        )?;
        let time_index = TimeIndex::create(
            &segment_file(dir, base, TIME_INDEX_SUFFIX),
            base,
            config.time_index_max_entries(),
        )?;
        // The txnindex is created lazily on its first entry; drop any stale one.
        let txn_path = segment_file(dir, base, TXN_INDEX_SUFFIX);
        match std::fs::remove_file(&txn_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(&txn_path, e)),
        }
        let txn_index = TxnIndex::open(&txn_path, base)?;
        Ok(Segment {
            base,
            log_path,
            log,
            size: 0,
            offset_index,
            time_index,
            txn_index,
            index_interval_bytes: config.index_interval_bytes,
            bytes_since_last_index_entry: 0,
            max_timestamp_so_far: (TimestampMs::NONE, base),
            first_batch_max_timestamp: None,
            created_ms: now_ms,
            next_offset: base,
            segment_bytes: config.segment_bytes,
            reserved: Reserved::new(0),
        })
    }

    /// Opens an existing segment. Returns whether its indexes were missing or failed the sanity
    /// check, in which case they are empty now and the caller must `recover` the segment.
    pub fn open(
        dir: &Path,
        base: Offset,
        config: &LogConfig,
        now_ms: i64,
    ) -> Result<(Segment, bool), LogError> {
        let log_path = segment_file(dir, base, LOG_SUFFIX);
        // Held for the checks below and recovery; `PartitionLog::open` releases it after.
        let mut log = LazyFile::existing(&log_path, Hold::Always);
        log.hold().map_err(|e| LogError::io(&log_path, e))?;
        let size = log
            .reader()
            .and_then(|f| f.metadata())
            .map_err(|e| LogError::io(&log_path, e))?
            .len();
        let index_path = segment_file(dir, base, INDEX_SUFFIX);
        let time_path = segment_file(dir, base, TIME_INDEX_SUFFIX);
        let oi_max = config.offset_index_max_entries();
        let ti_max = config.time_index_max_entries();
        let loaded = match (
            OffsetIndex::open(&index_path, base, oi_max),
            TimeIndex::open(&time_path, base, ti_max),
        ) {
            (Ok(oi), Ok(ti)) => Some((oi, ti)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(segment = %log_path.display(), error = %e, "rebuilding indexes");
                None
            }
        };
        let (offset_index, time_index, mut needs_recovery) = match loaded {
            Some((oi, ti)) => (oi, ti, false),
            None => (
                OffsetIndex::create(&index_path, base, oi_max)?,
                TimeIndex::create(&time_path, base, ti_max)?,
                true,
            ),
        };
        let txn_path = segment_file(dir, base, TXN_INDEX_SUFFIX);
        let txn_index = match TxnIndex::open(&txn_path, base).and_then(|t| {
            t.sanity_check()?;
            Ok(t)
        }) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(segment = %log_path.display(), error = %e, "rebuilding txnindex");
                needs_recovery = true;
                // Recovery re-creates it from the ABORT markers in the log.
                match std::fs::remove_file(&txn_path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(LogError::io(&txn_path, e)),
                }
                TxnIndex::open(&txn_path, base)?
            }
        };
        let mut seg = Segment {
            base,
            log_path,
            log,
            size,
            offset_index,
            time_index,
            txn_index,
            index_interval_bytes: config.index_interval_bytes,
            bytes_since_last_index_entry: 0,
            max_timestamp_so_far: (TimestampMs::NONE, base),
            first_batch_max_timestamp: None,
            created_ms: now_ms,
            next_offset: base,
            segment_bytes: config.segment_bytes,
            reserved: Reserved::new(size),
        };
        seg.max_timestamp_so_far = seg.time_index.last_entry();
        seg.first_batch_max_timestamp =
            read_header(&*seg.log_reader()?, &seg.log_path, 0, size)?.map(|h| h.max_timestamp);
        match seg.read_next_offset() {
            Ok(next) => seg.next_offset = next,
            Err(LogError::Corrupt { .. }) => needs_recovery = true,
            Err(e) => return Err(e),
        }
        if !needs_recovery && !seg.indexes_agree_with_log() {
            needs_recovery = true;
        }
        if needs_recovery {
            seg.offset_index.reset()?;
            seg.time_index.reset()?;
            seg.txn_index.reset()?;
        }
        Ok((seg, needs_recovery))
    }

    /// Cheap consistency check of index tails against the log, done at every open: an entry
    /// pointing past the log or past the last offset means the index belongs to other data.
    fn indexes_agree_with_log(&self) -> bool {
        let last_offset = Offset(self.next_offset.0 - 1);
        let oi_ok = self.offset_index.entries().last().is_none_or(|e| {
            (e.position.0 as u64) < self.size
                && crate::log::offset_index::absolute(self.base, e.relative_offset) <= last_offset
        });
        let (_, ti_offset) = self.time_index.last_entry();
        let ti_ok = self.time_index.is_empty() || ti_offset <= last_offset;
        oi_ok && ti_ok
    }

    /// Next offset after the last batch, scanning headers from the last index entry.
    fn read_next_offset(&self) -> Result<Offset, LogError> {
        let (_, start) = self.offset_index.lookup(Offset(i64::MAX));
        let mut pos = start.0 as u64;
        let mut next = self.base;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, self.size)? {
            next = h.last_offset.next();
            pos = h.end();
        }
        Ok(next)
    }

    pub fn base_offset(&self) -> Offset {
        self.base
    }

    /// Offset after the last batch (the base offset when empty).
    pub fn next_offset(&self) -> Offset {
        self.next_offset
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The `.log`: the held descriptor of an active segment, else one opened for the caller.
    pub fn log_file(&self) -> Result<FileRef<'_>, LogError> {
        self.log_reader()
    }

    fn log_reader(&self) -> Result<FileRef<'_>, LogError> {
        self.log
            .reader()
            .map_err(|e| LogError::io(&self.log_path, e))
    }

    /// Closes the descriptors this segment holds (it stopped being active, or was only opened
    /// and recovered); the next write opens them again.
    pub fn release_files(&mut self) {
        self.log.release();
        self.offset_index.release();
        self.time_index.release();
        self.txn_index.release();
    }

    /// Whether any of the segment's files holds a descriptor (tests of the fd budget).
    pub fn holds_files(&self) -> bool {
        self.log.is_held()
            || self.offset_index.is_held()
            || self.time_index.is_held()
            || self.txn_index.is_held()
    }

    pub fn offset_index(&self) -> &OffsetIndex {
        &self.offset_index
    }

    pub fn time_index(&self) -> &TimeIndex {
        &self.time_index
    }

    pub fn txn_index(&self) -> &TxnIndex {
        &self.txn_index
    }

    /// Records an aborted transaction whose ABORT marker was appended to this segment.
    pub fn append_aborted(
        &mut self,
        io: &mut impl LogIo,
        txn: &AbortedTxn,
    ) -> Result<(), LogError> {
        self.txn_index.append(io, txn)
    }

    /// Largest record timestamp in the segment, if any batch carried one.
    pub fn max_timestamp(&self) -> Option<TimestampMs> {
        let ts = self.max_timestamp_so_far.0;
        (ts.0 >= 0).then_some(ts)
    }

    /// Kafka's `largestTimestamp`: the max timestamp, else the file's modification time.
    pub fn largest_timestamp(&self) -> Result<i64, LogError> {
        if let Some(ts) = self.max_timestamp() {
            return Ok(ts.0);
        }
        let modified = std::fs::metadata(&self.log_path)
            .and_then(|m| m.modified())
            .map_err(|e| LogError::io(&self.log_path, e))?;
        Ok(modified
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0))
    }

    /// Kafka's `shouldRoll`, checked before appending `chunk` (kafka-formats.md §3.9).
    pub fn roll_reason(
        &self,
        chunk: &ChunkStats,
        config: &LogConfig,
        now_ms: i64,
    ) -> Option<RollReason> {
        let waited = match self.first_batch_max_timestamp {
            Some(ts) if ts.0 >= 0 => chunk.max_timestamp.0.saturating_sub(ts.0),
            _ => now_ms.saturating_sub(self.created_ms),
        };
        if self.size > config.segment_bytes.saturating_sub(chunk.bytes) {
            Some(RollReason::Size)
        } else if self.size > 0 && waited > config.segment_ms {
            Some(RollReason::Time)
        } else if self.offset_index.is_full() {
            Some(RollReason::OffsetIndexFull)
        } else if self.time_index.is_full() {
            Some(RollReason::TimeIndexFull)
        } else if relative(self.base, chunk.last_offset).is_none() {
            Some(RollReason::OffsetOverflow)
        } else {
            None
        }
    }

    /// Appends `bytes`, complete and already validated batches, at the end of the `.log`, with
    /// index entries per batch by Kafka's rule: the `.log` bytes and the new entries of each
    /// index go to `io` as one batch of (at most) three writes. On an I/O error the segment's
    /// in-memory state is unchanged and its files are cut back to their old sizes.
    pub fn append(&mut self, io: &mut impl LogIo, bytes: &[u8]) -> Result<(), LogError> {
        let mark = self.stage_append(bytes)?;
        // In order, stopping at the first failure (what `write_batch` of a plain `LogIo` does),
        // without collecting the ops: an append on this path allocates nothing
        // (tests/fetch_no_alloc.rs). The shards batch their appends on the ring instead
        // (`runtime::mirror_shard_append`).
        let mut written = Ok(());
        for op in self.staged_writes(&mark, bytes) {
            written = io.write_all_at(op.file, op.pos, op.data);
            if written.is_err() {
                break;
            }
        }
        self.finish_append(mark, written)
    }

    /// The sans-IO half of `append`: applies `bytes` to the in-memory state (size, next offset,
    /// index entries queued for writing) and returns what to restore if the writes fail. Nothing
    /// is written: the caller performs `staged_writes` and then calls `finish_append`, and no
    /// other change to this segment may come in between.
    pub fn stage_append(&mut self, bytes: &[u8]) -> Result<AppendMark, LogError> {
        let start = self.size;
        let end = start + bytes.len() as u64;
        assert!(
            end <= crate::limits::SEGMENT_BYTES_MAX,
            "segment grew past int32 positions"
        );
        let mark = AppendMark {
            size: start,
            bytes_since_last_index_entry: self.bytes_since_last_index_entry,
            max_timestamp_so_far: self.max_timestamp_so_far,
            first_batch_max_timestamp: self.first_batch_max_timestamp,
            next_offset: self.next_offset,
        };
        self.size = end;
        let mut pos = start;
        for item in Batches::new(bytes) {
            let (_, batch) = item.expect("append is given validated batches");
            if let Err(e) = self.index_batch(FilePosition(pos as u32), &batch) {
                self.restore(&mark)?;
                return Err(e);
            }
            pos += batch.size() as u64;
        }
        assert_eq!(pos, end, "append is given whole batches");
        // The writes borrow the files' descriptors until `finish_append` (lazily held files).
        if let Err(e) = self.begin_batch() {
            self.restore(&mark)?;
            self.end_batch();
            return Err(e);
        }
        if let Some((pos, len)) = self.reserved.plan(end, self.segment_bytes) {
            // Only a hint: the write itself reports a full disk or a failing one.
            if let Err(e) = preallocate::reserve(self.log.batch_file(), pos, len) {
                tracing::debug!(segment = %self.log_path.display(), error = %e, "blocks not reserved ahead");
            }
        }
        Ok(mark)
    }

    /// Gives back the blocks reserved past the `.log`'s end (the segment stops being active).
    /// A failure costs only disk space, so it is logged, not returned.
    pub fn release_reserved(&mut self) {
        if !self.reserved.past(self.size) {
            return;
        }
        if let Err(e) = self.log.set_len(self.size) {
            tracing::warn!(segment = %self.log_path.display(), error = %e, "reserved blocks not given back");
        }
        self.reserved.cut_to(self.size);
    }

    fn begin_batch(&mut self) -> Result<(), LogError> {
        self.log
            .begin_batch()
            .map_err(|e| LogError::io(&self.log_path, e))?;
        self.offset_index.begin_batch()?;
        self.time_index.begin_batch()
    }

    fn end_batch(&mut self) {
        self.log.end_batch();
        self.offset_index.end_batch();
        self.time_index.end_batch();
    }

    /// The writes of a staged append, in order: its `.log` bytes, then the `.index` and
    /// `.timeindex` entries it queued (each ordered after the previous write).
    pub fn staged_writes<'a>(
        &'a self,
        mark: &AppendMark,
        bytes: &'a [u8],
    ) -> impl Iterator<Item = WriteOp<'a>> {
        let log = WriteOp {
            file: self.log.batch_file(),
            pos: mark.size,
            data: bytes,
            after_previous: false,
        };
        std::iter::once(log)
            .chain(self.offset_index.pending_write())
            .chain(self.time_index.pending_write())
    }

    /// `staged_writes` as owned ops, for a ring batch that completes after this call: the
    /// `.log` op holds `bytes` (the records, shared), the index ops a copy of their entries,
    /// and every op its file's descriptor.
    pub fn staged_writes_owned(
        &self,
        mark: &AppendMark,
        bytes: &bytes::Bytes,
    ) -> impl Iterator<Item = OwnedWriteOp> {
        let log = OwnedWriteOp {
            file: self.log.batch_file_shared(),
            pos: mark.size,
            data: bytes.clone(),
            after_previous: false,
        };
        std::iter::once(log)
            .chain(self.offset_index.pending_write_owned())
            .chain(self.time_index.pending_write_owned())
    }

    /// Completes a staged append with the outcome of its writes: on success the queued index
    /// entries count as written; on failure everything `stage_append` changed is undone and
    /// the files are cut back (a failed rollback is reported instead of the write error, so the
    /// caller takes the log offline).
    pub fn finish_append(
        &mut self,
        mark: AppendMark,
        written: std::io::Result<()>,
    ) -> Result<(), LogError> {
        let done = match written {
            Ok(()) => {
                self.offset_index.pending_written();
                self.time_index.pending_written();
                Ok(())
            }
            Err(e) => self
                .restore(&mark)
                .and(Err(LogError::io(&self.log_path, e))),
        };
        self.end_batch();
        done
    }

    /// Undoes a staged append: in-memory state back to `mark`, files back to their sizes.
    fn restore(&mut self, mark: &AppendMark) -> Result<(), LogError> {
        self.size = mark.size;
        self.bytes_since_last_index_entry = mark.bytes_since_last_index_entry;
        self.max_timestamp_so_far = mark.max_timestamp_so_far;
        self.first_batch_max_timestamp = mark.first_batch_max_timestamp;
        self.next_offset = mark.next_offset;
        let log = self
            .log
            .set_len(mark.size)
            .map_err(|e| LogError::io(&self.log_path, e));
        self.reserved.cut_to(mark.size);
        let index = self.offset_index.drop_pending();
        let time = self.time_index.drop_pending();
        log.and(index).and(time)
    }

    /// Kafka's per-batch index step (shared by append and recovery so both produce the same
    /// entries): the max timestamp is updated first, then an entry is added when more than
    /// `index.interval.bytes` have been written since the last one. Entries are queued in
    /// memory; the caller writes them (`staged_writes`, `write_pending_indexes`).
    fn index_batch(&mut self, pos: FilePosition, batch: &Batch<'_>) -> Result<(), LogError> {
        let max_ts = batch.max_timestamp();
        if pos.0 == 0 {
            self.first_batch_max_timestamp = Some(max_ts);
        }
        if max_ts > self.max_timestamp_so_far.0 {
            self.max_timestamp_so_far = (max_ts, batch.last_offset());
        }
        if self.bytes_since_last_index_entry > self.index_interval_bytes as u64 {
            self.offset_index.push(batch.last_offset(), pos)?;
            let (ts, off) = self.max_timestamp_so_far;
            self.time_index.maybe_push(ts, off, false)?;
            self.bytes_since_last_index_entry = 0;
        }
        self.bytes_since_last_index_entry += batch.size() as u64;
        self.next_offset = batch.next_offset();
        Ok(())
    }

    /// Writes the index entries queued by recovery.
    fn write_pending_indexes(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.offset_index.write_pending(io)?;
        self.time_index.write_pending(io)
    }

    /// Rebuilds the indexes from the `.log`, validating every batch; cuts the `.log` at the
    /// first invalid or partial batch. `on_batch` sees every valid batch in order (epoch cache,
    /// producer state). Returns what was re-read and the number of bytes cut.
    pub fn recover<F>(&mut self, io: &mut impl LogIo, on_batch: F) -> Result<Recovered, LogError>
    where
        F: FnMut(&Batch<'_>) -> Result<Option<AbortedTxn>, LogError>,
    {
        // The index files are cut after the rebuild, and only where it did not cover them.
        self.offset_index.reset_deferred();
        self.time_index.reset_deferred();
        self.txn_index.reset()?;
        self.bytes_since_last_index_entry = 0;
        self.max_timestamp_so_far = (TimestampMs::NONE, self.base);
        self.first_batch_max_timestamp = None;
        self.next_offset = self.base;
        self.revalidate_from(io, 0, on_batch)
    }

    /// `recover`, trusting everything below `from` (the recovery point: those batches and
    /// their index entries were fsynced): only the batches from the one holding `from` on are
    /// revalidated and re-indexed. The segment's indexes must have passed `open`'s check.
    pub fn recover_from<F>(
        &mut self,
        io: &mut impl LogIo,
        from: Offset,
        on_batch: F,
    ) -> Result<Recovered, LogError>
    where
        F: FnMut(&Batch<'_>) -> Result<Option<AbortedTxn>, LogError>,
    {
        if from <= self.base {
            return self.recover(io, on_batch);
        }
        let Some(first) = self.translate_offset(from)? else {
            // Nothing at or above `from` in this segment (a torn header is dealt with below).
            let at = self.size_of_trusted_prefix()?;
            return self.resume_indexing_at(io, at, on_batch);
        };
        self.resume_indexing_at(io, first.position.0 as u64, on_batch)
    }

    /// End of the last whole batch header chain from the start (the trusted prefix when no
    /// batch reaches the recovery point).
    fn size_of_trusted_prefix(&self) -> Result<u64, LogError> {
        let (_, start) = self.offset_index.lookup(Offset(i64::MAX));
        let mut pos = start.0 as u64;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, self.size)? {
            pos = h.end();
        }
        Ok(pos)
    }

    /// Drops the index entries of the batches at and after byte `at`, restores the indexing
    /// state as of `at` (what appending the batches before it left), and revalidates from there.
    fn resume_indexing_at<F>(
        &mut self,
        io: &mut impl LogIo,
        at: u64,
        on_batch: F,
    ) -> Result<Recovered, LogError>
    where
        F: FnMut(&Batch<'_>) -> Result<Option<AbortedTxn>, LogError>,
    {
        if at == 0 {
            return self.recover(io, on_batch);
        }
        let next = match read_header(&*self.log_reader()?, &self.log_path, at, self.size)? {
            Some(h) => h.base_offset,
            None => self.next_offset_below(at)?,
        };
        self.offset_index.truncate_to_deferred(next);
        self.time_index.truncate_to_deferred(next);
        self.txn_index.truncate_to(next)?;
        // Kafka's counter: the bytes appended since the batch that got the last entry began.
        self.bytes_since_last_index_entry = match self.offset_index.entries().last() {
            Some(e) => at - e.position.0 as u64,
            None => at,
        };
        self.next_offset = next;
        self.max_timestamp_so_far = self.largest_timestamp_below(at)?;
        self.revalidate_from(io, at, on_batch)
    }

    /// The next offset after the batches that end at or before byte `at`.
    fn next_offset_below(&self, at: u64) -> Result<Offset, LogError> {
        let (_, start) = self.offset_index.lookup(Offset(i64::MAX));
        let mut pos = start.0 as u64;
        let mut next = self.base;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, at)? {
            next = h.last_offset.next();
            pos = h.end();
        }
        Ok(next)
    }

    /// Max timestamp (and its offset) of the batches before byte `at`: the last time-index
    /// entry below it, or a larger one in the batches after that entry.
    fn largest_timestamp_below(&self, at: u64) -> Result<(TimestampMs, Offset), LogError> {
        let mut best = if self.time_index.is_empty() {
            (TimestampMs::NONE, self.base)
        } else {
            self.time_index.last_entry()
        };
        let (_, start) = self.offset_index.lookup(best.1);
        let mut pos = start.0 as u64;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, at)? {
            if h.max_timestamp > best.0 {
                best = (h.max_timestamp, h.last_offset);
            }
            pos = h.end();
        }
        Ok(best)
    }

    /// Validates and indexes every batch from byte `from` on; cuts the `.log` at the first
    /// invalid or partial one.
    fn revalidate_from<F>(
        &mut self,
        io: &mut impl LogIo,
        from: u64,
        mut on_batch: F,
    ) -> Result<Recovered, LogError>
    where
        F: FnMut(&Batch<'_>) -> Result<Option<AbortedTxn>, LogError>,
    {
        let mut valid_end = from;
        let mut revalidated = Recovered::default();
        let file = match self.log.reader() {
            Ok(FileRef::Held(f)) => f.try_clone(),
            Ok(FileRef::Opened(f)) => Ok(f),
            Err(e) => Err(e),
        }
        .map_err(|e| LogError::io(&self.log_path, e))?;
        let path = self.log_path.clone();
        let mut failure: Option<String> = None;
        let outcome = for_each_batch(&file, &path, from, self.size, |pos, batch| {
            if let Err(e) = batch.validate() {
                failure = Some(e.to_string());
                return Ok(ControlFlow::Break(()));
            }
            // Kafka only needs the relative offset to fit; a batch that goes back in offsets
            // would corrupt the index, so recovery keeps the prefix before it.
            if relative(self.base, batch.last_offset()).is_none()
                || batch.base_offset() < self.next_offset
            {
                failure = Some(format!(
                    "offset {} out of order or out of range for base {}",
                    batch.last_offset(),
                    self.base
                ));
                return Ok(ControlFlow::Break(()));
            }
            self.index_batch(pos, &batch)?;
            if let Some(txn) = on_batch(&batch)? {
                self.txn_index.append(io, &txn)?;
            }
            valid_end = pos.0 as u64 + batch.size() as u64;
            revalidated.bytes += batch.size() as u64;
            revalidated.batches += 1;
            Ok(ControlFlow::Continue(()))
        })?;
        match (&outcome, &failure) {
            (ScanEnd::Clean, _) => {}
            (ScanEnd::Stopped { at }, Some(why)) => {
                tracing::warn!(segment = %path.display(), position = at, reason = %why, "invalid batch; truncating")
            }
            (ScanEnd::Partial { at }, _) => {
                tracing::warn!(segment = %path.display(), position = at, "partial batch; truncating")
            }
            (ScanEnd::Malformed { at, error }, _) => {
                tracing::warn!(segment = %path.display(), position = at, error = %error, "malformed batch; truncating")
            }
            (ScanEnd::Stopped { .. }, None) => {}
        }
        let cut = self.size - valid_end;
        if cut > 0 {
            self.log
                .set_len(valid_end)
                .map_err(|e| LogError::io(&self.log_path, e))?;
            self.reserved.cut_to(valid_end);
            self.size = valid_end;
        }
        self.write_pending_indexes(io)?;
        let (ts, off) = self.max_timestamp_so_far;
        self.time_index.maybe_append(io, ts, off, true)?;
        self.offset_index.settle_len()?;
        self.time_index.settle_len()?;
        revalidated.cut = cut;
        Ok(revalidated)
    }

    /// Position and header of the first batch whose last offset is ≥ `offset`: index lookup,
    /// then a header scan (Kafka's `translateOffset`). `None` if every batch is below `offset`.
    pub fn translate_offset(&self, offset: Offset) -> Result<Option<BatchHeader>, LogError> {
        let (_, start) = self.offset_index.lookup(offset);
        let mut pos = start.0 as u64;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, self.size)? {
            if h.last_offset >= offset {
                return Ok(Some(h));
            }
            pos = h.end();
        }
        Ok(None)
    }

    /// Whole batches from the one containing `from`: at least one batch, then more while the
    /// total stays within `max_bytes`. Returns (position, length) or `None` past the end.
    pub fn read(
        &self,
        from: Offset,
        max_bytes: u64,
    ) -> Result<Option<(FilePosition, u64)>, LogError> {
        let Some(first) = self.translate_offset(from)? else {
            return Ok(None);
        };
        let mut len = first.size as u64;
        let mut pos = first.end();
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, self.size)? {
            if len + h.size as u64 > max_bytes {
                break;
            }
            len += h.size as u64;
            pos = h.end();
        }
        Ok(Some((first.position, len)))
    }

    /// First batch at or after `from_position` whose max timestamp is ≥ `target` and whose last
    /// offset is ≥ `min_offset` (Kafka's `searchForTimestamp`, at batch level).
    pub fn find_batch_by_timestamp(
        &self,
        target: TimestampMs,
        min_offset: Offset,
    ) -> Result<Option<BatchHeader>, LogError> {
        let (_, indexed_offset) = self.time_index.lookup(target);
        let (_, start) = self.offset_index.lookup(indexed_offset.max(min_offset));
        let mut pos = start.0 as u64;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, self.size)? {
            if h.max_timestamp >= target && h.last_offset >= min_offset {
                return Ok(Some(h));
            }
            pos = h.end();
        }
        Ok(None)
    }

    /// Drops everything at offsets ≥ `offset`: the `.log` is cut at the start of the batch that
    /// contains `offset`, the index entries at or above it removed. Returns the bytes cut.
    pub fn truncate_to(&mut self, offset: Offset, now_ms: i64) -> Result<u64, LogError> {
        let Some(cut_at) = self.translate_offset(offset)? else {
            return Ok(0);
        };
        self.offset_index.truncate_to(offset)?;
        self.time_index.truncate_to(offset)?;
        self.txn_index.truncate_to(offset)?;
        let new_size = cut_at.position.0 as u64;
        let cut = self.size - new_size;
        self.log
            .set_len(new_size)
            .map_err(|e| LogError::io(&self.log_path, e))?;
        self.reserved.cut_to(new_size);
        self.size = new_size;
        if new_size == 0 {
            self.created_ms = now_ms;
            self.first_batch_max_timestamp = None;
        }
        self.bytes_since_last_index_entry = 0;
        self.next_offset = self.read_next_offset()?;
        self.max_timestamp_so_far = self.read_largest_timestamp()?;
        Ok(cut)
    }

    /// Max timestamp: the last time-index entry, or a larger one found in the batches after it.
    fn read_largest_timestamp(&self) -> Result<(TimestampMs, Offset), LogError> {
        let mut best = self.time_index.last_entry();
        let (_, start) = self.offset_index.lookup(best.1);
        let mut pos = start.0 as u64;
        let log = self.log_reader()?;
        while let Some(h) = read_header(&log, &self.log_path, pos, self.size)? {
            if h.max_timestamp > best.0 {
                best = (h.max_timestamp, h.last_offset);
            }
            pos = h.end();
        }
        Ok(best)
    }

    /// Writes the final time-index entry (the segment's max timestamp). Done when the segment
    /// stops being active and on close, so time-based retention and lookups see it.
    pub fn write_final_time_entry(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        let (ts, off) = self.max_timestamp_so_far;
        self.time_index.maybe_append(io, ts, off, true)
    }

    /// fdatasync of the `.log` and all indexes.
    pub fn flush(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.log
            .sync(io)
            .map_err(|e| LogError::io(&self.log_path, e))?;
        self.offset_index.sync(io)?;
        self.time_index.sync(io)?;
        self.txn_index.flush(io)
    }

    /// `flush` as syncs for the caller to perform later: one per file written since its last
    /// sync (`log::flush_plan`).
    pub fn plan_syncs(&self, out: &mut Vec<PlannedSync>) -> Result<(), LogError> {
        let log = self
            .log
            .sync_ticket()
            .map_err(|e| LogError::io(&self.log_path, e))?
            .map(|t| (self.log_path.clone(), t));
        let files = [
            (SegmentFile::Log, log),
            (SegmentFile::OffsetIndex, self.offset_index.sync_ticket()?),
            (SegmentFile::TimeIndex, self.time_index.sync_ticket()?),
            (SegmentFile::TxnIndex, self.txn_index.sync_ticket()?),
        ];
        for (which, planned) in files {
            if let Some((path, ticket)) = planned {
                out.push(PlannedSync {
                    segment: self.base,
                    which: Some(which),
                    path,
                    ticket,
                });
            }
        }
        Ok(())
    }

    /// A planned sync of one of this segment's files succeeded.
    pub fn synced_through(&mut self, which: SegmentFile, covers: u64) {
        match which {
            SegmentFile::Log => self.log.synced_through(covers),
            SegmentFile::OffsetIndex => self.offset_index.synced_through(covers),
            SegmentFile::TimeIndex => self.time_index.synced_through(covers),
            SegmentFile::TxnIndex => self.txn_index.synced_through(covers),
        }
    }

    /// Removes the segment's files (`.log`, indexes, and a `.txnindex` if there is one).
    pub fn delete_files(self) -> Result<(), LogError> {
        let dir = self
            .log_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let base = self.base;
        drop(self);
        for suffix in [
            INDEX_SUFFIX,
            TIME_INDEX_SUFFIX,
            TXN_INDEX_SUFFIX,
            LOG_SUFFIX,
        ] {
            let path = segment_file(&dir, base, suffix);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(LogError::io(&path, e)),
            }
        }
        Ok(())
    }
}
