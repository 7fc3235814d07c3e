//! SASL on kmirror's Kafka listener, with stock clients only: the Java clients (KafkaTool,
//! Kafka's own `kafka-configs.sh` main class) and librdkafka (confluent-kafka).
//!
//! - `kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[password=…]'` against kmirror (as a
//!   PLAIN admin from the users file) creates a SCRAM user, `--describe` shows it, and that user
//!   then logs in;
//! - Java and librdkafka consumers read a mirrored partition over SASL_PLAINTEXT with
//!   SCRAM-SHA-512 and with PLAIN; after failover Java and librdkafka producers write to it;
//! - wrong password and unknown user are refused with SASL_AUTHENTICATION_FAILED and Kafka's
//!   texts, as each client reports them;
//! - kmirror run under `umask 000` still writes its credential store 0600, and no password
//!   reaches its log;
//! - with `connections.max.reauth.ms` small a Java consumer keeps reading across several
//!   re-authentications of its connections (KIP-368).
//!
//! Who is let in: the listener authenticates, so allow.everyone.if.no.acl.found is false (the
//! default); User:admin (PLAIN) is the one super user, and grants alice and bob, with
//! `kafka-acls.sh`, what each test has them do on its topic.

mod harness;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::client_login::ClientLogin;
use harness::mirrors_cli::{
    cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::python_clients::{records, run_python_refused, run_python_with};
use harness::serve::{wait_all_mirrored, Launch, Serve};
use harness::{Isolation, ProduceOpts};

/// What kmirror's PLAIN users file holds (the admin creates the SCRAM users).
const PLAIN_USERS: &str = "admin = \"admin-secret\"\nbob = \"bob-secret\"\n";
const ALICE_PASSWORD: &str = "alice-secret-0";

/// kmirror with `[admin]`, a SASL_PLAINTEXT `[kafka]` listener (PLAIN and both SCRAMs), run
/// under `umask 000` with `log_filter` as KMIRROR_LOG; returns it, the admin address and the
/// listener.
fn start_kmirror(work: &Path, reauth_ms: u64, log_filter: &str) -> (Serve, String, String) {
    let users = work.join("plain-users.toml");
    harness::client_login::write_secret(&users, PLAIN_USERS);
    let config = work.join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &work.join("data"), "");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[kafka.sasl]\nenabled_mechanisms = [\"SCRAM-SHA-512\", \"SCRAM-SHA-256\", \"PLAIN\"]\n\
         plain_users_file = \"{}\"\nconnections_max_reauth_ms = {reauth_ms}\n\
         [kafka.authorizer]\nsuper_users = [\"User:admin\"]\n",
        users.display()
    ));
    std::fs::write(&config, text).unwrap();
    let launch = Launch::umask_000(vec![("KMIRROR_LOG".into(), log_filter.into())]);
    let mut serve = Serve::start_with(&config, work.join("serve.log"), &launch);
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    (serve, admin, kmirror)
}

/// A Java client properties file logging in as `user` with `mechanism`.
fn client_props(work: &Path, mechanism: &str, user: &str, password: &str) -> PathBuf {
    ClientLogin::sasl(mechanism, user, password)
        .java_properties(work, &format!("{user}-{mechanism}-{password}"))
}

fn librdkafka_login(mechanism: &str, user: &str, password: &str) -> serde_json::Value {
    ClientLogin::sasl(mechanism, user, password).librdkafka()
}

/// `kafka-acls.sh --add`, as the PLAIN super user, for `principals`, with `resource` (e.g.
/// `["--operation", "Read", "--topic", T]`).
fn grant(work: &Path, kmirror: &str, principals: &[&str], resource: &[&str]) {
    let admin = client_props(work, "PLAIN", "admin", "admin-secret");
    harness::kafka_acls_allow(kmirror, &admin, principals, resource);
}

/// Mirrors `topic` (one partition) of `source` as mirror "m" and waits until it is complete.
fn mirror(serve: &mut Serve, admin: &str, work: &Path, source: &harness::Kafka, topic: &str) {
    create_mirror(admin, work, "m", &source.bootstrap(), "");
    cli_ok(admin, &["start", "--mirror", "m", "--topics", topic]);
    let pairs = source.mirror_pairs(topic, 1, &work.join("data"));
    wait_all_mirrored(serve, &pairs);
}

/// `kafka-configs.sh` creates SCRAM-SHA-512 user alice on kmirror, logged in as the PLAIN admin.
fn create_alice(work: &Path, kmirror: &str) -> PathBuf {
    let admin = client_props(work, "PLAIN", "admin", "admin-secret");
    harness::add_scram_user(kmirror, &admin, "SCRAM-SHA-512", "alice", ALICE_PASSWORD);
    let admin = admin.to_str().unwrap();
    let out = harness::kafka_configs(
        kmirror,
        &[
            "--command-config",
            admin,
            "--describe",
            "--entity-type",
            "users",
            "--entity-name",
            "alice",
        ],
    );
    assert!(
        out.contains(
            "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-512=iterations=4096"
        ),
        "{out}"
    );
    assert!(!out.contains(ALICE_PASSWORD), "{out}");
    client_props(work, "SCRAM-SHA-512", "alice", ALICE_PASSWORD)
}

fn consume_args(kmirror: &str, topic: &str, max: usize) -> Vec<String> {
    [
        "consume",
        "--bootstrap",
        kmirror,
        "--topic",
        topic,
        "--partition",
        "0",
        "--from",
        "0",
        "--max",
        &max.to_string(),
        "--timeout-ms",
        "60000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What a Java consumer logging in with `props` reports when kmirror refuses it.
fn java_refusal(props: &Path, kmirror: &str, topic: &str) -> String {
    harness::with_client_config(props, || harness::try_consume(kmirror, topic, 1))
        .expect_err("a refused login consumed records")
}

// Goal: stock clients log in with SCRAM-SHA-512 (a user made with kafka-configs.sh against
// kmirror) and with PLAIN, read a mirrored partition and write to it after failover, and bad
// logins are refused with Kafka's SASL_AUTHENTICATION_FAILED texts.
#[test]
fn stock_clients_log_in_with_scram_and_plain_and_bad_logins_are_refused() {
    let k = harness::shared();
    let topic = harness::unique_topic("sasl");
    k.create_topic(&topic, 1, &[]);
    harness::produce(&k.bootstrap(), &topic, 0, 40, &ProduceOpts::default());
    let source = harness::consume(&k.bootstrap(), &topic, 0, 0, 40, Isolation::ReadUncommitted);
    assert_eq!(source.len(), 40);

    let work = tempfile::tempdir().unwrap();
    let (mut serve, admin, kmirror) = start_kmirror(work.path(), 0, "info");
    mirror(&mut serve, &admin, work.path(), k, &topic);
    let alice = create_alice(work.path(), &kmirror);
    grant(
        work.path(),
        &kmirror,
        &["User:alice", "User:bob"],
        &[
            "--operation",
            "Read",
            "--topic",
            &topic,
            "--group",
            "librdkafka-assign",
        ],
    );
    grant(
        work.path(),
        &kmirror,
        &["User:alice", "User:bob"],
        &["--operation", "Write", "--topic", &topic],
    );
    let store = work.path().join("data/scram-credentials.json");
    let mode = std::fs::metadata(&store).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the credential store under umask 000");
    assert!(!std::fs::read_to_string(&store)
        .unwrap()
        .contains(ALICE_PASSWORD));
    // The mirror definition (it may hold source passwords) lives in __mirror_state: its
    // directory is 0700 and its segments 0600 under umask 000 too.
    let state = work.path().join("data/__mirror_state-0");
    let dir_mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700, "{}", state.display());
    for f in std::fs::read_dir(&state).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "log") {
            let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
    }

    // Java consumers, SCRAM-SHA-512 and PLAIN.
    let bob = client_props(work.path(), "PLAIN", "bob", "bob-secret");
    for props in [&alice, &bob] {
        let ours = harness::with_client_config(props, || {
            harness::consume(&kmirror, &topic, 0, 0, 40, Isolation::ReadUncommitted)
        });
        assert_eq!(ours, source, "Java consumer with {}", props.display());
    }

    // librdkafka, SCRAM-SHA-512 and PLAIN.
    let rd_source = records(&run_python_with(
        "librdkafka_client.py",
        &["consume", &k.bootstrap(), &topic, "0", "read_uncommitted"],
        None,
    ));
    assert_eq!(rd_source.len(), 40);
    for login in [
        librdkafka_login("SCRAM-SHA-512", "alice", ALICE_PASSWORD),
        librdkafka_login("PLAIN", "bob", "bob-secret"),
    ] {
        let lines = run_python_with(
            "librdkafka_client.py",
            &["consume", &kmirror, &topic, "0", "read_uncommitted"],
            Some(&login),
        );
        assert_eq!(records(&lines), rd_source, "librdkafka with {login}");
    }

    // Refusals: wrong password and unknown user, as each client reports them.
    let scram_refused = "Authentication failed during authentication due to invalid \
                         credentials with SASL mechanism SCRAM-SHA-512";
    for props in [
        client_props(work.path(), "SCRAM-SHA-512", "alice", "wrong-password"),
        client_props(work.path(), "SCRAM-SHA-512", "mallory", ALICE_PASSWORD),
    ] {
        let err = java_refusal(&props, &kmirror, &topic);
        assert!(
            err.contains("SaslAuthenticationException") && err.contains(scram_refused),
            "Java client refused with {}:\n{err}",
            props.display()
        );
    }
    for props in [
        client_props(work.path(), "PLAIN", "bob", "wrong-password"),
        client_props(work.path(), "PLAIN", "mallory", "bob-secret"),
    ] {
        let err = java_refusal(&props, &kmirror, &topic);
        assert!(
            err.contains("SaslAuthenticationException")
                && err.contains("Authentication failed: Invalid username or password"),
            "Java client refused with {}:\n{err}",
            props.display()
        );
    }
    let said = run_python_refused(
        "librdkafka_client.py",
        &["consume", &kmirror, &topic, "0", "read_uncommitted"],
        Some(&librdkafka_login(
            "SCRAM-SHA-512",
            "alice",
            "wrong-password",
        )),
    );
    assert!(said.contains(scram_refused), "{said}");

    // Failover: producers log in and write to the partition kmirror now leads.
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", &topic]);
    let written = harness::with_client_config(&alice, || {
        harness::produce(
            &kmirror,
            &topic,
            0,
            20,
            &ProduceOpts {
                idempotent: true,
                seed: 3,
                ..ProduceOpts::default()
            },
        )
    });
    assert_eq!(written.offsets, (40..60).collect::<Vec<i64>>());
    let rd = run_python_with(
        "librdkafka_client.py",
        &["produce", &kmirror, &topic, "0", "10", "idempotent", "9"],
        Some(&librdkafka_login("PLAIN", "bob", "bob-secret")),
    );
    assert_eq!(
        rd.last().unwrap()["offsets"],
        serde_json::json!((60..70).collect::<Vec<i64>>()),
        "{rd:?}"
    );
    let all = harness::with_client_config(&bob, || {
        harness::consume(&kmirror, &topic, 0, 0, 70, Isolation::ReadUncommitted)
    });
    assert_eq!(all.len(), 70);
    assert_eq!(&all[..40], &source[..]);

    let log = serve.own_log_text();
    for secret in [ALICE_PASSWORD, "admin-secret", "bob-secret"] {
        assert!(!log.contains(secret), "kmirror logged a password");
    }
    assert!(log.contains("SASL authenticated"), "{log}");
}

// Goal (KIP-368): with connections.max.reauth.ms = 5 s a Java consumer that stays connected
// re-authenticates its connections several times and keeps receiving records. (The Java client
// re-authenticates at 85-95 % of the lifetime, counted from when it got the answer: with 2 s
// its last request could be 100 ms from the end, which a loaded 2-core machine overran.)
const REAUTH_MS: u64 = 5_000;

#[test]
fn a_java_consumer_keeps_reading_across_reauthentication() {
    let k = harness::shared();
    let topic = harness::unique_topic("sasl-reauth");
    k.create_topic(&topic, 1, &[]);
    harness::produce(&k.bootstrap(), &topic, 0, 10, &ProduceOpts::default());

    let work = tempfile::tempdir().unwrap();
    let (mut serve, admin, kmirror) =
        start_kmirror(work.path(), REAUTH_MS, "info,kmirror::serve::sasl=debug");
    mirror(&mut serve, &admin, work.path(), k, &topic);
    let alice = create_alice(work.path(), &kmirror);
    grant(
        work.path(),
        &kmirror,
        &["User:alice"],
        &["--operation", "Read", "--topic", &topic],
    );

    let mut consumer = harness::with_client_config(&alice, || {
        harness::tool_command(&consume_args(&kmirror, &topic, 30))
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    // Several re-authentications while the consumer waits for the records still to come.
    let reauths = || {
        serve
            .own_log_text()
            .matches("SASL re-authenticated")
            .count()
    };
    let start = Instant::now();
    while reauths() < 3 {
        assert!(
            consumer.try_wait().unwrap().is_none(),
            "the consumer ended before it got its records"
        );
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "no re-authentications within 90 s:\n{}",
            serve.own_log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    harness::produce(&k.bootstrap(), &topic, 0, 20, &ProduceOpts::default());
    let out = consumer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "consumer across re-authentication:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(lines, 30, "records the consumer got");
    // Only the consumer's own sessions count: the operator's kafka-configs.sh/kafka-acls.sh
    // connections (User:admin) may sit idle past the lifetime on a loaded machine.
    let log = serve.own_log_text();
    assert!(
        !log.contains("SASL session of User:alice expired"),
        "no session of the consumer expired: it re-authenticated in time\n{log}"
    );
}
