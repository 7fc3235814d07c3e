//! The only io_uring wrapper: one ring per shard, an op slab keyed by `user_data`, and the
//! blocking helpers the log's `LogIo` uses.
//!
//! Owned by one shard thread and created on it (SINGLE_ISSUER requires every submit to come from
//! the creating thread). Asynchronous ops (RECV, SEND, CONNECT, TIMEOUT, eventfd READ) *own* their
//! buffer for the whole flight: the buffer sits in the slab entry and comes back in the
//! `Completion`, so nothing the kernel writes into can be freed early. Blocking ops (file WRITE /
//! WRITE_FIXED / FSYNC) borrow their buffer and do not return before their CQE arrives.
//!
//! Steady state allocates nothing: the slab, its free list and the ready queue are allocated once
//! at `Ring::new` with `RING_OPS_IN_FLIGHT_MAX` entries; each op only moves values into a
//! preallocated entry. (Counting-allocator test: tests/runtime_no_alloc.rs.)
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use socket2::SockAddr;

use super::arena::{Arena, RegisteredChunk, SlotBuf};
use super::inline_writes::{Inline, InlineWrites, LogWrites};
use super::stats::ShardStats;
use crate::limits::{
    RING_CQ_ENTRIES, RING_OPS_IN_FLIGHT_MAX, RING_OPS_RESERVED, RING_SQ_ENTRIES,
    RING_WRITE_BATCH_MAX, SHARD_DISK_WAIT_MAX_MS, SHARD_HEARTBEAT_MS,
};
use crate::log::io::{OwnedWriteOp, WriteOp};

/// `user_data` of the single blocking op that may be in flight (it never enters the slab).
const SYNC_KEY: u64 = u64::MAX;
/// `user_data` of cancel requests, whose own completions carry nothing we need.
const CANCEL_KEY: u64 = u64::MAX - 1;
/// user_data of the TIMEOUT that bounds `submit_and_wait_new_for` on kernels without
/// IORING_FEAT_EXT_ARG (before 5.11).
const WAKE_KEY: u64 = u64::MAX - 2;
/// `user_data` bit of the writes of a `write_batch`; the other bits are the op's index. (The two
/// keys above have it set too, so they are matched first.)
const BATCH_BIT: u64 = 1 << 62;

/// Applies one candidate set of setup flags to a ring builder.
type SetFlags = fn(&mut io_uring::Builder);

/// Which setup flags the kernel accepted, best first. `kmirror doctor` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingMode {
    /// SINGLE_ISSUER | DEFER_TASKRUN (6.1+): completions run only when we enter; no IPIs.
    SingleIssuerDeferTaskrun,
    /// COOP_TASKRUN | TASKRUN_FLAG (5.19+).
    CoopTaskrun,
    /// No setup flags.
    Plain,
}

impl std::fmt::Display for RingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingMode::SingleIssuerDeferTaskrun => "SINGLE_ISSUER|DEFER_TASKRUN",
            RingMode::CoopTaskrun => "COOP_TASKRUN|TASKRUN_FLAG",
            RingMode::Plain => "plain",
        })
    }
}

/// The buffer an async op owned while in flight, handed back with its completion.
#[derive(Debug)]
pub enum OpBuf {
    None,
    /// RECV target; its length already includes the received bytes.
    Slot(SlotBuf),
    /// SEND source; the caller resends `data.slice(sent..)` after a short send.
    Bytes(Bytes),
    /// The descriptor of an FSYNC, kept open until its CQE.
    File(Arc<File>),
}

/// One finished async op.
#[derive(Debug)]
pub struct Completion {
    /// The caller's tag given at submission.
    pub tag: u64,
    /// The kernel's result: bytes moved, 0, or a negated errno (`-ETIME` for an expired timeout).
    pub result: i32,
    pub buf: OpBuf,
}

impl Completion {
    /// The result as an `io::Result` of a byte count.
    pub fn io_result(&self) -> io::Result<usize> {
        if self.result < 0 {
            Err(io::Error::from_raw_os_error(-self.result))
        } else {
            Ok(self.result as usize)
        }
    }
}

/// The slab had no room; the op was not submitted and its buffer is returned.
#[derive(Debug)]
pub struct SlabFull(pub OpBuf);

impl std::fmt::Display for SlabFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all {RING_OPS_IN_FLIGHT_MAX} ring op slots are in flight"
        )
    }
}

impl std::error::Error for SlabFull {}

/// What an async op keeps alive until its CQE: the buffer, and the memory the SQE points at.
struct OpEntry {
    tag: u64,
    buf: OpBuf,
    timespec: types::Timespec,
    addr: Option<SockAddr>,
    counter: [u8; 8],
}

/// Where one write of a `write_batch` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchState {
    Pending,
    Done,
    /// Failed with this errno (ECANCELED: an op it was linked after failed).
    Failed(i32),
}

#[derive(Debug, Clone, Copy)]
struct BatchOp {
    /// Bytes written so far (a short write is resubmitted for the rest).
    written: usize,
    state: BatchState,
    /// The CQE of the current submission.
    cqe: Option<i32>,
}

/// Per-ring counters, read by metrics and tests (plain integers: only the owning shard writes).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RingStats {
    pub writes_fixed: u64,
    pub writes_plain: u64,
    pub syncs: u64,
    /// `write_batch` calls: one submission and one wait each for all their writes (more only
    /// for a batch larger than `RING_WRITE_BATCH_MAX` or a short write).
    pub write_batches: u64,
    /// Waits for completions of a `write_batch` (windows and retry rounds).
    pub write_batch_waits: u64,
    /// SQEs queued for the kernel (every op, including blocking file ops and cancels).
    pub submitted: u64,
    /// CQEs reaped.
    pub completed: u64,
    /// Batch writes performed on the shard thread (`inline_writes`).
    pub writes_inline: u64,
    /// Inline writes slower than their size explains, each of which sent the rest of its batch
    /// and the next `INLINE_WRITE_BACKOFF` of writes to the ring.
    pub writes_inline_slow: u64,
}

/// One io_uring with its op slab. Owned by one shard thread; never shared.
pub struct Ring {
    uring: IoUring,
    mode: RingMode,
    slab: Vec<Option<OpEntry>>,
    free: Vec<u32>,
    ready: VecDeque<Completion>,
    sync_result: Option<i32>,
    /// Per-op state of the `write_batch` under way (kept to reuse its allocation).
    batch: Vec<BatchOp>,
    /// Writes of the current `write_batch` window not completed yet.
    batch_outstanding: usize,
    /// The first window of a batch begun and not yet finished.
    batch_begun: Option<std::ops::Range<usize>>,
    /// The ops of a batch begun with `write_batch_begin`, owned until its CQEs are in.
    owned_batch: Vec<OwnedWriteOp>,
    /// Whether batch writes start on this thread (`inline_writes`).
    inline: InlineWrites,
    stats: RingStats,
    fixed: Vec<RegisteredChunk>,
    /// Keeps registered memory mapped for as long as the ring may reference it.
    arena: Option<Arena>,
    /// The bounded wait's TIMEOUT is posted (kernels without EXT_ARG), and its timespec (the
    /// kernel copies it when the op is prepared).
    wake_posted: bool,
    wake_ts: types::Timespec,
    /// The shard whose heartbeat this ring's disk waits keep beating (`disk_wait_step`).
    shard: Option<Arc<ShardStats>>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("mode", &self.mode)
            .field("log_writes", &self.inline.mode())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

/// Ring setup flag sets, best first; `Ring::new` takes the first the kernel accepts.
const SETUP_ATTEMPTS: [(RingMode, SetFlags); 3] = [
    (RingMode::SingleIssuerDeferTaskrun, |b| {
        b.setup_single_issuer().setup_defer_taskrun();
    }),
    (RingMode::CoopTaskrun, |b| {
        b.setup_coop_taskrun().setup_taskrun_flag();
    }),
    (RingMode::Plain, |_| {}),
];

/// Tries every setup flag set on its own (for `kmirror doctor`): which ones this kernel and
/// seccomp policy accept, and the error of those it refuses.
pub fn probe_setup() -> Vec<(RingMode, io::Result<()>)> {
    SETUP_ATTEMPTS
        .iter()
        .map(|(mode, flags)| {
            let mut builder = IoUring::builder();
            builder.setup_cqsize(RING_CQ_ENTRIES);
            flags(&mut builder);
            (*mode, builder.build(RING_SQ_ENTRIES).map(drop))
        })
        .collect()
}

impl Ring {
    /// Builds the ring with the best flags the kernel accepts. Call on the owning thread.
    pub fn new() -> io::Result<Ring> {
        let mut last_err = None;
        for (mode, flags) in SETUP_ATTEMPTS {
            let mut builder = IoUring::builder();
            builder.setup_cqsize(RING_CQ_ENTRIES);
            flags(&mut builder);
            match builder.build(RING_SQ_ENTRIES) {
                Ok(uring) => return Ok(Ring::with(uring, mode)),
                // EINVAL: flag unknown to this kernel; try the next set.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("io_uring setup failed")))
    }

    fn with(uring: IoUring, mode: RingMode) -> Ring {
        let mut slab = Vec::with_capacity(RING_OPS_IN_FLIGHT_MAX);
        slab.resize_with(RING_OPS_IN_FLIGHT_MAX, || None);
        Ring {
            uring,
            mode,
            slab,
            free: (0..RING_OPS_IN_FLIGHT_MAX as u32).rev().collect(),
            ready: VecDeque::with_capacity(RING_OPS_IN_FLIGHT_MAX),
            sync_result: None,
            batch: Vec::new(),
            batch_outstanding: 0,
            batch_begun: None,
            owned_batch: Vec::new(),
            inline: InlineWrites::new(LogWrites::IoWorker),
            stats: RingStats::default(),
            fixed: Vec::new(),
            arena: None,
            wake_posted: false,
            wake_ts: types::Timespec::new(),
            shard: None,
        }
    }

    /// How batch writes are performed from now on (`runtime.log_writes`). A new ring uses
    /// `IoWorker`; the shard sets its configured mode.
    pub fn set_log_writes(&mut self, mode: LogWrites) {
        self.inline = InlineWrites::new(mode);
    }

    /// For tests: inline writes regardless of the host's dirty memory, and every one of them
    /// slow (`slow`) or none (else: a loaded test host must not pick the path either).
    #[cfg(test)]
    pub(crate) fn inline_writes_for_tests(&mut self, slow: bool) {
        let inline = InlineWrites::new(self.inline.mode()).ignoring_dirty_memory();
        self.inline = if slow {
            inline.every_write_slow()
        } else {
            inline.no_write_slow()
        };
    }

    /// From now on this ring's disk waits beat `stats`' heartbeat and flag themselves in it
    /// (`disk_wait_step`): a shard blocked on a slow disk is alive, up to a bound.
    pub fn beat_while_on_disk(&mut self, stats: Arc<ShardStats>) {
        self.shard = Some(stats);
    }

    /// One step of a wait on the disk that began at `since`: submits, waits at most a
    /// heartbeat period for a new completion, reaps, and beats the shard's heartbeat while the
    /// wait is younger than `SHARD_DISK_WAIT_MAX_MS` (past it the health check fails the shard,
    /// naming the disk). `disk_wait_end` clears the flag when the caller's wait is over.
    pub fn disk_wait_step(&mut self, since: Instant) {
        self.disk_wait_begin();
        self.submit_and_wait_new_for(Duration::from_millis(SHARD_HEARTBEAT_MS));
        if let Some(s) = &self.shard {
            if since.elapsed() < Duration::from_millis(SHARD_DISK_WAIT_MAX_MS) {
                s.heartbeat().beat();
            }
        }
    }

    /// Flags the shard's heartbeat as waiting on the disk, so a wait that stops the loop is
    /// blamed on the disk; `disk_wait_end` clears it.
    fn disk_wait_begin(&self) {
        if let Some(s) = &self.shard {
            s.heartbeat().on_disk(true);
        }
    }

    /// The wait `disk_wait_step` (or an inline write) was part of is over.
    pub fn disk_wait_end(&mut self) {
        if let Some(s) = &self.shard {
            s.heartbeat().on_disk(false);
        }
    }

    pub fn mode(&self) -> RingMode {
        self.mode
    }

    pub fn stats(&self) -> RingStats {
        self.stats
    }

    /// Async ops submitted and not yet reaped.
    pub fn in_flight(&self) -> usize {
        RING_OPS_IN_FLIGHT_MAX - self.free.len()
    }

    pub fn has_room(&self) -> bool {
        !self.free.is_empty()
    }

    /// Registers the arena's memory as fixed buffers. Once, at start, before any op (registration
    /// quiesces the ring on older kernels).
    pub fn register_arena(&mut self, arena: &Arena) -> io::Result<()> {
        assert!(self.arena.is_none(), "an arena is registered once per ring");
        let chunks = arena.chunks();
        let iovecs: Vec<libc::iovec> = chunks
            .iter()
            .map(|c| libc::iovec {
                iov_base: c.addr as *mut libc::c_void,
                iov_len: c.len,
            })
            .collect();
        // SAFETY: every iovec lies inside the arena's live mapping, and `self.arena` keeps that
        // mapping alive for as long as the ring exists, so the kernel never references freed
        // memory through these registrations.
        unsafe { self.uring.submitter().register_buffers(&iovecs)? };
        self.fixed = chunks;
        self.arena = Some(arena.clone());
        Ok(())
    }

    /// The registered buffer index covering all of `data`, if any (pointer range check).
    pub fn fixed_index(&self, data: &[u8]) -> Option<u16> {
        let start = data.as_ptr() as usize;
        let end = start.checked_add(data.len())?;
        self.fixed
            .iter()
            .find(|c| start >= c.addr && end <= c.addr + c.len)
            .map(|c| c.index)
    }

    fn alloc(&mut self, tag: u64, buf: OpBuf) -> Result<u32, SlabFull> {
        self.alloc_within(tag, buf, RING_OPS_RESERVED)
    }

    /// `alloc` that may take the last `RING_OPS_RESERVED` entries: for the shard loop's own
    /// ops (the wakeup read, the heartbeat), which must never find the slab full because the
    /// handler's ops took the entry they just freed.
    fn alloc_reserved(&mut self, tag: u64, buf: OpBuf) -> Result<u32, SlabFull> {
        self.alloc_within(tag, buf, 0)
    }

    fn alloc_within(&mut self, tag: u64, buf: OpBuf, keep: usize) -> Result<u32, SlabFull> {
        if self.free.len() <= keep {
            return Err(SlabFull(buf));
        }
        let Some(key) = self.free.pop() else {
            return Err(SlabFull(buf));
        };
        let slot = &mut self.slab[key as usize];
        assert!(slot.is_none(), "free list pointed at a busy slab entry");
        *slot = Some(OpEntry {
            tag,
            buf,
            timespec: types::Timespec::new(),
            addr: None,
            counter: [0; 8],
        });
        Ok(key)
    }

    fn entry_mut(&mut self, key: u32) -> &mut OpEntry {
        self.slab[key as usize]
            .as_mut()
            .expect("entry just allocated")
    }

    fn push(&mut self, sqe: squeue::Entry) {
        // SAFETY: every pointer in `sqe` targets memory that outlives the op: slab entries (stable,
        // the slab never reallocates) and their owned buffers for async ops, or a borrow held by
        // `run_sync` until the CQE arrives.
        self.stats.submitted += 1;
        if unsafe { self.uring.submission().push(&sqe) }.is_ok() {
            return;
        }
        // SQ full: flush it to the kernel and retry; the SQ has room for every slab entry plus the
        // sync and cancel ops, so the retry cannot fail.
        self.submit_retrying(0);
        // SAFETY: as above.
        let pushed = unsafe { self.uring.submission().push(&sqe) };
        assert!(pushed.is_ok(), "SQ still full after submit");
    }

    /// RECV into the slot's spare room, at most `max` bytes.
    pub fn recv(&mut self, tag: u64, fd: RawFd, slot: SlotBuf, max: usize) -> Result<(), SlabFull> {
        let len = max.min(slot.remaining()) as u32;
        let key = self.alloc(tag, OpBuf::Slot(slot))?;
        let OpBuf::Slot(slot) = &mut self.entry_mut(key).buf else {
            unreachable!()
        };
        let ptr = slot.spare_ptr();
        let sqe = opcode::Recv::new(types::Fd(fd), ptr, len)
            .build()
            .user_data(key as u64);
        self.push(sqe);
        Ok(())
    }

    /// SEND of `data` (may complete short; the caller resends the rest).
    pub fn send(&mut self, tag: u64, fd: RawFd, data: Bytes) -> Result<(), SlabFull> {
        let (ptr, len) = (data.as_ptr(), data.len() as u32);
        let key = self.alloc(tag, OpBuf::Bytes(data))?;
        let sqe = opcode::Send::new(types::Fd(fd), ptr, len)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(key as u64);
        self.push(sqe);
        Ok(())
    }

    /// CONNECT of a socket (non-blocking connect handled by the kernel).
    pub fn connect(&mut self, tag: u64, fd: RawFd, addr: SockAddr) -> Result<(), SlabFull> {
        let key = self.alloc(tag, OpBuf::None)?;
        let entry = self.entry_mut(key);
        let addr = entry.addr.insert(addr);
        let sqe = opcode::Connect::new(types::Fd(fd), addr.as_ptr().cast(), addr.len())
            .build()
            .user_data(key as u64);
        self.push(sqe);
        Ok(())
    }

    /// FSYNC with DATASYNC (fdatasync) of `file`, completed like any async op: the shard goes
    /// on while the disk writes back (a rolled segment's gigabyte took seconds).
    pub fn fdatasync_async(&mut self, tag: u64, file: Arc<File>) -> Result<(), SlabFull> {
        let fd = file.as_raw_fd();
        let key = self.alloc(tag, OpBuf::File(file))?;
        let sqe = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(key as u64);
        self.stats.syncs += 1;
        self.push(sqe);
        Ok(())
    }

    /// A relative TIMEOUT; completes with `-ETIME` when it expires.
    pub fn timeout(&mut self, tag: u64, after: Duration) -> Result<(), SlabFull> {
        let key = self.alloc(tag, OpBuf::None)?;
        self.push_timeout(key, after);
        Ok(())
    }

    /// `timeout` from the reserved entries (the shard loop's heartbeat).
    pub fn timeout_reserved(&mut self, tag: u64, after: Duration) -> Result<(), SlabFull> {
        let key = self.alloc_reserved(tag, OpBuf::None)?;
        self.push_timeout(key, after);
        Ok(())
    }

    fn push_timeout(&mut self, key: u32, after: Duration) {
        let entry = self.entry_mut(key);
        entry.timespec = types::Timespec::from(after);
        let ts: *const types::Timespec = &entry.timespec;
        let sqe = opcode::Timeout::new(ts).build().user_data(key as u64);
        self.push(sqe);
    }

    /// READ of an eventfd's 8-byte counter (the shard's wakeup).
    pub fn read_waker(&mut self, tag: u64, waker: &Waker) -> Result<(), SlabFull> {
        let key = self.alloc_reserved(tag, OpBuf::None)?;
        let ptr = self.entry_mut(key).counter.as_mut_ptr();
        let sqe = opcode::Read::new(types::Fd(waker.file.as_raw_fd()), ptr, 8)
            .build()
            .user_data(key as u64);
        self.push(sqe);
        Ok(())
    }

    /// Asks the kernel to cancel every async op; each then completes (usually `-ECANCELED`).
    pub fn cancel_all(&mut self) {
        let sqe = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_KEY);
        self.push(sqe);
    }

    fn submit_retrying(&mut self, want: usize) {
        loop {
            match self.uring.submit_and_wait(want) {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY: completions are backed up; reap some, then retry.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    self.reap();
                    if want > 0 && (self.sync_result.is_some() || !self.ready.is_empty()) {
                        return;
                    }
                }
                Err(e) => {
                    // The kernel may still reference borrowed buffers of an op in flight, so
                    // unwinding past them is not an option; a ring that cannot be entered is
                    // unusable anyway.
                    eprintln!("kmirror: io_uring_enter failed fatally: {e}");
                    std::process::abort();
                }
            }
        }
    }

    fn reap(&mut self) {
        loop {
            let next = self.uring.completion().next();
            let Some(cqe) = next else { break };
            self.complete(cqe);
        }
    }

    fn complete(&mut self, cqe: cqueue::Entry) {
        self.stats.completed += 1;
        let key = cqe.user_data();
        let result = cqe.result();
        match key {
            SYNC_KEY => self.sync_result = Some(result),
            WAKE_KEY => self.wake_posted = false,
            CANCEL_KEY => {}
            k if k & BATCH_BIT != 0 => {
                let op = &mut self.batch[(k & !BATCH_BIT) as usize];
                assert!(op.cqe.is_none(), "two CQEs for one batch write");
                op.cqe = Some(result);
                self.batch_outstanding -= 1;
            }
            _ => {
                let entry = self.slab[key as usize]
                    .take()
                    .expect("CQE for a free slab entry");
                self.free.push(key as u32);
                let mut buf = entry.buf;
                if let OpBuf::Slot(slot) = &mut buf {
                    if result > 0 {
                        slot.advance(result as usize);
                    }
                }
                self.ready.push_back(Completion {
                    tag: entry.tag,
                    result,
                    buf,
                });
            }
        }
    }

    /// Submits queued SQEs and, if nothing is ready yet, waits for at least one completion.
    pub fn submit_and_wait(&mut self) {
        let want = usize::from(self.ready.is_empty());
        self.submit_retrying(want);
        self.reap();
    }

    /// Submits queued SQEs without waiting.
    pub fn submit(&mut self) {
        self.submit_retrying(0);
        self.reap();
    }

    pub fn pop_completion(&mut self) -> Option<Completion> {
        self.ready.pop_front()
    }

    /// Submits queued SQEs and waits up to `limit` for at least one new completion from the
    /// kernel, even when some are ready already (for a caller waiting on particular ops,
    /// `take_ready`, which loops on what it waits for).
    pub fn submit_and_wait_new_for(&mut self, limit: Duration) {
        if !self.uring.params().is_feature_ext_arg() {
            // No timeout argument to io_uring_enter: a TIMEOUT op ends the wait instead.
            if !self.wake_posted {
                self.wake_ts = types::Timespec::from(limit);
                let ts: *const types::Timespec = &self.wake_ts;
                let sqe = opcode::Timeout::new(ts).build().user_data(WAKE_KEY);
                self.push(sqe);
                self.wake_posted = true;
            }
            self.submit_retrying(1);
            self.reap();
            return;
        }
        let ts = types::Timespec::from(limit);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.uring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            // ETIME: nothing completed within `limit`; EINTR/EBUSY: the caller loops.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) => {}
            Err(e) => {
                // As in `submit_retrying`: a ring that cannot be entered is unusable.
                eprintln!("kmirror: io_uring_enter failed fatally: {e}");
                std::process::abort();
            }
        }
        self.reap();
    }

    /// Takes the ready completions `want` picks, in order, leaving the rest ready in theirs.
    pub fn take_ready(&mut self, mut want: impl FnMut(&Completion) -> bool) -> Vec<Completion> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.ready.len());
        for c in self.ready.drain(..) {
            if want(&c) {
                taken.push(c);
            } else {
                kept.push_back(c);
            }
        }
        self.ready = kept;
        taken
    }

    /// Runs one op that borrows memory and waits for it; async completions that arrive meanwhile
    /// are queued for `pop_completion`.
    fn run_sync(&mut self, sqe: squeue::Entry) -> i32 {
        assert!(self.sync_result.is_none(), "one blocking op at a time");
        self.push(sqe.user_data(SYNC_KEY));
        let since = Instant::now();
        loop {
            self.disk_wait_step(since);
            if let Some(r) = self.sync_result.take() {
                self.disk_wait_end();
                return r;
            }
        }
    }

    /// One positional write (may be short): WRITE_FIXED when `data` lies in the registered
    /// arena, plain WRITE otherwise.
    pub fn write_at(&mut self, file: &File, pos: u64, data: &[u8]) -> io::Result<usize> {
        let sqe = self.write_sqe(file, pos, data);
        // `data` stays borrowed until run_sync returns, which is after the CQE.
        let r = self.run_sync(sqe);
        if r < 0 {
            Err(io::Error::from_raw_os_error(-r))
        } else {
            Ok(r as usize)
        }
    }

    /// Performs every write of `ops` with one submission and one wait (per window of
    /// `RING_WRITE_BATCH_MAX` writes), each a WRITE_FIXED when its bytes lie in the registered
    /// arena; an op with `after_previous` is linked (IOSQE_IO_LINK) to the one before it, so the
    /// kernel starts it only once that one completed whole, and cancels it if that one failed.
    /// Short writes are resubmitted for their rest (with the ops linked after them) in another
    /// round. One result per op lands in `results`. Async completions that arrive meanwhile are
    /// queued for `pop_completion`.
    pub fn write_batch(&mut self, ops: &[WriteOp<'_>], results: &mut Vec<io::Result<()>>) {
        // The same `ops` are finished at once, before this borrow ends.
        self.begin_window(ops);
        self.finish_windows(ops, results);
    }

    /// `write_batch` without the wait: the batch's first window is submitted and the call
    /// returns, so the caller can do other work (send its next fetch) while the kernel writes.
    /// The ring owns the ops (their bytes and descriptors) until `write_batch_finish`, so the
    /// memory the kernel reads stays alive however long that takes.
    pub fn write_batch_begin(&mut self, ops: Vec<OwnedWriteOp>) {
        {
            let borrowed: Vec<WriteOp<'_>> = ops.iter().map(OwnedWriteOp::as_op).collect();
            self.begin_window(&borrowed);
        }
        self.owned_batch = ops;
    }

    /// Waits for the batch `write_batch_begin` submitted (resubmitting short writes and the
    /// windows after the first) and leaves one result per op in `results`.
    pub fn write_batch_finish(&mut self, results: &mut Vec<io::Result<()>>) {
        let ops = std::mem::take(&mut self.owned_batch);
        {
            let borrowed: Vec<WriteOp<'_>> = ops.iter().map(OwnedWriteOp::as_op).collect();
            self.finish_windows(&borrowed, results);
        }
        // Every CQE of the batch is in: the kernel no longer reads `ops`.
        drop(ops);
    }

    /// Whether a begun batch's submitted writes have all completed, so `write_batch_finish`
    /// waits for nothing (unless a short write or a later window must still be submitted).
    pub fn write_batch_settled(&self) -> bool {
        self.batch_begun.is_some() && self.batch_outstanding == 0
    }

    /// The first half of a batch: its first window is submitted, nothing is waited for.
    /// Completions that arrive before `finish_windows` are kept for it. The kernel reads the
    /// ops' memory until their CQEs, so the callers keep `ops` alive and unchanged until
    /// `finish_windows` with the same ops returned (`write_batch` in one borrow,
    /// `write_batch_begin` by owning them).
    fn begin_window(&mut self, ops: &[WriteOp<'_>]) {
        assert!(
            self.batch.is_empty() && self.batch_begun.is_none(),
            "one write batch at a time"
        );
        self.stats.write_batches += 1;
        self.batch.extend(ops.iter().map(|op| BatchOp {
            written: 0,
            state: if op.data.is_empty() {
                BatchState::Done
            } else {
                BatchState::Pending
            },
            cqe: None,
        }));
        self.write_inline_while_fast(ops);
        let end = self.submit_window(ops, 0);
        if self.batch_outstanding > 0 {
            self.submit_retrying(0);
        }
        self.batch_begun = Some(0..end);
    }

    /// The second half of a batch: waits for the begun window's writes, resubmits short ones
    /// and the windows after the first, and leaves one result per op in `results`. `ops` must
    /// equal those the batch began with.
    fn finish_windows(&mut self, ops: &[WriteOp<'_>], results: &mut Vec<io::Result<()>>) {
        let begun = self
            .batch_begun
            .take()
            .expect("a write batch finished that was not begun");
        assert_eq!(
            self.batch.len(),
            ops.len(),
            "finished with other ops than begun"
        );
        let mut window = Some(begun);
        while window.is_some() || self.batch.iter().any(|b| b.state == BatchState::Pending) {
            let mut i = 0;
            while i < ops.len() || window.is_some() {
                let range = match window.take() {
                    Some(first) => first,
                    None => {
                        let start = i;
                        start..self.submit_window(ops, start)
                    }
                };
                i = range.end;
                // `ops` stays borrowed until every CQE of the window is in: only then may the
                // kernel no longer read the memory the SQEs point at.
                if self.batch_outstanding > 0 {
                    let since = Instant::now();
                    while self.batch_outstanding > 0 {
                        self.stats.write_batch_waits += 1;
                        self.disk_wait_step(since);
                    }
                    self.disk_wait_end();
                }
                self.settle_window(ops, range);
            }
        }
        results.clear();
        results.extend(self.batch.drain(..).map(|b| match b.state {
            BatchState::Done => Ok(()),
            BatchState::Failed(errno) => Err(io::Error::from_raw_os_error(errno)),
            BatchState::Pending => unreachable!("the loop above ends with no op pending"),
        }));
    }

    /// Performs the batch's writes on this thread, in order, while the policy wants them here
    /// and they stay fast (`inline_writes`); what is left stays pending for the ring. A failed
    /// write cancels the rest of its link chain with ECANCELED, as the kernel does for linked
    /// SQEs, so both paths report a batch alike.
    fn write_inline_while_fast(&mut self, ops: &[WriteOp<'_>]) {
        if !self.inline.wanted(Instant::now()) {
            return;
        }
        // A write that hangs (a device that needs stable pages, stuck in writeback) stops the
        // shard's heartbeat; flagged, the health check names the disk, as for a ring wait.
        self.disk_wait_begin();
        self.write_inline_ops(ops);
        self.disk_wait_end();
    }

    /// The writes of `write_inline_while_fast`, until one is slow.
    fn write_inline_ops(&mut self, ops: &[WriteOp<'_>]) {
        let mut chain_failed = false;
        for (k, op) in ops.iter().enumerate() {
            if !op.after_previous {
                chain_failed = false;
            }
            if self.batch[k].state != BatchState::Pending {
                continue;
            }
            if chain_failed {
                self.batch[k].state = BatchState::Failed(libc::ECANCELED);
                continue;
            }
            self.stats.writes_inline += 1;
            match self.inline.write(op.file, op.pos, op.data) {
                Inline::Written => self.batch[k].state = BatchState::Done,
                Inline::Failed(errno) => {
                    self.batch[k].state = BatchState::Failed(errno);
                    chain_failed = true;
                }
                Inline::WrittenSlowly => {
                    self.batch[k].state = BatchState::Done;
                    self.stats.writes_inline_slow += 1;
                    return;
                }
            }
        }
    }

    /// Queues the pending ops from `start` on, whole link chains only, until the window is
    /// full; returns where the window ends.
    fn submit_window(&mut self, ops: &[WriteOp<'_>], start: usize) -> usize {
        let pending = |batch: &[BatchOp], k: usize| batch[k].state == BatchState::Pending;
        let mut queued = 0;
        let mut i = start;
        while i < ops.len() {
            if !pending(&self.batch, i) {
                i += 1;
                continue;
            }
            let mut end = i + 1;
            while end < ops.len() && ops[end].after_previous && pending(&self.batch, end) {
                end += 1;
            }
            let chain = end - i;
            if queued > 0 && queued + chain > RING_WRITE_BATCH_MAX {
                break;
            }
            // A chain must reach the kernel in one submission, or its link would be cut.
            let room = {
                let sq = self.uring.submission();
                sq.capacity() - sq.len()
            };
            if room < chain {
                self.submit_retrying(0);
            }
            for (k, op) in ops.iter().enumerate().take(end).skip(i) {
                let sqe = self.batch_write_sqe(op, k, k + 1 < end);
                self.push(sqe);
            }
            self.batch_outstanding += chain;
            queued += chain;
            i = end;
        }
        i
    }

    fn batch_write_sqe(&mut self, op: &WriteOp<'_>, k: usize, link: bool) -> squeue::Entry {
        let written = self.batch[k].written;
        let sqe = self
            .write_sqe(op.file, op.pos + written as u64, &op.data[written..])
            .user_data(BATCH_BIT | k as u64);
        if link {
            sqe.flags(squeue::Flags::IO_LINK)
        } else {
            sqe
        }
    }

    /// Applies the completions of the window `range`, in order (an op canceled because the op
    /// it is linked after wrote short is pending again, behind it).
    fn settle_window(&mut self, ops: &[WriteOp<'_>], range: std::ops::Range<usize>) {
        for k in range {
            let Some(r) = self.batch[k].cqe.take() else {
                continue;
            };
            let previous_pending =
                k > 0 && ops[k].after_previous && self.batch[k - 1].state == BatchState::Pending;
            let op = &mut self.batch[k];
            op.state = match r {
                0 => BatchState::Failed(libc::EIO),
                n if n > 0 => {
                    op.written += n as usize;
                    if op.written == ops[k].data.len() {
                        BatchState::Done
                    } else {
                        BatchState::Pending
                    }
                }
                n if n == -libc::EINTR || n == -libc::EAGAIN => BatchState::Pending,
                n if n == -libc::ECANCELED && previous_pending => BatchState::Pending,
                n => BatchState::Failed(-n),
            };
        }
    }

    /// A positional write of `data` (at most 4 GiB of it): WRITE_FIXED when it lies in the
    /// registered arena, plain WRITE otherwise. The caller keeps `data` alive until the CQE.
    fn write_sqe(&mut self, file: &File, pos: u64, data: &[u8]) -> squeue::Entry {
        let fd = types::Fd(file.as_raw_fd());
        let len = data.len().min(u32::MAX as usize) as u32;
        match self.fixed_index(data) {
            Some(index) => {
                self.stats.writes_fixed += 1;
                opcode::WriteFixed::new(fd, data.as_ptr(), len, index)
                    .offset(pos)
                    .build()
            }
            None => {
                self.stats.writes_plain += 1;
                opcode::Write::new(fd, data.as_ptr(), len)
                    .offset(pos)
                    .build()
            }
        }
    }

    /// FSYNC with DATASYNC (fdatasync).
    pub fn fdatasync(&mut self, file: &File) -> io::Result<()> {
        let sqe = opcode::Fsync::new(types::Fd(file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        self.stats.syncs += 1;
        let r = self.run_sync(sqe);
        if r < 0 {
            Err(io::Error::from_raw_os_error(-r))
        } else {
            Ok(())
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Buffers owned by in-flight ops must not be released while the kernel may still write
        // into them: cancel everything and wait for every CQE before the slab is dropped.
        if self.in_flight() > 0 {
            self.cancel_all();
            while self.in_flight() > 0 {
                self.submit_retrying(1);
                self.reap();
            }
        }
        // A begun write batch's memory is owned here: wait for its writes too.
        while self.batch_outstanding > 0 {
            self.submit_retrying(1);
            self.reap();
        }
        self.ready.clear();
    }
}

/// Wakes a shard blocked in `io_uring_enter` from another thread: an eventfd the shard keeps a
/// READ posted on. Cloneable and `Send`; the control thread holds one per shard.
#[derive(Debug, Clone)]
pub struct Waker {
    file: Arc<File>,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd has no memory arguments; the returned descriptor is checked and then
        // owned exclusively by the OwnedFd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor that nothing else owns.
        Ok(Waker {
            file: Arc::new(File::from(unsafe { OwnedFd::from_raw_fd(fd) })),
        })
    }

    /// Adds 1 to the counter, completing the shard's posted READ.
    pub fn wake(&self) -> io::Result<()> {
        // eventfd's counter is a host-endian u64 by kernel ABI.
        #[allow(clippy::host_endian_bytes)]
        let one = 1u64.to_ne_bytes();
        (&*self.file).write_all(&one)
    }
}
