//! Group-offset sync against a real Kafka 4.1.1 source with stock Java clients: a consumer group
//! reads part of a topic on the source and commits; kmirror mirrors the topic (`kmirror serve`);
//! the sync reads the source's groups (ListGroups, OffsetFetch) and writes them into kmirror's
//! coordinator and `__consumer_offsets-0`. Offsets must equal what `kafka-consumer-groups.sh
//! --describe` shows on the source (and follow the clamp rule where the source is ahead of
//! kmirror), and survive a kill -9.

mod harness;
mod mirror_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::groups::{describe_group, group_consume};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{unique_topic, ProduceOpts};
use kmirror::control::group_sync::{self, BlockingSourceGroups, LocalLogs, OffsetSink};
use kmirror::control::mirror_def::{parse_properties, MirrorDefinition, MirrorName};
use kmirror::ids::{LeaderEpoch, Offset, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::log_dir::LogDir;
use kmirror::serve::groups::{CoordinatorConfig, GroupCoordinator, OffsetsLog};

#[test]
fn source_group_offsets_reach_kmirror_as_they_are_clamped_and_durable() {
    let k = harness::shared();
    let topic = unique_topic("gsync");
    let bootstrap = k.bootstrap();
    k.create_topic(&topic, 2, &[]);
    for p in 0..2 {
        k.produce(&topic, p, 100, &ProduceOpts::default());
    }
    // Group "app" reads 130 of the 200 records and commits exactly what it read.
    let app = unique_topic("app");
    let consumed = group_consume(&bootstrap, &topic, &app, 130);
    assert_eq!(consumed.len(), 130);

    // kmirror mirrors the topic, then stops.
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = mirror_support::write_config(work.path(), &bootstrap, &[&topic]);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let pairs = k.mirror_pairs(&topic, 2, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);
    serve.sigterm_and_wait();

    // The source moves on: 50 more records on partition 0, and group "ahead" reads and commits
    // all 150 of them, past what kmirror holds (100).
    k.produce(&topic, 0, 50, &ProduceOpts::default());
    let ahead = unique_topic("ahead");
    let mut ahead_consumed = group_consume(&bootstrap, &topic, &ahead, 250);
    ahead_consumed.sort();
    assert_eq!(
        ahead_consumed.last().unwrap().offset,
        99,
        "partition 1 read to its end"
    );

    let source_app = describe_group(&bootstrap, &app);
    let source_ahead = describe_group(&bootstrap, &ahead);
    assert_eq!(source_app.len(), 2, "{source_app:?}");
    assert_eq!(source_ahead[0].current_offset, Some(150));

    let logs = LogDir::open(&data_dir, LogConfig::default(), &mut StdIo).unwrap();
    let offsets_dir = work.path().join("groups");
    std::fs::create_dir_all(&offsets_dir).unwrap();
    let mut coord = CoordinatorConfig::new(0, "localhost", 0);
    coord.initial_rebalance_delay_ms = 0;
    let sink = Arc::new(Mutex::new(
        GroupCoordinator::open(coord.clone(), OffsetsLog::open(&offsets_dir).unwrap()).unwrap(),
    ));
    let props = parse_properties(&format!(
        "bootstrap.servers={bootstrap}\nmirror.groups.include={app},{ahead}\n"
    ))
    .unwrap();
    let def = MirrorDefinition::from_properties(MirrorName::new("m").unwrap(), &props).unwrap();
    let parts: BTreeSet<TopicPartition> = (0..2).map(|p| TopicPartition::new(&topic, p)).collect();
    let mut sink_handle = Arc::clone(&sink);
    let report = group_sync::sync_mirror(
        &def,
        &parts,
        &BlockingSourceGroups,
        &logs,
        &mut sink_handle as &mut dyn OffsetSink,
        Instant::now() + Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(report.groups_seen, 2, "{report:?}");
    assert_eq!(report.clamped, 1, "{report:?}");

    let committed = |c: &GroupCoordinator<OffsetsLog>, g: &str, p: i32| {
        c.committed(g, &TopicPartition::new(&topic, p))
            .map(|o| (o.offset, o.leader_epoch))
    };
    {
        let c = sink.lock().unwrap();
        // "app": identical to the source's describe, and to what the member consumed + 1.
        for row in &source_app {
            let last = consumed
                .iter()
                .filter(|r| r.partition == row.partition)
                .map(|r| r.offset)
                .max();
            let expected = row.current_offset.expect("source shows a commit");
            assert_eq!(Some(expected), last.map(|o| o + 1), "{row:?}");
            let (offset, epoch) = committed(&c, &app, row.partition).unwrap();
            assert_eq!(offset, Offset(expected), "{row:?}");
            assert!(epoch.0 >= 0, "the source's leader epoch comes along");
        }
        // "ahead": partition 0 clamped to kmirror's log end, with kmirror's epoch there;
        // partition 1 as it is.
        let (o0, e0) = committed(&c, &ahead, 0).unwrap();
        assert_eq!(o0, Offset(100));
        assert_eq!(
            e0,
            logs.epoch_before(&TopicPartition::new(&topic, 0), Offset(100))
        );
        assert_ne!(e0, LeaderEpoch::NONE);
        assert_eq!(committed(&c, &ahead, 1).unwrap().0, Offset(100));
    }
    let before: Vec<_> = {
        let c = sink.lock().unwrap();
        [(&app, 0), (&app, 1), (&ahead, 0), (&ahead, 1)]
            .iter()
            .map(|(g, p)| committed(&c, g, *p))
            .collect()
    };

    // kill -9: the coordinator and its log vanish without a close.
    drop(sink_handle);
    let c = Arc::try_unwrap(sink).ok().unwrap().into_inner().unwrap();
    std::mem::forget(c);
    let c = GroupCoordinator::open(coord, OffsetsLog::open(&offsets_dir).unwrap()).unwrap();
    let after: Vec<_> = [(&app, 0), (&app, 1), (&ahead, 0), (&ahead, 1)]
        .iter()
        .map(|(g, p)| committed(&c, g, *p))
        .collect();
    assert_eq!(after, before);
    c.into_store().close().unwrap();
    logs.close(&mut StdIo).unwrap();
}
