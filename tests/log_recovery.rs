//! Crash and corruption tests: a log is built, its files are damaged the way a crash or a bad
//! disk would damage them, and reopening must keep exactly the valid prefix.

use std::path::{Path, PathBuf};

use kmirror::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::recovery::LoadOptions;
use kmirror::wire::batch_builder::{control_batch, BatchBuilder, EndTxnMarker};
use rand::{Rng, SeedableRng};

fn tp() -> TopicPartition {
    TopicPartition::new("crash", 0)
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 3000,
        index_interval_bytes: 200,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// Batch `i` has offsets 2i, 2i+1, epoch i/10, timestamps 10_000 + offset.
fn batch(i: i64) -> Vec<u8> {
    let value = vec![b'x'; 50 + (i as usize % 7) * 10];
    BatchBuilder::new(Offset(2 * i))
        .leader_epoch(LeaderEpoch((i / 10) as i32))
        .record(TimestampMs(10_000 + 2 * i), Some(b"k"), Some(&value), &[])
        .record(TimestampMs(10_001 + 2 * i), Some(b"k"), Some(&value), &[])
        .build()
}

fn build(dir: &Path, n: i64) -> Vec<Vec<u8>> {
    let mut log = PartitionLog::create(dir, tp(), None, config()).expect("create");
    let bs: Vec<_> = (0..n).map(batch).collect();
    for b in &bs {
        log.append(&mut StdIo, b).expect("append");
    }
    log.close(&mut StdIo).expect("close");
    bs
}

fn logs(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

fn all_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .map(|p| {
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&p).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}

fn stored(log: &PartitionLog) -> Vec<u8> {
    log.segments()
        .iter()
        .flat_map(|s| std::fs::read(s.log_path()).expect("read"))
        .collect()
}

fn reopen(dir: &Path) -> PartitionLog {
    PartitionLog::open(
        dir,
        tp(),
        None,
        config(),
        LoadOptions::unclean(),
        &mut StdIo,
    )
    .expect("reopen")
}

/// Number of whole batches of `bs` lying entirely within the first `bytes` bytes.
fn whole_batches(bs: &[Vec<u8>], bytes: usize) -> usize {
    let mut total = 0;
    for (i, b) in bs.iter().enumerate() {
        total += b.len();
        if total > bytes {
            return i;
        }
    }
    bs.len()
}

#[test]
fn torn_tail_at_any_position_keeps_exactly_the_whole_batches_before_it() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6b6d6972);
    for round in 0..25 {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("crash-0");
        let bs = build(&dir, 60);
        let files = logs(&dir);
        // Cut a random segment at a random byte; later segments vanish as if never written.
        let victim = rng.gen_range(0..files.len());
        let len = std::fs::metadata(&files[victim]).expect("meta").len();
        let cut = rng.gen_range(0..=len);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&files[victim])
            .expect("open");
        f.set_len(cut).expect("truncate");
        for later in &files[victim + 1..] {
            std::fs::remove_file(later).expect("rm");
        }
        let before: usize = files[..victim]
            .iter()
            .map(|p| std::fs::metadata(p).expect("m").len() as usize)
            .sum();
        let keep = whole_batches(&bs, before + cut as usize);
        let log = reopen(&dir);
        assert_eq!(stored(&log), bs[..keep].concat(), "round {round}");
        assert_eq!(
            log.log_end_offset(),
            Offset(2 * keep as i64),
            "round {round}"
        );
        // The epoch cache matches the surviving batches (epoch e starts at batch 10e).
        let expected: Vec<(i32, i64)> = (0..keep as i64)
            .filter(|i| i % 10 == 0)
            .map(|i| ((i / 10) as i32, 2 * i))
            .collect();
        let got: Vec<(i32, i64)> = log
            .epoch_cache()
            .entries()
            .iter()
            .map(|e| (e.epoch.0, e.start_offset.0))
            .collect();
        assert_eq!(got, expected, "round {round}");
    }
}

#[test]
fn corrupt_byte_keeps_only_batches_before_the_damaged_one() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for round in 0..25 {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("crash-0");
        let bs = build(&dir, 60);
        let all = bs.concat();
        // Flip a byte anywhere in the log (header, CRC-covered body or length field).
        let files = logs(&dir);
        let victim = rng.gen_range(0..files.len());
        let mut bytes = std::fs::read(&files[victim]).expect("read");
        let at = rng.gen_range(0..bytes.len());
        bytes[at] ^= 1 << rng.gen_range(0..8);
        std::fs::write(&files[victim], &bytes).expect("write");
        let before: usize = files[..victim]
            .iter()
            .map(|p| std::fs::metadata(p).expect("m").len() as usize)
            .sum();
        let global = before + at;
        // The damaged batch is the one holding byte `global`. Bytes outside the CRC (base
        // offset, epoch) may survive validation; then the offsets decide, so accept any prefix
        // that ends at or after the batch before the damaged one and never includes bytes
        // after it.
        let damaged = whole_batches(&bs, global);
        let log = reopen(&dir);
        let kept = stored(&log);
        let kept_batches = whole_batches(&bs, kept.len());
        assert!(
            kept.len() <= bs[..=damaged].concat().len(),
            "round {round}: kept data after the damage"
        );
        assert!(
            kept_batches >= damaged,
            "round {round}: lost valid batches before the damage"
        );
        if kept_batches == damaged {
            assert_eq!(kept, all[..kept.len()].to_vec(), "round {round}");
        }
        // Whatever survived must be readable from the start.
        if !kept.is_empty() {
            assert!(!log.read_bytes(Offset(0), 1 << 20).expect("read").is_empty());
        }
    }
}

#[test]
fn clean_reopen_and_unclean_recovery_produce_the_same_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("crash-0");
    build(&dir, 60);
    let original = all_files(&dir);
    // Lose every index, txnindex and snapshot: an unclean open rebuilds them all.
    for (name, _) in &original {
        if name.ends_with(".index") || name.ends_with(".timeindex") {
            std::fs::remove_file(dir.join(name)).expect("rm");
        }
    }
    let log = reopen(&dir);
    log.close(&mut StdIo).expect("close");
    assert_eq!(all_files(&dir), original);
}

#[test]
fn aborted_transactions_are_indexed_and_rebuilt_by_recovery() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("crash-0");
    let mut log = PartitionLog::create(&dir, tp(), None, config()).expect("create");
    let pid = ProducerId(77);
    let value = vec![b'v'; 100];
    let data = |off: i64, seq: i32| {
        BatchBuilder::new(Offset(off))
            .leader_epoch(LeaderEpoch(0))
            .producer(pid, 3, seq)
            .transactional(true)
            .record(TimestampMs(1000 + off), None, Some(&value), &[])
            .build()
    };
    let marker = |off: i64, kind| {
        control_batch(
            Offset(off),
            LeaderEpoch(0),
            pid,
            3,
            kind,
            5,
            TimestampMs(1000 + off),
        )
    };
    let mut off = 0;
    let mut seq = 0;
    // 30 transactions of 3 records each, every third one aborted.
    for t in 0..30 {
        for _ in 0..3 {
            log.append(&mut StdIo, &data(off, seq)).expect("data");
            off += 1;
            seq += 1;
        }
        assert_eq!(log.last_stable_offset(), Offset(off - 3));
        let kind = if t % 3 == 0 {
            EndTxnMarker::Abort
        } else {
            EndTxnMarker::Commit
        };
        log.append(&mut StdIo, &marker(off, kind)).expect("marker");
        off += 1;
        assert_eq!(log.last_stable_offset(), log.log_end_offset());
    }
    // An open transaction at the end.
    log.append(&mut StdIo, &data(off, seq)).expect("data");
    assert_eq!(log.last_stable_offset(), Offset(off));
    assert!(log.segments().len() > 3);
    let mut aborted = Vec::new();
    for seg in log.segments() {
        for t in seg.txn_index().entries() {
            assert!(t.last_offset >= seg.base_offset());
            aborted.push((t.first_offset.0, t.last_offset.0));
        }
    }
    let expected: Vec<(i64, i64)> = (0..30)
        .filter(|t| t % 3 == 0)
        .map(|t| (4 * t, 4 * t + 3))
        .collect();
    assert_eq!(aborted, expected);
    log.close(&mut StdIo).expect("close");
    let original = all_files(&dir);
    assert!(original.iter().any(|(n, _)| n.ends_with(".txnindex")));
    assert!(original.iter().any(|(n, _)| n.ends_with(".snapshot")));
    for (name, _) in &original {
        if name.ends_with(".txnindex") || name.ends_with(".snapshot") || name.ends_with(".index") {
            std::fs::remove_file(dir.join(name)).expect("rm");
        }
    }
    let log = reopen(&dir);
    assert_eq!(
        log.last_stable_offset(),
        Offset(off),
        "open transaction survives recovery"
    );
    log.close(&mut StdIo).expect("close");
    // Rebuilt txnindex files equal the originals; the close-time snapshot is rewritten too.
    let rebuilt = all_files(&dir);
    for (name, bytes) in &original {
        if name.ends_with(".txnindex") || name.ends_with(".index") {
            let again = rebuilt.iter().find(|(n, _)| n == name).expect("rebuilt");
            assert_eq!(&again.1, bytes, "{name}");
        }
    }
    let last_snapshot = |files: &[(String, Vec<u8>)]| {
        files
            .iter()
            .rfind(|(n, _)| n.ends_with(".snapshot"))
            .cloned()
            .expect("snapshot")
    };
    assert_eq!(last_snapshot(&rebuilt), last_snapshot(&original));

    // Truncating below the last abort marker drops its txnindex entry and reopens the txn.
    let mut log = reopen(&dir);
    log.truncate_to(&mut StdIo, Offset(4 * 27 + 3))
        .expect("truncate");
    let last: Vec<_> = log
        .segments()
        .iter()
        .flat_map(|s| s.txn_index().entries().to_vec())
        .collect();
    assert_eq!(last.last().map(|t| t.last_offset), Some(Offset(4 * 24 + 3)));
    assert_eq!(log.last_stable_offset(), Offset(4 * 27));
}

/// Appends batches `from..` to a log with deferred flushes until it has `segments` segments;
/// returns the batches appended.
fn append_until_roll(log: &mut PartitionLog, from: i64, segments: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut i = from;
    while log.segments().len() < segments {
        let b = batch(i);
        log.append(&mut StdIo, &b).expect("append");
        out.push(b);
        i += 1;
    }
    out
}

/// Rolls `log` (two segments), then appends a batch far past its end, which rolls again: an
/// offset gap at the third segment's base (a compacted source's). Returns that base and the
/// log end.
fn roll_past_a_gap(log: &mut PartitionLog) -> (Offset, Offset) {
    let bs = append_until_roll(log, 0, 2);
    let gap_at = Offset(2 * (bs.len() as i64) + 1_000);
    log.append(&mut StdIo, &far_batch(gap_at.0))
        .expect("append past a gap");
    (gap_at, log.log_end_offset())
}

/// A batch at `offset`, big enough (about 2,970 B) to roll `config()`'s 3,000 B segments.
fn far_batch(offset: i64) -> Vec<u8> {
    BatchBuilder::new(Offset(offset))
        .record(
            TimestampMs(50_000),
            Some(b"k"),
            Some(&vec![b'y'; 2_900]),
            &[],
        )
        .build()
}

/// Goal: a crash while a roll's flush is still running (the shard does it in the background)
/// cannot leave a silent hole. The new segment's directory entry may reach the disk before the
/// rolled segment's tail; the rolled segment then ends on a batch boundary short of the next
/// base. Recovery must cut the log at that end (the mirror fetches the rest again) instead of
/// going on from the later segment past the lost batches. Once the roll's flush finished (its
/// producer snapshot written), the same layout — an offset gap a compacted source leaves — is
/// kept as it is.
#[test]
fn a_crash_before_a_rolls_flush_finished_cuts_at_the_rolled_segments_durable_end() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("crash-0");
    let mut log = PartitionLog::create(&dir, tp(), None, config()).expect("create");
    log.set_deferred_flushes(true);
    let bs = append_until_roll(&mut log, 0, 2);
    let base = log.segments()[1].base_offset();
    // A few batches in the new segment too.
    let after = (bs.len() as i64..bs.len() as i64 + 3)
        .map(batch)
        .collect::<Vec<_>>();
    for b in &after {
        log.append(&mut StdIo, b).expect("append");
    }
    assert!(log.wants_flush(), "the roll's flush never began");
    let rolled = log.segments()[0].log_path().to_path_buf();
    drop(log);
    // The crash: the rolled segment's last two batches never reached the disk.
    let keep: usize = bs[..bs.len() - 3].iter().map(Vec::len).sum();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&rolled)
        .expect("open")
        .set_len(keep as u64)
        .expect("cut");
    let durable_end = Offset(2 * (bs.len() as i64 - 3));
    assert!(durable_end < base);
    let log = reopen(&dir);
    assert_eq!(log.log_end_offset(), durable_end, "went on past the hole");
    assert_eq!(log.segments().len(), 1);
    assert_eq!(logs(&dir).len(), 1, "the later segment's files are left");
    assert_eq!(stored(&log), bs[..bs.len() - 3].concat());
    drop(log);

    // A real gap whose roll was flushed: the snapshot at the later base vouches for it.
    let dir = tmp.path().join("crash-1");
    let mut log = PartitionLog::create(&dir, tp(), None, config()).expect("create");
    let (gap_at, end) = roll_past_a_gap(&mut log);
    assert_eq!(
        log.segments().last().expect("segment").base_offset(),
        gap_at
    );
    drop(log);
    let log = reopen(&dir);
    assert_eq!(log.log_end_offset(), end, "a flushed roll's gap was cut");
}

/// Goal: a log whose rolled segments are known durable but whose rolls' producer snapshots
/// were never written (a drill clone copied while the mirror's last roll was being flushed)
/// gets them back (`snapshot_segment_bases`), so a later crash's recovery keeps an offset gap
/// at a roll instead of taking it for an unflushed roll and cutting the segments after it.
#[test]
fn missing_roll_snapshots_are_written_so_a_durable_gap_survives_recovery() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("crash-0");
    let mut log = PartitionLog::create(&dir, tp(), None, config()).expect("create");
    log.set_deferred_flushes(true);
    let (gap_at, end) = roll_past_a_gap(&mut log);
    assert_eq!(log.segments().len(), 3);
    // The files are whole (as a drill's fdatasync of them makes sure), the snapshots of the
    // two rolls were never written: the flushes never ran.
    drop(log);
    let unvouched = tmp.path().join("crash-1");
    copy_dir(&dir, &unvouched);

    let opts = LoadOptions {
        clean_shutdown: false,
        recovery_point: gap_at,
        log_start_offset: None,
    };
    let mut log = PartitionLog::open(&dir, tp(), None, config(), opts, &mut StdIo).expect("open");
    assert_eq!(
        log.snapshot_segment_bases(&mut StdIo).expect("snapshots"),
        2
    );
    drop(log);
    assert_eq!(reopen(&dir).log_end_offset(), end, "a vouched gap was cut");

    // The same files without the snapshots: recovery cuts at the gap.
    assert!(reopen(&unvouched).log_end_offset() < gap_at);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("dir") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}
