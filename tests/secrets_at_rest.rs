//! Goal (issue 12, credentials): every file kmirror writes that holds a secret is private
//! whatever the umask (files 0600, their directories 0700), the files it reads secrets from
//! must be private, and no secret reaches its log, `mirrors describe`/`list` or /metrics.
//!
//! Method: a dedicated Kafka broker with a SASL_SSL listener is the source; `kmirror serve` runs
//! under `umask 000` with an admin bearer token (`[admin] token_file`), a SASL_PLAINTEXT
//! `[kafka]` listener (SCRAM-SHA-512, and PLAIN users from a file) and debug logging. Its secrets:
//! the mirror's source password (the mirror definition lives in `__mirror_state`), the SCRAM
//! password of a user created with `kafka-configs.sh` against kmirror (stored salted in
//! `scram-credentials.json`), the PLAIN passwords and the token. First kmirror must refuse to
//! start with a users file others can read, naming the mode and not the passwords.

mod harness;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use harness::client_login::{write_secret, ClientLogin};
use harness::mirrors_cli::{cli_with, free_loopback_port, write_serving_config};
use harness::serve::{wait_all_mirrored, Launch, Serve};
use harness::{Kafka, ProduceOpts, SaslSslSetup};

const SOURCE_PASSWORD: &str = "source-bob-Zq81";
const SCRAM_PASSWORD: &str = "kmirror-alice-Wx55";
const ADMIN_PASSWORD: &str = "kmirror-admin-Pv27";
const TOKEN: &str = "7d2b46e8a1c3f5b74f1c0e9a9e0a2c4d";

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn secrets_are_private_files_and_never_shown() {
    let work = tempfile::tempdir().unwrap();
    let certs = harness::certs::make(work.path());
    let source = Kafka::start_sasl_ssl(&SaslSslSetup {
        keystore: &certs.broker_p12,
        keystore_password: certs.password,
        scram_users: &[("SCRAM-SHA-512", "bob", SOURCE_PASSWORD)],
        plain_users: &[],
        extra: &[],
    });
    let topic = "secret-topic";
    source.create_topic(topic, 1, &[]);
    source.produce(topic, 0, 30, &ProduceOpts::default());

    let token_file = work.path().join("admin.token");
    write_secret(&token_file, &format!("{TOKEN}\n"));
    let users = work.path().join("plain-users.toml");
    let users_text = format!("admin = \"{ADMIN_PASSWORD}\"\n");
    std::fs::write(&users, &users_text).unwrap();
    std::fs::set_permissions(&users, std::fs::Permissions::from_mode(0o644)).unwrap();
    let data = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(
        &config,
        &admin,
        Some("127.0.0.1:0"),
        &data,
        &format!("token_file = \"{}\"", token_file.display()),
    );
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[kafka.sasl]\nenabled_mechanisms = [\"SCRAM-SHA-512\", \"PLAIN\"]\n\
         plain_users_file = \"{}\"\n[kafka.authorizer]\nsuper_users = [\"User:admin\"]\n",
        users.display()
    ));
    std::fs::write(&config, text).unwrap();
    let launch = Launch::umask_000(vec![("KMIRROR_LOG".into(), "debug".into())]);

    // A users file others can read: kmirror does not start, and says why without the password.
    let log = work.path().join("serve.log");
    let mut refused = Serve::start_with(&config, work.path().join("refused.log"), &launch);
    let status = refused.wait_exit(Duration::from_secs(120));
    assert!(!status.success(), "kmirror started with a 0644 users file");
    let said = refused.own_log_text();
    assert!(said.contains("mode 0644"), "{said}");
    assert!(!said.contains(ADMIN_PASSWORD), "{said}");

    write_secret(&users, &users_text);
    let mut serve = Serve::start_with(&config, log, &launch);
    let token_arg = ["--admin-token-file", token_file.to_str().unwrap()];
    let cli = |args: &[&str]| {
        let o = cli_with(&admin, &token_arg, args);
        assert!(o.ok, "{args:?} failed: {}", o.stderr);
        o.stdout
    };
    serve.wait_for("the admin API", Duration::from_secs(120), || {
        cli_with(&admin, &token_arg, &["list"]).ok
    });
    let kmirror = serve.kafka_listener();

    // The mirror's source credentials.
    let props = ClientLogin::sasl("SCRAM-SHA-512", "bob", SOURCE_PASSWORD)
        .over_tls(&certs.ca_pem)
        .java_properties(work.path(), "source");
    let text = std::fs::read_to_string(&props).unwrap();
    std::fs::write(
        &props,
        format!("bootstrap.servers={}\n{text}", source.secure_bootstrap()),
    )
    .unwrap();
    let props = props.to_str().unwrap();
    cli(&["create", "--mirror", "sec", "--mirror-config", props]);
    cli(&["start", "--mirror", "sec", "--topics", topic]);
    wait_all_mirrored(&mut serve, &source.mirror_pairs(topic, 1, &data));

    // A SCRAM user of kmirror's own, made by the PLAIN super user.
    let operator = ClientLogin::sasl("PLAIN", "admin", ADMIN_PASSWORD)
        .java_properties(work.path(), "operator");
    harness::add_scram_user(
        &kmirror,
        &operator,
        "SCRAM-SHA-512",
        "alice",
        SCRAM_PASSWORD,
    );

    // Files: the credential store and every file of the mirror definitions' log.
    let store = data.join("scram-credentials.json");
    assert_eq!(mode(&store), 0o600, "{}", store.display());
    assert!(!std::fs::read_to_string(&store)
        .unwrap()
        .contains(SCRAM_PASSWORD));
    let state = data.join("__mirror_state-0");
    assert_state_files_private(&state);

    // Output: describe (text and JSON), list, /metrics, and the debug log.
    let metrics = ureq::get(&format!("http://{admin}/metrics"))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(metrics.contains("kmirror_"), "{metrics}");
    let shown = [
        ("describe", cli(&["describe", "--mirror", "sec"])),
        (
            "describe --json",
            cli(&["describe", "--mirror", "sec", "--json"]),
        ),
        ("list", cli(&["list", "--json"])),
        ("/metrics", metrics),
        ("log", serve.own_log_text()),
    ];
    assert!(shown[1].1.contains(topic), "{}", shown[1].1);
    for (what, text) in &shown {
        for secret in [SOURCE_PASSWORD, SCRAM_PASSWORD, ADMIN_PASSWORD, TOKEN] {
            assert!(!text.contains(secret), "{what} shows a secret:\n{text}");
        }
    }
    serve.sigterm_and_wait();
    // The clean close wrote a producer-state snapshot under umask 000: 0600 as well.
    assert_state_files_private(&state);
}

/// `dir` is 0700 and every file in it 0600.
fn assert_state_files_private(dir: &std::path::Path) {
    assert_eq!(mode(dir), 0o700, "{}", dir.display());
    let mut files = 0;
    for f in std::fs::read_dir(dir).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            files += 1;
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
    }
    assert!(files > 0, "{} holds no file", dir.display());
}
