//! PartitionLog behaviour through its public API: append, roll, index layout, reads, reopen,
//! truncation and retention. Expected values come from Kafka's rules (kafka-formats.md §3),
//! modelled independently here, never from the code under test.

use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::log::config::{CleanupPolicy, FlushPolicy, LogConfig};
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::recovery::LoadOptions;
use kmirror::log::segment::{segment_file, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use kmirror::log::LogError;
use kmirror::wire::batch_builder::BatchBuilder;

/// Adds `n` records with `value_len`-byte values, timestamps `first_ts`, `first_ts + 1`, ...
fn with_records(
    mut b: BatchBuilder,
    n: usize,
    first_ts: TimestampMs,
    value_len: usize,
) -> BatchBuilder {
    let value = vec![b'v'; value_len];
    for i in 0..n {
        b = b.record(
            TimestampMs(first_ts.0 + i as i64),
            Some(b"k"),
            Some(&value),
            &[],
        );
    }
    b
}

fn tp() -> TopicPartition {
    TopicPartition::new("orders", 0)
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 300,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// `n` batches of `per` records each from offset `start`, timestamps 1000 + offset, epoch
/// changing every 7 batches.
fn batches(start: i64, n: usize, per: usize, value_len: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut off = start;
    for i in 0..n {
        out.push(
            with_records(
                BatchBuilder::new(Offset(off)).leader_epoch(LeaderEpoch((i / 7) as i32)),
                per,
                TimestampMs(1000 + off),
                value_len,
            )
            .build(),
        );
        off += per as i64;
    }
    out
}

/// Kafka's index rule, modelled from the spec: per segment, before writing a batch at position
/// p, add (lastOffset, p) when bytes since the last entry exceed the interval (counter from 0).
fn expected_index(batch_sizes_and_last: &[(usize, i64)], base: i64, interval: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    let mut since = 0u64;
    for &(size, last) in batch_sizes_and_last {
        if since > interval {
            out.extend_from_slice(&((last - base) as i32).to_be_bytes());
            out.extend_from_slice(&(pos as i32).to_be_bytes());
            since = 0;
        }
        since += size as u64;
        pos += size as u64;
    }
    out
}

#[test]
fn appended_bytes_are_stored_verbatim_and_indexed_per_batch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let config = LogConfig {
        segment_bytes: 1 << 20,
        ..small_config()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config.clone()).expect("create");
    let bs = batches(0, 30, 3, 40);
    // Several batches per append, as a fetch response delivers them.
    for chunk in bs.chunks(4) {
        let joined = chunk.concat();
        let info = log.append(&mut StdIo, &joined).expect("append");
        assert_eq!(info.bytes, joined.len() as u64);
        assert_eq!(info.batches, chunk.len() as u32);
    }
    assert_eq!(log.log_end_offset(), Offset(90));
    let all = bs.concat();
    assert_eq!(
        std::fs::read(segment_file(&dir, Offset(0), ".log")).expect("log"),
        all
    );
    let model: Vec<(usize, i64)> = bs
        .iter()
        .enumerate()
        .map(|(i, b)| (b.len(), i as i64 * 3 + 2))
        .collect();
    let idx = std::fs::read(segment_file(&dir, Offset(0), INDEX_SUFFIX)).expect("index");
    assert!(!idx.is_empty());
    assert_eq!(idx, expected_index(&model, 0, 300));
    // Reads return whole batches from the one containing the offset.
    let got = log.read_bytes(Offset(4), 1).expect("read");
    assert_eq!(got, bs[1], "min one batch even when max_bytes is smaller");
    let got = log.read_bytes(Offset(45), 10_000).expect("read");
    assert_eq!(got, all[bs[..15].concat().len()..].to_vec());
    assert!(log.read(Offset(90), 100).expect("read at end").is_none());
    assert!(matches!(
        log.read(Offset(91), 100),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    // Epoch checkpoint: one entry per epoch, at the first batch of that epoch, written when
    // the recovery point moves (recovery rebuilds the epochs of batches above it).
    log.flush(&mut StdIo).expect("flush");
    let epochs = std::fs::read_to_string(dir.join("leader-epoch-checkpoint")).expect("epochs");
    assert_eq!(epochs, "0\n5\n0 0\n1 21\n2 42\n3 63\n4 84\n");
}

#[test]
fn segments_roll_on_size_at_the_incoming_batch_offset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    // Gapped offsets (a compacted source): each batch starts 10 after the previous one.
    let mut bases = Vec::new();
    let mut sizes = Vec::new();
    for i in 0..40 {
        let b = with_records(
            BatchBuilder::new(Offset(i * 10)),
            2,
            TimestampMs(5000 + i),
            200,
        )
        .build();
        bases.push(i * 10);
        sizes.push(b.len() as u64);
        log.append(&mut StdIo, &b).expect("append");
    }
    // Model of rule 1: roll when size > segment.bytes − incoming.
    let mut expected_bases = vec![0i64];
    let mut size = 0u64;
    for (i, s) in sizes.iter().enumerate() {
        if size > 4096 - s {
            expected_bases.push(bases[i]);
            size = 0;
        }
        size += s;
    }
    let got: Vec<i64> = log.segments().iter().map(|s| s.base_offset().0).collect();
    assert_eq!(got, expected_bases);
    assert!(got.len() > 2);
    assert_eq!(log.log_end_offset(), Offset(392));
    // Rolled segments got their final time-index entry: the max timestamp of the segment.
    let first = &log.segments()[0];
    let ti = std::fs::read(segment_file(&dir, Offset(0), TIME_INDEX_SUFFIX)).expect("ti");
    let last_ts = i64::from_be_bytes(ti[ti.len() - 12..ti.len() - 4].try_into().expect("8"));
    assert_eq!(
        TimestampMs(last_ts),
        first.max_timestamp().expect("has timestamps")
    );
    // A read in a gap returns the next batch.
    let got = log.read_bytes(Offset(15), 1).expect("read");
    assert_eq!(&got[..8], &20i64.to_be_bytes());
}

#[test]
fn segments_roll_on_record_time_not_wall_time() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let config = LogConfig {
        segment_ms: 1000,
        segment_bytes: 1 << 20,
        ..small_config()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config).expect("create");
    // Replayed data from years ago, 400 ms apart.
    for i in 0..10i64 {
        let b = with_records(
            BatchBuilder::new(Offset(i)),
            1,
            TimestampMs(1_000_000 + 400 * i),
            10,
        )
        .build();
        log.append(&mut StdIo, &b).expect("append");
    }
    // First batch maxTimestamp t0; roll when incoming − t0 > 1000: at 1200 (i=3), then 1200
    // after that (i=6), then i=9.
    let got: Vec<i64> = log.segments().iter().map(|s| s.base_offset().0).collect();
    assert_eq!(got, vec![0, 3, 6, 9]);
}

#[test]
fn invalid_appends_write_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    let good = batches(0, 2, 2, 10).concat();
    log.append(&mut StdIo, &good).expect("append");
    let before = std::fs::read(segment_file(&dir, Offset(0), ".log")).expect("log");

    // Below the log end.
    let low = with_records(BatchBuilder::new(Offset(3)), 1, TimestampMs(1), 1).build();
    assert!(matches!(
        log.append(&mut StdIo, &low),
        Err(LogError::UnexpectedAppendOffset { .. })
    ));
    // A good batch followed by one with a bad CRC: neither is written.
    let ok = with_records(BatchBuilder::new(Offset(4)), 1, TimestampMs(1), 1).build();
    let mut bad = with_records(BatchBuilder::new(Offset(5)), 1, TimestampMs(1), 1).build();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert!(matches!(
        log.append(&mut StdIo, &[ok.clone(), bad].concat()),
        Err(LogError::InvalidBatch(_))
    ));
    // Offsets going backwards inside one append.
    let back = with_records(BatchBuilder::new(Offset(4)), 1, TimestampMs(1), 1).build();
    assert!(matches!(
        log.append(&mut StdIo, &[ok.clone(), back].concat()),
        Err(LogError::NonIncreasingOffsets { .. })
    ));
    // A partial trailing batch.
    let partial = [ok.clone(), ok[..30].to_vec()].concat();
    assert!(matches!(
        log.append(&mut StdIo, &partial),
        Err(LogError::PartialBatch { .. })
    ));

    assert_eq!(
        std::fs::read(segment_file(&dir, Offset(0), ".log")).expect("log"),
        before
    );
    assert_eq!(log.log_end_offset(), Offset(4));
    log.append(&mut StdIo, &ok)
        .expect("a valid append still works");
    assert_eq!(log.log_end_offset(), Offset(5));
}

#[test]
fn big_append_into_small_segments_is_split_at_batch_boundaries() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    let bs = batches(0, 40, 2, 200);
    let all = bs.concat();
    assert!(all.len() > 3 * 4096);
    log.append(&mut StdIo, &all).expect("append");
    assert!(log.segments().len() >= 3);
    let mut stored = Vec::new();
    for seg in log.segments() {
        assert!(seg.size() <= 4096);
        stored.extend(std::fs::read(seg.log_path()).expect("read"));
    }
    assert_eq!(stored, all);
}

#[test]
fn reopen_after_close_continues_where_it_left_off() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    let bs = batches(0, 30, 2, 100);
    log.append(&mut StdIo, &bs[..20].concat()).expect("append");
    let segs = log.segments().len();
    log.close(&mut StdIo).expect("close");
    let clean = LoadOptions {
        clean_shutdown: true,
        recovery_point: Offset(40),
        log_start_offset: None,
    };
    let mut log =
        PartitionLog::open(&dir, tp(), None, small_config(), clean, &mut StdIo).expect("open");
    assert_eq!(log.log_end_offset(), Offset(40));
    assert_eq!(log.segments().len(), segs);
    log.append(&mut StdIo, &bs[20..].concat()).expect("append");
    let mut stored = Vec::new();
    for seg in log.segments() {
        stored.extend(std::fs::read(seg.log_path()).expect("read"));
    }
    assert_eq!(stored, bs.concat());
}

#[test]
fn lost_or_damaged_indexes_are_rebuilt_identically() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    log.append(&mut StdIo, &batches(0, 60, 2, 100).concat())
        .expect("append");
    log.close(&mut StdIo).expect("close");
    let mut originals = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension()
                .is_some_and(|x| x == "index" || x == "timeindex")
        })
        .collect();
    files.sort();
    for f in &files {
        originals.push(std::fs::read(f).expect("read"));
    }
    // Lose one index, damage another's length, and open as after a clean shutdown.
    std::fs::remove_file(&files[0]).expect("rm");
    let damaged = &files[3];
    let mut bytes = std::fs::read(damaged).expect("read");
    bytes.push(7);
    std::fs::write(damaged, bytes).expect("write");
    let clean = LoadOptions {
        clean_shutdown: true,
        recovery_point: Offset(120),
        log_start_offset: None,
    };
    let log =
        PartitionLog::open(&dir, tp(), None, small_config(), clean, &mut StdIo).expect("open");
    log.close(&mut StdIo).expect("close");
    for (f, orig) in files.iter().zip(&originals) {
        assert_eq!(&std::fs::read(f).expect("read"), orig, "{}", f.display());
    }
}

#[test]
fn truncate_to_cuts_at_batch_boundary_and_drops_later_segments() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    let bs = batches(0, 60, 2, 100);
    log.append(&mut StdIo, &bs.concat()).expect("append");
    assert!(log.segments().len() > 2);
    // Offset 51 is inside batch 25 (offsets 50..51): the log ends at 50.
    log.truncate_to(&mut StdIo, Offset(51)).expect("truncate");
    assert_eq!(log.log_end_offset(), Offset(50));
    let mut stored = Vec::new();
    for seg in log.segments() {
        stored.extend(std::fs::read(seg.log_path()).expect("read"));
    }
    assert_eq!(stored, bs[..25].concat());
    // Epochs at or past the new end are gone (epoch 3 starts at batch 21 = offset 42, kept).
    let latest = log.epoch_cache().latest().expect("epochs");
    assert_eq!(latest, (LeaderEpoch(3), Offset(42)));
    // Appending continues from the new end.
    log.append(&mut StdIo, &bs[25..].concat()).expect("append");
    assert_eq!(log.log_end_offset(), Offset(120));
    // Truncating below the log start starts over there.
    log.truncate_fully_and_start_at(&mut StdIo, Offset(500))
        .expect("truncate fully");
    assert_eq!(
        (log.log_start_offset(), log.log_end_offset()),
        (Offset(500), Offset(500))
    );
    assert_eq!(log.segments().len(), 1);
    assert!(log.epoch_cache().is_empty());
}

#[test]
fn retention_deletes_old_segments_and_moves_log_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let config = LogConfig {
        retention_ms: Some(100),
        ..small_config()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config).expect("create");
    log.append(&mut StdIo, &batches(0, 60, 2, 100).concat())
        .expect("append");
    let segs: Vec<(Offset, TimestampMs)> = log
        .segments()
        .iter()
        .map(|s| (s.base_offset(), s.max_timestamp().expect("ts")))
        .collect();
    // "now" such that only the first two segments are older than 100 ms.
    let now = segs[1].1 .0 + 101;
    assert!(segs[2].1 .0 + 100 >= now);
    let deleted = log.delete_old_segments(&mut StdIo, now).expect("retention");
    assert_eq!(deleted, 2);
    assert_eq!(log.log_start_offset(), segs[2].0);
    assert!(!segment_file(&dir, Offset(0), ".log").exists());
    assert!(matches!(
        log.read(Offset(0), 10),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    // Everything expired: the log keeps an empty active segment at its end.
    let deleted = log
        .delete_old_segments(&mut StdIo, i64::MAX / 2)
        .expect("retention");
    assert!(deleted > 0);
    assert_eq!(log.log_start_offset(), Offset(120));
    assert_eq!(log.log_end_offset(), Offset(120));
}

#[test]
fn set_config_refuses_bad_settings_and_compact_only_turns_retention_off() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let config = LogConfig {
        retention_ms: Some(100),
        ..small_config()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config.clone()).expect("create");
    let handle = log.attach_read_view();
    log.append(&mut StdIo, &batches(0, 60, 2, 100).concat())
        .expect("append");
    let segments = log.segments().len();
    assert!(segments > 2);
    // An invalid config is refused and the current one stays, for the owner and for readers.
    let bad = LogConfig {
        segment_ms: 0,
        ..config.clone()
    };
    assert!(log.set_config(bad).is_err());
    assert_eq!(log.config(), &config);
    assert_eq!(*handle.view().config, config);
    // compact only (as the source's cleanup.policy says): nothing expires by time any more,
    // and readers see the new settings.
    let compact = LogConfig {
        cleanup: CleanupPolicy {
            delete: false,
            compact: true,
        },
        ..config.clone()
    };
    log.set_config(compact.clone()).expect("valid config");
    assert_eq!(*handle.view().config, compact);
    let deleted = log
        .delete_old_segments(&mut StdIo, i64::MAX / 2)
        .expect("retention");
    assert_eq!(deleted, 0);
    assert_eq!(log.segments().len(), segments);
    assert_eq!(log.log_start_offset(), Offset(0));
    // delete again: time retention applies.
    log.set_config(config).expect("valid config");
    assert!(
        log.delete_old_segments(&mut StdIo, i64::MAX / 2)
            .expect("retention")
            > 0
    );
    assert_eq!(log.log_start_offset(), Offset(120));
}

#[test]
fn offset_for_timestamp_finds_first_record_at_or_after() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    // Timestamps 1000 + offset.
    log.append(&mut StdIo, &batches(0, 60, 2, 100).concat())
        .expect("append");
    for target in [1000i64, 1001, 1057, 1077, 1119] {
        let got = log
            .offset_for_timestamp(TimestampMs(target))
            .expect("lookup");
        assert_eq!(
            got,
            Some((Offset(target - 1000), TimestampMs(target))),
            "target {target}"
        );
    }
    assert_eq!(
        log.offset_for_timestamp(TimestampMs(999)).expect("lookup"),
        Some((Offset(0), TimestampMs(1000)))
    );
    assert_eq!(
        log.offset_for_timestamp(TimestampMs(1120)).expect("lookup"),
        None
    );
    assert_eq!(
        log.offset_for_timestamp(TimestampMs(-1)).expect("lookup"),
        Some((Offset(120), TimestampMs::NONE))
    );
    assert_eq!(
        log.offset_for_timestamp(TimestampMs(-3)).expect("lookup"),
        Some((Offset(119), TimestampMs(1119)))
    );
}

#[test]
fn every_append_policy_moves_the_recovery_point() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let config = LogConfig {
        flush: FlushPolicy::EveryAppend,
        ..small_config()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config).expect("create");
    log.append(&mut StdIo, &batches(0, 3, 2, 10).concat())
        .expect("append");
    assert_eq!(log.recovery_point(), Offset(6));
    let config = LogConfig {
        flush: FlushPolicy::Interval {
            messages: 10,
            ms: i64::MAX,
        },
        ..small_config()
    };
    let dir2 = tmp.path().join("orders-1");
    let mut log = PartitionLog::create(&dir2, tp(), None, config).expect("create");
    log.append(&mut StdIo, &batches(0, 3, 2, 10).concat())
        .expect("append");
    assert_eq!(log.recovery_point(), Offset(0));
    log.append(&mut StdIo, &batches(6, 3, 2, 10).concat())
        .expect("append");
    assert_eq!(log.recovery_point(), Offset(12));

    // flush.ms without further appends: the owner's timer drives it with its own clock.
    let ms = i64::MAX / 4;
    let config = LogConfig {
        flush: FlushPolicy::Interval { messages: 1000, ms },
        ..small_config()
    };
    let dir3 = tmp.path().join("orders-2");
    let mut log = PartitionLog::create(&dir3, tp(), None, config).expect("create");
    log.append(&mut StdIo, &batches(0, 3, 2, 10).concat())
        .expect("append");
    assert!(!log.flush_if_due(&mut StdIo, 0).expect("not due"));
    assert_eq!(log.recovery_point(), Offset(0));
    assert!(log.flush_if_due(&mut StdIo, i64::MAX / 2).expect("due"));
    assert_eq!(log.recovery_point(), Offset(6));
    assert!(!log
        .flush_if_due(&mut StdIo, i64::MAX / 2)
        .expect("nothing left to flush"));
}

/// Stages `records` on `log`, performs its writes with `io`, completes it with the outcome.
fn staged_append(
    log: &mut PartitionLog,
    io: &mut impl kmirror::log::io::LogIo,
    records: &[u8],
    fail_with: Option<i32>,
) -> Result<kmirror::log::partition_log::AppendInfo, LogError> {
    let view = log.attach_read_view();
    let end_before = log.log_end_offset();
    assert_eq!(view.view().high_watermark, end_before);
    let staged = log
        .stage_append(records)
        .unwrap()
        .expect("fits the active segment");
    // Readers see nothing of a staged append.
    assert!(log.log_end_offset() > end_before);
    let ops: Vec<_> = log.staged_writes(&staged, records).collect();
    let mut results = Vec::new();
    io.write_batch(&ops, &mut results);
    drop(ops);
    assert_eq!(view.view().high_watermark, end_before);
    let written = match fail_with {
        Some(errno) => Err(std::io::Error::from_raw_os_error(errno)),
        None => kmirror::log::io::first_error(&mut results),
    };
    let result = log.finish_append(io, staged, records, written);
    let exposed = view.view().high_watermark;
    match &result {
        Ok(_) => assert_eq!(exposed, log.log_end_offset(), "exposed once written"),
        Err(_) => assert_eq!(exposed, end_before, "a failed append is never exposed"),
    }
    result
}

// Goal: the staged append a shard batches over a response (stage, perform the planned writes,
// finish) leaves exactly the files and state of an ordinary append, and a failed write is
// rolled back as `append` does: ENOSPC leaves the log usable and unchanged, EIO takes it
// offline. Method: the same batches into two logs, one by `append` and one staged; compare
// every file; then stage one more batch and fail its writes.
#[test]
fn staged_appends_write_what_append_writes_and_roll_back_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let config = LogConfig {
        segment_bytes: 1 << 20,
        ..small_config()
    };
    let mut plain = PartitionLog::create(&a, tp(), None, config.clone()).unwrap();
    let mut staged = PartitionLog::create(&b, tp(), None, config).unwrap();
    let all = batches(0, 40, 3, 50);
    for chunk in all.chunks(4) {
        let records = chunk.concat();
        plain.append(&mut StdIo, &records).unwrap();
        staged_append(&mut staged, &mut StdIo, &records, None).unwrap();
    }
    assert_eq!(staged.log_end_offset(), plain.log_end_offset());
    for suffix in [".log", INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
        let name = |d: &std::path::Path| segment_file(d, Offset(0), suffix);
        let (x, y) = (
            std::fs::read(name(&a)).unwrap(),
            std::fs::read(name(&b)).unwrap(),
        );
        assert!(!x.is_empty(), "{suffix} has entries");
        assert_eq!(x, y, "{suffix}");
    }
    let end = staged.log_end_offset();
    let size = |d: &std::path::Path, s: &str| {
        std::fs::metadata(segment_file(d, Offset(0), s))
            .unwrap()
            .len()
    };
    let sizes = (size(&b, ".log"), size(&b, INDEX_SUFFIX));
    let more = batches(end.0, 4, 3, 50).concat();
    let err = staged_append(&mut staged, &mut StdIo, &more, Some(libc::ENOSPC)).unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    assert!(staged.offline_reason().is_none());
    assert_eq!(staged.log_end_offset(), end);
    assert_eq!((size(&b, ".log"), size(&b, INDEX_SUFFIX)), sizes);
    // Space is back: the same records go in.
    staged_append(&mut staged, &mut StdIo, &more, None).unwrap();
    let last = batches(staged.log_end_offset().0, 2, 3, 50).concat();
    staged_append(&mut staged, &mut StdIo, &last, Some(libc::EIO)).unwrap_err();
    assert!(staged.offline_reason().is_some());
    assert!(staged.append(&mut StdIo, &last).is_err());
}

/// Records the inode of every file `sync_data` is called on, and passes everything through.
#[derive(Default)]
struct SyncRecorder {
    synced: Vec<u64>,
}

impl kmirror::log::io::LogIo for SyncRecorder {
    fn write_all_at(&mut self, file: &std::fs::File, pos: u64, data: &[u8]) -> std::io::Result<()> {
        StdIo.write_all_at(file, pos, data)
    }

    fn sync_data(&mut self, file: &std::fs::File) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        self.synced.push(file.metadata()?.ino());
        file.sync_data()
    }
}

fn inode(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("metadata").ino()
}

/// Appends 2-record batches of 200-byte values from `next` until the log has `segments`
/// segments; returns the next offset.
fn append_until_segments(
    log: &mut PartitionLog,
    io: &mut impl kmirror::log::io::LogIo,
    mut next: i64,
    segments: usize,
) -> i64 {
    while log.segments().len() < segments {
        let b = with_records(
            BatchBuilder::new(Offset(next)),
            2,
            TimestampMs(5000 + next),
            200,
        )
        .build();
        log.append(io, &b).expect("append");
        next += 2;
    }
    next
}

/// Goal: a segment roll no longer fdatasyncs the rolled segment on the append path (a
/// gigabyte's write-back held a shard for seconds). With deferred flushes (the shard's mode)
/// the roll only asks for a flush; the owner plans it, goes on appending while its syncs run,
/// and the recovery point moves to the plan's target — not past it — when it reports success;
/// a flush asked for meanwhile waits for that one. Without deferral the append that rolled
/// flushes before it returns, as before.
#[test]
fn a_roll_asks_for_a_flush_that_a_deferring_owner_performs_while_appends_go_on() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let mut log = PartitionLog::create(&dir, tp(), None, small_config()).expect("create");
    log.set_deferred_flushes(true);
    let mut io = SyncRecorder::default();
    let next = append_until_segments(&mut log, &mut io, 0, 2);
    let first = [
        inode(&segment_file(&dir, Offset(0), LOG_SUFFIX)),
        inode(&segment_file(&dir, Offset(0), INDEX_SUFFIX)),
        inode(&segment_file(&dir, Offset(0), TIME_INDEX_SUFFIX)),
    ];
    assert!(
        !io.synced.iter().any(|i| first.contains(i)),
        "the append that rolled synced the rolled segment"
    );
    assert_eq!(log.recovery_point(), Offset(0));
    assert!(log.wants_flush());

    let plan = log.begin_flush(&mut io).expect("begin").expect("a plan");
    let target = log.log_end_offset();
    assert_eq!(plan.target(), target);
    let planned: Vec<u64> = plan.syncs().iter().map(|s| inode(s.path())).collect();
    for i in first {
        assert!(
            planned.contains(&i),
            "the plan misses a rolled segment file"
        );
    }
    // Appends go on while the plan's syncs run; a second roll's flush waits for this one.
    let next = append_until_segments(&mut log, &mut io, next, 3);
    assert!(log.flush_in_flight());
    assert!(!log.wants_flush(), "no second flush while one is in flight");
    assert!(log.begin_flush(&mut io).expect("begin").is_none());
    for s in plan.syncs() {
        s.file().sync_data().expect("fdatasync");
    }
    log.finish_flush(&mut io, plan, Ok(())).expect("finish");
    assert_eq!(log.recovery_point(), target);
    assert!(log.recovery_point() < log.log_end_offset());
    assert!(log.wants_flush(), "the second roll's flush is still wanted");

    let plan = log.begin_flush(&mut io).expect("begin").expect("a plan");
    let planned: Vec<u64> = plan.syncs().iter().map(|s| inode(s.path())).collect();
    assert!(
        !planned.contains(&first[0]),
        "a segment below the recovery point is synced again"
    );
    for s in plan.syncs() {
        s.file().sync_data().expect("fdatasync");
    }
    log.finish_flush(&mut io, plan, Ok(())).expect("finish");
    assert_eq!(log.recovery_point(), log.log_end_offset());
    assert!(!log.wants_flush());

    // A failed sync takes the log offline and leaves the recovery point where it was.
    let rp = log.recovery_point();
    append_until_segments(&mut log, &mut io, next, 4);
    let plan = log.begin_flush(&mut io).expect("begin").expect("a plan");
    let failed = LogError::io(
        plan.syncs()[0].path(),
        std::io::Error::from_raw_os_error(libc::EIO),
    );
    assert!(log.finish_flush(&mut io, plan, Err(failed)).is_err());
    assert!(log.offline_reason().is_some());
    assert_eq!(log.recovery_point(), rp);

    // Without deferral: the append that rolls returns with everything flushed.
    let dir2 = tmp.path().join("orders-1");
    let mut log = PartitionLog::create(&dir2, tp(), None, small_config()).expect("create");
    append_until_segments(&mut log, &mut StdIo, 0, 2);
    assert_eq!(log.recovery_point(), log.log_end_offset());
    assert!(!log.wants_flush());
    assert!(!log.flush_in_flight());
}

/// Disk blocks the file holds (st_blocks is in 512-byte units).
fn allocated_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("metadata").blocks() * 512
}

#[test]
fn an_active_segment_reserves_blocks_ahead_without_growing_and_gives_them_back_on_roll() {
    const MIB: usize = 1024 * 1024;
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("orders-0");
    let config = LogConfig {
        segment_bytes: 6 * MIB as u64,
        ..small_config()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config).expect("create");
    // 64 KiB batches, four per append, until the segment holds 3 MiB.
    let bs = batches(0, 120, 1, 64 * 1024);
    let mut written = Vec::new();
    let first = segment_file(&dir, Offset(0), LOG_SUFFIX);
    let mut next = 0;
    while written.len() < 3 * MIB {
        let joined = bs[next..next + 4].concat();
        log.append(&mut StdIo, &joined).expect("append");
        written.extend_from_slice(&joined);
        next += 4;
    }
    // The file holds exactly the bytes appended; the blocks run ahead of them (this test's
    // filesystem supports fallocate: ext4, xfs and tmpfs all do), by at most as much again as
    // the segment holds.
    assert_eq!(std::fs::read(&first).expect("log"), written);
    let held = written.len() as u64;
    let blocks = allocated_bytes(&first);
    assert!(
        blocks > held.next_multiple_of(4096) && blocks <= 2 * held + 64 * 1024,
        "{blocks} bytes of blocks for {held} bytes written"
    );
    // Reopening (revalidating every batch) sees the true end: nothing past it to cut.
    log.close(&mut StdIo).expect("close");
    let mut log = PartitionLog::open(
        &dir,
        tp(),
        None,
        small_config_6mib(),
        LoadOptions::unclean(),
        &mut StdIo,
    )
    .expect("reopen");
    assert_eq!(log.log_end_offset(), Offset(next as i64));
    // Append on until the segment rolls: the sealed segment keeps only its own blocks.
    while next + 4 <= bs.len() && segment_count(&dir) == 1 {
        let joined = bs[next..next + 4].concat();
        log.append(&mut StdIo, &joined).expect("append");
        written.extend_from_slice(&joined);
        next += 4;
    }
    assert_eq!(segment_count(&dir), 2, "the segment rolled");
    let sealed = std::fs::read(&first).expect("sealed log");
    assert_eq!(sealed, written[..sealed.len()].to_vec());
    assert!(
        allocated_bytes(&first) < sealed.len() as u64 + 64 * 1024,
        "{} bytes of blocks for a sealed segment of {}",
        allocated_bytes(&first),
        sealed.len()
    );
}

fn small_config_6mib() -> LogConfig {
    LogConfig {
        segment_bytes: 6 * 1024 * 1024,
        ..small_config()
    }
}

fn segment_count(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(LOG_SUFFIX))
        })
        .count()
}
