//! Goal: kmirror's ACLs are managed with Kafka's own `kafka-acls.sh` and enforced on stock
//! clients with Kafka's errors. Method: the shared Kafka 4.1.1 broker is the source of two
//! topics T and U; one `kmirror serve` (control plane, PLAINTEXT `[kafka]` listener, default
//! `[kafka.authorizer]`: enabled, allow.everyone.if.no.acl.found = true since no listener
//! authenticates) mirrors both and fails them over with `mirrors stop`. On a plaintext
//! listener every client is User:ANONYMOUS, so the ACLs are: READ on T and on the consumer's
//! group for User:ANONYMOUS, and READ on U for User:someone-else only (so U has ACLs, none of
//! them the client's). Then:
//! - `kafka-acls.sh --list` against kmirror shows exactly the ACLs added;
//! - the Java consumer reads every record of T; reading U fails with the Java client's
//!   TopicAuthorizationException, and a librdkafka (confluent-kafka) producer to U gets
//!   TOPIC_AUTHORIZATION_FAILED;
//! - the ACLs survive a restart of kmirror (`__kmirror_acls-0`), and `--remove` deletes them
//!   (after which U, with no ACL left, is readable again: the default allows).

mod harness;

use harness::mirrors_cli::serve_mirroring;
use harness::python_clients::librdkafka;
use harness::{acl_lines, kafka_acls, try_consume_count, ProduceOpts};

const RECORDS: usize = 20;

#[test]
fn kafka_acls_manages_kmirror_and_stock_clients_get_kafkas_errors() {
    let k = harness::shared();
    let prefix = harness::unique_topic("acl");
    let (t, u) = (format!("{prefix}-t"), format!("{prefix}-u"));
    for topic in [&t, &u] {
        k.create_topic(topic, 1, &[]);
        k.produce(topic, 0, RECORDS, &ProduceOpts::default());
    }
    let work = tempfile::tempdir().unwrap();
    let (serve, admin, kmirror) = serve_mirroring(work.path(), k, &[(&t, 1), (&u, 1)]);
    harness::mirrors_cli::cli_ok(&admin, &["stop", "--mirror", "m", "--topics", ".*"]);

    let group = format!("{prefix}-g");
    kafka_acls(
        &kmirror,
        &[
            "--add",
            "--allow-principal",
            "User:ANONYMOUS",
            "--operation",
            "Read",
            "--topic",
            &t,
            "--group",
            &group,
        ],
    );
    kafka_acls(
        &kmirror,
        &[
            "--add",
            "--allow-principal",
            "User:someone-else",
            "--operation",
            "Read",
            "--topic",
            &u,
        ],
    );
    let listed = acl_lines(&kafka_acls(&kmirror, &["--list"]));
    assert_eq!(listed.len(), 3, "three ACLs listed: {listed:#?}");
    assert!(
        listed
            .iter()
            .any(|l| l.contains("principal=User:someone-else")),
        "{listed:#?}"
    );
    let on_t = kafka_acls(&kmirror, &["--list", "--topic", &t]);
    assert!(
        on_t.contains(&format!("name={t}")) && on_t.contains("principal=User:ANONYMOUS"),
        "{on_t}"
    );

    // Enforcement with stock clients (after failover: the partitions are kmirror's own).
    assert_eq!(
        try_consume_count(&kmirror, &t, RECORDS),
        Ok(RECORDS),
        "T is readable"
    );
    let refused = try_consume_count(&kmirror, &u, RECORDS).expect_err("U must be refused");
    assert!(
        refused.contains("TopicAuthorizationException"),
        "the Java client names Kafka's error: {refused}"
    );
    // librdkafka: a produce to U (no WRITE for User:ANONYMOUS, and U has ACLs) fails with
    // Kafka's error in the delivery report.
    let rdk = librdkafka(&["produce-refused", &kmirror, &u, "0"]).remove(0);
    assert_eq!(rdk["error"], "TOPIC_AUTHORIZATION_FAILED", "{rdk}");

    // Durable: the same ACLs after a restart.
    let config = work.path().join("kmirror.toml");
    serve.sigterm_and_wait();
    let mut serve = harness::serve::Serve::start(&config, work.path().join("serve2.log"));
    let kmirror = serve.kafka_listener();
    assert_eq!(acl_lines(&kafka_acls(&kmirror, &["--list"])), listed);

    // --remove deletes them; U has no ACL left, so the plaintext default lets it be read.
    kafka_acls(
        &kmirror,
        &[
            "--remove",
            "--force",
            "--allow-principal",
            "User:someone-else",
            "--operation",
            "Read",
            "--topic",
            &u,
        ],
    );
    let left = acl_lines(&kafka_acls(&kmirror, &["--list"]));
    assert_eq!(left.len(), 2, "{left:#?}");
    assert_eq!(
        try_consume_count(&kmirror, &u, RECORDS),
        Ok(RECORDS),
        "U readable once its ACL is gone"
    );
    serve.sigterm_and_wait();
}

/// Writes the seeds of fuzz target `acl_requests` (`fuzz/corpus/acl_requests/`): stored ACL
/// records and CreateAcls/DescribeAcls/DeleteAcls bodies of every served version, in the
/// layout `kmirror::fuzz_entry::acl_requests` reads. Run: `cargo test --test serve_acls
/// write_acl_seed_corpus -- --ignored` (rerunning rewrites the same files).
#[test]
#[ignore = "writes the checked-in seed corpus; run by hand"]
fn write_acl_seed_corpus() {
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
    use kafka_protocol::messages::{CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use kmirror::serve::authz::acl::AclBinding;

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/acl_requests");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: String, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
    let bindings = [
        AclBinding::from_wire(2, "orders", 3, "User:alice", "*", 3, 3).unwrap(),
        AclBinding::from_wire(3, "app-", 4, "User:*", "10.0.0.1", 8, 2).unwrap(),
        AclBinding::from_wire(4, "kafka-cluster", 3, "User:admin", "*", 7, 3).unwrap(),
        AclBinding::from_wire(5, "tx", 3, "User:bob", "*", 4, 3).unwrap(),
    ];
    for (i, b) in bindings.iter().enumerate() {
        let mut rec = vec![0u8];
        rec.extend(b.encode());
        write(format!("record-{i}"), rec);
    }
    let text = |s: &str| StrBytes::from_string(s.to_string());
    for version in 1..=3i16 {
        let frame = |api: u8, body: &dyn Fn(&mut bytes::BytesMut)| {
            let mut out = bytes::BytesMut::from(&[1u8, api, (version - 1) as u8][..]);
            body(&mut out);
            out.to_vec()
        };
        let mut create = CreateAclsRequest::default();
        create.creations = bindings
            .iter()
            .map(|b| {
                let mut c = AclCreation::default();
                c.resource_type = b.pattern.resource_type.code();
                c.resource_name = text(&b.pattern.name);
                c.resource_pattern_type = b.pattern.pattern_type.code();
                c.principal = text(&b.entry.principal);
                c.host = text(&b.entry.host);
                c.operation = b.entry.operation.code();
                c.permission_type = b.entry.permission.code();
                c
            })
            .collect();
        let mut describe = DescribeAclsRequest::default();
        describe.resource_type_filter = 1;
        describe.resource_name_filter = None;
        describe.pattern_type_filter = 2;
        describe.principal_filter = None;
        describe.host_filter = None;
        describe.operation = 1;
        describe.permission_type = 1;
        let mut delete = DeleteAclsRequest::default();
        let mut f = DeleteAclsFilter::default();
        f.resource_type_filter = 2;
        f.resource_name_filter = Some(text("orders"));
        f.pattern_type_filter = 1;
        f.principal_filter = None;
        f.host_filter = None;
        f.operation = 1;
        f.permission_type = 1;
        delete.filters = vec![f];
        write(
            format!("create-v{version}"),
            frame(0, &|o| create.encode(o, version).unwrap()),
        );
        write(
            format!("describe-v{version}"),
            frame(1, &|o| describe.encode(o, version).unwrap()),
        );
        write(
            format!("delete-v{version}"),
            frame(2, &|o| delete.encode(o, version).unwrap()),
        );
    }
}
