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
use harness::{kafka_acls, ProduceOpts};

const RECORDS: usize = 20;

fn s(x: &str) -> String {
    x.to_string()
}

/// The ACL lines `kafka-acls.sh --list` printed (one per ACL, Kafka's `(principal=..., ...)`).
fn acl_lines(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("(principal="))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// Reads `topic`-0 with the Java consumer; the tool's stderr when it failed.
fn java_consume(bootstrap: &str, topic: &str) -> Result<usize, String> {
    let out = harness::run_tool_unchecked(&[
        s("consume"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
        s("--partition"),
        s("0"),
        s("--from"),
        s("0"),
        s("--max"),
        RECORDS.to_string(),
        s("--isolation"),
        s("read_uncommitted"),
        s("--timeout-ms"),
        s("30000"),
    ]);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with('{'))
            .count())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

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
    assert_eq!(java_consume(&kmirror, &t), Ok(RECORDS), "T is readable");
    let refused = java_consume(&kmirror, &u).expect_err("U must be refused");
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
        java_consume(&kmirror, &u),
        Ok(RECORDS),
        "U readable once its ACL is gone"
    );
    serve.sigterm_and_wait();
}
