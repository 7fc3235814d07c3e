//! `LogIo` on the shard's own ring: the partition log's writes and syncs go through io_uring.
//!
//! Owned transiently by the shard thread (it borrows the shard's `Ring` for one append or one
//! flush). Writes are submitted *and reaped* on the shard's ring before the call returns:
//! buffered page-cache writes complete in microseconds (inline where the filesystem takes async
//! buffered writes, e.g. XFS; on ext4 an io-wq worker runs them, as the profiles in
//! benches/RESULTS.md show on this VM's 6.18 kernel), so waiting keeps the log's simple
//! synchronous contract while async network completions that arrive meanwhile are queued, not
//! lost. `write_batch` submits all its writes at once and waits once. A fetch response's
//! appends do not go through here: `mirror_shard_append.rs` submits them with
//! `Ring::write_batch_begin`, sends the next fetch, and completes them afterwards. When the
//! bytes lie inside the registered arena (the usual case: record slices of a fetch response
//! received into a slot) the write is a WRITE_FIXED from that memory, with no copy and no
//! per-I/O page pinning.

use std::fs::File;
use std::io;

use super::ring::Ring;
use crate::log::io::{LogIo, WriteOp};

/// The shard ring seen as a `LogIo`.
#[derive(Debug)]
pub struct RingIo<'r> {
    ring: &'r mut Ring,
}

impl<'r> RingIo<'r> {
    pub fn new(ring: &'r mut Ring) -> RingIo<'r> {
        RingIo { ring }
    }
}

impl LogIo for RingIo<'_> {
    fn write_all_at(&mut self, file: &File, mut pos: u64, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            match self.ring.write_at(file, pos, data) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => {
                    // A short write leaves the rest of `data` still inside the same registered
                    // chunk, so the retry stays WRITE_FIXED.
                    data = &data[n..];
                    pos += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn sync_data(&mut self, file: &File) -> io::Result<()> {
        self.ring.fdatasync(file)
    }

    fn write_batch(&mut self, ops: &[WriteOp<'_>], results: &mut Vec<io::Result<()>>) {
        self.ring.write_batch(ops, results)
    }
}
