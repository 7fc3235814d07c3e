//! Goal: a failover drill (issue 16 item 2) gives clients a writable clone of mirrored topics
//! while mirroring goes on, costs about the active segments' tails on disk, and never changes
//! the mirror: its logs equal the source's bytes before, during and after the drill.
//!
//! Method: the shared broker, a two-partition topic with 1 MiB segments (Kafka's least; copied
//! to kmirror with the topic configs) and 3.5 MB per partition so each partition has many sealed segments; kmirror serves
//! `[admin]` and `[kafka]`. After mirroring, `mirrors drill start` clones the topic as
//! `drill.d1.<topic>`; the source keeps taking records (mirrored meanwhile), the Java producer
//! writes to the clone through kmirror's listener and the Java consumer reads it back (the
//! mirrored records up to the clone point, then its own). `drill stop` deletes it. The drill's
//! own bytes on disk (files not shared with the mirror by hard links) are measured against
//! the mirror's log size and the active segments' tails.

mod harness;

use std::path::Path;

use harness::mirrors_cli::{cli_ok, ControlPlane};
use harness::serve::{log_bytes, log_files, wait_all_mirrored};
use harness::{shared, unique_topic, Isolation, ProduceOpts};
use serde_json::Value;

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

#[test]
fn drill_clones_writable_while_mirroring_and_leaves_the_mirror_identical() {
    let k = shared();
    let topic = unique_topic("drill");
    k.create_topic(&topic, 2, &[("segment.bytes", "1048576")]);
    let opts = |seed| ProduceOpts {
        seed,
        value_bytes: 1000,
        ..ProduceOpts::default()
    };
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
    } = ControlPlane::start(&k.bootstrap(), true, "");
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
        assert!(p["cost"]["linked_bytes"].as_u64().unwrap() > 0, "{p}");
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
    let on_clone = harness::consume(&kmirror, &clone, 0, 0, 3600, Isolation::ReadCommitted);
    assert_eq!(on_clone.len(), 3600);
    let source = k.consume(&topic, 0, 0, 3500, Isolation::ReadCommitted);
    assert_eq!(
        on_clone[..3500]
            .iter()
            .map(|r| (r.offset, &r.value))
            .collect::<Vec<_>>(),
        source
            .iter()
            .map(|r| (r.offset, &r.value))
            .collect::<Vec<_>>(),
        "the clone holds the mirrored records"
    );
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
    let mirror_bytes: u64 = pairs.iter().map(|(_, ours)| dir_bytes(ours)).sum();
    let tails: u64 = pairs
        .iter()
        .map(|(_, ours)| {
            let logs = log_files(ours);
            std::fs::metadata(logs.last().unwrap()).unwrap().len()
        })
        .sum();
    eprintln!(
        "drill disk: own {own} bytes (incl. 100 produced records), shared by links {shared_bytes}, \
         mirror partitions {mirror_bytes} bytes, mirror active segments now {tails} bytes"
    );
    assert!(
        own * 4 < mirror_bytes,
        "the drill is not a full copy: own {own} vs mirror {mirror_bytes}"
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
