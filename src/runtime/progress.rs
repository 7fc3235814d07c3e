//! Per-partition progress the shards publish for the control thread (describe): the local log
//! end, the source's high watermark and the newest record timestamp stored. Plain atomics
//! written by the owning shard after each append and read whenever the control thread likes:
//! no queue to fill and no lock on the data path (the board's lock is taken only when a
//! partition is handed to a shard).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use crate::ids::TopicPartition;

const UNKNOWN: i64 = i64::MIN;

/// One partition's progress.
#[derive(Debug)]
pub struct PartitionProgress {
    log_end: AtomicI64,
    high_watermark: AtomicI64,
    /// Wall-clock ms at which `high_watermark` was last set (the loss report's "seen at").
    high_watermark_at: AtomicI64,
    newest_timestamp: AtomicI64,
    throttled_ms: AtomicI64,
    /// Offsets skipped because the source's log start passed our log end, summed.
    skipped: AtomicI64,
    /// Why appends are paused (a full disk), while they are; `stalled` says whether to look,
    /// so the append path reads one atomic and takes the mutex only around a stall.
    stalled: AtomicBool,
    stall_reason: Mutex<Option<String>>,
}

impl Default for PartitionProgress {
    fn default() -> Self {
        PartitionProgress {
            log_end: AtomicI64::new(UNKNOWN),
            high_watermark: AtomicI64::new(UNKNOWN),
            high_watermark_at: AtomicI64::new(UNKNOWN),
            newest_timestamp: AtomicI64::new(UNKNOWN),
            throttled_ms: AtomicI64::new(UNKNOWN),
            skipped: AtomicI64::new(0),
            stalled: AtomicBool::new(false),
            stall_reason: Mutex::new(None),
        }
    }
}

fn known(v: i64) -> Option<i64> {
    (v != UNKNOWN).then_some(v)
}

/// What one read of a partition's progress saw.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProgressSnapshot {
    pub log_end: Option<i64>,
    pub high_watermark: Option<i64>,
    /// When (wall-clock ms) the source last told this process `high_watermark`.
    pub high_watermark_at_ms: Option<i64>,
    /// Max timestamp of the newest batch stored (ms), when one was stored by this process.
    pub newest_timestamp: Option<i64>,
    /// Throttle time (ms) the source asked for on the connection that fetches this partition,
    /// summed since that connection's fetcher was set up.
    pub throttled_ms: Option<i64>,
    /// Offsets the source no longer held when this process asked for them (gaps left in the
    /// mirrored log because the source's retention passed its end), summed.
    pub skipped_records: i64,
    /// Why appends are paused and retried (a full disk), while they are.
    pub stalled: Option<String>,
}

impl PartitionProgress {
    // Relaxed: each value is a report on its own; describe never needs them consistent with
    // one another to the offset.
    pub fn set_log_end(&self, end: i64) {
        self.log_end.store(end, Ordering::Relaxed);
    }

    pub fn set_high_watermark(&self, hw: i64) {
        self.high_watermark.store(hw, Ordering::Relaxed);
        // A vDSO clock read per response and partition; the loss report at failover needs
        // to say how old the last high watermark kmirror saw is.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.high_watermark_at.store(now, Ordering::Relaxed);
    }

    /// The source's high watermark is unknown again (a fetcher is about to start after a
    /// pause): describe must not compute a lag from one seen before, which the source has
    /// moved past meanwhile; the first fetch response sets it.
    pub fn forget_high_watermark(&self) {
        self.high_watermark.store(UNKNOWN, Ordering::Relaxed);
    }

    pub fn set_newest_timestamp(&self, ts: i64) {
        self.newest_timestamp.store(ts, Ordering::Relaxed);
    }

    pub fn set_throttled_ms(&self, ms: u64) {
        self.throttled_ms
            .store(i64::try_from(ms).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    pub fn add_skipped(&self, offsets: u64) {
        let n = i64::try_from(offsets).unwrap_or(i64::MAX);
        let _ = self
            .skipped
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(n))
            });
    }

    pub fn set_stalled(&self, why: String) {
        *self.stall_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.stalled.store(true, Ordering::Release);
    }

    pub fn clear_stalled(&self) {
        if self.stalled.swap(false, Ordering::AcqRel) {
            *self.stall_reason.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }

    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            log_end: known(self.log_end.load(Ordering::Relaxed)),
            high_watermark: known(self.high_watermark.load(Ordering::Relaxed)),
            high_watermark_at_ms: known(self.high_watermark_at.load(Ordering::Relaxed)),
            newest_timestamp: known(self.newest_timestamp.load(Ordering::Relaxed)),
            throttled_ms: known(self.throttled_ms.load(Ordering::Relaxed)),
            skipped_records: self.skipped.load(Ordering::Relaxed),
            stalled: if self.stalled.load(Ordering::Acquire) {
                self.stall_reason
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            } else {
                None
            },
        }
    }
}

/// Every partition's progress cell, shared by the control thread and the shards.
#[derive(Debug, Clone, Default)]
pub struct ProgressBoard(Arc<Mutex<HashMap<TopicPartition, Arc<PartitionProgress>>>>);

impl ProgressBoard {
    /// The partition's cell, created on first use.
    pub fn cell(&self, tp: &TopicPartition) -> Arc<PartitionProgress> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(map.entry(tp.clone()).or_default())
    }

    pub fn snapshot(&self, tp: &TopicPartition) -> ProgressSnapshot {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(tp).map(|c| c.snapshot()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_set_and_shared_between_holders() {
        let board = ProgressBoard::default();
        let tp = TopicPartition::new("t", 0);
        assert_eq!(board.snapshot(&tp), ProgressSnapshot::default());
        let cell = board.clone().cell(&tp);
        cell.set_log_end(10);
        cell.set_high_watermark(12);
        let s = board.snapshot(&tp);
        assert_eq!(
            (s.log_end, s.high_watermark, s.newest_timestamp),
            (Some(10), Some(12), None)
        );
    }
}
