//! `.timeindex`: (max timestamp so far, offset of the batch that carried it) entries
//! (kafka-formats.md §3.3).
//!
//! Exact-size file, entries mirrored in memory, like `OffsetIndex`. The index counts as full one
//! entry before its capacity so that the final entry written when the segment becomes inactive
//! always has room — Kafka's rule, kept so that roll points match the broker's.

use std::path::{Path, PathBuf};

use crate::ids::{Offset, RelativeOffset, TimestampMs};
use crate::limits::TIME_INDEX_ENTRY_BYTES;
use crate::log::index_pending::{PendingEntries, PendingIndex};
use crate::log::io::{LogIo, WriteOp};
use crate::log::lazy_file::{Hold, LazyFile};
use crate::log::offset_index::{absolute, check_absolute, relative};
use crate::log::LogError;

const ENTRY: usize = TIME_INDEX_ENTRY_BYTES as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeIndexEntry {
    pub timestamp: TimestampMs,
    pub relative_offset: RelativeOffset,
}

#[derive(Debug)]
pub struct TimeIndex {
    path: PathBuf,
    /// Opened by the first write or cut (`lazy_file`); lookups use `entries`.
    file: LazyFile,
    /// The file may be longer than `entries` (a failed write left part of an entry).
    maybe_longer: bool,
    base: Offset,
    max_entries: u32,
    entries: Vec<TimeIndexEntry>,
    /// Entries pushed but not yet on the file (see `OffsetIndex`).
    pending: PendingEntries<ENTRY>,
}

impl TimeIndex {
    pub fn create(path: &Path, base: Offset, max_entries: u32) -> Result<TimeIndex, LogError> {
        let file = LazyFile::create(path, Hold::Budgeted).map_err(|e| LogError::io(path, e))?;
        Ok(TimeIndex {
            path: path.to_path_buf(),
            file,
            maybe_longer: false,
            base,
            max_entries,
            entries: Vec::new(),
            pending: PendingEntries::new(0),
        })
    }

    /// Opens an existing time index; a bad length or entries that go backwards are `Corrupt`.
    pub fn open(path: &Path, base: Offset, max_entries: u32) -> Result<TimeIndex, LogError> {
        let bytes = std::fs::read(path).map_err(|e| LogError::io(path, e))?;
        let file = LazyFile::existing(path, Hold::Budgeted);
        let entries = parse(path, &bytes)?;
        if let Some(last) = entries.last() {
            check_absolute(path, base, last.relative_offset)?;
        }
        Ok(TimeIndex {
            path: path.to_path_buf(),
            file,
            maybe_longer: false,
            base,
            max_entries,
            pending: PendingEntries::new(entries.len()),
            entries,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[TimeIndexEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Full at `max_entries − 1`: the last slot is reserved for the final entry.
    pub fn is_full(&self) -> bool {
        self.entries.len() + 1 >= self.max_entries as usize
    }

    /// The last entry as (timestamp, absolute offset); (NONE, base) when empty, as Kafka.
    pub fn last_entry(&self) -> (TimestampMs, Offset) {
        match self.entries.last() {
            Some(e) => (e.timestamp, self.absolute(e.relative_offset)),
            None => (TimestampMs::NONE, self.base),
        }
    }

    fn absolute(&self, rel: RelativeOffset) -> Offset {
        absolute(self.base, rel)
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
        if !self.entries.is_empty() && (offset < last_offset || timestamp < last_ts) {
            return Err(LogError::corrupt(
                &self.path,
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
            LogError::corrupt(&self.path, format!("offset {offset} out of range"))
        })?;
        let mut buf = [0u8; ENTRY];
        buf[..8].copy_from_slice(&timestamp.0.to_be_bytes());
        buf[8..].copy_from_slice(&rel.0.to_be_bytes());
        self.pending.push(&buf);
        self.entries.push(TimeIndexEntry {
            timestamp,
            relative_offset: rel,
        });
        Ok(())
    }

    /// The entry with the largest timestamp ≤ `target`, as (timestamp, offset); (NONE, base)
    /// when there is none.
    pub fn lookup(&self, target: TimestampMs) -> (TimestampMs, Offset) {
        let n = self.entries.partition_point(|e| e.timestamp <= target);
        match n.checked_sub(1) {
            Some(i) => (
                self.entries[i].timestamp,
                self.absolute(self.entries[i].relative_offset),
            ),
            None => (TimestampMs::NONE, self.base),
        }
    }

    /// Removes entries whose offset is ≥ `offset`.
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        let keep = if offset <= self.base {
            0
        } else {
            let rel = offset.0 - self.base.0;
            self.entries
                .partition_point(|e| (e.relative_offset.0 as i64) < rel)
        };
        self.truncate_entries(keep)
    }

    pub fn reset(&mut self) -> Result<(), LogError> {
        self.truncate_entries(0)
    }

    fn truncate_entries(&mut self, keep: usize) -> Result<(), LogError> {
        // The file holds exactly its written entries unless a write failed: cutting nothing
        // needs no descriptor (recovery cuts every index of a partition at its recovery point).
        let on_file_before = self.pending.on_file();
        self.entries.truncate(keep);
        let on_file = self.pending.truncate(keep);
        if on_file >= on_file_before && !self.maybe_longer {
            return Ok(());
        }
        self.file
            .set_len((on_file * ENTRY) as u64)
            .map_err(|e| LogError::io(&self.path, e))?;
        self.maybe_longer = false;
        Ok(())
    }

    pub fn sync(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.file.sync(io).map_err(|e| LogError::io(&self.path, e))
    }

    /// Closes the held descriptor (the segment is no longer active).
    pub fn release(&mut self) {
        self.file.release();
    }

    /// Whether a descriptor is held (tests of the fd budget).
    pub fn is_held(&self) -> bool {
        self.file.is_held()
    }
}

impl PendingIndex for TimeIndex {
    fn path(&self) -> &Path {
        &self.path
    }

    fn begin_batch(&mut self) -> Result<(), LogError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.file
            .begin_batch()
            .map_err(|e| LogError::io(&self.path, e))
    }

    fn end_batch(&mut self) {
        self.file.end_batch();
    }

    fn pending_write(&self) -> Option<WriteOp<'_>> {
        if self.pending.is_empty() {
            return None;
        }
        self.pending.write(self.file.batch_file())
    }

    fn pending_written(&mut self) {
        self.pending.written(self.entries.len());
    }

    fn drop_pending(&mut self) -> Result<(), LogError> {
        // A failed write may have put part of the entries on the file.
        self.maybe_longer = true;
        self.truncate_entries(self.pending.on_file())
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
