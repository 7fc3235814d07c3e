//! LogDir: many partitions under one root, root checkpoints and the clean-shutdown marker.

use std::path::Path;

use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::log::checkpoint::OffsetCheckpointFile;
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::log_dir::LogDir;
use kmirror::wire::batch_builder::BatchBuilder;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2000,
        retention_ms: None,
        ..LogConfig::default()
    }
}

fn batch(offset: i64) -> Vec<u8> {
    BatchBuilder::new(Offset(offset))
        .leader_epoch(LeaderEpoch(1))
        .record(
            TimestampMs(5000 + offset),
            Some(b"k"),
            Some(&[b'v'; 120]),
            &[],
        )
        .build()
}

fn checkpoint(root: &Path, name: &str) -> Vec<(String, i32, i64)> {
    OffsetCheckpointFile::read(&root.join(name))
        .expect("checkpoint")
        .into_iter()
        .map(|(tp, o)| (tp.topic, tp.partition, o.0))
        .collect()
}

#[test]
fn clean_close_marks_and_reopen_unmarks() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let mut dir = LogDir::open(&root, config(), &mut StdIo).expect("open");
    let a = TopicPartition::new("alpha", 0);
    let b = TopicPartition::new("beta.x-y", 7);
    let id = uuid::Uuid::new_v4();
    for i in 0..40 {
        dir.get_or_create(&a, Some(id), None)
            .expect("a")
            .append(&mut StdIo, &batch(i))
            .expect("append");
    }
    for i in 0..5 {
        dir.get_or_create(&b, None, None)
            .expect("b")
            .append(&mut StdIo, &batch(100 + i))
            .expect("append");
    }
    dir.close(&mut StdIo).expect("close");
    assert!(root.join(".kafka_cleanshutdown").exists());
    assert_eq!(
        checkpoint(&root, "recovery-point-offset-checkpoint"),
        vec![("alpha".into(), 0, 40), ("beta.x-y".into(), 7, 105)]
    );
    // No log start lies above its first segment base, so Kafka would record none.
    assert_eq!(checkpoint(&root, "log-start-offset-checkpoint"), vec![]);
    assert_eq!(
        checkpoint(&root, "replication-offset-checkpoint"),
        vec![("alpha".into(), 0, 40), ("beta.x-y".into(), 7, 105)]
    );
    let dir = LogDir::open(&root, config(), &mut StdIo).expect("reopen");
    assert!(!root.join(".kafka_cleanshutdown").exists());
    assert_eq!(dir.get(&a).expect("a").log_end_offset(), Offset(40));
    assert_eq!(dir.get(&a).expect("a").topic_id(), Some(id));
    assert_eq!(dir.get(&b).expect("b").log_end_offset(), Offset(105));
    assert!(dir.get(&a).expect("a").segments().len() > 1);
}

// Goal: a dir of many partitions, closed on several threads, ends exactly as a one-by-one
// close would: every partition's producer snapshot at its log end, every recovery point in the
// checkpoint, then the marker; a reopen trusts it and finds every end.
#[test]
fn a_close_of_many_partitions_snapshots_each_at_its_end() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let mut dir = LogDir::open(&root, config(), &mut StdIo).expect("open");
    let parts: Vec<TopicPartition> = (0..48).map(|p| TopicPartition::new("many", p)).collect();
    for (k, tp) in parts.iter().enumerate() {
        let log = dir.get_or_create(tp, None, None).expect("create");
        for i in 0..(k as i64 % 5 + 1) {
            log.append(&mut StdIo, &batch(i)).expect("append");
        }
    }
    dir.close(&mut StdIo).expect("close");
    assert!(root.join(".kafka_cleanshutdown").exists());
    let points = checkpoint(&root, "recovery-point-offset-checkpoint");
    assert_eq!(points.len(), parts.len());
    for (k, tp) in parts.iter().enumerate() {
        let end = k as i64 % 5 + 1;
        assert!(points.contains(&("many".into(), tp.partition, end)), "{tp}");
        let snapshot = root.join(tp.dir_name()).join(format!("{end:020}.snapshot"));
        assert!(snapshot.exists(), "{tp}: no snapshot at its end {end}");
    }
    let dir = LogDir::open(&root, config(), &mut StdIo).expect("reopen");
    for (k, tp) in parts.iter().enumerate() {
        assert_eq!(
            dir.get(tp).expect("reopened").log_end_offset(),
            Offset(k as i64 % 5 + 1)
        );
    }
}

#[test]
fn crash_without_close_recovers_from_the_recovery_point() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let tp = TopicPartition::new("alpha", 0);
    let mut dir = LogDir::open(&root, config(), &mut StdIo).expect("open");
    for i in 0..30 {
        dir.get_or_create(&tp, None, None)
            .expect("log")
            .append(&mut StdIo, &batch(i))
            .expect("append");
    }
    dir.flush(&mut StdIo).expect("flush");
    for i in 30..40 {
        dir.get_mut(&tp)
            .expect("log")
            .append(&mut StdIo, &batch(i))
            .expect("append");
    }
    let active = dir
        .get(&tp)
        .expect("log")
        .segments()
        .last()
        .expect("seg")
        .log_path()
        .to_path_buf();
    drop(dir); // crash: no close, no marker
               // The unsynced tail was torn mid-batch.
    let len = std::fs::metadata(&active).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .expect("open")
        .set_len(len - 7)
        .expect("cut");
    assert!(!root.join(".kafka_cleanshutdown").exists());
    let dir = LogDir::open(&root, config(), &mut StdIo).expect("reopen");
    let log = dir.get(&tp).expect("log");
    assert_eq!(
        log.log_end_offset(),
        Offset(39),
        "only the torn last batch is lost"
    );
    assert_eq!(log.read_bytes(Offset(38), 1).expect("read"), batch(38));
}

/// Small segments and an index entry every few batches, so a checkpoint lands mid-segment and
/// the indexes have entries on both sides of it.
fn indexed_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4000,
        index_interval_bytes: 300,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// Every file under `root` (relative path → bytes), for comparing two trees.
fn tree(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, bytes) in tree(from) {
        let p = to.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

// Goal: a partition whose log a shard owns is checkpointed at the recovery point its owner
// flushed to, and after a crash (nothing closed) only the batches after that point are
// revalidated; the indexes rebuilt from there equal those a full revalidation builds.
#[test]
fn after_a_crash_only_what_follows_the_checkpoint_is_revalidated() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let mut dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("open");
    let tp = TopicPartition::new("owned", 0);
    dir.get_or_create(&tp, None, None).expect("create");
    // Lent out, as to a shard: the log dir no longer holds it.
    let mut log = dir.take(&tp).expect("take");
    let mut next = 0;
    while log.segments().len() < 3 || log.segments().last().unwrap().size() < 1500 {
        log.append(&mut StdIo, &batch(next)).expect("append");
        next += 1;
    }
    // The owner's checkpoint flush, then the log dir's checkpoint write.
    log.flush(&mut StdIo).expect("flush");
    let checkpointed = log.log_end_offset();
    assert!(
        log.segments().last().unwrap().base_offset() < checkpointed,
        "the checkpoint must fall inside the active segment"
    );
    dir.write_checkpoints().expect("checkpoint");
    assert_eq!(
        checkpoint(&root, "recovery-point-offset-checkpoint"),
        vec![("owned".into(), 0, checkpointed.0)]
    );
    let mut after_bytes = 0;
    for _ in 0..6 {
        let b = batch(next);
        after_bytes += b.len() as u64;
        log.append(&mut StdIo, &b).expect("append");
        next += 1;
    }
    // kill -9: nothing is closed, no marker.
    drop(log);
    drop(dir);
    let full = tmp.path().join("full");
    copy_tree(&root, &full);
    std::fs::remove_file(full.join("recovery-point-offset-checkpoint")).unwrap();

    let dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("reopen");
    let log = dir.get(&tp).expect("log");
    assert!(log.recovered_at_open());
    let r = log.revalidated_at_open();
    assert_eq!((r.bytes, r.batches, r.cut), (after_bytes, 6, 0));
    assert_eq!(log.log_end_offset(), Offset(next));
    drop(dir);
    let dir = LogDir::open(&full, indexed_config(), &mut StdIo).expect("reopen full");
    let all = dir.get(&tp).expect("log").revalidated_at_open();
    assert_eq!(
        all.batches, next as u64,
        "without a checkpoint everything is re-read"
    );
    drop(dir);
    let (ours, theirs) = (tree(&root.join("owned-0")), tree(&full.join("owned-0")));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &ours {
        assert!(
            bytes == &theirs[name],
            "{name} differs after a partial revalidation"
        );
    }
}

// Goal: opening on many threads gives exactly what opening on one does: the same partitions,
// log ends, cut tails, indexes, snapshots and checkpoint files, byte for byte.
#[test]
fn parallel_recovery_equals_serial_recovery() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let mut dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("open");
    for p in 0..16 {
        let tp = TopicPartition::new("par", p);
        let log = dir.get_or_create(&tp, None, None).expect("create");
        for i in 0..(10 + 3 * p as i64) {
            log.append(&mut StdIo, &batch(i)).expect("append");
        }
        if p % 3 == 0 {
            log.flush(&mut StdIo).expect("flush");
        }
    }
    dir.write_checkpoints().expect("checkpoint");
    drop(dir);
    // A torn tail in one partition: recovery must cut it the same way on every thread count.
    let torn = root.join("par-5");
    let active = std::fs::read_dir(&torn)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max()
        .unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&active)
        .unwrap();
    std::io::Write::write_all(&mut f, &batch(999)[..40]).unwrap();
    let (one, many) = (tmp.path().join("one"), tmp.path().join("many"));
    copy_tree(&root, &one);
    copy_tree(&root, &many);
    let serial = LogDir::open_on_threads(&one, indexed_config(), &mut StdIo, 1).expect("serial");
    let parallel =
        LogDir::open_on_threads(&many, indexed_config(), &mut StdIo, 4).expect("parallel");
    let facts = |d: &LogDir| -> Vec<(TopicPartition, i64, i64, u64, u64, u64)> {
        d.partitions()
            .map(|(tp, l)| {
                let r = l.revalidated_at_open();
                (
                    tp.clone(),
                    l.log_end_offset().0,
                    l.recovery_point().0,
                    r.bytes,
                    r.batches,
                    r.cut,
                )
            })
            .collect()
    };
    let (a, b) = (facts(&serial), facts(&parallel));
    assert_eq!(a.len(), 16);
    assert!(a.iter().any(|f| f.5 == 40), "the torn tail was cut: {a:?}");
    assert_eq!(a, b);
    drop((serial, parallel));
    assert_eq!(tree(&one), tree(&many));
}

// Goal: after a crash, the log dir's open makes the re-read batches durable with one syncfs and
// then moves each recovered partition's recovery point to its log end; a leader-epoch checkpoint
// the rebuild left unchanged is not rewritten, and one it changed (epochs never flushed before
// the crash) is written by the partition's first flush, which only then moves its recovery point.
#[test]
fn crash_recovery_moves_recovery_points_after_one_sync_and_rewrites_nothing_unchanged() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let mut dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("open");
    let flushed = TopicPartition::new("flushed", 0);
    let fresh = TopicPartition::new("fresh", 0);
    dir.get_or_create(&flushed, None, None).expect("create");
    dir.get_or_create(&fresh, None, None).expect("create");
    let mut a = dir.take(&flushed).expect("take");
    let mut b = dir.take(&fresh).expect("take");
    for i in 0..4 {
        a.append(&mut StdIo, &batch(i)).expect("append");
    }
    a.flush(&mut StdIo).expect("flush");
    let checkpointed = a.log_end_offset();
    dir.write_checkpoints().expect("checkpoint");
    // More batches of the same epoch: the epoch checkpoint on file stays right for them.
    for i in 4..10 {
        a.append(&mut StdIo, &batch(i)).expect("append");
    }
    // Never flushed: its epoch is only in memory when the process dies.
    for i in 0..5 {
        b.append(&mut StdIo, &batch(i)).expect("append");
    }
    let epochs_a = root.join("flushed-0/leader-epoch-checkpoint");
    let inode_before = std::fs::metadata(&epochs_a)
        .expect("epochs of flushed")
        .ino();
    let index_a = tree(&root.join("flushed-0"));
    // kill -9: nothing is closed.
    drop((a, b, dir));
    assert_eq!(
        checkpoint(&root, "recovery-point-offset-checkpoint"),
        vec![
            ("flushed".into(), 0, checkpointed.0),
            ("fresh".into(), 0, 0)
        ]
    );

    let mut dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("reopen");
    for (tp, batches) in [(&flushed, 6), (&fresh, 5)] {
        let log = dir.get(tp).expect("log");
        assert!(log.recovered_at_open(), "{tp} was recovered");
        assert_eq!(log.revalidated_at_open().batches, batches, "{tp} re-read");
    }
    assert_eq!(
        std::fs::metadata(&epochs_a).expect("epochs").ino(),
        inode_before,
        "an unchanged epoch checkpoint is not rewritten"
    );
    // The rebuilt indexes (and everything else) are the files as they were before the crash;
    // the time index gains the entry for the recovered end that recovery always adds.
    let after = tree(&root.join("flushed-0"));
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        index_a.keys().collect::<Vec<_>>()
    );
    for (name, before) in &index_a {
        if name.ends_with(".timeindex") {
            assert!(after[name].starts_with(before), "{name} lost entries");
        } else {
            assert!(&after[name] == before, "{name} differs after recovery");
        }
    }
    // `flushed` moved to its end; `fresh` waits for its epochs to reach the disk.
    assert_eq!(
        checkpoint(&root, "recovery-point-offset-checkpoint"),
        vec![("flushed".into(), 0, 10), ("fresh".into(), 0, 0)]
    );
    let log = dir.get(&fresh).expect("fresh");
    assert!(log.has_unflushed(), "the first flush round must take it");
    let mut log = dir.take(&fresh).expect("take");
    log.flush(&mut StdIo).expect("flush");
    let text = std::fs::read_to_string(root.join("fresh-0/leader-epoch-checkpoint")).unwrap();
    assert_eq!(text, "0\n1\n1 0\n");
    dir.write_checkpoints().expect("checkpoint");
    assert_eq!(
        checkpoint(&root, "recovery-point-offset-checkpoint"),
        vec![("flushed".into(), 0, 10), ("fresh".into(), 0, 5)]
    );
}

// Goal: when every recovered partition waits for its first flush (its epochs changed, so its
// recovery point may not move at open), the open still makes recovery's writes durable with its
// syncfs; and a second kill -9 before that flush recovers the partition again from the same
// point, over several segments, to the same log.
#[test]
fn a_partition_waiting_for_its_first_flush_is_synced_and_recovers_again_after_a_second_crash() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    let mut dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("open");
    let tp = TopicPartition::new("deferred", 0);
    dir.get_or_create(&tp, None, None).expect("create");
    let mut log = dir.take(&tp).expect("take");
    let mut next = 0;
    while log.segments().len() < 3 {
        log.append(&mut StdIo, &batch(next)).expect("append");
        next += 1;
    }
    // Rolls flushed the sealed segments and epoch 1; a new leader epoch since then reached no
    // checkpoint file.
    for _ in 0..3 {
        let b = BatchBuilder::new(Offset(next))
            .leader_epoch(LeaderEpoch(2))
            .record(TimestampMs(9000 + next), Some(b"k"), Some(&[b'w'; 90]), &[])
            .build();
        log.append(&mut StdIo, &b).expect("append");
        next += 1;
    }
    let end = log.log_end_offset();
    let recovery_point = log.recovery_point();
    dir.write_checkpoints().expect("checkpoint");
    drop((log, dir));

    for round in 0..2 {
        let dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("reopen");
        assert!(
            dir.synced_at_open(),
            "round {round}: recovery's writes were synced"
        );
        let log = dir.get(&tp).expect("log");
        assert!(log.recovered_at_open());
        assert_eq!(log.log_end_offset(), end, "round {round}");
        assert_eq!(
            log.recovery_point(),
            recovery_point,
            "round {round}: the recovery point waits for the first flush"
        );
        assert!(log.revalidated_at_open().batches > 0);
        // kill -9 again before any flush.
        drop(dir);
    }
    let mut dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("reopen");
    let mut log = dir.take(&tp).expect("take");
    log.flush(&mut StdIo).expect("flush");
    assert_eq!(log.recovery_point(), end);
    dir.restore(log);
    dir.close(&mut StdIo).expect("close");
    let dir = LogDir::open(&root, indexed_config(), &mut StdIo).expect("clean reopen");
    assert!(!dir.synced_at_open(), "a clean open recovers nothing");
    assert_eq!(dir.get(&tp).expect("log").log_end_offset(), end);
}
