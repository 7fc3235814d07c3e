//! How many Fetch requests may wait for data at once. A Fetch long-polls (Kafka's purgatory)
//! by parking a handler thread of the endpoint's bounded pool; without a bound, clients that
//! send enough long polls (one client with a few hundred connections, each asking
//! `max_wait_ms` 30 s on a quiet topic) hold every pool thread and stall every other client's
//! requests for that long. Past the bound a Fetch is answered at once with what there is, as
//! if it had asked `max_wait_ms` 0: the client simply fetches again, and the pool keeps
//! threads for everyone else.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::limits::SERVE_FETCH_PARKED_MAX;

/// Fetches waiting for data now, in this process (the handler pool is per process).
static PARKED: AtomicUsize = AtomicUsize::new(0);

/// A parked Fetch's place; given back when dropped.
#[must_use]
pub struct Parked(());

impl Drop for Parked {
    fn drop(&mut self) {
        let before = PARKED.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a park slot given back twice");
    }
}

/// A place to wait for data, or `None` when `SERVE_FETCH_PARKED_MAX` fetches already wait.
pub fn try_park() -> Option<Parked> {
    PARKED
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < SERVE_FETCH_PARKED_MAX).then_some(n + 1)
        })
        .ok()
        .map(|_| Parked(()))
}

/// Fetches waiting for data now.
pub fn parked() -> usize {
    PARKED.load(Ordering::Acquire)
}
