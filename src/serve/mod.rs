//! The Kafka-protocol endpoint that serves mirrored partitions to stock clients.
pub mod groups;
