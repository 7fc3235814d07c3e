//! The golden storage test: batches written by a real Kafka 4.1.1 broker, appended into a
//! kmirror `PartitionLog` with the same topic settings, must give the same files.
//!
//! The broker's partition holds all five codecs, plain, idempotent and transactional producers
//! with commits and aborts (so control batches and a `.txnindex`), in small segments with dense
//! indexes. kmirror appends the broker's batches one by one, as the broker appended them (one
//! per produce request, plus the markers the coordinator writes), so roll points and index
//! entries follow the same rules on the same inputs. Kafka's DumpLogSegments then checks
//! kmirror's files, and every `.log`, `.index`, `.timeindex` and `.txnindex` is compared with
//! the broker's byte for byte. `kmirror log verify` must accept the broker's own directory and
//! reject a damaged copy, naming the batch.

mod harness;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::files::{copy_partition_trimmed, index_bytes_trimmed};
use harness::{Codec, Kafka, ProduceOpts, TxnEnd};
use kmirror::ids::{Offset, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::wire::batch::Batches;

const SEGMENT_BYTES: u64 = 20_000;
const INDEX_INTERVAL_BYTES: u32 = 500;

/// The broker partition all tests here read (made once: producing it takes a dozen client runs).
fn broker_partition() -> &'static (String, i64) {
    static PARTITION: OnceLock<(String, i64)> = OnceLock::new();
    PARTITION.get_or_init(|| produce_mix(harness::shared()))
}

/// Produces the mix of batches the tests need into partition 0 of a new topic; returns the topic
/// and the log end offset once every transaction marker is in the log.
fn produce_mix(k: &Kafka) -> (String, i64) {
    let topic = harness::unique_topic("golden");
    let segment = SEGMENT_BYTES.to_string();
    let interval = INDEX_INTERVAL_BYTES.to_string();
    k.create_topic(
        &topic,
        1,
        &[
            (k.version.segment_bytes_config(), &segment),
            ("index.interval.bytes", &interval),
        ],
    );
    for (i, codec) in Codec::ALL.iter().enumerate() {
        let opts = ProduceOpts {
            codec: *codec,
            seed: i as u64,
            headers: 1,
            ..Default::default()
        };
        k.produce(&topic, 0, 150, &opts);
    }
    let idempotent = ProduceOpts {
        codec: Codec::Lz4,
        idempotent: true,
        seed: 10,
        ..Default::default()
    };
    let mut end = k.produce(&topic, 0, 200, &idempotent).last_offset + 1;
    for (i, codec) in [Codec::Zstd, Codec::Gzip, Codec::None].iter().enumerate() {
        let txn = ProduceOpts {
            codec: *codec,
            seed: 20 + i as u64,
            transactions: vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit],
            ..Default::default()
        };
        // The last record's offset, then one marker offset after it.
        end = k.produce(&topic, 0, 150, &txn).last_offset + 2;
    }
    k.wait_for_log_end(&topic, 0, end);
    (topic, end)
}

fn with_ext(files: &[PathBuf], ext: &str) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == ext))
        .cloned()
        .collect()
}

fn names(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn kmirror_config() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT_BYTES,
        index_interval_bytes: INDEX_INTERVAL_BYTES,
        ..LogConfig::default()
    }
}

/// Appends every batch of the broker's segments, in offset order, one append per batch.
fn append_batch_by_batch(broker_logs: &[PathBuf], log: &mut PartitionLog) -> usize {
    let mut appended = 0;
    for seg in broker_logs {
        let bytes = std::fs::read(seg).unwrap();
        for item in Batches::new(&bytes) {
            let (_, batch) = item.unwrap_or_else(|e| panic!("{}: {e}", seg.display()));
            log.append(&mut StdIo, batch.bytes())
                .unwrap_or_else(|e| panic!("append at {}: {e}", batch.base_offset()));
            appended += 1;
        }
    }
    appended
}

#[test]
fn kmirror_writes_the_brokers_files() {
    let k = harness::shared();
    let (topic, end) = broker_partition();
    let end = *end;
    let broker_dir = k.partition_dir(topic, 0);
    // A trimmed copy: the live active segment's indexes carry 10 MiB of preallocated zeros.
    let scratch = tempfile::tempdir().unwrap();
    let broker_files = copy_partition_trimmed(&broker_dir, &scratch.path().join("broker"));
    let broker_logs = with_ext(&broker_files, "log");
    assert!(
        broker_logs.len() >= 4,
        "small segments give several: {:?}",
        names(&broker_logs)
    );

    let topic_id = kmirror::log::partition_meta::read(&broker_dir).unwrap();
    assert!(topic_id.is_some(), "the broker wrote partition.metadata");
    let ours = scratch.path().join(format!("{topic}-0"));
    let tp = TopicPartition::new(topic.clone(), 0);
    let mut log = PartitionLog::create(&ours, tp, topic_id, kmirror_config()).unwrap();
    let batches = append_batch_by_batch(&broker_logs, &mut log);
    assert_eq!(log.log_end_offset(), Offset(end));
    // Compared while open, like the broker's live files: closing adds the active segment's
    // final time-index entry (as Kafka's own close does), which the running broker has not
    // written yet whenever the segment's max timestamp is not already indexed.
    log.flush(&mut StdIo).unwrap();

    let our_files = segment_files(&ours);
    assert_eq!(
        names(&with_ext(&our_files, "log")),
        names(&broker_logs),
        "segments roll at the same offsets"
    );
    for ext in ["log", "txnindex"] {
        assert_eq!(
            names(&with_ext(&our_files, ext)),
            names(&with_ext(&broker_files, ext))
        );
        for (mine, theirs) in with_ext(&our_files, ext)
            .iter()
            .zip(with_ext(&broker_files, ext))
        {
            let (a, b) = (
                std::fs::read(mine).unwrap(),
                std::fs::read(&theirs).unwrap(),
            );
            assert!(
                a == b,
                "{} differs from the broker's ({} vs {} bytes)",
                mine.display(),
                a.len(),
                b.len()
            );
        }
    }
    let mut entries = 0;
    for ext in ["index", "timeindex"] {
        assert_eq!(
            names(&with_ext(&our_files, ext)),
            names(&with_ext(&broker_files, ext))
        );
        for (mine, theirs) in with_ext(&our_files, ext)
            .iter()
            .zip(with_ext(&broker_files, ext))
        {
            let (a, b) = (index_bytes_trimmed(mine), index_bytes_trimmed(&theirs));
            assert_eq!(a, b, "{} entries differ from the broker's", mine.display());
            entries += b.len();
        }
    }
    assert!(
        entries > 0,
        "index.interval.bytes={INDEX_INTERVAL_BYTES} gives index entries"
    );
    assert_eq!(
        std::fs::read(ours.join("partition.metadata")).unwrap(),
        std::fs::read(broker_dir.join("partition.metadata")).unwrap()
    );
    let active_timeindex = with_ext(&our_files, "timeindex").pop().unwrap();
    let open_entries = index_bytes_trimmed(&active_timeindex);
    log.close(&mut StdIo).unwrap();
    let closed_entries = index_bytes_trimmed(&active_timeindex);
    assert!(
        closed_entries.starts_with(&open_entries)
            && closed_entries.len() - open_entries.len() <= 12,
        "close only appends the final time-index entry"
    );

    // Kafka's verdict on kmirror's files: every record decompressed, indexes checked both ways.
    let dump = dump_log_segments(&our_files, DumpFlags::DEEP_SANITY);
    dump.assert_clean();
    assert_eq!(dump.batches.len(), batches);
    for codec in Codec::ALL {
        assert!(
            dump.batches.iter().any(|b| b.codec == codec.name()),
            "{codec:?} batch present"
        );
    }
    assert_eq!(
        dump.batches.iter().filter(|b| b.is_control).count(),
        9,
        "3 x commit/abort/commit"
    );
    dump_log_segments(&our_files, DumpFlags::DEEP).assert_clean();
    let verify = dump_log_segments(&our_files, DumpFlags::VERIFY_INDEX_ONLY);
    verify.assert_clean();
}

#[test]
fn kmirror_splits_one_large_append_into_segments() {
    // A fetch hands kmirror many batches at once; one append of the whole partition (several
    // segments' worth) must be split into segments that Kafka accepts, holding the same bytes.
    let k = harness::shared();
    let (topic, end) = broker_partition();
    let end = *end;
    let scratch = tempfile::tempdir().unwrap();
    let broker_files = copy_partition_trimmed(&k.partition_dir(topic, 0), scratch.path());
    let ours = scratch.path().join("ours-0");
    let tp = TopicPartition::new(topic.clone(), 0);
    let mut log = PartitionLog::create(&ours, tp, None, kmirror_config()).unwrap();
    let broker_bytes: Vec<u8> = with_ext(&broker_files, "log")
        .iter()
        .flat_map(|f| std::fs::read(f).unwrap())
        .collect();
    assert!(broker_bytes.len() as u64 > 3 * SEGMENT_BYTES);
    let info = log.append(&mut StdIo, &broker_bytes).unwrap();
    assert_eq!(
        (info.first_offset, info.last_offset),
        (Offset(0), Offset(end - 1))
    );
    assert_eq!(log.log_end_offset(), Offset(end));
    log.close(&mut StdIo).unwrap();
    let our_files = segment_files(&ours);
    let ours_bytes: Vec<u8> = with_ext(&our_files, "log")
        .iter()
        .flat_map(|f| std::fs::read(f).unwrap())
        .collect();
    assert!(
        ours_bytes == broker_bytes,
        "the log holds the broker's bytes, in order"
    );
    dump_log_segments(&our_files, DumpFlags::DEEP_SANITY).assert_clean();
    dump_log_segments(&our_files, DumpFlags::DEEP).assert_clean();
}

fn kmirror_verify(dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["log", "verify"])
        .arg(dir)
        .output()
        .expect("run kmirror log verify")
}

#[test]
fn kmirror_log_verify_judges_broker_directories() {
    let k = harness::shared();
    let (topic, _) = broker_partition();
    let broker_dir = k.partition_dir(topic, 0);

    let out = kmirror_verify(&broker_dir);
    assert!(
        out.status.success(),
        "kmirror log verify rejects the broker's live directory:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Damage one record byte of the second batch of the second segment.
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join(format!("{topic}-0"));
    let files = copy_partition_trimmed(&broker_dir, &copy);
    let seg = &with_ext(&files, "log")[1];
    let mut bytes = std::fs::read(seg).unwrap();
    let (pos, victim) = Batches::new(&bytes).nth(1).unwrap().unwrap();
    let victim_offset = victim.base_offset();
    let at = pos + victim.size() - 1;
    bytes[at] ^= 0x5a;
    std::fs::write(seg, &bytes).unwrap();

    let out = kmirror_verify(&copy);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "kmirror log verify accepts a damaged batch"
    );
    assert!(
        stderr.contains(&victim_offset.0.to_string()),
        "the complaint names offset {victim_offset}: {stderr}"
    );
    // Kafka agrees that the copy is damaged.
    let dump = dump_log_segments(std::slice::from_ref(seg), DumpFlags::DEEP_SANITY);
    assert!(dump.has_error("isvalid: false"), "{:?}", dump.errors);
}
