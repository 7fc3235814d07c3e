//! Is every shard still turning its loop? Each shard bumps its `Heartbeat` once per turn of its
//! completion loop (an idle shard turns at least every `SHARD_HEARTBEAT_MS`, woken by a ring
//! TIMEOUT it keeps posted) and records how its thread ended. The control side's `ShardHealth`
//! compares the counters between checks against its own clock: a counter that has not moved
//! for `SHARD_STALL_MS`, or a thread that panicked or left its loop, is a failed shard.
//!
//! kmirror does not restart a shard in place (its partitions' logs died with it, and their
//! state can only be rebuilt by recovery), so a failed shard is final for the process: the
//! caller fails its partitions, stops the watchdog pings and exits non-zero.
//!
//! A shard blocked on its disk (`Ring`'s waits for writes and syncs) keeps beating for up to
//! `SHARD_DISK_WAIT_MAX_MS` and flags the wait (`Heartbeat::on_disk`): a slow disk is not a
//! stuck loop, and a stall found past that bound says it was the disk.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::stats::ShardStats;
use crate::ids::ShardId;

const RUNNING: u8 = 0;
const STOPPED: u8 = 1;
const PANICKED: u8 = 2;

/// What one shard publishes about its own liveness (it is the only writer of `turns` and of
/// how it ended), plus the control side's verdict for `/metrics`.
#[derive(Debug)]
pub struct Heartbeat {
    turns: AtomicU64,
    end: AtomicU8,
    /// The panic message, set once when the shard thread unwinds.
    panic: Mutex<Option<String>>,
    /// The health check's verdict (`kmirror_shard_healthy`); true until it finds otherwise.
    healthy: AtomicBool,
    /// How often this shard was found failed (`kmirror_shard_failures_total`): 0 or 1, since a
    /// failed shard ends the process.
    failures: AtomicU64,
    /// The shard is blocked waiting on its disk (set and cleared by its ring), so a stall
    /// found now names the disk.
    on_disk: AtomicBool,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            turns: AtomicU64::new(0),
            end: AtomicU8::new(RUNNING),
            panic: Mutex::new(None),
            healthy: AtomicBool::new(true),
            failures: AtomicU64::new(0),
            on_disk: AtomicBool::new(false),
        }
    }
}

impl Heartbeat {
    /// One turn of the shard loop (a relaxed add: only its movement matters).
    pub fn beat(&self) {
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }

    /// The shard starts (`true`) or ends (`false`) a wait on its disk.
    pub fn on_disk(&self, waiting: bool) {
        self.on_disk.store(waiting, Ordering::Relaxed);
    }

    pub fn waiting_on_disk(&self) -> bool {
        self.on_disk.load(Ordering::Relaxed)
    }

    /// The shard left its loop because it was asked to stop.
    pub fn stopped(&self) {
        self.end.store(STOPPED, Ordering::Release);
    }

    /// The shard thread panicked with `message`.
    pub fn panicked(&self, message: String) {
        *self.panic.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
        self.end.store(PANICKED, Ordering::Release);
    }

    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    fn failed(&self) {
        self.healthy.store(false, Ordering::Relaxed);
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    fn ended(&self) -> Option<Result<(), String>> {
        match self.end.load(Ordering::Acquire) {
            RUNNING => None,
            STOPPED => Some(Ok(())),
            _ => Some(Err(self
                .panic
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_default())),
        }
    }
}

/// A shard the health check found failed, and why (the reason its partitions fail with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFailure {
    pub shard: ShardId,
    pub why: String,
}

struct Watched {
    stats: Arc<ShardStats>,
    turns: u64,
    moved_at: Instant,
    failed: bool,
}

/// The control side's view of every shard's heartbeat. Checked with an explicit clock so the
/// rule can be tested without waiting.
pub struct ShardHealth {
    stall: Duration,
    watched: Vec<Watched>,
}

impl ShardHealth {
    pub fn new(stats: &[Arc<ShardStats>], stall: Duration, now: Instant) -> ShardHealth {
        ShardHealth {
            stall,
            watched: stats
                .iter()
                .map(|s| Watched {
                    stats: Arc::clone(s),
                    turns: s.heartbeat().turns(),
                    moved_at: now,
                    failed: false,
                })
                .collect(),
        }
    }

    /// The shards found failed since the last check (each reported once).
    pub fn check(&mut self, now: Instant) -> Vec<ShardFailure> {
        let mut out = Vec::new();
        for w in self.watched.iter_mut().filter(|w| !w.failed) {
            let hb = w.stats.heartbeat();
            let shard = w.stats.shard;
            let why = match hb.ended() {
                Some(Err(message)) => Some(format!("shard {} panicked: {message}", shard.0)),
                // Shards only leave their loop when the runtime stops them, after the last
                // check; one that left earlier fetches nothing.
                Some(Ok(())) => Some(format!("shard {} left its loop", shard.0)),
                None => {
                    let turns = hb.turns();
                    if turns != w.turns {
                        w.turns = turns;
                        w.moved_at = now;
                        None
                    } else {
                        let still = now.saturating_duration_since(w.moved_at);
                        (still >= self.stall).then(|| {
                            let disk = if hb.waiting_on_disk() {
                                " (it is waiting on its disk: a write or sync has not completed)"
                            } else {
                                ""
                            };
                            format!(
                                "shard {} stalled: its loop has not turned for {} ms{disk}",
                                shard.0,
                                still.as_millis()
                            )
                        })
                    }
                }
            };
            if let Some(why) = why {
                w.failed = true;
                hb.failed();
                out.push(ShardFailure { shard, why });
            }
        }
        out
    }

    /// No shard was found failed (so far).
    pub fn all_healthy(&self) -> bool {
        self.watched.iter().all(|w| !w.failed)
    }

    /// Whether `shard` was found failed.
    pub fn is_failed(&self, shard: ShardId) -> bool {
        self.watched
            .iter()
            .any(|w| w.failed && w.stats.shard == shard)
    }
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(n: u16) -> Vec<Arc<ShardStats>> {
        (0..n)
            .map(|i| Arc::new(ShardStats::new(ShardId(i))))
            .collect()
    }

    // Goal: a shard whose counter keeps moving stays healthy however long it runs; one whose
    // counter stops is failed exactly once, after the stall bound and not before.
    #[test]
    fn a_counter_that_stops_moving_fails_its_shard_after_the_bound() {
        let stats = shards(2);
        let t0 = Instant::now();
        let stall = Duration::from_millis(5_000);
        let mut h = ShardHealth::new(&stats, stall, t0);
        let mut now = t0;
        for _ in 0..20 {
            now += Duration::from_millis(1_000);
            stats[0].heartbeat().beat();
            stats[1].heartbeat().beat();
            assert!(h.check(now).is_empty());
        }
        // Shard 1 stops turning.
        let stopped_at = now;
        for _ in 0..4 {
            now += Duration::from_millis(1_000);
            stats[0].heartbeat().beat();
            assert!(h.check(now).is_empty(), "failed before the bound");
            assert!(h.all_healthy());
        }
        now = stopped_at + stall;
        stats[0].heartbeat().beat();
        let failed = h.check(now);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].shard, ShardId(1));
        assert!(failed[0].why.contains("stalled"), "{}", failed[0].why);
        assert!(!h.all_healthy() && h.is_failed(ShardId(1)) && !h.is_failed(ShardId(0)));
        assert!(!stats[1].heartbeat().healthy());
        assert_eq!(stats[1].heartbeat().failures(), 1);
        assert!(stats[0].heartbeat().healthy());
        // Reported once; a counter moving again does not make it healthy.
        stats[1].heartbeat().beat();
        assert!(h.check(now + Duration::from_secs(1)).is_empty());
        assert!(!h.all_healthy());
        assert_eq!(stats[1].heartbeat().failures(), 1);
    }

    // Goal: a panicked shard is failed at the next check, with its panic message, even though
    // its counter moved just before.
    #[test]
    fn a_panicked_shard_fails_at_once_with_its_message() {
        let stats = shards(1);
        let t0 = Instant::now();
        let mut h = ShardHealth::new(&stats, Duration::from_secs(5), t0);
        stats[0].heartbeat().beat();
        stats[0].heartbeat().panicked("boom".into());
        let failed = h.check(t0 + Duration::from_millis(1));
        assert_eq!(
            failed,
            vec![ShardFailure {
                shard: ShardId(0),
                why: "shard 0 panicked: boom".into()
            }]
        );
    }

    // Goal: a stall found while the shard is blocked on its disk (past the disk-wait bound, so
    // its ring stopped beating) says so, and one found in a stuck loop does not.
    #[test]
    fn a_stall_during_a_disk_wait_names_the_disk() {
        let stats = shards(2);
        let t0 = Instant::now();
        let mut h = ShardHealth::new(&stats, Duration::from_secs(5), t0);
        stats[1].heartbeat().on_disk(true);
        let failed = h.check(t0 + Duration::from_secs(5));
        assert_eq!(failed.len(), 2);
        assert!(!failed[0].why.contains("disk"), "{}", failed[0].why);
        assert!(
            failed[1].why.contains("waiting on its disk"),
            "{}",
            failed[1].why
        );
    }
}
