//! A fetch response's appends (a child of `mirror_shard`): every partition that returned
//! records is validated and staged in memory (`PartitionLog::stage_append`), then the writes of
//! all of them — each partition's `.log` bytes as a WRITE_FIXED from the arena slot the response
//! was received into, linked to its `.index` and `.timeindex` entries — go to the ring as one
//! batch: one submission and one wait per response instead of one per write. Each log is then
//! completed with its own writes' outcome (`finish_append`: rollback and offline rules as for a
//! single append), and only then does its read view, fetch position and progress move, so
//! nothing is exposed before it is written.
//!
//! An append that needs a segment roll (or spans segments) is not staged: it is appended on its
//! own at once, as before, which is safe next to the staged ones since they touch other files.
//! Anything in the response other than records and watermarks first writes and completes what
//! is staged, so a partition is never stopped, moved or read while its append is in flight.

use std::io;
use std::time::{Duration, Instant};

use super::{resume_point, Cx, Loc, MirrorShard};
use crate::fetch::fetcher::FetchedRecords;
use crate::ids::Offset;
use crate::log::io::OwnedWriteOp;
use crate::log::partition_log::StagedAppend;
use crate::log::LogError;
use crate::runtime::uring_io::RingIo;

/// The outcome of one partition's append as the shard acts on it: the new log end, or the
/// error with where to fetch from again and whether the log went offline.
type AppendOutcome = Result<Offset, (LogError, (Offset, crate::ids::LeaderEpoch), bool)>;

struct Staged {
    at: Loc,
    append: StagedAppend,
    records: FetchedRecords,
}

/// The appends of the response being handled (reused between responses).
#[derive(Default)]
pub(super) struct StagedAppends {
    staged: Vec<Staged>,
    /// Appends whose writes were submitted (`submit_staged`) and await `complete_staged`.
    in_flight: Vec<Staged>,
    /// Where each in-flight append's ops end in the batch.
    ends: Vec<usize>,
    /// When the first append of the response was staged.
    began: Option<Instant>,
    results: Vec<io::Result<()>>,
}

impl MirrorShard {
    /// Stages `r`'s append, or appends it at once when it cannot be staged.
    pub(super) fn stage_records(&mut self, cx: &mut Cx<'_>, at: Loc, r: FetchedRecords) {
        let began = *self.staged.began.get_or_insert_with(Instant::now);
        if self.log(at).is_some_and(|log| log.has_staged_append()) {
            // A second answer for one partition in one response: complete the first one first.
            self.write_staged(cx);
        }
        let Some(log) = self.log_mut(at) else {
            return;
        };
        let outcome = match log.stage_validated_append(&r.records) {
            Ok(Some(append)) => {
                self.staged.staged.push(Staged {
                    at,
                    append,
                    records: r,
                });
                return;
            }
            Ok(None) => log
                .append(&mut RingIo::new(cx.ring), &r.records)
                .map(|_| log.log_end_offset()),
            Err(e) => Err(e),
        }
        .map_err(|e| (e, resume_point(log), log.offline_reason().is_some()));
        let clocks = (began.elapsed(), wall_ms());
        self.appended(cx, at, &r, outcome, clocks);
    }

    /// Writes every staged append with one ring batch and completes each with its outcome.
    pub(super) fn write_staged(&mut self, cx: &mut Cx<'_>) {
        self.submit_staged(cx);
        self.complete_staged(cx);
    }

    /// Submits the staged appends' writes as one ring batch without waiting for them: the
    /// ring owns the ops (the records' bytes, copies of the index entries, the descriptors)
    /// until `complete_staged`. The logs keep their appends staged meanwhile; the next whole
    /// response, any handler entry other than a RECV or SEND completion, and the end of a
    /// turn in which the writes' CQEs came in complete them before anything else can touch
    /// those logs.
    pub(super) fn submit_staged(&mut self, cx: &mut Cx<'_>) {
        self.complete_staged(cx);
        if self.staged.staged.is_empty() {
            self.staged.began = None;
            return;
        }
        let staged = std::mem::take(&mut self.staged.staged);
        let mut ops: Vec<OwnedWriteOp> = Vec::with_capacity(staged.len() * 3);
        let mut ends = std::mem::take(&mut self.staged.ends);
        ends.clear();
        for s in &staged {
            let log = self
                .log(s.at)
                .expect("a staged log stays until its append completes");
            ops.extend(log.staged_writes_owned(&s.append, &s.records.records));
            ends.push(ops.len());
        }
        cx.ring.write_batch_begin(ops);
        self.staged.in_flight = staged;
        self.staged.ends = ends;
    }

    /// Waits for the submitted writes and completes each append with its outcome: the log's
    /// read view, fetch position and progress move only now.
    pub(super) fn complete_staged(&mut self, cx: &mut Cx<'_>) {
        if self.staged.in_flight.is_empty() {
            return;
        }
        let staged = std::mem::take(&mut self.staged.in_flight);
        let ends = std::mem::take(&mut self.staged.ends);
        let mut results = std::mem::take(&mut self.staged.results);
        cx.ring.write_batch_finish(&mut results);
        let began = self.staged.began.take().unwrap_or_else(Instant::now);
        let clocks = (began.elapsed(), wall_ms());
        let mut start = 0;
        for (s, end) in staged.into_iter().zip(ends) {
            let written = results[start..end]
                .iter_mut()
                .find(|r| r.is_err())
                .map_or(Ok(()), |r| std::mem::replace(r, Ok(())));
            start = end;
            let log = self
                .log_mut(s.at)
                .expect("a staged log stays until its append completes");
            let outcome = log
                .finish_append(
                    &mut RingIo::new(cx.ring),
                    s.append,
                    &s.records.records,
                    written,
                )
                .map(|_| log.log_end_offset())
                .map_err(|e| (e, resume_point(log), log.offline_reason().is_some()));
            self.appended(cx, s.at, &s.records, outcome, clocks);
        }
        self.staged.results = results;
    }

    /// Acts on one partition's append outcome: fetch on, meter and report it, or stop or
    /// pause the partition.
    fn appended(
        &mut self,
        cx: &mut Cx<'_>,
        at: Loc,
        r: &FetchedRecords,
        outcome: AppendOutcome,
        clocks: (Duration, i64),
    ) {
        match outcome {
            Ok(end) => {
                self.group_mut(at).fetcher.appended(r.slot);
                self.meter_append(cx, at, r, clocks, end);
                self.report_append(at, r);
                // The append rolled: its old segment is flushed on the ring meanwhile.
                if self.log(at).is_some_and(|log| log.wants_flush()) {
                    self.start_flush(cx, at);
                }
            }
            Err((e, _, true)) => {
                // Kafka's rule for log dirs: a disk error takes the log offline for good;
                // retrying could only write around lost pages.
                let why = format!(
                    "log offline after a disk error, not retried: {e}; fix the disk and restart \
                     kmirror (the log is recovered when opened)"
                );
                self.stop_partition(cx, at, why, false);
            }
            Err((e, (end, epoch), false)) if e.is_disk_full() => {
                // Rolled back: fetch the same records again once there is space.
                let why = format!(
                    "disk full, appends paused and retried with backoff until space returns: {e}"
                );
                let group = self.group_mut(at);
                let _ = group.fetcher.rewind(r.slot, end, epoch, Instant::now());
                let tp = group.fetcher.topic_partition(r.slot).cloned();
                self.report_stalled(at, why.clone());
                if let Some(tp) = tp {
                    super::notice(cx, format!("{tp}: {why}"));
                }
            }
            Err((e, _, false)) => {
                let why = format!("append failed: {e}");
                self.stop_partition(cx, at, why, true);
            }
        }
    }
}

/// Wall-clock milliseconds (the end-to-end latency's clock: record timestamps).
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
