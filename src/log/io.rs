//! The seam between the partition log and the I/O engine that performs its writes.
//!
//! The log decides *what* goes *where* (file, position, bytes); a `LogIo` does it. On a shard the
//! implementation is the shard's own io_uring (WRITE_FIXED from the registered arena when the
//! bytes lie in it); tools and tests use plain positional writes. Keeping this a small trait also
//! lets crash tests stop a "disk" between a write and its sync.
//!
//! An append plans its writes as one list (`WriteOp`s: the `.log` bytes, then the index bytes
//! it produced) and hands the whole list to `write_batch`, so an engine that can (the ring) pays
//! one submission and one wait for all of them, and a shard can put the appends of a whole fetch
//! response into one list. The default `write_batch` performs the writes one after another in
//! list order through `write_all_at`, so a test disk that counts or fails writes sees the same
//! sequence of single writes as before batching (crash tests cut between any two of them).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// One planned positional write.
#[derive(Debug, Clone, Copy)]
pub struct WriteOp<'a> {
    pub file: &'a File,
    pub pos: u64,
    pub data: &'a [u8],
    /// Must not start before the previous op in the list completed (the index bytes of an
    /// append follow its `.log` bytes, so an index never points at data not yet written).
    pub after_previous: bool,
}

/// A planned positional write that owns what it writes and the descriptor it writes through,
/// for writes that outlive the call that planned them (a ring batch submitted before the shard
/// sends its next fetch, completed later).
#[derive(Debug, Clone)]
pub struct OwnedWriteOp {
    pub file: std::sync::Arc<File>,
    pub pos: u64,
    pub data: bytes::Bytes,
    pub after_previous: bool,
}

impl OwnedWriteOp {
    pub fn as_op(&self) -> WriteOp<'_> {
        WriteOp {
            file: &self.file,
            pos: self.pos,
            data: &self.data,
            after_previous: self.after_previous,
        }
    }
}

/// Performs the log's file writes and syncs.
pub trait LogIo {
    /// Write all of `data` at byte `pos` of `file`. Short writes are retried until done or failed.
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> io::Result<()>;

    /// Make the file's data durable (fdatasync).
    fn sync_data(&mut self, file: &File) -> io::Result<()>;

    /// Performs every op of `ops` (each written whole, short writes retried) and leaves one
    /// result per op in `results` (cleared first). An op whose `after_previous` predecessor
    /// failed fails too, without writing. The default performs them in order, one at a time.
    fn write_batch(&mut self, ops: &[WriteOp<'_>], results: &mut Vec<io::Result<()>>) {
        results.clear();
        for op in ops {
            let previous_failed = op.after_previous && results.last().is_some_and(|r| r.is_err());
            let r = if previous_failed {
                Err(io::Error::from_raw_os_error(libc::ECANCELED))
            } else {
                self.write_all_at(op.file, op.pos, op.data)
            };
            results.push(r);
        }
    }
}

/// The first error of a batch's results, if any (an append's outcome).
pub fn first_error(results: &mut Vec<io::Result<()>>) -> io::Result<()> {
    match results.iter().position(|r| r.is_err()) {
        Some(i) => results.swap_remove(i),
        None => Ok(()),
    }
}

/// Plain `pwrite`/`fdatasync`, for tools, tests and the control thread.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdIo;

impl LogIo for StdIo {
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> io::Result<()> {
        file.write_all_at(data, pos)
    }

    fn sync_data(&mut self, file: &File) -> io::Result<()> {
        file.sync_data()
    }
}
