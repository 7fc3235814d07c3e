//! Goal: the continuous integrity audit (issue 16 item 1) proves what the copy holds, against a
//! real Kafka 4.1.1 broker through `kmirror serve` and the CLIs:
//! - after mirroring, every partition's verified-through offset reaches the local log end
//!   (describe, `kmirror audit report`, /metrics), and the audit's cost (bytes fetched again
//!   from the source vs bytes mirrored) is printed;
//! - one byte flipped in a closed mirrored segment on disk: the scrub reports exactly that
//!   batch (its base and last offset) and the partition goes FAILED with the reason;
//! - the source topic deleted and recreated with different data at the same offsets: a
//!   mismatch event naming both CRCs and the new topic id.

mod harness;

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use harness::mirrors_cli::{
    audit_report, cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin,
    write_admin_config,
};
use harness::serve::{log_files, scrape_metrics, Serve};
use harness::ProduceOpts;
use kmirror::wire::batch::Batches;

/// Failure guard for the audit to get where the test waits for, not a performance claim.
const AUDIT_LIMIT: Duration = Duration::from_secs(180);

fn wait_until<T>(serve: &mut Serve, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        serve.assert_running();
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            start.elapsed() < AUDIT_LIMIT,
            "{what}: never happened\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn metric(scrape: &str, name: &str, topic: &str) -> Option<f64> {
    scrape
        .lines()
        .find(|l| l.starts_with(name) && l.contains(&format!("topic=\"{topic}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn verified_through_scrub_and_source_mismatch() {
    let k = harness::shared();
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &data_dir, "sync_interval_ms = 1000\n");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);

    // 1. Verified through the end. 1 MiB segments (Kafka's minimum), copied to the mirror,
    //    so the data spans closed segments.
    let topic = harness::unique_topic("audit");
    k.create_topic(&topic, 1, &[("segment.bytes", "1048576")]);
    let records = 14_000;
    k.produce(&topic, 0, records, &ProduceOpts::default());
    create_mirror(
        &admin,
        work.path(),
        "a",
        &k.bootstrap(),
        "mirror.audit.interval.ms=500\n",
    );
    cli_ok(&admin, &["start", "--mirror", "a", "--topics", &topic]);
    let end = records as i64;
    let row = wait_until(&mut serve, "verified through the end", || {
        let rows = describe_rows(&admin, "a");
        let r = rows[0].clone();
        (r["destinationOffset"] == end && r["verifiedOffset"] == end).then_some(r)
    });
    assert_eq!(row["state"], "MIRRORING", "{row}");
    assert!(row["verifiedTimestampMs"].as_i64().unwrap() > 0, "{row}");
    assert_eq!(row["verifiedLagSeconds"], 0.0, "{row}");
    let report = audit_report(&admin, "a");
    assert_eq!(report["mismatches"], 0, "{report}");
    assert_eq!(report["partitions"][0]["verifiedOffset"], end, "{report}");
    let table = cli_ok(&admin, &["describe", "--mirror", "a"]);
    assert!(table.contains("VERIFIED-OFFSET"), "{table}");
    let scrape = scrape_metrics(&admin);
    assert_eq!(
        metric(&scrape, "kmirror_partition_verified_offset", &topic),
        Some(end as f64),
        "{scrape}"
    );
    let fetched = metric(&scrape, "kmirror_audit_fetched_bytes_total", &topic).unwrap();
    let mirrored = metric(&scrape, "kmirror_partition_mirrored_bytes_total", &topic).unwrap();
    assert!(fetched > 0.0 && mirrored > 0.0, "{scrape}");
    println!(
        "audit cost: {fetched} bytes fetched from the source for verification vs {mirrored} bytes \
         mirrored ({:.3}x); {} bytes re-read locally",
        fetched / mirrored,
        metric(&scrape, "kmirror_audit_read_bytes_total", &topic).unwrap()
    );

    // 2. One byte flipped inside a batch of the first (closed) segment.
    let dir = data_dir.join(format!("{topic}-0"));
    let segments = log_files(&dir);
    assert!(segments.len() >= 2, "want closed segments: {segments:?}");
    let first = std::fs::read(&segments[0]).unwrap();
    let batches: Vec<_> = Batches::new(&first).map(|b| b.unwrap()).collect();
    let (pos, victim) = &batches[batches.len() / 2];
    let (base, last) = (victim.base_offset().0, victim.last_offset().0);
    let at = (*pos + victim.size() - 3) as u64;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&segments[0])
        .unwrap();
    f.write_all_at(&[first[at as usize] ^ 0x40], at).unwrap();
    drop(f);
    let event = wait_until(&mut serve, "scrub event", || {
        let r = audit_report(&admin, "a");
        r["events"].as_array().unwrap().first().cloned()
    });
    assert_eq!(event["kind"], "scrub", "{event}");
    assert_eq!(
        (&event["scrub"]["baseOffset"], &event["scrub"]["lastOffset"]),
        (&base.into(), &last.into()),
        "the scrub names exactly the damaged batch: {event}"
    );
    assert_eq!(event["scrub"]["position"], *pos as u64, "{event}");
    let row = wait_until(&mut serve, "FAILED after the scrub", || {
        let r = describe_rows(&admin, "a")[0].clone();
        (r["state"] == "FAILED").then_some(r)
    });
    let why = row["errorMessage"].as_str().unwrap();
    assert!(
        why.contains(&format!("local batch {base}..={last} is damaged")),
        "{row}"
    );
    assert_eq!(row["retryAttempt"], -1, "{row}");
    let scrape = scrape_metrics(&admin);
    assert_eq!(
        metric(&scrape, "kmirror_audit_mismatches_total", &topic),
        Some(1.0),
        "{scrape}"
    );

    // 3. The source topic recreated with other data at the same offsets. One batch per round
    //    (1 byte/s budget), so the audit is still behind when the topic changes.
    let topic = harness::unique_topic("audit-recreated");
    k.create_topic(&topic, 1, &[]);
    let small = ProduceOpts {
        batch_size: 1000,
        ..ProduceOpts::default()
    };
    k.produce(&topic, 0, 600, &small);
    create_mirror(
        &admin,
        work.path(),
        "r",
        &k.bootstrap(),
        "mirror.audit.interval.ms=2000\nmirror.audit.bytes.per.sec=1\n",
    );
    cli_ok(&admin, &["start", "--mirror", "r", "--topics", &topic]);
    let row = wait_until(&mut serve, "mirrored, partly verified", || {
        let r = describe_rows(&admin, "r")[0].clone();
        (r["destinationOffset"] == 600 && r["verifiedOffset"].as_i64().is_some_and(|v| v > 0))
            .then_some(r)
    });
    assert!(row["verifiedOffset"].as_i64().unwrap() < 600, "{row}");
    k.delete_topic(&topic);
    k.create_topic(&topic, 1, &[]);
    let other = ProduceOpts { seed: 99, ..small };
    k.produce(&topic, 0, 600, &other);
    let event = wait_until(&mut serve, "mismatch event", || {
        let r = audit_report(&admin, "r");
        r["events"].as_array().unwrap().first().cloned()
    });
    println!("{event:#}");
    assert_eq!(event["kind"], "mismatch", "{event}");
    let (l, s) = (&event["mismatch"]["local"], &event["mismatch"]["source"]);
    assert_ne!(l["crc"], s["crc"], "{event}");
    let message = event["message"].as_str().unwrap();
    assert!(message.contains("deleted and recreated"), "{message}");
    assert!(
        message.contains(&format!("local crc {:#010x}", l["crc"].as_u64().unwrap())),
        "{message}"
    );
    let row = describe_rows(&admin, "r")[0].clone();
    assert_eq!(row["state"], "FAILED", "{row}");
    let v = row["verifiedOffset"].as_i64().unwrap();
    assert!(
        v <= l["baseOffset"].as_i64().unwrap(),
        "never verified past the mismatch: {row}"
    );
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");

    // The marks survive a restart.
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let report = audit_report(&admin, "r");
    assert_eq!(report["partitions"][0]["verifiedOffset"], v, "{report}");
    serve.sigterm_and_wait();
}
