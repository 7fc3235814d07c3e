//! Goal: every API version a stock client sends to kmirror is one kmirror advertises and
//! understands, and the table below (what kmirror advertises, what each client sends) is true.
//! Method: one `kmirror serve` (`[admin]` + `[kafka]`) mirrors two topics of the shared Kafka
//! 4.1.1 broker (plain records, a committed and an aborted transaction). Each client runs its
//! workload against kmirror, one client at a time: reading (assign and consume both isolation
//! levels, metadata, configs, offsets, a consumer group that commits, group listing and
//! describing) while mirrored, then, after `mirrors stop`, writing (idempotent and
//! transactional produce, consume-transform-produce for the Java client). `/metrics` is scraped
//! around each run: `kmirror_endpoint_requests_total{api_key,version}` gives the (API, version)
//! pairs that client sent and `kmirror_endpoint_request_errors_total` any it sent that kmirror
//! refused. The test asserts that no request was refused, that each client sent only versions
//! the table lists for it and used every API listed for it, and that the table's kmirror
//! ranges are exactly what kmirror's ApiVersions response advertises.
//!
//! Clients: librdkafka 2.16.0 (confluent-kafka 2.16.1), the Java clients 4.1.1 (KafkaTool and
//! `kafka-consumer-groups.sh`), kafka-python 3.0.12. Other Java clients are not run here; a Java
//! client sends, per API, the highest version both it and the broker support
//! (`NetworkClient`/`ApiVersions.latestUsableVersion`), so from the `ApiKeys` ranges in their jars
//! (2.1.1, 2.8.2, 3.9.1, 4.4.0: every served API's client maximum is at or above kmirror's
//! minimum) they send min(client max, kmirror max), as the table below lists.
//!
//! Java clients not run here, from the `ApiKeys` ranges in their jars (`min(client max, kmirror
//! max)`; a Java client sends no version below kmirror's minimum for any served API):
//!
//! | API | kmirror | Java 2.1.1 | 2.8.2 | 3.9.1 | 4.4.0 |
//! |---|---|---|---|---|---|
//! | Produce | 3–12 | 7 | 9 | 11 | 12 (4.1.1's transactional producer sent 11) |
//! | Fetch | 4–17 | 10 | 12 | 17 | 17 |
//! | ListOffsets | 1–10 | 4 | 6 | 9 | 10 |
//! | Metadata | 0–12 | 7 | 11 | 12 | 12 |
//! | OffsetCommit / OffsetFetch | 2–9 / 1–9 | 6 / 5 | 8 / 7 | 9 / 9 | 9 / 9 |
//! | FindCoordinator | 0–6 | 2 | 3 | 6 | 6 |
//! | JoinGroup / SyncGroup / Heartbeat / LeaveGroup | 0–9 / 0–5 / 0–4 / 0–5 | 3 / 2 / 2 / 2 | 7 / 5 / 4 / 4 | 9 / 5 / 4 / 5 | 9 / 5 / 4 / 5 |
//! | DescribeGroups / ListGroups | 0–6 / 0–5 | 2 / 2 | 5 / 4 | 5 / 5 | 6 / 5 |
//! | ApiVersions | 0–4 | 2 | 3 | 4 | 5, answered UNSUPPORTED_VERSION in the v0 layout, then 4 (seen by hand) |
//! | InitProducerId / AddPartitionsToTxn / AddOffsetsToTxn / EndTxn / TxnOffsetCommit | 0–4 / 0–3 / 0–4 / 0–4 / 0–4 | 1 / 1 / 1 / 1 / 2 | 4 / 3 / 3 / 3 / 3 | 4 / 3 / 4 / 4 / 4 | 4 / 3 / 4 / 4 / 4 |
//! | OffsetForLeaderEpoch | 2–4 | 2 | 4 | 4 | 4 |
//! | DescribeConfigs | 1–4 | 2 | 4 | 4 | 4 |

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;

use bytes::{Buf, BytesMut};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse, RequestHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use harness::groups::{describe_group, group_consume, txn_transform};
use harness::mirrors_cli::{cli_ok, serve_mirroring};
use harness::python_clients::{kafka_python, librdkafka};
use harness::serve::{endpoint_requests, scrape_metrics, EndpointRequests};
use harness::{Isolation, ProduceOpts, TxnEnd};

/// One API kmirror serves: the range it advertises and the versions each client's workload
/// sent (empty: the workload does not use it).
struct Row {
    key: i16,
    name: &'static str,
    min: i16,
    max: i16,
    librdkafka: &'static [i16],
    java: &'static [i16],
    kafka_python: &'static [i16],
}

#[rustfmt::skip]
const TABLE: &[Row] = &[
    Row { key: 0, name: "Produce", min: 3, max: 12, librdkafka: &[10], java: &[11, 12], kafka_python: &[9] },
    Row { key: 1, name: "Fetch", min: 4, max: 17, librdkafka: &[16], java: &[16, 17], kafka_python: &[12] },
    Row { key: 2, name: "ListOffsets", min: 1, max: 10, librdkafka: &[7], java: &[10], kafka_python: &[10] },
    Row { key: 3, name: "Metadata", min: 0, max: 12, librdkafka: &[12], java: &[12], kafka_python: &[12] },
    Row { key: 8, name: "OffsetCommit", min: 2, max: 9, librdkafka: &[9], java: &[9], kafka_python: &[8] },
    Row { key: 9, name: "OffsetFetch", min: 1, max: 9, librdkafka: &[9], java: &[9], kafka_python: &[8] },
    Row { key: 10, name: "FindCoordinator", min: 0, max: 6, librdkafka: &[2], java: &[6], kafka_python: &[6] },
    Row { key: 11, name: "JoinGroup", min: 0, max: 9, librdkafka: &[5], java: &[9], kafka_python: &[7] },
    Row { key: 12, name: "Heartbeat", min: 0, max: 4, librdkafka: &[3], java: &[4], kafka_python: &[4] },
    Row { key: 13, name: "LeaveGroup", min: 0, max: 5, librdkafka: &[1], java: &[5], kafka_python: &[5] },
    Row { key: 14, name: "SyncGroup", min: 0, max: 5, librdkafka: &[3], java: &[5], kafka_python: &[5] },
    Row { key: 15, name: "DescribeGroups", min: 0, max: 6, librdkafka: &[5], java: &[6], kafka_python: &[] },
    Row { key: 16, name: "ListGroups", min: 0, max: 5, librdkafka: &[5], java: &[], kafka_python: &[] },
    Row { key: 18, name: "ApiVersions", min: 0, max: 4, librdkafka: &[3], java: &[4], kafka_python: &[4] },
    Row { key: 22, name: "InitProducerId", min: 0, max: 4, librdkafka: &[4], java: &[4], kafka_python: &[] },
    Row { key: 23, name: "OffsetForLeaderEpoch", min: 2, max: 4, librdkafka: &[], java: &[4], kafka_python: &[] },
    Row { key: 24, name: "AddPartitionsToTxn", min: 0, max: 3, librdkafka: &[0], java: &[3], kafka_python: &[] },
    Row { key: 25, name: "AddOffsetsToTxn", min: 0, max: 4, librdkafka: &[], java: &[4], kafka_python: &[] },
    Row { key: 26, name: "EndTxn", min: 0, max: 4, librdkafka: &[1], java: &[4], kafka_python: &[] },
    Row { key: 28, name: "TxnOffsetCommit", min: 0, max: 4, librdkafka: &[], java: &[4], kafka_python: &[] },
    // The ACL APIs (kafka-acls.sh; tests/serve_acls.rs): no client workload here sends them.
    Row { key: 29, name: "DescribeAcls", min: 1, max: 3, librdkafka: &[], java: &[], kafka_python: &[] },
    Row { key: 30, name: "CreateAcls", min: 1, max: 3, librdkafka: &[], java: &[], kafka_python: &[] },
    Row { key: 31, name: "DeleteAcls", min: 1, max: 3, librdkafka: &[], java: &[], kafka_python: &[] },
    Row { key: 32, name: "DescribeConfigs", min: 1, max: 4, librdkafka: &[1], java: &[4], kafka_python: &[] },
];

/// APIs a client sends only when its run outlasts a timer (Heartbeat: `heartbeat.interval.ms`):
/// what it sent must be in the table, but it may have sent nothing.
const TIMER_DRIVEN: &[i16] = &[12];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Client {
    Librdkafka,
    Java,
    KafkaPython,
}

impl Client {
    fn column(self, row: &Row) -> &'static [i16] {
        match self {
            Client::Librdkafka => row.librdkafka,
            Client::Java => row.java,
            Client::KafkaPython => row.kafka_python,
        }
    }
}

/// What kmirror's ApiVersions (v3) response advertises: key → (min, max).
fn advertised(kmirror: &str) -> BTreeMap<i16, (i16, i16)> {
    let mut frame = BytesMut::new();
    let mut header = RequestHeader::default();
    header.request_api_key = 18;
    header.request_api_version = 3;
    header.correlation_id = 7;
    header.client_id = Some(StrBytes::from_static_str("api-audit"));
    header.encode(&mut frame, 2).unwrap();
    let mut req = ApiVersionsRequest::default();
    req.client_software_name = StrBytes::from_static_str("api-audit");
    req.client_software_version = StrBytes::from_static_str("1");
    req.encode(&mut frame, 3).unwrap();
    let mut stream = TcpStream::connect(kmirror).unwrap();
    stream
        .write_all(&(frame.len() as i32).to_be_bytes())
        .unwrap();
    stream.write_all(&frame).unwrap();
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).unwrap();
    let mut body = bytes::Bytes::from(body);
    assert_eq!(body.get_i32(), 7, "correlation id (response header v0)");
    let resp = ApiVersionsResponse::decode(&mut body, 3).unwrap();
    assert_eq!(resp.error_code, 0);
    resp.api_keys
        .iter()
        .map(|k| (k.api_key, (k.min_version, k.max_version)))
        .collect()
}

/// The (API, version) pairs whose counters grew between two scrapes, with what grew.
fn sent_between(
    before: &BTreeMap<(i16, i16), EndpointRequests>,
    after: &BTreeMap<(i16, i16), EndpointRequests>,
) -> BTreeMap<(i16, i16), EndpointRequests> {
    let mut out = BTreeMap::new();
    for (at, now) in after {
        let was = before.get(at).cloned().unwrap_or_default();
        let mut grew = EndpointRequests {
            served: now.served - was.served,
            ..Default::default()
        };
        for (why, n) in &now.errors {
            let d = n - was.errors.get(why).copied().unwrap_or(0);
            if d > 0 {
                grew.errors.insert(why.clone(), d);
            }
        }
        if grew.served > 0 || !grew.errors.is_empty() {
            out.insert(*at, grew);
        }
    }
    out
}

/// The table as markdown, from what was observed (for the failure message and `--nocapture`).
fn markdown(
    adv: &BTreeMap<i16, (i16, i16)>,
    seen: &BTreeMap<Client, BTreeSet<(i16, i16)>>,
) -> String {
    let versions = |c: Client, key: i16| -> String {
        let v: Vec<String> = seen[&c]
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
            .collect();
        if v.is_empty() {
            "–".into()
        } else {
            v.join(", ")
        }
    };
    let mut out = String::from(
        "| key | API | kmirror | librdkafka 2.16 | Java 4.1.1 | kafka-python 3.0 |\n|---|---|---|---|---|---|\n",
    );
    for (key, (min, max)) in adv {
        let name = TABLE
            .iter()
            .find(|r| r.key == *key)
            .map(|r| r.name)
            .unwrap_or("?");
        out.push_str(&format!(
            "| {key} | {name} | {min}–{max} | {} | {} | {} |\n",
            versions(Client::Librdkafka, *key),
            versions(Client::Java, *key),
            versions(Client::KafkaPython, *key)
        ));
    }
    out
}

#[test]
fn every_version_each_client_sends_is_advertised_and_understood() {
    let k = harness::shared();
    let prefix = harness::unique_topic("audit");
    let (input, output) = (format!("{prefix}-in"), format!("{prefix}-out"));
    k.create_topic(&input, 2, &[]);
    k.create_topic(&output, 1, &[]);
    k.produce(&input, 0, 100, &ProduceOpts::default());
    k.produce(
        &input,
        1,
        100,
        &ProduceOpts {
            transactions: vec![TxnEnd::Commit, TxnEnd::Abort],
            seed: 2,
            ..Default::default()
        },
    );
    k.produce(&output, 0, 10, &ProduceOpts::default());

    let work = tempfile::tempdir().unwrap();
    let (serve, admin, kmirror) = serve_mirroring(work.path(), k, &[(&input, 2), (&output, 1)]);

    let mut seen: BTreeMap<Client, BTreeSet<(i16, i16)>> = BTreeMap::new();
    let mut refused = Vec::new();
    let mut run = |client: Client, what: &str, work: &mut dyn FnMut()| {
        let before = endpoint_requests(&scrape_metrics(&admin));
        work();
        let after = endpoint_requests(&scrape_metrics(&admin));
        for (at, grew) in sent_between(&before, &after) {
            if !grew.errors.is_empty() {
                refused.push(format!(
                    "{client:?} {what}: api {} v{}: {:?}",
                    at.0, at.1, grew.errors
                ));
            }
            seen.entry(client).or_default().insert(at);
        }
    };
    let pattern = format!("^{prefix}-.*");
    let group = |c: &str| format!("{prefix}-{c}");

    // Reading while mirrored.
    run(Client::Librdkafka, "read", &mut || {
        for (p, iso) in [("0", "read_uncommitted"), ("1", "read_committed")] {
            assert!(!librdkafka(&["consume", &kmirror, &input, p, iso]).is_empty());
        }
        librdkafka(&["metadata", &kmirror]);
        librdkafka(&["configs", &kmirror, &input]);
        librdkafka(&["offsets", &kmirror, &input, "0", "0,1"]);
        // Twice: the second member starts at the first one's commits.
        for _ in 0..2 {
            librdkafka(&["group", &kmirror, &pattern, &group("rdk"), "50"]);
        }
        librdkafka(&["produce-refused", &kmirror, &input, "0"]);
    });
    run(Client::Java, "read", &mut || {
        for iso in [Isolation::ReadUncommitted, Isolation::ReadCommitted] {
            assert!(!harness::consume_to_end(&kmirror, &input, 1, iso).is_empty());
        }
        harness::offsets(&kmirror, &input, 0);
        harness::offsets_for_times(&kmirror, &input, 0, &[0, 1]);
        harness::describe_topic_configs(&kmirror, &input, &["retention.ms"]);
        for _ in 0..2 {
            group_consume(&kmirror, &input, &group("java"), 50);
        }
        assert!(!describe_group(&kmirror, &group("java")).is_empty());
    });
    run(Client::KafkaPython, "read", &mut || {
        for (p, iso) in [("0", "read_uncommitted"), ("1", "read_committed")] {
            assert!(!kafka_python(&["consume", &kmirror, &input, p, "10", iso]).is_empty());
        }
        kafka_python(&["group", &kmirror, &input, &group("py"), "50"]);
        kafka_python(&["produce", &kmirror, &input, "0"]);
    });

    // Writing after failover.
    cli_ok(
        &admin,
        &[
            "stop",
            "--mirror",
            "m",
            "--topics",
            &format!("{input},{output}"),
        ],
    );
    run(Client::Librdkafka, "write", &mut || {
        librdkafka(&["produce", &kmirror, &input, "0", "10", "idempotent", "a1"]);
        librdkafka(&["produce", &kmirror, &input, "0", "10", "commit,abort", "a2"]);
    });
    run(Client::Java, "write", &mut || {
        let idem = ProduceOpts {
            idempotent: true,
            seed: 3,
            ..Default::default()
        };
        harness::produce(&kmirror, &input, 0, 10, &idem);
        let txns = ProduceOpts {
            transactions: vec![TxnEnd::Commit, TxnEnd::Abort],
            seed: 4,
            ..Default::default()
        };
        harness::produce(&kmirror, &input, 0, 10, &txns);
        txn_transform(
            &kmirror,
            &input,
            &group("ctp"),
            &output,
            &["commit", "abort"],
            5,
        );
    });
    run(Client::KafkaPython, "write", &mut || {
        let out = kafka_python(&["produce", &kmirror, &input, "0"]).remove(0);
        assert_eq!(out["error"], serde_json::Value::Null, "{out}");
    });

    let adv = advertised(&kmirror);
    let table = markdown(&adv, &seen);
    println!("{table}");
    assert!(
        refused.is_empty(),
        "refused requests: {refused:#?}\n{table}"
    );
    let ours: BTreeMap<i16, (i16, i16)> = TABLE.iter().map(|r| (r.key, (r.min, r.max))).collect();
    assert_eq!(
        ours, adv,
        "the table's kmirror ranges are ApiVersions'\n{table}"
    );
    for client in [Client::Librdkafka, Client::Java, Client::KafkaPython] {
        let listed: BTreeSet<(i16, i16)> = TABLE
            .iter()
            .flat_map(|r| client.column(r).iter().map(|v| (r.key, *v)))
            .collect();
        let sent = seen.get(&client).cloned().unwrap_or_default();
        let strays: Vec<_> = sent.difference(&listed).collect();
        assert!(
            strays.is_empty(),
            "{client:?} sent versions the table does not list: {strays:?}\n{table}"
        );
        // Every API the table lists for the client was used. Which of its listed versions
        // a run sends may vary (the Java consumer sends Fetch 16 or 17 from run to run).
        for row in TABLE {
            let used = sent.iter().any(|(key, _)| *key == row.key);
            let listed = !client.column(row).is_empty();
            assert!(
                used == listed || (listed && TIMER_DRIVEN.contains(&row.key)),
                "{client:?} {}: used {used}, listed {listed}\n{table}",
                row.name
            );
        }
    }
    drop(serve);
}
