//! Goal: the DR endpoint lets in exactly whom the source let in (issue 12 item 4). ACLs made
//! on a source running Kafka's StandardAuthorizer with Kafka's own `kafka-acls.sh` are synced
//! to kmirror by the mirror (`mirror.acls.*`), follow removals on the source, never remove an
//! ACL made on kmirror itself, and stay in force after failover and a kill -9 restart, where
//! stock Java clients over SASL PLAIN get in or get Kafka's TOPIC_AUTHORIZATION_FAILED. A
//! source without an authorizer is reported in `describe` and mirroring carries on.
//!
//! Method: a dedicated 4.1.1 KRaft source with StandardAuthorizer (`super.users` is
//! User:ANONYMOUS: the principal of its PLAINTEXT listener, which the broker itself and the
//! test tools use) and a SASL_SSL listener where the mirror logs in with SCRAM-SHA-512 as
//! User:mirror, which is no super user: its own ACLs on the source let it mirror T, and
//! DescribeAcls is refused (and shown) until it may DESCRIBE the cluster. kmirror serves a SASL_PLAINTEXT listener with PLAIN users
//! admin (a super user), alice and bob, and `allow.everyone.if.no.acl.found = false` set
//! explicitly (the test holds under either default). Every ACL is set explicitly.

mod harness;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::mirrors_cli::{
    cli_ok, create_mirror, describe_rows, free_loopback_port, serve_admin_with_listener,
    wait_admin, write_serving_config,
};
use harness::serve::{wait_all_mirrored, Serve};
use harness::{acl_lines, kafka_acls, Kafka, ProduceOpts, SaslSslSetup};

const RECORDS: usize = 20;
/// Failure guard for a sync round to show up, not a performance claim (rounds run every
/// 500 ms here).
const SYNC_LIMIT: Duration = Duration::from_secs(60);
const MIRROR_PROPS: &str = "mirror.acls.interval.ms=500\n";

fn s(x: &str) -> String {
    x.to_string()
}

/// kmirror with `[admin]` and a SASL_PLAINTEXT (PLAIN) `[kafka]` listener that denies what no
/// ACL allows; returns it, the admin address, the listener and the config path.
fn start_kmirror(work: &Path) -> (Serve, String, String, PathBuf) {
    let users = work.join("plain-users.toml");
    std::fs::write(
        &users,
        "admin = \"admin-secret\"\nalice = \"alice-secret\"\nbob = \"bob-secret\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&users, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = work.join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &work.join("data"), "");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[kafka.sasl]\nenabled_mechanisms = [\"PLAIN\"]\nplain_users_file = \"{}\"\n\
         [kafka.authorizer]\nsuper_users = [\"User:admin\"]\n\
         allow_everyone_if_no_acl_found = false\n",
        users.display()
    ));
    std::fs::write(&config, text).unwrap();
    let mut serve = Serve::start(&config, work.join("serve.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    (serve, admin, kmirror, config)
}

/// A Java client properties file logging in with PLAIN as `user`.
fn login(work: &Path, user: &str) -> PathBuf {
    let path = work.join(format!("{user}.properties"));
    std::fs::write(
        &path,
        format!(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n\
             sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \
             username=\"{user}\" password=\"{user}-secret\";\n"
        ),
    )
    .unwrap();
    path
}

/// `kafka-acls.sh ACTION --allow-principal P --operation OP... RESOURCE NAME` against
/// `bootstrap` (`login`: a client properties file for an authenticating listener).
fn allow(
    bootstrap: &str,
    login: Option<&Path>,
    action: &str,
    principal: &str,
    ops: &[&str],
    resource: &str,
    name: &str,
) {
    let mut args: Vec<&str> = Vec::new();
    if let Some(l) = login {
        args.extend(["--command-config", l.to_str().unwrap()]);
    }
    args.push(action);
    if action == "--remove" {
        args.push("--force");
    }
    args.extend(["--allow-principal", principal]);
    for op in ops {
        args.extend(["--operation", op]);
    }
    args.extend([resource, name]);
    kafka_acls(bootstrap, &args);
}

/// `kafka-acls.sh --list` against kmirror as the super user, as sorted ACL lines.
fn kmirror_acls(kmirror: &str, admin_login: &Path) -> Vec<String> {
    let cfg = admin_login.to_str().unwrap();
    acl_lines(&kafka_acls(kmirror, &["--command-config", cfg, "--list"]))
}

/// The mirror's `describe --json` ACL sync status (the same on every row).
fn acl_sync(admin: &str) -> serde_json::Value {
    let rows = describe_rows(admin, "m");
    assert!(!rows.is_empty(), "describe shows no partition of m");
    rows[0]["aclSync"].clone()
}

/// Waits until the mirror's ACL sync status satisfies `done`; returns it.
fn wait_sync(
    serve: &mut Serve,
    admin: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    serve.poll(
        what,
        (SYNC_LIMIT, Duration::from_millis(200)),
        |_| acl_sync(admin),
        done,
    )
}

fn principals(lines: &[String]) -> Vec<String> {
    let mut p: Vec<String> = lines
        .iter()
        .filter_map(|l| {
            let rest = l.strip_prefix("(principal=")?;
            Some(rest.split(',').next()?.to_string())
        })
        .collect();
    p.dedup();
    p
}

/// The Java consumer (assigned partition 0, no group) logged in with `props`.
fn java_consume(props: &Path, kmirror: &str, topic: &str, max: usize) -> Result<usize, String> {
    harness::with_client_config(props, || harness::try_consume(kmirror, topic, max))
}

/// The Java producer as the client of `props`, 5 records to partition 0: stderr on failure.
fn java_produce(props: &Path, kmirror: &str, topic: &str) -> Result<(), String> {
    let out = harness::with_client_config(props, || {
        harness::run_tool_unchecked(&[
            s("produce"),
            s("--bootstrap"),
            s(kmirror),
            s("--topic"),
            s(topic),
            s("--partition"),
            s("0"),
            s("--count"),
            s("5"),
        ])
    });
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn source_acls_are_synced_followed_kept_after_failover_and_enforced_on_java_clients() {
    let work = tempfile::tempdir().unwrap();
    let certs = harness::certs::make(work.path());
    let source = Kafka::start_sasl_ssl(&SaslSslSetup {
        keystore: &certs.broker_p12,
        keystore_password: certs.password,
        scram_users: &[("SCRAM-SHA-512", "mirror", "mirror-secret")],
        plain_users: &[],
        extra: &[
            (
                "authorizer.class.name",
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            ),
            ("super.users", "User:ANONYMOUS"),
            ("allow.everyone.if.no.acl.found", "false"),
        ],
    });
    let t = harness::unique_topic("aclsync-t");
    let group = format!("{t}-g");
    let other = format!("{t}-not-mirrored");
    source.create_topic(&t, 1, &[]);
    source.produce(&t, 0, RECORDS, &ProduceOpts::default());
    let src = source.bootstrap();
    allow(
        &src,
        None,
        "--add",
        "User:alice",
        &["Read", "Write", "Describe"],
        "--topic",
        &t,
    );
    allow(
        &src,
        None,
        "--add",
        "User:alice",
        &["Read"],
        "--group",
        &group,
    );
    // Removed on the source later; and one on a topic the mirror does not mirror.
    allow(&src, None, "--add", "User:dave", &["Read"], "--topic", &t);
    allow(
        &src,
        None,
        "--add",
        "User:carol",
        &["Read"],
        "--topic",
        &other,
    );
    // Patterns that apply to T (a prefix of its name, the wildcard) and one that does not.
    let prefixed = |user: &str, prefix: &str| {
        let args = [
            "--add",
            "--allow-principal",
            user,
            "--operation",
            "Describe",
        ];
        let pattern = ["--topic", prefix, "--resource-pattern-type", "prefixed"];
        kafka_acls(&src, &[&args[..], &pattern[..]].concat());
    };
    // The mirror's own principal on the source: enough to mirror T, not yet to list ACLs.
    let mirror_ops = ["Read", "Describe", "DescribeConfigs"];
    allow(
        &src,
        None,
        "--add",
        "User:mirror",
        &mirror_ops,
        "--topic",
        &t,
    );
    prefixed("User:gina", &t[..t.len() - 2]);
    prefixed("User:ivan", "zz-not-a-prefix-of-t");
    allow(
        &src,
        None,
        "--add",
        "User:hank",
        &["Describe"],
        "--topic",
        "*",
    );
    let on_source = acl_lines(&kafka_acls(&src, &["--list"]));
    assert_eq!(on_source.len(), 12, "{on_source:#?}");

    let (mut serve, admin, kmirror, config) = start_kmirror(work.path());
    let admin_login = login(work.path(), "admin");
    let alice = login(work.path(), "alice");
    let bob = login(work.path(), "bob");
    // The mirror logs in to the source's SASL_SSL listener as User:mirror (not a super user).
    let mirror_login = format!(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n\
         sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
         username=\"mirror\" password=\"mirror-secret\";\n\
         ssl.truststore.type=PEM\nssl.truststore.location={}\n{MIRROR_PROPS}",
        certs.ca_pem.display()
    );
    let secure = source.secure_bootstrap();
    create_mirror(&admin, work.path(), "m", &secure, &mirror_login);
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &t]);
    let data = work.path().join("data");
    wait_all_mirrored(&mut serve, &source.mirror_pairs(&t, 1, &data));

    // DescribeAcls goes out with the mirror's credentials: refused until User:mirror may
    // DESCRIBE the source cluster; the error is shown and mirroring is not affected.
    let st = wait_sync(&mut serve, &admin, "a refused DescribeAcls", |s| {
        s["error"]
            .as_str()
            .is_some_and(|e| e.contains("ClusterAuthorizationFailed"))
    });
    assert_eq!(st["synced"], 0, "{st}");
    let grant = [
        "--add",
        "--allow-principal",
        "User:mirror",
        "--operation",
        "Describe",
    ];
    kafka_acls(&src, &[&grant[..], &["--cluster"][..]].concat());
    // The ten ACLs that apply to T and the group's are synced; carol's (another topic),
    // ivan's (a prefix of another name) and the cluster one are not.
    let st = wait_sync(&mut serve, &admin, "ten ACLs synced", |s| s["synced"] == 10);
    assert_eq!(st["state"], "syncing", "{st}");
    assert!(
        st["lastSyncMs"].as_i64().is_some() && st["error"].is_null(),
        "{st}"
    );
    let listed = kmirror_acls(&kmirror, &admin_login);
    assert_eq!(listed.len(), 10, "{listed:#?}");
    assert_eq!(
        principals(&listed),
        [
            "User:alice",
            "User:dave",
            "User:gina",
            "User:hank",
            "User:mirror"
        ],
        "{listed:#?}"
    );
    assert!(
        listed.iter().all(|l| on_source.contains(l)),
        "as the source lists them: {listed:#?}"
    );
    let describe = cli_ok(&admin, &["describe", "--mirror", "m"]);
    assert!(
        describe.contains("ACL sync of m: syncing, 10 synced ACLs in force"),
        "{describe}"
    );

    // An ACL made on kmirror directly, and dave's removed on the source.
    allow(
        &kmirror,
        Some(&admin_login),
        "--add",
        "User:erin",
        &["Read"],
        "--topic",
        &t,
    );
    allow(
        &src,
        None,
        "--remove",
        "User:dave",
        &["Read"],
        "--topic",
        &t,
    );
    wait_sync(&mut serve, &admin, "dave's ACL removed", |s| {
        s["synced"] == 9
    });
    let listed = kmirror_acls(&kmirror, &admin_login);
    assert_eq!(
        principals(&listed),
        [
            "User:alice",
            "User:erin",
            "User:gina",
            "User:hank",
            "User:mirror"
        ],
        "dave's gone, erin's (made on kmirror) kept: {listed:#?}"
    );
    assert_eq!(listed.len(), 10, "{listed:#?}");

    // Failover: sync stops, the synced ACLs stay. An ACL added on the source afterwards is
    // not taken (checked at the end, after the clients' runs gave many intervals' time).
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", ".*"]);
    let st = wait_sync(&mut serve, &admin, "sync stopped", |s| {
        s["state"] == "stopped"
    });
    assert_eq!(st["synced"], 9, "{st}");
    let last_sync = st["lastSyncMs"].clone();
    allow(&src, None, "--add", "User:bob", &["Read"], "--topic", &t);

    // alice produces and consumes (with her group G); bob is refused with Kafka's error.
    java_produce(&alice, &kmirror, &t).expect("alice produces to T");
    let read = harness::with_client_config(&alice, || {
        harness::groups::group_consume(&kmirror, &t, &group, RECORDS + 5)
    });
    assert_eq!(read.len(), RECORDS + 5, "alice reads T with group {group}");
    let refused = java_consume(&bob, &kmirror, &t, 1).expect_err("bob must be refused");
    assert!(
        refused.contains("TopicAuthorizationException")
            && refused.contains("Not authorized to access topics"),
        "the Java consumer names Kafka's TOPIC_AUTHORIZATION_FAILED: {refused}"
    );
    let refused = java_produce(&bob, &kmirror, &t).expect_err("bob must not produce");
    assert!(
        refused.contains("TopicAuthorizationException"),
        "the Java producer names Kafka's TOPIC_AUTHORIZATION_FAILED: {refused}"
    );
    let st = acl_sync(&admin);
    assert_eq!(
        (st["state"].clone(), st["lastSyncMs"].clone()),
        (serde_json::json!("stopped"), last_sync),
        "no round after failover: {st}"
    );
    assert_eq!(
        principals(&kmirror_acls(&kmirror, &admin_login)),
        [
            "User:alice",
            "User:erin",
            "User:gina",
            "User:hank",
            "User:mirror"
        ]
    );

    // kill -9 and restart: the synced ACLs (in __mirror_state) and erin's are in force again.
    serve.kill9();
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    assert_eq!(
        kmirror_acls(&kmirror, &admin_login),
        listed,
        "after kill -9"
    );
    assert_eq!(
        java_consume(&alice, &kmirror, &t, RECORDS + 5),
        Ok(RECORDS + 5)
    );
    let refused = java_consume(&bob, &kmirror, &t, 1).expect_err("bob still refused");
    assert!(refused.contains("TopicAuthorizationException"), "{refused}");
    serve.sigterm_and_wait();
}

#[test]
fn a_source_without_authorizer_is_reported_and_mirroring_continues() {
    let k = harness::shared();
    let t = harness::unique_topic("aclsync-noauth");
    k.create_topic(&t, 1, &[]);
    k.produce(&t, 0, RECORDS, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let (mut serve, admin, _kmirror) = serve_admin_with_listener(work.path());
    create_mirror(&admin, work.path(), "m", &k.bootstrap(), MIRROR_PROPS);
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &t]);
    let pairs = k.mirror_pairs(&t, 1, &work.path().join("data"));
    wait_all_mirrored(&mut serve, &pairs);
    let st = wait_sync(&mut serve, &admin, "no-authorizer message", |s| {
        s["message"]
            .as_str()
            .is_some_and(|m| m.contains("no authorizer"))
    });
    assert_eq!(
        (st["state"].clone(), st["synced"].clone()),
        ("syncing".into(), 0.into())
    );
    assert!(st["error"].is_null(), "not an error: {st}");
    assert!(
        serve
            .log_text()
            .contains("the source has no authorizer (SECURITY_DISABLED)"),
        "said in the log"
    );
    // Mirroring carries on.
    k.produce(&t, 0, RECORDS, &ProduceOpts::default());
    wait_all_mirrored(&mut serve, &pairs);
    let rows = describe_rows(&admin, "m");
    assert_eq!(rows[0]["state"], "MIRRORING", "{rows:?}");
    serve.sigterm_and_wait();
}
