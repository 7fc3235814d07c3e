//! Goal: a failover drill (issue 16 item 2) gives clients a writable clone of mirrored topics
//! while mirroring goes on, costs about the active segments' tails on disk, and never changes
//! the mirror: its logs equal the source's bytes before, during and after the drill.
//!
//! Method: the shared broker, a two-partition topic with 1 MiB segments (Kafka's least; copied
//! to kmirror with the topic configs) and 3.5 MB per partition so each partition has many sealed segments; kmirror serves
//! `[admin]` and `[kafka]`. After mirroring, `mirrors drill start` clones the topic as
//! `drill.d1.<topic>`; the source keeps taking records (mirrored meanwhile), the Java producer
//! writes to the clone through kmirror's listener and the Java consumer reads it back (the
//! mirrored records up to the clone point, then its own). A consumer group committed on the
//! source (synced to kmirror by the group-offset sync) finds its offsets on the clone: a Java
//! group consumer of the same group id on `drill.d1.<topic>` resumes at them. `drill stop`
//! deletes the clone and those offsets. The drill's own bytes on disk (files not shared with
//! the mirror by hard links) are measured against the mirror's log size and the active
//! segments' tails: sealed segments are shared, only the tails (and indexes) are copied.
//!
//! The second test kills kmirror with `kill -9` while a drill runs: the restart serves the
//! clone again (readable, writable, listed) and `drill stop` then deletes it completely; a
//! drill recorded as starting (its clone half made) is deleted by the restart.

mod harness;

use std::path::Path;

use std::collections::BTreeMap;
use std::time::Duration;

use harness::groups::{describe_group, group_consume, DescribeRow};
use harness::mirrors_cli::{cli_ok, wait_admin, ControlPlane};
use harness::serve::{log_bytes, log_files, wait_all_mirrored, Serve};
use harness::{shared, unique_topic, Isolation, ProduceOpts};
use serde_json::Value;

/// Failure guard for the group-offset sync (every second here) to reach kmirror.
const SYNC_LIMIT: Duration = Duration::from_secs(90);

/// `group`'s committed offsets of `topic` on `bootstrap`, by partition (Kafka's own tool).
fn committed(bootstrap: &str, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    describe_group(bootstrap, group)
        .into_iter()
        .filter(|r: &DescribeRow| r.topic == topic)
        .filter_map(|r| Some((r.partition, r.current_offset?)))
        .collect()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A new topic with 1 MiB segments (Kafka's least; copied to kmirror with the topic configs).
fn topic_of_small_segments(k: &harness::Kafka, prefix: &str, partitions: i32) -> String {
    let topic = unique_topic(prefix);
    k.create_topic(&topic, partitions, &[("segment.bytes", "1048576")]);
    topic
}

/// Records of 1,000 bytes (3,500 fill three and a half segments).
fn opts(seed: u64) -> ProduceOpts {
    ProduceOpts {
        seed,
        value_bytes: 1000,
        ..ProduceOpts::default()
    }
}

/// Partition 0 of `clone` on kmirror holds `total` records, the first `mirrored` of them equal
/// to the source's (offsets and values).
fn assert_clone_holds(
    k: &harness::Kafka,
    kmirror: &str,
    topic: &str,
    clone: &str,
    mirrored: usize,
    total: usize,
) {
    let on_clone = harness::consume(kmirror, clone, 0, 0, total, Isolation::ReadCommitted);
    assert_eq!(on_clone.len(), total);
    let source = k.consume(topic, 0, 0, mirrored, Isolation::ReadCommitted);
    let pairs = |rs: &[harness::ConsumedRecord]| -> Vec<(i64, Option<Vec<u8>>)> {
        rs.iter().map(|r| (r.offset, r.value.clone())).collect()
    };
    assert_eq!(
        pairs(&on_clone[..mirrored]),
        pairs(&source),
        "the clone holds the mirrored records"
    );
}

#[test]
fn drill_clones_writable_while_mirroring_and_leaves_the_mirror_identical() {
    let k = shared();
    let topic = topic_of_small_segments(k, "drill", 2);
    for p in 0..2 {
        k.produce(&topic, p, 3500, &opts(1 + p as u64));
    }

    let ControlPlane {
        data_dir,
        admin,
        mut serve,
        // Holds the temp dir (data dir, serve log) until the test ends.
        work: _work,
        ..
    } = ControlPlane::start(
        &k.bootstrap(),
        true,
        "sync.group.offsets.interval.ms=1000\n",
    );
    let kmirror = serve.kafka_listener();
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    let pairs: Vec<_> = (0..2)
        .map(|p| {
            (
                k.partition_dir(&topic, p),
                data_dir.join(format!("{topic}-{p}")),
            )
        })
        .collect();
    // Before: byte-identical (wait_all_mirrored returns once every .log byte matches).
    wait_all_mirrored(&mut serve, &pairs);
    let segments = log_files(&pairs[0].1).len();
    assert!(segments >= 3, "the test needs sealed segments: {segments}");

    // A group on the source reads 4,000 of the 7,000 records (so both partitions) and commits;
    // the group-offset sync brings its offsets to kmirror.
    let group = unique_topic("drill-group");
    let read = group_consume(&k.bootstrap(), &topic, &group, 4000);
    assert_eq!(read.len(), 4000);
    let on_source = committed(&k.bootstrap(), &group, &topic);
    assert_eq!(
        on_source.len(),
        2,
        "both partitions committed: {on_source:?}"
    );
    serve.wait_for("the group's offsets synced to kmirror", SYNC_LIMIT, || {
        committed(&kmirror, &group, &topic) == on_source
    });

    // What a full copy would cost, and the tails and sealed segments at the clone point (the
    // source takes nothing until the drill started).
    let full_copy: u64 = pairs.iter().map(|(_, ours)| dir_bytes(ours)).sum();
    let at_clone: Vec<(u64, u64)> = pairs
        .iter()
        .map(|(_, ours)| {
            let logs = log_files(ours);
            let (active, sealed) = logs.split_last().unwrap();
            let len = |p: &std::path::PathBuf| std::fs::metadata(p).unwrap().len();
            (len(active), sealed.iter().map(len).sum())
        })
        .collect();

    let out = cli_ok(
        &admin,
        &[
            "drill", "start", "--mirror", "m", "--topics", &topic, "--name", "d1", "--json",
        ],
    );
    let started: Value = serde_json::from_str(&out).unwrap();
    let d = &started[0];
    let clone = format!("drill.d1.{topic}");
    let parts = d["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 2, "{d}");
    for p in parts {
        assert_eq!(p["clone_topic"], clone.as_str(), "{p}");
        assert_eq!(p["cost"]["link_fallbacks"], 0, "{p}");
        // Sealed segments hard-linked, never copied; the active segment's tail copied, plus
        // indexes, checkpoints and snapshots (a few KiB).
        let (tail, sealed) = at_clone[p["partition"].as_u64().unwrap() as usize];
        assert_eq!(p["cost"]["linked_bytes"], sealed, "{p}");
        let copied = p["cost"]["copied_bytes"].as_u64().unwrap();
        assert!(
            copied >= tail && copied - tail <= 64 * 1024,
            "copied {copied} bytes for an active tail of {tail}: {p}"
        );
        assert_eq!(p["group_offsets"], 1, "the group's offset copied: {p}");
    }

    // During: the source takes more and kmirror mirrors it, clients use the clone.
    for p in 0..2 {
        k.produce(&topic, p, 300, &opts(10 + p as u64));
    }
    let cloned_end = parts.iter().find(|p| p["partition"] == 0).unwrap()["cloned_end"]
        .as_i64()
        .unwrap();
    assert_eq!(cloned_end, 3500, "the clone was taken at the mirrored end");
    let written = harness::produce(
        &kmirror,
        &clone,
        0,
        100,
        &ProduceOpts {
            idempotent: true,
            seed: 99,
            ..ProduceOpts::default()
        },
    );
    assert_eq!(
        written.offsets,
        (cloned_end..cloned_end + 100).collect::<Vec<i64>>(),
        "the clone continues at the mirrored end"
    );
    assert_clone_holds(k, &kmirror, &topic, &clone, 3500, 3600);
    // The group rehearses: the same group id on the clone resumes at its committed offsets
    // and reads to the clone's ends (3,600 on partition 0, 3,500 on partition 1).
    assert_eq!(
        committed(&kmirror, &group, &clone),
        on_source,
        "offsets on the clone"
    );
    let ends = [3600i64, 3500];
    let rest: i64 = (0..2).map(|p| ends[p] - on_source[&(p as i32)]).sum();
    let resumed = group_consume(&kmirror, &clone, &group, rest as usize);
    for (p, end) in ends.iter().enumerate() {
        let offsets: Vec<i64> = resumed
            .iter()
            .filter(|r| r.partition == p as i32)
            .map(|r| r.offset)
            .collect();
        let from = on_source[&(p as i32)];
        assert_eq!(
            offsets,
            (from..*end).collect::<Vec<i64>>(),
            "partition {p} resumed at the group's offset {from}"
        );
    }
    wait_all_mirrored(&mut serve, &pairs);
    for (theirs, ours) in &pairs {
        assert_eq!(
            log_bytes(ours),
            log_bytes(theirs),
            "the mirror during the drill"
        );
    }

    // Disk: what the drill owns vs the mirror.
    let listed: Value =
        serde_json::from_str(&cli_ok(&admin, &["drill", "list", "--json"])).unwrap();
    let own = listed[0]["disk_bytes"].as_u64().unwrap();
    let shared_bytes = listed[0]["linked_bytes"].as_u64().unwrap();
    let tails: u64 = at_clone.iter().map(|(tail, _)| tail).sum();
    let copied: u64 = parts
        .iter()
        .map(|p| p["cost"]["copied_bytes"].as_u64().unwrap())
        .sum();
    eprintln!(
        "drill disk: own {own} bytes (copied at the start {copied}, of which active tails \
         {tails}; plus 100 records produced to the clone), shared by links {shared_bytes}; a \
         full copy of the drilled partitions: {full_copy} bytes"
    );
    // ≈ the tails: what was copied, what the clients wrote since (100 records of ~100 bytes)
    // and the indexes of the clone's active segments.
    assert!(
        own >= tails && own <= copied + 128 * 1024,
        "the drill owns about the active tails: own {own}, tails {tails}, copied {copied}"
    );
    assert!(
        own * 4 < full_copy,
        "the drill is not a full copy: own {own} vs {full_copy}"
    );
    let text = cli_ok(&admin, &["describe", "--mirror", "m"]);
    assert!(
        text.contains("Drill d1:"),
        "describe shows the drill: {text}"
    );

    // After: the clone is gone, the mirror goes on and still equals the source.
    cli_ok(&admin, &["drill", "stop", "--name", "d1"]);
    for p in 0..2 {
        assert!(
            !data_dir.join(format!("{clone}-{p}")).exists(),
            "clone dir deleted"
        );
    }
    let listed: Value =
        serde_json::from_str(&cli_ok(&admin, &["drill", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 0);
    assert!(
        committed(&kmirror, &group, &clone).is_empty(),
        "the offsets committed on the clone are deleted with it"
    );
    assert!(!data_dir.join("kmirror-drills/d1.json").exists());
    for p in 0..2 {
        k.produce(&topic, p, 200, &opts(20 + p as u64));
    }
    wait_all_mirrored(&mut serve, &pairs);
    for (theirs, ours) in &pairs {
        assert_eq!(
            log_bytes(ours),
            log_bytes(theirs),
            "the mirror after the drill"
        );
    }
    drop(serve);
}

#[test]
fn a_drill_survives_kill_9_and_its_stop_after_the_restart_deletes_it() {
    use kmirror::control::drill::{
        DrillPartition, DrillPhase, DrillRecord, DrillSummary, RECORDS_DIR,
    };
    use kmirror::control::json_records::JsonRecords;

    let k = shared();
    let topic = topic_of_small_segments(k, "drill-restart", 1);
    k.produce(&topic, 0, 2500, &opts(1));
    let ControlPlane {
        data_dir,
        admin,
        serve,
        config,
        work,
    } = ControlPlane::start(&k.bootstrap(), true, "");
    let mut serve = serve;
    let kmirror = serve.kafka_listener();
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    let pairs = vec![(
        k.partition_dir(&topic, 0),
        data_dir.join(format!("{topic}-0")),
    )];
    wait_all_mirrored(&mut serve, &pairs);
    assert!(log_files(&pairs[0].1).len() >= 3, "sealed segments");

    cli_ok(
        &admin,
        &[
            "drill", "start", "--mirror", "m", "--topics", &topic, "--name", "d2",
        ],
    );
    let clone = format!("drill.d2.{topic}");
    let before = harness::produce(&kmirror, &clone, 0, 50, &opts(7));
    assert_eq!(before.offsets, (2500..2550).collect::<Vec<i64>>());

    // A drill half started when kmirror dies: recorded as starting, its clone a bare
    // directory (the building was cut short).
    let half = format!("drill.half.{topic}");
    std::fs::create_dir(data_dir.join(format!("{half}-0"))).unwrap();
    let planned = DrillSummary {
        name: "half".into(),
        mirror: "m".into(),
        started_at_ms: 0,
        partitions: vec![DrillPartition {
            topic: topic.clone(),
            partition: 0,
            clone_topic: half.clone(),
            cloned_end: -1,
            cost: Default::default(),
            group_offsets: 0,
        }],
        disk_bytes: 0,
        linked_bytes: 0,
        groups_left_alone: Vec::new(),
    };
    JsonRecords::new(&data_dir, RECORDS_DIR)
        .put(
            "half",
            &DrillRecord {
                phase: DrillPhase::Starting,
                summary: planned,
            },
        )
        .unwrap();

    serve.kill9();
    let mut serve = Serve::start(&config, work.path().join("serve-restarted.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();

    // The running drill is back: listed, its clone readable (the mirrored records and the
    // 50 produced before the kill) and writable.
    let listed: Value =
        serde_json::from_str(&cli_ok(&admin, &["drill", "list", "--json"])).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["d2"], "{listed}");
    assert_eq!(listed[0]["partitions"][0]["cloned_end"], 2500);
    let text = cli_ok(&admin, &["describe", "--mirror", "m"]);
    assert!(
        text.contains("Drill d2:"),
        "describe shows the drill: {text}"
    );
    let after = harness::produce(&kmirror, &clone, 0, 10, &opts(8));
    assert_eq!(after.offsets, (2550..2560).collect::<Vec<i64>>());
    assert_clone_holds(k, &kmirror, &topic, &clone, 2500, 2560);
    // The half-started one is gone, directory and record.
    assert!(!data_dir.join(format!("{half}-0")).exists());
    assert!(!data_dir.join(RECORDS_DIR).join("half.json").exists());

    // Mirroring went on after the restart, untouched by the drill.
    k.produce(&topic, 0, 100, &opts(9));
    wait_all_mirrored(&mut serve, &pairs);

    cli_ok(&admin, &["drill", "stop", "--name", "d2"]);
    assert!(
        !data_dir.join(format!("{clone}-0")).exists(),
        "clone deleted"
    );
    assert!(!data_dir.join(RECORDS_DIR).join("d2.json").exists());
    // Nothing comes back on the next start.
    serve.kill9();
    let mut serve = Serve::start(&config, work.path().join("serve-again.log"));
    wait_admin(&mut serve, &admin);
    let listed: Value =
        serde_json::from_str(&cli_ok(&admin, &["drill", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 0, "{listed}");
    assert!(!data_dir.join(format!("{clone}-0")).exists());
    k.produce(&topic, 0, 10, &opts(10));
    wait_all_mirrored(&mut serve, &pairs);
    assert_eq!(log_bytes(&pairs[0].1), log_bytes(&pairs[0].0));
    drop(serve);
}
