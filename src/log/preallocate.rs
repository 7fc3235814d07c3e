//! Disk blocks reserved ahead of an active segment's end.
//!
//! An appending `pwrite` into a file's unallocated tail makes ext4 reserve blocks for delayed
//! allocation page by page, about a fifth of a shard's time in session 21's profile. Blocks
//! reserved beforehand with `fallocate(FALLOC_FL_KEEP_SIZE)` skip that: the file's size stays
//! its true length (readers, recovery and Kafka's tools see exactly the bytes written, as
//! before), only the blocks past it are taken. Kafka's own `log.preallocate` instead extends
//! the file and trims it on roll, which a crash would leave zero-filled; this does not.
//!
//! The reservation is a hint: a filesystem without `fallocate` or a full disk makes it fail,
//! and the write that follows reports the real outcome. A segment that stops being active
//! gives its unused blocks back (`Segment::release_reserved`, a truncate to its own size).

use std::fs::File;
use std::io;

use crate::limits::{LOG_PREALLOCATE_AHEAD_MAX, LOG_PREALLOCATE_FROM_BYTES};

/// What one active `.log` has reserved. Lives in the segment's memory only: after a restart a
/// segment starts from its size again (reserving a range that already has blocks is a no-op).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Blocks are reserved (or were asked for) below this byte.
    to: u64,
}

impl Reserved {
    pub fn new(size: u64) -> Reserved {
        Reserved { to: size }
    }

    /// The range to reserve before the `.log` grows to `end` bytes, if any: none while `end`
    /// lies in what is reserved or the segment is small; else from the end of the reservation
    /// to `end` plus as much again as the segment will hold (at most
    /// `LOG_PREALLOCATE_AHEAD_MAX`), never past `segment_bytes`. Counts it as reserved.
    pub fn plan(&mut self, end: u64, segment_bytes: u64) -> Option<(u64, u64)> {
        if end <= self.to || end < LOG_PREALLOCATE_FROM_BYTES {
            return None;
        }
        let to = end
            .saturating_add(end.min(LOG_PREALLOCATE_AHEAD_MAX))
            .min(segment_bytes.max(end));
        let from = self.to;
        self.to = to;
        debug_assert!(from < to);
        Some((from, to - from))
    }

    /// Whether blocks may be reserved past `size` (a `release` has something to give back).
    pub fn past(&self, size: u64) -> bool {
        self.to > size
    }

    /// The file was cut or trimmed to `size`: nothing is reserved past it any more.
    pub fn cut_to(&mut self, size: u64) {
        self.to = size;
    }
}

/// Reserves `len` bytes of blocks at `pos` of `file` without changing its size.
pub fn reserve(file: &File, pos: u64, len: u64) -> io::Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, pos, len)
        .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn small_segments_reserve_nothing() {
        let mut r = Reserved::new(0);
        assert_eq!(r.plan(LOG_PREALLOCATE_FROM_BYTES - 1, 1024 * MIB), None);
        assert!(!r.past(LOG_PREALLOCATE_FROM_BYTES - 1));
    }

    #[test]
    fn reservations_double_the_segment_up_to_the_cap_and_stop_at_segment_bytes() {
        let mut r = Reserved::new(0);
        // First reservation: from 0 (the written part too) to twice the end.
        assert_eq!(r.plan(MIB, 1024 * MIB), Some((0, 2 * MIB)));
        assert_eq!(r.plan(2 * MIB, 1024 * MIB), None, "inside the reservation");
        assert_eq!(r.plan(3 * MIB, 1024 * MIB), Some((2 * MIB, 4 * MIB)));
        // Large segments reserve LOG_PREALLOCATE_AHEAD_MAX past the end.
        let end = 100 * MIB;
        assert_eq!(
            r.plan(end, 1024 * MIB),
            Some((6 * MIB, end + LOG_PREALLOCATE_AHEAD_MAX - 6 * MIB))
        );
        // Never past segment.bytes (but always the write itself).
        let seg = end + LOG_PREALLOCATE_AHEAD_MAX + MIB;
        let (from, len) = r.plan(seg - 1, seg).unwrap();
        assert_eq!(from + len, seg);
        assert!(r.past(seg - 1));
        r.cut_to(5 * MIB);
        assert!(!r.past(5 * MIB));
        assert_eq!(r.plan(6 * MIB, seg), Some((5 * MIB, 7 * MIB)));
    }

    #[test]
    fn reserving_keeps_the_size_and_a_truncate_to_the_size_gives_the_blocks_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all_at(&[7u8; 4096], 0).unwrap();
        match reserve(&f, 0, 8 * MIB) {
            Ok(()) => {}
            // A filesystem without fallocate (the reservation is only a hint).
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return,
            Err(e) => panic!("fallocate: {e}"),
        }
        let m = f.metadata().unwrap();
        assert_eq!(m.len(), 4096, "the size is the bytes written");
        assert!(m.blocks() * 512 >= 8 * MIB, "blocks reserved past the end");
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 4096]);
        f.set_len(4096).unwrap();
        let m = f.metadata().unwrap();
        assert!(
            m.blocks() * 512 < MIB,
            "a truncate to the size frees the rest"
        );
    }
}
