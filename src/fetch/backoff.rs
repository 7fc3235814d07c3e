//! Retry timing for source errors: exponential backoff per partition or per fetcher.
//!
//! Throttling is separate (`conn::Connection::throttle`): a broker's throttle_time_ms is an
//! order, while backoff is our own restraint after a failure.

use std::time::{Duration, Instant};

use crate::limits::{SOURCE_BACKOFF_MS_MAX, SOURCE_BACKOFF_MS_MIN};

/// Exponential backoff: `SOURCE_BACKOFF_MS_MIN` doubled per consecutive failure, capped at
/// `SOURCE_BACKOFF_MS_MAX`, reset by the first success.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
    until: Option<Instant>,
}

impl Backoff {
    /// Record a failure at `now`; returns when the next attempt may happen.
    pub fn fail(&mut self, now: Instant) -> Instant {
        let shift = self.failures.min(16);
        let ms = SOURCE_BACKOFF_MS_MIN
            .saturating_mul(1 << shift)
            .min(SOURCE_BACKOFF_MS_MAX);
        self.failures = self.failures.saturating_add(1);
        let until = now + Duration::from_millis(ms);
        self.until = Some(until);
        until
    }

    pub fn succeed(&mut self) {
        self.failures = 0;
        self.until = None;
    }

    /// The instant before which no attempt may be made, if it is still ahead of `now`.
    pub fn pending(&self, now: Instant) -> Option<Instant> {
        self.until.filter(|t| *t > now)
    }

    /// The instant the current backoff ends (it may already be past), if one was set.
    pub fn until(&self) -> Option<Instant> {
        self.until
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps_then_resets() {
        let now = Instant::now();
        let mut b = Backoff::default();
        assert_eq!(b.pending(now), None);
        let delays: Vec<u64> = (0..12)
            .map(|_| (b.fail(now) - now).as_millis() as u64)
            .collect();
        assert_eq!(delays[0], SOURCE_BACKOFF_MS_MIN);
        assert_eq!(delays[1], 2 * SOURCE_BACKOFF_MS_MIN);
        assert!(delays.windows(2).all(|w| w[1] >= w[0]));
        assert_eq!(*delays.last().unwrap(), SOURCE_BACKOFF_MS_MAX);
        assert!(b.pending(now).is_some());
        b.succeed();
        assert_eq!((b.pending(now), b.failures()), (None, 0));
    }
}
