//! Benchmark tooling (issue 7): a synthetic Kafka source serving pre-built compressed batches
//! from memory, and the raw-copy client whose MB/s is the denominator of kmirror's throughput.
//!
//! Both sides derive everything from one [`SynthSpec`], so the raw-copy client can advance its
//! fetch offsets without parsing a single byte of the responses.

pub mod error;
pub mod fetch_response;
pub mod progress;
pub mod raw_copy;
pub mod raw_copy_broker;
pub mod records;
pub mod server;
pub mod sessions;
pub mod spec;

pub use error::SynthError;
pub use spec::{SynthCodec, SynthSpec};
