//! Progress reports of the shard's partitions (a child of `mirror_shard`): after every append
//! and every watermark change the partition's cell on the `ProgressBoard` is updated, for the
//! control thread's describe. The cell is looked up once, when the partition arrives.

use std::sync::Arc;

use super::MirrorShard;
use crate::fetch::fetcher::{FetchedRecords, Slot};
use crate::ids::{Offset, TopicPartition};
use crate::runtime::progress::PartitionProgress;

impl MirrorShard {
    /// Looks up (once) the progress cell of a partition that just arrived on source `i`.
    pub(super) fn track_progress(&mut self, i: usize, slot: Slot, tp: &TopicPartition) {
        let cell = self.progress.cell(tp);
        if let Some(log) = self.log_mut(i, slot) {
            cell.set_log_end(log.log_end_offset().0);
        }
        self.cells.insert((i, slot.0), cell);
    }

    fn cell(&self, i: usize, slot: Slot) -> Option<&Arc<PartitionProgress>> {
        self.cells.get(&(i, slot.0))
    }

    /// After a successful append of `r`.
    pub(super) fn report_append(&mut self, i: usize, r: &FetchedRecords) {
        let end = self.log_mut(i, r.slot).map(|l| l.log_end_offset());
        let throttled = self.sources[i].fetcher.throttled_ms_total();
        if let (Some(cell), Some(end)) = (self.cell(i, r.slot), end) {
            cell.set_log_end(end.0);
            cell.set_high_watermark(r.high_watermark.0);
            cell.set_newest_timestamp(r.max_timestamp.0);
            cell.set_throttled_ms(throttled);
        }
    }

    pub(super) fn report_high_watermark(&mut self, i: usize, slot: Slot, hw: Offset) {
        let throttled = self.sources[i].fetcher.throttled_ms_total();
        if let Some(cell) = self.cell(i, slot) {
            cell.set_high_watermark(hw.0);
            cell.set_throttled_ms(throttled);
        }
    }
}
