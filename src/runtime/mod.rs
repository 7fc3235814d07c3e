//! The per-core machine: pinned shard threads, each with its own io_uring and registered arena.
