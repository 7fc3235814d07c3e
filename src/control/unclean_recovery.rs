//! Unclean-election recovery (issue 14 item 2): with `mirror.support.unclean.leader.election`
//! on, a partition whose source log diverges from ours by leader epoch (the source elected a
//! replica that lacked records we mirrored) converges on the source's log the way a Kafka
//! follower does, instead of going FAILED.
//!
//! The divergence point is Kafka's follower truncation rule (`fetch::divergence`): the source
//! leader's end offset for our last epoch (Fetch v12+ DivergingEpoch, or OffsetForLeaderEpoch
//! on older sources) against our own leader-epoch cache. When our history lacks the leader's
//! epoch the rule is incomplete: we cut at the end of our epoch below it and the next fetch asks
//! again, which may cut further (each round cuts, so this ends).
//!
//! What is cut is never deleted: the batches from the cut point to the log end are copied, byte
//! for byte, to the quarantine (`log::quarantine`, a Kafka segment plus `report.json`) under
//! the label `unclean-<ms>`, fsynced, and only then is the log truncated and flushed. A kill -9
//! before the report is written leaves the log as it was (the partial copy is removed by the
//! next attempt); after it, a complete quarantine and the old, a partly truncated or the
//! truncated log. Repeating the recovery then finds the complete take that already holds the
//! log's batches from the cut point (`Quarantine::covering`) and truncates without taking them
//! again.
//!
//! A source topic deleted and recreated (a new topic id) is not an unclean election: the
//! caller checks the topic id before calling this, and such a partition stays FAILED.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::fetch::divergence::truncation_offset;
use crate::ids::{LeaderEpoch, Offset};
use crate::limits::UNCLEAN_RECOVERIES_SHOWN_MAX;
use crate::log::io::LogIo;
use crate::log::partition_log::PartitionLog;
use crate::log::quarantine::{Quarantine, QuarantineReport};
use crate::log::LogError;
use crate::wire::batch::Batches;

/// Quarantine labels of unclean-election recoveries start with this.
pub const LABEL_PREFIX: &str = "unclean-";

/// One recovery: where the log was cut and what went to the quarantine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UncleanRecovery {
    /// The quarantine label (`unclean-<ms>`) and the segment file holding the cut batches.
    pub label: String,
    pub segment_file: PathBuf,
    /// The source leader's answer: its log for `sourceEpoch` ends at `sourceEndOffset`.
    pub source_epoch: i32,
    pub source_end_offset: i64,
    /// First offset cut (the new log end) and the log end before the cut (exclusive).
    pub first_offset: i64,
    pub end_offset: i64,
    pub batches: usize,
    pub records: i64,
    pub bytes: u64,
    /// The leader epochs of the batches cut, ascending, each once.
    pub epochs: Vec<i32>,
    /// `false` when our history lacked the source's epoch: the next fetch may cut further.
    pub complete: bool,
}

impl UncleanRecovery {
    /// The recovery a quarantine take records (e.g. one found again after a restart).
    pub fn from_report(label: &str, r: &QuarantineReport, complete: bool) -> UncleanRecovery {
        let mut epochs: Vec<i32> = r.batches.iter().map(|b| b.partition_leader_epoch).collect();
        epochs.sort_unstable();
        epochs.dedup();
        let (source_epoch, source_end_offset) = parse_reason(&r.reason).unwrap_or((-1, -1));
        UncleanRecovery {
            label: label.to_owned(),
            segment_file: r.segment_file.clone(),
            source_epoch,
            source_end_offset,
            first_offset: r.first_offset,
            end_offset: r.end_offset,
            batches: r.batch_count,
            records: r.record_count,
            bytes: r.bytes,
            epochs,
            complete,
        }
    }
}

/// A partition's recoveries, for `describe` and `/metrics`: found again in the quarantine at
/// start, so they are counted across restarts (until an operator removes the quarantine).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UncleanRecoveries {
    pub count: u64,
    pub quarantined_records: i64,
    /// The newest recoveries, oldest first (at most `UNCLEAN_RECOVERIES_SHOWN_MAX`).
    pub recent: Vec<UncleanRecovery>,
}

impl UncleanRecoveries {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Counts `r`, unless it is the newest one again (a recovery repeated after a crash
    /// reuses its quarantine take).
    pub fn add(&mut self, r: UncleanRecovery) {
        if self.recent.last().is_some_and(|last| last.label == r.label) {
            return;
        }
        self.count += 1;
        self.quarantined_records += r.records;
        self.recent.push(r);
        if self.recent.len() > UNCLEAN_RECOVERIES_SHOWN_MAX {
            self.recent.remove(0);
        }
    }
}

/// The recoveries of every partition found in `quarantine`.
pub fn load(
    quarantine: &Quarantine,
) -> Result<Vec<(crate::ids::TopicPartition, UncleanRecoveries)>, LogError> {
    let mut out = Vec::new();
    for tp in quarantine.partitions(LABEL_PREFIX)? {
        let mut all = UncleanRecoveries::default();
        for (label, report) in quarantine.reports(LABEL_PREFIX, &tp)? {
            all.add(UncleanRecovery::from_report(&label, &report, true));
        }
        out.push((tp, all));
    }
    Ok(out)
}

fn reason(source: (LeaderEpoch, Offset), log_end: Offset) -> String {
    format!(
        "unclean leader election on the source: its leader's log for epoch {} ends at offset {}; \
         ours ran to {}",
        source.0 .0, source.1 .0, log_end.0
    )
}

/// The (epoch, end offset) a `reason` names.
fn parse_reason(reason: &str) -> Option<(i32, i64)> {
    let rest = reason.split_once("for epoch ")?.1;
    let (epoch, rest) = rest.split_once(" ends at offset ")?;
    let end = rest.split(';').next()?;
    Some((epoch.parse().ok()?, end.parse().ok()?))
}

/// The base offset of the batch holding `offset` (a cut never splits a batch).
fn batch_base(log: &PartitionLog, offset: Offset) -> Result<Offset, LogError> {
    let buf = log.read_bytes(offset, 1)?;
    match Batches::new(&buf).next() {
        Some(Ok((_, b))) => Ok(b.base_offset().min(offset)),
        Some(Err(e)) => Err(LogError::corrupt(log.dir(), e.to_string())),
        None => Ok(offset),
    }
}

/// Cuts `log` where it diverges from the source leader's answer `source` (its epoch and its
/// end offset for it): the cut batches to `quarantine`, then the truncation, flushed. `None`
/// when the answer shows no divergence (nothing is changed; the caller fails the partition as
/// without recovery). `now_ms` names a new take.
pub fn recover(
    log: &mut PartitionLog,
    io: &mut impl LogIo,
    quarantine: &Quarantine,
    source: (LeaderEpoch, Offset),
    now_ms: i64,
) -> Result<Option<UncleanRecovery>, LogError> {
    let end = log.log_end_offset();
    let rule = truncation_offset(
        source,
        |e| log.epoch_cache().end_offset_for(e, end),
        end,
        end,
    );
    if !rule.diverges(end) {
        return Ok(None);
    }
    let cut = batch_base(log, rule.offset.max(log.log_start_offset()))?;
    let (label, report) = match quarantine.covering(LABEL_PREFIX, log, cut)? {
        Some(found) => found,
        None => {
            let tp = log.topic_partition().clone();
            quarantine.remove_incomplete(LABEL_PREFIX, &tp)?;
            // Two recoveries of one partition within a millisecond get distinct labels.
            let mut at = now_ms;
            while quarantine
                .root()
                .join(label_at(at))
                .join(tp.to_string())
                .exists()
            {
                at += 1;
            }
            let label = label_at(at);
            let report = quarantine
                .take_with(io, &label, log, cut, &reason(source, end))?
                .expect("the log holds data at the cut point");
            (label, report)
        }
    };
    log.truncate_to(io, cut)?;
    log.flush(io)?;
    Ok(Some(UncleanRecovery::from_report(
        &label,
        &report,
        rule.complete,
    )))
}

fn label_at(ms: i64) -> String {
    format!("{LABEL_PREFIX}{ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_names_the_source_answer() {
        let r = reason((LeaderEpoch(3), Offset(120)), Offset(150));
        assert_eq!(parse_reason(&r), Some((3, 120)));
        assert_eq!(
            parse_reason("consistent cut at source timestamp 5 ms"),
            None
        );
    }
}
