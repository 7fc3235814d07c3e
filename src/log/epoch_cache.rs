//! The leader-epoch cache of one partition: which leader epoch began at which offset, persisted
//! as `leader-epoch-checkpoint` (version 0, lines `<epoch> <startOffset>`).
//!
//! The mirror answers OffsetForLeaderEpoch and detects divergence from it (kafka-formats.md §6.7),
//! and a broker that adopts the directory trusts it, so every operation follows Kafka's
//! `LeaderEpochFileCache` exactly: the same assign/conflict rule, the same truncations, the same
//! `endOffsetFor` answers. The differential test in tests/log_formats_kafka.rs replays random
//! operation sequences through Kafka's own class and compares.

use std::path::{Path, PathBuf};

use crate::ids::{LeaderEpoch, Offset};
use crate::log::checkpoint::{read_lines, split_fields, write_lines_with};
use crate::log::io::{LogIo, StdIo};
use crate::log::LogError;
use crate::wire::batch::Batch;

pub const FILE_NAME: &str = "leader-epoch-checkpoint";
const VERSION: i32 = 0;

/// One entry: `epoch` began with the batch at `start_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: LeaderEpoch,
    pub start_offset: Offset,
}

#[derive(Debug)]
pub struct LeaderEpochCache {
    path: PathBuf,
    /// Sorted by epoch; start offsets non-decreasing (kept so by `assign`).
    entries: Vec<EpochEntry>,
    /// What the file holds (as last loaded or flushed). Dirty means `entries` differ from it,
    /// so a change undone before the flush writes nothing: recovery truncates the epochs of
    /// the region it re-reads and rebuilds the same entries from the batches, and rewriting an
    /// unchanged checkpoint (tmp, fsync, rename) for each of 16,384 partitions was most of a
    /// restart after kill -9.
    flushed: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    /// Load `<partition_dir>/leader-epoch-checkpoint`; an absent file is an empty cache.
    pub fn load(partition_dir: &Path) -> Result<LeaderEpochCache, LogError> {
        let path = partition_dir.join(FILE_NAME);
        let mut cache = LeaderEpochCache {
            path,
            entries: Vec::new(),
            flushed: Vec::new(),
        };
        let path = cache.path.clone();
        if let Some(lines) = read_lines(&path, VERSION)? {
            for line in lines {
                let bad = |why: &str| LogError::corrupt(&path, format!("{why}: {line:?}"));
                let [epoch, start] = split_fields(&line)[..] else {
                    return Err(bad("malformed entry"));
                };
                let epoch: i32 = epoch.parse().map_err(|_| bad("bad epoch"))?;
                let start: i64 = start.parse().map_err(|_| bad("bad start offset"))?;
                if epoch < 0 || start < 0 {
                    return Err(bad("negative epoch or offset"));
                }
                // Kafka loads by assigning each entry in turn, so a non-monotonic file is
                // repaired by the conflict rule rather than rejected; do the same.
                cache.assign(LeaderEpoch(epoch), Offset(start));
            }
        }
        cache.flushed = cache.entries.clone();
        Ok(cache)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the in-memory state differs from what was last loaded or flushed.
    pub fn is_dirty(&self) -> bool {
        self.entries != self.flushed
    }

    pub fn latest(&self) -> Option<(LeaderEpoch, Offset)> {
        self.entries.last().map(|e| (e.epoch, e.start_offset))
    }

    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.entries.last().map(|e| e.epoch)
    }

    /// Record that `epoch` starts at `start`, as Kafka does for every appended v2 batch.
    ///
    /// Nothing changes when `epoch` is the latest epoch and `start` is not below its start (the
    /// common case: another batch of the current epoch). Otherwise, like Kafka, every entry from
    /// the end whose epoch is ≥ `epoch` or whose start is ≥ `start` is removed as conflicting and
    /// the new entry is added. Negative epochs or offsets (no epoch, legacy data) are ignored;
    /// Kafka rejects them, and its callers never pass them. Returns whether anything changed.
    pub fn assign(&mut self, epoch: LeaderEpoch, start: Offset) -> bool {
        if epoch.0 < 0 || start.0 < 0 {
            return false;
        }
        if let Some(last) = self.entries.last() {
            if last.epoch == epoch && start >= last.start_offset {
                return false;
            }
        }
        while let Some(last) = self.entries.last() {
            if last.epoch >= epoch || last.start_offset >= start {
                self.entries.pop();
            } else {
                break;
            }
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset: start,
        });
        true
    }

    /// Kafka's `endOffsetFor`: for a requested epoch, the largest known epoch ≤ it and the start
    /// offset of the next higher epoch, or `log_end` when the requested epoch is the latest.
    /// A requested epoch below every known epoch gives (requested, start of the first epoch).
    /// (-1, -1) when the epoch is undefined (-1) or no epoch above it is known.
    pub fn end_offset_for(&self, requested: LeaderEpoch, log_end: Offset) -> (LeaderEpoch, Offset) {
        end_offset_for(&self.entries, requested, log_end)
    }

    /// The epoch of the entry covering `offset`, if any.
    pub fn epoch_for_offset(&self, offset: Offset) -> Option<LeaderEpoch> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.start_offset <= offset)
            .map(|e| e.epoch)
    }

    /// The log was truncated to `end_offset` (offsets ≥ it are gone): drop the epochs that start
    /// there or later.
    pub fn truncate_from_end(&mut self, end_offset: Offset) {
        let Some(last) = self.entries.last() else {
            return;
        };
        if end_offset.0 < 0 || last.start_offset < end_offset {
            return;
        }
        self.entries.retain(|e| e.start_offset < end_offset);
    }

    /// Opening a log that ends at `log_end`: drop the epochs that start beyond it (their
    /// batches are gone) but keep one that starts exactly there. Such an entry has no batch
    /// yet: it is the epoch a promotion (failover) assigned before anything was produced.
    /// Kafka's loader drops it too (`truncateFromEnd(nextOffset)`) and relies on its controller
    /// to announce the epoch again; kmirror is its own controller, so this checkpoint is the
    /// only record of the epoch and stays authoritative for it.
    pub fn truncate_past_end(&mut self, log_end: Offset) {
        self.truncate_from_end(Offset(log_end.0.saturating_add(1)));
    }

    /// The log start moved to `start_offset`: drop the epochs that begin at or before it, keeping
    /// the last of them (it covers the new start) moved to begin at `start_offset`.
    pub fn truncate_from_start(&mut self, start_offset: Offset) {
        let removed = self
            .entries
            .iter()
            .take_while(|e| e.start_offset <= start_offset)
            .count();
        if removed == 0 {
            return;
        }
        let covering = self.entries[removed - 1].epoch;
        self.entries.drain(..removed);
        self.entries.insert(
            0,
            EpochEntry {
                epoch: covering,
                start_offset,
            },
        );
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Persist the entries atomically (tmp, fsync, rename, fsync dir).
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.flush_with(&mut StdIo)
    }

    /// `flush` with the file's write and sync through `io` (the log's own I/O engine). A
    /// failure leaves the cache dirty, so the next flush writes it again.
    pub fn flush_with(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        let lines: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{} {}", e.epoch.0, e.start_offset.0))
            .collect();
        write_lines_with(io, &self.path, VERSION, &lines)?;
        self.flushed.clone_from(&self.entries);
        Ok(())
    }

    /// Flush only when something changed since the last load or flush.
    pub fn flush_if_dirty(&mut self) -> Result<(), LogError> {
        self.flush_if_dirty_with(&mut StdIo)
    }

    /// `flush_if_dirty` through `io`.
    pub fn flush_if_dirty_with(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        if self.is_dirty() {
            self.flush_with(io)?;
        }
        Ok(())
    }
}

/// `LeaderEpochCache::end_offset_for` over any sorted list of entries (the published read
/// views carry a copy of the entries).
pub fn end_offset_for(
    entries: &[EpochEntry],
    requested: LeaderEpoch,
    log_end: Offset,
) -> (LeaderEpoch, Offset) {
    const UNDEFINED: (LeaderEpoch, Offset) = (LeaderEpoch(-1), Offset(-1));
    if requested == LeaderEpoch::NONE {
        return UNDEFINED;
    }
    if entries.last().map(|e| e.epoch) == Some(requested) {
        return (requested, log_end);
    }
    let Some(higher) = entries.iter().find(|e| e.epoch > requested) else {
        return UNDEFINED;
    };
    match entries.iter().rev().find(|e| e.epoch <= requested) {
        Some(floor) => (floor.epoch, higher.start_offset),
        None => (requested, higher.start_offset),
    }
}

/// The rule shared by append and recovery: a v2 batch whose epoch is known and higher than the
/// latest starts a new epoch at its base offset. Legacy batches carry no epoch and leave the
/// cache alone (Kafka's leader clears its cache on a legacy append to fall back to
/// high-watermark truncation; a mirror keeps the source's epochs, which remain true for the
/// v2 batches around the legacy ones). Returns whether the cache changed.
pub(crate) fn assign_epoch(epochs: &mut LeaderEpochCache, batch: &Batch<'_>) -> bool {
    if batch.is_legacy() {
        return false;
    }
    let epoch: LeaderEpoch = batch.partition_leader_epoch();
    if !epoch.is_known() || epochs.latest_epoch().is_some_and(|latest| epoch <= latest) {
        return false;
    }
    epochs.assign(epoch, batch.base_offset())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cache() -> (tempfile::TempDir, LeaderEpochCache) {
        let dir = tempfile::tempdir().unwrap();
        let c = LeaderEpochCache::load(dir.path()).unwrap();
        (dir, c)
    }

    fn pairs(c: &LeaderEpochCache) -> Vec<(i32, i64)> {
        c.entries()
            .iter()
            .map(|e| (e.epoch.0, e.start_offset.0))
            .collect()
    }

    #[test]
    fn assign_follows_kafka_rules() {
        let (_d, mut c) = cache();
        assert!(!c.assign(LeaderEpoch(-1), Offset(0)));
        assert!(c.assign(LeaderEpoch(0), Offset(0)));
        assert!(
            !c.assign(LeaderEpoch(0), Offset(5)),
            "same epoch, later batch"
        );
        assert!(c.assign(LeaderEpoch(3), Offset(10)));
        assert!(c.assign(LeaderEpoch(5), Offset(20)));
        assert_eq!(pairs(&c), vec![(0, 0), (3, 10), (5, 20)]);
        // Same epoch at a lower offset replaces the entry.
        assert!(c.assign(LeaderEpoch(5), Offset(15)));
        assert_eq!(pairs(&c), vec![(0, 0), (3, 10), (5, 15)]);
        // A higher epoch whose start is below existing starts evicts the conflicting entries.
        assert!(c.assign(LeaderEpoch(7), Offset(10)));
        assert_eq!(pairs(&c), vec![(0, 0), (7, 10)]);
        // A lower epoch evicts every entry with epoch >= it.
        assert!(c.assign(LeaderEpoch(2), Offset(30)));
        assert_eq!(pairs(&c), vec![(0, 0), (2, 30)]);
    }

    #[test]
    fn end_offset_for_matches_kafka_cases() {
        let (_d, mut c) = cache();
        assert_eq!(
            c.end_offset_for(LeaderEpoch(0), Offset(9)),
            (LeaderEpoch(-1), Offset(-1))
        );
        c.assign(LeaderEpoch(2), Offset(5));
        c.assign(LeaderEpoch(4), Offset(20));
        c.assign(LeaderEpoch(6), Offset(40));
        let eo = |e| c.end_offset_for(LeaderEpoch(e), Offset(100));
        assert_eq!(eo(-1), (LeaderEpoch(-1), Offset(-1)));
        assert_eq!(eo(6), (LeaderEpoch(6), Offset(100)));
        assert_eq!(eo(7), (LeaderEpoch(-1), Offset(-1)));
        assert_eq!(eo(5), (LeaderEpoch(4), Offset(40)));
        assert_eq!(eo(4), (LeaderEpoch(4), Offset(40)));
        assert_eq!(eo(3), (LeaderEpoch(2), Offset(20)));
        assert_eq!(eo(1), (LeaderEpoch(1), Offset(5)));
    }

    #[test]
    fn truncations() {
        let (_d, mut c) = cache();
        c.assign(LeaderEpoch(0), Offset(0));
        c.assign(LeaderEpoch(1), Offset(10));
        c.assign(LeaderEpoch(2), Offset(20));
        c.truncate_from_end(Offset(21));
        assert_eq!(pairs(&c), vec![(0, 0), (1, 10), (2, 20)]);
        c.truncate_from_end(Offset(20));
        assert_eq!(pairs(&c), vec![(0, 0), (1, 10)]);
        c.truncate_from_start(Offset(5));
        assert_eq!(pairs(&c), vec![(0, 5), (1, 10)]);
        c.truncate_from_start(Offset(10));
        assert_eq!(pairs(&c), vec![(1, 10)]);
        c.truncate_from_start(Offset(3));
        assert_eq!(pairs(&c), vec![(1, 10)]);
    }

    #[test]
    fn truncate_past_end_keeps_an_epoch_starting_at_the_end() {
        let (_d, mut c) = cache();
        c.assign(LeaderEpoch(0), Offset(0));
        c.assign(LeaderEpoch(4), Offset(10));
        c.truncate_past_end(Offset(10));
        assert_eq!(pairs(&c), vec![(0, 0), (4, 10)]);
        c.truncate_past_end(Offset(9));
        assert_eq!(pairs(&c), vec![(0, 0)]);
    }

    #[test]
    fn a_change_undone_before_the_flush_leaves_the_cache_clean() {
        let (_d, mut c) = cache();
        c.assign(LeaderEpoch(0), Offset(0));
        c.assign(LeaderEpoch(2), Offset(40));
        c.flush().unwrap();
        // What recovery does: drop the epochs of the re-read region, assign them again.
        c.truncate_from_end(Offset(40));
        assert!(c.is_dirty());
        c.assign(LeaderEpoch(2), Offset(40));
        assert!(!c.is_dirty(), "the same entries are not a change");
        c.assign(LeaderEpoch(3), Offset(50));
        assert!(c.is_dirty());
    }

    #[test]
    fn flush_and_reload() {
        let (d, mut c) = cache();
        assert!(!c.is_dirty());
        c.assign(LeaderEpoch(0), Offset(0));
        c.assign(LeaderEpoch(3), Offset(1500));
        assert!(c.is_dirty());
        c.flush().unwrap();
        assert!(!c.is_dirty());
        let text = std::fs::read_to_string(d.path().join(FILE_NAME)).unwrap();
        assert_eq!(text, "0\n2\n0 0\n3 1500\n");
        let again = LeaderEpochCache::load(d.path()).unwrap();
        assert_eq!(again.entries(), c.entries());
    }

    #[test]
    fn load_rejects_bad_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(FILE_NAME);
        for bad in [
            "0\n1\n1\n",
            "0\n1\n-1 0\n",
            "0\n1\n1 -5\n",
            "1\n0\n",
            "0\n1\nx 1\n",
        ] {
            std::fs::write(&p, bad).unwrap();
            assert!(
                matches!(
                    LeaderEpochCache::load(d.path()),
                    Err(LogError::Corrupt { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn load_applies_conflict_rule_like_kafka() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(FILE_NAME), "0\n3\n1 10\n3 20\n2 30\n").unwrap();
        let c = LeaderEpochCache::load(d.path()).unwrap();
        assert_eq!(pairs(&c), vec![(1, 10), (2, 30)]);
    }

    proptest! {
        /// Whatever sequence of operations, the cache stays strictly increasing in epoch and
        /// non-decreasing in start offset, and survives a flush/load round trip.
        #[test]
        fn invariants_and_round_trip(ops in proptest::collection::vec((0u8..3, 0i32..20, 0i64..200), 0..60)) {
            let (d, mut c) = cache();
            for (op, e, o) in ops {
                match op {
                    0 => { c.assign(LeaderEpoch(e), Offset(o)); }
                    1 => c.truncate_from_end(Offset(o)),
                    _ => c.truncate_from_start(Offset(o)),
                }
                for w in c.entries().windows(2) {
                    prop_assert!(w[0].epoch < w[1].epoch);
                    prop_assert!(w[0].start_offset <= w[1].start_offset);
                }
            }
            c.flush().unwrap();
            let reloaded = LeaderEpochCache::load(d.path()).unwrap();
            prop_assert_eq!(reloaded.entries(), c.entries());
        }
    }
}
