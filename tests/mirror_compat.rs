//! Goal: `kmirror serve` mirrors sources from Kafka 2.1 (ZooKeeper) to 4.x byte-for-byte.
//! Method: for each release the harness runs (2.1.1 with ZooKeeper, 3.9.1 and 4.1.1 with KRaft),
//! a dedicated broker takes compressed, idempotent and transactional (commit and abort) batches
//! in two partitions; `kmirror serve` mirrors them; our `.log` bytes must equal the broker's and
//! DumpLogSegments and `kmirror log verify` must accept our directories.

mod harness;
mod mirror_support;

use harness::{Codec, Kafka, ProduceOpts, TxnEnd};
use mirror_support::mirror_and_check;

fn mirror_release(version: &str) {
    let k = Kafka::start_version(version);
    let topic = "compat";
    k.create_topic(topic, 2, &[(k.version.segment_bytes_config(), "20000")]);
    let plain = ProduceOpts {
        codec: Codec::Snappy,
        idempotent: true,
        ..Default::default()
    };
    k.produce(topic, 0, 300, &plain);
    let gz = ProduceOpts {
        codec: Codec::Gzip,
        seed: 3,
        ..Default::default()
    };
    k.produce(topic, 1, 300, &gz);
    let txn = ProduceOpts {
        codec: Codec::Zstd,
        transactions: vec![TxnEnd::Commit, TxnEnd::Abort],
        seed: 2,
        ..Default::default()
    };
    let produced = k.produce(topic, 1, 200, &txn);
    k.wait_for_log_end(topic, 1, produced.last_offset + 2);
    mirror_and_check(&k, &[(topic, 2)]);
}

#[test]
fn kafka_2_1_1_with_zookeeper() {
    mirror_release("2.1.1");
}

#[test]
fn kafka_3_9_1_kraft() {
    mirror_release("3.9.1");
}

#[test]
fn kafka_4_1_1_kraft() {
    mirror_release("4.1.1");
}
