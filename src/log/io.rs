//! The seam between the partition log and the I/O engine that performs its writes.
//!
//! The log decides *what* goes *where* (file, position, bytes); a `LogIo` does it. On a shard the
//! implementation is the shard's own io_uring (WRITE_FIXED from the registered arena when the
//! bytes lie in it); tools and tests use plain positional writes. Keeping this a small trait also
//! lets crash tests stop a "disk" between a write and its sync.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Performs the log's file writes and syncs.
pub trait LogIo {
    /// Write all of `data` at byte `pos` of `file`. Short writes are retried until done or failed.
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> io::Result<()>;

    /// Make the file's data durable (fdatasync).
    fn sync_data(&mut self, file: &File) -> io::Result<()>;
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
