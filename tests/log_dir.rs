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
