//! Loading a partition directory and recovering it after an unclean shutdown
//! (kafka-formats.md §4).
//!
//! Recovery revalidates every batch from the segment holding the recovery point to the end,
//! cuts the log at the first batch that is partial or fails its CRC, deletes every later
//! segment, and rebuilds indexes and the epoch cache from the surviving batches. Data below the
//! recovery point was fsynced and is trusted; it is never touched, except that a segment whose
//! index files are missing or fail the sanity check gets its indexes rebuilt.

use std::ops::ControlFlow;
use std::path::Path;

use crate::ids::{LeaderEpoch, Offset};
use crate::log::clock::now_ms;
use crate::log::config::LogConfig;
use crate::log::epoch_cache::assign_epoch;
use crate::log::epoch_cache::LeaderEpochCache;
use crate::log::io::LogIo;
use crate::log::producer_state::{
    delete_snapshots_above, list_snapshots, snapshot_path, ProducerStateManager,
};
use crate::log::scan::for_each_batch;
use crate::log::segment::{
    parse_base_offset, Recovered, Segment, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
};
use crate::log::LogError;

/// What the log dir knows about a partition when it opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// The log dir had `.kafka_cleanshutdown`: skip revalidation (indexes are still checked).
    pub clean_shutdown: bool,
    /// From `recovery-point-offset-checkpoint` (0 when the partition is not listed).
    pub recovery_point: Offset,
    /// From `log-start-offset-checkpoint`, when listed.
    pub log_start_offset: Option<Offset>,
}

impl LoadOptions {
    /// No knowledge: recover everything (what tools and a lost checkpoint get).
    pub fn unclean() -> LoadOptions {
        LoadOptions {
            clean_shutdown: false,
            recovery_point: Offset::ZERO,
            log_start_offset: None,
        }
    }
}

/// The outcome of loading.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub segments: Vec<Segment>,
    pub log_start: Offset,
    pub recovery_point: Offset,
    /// Some segment was revalidated batch by batch (unclean stop, or a bad index).
    pub recovered: bool,
    /// What that revalidation re-read.
    pub revalidated: Recovered,
    /// With `SyncAfter::Caller`: the recovery point the log may take once its caller made the
    /// revalidated batches durable (`recovery_point` stays at the old one until then).
    pub awaiting_sync: Option<Offset>,
}

/// Who makes the batches a recovery re-read durable before the recovery point moves over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAfter {
    /// `load` fsyncs the partition's segments itself.
    Load,
    /// The caller does, for many partitions at once (`LogDir`'s open: one `syncfs` instead of
    /// three fdatasyncs per partition, which were most of a 16,384-partition restart).
    Caller,
}

/// Suffixes of files left by interrupted Kafka operations that are safe to drop.
const TRANSIENT_SUFFIXES: [&str; 2] = [".deleted", ".cleaned"];

pub(crate) fn load(
    dir: &Path,
    config: &LogConfig,
    opts: &LoadOptions,
    io: &mut impl LogIo,
    epochs: &mut LeaderEpochCache,
    producers: &mut ProducerStateManager,
    sync: SyncAfter,
) -> Result<Loaded, LogError> {
    // The checkpoint's newest epoch may have no batch yet (see `restore_unbacked_epoch`).
    let checkpointed = epochs.latest();
    let bases = list_segments(dir)?;
    let now = now_ms();
    let mut segments = Vec::with_capacity(bases.len());
    let mut needs = Vec::with_capacity(bases.len());
    for base in bases {
        let (seg, bad_index) = Segment::open(dir, base, config, now)?;
        segments.push(seg);
        needs.push(bad_index);
    }
    // Below the recovery point everything was fsynced: the segment holding it is revalidated
    // only from there (unless its own indexes failed the check), later ones whole.
    let mut resume_at: Option<(usize, Offset)> = None;
    if !opts.clean_shutdown && !segments.is_empty() {
        let from = segments
            .partition_point(|s| s.base_offset() <= opts.recovery_point)
            .saturating_sub(1);
        if !needs[from] && opts.recovery_point > segments[from].base_offset() {
            resume_at = Some((from, opts.recovery_point));
        }
        for flag in &mut needs[from..] {
            *flag = true;
        }
    }
    let mut recovered = false;
    let mut revalidated = Recovered::default();
    if let Some(first) = needs.iter().position(|&n| n) {
        recovered = true;
        // Only when nothing before it needs revalidating (an earlier bad index starts the
        // region at that segment, and every batch from there must be replayed).
        let resume_at = resume_at.filter(|(at, _)| *at == first).map(|(_, o)| o);
        // Epochs and producer state of the region being revalidated are rebuilt from its
        // batches; the producer state first has to reach the region's start.
        let region_start = resume_at.unwrap_or(segments[first].base_offset());
        epochs.truncate_from_end(region_start);
        let trusted = if resume_at.is_some() {
            first + 1
        } else {
            first
        };
        rebuild_producer_state(dir, &segments[..trusted], producers, region_start)?;
        let mut i = first;
        while i < segments.len() {
            let mut on_batch = |batch: &crate::wire::batch::Batch<'_>| {
                assign_epoch(epochs, batch);
                Ok(producers.on_batch(batch))
            };
            let pass = if !needs[i] {
                replay(&segments[i], epochs, producers)?;
                Recovered::default()
            } else if let (true, Some(at)) = (i == first, resume_at) {
                segments[i].recover_from(io, at, &mut on_batch)?
            } else {
                segments[i].recover(io, &mut on_batch)?
            };
            revalidated.bytes += pass.bytes;
            revalidated.batches += pass.batches;
            revalidated.cut += pass.cut;
            if pass.cut > 0 {
                tracing::warn!(
                    dir = %dir.display(),
                    segment = %segments[i].base_offset(),
                    bytes = pass.cut,
                    "recovery truncated the log; deleting later segments"
                );
                for seg in segments.drain(i + 1..) {
                    seg.delete_files()?;
                }
                break;
            }
            if unflushed_roll_hole(dir, opts, &segments, i) {
                // A roll's flush had not finished: the next segment's name reached the disk,
                // the rolled segment's tail did not (it ends on a batch boundary short of the
                // next base, and no producer snapshot at that base vouches for it). Without
                // this cut the log would go on past a hole the source still has the data for.
                let dropped: u64 = segments[i + 1..].iter().map(Segment::size).sum();
                tracing::warn!(
                    dir = %dir.display(),
                    segment = %segments[i].base_offset(),
                    end = %segments[i].next_offset(),
                    next = %segments[i + 1].base_offset(),
                    bytes = dropped,
                    "a rolled segment ends short of the next one and its roll was never flushed; \
                     cutting the log at its end (the rest is fetched again)"
                );
                revalidated.cut += dropped.max(1);
                for seg in segments.drain(i + 1..) {
                    seg.delete_files()?;
                }
                break;
            }
            i += 1;
        }
    }
    if segments.is_empty() {
        let start = opts.log_start_offset.unwrap_or(Offset::ZERO);
        segments.push(Segment::create(dir, start, config, now)?);
    }
    let first_base = segments[0].base_offset();
    let mut log_start = opts.log_start_offset.unwrap_or(first_base).max(first_base);
    let end = segments.last().expect("non-empty").next_offset();
    if end < log_start {
        // The checkpointed start lies beyond the data: Kafka drops everything and starts there.
        for seg in segments.drain(..) {
            seg.delete_files()?;
        }
        segments.push(Segment::create(dir, log_start, config, now)?);
        epochs.clear();
    }
    let end = segments.last().expect("non-empty").next_offset();
    log_start = log_start.min(end);
    epochs.truncate_past_end(end);
    restore_unbacked_epoch(epochs, checkpointed, end);
    epochs.truncate_from_start(log_start);
    // With `SyncAfter::Caller`, changed epochs are left to the log's first flush, which writes
    // them before its fsyncs move the recovery point: until then the next recovery rebuilds
    // them from the same batches. (An atomic checkpoint write is a tmp file, an fsync and a
    // rename: 16,384 of them were most of a restart after kill -9.)
    let epochs_deferred = sync == SyncAfter::Caller && epochs.is_dirty();
    if !epochs_deferred {
        epochs.flush_if_dirty_with(io)?;
    }
    // Snapshots past the end describe data that is gone.
    delete_snapshots_above(dir, end)?;
    if !recovered || producers.map_end_offset() != end {
        rebuild_producer_state(dir, &segments, producers, end)?;
    }
    // Batches re-read (or a tail cut) may exist only in the page cache of a crashed run: fsync
    // them before the recovery point moves over them. A revalidation that found nothing past
    // the recovery point has nothing to make durable (most partitions after a checkpoint).
    let mut awaiting_sync = None;
    let recovery_point = if recovered && (revalidated.batches > 0 || revalidated.cut > 0) {
        match sync {
            SyncAfter::Load => {
                for seg in &mut segments {
                    seg.flush(io)?;
                }
                end
            }
            SyncAfter::Caller => {
                // The recovery point may move once the batches are durable, but not past
                // epochs that are not on file yet (the first flush moves it then).
                awaiting_sync = (!epochs_deferred).then_some(end);
                opts.recovery_point.min(end)
            }
        }
    } else if opts.clean_shutdown {
        end
    } else {
        opts.recovery_point.min(end)
    };
    Ok(Loaded {
        segments,
        log_start,
        recovery_point,
        recovered,
        revalidated,
        awaiting_sync,
    })
}

/// Whether segment `i` ends short of segment `i + 1`'s base although that segment lies above
/// the recovery point and has no producer snapshot at its base. A roll writes that snapshot
/// only after the flush that made the rolled segment durable (`PartitionLog::finish_flush`),
/// so its absence means the gap may be lost data rather than offsets the source never had.
/// (A real gap, e.g. a compacted source's, is cut too when its roll was never flushed; the
/// fetcher asks the source from the cut again and gets the same batches.)
fn unflushed_roll_hole(dir: &Path, opts: &LoadOptions, segments: &[Segment], i: usize) -> bool {
    let Some(next) = segments.get(i + 1) else {
        return false;
    };
    let base = next.base_offset();
    !opts.clean_shutdown
        && base > opts.recovery_point
        && segments[i].next_offset() < base
        && !snapshot_path(dir, base).exists()
}

/// Puts back the checkpoint's newest epoch when it starts exactly at the recovered log end and
/// is above every epoch the batches gave: the failover fence (`PartitionLog::promote`) of a
/// partition nothing was written to since. Revalidation rebuilds the epochs of the region it
/// rereads from batches only, and there is no batch to rebuild this one from; losing it would
/// make kmirror lead, announce and stamp produced batches at the source's epoch again. An epoch
/// starting beyond the end is not restored: its batches are gone and, for a partition still
/// STOPPING, the next promotion assigns a new one.
fn restore_unbacked_epoch(
    epochs: &mut LeaderEpochCache,
    checkpointed: Option<(LeaderEpoch, Offset)>,
    end: Offset,
) {
    let Some((epoch, start)) = checkpointed else {
        return;
    };
    if start == end && epochs.latest_epoch().is_none_or(|latest| latest < epoch) {
        epochs.assign(epoch, start);
    }
}

/// Feeds a trusted segment's batches to the epoch cache and producer state (it lies between
/// recovered segments).
fn replay(
    seg: &Segment,
    epochs: &mut LeaderEpochCache,
    producers: &mut ProducerStateManager,
) -> Result<(), LogError> {
    for_each_batch(
        &*seg.log_file()?,
        seg.log_path(),
        0,
        seg.size(),
        |_, batch| {
            assign_epoch(epochs, &batch);
            producers.on_batch(&batch);
            Ok(ControlFlow::Continue(()))
        },
    )?;
    Ok(())
}

/// Brings `producers` to the state at `upto` (exclusive): the newest usable snapshot at or
/// below it, then the batches of `segments` from there. A corrupt snapshot is deleted and the
/// next older one tried; with none, the whole log is replayed (never Kafka's "assume an
/// upgrade and skip", which would lose idempotence and open transactions).
pub(crate) fn rebuild_producer_state(
    dir: &Path,
    segments: &[Segment],
    producers: &mut ProducerStateManager,
    upto: Offset,
) -> Result<(), LogError> {
    let from = loop {
        match producers.load_latest_snapshot(dir, upto) {
            Ok(Some(offset)) => break offset,
            Ok(None) => {
                let start = segments.first().map_or(upto, Segment::base_offset);
                producers.reset(start);
                break start;
            }
            Err(e) => {
                let Some(bad) = list_snapshots(dir)?.into_iter().rev().find(|o| *o <= upto) else {
                    return Err(e);
                };
                tracing::warn!(error = %e, "deleting unreadable producer snapshot");
                let path = snapshot_path(dir, bad);
                std::fs::remove_file(&path).map_err(|e| LogError::io(&path, e))?;
            }
        }
    };
    for seg in segments {
        if seg.next_offset() <= from || seg.base_offset() >= upto {
            continue;
        }
        for_each_batch(
            &*seg.log_file()?,
            seg.log_path(),
            0,
            seg.size(),
            |_, batch| {
                if batch.base_offset() >= upto {
                    return Ok(ControlFlow::Break(()));
                }
                if batch.last_offset() >= from {
                    producers.on_batch(&batch);
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
    }
    Ok(())
}

/// Base offsets of the segments in `dir`, sorted. Drops leftovers of interrupted operations and
/// index files without a `.log`. A `.swap` file (an interrupted Kafka compaction) is refused:
/// finishing or undoing it safely needs the log cleaner's rules, which kmirror does not run.
fn list_segments(dir: &Path) -> Result<Vec<Offset>, LogError> {
    let mut logs = Vec::new();
    let mut indexes = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if TRANSIENT_SUFFIXES.iter().any(|s| name.ends_with(s)) {
            std::fs::remove_file(&path).map_err(|e| LogError::io(&path, e))?;
            continue;
        }
        if name.ends_with(".swap") {
            return Err(LogError::corrupt(
                path,
                "interrupted segment swap; cannot recover safely",
            ));
        }
        let Some(base) = parse_base_offset(&name) else {
            continue;
        };
        if name.ends_with(LOG_SUFFIX) {
            logs.push(base);
        } else if [INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX]
            .iter()
            .any(|s| name.ends_with(s))
        {
            indexes.push((base, path));
        }
    }
    logs.sort();
    for (base, path) in indexes {
        if logs.binary_search(&base).is_err() {
            std::fs::remove_file(&path).map_err(|e| LogError::io(&path, e))?;
        }
    }
    Ok(logs)
}
