//! Storage in Apache Kafka's own on-disk format: partition directories with segments, indexes,
//! checkpoints and producer state, written so that Kafka's tools and brokers can read them.

pub mod error;
pub mod io;

pub use error::LogError;
