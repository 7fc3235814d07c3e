//! A segment file that is opened only when it is written, cut or synced, so an idle partition
//! holds no descriptor for it.
//!
//! Why: a partition's active segment has three files (`.log`, `.index`, `.timeindex`), and
//! holding all three open made 16,384 partitions need ≈ 50,000 descriptors. Reads never need
//! a held handle here (the indexes are mirrored in memory, the endpoint opens files by path),
//! so a handle is opened for the first write and then kept:
//! - `Hold::Always` (the active `.log`): kept until `release` (the segment stops being active)
//!   or drop. One per partition written since its log was opened.
//! - `Hold::Budgeted` (`.index`, `.timeindex`, `.txnindex`): kept only while the process holds
//!   fewer than `limits::INDEX_FILES_HELD_MAX` such handles; past that, each write opens,
//!   writes and closes. So the descriptors held for indexes are bounded whatever the
//!   partition count, and below the budget nothing is opened twice.
//!
//! Sync: fdatasync on a new descriptor flushes the same inode's dirty pages, and Linux reports
//! a writeback error nobody has seen yet to descriptors opened after it (errseq), so a sync
//! through a fresh descriptor is as strong as one through the writer's. A file counts as
//! unsynced from open (a previous process may have left dirty pages) until a sync succeeds;
//! later syncs of a file nothing was written to or cut since are skipped.
//!
//! A sync may also be performed by the file's owner after this call returns (`sync_ticket`, a
//! shard's fdatasync submitted to its ring while it goes on appending): writes and cuts are
//! counted, a ticket records the count it covers, and `synced_through` marks the file clean only
//! if nothing was written since the ticket was taken.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::limits::INDEX_FILES_HELD_MAX;
use crate::log::io::LogIo;

/// Budgeted handles held by this process (all logs, all threads).
static BUDGETED_HELD: AtomicUsize = AtomicUsize::new(0);

/// Which files may keep their descriptor after a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Kept after the first write (the hot `.log` of an active segment).
    Always,
    /// Kept only within `INDEX_FILES_HELD_MAX` for the process.
    Budgeted,
}

/// One held descriptor; a budgeted one gives its slot back when dropped.
#[derive(Debug)]
struct Held {
    /// Shared with the owned write ops of a ring batch in flight (`batch_file_shared`), which
    /// keep the descriptor open until their CQEs even if the file is released meanwhile.
    file: Arc<File>,
    budgeted: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.budgeted {
            BUDGETED_HELD.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[derive(Debug)]
pub struct LazyFile {
    path: PathBuf,
    hold: Hold,
    held: Option<Held>,
    /// Writes and cuts so far (1 at open: a previous process may have left dirty pages).
    written: u64,
    /// The value of `written` the last successful sync covered.
    synced: u64,
    /// The held descriptor was opened for one batch of writes only (past the budget) and is
    /// closed by `end_batch`.
    batch_only: bool,
}

impl LazyFile {
    /// An existing file, not opened yet.
    pub fn existing(path: &Path, hold: Hold) -> LazyFile {
        LazyFile {
            path: path.to_path_buf(),
            hold,
            held: None,
            written: 1,
            synced: 0,
            batch_only: false,
        }
    }

    /// Creates the file empty (replacing what was there) and closes it again: it exists on
    /// disk at once (Kafka's tools expect every segment's index files), and is opened again by
    /// its first write.
    pub fn create(path: &Path, hold: Hold) -> io::Result<LazyFile> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(LazyFile::existing(path, hold))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a descriptor is held now.
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// The held descriptor, else one opened read-only for the caller (closed when dropped).
    pub fn reader(&self) -> io::Result<FileRef<'_>> {
        match &self.held {
            Some(h) => Ok(FileRef::Held(&h.file)),
            None => Ok(FileRef::Opened(File::open(&self.path)?)),
        }
    }

    /// Opens the file read-write now and holds it, outside the budget, until `release`: for a
    /// run of reads and cuts on one file (opening a segment and recovering it).
    pub fn hold(&mut self) -> io::Result<()> {
        if self.held.is_none() {
            let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
            self.held = Some(Held {
                file: Arc::new(file),
                budgeted: false,
            });
        }
        Ok(())
    }

    /// Runs `f` on a writable descriptor: the held one, or a new one that is kept if the hold
    /// rule allows and closed after `f` otherwise. Marks the file unsynced.
    pub fn with_write<R>(&mut self, f: impl FnOnce(&File) -> io::Result<R>) -> io::Result<R> {
        self.written += 1;
        if let Some(h) = &self.held {
            return f(&h.file);
        }
        let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        let keep = match self.hold {
            Hold::Always => Some(false),
            Hold::Budgeted => take_budget_slot().then_some(true),
        };
        match keep {
            Some(budgeted) => {
                let held = self.held.insert(Held {
                    file: Arc::new(file),
                    budgeted,
                });
                f(&held.file)
            }
            None => f(&file),
        }
    }

    pub fn write_all_at(&mut self, io: &mut impl LogIo, pos: u64, data: &[u8]) -> io::Result<()> {
        self.with_write(|f| io.write_all_at(f, pos, data))
    }

    pub fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.with_write(|f| f.set_len(len))
    }

    /// fdatasync, unless nothing was written to or cut from the file since its last sync.
    pub fn sync(&mut self, io: &mut impl LogIo) -> io::Result<()> {
        if !self.is_unsynced() {
            return Ok(());
        }
        let covers = self.written;
        match &self.held {
            Some(h) => io.sync_data(&h.file)?,
            None => io.sync_data(&OpenOptions::new().write(true).open(&self.path)?)?,
        }
        self.synced = covers;
        Ok(())
    }

    /// Whether something was written to or cut from the file since its last sync.
    pub fn is_unsynced(&self) -> bool {
        self.written != self.synced
    }

    /// What a sync performed later by the caller needs (the held descriptor, or a new one
    /// kept alive by the ticket), or `None` when the file is clean. Pass the ticket's `covers`
    /// to `synced_through` once the fdatasync succeeded.
    pub fn sync_ticket(&self) -> io::Result<Option<SyncTicket>> {
        if !self.is_unsynced() {
            return Ok(None);
        }
        let file = match &self.held {
            Some(h) => Arc::clone(&h.file),
            None => Arc::new(OpenOptions::new().write(true).open(&self.path)?),
        };
        Ok(Some(SyncTicket {
            file,
            covers: self.written,
        }))
    }

    /// A ticket's fdatasync succeeded: the file is clean unless written since the ticket.
    pub fn synced_through(&mut self, covers: u64) {
        debug_assert!(covers <= self.written, "a ticket from the future");
        self.synced = self.synced.max(covers);
    }

    /// Closes the held descriptor, if any (the segment stopped being active).
    pub fn release(&mut self) {
        self.held = None;
        self.batch_only = false;
    }

    /// Holds a writable descriptor until `end_batch`, for writes submitted together whose
    /// descriptor must outlive this call (a ring batch borrows it): the held one, or a new one
    /// kept by the hold rule, or one held for this batch only. Marks the file unsynced.
    pub fn begin_batch(&mut self) -> io::Result<()> {
        self.written += 1;
        if self.held.is_some() {
            return Ok(());
        }
        let file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        let (budgeted, batch_only) = match self.hold {
            Hold::Always => (false, false),
            Hold::Budgeted if take_budget_slot() => (true, false),
            Hold::Budgeted => (false, true),
        };
        self.held = Some(Held {
            file: Arc::new(file),
            budgeted,
        });
        self.batch_only = batch_only;
        Ok(())
    }

    /// The descriptor `begin_batch` holds.
    pub fn batch_file(&self) -> &File {
        &self
            .held
            .as_ref()
            .expect("batch_file is called between begin_batch and end_batch")
            .file
    }

    /// `batch_file`, shared: for writes that may complete after `end_batch` closed it here.
    pub fn batch_file_shared(&self) -> Arc<File> {
        Arc::clone(
            &self
                .held
                .as_ref()
                .expect("batch_file is called between begin_batch and end_batch")
                .file,
        )
    }

    /// Ends what `begin_batch` began: a descriptor held for that batch only is closed.
    pub fn end_batch(&mut self) {
        if self.batch_only {
            self.held = None;
            self.batch_only = false;
        }
    }
}

/// An fdatasync to perform later (`LazyFile::sync_ticket`): the descriptor, kept open by the
/// ticket, and how many writes of the file it covers.
#[derive(Debug, Clone)]
pub struct SyncTicket {
    pub file: Arc<File>,
    pub covers: u64,
}

/// A descriptor to read through: the held one, or one opened for this use.
#[derive(Debug)]
pub enum FileRef<'a> {
    Held(&'a File),
    Opened(File),
}

impl std::ops::Deref for FileRef<'_> {
    type Target = File;

    fn deref(&self) -> &File {
        match self {
            FileRef::Held(f) => f,
            FileRef::Opened(f) => f,
        }
    }
}

fn take_budget_slot() -> bool {
    BUDGETED_HELD
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < INDEX_FILES_HELD_MAX).then_some(n + 1)
        })
        .is_ok()
}

/// Budgeted handles held now, process-wide (tests and the fd-budget check).
pub fn budgeted_held() -> usize {
    BUDGETED_HELD.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::io::StdIo;

    #[test]
    fn opened_on_first_write_and_sync_skipped_when_clean() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.index");
        let mut f = LazyFile::create(&path, Hold::Budgeted).expect("create");
        assert!(!f.is_held());
        assert_eq!(std::fs::metadata(&path).expect("meta").len(), 0);
        f.write_all_at(&mut StdIo, 0, b"abcd").expect("write");
        f.sync(&mut StdIo).expect("sync");
        assert!(!f.is_unsynced());
        f.sync(&mut StdIo).expect("clean sync");
        f.set_len(2).expect("cut");
        assert!(f.is_unsynced());
        f.release();
        assert!(!f.is_held());
        f.sync(&mut StdIo).expect("sync through a fresh descriptor");
        assert_eq!(std::fs::read(&path).expect("read"), b"ab");
        let mut read = [0u8; 2];
        let file = f.reader().expect("reader");
        assert!(matches!(file, FileRef::Opened(_)));
        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut read, 0).expect("read");
        assert_eq!(&read, b"ab");
    }

    #[test]
    fn a_ticket_cleans_the_file_only_if_nothing_was_written_after_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.log");
        let mut f = LazyFile::create(&path, Hold::Budgeted).expect("create");
        f.write_all_at(&mut StdIo, 0, b"abcd").expect("write");
        f.release();
        // Not held: the ticket keeps a fresh descriptor of the same inode open.
        let t = f.sync_ticket().expect("ticket").expect("unsynced");
        t.file.sync_data().expect("fdatasync");
        f.write_all_at(&mut StdIo, 4, b"ef")
            .expect("write after the ticket");
        f.synced_through(t.covers);
        assert!(
            f.is_unsynced(),
            "a write after the ticket keeps the file unsynced"
        );
        let t2 = f.sync_ticket().expect("ticket").expect("unsynced");
        t2.file.sync_data().expect("fdatasync");
        f.synced_through(t2.covers);
        assert!(!f.is_unsynced());
        assert!(f.sync_ticket().expect("ticket").is_none());
        // An older ticket finishing late does not make a newer write look synced.
        f.set_len(2).expect("cut");
        f.synced_through(t.covers);
        assert!(f.is_unsynced());
    }

    #[test]
    fn always_files_are_kept_after_the_first_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.log");
        let mut f = LazyFile::create(&path, Hold::Always).expect("create");
        assert!(!f.is_held());
        f.set_len(0).expect("cut");
        assert!(f.is_held());
        f.release();
        assert!(!f.is_held());
    }
}
