//! Proves the test harness against a real Kafka 4.1.1 broker: topics with configs, every codec,
//! idempotent and transactional producers, DumpLogSegments on the broker's own files (and that
//! it does flag damage), and that a dedicated broker restarts and dies with its owner.

mod harness;

use std::path::PathBuf;

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::files::copy_partition_trimmed;
use harness::{Codec, Isolation, Kafka, ProduceOpts, TxnEnd};

/// Small segments and dense indexes, so a few hundred records give several segments.
const SMALL_SEGMENTS: &[(&str, &str)] = &[
    ("internal.segment.bytes", "20000"),
    ("index.interval.bytes", "500"),
];

/// The partition's segment files, copied with the live active segment's index tails trimmed.
fn live_files(k: &Kafka, topic: &str, p: i32, scratch: &tempfile::TempDir) -> Vec<PathBuf> {
    copy_partition_trimmed(
        &k.partition_dir(topic, p),
        &scratch.path().join(format!("{topic}-{p}")),
    )
}

fn log_files(dir: &std::path::Path) -> Vec<PathBuf> {
    segment_files(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect()
}

#[test]
fn topics_take_their_configs() {
    let k = harness::shared();
    let topic = harness::unique_topic("selftest-cfg");
    k.create_topic(&topic, 3, SMALL_SEGMENTS);
    for p in 0..3 {
        assert!(
            k.partition_dir(&topic, p).is_dir(),
            "no directory for partition {p}"
        );
    }
    let produced = k.produce(&topic, 1, 400, &ProduceOpts::default());
    assert_eq!(produced.offsets, (0..400).collect::<Vec<i64>>());
    // 400 records of ~130 bytes overflow 20000-byte segments only if the config took effect.
    let logs = log_files(&k.partition_dir(&topic, 1));
    assert!(logs.len() >= 2, "expected several segments, found {logs:?}");
    let offsets = k.offsets(&topic, 1);
    assert_eq!((offsets.log_start_offset, offsets.log_end_offset), (0, 400));
    assert!(log_files(&k.partition_dir(&topic, 0))
        .iter()
        .all(|f| f.metadata().unwrap().len() == 0));
}

#[test]
fn every_codec_reaches_the_log_and_dumps_clean() {
    let k = harness::shared();
    let topic = harness::unique_topic("selftest-codecs");
    k.create_topic(&topic, Codec::ALL.len() as i32, SMALL_SEGMENTS);
    for (p, codec) in Codec::ALL.iter().enumerate() {
        let opts = ProduceOpts {
            codec: *codec,
            seed: p as u64,
            headers: 2,
            ..Default::default()
        };
        k.produce(&topic, p as i32, 300, &opts);
    }
    for (p, codec) in Codec::ALL.iter().enumerate() {
        let scratch = tempfile::tempdir().unwrap();
        let files = live_files(k, &topic, p as i32, &scratch);
        let dump = dump_log_segments(&files, DumpFlags::DEEP_SANITY);
        dump.assert_clean();
        assert!(!dump.batches.is_empty(), "{codec:?}: no batches");
        for b in &dump.batches {
            assert_eq!(
                b.codec,
                codec.name(),
                "batch at {} of {codec:?}",
                b.base_offset
            );
            assert!(b.is_valid && !b.is_transactional && !b.is_control);
        }
        assert_eq!(
            dump.records.len(),
            300,
            "{codec:?}: deep iteration saw every record"
        );
        assert_eq!(dump.records[299].1["headerKeys"], "[h0,h1]");
        // Index entries compared against the log, both ways the tool offers.
        dump_log_segments(&files, DumpFlags::DEEP).assert_clean();
        dump_log_segments(&files, DumpFlags::VERIFY_INDEX_ONLY).assert_clean();
    }
}

#[test]
fn idempotent_and_transactional_batches_are_marked() {
    let k = harness::shared();
    let topic = harness::unique_topic("selftest-txn");
    k.create_topic(&topic, 2, SMALL_SEGMENTS);
    let idem = ProduceOpts {
        idempotent: true,
        codec: Codec::Lz4,
        ..Default::default()
    };
    k.produce(&topic, 0, 200, &idem);
    let txn = ProduceOpts {
        codec: Codec::Zstd,
        transactions: vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit],
        ..Default::default()
    };
    let produced = k.produce(&topic, 1, 300, &txn);
    // Three data ranges and three commit/abort markers, each marker taking one offset.
    assert_eq!(produced.last_offset, 300 + 3 - 2);
    k.wait_for_log_end(&topic, 1, 303);

    let scratch = tempfile::tempdir().unwrap();
    let dump = dump_log_segments(&live_files(k, &topic, 0, &scratch), DumpFlags::DEEP_SANITY);
    dump.assert_clean();
    assert!(dump
        .batches
        .iter()
        .all(|b| b.producer_id >= 0 && b.fields["baseSequence"] != "-1"));
    assert_eq!(dump.batches[0].fields["baseSequence"], "0");

    let dump = dump_log_segments(&live_files(k, &topic, 1, &scratch), DumpFlags::DEEP_SANITY);
    dump.assert_clean();
    assert!(dump.batches.iter().all(|b| b.is_transactional));
    let markers: Vec<&str> = dump
        .records
        .iter()
        .filter_map(|(_, r)| r.get("endTxnMarker").map(String::as_str))
        .collect();
    assert_eq!(markers, ["COMMIT", "ABORT", "COMMIT"]);
    assert_eq!(dump.batches.iter().filter(|b| b.is_control).count(), 3);
    let txnindex: Vec<PathBuf> = segment_files(&k.partition_dir(&topic, 1))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "txnindex"))
        .collect();
    assert!(
        !txnindex.is_empty(),
        "the aborted transaction is recorded in a .txnindex"
    );

    let committed = k.consume(&topic, 1, 0, 300, Isolation::ReadCommitted);
    let all = k.consume(&topic, 1, 0, 300, Isolation::ReadUncommitted);
    assert_eq!(
        committed.len(),
        200,
        "read_committed skips the aborted third"
    );
    assert_eq!(all.len(), 300);
    assert_eq!(all[0].key.as_deref(), Some(&b"key-1-0"[..]));
}

#[test]
fn dump_log_segments_flags_damage() {
    let k = harness::shared();
    let topic = harness::unique_topic("selftest-damage");
    k.create_topic(&topic, 1, SMALL_SEGMENTS);
    k.produce(
        &topic,
        0,
        300,
        &ProduceOpts {
            codec: Codec::Gzip,
            ..Default::default()
        },
    );
    let copy = tempfile::tempdir().unwrap();
    let first = &log_files(&k.partition_dir(&topic, 0))[0];
    let stem = first.file_stem().unwrap().to_str().unwrap().to_string();
    for ext in ["log", "index", "timeindex"] {
        let name = format!("{stem}.{ext}");
        std::fs::copy(first.with_file_name(&name), copy.path().join(&name)).unwrap();
    }
    let log = copy.path().join(format!("{stem}.log"));
    let index = copy.path().join(format!("{stem}.index"));
    dump_log_segments(&[log.clone(), index.clone()], DumpFlags::DEEP).assert_clean();

    // A flipped byte inside the first batch's compressed records breaks its CRC.
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&log, &bytes).unwrap();
    let dump = dump_log_segments(std::slice::from_ref(&log), DumpFlags::DEEP_SANITY);
    assert!(dump.has_error("isvalid: false"), "{:?}", dump.errors);

    // An index entry pointing past the batch it names.
    let mut idx = std::fs::read(&index).unwrap();
    assert!(idx.len() >= 8, "the segment has index entries");
    idx[4..8].copy_from_slice(&7u32.to_be_bytes());
    std::fs::write(&index, &idx).unwrap();
    let dump = dump_log_segments(std::slice::from_ref(&index), DumpFlags::DEEP);
    assert!(
        !dump.errors.is_empty(),
        "a wrong index position goes unnoticed:\n{}",
        dump.stdout
    );
}

#[test]
fn dedicated_broker_restarts_and_dies_with_its_owner() {
    let mut k = Kafka::start_dedicated();
    let topic = "restart";
    k.create_topic(topic, 1, &[]);
    k.produce(
        topic,
        0,
        50,
        &ProduceOpts {
            idempotent: true,
            ..Default::default()
        },
    );
    k.restart();
    assert!(k.is_running());
    let back = k.consume(topic, 0, 0, 50, Isolation::ReadCommitted);
    assert_eq!(back.len(), 50, "records survive a clean restart");
    k.kill();
    k.restart();
    assert_eq!(k.offsets(topic, 0).log_end_offset, 50, "and a crash");

    let pid = k.jvm_pid().expect("running");
    let dir = k.data_dir();
    drop(k);
    let alive = std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!alive.success(), "JVM {pid} outlived its Kafka handle");
    assert!(!dir.exists(), "{} outlived its Kafka handle", dir.display());
}
