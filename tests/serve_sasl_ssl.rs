//! Goal: kmirror's listeners as a security review wants them, with stock clients only (the Java
//! producer, consumer and admin client through KafkaTool and Kafka's kafka-configs.sh /
//! kafka-acls.sh, and librdkafka through confluent-kafka):
//! - over SASL_SSL with SCRAM-SHA-512 (a user made with `kafka-configs.sh --add-config
//!   'SCRAM-SHA-512=[password=…]'` against kmirror) the Java and librdkafka consumers read a
//!   mirrored partition exactly as the source has it, the Java admin client lists its offsets,
//!   and after failover the Java and librdkafka producers write to it; a wrong password and an
//!   unknown user are refused with SASL_AUTHENTICATION_FAILED as each client reports it;
//! - over mTLS (`ssl_client_auth = "required"`) the same clients with a certificate of the
//!   trusted CA do the same; without a certificate, or with one of another CA, they are refused;
//! - under the default authorizer (allow.everyone.if.no.acl.found false once a listener
//!   authenticates, as Kafka's StandardAuthorizer) an authenticated user with no ACL gets
//!   TOPIC_AUTHORIZATION_FAILED (Java and librdkafka), and so does User:ANONYMOUS on the
//!   PLAINTEXT listener next to them (Kafka's rule: the default holds for every listener).
//!
//! Method: one `kmirror serve` (control plane) with three listeners: PLAIN (PLAINTEXT), SASL
//! (SASL_SSL, SCRAM-SHA-512 and PLAIN) and MTLS (SSL, client auth required); certificates made
//! with the openssl CLI. It mirrors two topics of the shared broker, one per test, and each test
//! fails its own topic over with `mirrors stop`. Each test runs its Java client checks in one
//! JVM (`harness::with_tool_session`: the same KafkaTool commands, each with its own client and
//! login, in sequence) instead of a JVM per check, which made this the slowest CI test.
//!
//! Who is let in: User:admin (PLAIN, from the users file) is the one super user. It creates the
//! SCRAM users alice (granted) and bob (no ACL), and grants alice and the client certificate's
//! principal READ and WRITE on both topics and READ on librdkafka's group; nobody else.

mod harness;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use harness::certs::PemCerts;
use harness::client_login::ClientLogin;
use harness::mirrors_cli::write_serving_config;
use harness::mirrors_cli::{cli_ok, create_mirror, free_loopback_port, wait_admin};
use harness::python_clients::{records, run_python_refused, run_python_with};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{ConsumedRecord, Isolation, ProduceOpts};

const RECORDS: usize = 40;
const ALICE_PASSWORD: &str = "alice-scram-secret";
const BOB_PASSWORD: &str = "bob-scram-secret";
const PLAIN_USERS: &str = "admin = \"admin-plain-secret\"\n";
/// librdkafka's consumer names a group even when it only assigns; it reads no offsets.
const RDKAFKA_GROUP: &str = "librdkafka-assign";
/// Kafka's text for a refused SCRAM login, which both client families pass on.
const SCRAM_REFUSED: &str = "Authentication failed during authentication due to invalid \
                             credentials with SASL mechanism SCRAM-SHA-512";

struct Rig {
    work: tempfile::TempDir,
    _serve: Mutex<Serve>,
    admin: String,
    certs: PemCerts,
    plain: String,
    sasl: String,
    mtls: String,
    /// The topic of the SASL_SSL test and the one of the mTLS test.
    sasl_topic: String,
    mtls_topic: String,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let k = harness::shared();
        let sasl_topic = harness::unique_topic("sasl-ssl");
        let mtls_topic = harness::unique_topic("mtls");
        for t in [&sasl_topic, &mtls_topic] {
            k.create_topic(t, 1, &[]);
            k.produce(t, 0, RECORDS, &ProduceOpts::default());
        }
        let work = tempfile::tempdir().unwrap();
        let certs = harness::certs::make_pem(work.path());
        let users = work.path().join("plain-users.toml");
        harness::client_login::write_secret(&users, PLAIN_USERS);
        let config = work.path().join("kmirror.toml");
        let admin = format!("127.0.0.1:{}", free_loopback_port());
        let data = work.path().join("data");
        write_serving_config(&config, &admin, None, &data, "");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "[kafka]\n[[kafka.listeners]]\nname = \"PLAIN\"\nlisten = \"127.0.0.1:0\"\n\
             security_protocol = \"PLAINTEXT\"\n{}{}\
             [kafka.sasl]\nenabled_mechanisms = [\"SCRAM-SHA-512\", \"PLAIN\"]\n\
             plain_users_file = \"{}\"\n\
             [kafka.authorizer]\nsuper_users = [\"User:admin\"]\n",
            certs.listener("SASL", "SASL_SSL", "none"),
            certs.listener("MTLS", "SSL", "required"),
            users.display()
        ));
        std::fs::write(&config, text).unwrap();
        // Shared by both tests in a static: killed when the test process exits.
        let mut serve = Serve::start_until_exit(&config, work.path().join("serve.log"));
        wait_admin(&mut serve, &admin);
        let plain = serve.kafka_listener_named("PLAIN");
        let sasl = serve.kafka_listener_named("SASL");
        let mtls = serve.kafka_listener_named("MTLS");
        create_mirror(&admin, work.path(), "m", &k.bootstrap(), "");
        let both = format!("{sasl_topic},{mtls_topic}");
        cli_ok(&admin, &["start", "--mirror", "m", "--topics", &both]);
        let pairs: Vec<_> = [&sasl_topic, &mtls_topic]
            .iter()
            .flat_map(|t| k.mirror_pairs(t, 1, &data))
            .collect();
        wait_all_mirrored(&mut serve, &pairs);

        // The operator, over SASL_SSL as the PLAIN super user: SCRAM users and ACLs.
        let operator = ClientLogin::sasl("PLAIN", "admin", "admin-plain-secret")
            .over_tls(&certs.ca)
            .java_properties(work.path(), "operator");
        for (user, password) in [("alice", ALICE_PASSWORD), ("bob", BOB_PASSWORD)] {
            harness::add_scram_user(&sasl, &operator, "SCRAM-SHA-512", user, password);
        }
        let granted = ["User:alice", certs.client_principal];
        let grant =
            |resource: &[&str]| harness::kafka_acls_allow(&sasl, &operator, &granted, resource);
        grant(&[
            "--operation",
            "Read",
            "--topic",
            &sasl_topic,
            "--topic",
            &mtls_topic,
            "--group",
            RDKAFKA_GROUP,
        ]);
        grant(&[
            "--operation",
            "Write",
            "--topic",
            &sasl_topic,
            "--topic",
            &mtls_topic,
        ]);
        Rig {
            work,
            _serve: Mutex::new(serve),
            admin,
            certs,
            plain,
            sasl,
            mtls,
            sasl_topic,
            mtls_topic,
        }
    })
}

impl Rig {
    fn java(&self, login: ClientLogin<'_>, name: &str) -> PathBuf {
        login.java_properties(self.work.path(), name)
    }

    fn scram(&self, user: &'static str, password: &'static str) -> ClientLogin<'_> {
        ClientLogin::sasl("SCRAM-SHA-512", user, password).over_tls(&self.certs.ca)
    }

    fn client_cert(&self) -> ClientLogin<'_> {
        let c = &self.certs;
        ClientLogin::tls(&c.ca, Some((&c.client_cert, &c.client_key)))
    }
}

fn java_records(props: &Path, bootstrap: &str, topic: &str, n: usize) -> Vec<ConsumedRecord> {
    harness::with_client_config(props, || {
        harness::consume(bootstrap, topic, 0, 0, n, Isolation::ReadUncommitted)
    })
}

/// What librdkafka's `consume` read of `topic`-0 through `bootstrap` logged in with `login`.
fn librdkafka_records(
    bootstrap: &str,
    topic: &str,
    login: &serde_json::Value,
) -> Vec<ConsumedRecord> {
    records(&run_python_with(
        "librdkafka_client.py",
        &["consume", bootstrap, topic, "0", "read_uncommitted"],
        Some(login),
    ))
}

/// What librdkafka's `consume` printed when kmirror refused `login`.
fn librdkafka_refusal(bootstrap: &str, topic: &str, login: &serde_json::Value) -> String {
    run_python_refused(
        "librdkafka_client.py",
        &["consume", bootstrap, topic, "0", "read_uncommitted"],
        Some(login),
    )
}

/// After failover of `topic`: a Java idempotent producer writes 20 records (offsets 40..60) and
/// a librdkafka idempotent producer 10 more (60..70) through `bootstrap`, logged in as
/// `java`/`rdkafka`; then
/// the Java consumer reads all 70, the first 40 being the mirrored ones.
fn produce_after_failover(
    r: &Rig,
    bootstrap: &str,
    topic: &str,
    java: &Path,
    rdkafka: &serde_json::Value,
    mirrored: &[ConsumedRecord],
) {
    cli_ok(&r.admin, &["stop", "--mirror", "m", "--topics", topic]);
    let written = harness::with_client_config(java, || {
        harness::produce(
            bootstrap,
            topic,
            0,
            20,
            &ProduceOpts {
                idempotent: true,
                seed: 5,
                ..ProduceOpts::default()
            },
        )
    });
    assert_eq!(written.offsets, (40..60).collect::<Vec<i64>>());
    let rd = run_python_with(
        "librdkafka_client.py",
        &["produce", bootstrap, topic, "0", "10", "idempotent", "7"],
        Some(rdkafka),
    );
    assert_eq!(
        rd.last().unwrap()["offsets"],
        serde_json::json!((60..70).collect::<Vec<i64>>()),
        "{rd:?}"
    );
    let all = java_records(java, bootstrap, topic, 70);
    assert_eq!(all.len(), 70);
    assert_eq!(&all[..RECORDS], mirrored);
}

// Goal: SCRAM-SHA-512 over SASL_SSL for Java producer/consumer/admin and librdkafka
// producer/consumer; bad logins refused with SASL_AUTHENTICATION_FAILED; no ACL, no access.
#[test]
fn sasl_ssl_scram_clients_work_and_bad_logins_and_unacled_users_are_refused() {
    harness::with_tool_session(sasl_ssl_checks)
}

fn sasl_ssl_checks() {
    let r = rig();
    let k = harness::shared();
    let topic = &r.sasl_topic;
    let source = harness::consume(
        &k.bootstrap(),
        topic,
        0,
        0,
        RECORDS,
        Isolation::ReadUncommitted,
    );
    assert_eq!(source.len(), RECORDS);

    let alice = r.java(r.scram("alice", ALICE_PASSWORD), "sasl-alice");
    assert_eq!(java_records(&alice, &r.sasl, topic, RECORDS), source);
    let offsets = harness::with_client_config(&alice, || harness::offsets(&r.sasl, topic, 0));
    assert_eq!(
        (offsets.log_start_offset, offsets.log_end_offset),
        (0, RECORDS as i64),
        "Java admin client over SASL_SSL"
    );
    let rd_alice = r.scram("alice", ALICE_PASSWORD).librdkafka();
    let rd_source = records(&run_python_with(
        "librdkafka_client.py",
        &["consume", &k.bootstrap(), topic, "0", "read_uncommitted"],
        None,
    ));
    assert_eq!(librdkafka_records(&r.sasl, topic, &rd_alice), rd_source);

    // Wrong password and unknown user.
    for (user, password) in [
        ("alice", "not-alices-password"),
        ("mallory", ALICE_PASSWORD),
    ] {
        let props = r.java(r.scram(user, password), &format!("sasl-{user}-{password}"));
        let err = harness::with_client_config(&props, || harness::try_consume(&r.sasl, topic, 1))
            .expect_err("a refused login consumed records");
        assert!(
            err.contains("SaslAuthenticationException") && err.contains(SCRAM_REFUSED),
            "Java client as {user}:\n{err}"
        );
        let said = librdkafka_refusal(&r.sasl, topic, &r.scram(user, password).librdkafka());
        assert!(
            said.contains(SCRAM_REFUSED),
            "librdkafka as {user}:\n{said}"
        );
    }

    // bob logs in but has no ACL: the default (false with authenticated listeners) refuses.
    let bob = r.java(r.scram("bob", BOB_PASSWORD), "sasl-bob");
    let err = harness::with_client_config(&bob, || harness::try_consume(&r.sasl, topic, 1))
        .expect_err("bob has no ACL");
    assert!(err.contains("TopicAuthorizationException"), "{err}");
    // User:ANONYMOUS on the PLAINTEXT listener has none either.
    let err = harness::try_consume(&r.plain, topic, 1).expect_err("ANONYMOUS has no ACL");
    assert!(err.contains("TopicAuthorizationException"), "{err}");

    produce_after_failover(r, &r.sasl, topic, &alice, &rd_alice, &source);
    let refused = run_python_with(
        "librdkafka_client.py",
        &["produce-refused", &r.sasl, topic, "0"],
        Some(&r.scram("bob", BOB_PASSWORD).librdkafka()),
    );
    assert_eq!(
        refused[0]["error"], "TOPIC_AUTHORIZATION_FAILED",
        "{refused:?}"
    );
    assert_eq!(librdkafka_records(&r.sasl, topic, &rd_alice).len(), 70);
}

// Goal: mTLS with `ssl_client_auth = required` for Java producer/consumer/admin and librdkafka
// producer/consumer with a certificate of the trusted CA; without one, or with another CA's,
// both client families are refused.
#[test]
fn mtls_clients_with_a_trusted_certificate_work_and_others_are_refused() {
    harness::with_tool_session(mtls_checks)
}

fn mtls_checks() {
    let r = rig();
    let k = harness::shared();
    let c = &r.certs;
    let topic = &r.mtls_topic;
    let source = harness::consume(
        &k.bootstrap(),
        topic,
        0,
        0,
        RECORDS,
        Isolation::ReadUncommitted,
    );

    let java = r.java(r.client_cert(), "mtls-alice");
    assert_eq!(java_records(&java, &r.mtls, topic, RECORDS), source);
    let offsets = harness::with_client_config(&java, || harness::offsets(&r.mtls, topic, 0));
    assert_eq!(
        (offsets.log_start_offset, offsets.log_end_offset),
        (0, RECORDS as i64),
        "Java admin client over mTLS"
    );
    let rdkafka = r.client_cert().librdkafka();
    let rd_source = records(&run_python_with(
        "librdkafka_client.py",
        &["consume", &k.bootstrap(), topic, "0", "read_uncommitted"],
        None,
    ));
    assert_eq!(librdkafka_records(&r.mtls, topic, &rdkafka), rd_source);

    for (name, login) in [
        ("no-cert", ClientLogin::tls(&c.ca, None)),
        (
            "stranger",
            ClientLogin::tls(&c.ca, Some((&c.stranger_cert, &c.stranger_key))),
        ),
    ] {
        let props = r.java(login, &format!("mtls-{name}"));
        let err = harness::with_client_config(&props, || harness::try_consume(&r.mtls, topic, 1))
            .expect_err("a client kmirror cannot authenticate consumed records");
        assert!(
            err.contains("SslAuthenticationException"),
            "Java client with {name}:\n{err}"
        );
        // librdkafka retries a refused TLS connection for ever; its error callback says why:
        // kmirror's TLS alert. (It reported "certificate required" for the stranger's
        // certificate too: kmirror's CertificateRequest names only the trusted CA, and OpenSSL
        // did not offer a certificate of another.)
        let said = run_python_with(
            "librdkafka_client.py",
            &["connect-refused", &r.mtls],
            Some(&login.librdkafka()),
        )
        .remove(0);
        assert_eq!(
            said["error"], "_TRANSPORT",
            "librdkafka with {name}: {said}"
        );
        assert!(
            said["message"]
                .as_str()
                .unwrap()
                .contains("alert certificate required"),
            "librdkafka with {name}: {said}"
        );
    }

    produce_after_failover(r, &r.mtls, topic, &java, &rdkafka, &source);
    assert_eq!(librdkafka_records(&r.mtls, topic, &rdkafka).len(), 70);
}
