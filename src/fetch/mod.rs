//! Data plane, source side: the Kafka client that fetches record batches from source brokers.
//!
//! Sans-IO: nothing here touches a socket or a clock. A driver (the io_uring shard loop, or
//! `blocking` for tools and tests) asks for request bytes, sends them, and hands back each
//! response frame as `bytes::Bytes`; the client answers with events and with the instant the next
//! request may go out.
//!
//! | module     | job                                                                   |
//! |------------|-----------------------------------------------------------------------|
//! | `conn`     | one connection's correlation ids, in-flight requests, poison, throttle |
//! | `versions` | ApiVersions negotiation                                               |
//! | `metadata` | topics, partitions, leaders, leader epochs, topic ids                 |
//! | `blocking` | a std-socket driver for the control thread and tests                  |

pub mod blocking;
pub mod conn;
pub mod metadata;
pub mod versions;
