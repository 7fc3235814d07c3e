//! What kmirror's fetching costs a source, and the knobs that bound it: fetch sessions
//! (KIP-227: incremental requests name only partitions whose fetch position changed, and the
//! broker answers only partitions with news, so thousands of idle partitions cost neither side
//! per request) and `max_rate_bytes_per_sec`, a cap on the record bytes one mirror fetches.
//! The source's own quotas (`throttle_time_ms`) are honoured by the fetcher regardless.
//!
//! The cap is per client id: every fetcher with the same client id (the mirror's, by default
//! `kmirror-<mirror>`; the static mode's `source.client_id`), on every shard and to every
//! broker of the source, draws from one budget, so the cap holds for the mirror as a whole
//! however its partitions are spread. The budget is lock-free (one atomic, the instant the
//! bytes fetched so far are paid for), so shards never wait on each other; the registry that
//! hands out budgets is locked only when a fetcher is created.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::limits::{FETCH_MAX_RATE_BURST_MS, FETCH_MAX_RATE_MIN_BYTES_PER_SEC};

/// `[fetch.source_load]` in `kmirror serve`'s configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceLoadSection {
    /// Use fetch sessions with sources that have them (Fetch v7+, Kafka 1.1+). Off only to
    /// measure what they save.
    #[serde(default = "default_sessions")]
    pub sessions: bool,
    /// Cap on the record bytes per second a mirror (a client id) fetches from its source;
    /// 0 means no cap (the source's quotas still apply).
    #[serde(default)]
    pub max_rate_bytes_per_sec: u64,
}

fn default_sessions() -> bool {
    true
}

impl Default for SourceLoadSection {
    fn default() -> Self {
        SourceLoadSection {
            sessions: default_sessions(),
            max_rate_bytes_per_sec: 0,
        }
    }
}

impl SourceLoadSection {
    pub fn validate(&self) -> Result<(), String> {
        let r = self.max_rate_bytes_per_sec;
        if r != 0 && r < FETCH_MAX_RATE_MIN_BYTES_PER_SEC {
            return Err(format!(
                "fetch.source_load.max_rate_bytes_per_sec = {r}: must be 0 (no cap) or at least \
                 {FETCH_MAX_RATE_MIN_BYTES_PER_SEC}"
            ));
        }
        Ok(())
    }
}

/// One mirror's byte budget: bytes are paid for at `rate` per second; the instant up to which
/// they are paid moves forward with each charge. A fetch may go out while that instant is less
/// than one burst ahead of now, so a mirror that was idle may fetch one burst at once and the
/// average over any longer window stays at the rate.
#[derive(Debug)]
pub struct RateCap {
    bytes_per_sec: u64,
    /// The first instant the budget was asked about (the fetcher is sans-IO: no clock here).
    origin: OnceLock<Instant>,
    /// Nanoseconds after `origin` up to which the fetched bytes are paid for.
    paid_until_ns: AtomicU64,
}

impl RateCap {
    pub fn new(bytes_per_sec: u64) -> RateCap {
        assert!(bytes_per_sec > 0, "a cap of 0 means no cap: make none");
        RateCap {
            bytes_per_sec,
            origin: OnceLock::new(),
            paid_until_ns: AtomicU64::new(0),
        }
    }

    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    fn origin(&self, now: Instant) -> Instant {
        *self.origin.get_or_init(|| now)
    }

    fn ns_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin(t)).as_nanos() as u64
    }

    /// `bytes` of records arrived at `now`.
    pub fn charge(&self, bytes: u64, now: Instant) {
        if bytes == 0 {
            return;
        }
        let cost = (u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_sec))
            .min(u128::from(u64::MAX / 4)) as u64;
        let now_ns = self.ns_at(now);
        // Idle time is no credit: the one burst `ready_at` allows is all a mirror gets at once.
        let _ = self
            .paid_until_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |paid| {
                Some(paid.max(now_ns).saturating_add(cost))
            });
    }

    /// When the next fetch may go out: `None` if now.
    pub fn ready_at(&self, now: Instant) -> Option<Instant> {
        let burst_ns = FETCH_MAX_RATE_BURST_MS * 1_000_000;
        let paid = self.paid_until_ns.load(Ordering::Relaxed);
        let now_ns = self.ns_at(now);
        let earliest = paid.saturating_sub(burst_ns);
        (earliest > now_ns).then(|| self.origin(now) + Duration::from_nanos(earliest))
    }
}

/// The budget of `client_id` at `bytes_per_sec` (0: none), shared by every fetcher holding it.
/// A budget lives while a fetcher holds it; a different rate for the same client id (a new
/// configuration) starts a new budget.
pub fn shared_cap(client_id: &str, bytes_per_sec: u64) -> Option<Arc<RateCap>> {
    if bytes_per_sec == 0 {
        return None;
    }
    static CAPS: OnceLock<Mutex<HashMap<String, Weak<RateCap>>>> = OnceLock::new();
    let caps = CAPS.get_or_init(Default::default);
    // Only inserts and removals happen under the lock; a poisoned map is still consistent.
    let mut caps = caps.lock().unwrap_or_else(|p| p.into_inner());
    caps.retain(|_, w| w.strong_count() > 0);
    if let Some(cap) = caps.get(client_id).and_then(Weak::upgrade) {
        if cap.bytes_per_sec == bytes_per_sec {
            return Some(cap);
        }
    }
    let cap = Arc::new(RateCap::new(bytes_per_sec));
    caps.insert(client_id.to_string(), Arc::downgrade(&cap));
    Some(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_holds_the_average_and_allows_one_burst() {
        let cap = RateCap::new(1_000_000); // 1 MB/s
        let t0 = Instant::now();
        assert_eq!(cap.ready_at(t0), None, "an idle mirror may fetch at once");
        // 3 MB arrive at once: paid until t0 + 3 s (the idle time before is no credit), so the
        // next fetch waits until one burst before that.
        cap.charge(3_000_000, t0);
        let burst = Duration::from_millis(FETCH_MAX_RATE_BURST_MS);
        let ready = cap.ready_at(t0).expect("over budget");
        assert_eq!(ready, t0 - burst + Duration::from_secs(3));
        assert_eq!(cap.ready_at(ready), None);
        // Over a long run of charges the bytes never run ahead of rate × time + one burst.
        let mut now = ready;
        let mut bytes = 3_000_000u64;
        for _ in 0..100 {
            let n = 64 * 1024;
            cap.charge(n, now);
            bytes += n;
            now = cap.ready_at(now).unwrap_or(now);
        }
        let elapsed = now.saturating_duration_since(t0 - burst).as_secs_f64();
        let rate = bytes as f64 / elapsed;
        assert!(
            rate <= 1_000_000.0 * 1.0001,
            "average {rate} B/s above the cap"
        );
    }

    #[test]
    fn one_budget_per_client_id() {
        let a = shared_cap("source-load-test-a", 2_000_000).unwrap();
        let a2 = shared_cap("source-load-test-a", 2_000_000).unwrap();
        assert!(
            Arc::ptr_eq(&a, &a2),
            "fetchers of one mirror share the budget"
        );
        let b = shared_cap("source-load-test-b", 2_000_000).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        let a3 = shared_cap("source-load-test-a", 3_000_000).unwrap();
        assert_eq!(
            a3.bytes_per_sec(),
            3_000_000,
            "a new rate starts a new budget"
        );
        assert!(shared_cap("source-load-test-a", 0).is_none());
    }

    #[test]
    fn a_cap_below_the_minimum_is_refused() {
        let s = SourceLoadSection {
            max_rate_bytes_per_sec: 1,
            ..SourceLoadSection::default()
        };
        assert!(s.validate().unwrap_err().contains("at least"));
        assert!(SourceLoadSection::default().validate().is_ok());
    }
}
