//! Ports for listeners that a test must know before the process binds them (restarts on the
//! same port, configs written ahead).
//!
//! Why not "bind port 0, read it, close it": that port comes from the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`, 32768–60999 here), the same range every outgoing connection
//! takes its source port from. Between the close and kmirror's (or a broker's) bind, any client
//! on the machine — a broker's replication link, a flood of test connections — may take it, and
//! the listener fails with "Address already in use" (seen in CI). Ports handed out here lie
//! below that range, so neither outgoing connections nor bind(0) ever use them; within one test
//! process a counter keeps them distinct, and the start differs per process (test binaries run
//! one after another, each in its own process).

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Handed-out ports lie in `LOW..HIGH` (below the kernel's ephemeral range).
const LOW: u32 = 20_000;
const HIGH: u32 = 32_000;

/// A loopback port no one listens on now, outside the ephemeral range and not handed out
/// before by this process.
pub fn reserved_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = HIGH - LOW;
    // First call: a start of this process's own (pid-spread), so consecutive test binaries
    // do not walk the same ports while a previous one's sockets may still linger.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{HIGH}");
}
