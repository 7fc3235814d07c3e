//! A partition's lines in the log dir's checkpoint files (recovery point, log start, high
//! watermark), published by whoever owns the log at the moment (a shard, the leader store, the
//! control thread) into atomics shared with the `LogDir`. The log dir writes every partition's
//! checkpoint from these cells, wherever its log lives, with no lock and no message on the
//! owner's path: the owner does a few relaxed stores when the values change.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::ids::Offset;

const NONE: i64 = -1;

#[derive(Debug)]
pub struct CheckpointCell {
    recovery_point: AtomicI64,
    /// The log start when it lies above the first segment's base (Kafka lists only those).
    log_start: AtomicI64,
    high_watermark: AtomicI64,
}

/// One read of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub recovery_point: Offset,
    pub log_start_above_first_segment: Option<Offset>,
    pub high_watermark: Offset,
}

impl CheckpointCell {
    pub fn new(e: CheckpointEntry) -> CheckpointCell {
        let c = CheckpointCell {
            recovery_point: AtomicI64::new(0),
            log_start: AtomicI64::new(NONE),
            high_watermark: AtomicI64::new(0),
        };
        c.publish(e);
        c
    }

    /// The owner's current values. The recovery point is stored with Release after the fsync
    /// that justified it, so a reader never sees one ahead of the data on disk.
    pub fn publish(&self, e: CheckpointEntry) {
        self.log_start.store(
            e.log_start_above_first_segment.map_or(NONE, |o| o.0),
            Ordering::Relaxed,
        );
        self.high_watermark
            .store(e.high_watermark.0, Ordering::Relaxed);
        self.recovery_point
            .store(e.recovery_point.0, Ordering::Release);
    }

    pub fn read(&self) -> CheckpointEntry {
        let start = self.log_start.load(Ordering::Relaxed);
        CheckpointEntry {
            recovery_point: Offset(self.recovery_point.load(Ordering::Acquire)),
            log_start_above_first_segment: (start != NONE).then_some(Offset(start)),
            high_watermark: Offset(self.high_watermark.load(Ordering::Relaxed)),
        }
    }
}
