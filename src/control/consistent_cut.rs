//! The consistent cut at failover (issue 16 item 4): `mirrors stop --cut-at-timestamp T` cuts
//! every partition it fails over to the same source timestamp, so no topic shows records newer
//! than another's after the failover.
//!
//! Per partition the log keeps its prefix up to (not including) the first batch whose max
//! timestamp is above T; that batch and everything after it go to the quarantine
//! (`log::quarantine`, byte for byte), then the log is truncated there, before the promotion
//! (so a transaction whose COMMIT was cut is aborted by it like any other open one). Batches
//! are never split: a batch holding records on both sides of T is cut whole (kmirror keeps the
//! source's batches as they are). A partition with no batch above T is not cut; it may not
//! hold every record up to T either (it may lag), which `holds_a_later_batch: false` says.

use serde::{Deserialize, Serialize};

use crate::ids::{Offset, TimestampMs};
use crate::log::io::LogIo;
use crate::log::partition_log::PartitionLog;
use crate::log::quarantine::{Quarantine, QuarantineReport};
use crate::log::LogError;

/// One partition's cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CutReport {
    pub topic: String,
    pub partition: i32,
    pub cut_at_timestamp: i64,
    /// The new log end (the first offset cut), or `None` when nothing was newer than T.
    pub cut_offset: Option<i64>,
    pub log_end_before: i64,
    pub log_end_after: i64,
    /// Whether the log held a batch newer than T: only then is it known to hold every record
    /// of the source up to T (the source's batches arrive in offset order).
    pub holds_a_later_batch: bool,
    /// What went to the quarantine.
    pub quarantine: Option<QuarantineReport>,
}

/// The base offset of the first batch whose max timestamp is above `ts`.
pub fn cut_offset(log: &PartitionLog, ts: TimestampMs) -> Result<Option<Offset>, LogError> {
    let after = TimestampMs(ts.0.saturating_add(1));
    for seg in log.segments() {
        if seg.max_timestamp().is_none_or(|m| m < after) {
            continue;
        }
        if let Some(h) = seg.find_batch_by_timestamp(after, log.log_start_offset())? {
            return Ok(Some(h.base_offset.max(log.log_start_offset())));
        }
    }
    Ok(None)
}

/// Cuts `log` at `ts`: the batches after it to the quarantine under `label`, then truncation.
/// Repeating it after a crash cuts nothing more (and leaves the first quarantine in place).
pub fn cut(
    log: &mut PartitionLog,
    io: &mut impl LogIo,
    ts: TimestampMs,
    quarantine: &Quarantine,
    label: &str,
) -> Result<CutReport, LogError> {
    let before = log.log_end_offset();
    let at = cut_offset(log, ts)?;
    let mut taken = None;
    if let Some(at) = at {
        let reason = format!("consistent cut at source timestamp {} ms", ts.0);
        taken = quarantine.take(label, log, at, &reason)?;
        log.truncate_to(io, at)?;
        log.flush(io)?;
    }
    let tp = log.topic_partition().clone();
    Ok(CutReport {
        topic: tp.topic,
        partition: tp.partition,
        cut_at_timestamp: ts.0,
        cut_offset: at.map(|o| o.0),
        log_end_before: before.0,
        log_end_after: log.log_end_offset().0,
        holds_a_later_batch: at.is_some(),
        quarantine: taken,
    })
}
