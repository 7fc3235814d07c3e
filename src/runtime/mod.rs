//! The per-core machine: pinned shard threads, each with its own io_uring and registered arena.
//!
//! | file          | job                                                                    |
//! |---------------|------------------------------------------------------------------------|
//! | `ring`        | the only io_uring wrapper: flags, op slab, blocking file ops, wakeup   |
//! | `arena`       | registered hugepage arena cut into slots; slots freeze into `Bytes`    |
//! | `memlock`     | start-up RLIMIT_MEMLOCK / CAP_IPC_LOCK check with a fix-it message    |
//! | `uring_io`    | `LogIo` on the shard ring (WRITE_FIXED from the arena)                 |
//! | `inline_writes` | whether a batch's writes run on the shard thread or the ring (`runtime.log_writes`) |
//! | `mailbox`     | bounded SPSC queues control<->shard with wakeups                       |
//! | `shard`       | the pinned shard loop and the `ShardHandler` trait                     |
//! | `start`       | `Runtime`: core selection, spawning, stopping                          |
//! | `mirror_shard`| the data path: source sockets, fetchers, appends to partition logs    |
//! | `stats`       | per-shard counters and latency intervals, read by metrics lock-free    |
//! | `health`      | per-shard heartbeat and the control side's stall/panic check           |
//! | `test_hooks`  | debug-build-only faults (panic or stall a shard) for the tests         |

pub mod arena;
pub mod health;
pub mod inline_writes;
pub mod mailbox;
pub mod memlock;
pub mod mirror_shard;
pub mod progress;
pub mod ring;
pub mod shard;
pub mod start;
pub mod stats;
mod test_hooks;
pub mod uring_io;

pub use arena::{Arena, SlotBuf};
pub use ring::{Completion, OpBuf, Ring, RingMode, RingStats, Waker};
pub use shard::{ShardCx, ShardHandler, ShardInfo};
pub use start::{Runtime, RuntimeConfig, RuntimeError, Starting};
pub use stats::{
    Latency, LatencySet, PartitionSnapshot, PartitionStats, ShardSnapshot, ShardStats,
};
pub use uring_io::RingIo;
