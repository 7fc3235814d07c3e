//! Goal: kmirror's Kafka listener serves incremental fetch sessions (KIP-227) the way a broker
//! does, and a stock consumer that uses them reads exactly what the source holds. Method: a
//! real KRaft broker (Kafka 4.1.1) is the source of a 20-partition topic; `kmirror serve` (the
//! binary, static mode with `[kafka]` and `[metrics]`) mirrors it; Kafka's own console consumer
//! (which opens a fetch session per broker and then sends incremental fetches) reads the whole
//! topic from kmirror with small per-partition fetch sizes, so it needs many fetches, and its
//! output (partition, offset, timestamp, headers, key, value of every record) must equal its
//! output against the source. kmirror's `/metrics` must then show sessions created and
//! incremental fetches served: without sessions the client falls back to full fetches and
//! those counters stay at zero, failing the test. A last read from kmirror uses a response
//! limit that runs out inside a partition's first batch, which a broker answers with no
//! records for that partition; the consumer must again get every record.

mod harness;
mod mirror_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use harness::mirrors_cli::free_loopback_port;
use harness::serve::{add_kafka_listener, wait_all_mirrored, Serve};
use harness::ProduceOpts;

const PARTITIONS: i32 = 20;
const RECORDS: usize = 4_000;

/// Starts `kmirror serve` mirroring `topic` with a Kafka listener and `/metrics`; returns it,
/// its data dir and the listener's address.
fn start_serving(
    work: &Path,
    bootstrap: &str,
    topic: &str,
    metrics: &str,
) -> (Serve, PathBuf, String) {
    let (config, data_dir) = mirror_support::write_config(work, bootstrap, &[topic]);
    add_kafka_listener(&config);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[metrics]\nlisten = \"{metrics}\"\n"));
    std::fs::write(&config, text).unwrap();
    let mut serve = Serve::start(&config, work.join("serve.log"));
    let addr = serve.kafka_listener();
    (serve, data_dir, addr)
}

/// Every record of `topic` as the console consumer prints it, sorted by partition and offset;
/// `limits` are extra consumer properties.
fn console_read(bootstrap: &str, topic: &str, limits: &[&str]) -> Vec<String> {
    let max = RECORDS.to_string();
    let mut args = vec![
        "--topic",
        topic,
        "--from-beginning",
        "--max-messages",
        &max,
        "--timeout-ms",
        "60000",
        "--property",
        "print.partition=true",
        "--property",
        "print.offset=true",
        "--property",
        "print.timestamp=true",
        "--property",
        "print.headers=true",
        "--property",
        "print.key=true",
    ];
    for property in limits {
        args.extend(["--consumer-property", property]);
    }
    let mut lines = harness::console_consumer(bootstrap, &args);
    let key = |l: &String| -> (i64, i64) {
        let field = |name: &str| {
            l.split('\t')
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {l:?}"))
        };
        (field("Partition:"), field("Offset:"))
    };
    lines.sort_by_key(key);
    lines
}

/// `name` → value of every unlabelled sample of a scrape.
fn scrape(addr: &str) -> HashMap<String, f64> {
    let mut resp = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap_or_else(|e| panic!("scraping {addr}: {e}"));
    let text = resp.body_mut().read_to_string().unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn console_consumer_reads_through_incremental_fetch_sessions() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-sessions");
    k.create_topic(&topic, PARTITIONS, &[]);
    let opts = ProduceOpts {
        spread: PARTITIONS as u32,
        batch_size: 1024,
        headers: 1,
        seed: 11,
        ..Default::default()
    };
    k.produce(&topic, 0, RECORDS, &opts);

    let work = tempfile::tempdir().unwrap();
    let metrics = format!("127.0.0.1:{}", free_loopback_port());
    let (mut serve, data_dir, kmirror) =
        start_serving(work.path(), &k.bootstrap(), &topic, &metrics);
    let pairs = k.mirror_pairs(&topic, PARTITIONS, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);
    let before = scrape(&metrics);
    assert_eq!(
        before.get("kmirror_endpoint_fetch_sessions_created_total"),
        Some(&0.0),
        "no client fetched yet"
    );

    // Small fetches: the topic takes many fetch round trips, so most are incremental.
    let small = ["max.partition.fetch.bytes=4096"];
    let theirs = console_read(&k.bootstrap(), &topic, &small);
    assert_eq!(theirs.len(), RECORDS, "the source gave every record");
    let ours = console_read(&kmirror, &topic, &small);
    assert_eq!(ours.len(), RECORDS, "kmirror gave every record");
    assert_eq!(
        ours, theirs,
        "records read from kmirror differ from the source's"
    );

    let after: Vec<(String, f64)> = scrape(&metrics)
        .into_iter()
        .filter(|(name, _)| name.starts_with("kmirror_endpoint_"))
        .collect();
    let value = |name: &str| {
        after
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{name} missing: {after:?}"))
    };
    let created = value("kmirror_endpoint_fetch_sessions_created_total");
    let incremental = value("kmirror_endpoint_incremental_fetches_total");
    eprintln!(
        "kmirror: {created} fetch sessions created, {incremental} incremental fetches served"
    );
    assert!(
        created >= 1.0,
        "the consumer's full fetch opened no session: {after:?}"
    );
    assert!(
        incremental >= 1.0,
        "no incremental fetch was served (created {created}): {after:?}"
    );
    // A response limit that runs out inside the next partition's first batch (1,500 bytes of
    // the 2,000 go to the first partition, batches are about 1 KiB): that partition must come
    // back with no records, as from a broker, not with the cut bytes, which stop the Java
    // consumer ("no complete records were found").
    let cut = ["max.partition.fetch.bytes=1500", "fetch.max.bytes=2000"];
    let ours = console_read(&kmirror, &topic, &cut);
    assert_eq!(
        ours.len(),
        RECORDS,
        "kmirror gave every record under a cutting limit"
    );
    assert_eq!(ours, theirs, "records read under a cutting limit differ");

    serve.assert_running();
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
