//! What `.index` and `.timeindex` share: the lazily held file (`lazy_file`), the entries kept in
//! memory for lookups, the entries pushed but not yet written (`index_pending`), and the cuts
//! that keep the file exact-size. `OffsetIndex` and `TimeIndex` are this type over their entry;
//! each keeps only its encoding, its append rule and its lookups.

use std::path::{Path, PathBuf};

use crate::ids::{Offset, RelativeOffset};
use crate::log::index_pending::{PendingEntries, PendingIndex};
use crate::log::io::{OwnedWriteOp, WriteOp};
use crate::log::lazy_file::{Hold, LazyFile};
use crate::log::offset_index::check_absolute;
use crate::log::LogError;

/// An index entry encoded in `N` bytes.
pub trait IndexEntry<const N: usize>: Copy {
    /// The entry's offset relative to the segment base (entries are ordered by it).
    fn relative_offset(&self) -> RelativeOffset;

    /// The entry's bytes on the file.
    fn encode(&self) -> [u8; N];

    /// Parses a whole file; `Corrupt` names the first problem.
    fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<Self>, LogError>;
}

/// One segment's index file of `E` entries, `N` bytes each.
#[derive(Debug)]
pub struct IndexFile<E, const N: usize> {
    path: PathBuf,
    /// Opened by the first write or cut (`lazy_file`); lookups use `entries`.
    file: LazyFile,
    /// The file may be longer than `entries` (a failed write left part of an entry).
    maybe_longer: bool,
    pub(super) base: Offset,
    pub(super) max_entries: u32,
    entries: Vec<E>,
    /// Entries pushed but not yet on the file (written once per append, with its `.log` bytes).
    pending: PendingEntries<N>,
}

impl<E: IndexEntry<N>, const N: usize> IndexFile<E, N> {
    /// Creates an empty index, replacing whatever file was there.
    pub fn create(path: &Path, base: Offset, max_entries: u32) -> Result<Self, LogError> {
        let file = LazyFile::create(path, Hold::Budgeted).map_err(|e| LogError::io(path, e))?;
        Ok(Self::with(path, file, base, max_entries, Vec::new()))
    }

    /// Opens an existing index and runs the sanity check (`IndexEntry::parse`, and the last
    /// entry must fit past the base); `Corrupt` means the caller rebuilds it from the log.
    pub fn open(path: &Path, base: Offset, max_entries: u32) -> Result<Self, LogError> {
        let bytes = std::fs::read(path).map_err(|e| LogError::io(path, e))?;
        let file = LazyFile::existing(path, Hold::Budgeted);
        let entries = E::parse(path, &bytes)?;
        if let Some(last) = entries.last() {
            check_absolute(path, base, last.relative_offset())?;
        }
        Ok(Self::with(path, file, base, max_entries, entries))
    }

    /// An index whose file holds exactly `entries`.
    fn with(path: &Path, file: LazyFile, base: Offset, max_entries: u32, entries: Vec<E>) -> Self {
        IndexFile {
            path: path.to_path_buf(),
            file,
            maybe_longer: false,
            base,
            max_entries,
            pending: PendingEntries::new(entries.len()),
            entries,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[E] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds an entry in memory; it reaches the file with the next `pending_write` the caller
    /// performs (then `pending_written`) or `write_pending`. The caller checked its order.
    pub(super) fn push_entry(&mut self, entry: E) {
        self.pending.push(&entry.encode());
        self.entries.push(entry);
    }

    /// Removes the entries for offsets ≥ `offset`.
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        let keep = self.keep_below(offset);
        self.truncate_entries(keep)
    }

    /// Drops every entry (recovery rebuilds the index from scratch).
    pub fn reset(&mut self) -> Result<(), LogError> {
        self.truncate_entries(0)
    }

    /// `truncate_to` for recovery: the entries go at once, the file is cut only by
    /// `settle_len`, after the rebuilt entries were written over it. Why: recovery cuts every
    /// index at the region it re-reads and then writes the same entries back; cutting first
    /// freed, discarded and reallocated the blocks of every recovered partition's indexes
    /// (ext4_truncate was a third of a 16,384-partition restart). Until `settle_len` the file
    /// may hold stale entries past the kept ones; a crash then leaves them above the recovery
    /// point, which the next recovery cuts again (it never trusts entries there).
    pub fn truncate_to_deferred(&mut self, offset: Offset) {
        let keep = self.keep_below(offset);
        self.entries.truncate(keep);
        self.pending.truncate(keep);
        self.maybe_longer = true;
    }

    /// `reset` for recovery (see `truncate_to_deferred`).
    pub fn reset_deferred(&mut self) {
        self.entries.clear();
        self.pending.truncate(0);
        self.maybe_longer = true;
    }

    /// Cuts the file to its written entries when it may be longer (after the deferred cuts
    /// and the rebuilt entries' write); a file the rebuild covered exactly is left alone.
    pub fn settle_len(&mut self) -> Result<(), LogError> {
        if !self.maybe_longer {
            return Ok(());
        }
        let exact = (self.pending.on_file() * N) as u64;
        let len = match std::fs::metadata(&self.path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(LogError::io(&self.path, e)),
        };
        if len != exact {
            self.file
                .set_len(exact)
                .map_err(|e| LogError::io(&self.path, e))?;
        }
        self.maybe_longer = false;
        Ok(())
    }

    /// How many entries have offsets below `offset`.
    fn keep_below(&self, offset: Offset) -> usize {
        if offset <= self.base {
            return 0;
        }
        let rel = offset.0 - self.base.0;
        self.entries
            .partition_point(|e| (e.relative_offset().0 as i64) < rel)
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
            .set_len((on_file * N) as u64)
            .map_err(|e| LogError::io(&self.path, e))?;
        self.maybe_longer = false;
        Ok(())
    }

    pub fn sync(&mut self, io: &mut impl crate::log::io::LogIo) -> Result<(), LogError> {
        self.file.sync(io).map_err(|e| LogError::io(&self.path, e))
    }

    /// A sync for the caller to perform later (`LazyFile::sync_ticket`), with the path.
    pub fn sync_ticket(
        &self,
    ) -> Result<Option<(PathBuf, crate::log::lazy_file::SyncTicket)>, LogError> {
        self.file
            .sync_ticket()
            .map(|t| t.map(|t| (self.path.clone(), t)))
            .map_err(|e| LogError::io(&self.path, e))
    }

    /// A ticket's sync succeeded (`LazyFile::synced_through`).
    pub fn synced_through(&mut self, covers: u64) {
        self.file.synced_through(covers);
    }

    /// Closes the held descriptor (the segment is no longer active).
    pub fn release(&mut self) {
        self.file.release();
    }

    /// `pending_write` as an owned op (between `begin_batch` and `end_batch`): the entries'
    /// bytes copied, the descriptor shared, so the write may complete after this call.
    pub fn pending_write_owned(&self) -> Option<OwnedWriteOp> {
        let op = self.pending_write()?;
        Some(OwnedWriteOp {
            file: self.file.batch_file_shared(),
            pos: op.pos,
            data: bytes::Bytes::copy_from_slice(op.data),
            after_previous: op.after_previous,
        })
    }

    /// Whether a descriptor is held (tests of the fd budget).
    pub fn is_held(&self) -> bool {
        self.file.is_held()
    }
}

impl<E: IndexEntry<N>, const N: usize> PendingIndex for IndexFile<E, N> {
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
