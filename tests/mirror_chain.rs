//! Goal: kmirror serves what a downstream kmirror needs (Metadata with its own cluster id and
//! the source's topic ids and leader epochs, Fetch with sessions, ListOffsets,
//! OffsetForLeaderEpoch, DescribeConfigs), so a chain A (a real Kafka broker) → kmirror B →
//! kmirror C holds A's segment bytes exactly; and when B dies, C is re-pointed straight at A
//! (`mirrors repoint`) and resumes from its own log end, fetching nothing it already holds,
//! while a source whose topic of the same name holds another history is refused with the
//! reason (by `repoint`, and by `start` of a new mirror over C's existing logs) and C's log is
//! left as it was. Each topic's lineage (A's cluster id as Kafka's `kafka-cluster.sh
//! cluster-id` tells it with B's mirror epoch, then B's with C's) is in C's `describe` and in
//! what C serves (`kmirror.lineage`), before and after the re-point; a re-point of B at C
//! (which mirrors from B: same bytes, a loop) is refused by the lineage; STOPPED partitions
//! stay as they are through a re-point.
//!
//! Method: two `kmirror serve` control planes (B with a `[kafka]` listener), the Java
//! producer on A, our `.log` bytes compared with the broker's files; the re-copy figure is
//! C's `kmirror_shard_written_bytes_total` after the re-point against the bytes A wrote
//! after C's old log end.

mod harness;

use std::path::Path;

use harness::mirrors_cli::{cli, cli_ok, create_mirror, describe_rows, serve_admin_with_listener};
use harness::serve::{log_bytes, scrape_metrics, wait_all_mirrored};
use harness::ProduceOpts;

const PARTITIONS: i32 = 2;

/// Record bytes the shards appended since the process started
/// (`kmirror_shard_written_bytes_total`, summed over shards; the per-partition counter starts
/// again when a partition rejoins a shard, as a re-point makes it).
fn written_bytes(admin: &str) -> u64 {
    let scrape = scrape_metrics(admin);
    let lines: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("kmirror_shard_written_bytes_total{"))
        .collect();
    assert!(!lines.is_empty(), "no shard counters in:\n{scrape}");
    lines
        .iter()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

fn cluster_id_of(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("kmirror-cluster-id"))
        .unwrap()
        .trim()
        .to_owned()
}

fn list_row(admin: &str, mirror: &str) -> serde_json::Value {
    let rows: serde_json::Value =
        serde_json::from_str(&cli_ok(admin, &["list", "--json"])).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["mirror"] == mirror)
        .cloned()
        .unwrap()
}

/// Every partition row of `topic` in `describe --json` has `chain`, and the text shows it.
fn assert_lineage(admin: &str, topic: &str, chain: &serde_json::Value) {
    for r in describe_rows(admin, "up") {
        assert_eq!(&r["lineage"], chain, "{r}");
    }
    let shown: Vec<String> = chain
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            format!(
                "{}@{}",
                l["cluster_id"].as_str().unwrap(),
                l["mirror_epoch"]
            )
        })
        .collect();
    let text = cli_ok(admin, &["describe", "--mirror", "up"]);
    assert!(
        text.contains(&format!("Lineage of {topic} (up): {}", shown.join(" > "))),
        "{text}"
    );
}

#[test]
fn a_chain_is_byte_identical_and_a_repoint_resumes_without_a_recopy() {
    let a = harness::shared();
    let topic = harness::unique_topic("chain");
    a.create_topic(&topic, PARTITIONS, &[("retention.ms", "86400000")]);
    let spread = ProduceOpts {
        spread: PARTITIONS as u32,
        ..ProduceOpts::default()
    };
    a.produce(&topic, 0, 600, &spread);

    // A → B.
    let work_b = tempfile::tempdir().unwrap();
    let (mut b, admin_b, listener_b) = serve_admin_with_listener(work_b.path());
    create_mirror(&admin_b, work_b.path(), "m", &a.bootstrap(), "");
    cli_ok(&admin_b, &["start", "--mirror", "m", "--topics", &topic]);
    wait_all_mirrored(
        &mut b,
        &a.mirror_pairs(&topic, PARTITIONS, &work_b.path().join("data")),
    );

    // B → C: C's source is B, with B's own cluster id.
    let work_c = tempfile::tempdir().unwrap();
    let data_c = work_c.path().join("data");
    let (mut c, admin_c, listener_c) = serve_admin_with_listener(work_c.path());
    create_mirror(&admin_c, work_c.path(), "up", &listener_b, "");
    cli_ok(&admin_c, &["start", "--mirror", "up", "--topics", &topic]);
    let pairs_c = a.mirror_pairs(&topic, PARTITIONS, &data_c);
    wait_all_mirrored(&mut c, &pairs_c);
    let b_id = cluster_id_of(&work_b.path().join("data"));
    assert_ne!(
        b_id,
        cluster_id_of(&data_c),
        "two kmirrors share a cluster id"
    );
    assert_eq!(list_row(&admin_c, "up")["source_cluster_id"], b_id.as_str());
    // The topic config A has, copied by B, is copied from B by C (DescribeConfigs of B).
    let configs = harness::describe_topic_config_sources(&listener_c, &topic, &["retention.ms"]);
    assert_eq!(
        configs,
        [(
            "retention.ms".to_owned(),
            Some("86400000".to_owned()),
            Some("DYNAMIC_TOPIC_CONFIG".to_owned())
        )]
    );

    // Each topic's lineage: C's chain names A (by Kafka's own cluster id) with B's mirror
    // epoch, then B with C's. C serves it to its own downstream as the read-only topic config
    // `kmirror.lineage`, as the stock Admin client reads it.
    let a_id = harness::kafka_cluster_id(&a.bootstrap());
    assert_ne!(a_id, b_id);
    let epoch_b = list_row(&admin_b, "m")["mirror_epoch"].as_i64().unwrap();
    let epoch_c = list_row(&admin_c, "up")["mirror_epoch"].as_i64().unwrap();
    let link = |id: &str, epoch: i64| serde_json::json!({"cluster_id": id, "mirror_epoch": epoch});
    let chain = serde_json::json!([link(&a_id, epoch_b), link(&b_id, epoch_c)]);
    assert_lineage(&admin_c, &topic, &chain);
    let served = harness::describe_topic_config_sources(&listener_c, &topic, &["kmirror.lineage"]);
    assert_eq!(
        served,
        [(
            "kmirror.lineage".to_owned(),
            Some(format!("{a_id}:{epoch_b},{b_id}:{epoch_c}")),
            Some("DYNAMIC_TOPIC_CONFIG".to_owned())
        )]
    );

    // What the lineage refuses that the bytes cannot: B re-pointed at C, which mirrors the
    // topic from B. C holds B's bytes (the history check agrees), but following it would be a
    // loop; refused, and B keeps its source.
    let props_c = work_b.path().join("c.properties");
    std::fs::write(&props_c, format!("bootstrap.servers={listener_c}\n")).unwrap();
    let looped = cli(
        &admin_b,
        &[
            "repoint",
            "--mirror",
            "m",
            "--mirror-config",
            props_c.to_str().unwrap(),
        ],
    );
    println!("{}", looped.stderr);
    assert!(!looped.ok, "a loop was accepted: {}", looped.stdout);
    assert!(
        looped.stderr.contains("refused, nothing changed")
            && looped.stderr.contains("mirrors this topic from us")
            && looped
                .stderr
                .contains(&format!("holds our cluster id {b_id}"))
            && !looped.stderr.contains("differs"),
        "{}",
        looped.stderr
    );
    assert_eq!(
        list_row(&admin_b, "m")["source_bootstrap_servers"],
        a.bootstrap().as_str()
    );

    // New records on A flow through B to C.
    a.produce(
        &topic,
        0,
        400,
        &ProduceOpts {
            seed: 2,
            ..spread.clone()
        },
    );
    wait_all_mirrored(&mut c, &pairs_c);

    // B dies. A goes on taking records C does not have.
    b.kill9();
    let before: Vec<Vec<u8>> = pairs_c.iter().map(|(_, ours)| log_bytes(ours)).collect();
    let bytes_before = written_bytes(&admin_c);
    a.produce(
        &topic,
        0,
        500,
        &ProduceOpts {
            seed: 3,
            ..spread.clone()
        },
    );

    // C follows A directly: its history agrees, it resumes from its log end.
    let props_a = work_c.path().join("a.properties");
    std::fs::write(&props_a, format!("bootstrap.servers={}\n", a.bootstrap())).unwrap();
    let repoint = [
        "repoint",
        "--mirror",
        "up",
        "--mirror-config",
        props_a.to_str().unwrap(),
    ];
    let out = cli_ok(&admin_c, &repoint);
    println!("{out}");
    assert!(out.contains("history agrees; resumes from offset"), "{out}");
    wait_all_mirrored(&mut c, &pairs_c);
    let mut new_bytes = 0u64;
    for (i, (theirs, ours)) in pairs_c.iter().enumerate() {
        let now = log_bytes(ours);
        assert_eq!(now, log_bytes(theirs), "{} differs from A", ours.display());
        assert_eq!(
            &now[..before[i].len()],
            &before[i][..],
            "what C held before the re-point changed"
        );
        new_bytes += (now.len() - before[i].len()) as u64;
    }
    let fetched = written_bytes(&admin_c) - bytes_before;
    println!(
        "re-copy figure: C appended {fetched} bytes after the re-point; A wrote {new_bytes} bytes past C's old log end; C already held {} bytes",
        before.iter().map(Vec::len).sum::<usize>()
    );
    assert_eq!(fetched, new_bytes, "C fetched bytes it already held");
    let row = list_row(&admin_c, "up");
    assert_eq!(
        row["source_bootstrap_servers"],
        a.bootstrap().as_str(),
        "{row}"
    );
    assert_eq!(row["lineage"][0]["cluster_id"], b_id.as_str(), "{row}");
    for r in describe_rows(&admin_c, "up") {
        assert_eq!(r["state"], "MIRRORING", "{r}");
    }
    // The chain keeps B and adds A again under C's new mirror epoch.
    let epoch_c2 = list_row(&admin_c, "up")["mirror_epoch"].as_i64().unwrap();
    assert!(epoch_c2 > epoch_c);
    let chain = serde_json::json!([
        link(&a_id, epoch_b),
        link(&b_id, epoch_c),
        link(&a_id, epoch_c2)
    ]);
    assert_lineage(&admin_c, &topic, &chain);
    assert!(
        out.contains(&format!(
            "lineage of {topic}: {a_id}@{epoch_b} > {b_id}@{epoch_c} > {a_id}@{epoch_c2}"
        )),
        "{out}"
    );

    // A topic of the same name with another history is refused, and C keeps its log.
    cli_ok(&admin_c, &["pause", "--mirror", "up", "--topics", &topic]);
    let held: Vec<Vec<u8>> = pairs_c.iter().map(|(_, ours)| log_bytes(ours)).collect();
    a.delete_topic(&topic);
    a.create_topic(&topic, PARTITIONS, &[]);
    a.produce(
        &topic,
        0,
        2000,
        &ProduceOpts {
            seed: 4,
            ..spread.clone()
        },
    );
    let refused = cli(&admin_c, &repoint);
    println!("{}", refused.stderr);
    assert!(
        !refused.ok,
        "a foreign history was accepted: {}",
        refused.stdout
    );
    assert!(
        refused.stderr.contains("refused, nothing changed")
            && refused.stderr.contains("differs from the new source's")
            && refused.stderr.contains("another topic of the same name"),
        "{}",
        refused.stderr
    );
    for (i, (_, ours)) in pairs_c.iter().enumerate() {
        assert_eq!(log_bytes(ours), held[i], "{} changed", ours.display());
    }
    assert_eq!(
        list_row(&admin_c, "up")["lineage"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Failed over, the partitions are C's own: a re-point leaves them STOPPED and says why.
    cli_ok(&admin_c, &["stop", "--mirror", "up", "--topics", &topic]);
    let kept = cli_ok(&admin_c, &repoint);
    for p in 0..PARTITIONS {
        assert!(
            kept.contains(&format!(
                "{topic}-{p}: not re-pointed: STOPPED (failed over)"
            )),
            "{kept}"
        );
    }
    for r in describe_rows(&admin_c, "up") {
        assert_eq!(r["state"], "STOPPED", "{r}");
    }
    for (i, (_, ours)) in pairs_c.iter().enumerate() {
        assert_eq!(log_bytes(ours), held[i], "{} changed", ours.display());
    }

    // Nor does a new mirror take over C's logs of that topic (left by the failed-over "up")
    // from a source holding another history: `start` checks them the same way.
    create_mirror(&admin_c, work_c.path(), "other", &a.bootstrap(), "");
    let taken = cli(
        &admin_c,
        &["start", "--mirror", "other", "--topics", &topic],
    );
    println!("{}", taken.stderr);
    assert!(!taken.ok, "a foreign history was adopted: {}", taken.stdout);
    assert!(
        taken
            .stderr
            .contains("start of mirror other refused, nothing changed")
            && taken.stderr.contains("local data from an earlier mirror")
            && taken.stderr.contains("differs from the new source's"),
        "{}",
        taken.stderr
    );
    assert!(describe_rows(&admin_c, "other").is_empty());
    for (i, (_, ours)) in pairs_c.iter().enumerate() {
        assert_eq!(log_bytes(ours), held[i], "{} changed", ours.display());
    }
    let text = c.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
