//! Goal: kmirror serves what a downstream kmirror needs (Metadata with its own cluster id and
//! the source's topic ids and leader epochs, Fetch with sessions, ListOffsets,
//! OffsetForLeaderEpoch, DescribeConfigs), so a chain A (a real Kafka broker) → kmirror B →
//! kmirror C holds A's segment bytes exactly; and when B dies, C is re-pointed straight at A
//! (`mirrors repoint`) and resumes from its own log end, fetching nothing it already holds,
//! while a source whose topic of the same name holds another history is refused with the
//! reason (by `repoint`, and by `start` of a new mirror over C's existing logs) and C's log is
//! left as it was.
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

    // Nor does a new mirror take over C's logs of that topic (left by the failed-over "up")
    // from a source holding another history: `start` checks them the same way.
    cli_ok(&admin_c, &["stop", "--mirror", "up", "--topics", &topic]);
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
