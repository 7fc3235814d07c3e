//! `.index`: sparse map from offsets to `.log` byte positions (kafka-formats.md §3.2).
//!
//! The file always holds exactly `entries × 8` bytes: we never preallocate the zero tail Kafka
//! uses for its mmap. Kafka takes an existing index's length as its valid size, so an exact-size
//! file is what a broker or DumpLogSegments expects, at any moment, without a trim on roll or
//! close. The entries are also kept in memory (at most `segment.index.bytes` per segment) so a
//! lookup never touches the disk.

use std::path::Path;

use crate::ids::{FilePosition, Offset, RelativeOffset};
use crate::limits::OFFSET_INDEX_ENTRY_BYTES;
use crate::log::index_file::{IndexEntry, IndexFile};
use crate::log::index_pending::PendingIndex;
use crate::log::io::LogIo;
use crate::log::LogError;

const ENTRY: usize = OFFSET_INDEX_ENTRY_BYTES as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetIndexEntry {
    pub relative_offset: RelativeOffset,
    pub position: FilePosition,
}

/// The `.index` of one segment (`index_file` holds the file, the entries and their writes).
pub type OffsetIndex = IndexFile<OffsetIndexEntry, ENTRY>;

impl IndexEntry<ENTRY> for OffsetIndexEntry {
    fn relative_offset(&self) -> RelativeOffset {
        self.relative_offset
    }

    fn encode(&self) -> [u8; ENTRY] {
        let mut buf = [0u8; ENTRY];
        buf[..4].copy_from_slice(&self.relative_offset.0.to_be_bytes());
        buf[4..].copy_from_slice(&self.position.0.to_be_bytes());
        buf
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<Self>, LogError> {
        parse(path, bytes)
    }
}

impl OffsetIndex {
    pub fn is_full(&self) -> bool {
        self.len() >= self.max_entries as usize
    }

    /// Appends (absolute `offset`, `position`) and writes it. Offsets must strictly increase, as
    /// in Kafka (`InvalidOffsetException`); the caller guarantees it by construction.
    pub fn append(
        &mut self,
        io: &mut impl LogIo,
        offset: Offset,
        position: FilePosition,
    ) -> Result<(), LogError> {
        self.push(offset, position)?;
        self.write_pending(io)
    }

    /// Adds (absolute `offset`, `position`) in memory only; it reaches the file with the next
    /// `pending_write` the caller performs (then `pending_written`) or `write_pending`.
    pub fn push(&mut self, offset: Offset, position: FilePosition) -> Result<(), LogError> {
        assert!(!self.is_full(), "offset index appended past its capacity");
        let relative = relative(self.base, offset).ok_or_else(|| {
            LogError::corrupt(self.path(), format!("offset {offset} out of range"))
        })?;
        if let Some(last) = self.entries().last() {
            if relative <= last.relative_offset || position <= last.position {
                return Err(LogError::corrupt(
                    self.path(),
                    format!(
                        "entry ({offset}, {}) does not follow the last entry",
                        position.0
                    ),
                ));
            }
        }
        self.push_entry(OffsetIndexEntry {
            relative_offset: relative,
            position,
        });
        Ok(())
    }

    /// The largest entry whose offset is ≤ `target`, as (absolute offset, position); the
    /// segment start when there is none.
    pub fn lookup(&self, target: Offset) -> (Offset, FilePosition) {
        let entries = self.entries();
        let found = match relative(self.base, target) {
            Some(rel) => {
                let n = entries.partition_point(|e| e.relative_offset <= rel);
                n.checked_sub(1).map(|i| entries[i])
            }
            None if target < self.base => None,
            None => entries.last().copied(),
        };
        match found {
            Some(e) => (absolute(self.base, e.relative_offset), e.position),
            None => (self.base, FilePosition(0)),
        }
    }
}

/// `offset − base` when it fits the int32 Kafka stores.
pub fn relative(base: Offset, offset: Offset) -> Option<RelativeOffset> {
    let rel = offset.0.checked_sub(base.0)?;
    if (0..=i32::MAX as i64).contains(&rel) {
        Some(RelativeOffset(rel as u32))
    } else {
        None
    }
}

/// `base + rel` for an entry of a loaded or appended index: both `relative` (appends) and
/// `check_absolute` (opens) proved it representable.
pub fn absolute(base: Offset, rel: RelativeOffset) -> Offset {
    base.checked_add(i64::from(rel.0))
        .expect("index entries are checked to fit when appended or opened")
}

/// Refuses an index (read from a file, so untrusted) whose entry at `rel` would lie past
/// `limits::OFFSET_MAX` from a segment based at `base`: the caller rebuilds it from the log.
pub fn check_absolute(path: &Path, base: Offset, rel: RelativeOffset) -> Result<(), LogError> {
    match base.checked_add(i64::from(rel.0)) {
        Some(_) => Ok(()),
        None => Err(LogError::corrupt(
            path,
            format!("entry at relative offset {} overflows base {base}", rel.0),
        )),
    }
}

/// Parses index bytes; `Corrupt` names the first problem.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<OffsetIndexEntry>, LogError> {
    if bytes.len() % ENTRY != 0 {
        return Err(LogError::corrupt(
            path,
            format!("length {} is not a multiple of {ENTRY}", bytes.len()),
        ));
    }
    let mut entries: Vec<OffsetIndexEntry> = Vec::with_capacity(bytes.len() / ENTRY);
    for (i, chunk) in bytes.chunks_exact(ENTRY).enumerate() {
        let rel = i32::from_be_bytes(chunk[..4].try_into().expect("4 bytes"));
        let pos = i32::from_be_bytes(chunk[4..].try_into().expect("4 bytes"));
        if rel < 0 || pos < 0 {
            return Err(LogError::corrupt(
                path,
                format!("entry {i} is negative ({rel}, {pos})"),
            ));
        }
        let entry = OffsetIndexEntry {
            relative_offset: RelativeOffset(rel as u32),
            position: FilePosition(pos as u32),
        };
        if let Some(last) = entries.last() {
            if entry.relative_offset <= last.relative_offset || entry.position <= last.position {
                return Err(LogError::corrupt(
                    path,
                    format!("entry {i} ({rel}, {pos}) does not increase over the previous one"),
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
    use proptest::prelude::*;

    #[test]
    fn file_is_exact_size_and_round_trips() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000100.index");
        let mut idx = OffsetIndex::create(&path, Offset(100), 16).expect("create");
        idx.append(&mut StdIo, Offset(105), FilePosition(4200))
            .expect("append");
        idx.append(&mut StdIo, Offset(110), FilePosition(8500))
            .expect("append");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(
            bytes,
            [0, 0, 0, 5, 0, 0, 0x10, 0x68, 0, 0, 0, 10, 0, 0, 0x21, 0x34]
        );
        let again = OffsetIndex::open(&path, Offset(100), 16).expect("open");
        assert_eq!(again.entries(), idx.entries());
    }

    #[test]
    fn lookup_falls_back_to_segment_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.index");
        let mut idx = OffsetIndex::create(&path, Offset(100), 16).expect("create");
        assert_eq!(idx.lookup(Offset(150)), (Offset(100), FilePosition(0)));
        idx.append(&mut StdIo, Offset(120), FilePosition(5000))
            .expect("append");
        assert_eq!(idx.lookup(Offset(119)), (Offset(100), FilePosition(0)));
        assert_eq!(idx.lookup(Offset(120)), (Offset(120), FilePosition(5000)));
        assert_eq!(idx.lookup(Offset(99)), (Offset(100), FilePosition(0)));
    }

    #[test]
    fn non_increasing_file_is_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.index");
        std::fs::write(&path, [0, 0, 0, 5, 0, 0, 0, 9, 0, 0, 0, 5, 0, 0, 0, 10]).expect("write");
        assert!(matches!(
            OffsetIndex::open(&path, Offset(0), 16),
            Err(LogError::Corrupt { .. })
        ));
        std::fs::write(&path, [0, 0, 0, 5, 0]).expect("write");
        assert!(matches!(
            OffsetIndex::open(&path, Offset(0), 16),
            Err(LogError::Corrupt { .. })
        ));
    }

    #[test]
    fn a_deferred_cut_keeps_the_file_until_settled_and_then_makes_it_exact() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("00000000000000000000.index");
        let mut idx = OffsetIndex::create(&path, Offset(0), 16).expect("create");
        for (o, p) in [(5, 100), (10, 200), (15, 300)] {
            idx.append(&mut StdIo, Offset(o), FilePosition(p))
                .expect("append");
        }
        let before = std::fs::read(&path).expect("read");
        let inode = std::fs::metadata(&path).expect("meta").ino();
        // Recovery: cut at 10, rebuild the same entries, settle: the file is untouched.
        idx.truncate_to_deferred(Offset(10));
        assert_eq!(idx.len(), 1);
        assert_eq!(std::fs::read(&path).expect("read"), before, "no cut yet");
        idx.push(Offset(10), FilePosition(200)).expect("push");
        idx.push(Offset(15), FilePosition(300)).expect("push");
        idx.write_pending(&mut StdIo).expect("write");
        idx.settle_len().expect("settle");
        assert_eq!(std::fs::read(&path).expect("read"), before);
        assert_eq!(std::fs::metadata(&path).expect("meta").ino(), inode);
        // A rebuild that ends earlier (a cut log) is cut to exactly its entries.
        idx.reset_deferred();
        idx.push(Offset(5), FilePosition(100)).expect("push");
        idx.write_pending(&mut StdIo).expect("write");
        assert_eq!(
            std::fs::read(&path).expect("read").len(),
            24,
            "stale entries until settled"
        );
        idx.settle_len().expect("settle");
        assert_eq!(std::fs::read(&path).expect("read"), before[..8].to_vec());
        let again = OffsetIndex::open(&path, Offset(0), 16).expect("open");
        assert_eq!(again.entries(), idx.entries());
    }

    proptest! {
        /// Lookup returns exactly the greatest entry ≤ target, for any sorted entry set.
        #[test]
        fn lookup_is_greatest_lower_bound(
            deltas in proptest::collection::vec(1u32..1000, 0..50),
            target in 0i64..60_000,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("p.index");
            let base = Offset(1_000);
            let mut idx = OffsetIndex::create(&path, base, 64).expect("create");
            let mut off = base.0;
            let mut pairs = Vec::new();
            for (i, d) in deltas.iter().enumerate() {
                off += *d as i64;
                let pos = FilePosition((i as u32 + 1) * 100);
                idx.append(&mut StdIo, Offset(off), pos).expect("append");
                pairs.push((Offset(off), pos));
            }
            let target = Offset(base.0 + target);
            let expected = pairs.iter().rev().find(|(o, _)| *o <= target).copied()
                .unwrap_or((base, FilePosition(0)));
            prop_assert_eq!(idx.lookup(target), expected);
            idx.truncate_to(target).expect("truncate");
            prop_assert!(idx.entries().iter().all(|e| (e.relative_offset.0 as i64) < target.0 - base.0));
            let len = std::fs::metadata(&path).expect("meta").len();
            prop_assert_eq!(len, idx.len() as u64 * 8);
        }
    }
}
