//! Starting and stopping the shard threads: core selection from the allowed CPU set, the memlock
//! check, one mailbox pair per shard. `Runtime` is owned by the control thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::inline_writes::LogWrites;
use super::mailbox::{ControlSender, MailboxFull, ShardSender};
use super::memlock::{self, MemlockError};
use super::ring::Waker;
use super::shard::{self, ShardHandler, ShardInfo, ShardSeed, ShardStartError};
use super::stats::ShardStats;
use crate::ids::ShardId;
use crate::limits::{
    MAILBOX_TO_CONTROL_CAPACITY, MAILBOX_TO_SHARD_CAPACITY, SHARDS_MAX, SHARD_JOIN_WAIT_MS,
};

/// How many shards, where, and how big their arenas are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    pub shards: usize,
    /// CPUs to pin shards to, one per shard; `None` takes the first `shards` allowed CPUs.
    pub cores: Option<Vec<usize>>,
    pub arena_slot_bytes: usize,
    pub arena_slots: usize,
    /// Where the shards' log writes run (`runtime.log_writes`).
    pub log_writes: LogWrites,
}

/// Why the runtime did not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("shard count {0} is outside [1, {SHARDS_MAX}]")]
    ShardCount(usize),
    #[error("cannot read the allowed CPU set (sched_getaffinity)")]
    NoAffinity,
    #[error("{shards} shards need {shards} distinct CPUs but only {allowed:?} are allowed")]
    TooFewCores { shards: usize, allowed: Vec<usize> },
    #[error("configured cores {cores:?} must be {shards} distinct CPUs from the allowed set {allowed:?}")]
    BadCores {
        cores: Vec<usize>,
        shards: usize,
        allowed: Vec<usize>,
    },
    #[error(transparent)]
    Memlock(#[from] MemlockError),
    #[error(transparent)]
    Shard(#[from] ShardStartError),
    #[error("cannot create a shard wakeup eventfd: {0}")]
    Waker(std::io::Error),
    #[error("cannot spawn a shard thread: {0}")]
    Spawn(std::io::Error),
    #[error("shard thread exited before reporting start")]
    ShardVanished,
}

struct ShardHandle<H: ShardHandler> {
    sender: ShardSender<H::Msg>,
    events: rtrb::Consumer<H::Event>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

/// The running shards. Owned by the control thread, which is the thread that called `start`
/// (shard events unpark it).
pub struct Runtime<H: ShardHandler> {
    shards: Vec<ShardHandle<H>>,
    infos: Vec<ShardInfo>,
    stats: Vec<Arc<ShardStats>>,
    stop: Arc<AtomicBool>,
    next_event_shard: usize,
}

fn pick_cores(config: &RuntimeConfig) -> Result<Vec<core_affinity::CoreId>, RuntimeError> {
    let allowed: Vec<usize> = core_affinity::get_core_ids()
        .ok_or(RuntimeError::NoAffinity)?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let chosen: Vec<usize> = match &config.cores {
        None => {
            if allowed.len() < config.shards {
                return Err(RuntimeError::TooFewCores {
                    shards: config.shards,
                    allowed,
                });
            }
            allowed[..config.shards].to_vec()
        }
        Some(cores) => {
            let mut dedup = cores.clone();
            dedup.sort_unstable();
            dedup.dedup();
            let ok = cores.len() == config.shards
                && dedup.len() == cores.len()
                && cores.iter().all(|c| allowed.contains(c));
            if !ok {
                return Err(RuntimeError::BadCores {
                    cores: cores.clone(),
                    shards: config.shards,
                    allowed,
                });
            }
            cores.clone()
        }
    };
    Ok(chosen
        .into_iter()
        .map(|id| core_affinity::CoreId { id })
        .collect())
}

/// Shards spawned but not yet known to be ready: each is still building its ring and pinning
/// its arena, which on a fresh VM means the kernel zeroing every arena page (about a second
/// for 2 × 256 MiB). The caller does its own start-up work meanwhile (opening the log dir,
/// asking the source for metadata) and then calls `ready`. Dropping it stops the shards.
pub struct Starting<H: ShardHandler> {
    rt: Runtime<H>,
    ready: Vec<std::sync::mpsc::Receiver<Result<ShardInfo, ShardStartError>>>,
}

impl<H: ShardHandler> Starting<H> {
    /// Waits until every shard has its ring and registered arena, or reports the first that
    /// could not (the others are then stopped).
    pub fn ready(mut self) -> Result<Runtime<H>, RuntimeError> {
        for rx in std::mem::take(&mut self.ready) {
            // On error `self.rt` drops, stopping every shard.
            let info = rx.recv().map_err(|_| RuntimeError::ShardVanished)??;
            self.rt.infos.push(info);
        }
        Ok(self.rt)
    }
}

impl<H: ShardHandler + 'static> Runtime<H> {
    /// `spawn` and then `ready`: returns once every shard has its ring and registered arena
    /// (or reports why not).
    pub fn start<F>(config: &RuntimeConfig, make: F) -> Result<Runtime<H>, RuntimeError>
    where
        F: Fn(ShardId) -> H + Send + Sync + 'static,
    {
        Self::spawn(config, make)?.ready()
    }

    /// Checks memlock and spawns one pinned thread per shard, all at once so their arenas are
    /// set up side by side, without waiting for them. `make` builds each shard's handler on
    /// its thread. Must be called on the control thread: shard events unpark the caller.
    pub fn spawn<F>(config: &RuntimeConfig, make: F) -> Result<Starting<H>, RuntimeError>
    where
        F: Fn(ShardId) -> H + Send + Sync + 'static,
    {
        if !(1..=SHARDS_MAX).contains(&config.shards) {
            return Err(RuntimeError::ShardCount(config.shards));
        }
        let cores = pick_cores(config)?;
        let needed = (config.shards * config.arena_slot_bytes * config.arena_slots) as u64;
        memlock::check(needed)?;
        let make: Arc<dyn Fn(ShardId) -> H + Send + Sync> = Arc::new(make);
        let stop = Arc::new(AtomicBool::new(false));
        let control = std::thread::current();
        let mut rt = Runtime {
            shards: Vec::new(),
            infos: Vec::new(),
            stats: Vec::new(),
            stop,
            next_event_shard: 0,
        };
        let mut ready = Vec::with_capacity(cores.len());
        for (i, core) in cores.into_iter().enumerate() {
            let shard = ShardId(i as u16);
            let waker = Waker::new().map_err(RuntimeError::Waker)?;
            let (to_shard, inbox) = rtrb::RingBuffer::new(MAILBOX_TO_SHARD_CAPACITY);
            let (to_control, events) = rtrb::RingBuffer::new(MAILBOX_TO_CONTROL_CAPACITY);
            let stats = Arc::new(ShardStats::new(shard));
            rt.stats.push(Arc::clone(&stats));
            let seed = ShardSeed::<H> {
                shard,
                core,
                slot_bytes: config.arena_slot_bytes,
                slots: config.arena_slots,
                log_writes: config.log_writes,
                inbox,
                events: ControlSender::new(to_control, control.clone()),
                waker: waker.clone(),
                stop: Arc::clone(&rt.stop),
                stats,
            };
            let (ready_tx, ready_rx) = std::sync::mpsc::channel();
            let make = Arc::clone(&make);
            let thread = std::thread::Builder::new()
                .name(format!("kmirror-shard-{i}"))
                .spawn(move || shard::run(seed, &*make, ready_tx))
                .map_err(RuntimeError::Spawn)?;
            rt.shards.push(ShardHandle {
                sender: ShardSender::new(to_shard, waker.clone()),
                events,
                waker,
                thread: Some(thread),
            });
            ready.push(ready_rx);
        }
        // On an error above `rt` drops, stopping the shards already spawned.
        Ok(Starting { rt, ready })
    }

    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Per-shard facts (core, tid, ring flags, arena size).
    pub fn infos(&self) -> &[ShardInfo] {
        &self.infos
    }

    /// Each shard's published counters and latency intervals (shared read-only).
    pub fn stats(&self) -> &[Arc<ShardStats>] {
        &self.stats
    }

    /// Queues a message to a shard and wakes it.
    pub fn send(&mut self, shard: ShardId, msg: H::Msg) -> Result<(), MailboxFull<H::Msg>> {
        self.shards[shard.0 as usize].sender.send(msg)
    }

    /// The next queued shard event, round-robin over shards, without waiting.
    pub fn try_event(&mut self) -> Option<(ShardId, H::Event)> {
        let n = self.shards.len();
        for k in 0..n {
            let i = (self.next_event_shard + k) % n;
            if let Ok(e) = self.shards[i].events.pop() {
                self.next_event_shard = (i + 1) % n;
                return Some((ShardId(i as u16), e));
            }
        }
        None
    }

    /// The next shard event, waiting up to `timeout` (parks the control thread).
    pub fn next_event(&mut self, timeout: std::time::Duration) -> Option<(ShardId, H::Event)> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_event() {
                return Some(e);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::park_timeout(deadline - now);
        }
    }

    /// Stops every shard cleanly (handlers' `stop`, in-flight ops cancelled) and joins them.
    pub fn stop(mut self) {
        self.shutdown();
    }
}

impl<H: ShardHandler> Runtime<H> {
    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        for s in &self.shards {
            let _ = s.waker.wake();
        }
        // A stalled shard never ends: waiting for it would hang the stop (and with it the
        // process systemd is waiting to restart), so each is given a bounded time.
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(SHARD_JOIN_WAIT_MS);
        for (i, s) in self.shards.iter_mut().enumerate() {
            let Some(t) = s.thread.take() else { continue };
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if t.is_finished() {
                // A shard that panicked has already reported it on stderr.
                let _ = t.join();
            } else {
                tracing::error!(shard = i, "shard did not stop; leaving its thread behind");
            }
        }
    }
}

impl<H: ShardHandler> Drop for Runtime<H> {
    fn drop(&mut self) {
        self.shutdown();
    }
}
