//! Goal: kmirror's named listeners serve stock clients over TLS and mutual TLS as a Kafka
//! broker does: the Java consumer and librdkafka read the mirrored topic through `SSL`
//! listeners and get exactly the records the plaintext (sendfile) listener gives; a client
//! certificate becomes the principal in Kafka's RFC 2253 form (`User:CN=alice,OU=eng,O=acme,
//! C=US`), counted per listener and principal in /metrics; a client without a certificate, or
//! with one from a CA the truststore does not hold, gets no answer on the `required` listener.
//!
//! Method: one `kmirror serve` (static mode) mirrors a topic of the shared broker and has three
//! listeners: PLAIN (PLAINTEXT), TLS (SSL, no client auth) and MTLS (SSL, ssl_client_auth =
//! required). Certificates are made with the openssl CLI. Each client bootstraps on one
//! listener only, so it also proves Metadata advertises that listener's address (a TLS client
//! sent to the plaintext port could not read anything).
//!
//! Who is let in: the MTLS listener authenticates, so allow.everyone.if.no.acl.found is false
//! (the default). The operator's certificate (`admin_principal`) is the one super user; with it
//! `kafka-acls.sh` over mTLS lets User:ANONYMOUS (PLAIN and TLS clients) and the client
//! certificate's principal READ the topic and librdkafka's group, nothing else.

mod harness;
mod mirror_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use harness::certs::PemCerts;
use harness::client_login::ClientLogin;
use harness::consume_to_end_configured;
use harness::mirrors_cli::free_loopback_port;
use harness::python_clients::{librdkafka, records};
use harness::serve::{scrape_metrics, wait_mirrored, Serve};
use harness::{Isolation, ProduceOpts};
use mirror_support::write_config;

const RECORDS: usize = 2_000;

struct Rig {
    work: tempfile::TempDir,
    _serve: Mutex<Serve>,
    certs: PemCerts,
    plain: String,
    tls: String,
    mtls: String,
    metrics: String,
    topic: String,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let k = harness::shared();
        let topic = harness::unique_topic("serve-tls");
        k.create_topic(&topic, 1, &[]);
        k.produce(&topic, 0, RECORDS, &ProduceOpts::default());
        let work = tempfile::tempdir().unwrap();
        let certs = harness::certs::make_pem(work.path());
        let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[&topic]);
        let metrics = format!("127.0.0.1:{}", free_loopback_port());
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "[metrics]\nlisten = \"{metrics}\"\n[kafka]\n[[kafka.listeners]]\nname = \"PLAIN\"\n\
             listen = \"127.0.0.1:0\"\nsecurity_protocol = \"PLAINTEXT\"\n{}{}\
             [kafka.authorizer]\nsuper_users = [\"{}\"]\n",
            certs.listener("TLS", "SSL", "none"),
            certs.listener("MTLS", "SSL", "required"),
            certs.admin_principal
        ));
        std::fs::write(&config, text).unwrap();
        // Shared in a static: killed when the test process exits.
        let mut serve = Serve::start_until_exit(&config, work.path().join("serve.log"));
        let plain = serve.kafka_listener_named("PLAIN");
        let tls_addr = serve.kafka_listener_named("TLS");
        let mtls = serve.kafka_listener_named("MTLS");
        let operator = ClientLogin::tls(&certs.ca, Some((&certs.admin_cert, &certs.admin_key)))
            .java_properties(work.path(), "operator");
        harness::kafka_acls_allow(
            &mtls,
            &operator,
            &["User:ANONYMOUS", certs.client_principal],
            &[
                "--operation",
                "Read",
                "--topic",
                &topic,
                "--group",
                "librdkafka-assign",
            ],
        );
        wait_mirrored(
            &mut serve,
            &k.partition_dir(&topic, 0),
            &data_dir.join(format!("{topic}-0")),
        );
        Rig {
            work,
            _serve: Mutex::new(serve),
            certs,
            plain,
            tls: tls_addr,
            mtls,
            metrics,
            topic,
        }
    })
}

/// A Java client properties file for an SSL listener, with the client certificate when
/// `with_cert`.
fn java_properties(
    dir: &Path,
    name: &str,
    certs: &PemCerts,
    with_cert: bool,
) -> std::path::PathBuf {
    let cert = with_cert.then_some((certs.client_cert.as_path(), certs.client_key.as_path()));
    ClientLogin::tls(&certs.ca, cert).java_properties(dir, name)
}

/// The value of the series of `name` whose labels contain all of `labels`; 0 when absent.
fn metric(addr: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape_metrics(addr)
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name}_total{{"))
        })
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Goal: the Java consumer reads every record over TLS (anonymous) and over mTLS (as the
/// certificate's principal), identical to what the plaintext listener serves with sendfile.
#[test]
fn java_consumer_reads_over_tls_and_mtls_as_its_certificate_principal() {
    let r = rig();
    let plain = harness::consume_to_end(&r.plain, &r.topic, 0, Isolation::ReadUncommitted);
    assert_eq!(plain.len(), RECORDS);

    let anon = java_properties(r.work.path(), "java-tls", &r.certs, false);
    let over_tls = consume_to_end_configured(&r.tls, &r.topic, 0, &anon);
    assert_eq!(
        over_tls, plain,
        "TLS listener served other records than PLAINTEXT"
    );

    let before = metric(
        &r.metrics,
        "kmirror_endpoint_tls_connections",
        &[
            ("listener", "MTLS"),
            ("principal", r.certs.client_principal),
        ],
    );
    let with_cert = java_properties(r.work.path(), "java-mtls", &r.certs, true);
    let over_mtls = consume_to_end_configured(&r.mtls, &r.topic, 0, &with_cert);
    assert_eq!(
        over_mtls, plain,
        "mTLS listener served other records than PLAINTEXT"
    );
    let after = metric(
        &r.metrics,
        "kmirror_endpoint_tls_connections",
        &[
            ("listener", "MTLS"),
            ("principal", r.certs.client_principal),
        ],
    );
    assert!(
        after > before,
        "no mTLS connection counted as {} ({before} -> {after})",
        r.certs.client_principal
    );
    assert!(
        metric(
            &r.metrics,
            "kmirror_endpoint_tls_connections",
            &[("listener", "TLS"), ("principal", "User:ANONYMOUS"),]
        ) > 0.0,
        "the TLS listener's clients have no certificate: User:ANONYMOUS"
    );
}

/// Goal: librdkafka (confluent-kafka) reads every record over mTLS with its certificate.
#[test]
fn librdkafka_consumer_reads_over_mtls() {
    let r = rig();
    let plain = harness::consume_to_end(&r.plain, &r.topic, 0, Isolation::ReadUncommitted);
    let config = ClientLogin::tls(
        &r.certs.ca,
        Some((&r.certs.client_cert, &r.certs.client_key)),
    )
    .librdkafka()
    .to_string();
    let before = metric(
        &r.metrics,
        "kmirror_endpoint_tls_connections",
        &[
            ("listener", "MTLS"),
            ("principal", r.certs.client_principal),
        ],
    );
    let got = records(&librdkafka(&[
        "consume",
        &r.mtls,
        &r.topic,
        "0",
        "read_uncommitted",
        &config,
    ]));
    assert_eq!(got.len(), RECORDS);
    let same: Vec<_> = got.iter().map(|c| (c.offset, c.value.clone())).collect();
    let want: Vec<_> = plain.iter().map(|c| (c.offset, c.value.clone())).collect();
    assert_eq!(same, want, "librdkafka over mTLS read other records");
    assert!(
        metric(
            &r.metrics,
            "kmirror_endpoint_tls_connections",
            &[
                ("listener", "MTLS"),
                ("principal", r.certs.client_principal),
            ]
        ) > before
    );
}

/// ApiVersions v0, correlation id 1.
const API_VERSIONS: [u8; 14] = [0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0, 0];

/// Connects to `addr` with rustls trusting the test CA, presenting `cert`/`key` if given, sends
/// ApiVersions and says whether a whole answer came back.
fn answered_over_tls(addr: &str, ca: &Path, client: Option<(&Path, &Path)>) -> bool {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .map(|c| c.unwrap())
                    .collect(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    if tls.write_all(&API_VERSIONS).is_err() {
        return false;
    }
    let mut len = [0u8; 4];
    if tls.read_exact(&mut len).is_err() {
        return false;
    }
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    tls.read_exact(&mut body).is_ok() && body[..4] == [0, 0, 0, 1]
}

/// Goal: on the `required` listener a certificate from another CA, or none, is refused in the
/// handshake (counted in /metrics) while the trusted one is answered; the `none` listener
/// answers a client without a certificate.
#[test]
fn untrusted_or_missing_client_certificates_are_refused() {
    let r = rig();
    let c = &r.certs;
    let failed = || {
        metric(
            &r.metrics,
            "kmirror_endpoint_tls_handshakes_failed",
            &[("listener", "MTLS")],
        )
    };
    let before = failed();
    assert!(
        answered_over_tls(&r.mtls, &c.ca, Some((&c.client_cert, &c.client_key))),
        "the trusted client certificate must be answered"
    );
    assert!(
        !answered_over_tls(&r.mtls, &c.ca, Some((&c.stranger_cert, &c.stranger_key))),
        "a certificate from another CA must be refused"
    );
    assert!(
        !answered_over_tls(&r.mtls, &c.ca, None),
        "no certificate on a required listener must be refused"
    );
    assert!(answered_over_tls(&r.tls, &c.ca, None));
    let after = failed();
    assert!(
        after >= before + 2.0,
        "both refusals must be counted ({before} -> {after})"
    );
}
