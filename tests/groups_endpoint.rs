//! Goal: consumer groups work on kmirror's Kafka endpoint with stock clients, their committed
//! offsets survive a restart, and a group moves from the source to kmirror without losing or
//! repeating a record. Method: a real Kafka 4.1.1 broker (KRaft, shared by this binary) is the
//! source; `kmirror serve` (the binary) mirrors it and serves `[kafka]`; the clients are
//! kafka-python (PyPI, pinned in tests/python/requirements.txt), the Java consumer (KafkaTool, group protocol
//! "classic") and Kafka's own `kafka-consumer-groups.sh --describe` (ConsumerGroupCommand).
//!
//! - Static mode: a kafka-python group consumes part of a mirrored topic from kmirror and
//!   commits; `--describe` against kmirror shows those offsets; kmirror restarts; the group
//!   resumes exactly at its commits (the two runs read every record once).
//! - Control-plane mode: a group commits on the source; after the group-offset sync
//!   `--describe` against kmirror shows the source's offsets; failover (`mirrors stop`); the
//!   same group consuming from kmirror starts exactly at the committed offsets; after kill -9
//!   and a restart the offsets it committed on kmirror are still there.
//! - A group commits on the source after the last periodic sync: `mirrors stop` runs one more
//!   sync, so the group resumes on kmirror exactly at those later commits.
//! - Two Java members of one group on kmirror split the partitions (one waits in a parked
//!   JoinGroup while the other rejoins on its own connection) and the survivor takes all of
//!   them back when the other leaves.
//! - KIP-848 is not served: a Java 4.1 consumer with `group.protocol=consumer` fails at once
//!   with the client's own UnsupportedVersionException telling the user to set
//!   `group.protocol=classic`, and never sends ConsumerGroupHeartbeat (ApiVersions lacks it).

mod harness;
mod mirror_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::groups::{describe_group, group_consume, join_member, Consumed, DescribeRow};
use harness::mirrors_cli::{
    cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{
    add_kafka_listener, endpoint_requests, scrape_metrics, wait_all_mirrored, Serve,
};
use harness::{unique_topic, ProduceOpts};

/// Failure guard for the server and the sync to come up, not a performance claim.
const LIMIT: Duration = Duration::from_secs(90);

const RECORDS_PER_PARTITION: i64 = 100;

fn offsets(rows: &[DescribeRow]) -> Vec<(i32, Option<i64>)> {
    rows.iter()
        .map(|r| (r.partition, r.current_offset))
        .collect()
}

/// Per partition, the offset after the last record consumed: what the group committed.
fn next_offsets(consumed: &[Consumed]) -> Vec<(i32, Option<i64>)> {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for c in consumed {
        let e = next.entry(c.partition).or_insert(0);
        *e = (*e).max(c.offset + 1);
    }
    (0..2).map(|p| (p, next.get(&p).copied())).collect()
}

/// Every record of both partitions, once.
fn every_record() -> Vec<Consumed> {
    (0..2)
        .flat_map(|partition| {
            (0..RECORDS_PER_PARTITION).map(move |offset| Consumed { partition, offset })
        })
        .collect()
}

/// Each partition the second run read from starts exactly where the first run committed.
fn assert_resumes_at(second: &[Consumed], committed: &[(i32, Option<i64>)]) {
    for (p, c) in committed {
        let resumed = second
            .iter()
            .filter(|r| r.partition == *p)
            .map(|r| r.offset)
            .min();
        if let Some(resumed) = resumed {
            assert_eq!(
                resumed,
                c.unwrap_or(0),
                "partition {p} resumed elsewhere than its commit"
            );
        }
    }
}

/// Creates a topic of two partitions with `RECORDS_PER_PARTITION` records each.
fn source_topic(prefix: &str) -> String {
    let k = harness::shared();
    let topic = unique_topic(prefix);
    k.create_topic(&topic, 2, &[]);
    for p in 0..2 {
        k.produce(
            &topic,
            p,
            RECORDS_PER_PARTITION as usize,
            &ProduceOpts::default(),
        );
    }
    topic
}

fn mirrored_pairs(topic: &str, data_dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    harness::shared().mirror_pairs(topic, 2, data_dir)
}

// ---- static mode, kafka-python ----

/// Starts `kmirror serve` with `config`, logging to `log`; returns it and the Kafka
/// listener's `host:port` (the port is chosen by the OS).
fn serve_static(config: &Path, log: PathBuf) -> (Serve, String) {
    let mut serve = Serve::start(config, log);
    let addr = serve.kafka_listener();
    (serve, addr)
}

/// Runs the kafka-python group member; fails (never skips) when kafka-python is missing.
fn python_group(bootstrap: &str, topic: &str, group: &str, max: usize) -> Vec<Consumed> {
    harness::python_clients::kafka_python(&["group", bootstrap, topic, group, &max.to_string()])
        .into_iter()
        .map(|l| serde_json::from_value(l).unwrap())
        .collect()
}

#[test]
fn a_kafka_python_group_resumes_at_its_commit_after_a_restart() {
    let k = harness::shared();
    let topic = source_topic("gpy");
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) =
        mirror_support::write_config(work.path(), &k.bootstrap(), &[topic.as_str()]);
    add_kafka_listener(&config);

    let (mut serve, kmirror) = serve_static(&config, work.path().join("serve1.log"));
    wait_all_mirrored(&mut serve, &mirrored_pairs(&topic, &data_dir));
    let group = unique_topic("pyapp");
    let mut first = python_group(&kmirror, &topic, &group, 130);
    assert_eq!(first.len(), 130);
    let committed = next_offsets(&first);
    // Kafka's own tool reads the group's offsets from kmirror.
    let rows = describe_group(&kmirror, &group);
    assert_eq!(offsets(&rows), committed, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.log_end_offset == Some(RECORDS_PER_PARTITION)),
        "{rows:?}"
    );
    serve.sigterm_and_wait();

    let (_serve, kmirror) = serve_static(&config, work.path().join("serve2.log"));
    let second = python_group(&kmirror, &topic, &group, 70);
    assert_resumes_at(&second, &committed);
    first.extend(second);
    first.sort();
    assert_eq!(
        first,
        every_record(),
        "every record exactly once across the restart"
    );
    let done = vec![(0, Some(100)), (1, Some(100))];
    assert_eq!(offsets(&describe_group(&kmirror, &group)), done);
}

// ---- control-plane mode, Java clients ----

/// A control-plane config with the Kafka listener on a fixed port, so a restart keeps it.
struct Rig {
    work: tempfile::TempDir,
    config: PathBuf,
    admin: String,
    kafka: String,
    data_dir: PathBuf,
}

impl Rig {
    fn new() -> Rig {
        let work = tempfile::tempdir().unwrap();
        let data_dir = work.path().join("data");
        let config = work.path().join("kmirror.toml");
        let admin = format!("127.0.0.1:{}", free_loopback_port());
        let kafka = format!("127.0.0.1:{}", free_loopback_port());
        write_serving_config(&config, &admin, Some(&kafka), &data_dir, "");
        Rig {
            work,
            config,
            admin,
            kafka,
            data_dir,
        }
    }

    fn serve(&self, log: &str) -> Serve {
        let mut serve = Serve::start(&self.config, self.work.path().join(log));
        wait_admin(&mut serve, &self.admin);
        serve
    }

    /// Creates mirror "m" from the shared broker with `extra` properties and starts `topic`.
    fn mirror(&self, topic: &str, extra: &str) {
        let bootstrap = harness::shared().bootstrap();
        create_mirror(&self.admin, self.work.path(), "m", &bootstrap, extra);
        cli_ok(&self.admin, &["start", "--mirror", "m", "--topics", topic]);
    }

    fn states(&self) -> Vec<String> {
        let json = cli_ok(&self.admin, &["describe", "--mirror", "m", "--json"]);
        let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["state"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[test]
fn a_group_moves_from_the_source_to_kmirror_without_gap_or_duplicate() {
    let k = harness::shared();
    let topic = source_topic("gmove");
    let group = unique_topic("app");
    let mut first = group_consume(&k.bootstrap(), &topic, &group, 130);
    let on_source = offsets(&describe_group(&k.bootstrap(), &group));
    assert_eq!(on_source, next_offsets(&first));

    let rig = Rig::new();
    let mut serve = rig.serve("serve1.log");
    rig.mirror(
        &topic,
        &format!("sync.group.offsets.interval.ms=500\nmirror.groups.include={group}\n"),
    );
    wait_all_mirrored(&mut serve, &mirrored_pairs(&topic, &rig.data_dir));
    // kafka-consumer-groups --describe against kmirror shows the source's commits.
    let start = Instant::now();
    loop {
        let rows = describe_group(&rig.kafka, &group);
        if offsets(&rows) == on_source {
            assert!(
                rows.iter()
                    .all(|r| r.log_end_offset == Some(RECORDS_PER_PARTITION)),
                "{rows:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "kmirror shows {rows:?}, the source {on_source:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Failover, then the group carries on from kmirror.
    let stopped = cli_ok(&rig.admin, &["stop", "--mirror", "m", "--topics", &topic]);
    assert!(
        stopped.contains("Last group-offset sync: done"),
        "{stopped}"
    );
    let start = Instant::now();
    while rig.states().iter().any(|s| s != "STOPPED") {
        assert!(start.elapsed() < LIMIT, "{}", serve.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let second = group_consume(&rig.kafka, &topic, &group, 70);
    assert_resumes_at(&second, &on_source);
    first.extend(second);
    first.sort();
    assert_eq!(
        first,
        every_record(),
        "every record exactly once across the move"
    );
    let done = vec![(0, Some(100)), (1, Some(100))];
    assert_eq!(offsets(&describe_group(&rig.kafka, &group)), done);

    // kill -9, restart: the commits made on kmirror are still there.
    serve.kill9();
    let _serve = rig.serve("serve2.log");
    assert_eq!(offsets(&describe_group(&rig.kafka, &group)), done);
}

#[test]
fn the_last_sync_at_failover_carries_the_commits_made_since_the_periodic_one() {
    let k = harness::shared();
    let topic = source_topic("glast");
    let group = unique_topic("late");
    let mut consumed = group_consume(&k.bootstrap(), &topic, &group, 130);

    let rig = Rig::new();
    let mut serve = rig.serve("serve.log");
    // One periodic round a day: whatever it copied at the start, the commits below can only
    // reach kmirror through the sync that `mirrors stop` runs.
    rig.mirror(
        &topic,
        &format!(
            "sync.group.offsets.interval.ms=86400000\nmirror.groups.include={group}\n\
             sync.group.offsets.final.timeout.ms=120000\n"
        ),
    );
    wait_all_mirrored(&mut serve, &mirrored_pairs(&topic, &rig.data_dir));
    consumed.extend(group_consume(&k.bootstrap(), &topic, &group, 40));
    let on_source = offsets(&describe_group(&k.bootstrap(), &group));
    assert_eq!(on_source, next_offsets(&consumed));

    let stopped = cli_ok(&rig.admin, &["stop", "--mirror", "m", "--topics", &topic]);
    assert!(
        stopped.contains("Last group-offset sync: done"),
        "{stopped}"
    );
    let start = Instant::now();
    while rig.states().iter().any(|s| s != "STOPPED") {
        assert!(start.elapsed() < LIMIT, "{}", serve.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        offsets(&describe_group(&rig.kafka, &group)),
        on_source,
        "{}",
        serve.log_text()
    );
    let rest = group_consume(&rig.kafka, &topic, &group, 30);
    assert_resumes_at(&rest, &on_source);
    consumed.extend(rest);
    consumed.sort();
    assert_eq!(
        consumed,
        every_record(),
        "every record exactly once across the failover"
    );
    serve.sigterm_and_wait();
}

#[test]
fn two_members_on_kmirror_split_the_partitions_and_rebalance() {
    let topic = source_topic("grebal");
    let rig = Rig::new();
    let mut serve = rig.serve("serve.log");
    rig.mirror(&topic, "sync.group.offsets.enabled=false\n");
    wait_all_mirrored(&mut serve, &mirrored_pairs(&topic, &rig.data_dir));
    let group = unique_topic("pair");
    // Each step waits for the assignment it needs, so JVM start times do not matter.
    let mut a = join_member(&rig.kafka, &topic, &group);
    a.wait_assigned("A alone owns both partitions", |p| p == [0, 1]);
    let mut b = join_member(&rig.kafka, &topic, &group);
    let given = b.wait_assigned("B gets one partition", |p| p.len() == 1)[0];
    a.wait_assigned("A keeps the other one", |p| p == [1 - given]);
    let b = b.leave();
    a.wait_assigned("A takes all back after B left", |p| p == [0, 1]);
    let a = a.leave();
    assert_eq!(b.assignments, vec![vec![given]], "{b:?}");
    // Each member read the records of the partitions it was given.
    assert!(b.records.iter().all(|r| r.partition == given), "{b:?}");
    assert!(!a.records.is_empty());
    serve.sigterm_and_wait();
}

#[test]
fn a_kip_848_consumer_is_told_to_use_the_classic_protocol() {
    // No source needed: the client fails on what kmirror's ApiVersions lacks.
    let work = tempfile::tempdir().unwrap();
    let (_serve, admin, kmirror) = harness::mirrors_cli::serve_admin_with_listener(work.path());

    // The timeout is far beyond what the failure takes: a consumer that waited it out would
    // fail with "consumed 0 of 1" instead, which the test refuses.
    let out = harness::groups::group_consume_protocol(
        &kmirror,
        "kip848",
        "kip848-group",
        1,
        "consumer",
        60_000,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the consumer cannot work: {stderr}");
    assert!(
        stderr.contains("UnsupportedVersionException"),
        "the Java client's own error: {stderr}"
    );
    assert!(
        stderr.contains("group.protocol=classic"),
        "the message tells the user what to do: {stderr}"
    );
    assert!(
        !stderr.contains("consumed 0 of"),
        "it failed, not timed out: {stderr}"
    );

    // It learnt it from ApiVersions: no ConsumerGroupHeartbeat (68) was ever sent, and nothing
    // was refused.
    let requests = endpoint_requests(&scrape_metrics(&admin));
    assert!(
        requests.contains_key(&(18, 4)),
        "ApiVersions v4: {requests:?}"
    );
    assert!(
        requests.keys().all(|(api, _)| *api != 68 && *api != 69),
        "{requests:?}"
    );
    assert!(
        requests.values().all(|r| r.errors.is_empty()),
        "{requests:?}"
    );
}
