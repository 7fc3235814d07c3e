//! Index entries added in memory and not yet written: what lets an append write its `.index`
//! and `.timeindex` entries with one write per file, in the same batch as its `.log` bytes,
//! instead of one 8- or 12-byte write per batch.
//!
//! The index files stay exact-size: the pending bytes always start at the end of what is on the
//! file (`on_file` entries), so the write appends them and the file is never longer than its
//! entries. Between a push and its write, a crash leaves the file *shorter* than the segment's
//! indexing would make it, which recovery rebuilds from the `.log` (as after a crash between the
//! `.log` write and the index write before batching).

use std::fs::File;
use std::path::Path;

use crate::log::io::{LogIo, WriteOp};
use crate::log::LogError;

/// An index whose entries are pushed in memory and written in one go (`.index`, `.timeindex`).
pub trait PendingIndex {
    fn path(&self) -> &Path;

    /// Holds the descriptor `pending_write` borrows, when entries are pending (the index file
    /// may otherwise be closed: `log::lazy_file`).
    fn begin_batch(&mut self) -> Result<(), LogError>;

    /// Gives back what `begin_batch` took.
    fn end_batch(&mut self);

    /// The write that puts the pushed entries on the file, if there are any (after
    /// `begin_batch`).
    fn pending_write(&self) -> Option<WriteOp<'_>>;

    /// The `pending_write` was performed.
    fn pending_written(&mut self);

    /// The `pending_write` failed: the pushed entries are dropped and the file cut back to the
    /// entries written before them.
    fn drop_pending(&mut self) -> Result<(), LogError>;

    /// Writes the pushed entries now.
    fn write_pending(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.begin_batch()?;
        let Some(op) = self.pending_write() else {
            self.end_batch();
            return Ok(());
        };
        let written = io.write_all_at(op.file, op.pos, op.data);
        self.end_batch();
        match written {
            Ok(()) => {
                self.pending_written();
                Ok(())
            }
            Err(e) => {
                let _ = self.drop_pending();
                Err(LogError::io(self.path(), e))
            }
        }
    }
}

/// Encoded entries of `N` bytes each that follow the `on_file` entries already written.
#[derive(Debug)]
pub struct PendingEntries<const N: usize> {
    on_file: usize,
    bytes: Vec<u8>,
}

impl<const N: usize> PendingEntries<N> {
    pub fn new(on_file: usize) -> PendingEntries<N> {
        PendingEntries {
            on_file,
            bytes: Vec::new(),
        }
    }

    /// Entries on the file.
    pub fn on_file(&self) -> usize {
        self.on_file
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn push(&mut self, entry: &[u8; N]) {
        self.bytes.extend_from_slice(entry);
    }

    /// The append of the pending entries to `file`, if any. Ordered after the previous op of a
    /// batch (the `.log` bytes the entries point into).
    pub fn write<'a>(&'a self, file: &'a File) -> Option<WriteOp<'a>> {
        (!self.bytes.is_empty()).then_some(WriteOp {
            file,
            pos: (self.on_file * N) as u64,
            data: &self.bytes,
            after_previous: true,
        })
    }

    /// The pending entries were written; the index now holds `total` entries on its file.
    pub fn written(&mut self, total: usize) {
        assert_eq!(
            total,
            self.on_file + self.bytes.len() / N,
            "index entries changed between their pending write and its completion"
        );
        self.on_file = total;
        self.bytes.clear();
    }

    /// The index keeps its first `keep` entries: pending ones past it are dropped. Returns how
    /// many entries the file must keep.
    pub fn truncate(&mut self, keep: usize) -> usize {
        let pending_kept = keep.saturating_sub(self.on_file);
        self.bytes.truncate(pending_kept * N);
        self.on_file = self.on_file.min(keep);
        self.on_file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_bytes_follow_the_file_and_truncate_with_the_entries() {
        let file = tempfile::tempfile().expect("tempfile");
        let mut p = PendingEntries::<4>::new(2);
        assert!(p.write(&file).is_none());
        p.push(&[1, 2, 3, 4]);
        p.push(&[5, 6, 7, 8]);
        let op = p.write(&file).expect("pending");
        assert_eq!((op.pos, op.data), (8, &[1, 2, 3, 4, 5, 6, 7, 8][..]));
        // Keeping 3 of the 4 entries keeps one pending entry; the file keeps its 2.
        assert_eq!(p.truncate(3), 2);
        assert_eq!(p.write(&file).expect("pending").data, &[1, 2, 3, 4]);
        p.written(3);
        assert!(p.is_empty());
        assert_eq!(p.truncate(1), 1);
        assert_eq!(p.on_file(), 1);
    }
}
