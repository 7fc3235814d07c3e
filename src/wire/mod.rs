//! Kafka bytes in and out, with no I/O: batch views, frames and protocol helpers.

pub mod api;
pub mod batch;
pub mod batch_builder;
pub mod crc32c;
pub mod fetch_parts;
pub mod frame;
pub mod records;
