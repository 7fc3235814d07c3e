//! What a shard tells the outside world about itself, without locks on its hot path.
//!
//! Each shard owns one `ShardStats`, shared read-only (`Arc`) with the control side. The shard
//! is the only writer of every counter (relaxed atomic stores and adds: a scrape may see one
//! counter a little ahead of another, never a torn value). Latency histograms cannot be atomics,
//! so the shard records into its own `LatencySet` and, once per `LATENCY_INTERVAL_MS`, swaps it
//! for a blank one from a lock-free queue and hands the full one over (`crossbeam` `ArrayQueue`
//! both ways, so after warm-up nothing allocates). The only mutex is the partition registry,
//! touched when a partition is added to or leaves the shard, never per fetch.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use hdrhistogram::Histogram;

use crate::ids::{Offset, ShardId, TimestampMs, TopicPartition};
use crate::limits::{
    LATENCY_EXCHANGE_DEPTH, LATENCY_INTERVAL_MS, LATENCY_MAX_NS, LATENCY_SIGNIFICANT_DIGITS,
};

/// Counters of one partition while a shard mirrors it.
#[derive(Debug)]
pub struct PartitionStats {
    pub tp: TopicPartition,
    log_end: AtomicI64,
    high_watermark: AtomicI64,
    bytes: AtomicU64,
    batches: AtomicU64,
    fetch_errors: AtomicU64,
    throttle_ms: AtomicU64,
    /// Offsets skipped because the source's log start passed our log end.
    records_skipped: AtomicU64,
    /// Largest batch timestamp appended so far (-1: none yet).
    max_timestamp_ms: AtomicI64,
    /// The connection fetching the partition is up and its source broker has answered on it.
    source_answered: AtomicBool,
}

/// A consistent-enough copy of `PartitionStats` for rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSnapshot {
    pub tp: TopicPartition,
    pub log_end: Offset,
    /// `None` until the source reported one.
    pub high_watermark: Option<Offset>,
    pub bytes: u64,
    pub batches: u64,
    pub fetch_errors: u64,
    pub throttle_ms: u64,
    pub records_skipped: u64,
    pub max_timestamp: Option<TimestampMs>,
    pub source_answered: bool,
}

impl PartitionStats {
    pub fn new(tp: TopicPartition, log_end: Offset) -> PartitionStats {
        PartitionStats {
            tp,
            log_end: AtomicI64::new(log_end.0),
            high_watermark: AtomicI64::new(-1),
            bytes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            fetch_errors: AtomicU64::new(0),
            throttle_ms: AtomicU64::new(0),
            records_skipped: AtomicU64::new(0),
            max_timestamp_ms: AtomicI64::new(-1),
            source_answered: AtomicBool::new(false),
        }
    }

    /// After an append of `bytes` in `batches` batches ending the log at `log_end`.
    pub fn appended(&self, bytes: u64, batches: u64, log_end: Offset, max_ts: TimestampMs) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.batches.fetch_add(batches, Ordering::Relaxed);
        self.log_end.store(log_end.0, Ordering::Relaxed);
        self.max_timestamp_ms.fetch_max(max_ts.0, Ordering::Relaxed);
    }

    pub fn log_end_moved(&self, log_end: Offset) {
        self.log_end.store(log_end.0, Ordering::Relaxed);
    }

    pub fn high_watermark(&self, hw: Offset) {
        self.high_watermark.store(hw.0, Ordering::Relaxed);
    }

    /// The connection fetching this partition was throttled for `ms`.
    pub fn throttled(&self, ms: u64) {
        self.throttle_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// The source's log start passed our log end: `offsets` were never mirrored.
    pub fn records_skipped(&self, offsets: u64) {
        self.records_skipped.fetch_add(offsets, Ordering::Relaxed);
    }

    pub fn fetch_error(&self) {
        self.fetch_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The partition's source connection answered since it connected (true), or was lost.
    pub fn source_answered(&self, yes: bool) {
        self.source_answered.store(yes, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> PartitionSnapshot {
        let hw = self.high_watermark.load(Ordering::Relaxed);
        let ts = self.max_timestamp_ms.load(Ordering::Relaxed);
        PartitionSnapshot {
            tp: self.tp.clone(),
            log_end: Offset(self.log_end.load(Ordering::Relaxed)),
            high_watermark: (hw >= 0).then_some(Offset(hw)),
            bytes: self.bytes.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            fetch_errors: self.fetch_errors.load(Ordering::Relaxed),
            throttle_ms: self.throttle_ms.load(Ordering::Relaxed),
            records_skipped: self.records_skipped.load(Ordering::Relaxed),
            max_timestamp: (ts >= 0).then_some(TimestampMs(ts)),
            source_answered: self.source_answered.load(Ordering::Relaxed),
        }
    }
}

/// Which latency a sample belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// Fetch request sent → whole response received.
    FetchRoundTrip,
    /// `PartitionLog::append` of one fetched partition's records (page-cache write).
    Append,
    /// Largest batch timestamp at the source → local append finished (wall clocks of two hosts).
    EndToEnd,
}

impl Latency {
    pub const ALL: [Latency; 3] = [Latency::FetchRoundTrip, Latency::Append, Latency::EndToEnd];

    /// Tag in interval logs and label value in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Latency::FetchRoundTrip => "fetch_round_trip",
            Latency::Append => "append",
            Latency::EndToEnd => "end_to_end",
        }
    }
}

/// One histogram per `Latency`, in nanoseconds.
#[derive(Debug, Clone)]
pub struct LatencySet {
    pub hists: [Histogram<u64>; 3],
    /// Start of the interval these samples cover (wall clock, for interval logs).
    pub start: std::time::SystemTime,
    pub end: std::time::SystemTime,
}

impl LatencySet {
    pub fn new() -> LatencySet {
        let h = || {
            Histogram::new_with_bounds(1, LATENCY_MAX_NS, LATENCY_SIGNIFICANT_DIGITS)
                .expect("bounds from limits.rs are valid")
        };
        let now = std::time::SystemTime::now();
        LatencySet {
            hists: [h(), h(), h()],
            start: now,
            end: now,
        }
    }

    /// Records one sample; values beyond the range are clamped (never an allocation).
    pub fn record(&mut self, which: Latency, d: Duration) {
        let ns = (d.as_nanos() as u64).clamp(1, LATENCY_MAX_NS);
        let _ = self.hists[which as usize].record(ns);
    }

    pub fn get(&self, which: Latency) -> &Histogram<u64> {
        &self.hists[which as usize]
    }

    fn reset(&mut self, start: std::time::SystemTime) {
        for h in &mut self.hists {
            h.reset();
        }
        self.start = start;
        self.end = start;
    }
}

impl Default for LatencySet {
    fn default() -> Self {
        Self::new()
    }
}

/// Everything one shard publishes.
#[derive(Debug)]
pub struct ShardStats {
    pub shard: ShardId,
    bytes_written: AtomicU64,
    appends: AtomicU64,
    append_ns: AtomicU64,
    fetches: AtomicU64,
    fetch_ns: AtomicU64,
    throttle_ms: AtomicU64,
    /// Fetch requests sent, full and incremental (fetch sessions, `fetch::source_load`).
    fetch_full: AtomicU64,
    fetch_incremental: AtomicU64,
    /// Catch-up splits of a connection into two fetch groups, and merges back
    /// (`mirror_shard_split`).
    fetch_group_splits: AtomicU64,
    fetch_group_merges: AtomicU64,
    ring_submitted: AtomicU64,
    ring_completed: AtomicU64,
    /// Log writes done on the shard thread, and those slower than their size explains
    /// (`runtime::inline_writes`), each of which sent writes to the ring for a while.
    log_writes_inline: AtomicU64,
    log_writes_inline_slow: AtomicU64,
    arena_slots_in_use: AtomicU64,
    arena_slots: AtomicU64,
    /// Flushes the shard performed on its ring (rolls, checkpoint rounds): finished, their
    /// time from plan to last sync, and how many are on the ring now.
    flushes: AtomicU64,
    flush_ns: AtomicU64,
    flushes_in_flight: AtomicU64,
    /// Turns of the shard loop and how the thread ended (`runtime::health`).
    heartbeat: super::health::Heartbeat,
    partitions: Mutex<Vec<Arc<PartitionStats>>>,
    filled: ArrayQueue<Box<LatencySet>>,
    blank: ArrayQueue<Box<LatencySet>>,
}

/// A copy of a shard's counters for rendering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardSnapshot {
    pub bytes_written: u64,
    pub appends: u64,
    pub append_ns: u64,
    pub fetches: u64,
    pub fetch_ns: u64,
    pub throttle_ms: u64,
    pub fetch_full: u64,
    pub fetch_incremental: u64,
    pub fetch_group_splits: u64,
    pub fetch_group_merges: u64,
    pub ring_submitted: u64,
    pub ring_completed: u64,
    pub log_writes_inline: u64,
    pub log_writes_inline_slow: u64,
    pub arena_slots_in_use: u64,
    pub arena_slots: u64,
    pub flushes: u64,
    pub flush_ns: u64,
    pub flushes_in_flight: u64,
    /// 1 while the health check finds the shard turning, 0 once it failed.
    pub healthy: u64,
    /// Times the health check found the shard failed.
    pub failures: u64,
}

impl ShardStats {
    pub fn new(shard: ShardId) -> ShardStats {
        let blank = ArrayQueue::new(LATENCY_EXCHANGE_DEPTH);
        for _ in 0..LATENCY_EXCHANGE_DEPTH {
            let _ = blank.push(Box::new(LatencySet::new()));
        }
        ShardStats {
            shard,
            bytes_written: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            append_ns: AtomicU64::new(0),
            fetches: AtomicU64::new(0),
            fetch_ns: AtomicU64::new(0),
            throttle_ms: AtomicU64::new(0),
            fetch_full: AtomicU64::new(0),
            fetch_incremental: AtomicU64::new(0),
            fetch_group_splits: AtomicU64::new(0),
            fetch_group_merges: AtomicU64::new(0),
            ring_submitted: AtomicU64::new(0),
            ring_completed: AtomicU64::new(0),
            log_writes_inline: AtomicU64::new(0),
            log_writes_inline_slow: AtomicU64::new(0),
            arena_slots_in_use: AtomicU64::new(0),
            arena_slots: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            flush_ns: AtomicU64::new(0),
            flushes_in_flight: AtomicU64::new(0),
            heartbeat: Default::default(),
            partitions: Mutex::new(Vec::new()),
            // Room for every set in circulation (the blanks plus the one recording), so the
            // final hand-over at shutdown never finds the queue full.
            filled: ArrayQueue::new(LATENCY_EXCHANGE_DEPTH + 1),
            blank,
        }
    }

    pub fn appended(&self, bytes: u64, took: Duration) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.append_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn fetched(&self, took: Duration) {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.fetch_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Throttle time a source asked for (`throttle_time_ms` of a response).
    pub fn throttled(&self, ms: u64) {
        self.throttle_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Fetch requests sent since the last call: `full` list every partition, `incremental`
    /// only changes within a fetch session.
    pub fn fetch_requests(&self, full: u64, incremental: u64) {
        self.fetch_full.fetch_add(full, Ordering::Relaxed);
        self.fetch_incremental
            .fetch_add(incremental, Ordering::Relaxed);
    }

    /// A connection behind split its partitions into a second fetch group.
    pub fn fetch_group_split(&self) {
        self.fetch_group_splits.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection caught up merged its fetch groups back into one.
    pub fn fetch_group_merge(&self) {
        self.fetch_group_merges.fetch_add(1, Ordering::Relaxed);
    }

    /// A flush's syncs went to the ring.
    pub fn flush_started(&self) {
        self.flushes_in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A flush the ring performed finished (successfully or not) after `took`.
    pub fn flush_finished(&self, took: Duration) {
        self.flushes_in_flight.fetch_sub(1, Ordering::Relaxed);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.flush_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Ring and arena gauges, published by the shard loop once per iteration.
    pub fn publish_runtime(&self, submitted: u64, completed: u64, in_use: u64, slots: u64) {
        self.ring_submitted.store(submitted, Ordering::Relaxed);
        self.ring_completed.store(completed, Ordering::Relaxed);
        self.arena_slots_in_use.store(in_use, Ordering::Relaxed);
        self.arena_slots.store(slots, Ordering::Relaxed);
    }

    /// The ring's inline-write counters, published with `publish_runtime`.
    pub fn publish_inline_writes(&self, inline: u64, slow: u64) {
        self.log_writes_inline.store(inline, Ordering::Relaxed);
        self.log_writes_inline_slow.store(slow, Ordering::Relaxed);
    }

    /// The shard loop's heartbeat (written by the shard) and health verdict (by the control
    /// side's check).
    pub fn heartbeat(&self) -> &super::health::Heartbeat {
        &self.heartbeat
    }

    /// A partition joined the shard. Not on the hot path (mailbox message).
    pub fn register(&self, tp: TopicPartition, log_end: Offset) -> Arc<PartitionStats> {
        let p = Arc::new(PartitionStats::new(tp, log_end));
        self.lock_partitions().push(Arc::clone(&p));
        p
    }

    /// A partition left the shard.
    pub fn deregister(&self, p: &Arc<PartitionStats>) {
        self.lock_partitions().retain(|q| !Arc::ptr_eq(q, p));
    }

    fn lock_partitions(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PartitionStats>>> {
        // Only pushes and retains happen under the lock; a panic there leaves a valid Vec.
        self.partitions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn partitions(&self) -> Vec<PartitionSnapshot> {
        let list: Vec<Arc<PartitionStats>> = self.lock_partitions().clone();
        list.iter().map(|p| p.snapshot()).collect()
    }

    pub fn snapshot(&self) -> ShardSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ShardSnapshot {
            bytes_written: l(&self.bytes_written),
            appends: l(&self.appends),
            append_ns: l(&self.append_ns),
            fetches: l(&self.fetches),
            fetch_ns: l(&self.fetch_ns),
            throttle_ms: l(&self.throttle_ms),
            fetch_full: l(&self.fetch_full),
            fetch_incremental: l(&self.fetch_incremental),
            fetch_group_splits: l(&self.fetch_group_splits),
            fetch_group_merges: l(&self.fetch_group_merges),
            ring_submitted: l(&self.ring_submitted),
            ring_completed: l(&self.ring_completed),
            log_writes_inline: l(&self.log_writes_inline),
            log_writes_inline_slow: l(&self.log_writes_inline_slow),
            arena_slots_in_use: l(&self.arena_slots_in_use),
            arena_slots: l(&self.arena_slots),
            flushes: l(&self.flushes),
            flush_ns: l(&self.flush_ns),
            flushes_in_flight: l(&self.flushes_in_flight),
            healthy: u64::from(self.heartbeat.healthy()),
            failures: self.heartbeat.failures(),
        }
    }

    /// Control side: the next finished latency interval, if any.
    pub fn take_latency(&self) -> Option<Box<LatencySet>> {
        self.filled.pop()
    }

    /// Control side: hands an emptied set back for reuse.
    pub fn recycle_latency(&self, set: Box<LatencySet>) {
        let _ = self.blank.push(set);
    }
}

/// The shard's own latency recorder: records locally, rotates through `ShardStats`.
#[derive(Debug)]
pub struct LatencyRecorder {
    current: Box<LatencySet>,
    since: Instant,
}

impl LatencyRecorder {
    pub fn new() -> LatencyRecorder {
        LatencyRecorder {
            current: Box::new(LatencySet::new()),
            since: Instant::now(),
        }
    }

    pub fn record(&mut self, which: Latency, d: Duration) {
        self.current.record(which, d);
    }

    /// Hands the current interval over when it is due and a blank set is available; when the
    /// control side falls behind the samples simply stay in the current (longer) interval.
    pub fn maybe_rotate(&mut self, stats: &ShardStats, now: Instant) {
        if now.duration_since(self.since) < Duration::from_millis(LATENCY_INTERVAL_MS) {
            return;
        }
        let Some(mut next) = stats.blank.pop() else {
            return;
        };
        let wall = std::time::SystemTime::now();
        next.reset(wall);
        std::mem::swap(&mut next, &mut self.current);
        next.end = wall;
        self.since = now;
        if let Err(back) = stats.filled.push(next) {
            // Cannot happen: the hand-over queue has room for every set; keep the samples anyway.
            let _ = stats.blank.push(back);
        }
    }

    /// Hands the current, partial interval over when the shard stops, so every sample the
    /// shard counted reaches the interval log (the telemetry thread drains after the shards).
    pub fn finish(mut self, stats: &ShardStats) {
        self.current.end = std::time::SystemTime::now();
        let pushed = stats.filled.push(self.current);
        assert!(
            pushed.is_ok(),
            "the hand-over queue holds every set in circulation"
        );
    }
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_hands_over_samples_and_reuses_sets() {
        let stats = ShardStats::new(ShardId(0));
        let mut rec = LatencyRecorder::new();
        rec.record(Latency::Append, Duration::from_micros(50));
        rec.record(Latency::Append, Duration::from_micros(70));
        rec.maybe_rotate(&stats, Instant::now());
        assert!(
            stats.take_latency().is_none(),
            "rotated before the interval ended"
        );
        let later = Instant::now() + Duration::from_millis(LATENCY_INTERVAL_MS);
        rec.maybe_rotate(&stats, later);
        let set = stats.take_latency().expect("one interval handed over");
        assert_eq!(set.get(Latency::Append).len(), 2);
        assert_eq!(set.get(Latency::FetchRoundTrip).len(), 0);
        assert!(set.get(Latency::Append).max() >= 70_000);
        stats.recycle_latency(set);
        // All sets in circulation: the queues never lose or grow one.
        assert_eq!(stats.blank.len(), LATENCY_EXCHANGE_DEPTH);
    }

    #[test]
    fn finish_hands_over_the_partial_interval_even_when_the_control_side_is_behind() {
        let stats = ShardStats::new(ShardId(0));
        let mut rec = LatencyRecorder::new();
        let mut at = Instant::now();
        // The control side takes nothing: every blank set ends up handed over.
        for _ in 0..LATENCY_EXCHANGE_DEPTH {
            rec.record(Latency::Append, Duration::from_micros(10));
            at += Duration::from_millis(LATENCY_INTERVAL_MS);
            rec.maybe_rotate(&stats, at);
        }
        assert!(stats.blank.is_empty());
        rec.record(Latency::Append, Duration::from_micros(10));
        rec.record(Latency::Append, Duration::from_micros(20));
        rec.finish(&stats);
        let mut samples = 0;
        while let Some(set) = stats.take_latency() {
            samples += set.get(Latency::Append).len();
        }
        assert_eq!(samples, LATENCY_EXCHANGE_DEPTH as u64 + 2);
    }

    #[test]
    fn partition_registry_tracks_membership() {
        let stats = ShardStats::new(ShardId(1));
        let p = stats.register(TopicPartition::new("t", 0), Offset(5));
        p.appended(100, 2, Offset(9), TimestampMs(1234));
        p.high_watermark(Offset(12));
        let snap = stats.partitions();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0].log_end, Offset(9));
        assert_eq!(snap[0].high_watermark, Some(Offset(12)));
        assert_eq!(snap[0].bytes, 100);
        assert_eq!(snap[0].max_timestamp, Some(TimestampMs(1234)));
        stats.deregister(&p);
        assert!(stats.partitions().is_empty());
    }
}
