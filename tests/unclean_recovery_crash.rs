//! Goal: the unclean-election recovery (`control::unclean_recovery`, issue 14 item 2) is
//! crash-safe and never loses a record: a kill -9 at any point of it leaves the old or the
//! truncated log, and a truncated log always has a complete quarantine beside it; running the
//! recovery again after the crash ends exactly where an uninterrupted one does (one quarantine
//! take holding exactly the cut batches, the same log bytes). Method: a real multi-segment
//! partition log; the recovery runs through a `LogIo` "disk" that dies at its Nth write or
//! sync (every later one fails too, like a killed process), for every N until one run gets
//! through; the log is then reopened from disk with recovery, as after a crash. Kafka's
//! DumpLogSegments reading the quarantine is checked by the broker test (mirror_unclean.rs).

mod harness;

use std::fs::File;
use std::path::{Path, PathBuf};

use harness::serve::log_bytes;
use kmirror::control::unclean_recovery::{self, recover, LABEL_PREFIX};
use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::log::config::{FlushPolicy, LogConfig};
use kmirror::log::io::{LogIo, StdIo};
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::quarantine::Quarantine;
use kmirror::log::recovery::LoadOptions;
use kmirror::wire::batch_builder::BatchBuilder;

/// A disk that completes `ops_left` writes and syncs, then fails every one (a dead process).
struct DyingDisk {
    ops_left: usize,
    died: bool,
}

impl DyingDisk {
    fn op(&mut self) -> std::io::Result<()> {
        if self.ops_left == 0 {
            self.died = true;
            return Err(std::io::Error::other("killed"));
        }
        self.ops_left -= 1;
        Ok(())
    }
}

impl LogIo for DyingDisk {
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> std::io::Result<()> {
        self.op()?;
        StdIo.write_all_at(file, pos, data)
    }

    fn sync_data(&mut self, file: &File) -> std::io::Result<()> {
        self.op()?;
        StdIo.sync_data(file)
    }
}

fn tp() -> TopicPartition {
    TopicPartition::new("ule", 0)
}

fn config() -> LogConfig {
    LogConfig {
        // A segment per two batches: the cut deletes whole segments and cuts one.
        segment_bytes: 700,
        flush: FlushPolicy::EveryAppend,
        ..LogConfig::default()
    }
}

fn batch(base: i64, epoch: i32, n: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(epoch));
    for i in 0..n {
        b = b.value(
            TimestampMs(1_700_000_000_000 + base * 10 + i as i64),
            &[b'a' + (base % 26) as u8; 60],
        );
    }
    b.build()
}

/// Offsets 0..15 in batches of 3: epoch 1 for 0..6, epoch 2 for 6..15.
fn build(data_dir: &Path) -> PartitionLog {
    build_with(data_dir, &[(0, 1), (3, 1), (6, 2), (9, 2), (12, 2)])
}

/// Batches of 3 records at (base offset, leader epoch).
fn build_with(data_dir: &Path, batches: &[(i64, i32)]) -> PartitionLog {
    let mut log = PartitionLog::create(&data_dir.join("ule-0"), tp(), None, config()).unwrap();
    for &(base, epoch) in batches {
        log.append(&mut StdIo, &batch(base, epoch, 3)).unwrap();
    }
    assert!(log.segments().len() >= 3, "several segments");
    log
}

fn reopen(data_dir: &Path) -> PartitionLog {
    PartitionLog::open(
        &data_dir.join("ule-0"),
        tp(),
        None,
        config(),
        LoadOptions::unclean(),
        &mut StdIo,
    )
    .unwrap()
}

/// Label directories under the quarantine holding this partition, complete or not.
fn takes(data_dir: &Path) -> Vec<PathBuf> {
    let root = Quarantine::new(data_dir).root().to_path_buf();
    let Ok(rd) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .map(|e| e.unwrap().path().join("ule-0"))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

fn segment_of(take: &Path) -> Vec<u8> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(take)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    assert_eq!(files.len(), 1, "one segment per take: {files:?}");
    std::fs::read(files.pop().unwrap()).unwrap()
}

// The source (leader epoch 2 elected uncleanly at offset 9, say) answers that its log for our
// last epoch 2 ends at 9: batches 9..15 are ours alone.
const SOURCE: (LeaderEpoch, Offset) = (LeaderEpoch(2), Offset(9));

#[test]
fn kill_at_any_point_leaves_old_or_truncated_log_and_a_complete_quarantine() {
    // The uninterrupted run, for reference.
    let reference = tempfile::tempdir().unwrap();
    let mut log = build(reference.path());
    let old = log_bytes(&reference.path().join("ule-0"));
    let q = Quarantine::new(reference.path());
    let r = recover(&mut log, &mut StdIo, &q, SOURCE, 1_000)
        .unwrap()
        .expect("diverges");
    assert_eq!((r.first_offset, r.end_offset), (9, 15));
    assert_eq!((r.batches, r.records), (2, 6));
    assert_eq!(r.epochs, vec![2]);
    assert!(r.complete);
    assert_eq!(log.log_end_offset(), Offset(9));
    drop(log);
    let truncated = log_bytes(&reference.path().join("ule-0"));
    let cut = segment_of(&takes(reference.path())[0]);
    // Nothing lost: the truncated log and the quarantine are the old log, byte for byte.
    assert_eq!([truncated.clone(), cut.clone()].concat(), old);

    // `n` is also the number of crash points tried before this run.
    for n in 0.. {
        let dir = tempfile::tempdir().unwrap();
        let mut log = build(dir.path());
        let q = Quarantine::new(dir.path());
        let mut disk = DyingDisk {
            ops_left: n,
            died: false,
        };
        let outcome = recover(&mut log, &mut disk, &q, SOURCE, 1_000 + n as i64);
        if !disk.died {
            outcome.unwrap().expect("diverges");
            assert!(n > 3, "the recovery writes and syncs several times");
            break;
        }
        assert!(outcome.is_err(), "crash at op {n} is reported");
        drop(log); // killed: nothing closed
        let now = log_bytes(&dir.path().join("ule-0"));
        let complete = unclean_recovery::load(&q).unwrap();
        assert!(
            now == old || now == truncated,
            "crash at op {n}: the log is neither the old nor the truncated one"
        );
        if now == truncated {
            assert_eq!(
                complete.len(),
                1,
                "crash at op {n}: truncated without quarantine"
            );
            assert_eq!(complete[0].1.quarantined_records, 6);
        }

        // Restarted: the source answers the same; the recovery ends where the reference did.
        let mut log = reopen(dir.path());
        let again = recover(&mut log, &mut StdIo, &q, SOURCE, 50_000).unwrap();
        if now == truncated {
            assert!(again.is_none(), "nothing diverges any more");
        }
        drop(log);
        assert_eq!(log_bytes(&dir.path().join("ule-0")), truncated, "op {n}");
        let all = takes(dir.path());
        assert_eq!(
            all.len(),
            1,
            "op {n}: exactly one take, no partial one: {all:?}"
        );
        assert_eq!(
            segment_of(&all[0]),
            cut,
            "op {n}: the quarantine holds the cut batches"
        );
        let loaded = unclean_recovery::load(&q).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].0, tp());
        assert_eq!(loaded[0].1.count, 1);
        assert_eq!(loaded[0].1.recent[0].first_offset, 9);
        assert!(all[0]
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(LABEL_PREFIX));
    }
}

// Goal: when our history lacks the source leader's epoch, the first cut stops at the end of
// our epoch below it (Kafka's follower rule) and the next answer cuts further; each cut goes
// to its own take and both are counted.
#[test]
fn an_incomplete_answer_cuts_in_two_rounds_and_keeps_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = build_with(dir.path(), &[(0, 1), (3, 1), (6, 3), (9, 3), (12, 3)]);
    let old = log_bytes(&dir.path().join("ule-0"));
    let q = Quarantine::new(dir.path());
    // The source holds epochs 1 (0..5) and 2 (from 5, to its end 8), never our 3. Asked about
    // our epoch 3 it answers its largest epoch ≤ 3: (2, 8). We lack epoch 2: cut where our
    // epoch 1 ends (6) and ask again.
    let first = recover(&mut log, &mut StdIo, &q, (LeaderEpoch(2), Offset(8)), 1)
        .unwrap()
        .expect("diverges");
    assert_eq!((first.first_offset, first.end_offset), (6, 15));
    assert!(!first.complete);
    assert_eq!(first.epochs, vec![3]);
    // Asked about epoch 1 it answers (1, 5): our batch 3..6 holds 5, so it goes whole.
    let second = recover(&mut log, &mut StdIo, &q, (LeaderEpoch(1), Offset(5)), 2)
        .unwrap()
        .expect("diverges");
    assert_eq!((second.first_offset, second.end_offset), (3, 6));
    assert!(second.complete);
    assert_eq!(log.log_end_offset(), Offset(3));
    // A third answer agreeing with us cuts nothing.
    assert!(
        recover(&mut log, &mut StdIo, &q, (LeaderEpoch(1), Offset(5)), 3)
            .unwrap()
            .is_none()
    );
    drop(log);
    let all = takes(dir.path());
    assert_eq!(all.len(), 2);
    // What is left plus the two takes, newest cut first, is the old log byte for byte.
    let rebuilt = [
        log_bytes(&dir.path().join("ule-0")),
        segment_of(&all[1]),
        segment_of(&all[0]),
    ]
    .concat();
    assert_eq!(rebuilt, old);
    let loaded = unclean_recovery::load(&q).unwrap();
    assert_eq!(loaded[0].1.count, 2);
    assert_eq!(loaded[0].1.quarantined_records, 12);
}
