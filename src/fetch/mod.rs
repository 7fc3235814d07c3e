//! Data plane, source side: the Kafka client that fetches record batches from source brokers.
