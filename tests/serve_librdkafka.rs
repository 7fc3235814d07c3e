//! Goal: librdkafka (confluent-kafka 2.16.1, the client behind Python, Go, .NET and Node users)
//! works against kmirror as against the source broker. Method: the shared Kafka 4.1.1 broker is
//! the source (the Java producer writes plain, gzip, lz4-idempotent batches with headers and a
//! committed and an aborted transaction); one `kmirror serve` with `[admin]` and `[kafka]`
//! mirrors two topics; then `tests/python/librdkafka_client.py` reads the source and kmirror and
//! every answer is compared: records read_uncommitted and read_committed, list_topics,
//! describe_configs, list_offsets (earliest, latest, by timestamp); a consumer group subscribed
//! by regex gets both mirrored topics, commits, and a second member resumes exactly there
//! (list/describe_consumer_groups while it is a member); after `mirrors stop` an idempotent
//! and a transactional librdkafka producer (commit and abort) write to kmirror and a
//! read_committed librdkafka consumer sees exactly the committed records. No request may have
//! been misread (`kmirror_endpoint_request_errors_total{error="decode"}`).

mod harness;

use std::collections::BTreeSet;

use harness::mirrors_cli::{cli_ok, describe_rows, serve_mirroring};
use harness::python_clients::{librdkafka, records};
use harness::serve::{endpoint_requests, scrape_metrics};
use harness::{Codec, ConsumedRecord, Kafka, ProduceOpts, TxnEnd};

const ISOLATIONS: [&str; 2] = ["read_uncommitted", "read_committed"];

fn consume(bootstrap: &str, topic: &str, partition: i32, isolation: &str) -> Vec<ConsumedRecord> {
    records(&librdkafka(&[
        "consume",
        bootstrap,
        topic,
        &partition.to_string(),
        isolation,
    ]))
}

/// Writes the source data: `a` partition 0 plain then gzip batches with headers, partition 1
/// a committed, an aborted and a committed transaction then idempotent lz4; `b` plain.
fn produce_source(k: &Kafka, a: &str, b: &str) {
    k.produce(
        a,
        0,
        200,
        &ProduceOpts {
            headers: 2,
            seed: 1,
            ..Default::default()
        },
    );
    k.produce(
        a,
        0,
        200,
        &ProduceOpts {
            codec: Codec::Gzip,
            headers: 1,
            seed: 2,
            ..Default::default()
        },
    );
    k.produce(
        a,
        1,
        300,
        &ProduceOpts {
            transactions: vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit],
            headers: 1,
            seed: 3,
            ..Default::default()
        },
    );
    k.produce(
        a,
        1,
        100,
        &ProduceOpts {
            codec: Codec::Lz4,
            idempotent: true,
            seed: 4,
            ..Default::default()
        },
    );
    k.produce(
        b,
        0,
        150,
        &ProduceOpts {
            seed: 5,
            ..Default::default()
        },
    );
}

#[test]
fn librdkafka_reads_administers_and_writes_kmirror_as_it_does_the_source() {
    let k = harness::shared();
    let prefix = harness::unique_topic("rdk");
    let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));
    k.create_topic(&a, 2, &[("retention.ms", "86400000")]);
    k.create_topic(&b, 1, &[]);
    produce_source(k, &a, &b);
    let partitions = [(a.as_str(), 0), (a.as_str(), 1), (b.as_str(), 0)];

    let work = tempfile::tempdir().unwrap();
    let (serve, admin, kmirror) = serve_mirroring(work.path(), k, &[(&a, 2), (&b, 1)]);
    let source = k.bootstrap();

    // Records, both isolation levels, equal the source's record by record.
    let mut committed_total = 0;
    let mut committed = Vec::new();
    for (t, p) in partitions {
        let mut counts = Vec::new();
        for iso in ISOLATIONS {
            let theirs = consume(&source, t, p, iso);
            assert!(!theirs.is_empty(), "the source gave nothing for {t}-{p}");
            let ours = consume(&kmirror, t, p, iso);
            assert_eq!(ours, theirs, "{t}-{p} {iso}: librdkafka records differ");
            counts.push(ours.len());
            if iso == "read_committed" {
                committed_total += ours.len();
                committed.extend(ours.iter().map(|r| (t.to_string(), p, r.offset)));
            }
        }
        let aborted = if (t, p) == (a.as_str(), 1) { 100 } else { 0 };
        assert_eq!(
            counts[0] - counts[1],
            aborted,
            "{t}-{p}: records only read_uncommitted (the aborted transaction)"
        );
    }

    // Admin: list_topics (the all-topics Metadata request), describe_configs, list_offsets.
    let md = |bootstrap: &str| librdkafka(&["metadata", bootstrap]).remove(0);
    let (ours, theirs) = (md(&kmirror), md(&source));
    assert_eq!(ours["brokers"], 1, "{ours}");
    let listed: BTreeSet<&String> = ours["topics"].as_object().unwrap().keys().collect();
    assert_eq!(
        listed,
        BTreeSet::from([&a, &b]),
        "kmirror lists what it mirrors"
    );
    for t in [&a, &b] {
        assert_eq!(ours["topics"][t], theirs["topics"][t], "{t}: partitions");
    }
    let cfg = |bootstrap: &str| librdkafka(&["configs", bootstrap, &a]).remove(0);
    let (ours, theirs) = (cfg(&kmirror), cfg(&source));
    assert_eq!(ours["retention.ms"], "86400000", "{ours}");
    for key in [
        "retention.ms",
        "retention.bytes",
        "segment.bytes",
        "cleanup.policy",
    ] {
        assert_eq!(ours[key], theirs[key], "describe_configs {key}");
    }
    for (t, p) in partitions {
        let recs = consume(&source, t, p, "read_uncommitted");
        let stamps = [
            0,
            recs[0].timestamp + 1,
            recs[recs.len() / 2].timestamp,
            recs[recs.len() - 1].timestamp + 60_000,
        ]
        .map(|s| s.to_string())
        .join(",");
        let offsets = |bootstrap: &str| {
            librdkafka(&["offsets", bootstrap, t, &p.to_string(), &stamps]).remove(0)
        };
        let ours = offsets(&kmirror);
        assert_eq!(ours, offsets(&source), "{t}-{p}: list_offsets");
        assert!(ours["latest"].as_i64().unwrap() > 0, "{ours}");
    }

    // A group subscribed by regex gets both mirrored topics, commits, and resumes there.
    let group = format!("{prefix}-g");
    let pattern = format!("^{prefix}-.*");
    let first_max = committed_total / 2;
    let mut run = librdkafka(&["group", &kmirror, &pattern, &group, &first_max.to_string()]);
    let summary = run.pop().unwrap();
    // `partitions` is in (topic, partition) order, as the helper sorts.
    let all_partitions: Vec<serde_json::Value> = partitions
        .iter()
        .map(|(t, p)| serde_json::json!([t, p]))
        .collect();
    assert_eq!(
        summary["assignment"].as_array().unwrap(),
        &all_partitions,
        "the regex subscription got every mirrored partition: {summary}"
    );
    assert!(
        summary["listed"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(group)),
        "list_consumer_groups: {summary}"
    );
    let d = &summary["described"];
    assert_eq!(d["state"], "STABLE", "{summary}");
    assert_eq!(d["simple"], false, "a subscribing group: {summary}");
    assert_eq!(
        d["assignor"], "range",
        "librdkafka's first strategy: {summary}"
    );
    assert_eq!(
        d["coordinator"], 0,
        "kmirror coordinates its groups: {summary}"
    );
    assert_eq!(
        d["members"],
        serde_json::json!([all_partitions]),
        "one member with every partition: {summary}"
    );
    let mut second = librdkafka(&[
        "group",
        &kmirror,
        &pattern,
        &group,
        &(committed_total - first_max).to_string(),
    ]);
    second.pop();
    let key = |l: &serde_json::Value| {
        (
            l["topic"].as_str().unwrap().to_string(),
            l["partition"].as_i64().unwrap() as i32,
            l["offset"].as_i64().unwrap(),
        )
    };
    let first_seen: BTreeSet<_> = run.iter().map(key).collect();
    let second_seen: BTreeSet<_> = second.iter().map(key).collect();
    assert_eq!(first_seen.len(), first_max, "no record twice in one run");
    assert!(
        first_seen.is_disjoint(&second_seen),
        "the second member resumed at the commit, re-reading nothing"
    );
    let together: BTreeSet<_> = first_seen.union(&second_seen).cloned().collect();
    assert_eq!(
        together,
        committed.iter().cloned().collect::<BTreeSet<_>>(),
        "both members together read every committed record"
    );

    // While mirrored, a write is refused with a non-retriable error.
    let refused = librdkafka(&["produce-refused", &kmirror, &a, "0"]).remove(0);
    assert_eq!(refused["error"], "TOPIC_EXCEPTION", "{refused}");
    assert_eq!(refused["retriable"], false, "{refused}");

    // Failover, then librdkafka producers write to kmirror.
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", &a]);
    let row = describe_rows(&admin, "m")
        .into_iter()
        .find(|r| r["topic"] == a.as_str() && r["partition"] == 0)
        .unwrap();
    assert_eq!(row["state"], "STOPPED", "{row}");
    let before = consume(&kmirror, &a, 0, "read_committed");
    let end = k.offsets(&a, 0).log_end_offset;
    let idem = librdkafka(&["produce", &kmirror, &a, "0", "50", "idempotent", "s1"]).remove(0);
    assert_eq!(
        idem["offsets"],
        serde_json::json!((end..end + 50).collect::<Vec<i64>>()),
        "idempotent records right after the mirrored ones: {idem}"
    );
    let txns = librdkafka(&[
        "produce",
        &kmirror,
        &a,
        "0",
        "40",
        "commit,abort,commit",
        "s2",
    ]);
    assert_eq!(txns.len(), 3, "{txns:?}");
    let mut want: Vec<String> = Vec::new();
    for line in std::iter::once(&idem).chain(txns.iter()) {
        if line["outcome"] != "abort" {
            let values = line["values"].as_array().unwrap();
            want.extend(values.iter().map(|v| v.as_str().unwrap().to_string()));
        }
    }
    let after = consume(&kmirror, &a, 0, "read_committed");
    assert_eq!(&after[..before.len()], &before[..], "the mirrored records");
    let written: Vec<String> = after[before.len()..]
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    assert_eq!(
        written, want,
        "read_committed sees the idempotent and the committed records, none aborted"
    );
    let everything = consume(&kmirror, &a, 0, "read_uncommitted");
    assert_eq!(
        everything.len(),
        before.len() + 50 + 3 * 40,
        "read_uncommitted also sees the aborted transaction"
    );

    // No request of all this was misread.
    let requests = endpoint_requests(&scrape_metrics(&admin));
    let misread: Vec<_> = requests
        .iter()
        .filter(|(_, r)| !r.errors.is_empty())
        .collect();
    assert!(misread.is_empty(), "requests refused: {misread:?}");
    assert!(
        requests.get(&(3, 12)).is_some_and(|r| r.served > 0),
        "librdkafka's Metadata v12 was served: {requests:?}"
    );
    drop(serve);
}
