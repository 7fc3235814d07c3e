//! Goal (issue 11 item 5): mirrored history is never deleted because the source lost it. When
//! the source's retention passes our log end while kmirror is down, kmirror keeps every local
//! batch byte for byte, continues at the source's log start (an offset gap, as compaction
//! leaves), and reports the gap in `describe` (`skippedRecords`), in /metrics
//! (`kmirror_partition_records_skipped_total`) and in its log (a warning with both offsets).
//! Kafka's DumpLogSegments and the Java consumer read the gapped partition.
//!
//! Method: a dedicated Kafka broker checking retention every second; a topic with small
//! segments, mirrored by `kmirror serve` (control plane, `retention.ms` excluded from the copied
//! configs so kmirror's own retention cannot be what deletes); kmirror is stopped (SIGTERM),
//! more records are produced and the source topic's retention set to 1 s until its log start
//! passes our end, then retention is restored, a last few records produced, and kmirror started
//! again on the same data dir.

mod harness;

use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::mirrors_cli::{
    cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{log_bytes, plain, scrape_metrics, wait_mirrored, Serve, CATCH_UP_LIMIT};
use harness::{Isolation, Kafka, ProduceOpts};

/// Failure guard for the broker's retention to delete segments (checks every second), not a
/// performance claim.
const RETENTION_LIMIT: Duration = Duration::from_secs(120);

fn set_retention(k: &Kafka, topic: &str, ms: &str) {
    k.alter_config(topic, &[("retention.ms", ms)]);
}

#[test]
fn source_retention_past_our_end_leaves_a_reported_gap_and_keeps_local_batches() {
    let k = Kafka::start_with(
        harness::KafkaVersion::DEFAULT,
        &[("log.retention.check.interval.ms", "1000")],
    );
    let topic = harness::unique_topic("gap");
    let segment = k.version.segment_bytes_config();
    k.create_topic(&topic, 1, &[(segment, "16384")]);
    let small = ProduceOpts {
        batch_size: 2048,
        ..ProduceOpts::default()
    };
    k.produce(&topic, 0, 300, &small);

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let listener = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some(&listener), &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    create_mirror(
        &admin,
        work.path(),
        "m",
        &k.bootstrap(),
        "mirror.topic.properties.exclude=retention.ms\n",
    );
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    let ours = data_dir.join(format!("{topic}-0"));
    let theirs = k.partition_dir(&topic, 0);
    wait_mirrored(&mut serve, &theirs, &ours);
    serve.sigterm_and_wait();
    let kept = log_bytes(&ours);
    let kept_files = harness::serve::log_files(&ours);
    let source_segments = harness::serve::log_files(&theirs).len();
    assert!(
        source_segments > 2,
        "the source rolls small segments: {source_segments}"
    );
    let our_end = 300i64;

    // While kmirror is down the source moves on and its retention deletes past our end.
    k.produce(&topic, 0, 300, &small);
    set_retention(&k, &topic, "1000");
    let start = Instant::now();
    let source_start = loop {
        let o = harness::offsets(&k.bootstrap(), &topic, 0);
        if o.log_start_offset > our_end {
            break o.log_start_offset;
        }
        assert!(
            start.elapsed() < RETENTION_LIMIT,
            "the source's retention never passed offset {our_end}: {o:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    set_retention(&k, &topic, "604800000");
    // Retention may still have been deleting: read the final log start once it is restored.
    std::thread::sleep(Duration::from_millis(1500));
    let source_start = harness::offsets(&k.bootstrap(), &topic, 0)
        .log_start_offset
        .max(source_start);
    let last = k.produce(&topic, 0, 50, &small);
    assert!(last.first_offset >= source_start);

    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    // Caught up: our bytes are the kept ones followed by everything the source still holds.
    let theirs_now = log_bytes(&theirs);
    let began = Instant::now();
    loop {
        serve.assert_running();
        let now = log_bytes(&ours);
        if now.len() >= kept.len() + theirs_now.len() {
            break;
        }
        assert!(
            began.elapsed() < CATCH_UP_LIMIT,
            "not caught up: {} of {} bytes\n{}",
            now.len(),
            kept.len() + theirs_now.len(),
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let now = log_bytes(&ours);
    assert!(
        now[..kept.len()] == kept[..],
        "a local batch changed or went away"
    );
    assert!(
        now[kept.len()..] == theirs_now[..],
        "after the gap the log is not the source's bytes"
    );
    for f in &kept_files {
        assert!(f.exists(), "{} was deleted", f.display());
    }

    // The gap is reported: describe, /metrics and the log.
    let skipped = source_start - our_end;
    let rows = describe_rows(&admin, "m");
    let row = rows
        .iter()
        .find(|r| r["topic"] == topic.as_str())
        .expect("describe row");
    assert_eq!(row["state"], "MIRRORING", "{row}");
    let first_new = {
        let records = harness::consume_to_end(&listener, &topic, 0, Isolation::ReadUncommitted);
        let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
        let expected: Vec<i64> = (0..our_end)
            .chain(offsets.iter().copied().filter(|o| *o >= our_end))
            .collect();
        assert_eq!(offsets, expected, "the consumer reads across the gap");
        assert_eq!(
            offsets.len(),
            our_end as usize + (600 + 50 - source_start) as usize
        );
        offsets[our_end as usize]
    };
    // The gap ends at the source's log start (a segment base after retention).
    assert_eq!(first_new, source_start);
    assert_eq!(row["skippedRecords"], skipped, "{row}");
    let metrics = scrape_metrics(&admin);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("kmirror_partition_records_skipped_total") && l.contains(&topic))
        .unwrap_or_else(|| panic!("no records-skipped counter for {topic}:\n{metrics}"));
    assert!(line.ends_with(&format!(" {skipped}")), "{line}");
    let text = plain(&serve.log_text());
    let warned = text.lines().any(|l| {
        l.contains("WARN")
            && l.contains("retention passed our log end")
            && l.contains(&format!("local_log_end={our_end}"))
            && l.contains(&format!("source_log_start={first_new}"))
    });
    assert!(warned, "no warning naming both offsets:\n{text}");

    // Kafka's own tool reads every segment, the gap included.
    let dump = dump_log_segments(&segment_files(&ours), DumpFlags::default());
    dump.assert_clean();
    serve.sigterm_and_wait();
}
