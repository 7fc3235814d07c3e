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
//!
//! Method: a dedicated real Kafka 4.1.1 KRaft broker (it is restarted and killed), `kmirror
//! serve` with `[admin]` and `[kafka]`, the Java consumer (`KafkaTool group-consume`), epochs read
//! from Metadata answers of the source and of kmirror.

mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::groups::{describe_group, group_consume, group_consume_with};
use harness::mirrors_cli::{
    cli, cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{Kafka, ProduceOpts};

/// Failure guard for waits on background work (leader look-ups, group syncs, a stop against a
/// dead source) on a loaded machine; not a performance claim.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

fn leader_epoch(bootstrap: &str, topic: &str) -> i32 {
    let mut c = kmirror::fetch::blocking::BlockingClient::connect(bootstrap, "test").unwrap();
    let md = c.metadata(Some(&[topic])).unwrap();
    md.partition(topic, 0).unwrap().leader_epoch.0
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
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &data_dir, "");
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
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}

/// The last (epoch, start offset) of Kafka's leader-epoch-checkpoint file in `dir`.
fn last_epoch_entry(dir: &Path) -> Option<(i32, i64)> {
    let text = std::fs::read_to_string(dir.join("leader-epoch-checkpoint")).unwrap();
    text.lines().skip(2).last().map(|l| {
        let mut f = l.split_whitespace().map(|v| v.parse::<i64>().unwrap());
        (f.next().unwrap() as i32, f.next().unwrap())
    })
}
