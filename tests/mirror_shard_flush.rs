//! Goal: a shard flushes its logs on its ring without waiting. A segment roll (every
//! `segment.bytes` of a partition) and the periodic recovery-point checkpoint used to fdatasync
//! on the shard thread, holding every partition of the shard for the whole write-back (2 s for
//! a rolled gigabyte on this VM, which also took the single-partition benchmark to under half
//! the copy limit). Now the shard submits the syncs and goes on; the log's recovery point moves
//! when they completed, and a log leaves the shard only once its flush finished.
//!
//! Method: an in-process synthetic source serves three partitions to a one-shard runtime; two
//! logs roll every 64 KiB (many rolls), one never rolls. We watch each log's published
//! recovery point (its checkpoint cell) while the shard holds it: a rolling log's reaches its
//! last rolled segment without any checkpoint round (the roll's own flush, done on the ring),
//! the other's stays at 0 until a `Flush` round, after which all are at the end; the shard
//! counts those flushes. The logs then come back from the shard settled (no flush in flight,
//! the recovery point at the end), and a reopened log holds exactly the source's batches.

mod harness;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::serve::log_bytes;
use kmirror::bench::server::SynthServer;
use kmirror::bench::{SynthCodec, SynthSpec};
use kmirror::fetch::fetcher::{FetchConfig, PartitionStart};
use kmirror::fetch::versions::Versions;
use kmirror::ids::{LeaderEpoch, Offset, ShardId, TopicPartition};
use kmirror::log::checkpoint_cell::CheckpointCell;
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::recovery::LoadOptions;
use kmirror::runtime::mirror_shard::{
    MirrorEvent, MirrorMsg, MirrorShard, ReturnedLogs, SourceSpec,
};
use kmirror::runtime::{Runtime, RuntimeConfig};
use kmirror::wire::api;

/// Failure guard only, not a performance claim.
const WAIT: Duration = Duration::from_secs(60);
/// Partitions 0 and 1 roll every `SEGMENT_BYTES`; the last one never rolls (default
/// segment size), so only a checkpoint round flushes it.
const PARTITIONS: i32 = 3;
const ROLLING: i32 = 2;
const SEGMENT_BYTES: u64 = 64 * 1024;

fn wait_until(what: &str, rt: &mut Runtime<MirrorShard>, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    let mut events = Vec::new();
    while !done() {
        assert!(
            start.elapsed() < WAIT,
            "{what}: not within {WAIT:?}; shard events: {events:?}"
        );
        if let Some((_, e)) = rt.next_event(Duration::from_millis(50)) {
            if matches!(e, MirrorEvent::PartitionStopped { .. }) {
                panic!("{what}: {e:?}");
            }
            events.push(format!("{e:?}"));
        }
    }
}

/// A synthetic source of `partitions` partitions and a one-shard runtime mirroring each into
/// a fresh log (`config_of(partition)`), with what each log must end up holding.
struct Rig {
    partitions: i32,
    rt: Runtime<MirrorShard>,
    returned: ReturnedLogs,
    /// Each partition's checkpoint cell: its published recovery point while the shard has it.
    cells: Vec<(TopicPartition, Arc<CheckpointCell>)>,
    dirs: Vec<std::path::PathBuf>,
    end: Offset,
    want: Vec<u8>,
    /// Offsets per `SEGMENT_BYTES` segment.
    per_segment: i64,
    _work: tempfile::TempDir,
}

fn rolling_config(p: i32) -> LogConfig {
    if p < ROLLING {
        LogConfig {
            segment_bytes: SEGMENT_BYTES,
            ..LogConfig::default()
        }
    } else {
        LogConfig::default()
    }
}

fn rig(config_of: fn(i32) -> LogConfig) -> Rig {
    rig_of(PARTITIONS, 160, config_of)
}

fn rig_of(partitions: i32, batches: u64, config_of: fn(i32) -> LogConfig) -> Rig {
    let spec = SynthSpec {
        partitions: partitions as u32,
        codec: SynthCodec::Lz4,
        batch_bytes: 4096,
        partition_bytes: Some(4096 * batches),
        ..SynthSpec::default()
    };
    let server = SynthServer::bind("127.0.0.1:0", spec).unwrap();
    let catalog = server.catalog().clone();
    let addr = server.spawn().unwrap();
    let batches = catalog.batches_per_partition.unwrap() as i64;
    let rpb = catalog.records_per_batch();
    assert_eq!(rpb, i64::from(catalog.template.records_per_batch()));
    let end = Offset(batches * rpb);
    let want: Vec<u8> = (0..batches)
        .flat_map(|i| catalog.template.stamped(Offset(i * rpb)))
        .collect();
    let per_segment = (SEGMENT_BYTES as i64 / catalog.template.size() as i64) * rpb;

    let work = tempfile::tempdir().unwrap();
    let returned: ReturnedLogs = Arc::new(Mutex::new(Vec::new()));
    let shard_returned = Arc::clone(&returned);
    let mut rt = Runtime::start(
        &RuntimeConfig {
            shards: 1,
            cores: None,
            arena_slot_bytes: 1024 * 1024,
            arena_slots: 4,
            log_writes: Default::default(),
        },
        move |_| MirrorShard::new(Arc::clone(&shard_returned)),
    )
    .unwrap();
    // One batch per partition per response, so the last segment of a rolling log gets many
    // appends after its roll.
    let source = SourceSpec {
        broker_id: 1,
        addr: addr.to_string(),
        versions: Versions {
            api_versions: 3,
            metadata: api::METADATA.max,
            fetch: 12,
            list_offsets: api::LIST_OFFSETS.max,
            offset_for_leader_epoch: api::OFFSET_FOR_LEADER_EPOCH.max,
        },
        fetch: FetchConfig {
            max_wait_ms: 100,
            min_bytes: 1,
            max_bytes: 256 * 1024,
            partition_max_bytes: 4 * 1024,
            sessions: true,
            sessions_per_connection: 1,
            connections_per_source: 1,
            max_rate_bytes_per_sec: 0,
            catch_up_pipelining: true,
        },
        client_id: "flush-test".to_string(),
        request_timeout_ms: 5_000,
        security: Default::default(),
    };
    let mut cells = Vec::new();
    let mut dirs = Vec::new();
    for p in 0..partitions {
        let tp = TopicPartition::new("synth", p);
        let dir = work.path().join(tp.dir_name());
        let log = PartitionLog::create(&dir, tp.clone(), None, config_of(p)).unwrap();
        cells.push((tp.clone(), log.checkpoint_cell()));
        dirs.push(dir);
        let start = PartitionStart {
            tp,
            topic_id: SynthSpec::topic_id("synth"),
            log_end: Offset::ZERO,
            last_epoch: LeaderEpoch::NONE,
            leader_epoch: LeaderEpoch::NONE,
        };
        rt.send(
            ShardId(0),
            MirrorMsg::AddPartition {
                source: source.clone(),
                start,
                log: Box::new(log),
            },
        )
        .unwrap();
    }
    Rig {
        partitions,
        rt,
        returned,
        cells,
        dirs,
        end,
        want,
        per_segment,
        _work: work,
    }
}

impl Rig {
    fn wait_all_on_disk(&mut self) {
        let (dirs, want) = (&self.dirs, self.want.len());
        wait_until("every batch on disk", &mut self.rt, || {
            dirs.iter().all(|d| log_bytes(d).len() == want)
        });
    }

    /// Removes every partition and returns the logs the shard handed back.
    fn remove_all(&mut self) -> Vec<PartitionLog> {
        for (tp, _) in &self.cells {
            self.rt
                .send(ShardId(0), MirrorMsg::RemovePartition { tp: tp.clone() })
                .unwrap();
        }
        let returned = Arc::clone(&self.returned);
        wait_until("every log handed back", &mut self.rt, || {
            returned.lock().unwrap().len() == self.partitions as usize
        });
        std::mem::take(&mut *self.returned.lock().unwrap())
    }

    /// Each returned log: settled, at the end, and holding the source's bytes after a reopen.
    fn check_returned(&self, logs: Vec<PartitionLog>, config_of: fn(i32) -> LogConfig) {
        for log in logs {
            assert!(
                !log.flush_in_flight(),
                "a log came back with a flush in flight"
            );
            assert_eq!(log.log_end_offset(), self.end);
            assert_eq!(log.recovery_point(), self.end);
            let dir = log.dir().to_path_buf();
            let tp = log.topic_partition().clone();
            let p = tp.partition;
            log.close(&mut StdIo).unwrap();
            let reopened = PartitionLog::open(
                &dir,
                tp,
                None,
                config_of(p),
                LoadOptions::unclean(),
                &mut StdIo,
            )
            .unwrap();
            assert_eq!(reopened.log_end_offset(), self.end);
            assert!(log_bytes(&dir) == self.want, "{} differs", dir.display());
        }
    }
}

#[test]
fn rolls_and_checkpoints_are_flushed_on_the_ring_and_logs_come_back_settled() {
    let mut rig = rig(rolling_config);
    let (end, per_segment) = (rig.end, rig.per_segment);
    // The rolls' own flushes move the recovery point while the shard holds the logs, with no
    // checkpoint round asked for: past the end minus two segments' worth of offsets (the
    // last rolled segment ends there or later).
    let rolled_to = Offset(end.0 - 2 * per_segment);
    assert!(
        rolled_to.0 > 4 * per_segment,
        "the test needs several rolls"
    );
    let rolling = rig.cells[..ROLLING as usize].to_vec();
    wait_until(
        "recovery points moved by the rolls' flushes",
        &mut rig.rt,
        || {
            rolling
                .iter()
                .all(|(_, c)| c.read().recovery_point >= rolled_to)
        },
    );
    rig.wait_all_on_disk();
    let by_rolls = rig.rt.stats()[0].snapshot();
    let (_, unrolled) = &rig.cells[ROLLING as usize];
    assert_eq!(
        unrolled.read().recovery_point,
        Offset::ZERO,
        "a log that never rolled was flushed before any round"
    );
    // A checkpoint round flushes the rest, also on the ring.
    rig.rt.send(ShardId(0), MirrorMsg::Flush).unwrap();
    let cells = rig.cells.clone();
    wait_until(
        "recovery points at the end after a Flush",
        &mut rig.rt,
        || cells.iter().all(|(_, c)| c.read().recovery_point == end),
    );

    // Those flushes ran on the ring: the shard counted them (its synchronous path does not),
    // at least one per rolling partition (several rolls may share a flush) and then the
    // round's, at least the unrolled log's.
    let after_round = rig.rt.stats()[0].snapshot();
    assert!(
        by_rolls.flushes >= ROLLING as u64,
        "{} flushes on the ring before the round",
        by_rolls.flushes
    );
    assert!(
        after_round.flushes > by_rolls.flushes,
        "{by_rolls:?} then {after_round:?}"
    );
    assert!(after_round.flush_ns > 0);
    assert_eq!(after_round.flushes_in_flight, 0);

    let logs = rig.remove_all();
    for log in &logs {
        let segments = log.segments().len();
        if log.topic_partition().partition < ROLLING {
            assert!(segments > 4, "{segments} segments: too few rolls");
        } else {
            assert_eq!(segments, 1);
        }
    }
    rig.check_returned(logs, rolling_config);
    rig.rt.stop();
}

/// Goal: a log leaves the shard only once its flush finished. A checkpoint round and the
/// removal of every partition are sent back to back, so the shard usually hands the logs back
/// while the round's fdatasyncs are still on its ring (often not yet submitted): it waits for
/// those and hands each log back with its recovery point at the end, whichever came first.
#[test]
fn a_log_removed_while_its_flush_is_in_flight_comes_back_after_it() {
    fn no_rolls(_: i32) -> LogConfig {
        LogConfig::default()
    }
    let mut rig = rig(no_rolls);
    rig.wait_all_on_disk();
    assert!(rig
        .cells
        .iter()
        .all(|(_, c)| c.read().recovery_point == Offset::ZERO));
    rig.rt.send(ShardId(0), MirrorMsg::Flush).unwrap();
    let logs = rig.remove_all();
    let stats = rig.rt.stats()[0].snapshot();
    assert_eq!(stats.flushes, PARTITIONS as u64);
    assert_eq!(stats.flushes_in_flight, 0);
    rig.check_returned(logs, no_rolls);
    rig.rt.stop();
}

/// Goal: a checkpoint round over more logs than the ring has op slots neither starves the
/// sources of slots nor leaves a flush behind: the shard keeps at most
/// `SHARD_FSYNCS_IN_FLIGHT_MAX` fdatasyncs on its ring and queues the rest. Method: 400
/// partitions (about 1,200 syncs in the round, against 192 op slots) mirror a few batches
/// each; after the round every recovery point is at the end, the shard counted one flush per
/// log, and no connection was dropped for want of a slot.
#[test]
fn a_checkpoint_round_over_more_logs_than_op_slots_queues_its_syncs() {
    fn no_rolls(_: i32) -> LogConfig {
        LogConfig::default()
    }
    const MANY: i32 = 400;
    let mut rig = rig_of(MANY, 3, no_rolls);
    rig.wait_all_on_disk();
    rig.rt.send(ShardId(0), MirrorMsg::Flush).unwrap();
    let (cells, end) = (rig.cells.clone(), rig.end);
    let start = Instant::now();
    let mut events = Vec::new();
    while !cells.iter().all(|(_, c)| c.read().recovery_point == end) {
        assert!(start.elapsed() < WAIT, "round not done in {WAIT:?}");
        if let Some((_, MirrorEvent::Notice { what })) =
            rig.rt.next_event(Duration::from_millis(50))
        {
            events.push(what);
        }
    }
    let stats = rig.rt.stats()[0].snapshot();
    assert_eq!(stats.flushes, MANY as u64);
    assert_eq!(stats.flushes_in_flight, 0);
    assert!(
        !events
            .iter()
            .any(|e| e.contains("slab") || e.contains("reconnect")),
        "{events:?}"
    );
    let logs = rig.remove_all();
    assert_eq!(logs.len(), MANY as usize);
    rig.check_returned(logs, no_rolls);
    rig.rt.stop();
}
