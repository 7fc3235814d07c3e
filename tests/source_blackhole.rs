//! Goal: the disaster path works against a source that never answers. A real outage is a black
//! hole (connects hang, sockets never answer), not a refused connection. Method: `kmirror
//! serve` with `[admin]` and `[kafka]` mirrors a topic from a real broker with a Java consumer
//! group synced to kmirror, then the source is black-holed, two ways: (a) through the harness
//! proxy, which after `freeze()` accepts and never answers, and (b) `kill -STOP` of a dedicated
//! broker's JVM. Throughout the outage `/metrics` and `describe` answer, each well before the
//! source request timeout (20 s here; liveness bound 3 s). `mirrors stop` fails over within
//! the final group-sync timeout plus 5 s and reports the skipped group sync; the group resumes
//! on kmirror at its synced offset. Then kmirror is killed and restarted with the source still
//! frozen: the admin API serves within seconds, the partition is STOPPED and writable (Java
//! idempotent producer), its leader epoch kept, and SIGTERM does not wait on the source.
//! With the proxy, `mirrors create` against the black hole fails with a clear error within its
//! deadline while `/metrics` keeps answering.
//!
//! Every duration asserted is a liveness bound against a 20 s source timeout, not a
//! performance claim; the measured figures are printed (`--nocapture`).

mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::groups::{committed_offset, group_consume};
use harness::mirrors_cli::{
    cli, cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin, write_serving_config,
};
use harness::proxy::{Fault, FaultProxy};
use harness::serve::Serve;
use harness::{Kafka, ProduceOpts};

/// The source request timeout configured for kmirror (`fetch.request_timeout_ms`): the
/// deadline of every source call.
const REQUEST_TIMEOUT_MS: u64 = 20_000;
/// `sync.group.offsets.final.timeout.ms` of the mirror.
const FINAL_SYNC_MS: u64 = 3_000;
/// Liveness bound for `/metrics` and `describe` during the outage: far below the source
/// request timeout, so an answer that waited on the source fails it.
const ANSWER_LIMIT: Duration = Duration::from_secs(3);
/// The brief's bound for `stop` with every source black-holed.
const STOP_LIMIT: Duration = Duration::from_millis(FINAL_SYNC_MS + 5_000);
/// "Serving within seconds" after a restart with the source frozen (liveness bound).
const ADMIN_UP_LIMIT: Duration = Duration::from_secs(10);
/// Failure guard for waits on background work on a loaded machine; not a performance claim.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

const RECORDS: usize = 100;
const CONSUMED: usize = 60;

fn agent() -> ureq::Agent {
    // A hung answer fails the test (well past every bound) instead of hanging it.
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(90)))
        .build()
        .into()
}

/// GET `path` on the admin API: (status, body, how long it took).
fn get(agent: &ureq::Agent, admin: &str, path: &str) -> (u16, String, Duration) {
    let start = Instant::now();
    let mut resp = agent
        .get(&format!("http://{admin}{path}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().unwrap();
    (status, body, start.elapsed())
}

/// The slowest `/metrics` and `describe` answers seen.
#[derive(Debug, Default, Clone, Copy)]
struct Slowest {
    metrics: Duration,
    describe: Duration,
    polls: usize,
}

/// Polls `/metrics` and `describe` for `window` (or until `until` says stop), checking each
/// answers correctly and within `ANSWER_LIMIT`.
fn poll(admin: &str, window: Duration, until: impl Fn() -> bool) -> Slowest {
    let agent = agent();
    let mut s = Slowest::default();
    let start = Instant::now();
    while start.elapsed() < window && !until() {
        let (status, body, took) = get(&agent, admin, "/metrics");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("kmirror_partition_state"), "{body}");
        assert!(
            took < ANSWER_LIMIT,
            "/metrics took {took:?} during the outage"
        );
        s.metrics = s.metrics.max(took);
        let (status, body, took) = get(&agent, admin, "/describe?mirror=m");
        assert_eq!(status, 200, "{body}");
        let rows: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
        assert!(
            took < ANSWER_LIMIT,
            "describe took {took:?} during the outage"
        );
        s.describe = s.describe.max(took);
        s.polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.polls > 0);
    s
}

/// Polls on a thread while `f` runs on this one.
fn polling_while<T>(admin: &str, f: impl FnOnce() -> T) -> (T, Slowest) {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (d2, a2) = (std::sync::Arc::clone(&done), admin.to_owned());
    let poller = std::thread::spawn(move || {
        poll(&a2, WAIT_LIMIT, || {
            d2.load(std::sync::atomic::Ordering::Relaxed)
        })
    });
    let out = f();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (out, poller.join().unwrap())
}

/// The leader epoch kmirror's Metadata announces for partition 0.
fn announced_epoch(kmirror: &str, topic: &str) -> i32 {
    let mut c = kmirror::fetch::blocking::BlockingClient::connect(kmirror, "test").unwrap();
    let md = c.metadata(Some(&[topic])).unwrap();
    md.partition(topic, 0).unwrap().leader_epoch.0
}

fn start_serve(config: &Path, log: std::path::PathBuf, admin: &str) -> (Serve, Duration) {
    let start = Instant::now();
    let mut serve = Serve::start(config, log);
    wait_admin(&mut serve, admin);
    (serve, start.elapsed())
}

/// kmirror mirroring `topic` from `bootstrap` (the broker `k` itself or a proxy in front of
/// it), caught up, with a Java group's commit synced to kmirror.
struct Rig {
    serve: Serve,
    work: tempfile::TempDir,
    admin: String,
    config: std::path::PathBuf,
    kmirror: String,
    group: String,
    topic: String,
    bootstrap: String,
}

fn mirroring(k: &Kafka, bootstrap: &str, topic: &str) -> Rig {
    let group = format!("{topic}-app");
    k.create_topic(topic, 1, &[]);
    k.produce(topic, 0, RECORDS, &ProduceOpts::default());
    assert_eq!(
        group_consume(&k.bootstrap(), topic, &group, CONSUMED).len(),
        CONSUMED
    );

    let work = tempfile::tempdir().unwrap();
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let config = work.path().join("kmirror.toml");
    write_serving_config(
        &config,
        &admin,
        Some("127.0.0.1:0"),
        &work.path().join("data"),
        "",
    );
    // The last section written is [fetch].
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("request_timeout_ms = {REQUEST_TIMEOUT_MS}\n"));
    std::fs::write(&config, text).unwrap();
    let (mut serve, _) = start_serve(&config, work.path().join("serve.log"), &admin);
    let kmirror = serve.kafka_listener();
    let sync = format!(
        "sync.group.offsets.interval.ms=500\nsync.group.offsets.final.timeout.ms={FINAL_SYNC_MS}\n"
    );
    create_mirror(&admin, work.path(), "m", bootstrap, &sync);
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", topic]);
    serve.wait_for("the topic to be mirrored", WAIT_LIMIT, || {
        describe_rows(&admin, "m")[0]["destinationOffset"] == RECORDS as i64
    });
    serve.wait_for("the group sync", WAIT_LIMIT, || {
        committed_offset(&kmirror, &group, 0) == Some(CONSUMED as i64)
    });
    Rig {
        serve,
        work,
        admin,
        config,
        kmirror,
        group,
        topic: topic.to_owned(),
        bootstrap: bootstrap.to_owned(),
    }
}

/// The outage, once the source is black-holed. `create_check`: also try `mirrors create`
/// against the black hole.
fn outage(rig: Rig, create_check: bool) {
    let (admin, topic, bootstrap) = (&*rig.admin, &*rig.topic, &*rig.bootstrap);
    let (work, config, kmirror, group) = (&rig.work, &rig.config, &*rig.kmirror, &*rig.group);
    let serve = rig.serve;
    let during = poll(admin, Duration::from_secs(8), || false);
    eprintln!("black hole, mirroring: {during:?}");

    if create_check {
        let props = work.path().join("m2.properties");
        std::fs::write(&props, format!("bootstrap.servers={bootstrap}\n")).unwrap();
        let props = props.to_str().unwrap().to_owned();
        let ((out, took), during) = polling_while(admin, || {
            let start = Instant::now();
            let out = cli(
                admin,
                &["create", "--mirror", "m2", "--mirror-config", &props],
            );
            (out, start.elapsed())
        });
        eprintln!("create against the black hole: {took:?}; meanwhile {during:?}");
        assert!(
            !out.ok,
            "create succeeded against a black hole: {}",
            out.stdout
        );
        assert!(
            out.stderr
                .contains(&format!("did not answer within {REQUEST_TIMEOUT_MS} ms")),
            "a clear error: {}",
            out.stderr
        );
        assert!(
            took < Duration::from_millis(REQUEST_TIMEOUT_MS + 5_000),
            "create took {took:?}"
        );
        assert!(cli_ok(admin, &["list"]).contains('m'));
        assert!(!cli_ok(admin, &["list"]).contains("m2"));
    }

    // The failover, with the source still black-holed.
    let ((stop, took), during) = polling_while(admin, || {
        let start = Instant::now();
        let out = cli(admin, &["stop", "--mirror", "m", "--topics", topic]);
        (out, start.elapsed())
    });
    eprintln!("stop: {took:?}; meanwhile {during:?}");
    assert!(stop.ok, "stop: {}\n{}", stop.stderr, serve.log_text());
    assert!(took < STOP_LIMIT, "stop took {took:?}");
    assert!(
        stop.stdout.contains(&format!(
            "Last group-offset sync: skipped: source did not answer within {FINAL_SYNC_MS} ms"
        )) || stop.stdout.contains("Last group-offset sync: skipped:"),
        "stop says which step was skipped and why: {}",
        stop.stdout
    );
    let row = describe_rows(admin, "m").remove(0);
    assert_eq!(row["state"], "STOPPED", "{row}");
    // The group resumes on kmirror where it was synced.
    let resumed = group_consume(kmirror, topic, group, RECORDS - CONSUMED);
    assert_eq!(
        resumed.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (CONSUMED as i64..RECORDS as i64).collect::<Vec<_>>()
    );
    // Writable at once, as the new leader. (A restart after a failover without any write
    // keeping the promoted epoch is the failover fence's test, tests/failover_epochs.rs.)
    let produce = |kmirror: &str, seed: u64| {
        let written = harness::produce(
            kmirror,
            topic,
            0,
            10,
            &ProduceOpts {
                idempotent: true,
                seed,
                ..ProduceOpts::default()
            },
        );
        assert_eq!(written.count, 10);
        assert!(written.first_offset >= RECORDS as i64, "{written:?}");
    };
    produce(kmirror, 2);
    let epoch = announced_epoch(kmirror, topic);
    assert!(epoch > 0, "promoted above the source's epoch 0");

    // A crash, and a restart with the source still frozen.
    serve.kill9();
    let (mut serve, up) = start_serve(config, work.path().join("serve2.log"), admin);
    eprintln!("admin API up after the restart: {up:?}");
    assert!(up < ADMIN_UP_LIMIT, "admin API up after {up:?}");
    let kmirror = serve.kafka_listener();
    let row = describe_rows(admin, "m").remove(0);
    assert_eq!(row["state"], "STOPPED", "{row}");
    assert_eq!(
        announced_epoch(&kmirror, topic),
        epoch,
        "the promoted epoch is kept"
    );
    let written = harness::produce(
        &kmirror,
        topic,
        0,
        10,
        &ProduceOpts {
            idempotent: true,
            seed: 3,
            ..ProduceOpts::default()
        },
    );
    assert_eq!(written.count, 10);
    assert!(written.first_offset >= RECORDS as i64, "{written:?}");
    let after = poll(admin, Duration::from_secs(3), || false);
    eprintln!("black hole, after the restart: {after:?}");

    let start = Instant::now();
    let text = serve.sigterm_and_wait();
    let took = start.elapsed();
    eprintln!("SIGTERM with the source frozen: {took:?}");
    assert!(text.contains("stopped cleanly"), "{text}");
    assert!(
        took < Duration::from_millis(REQUEST_TIMEOUT_MS),
        "SIGTERM took {took:?}"
    );
}

#[test]
fn a_proxy_that_never_answers() {
    let k = harness::shared();
    let proxy = FaultProxy::start(k.bootstrap().parse().unwrap(), Fault::None);
    let topic = harness::unique_topic("blackhole-proxy");
    let rig = mirroring(k, &proxy.bootstrap(), &topic);
    proxy.freeze();
    outage(rig, true);
}

#[test]
fn a_broker_frozen_with_sigstop() {
    let mut k = Kafka::start_dedicated();
    let rig = mirroring(&k, &k.bootstrap(), "frozen");
    k.freeze();
    outage(rig, false);
}
