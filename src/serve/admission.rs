//! What the listener lets in and holds: connection slots (`max.connections`,
//! `max.connections.per.ip`), the global budget of request bytes buffered
//! (`queued.max.request.bytes`), and the endpoint's connection counters for `/metrics`.
//!
//! A slot and a budget permit are drop guards: a connection task or handler that panics (a
//! handler bug) unwinds through them, so it can never leak a slot or budget bytes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// The listener's limits (Kafka's broker settings of the same names, see config.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// `max.connections`: connections held at once; one more is closed at once.
    pub max_connections: usize,
    /// `max.connections.per.ip`: connections held at once from one client address.
    pub max_connections_per_ip: usize,
    /// `connections.max.idle.ms`: a connection with no request for this long is closed.
    pub connections_max_idle_ms: u64,
    /// `request.receive.timeout.ms`: a request frame begun must be complete within this.
    pub request_receive_timeout_ms: u64,
    /// `queued.max.request.bytes`: request bytes all connections may buffer together.
    pub queued_max_request_bytes: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        use crate::limits::*;
        ConnLimits {
            max_connections: SERVE_CONNECTIONS_DEFAULT,
            max_connections_per_ip: SERVE_CONNECTIONS_DEFAULT,
            connections_max_idle_ms: SERVE_CONNECTIONS_MAX_IDLE_MS_DEFAULT,
            request_receive_timeout_ms: SERVE_REQUEST_RECEIVE_TIMEOUT_MS_DEFAULT,
            queued_max_request_bytes: SERVE_QUEUED_REQUEST_BYTES_DEFAULT,
        }
    }
}

/// Process-wide counters of the Kafka endpoint (one listener per process), read by `/metrics`.
#[derive(Debug, Default)]
pub struct ConnStats {
    pub accepted: AtomicU64,
    pub refused_max_connections: AtomicU64,
    pub refused_per_ip: AtomicU64,
    pub closed_idle: AtomicU64,
    pub closed_receive_timeout: AtomicU64,
    pub handler_panics: AtomicU64,
    /// Connections held now.
    pub open: AtomicU64,
}

pub static CONN_STATS: ConnStats = ConnStats {
    accepted: AtomicU64::new(0),
    refused_max_connections: AtomicU64::new(0),
    refused_per_ip: AtomicU64::new(0),
    closed_idle: AtomicU64::new(0),
    closed_receive_timeout: AtomicU64::new(0),
    handler_panics: AtomicU64::new(0),
    open: AtomicU64::new(0),
};

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Why a connection was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    MaxConnections(usize),
    PerIp(usize),
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// The connection slots and the request-bytes budget of one listener.
#[derive(Debug)]
pub struct Admission {
    pub limits: ConnLimits,
    held: Mutex<Held>,
    /// Request bytes not yet handed out.
    bytes_left: Mutex<usize>,
    bytes_freed: Condvar,
    /// The same wake-up for connection tasks, which must not block their runtime thread.
    bytes_freed_async: tokio::sync::Notify,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent across a panic (plain counters).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    pub fn new(limits: ConnLimits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            held: Mutex::new(Held::default()),
            bytes_left: Mutex::new(limits.queued_max_request_bytes),
            bytes_freed: Condvar::new(),
            bytes_freed_async: tokio::sync::Notify::new(),
        })
    }

    /// A slot for a connection from `ip`, or why not (counted in `CONN_STATS`).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refusal> {
        let mut held = lock(&self.held);
        if held.total >= self.limits.max_connections {
            bump(&CONN_STATS.refused_max_connections);
            return Err(Refusal::MaxConnections(self.limits.max_connections));
        }
        let from_ip = held.per_ip.entry(ip).or_insert(0);
        if *from_ip >= self.limits.max_connections_per_ip {
            bump(&CONN_STATS.refused_per_ip);
            return Err(Refusal::PerIp(self.limits.max_connections_per_ip));
        }
        *from_ip += 1;
        held.total += 1;
        bump(&CONN_STATS.accepted);
        CONN_STATS.open.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            admission: Arc::clone(self),
            ip,
        })
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        lock(&self.held).total
    }

    /// Waits until `bytes` of the request budget are free (or `deadline` passes: `None`) and
    /// takes them. `bytes` above the whole budget can never be had: `None` at once.
    pub fn request_bytes(self: &Arc<Self>, bytes: usize, deadline: Instant) -> Option<BytesPermit> {
        if bytes > self.limits.queued_max_request_bytes {
            return None;
        }
        let mut left = lock(&self.bytes_left);
        while *left < bytes {
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            left = self
                .bytes_freed
                .wait_timeout(left, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *left -= bytes;
        Some(BytesPermit {
            admission: Arc::clone(self),
            bytes,
        })
    }

    /// `request_bytes` for a connection task: waits without blocking its thread.
    pub async fn request_bytes_async(
        self: &Arc<Self>,
        bytes: usize,
        deadline: Instant,
    ) -> Option<BytesPermit> {
        if bytes > self.limits.queued_max_request_bytes {
            return None;
        }
        loop {
            // Registered before looking, so a release between the look and the wait wakes us.
            let freed = self.bytes_freed_async.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut left = lock(&self.bytes_left);
                if *left >= bytes {
                    *left -= bytes;
                    return Some(BytesPermit {
                        admission: Arc::clone(self),
                        bytes,
                    });
                }
            }
            if tokio::time::timeout_at(deadline.into(), freed)
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Request bytes not handed out now.
    pub fn request_bytes_left(&self) -> usize {
        *lock(&self.bytes_left)
    }
}

/// A held connection slot; dropping it (also while unwinding) frees it.
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = lock(&self.admission.held);
        held.total -= 1;
        if let Some(n) = held.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.per_ip.remove(&self.ip);
            }
        }
        CONN_STATS.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Request bytes taken from the budget; dropping it gives them back.
#[derive(Debug)]
pub struct BytesPermit {
    admission: Arc<Admission>,
    bytes: usize,
}

impl Drop for BytesPermit {
    fn drop(&mut self) {
        *lock(&self.admission.bytes_left) += self.bytes;
        self.admission.bytes_freed.notify_all();
        self.admission.bytes_freed_async.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(max: usize, per_ip: usize, bytes: usize) -> ConnLimits {
        ConnLimits {
            max_connections: max,
            max_connections_per_ip: per_ip,
            queued_max_request_bytes: bytes,
            ..ConnLimits::default()
        }
    }

    /// Slots are counted per address and in total, and come back when dropped, also when the
    /// thread holding one panics.
    #[test]
    fn slots_are_limited_and_released_even_by_a_panic() {
        let a = Admission::new(limits(3, 2, 1));
        let (ip1, ip2): (IpAddr, IpAddr) =
            ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let s1 = a.admit(ip1).unwrap();
        let _s2 = a.admit(ip1).unwrap();
        assert_eq!(a.admit(ip1).unwrap_err(), Refusal::PerIp(2));
        let _s3 = a.admit(ip2).unwrap();
        assert_eq!(a.admit(ip2).unwrap_err(), Refusal::MaxConnections(3));
        drop(s1);
        let s4 = a.admit(ip1).unwrap();
        let joined = std::thread::spawn(move || {
            let _held = s4;
            panic!("handler bug");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(a.held(), 2);
        a.admit(ip1).unwrap();
    }

    /// A request waits for budget rather than allocating past it, gets it when another
    /// request's bytes are freed, and a request above the whole budget is refused at once.
    #[test]
    fn request_bytes_wait_for_the_budget() {
        let a = Admission::new(limits(10, 10, 100));
        let soon = || Instant::now() + Duration::from_millis(50);
        let p = a.request_bytes(80, soon()).unwrap();
        assert!(
            a.request_bytes(30, soon()).is_none(),
            "over budget must wait, then give up"
        );
        let a2 = Arc::clone(&a);
        let waiter = std::thread::spawn(move || {
            a2.request_bytes(30, Instant::now() + Duration::from_secs(30))
                .map(|p| p.bytes)
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(p);
        assert_eq!(waiter.join().unwrap(), Some(30));
        assert_eq!(a.request_bytes_left(), 100);
        assert!(a.request_bytes(101, soon()).is_none());
    }

    /// The connection tasks' form waits the same way, on a runtime thread it does not block.
    #[test]
    fn request_bytes_async_waits_for_the_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let a = Admission::new(limits(10, 10, 100));
        let p = a.request_bytes(80, Instant::now()).unwrap();
        rt.block_on(async {
            let soon = Instant::now() + Duration::from_millis(50);
            assert!(a.request_bytes_async(30, soon).await.is_none());
            let later = Instant::now() + Duration::from_secs(30);
            let waiter = a.request_bytes_async(30, later);
            let freer = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(p);
            };
            let (got, ()) = tokio::join!(waiter, freer);
            assert_eq!(got.map(|p| p.bytes), Some(30));
        });
        assert_eq!(a.request_bytes_left(), 100);
    }
}
