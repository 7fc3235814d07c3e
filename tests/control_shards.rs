//! The controller driving the real shards against a real Kafka 4.1.1 source: a started topic
//! is fetched into the data dir, pause hands the log back to the control thread (so its end is
//! known exactly), resume continues from there, and after many pause/resume cycles and more
//! produced records the local log holds every offset once, as DumpLogSegments confirms.

mod harness;

use std::time::Duration;

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::{ProduceOpts, TxnEnd};
use kmirror::control::controller::{Controller, DataPlane};
use kmirror::control::shard_plane::ShardDataPlane;
use kmirror::control::source_catalog::BlockingSourceCatalog;
use kmirror::control::state::{Command, RetryPolicy, StateName};
use kmirror::control::state_log::StateLog;
use kmirror::fetch::fetcher::FetchConfig;
use kmirror::ids::{ProducerId, TopicPartition};
use kmirror::log::clean_shutdown;
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::log_dir::LogDir;
use kmirror::runtime::RuntimeConfig;

type Ctl = Controller<BlockingSourceCatalog, ShardDataPlane>;

fn local_end(c: &mut Ctl, topic: &str) -> Option<i64> {
    c.describe(Some("m"))
        .unwrap()
        .into_iter()
        .find(|r| r.topic == topic)
        .and_then(|r| r.destination_offset)
}

/// Pauses and resumes until a pause finds the local log at `target`; every pause must find a
/// log end between the previous one and the target (no gap, nothing lost, nothing beyond).
fn pause_resume_until(c: &mut Ctl, topic: &str, target: i64) -> u32 {
    let mut previous = local_end(c, topic).unwrap_or(0);
    // How long the partition mirrors between a resume and the next pause: short, so pauses
    // land mid-stream, and doubled after a cycle without progress (up to 8 s), so a loaded
    // machine whose round trips take longer still gets there.
    let mut window = Duration::from_millis(250);
    for cycle in 1..=240 {
        c.command("m", topic, Command::Pause).unwrap();
        assert_eq!(
            c.partition_state("m", &TopicPartition::new(topic, 0)),
            Some(StateName::Paused)
        );
        let end =
            local_end(c, topic).expect("a paused partition's log is back on the control thread");
        assert!(
            (previous..=target).contains(&end),
            "log end {end} outside [{previous}, {target}]"
        );
        if end == target {
            return cycle;
        }
        if end == previous && cycle > 1 {
            window = (window * 2).min(Duration::from_secs(8));
        }
        previous = end;
        c.command("m", topic, Command::Resume).unwrap();
        // The control loop's tick: the leader look-up's answer hands the partition to its
        // shard, and failures come back.
        let resumed = std::time::Instant::now();
        while resumed.elapsed() < window {
            std::thread::sleep(Duration::from_millis(50));
            let failures = c.data_plane_mut().poll_failures();
            assert!(failures.is_empty(), "shard failures: {failures:?}");
        }
    }
    panic!("the mirror never reached offset {target}");
}

fn open_controller(data: &std::path::Path) -> Ctl {
    let runtime = RuntimeConfig {
        shards: 1,
        cores: None,
        arena_slot_bytes: 4 * 1024 * 1024,
        arena_slots: 4,
        log_writes: Default::default(),
    };
    let fetch = FetchConfig {
        max_wait_ms: 200,
        min_bytes: 1,
        max_bytes: 1024 * 1024,
        partition_max_bytes: 1024 * 1024,
        sessions: true,
        sessions_per_connection: 1,
        connections_per_source: 1,
        max_rate_bytes_per_sec: 0,
        catch_up_pipelining: true,
    };
    let plane = ShardDataPlane::start(
        data,
        &runtime,
        fetch,
        kmirror::limits::SOURCE_REQUEST_TIMEOUT_MS_DEFAULT,
    )
    .unwrap();
    let store = StateLog::open(data).unwrap();
    Controller::open(store, RetryPolicy::default(), BlockingSourceCatalog, plane).unwrap()
}

#[test]
fn pause_resume_keeps_every_offset_once() {
    let k = harness::shared();
    let topic = harness::unique_topic("ctl-shards");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 200, &ProduceOpts::default());
    let data = tempfile::tempdir().unwrap();
    let mut c = open_controller(data.path());
    let props = [("bootstrap.servers".to_owned(), k.bootstrap())].into();
    c.create("m", &props).unwrap();
    let report = c.start("m", &topic, None).unwrap();
    assert_eq!(report.changed, [format!("{topic}-0")]);

    pause_resume_until(&mut c, &topic, 200);
    k.produce(&topic, 0, 100, &ProduceOpts::default());
    c.command("m", &topic, Command::Resume).unwrap();
    pause_resume_until(&mut c, &topic, 300);

    c.command("m", &topic, Command::Stop).unwrap();
    let row = c.describe(Some("m")).unwrap().remove(0);
    assert_eq!(row.state, StateName::Stopped);
    assert_eq!(row.last_end_offset, Some(300));
    let plane = c.shutdown().unwrap();
    plane.stop().unwrap();

    let dir = data.path().join(format!("{topic}-0"));
    let logs: Vec<_> = segment_files(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    let dump = dump_log_segments(&logs, DumpFlags::DEEP);
    dump.assert_clean();
    let mut next = 0;
    for b in &dump.batches {
        assert_eq!(b.base_offset, next, "gap or overlap before batch {b:?}");
        next = b.last_offset + 1;
    }
    assert_eq!(next, 300);
}

/// Failover (`stop`) with a transaction still open on the source: the mirrored log gets an
/// ABORT marker for it, at a leader epoch above every source epoch, its producer state is
/// reset, and Kafka's DumpLogSegments accepts the result.
#[test]
fn stop_aborts_the_open_source_transaction_and_raises_the_epoch() {
    let k = harness::shared();
    let topic = harness::unique_topic("ctl-failover");
    k.create_topic(&topic, 1, &[]);
    k.produce(
        &topic,
        0,
        30,
        &ProduceOpts {
            idempotent: true,
            ..ProduceOpts::default()
        },
    );
    k.produce(
        &topic,
        0,
        40,
        &ProduceOpts {
            transactions: vec![TxnEnd::Commit, TxnEnd::Open],
            // The source must not abort it on its own while the test runs.
            transaction_timeout_ms: Some(600_000),
            ..ProduceOpts::default()
        },
    );
    let source_end = k.offsets(&topic, 0).log_end_offset;

    let data = tempfile::tempdir().unwrap();
    let mut c = open_controller(data.path());
    let props = [("bootstrap.servers".to_owned(), k.bootstrap())].into();
    c.create("m", &props).unwrap();
    c.start("m", &topic, None).unwrap();
    pause_resume_until(&mut c, &topic, source_end);
    c.command("m", &topic, Command::Stop).unwrap();
    let row = c.describe(Some("m")).unwrap().remove(0);
    assert_eq!(row.state, StateName::Stopped);
    assert_eq!(
        row.last_end_offset,
        Some(source_end),
        "the mirrored end is recorded"
    );
    c.shutdown().unwrap().stop().unwrap();

    let dir = data.path().join(format!("{topic}-0"));
    let dump = dump_log_segments(&segment_files(&dir), DumpFlags::DEEP);
    dump.assert_clean();
    let (marker, mirrored) = dump.batches.split_last().expect("batches");
    let open_txn = mirrored
        .iter()
        .rev()
        .find(|b| b.is_transactional && !b.is_control)
        .expect("the open transaction's data was mirrored");
    assert!(marker.is_control, "{marker:?}");
    assert_eq!(
        marker.base_offset, source_end,
        "the marker follows the mirrored data"
    );
    assert_eq!(marker.producer_id, open_txn.producer_id);
    let epoch =
        |b: &harness::dump::DumpBatch| -> i32 { b.fields["partitionLeaderEpoch"].parse().unwrap() };
    let source_max = mirrored.iter().map(epoch).max().unwrap();
    assert!(
        epoch(marker) > source_max,
        "{} <= {source_max}",
        epoch(marker)
    );
    let aborts = dump
        .records
        .iter()
        .filter(|(_, f)| f.get("endTxnMarker").map(String::as_str) == Some("ABORT"))
        .count();
    assert_eq!(aborts, 1, "exactly the open transaction is aborted");

    // Reopened as kmirror does after a crash (no clean-shutdown marker, so recovery runs from
    // the checkpointed recovery point): no source producer keeps state, nothing is open.
    std::fs::remove_file(clean_shutdown::path(data.path())).unwrap();
    let mut logs = LogDir::open(data.path(), LogConfig::default(), &mut StdIo).unwrap();
    let log = logs.take(&TopicPartition::new(&topic, 0)).unwrap();
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
    assert_eq!(log.log_end_offset().0, source_end + 1);
    assert!(
        log.producer_state()
            .producer(ProducerId(open_txn.producer_id))
            .is_none(),
        "source producer state was reset"
    );
}
