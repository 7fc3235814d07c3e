//! systemd service notification (`Type=notify`): READY=1 once recovery finished and the shards
//! run, WATCHDOG=1 from the control thread's tick, STOPPING=1 when shutdown begins. Every call
//! is a no-op outside systemd (no `NOTIFY_SOCKET`), and a failed send is only logged: the
//! service manager going away must never stop mirroring.

use std::sync::atomic::{AtomicBool, Ordering};
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
        self.last = Some(now);
        send(&[NotifyState::Watchdog]);
    }
}
