//! Descriptors held by many partitions (log/lazy_file): an idle partition holds none, a written
//! one holds its active `.log`, and index files stay within `INDEX_FILES_HELD_MAX` for the
//! whole process however many partitions write them. Counted in /proc/self/fd; this binary has
//! one test so nothing else opens files meanwhile.

use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::limits::INDEX_FILES_HELD_MAX;
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::lazy_file::budgeted_held;
use kmirror::log::log_dir::LogDir;
use kmirror::wire::batch_builder::BatchBuilder;

/// Enough partitions that their index files (two each) pass the budget.
const PARTITIONS: i32 = INDEX_FILES_HELD_MAX as i32 / 2 + 100;
/// Descriptors the test itself may open besides the partitions' (tempdir, stdio, threads).
const SLACK: usize = 32;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

fn batch(offset: i64) -> Vec<u8> {
    BatchBuilder::new(Offset(offset))
        .leader_epoch(LeaderEpoch(1))
        .record(
            TimestampMs(5000 + offset),
            Some(b"k"),
            Some(&[b'v'; 200]),
            &[],
        )
        .build()
}

#[test]
fn thousands_of_partitions_stay_within_the_descriptor_budget() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("data");
    // An index entry for every batch after the first, so every partition writes both indexes.
    let config = LogConfig {
        index_interval_bytes: 1,
        retention_ms: None,
        ..LogConfig::default()
    };
    let tps: Vec<(TopicPartition, Option<uuid::Uuid>)> = (0..PARTITIONS)
        .map(|p| (TopicPartition::new("many", p), None))
        .collect();
    let base = open_fds();
    let mut dir = LogDir::open(&root, config.clone(), &mut StdIo).expect("open");
    assert_eq!(
        dir.create_missing(&tps).expect("create"),
        PARTITIONS as usize
    );
    let created = open_fds();
    assert!(
        created <= base + SLACK,
        "{PARTITIONS} new, unwritten partitions hold {} descriptors",
        created - base
    );
    for (tp, _) in &tps {
        let log = dir.get_mut(tp).expect("created");
        for i in 0..3 {
            log.append(&mut StdIo, &batch(i)).expect("append");
        }
    }
    let written = open_fds();
    let bound = base + PARTITIONS as usize + INDEX_FILES_HELD_MAX + SLACK;
    assert!(
        written <= bound,
        "{written} descriptors open after writing {PARTITIONS} partitions, bound {bound}"
    );
    assert!(budgeted_held() <= INDEX_FILES_HELD_MAX);
    // Past the budget the indexes were still written, through descriptors opened per write.
    for (tp, _) in tps.iter().rev().take(3) {
        let seg = &dir.get(tp).expect("log").segments()[0];
        let dir_path = root.join(tp.dir_name());
        let index = std::fs::metadata(dir_path.join("00000000000000000000.index")).expect("index");
        assert_eq!(index.len(), seg.offset_index().len() as u64 * 8);
        assert_eq!(seg.offset_index().len(), 2);
    }
    // A crash: no flush, no close, so the next open revalidates every batch and rebuilds the
    // indexes, holding each partition's files only while it does.
    drop(dir);
    assert!(
        open_fds() <= base + SLACK,
        "dropping the logs closes everything"
    );
    let dir = LogDir::open(&root, config, &mut StdIo).expect("reopen");
    let reopened = open_fds();
    assert!(
        reopened <= base + SLACK,
        "{PARTITIONS} reopened, idle partitions hold {} descriptors",
        reopened - base
    );
    for (tp, _) in &tps {
        let log = dir.get(tp).expect("reopened");
        assert_eq!(log.log_end_offset(), Offset(3), "{tp}");
        assert_eq!(log.segments()[0].offset_index().len(), 2, "{tp}");
    }
}
