//! Goal: both kinds of failover work through the CLI against real brokers.
//! - Unplanned: with the source broker already dead (kill -9), `kmirror mirrors stop` still fails
//!   the topic over, the transaction the source left open is aborted on kmirror, and producers
//!   and read_committed consumers use kmirror. Method: a dedicated KRaft broker with a committed
//!   and an open transaction, `kmirror serve` with `[admin]` and `[kafka]`, the broker killed,
//!   then the CLI, the Java clients against kmirror, and a restart of kmirror.
//! - Planned: `stop --promote` refuses (changing nothing) while kmirror is behind the source, and
//!   stops once it holds everything, with the source's end recorded.

mod harness;
mod mirror_support;

use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpBatch, DumpFlags};
use harness::groups::{describe_group, txn_transform, HeldTransform};
use harness::mirrors_cli::{
    cli, cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{Isolation, Kafka, ProduceOpts, TxnEnd};

/// `kmirror serve` with `[admin]` and a `[kafka]` listener on an OS-chosen port.
fn serve_with_listener(work: &std::path::Path, admin: &str) -> (Serve, std::path::PathBuf) {
    let data_dir = work.join("data");
    let config = work.join("kmirror.toml");
    write_serving_config(&config, admin, Some("127.0.0.1:0"), &data_dir, "");
    let mut serve = Serve::start(&config, work.join("serve.log"));
    wait_admin(&mut serve, admin);
    (serve, config)
}

/// Failure guard for `stop` against a dead source, not a performance claim: the source calls a
/// stop makes (the last group-offset sync) are bounded and skipped when nobody answers.
const STOP_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn failover_completes_with_the_source_broker_dead() {
    let mut k = Kafka::start_dedicated();
    let topic = "dr";
    k.create_topic(topic, 1, &[]);
    k.produce(
        topic,
        0,
        60,
        &ProduceOpts {
            transactions: vec![TxnEnd::Commit, TxnEnd::Open],
            // The source must not end it on its own while the test runs.
            transaction_timeout_ms: Some(600_000),
            ..ProduceOpts::default()
        },
    );
    let source_end = k.offsets(topic, 0).log_end_offset;
    let committed = k.consume(topic, 0, 0, 30, Isolation::ReadCommitted);
    assert_eq!(committed.len(), 30, "the committed transaction");

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let (mut serve, config) = serve_with_listener(work.path(), &admin);
    let kmirror = serve.kafka_listener();
    create_mirror(&admin, work.path(), "m", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", topic]);
    let dir = data_dir.join(format!("{topic}-0"));
    wait_all_mirrored(&mut serve, &[(k.partition_dir(topic, 0), dir.clone())]);
    // While mirroring, read_committed on kmirror stops at the open transaction.
    let before = harness::consume_to_end(&kmirror, topic, 0, Isolation::ReadCommitted);
    assert_eq!(
        before, committed,
        "read_committed on kmirror before failover"
    );

    // The disaster.
    k.kill();

    let start = Instant::now();
    let stop = cli(&admin, &["stop", "--mirror", "m", "--topics", topic]);
    assert!(
        stop.ok,
        "stop with a dead source: {}\n{}",
        stop.stderr,
        serve.log_text()
    );
    assert!(start.elapsed() < STOP_LIMIT, "stop hung on the dead source");
    assert!(
        stop.stdout.contains("Last group-offset sync: skipped"),
        "stop says the consumers resume from the last periodic sync: {}",
        stop.stdout
    );
    let row = describe_rows(&admin, "m").remove(0);
    assert_eq!(row["state"], "STOPPED", "{row}");
    assert_eq!(row["lastEndOffset"], source_end, "{row}");
    assert_eq!(
        row["destinationOffset"],
        source_end + 1,
        "describe shows the failed-over log's end (the ABORT marker is the +1): {row}"
    );
    // STOPPED only once the promotion is durable: the recovery-point checkpoint (written once
    // for a whole stop) already holds the promoted log's end.
    let recovery = kmirror::log::checkpoint::OffsetCheckpointFile::read(
        &data_dir.join(kmirror::log::checkpoint::OffsetCheckpointFile::RECOVERY_POINT),
    )
    .unwrap();
    assert_eq!(
        recovery.get(&kmirror::ids::TopicPartition::new(topic, 0)),
        Some(&kmirror::ids::Offset(source_end + 1)),
        "{recovery:?}"
    );

    // The open transaction is aborted: read_committed sees exactly the committed records, and
    // an idempotent producer continues right after the ABORT marker.
    let ours = harness::consume(&kmirror, topic, 0, 0, 30, Isolation::ReadCommitted);
    assert_eq!(ours, committed, "read_committed on kmirror after failover");
    let written = harness::produce(
        &kmirror,
        topic,
        0,
        20,
        &ProduceOpts {
            idempotent: true,
            seed: 5,
            ..ProduceOpts::default()
        },
    );
    let first = source_end + 1;
    assert_eq!(written.offsets, (first..first + 20).collect::<Vec<i64>>());
    let after = harness::consume(&kmirror, topic, 0, 0, 50, Isolation::ReadCommitted);
    assert_eq!(after.len(), 50);
    assert_eq!(&after[..30], &committed[..]);
    assert!(
        after[30..].iter().all(|r| r.offset >= first),
        "no record of the aborted transaction is returned"
    );
    // A crash right after the acknowledged writes.
    serve.kill9();

    // A restart with the source still dead: the partition stays STOPPED and writable.
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    let row = describe_rows(&admin, "m").remove(0);
    assert_eq!(row["state"], "STOPPED", "{row}");
    let again = harness::consume(&kmirror, topic, 0, 0, 50, Isolation::ReadCommitted);
    assert_eq!(again, after, "the failed-over data survived the restart");
    let more = harness::produce(
        &kmirror,
        topic,
        0,
        5,
        &ProduceOpts {
            idempotent: true,
            seed: 6,
            ..ProduceOpts::default()
        },
    );
    assert_eq!(more.offsets, (first + 20..first + 25).collect::<Vec<i64>>());
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    mirror_support::verify(&dir);
    assert_written_as_the_new_leader(&dir, source_end);
}

/// Kafka's DumpLogSegments on the failed-over partition: the mirrored batches, then the ABORT
/// marker at `source_end` in a leader epoch above every mirrored one, then the batches written
/// after failover, all in that epoch and by producer ids no mirrored batch carries.
fn assert_written_as_the_new_leader(dir: &std::path::Path, source_end: i64) {
    let logs: Vec<_> = segment_files(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    let dump = dump_log_segments(&logs, DumpFlags::DEEP);
    dump.assert_clean();
    let epoch = |b: &DumpBatch| -> i32 { b.fields["partitionLeaderEpoch"].parse().unwrap() };
    let mirrored: Vec<&DumpBatch> = dump
        .batches
        .iter()
        .filter(|b| b.base_offset < source_end)
        .collect();
    let marker = dump
        .batches
        .iter()
        .find(|b| b.base_offset == source_end)
        .expect("a batch at the source's end");
    let written: Vec<&DumpBatch> = dump
        .batches
        .iter()
        .filter(|b| b.base_offset > source_end)
        .collect();
    assert!(marker.is_control, "{marker:?}");
    let source_max = mirrored.iter().map(|b| epoch(b)).max().unwrap();
    assert!(epoch(marker) > source_max, "{marker:?}");
    assert_eq!(
        written.last().map(|b| b.last_offset),
        Some(source_end + 25),
        "the 25 records produced after failover"
    );
    let mirrored_ids: std::collections::BTreeSet<i64> =
        mirrored.iter().map(|b| b.producer_id).collect();
    for b in written {
        assert_eq!(
            epoch(b),
            epoch(marker),
            "written in the raised epoch: {b:?}"
        );
        assert!(
            b.producer_id >= 0 && !mirrored_ids.contains(&b.producer_id),
            "producer id {} collides with a mirrored one {mirrored_ids:?}",
            b.producer_id
        );
    }
}

#[test]
fn promote_waits_for_zero_lag_then_stops() {
    let k = harness::shared();
    let topic = harness::unique_topic("promote");
    k.create_topic(&topic, 2, &[]);
    for p in 0..2 {
        k.produce(&topic, p, 150, &ProduceOpts::default());
    }
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let (mut serve, _) = serve_with_listener(work.path(), &admin);
    create_mirror(&admin, work.path(), "p", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "p", "--topics", &topic]);
    let pairs = k.mirror_pairs(&topic, 2, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);

    // Behind the source (paused while the source grows): promote gives up and changes nothing.
    cli_ok(&admin, &["pause", "--mirror", "p", "--topics", &topic]);
    k.produce(&topic, 1, 40, &ProduceOpts::default());
    let refused = cli(
        &admin,
        &[
            "stop",
            "--mirror",
            "p",
            "--topics",
            &topic,
            "--promote",
            "--promote-timeout-ms",
            "2000",
        ],
    );
    assert!(!refused.ok, "promoted while behind: {}", refused.stdout);
    assert!(
        refused.stderr.contains("not caught up")
            && refused
                .stderr
                .contains(&format!("{topic}-1 holds 150 of 190")),
        "the refusal names the lagging partition: {}",
        refused.stderr
    );
    for row in describe_rows(&admin, "p") {
        assert_eq!(row["state"], "PAUSED", "a refused promote changed {row}");
    }

    // Caught up again: promote stops every partition at the source's end.
    cli_ok(&admin, &["resume", "--mirror", "p", "--topics", &topic]);
    let out = cli_ok(
        &admin,
        &["stop", "--mirror", "p", "--topics", &topic, "--promote"],
    );
    assert!(out.contains("Promoted"), "{out}");
    let mut rows = describe_rows(&admin, "p");
    rows.sort_by_key(|r| r["partition"].as_i64());
    for (p, row) in rows.iter().enumerate() {
        assert_eq!(row["state"], "STOPPED", "{row}");
        assert_eq!(
            row["lastEndOffset"],
            k.offsets(&topic, p as i32).log_end_offset,
            "{row}"
        );
    }
    for (theirs, ours) in &pairs {
        let seg = |d: &std::path::Path| std::fs::read(d.join("00000000000000000000.log")).unwrap();
        assert!(seg(theirs) == seg(ours), "{} differs", ours.display());
    }
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}

/// Goal: transactional producers work on kmirror after failover (kmirror is their transaction
/// coordinator): commits are visible to read_committed consumers, aborts are not, a
/// transaction left open is aborted at its timeout (the last stable offset moves on), and after
/// a restart the same transactional id fences and continues. Method: the Java transactional
/// producer and consumer against kmirror's listener, DumpLogSegments-style checks by
/// `kmirror log verify`.
#[test]
fn transactional_producers_work_after_failover() {
    let k = harness::shared();
    let topic = harness::unique_topic("txn-after");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 50, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let (mut serve, config) = serve_with_listener(work.path(), &admin);
    let kmirror = serve.kafka_listener();
    create_mirror(&admin, work.path(), "t", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "t", "--topics", &topic]);
    let dir = data_dir.join(format!("{topic}-0"));
    wait_all_mirrored(&mut serve, &[(k.partition_dir(&topic, 0), dir.clone())]);
    cli_ok(&admin, &["stop", "--mirror", "t", "--topics", &topic]);
    let mirrored = harness::consume(&kmirror, &topic, 0, 0, 50, Isolation::ReadCommitted);
    assert_eq!(mirrored.len(), 50);

    let txn = |txns: Vec<TxnEnd>, n: usize, seed: u64, timeout_ms: Option<u32>| {
        harness::produce(
            &kmirror,
            &topic,
            0,
            n,
            &ProduceOpts {
                transactions: txns,
                transactional_id: Some("app-1".into()),
                transaction_timeout_ms: timeout_ms,
                seed,
                ..ProduceOpts::default()
            },
        )
    };
    // Offsets 50..=59 committed, marker at 60, 61..=70 aborted, marker at 71.
    let both = txn(vec![TxnEnd::Commit, TxnEnd::Abort], 20, 11, None);
    assert_eq!(both.offsets[..10], (50..60).collect::<Vec<i64>>()[..]);
    assert_eq!(both.offsets[10..], (61..71).collect::<Vec<i64>>()[..]);
    let committed = harness::consume(&kmirror, &topic, 0, 0, 60, Isolation::ReadCommitted);
    assert_eq!(&committed[..50], &mirrored[..]);
    assert_eq!(
        committed[50..].iter().map(|r| r.offset).collect::<Vec<_>>(),
        (50..60).collect::<Vec<i64>>()
    );

    // Left open by a producer that halts: the coordinator aborts it at its 3 s timeout, so
    // the last stable offset moves past it and read_committed sees what comes after.
    let open = txn(vec![TxnEnd::Open], 5, 12, Some(3_000));
    assert_eq!(open.first_offset, 72);
    let after = harness::produce(
        &kmirror,
        &topic,
        0,
        3,
        &ProduceOpts {
            idempotent: true,
            seed: 13,
            ..ProduceOpts::default()
        },
    );
    // The timer's ABORT marker lands before or after these, depending on timing.
    assert!(after.first_offset > open.last_offset, "{after:?}");
    // The consumer's own 30 s wait covers the timeout: 63 records once the open one is aborted.
    let visible = harness::consume(&kmirror, &topic, 0, 0, 63, Isolation::ReadCommitted);
    assert_eq!(
        visible[60..].iter().map(|r| r.offset).collect::<Vec<_>>(),
        after.offsets,
        "the records written after the transaction that timed out"
    );
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");

    // After a restart the coordinator remembers the id: a new producer with it commits.
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    let again = harness::produce(
        &kmirror,
        &topic,
        0,
        4,
        &ProduceOpts {
            transactions: vec![TxnEnd::Commit],
            transactional_id: Some("app-1".into()),
            seed: 14,
            ..ProduceOpts::default()
        },
    );
    let all = harness::consume(&kmirror, &topic, 0, 0, 67, Isolation::ReadCommitted);
    assert_eq!(
        all[63..].iter().map(|r| r.offset).collect::<Vec<_>>(),
        again.offsets
    );
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    mirror_support::verify(&dir);
}

/// Goal: consume-transform-produce applications work on kmirror after failover: the offsets a
/// transaction sends with `sendOffsetsToTransaction` become the group's committed offsets when
/// it commits, an aborted one leaves them unchanged, and both committed and pending (sent, not
/// yet committed) offsets survive `kill -9` of kmirror. Method: two mirrored topics failed over
/// with `kmirror mirrors stop`, the Java consumer (group member, read_committed) and
/// transactional producer against kmirror's listener (commit, commit, abort), Kafka's
/// `kafka-consumer-groups --describe` before and after a kill -9 and restart; then the group
/// resumes there, holds a transaction open after sendOffsetsToTransaction while kmirror is
/// killed -9 and restarted on the same port, and commits it afterwards.
#[test]
fn consume_transform_produce_commits_offsets_with_the_transaction() {
    let k = harness::shared();
    let input = harness::unique_topic("ctp-in");
    let output = harness::unique_topic("ctp-out");
    k.create_topic(&input, 1, &[]);
    k.create_topic(&output, 1, &[]);
    k.produce(&input, 0, 30, &ProduceOpts::default());
    k.produce(&output, 0, 2, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    // A fixed listener port: the held transaction's client reconnects to the restarted kmirror.
    let config = work.path().join("kmirror.toml");
    let kafka_listen = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some(&kafka_listen), &data_dir, "");
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    let topics = format!("^({input}|{output})$");
    create_mirror(&admin, work.path(), "ctp", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "ctp", "--topics", &topics]);
    wait_all_mirrored(
        &mut serve,
        &[
            (
                k.partition_dir(&input, 0),
                data_dir.join(format!("{input}-0")),
            ),
            (
                k.partition_dir(&output, 0),
                data_dir.join(format!("{output}-0")),
            ),
        ],
    );
    cli_ok(&admin, &["stop", "--mirror", "ctp", "--topics", &topics]);
    let inputs = harness::consume(&kmirror, &input, 0, 0, 30, Isolation::ReadCommitted);
    assert_eq!(inputs.len(), 30);

    let group = "ctp-app";
    let rounds = txn_transform(
        &kmirror,
        &input,
        group,
        &output,
        &["commit", "commit", "abort"],
        10,
    );
    assert_eq!(
        rounds
            .iter()
            .map(|r| (r.txn.as_str(), r.partition, r.next))
            .collect::<Vec<_>>(),
        [("commit", 0, 10), ("commit", 0, 20), ("abort", 0, 30)]
    );
    let committed_at = |bootstrap: &str| -> Option<i64> {
        let rows = describe_group(bootstrap, group);
        let row = rows
            .iter()
            .find(|r| r.topic == input && r.partition == 0)
            .unwrap_or_else(|| panic!("no row for {input}-0: {rows:?}"));
        row.current_offset
    };
    assert_eq!(
        committed_at(&kmirror),
        Some(20),
        "the committed transactions' offsets, not the aborted one's"
    );
    // The output holds the two committed transactions' records after the mirrored ones, each
    // the reversed value of the input record at the same position.
    let out = harness::consume(&kmirror, &output, 0, 0, 22, Isolation::ReadCommitted);
    let produced: Vec<i64> = rounds[..2]
        .iter()
        .flat_map(|r| r.produced.clone())
        .collect();
    assert_eq!(
        out[2..].iter().map(|r| r.offset).collect::<Vec<_>>(),
        produced
    );
    for (o, i) in out[2..].iter().zip(&inputs) {
        let mut reversed = i.value.clone().unwrap();
        reversed.reverse();
        assert_eq!(o.value.as_ref(), Some(&reversed));
    }

    // kill -9 and restart: the group's offsets are still the committed transactions'.
    serve.kill9();
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    assert_eq!(committed_at(&kmirror), Some(20));

    // The application resumes at 20: one transaction commits 20..24, the next sends offset 30
    // and is held open; its offset is pending, not committed.
    let resume_file = work.path().join("resume");
    let held = HeldTransform::start(
        &kmirror,
        &input,
        group,
        &output,
        &["commit", "hold"],
        5,
        &resume_file,
    );
    assert_eq!(
        committed_at(&kmirror),
        Some(25),
        "a pending offset is not shown"
    );
    // kill -9 with the offset pending; after the restart the client commits the transaction
    // and the pending offset, read back from __consumer_offsets-0, becomes the group's.
    serve.kill9();
    let mut serve = Serve::start(&config, work.path().join("serve3.log"));
    wait_admin(&mut serve, &admin);
    let rounds = held.resume();
    assert_eq!(
        rounds
            .iter()
            .map(|r| (r.txn.as_str(), r.next))
            .collect::<Vec<_>>(),
        [("commit", 25), ("hold", 30)]
    );
    assert_eq!(committed_at(&kmirror), Some(30));
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
