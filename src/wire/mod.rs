//! Kafka bytes in and out, with no I/O: batch views, frames and protocol helpers.

pub mod batch;
pub mod batch_builder;
