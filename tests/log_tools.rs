//! `kmirror log verify` / `log dump` on directories written by PartitionLog, intact and with
//! each kind of damage; the binary's exit status and messages included.

use std::path::{Path, PathBuf};
use std::process::Command;

use kmirror::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::recovery::LoadOptions;
use kmirror::ops::log_tools::{verify, ToolError};
use kmirror::wire::batch_builder::{control_batch, legacy_message, BatchBuilder, EndTxnMarker};

/// 3 segments or more: 40 plain batches (epochs 0..3), one aborted and one committed txn.
fn build(root: &Path) -> PathBuf {
    let dir = root.join("t-0");
    let config = LogConfig {
        segment_bytes: 2500,
        index_interval_bytes: 150,
        retention_ms: None,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::create(
        &dir,
        TopicPartition::new("t", 0),
        Some(uuid::Uuid::new_v4()),
        config,
    )
    .expect("create");
    let mut off = 0;
    for i in 0..40 {
        let b = BatchBuilder::new(Offset(off))
            .leader_epoch(LeaderEpoch(i / 15))
            .record(
                TimestampMs(50_000 + off),
                Some(b"k"),
                Some(&[b'a'; 90]),
                &[],
            )
            .record(TimestampMs(50_001 + off), None, Some(&[b'b'; 30]), &[])
            .build();
        log.append(&mut StdIo, &b).expect("append");
        off += 2;
    }
    let pid = ProducerId(9);
    for kind in [EndTxnMarker::Abort, EndTxnMarker::Commit] {
        let data = BatchBuilder::new(Offset(off))
            .leader_epoch(LeaderEpoch(2))
            .producer(pid, 0, (off - 80) as i32)
            .transactional(true)
            .value(TimestampMs(60_000 + off), b"txn")
            .build();
        log.append(&mut StdIo, &data).expect("txn data");
        off += 1;
        let marker = control_batch(
            Offset(off),
            LeaderEpoch(2),
            pid,
            0,
            kind,
            1,
            TimestampMs(60_000 + off),
        );
        log.append(&mut StdIo, &marker).expect("marker");
        off += 1;
    }
    log.close(&mut StdIo).expect("close");
    dir
}

fn file(dir: &Path, base: i64, suffix: &str) -> PathBuf {
    dir.join(format!("{base:020}{suffix}"))
}

fn expect_problem(dir: &Path, needle_file: &Path, needle_text: &str) {
    match verify(dir) {
        Err(ToolError::Problem(p)) => {
            assert_eq!(p.path, needle_file, "{p}");
            assert!(p.to_string().contains(needle_text), "{p}");
        }
        other => panic!(
            "expected a problem in {}, got {other:?}",
            needle_file.display()
        ),
    }
}

fn second_segment_base(dir: &Path) -> i64 {
    let mut bases: Vec<i64> = std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            name.strip_suffix(".log").map(|s| s.parse().expect("base"))
        })
        .collect();
    bases.sort();
    bases[1]
}

#[test]
fn intact_directory_verifies_with_a_summary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let s = verify(&dir).expect("verify");
    assert_eq!(s.batches, 44);
    assert_eq!(s.records, 84);
    assert_eq!(
        (s.first_offset, s.last_offset),
        (Some(Offset(0)), Some(Offset(83)))
    );
    assert_eq!(s.aborted_txns, 1);
    assert_eq!(s.epochs, 3);
    assert!(s.segments >= 3 && s.index_entries > 0 && s.time_index_entries > 0 && s.snapshots > 0);
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["log", "verify"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("OK: "));
}

#[test]
fn bad_crc_names_the_segment_and_offset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let base = second_segment_base(&dir);
    let path = file(&dir, base, ".log");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[70] ^= 0x40; // inside the first batch's records
    std::fs::write(&path, bytes).expect("write");
    expect_problem(
        &dir,
        &path,
        &format!("offset {base} (position 0): batch at offset {base}: CRC mismatch"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["log", "verify"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CRC mismatch"));
}

#[test]
fn partial_tail_is_reported() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let path = file(&dir, 0, ".log");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes.extend_from_within(..30);
    std::fs::write(&path, bytes).expect("write");
    expect_problem(&dir, &path, "30 invalid bytes at the end");
}

#[test]
fn wrong_index_entry_is_a_mismatch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let path = file(&dir, 0, ".index");
    let mut bytes = std::fs::read(&path).expect("read");
    assert!(bytes.len() >= 16);
    // Point the first entry one offset earlier than the batch's last offset.
    let rel = i32::from_be_bytes(bytes[..4].try_into().expect("4")) - 1;
    bytes[..4].copy_from_slice(&rel.to_be_bytes());
    std::fs::write(&path, bytes).expect("write");
    expect_problem(
        &dir,
        &path,
        &format!("index offset {rel}, log offset {}", rel + 1),
    );
}

#[test]
fn wrong_time_index_timestamp_is_a_mismatch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let path = file(&dir, 0, ".timeindex");
    let mut bytes = std::fs::read(&path).expect("read");
    let ts = i64::from_be_bytes(bytes[..8].try_into().expect("8")) - 1;
    bytes[..8].copy_from_slice(&ts.to_be_bytes());
    std::fs::write(&path, bytes).expect("write");
    expect_problem(&dir, &path, "timestamp mismatch");
}

#[test]
fn epoch_checkpoint_must_match_the_batches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let path = dir.join("leader-epoch-checkpoint");
    std::fs::write(&path, "0\n3\n0 0\n1 30\n2 62\n").expect("write");
    expect_problem(
        &dir,
        &path,
        "entry 2 is 2@62, the batches start epoch 2 at 60",
    );
}

// Goal: a promoted log that has not been written yet verifies: like an elected Kafka leader,
// promotion records the new epoch at the log end before any batch carries it. Only that one
// trailing entry is allowed. Method: promote the built log, close it, verify; then move the
// trailing entry below the log end and expect the mismatch.
#[test]
fn epoch_of_a_promoted_but_unwritten_leader_verifies() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let load = LoadOptions {
        clean_shutdown: true,
        recovery_point: Offset::ZERO,
        log_start_offset: None,
    };
    let config = LogConfig {
        segment_bytes: 2500,
        index_interval_bytes: 150,
        retention_ms: None,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(
        &dir,
        TopicPartition::new("t", 0),
        None,
        config,
        load,
        &mut StdIo,
    )
    .expect("open");
    let end = log.log_end_offset();
    log.promote(&mut StdIo, LeaderEpoch(3)).expect("promote");
    assert_eq!(
        log.log_end_offset(),
        end,
        "no marker: no transaction was open"
    );
    log.close(&mut StdIo).expect("close");
    let summary = verify(&dir).expect("a promoted, unwritten log verifies");
    assert_eq!(
        summary.epochs, 4,
        "epochs 0, 1, 2 from the batches and 3 at the log end"
    );

    let path = dir.join("leader-epoch-checkpoint");
    let text = std::fs::read_to_string(&path).expect("read checkpoint");
    let trailing = format!("3 {}", end.0);
    assert!(text.contains(&trailing), "{text}");
    std::fs::write(&path, text.replace(&trailing, &format!("3 {}", end.0 - 1))).expect("write");
    expect_problem(&dir, &path, "does not match the batches");
}

#[test]
fn dump_prints_one_line_per_batch_including_legacy_and_markers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["log", "dump"])
        .arg(&dir)
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let batch_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("baseOffset:"))
        .collect();
    assert_eq!(batch_lines.len(), 44);
    assert!(batch_lines.iter().all(|l| l.contains("isvalid: true")));
    assert!(batch_lines[0]
        .starts_with("baseOffset: 0 lastOffset: 1 count: 2 partitionLeaderEpoch: 0 magic: 2"));
    assert_eq!(
        batch_lines
            .iter()
            .filter(|l| l.contains("endTxnMarker: ABORT"))
            .count(),
        1
    );
    assert_eq!(
        batch_lines
            .iter()
            .filter(|l| l.contains("endTxnMarker: COMMIT"))
            .count(),
        1
    );

    // A legacy log: dumps and verifies (no epochs, CRC-32).
    let legacy = tmp.path().join("old-0");
    let mut log = PartitionLog::create(
        &legacy,
        TopicPartition::new("old", 0),
        None,
        LogConfig::default(),
    )
    .expect("create");
    let msgs: Vec<u8> = (0..5)
        .flat_map(|i| legacy_message(1, Offset(i), TimestampMs(7 + i), None, Some(b"v")))
        .collect();
    log.append(&mut StdIo, &msgs).expect("append legacy");
    log.close(&mut StdIo).expect("close");
    assert_eq!(verify(&legacy).expect("verify").batches, 5);
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["log", "dump"])
        .arg(&legacy)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("baseOffset: 4 lastOffset: 4 count: 1 partitionLeaderEpoch: -1 magic: 1"));
}

// Goal: kmirror writes `leader-epoch-checkpoint` at a flush, before the recovery point moves,
// so on a live or killed log the checkpoint may lack epochs that start at or above the
// partition's recovery point (recovery rebuilds those from the batches; no recovery-point entry
// means 0); `verify` accepts exactly that, and nothing below the recovery point. Method: the built log's epochs are
// 0@0, 1@30, 2@60; drop the last entry and vary `recovery-point-offset-checkpoint` beside the
// partition directory.
#[test]
fn epochs_above_the_recovery_point_may_be_missing_from_the_checkpoint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = build(tmp.path());
    let path = dir.join("leader-epoch-checkpoint");
    let rp = tmp.path().join("recovery-point-offset-checkpoint");
    std::fs::write(&path, "0\n2\n0 0\n1 30\n").expect("write");

    // Recovery point 61: epoch 2 starts below it, so it must have been checkpointed.
    std::fs::write(&rp, "0\n1\nt 0 61\n").expect("write");
    expect_problem(&dir, &path, "does not match the batches");

    // Recovery point 60: epoch 2 starts there, not yet checkpointed.
    std::fs::write(&rp, "0\n1\nt 0 60\n").expect("write");
    let summary = verify(&dir).expect("epoch 2 starts at the recovery point");
    assert_eq!(summary.epochs_above_recovery_point, 1, "{summary}");
    assert!(summary
        .to_string()
        .contains("1 epochs above the recovery point"));

    // No recovery-point file (or no entry): recovery starts at 0, so the same holds.
    std::fs::remove_file(&rp).expect("remove");
    assert_eq!(
        verify(&dir)
            .expect("no recovery point")
            .epochs_above_recovery_point,
        1
    );

    // No checkpoint at all with recovery point 0 (a fresh partition before its first flush).
    std::fs::remove_file(&path).expect("remove");
    std::fs::write(&rp, "0\n1\nt 0 0\n").expect("write");
    let summary = verify(&dir).expect("nothing flushed yet");
    assert_eq!(summary.epochs_above_recovery_point, 3, "{summary}");
    std::fs::write(&rp, "0\n1\nt 0 30\n").expect("write");
    expect_problem(&dir, &path, "missing, but epoch 0 starts at 0");
}
