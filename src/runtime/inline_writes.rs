//! Where a shard's log writes run: on the shard thread itself while they stay fast, or as ring
//! WRITEs that the kernel hands to an io-wq worker.
//!
//! On ext4 (which does not take io_uring's non-blocking buffered writes, nor `RWF_NOWAIT` ones)
//! every ring WRITE of a `.log` goes to an io-wq worker, which then copies bytes the shard
//! thread has just received and checksummed, from memory that has left the shard's cache, on
//! whatever core it runs. Writing on the shard thread instead copies them while they are still
//! in its cache and leaves the other cores to the rest of the box: at 16 and 4,096 partitions it
//! took 12–20 % less CPU per GB and moved 10–20 % more (benches/RESULTS.md, session 21).
//!
//! Its risk is the shard thread itself: a buffered write can block, for as long as writeback
//! takes, when the kernel throttles a writer because dirty memory passed the "free run" line
//! (half way between `vm.dirty_background_*` and `vm.dirty_*`: `balance_dirty_pages`), and a
//! blocked shard receives, times and answers nothing. Throttled, an io-wq worker sleeps instead
//! and the shard goes on receiving: with 6 GB mirrored past this box's dirty limit, writing on
//! the shard was 20–25 % slower than the ring (benches/RESULTS.md, session 21). So the shard
//! writes itself only while the kernel's dirty and writeback pages stay below
//! `INLINE_WRITE_FREE_RUN_SHARE` of that line (`/proc/vmstat`, read at most every
//! `INLINE_WRITE_DIRTY_CHECK_INTERVAL`), and a write that takes longer than its size explains
//! (a stall of another kind) ends the inline writing of its batch (the rest go to the ring) and
//! of every batch for `INLINE_WRITE_BACKOFF`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use crate::limits::{
    INLINE_WRITE_BACKOFF, INLINE_WRITE_DIRTY_CHECK_INTERVAL, INLINE_WRITE_FREE_RUN_SHARE,
    INLINE_WRITE_SLOW_BYTES_PER_SEC, INLINE_WRITE_SLOW_FLOOR,
};

/// How a shard performs its log writes (`runtime.log_writes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogWrites {
    /// `pwrite` on the shard thread while writes stay fast; ring WRITEs for a while after a
    /// slow one.
    #[default]
    ShardWhenFast,
    /// Always ring WRITEs (on ext4 an io-wq worker copies the bytes into the page cache).
    IoWorker,
}

/// The policy's state, owned by the shard's ring.
#[derive(Debug)]
pub(crate) struct InlineWrites {
    mode: LogWrites,
    /// Writes go to the ring until then, after a slow one.
    off_until: Option<Instant>,
    /// When `/proc/vmstat` was last read, and whether dirty memory was then well below the
    /// kernel's free-run line.
    dirty_checked: Option<Instant>,
    dirty_low: bool,
    /// Tests that compare write paths turn the dirty-memory rule off, so the host's state
    /// cannot pick the path for them.
    watch_dirty: bool,
    /// A write slower than `floor + len / rate` is slow.
    floor: Duration,
    rate: u64,
}

/// What one inline write did.
#[derive(Debug)]
pub(crate) enum Inline {
    Written,
    Failed(i32),
    /// Written, but slowly: stop writing inline for now.
    WrittenSlowly,
}

impl InlineWrites {
    pub fn new(mode: LogWrites) -> InlineWrites {
        InlineWrites {
            mode,
            off_until: None,
            dirty_checked: None,
            dirty_low: true,
            watch_dirty: true,
            floor: INLINE_WRITE_SLOW_FLOOR,
            rate: INLINE_WRITE_SLOW_BYTES_PER_SEC,
        }
    }

    /// For tests: every write counts as slow.
    #[cfg(test)]
    pub fn every_write_slow(mut self) -> InlineWrites {
        self.floor = Duration::ZERO;
        self.rate = u64::MAX;
        self
    }

    /// For tests: no write counts as slow, however long the host takes (a CI machine under
    /// load once took longer than the rule allows for one of 600 small writes).
    #[cfg(test)]
    pub fn no_write_slow(mut self) -> InlineWrites {
        self.floor = Duration::from_secs(24 * 3600);
        self.rate = u64::MAX;
        self
    }

    /// For tests: dirty memory never sends writes to the ring.
    #[cfg(test)]
    pub fn ignoring_dirty_memory(mut self) -> InlineWrites {
        self.watch_dirty = false;
        self
    }

    pub fn mode(&self) -> LogWrites {
        self.mode
    }

    /// Whether the next batch's writes should start on this thread.
    pub fn wanted(&mut self, now: Instant) -> bool {
        match self.mode {
            LogWrites::IoWorker => false,
            LogWrites::ShardWhenFast => match self.off_until {
                Some(t) if now < t => false,
                _ => {
                    self.off_until = None;
                    self.dirty_memory_low(now)
                }
            },
        }
    }

    /// Whether the kernel's dirty and writeback pages are well below the line past which it
    /// throttles writers, as of a read of `/proc/vmstat` at most `INLINE_WRITE_DIRTY_CHECK_INTERVAL`
    /// old. Unreadable (no procfs): only the slow-write rule guards the shard.
    fn dirty_memory_low(&mut self, now: Instant) -> bool {
        if !self.watch_dirty {
            return true;
        }
        let stale = self
            .dirty_checked
            .is_none_or(|t| now.duration_since(t) >= INLINE_WRITE_DIRTY_CHECK_INTERVAL);
        if stale {
            self.dirty_checked = Some(now);
            self.dirty_low = std::fs::read_to_string("/proc/vmstat")
                .ok()
                .and_then(|text| below_free_run(&text))
                .unwrap_or(true);
        }
        self.dirty_low
    }

    /// Writes all of `data` at `pos` of `file` on this thread (short writes and EINTR are
    /// retried, as the ring path does). A slow write starts the backoff.
    pub fn write(&mut self, file: &File, pos: u64, data: &[u8]) -> Inline {
        let began = Instant::now();
        let result = file.write_all_at(data, pos);
        let took = began.elapsed();
        match result {
            Ok(()) => {
                let explained =
                    self.floor + Duration::from_secs_f64(data.len() as f64 / self.rate as f64);
                if took > explained {
                    self.off_until = Some(Instant::now() + INLINE_WRITE_BACKOFF);
                    Inline::WrittenSlowly
                } else {
                    Inline::Written
                }
            }
            // `write_all_at` reports a zero-byte write as WriteZero, which has no errno; the
            // ring path reports a CQE of 0 as EIO.
            Err(e) => Inline::Failed(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

/// Whether `/proc/vmstat`'s dirty plus writeback pages are below `INLINE_WRITE_FREE_RUN_SHARE`
/// of the free-run line, (`nr_dirty_background_threshold` + `nr_dirty_threshold`) / 2, under
/// which `balance_dirty_pages` never pauses a writer. `None` when a field is missing.
pub(crate) fn below_free_run(vmstat: &str) -> Option<bool> {
    let field = |name: &str| -> Option<u64> {
        vmstat.lines().find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().ok()).flatten()
        })
    };
    let dirty = field("nr_dirty")? + field("nr_writeback")?;
    let free_run = (field("nr_dirty_background_threshold")? + field("nr_dirty_threshold")?) / 2;
    let (num, den) = INLINE_WRITE_FREE_RUN_SHARE;
    Some(dirty.saturating_mul(den) < free_run.saturating_mul(num))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_write_turns_inline_writing_off_for_the_backoff() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let mut fast = InlineWrites::new(LogWrites::ShardWhenFast).ignoring_dirty_memory();
        let now = Instant::now();
        assert!(fast.wanted(now));
        assert!(matches!(fast.write(&file, 0, b"abc"), Inline::Written));
        assert!(fast.wanted(Instant::now()));

        let mut slow = InlineWrites::new(LogWrites::ShardWhenFast)
            .ignoring_dirty_memory()
            .every_write_slow();
        assert!(matches!(
            slow.write(&file, 3, b"def"),
            Inline::WrittenSlowly
        ));
        let after = Instant::now();
        assert!(!slow.wanted(after));
        assert!(slow.wanted(after + INLINE_WRITE_BACKOFF));
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"abcdef");
    }

    /// Runs `ops` through `io.write_batch` and returns the errno (0: ok) of each op.
    fn batch_errnos(
        io: &mut impl crate::log::io::LogIo,
        ops: &[crate::log::io::WriteOp<'_>],
    ) -> Vec<i32> {
        let mut results = Vec::new();
        io.write_batch(ops, &mut results);
        results
            .iter()
            .map(|r| {
                r.as_ref()
                    .map_or_else(|e| e.raw_os_error().unwrap(), |()| 0)
            })
            .collect()
    }

    // Goal: one write batch (a response's appends: per partition a .log write from the arena
    // linked to its index writes) writes every byte where the same ops in order through StdIo
    // put them, and reports alike, whether the ring performs it (in one wait, every .log write
    // a WRITE_FIXED from the slot), the shard thread does, or the shard thread starts and hands
    // the rest to the ring after a slow write; a failing op fails the ops linked after it
    // (never written, ECANCELED) and nothing else. Method: 200 "partitions" of a log write
    // linked to two index writes, the middle one's log write aimed at a read-only descriptor,
    // through StdIo and three rings (io_worker, shard_when_fast, shard_when_fast with every
    // write slow), each into its own files; compare errnos, files and the rings' counters.
    #[test]
    fn inline_and_ring_writes_report_and_write_alike() {
        use crate::log::io::{StdIo, WriteOp};
        use crate::runtime::{Arena, Ring, RingIo};
        const N: usize = 200;
        const SLOT: usize = 256 * 1024;
        let mut rings: Vec<Ring> = (0..3).map(|_| Ring::new().expect("io_uring")).collect();
        let arena = Arena::new(SLOT, 1).unwrap();
        rings[0].register_arena(&arena).unwrap();
        let mut slot = arena.take().unwrap();
        let pattern: Vec<u8> = (0..SLOT).map(|i| (i * 7 % 253) as u8).collect();
        slot.extend_from_slice(&pattern);
        let bytes = slot.freeze();
        let dir = tempfile::tempdir().unwrap();
        let read_only = File::open(dir.path()).unwrap();
        let index_bytes: Vec<[u8; 8]> = (0..N).map(|p| (p as u64).to_be_bytes()).collect();
        let sides = ["ring", "inline", "slow", "std"];
        let files: Vec<Vec<(File, File)>> = sides
            .iter()
            .map(|side| {
                (0..N)
                    .map(|p| {
                        let open = |suffix: &str| {
                            std::fs::OpenOptions::new()
                                .create(true)
                                .truncate(true)
                                .read(true)
                                .write(true)
                                .open(dir.path().join(format!("{side}-{p}.{suffix}")))
                                .unwrap()
                        };
                        (open("log"), open("index"))
                    })
                    .collect()
            })
            .collect();
        let ops = |side: usize| -> Vec<WriteOp<'_>> {
            let mut ops = Vec::new();
            for (p, (log, index)) in files[side].iter().enumerate() {
                ops.push(WriteOp {
                    file: if p == N / 2 { &read_only } else { log },
                    pos: 0,
                    data: &bytes[p * 100..p * 100 + 1000 + p * 97],
                    after_previous: false,
                });
                for k in 0..2 {
                    ops.push(WriteOp {
                        file: index,
                        pos: k * 8,
                        data: &index_bytes[p],
                        after_previous: true,
                    });
                }
            }
            ops
        };
        rings[1].set_log_writes(LogWrites::ShardWhenFast);
        rings[1].inline_writes_for_tests(false);
        rings[2].set_log_writes(LogWrites::ShardWhenFast);
        rings[2].inline_writes_for_tests(true);
        let mut errnos: Vec<Vec<i32>> = (0..3)
            .map(|i| batch_errnos(&mut RingIo::new(&mut rings[i]), &ops(i)))
            .collect();
        errnos.push(batch_errnos(&mut StdIo, &ops(3)));
        let failed: Vec<usize> = (0..3 * N).filter(|&k| errnos[0][k] != 0).collect();
        assert_eq!(failed, [3 * (N / 2), 3 * (N / 2) + 1, 3 * (N / 2) + 2]);
        assert_eq!(errnos[0][3 * (N / 2)], libc::EBADF);
        assert_eq!(errnos[0][3 * (N / 2) + 1], libc::ECANCELED);
        assert_eq!(errnos[1], errnos[0], "inline");
        assert_eq!(errnos[2], errnos[0], "inline, then the ring");
        assert_eq!(
            errnos[0].iter().map(|&e| e != 0).collect::<Vec<_>>(),
            errnos[3].iter().map(|&e| e != 0).collect::<Vec<_>>(),
            "std"
        );
        for p in 0..N {
            for suffix in ["log", "index"] {
                let read = |side: &str| {
                    std::fs::read(dir.path().join(format!("{side}-{p}.{suffix}"))).unwrap()
                };
                let std_file = read("std");
                for side in &sides[..3] {
                    assert_eq!(read(side), std_file, "{side}: partition {p} {suffix}");
                }
            }
        }
        let stats: Vec<_> = rings.iter().map(Ring::stats).collect();
        // The ring alone: every .log write a WRITE_FIXED from the slot, every op one SQE (no
        // retry round), one batch.
        assert_eq!(
            (
                stats[0].writes_fixed,
                stats[0].writes_plain,
                stats[0].submitted
            ),
            (N as u64, 2 * N as u64, 3 * N as u64)
        );
        assert_eq!(stats[0].write_batches, 1);
        assert_eq!(stats[0].writes_inline, 0);
        // Inline: no SQE; the two canceled ops never written.
        assert_eq!(
            (stats[1].writes_inline, stats[1].submitted),
            (3 * N as u64 - 2, 0)
        );
        // Slow: the first write inline, then the rest of the batch on the ring ...
        assert_eq!(
            (
                stats[2].writes_inline,
                stats[2].writes_inline_slow,
                stats[2].submitted
            ),
            (1, 1, 3 * N as u64 - 1)
        );
        // ... and the next batch too, within the backoff.
        let again = batch_errnos(&mut RingIo::new(&mut rings[2]), &ops(2));
        assert_eq!(again, errnos[0]);
        assert_eq!(rings[2].stats().writes_inline, 1);
    }

    #[test]
    fn dirty_memory_near_the_free_run_line_sends_writes_to_the_ring() {
        let vmstat = |dirty: u64, writeback: u64| {
            format!(
                "nr_free_pages 5\nnr_dirty {dirty}\nnr_writeback {writeback}\n\
                 nr_dirty_threshold 1000\nnr_dirty_background_threshold 600\nnr_foo 1\n"
            )
        };
        // Free run ends at (600 + 1000) / 2 = 800 pages; the shard writes itself below 7/8 of it.
        assert_eq!(below_free_run(&vmstat(0, 0)), Some(true));
        assert_eq!(below_free_run(&vmstat(600, 99)), Some(true));
        assert_eq!(below_free_run(&vmstat(600, 100)), Some(false));
        assert_eq!(below_free_run(&vmstat(10, 900)), Some(false));
        assert_eq!(below_free_run("nr_dirty 1\n"), None);
        // This machine's own /proc/vmstat has every field.
        let here = std::fs::read_to_string("/proc/vmstat").unwrap();
        assert!(below_free_run(&here).is_some());
    }

    #[test]
    fn io_worker_mode_never_writes_inline() {
        let mut w = InlineWrites::new(LogWrites::IoWorker);
        assert!(!w.wanted(Instant::now()));
    }

    #[test]
    fn a_failed_write_reports_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ro"), b"x").unwrap();
        let ro = File::open(dir.path().join("ro")).unwrap();
        let mut w = InlineWrites::new(LogWrites::ShardWhenFast);
        assert!(matches!(w.write(&ro, 0, b"y"), Inline::Failed(libc::EBADF)));
    }
}
