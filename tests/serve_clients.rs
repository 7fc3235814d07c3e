//! Goal: stock Kafka clients read a mirrored topic from kmirror's Kafka endpoint and get
//! exactly what the source broker gives them. Method: a real KRaft broker (Kafka 4.1.1) is
//! the source; the Java producer writes plain, compressed, idempotent and transactional
//! (committed and aborted) batches with headers; `kmirror serve` (the binary) mirrors them
//! and serves `[kafka]`; then the Java consumer (KafkaTool) and kafka-python (PyPI) consume
//! from kmirror, and every answer is compared with the same client's answer from the source:
//! records (key, value, headers, offset, timestamp) read_uncommitted and read_committed,
//! ListOffsets earliest/latest/by timestamp/max timestamp, DescribeConfigs. Produce to the mirrored topic must
//! fail with INVALID_TOPIC_EXCEPTION and our message in both clients. Malformed requests
//! (garbage, oversized length, unknown API, truncated frame) close only their connection.

mod harness;
mod mirror_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use harness::mirrors_cli::{
    cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::python_clients::{self, kafka_python};
use harness::serve::{add_kafka_listener, wait_mirrored, Serve};
use harness::{Codec, ConsumedRecord, Isolation, ProduceOpts, TxnEnd};
use mirror_support::write_config;

/// Starts `kmirror serve` mirroring `topics` with a Kafka listener on a free port; returns it
/// and the listener's `host:port` (read from its log line).
fn start_serving(
    work: &Path,
    bootstrap: &str,
    topics: &[&str],
) -> (Serve, std::path::PathBuf, String) {
    let (config, data_dir) = write_config(work, bootstrap, topics);
    add_kafka_listener(&config);
    let mut serve = Serve::start(&config, work.join("serve.log"));
    let addr = serve.kafka_listener();
    (serve, data_dir, addr)
}

#[test]
fn stock_clients_read_the_mirror_as_they_read_the_source() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-clients");
    k.create_topic(&topic, 2, &[]);
    // Partition 0: plain then compressed batches, with headers.
    let plain = ProduceOpts {
        headers: 2,
        seed: 1,
        ..Default::default()
    };
    k.produce(&topic, 0, 300, &plain);
    let gzip = ProduceOpts {
        codec: Codec::Gzip,
        headers: 1,
        seed: 2,
        ..Default::default()
    };
    k.produce(&topic, 0, 400, &gzip);
    // Partition 1: transactions committed and aborted, then idempotent lz4.
    let txns = ProduceOpts {
        transactions: vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit, TxnEnd::Abort],
        headers: 1,
        seed: 3,
        ..Default::default()
    };
    k.produce(&topic, 1, 400, &txns);
    let idem = ProduceOpts {
        codec: Codec::Lz4,
        idempotent: true,
        seed: 4,
        ..Default::default()
    };
    let last = k.produce(&topic, 1, 200, &idem);
    k.wait_for_log_end(&topic, 1, last.last_offset + 1);

    let work = tempfile::tempdir().unwrap();
    let (mut serve, data_dir, kmirror) = start_serving(work.path(), &k.bootstrap(), &[&topic]);
    for p in 0..2 {
        let ours = data_dir.join(format!("{topic}-{p}"));
        wait_mirrored(&mut serve, &k.partition_dir(&topic, p), &ours);
    }

    for p in 0..2 {
        for iso in [Isolation::ReadUncommitted, Isolation::ReadCommitted] {
            // Each consumer reads up to the end offset (the last stable one read_committed).
            let theirs = harness::consume_to_end(&k.bootstrap(), &topic, p, iso);
            assert!(!theirs.is_empty(), "source gave nothing for {topic}-{p}");
            let ours = harness::consume_to_end(&kmirror, &topic, p, iso);
            assert_eq!(
                ours.len(),
                theirs.len(),
                "{topic}-{p} {iso:?}: record count"
            );
            assert_eq!(
                ours, theirs,
                "{topic}-{p} {iso:?}: Java consumer records differ"
            );
            let iso_name = match iso {
                Isolation::ReadCommitted => "read_committed",
                Isolation::ReadUncommitted => "read_uncommitted",
            };
            let py = python_clients::records(&kafka_python(&[
                "consume",
                &kmirror,
                &topic,
                &p.to_string(),
                &theirs.len().to_string(),
                iso_name,
            ]));
            assert_eq!(
                py, theirs,
                "{topic}-{p} {iso:?}: kafka-python records differ"
            );
        }
    }

    // Aborted records exist on partition 1 and a read_committed consumer of kmirror sees none.
    let all = harness::consume_to_end(&kmirror, &topic, 1, Isolation::ReadUncommitted);
    let committed = harness::consume_to_end(&kmirror, &topic, 1, Isolation::ReadCommitted);
    let aborted: Vec<&ConsumedRecord> = all.iter().filter(|r| !committed.contains(r)).collect();
    assert_eq!(
        aborted.len(),
        200,
        "two aborted transactions of 100 records each"
    );
    for r in &aborted {
        assert!(
            !committed.iter().any(|c| c.offset == r.offset),
            "aborted offset {} visible read_committed",
            r.offset
        );
    }

    // ListOffsets: earliest/latest, by timestamp (records' own timestamps, before all, after
    // all) and max timestamp all equal the source's answers.
    for p in 0..2 {
        assert_eq!(
            harness::offsets(&kmirror, &topic, p).log_end_offset,
            k.offsets(&topic, p).log_end_offset
        );
        assert_eq!(
            harness::offsets(&kmirror, &topic, p).log_start_offset,
            k.offsets(&topic, p).log_start_offset
        );
        let recs = harness::consume_to_end(&k.bootstrap(), &topic, p, Isolation::ReadUncommitted);
        let mut stamps: Vec<i64> = [0, recs.len() / 3, recs.len() / 2, recs.len() - 1]
            .iter()
            .map(|&i| recs[i].timestamp)
            .collect();
        stamps.extend([
            0,
            recs[0].timestamp + 1,
            recs[recs.len() - 1].timestamp + 60_000,
        ]);
        let theirs = harness::offsets_for_times(&k.bootstrap(), &topic, p, &stamps);
        let ours = harness::offsets_for_times(&kmirror, &topic, p, &stamps);
        assert_eq!(ours, theirs, "{topic}-{p}: ListOffsets by timestamp");
    }

    // DescribeConfigs: the settings kmirror applies equal the source broker's (both defaults).
    let keys = [
        "segment.bytes",
        "retention.ms",
        "retention.bytes",
        "index.interval.bytes",
    ];
    let ours = harness::describe_topic_configs(&kmirror, &topic, &keys);
    assert_eq!(
        ours,
        harness::describe_topic_configs(&k.bootstrap(), &topic, &keys)
    );
    assert!(ours.iter().all(|(_, v)| v.is_some()), "{ours:?}");

    // Produce to a mirrored topic fails with INVALID_TOPIC_EXCEPTION and our message.
    let out = harness::run_tool_unchecked(&[
        "produce".into(),
        "--bootstrap".into(),
        kmirror.clone(),
        "--topic".into(),
        topic.clone(),
        "--partition".into(),
        "0".into(),
        "--count".into(),
        "1".into(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "Java produce to the mirror succeeded"
    );
    assert!(
        err.contains("InvalidTopicException"),
        "Java producer error:\n{err}"
    );
    assert!(
        err.contains("read-only"),
        "Java producer error lacks our message:\n{err}"
    );
    let py = kafka_python(&["produce", &kmirror, &topic, "0"]);
    assert_eq!(py[0]["error"], "InvalidTopicError", "kafka-python: {py:?}");
    assert_eq!(py[0]["retriable"], false, "kafka-python: {py:?}");
    // Nothing was appended to the mirror by the attempts.
    assert_eq!(
        harness::offsets(&kmirror, &topic, 0).log_end_offset,
        k.offsets(&topic, 0).log_end_offset
    );
    serve.assert_running();
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}

/// Sends `bytes` on a fresh connection and reports whether the server closed it.
fn closed_after(addr: &str, bytes: &[u8], then_close_write: bool) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    if then_close_write {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn malformed_requests_close_only_their_connection() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-garbage");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 50, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let (mut serve, data_dir, kmirror) = start_serving(work.path(), &k.bootstrap(), &[&topic]);
    wait_mirrored(
        &mut serve,
        &k.partition_dir(&topic, 0),
        &data_dir.join(format!("{topic}-0")),
    );

    // An idle client that stays connected throughout must keep working.
    let survivor = harness::consume(&kmirror, &topic, 0, 0, 50, Isolation::ReadUncommitted);
    assert_eq!(survivor.len(), 50);

    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "negative length",
            vec![0xff, 0xff, 0xff, 0xf0, 1, 2, 3],
            false,
        ),
        (
            "length above the limit",
            (1_000_000_000i32).to_be_bytes().to_vec(),
            false,
        ),
        (
            "unknown api key",
            {
                let mut f = 12i32.to_be_bytes().to_vec();
                f.extend([0x7f, 0x00, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0, 0]);
                f
            },
            false,
        ),
        (
            "garbage body for Metadata v12",
            {
                let mut f = 16i32.to_be_bytes().to_vec();
                f.extend([
                    0, 3, 0, 12, 0, 0, 0, 9, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55,
                ]);
                f
            },
            false,
        ),
        (
            // The decoder must not reserve room for 2^31-1 topics before reading any.
            "Metadata v0 claiming 2^31-1 topics",
            {
                let mut f = 14i32.to_be_bytes().to_vec();
                f.extend([0, 3, 0, 0, 0, 0, 0, 9, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff]);
                f
            },
            false,
        ),
        (
            "Metadata v12 claiming 2^32-2 topics (compact array)",
            {
                let mut f = 16i32.to_be_bytes().to_vec();
                f.extend([
                    0, 3, 0, 12, 0, 0, 0, 9, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0xff, 0x0f,
                ]);
                f
            },
            false,
        ),
        (
            "truncated frame",
            {
                let mut f = 100i32.to_be_bytes().to_vec();
                f.extend([0, 18, 0, 3, 0, 0]);
                f
            },
            true,
        ),
    ];
    for (what, bytes, close_write) in &cases {
        assert!(
            closed_after(&kmirror, bytes, *close_write),
            "{what}: connection left open"
        );
    }
    serve.assert_running();
    // One log line per bad connection. Most are written before the close; the truncated
    // frame's only once kmirror reads the client's end of stream, which may come just after
    // the client saw the connection close, so wait for it (bounded).
    let start = std::time::Instant::now();
    loop {
        let log = serve.log_text();
        let lines = log.matches("Kafka client connection closed").count();
        if lines >= cases.len() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{lines} of {} connection-closed log lines:\n{log}",
            cases.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The endpoint still serves, with the same answer as before.
    let again = harness::consume(&kmirror, &topic, 0, 0, 50, Isolation::ReadUncommitted);
    assert_eq!(again, survivor);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}

// Goal: the listener also runs in control-plane mode (`[admin]`), where partitions appear when
// a mirror is started through the CLI. Method: start a mirror with `kmirror mirrors`, wait
// until the bytes equal the broker's, and compare the Java consumer's records from kmirror
// with the source's.
#[test]
fn control_plane_mode_serves_clients_too() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-ctl-clients");
    k.create_topic(&topic, 1, &[]);
    k.produce(
        &topic,
        0,
        120,
        &ProduceOpts {
            headers: 1,
            ..Default::default()
        },
    );
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let config = work.path().join("kmirror.toml");
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    create_mirror(&admin, work.path(), "m", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    wait_mirrored(
        &mut serve,
        &k.partition_dir(&topic, 0),
        &data_dir.join(format!("{topic}-0")),
    );

    let theirs = k.consume(&topic, 0, 0, 120, Isolation::ReadUncommitted);
    let ours = harness::consume(&kmirror, &topic, 0, 0, 120, Isolation::ReadUncommitted);
    assert_eq!(theirs.len(), 120);
    assert_eq!(ours, theirs);
    // The Java consumer opened a fetch session on kmirror; the admin `/metrics` counts it.
    let metrics = ureq::get(&format!("http://{admin}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let created: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kmirror_endpoint_fetch_sessions_created_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no fetch session counter in:\n{metrics}"));
    assert!(created >= 1.0, "no fetch session created:\n{metrics}");

    // Failover: after `stop` the partition is writable; an idempotent Java producer writes to
    // kmirror and its records continue at the mirrored end.
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", &topic]);
    let opts = ProduceOpts {
        idempotent: true,
        seed: 7,
        ..Default::default()
    };
    let written = harness::produce(&kmirror, &topic, 0, 30, &opts);
    assert_eq!(written.offsets, (120..150).collect::<Vec<i64>>());
    let all = harness::consume(&kmirror, &topic, 0, 0, 150, Isolation::ReadCommitted);
    assert_eq!(all.len(), 150);
    assert_eq!(&all[..120], &theirs[..]);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");

    // After a restart the written records are still there and the partition is still writable.
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    let again = harness::consume(&kmirror, &topic, 0, 0, 150, Isolation::ReadCommitted);
    assert_eq!(again, all, "the failed-over partition survived the restart");
    let more = harness::produce(&kmirror, &topic, 0, 5, &ProduceOpts { seed: 8, ..opts });
    assert_eq!(more.offsets, (150..155).collect::<Vec<i64>>());
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
