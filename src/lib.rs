//! kmirror: the destination of Kafka cluster mirroring (KIP-1279) as a dedicated appliance.
//!
//! Source record batches are fetched with the ordinary Fetch protocol and stored byte-for-byte,
//! at the source's offsets, in Kafka's own on-disk format.
//!
//! # Layout
//!
//! | module    | job                                                                        |
//! |-----------|----------------------------------------------------------------------------|
//! | `ids`     | distinct types for offsets, epochs, positions                              |
//! | `limits`  | every bound, tied together by compile-time assertions                     |
//! | `config`  | `kmirror serve` TOML configuration, validated against the limits          |
//! | `wire`    | Kafka bytes with no I/O: batch views, CRCs, frames                         |
//! | `log`     | partition directories in Kafka's format: segments, indexes, checkpoints    |
//! | `runtime` | pinned shard threads, each with its own io_uring and registered arena      |
//! | `fetch`   | the source-side client that fetches batches (data plane)                   |
//! | `serve`   | the Kafka-protocol endpoint for stock clients                              |
//! | `control` | the control thread: mirror lifecycle, `__mirror_state`, sync               |
//! | `ops`     | CLI tools, metrics, latency export, systemd notification                   |
//! | `bench`   | benchmark tools: the synthetic source and the raw-copy client              |

pub mod bench;
pub mod config;
pub mod control;
pub mod fetch;
#[doc(hidden)]
pub mod fuzz_entry;
pub mod ids;
pub mod limits;
pub mod log;
pub mod ops;
pub mod runtime;
pub mod serve;
pub mod wire;
