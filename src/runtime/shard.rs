//! The pinned shard thread: owns its ring, its arena and a `ShardHandler` (the data path), and
//! runs to completion: drain the mailbox, submit, wait, dispatch completions, repeat. Each turn
//! beats the shard's heartbeat (`runtime::health`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::arena::Arena;
use super::mailbox::{ControlSender, MailboxFull};
use super::ring::{Completion, Ring, RingMode, Waker};
use super::stats::{LatencyRecorder, ShardStats};
use crate::ids::ShardId;
use crate::limits::SHARD_HEARTBEAT_MS;

/// Tag of the shard's own eventfd READ.
pub const WAKER_TAG: u64 = u64::MAX;
/// Tag of the shard's heartbeat TIMEOUT; handler tags must be below it.
pub const HEARTBEAT_TAG: u64 = u64::MAX - 1;

/// What a shard runs. Created on the shard thread by the runtime's factory, so it may hold
/// `!Send` state; it sees the ring and arena only through `ShardCx`.
pub trait ShardHandler {
    /// Control → shard message.
    type Msg: Send + 'static;
    /// Shard → control event.
    type Event: Send + 'static;

    /// Once, after the ring and arena are ready.
    fn start(&mut self, cx: &mut ShardCx<'_, Self::Event>);
    fn on_message(&mut self, cx: &mut ShardCx<'_, Self::Event>, msg: Self::Msg);
    fn on_completion(&mut self, cx: &mut ShardCx<'_, Self::Event>, completion: Completion);
    /// After each turn's completions, before the shard waits for the next: work a handler left
    /// in flight during the turn (a response's log writes) may be finished here once it
    /// completed, without waiting for it.
    fn end_of_turn(&mut self, _cx: &mut ShardCx<'_, Self::Event>) {}
    /// Once, on clean stop, before in-flight ops are cancelled: close files and sockets here.
    fn stop(&mut self, cx: &mut ShardCx<'_, Self::Event>);
}

/// What a handler may use while it runs on its shard.
pub struct ShardCx<'a, E> {
    pub shard: ShardId,
    pub ring: &'a mut Ring,
    pub arena: &'a Arena,
    /// Counters the control side reads; the shard is their only writer.
    pub stats: &'a ShardStats,
    /// This shard's latency histograms (handed to the control side once per interval).
    pub latency: &'a mut LatencyRecorder,
    events: &'a mut ControlSender<E>,
}

impl<E> ShardCx<'_, E> {
    /// Sends an event to the control thread.
    pub fn emit(&mut self, event: E) -> Result<(), MailboxFull<E>> {
        self.events.send(event)
    }
}

/// Facts about a started shard, for tests and `kmirror doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    pub shard: ShardId,
    /// The CPU the thread is pinned to.
    pub core: usize,
    /// Kernel thread id (for /proc/<pid>/task/<tid>).
    pub tid: u32,
    pub ring_mode: RingMode,
    pub arena_bytes: usize,
}

/// Everything a shard thread is started with.
pub(crate) struct ShardSeed<H: ShardHandler> {
    pub shard: ShardId,
    pub core: core_affinity::CoreId,
    pub slot_bytes: usize,
    pub slots: usize,
    pub log_writes: super::inline_writes::LogWrites,
    pub inbox: rtrb::Consumer<H::Msg>,
    pub events: ControlSender<H::Event>,
    pub waker: Waker,
    pub stop: Arc<AtomicBool>,
    pub stats: Arc<ShardStats>,
}

/// Why a shard could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardStartError {
    #[error("shard {shard}: cannot pin to core {core}")]
    Pin { shard: u16, core: usize },
    #[error("shard {shard}: io_uring setup failed: {source}")]
    Ring { shard: u16, source: std::io::Error },
    #[error("shard {shard}: {source}")]
    Arena {
        shard: u16,
        source: super::arena::ArenaError,
    },
    #[error(
        "shard {shard}: registering the {bytes} B arena failed: {source} (ENOMEM usually means \
         RLIMIT_MEMLOCK is too low: raise LimitMEMLOCK= / `ulimit -l` or grant CAP_IPC_LOCK)"
    )]
    Register {
        shard: u16,
        bytes: usize,
        source: std::io::Error,
    },
    #[error("shard {shard}: cannot read own thread id: {source}")]
    Tid { shard: u16, source: std::io::Error },
}

fn current_tid() -> std::io::Result<u32> {
    // "/proc/thread-self" links to "<pid>/task/<tid>"; reading it needs no unsafe gettid call.
    let link = std::fs::read_link("/proc/thread-self")?;
    link.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected /proc/thread-self link"))
}

/// Sets up the pinned thread's ring and arena; the caller reports the result to `start`.
fn prepare<H: ShardHandler>(
    seed: &ShardSeed<H>,
) -> Result<(Ring, Arena, ShardInfo), ShardStartError> {
    let shard = seed.shard.0;
    if !core_affinity::set_for_current(seed.core) {
        return Err(ShardStartError::Pin {
            shard,
            core: seed.core.id,
        });
    }
    // Ring and arena are created after pinning: SINGLE_ISSUER binds the ring to this thread, and
    // the arena's pages are first touched here, on the local NUMA node.
    let mut ring = Ring::new().map_err(|source| ShardStartError::Ring { shard, source })?;
    ring.beat_while_on_disk(Arc::clone(&seed.stats));
    ring.set_log_writes(seed.log_writes);
    let arena = Arena::new(seed.slot_bytes, seed.slots)
        .map_err(|source| ShardStartError::Arena { shard, source })?;
    ring.register_arena(&arena)
        .map_err(|source| ShardStartError::Register {
            shard,
            bytes: arena.bytes(),
            source,
        })?;
    let tid = current_tid().map_err(|source| ShardStartError::Tid { shard, source })?;
    let info = ShardInfo {
        shard: seed.shard,
        core: seed.core.id,
        tid,
        ring_mode: ring.mode(),
        arena_bytes: arena.bytes(),
    };
    Ok((ring, arena, info))
}

/// Ring and arena gauges and the latency interval, once per loop iteration (a few relaxed
/// stores and one clock read).
fn publish<E>(cx: &mut ShardCx<'_, E>) {
    let ring = cx.ring.stats();
    let slots = cx.arena.slots() as u64;
    let in_use = slots - cx.arena.free_slots() as u64;
    cx.stats
        .publish_runtime(ring.submitted, ring.completed, in_use, slots);
    cx.stats
        .publish_inline_writes(ring.writes_inline, ring.writes_inline_slow);
    cx.latency.maybe_rotate(cx.stats, std::time::Instant::now());
}

/// The shard thread body. `ready` receives the start result exactly once.
///
/// The loop runs under `catch_unwind`: a panic in the handler is recorded in the shard's
/// heartbeat (the control side fails its partitions and stops the process), and the handler
/// and ring are torn down here, in that order, before the arena whose registered buffers the
/// kernel may still be writing into.
pub(crate) fn run<H: ShardHandler>(
    mut seed: ShardSeed<H>,
    make: &(dyn Fn(ShardId) -> H + Send + Sync),
    ready: std::sync::mpsc::Sender<Result<ShardInfo, ShardStartError>>,
) {
    let (mut ring, arena) = match prepare(&seed) {
        Ok((ring, arena, info)) => {
            let _ = ready.send(Ok(info));
            (ring, arena)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let stats = Arc::clone(&seed.stats);
    let mut latency = LatencyRecorder::new();
    let mut handler: Option<H> = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let handler = handler.insert(make(seed.shard));
        let mut cx = ShardCx {
            shard: seed.shard,
            ring: &mut ring,
            arena: &arena,
            stats: &stats,
            latency: &mut latency,
            events: &mut seed.events,
        };
        turn_loop(handler, &mut cx, &mut seed.inbox, &seed.waker, &seed.stop);
        handler.stop(&mut cx);
    }));
    match outcome {
        Ok(()) => {
            drop(handler);
            latency.finish(&stats);
            stats.heartbeat().stopped();
        }
        Err(payload) => {
            // Its logs are dropped unclosed: their owner is gone, and the next start recovers
            // them (no clean-shutdown marker can be written without them).
            drop(handler);
            stats
                .heartbeat()
                .panicked(super::health::panic_message(&*payload));
        }
    }
    // Dropping the ring cancels and reaps every op still in flight before the arena can go.
    drop(ring);
    drop(arena);
}

/// Drain the mailbox, submit, wait, dispatch completions, repeat, until asked to stop. Every
/// turn beats the heartbeat; a TIMEOUT kept posted every `SHARD_HEARTBEAT_MS` makes an idle
/// shard turn too, so a shard that stops turning is known to be stuck, not idle.
fn turn_loop<H: ShardHandler>(
    handler: &mut H,
    cx: &mut ShardCx<'_, H::Event>,
    inbox: &mut rtrb::Consumer<H::Msg>,
    waker: &Waker,
    stop: &AtomicBool,
) {
    let beat = Duration::from_millis(SHARD_HEARTBEAT_MS);
    let fault = super::test_hooks::ShardFault::armed(cx.shard);
    cx.ring
        .read_waker(WAKER_TAG, waker)
        .unwrap_or_else(|_| unreachable!("empty slab at start"));
    // Posted again after each expiry; if the handler filled the op slab meanwhile it is
    // retried every turn (a shard that busy is turning anyway).
    let mut beat_posted = false;
    handler.start(cx);
    loop {
        cx.stats.heartbeat().beat();
        cx.events.flush();
        if !beat_posted {
            beat_posted = cx.ring.timeout_reserved(HEARTBEAT_TAG, beat).is_ok();
        }
        if let Some(f) = &fault {
            f.fire_if_due(cx.shard);
        }
        while let Ok(msg) = inbox.pop() {
            // A long burst of messages (thousands of partitions handed over) is progress too.
            cx.stats.heartbeat().beat();
            handler.on_message(cx, msg);
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
        cx.ring.submit_and_wait();
        while let Some(c) = cx.ring.pop_completion() {
            if c.tag == WAKER_TAG {
                // The READ consumed the counter; post it again so the next wake is seen.
                // The slot it used was just freed, so the slab has room.
                cx.ring
                    .read_waker(WAKER_TAG, waker)
                    .unwrap_or_else(|_| unreachable!("slab entry just freed"));
            } else if c.tag == HEARTBEAT_TAG {
                beat_posted = cx.ring.timeout_reserved(HEARTBEAT_TAG, beat).is_ok();
                if let Some(f) = &fault {
                    f.fire_if_due(cx.shard);
                }
            } else {
                handler.on_completion(cx, c);
            }
        }
        handler.end_of_turn(cx);
        publish(cx);
    }
}
