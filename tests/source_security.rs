//! Goal: per-mirror source security against a real broker. Method: a dedicated Kafka 4.1.1
//! KRaft broker with a SASL_SSL listener (certificates made now with keytool, SCRAM users
//! created by `kafka-storage format --add-scram`, PLAIN users in its JAAS config, sessions that
//! expire every few seconds so connections are re-established), and `kmirror serve` driven by
//! the `kmirror mirrors` CLI.
//! - SCRAM-SHA-512 and PLAIN mirrors over SASL_SSL copy their topics byte for byte;
//! - creating a mirror with a wrong password fails and the CLI names the authentication failure;
//! - when a running mirror's password is changed on the source, its next connection is refused
//!   and its partition becomes FAILED, not retryable, with an "authentication failed" reason,
//!   while the other mirrors keep mirroring what is produced afterwards;
//! - the group-offset sync reads the source's groups over SASL_SSL with the mirror's own
//!   credentials: a group's commit on the source shows on kmirror's Kafka listener
//!   (`kafka-consumer-groups.sh --describe`);
//! - `kmirror doctor` reports the good mirrors' sources as authenticated and the rotated one as
//!   refused, through the running kmirror, which alone holds the credentials.

mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::mirrors_cli::{
    cli, cli_ok, describe_rows, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{Kafka, ProduceOpts, SaslSslSetup};

/// Failure guard for the refused mirror to be noticed, not a performance claim.
const FAIL_LIMIT: Duration = Duration::from_secs(120);

fn mirror_props(path: &Path, bootstrap: &str, ca: &Path, mechanism: &str, user: &str, pw: &str) {
    let module = if mechanism == "PLAIN" {
        "org.apache.kafka.common.security.plain.PlainLoginModule"
    } else {
        "org.apache.kafka.common.security.scram.ScramLoginModule"
    };
    std::fs::write(
        path,
        format!(
            "bootstrap.servers={bootstrap}\n\
             security.protocol=SASL_SSL\n\
             sasl.mechanism={mechanism}\n\
             sasl.jaas.config={module} required username=\"{user}\" password=\"{pw}\";\n\
             ssl.truststore.type=PEM\n\
             ssl.truststore.location={}\n",
            ca.display()
        ),
    )
    .unwrap();
}

#[test]
fn sasl_ssl_mirrors_and_a_refused_login_fails_only_its_mirror() {
    let work = tempfile::tempdir().unwrap();
    let certs = harness::certs::make(work.path());
    let k = Kafka::start_sasl_ssl(&SaslSslSetup {
        keystore: &certs.broker_p12,
        keystore_password: certs.password,
        scram_users: &[
            ("SCRAM-SHA-512", "bob", "bob-secret"),
            ("SCRAM-SHA-256", "carol", "carol-secret"),
        ],
        plain_users: &[("dave", "dave-secret")],
        // Sessions expire, so the broker closes every SASL connection after a few seconds and
        // each mirror authenticates again with what it has.
        extra: &[("connections.max.reauth.ms", "4000")],
    });
    let topics = ["sec-good", "sec-bad", "sec-plain"];
    for t in topics {
        k.create_topic(t, 1, &[]);
        k.produce(t, 0, 200, &ProduceOpts::default());
    }
    // A consumer group (on the broker's PLAINTEXT listener) reads and commits 120 records.
    let group = "sec-app";
    let read = harness::groups::group_consume(&k.bootstrap(), "sec-good", group, 120);
    assert_eq!(read.len(), 120);

    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    // A long sync interval: only the data path's own reconnect can notice the new password.
    let kafka = format!("127.0.0.1:{}", free_loopback_port());
    let slow = "sync_interval_ms = 3600000";
    write_serving_config(&config, &admin, Some(&kafka), &data_dir, slow);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_admin(&mut serve, &admin);

    let secure = k.secure_bootstrap();
    let props = |name: &str, mech: &str, user: &str, pw: &str| {
        let p = work.path().join(format!("{name}.properties"));
        mirror_props(&p, &secure, &certs.ca_pem, mech, user, pw);
        let mut text = std::fs::read_to_string(&p).unwrap();
        text.push_str("sync.group.offsets.interval.ms=500\n");
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    };

    let wrong = props("wrong", "SCRAM-SHA-256", "carol", "not-her-password");
    let refused = cli(
        &admin,
        &["create", "--mirror", "wrong", "--mirror-config", &wrong],
    );
    assert!(
        !refused.ok,
        "a wrong password was accepted: {}",
        refused.stdout
    );
    assert!(
        refused.stderr.contains("authentication failed"),
        "the CLI does not name the problem: {}",
        refused.stderr
    );

    for (name, mech, user, pw, topic) in [
        ("good", "SCRAM-SHA-512", "bob", "bob-secret", "sec-good"),
        ("bad", "SCRAM-SHA-256", "carol", "carol-secret", "sec-bad"),
        ("plain", "PLAIN", "dave", "dave-secret", "sec-plain"),
    ] {
        let p = props(name, mech, user, pw);
        cli_ok(&admin, &["create", "--mirror", name, "--mirror-config", &p]);
        cli_ok(&admin, &["start", "--mirror", name, "--topics", topic]);
    }
    let pairs = |ts: &[&str]| -> Vec<_> {
        ts.iter()
            .map(|t| (k.partition_dir(t, 0), data_dir.join(format!("{t}-0"))))
            .collect()
    };
    wait_all_mirrored(&mut serve, &pairs(&topics));
    // The group sync of mirror "good" reads the source's groups over SASL_SSL as bob.
    let start = Instant::now();
    loop {
        let rows = harness::groups::describe_group(&kafka, group);
        let shown: Vec<_> = rows
            .iter()
            .map(|r| (r.topic.as_str(), r.partition, r.current_offset))
            .collect();
        if shown == [("sec-good", 0, Some(120))] {
            break;
        }
        assert!(
            start.elapsed() < FAIL_LIMIT,
            "kmirror shows {rows:?} for {group}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // Rotate carol's password on the source; her mirror's connection expires and is refused.
    harness::kafka_configs(
        &k.bootstrap(),
        &[
            "--alter",
            "--add-config",
            "SCRAM-SHA-256=[password=rotated-secret]",
            "--entity-type",
            "users",
            "--entity-name",
            "carol",
        ],
    );
    for t in topics {
        k.produce(t, 0, 100, &ProduceOpts::default());
    }
    let start = Instant::now();
    let bad = loop {
        let rows = describe_rows(&admin, "bad");
        if rows[0]["state"] == "FAILED" {
            break rows[0].clone();
        }
        assert!(
            start.elapsed() < FAIL_LIMIT,
            "the refused mirror never failed: {rows:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let message = bad["errorMessage"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("authentication failed"),
        "reason: {message}"
    );
    assert_eq!(
        bad["retryAttempt"], -1,
        "an authentication failure must not retry"
    );

    // The other mirrors are untouched: they fetch what was produced after the rotation.
    wait_all_mirrored(&mut serve, &pairs(&["sec-good", "sec-plain"]));
    for m in ["good", "plain"] {
        let rows = describe_rows(&admin, m);
        assert_eq!(rows[0]["state"], "MIRRORING", "{m}: {rows:?}");
    }

    // `kmirror doctor` has the running kmirror connect with each mirror's own settings: the
    // good ones pass as authenticated users, the rotated one fails as refused credentials.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("doctor")
        .arg(&config)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        !out.status.success(),
        "a refused mirror must fail doctor:\n{report}"
    );
    for (mirror, how) in [
        ("good", "SASL_SSL as bob (SCRAM-SHA-512)"),
        ("plain", "SASL_SSL as dave (PLAIN)"),
    ] {
        let line = format!("PASS source of mirror {mirror}: {secure} answers over {how}");
        assert!(report.contains(&line), "no {line:?} in:\n{report}");
    }
    let refused =
        format!("FAIL source of mirror bad: {secure} refused SASL_SSL as carol (SCRAM-SHA-256): ");
    let at = report
        .find(&refused)
        .unwrap_or_else(|| panic!("no {refused:?} in:\n{report}"));
    assert!(
        report[at..]
            .lines()
            .next()
            .unwrap()
            .contains("authentication failed"),
        "{report}"
    );
    assert_eq!(
        describe_rows(&admin, "good")[0]["state"],
        "MIRRORING",
        "a doctor check changes no state"
    );

    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
}
