//! Goal: kmirror's leader epoch never goes below the source's (KIP-1279), and consumer groups
//! synced from the source resume on kmirror with the Java consumer, while mirroring and after
//! failover.
//! - The source's leader moves on twice (broker restarts) without writing a record, so its
//!   current leader epoch is above every epoch in the mirrored data. After an unplanned
//!   failover (source dead, kmirror restarted in between), kmirror leads at an epoch above the
//!   source's.
//! - A group committed on the source at the source's current leader epoch (above what kmirror
//!   announces while mirroring): after the sync, the Java consumer of that group reads from
//!   kmirror while it mirrors (it would loop on metadata if the committed epoch were above
//!   kmirror's), and both groups continue on kmirror after failover exactly at the source's
//!   committed offsets.
//! - The fence survives restarts with nothing written since the failover (no produced batch,
//!   no ABORT marker carries the promoted epoch): after a clean restart and after a kill -9,
//!   Metadata still announces the promoted epoch, OffsetForLeaderEpoch ends the source's epoch
//!   where it begins, and a Java consumer that joined before the restarts (so it has seen the
//!   promoted epoch and fetches with it) reads what is produced afterwards, which Kafka's
//!   DumpLogSegments shows at the promoted epoch.
//!
//! Method: a dedicated real Kafka 4.1.1 KRaft broker (it is restarted and killed), `kmirror
//! serve` with `[admin]` and `[kafka]`, the Java consumer (`KafkaTool group-consume`,
//! `group-member`) and producer, epochs read from Metadata and OffsetForLeaderEpoch answers of
//! the source and of kmirror.

mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::groups::{describe_group, group_consume, group_consume_with, join_member};
use harness::mirrors_cli::{
    cli, cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{Kafka, ProduceOpts};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{BrokerId, OffsetForLeaderEpochRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

/// Failure guard for waits on background work (leader look-ups, group syncs, a stop against a
/// dead source) on a loaded machine; not a performance claim.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

fn leader_epoch(bootstrap: &str, topic: &str) -> i32 {
    let mut c = kmirror::fetch::blocking::BlockingClient::connect(bootstrap, "test").unwrap();
    let md = c.metadata(Some(&[topic])).unwrap();
    md.partition(topic, 0).unwrap().leader_epoch.0
}

/// kmirror's OffsetForLeaderEpoch answer for `epoch` of partition 0, asked as a consumer that
/// knows leader epoch `current` (what the Java consumer sends to validate its position):
/// (error code, epoch, end offset).
fn end_offset_for(bootstrap: &str, topic: &str, current: i32, epoch: i32) -> (i16, i32, i64) {
    let mut c = kmirror::fetch::blocking::BlockingClient::connect(bootstrap, "test").unwrap();
    let mut p = OffsetForLeaderPartition::default();
    p.partition = 0;
    p.current_leader_epoch = current;
    p.leader_epoch = epoch;
    let mut t = OffsetForLeaderTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.to_string()));
    t.partitions.push(p);
    let mut req = OffsetForLeaderEpochRequest::default();
    req.replica_id = BrokerId(-1);
    req.topics.push(t);
    let resp = c.request(4, &req).unwrap();
    let e = &resp.topics[0].partitions[0];
    (e.error_code, e.leader_epoch, e.end_offset)
}

fn wait_for(what: &str, serve: &Serve, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "gave up waiting for {what}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn committed_on(bootstrap: &str, group: &str) -> Option<i64> {
    describe_group(bootstrap, group)
        .into_iter()
        .find(|r| r.partition == 0)
        .and_then(|r| r.current_offset)
}

#[test]
fn failover_leads_above_the_source_epoch_and_synced_groups_resume() {
    let mut k = Kafka::start_dedicated();
    let topic = "ep";
    let source = k.bootstrap();
    k.create_topic(topic, 1, &[]);
    k.produce(topic, 0, 40, &ProduceOpts::default());
    let batch_epoch = leader_epoch(&source, topic);
    // "plain" commits what it read, with the epoch of its last record.
    assert_eq!(group_consume(&source, topic, "plain", 20).len(), 20);

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let config = work.path().join("kmirror.toml");
    // A fixed listener port: the consumer joined before kmirror's restarts reconnects to it.
    let kafka_listen = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some(&kafka_listen), &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    let sync = "sync.group.offsets.interval.ms=500\nsync.group.offsets.final.timeout.ms=2000\n";
    create_mirror(&admin, work.path(), "m", &source, sync);
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", topic]);
    let dir = data_dir.join(format!("{topic}-0"));
    wait_all_mirrored(&mut serve, &[(k.partition_dir(topic, 0), dir.clone())]);

    // The source's leader moves on twice with no record written.
    k.restart();
    k.restart();
    let source_epoch = leader_epoch(&source, topic);
    assert!(
        source_epoch > batch_epoch,
        "restarts raised the source epoch ({batch_epoch} -> {source_epoch})"
    );
    // kmirror's fetcher is told the new leader's epoch and keeps it on disk.
    let epochs_file = data_dir.join("kmirror-source-epochs");
    wait_for("kmirror to learn the source epoch", &serve, || {
        std::fs::read_to_string(&epochs_file)
            .is_ok_and(|t| t.lines().any(|l| l == format!("0 {source_epoch} {topic}")))
    });
    let mut kmirror = serve.kafka_listener();
    let announced = leader_epoch(&kmirror, topic);
    assert_eq!(
        announced, batch_epoch,
        "while mirroring kmirror announces the newest epoch in its data"
    );

    // "current" commits on the source at the source's current epoch, above kmirror's.
    assert_eq!(
        group_consume_with(&source, topic, "current", 20, Some(source_epoch)).len(),
        20
    );
    wait_for("the sync to copy both groups", &serve, || {
        committed_on(&kmirror, "plain") == Some(20) && committed_on(&kmirror, "current") == Some(20)
    });
    // While mirroring, the Java consumer of "current" reads from kmirror where the source
    // left it (its consumer would refresh metadata forever, and give up, were the committed
    // epoch above kmirror's).
    let read = group_consume(&kmirror, topic, "current", 10);
    assert_eq!(
        read.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (20..30).collect::<Vec<i64>>()
    );
    // With no member left on kmirror the source is again authoritative: the sync puts the
    // source's commit back (and its epoch, capped again).
    wait_for("the sync to restore the source's commit", &serve, || {
        committed_on(&kmirror, "current") == Some(20)
    });

    // Unplanned failover: the source dies, kmirror restarts without it, then stops.
    k.kill();
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    kmirror = serve.kafka_listener();
    let stop = cli(&admin, &["stop", "--mirror", "m", "--topics", topic]);
    assert!(stop.ok, "stop: {}\n{}", stop.stderr, serve.log_text());
    let promoted = leader_epoch(&kmirror, topic);
    assert!(
        promoted > source_epoch,
        "kmirror leads at {promoted}, the source was at {source_epoch}"
    );
    assert_eq!(
        last_epoch_entry(&dir),
        Some((promoted, 40)),
        "the promoted epoch starts at the mirrored end in leader-epoch-checkpoint"
    );

    // Both groups continue on kmirror exactly where they were.
    let plain = group_consume(&kmirror, topic, "plain", 20);
    assert_eq!(
        plain.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (20..40).collect::<Vec<i64>>()
    );
    let current = group_consume(&kmirror, topic, "current", 20);
    assert_eq!(
        current.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (20..40).collect::<Vec<i64>>()
    );

    // Restarts with nothing written since the failover: the source left no transaction open,
    // so no ABORT marker carries the promoted epoch either; it is only in the checkpoint.
    // The member of "plain" (committed at 40) joins first, so its consumer has the promoted
    // epoch from kmirror's Metadata and sends it with every fetch.
    let mut member = join_member(&kmirror, topic, "plain");
    member.wait_assigned("the member of plain assigned partition 0", |p| p == [0]);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    let mut serve = Serve::start(&config, work.path().join("serve3.log"));
    wait_admin(&mut serve, &admin);
    assert_fence_kept(&serve.kafka_listener(), topic, &dir, promoted, batch_epoch);
    serve.kill9();
    let mut serve = Serve::start(&config, work.path().join("serve4.log"));
    wait_admin(&mut serve, &admin);
    assert_fence_kept(&serve.kafka_listener(), topic, &dir, promoted, batch_epoch);

    // What is produced now is read by the member that saw the promoted epoch before the
    // restarts (a consumer fetching with an epoch above kmirror's would get
    // UNKNOWN_LEADER_EPOCH and retry forever).
    harness::produce(&kmirror, topic, 0, 10, &ProduceOpts::default());
    member.wait_records(
        "the member to read the records produced after the restarts",
        |r| (40..50).all(|o| r.iter().any(|c| c.partition == 0 && c.offset == o)),
    );
    let run = member.leave();
    assert!(
        run.records.iter().all(|c| (40..50).contains(&c.offset)),
        "the member read only what was produced after failover: {:?}",
        run.records
    );
    assert_eq!(leader_epoch(&kmirror, topic), promoted);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");

    // Kafka's reader: the produced batches carry the promoted epoch.
    let out = dump_log_segments(&segment_files(&dir), DumpFlags::DEEP);
    out.assert_clean();
    let produced: Vec<_> = out.batches.iter().filter(|b| b.base_offset >= 40).collect();
    assert!(!produced.is_empty(), "{}", out.stdout);
    for b in produced {
        assert_eq!(
            b.fields["partitionLeaderEpoch"],
            promoted.to_string(),
            "{b:?}"
        );
    }
}

/// After a restart with nothing written since the failover at offset 40, kmirror still leads
/// at `promoted`: its Metadata announces it, leader-epoch-checkpoint starts it at 40, and
/// OffsetForLeaderEpoch (asked with the promoted epoch as the consumer's current one, which
/// kmirror must not answer UNKNOWN_LEADER_EPOCH) ends the mirrored epoch at 40.
fn assert_fence_kept(kmirror: &str, topic: &str, dir: &Path, promoted: i32, mirrored: i32) {
    assert_eq!(
        leader_epoch(kmirror, topic),
        promoted,
        "Metadata after restart"
    );
    assert_eq!(last_epoch_entry(dir), Some((promoted, 40)));
    assert_eq!(
        end_offset_for(kmirror, topic, promoted, mirrored),
        (0, mirrored, 40)
    );
    assert_eq!(
        end_offset_for(kmirror, topic, promoted, promoted),
        (0, promoted, 40)
    );
}

/// The last (epoch, start offset) of Kafka's leader-epoch-checkpoint file in `dir`.
fn last_epoch_entry(dir: &Path) -> Option<(i32, i64)> {
    let text = std::fs::read_to_string(dir.join("leader-epoch-checkpoint")).unwrap();
    text.lines().skip(2).last().map(|l| {
        let mut f = l.split_whitespace().map(|v| v.parse::<i64>().unwrap());
        (f.next().unwrap() as i32, f.next().unwrap())
    })
}
