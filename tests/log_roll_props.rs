//! Property tests of the roll and index rules against a model written from the spec
//! (kafka-formats.md §3.2, §3.3, §3.9), and of all-or-nothing appends under failing I/O.

use std::fs::File;
use std::path::Path;

use kmirror::ids::{Offset, TimestampMs, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::{LogIo, StdIo};
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::segment::{segment_file, INDEX_SUFFIX};
use kmirror::wire::batch_builder::BatchBuilder;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Spec {
    gap: i64,
    records: usize,
    value_len: usize,
    ts_step: i64,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![8 => Just(0i64), 3 => 1i64..5, 1 => Just(i32::MAX as i64 - 2)],
        1usize..4,
        0usize..400,
        prop_oneof![3 => 0i64..50, 1 => 0i64..2000],
    )
        .prop_map(|(gap, records, value_len, ts_step)| Spec {
            gap,
            records,
            value_len,
            ts_step,
        })
}

fn make(specs: &[Spec]) -> Vec<(Vec<u8>, i64, i64, i64)> {
    let mut out = Vec::new();
    let mut next = 0i64;
    let mut ts = 1_000_000i64;
    for s in specs {
        let base = next + s.gap;
        ts += s.ts_step;
        let value = vec![b'x'; s.value_len];
        let mut b = BatchBuilder::new(Offset(base));
        for _ in 0..s.records {
            b = b.record(TimestampMs(ts), None, Some(&value), &[]);
        }
        let bytes = b.build();
        let last = base + s.records as i64 - 1;
        out.push((bytes, base, last, ts));
        next = last + 1;
    }
    out
}

/// One segment of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelSegment {
    base: i64,
    size: u64,
    index: Vec<(i64, u64)>,
}

/// Kafka's rules, one batch per append, written from the spec.
fn model(batches: &[(Vec<u8>, i64, i64, i64)], c: &LogConfig) -> Vec<ModelSegment> {
    let oi_max = (c.segment_index_bytes / 8) as usize;
    let ti_max = (c.segment_index_bytes / 12) as usize;
    let mut segs = vec![ModelSegment {
        base: 0,
        size: 0,
        index: vec![],
    }];
    let (mut first_ts, mut since, mut max_ts, mut time_entries, mut last_time_ts) =
        (None::<i64>, 0u64, -1i64, 0usize, -1i64);
    let mut leo = 0i64;
    for (bytes, base, last, ts) in batches {
        let size = bytes.len() as u64;
        let seg = segs.last().expect("segment");
        let waited = first_ts.map_or(0, |f| ts - f);
        let roll = seg.size > c.segment_bytes - size
            || (seg.size > 0 && waited > c.segment_ms)
            || seg.index.len() >= oi_max
            || time_entries + 1 >= ti_max
            || last - seg.base > i32::MAX as i64;
        if roll {
            segs.push(ModelSegment {
                base: (*base).max(leo),
                size: 0,
                index: vec![],
            });
            first_ts = None;
            since = 0;
            max_ts = -1;
            time_entries = 0;
            last_time_ts = -1;
        }
        let seg = segs.last_mut().expect("segment");
        if seg.size == 0 {
            first_ts = Some(*ts);
        }
        if *ts > max_ts {
            max_ts = *ts;
        }
        if since > c.index_interval_bytes as u64 {
            seg.index.push((*last - seg.base, seg.size));
            if max_ts > last_time_ts {
                time_entries += 1;
                last_time_ts = max_ts;
            }
            since = 0;
        }
        since += size;
        seg.size += size;
        leo = last + 1;
    }
    segs
}

fn index_entries(dir: &Path, base: i64) -> Vec<(i64, u64)> {
    let bytes = std::fs::read(segment_file(dir, Offset(base), INDEX_SUFFIX)).expect("index");
    bytes
        .chunks_exact(8)
        .map(|e| {
            let rel = i32::from_be_bytes(e[..4].try_into().expect("4")) as i64;
            let pos = i32::from_be_bytes(e[4..].try_into().expect("4")) as u64;
            (rel, pos)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn rolls_and_index_entries_follow_the_rules(
        specs in proptest::collection::vec(spec(), 1..80),
        segment_bytes in 600u64..6000,
        segment_ms in 100i64..5000,
        index_interval in 0u32..1500,
        index_bytes in prop_oneof![Just(48u32), Just(96u32), Just(10 * 1024 * 1024u32)],
    ) {
        let config = LogConfig {
            segment_bytes,
            segment_ms,
            index_interval_bytes: index_interval,
            segment_index_bytes: index_bytes,
            retention_ms: None,
            ..LogConfig::default()
        };
        let batches = make(&specs);
        prop_assume!(batches.iter().all(|b| b.0.len() as u64 <= segment_bytes));
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("p-0");
        let mut log = PartitionLog::create(&dir, TopicPartition::new("p", 0), None, config.clone()).expect("create");
        for (bytes, ..) in &batches {
            log.append(&mut StdIo, bytes).expect("append");
        }
        let expected = model(&batches, &config);
        let got: Vec<ModelSegment> = log
            .segments()
            .iter()
            .map(|s| ModelSegment {
                base: s.base_offset().0,
                size: s.size(),
                index: index_entries(&dir, s.base_offset().0),
            })
            .collect();
        prop_assert_eq!(got, expected);
    }
}

/// A disk that fails after `budget` bytes, mid-write.
struct FailingIo {
    budget: usize,
}

impl LogIo for FailingIo {
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> std::io::Result<()> {
        if data.len() <= self.budget {
            self.budget -= data.len();
            return StdIo.write_all_at(file, pos, data);
        }
        let part = self.budget;
        self.budget = 0;
        StdIo.write_all_at(file, pos, &data[..part])?;
        // A full disk (ENOSPC) is the one write error after which the log stays usable; any
        // other takes it offline (tests/log_disk_faults.rs).
        Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
    }

    fn sync_data(&mut self, file: &File) -> std::io::Result<()> {
        StdIo.sync_data(file)
    }
}

fn all_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        // A roll done before the failed write may stay (with its final time-index entry and a
        // snapshot): that is a state Kafka itself produces. Data and offset index must not move.
        .filter(|p| p.extension().is_some_and(|x| x == "log" || x == "index"))
        .map(|p| {
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&p).expect("read"),
            )
        })
        .filter(|(_, bytes)| !bytes.is_empty())
        .collect();
    v.sort();
    v
}

#[test]
fn a_failed_write_leaves_the_log_as_before() {
    let specs: Vec<Spec> = (0..40)
        .map(|i| Spec {
            gap: 0,
            records: 2,
            value_len: 100 + i % 5,
            ts_step: 7,
        })
        .collect();
    let batches = make(&specs);
    let config = LogConfig {
        segment_bytes: 2500,
        index_interval_bytes: 300,
        retention_ms: None,
        ..LogConfig::default()
    };
    let (head, tail) = batches.split_at(20);
    let chunk: Vec<u8> = tail.iter().flat_map(|b| b.0.clone()).collect();
    for budget in (0..chunk.len() + 200).step_by(97) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("f-0");
        let mut log = PartitionLog::create(&dir, TopicPartition::new("f", 0), None, config.clone())
            .expect("create");
        for (bytes, ..) in head {
            log.append(&mut StdIo, bytes).expect("append");
        }
        let before = all_files(&dir);
        let end = log.log_end_offset();
        match log.append(&mut FailingIo { budget }, &chunk) {
            Ok(_) => {
                assert!(
                    budget >= chunk.len(),
                    "budget {budget} cannot hold the append"
                );
                continue;
            }
            Err(_) => {
                assert_eq!(log.log_end_offset(), end, "budget {budget}");
                assert_eq!(all_files(&dir), before, "budget {budget}");
                kmirror::ops::log_tools::verify(&dir).expect("consistent after a failed append");
            }
        }
        // The log is usable again and ends up as if nothing had failed.
        log.append(&mut StdIo, &chunk)
            .expect("append after failure");
        assert_eq!(log.log_end_offset(), Offset(80));
        let stored: Vec<u8> = log
            .segments()
            .iter()
            .flat_map(|s| std::fs::read(s.log_path()).expect("read"))
            .collect();
        assert_eq!(
            stored,
            batches
                .iter()
                .flat_map(|b| b.0.clone())
                .collect::<Vec<u8>>()
        );
    }
}
