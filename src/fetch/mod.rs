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
//! | `list_offsets` | ListOffsets requests and answers (log start, HW, by timestamp)  |
//! | `metadata` | topics, partitions, leaders, leader epochs, topic ids                 |
//! | `fetcher`  | per source broker: partitions, fetch sessions, requests, events      |
//! | `response` | validation of one partition's records, in place                      |
//! | `divergence` | Kafka's truncation rule, to report where logs diverge              |
//! | `backoff`  | retry timing after source errors                                      |
//! | `blocking` | a std-socket driver for the control thread and tests                  |
//! | `tls`      | rustls client config and a sans-IO TLS session                        |
//! | `sasl`     | SaslHandshake/SaslAuthenticate with PLAIN and SCRAM-SHA-256/512       |
//! | `security` | the TLS + SASL layer between TCP connect and the first request        |
//! | `source_load` | what fetching costs the source: the sessions knob, the rate cap    |

pub mod backoff;
pub mod blocking;
pub mod conn;
pub mod divergence;
pub mod fetcher;
pub mod list_offsets;
pub mod metadata;
pub mod response;
pub mod sasl;
pub mod security;
pub mod source_load;
pub mod tls;
pub mod versions;

#[cfg(test)]
mod fetcher_tests;
