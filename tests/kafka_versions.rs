//! The harness runs older Kafka releases too (sources of a mirror may be old): each supported
//! release starts, takes a topic with small segments, accepts idempotent, transactional and
//! compressed produces from today's Java client, and gives the records back. Its files pass
//! Kafka 4.1's DumpLogSegments, the tool kmirror's own output is checked with.

mod harness;

use harness::dump::{dump_log_segments, DumpFlags};
use harness::files::copy_partition_trimmed;
use harness::{Codec, Isolation, Kafka, ProduceOpts, TxnEnd};

fn round_trip(version: &str) {
    let k = Kafka::start_version(version);
    let topic = "old-release";
    k.create_topic(topic, 1, &[(k.version.segment_bytes_config(), "20000")]);
    let plain = ProduceOpts {
        codec: Codec::Snappy,
        idempotent: true,
        ..Default::default()
    };
    k.produce(topic, 0, 200, &plain);
    let txn = ProduceOpts {
        codec: Codec::Zstd,
        transactions: vec![TxnEnd::Commit, TxnEnd::Abort],
        seed: 2,
        ..Default::default()
    };
    let produced = k.produce(topic, 0, 200, &txn);
    // 200 + 100 committed + marker + 100 aborted + marker.
    assert_eq!(produced.last_offset, 200 + 200 + 1 - 1);
    k.wait_for_log_end(topic, 0, 402);

    let committed = k.consume(topic, 0, 0, 400, Isolation::ReadCommitted);
    assert_eq!(
        committed.len(),
        300,
        "Kafka {version}: the aborted 100 stay hidden"
    );
    assert_eq!(committed[0].key.as_deref(), Some(&b"key-1-0"[..]));
    assert_eq!(committed[200].key.as_deref(), Some(&b"key-2-0"[..]));

    let scratch = tempfile::tempdir().unwrap();
    let files = copy_partition_trimmed(&k.partition_dir(topic, 0), scratch.path());
    let logs = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "log"))
        .count();
    assert!(logs >= 2, "Kafka {version}: small segments roll");
    let dump = dump_log_segments(&files, DumpFlags::DEEP_SANITY);
    dump.assert_clean();
    assert!(dump.batches.iter().any(|b| b.codec == "snappy"));
    assert_eq!(dump.batches.iter().filter(|b| b.is_control).count(), 2);
    dump_log_segments(&files, DumpFlags::DEEP).assert_clean();
}

#[test]
fn kafka_2_1_1_with_zookeeper() {
    round_trip("2.1.1");
}

#[test]
fn kafka_3_9_1_kraft() {
    round_trip("3.9.1");
}
