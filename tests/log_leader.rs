//! The partition log as a leader after failover (KIP-1279 §9): promotion aborts what the source
//! left open, raises the leader epoch and forgets the source's producers, durably (clean and
//! unclean reopen); leader appends get offsets from the log end, the new epoch, and Kafka's
//! idempotence rules. Expected values are the test's own inputs and Kafka's rules; Kafka's own
//! DumpLogSegments reads the result.

mod harness;

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use kmirror::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::{AbortedOpen, PartitionLog, ProduceError, ProduceOutcome};
use kmirror::log::recovery::LoadOptions;
use kmirror::wire::batch::{Batch, Batches};
use kmirror::wire::batch_builder::{control_batch, BatchBuilder, EndTxnMarker};

const SOURCE_EPOCH: LeaderEpoch = LeaderEpoch(3);
const NEW_EPOCH: LeaderEpoch = LeaderEpoch(7);
const MAX_MESSAGE_BYTES: usize = 1_048_588;
const T0: i64 = 1_700_000_000_000;

fn tp() -> TopicPartition {
    TopicPartition::new("orders", 0)
}

fn values(b: BatchBuilder, n: usize) -> BatchBuilder {
    (0..n).fold(b, |b, i| b.value(TimestampMs(T0 + i as i64), b"payload"))
}

/// A mirrored history as the source wrote it, at the source's offsets:
/// 0-1 plain; 2-3 txn of producer 100 (left open); 4-6 idempotent producer 200; 7 txn of
/// producer 300 and its COMMIT at 8; 9 txn of producer 400 (left open); a compaction gap; 12
/// plain. Log end 13.
fn mirrored_history() -> Vec<Vec<u8>> {
    let at = |o: i64| BatchBuilder::new(Offset(o)).leader_epoch(SOURCE_EPOCH);
    vec![
        values(at(0), 2).build(),
        values(at(2).producer(ProducerId(100), 2, 0).transactional(true), 2).build(),
        values(at(4).producer(ProducerId(200), 0, 0), 3).build(),
        values(at(7).producer(ProducerId(300), 1, 0).transactional(true), 1).build(),
        control_batch(
            Offset(8),
            SOURCE_EPOCH,
            ProducerId(300),
            1,
            EndTxnMarker::Commit,
            4,
            TimestampMs(T0),
        ),
        values(at(9).producer(ProducerId(400), 0, 0).transactional(true), 1).build(),
        values(at(12), 1).build(),
    ]
}

fn mirrored_log(dir: &std::path::Path) -> PartitionLog {
    let mut log = PartitionLog::create(dir, tp(), None, LogConfig::default()).unwrap();
    for b in mirrored_history() {
        log.append(&mut StdIo, &b).unwrap();
    }
    assert_eq!(log.log_end_offset(), Offset(13));
    log
}

/// Reopens the partition: after a clean shutdown, or after a crash with the recovery point the
/// root checkpoint holds (`None`: the checkpoint was lost, so everything is revalidated).
fn reopen(dir: &std::path::Path, clean: bool, recovery_point: Option<Offset>) -> PartitionLog {
    let load = LoadOptions {
        clean_shutdown: clean,
        recovery_point: recovery_point.unwrap_or(Offset::ZERO),
        log_start_offset: None,
    };
    PartitionLog::open(dir, tp(), None, LogConfig::default(), load, &mut StdIo).unwrap()
}

/// Every batch of the log, read back through the log's own reader, across segments (the
/// markers written "now" roll a segment of old record times: segment.ms counts record time).
fn all_batches(log: &PartitionLog) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut from = log.log_start_offset();
    while from < log.log_end_offset() {
        let bytes = log.read_bytes(from, 1 << 30).unwrap();
        for b in Batches::new(&bytes) {
            let b = b.unwrap().1;
            from = b.next_offset();
            out.push(b.bytes().to_vec());
        }
    }
    out
}

/// (producer id, first offset, marker offset) of every `.txnindex` entry of the log.
fn aborted_entries(log: &PartitionLog) -> Vec<(i64, i64, i64)> {
    log.segments()
        .iter()
        .flat_map(|s| s.txn_index().entries().to_vec())
        .map(|t| (t.producer_id.0, t.first_offset.0, t.last_offset.0))
        .collect()
}

fn assert_source_producers_gone(log: &PartitionLog) {
    for pid in [100, 200, 300, 400] {
        assert!(
            log.producer_state().producer(ProducerId(pid)).is_none(),
            "source producer {pid} still has state"
        );
    }
}

#[test]
fn promotion_aborts_open_transactions_raises_the_epoch_and_forgets_source_producers() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("orders-0");
    let mut log = mirrored_log(&dir);
    assert_eq!(
        log.last_stable_offset(),
        Offset(2),
        "producer 100's transaction is open"
    );

    let promotion = log.promote(&mut StdIo, NEW_EPOCH).unwrap();
    assert_eq!(
        promotion.aborted,
        vec![
            AbortedOpen {
                producer_id: ProducerId(100),
                first_offset: Offset(2),
                marker_offset: Offset(13),
            },
            AbortedOpen {
                producer_id: ProducerId(400),
                first_offset: Offset(9),
                marker_offset: Offset(14),
            },
        ]
    );
    assert_eq!(promotion.log_end, Offset(15));
    assert_eq!(
        log.last_stable_offset(),
        Offset(15),
        "no transaction is left open"
    );
    assert_eq!(log.epoch_cache().latest(), Some((NEW_EPOCH, Offset(13))));
    assert_source_producers_gone(&log);

    // The markers are real ABORTs for the open producers, at the new epoch.
    let batches = all_batches(&log);
    let markers: Vec<Batch<'_>> = batches
        .iter()
        .map(|b| Batch::parse_valid(b).unwrap().unwrap())
        .filter(|b| b.is_control())
        .collect();
    assert_eq!(markers.len(), 3, "the source's COMMIT and two ABORTs");
    for (m, pid, epoch) in [(&markers[1], 100, 2), (&markers[2], 400, 0)] {
        assert_eq!(m.producer_id(), ProducerId(pid));
        assert_eq!(m.producer_epoch(), epoch);
        assert_eq!(m.partition_leader_epoch(), NEW_EPOCH);
        assert_eq!(
            m.control_type(),
            Some(kmirror::wire::batch::ControlType::Abort)
        );
    }
    assert_eq!(aborted_entries(&log), vec![(100, 2, 13), (400, 9, 14)]);

    // Promoting again at the same epoch (a crash after it) changes nothing; a lower one fails.
    let again = log.promote(&mut StdIo, NEW_EPOCH).unwrap();
    assert!(again.aborted.is_empty());
    assert_eq!(again.log_end, Offset(15));
    assert!(matches!(
        log.promote(&mut StdIo, LeaderEpoch(6)),
        Err(ProduceError::StaleLeaderEpoch { .. })
    ));

    // Durable: after a clean close, and after a crash once the owner has checkpointed the
    // recovery point (promotion flushed everything up to 15) the source producers stay
    // forgotten.
    log.close(&mut StdIo).unwrap();
    for (clean, recovery_point) in [(true, None), (false, Some(Offset(15)))] {
        let log = reopen(&dir, clean, recovery_point);
        assert_eq!(log.log_end_offset(), Offset(15), "clean={clean}");
        assert_eq!(log.last_stable_offset(), Offset(15), "clean={clean}");
        assert_eq!(log.epoch_cache().latest(), Some((NEW_EPOCH, Offset(13))));
        assert_source_producers_gone(&log);
    }
    // With the checkpoint lost, recovery replays the source's batches and their producers come
    // back; promoting again at the same epoch (what the owner does for a partition it has not
    // yet recorded as STOPPED) forgets them and writes no new marker.
    let mut log = reopen(&dir, false, None);
    assert!(log.producer_state().producer(ProducerId(200)).is_some());
    let again = log.promote(&mut StdIo, NEW_EPOCH).unwrap();
    assert!(
        again.aborted.is_empty(),
        "the ABORT markers are already in the log"
    );
    assert_eq!(again.log_end, Offset(15));
    assert_source_producers_gone(&log);
    log.close(&mut StdIo).unwrap();

    // Kafka's reader agrees: valid batches, the two ABORT markers at epoch 7.
    let out = dump_log_segments(&segment_files(&dir), DumpFlags::DEEP);
    out.assert_clean();
    let aborts: Vec<_> = out
        .records
        .iter()
        .filter(|(_, f)| f.get("endTxnMarker").map(String::as_str) == Some("ABORT"))
        .collect();
    assert_eq!(aborts.len(), 2, "{}", out.stdout);
    let last_two: Vec<_> = out.batches.iter().rev().take(2).collect();
    for b in last_two {
        assert!(b.is_control && b.is_valid, "{b:?}");
        assert_eq!(b.fields["partitionLeaderEpoch"], "7", "{b:?}");
    }
}

fn produced(pid: i64, epoch: i16, seq: i32, n: usize) -> Vec<u8> {
    // Producers send base offset 0 and no leader epoch; the leader fills both in.
    values(
        BatchBuilder::new(Offset(0)).producer(ProducerId(pid), epoch, seq),
        n,
    )
    .build()
}

#[test]
fn leader_appends_take_offsets_from_the_log_end_and_follow_kafkas_idempotence_rules() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("orders-0");
    let mut log = mirrored_log(&dir);
    log.promote(&mut StdIo, NEW_EPOCH).unwrap();
    let end = log.log_end_offset().0;
    let append = |log: &mut PartitionLog, mut b: Vec<u8>| {
        log.append_as_leader(&mut StdIo, &mut b, NEW_EPOCH, MAX_MESSAGE_BYTES)
    };

    let first = produced(1000, 0, 0, 3);
    assert_eq!(
        append(&mut log, first.clone()).unwrap(),
        ProduceOutcome::Appended {
            base_offset: Offset(end),
            last_offset: Offset(end + 2)
        }
    );
    // A retry (the same sequences) gets the same offsets and writes nothing.
    assert_eq!(
        append(&mut log, first.clone()).unwrap(),
        ProduceOutcome::Duplicate {
            base_offset: Offset(end),
            last_offset: Offset(end + 2)
        }
    );
    assert_eq!(log.log_end_offset(), Offset(end + 3));
    assert!(matches!(
        append(&mut log, produced(1000, 0, 3, 2)).unwrap(),
        ProduceOutcome::Appended { base_offset, .. } if base_offset == Offset(end + 3)
    ));
    // An older retry (first of the last five batches) still gets its offsets.
    assert!(matches!(
        append(&mut log, first.clone()).unwrap(),
        ProduceOutcome::Duplicate { base_offset, .. } if base_offset == Offset(end)
    ));
    // A gap in sequences is refused and nothing is written.
    match append(&mut log, produced(1000, 0, 9, 1)) {
        Err(ProduceError::OutOfOrderSequence { expected, got, .. }) => {
            assert_eq!((expected, got), (5, 9))
        }
        other => panic!("expected OutOfOrderSequence, got {other:?}"),
    }
    assert_eq!(log.log_end_offset(), Offset(end + 5));
    // A bumped producer epoch starts at sequence 0; the old epoch is then fenced.
    append(&mut log, produced(1000, 1, 0, 1)).unwrap();
    assert!(matches!(
        append(&mut log, produced(1000, 0, 5, 1)),
        Err(ProduceError::InvalidProducerEpoch {
            current: 1,
            got: 0,
            ..
        })
    ));
    // A source producer continuing its old sequence is not recognised (state was reset).
    assert!(matches!(
        append(&mut log, produced(200, 0, 3, 1)),
        Err(ProduceError::OutOfOrderSequence { expected: 0, .. })
    ));
    // Plain (non-idempotent) producers just append.
    append(&mut log, produced(-1, -1, -1, 2)).unwrap();
    let end_after = log.log_end_offset();
    assert_eq!(end_after, Offset(end + 8));

    // Malformed produces are refused with the reason, and nothing is written.
    let two = [produced(-1, -1, -1, 1), produced(-1, -1, -1, 1)].concat();
    assert!(matches!(
        append(&mut log, two),
        Err(ProduceError::BatchCount(2))
    ));
    let mut bad_crc = produced(-1, -1, -1, 1);
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    assert!(matches!(
        append(&mut log, bad_crc),
        Err(ProduceError::Corrupt(_))
    ));
    let whole = produced(-1, -1, -1, 1);
    assert!(matches!(
        append(&mut log, whole[..whole.len() - 3].to_vec()),
        Err(ProduceError::Truncated { .. }) | Err(ProduceError::BatchCount(0))
    ));
    let marker = control_batch(
        Offset(0),
        LeaderEpoch::NONE,
        ProducerId(1000),
        1,
        EndTxnMarker::Commit,
        0,
        TimestampMs(T0),
    );
    assert!(matches!(
        append(&mut log, marker),
        Err(ProduceError::ControlBatch)
    ));
    let legacy = kmirror::wire::batch_builder::legacy_message(
        1,
        Offset(0),
        TimestampMs(T0),
        None,
        Some(b"old"),
    );
    assert!(matches!(
        append(&mut log, legacy),
        Err(ProduceError::UnsupportedMagic(1))
    ));
    let mut big = produced(-1, -1, -1, 1);
    assert!(matches!(
        log.append_as_leader(&mut StdIo, &mut big, NEW_EPOCH, 10),
        Err(ProduceError::TooLarge { .. })
    ));
    let mut stale = produced(-1, -1, -1, 1);
    assert!(matches!(
        log.append_as_leader(&mut StdIo, &mut stale, LeaderEpoch(6), MAX_MESSAGE_BYTES),
        Err(ProduceError::StaleLeaderEpoch { .. })
    ));
    assert_eq!(log.log_end_offset(), end_after);

    // Every produced batch carries its assigned offset and the new epoch, CRC still valid.
    let produced_batches: Vec<Vec<u8>> = all_batches(&log)
        .into_iter()
        .filter(|b| Batch::parse_valid(b).unwrap().unwrap().base_offset() >= Offset(end))
        .collect();
    let bases: Vec<i64> = produced_batches
        .iter()
        .map(|b| Batch::parse_valid(b).unwrap().unwrap().base_offset().0)
        .collect();
    assert_eq!(bases, vec![end, end + 3, end + 5, end + 6]);
    for b in &produced_batches {
        let b = Batch::parse_valid(b).unwrap().unwrap();
        b.validate().unwrap();
        assert_eq!(b.partition_leader_epoch(), NEW_EPOCH);
    }

    // After a clean restart the last batch is still recognised as a retry (from the snapshot).
    log.close(&mut StdIo).unwrap();
    let mut log = reopen(&dir, true, None);
    assert!(matches!(
        append(&mut log, produced(1000, 1, 0, 1)).unwrap(),
        ProduceOutcome::Duplicate { base_offset, .. } if base_offset == Offset(end + 5)
    ));
    append(&mut log, produced(1000, 1, 1, 1)).unwrap();
    log.close(&mut StdIo).unwrap();

    let out = dump_log_segments(&segment_files(&dir), DumpFlags::DEEP);
    out.assert_clean();
    let offsets: Vec<i64> = out
        .records
        .iter()
        .filter_map(|(_, f)| f.get("offset").map(|o| o.parse().unwrap()))
        .filter(|o| *o >= end)
        .collect();
    assert_eq!(
        offsets,
        (end..end + 9).collect::<Vec<_>>(),
        "{}",
        out.stdout
    );
}

#[test]
fn transactions_after_failover_commit_and_abort_with_markers() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("orders-0");
    let mut log = mirrored_log(&dir);
    log.promote(&mut StdIo, NEW_EPOCH).unwrap();
    let max_source_pid = 400;
    assert_eq!(log.max_producer_id(), None, "state was reset");

    let pid = ProducerId(max_source_pid + 1_000);
    let txn = |seq: i32| {
        values(
            BatchBuilder::new(Offset(0))
                .producer(pid, 0, seq)
                .transactional(true),
            2,
        )
        .build()
    };
    let start = log.log_end_offset();
    log.append_as_leader(&mut StdIo, &mut txn(0), NEW_EPOCH, MAX_MESSAGE_BYTES)
        .unwrap();
    assert_eq!(
        log.last_stable_offset(),
        start,
        "open transaction holds the LSO"
    );
    let commit = log
        .write_txn_marker(&mut StdIo, pid, 0, EndTxnMarker::Commit, 0, NEW_EPOCH)
        .unwrap();
    assert_eq!(commit, Offset(start.0 + 2));
    assert_eq!(log.last_stable_offset(), log.log_end_offset());

    let second = log.log_end_offset();
    log.append_as_leader(&mut StdIo, &mut txn(2), NEW_EPOCH, MAX_MESSAGE_BYTES)
        .unwrap();
    let abort = log
        .write_txn_marker(&mut StdIo, pid, 0, EndTxnMarker::Abort, 0, NEW_EPOCH)
        .unwrap();
    assert_eq!(
        aborted_entries(&log).last(),
        Some(&(pid.0, second.0, abort.0)),
        "the aborted transaction is indexed"
    );
    assert_eq!(log.max_producer_id(), Some(pid));
    assert!(matches!(
        log.write_txn_marker(&mut StdIo, pid, -1, EndTxnMarker::Abort, 0, NEW_EPOCH),
        Err(ProduceError::InvalidProducerEpoch { .. })
    ));
    log.close(&mut StdIo).unwrap();
    dump_log_segments(&segment_files(&dir), DumpFlags::DEEP).assert_clean();
}
