//! `.timeindex`: (max timestamp so far, offset of the batch that carried it) entries
//! (kafka-formats.md §3.3).
//!
//! Exact-size file, entries mirrored in memory, like `OffsetIndex`. The index counts as full one
//! entry before its capacity so that the final entry written when the segment becomes inactive
//! always has room — Kafka's rule, kept so that roll points match the broker's.

use std::path::Path;

use crate::ids::{Offset, RelativeOffset, TimestampMs};
use crate::limits::TIME_INDEX_ENTRY_BYTES;
use crate::log::index_file::{IndexEntry, IndexFile};
use crate::log::index_pending::PendingIndex;
use crate::log::io::LogIo;
use crate::log::offset_index::{absolute, relative};
use crate::log::LogError;

const ENTRY: usize = TIME_INDEX_ENTRY_BYTES as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeIndexEntry {
    pub timestamp: TimestampMs,
    pub relative_offset: RelativeOffset,
}

/// The `.timeindex` of one segment (`index_file` holds the file, the entries and their writes).
pub type TimeIndex = IndexFile<TimeIndexEntry, ENTRY>;

impl IndexEntry<ENTRY> for TimeIndexEntry {
    fn relative_offset(&self) -> RelativeOffset {
        self.relative_offset
    }

    fn encode(&self) -> [u8; ENTRY] {
        let mut buf = [0u8; ENTRY];
        buf[..8].copy_from_slice(&self.timestamp.0.to_be_bytes());
        buf[8..].copy_from_slice(&self.relative_offset.0.to_be_bytes());
        buf
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<Self>, LogError> {
        parse(path, bytes)
    }
}

impl TimeIndex {
    /// Full at `max_entries − 1`: the last slot is reserved for the final entry.
    pub fn is_full(&self) -> bool {
        self.len() + 1 >= self.max_entries as usize
    }

    /// The last entry as (timestamp, absolute offset); (NONE, base) when empty, as Kafka.
    pub fn last_entry(&self) -> (TimestampMs, Offset) {
        match self.entries().last() {
            Some(e) => (e.timestamp, absolute(self.base, e.relative_offset)),
            None => (TimestampMs::NONE, self.base),
        }
    }

    /// Appends (timestamp, offset) if the timestamp is strictly greater than the last entry's,
    /// and writes it. `force` skips the full check (the final entry of a segment).
    pub fn maybe_append(
        &mut self,
        io: &mut impl LogIo,
        timestamp: TimestampMs,
        offset: Offset,
        force: bool,
    ) -> Result<(), LogError> {
        self.maybe_push(timestamp, offset, force)?;
        self.write_pending(io)
    }

    /// `maybe_append` in memory only; the entry reaches the file with the next `pending_write`
    /// the caller performs (then `pending_written`) or `write_pending`.
    pub fn maybe_push(
        &mut self,
        timestamp: TimestampMs,
        offset: Offset,
        force: bool,
    ) -> Result<(), LogError> {
        assert!(
            force || !self.is_full(),
            "time index appended past its capacity"
        );
        let (last_ts, last_offset) = self.last_entry();
        if !self.is_empty() && (offset < last_offset || timestamp < last_ts) {
            return Err(LogError::corrupt(
                self.path(),
                format!(
                    "entry ({}, {offset}) goes back from ({}, {last_offset})",
                    timestamp.0, last_ts.0
                ),
            ));
        }
        if timestamp <= last_ts {
            return Ok(());
        }
        let rel = relative(self.base, offset).ok_or_else(|| {
            LogError::corrupt(self.path(), format!("offset {offset} out of range"))
        })?;
        self.push_entry(TimeIndexEntry {
            timestamp,
            relative_offset: rel,
        });
        Ok(())
    }

    /// The entry with the largest timestamp ≤ `target`, as (timestamp, offset); (NONE, base)
    /// when there is none.
    pub fn lookup(&self, target: TimestampMs) -> (TimestampMs, Offset) {
        let entries = self.entries();
        let n = entries.partition_point(|e| e.timestamp <= target);
        match n.checked_sub(1) {
            Some(i) => (
                entries[i].timestamp,
                absolute(self.base, entries[i].relative_offset),
            ),
            None => (TimestampMs::NONE, self.base),
        }
    }
}

/// Parses time index bytes; `Corrupt` names the first problem.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<TimeIndexEntry>, LogError> {
    if bytes.len() % ENTRY != 0 {
        return Err(LogError::corrupt(
            path,
            format!("length {} is not a multiple of {ENTRY}", bytes.len()),
        ));
    }
    let mut entries: Vec<TimeIndexEntry> = Vec::with_capacity(bytes.len() / ENTRY);
    for (i, chunk) in bytes.chunks_exact(ENTRY).enumerate() {
        let ts = i64::from_be_bytes(chunk[..8].try_into().expect("8 bytes"));
        let rel = i32::from_be_bytes(chunk[8..].try_into().expect("4 bytes"));
        if rel < 0 {
            return Err(LogError::corrupt(
                path,
                format!("entry {i} has negative offset {rel}"),
            ));
        }
        let entry = TimeIndexEntry {
            timestamp: TimestampMs(ts),
            relative_offset: RelativeOffset(rel as u32),
        };
        if let Some(last) = entries.last() {
            if entry.timestamp <= last.timestamp || entry.relative_offset < last.relative_offset {
                return Err(LogError::corrupt(
                    path,
                    format!("entry {i} ({ts}, {rel}) does not follow the previous one"),
                ));
            }
        }
        entries.push(entry);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::io::StdIo;

    #[test]
    fn appends_only_strictly_greater_timestamps() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.timeindex");
        let mut idx = TimeIndex::create(&path, Offset(10), 8).expect("create");
        // NO_TIMESTAMP never makes an entry.
        idx.maybe_append(&mut StdIo, TimestampMs::NONE, Offset(10), false)
            .expect("append");
        assert!(idx.is_empty());
        idx.maybe_append(&mut StdIo, TimestampMs(500), Offset(12), false)
            .expect("append");
        idx.maybe_append(&mut StdIo, TimestampMs(500), Offset(15), false)
            .expect("append");
        idx.maybe_append(&mut StdIo, TimestampMs(600), Offset(20), false)
            .expect("append");
        assert_eq!(idx.len(), 2);
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(bytes.len(), 24);
        assert_eq!(&bytes[..12], &[0, 0, 0, 0, 0, 0, 0x01, 0xf4, 0, 0, 0, 2]);
        assert_eq!(idx.lookup(TimestampMs(550)), (TimestampMs(500), Offset(12)));
        assert_eq!(
            idx.lookup(TimestampMs(499)),
            (TimestampMs::NONE, Offset(10))
        );
        assert!(idx
            .maybe_append(&mut StdIo, TimestampMs(700), Offset(19), false)
            .is_err());
    }

    #[test]
    fn full_one_entry_early_but_final_entry_fits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.timeindex");
        let mut idx = TimeIndex::create(&path, Offset(0), 3).expect("create");
        idx.maybe_append(&mut StdIo, TimestampMs(1), Offset(1), false)
            .expect("append");
        assert!(!idx.is_full());
        idx.maybe_append(&mut StdIo, TimestampMs(2), Offset(2), false)
            .expect("append");
        assert!(idx.is_full());
        idx.maybe_append(&mut StdIo, TimestampMs(3), Offset(3), true)
            .expect("final entry");
        assert_eq!(TimeIndex::open(&path, Offset(0), 3).expect("open").len(), 3);
    }
}
