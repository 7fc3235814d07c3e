//! Goal: failback to the original (stock Kafka) cluster after a failover (issue 14 item 1):
//! the original's divergent tail is reported exactly and left in place, what was written on
//! kmirror after the failover is copied back in order with an exact offset map (keys, values,
//! headers, timestamps kept), a consumer group that moved to kmirror continues on the original
//! with no gap and no duplicate, and a kill -9 of kmirror mid-copy loses nothing and doubles
//! nothing.
//!
//! Method: a dedicated KRaft broker A (it is killed and restarted). kmirror mirrors A's topic,
//! is paused, and A then acknowledges records kmirror never fetches (the divergent tail, counted
//! from the producer's acks); A is killed (-9) and the topic failed over. The Java producer
//! writes to kmirror (headers, two codecs, small batches so the copy has many), then
//! librdkafka's idempotent producer; a Java group consumes part of it and commits. A restarts; `failback create` reports the tail; `start`
//! copies; kmirror is killed -9 while the copy is under way and restarted (the copy resumes by
//! itself); `stop` waits for zero lag and moves the group. Then A's log is read with the Java
//! consumer and compared with kmirror's, and the group consumes the rest on A.
//!
//! Transactions: a second topic `fbtx` is written on kmirror after the failover by two Java
//! transactional producers at once (committed and aborted transactions, small batches) and a
//! plain idempotent one, so transactions of several producers interleave in one partition.
//! Failback replays them on A with A's own transaction protocol; the copier is held by a test
//! hook (`KMIRROR_TEST_FAILBACK_HOLD_FILE`) while a replayed transaction is half done, and there
//! kmirror is killed -9, and later A's broker is killed -9 and restarted. A read_committed Java
//! consumer on A must then see exactly kmirror's committed and plain records in order, a
//! read_uncommitted one all of kmirror's records, a group that read part of it on kmirror must
//! continue on A at exactly the next record, and /metrics must show the reverse copy.

mod harness;

use std::time::{Duration, Instant};

use harness::groups::{committed_offset, group_consume};
use harness::mirrors_cli::{cli_ok, ControlPlane};
use harness::python_clients::librdkafka;
use harness::serve::{scrape_metrics, wait_all_mirrored, Serve};
use harness::{consume_to_end, Codec, Isolation, Kafka, ProduceOpts, TxnEnd};
use serde_json::Value;

/// Failure guard only: how long the test waits for the copy to reach a state.
const COPY_LIMIT: Duration = Duration::from_secs(180);

/// The records on A are kmirror's, one for one: key, value, headers, timestamp, in order.
fn same_records(what: &str, on_a: &[harness::ConsumedRecord], on_k: &[harness::ConsumedRecord]) {
    assert_eq!(on_a.len(), on_k.len(), "{what}: record count");
    for (ra, rk) in on_a.iter().zip(on_k) {
        assert_eq!(
            (&ra.key, &ra.value, &ra.headers, ra.timestamp),
            (&rk.key, &rk.value, &rk.headers, rk.timestamp),
            "{what}: record {} on A against kmirror offset {}",
            ra.offset,
            rk.offset
        );
    }
}

const HOLD_VAR: &str = "KMIRROR_TEST_FAILBACK_HOLD_FILE";

/// Waits until the copier says it is held by the hook file `hold`.
fn wait_held(hold: &std::path::Path) {
    let mut held = hold.as_os_str().to_owned();
    held.push(".held");
    let held = std::path::PathBuf::from(held);
    let started = Instant::now();
    while !held.exists() {
        assert!(
            started.elapsed() < COPY_LIMIT,
            "the copier never held at a half-replayed transaction ({})",
            hold.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of sample `key` (name and labels as rendered) in a scrape.
fn metric(scrape: &str, key: &str) -> f64 {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {key} in:\n{scrape}"))
}

fn failback_json(admin: &str, args: &[&str]) -> Value {
    let mut all = vec!["failback"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = cli_ok(admin, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("failback --json: {e}: {out}"))
}

fn describe(admin: &str) -> Value {
    failback_json(admin, &["describe", "--mirror", "m"])
}

/// The copy's row of topic `fb` (the one with data to copy).
fn part(report: &Value) -> &Value {
    part_of(report, "fb")
}

fn part_of<'a>(report: &'a Value, topic: &str) -> &'a Value {
    let parts = report["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), 2, "{report}");
    parts
        .iter()
        .find(|p| p["topic"] == topic)
        .unwrap_or_else(|| panic!("no {topic} in {report}"))
}

#[test]
fn failback_copies_the_delta_maps_offsets_and_moves_the_group() {
    let topic = "fb";
    let holds = tempfile::tempdir().unwrap();
    let (hold1, hold2) = (holds.path().join("hold1"), holds.path().join("hold2"));
    let mut a = Kafka::start_dedicated();
    a.create_topic(topic, 1, &[]);
    // Written to transactionally after failover: failback replays the transactions.
    let txn_topic = "fbtx";
    a.create_topic(txn_topic, 1, &[]);
    a.produce(txn_topic, 0, 10, &ProduceOpts::default());
    let mirrored = a.produce(topic, 0, 50, &ProduceOpts::default());
    assert_eq!(mirrored.last_offset, 49);

    let ControlPlane {
        work: _work,
        data_dir,
        config,
        admin,
        mut serve,
    } = ControlPlane::start_with_env(
        &a.bootstrap(),
        true,
        "sync.group.offsets.enabled=false\n",
        &[(HOLD_VAR, hold1.as_os_str())],
    );
    let topics = "fb,fbtx";
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", topics]);
    let pairs: Vec<_> = [topic, txn_topic]
        .iter()
        .map(|t| (a.partition_dir(t, 0), data_dir.join(format!("{t}-0"))))
        .collect();
    wait_all_mirrored(&mut serve, &pairs);
    cli_ok(&admin, &["pause", "--mirror", "m", "--topics", topics]);

    // The divergent tail: acknowledged by A, never fetched by the paused mirror; then A dies.
    let tail = a.produce(
        topic,
        0,
        20,
        &ProduceOpts {
            seed: 7,
            ..ProduceOpts::default()
        },
    );
    assert_eq!((tail.first_offset, tail.last_offset), (50, 69));
    let tail_on_a = harness::consume(&a.bootstrap(), topic, 0, 50, 20, Isolation::ReadUncommitted);
    assert_eq!(tail_on_a.len(), 20);
    a.kill();
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", topics]);

    // Writes after failover: many small batches, uncompressed and lz4, with headers.
    let kmirror = serve.kafka_listener();
    let small = |seed, codec| ProduceOpts {
        seed,
        codec,
        headers: 2,
        batch_size: 300,
        linger_ms: 0,
        ..ProduceOpts::default()
    };
    let w1 = harness::produce(&kmirror, topic, 0, 600, &small(11, Codec::None));
    let w2 = harness::produce(&kmirror, topic, 0, 600, &small(12, Codec::Lz4));
    assert_eq!(
        w1.first_offset, 50,
        "kmirror continues at the failover point"
    );
    // Two transactional producers and a plain one at once on fbtx: 4 × 50 (2 committed) +
    // 3 × 50 (2 committed) transactional records and 200 plain ones, in small batches.
    let txn = |id: &str, seed, ends: Vec<TxnEnd>| ProduceOpts {
        seed,
        headers: 1,
        batch_size: 300,
        linger_ms: 0,
        transactions: ends,
        transactional_id: Some(id.into()),
        ..ProduceOpts::default()
    };
    let t1 = txn(
        "fb-t1",
        21,
        vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit, TxnEnd::Abort],
    );
    let t2 = txn(
        "fb-t2",
        22,
        vec![TxnEnd::Abort, TxnEnd::Commit, TxnEnd::Commit],
    );
    let plain = ProduceOpts {
        seed: 23,
        idempotent: true,
        batch_size: 300,
        linger_ms: 0,
        ..ProduceOpts::default()
    };
    std::thread::scope(|s| {
        let w = [
            s.spawn(|| harness::produce(&kmirror, txn_topic, 0, 200, &t1)),
            s.spawn(|| harness::produce(&kmirror, txn_topic, 0, 150, &t2)),
            s.spawn(|| harness::produce(&kmirror, txn_topic, 0, 200, &plain)),
        ];
        for h in w {
            h.join().expect("producer thread");
        }
    });
    let after_failover = |v: Vec<harness::ConsumedRecord>| -> Vec<harness::ConsumedRecord> {
        v.into_iter().filter(|r| r.offset >= 10).collect()
    };
    let fbtx_both = |bootstrap: &str| {
        let read = |i| after_failover(consume_to_end(bootstrap, txn_topic, 0, i));
        (
            read(Isolation::ReadCommitted),
            read(Isolation::ReadUncommitted),
        )
    };
    let (tx_committed_k, tx_all_k) = fbtx_both(&kmirror);
    assert_eq!(
        tx_committed_k.len(),
        100 + 100 + 200,
        "kmirror read_committed"
    );
    assert_eq!(tx_all_k.len(), 200 + 150 + 200, "kmirror read_uncommitted");
    // 7 transaction markers besides the records.
    let tx_end_k = 10 + 550 + 7;
    // And librdkafka's idempotent producer (confluent-kafka).
    let rdk = librdkafka(&["produce", &kmirror, topic, "0", "300", "idempotent", "rdk"]).remove(0);
    assert_eq!(rdk["offsets"][0], w2.last_offset + 1, "{rdk}");
    let written: i64 = 600 + 600 + 300;
    let kmirror_end = 50 + written;
    let on_kmirror = consume_to_end(&kmirror, topic, 0, Isolation::ReadUncommitted);
    let post: Vec<_> = on_kmirror
        .iter()
        .filter(|r| r.offset >= 50)
        .cloned()
        .collect();
    assert_eq!(post.len() as i64, written);
    assert_eq!(post.last().unwrap().offset, kmirror_end - 1);

    // A group moves to kmirror: it reads the 50 mirrored records and 300 written after.
    let consumed = group_consume(&kmirror, topic, "g", 350);
    assert_eq!(consumed.len(), 350);
    let g_on_kmirror = consumed.last().unwrap().offset + 1;
    assert_eq!(committed_offset(&kmirror, "g", 0), Some(g_on_kmirror));
    // And one on fbtx (read_uncommitted, the Java default): its 10 mirrored records and 100
    // written after, aborted ones included. Its position may well be a transaction marker.
    let gt = group_consume(&kmirror, txn_topic, "gt", 110);
    assert_eq!(gt.len(), 110);
    let gt_on_kmirror = gt.last().unwrap().offset + 1;

    a.restart();

    // The report first: A's tail, exactly what the test's producer had A acknowledge.
    let created = failback_json(&admin, &["create", "--mirror", "m", "--topics", topics]);
    let tx = part_of(&created, txn_topic);
    assert_eq!(tx["divergentTail"]["offsets"], 0, "{tx}");
    assert_eq!(tx["divergentTail"]["records"], 0, "{tx}");
    let p = part(&created);
    assert_eq!(created["phase"], "CREATED", "{created}");
    let t = &p["divergentTail"];
    assert_eq!(t["from_offset"], 50, "{t}");
    assert_eq!(t["to_offset"], 70, "{t}");
    assert_eq!(t["offsets"], 20, "{t}");
    assert_eq!(t["records"], tail.count as i64, "{t}");
    assert_eq!(t["first_offset"], 50, "{t}");
    assert_eq!(t["last_offset"], 69, "{t}");
    assert_eq!(t["first_timestamp_ms"], tail_on_a[0].timestamp, "{t}");
    assert_eq!(t["last_timestamp_ms"], tail_on_a[19].timestamp, "{t}");
    assert_eq!(t["scan_complete"], true, "{t}");
    assert_eq!(p["failoverPoint"], 50);
    assert_eq!(p["originalCopyBase"], 70);
    assert_eq!(p["lag"], kmirror_end - 50, "{p}");
    // The table names the tail too.
    let table = cli_ok(&admin, &["failback", "describe", "--mirror", "m"]);
    assert!(table.contains("50..70"), "{table}");

    // Mirroring the original again now would fetch the copies back: refused, nothing changed.
    let refused = harness::mirrors_cli::cli(&admin, &["start", "--mirror", "m", "--topics", topic]);
    assert!(
        !refused.ok && refused.stderr.contains("failback"),
        "{}",
        refused.stderr
    );

    // Copy, held by the hook once a replayed transaction is half done; kill kmirror -9 there.
    std::fs::write(&hold1, b"").unwrap();
    failback_json(&admin, &["start", "--mirror", "m"]);
    wait_held(&hold1);
    let d = describe(&admin);
    assert!(part(&d)["error"].is_null(), "{d}");
    assert!(part(&d)["copiedRecords"].as_i64().unwrap() > 0, "{d}");
    assert!(part(&d)["lag"].as_i64().unwrap() > 0, "{d}");
    let tx = part_of(&d, txn_topic);
    assert!(tx["error"].is_null(), "{tx}");
    let open_at_kill: Vec<Value> = tx["openTransactions"].as_array().unwrap().clone();
    assert!(!open_at_kill.is_empty(), "{tx}");
    assert!(tx["lag"].as_i64().unwrap() > 0, "{tx}");
    serve.kill9();

    // kmirror again, held again at the first transactional batch it copies: the transaction
    // half replayed before the kill, continued (not fenced). There A's broker is killed -9
    // and restarted under the copy.
    std::fs::write(&hold2, b"").unwrap();
    let mut serve = Serve::start_with_env(
        &config,
        _work.path().join("serve-2.log"),
        &[(HOLD_VAR, hold2.as_os_str())],
    );
    harness::mirrors_cli::wait_admin(&mut serve, &admin);
    wait_held(&hold2);
    let d = describe(&admin);
    let tx = part_of(&d, txn_topic);
    assert!(tx["error"].is_null(), "{tx}");
    let open_now = tx["openTransactions"].as_array().unwrap();
    assert!(
        open_at_kill.iter().all(|o| open_now.contains(o)),
        "the transactions half replayed at the kill are still open on A (continued, not fenced): {tx}"
    );
    let scrape = scrape_metrics(&admin);
    let l = r#"mirror="m",topic="fbtx",partition="0""#;
    assert!(
        metric(
            &scrape,
            &format!("kmirror_failback_open_transactions{{{l}}}")
        ) >= 1.0
    );
    assert_eq!(
        metric(
            &scrape,
            &format!(r#"kmirror_failback_state{{{l},state="COPYING"}}"#)
        ),
        1.0
    );
    assert!(metric(&scrape, &format!("kmirror_failback_lag_offsets{{{l}}}")) > 0.0);
    a.kill();
    a.restart();
    std::fs::remove_file(&hold2).unwrap();

    // The copy resumes by itself (the failback was COPYING) and catches up.
    let started = Instant::now();
    let done = loop {
        let d = describe(&admin);
        let p = part(&d);
        let tx = part_of(&d, txn_topic);
        assert!(p["error"].is_null(), "{d}");
        assert!(tx["error"].is_null(), "{d}");
        if p["lag"] == 0 && tx["lag"] == 0 && tx["openTransactions"] == serde_json::json!([]) {
            break d;
        }
        assert!(started.elapsed() < COPY_LIMIT, "copy did not catch up: {d}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(part(&done)["copiedRecords"], written, "{done}");
    // Every transactional record replayed (aborted ones too), each marker once: A's log end
    // is kmirror's (no tail on fbtx).
    let tx = part_of(&done, txn_topic);
    assert_eq!(tx["copiedRecords"], 550, "{tx}");
    assert_eq!(tx["kmirrorEnd"], tx_end_k, "{tx}");
    assert_eq!(tx["originalNext"], tx_end_k, "{tx}");
    assert_eq!(part(&done)["originalNext"], 70 + written, "{done}");
    let scrape = scrape_metrics(&admin);
    for (t, records) in [(topic, written), (txn_topic, 550)] {
        let l = format!(r#"mirror="m",topic="{t}",partition="0""#);
        assert_eq!(
            metric(&scrape, &format!("kmirror_failback_lag_offsets{{{l}}}")),
            0.0
        );
        assert_eq!(
            metric(
                &scrape,
                &format!("kmirror_failback_copied_records_total{{{l}}}")
            ),
            records as f64
        );
        assert!(
            metric(
                &scrape,
                &format!("kmirror_failback_copied_bytes_total{{{l}}}")
            ) > 0.0
        );
        assert_eq!(
            metric(
                &scrape,
                &format!("kmirror_failback_open_transactions{{{l}}}")
            ),
            0.0
        );
    }
    let l = r#"mirror="m",topic="fb",partition="0""#;
    assert_eq!(
        metric(
            &scrape,
            &format!("kmirror_failback_divergent_tail_records{{{l}}}")
        ),
        tail.count as f64
    );

    // Cut-over: the group's offset moves to A, translated.
    let stopped = failback_json(&admin, &["stop", "--mirror", "m"]);
    assert_eq!(stopped["phase"], "STOPPED", "{stopped}");
    let groups = stopped["groups"].as_array().unwrap();
    let g = groups
        .iter()
        .find(|g| g["group"] == "g")
        .unwrap_or_else(|| panic!("group g not moved: {stopped}"));
    let g_on_a = 70 + (g_on_kmirror - 50);
    assert_eq!(g["outcome"], "committed", "{g}");
    assert_eq!(g["kmirror_offset"], g_on_kmirror, "{g}");
    assert_eq!(g["original_offset"], g_on_a, "{g}");
    assert_eq!(committed_offset(&a.bootstrap(), "g", 0), Some(g_on_a));

    // A holds: its own 50, its tail (untouched), then kmirror's records in order, exactly once.
    let on_a = consume_to_end(&a.bootstrap(), topic, 0, Isolation::ReadUncommitted);
    assert_eq!(on_a.len() as i64, 50 + 20 + written);
    assert_eq!(
        on_a[..50],
        on_kmirror[..50],
        "the mirrored part is the same log"
    );
    assert_eq!(
        on_a[50..70],
        tail_on_a[..],
        "the divergent tail stays where it was"
    );
    for (i, ra) in on_a[70..].iter().enumerate() {
        assert_eq!(ra.offset, 70 + i as i64, "no gap on A");
    }
    same_records("fb", &on_a[70..], &post);

    // fbtx on A: its 10 mirrored records, then read_committed exactly kmirror's committed and
    // plain records, read_uncommitted all of kmirror's, in kmirror's order.
    let (tx_committed_a, tx_all_a) = fbtx_both(&a.bootstrap());
    same_records("fbtx read_committed", &tx_committed_a, &tx_committed_k);
    same_records("fbtx read_uncommitted", &tx_all_a, &tx_all_k);

    // The group continues on A: exactly the records after its position, once each.
    let rest = (70 + written - g_on_a) as usize;
    let consumed_on_a = group_consume(&a.bootstrap(), topic, "g", rest);
    let offsets: Vec<i64> = consumed_on_a.iter().map(|c| c.offset).collect();
    let expected: Vec<i64> = (g_on_a..70 + written).collect();
    assert_eq!(
        offsets, expected,
        "the group resumes on A with no gap or duplicate"
    );
    // The fbtx group continues on A with exactly the records after its kmirror position (its
    // offset translated past markers on both sides): compared by key, once each.
    let gt_moved = groups
        .iter()
        .find(|g| g["group"] == "gt")
        .unwrap_or_else(|| panic!("group gt not moved: {stopped}"));
    assert_eq!(gt_moved["outcome"], "committed", "{gt_moved}");
    assert_eq!(gt_moved["kmirror_offset"], gt_on_kmirror, "{gt_moved}");
    let want: Vec<_> = tx_all_k
        .iter()
        .filter(|r| r.offset >= gt_on_kmirror)
        .map(|r| r.key.clone())
        .collect();
    let gt_on_a = group_consume(&a.bootstrap(), txn_topic, "gt", want.len());
    let got: Vec<_> = gt_on_a
        .iter()
        .map(|c| {
            tx_all_a
                .iter()
                .find(|r| r.offset == c.offset)
                .unwrap_or_else(|| panic!("gt read offset {} on A, not a data record", c.offset))
                .key
                .clone()
        })
        .collect();
    assert_eq!(
        got, want,
        "the fbtx group resumes on A with no gap or duplicate"
    );
    drop(serve);
}
