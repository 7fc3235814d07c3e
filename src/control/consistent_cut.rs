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

/// The quarantine an earlier, interrupted run of the same cut completed (`report.json` is
/// written last, after the segment file's fsync): same label, partition and first offset.
fn earlier_take(
    quarantine: &Quarantine,
    label: &str,
    log: &PartitionLog,
    at: Offset,
) -> Option<QuarantineReport> {
    let path = quarantine
        .root()
        .join(label)
        .join(log.topic_partition().to_string())
        .join("report.json");
    let bytes = std::fs::read(path).ok()?;
    let report: QuarantineReport = serde_json::from_slice(&bytes).ok()?;
    (report.first_offset == at.0).then_some(report)
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
/// Repeating it after a crash cuts nothing more and leaves the first quarantine in place: a
/// crash inside the truncation may leave the log with its later segments deleted but the cut
/// point still present, and copying again then would replace the complete quarantine with
/// the shorter rest, so a complete quarantine of the same cut point is kept as it is.
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
        taken = match earlier_take(quarantine, label, log, at) {
            Some(report) => Some(report),
            None => {
                let reason = format!("consistent cut at source timestamp {} ms", ts.0);
                quarantine.take(label, log, at, &reason)?
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LeaderEpoch, TopicPartition};
    use crate::log::config::LogConfig;
    use crate::log::io::StdIo;
    use crate::wire::batch_builder::BatchBuilder;

    fn batch(base: i64, ts: i64) -> Vec<u8> {
        BatchBuilder::new(Offset(base))
            .leader_epoch(LeaderEpoch(1))
            .value(TimestampMs(ts), &[b'v'; 200])
            .value(TimestampMs(ts), &[b'w'; 200])
            .build()
    }

    /// 20 batches of 2 records, max timestamps 1000, 1010, ..., about 3 batches a segment.
    fn log(dir: &std::path::Path) -> PartitionLog {
        let config = LogConfig {
            segment_bytes: 1500,
            ..LogConfig::default()
        };
        let mut log = PartitionLog::create(dir, TopicPartition::new("c", 0), None, config).unwrap();
        for i in 0..20 {
            log.append(&mut StdIo, &batch(i * 2, 1000 + i * 10))
                .unwrap();
        }
        log
    }

    /// The crash a restart finishes: the quarantine was taken and the truncation had deleted
    /// the segments after the cut point (it deletes from the end) when the process died. The
    /// repeated cut must keep the complete quarantine, not copy the shorter rest over it.
    #[test]
    fn a_cut_interrupted_inside_its_truncation_keeps_the_whole_quarantine() {
        let data = tempfile::tempdir().unwrap();
        let mut log = log(&data.path().join("c-0"));
        assert!(log.segments().len() >= 4, "{}", log.segments().len());
        let q = Quarantine::new(data.path());
        let ts = TimestampMs(1045);
        let at = cut_offset(&log, ts).unwrap().unwrap();
        assert_eq!(at, Offset(10), "the first batch newer than T");
        let first = q.take("cut-m-1", &log, at, "test").unwrap().unwrap();
        assert_eq!((first.first_offset, first.end_offset), (10, 40));
        let next_base = log
            .segments()
            .iter()
            .map(|s| s.base_offset())
            .find(|b| *b > at)
            .unwrap();
        log.truncate_to(&mut StdIo, next_base).unwrap();
        assert!(log.log_end_offset() > at && log.log_end_offset() < Offset(40));

        let report = cut(&mut log, &mut StdIo, ts, &q, "cut-m-1").unwrap();
        assert_eq!(report.log_end_after, 10);
        assert_eq!(report.quarantine.as_ref(), Some(&first));
        let held = std::fs::read(&first.segment_file).unwrap();
        assert_eq!(
            held.len() as u64,
            first.bytes,
            "the quarantine kept every batch"
        );
        let again = cut(&mut log, &mut StdIo, ts, &q, "cut-m-1").unwrap();
        assert_eq!((again.cut_offset, again.log_end_after), (None, 10));
    }
}
