//! Disk errors are not retried into silent loss (issue 11 item 6), through the `LogIo` seam:
//! a disk that fails one write or one sync with a real errno, everything else passing through
//! to the file system.
//!
//! The defined states: a write EIO or any fsync error takes a partition log offline (appends,
//! flushes and a clean close refused until it is reopened, which recovers it); a write ENOSPC
//! rolls the append back and leaves the log usable, so the same append succeeds once there is
//! space; a keyed log's command fails and is never applied later (not in memory, not after a
//! reopen). Nothing appended before the fault is lost. Checkpoint, producer-snapshot and
//! leader-epoch files are written through the same seam, so the same faults reach them.

mod harness;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::log::checkpoint::OffsetCheckpointFile;
use kmirror::log::config::{FlushPolicy, LogConfig};
use kmirror::log::io::{LogIo, StdIo};
use kmirror::log::keyed_log::KeyedLog;
use kmirror::log::log_dir::LogDir;
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::recovery::LoadOptions;
use kmirror::log::LogError;
use kmirror::wire::batch_builder::BatchBuilder;

use harness::serve::log_bytes;

/// Which operation of the disk fails, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Sync,
}

/// A disk that fails the `nth` (0-based) `op` with `errno`, once, and otherwise passes
/// through. A failed write writes nothing.
#[derive(Debug)]
struct FaultyDisk {
    op: Op,
    nth: usize,
    errno: i32,
    seen: usize,
    fired: bool,
}

impl FaultyDisk {
    fn new(op: Op, nth: usize, errno: i32) -> FaultyDisk {
        FaultyDisk {
            op,
            nth,
            errno,
            seen: 0,
            fired: false,
        }
    }

    fn hit(&mut self, op: Op) -> std::io::Result<()> {
        if op != self.op || self.fired {
            return Ok(());
        }
        self.seen += 1;
        if self.seen > self.nth {
            self.fired = true;
            return Err(std::io::Error::from_raw_os_error(self.errno));
        }
        Ok(())
    }
}

impl LogIo for FaultyDisk {
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> std::io::Result<()> {
        self.hit(Op::Write)?;
        StdIo.write_all_at(file, pos, data)
    }

    fn sync_data(&mut self, file: &File) -> std::io::Result<()> {
        self.hit(Op::Sync)?;
        StdIo.sync_data(file)
    }
}

fn batch(base: i64, epoch: i32, n: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(epoch));
    for i in 0..n {
        b = b.value(TimestampMs(1_700_000_000_000 + i as i64), &[b'v'; 64]);
    }
    b.build()
}

fn tp() -> TopicPartition {
    TopicPartition::new("d", 0)
}

fn every_append() -> LogConfig {
    LogConfig {
        flush: FlushPolicy::EveryAppend,
        ..LogConfig::default()
    }
}

/// A log with three acknowledged (fsynced) batches 0..9 at epoch 1.
fn acknowledged(dir: &Path) -> PartitionLog {
    let mut log = PartitionLog::create(dir, tp(), None, every_append()).unwrap();
    for base in [0, 3, 6] {
        log.append(&mut StdIo, &batch(base, 1, 3)).unwrap();
    }
    assert_eq!(log.log_end_offset(), Offset(9));
    log
}

fn reopen(dir: &Path) -> PartitionLog {
    PartitionLog::open(
        dir,
        tp(),
        None,
        every_append(),
        LoadOptions::unclean(),
        &mut StdIo,
    )
    .unwrap()
}

fn assert_offline(log: &mut PartitionLog, dir: &Path) {
    assert!(log.offline_reason().is_some(), "the log must be offline");
    let refused = log.append(&mut StdIo, &batch(9, 1, 1));
    assert!(
        matches!(refused, Err(LogError::Failed { .. })),
        "{refused:?}"
    );
    assert!(matches!(
        log.flush(&mut StdIo),
        Err(LogError::Failed { .. })
    ));
    let text = refused.unwrap_err().to_string();
    assert!(text.contains("offline after a disk error"), "{text}");
    let _ = dir;
}

// Goal: a write EIO fails the append, leaves nothing of it, and takes the log offline; the
// acknowledged batches survive a reopen, which makes the log usable again.
#[test]
fn write_eio_takes_the_log_offline_and_loses_nothing_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d-0");
    let mut log = acknowledged(&dir);
    let before = log_bytes(&dir);
    let err = log
        .append(
            &mut FaultyDisk::new(Op::Write, 0, libc::EIO),
            &batch(9, 1, 3),
        )
        .unwrap_err();
    assert!(err.is_io() && !err.is_disk_full(), "{err}");
    assert_eq!(log.log_end_offset(), Offset(9));
    assert_offline(&mut log, &dir);
    assert!(
        log.close(&mut StdIo).is_err(),
        "an offline log must not close cleanly"
    );
    assert_eq!(log_bytes(&dir), before);
    let mut log = reopen(&dir);
    assert_eq!(log.log_end_offset(), Offset(9));
    assert!(log.offline_reason().is_none());
    log.append(&mut StdIo, &batch(9, 1, 3)).unwrap();
    assert_eq!(log.log_end_offset(), Offset(12));
}

// Goal: an fsync EIO after the write fails the append, cuts its bytes back out (so nothing
// unsynced is ever vouched for) and takes the log offline; acknowledged data stays.
#[test]
fn fsync_eio_takes_the_log_offline_and_cuts_the_unsynced_append() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d-0");
    let mut log = acknowledged(&dir);
    let before = log_bytes(&dir);
    let recovery_point = log.recovery_point();
    let err = log
        .append(
            &mut FaultyDisk::new(Op::Sync, 0, libc::EIO),
            &batch(9, 1, 3),
        )
        .unwrap_err();
    assert!(err.is_io(), "{err}");
    assert_eq!(log.log_end_offset(), Offset(9));
    assert_eq!(log.recovery_point(), recovery_point, "recovery point moved");
    assert_offline(&mut log, &dir);
    assert_eq!(
        log_bytes(&dir),
        before,
        "the unsynced batch is still in the file"
    );
    drop(log);
    let log = reopen(&dir);
    assert_eq!(log.log_end_offset(), Offset(9));
    assert_eq!(log_bytes(&dir), before);
}

// Goal: ENOSPC on a write rolls the append back and leaves the log usable: the very same
// append succeeds once the disk has space again, and the log is as if nothing had failed.
#[test]
fn write_enospc_rolls_back_and_the_same_append_succeeds_later() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d-0");
    let mut log = acknowledged(&dir);
    // A new epoch: the append writes the segment data (write 0), then its flush (every
    // append here) the leader-epoch checkpoint (write 1, before the recovery point moves); a
    // full disk at either rolls everything back.
    let next = batch(9, 2, 3);
    for nth in [0, 1] {
        let before = log_bytes(&dir);
        match log.append(&mut FaultyDisk::new(Op::Write, nth, libc::ENOSPC), &next) {
            Err(err) => {
                assert!(err.is_disk_full(), "{err}");
                assert_eq!(log.log_end_offset(), Offset(9), "nth {nth}");
                assert!(
                    log.offline_reason().is_none(),
                    "ENOSPC must not take it offline"
                );
                assert_eq!(log_bytes(&dir), before, "nth {nth}");
            }
            Ok(_) => panic!("write {nth} of the append was not reached"),
        }
    }
    assert_eq!(log.epoch_cache().latest_epoch(), Some(LeaderEpoch(1)));
    log.append(&mut StdIo, &next).unwrap();
    assert_eq!(log.log_end_offset(), Offset(12));
    log.close(&mut StdIo).unwrap();
    let log = reopen(&dir);
    assert_eq!(log.log_end_offset(), Offset(12));
    assert_eq!(log.epoch_cache().latest_epoch(), Some(LeaderEpoch(2)));
}

// Goal: the leader-epoch checkpoint is written through the log's LogIo: a new epoch whose
// checkpoint sync fails fails the append (rolled back, offline), and after a reopen the epoch
// cache does not claim the epoch whose batch is gone.
#[test]
fn epoch_checkpoint_goes_through_the_seam() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d-0");
    let mut log = acknowledged(&dir);
    // Syncs of this append's flush, in order: the epoch checkpoint's tmp file (new epoch 2),
    // then the segment.
    let err = log
        .append(
            &mut FaultyDisk::new(Op::Sync, 0, libc::EIO),
            &batch(9, 2, 1),
        )
        .unwrap_err();
    assert!(err.to_string().contains("leader-epoch-checkpoint"), "{err}");
    assert!(log.offline_reason().is_some());
    drop(log);
    let log = reopen(&dir);
    assert_eq!(log.log_end_offset(), Offset(9));
    assert_eq!(log.epoch_cache().latest_epoch(), Some(LeaderEpoch(1)));
}

// Goal: producer snapshots (written on every roll) go through the seam: a failing snapshot
// write fails the append that rolled.
#[test]
fn producer_snapshot_goes_through_the_seam() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d-0");
    let config = LogConfig {
        segment_bytes: 400,
        ..every_append()
    };
    let mut log = PartitionLog::create(&dir, tp(), None, config.clone()).unwrap();
    log.append(&mut StdIo, &batch(0, 1, 3)).unwrap();
    let mut disk = FaultyDisk::new(Op::Write, usize::MAX, libc::EIO);
    // Find which write of a rolling append is the snapshot's: count them on a good run in a
    // copy, then fail exactly that one here.
    let probe_dir = tmp.path().join("probe");
    let mut probe = PartitionLog::create(&probe_dir, tp(), None, config.clone()).unwrap();
    probe.append(&mut StdIo, &batch(0, 1, 3)).unwrap();
    let mut counter = Counting::default();
    probe.append(&mut counter, &batch(3, 1, 3)).unwrap();
    let snapshot_write = counter
        .writes
        .iter()
        .position(|p| p.ends_with(".snapshot.tmp"))
        .expect("a rolling append writes a producer snapshot");
    disk.nth = snapshot_write;
    let err = log.append(&mut disk, &batch(3, 1, 3)).unwrap_err();
    assert!(err.to_string().contains(".snapshot"), "{err}");
    assert_eq!(log.log_end_offset(), Offset(3));
}

/// Records the file each write goes to (through /proc/self/fd) and counts syncs, passing
/// everything through.
#[derive(Debug, Default)]
struct Counting {
    writes: Vec<String>,
    syncs: usize,
}

impl LogIo for Counting {
    fn write_all_at(&mut self, file: &File, pos: u64, data: &[u8]) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
        self.writes.push(path.display().to_string());
        StdIo.write_all_at(file, pos, data)
    }

    fn sync_data(&mut self, file: &File) -> std::io::Result<()> {
        self.syncs += 1;
        StdIo.sync_data(file)
    }
}

// Goal: log-dir checkpoints go through the seam; a failed one leaves the previous file intact
// (atomic replace), and a log-dir flush with an offline log still flushes and checkpoints the
// others, then reports the error, without moving the offline log's recovery point.
#[test]
fn checkpoints_go_through_the_seam_and_an_offline_log_does_not_block_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut dir = LogDir::open(root, every_append(), &mut StdIo).unwrap();
    let (a, b) = (TopicPartition::new("a", 0), TopicPartition::new("b", 0));
    for t in [&a, &b] {
        let log = dir.get_or_create(t, None, None).unwrap();
        log.append(&mut StdIo, &batch(0, 1, 3)).unwrap();
    }
    dir.write_checkpoints().unwrap();
    let path = root.join(OffsetCheckpointFile::RECOVERY_POINT);
    let good = std::fs::read(&path).unwrap();
    let err = dir
        .write_checkpoints_with(&mut FaultyDisk::new(Op::Sync, 0, libc::EIO))
        .unwrap_err();
    assert!(
        err.to_string().contains("recovery-point-offset-checkpoint"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        good,
        "a failed checkpoint replaced the file"
    );

    // a goes offline; b gets more data; a log-dir flush checkpoints b and reports a.
    let log_a = dir.get_mut(&a).unwrap();
    assert!(log_a
        .append(
            &mut FaultyDisk::new(Op::Write, 0, libc::EIO),
            &batch(3, 1, 1)
        )
        .is_err());
    let log_b = dir.get_mut(&b).unwrap();
    log_b.append(&mut StdIo, &batch(3, 1, 2)).unwrap();
    assert!(dir.flush(&mut StdIo).is_err());
    let points = OffsetCheckpointFile::read(&path).unwrap();
    let expected: BTreeMap<_, _> = [(a.clone(), Offset(3)), (b.clone(), Offset(5))].into();
    assert_eq!(points, expected);
    assert!(
        dir.close(&mut StdIo).is_err(),
        "no clean shutdown with an offline log"
    );
    assert!(!kmirror::log::clean_shutdown::exists(root).unwrap());
}

const TOPIC: &str = "__keyed_test";

fn keyed(root: &Path, disk: FaultyDisk) -> KeyedLog<FaultyDisk> {
    KeyedLog::open_with(root, TOPIC, FlushPolicy::EveryAppend, disk).unwrap()
}

fn live_after_reopen(root: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let log = KeyedLog::open(root, TOPIC, FlushPolicy::EveryAppend).unwrap();
    let live = log.live().clone().into_iter().collect();
    log.close().unwrap();
    live
}

fn kv(k: &str, v: &str) -> (Vec<u8>, Vec<u8>) {
    (k.as_bytes().to_vec(), v.as_bytes().to_vec())
}

// Goal: a keyed-log command whose fsync fails returns the error, is not applied in memory,
// is not replayed after a reopen, and every later command fails (offline); the command
// acknowledged before it survives.
#[test]
fn keyed_log_fsync_failure_fails_the_command_and_never_applies_it() {
    let tmp = tempfile::tempdir().unwrap();
    // How many syncs one put makes (its flush syncs every file of the segment): fail the
    // first sync of the second put.
    let probe = tempfile::tempdir().unwrap();
    let mut counting = KeyedLog::open_with(
        probe.path(),
        TOPIC,
        FlushPolicy::EveryAppend,
        Counting::default(),
    )
    .unwrap();
    counting.put(b"a".to_vec(), b"1".to_vec()).unwrap();
    let per_put = counting.io().syncs;
    assert!(per_put > 0, "a put with EveryAppend syncs");
    let mut log = keyed(tmp.path(), FaultyDisk::new(Op::Sync, per_put, libc::EIO));
    log.put(b"a".to_vec(), b"1".to_vec()).unwrap();
    assert!(log.put(b"b".to_vec(), b"2".to_vec()).is_err());
    assert!(!log.live().contains_key(b"b".as_slice()));
    assert!(
        log.put(b"c".to_vec(), b"3".to_vec()).is_err(),
        "an offline keyed log must refuse later commands"
    );
    drop(log);
    assert_eq!(live_after_reopen(tmp.path()), vec![kv("a", "1")]);
}

// Goal: a keyed-log command whose write fails with EIO fails and is never applied; with
// ENOSPC it fails, is never applied, and the next command succeeds once there is space.
#[test]
fn keyed_log_write_failures_fail_the_command_and_never_apply_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut log = keyed(tmp.path(), FaultyDisk::new(Op::Write, 0, libc::ENOSPC));
    assert!(log.put(b"a".to_vec(), b"1".to_vec()).is_err());
    assert!(log.live().is_empty());
    log.put(b"b".to_vec(), b"2".to_vec()).unwrap();
    drop(log);
    assert_eq!(live_after_reopen(tmp.path()), vec![kv("b", "2")]);

    let mut log = keyed(tmp.path(), FaultyDisk::new(Op::Write, 0, libc::EIO));
    assert!(log.delete(b"b").is_err());
    assert!(log.live().contains_key(b"b".as_slice()));
    assert!(
        log.put(b"c".to_vec(), b"3".to_vec()).is_err(),
        "offline after EIO"
    );
    drop(log);
    assert_eq!(live_after_reopen(tmp.path()), vec![kv("b", "2")]);
}
