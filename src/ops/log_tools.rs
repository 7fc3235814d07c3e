//! `kmirror log verify DIR` and `kmirror log dump DIR`: offline checks of one partition
//! directory, whether kmirror or Apache Kafka wrote it. Both only read; they never repair.
//!
//! `verify` applies the cross-checks Kafka's DumpLogSegments makes (kafka-formats.md §5) plus
//! the broker's load-time sanity checks, and stops at the first problem with the file, offset
//! and position involved.

use std::fmt;
use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::ids::{LeaderEpoch, Offset, TimestampMs};
use crate::limits::{OFFSET_INDEX_ENTRY_BYTES, TIME_INDEX_ENTRY_BYTES, TXN_INDEX_ENTRY_BYTES};
use crate::log::checkpoint::OffsetCheckpointFile;
use crate::log::epoch_cache::LeaderEpochCache;
use crate::log::offset_index::OffsetIndexEntry;
use crate::log::producer_state::{list_snapshots, read_snapshot, snapshot_path};
use crate::log::scan::{for_each_batch, ScanEnd};
use crate::log::segment::{
    parse_base_offset, segment_file, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX,
};
use crate::log::time_index::TimeIndexEntry;
use crate::log::txn_index::AbortedTxn;
use crate::log::{offset_index, partition_meta, time_index, LogError};
use crate::wire::batch::{Batch, ControlType};

/// The first problem `verify` found.
#[derive(Debug)]
pub struct Problem {
    pub path: PathBuf,
    pub offset: Option<Offset>,
    pub position: Option<u64>,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(o) = self.offset {
            write!(f, ": offset {o}")?;
        }
        if let Some(p) = self.position {
            write!(f, " (position {p})")?;
        }
        write!(f, ": {}", self.what)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Problem(Problem),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("{0}: not a partition directory (no .log files)")]
    NoSegments(PathBuf),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

fn problem(
    path: &Path,
    offset: Option<Offset>,
    position: Option<u64>,
    what: impl Into<String>,
) -> ToolError {
    ToolError::Problem(Problem {
        path: path.to_path_buf(),
        offset,
        position,
        what: what.into(),
    })
}

/// What `verify` checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub segments: usize,
    pub batches: u64,
    pub records: u64,
    pub bytes: u64,
    pub first_offset: Option<Offset>,
    pub last_offset: Option<Offset>,
    pub index_entries: u64,
    pub time_index_entries: u64,
    pub aborted_txns: u64,
    pub epochs: usize,
    pub snapshots: usize,
    /// Zero-filled (preallocated) index tails of a broker that was still running.
    pub preallocated_tails: usize,
    /// Epochs the batches start at or above the recovery point that the epoch checkpoint does
    /// not list yet (written at the next flush).
    pub epochs_above_recovery_point: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let range = match (self.first_offset, self.last_offset) {
            (Some(a), Some(b)) => format!("offsets {a}..={b}"),
            _ => "no batches".to_string(),
        };
        write!(
            f,
            "OK: {} segments, {} batches, {} records, {} bytes, {range}; {} index entries, \
             {} time index entries, {} aborted txns, {} epochs, {} snapshots",
            self.segments,
            self.batches,
            self.records,
            self.bytes,
            self.index_entries,
            self.time_index_entries,
            self.aborted_txns,
            self.epochs,
            self.snapshots
        )?;
        if self.preallocated_tails > 0 {
            write!(
                f,
                " ({} preallocated index tails ignored)",
                self.preallocated_tails
            )?;
        }
        if self.epochs_above_recovery_point > 0 {
            write!(
                f,
                " ({} epochs above the recovery point not checkpointed yet)",
                self.epochs_above_recovery_point
            )?;
        }
        Ok(())
    }
}

/// Header facts of one stored batch, kept for the index cross-checks.
#[derive(Debug, Clone, Copy)]
struct Seen {
    position: u64,
    base: Offset,
    last: Offset,
    max_timestamp: TimestampMs,
    abort_marker: bool,
}

fn segment_bases(dir: &Path) -> Result<Vec<Offset>, ToolError> {
    let mut bases = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))? {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(LOG_SUFFIX) {
            if let Some(base) = parse_base_offset(&name) {
                bases.push(base);
            }
        }
    }
    bases.sort();
    if bases.is_empty() {
        return Err(ToolError::NoSegments(dir.to_path_buf()));
    }
    Ok(bases)
}

/// Checks a partition directory; `Err(Problem)` names the first inconsistency.
pub fn verify(dir: &Path) -> Result<Summary, ToolError> {
    let mut summary = Summary::default();
    let mut previous_last: Option<Offset> = None;
    let mut epochs: Vec<(LeaderEpoch, Offset)> = Vec::new();
    let mut log_end = Offset(0);
    for base in segment_bases(dir)? {
        summary.segments += 1;
        let seen = verify_log(dir, base, &mut previous_last, &mut epochs, &mut summary)?;
        verify_offset_index(dir, base, &seen, &mut summary)?;
        verify_time_index(dir, base, &seen, &mut summary)?;
        verify_txn_index(dir, base, &seen, &mut summary)?;
        // An empty last segment (rolled by a new leader) still marks where the log ends.
        log_end = log_end.max(base);
    }
    if let Some(last) = previous_last {
        log_end = log_end.max(last.next());
    }
    verify_epochs(dir, &epochs, log_end, recovery_point(dir), &mut summary)?;
    for offset in list_snapshots(dir)? {
        let path = snapshot_path(dir, offset);
        read_snapshot(&path).map_err(|e| problem(&path, None, None, e.to_string()))?;
        summary.snapshots += 1;
    }
    let meta = dir.join("partition.metadata");
    if meta.exists() {
        partition_meta::read(dir).map_err(|e| problem(&meta, None, None, e.to_string()))?;
    }
    Ok(summary)
}

fn verify_log(
    dir: &Path,
    base: Offset,
    previous_last: &mut Option<Offset>,
    epochs: &mut Vec<(LeaderEpoch, Offset)>,
    summary: &mut Summary,
) -> Result<Vec<Seen>, ToolError> {
    let path = segment_file(dir, base, LOG_SUFFIX);
    let file = std::fs::File::open(&path).map_err(|e| LogError::io(&path, e))?;
    let size = file.metadata().map_err(|e| LogError::io(&path, e))?.len();
    let mut seen = Vec::new();
    let mut failure: Option<ToolError> = None;
    let end = for_each_batch(&file, &path, 0, size, |pos, batch| {
        let at = Some(pos.0 as u64);
        let fail = |what: String| problem(&path, Some(batch.base_offset()), at, what);
        if let Err(e) = batch.validate() {
            failure = Some(fail(e.to_string()));
            return Ok(ControlFlow::Break(()));
        }
        if batch.base_offset() < base || batch.last_offset().0 - base.0 > i32::MAX as i64 {
            failure = Some(fail(format!(
                "offsets {}..={} do not fit segment base {base}",
                batch.base_offset(),
                batch.last_offset()
            )));
            return Ok(ControlFlow::Break(()));
        }
        if let Some(prev) = *previous_last {
            if batch.base_offset() <= prev {
                failure = Some(fail(format!(
                    "does not follow the previous batch ending at {prev}"
                )));
                return Ok(ControlFlow::Break(()));
            }
        }
        *previous_last = Some(batch.last_offset());
        let epoch = batch.partition_leader_epoch();
        if !batch.is_legacy() && epoch.is_known() && epochs.last().is_none_or(|(e, _)| epoch > *e) {
            epochs.push((epoch, batch.base_offset()));
        }
        summary.batches += 1;
        summary.records += batch.records_count().max(0) as u64;
        summary.bytes += batch.size() as u64;
        summary.first_offset.get_or_insert(batch.base_offset());
        summary.last_offset = Some(batch.last_offset());
        seen.push(Seen {
            position: pos.0 as u64,
            base: batch.base_offset(),
            last: batch.last_offset(),
            max_timestamp: batch.max_timestamp(),
            abort_marker: batch.control_type() == Some(ControlType::Abort),
        });
        Ok(ControlFlow::Continue(()))
    })?;
    if let Some(f) = failure {
        return Err(f);
    }
    match end {
        ScanEnd::Clean | ScanEnd::Stopped { .. } => Ok(seen),
        ScanEnd::Partial { at } => Err(problem(
            &path,
            None,
            Some(at),
            format!("{} invalid bytes at the end (partial batch)", size - at),
        )),
        ScanEnd::Malformed { at, error } => Err(problem(&path, None, Some(at), error.to_string())),
    }
}

/// Drops a zero-filled tail (a running broker's preallocated index), as DumpLogSegments does.
fn strip_zero_tail(bytes: &[u8], entry: usize, summary: &mut Summary) -> usize {
    let whole = bytes.len() - bytes.len() % entry;
    let mut n = whole / entry;
    while n > 0 && bytes[(n - 1) * entry..n * entry].iter().all(|&b| b == 0) {
        n -= 1;
    }
    if n * entry != whole {
        summary.preallocated_tails += 1;
    }
    if bytes.len() % entry != 0 {
        // Keep the bad length visible to the parser.
        return bytes.len();
    }
    n * entry
}

fn read_index(path: &Path) -> Result<Vec<u8>, ToolError> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => problem(path, None, None, "missing"),
        _ => ToolError::Log(LogError::io(path, e)),
    })
}

fn verify_offset_index(
    dir: &Path,
    base: Offset,
    seen: &[Seen],
    summary: &mut Summary,
) -> Result<(), ToolError> {
    let path = segment_file(dir, base, INDEX_SUFFIX);
    let bytes = read_index(&path)?;
    let valid = strip_zero_tail(&bytes, OFFSET_INDEX_ENTRY_BYTES as usize, summary);
    let entries: Vec<OffsetIndexEntry> = offset_index::parse(&path, &bytes[..valid])
        .map_err(|e| problem(&path, None, None, e.to_string()))?;
    for (i, e) in entries.iter().enumerate() {
        let offset = Offset(base.0 + e.relative_offset.0 as i64);
        let position = e.position.0 as u64;
        let at = Some(position);
        match seen.binary_search_by_key(&position, |s| s.position) {
            Ok(j) if seen[j].last == offset => {}
            Ok(j) => {
                return Err(problem(
                    &path,
                    Some(offset),
                    at,
                    format!(
                        "entry {i}: index offset {offset}, log offset {}",
                        seen[j].last
                    ),
                ))
            }
            Err(_) => {
                return Err(problem(
                    &path,
                    Some(offset),
                    at,
                    format!("entry {i}: no batch starts at this position"),
                ))
            }
        }
    }
    summary.index_entries += entries.len() as u64;
    Ok(())
}

fn verify_time_index(
    dir: &Path,
    base: Offset,
    seen: &[Seen],
    summary: &mut Summary,
) -> Result<(), ToolError> {
    let path = segment_file(dir, base, TIME_INDEX_SUFFIX);
    let bytes = read_index(&path)?;
    let valid = strip_zero_tail(&bytes, TIME_INDEX_ENTRY_BYTES as usize, summary);
    let entries: Vec<TimeIndexEntry> = time_index::parse(&path, &bytes[..valid])
        .map_err(|e| problem(&path, None, None, e.to_string()))?;
    for (i, e) in entries.iter().enumerate() {
        let offset = Offset(base.0 + e.relative_offset.0 as i64);
        let j = seen.partition_point(|s| s.last < offset);
        let Some(batch) = seen.get(j).filter(|s| s.last == offset) else {
            return Err(problem(
                &path,
                Some(offset),
                None,
                format!("entry {i}: indexed offset not found in the log"),
            ));
        };
        if batch.max_timestamp != e.timestamp {
            return Err(problem(
                &path,
                Some(offset),
                Some(batch.position),
                format!(
                    "entry {i}: timestamp mismatch: index {}, batch max timestamp {}",
                    e.timestamp.0, batch.max_timestamp.0
                ),
            ));
        }
    }
    summary.time_index_entries += entries.len() as u64;
    Ok(())
}

fn verify_txn_index(
    dir: &Path,
    base: Offset,
    seen: &[Seen],
    summary: &mut Summary,
) -> Result<(), ToolError> {
    let path = segment_file(dir, base, TXN_INDEX_SUFFIX);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ToolError::Log(LogError::io(&path, e))),
    };
    let entry = TXN_INDEX_ENTRY_BYTES as usize;
    if bytes.len() % entry != 0 {
        return Err(problem(
            &path,
            None,
            None,
            format!("length {} is not a multiple of {entry}", bytes.len()),
        ));
    }
    let mut previous: Option<Offset> = None;
    for (i, chunk) in bytes.chunks_exact(entry).enumerate() {
        let txn = AbortedTxn::decode(chunk.try_into().expect("exact chunk"))
            .map_err(|why| problem(&path, None, None, format!("entry {i}: {why}")))?;
        let at = Some(txn.last_offset);
        if txn.last_offset < base || txn.first_offset > txn.last_offset {
            return Err(problem(
                &path,
                at,
                None,
                format!("entry {i}: offsets out of range: {txn:?}"),
            ));
        }
        if previous.is_some_and(|p| txn.last_offset <= p) {
            return Err(problem(
                &path,
                at,
                None,
                format!("entry {i}: markers out of order"),
            ));
        }
        previous = Some(txn.last_offset);
        let j = seen.partition_point(|s| s.last < txn.last_offset);
        if !seen
            .get(j)
            .is_some_and(|s| s.base == txn.last_offset && s.abort_marker)
        {
            return Err(problem(
                &path,
                at,
                None,
                format!("entry {i}: no ABORT marker at this offset"),
            ));
        }
        summary.aborted_txns += 1;
    }
    Ok(())
}

/// The partition's recovery point as kmirror's (and Kafka's) recovery would take it: its entry
/// in `recovery-point-offset-checkpoint` of the log dir above `dir`, else offset 0 (a missing
/// file or entry means "recover from the start"). A root file that cannot be read (a running
/// broker may be rewriting it) also gives 0: that only widens which epochs may be missing, and
/// the partition directory, not the log dir's root, is what is judged here.
fn recovery_point(dir: &Path) -> Offset {
    let tp = dir
        .file_name()
        .and_then(|n| crate::log::log_dir::parse_partition_dir(&n.to_string_lossy()));
    let (Some(tp), Some(root)) = (tp, dir.parent()) else {
        return Offset::ZERO;
    };
    OffsetCheckpointFile::read(&root.join(OffsetCheckpointFile::RECOVERY_POINT))
        .ok()
        .and_then(|points| points.get(&tp).copied())
        .unwrap_or(Offset::ZERO)
}

/// The checkpoint must list exactly the epochs the batches start (epoch ≥ 0 and higher than the
/// last), except that retention may have moved the first entry's start up to the log start, and
/// that it may end with one newer epoch starting at the log end: a leader records its epoch when
/// it is elected (kmirror when it is promoted), before it has written a batch. Epochs that start
/// at or above the partition's recovery point may be missing from its end: kmirror writes the
/// checkpoint when it flushes, before the recovery point moves, and recovery rebuilds epochs
/// above the recovery point from the batches (so a live or killed log is consistent). What is
/// listed must still match the batches.
fn verify_epochs(
    dir: &Path,
    computed: &[(LeaderEpoch, Offset)],
    log_end: Offset,
    durable_through: Offset,
    summary: &mut Summary,
) -> Result<(), ToolError> {
    let path = dir.join(crate::log::epoch_cache::FILE_NAME);
    // Epochs from `from` on all start at or above the recovery point: not yet checkpointed.
    let unflushed_from = |from: usize| computed[from..].iter().all(|(_, o)| *o >= durable_through);
    if !path.exists() {
        if let Some((e, o)) = computed.first() {
            if unflushed_from(0) {
                summary.epochs_above_recovery_point = computed.len();
                return Ok(());
            }
            return Err(problem(
                &path,
                Some(*o),
                None,
                format!("missing, but epoch {e} starts at {o}"),
            ));
        }
        return Ok(());
    }
    let cache =
        LeaderEpochCache::load(dir).map_err(|e| problem(&path, None, None, e.to_string()))?;
    let stored: Vec<(LeaderEpoch, Offset)> = cache
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect();
    let describe = |v: &[(LeaderEpoch, Offset)]| {
        v.iter()
            .map(|(e, o)| format!("{e}@{o}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mismatch = || {
        problem(
            &path,
            None,
            None,
            format!(
                "checkpoint [{}] does not match the batches [{}]",
                describe(&stored),
                describe(computed)
            ),
        )
    };
    let elected_unwritten = stored.len() == computed.len() + 1
        && stored.last().is_some_and(|(e, o)| {
            *o == log_end && computed.last().is_none_or(|(last, _)| e > last)
        });
    let checkpoint_behind = stored.len() < computed.len() && unflushed_from(stored.len());
    if stored.len() != computed.len() && !elected_unwritten && !checkpoint_behind {
        return Err(mismatch());
    }
    if checkpoint_behind {
        summary.epochs_above_recovery_point = computed.len() - stored.len();
    }
    for (i, (s, c)) in stored.iter().zip(computed).enumerate() {
        let start_ok = if i == 0 { s.1 <= c.1 } else { s.1 == c.1 };
        if s.0 != c.0 || !start_ok {
            return Err(problem(
                &path,
                Some(c.1),
                None,
                format!(
                    "entry {i} is {}@{}, the batches start epoch {} at {}",
                    s.0, s.1, c.0, c.1
                ),
            ));
        }
    }
    summary.epochs = stored.len();
    Ok(())
}

/// One line per batch of every segment, in the spirit of DumpLogSegments' batch lines.
pub fn dump(dir: &Path, out: &mut impl Write) -> Result<(), ToolError> {
    for base in segment_bases(dir)? {
        let path = segment_file(dir, base, LOG_SUFFIX);
        writeln!(out, "Dumping {}", path.display())?;
        let file = std::fs::File::open(&path).map_err(|e| LogError::io(&path, e))?;
        let size = file.metadata().map_err(|e| LogError::io(&path, e))?.len();
        let mut write_error: Option<std::io::Error> = None;
        let end = for_each_batch(&file, &path, 0, size, |pos, batch| {
            if let Err(e) = writeln!(out, "{}", batch_line(pos.0 as u64, &batch)) {
                write_error = Some(e);
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if let Some(e) = write_error {
            return Err(e.into());
        }
        match end {
            ScanEnd::Clean | ScanEnd::Stopped { .. } => {}
            ScanEnd::Partial { at } => writeln!(
                out,
                "Found {} invalid bytes at the end of {}",
                size - at,
                path.display()
            )?,
            ScanEnd::Malformed { at, error } => {
                writeln!(out, "Unreadable batch at position {at}: {error}")?
            }
        }
    }
    Ok(())
}

fn batch_line(position: u64, b: &Batch<'_>) -> String {
    let valid = b.validate();
    let mut line = format!(
        "baseOffset: {} lastOffset: {} count: {} partitionLeaderEpoch: {} magic: {} compresscodec: {} \
         producerId: {} producerEpoch: {} baseSequence: {} isTransactional: {} isControl: {} \
         position: {position} maxTimestamp: {} size: {} crc: {} isvalid: {}",
        b.base_offset(),
        b.last_offset(),
        b.records_count(),
        b.partition_leader_epoch(),
        b.magic(),
        b.codec().name(),
        b.producer_id().0,
        b.producer_epoch(),
        b.base_sequence(),
        b.is_transactional(),
        b.is_control(),
        b.max_timestamp().0,
        b.size(),
        b.stored_crc(),
        valid.is_ok(),
    );
    match b.control_type() {
        Some(ControlType::Abort) => line.push_str(" endTxnMarker: ABORT"),
        Some(ControlType::Commit) => line.push_str(" endTxnMarker: COMMIT"),
        Some(ControlType::Other(t)) => line.push_str(&format!(" controlType: {t}")),
        None => {}
    }
    if let Some(ce) = b.coordinator_epoch() {
        line.push_str(&format!(" coordinatorEpoch: {ce}"));
    }
    if let Err(e) = valid {
        line.push_str(&format!(" error: {e}"));
    }
    line
}
