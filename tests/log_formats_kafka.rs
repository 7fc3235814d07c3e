//! Cross-checks of the small on-disk formats against Apache Kafka 4.1 itself: Kafka's own
//! `DumpLogSegments` and Kafka's own classes (driven by tests/kafka/FormatProbe.java) must read
//! what kmirror wrote and report the values the test put in, and Kafka's own record builders must
//! produce byte-identical batches. Expectations are the test's inputs or Kafka's output, never
//! the output of the code under test.
//!
//! Needs `java` and the Kafka jars (`bash tests/kafka/fetch-jars.sh`); fails loudly without them.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use kmirror::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs, TopicPartition};
use kmirror::log::checkpoint::OffsetCheckpointFile;
use kmirror::log::epoch_cache::LeaderEpochCache;
use kmirror::log::io::StdIo;
use kmirror::log::producer_state::ProducerStateManager;
use kmirror::log::txn_index::{AbortedTxn, TxnIndex};
use kmirror::log::{clean_shutdown, partition_meta};
use kmirror::wire::batch::{Batch, Batches};
use kmirror::wire::batch_builder::{control_batch, BatchBuilder, EndTxnMarker};
use rand::{Rng, SeedableRng};

fn kafka_libs() -> PathBuf {
    let dir = match std::env::var_os("KMIRROR_KAFKA_LIBS") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/kmirror/kafka-4.1.1/libs")
        }
    };
    assert!(
        dir.join("kafka_2.13-4.1.1.jar").is_file() && dir.join("kafka-storage-4.1.1.jar").is_file(),
        "Kafka 4.1.1 jars not found in {}: run `bash tests/kafka/fetch-jars.sh`",
        dir.display()
    );
    dir
}

/// Run `java -cp <kafka jars> <args>` and return stdout; any failure fails the test.
fn java(args: &[&str]) -> String {
    let cp = format!("{}/*", kafka_libs().display());
    let out = Command::new("java")
        .arg("-cp")
        .arg(&cp)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `java` ({e}): install JDK 17 and run `bash tests/kafka/fetch-jars.sh`"
            )
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "java {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn dump_log_segments(file: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "kafka.tools.DumpLogSegments",
        "--files",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    java(&args)
}

/// Run FormatProbe.java on a script; returns its output lines.
fn probe(dir: &Path, script: &str) -> Vec<String> {
    let script_path = dir.join("probe-script.txt");
    std::fs::write(&script_path, script).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/FormatProbe.java");
    java(&[src.to_str().unwrap(), script_path.to_str().unwrap()])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The `key: value` pairs of one DumpLogSegments line.
fn fields(line: &str) -> HashMap<String, String> {
    let toks: Vec<&str> = line.split_whitespace().collect();
    let mut out = HashMap::new();
    let mut i = 0;
    while i + 1 < toks.len() {
        if let Some(key) = toks[i].strip_suffix(':') {
            out.insert(key.to_owned(), toks[i + 1].to_owned());
            i += 2;
        } else {
            i += 1;
        }
    }
    out
}

fn batch(bytes: &[u8]) -> Batch<'_> {
    Batch::parse_valid(bytes).unwrap().unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        write!(s, "{b:02x}").unwrap();
        s
    })
}

const T0: i64 = 1_700_000_000_000;

/// A producer snapshot we wrote is read by DumpLogSegments and loaded by Kafka's
/// ProducerStateManager exactly as a broker does at startup, with the values we fed in.
#[test]
fn producer_snapshot_is_read_by_kafka() {
    let d = tempfile::tempdir().unwrap();
    let mut psm = ProducerStateManager::new();
    let log = vec![
        // Offsets 0-1: idempotent producer 1000, epoch 3, sequences 7-8.
        BatchBuilder::new(Offset(0))
            .producer(ProducerId(1000), 3, 7)
            .value(TimestampMs(T0), b"a")
            .value(TimestampMs(T0 + 1), b"b")
            .build(),
        // Offset 2: transactional producer 2000 opens a transaction that stays open.
        BatchBuilder::new(Offset(2))
            .producer(ProducerId(2000), 0, 0)
            .transactional(true)
            .value(TimestampMs(T0 + 2), b"c")
            .build(),
        // Offsets 3-5: producer 3000 writes two records, then its transaction is aborted with a
        // bumped epoch (transaction protocol v2) by coordinator epoch 9.
        BatchBuilder::new(Offset(3))
            .producer(ProducerId(3000), 4, 20)
            .transactional(true)
            .value(TimestampMs(T0 + 3), b"d")
            .value(TimestampMs(T0 + 4), b"e")
            .build(),
        control_batch(
            Offset(5),
            LeaderEpoch(1),
            ProducerId(3000),
            5,
            EndTxnMarker::Abort,
            9,
            TimestampMs(T0 + 5),
        ),
        // Offsets 6-7: producer 4000 commits (same epoch), coordinator epoch 2.
        BatchBuilder::new(Offset(6))
            .producer(ProducerId(4000), 1, 100)
            .transactional(true)
            .value(TimestampMs(T0 + 6), b"f")
            .build(),
        control_batch(
            Offset(7),
            LeaderEpoch(1),
            ProducerId(4000),
            1,
            EndTxnMarker::Commit,
            2,
            TimestampMs(T0 + 7),
        ),
    ];
    let mut aborted = Vec::new();
    for b in &log {
        aborted.extend(psm.on_batch(&batch(b)));
    }
    assert_eq!(
        aborted,
        vec![AbortedTxn {
            producer_id: ProducerId(3000),
            first_offset: Offset(3),
            last_offset: Offset(5),
            last_stable_offset: Offset(2), // producer 2000's open transaction
        }]
    );
    let snap = psm.take_snapshot(d.path(), Offset(8)).unwrap();
    assert!(snap.ends_with("00000000000000000008.snapshot"));

    let out = dump_log_segments(&snap, &[]);
    let entries: HashMap<String, HashMap<String, String>> = out
        .lines()
        .filter(|l| l.starts_with("producerId:"))
        .map(|l| {
            let f = fields(l);
            (f["producerId"].clone(), f)
        })
        .collect();
    assert_eq!(entries.len(), 4, "DumpLogSegments output:\n{out}");
    // (epoch, coordinatorEpoch, currentTxnFirstOffset, lastSequence, lastOffset, offsetDelta,
    // timestamp) as Kafka prints them, worked out from the batches above.
    type Fields = (&'static str, &'static str, &'static str, &'static str);
    let want: [(Fields, (&str, &str, &str), i64); 4] = [
        (
            ("1000", "3", "-1", "OptionalLong.empty"),
            ("8", "1", "1"),
            T0 + 1,
        ),
        (
            ("2000", "0", "-1", "OptionalLong[2]"),
            ("0", "2", "0"),
            T0 + 2,
        ),
        // The bumped marker epoch clears the batch metadata, as in Kafka.
        (
            ("3000", "5", "9", "OptionalLong.empty"),
            ("-1", "-1", "0"),
            T0 + 5,
        ),
        (
            ("4000", "1", "2", "OptionalLong.empty"),
            ("100", "6", "0"),
            T0 + 7,
        ),
    ];
    for ((pid, epoch, coord, txn), (seq, last, delta), ts) in want {
        let f = &entries[pid];
        assert_eq!(f["producerEpoch"], epoch, "{pid}: {out}");
        assert_eq!(f["coordinatorEpoch"], coord, "{pid}: {out}");
        assert_eq!(f["currentTxnFirstOffset"], txn, "{pid}: {out}");
        let get = |k: &str| f.get(k).map(String::as_str);
        if seq == "-1" {
            // No batch since the epoch began: Kafka prints no batch metadata at all.
            assert_eq!(
                (get("lastSequence"), get("lastOffset")),
                (None, None),
                "{pid}: {out}"
            );
        } else {
            assert_eq!(get("lastSequence"), Some(seq), "{pid}: {out}");
            assert_eq!(get("lastOffset"), Some(last), "{pid}: {out}");
            assert_eq!(get("offsetDelta"), Some(delta), "{pid}: {out}");
        }
        assert_eq!(f["lastTimestamp"], ts.to_string(), "{pid}: {out}");
    }

    // Kafka's ProducerStateManager, loading the directory the way LogLoader does.
    let now = T0 + 1000;
    let lines = probe(
        d.path(),
        &format!("producer-state {} 0 8 {now}\n", d.path().display()),
    );
    assert!(
        lines.contains(&"producer-state mapEndOffset 8".to_owned()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"producer-state firstUnstableOffset 2".to_owned()),
        "{lines:?}"
    );
    let producers: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("producer-state producer "))
        .collect();
    let want = [
        format!("producer-state producer 1000 3 8 1 1 {} -1 -1", T0 + 1),
        format!("producer-state producer 2000 0 0 2 0 {} -1 2", T0 + 2),
        format!("producer-state producer 3000 5 -1 -1 0 {} 9 -1", T0 + 5),
        format!("producer-state producer 4000 1 100 6 0 {} 2 -1", T0 + 7),
    ];
    assert_eq!(producers, want.iter().collect::<Vec<_>>());
}

/// A `.txnindex` we wrote is dumped by DumpLogSegments with our entries, and Kafka's
/// TransactionIndex answers every collectAbortedTxns query as ours does.
#[test]
fn txn_index_is_read_by_kafka() {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("00000000000000000100.txnindex");
    let mut idx = TxnIndex::open(&path, Offset(100)).unwrap();
    let txns = [
        (7, 90, 105, 95),
        (8, 101, 110, 111),
        (7, 108, 120, 130),
        (9, 125, 140, 141),
    ];
    for (pid, first, last, lso) in txns {
        idx.append(
            &mut StdIo,
            &AbortedTxn {
                producer_id: ProducerId(pid),
                first_offset: Offset(first),
                last_offset: Offset(last),
                last_stable_offset: Offset(lso),
            },
        )
        .unwrap();
    }
    idx.flush(&mut StdIo).unwrap();

    let out = dump_log_segments(&path, &[]);
    let dumped: Vec<(i64, i64, i64, i64)> = out
        .lines()
        .filter(|l| l.starts_with("version:"))
        .map(|l| {
            let f = fields(l);
            assert_eq!(f["version"], "0");
            let n = |k: &str| f[k].parse::<i64>().unwrap();
            (
                n("producerId"),
                n("firstOffset"),
                n("lastOffset"),
                n("lastStableOffset"),
            )
        })
        .collect();
    assert_eq!(dumped, txns.to_vec(), "DumpLogSegments output:\n{out}");

    let mut script = String::new();
    let mut ours = Vec::new();
    for fetch in [0, 100, 106, 111, 121, 141] {
        for upper in [90, 102, 111, 125, 131, 200] {
            writeln!(script, "txn-collect {} 100 {fetch} {upper}", path.display()).unwrap();
            let (found, complete) = idx.collect_aborted(Offset(fetch), Offset(upper));
            let mut line = format!("txn-collect {complete}");
            for t in found {
                write!(
                    line,
                    " {}:{}:{}:{}",
                    t.producer_id.0, t.first_offset.0, t.last_offset.0, t.last_stable_offset.0
                )
                .unwrap();
            }
            ours.push(line);
        }
    }
    assert_eq!(probe(d.path(), &script), ours);
}

/// Our data and control batches are byte-identical to the ones Kafka's MemoryRecords builds
/// from the same inputs, and DumpLogSegments validates a `.log` made of them.
#[test]
fn builder_batches_are_byte_identical_to_kafkas() {
    let d = tempfile::tempdir().unwrap();
    let mut script = String::new();
    let mut ours = Vec::new();
    // Data batches: (offset, leader epoch, pid, producer epoch, base sequence, transactional,
    // records as (timestamp, key, value, headers)).
    type Rec = (
        i64,
        Option<&'static str>,
        Option<&'static str>,
        Vec<(&'static str, Option<&'static str>)>,
    );
    type Producer = (i64, i16, i32, bool);
    let specs: Vec<(i64, i32, Producer, Vec<Rec>)> = vec![
        (
            0,
            -1,
            (-1, -1, -1, false),
            vec![(T0, None, Some("hello"), vec![])],
        ),
        (
            10,
            4,
            (77, 2, 1000, true),
            vec![
                (
                    T0 + 5,
                    Some("k1"),
                    Some("v1"),
                    vec![("h", Some("x")), ("n", None)],
                ),
                (T0 + 1, None, None, vec![]),
                (
                    T0 + 300_000,
                    Some("k3"),
                    Some("a-somewhat-longer-value"),
                    vec![],
                ),
            ],
        ),
        (
            1 << 40,
            123,
            (1 << 50, 0, i32::MAX - 1, false),
            (0..200)
                .map(|i| (T0 - i, None, Some("r"), vec![]))
                .collect(),
        ),
    ];
    for (offset, epoch, (pid, pepoch, seq, txn), recs) in &specs {
        let mut b = BatchBuilder::new(Offset(*offset))
            .leader_epoch(LeaderEpoch(*epoch))
            .producer(ProducerId(*pid), *pepoch, *seq)
            .transactional(*txn);
        write!(
            script,
            "data-batch {offset} {epoch} {pid} {pepoch} {seq} {txn}"
        )
        .unwrap();
        for (ts, k, v, hs) in recs {
            let headers: Vec<(&str, Option<&[u8]>)> = hs
                .iter()
                .map(|(hk, hv)| (*hk, hv.map(str::as_bytes)))
                .collect();
            b = b.record(
                TimestampMs(*ts),
                k.map(str::as_bytes),
                v.map(str::as_bytes),
                &headers,
            );
            write!(script, " {ts},{},{}", k.unwrap_or("-"), v.unwrap_or("-")).unwrap();
            for (hk, hv) in hs {
                write!(script, ",{hk}={}", hv.unwrap_or("-")).unwrap();
            }
        }
        script.push('\n');
        ours.push(b.build());
    }
    let markers = [
        (3i64, T0 + 9, 2i32, 2000i64, 1i16, EndTxnMarker::Abort, 9i32),
        (4, T0 + 10, 2, 2000, 1, EndTxnMarker::Commit, 0),
        (1 << 33, T0, 0, 5, i16::MAX, EndTxnMarker::Abort, i32::MAX),
    ];
    for (offset, ts, epoch, pid, pepoch, m, coord) in markers {
        let name = if m == EndTxnMarker::Abort {
            "ABORT"
        } else {
            "COMMIT"
        };
        writeln!(
            script,
            "end-txn-marker {offset} {ts} {epoch} {pid} {pepoch} {name} {coord}"
        )
        .unwrap();
        ours.push(control_batch(
            Offset(offset),
            LeaderEpoch(epoch),
            ProducerId(pid),
            pepoch,
            m,
            coord,
            TimestampMs(ts),
        ));
    }
    let kafka: Vec<String> = probe(d.path(), &script)
        .into_iter()
        .map(|l| l.split(' ').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(kafka.len(), ours.len());
    for (k, o) in kafka.iter().zip(&ours) {
        assert_eq!(k, &hex(o), "Kafka's bytes vs ours");
    }

    // A segment of builder batches: a transaction aborted and one committed.
    let segment = [
        BatchBuilder::new(Offset(0))
            .leader_epoch(LeaderEpoch(2))
            .producer(ProducerId(2000), 0, 0)
            .transactional(true)
            .value(TimestampMs(T0), b"x")
            .value(TimestampMs(T0 + 1), b"y")
            .build(),
        control_batch(
            Offset(2),
            LeaderEpoch(2),
            ProducerId(2000),
            1,
            EndTxnMarker::Abort,
            9,
            TimestampMs(T0 + 2),
        ),
        BatchBuilder::new(Offset(3))
            .leader_epoch(LeaderEpoch(2))
            .producer(ProducerId(2001), 5, 0)
            .transactional(true)
            .value(TimestampMs(T0 + 3), b"z")
            .build(),
        control_batch(
            Offset(4),
            LeaderEpoch(2),
            ProducerId(2001),
            5,
            EndTxnMarker::Commit,
            11,
            TimestampMs(T0 + 4),
        ),
    ]
    .concat();
    let log = d.path().join("00000000000000000000.log");
    std::fs::write(&log, &segment).unwrap();
    assert_eq!(Batches::new(&segment).count(), 4);
    let out = dump_log_segments(&log, &["--deep-iteration"]);
    let headers: Vec<HashMap<String, String>> = out
        .lines()
        .filter(|l| l.starts_with("baseOffset:"))
        .map(fields)
        .collect();
    assert_eq!(headers.len(), 4, "{out}");
    for (h, (base, control)) in headers
        .iter()
        .zip([(0, false), (2, true), (3, false), (4, true)])
    {
        assert_eq!(h["isvalid"], "true", "{out}");
        assert_eq!(h["baseOffset"], base.to_string(), "{out}");
        assert_eq!(h["isControl"], control.to_string(), "{out}");
        assert_eq!(h["isTransactional"], "true", "{out}");
        assert_eq!(h["partitionLeaderEpoch"], "2", "{out}");
    }
    let markers: Vec<HashMap<String, String>> = out
        .lines()
        .filter(|l| l.contains("endTxnMarker:"))
        .map(fields)
        .collect();
    assert_eq!(markers.len(), 2, "{out}");
    assert_eq!(
        (
            markers[0]["endTxnMarker"].as_str(),
            markers[0]["coordinatorEpoch"].as_str()
        ),
        ("ABORT", "9")
    );
    assert_eq!(
        (
            markers[1]["endTxnMarker"].as_str(),
            markers[1]["coordinatorEpoch"].as_str()
        ),
        ("COMMIT", "11")
    );
    assert!(!out.contains("isvalid: false"), "{out}");
}

/// Random operation sequences give the same entries and endOffsetFor answers in our
/// LeaderEpochCache and in Kafka's LeaderEpochFileCache; the checkpoint we flush is read back by
/// Kafka's LeaderEpochCheckpointFile.
#[test]
fn leader_epoch_cache_matches_kafka() {
    let d = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6b6d_6972);
    let mut script = String::new();
    let mut want = Vec::new();
    for seq in 0..25 {
        let dir = d.path().join(format!("p{seq}"));
        std::fs::create_dir(&dir).unwrap();
        let mut ours = LeaderEpochCache::load(&dir).unwrap();
        // Kafka's cache gets its own file so that its asynchronous flushes never race ours.
        writeln!(
            script,
            "epoch-new {}",
            d.path().join(format!("kafka-{seq}")).display()
        )
        .unwrap();
        for _ in 0..40 {
            match rng.gen_range(0..10) {
                0..=5 => {
                    let (e, o) = (rng.gen_range(0..12), rng.gen_range(0..120));
                    ours.assign(LeaderEpoch(e), Offset(o));
                    writeln!(script, "epoch-assign {e} {o}").unwrap();
                }
                6 => {
                    let o = rng.gen_range(0..120);
                    ours.truncate_from_end(Offset(o));
                    writeln!(script, "epoch-truncate-end {o}").unwrap();
                }
                7 => {
                    let o = rng.gen_range(0..120);
                    ours.truncate_from_start(Offset(o));
                    writeln!(script, "epoch-truncate-start {o}").unwrap();
                }
                _ => {
                    let (e, leo) = (rng.gen_range(-1..13), rng.gen_range(0..150));
                    let (re, ro) = ours.end_offset_for(LeaderEpoch(e), Offset(leo));
                    writeln!(script, "epoch-end-offset {e} {leo}").unwrap();
                    want.push(format!("epoch-end-offset {} {}", re.0, ro.0));
                }
            }
            writeln!(script, "epoch-entries").unwrap();
            let mut line = "epoch-entries".to_owned();
            for e in ours.entries() {
                write!(line, " {}:{}", e.epoch.0, e.start_offset.0).unwrap();
            }
            want.push(line);
        }
        ours.flush().unwrap();
        writeln!(script, "epoch-read {}", ours.path().display()).unwrap();
        for e in ours.entries() {
            want.push(format!("epoch-read {} {}", e.epoch.0, e.start_offset.0));
        }
    }
    let got = probe(d.path(), &script);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "line {i} differs (Kafka vs ours)");
    }
}

/// partition.metadata, the root offset checkpoints and the clean-shutdown marker we wrote are
/// read by Kafka's own readers with the values we wrote.
#[test]
fn small_metadata_files_are_read_by_kafka() {
    let d = tempfile::tempdir().unwrap();
    let topic_id = uuid::Uuid::new_v4();
    partition_meta::write(d.path(), topic_id).unwrap();

    let cp = d.path().join(OffsetCheckpointFile::RECOVERY_POINT);
    let offsets: BTreeMap<TopicPartition, Offset> = [
        (TopicPartition::new("orders", 0), Offset(0)),
        (TopicPartition::new("orders", 11), Offset(1 << 40)),
        (TopicPartition::new("__consumer_offsets", 3), Offset(42)),
        (TopicPartition::new("a.b-c_d", 2), Offset(7)),
    ]
    .into_iter()
    .collect();
    OffsetCheckpointFile::write(&cp, &offsets).unwrap();

    let with_epoch = d.path().join("with-epoch");
    let without_epoch = d.path().join("without-epoch");
    let removed = d.path().join("removed");
    for dir in [&with_epoch, &without_epoch, &removed] {
        std::fs::create_dir(dir).unwrap();
    }
    clean_shutdown::write(&with_epoch, Some(1234)).unwrap();
    clean_shutdown::write(&without_epoch, None).unwrap();
    clean_shutdown::write(&removed, Some(1)).unwrap();
    clean_shutdown::remove(&removed).unwrap();

    let script = format!(
        "partition-meta {}\noffsets {}\nclean-shutdown {}\nclean-shutdown {}\nclean-shutdown {}\n",
        d.path().join(partition_meta::FILE_NAME).display(),
        cp.display(),
        with_epoch.display(),
        without_epoch.display(),
        removed.display(),
    );
    let lines = probe(d.path(), &script);
    let kafka_id = lines[0].strip_prefix("partition-meta ").unwrap();
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(kafka_id)
        .unwrap();
    assert_eq!(
        decoded,
        topic_id.as_bytes(),
        "Kafka read topic id {kafka_id}"
    );

    let mut kafka_offsets: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("offsets "))
        .collect();
    kafka_offsets.sort();
    let mut want: Vec<String> = offsets
        .iter()
        .map(|(tp, o)| format!("{} {} {}", tp.topic, tp.partition, o.0))
        .collect();
    want.sort();
    assert_eq!(kafka_offsets, want);

    let shutdown: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("clean-shutdown"))
        .collect();
    assert_eq!(
        shutdown,
        [
            "clean-shutdown true OptionalLong[1234]",
            "clean-shutdown true OptionalLong.empty",
            "clean-shutdown false OptionalLong.empty"
        ]
    );
}
