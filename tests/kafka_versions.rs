//! Goal: kmirror mirrors sources of every Kafka release a source cluster may still run, from 2.1
//! (ZooKeeper) through 2.8 (the last before KRaft was usable, the middle of the migration path)
//! to 4.4 (the newest), byte-for-byte; and the newest Java clients use kmirror.
//! Method: per release one dedicated broker, started once: a topic with small segments takes
//! snappy idempotent, gzip and zstd transactional (commit and abort) batches from today's Java
//! clients and gives the committed records back; `kmirror serve` mirrors it, our `.log` bytes
//! must equal the broker's, and Kafka 4.1's DumpLogSegments and `kmirror log verify` must
//! accept our directories. The 4.4 broker is mirrored by a control-plane kmirror instead, whose
//! `[kafka]` listener Kafka 4.4's own Java clients then use: read_committed (compared record by
//! record with the source), failover, an idempotent producer.

mod harness;
mod mirror_support;

use harness::mirrors_cli::{
    cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{log_files, wait_all_mirrored, Serve};
use harness::{
    consume_to_end_with, produce_with, Codec, ConsumedRecord, DumpOutput, Isolation, Kafka,
    KafkaVersion, ProduceOpts, TxnEnd,
};
use mirror_support::{assert_valid, mirror_and_check};

const TOPIC: &str = "release";

/// The keys `KafkaTool produce` gives `n` records with `seed`.
fn keys(seed: u64, range: std::ops::Range<usize>) -> Vec<Vec<u8>> {
    range
        .map(|i| format!("key-{seed}-{i}").into_bytes())
        .collect()
}

/// Starts `version`'s broker and fills the topic.
fn filled_release(version: KafkaVersion) -> Kafka {
    let name = version.name();
    let k = Kafka::start_with(version, &[]);
    k.create_topic(TOPIC, 2, &[(k.version.segment_bytes_config(), "20000")]);
    let snappy = ProduceOpts {
        codec: Codec::Snappy,
        idempotent: true,
        ..Default::default()
    };
    k.produce(TOPIC, 0, 300, &snappy);
    let gzip = ProduceOpts {
        codec: Codec::Gzip,
        seed: 3,
        ..Default::default()
    };
    k.produce(TOPIC, 1, 300, &gzip);
    let txn = ProduceOpts {
        codec: Codec::Zstd,
        transactions: vec![TxnEnd::Commit, TxnEnd::Abort],
        seed: 2,
        ..Default::default()
    };
    let produced = k.produce(TOPIC, 1, 200, &txn);
    // 300 + 100 committed + marker + 100 aborted (the last at 500) + marker.
    assert_eq!(produced.last_offset, 500, "Kafka {name}");
    k.wait_for_log_end(TOPIC, 1, 502);

    // The mirror reads across the source's segment boundaries (static-mode kmirror keeps its own
    // segment size; the `.log` bytes are compared concatenated).
    let source_segments = log_files(&k.partition_dir(TOPIC, 1)).len();
    assert!(source_segments >= 2, "Kafka {name}: small segments roll");
    k
}

/// Partition 1's committed records, read back from the broker by Kafka `clients`' consumer:
/// the gzip ones and the committed transaction, the aborted 100 hidden.
fn read_committed_back(k: &Kafka, clients: KafkaVersion) -> Vec<ConsumedRecord> {
    let bootstrap = k.bootstrap();
    let committed = consume_to_end_with(clients, &bootstrap, TOPIC, 1, Isolation::ReadCommitted);
    let got: Vec<Vec<u8>> = committed.iter().map(|r| r.key.clone().unwrap()).collect();
    let mut want = keys(3, 0..300);
    want.extend(keys(2, 0..100));
    assert_eq!(
        got,
        want,
        "Kafka {} read by {} clients: the committed records",
        k.version.name(),
        clients.name()
    );
    committed
}

/// A filled `version` broker mirrored by `kmirror serve` (static mode) and our files checked.
fn mirror_release(version: KafkaVersion) {
    let k = filled_release(version);
    read_committed_back(&k, KafkaVersion::DEFAULT);
    let dump = mirror_and_check(&k, &[(TOPIC, 2)]);
    check_batches(version.name(), &dump);
}

/// What DumpLogSegments read in our copy: every codec produced and both transaction markers.
fn check_batches(name: &str, dump: &DumpOutput) {
    for codec in ["snappy", "gzip", "zstd"] {
        assert!(
            dump.batches.iter().any(|b| b.codec == codec),
            "Kafka {name}: no {codec} batch mirrored"
        );
    }
    let markers = dump.batches.iter().filter(|b| b.is_control).count();
    assert_eq!(markers, 2, "Kafka {name}: the COMMIT and ABORT markers");
}

/// `k` mirrored by a control-plane kmirror (our `.log` bytes equal the broker's), then Kafka
/// `clients`' Java consumer and producer against kmirror's `[kafka]` listener: read_committed
/// reads what the same consumer reads on the source; after `mirrors stop` an idempotent
/// producer continues at the mirrored end; after SIGTERM DumpLogSegments and `kmirror log
/// verify` accept our directories. (One kmirror does both jobs, so the newest release's test
/// costs one mirror run, not two.)
fn clients_on_kmirror(k: &Kafka, clients: KafkaVersion) {
    let name = clients.name();
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    create_mirror(&admin, work.path(), "m", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", TOPIC]);
    let pairs = k.mirror_pairs(TOPIC, 2, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);

    let read_committed = |bootstrap: &str| {
        consume_to_end_with(clients, bootstrap, TOPIC, 1, Isolation::ReadCommitted)
    };
    let source = read_committed_back(k, clients);
    let ours = read_committed(&kmirror);
    assert_eq!(
        ours, source,
        "Kafka {name} read_committed consumer: kmirror and the source differ"
    );

    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", TOPIC]);
    let end = k.offsets(TOPIC, 1).log_end_offset;
    let idempotent = ProduceOpts {
        idempotent: true,
        seed: 7,
        ..Default::default()
    };
    let written = produce_with(clients, &kmirror, TOPIC, 1, 20, &idempotent);
    assert_eq!(
        written.offsets,
        (end..end + 20).collect::<Vec<i64>>(),
        "Kafka {name} idempotent producer after failover continues at the mirrored end"
    );
    let after = read_committed(&kmirror);
    assert_eq!(&after[..source.len()], &source[..], "Kafka {name}");
    let new_keys: Vec<Vec<u8>> = after[source.len()..]
        .iter()
        .map(|r| r.key.clone().unwrap())
        .collect();
    assert_eq!(
        new_keys,
        keys(7, 0..20),
        "Kafka {name}: the records written after failover"
    );
    serve.sigterm_and_wait();
    let ours: Vec<std::path::PathBuf> = pairs.into_iter().map(|(_, o)| o).collect();
    check_batches(name, &assert_valid(&ours));
}

#[test]
fn release_2_1_1_with_zookeeper() {
    mirror_release(KafkaVersion::V2_1_1);
}

#[test]
fn release_2_8_2_with_zookeeper() {
    mirror_release(KafkaVersion::V2_8_2);
}

#[test]
fn release_3_9_1_kraft() {
    mirror_release(KafkaVersion::V3_9_1);
}

#[test]
fn release_4_1_1_kraft() {
    mirror_release(KafkaVersion::DEFAULT);
}

/// Named to sort first: libtest starts tests in name order, and this, the longest, should run
/// beside the others rather than alone after them.
#[test]
fn newest_release_4_4_0_kraft_and_its_java_clients() {
    let k = filled_release(KafkaVersion::V4_4_0);
    clients_on_kmirror(&k, KafkaVersion::V4_4_0);
}
