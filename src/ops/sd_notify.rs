//! systemd service notification (`Type=notify`): READY=1 once recovery finished and the shards
//! run, EXTEND_TIMEOUT_USEC while a long recovery makes progress before that, WATCHDOG=1 from
//! the control thread's tick only while every shard was just found turning, STOPPING=1 when
//! shutdown begins. Every call is a no-op outside systemd (no `NOTIFY_SOCKET`), and a failed
//! send is only logged: the service manager going away must never stop mirroring.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;

fn send(state: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::warn!("sd_notify {state:?}: {e}");
    }
}

/// Set once READY=1 went out. The control thread's tick starts before the thread that sends
/// READY gets to run again, and a WATCHDOG=1 ahead of READY=1 would tell systemd the service
/// is alive before it is up; pings wait for this instead.
static READY_SENT: AtomicBool = AtomicBool::new(false);

/// Recovery is done, the shards run and the admin API (if any) listens.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
    READY_SENT.store(true, Ordering::Release);
}

/// Shutdown began (shards stopping, logs being closed).
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// Pings the watchdog at half the interval systemd asked for (`WATCHDOG_USEC`), the rate
/// sd_watchdog_enabled(3) recommends, however often `ping` is called.
#[derive(Debug)]
pub struct Watchdog {
    every: Option<Duration>,
    last: Option<Instant>,
}

impl Watchdog {
    pub fn from_env() -> Watchdog {
        Watchdog {
            every: sd_notify::watchdog_enabled().map(|d| d / 2),
            last: None,
        }
    }

    /// The ping period, or `None` when no watchdog is configured.
    pub fn period(&self) -> Option<Duration> {
        self.every
    }

    /// Called from the control loop's tick, after the shards' health check: sends WATCHDOG=1
    /// when one is due and the shards were found healthy within the last period.
    pub fn ping(&mut self) {
        let Some(every) = self.every else {
            return;
        };
        if !READY_SENT.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < every) {
            return;
        }
        if !SHARDS.vouches(now, every) {
            return;
        }
        self.last = Some(now);
        send(&[NotifyState::Watchdog]);
    }
}

/// What the last health checks of the shards found, for the watchdog: a ping vouches that the
/// control loop *and* every shard make progress, so it needs a check that passed recently, and
/// never goes out again once a shard failed.
#[derive(Debug)]
pub struct HealthGate {
    base: OnceLock<Instant>,
    /// Nanoseconds after `base` of the last passed check, plus one (0: none yet).
    passed_at: AtomicU64,
    failed: AtomicBool,
}

impl HealthGate {
    pub const fn new() -> HealthGate {
        HealthGate {
            base: OnceLock::new(),
            passed_at: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        }
    }

    fn since_base(&self, at: Instant) -> u64 {
        let base = *self.base.get_or_init(|| at);
        at.saturating_duration_since(base).as_nanos() as u64
    }

    /// A health check ran at `at`; `all_healthy` is false once any shard failed (for good).
    pub fn record(&self, all_healthy: bool, at: Instant) {
        if all_healthy {
            self.passed_at
                .store(self.since_base(at) + 1, Ordering::Release);
        } else {
            self.failed.store(true, Ordering::Release);
        }
    }

    /// Whether a ping at `now` is honest: no shard failed and a check passed within `within`.
    pub fn vouches(&self, now: Instant, within: Duration) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return false;
        }
        let passed = self.passed_at.load(Ordering::Acquire);
        passed != 0 && self.since_base(now).saturating_sub(passed - 1) <= within.as_nanos() as u64
    }
}

impl Default for HealthGate {
    fn default() -> Self {
        Self::new()
    }
}

/// The process's one gate (systemd watches one process).
static SHARDS: HealthGate = HealthGate::new();

/// The shards' health check ran now (the data plane calls this from each control tick).
pub fn shards_checked(all_healthy: bool) {
    SHARDS.record(all_healthy, Instant::now());
}

/// A shard failed: no watchdog ping goes out again, and `systemctl status` says why.
pub fn shard_failed(why: &str) {
    SHARDS.record(false, Instant::now());
    send(&[NotifyState::Status(&format!(
        "{why}; exiting to be restarted"
    ))]);
}

/// Keeps systemd's start timeout (`TimeoutStartSec`) from expiring while start-up makes
/// progress: every `EXTEND_EVERY` it looks at `progress` (a counter the work bumps, e.g.
/// partitions opened) and, if it moved, sends EXTEND_TIMEOUT_USEC for two more periods with the
/// count as STATUS. A start-up that stops moving gets no extension and times out as it should.
/// The guard stops the thread when dropped.
pub struct StartExtension {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often start-up progress is looked at, and the extension granted when it moved.
const EXTEND_EVERY: Duration = Duration::from_secs(5);

impl StartExtension {
    /// Starts watching `progress` (`what` names the work in STATUS, e.g. "recovering").
    /// Outside systemd (no `NOTIFY_SOCKET`) nothing is started.
    pub fn start(what: &'static str, progress: std::sync::Arc<AtomicU64>) -> StartExtension {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return StartExtension { stop, thread: None };
        }
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("kmirror-start-extend".into())
            .spawn(move || {
                let mut seen = progress.load(Ordering::Relaxed);
                let mut next = Instant::now() + EXTEND_EVERY;
                while !flag.load(Ordering::Acquire) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::park_timeout(next - now);
                        continue;
                    }
                    next = now + EXTEND_EVERY;
                    let done = progress.load(Ordering::Relaxed);
                    if done != seen {
                        seen = done;
                        let usec = (2 * EXTEND_EVERY).as_micros() as u32;
                        let status = format!("{what}: {done} done");
                        send(&[
                            NotifyState::ExtendTimeoutUsec(usec),
                            NotifyState::Status(&status),
                        ]);
                    }
                }
            })
            .ok();
        StartExtension { stop, thread }
    }
}

impl Drop for StartExtension {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the gate vouches only for a check that passed within the period, and never again
    // once a shard failed, whatever passes are recorded later.
    #[test]
    fn the_gate_needs_a_recent_pass_and_closes_for_good_on_a_failure() {
        let gate = HealthGate::new();
        let t0 = Instant::now();
        let period = Duration::from_millis(500);
        assert!(!gate.vouches(t0, period), "no check yet");
        gate.record(true, t0);
        assert!(gate.vouches(t0 + Duration::from_millis(400), period));
        assert!(
            !gate.vouches(t0 + Duration::from_millis(600), period),
            "the last pass is too old: the checks stopped"
        );
        gate.record(true, t0 + Duration::from_millis(600));
        assert!(gate.vouches(t0 + Duration::from_millis(700), period));
        gate.record(false, t0 + Duration::from_millis(800));
        assert!(!gate.vouches(t0 + Duration::from_millis(800), period));
        gate.record(true, t0 + Duration::from_millis(900));
        assert!(!gate.vouches(t0 + Duration::from_millis(900), period));
    }
}
