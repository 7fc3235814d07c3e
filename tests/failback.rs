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
//! consumer and compared with kmirror's, and the group consumes the rest on A. A second topic,
//! written to by a Java transactional producer after the failover, must be refused with the
//! reason (transactions are not replayed yet) while the first is copied.

mod harness;

use std::time::{Duration, Instant};

use harness::groups::{committed_offset, group_consume};
use harness::mirrors_cli::{cli_ok, ControlPlane};
use harness::python_clients::librdkafka;
use harness::serve::{wait_all_mirrored, Serve};
use harness::{consume_to_end, Codec, Isolation, Kafka, ProduceOpts, TxnEnd};
use serde_json::Value;

/// Failure guard only: how long the test waits for the copy to reach a state.
const COPY_LIMIT: Duration = Duration::from_secs(180);

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
    let mut a = Kafka::start_dedicated();
    a.create_topic(topic, 1, &[]);
    // Written to transactionally after failover: failback refuses it (no replay yet).
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
    } = ControlPlane::start(&a.bootstrap(), true, "sync.group.offsets.enabled=false\n");
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
    harness::produce(
        &kmirror,
        txn_topic,
        0,
        10,
        &ProduceOpts {
            transactions: vec![TxnEnd::Commit],
            transactional_id: Some("fb-txn".into()),
            ..ProduceOpts::default()
        },
    );
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

    // Copy, and kill kmirror -9 while it is under way.
    failback_json(&admin, &["start", "--mirror", "m"]);
    let started = Instant::now();
    loop {
        let d = describe(&admin);
        let p = part(&d);
        let copied = p["copiedRecords"].as_i64().unwrap();
        assert!(p["error"].is_null(), "{d}");
        if copied > 0 {
            assert!(
                p["lag"].as_i64().unwrap() > 0,
                "the copy finished before the test could kill kmirror mid-copy: {d}"
            );
            break;
        }
        assert!(started.elapsed() < COPY_LIMIT, "copy never began: {d}");
        std::thread::sleep(Duration::from_millis(10));
    }
    serve.kill9();
    let mut serve = Serve::start(&config, _work.path().join("serve-2.log"));
    harness::mirrors_cli::wait_admin(&mut serve, &admin);

    // The copy resumes by itself (the failback was COPYING) and catches up.
    let started = Instant::now();
    let done = loop {
        let d = describe(&admin);
        let p = part(&d);
        assert!(p["error"].is_null(), "{d}");
        if p["lag"] == 0 {
            break d;
        }
        assert!(started.elapsed() < COPY_LIMIT, "copy did not catch up: {d}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(part(&done)["copiedRecords"], written, "{done}");
    // The transactional partition is refused with the reason, nothing of it copied.
    let tx = part_of(&done, txn_topic);
    let why = tx["error"].as_str().unwrap_or_else(|| panic!("{tx}"));
    assert!(
        why.contains("offset 10 is transactional") && why.contains("does not replay"),
        "{tx}"
    );
    assert_eq!(tx["copiedRecords"], 0, "{tx}");
    assert_eq!(tx["originalNext"], 10, "{tx}");
    assert_eq!(part(&done)["originalNext"], 70 + written, "{done}");

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
    for (i, (ra, rk)) in on_a[70..].iter().zip(&post).enumerate() {
        assert_eq!(ra.offset, 70 + i as i64, "no gap on A");
        assert_eq!(
            (&ra.key, &ra.value, &ra.headers, ra.timestamp),
            (&rk.key, &rk.value, &rk.headers, rk.timestamp),
            "record {} on A against kmirror offset {}",
            ra.offset,
            rk.offset
        );
    }

    // The group continues on A: exactly the records after its position, once each.
    let rest = (70 + written - g_on_a) as usize;
    let consumed_on_a = group_consume(&a.bootstrap(), topic, "g", rest);
    let offsets: Vec<i64> = consumed_on_a.iter().map(|c| c.offset).collect();
    let expected: Vec<i64> = (g_on_a..70 + written).collect();
    assert_eq!(
        offsets, expected,
        "the group resumes on A with no gap or duplicate"
    );
    drop(serve);
}
