//! Progress reports of the shard's partitions (a child of `mirror_shard`): after every append
//! and every watermark change the partition's cell on the `ProgressBoard` is updated, for the
//! control thread's describe. The cell is looked up once, when the partition arrives.

use std::sync::Arc;

use super::{Loc, MirrorShard};
use crate::fetch::fetcher::FetchedRecords;
use crate::ids::{Offset, TopicPartition};
use crate::runtime::progress::PartitionProgress;

impl MirrorShard {
    /// Looks up (once) the progress cell of a partition that just arrived at `at`.
    pub(super) fn track_progress(&mut self, at: Loc, tp: &TopicPartition) {
        let cell = self.progress.cell(tp);
        if let Some(log) = self.log_mut(at) {
            cell.set_log_end(log.log_end_offset().0);
        }
        self.cells.insert(at, cell);
    }

    fn cell(&self, at: Loc) -> Option<&Arc<PartitionProgress>> {
        self.cells.get(&at)
    }

    fn throttled_ms(&self, at: Loc) -> u64 {
        self.sources[at.src].groups[at.group]
            .fetcher
            .throttled_ms_total()
    }

    /// After a successful append of `r` at `at`.
    pub(super) fn report_append(&mut self, at: Loc, r: &FetchedRecords) {
        let end = self.log_mut(at).map(|l| l.log_end_offset());
        let throttled = self.throttled_ms(at);
        if let (Some(cell), Some(end)) = (self.cell(at), end) {
            cell.clear_stalled();
            cell.set_log_end(end.0);
            cell.set_high_watermark(r.high_watermark.0);
            cell.set_newest_timestamp(r.max_timestamp.0);
            cell.set_throttled_ms(throttled);
        }
    }

    /// Offsets the source no longer held when we asked for them (its log start passed our log
    /// end): counted for describe and /metrics.
    pub(super) fn report_skipped(&mut self, at: Loc, skipped: u64) {
        if let Some(m) = self.meter(at) {
            m.records_skipped(skipped);
        }
        if let Some(cell) = self.cell(at) {
            cell.add_skipped(skipped);
        }
    }

    /// Appends are paused (a full disk) and retried: `why` shows in describe until the next
    /// append succeeds.
    pub(super) fn report_stalled(&mut self, at: Loc, why: String) {
        if let Some(cell) = self.cell(at) {
            cell.set_stalled(why);
        }
    }

    pub(super) fn report_high_watermark(&mut self, at: Loc, hw: Offset) {
        let throttled = self.throttled_ms(at);
        if let Some(cell) = self.cell(at) {
            cell.set_high_watermark(hw.0);
            cell.set_throttled_ms(throttled);
        }
    }
}
