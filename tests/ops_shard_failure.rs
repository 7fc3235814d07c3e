//! Goal: a shard that panics is not hidden. `kmirror serve` (control plane, 2 shards) mirrors a
//! real Kafka 4.1.1 topic while telling a stand-in NOTIFY_SOCKET about its watchdog; then shard
//! 0 panics on purpose (the debug-build test hook `KMIRROR_TEST_PANIC_SHARD_WHEN_FILE`). Within
//! seconds: `/metrics` shows `kmirror_shard_healthy{shard="0"} 0` and the failure counted,
//! `describe` shows shard 0's partitions FAILED with the panic as the reason (shard 1's keep
//! mirroring), no WATCHDOG=1 follows the failure's STATUS, the process exits non-zero, and no
//! clean-shutdown marker is left. A restart (no hook) recovers the logs and mirrors on: every
//! partition ends byte-identical to the broker's, including records produced meanwhile.

mod harness;

use std::time::{Duration, Instant};

use harness::mirrors_cli::{
    cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin, write_admin_config,
};
use harness::notify::NotifySocket;
use harness::serve::{plain, wait_all_mirrored, Serve};
use harness::ProduceOpts;
use kmirror::control::mirror_run::shard_for;
use kmirror::ids::{ShardId, TopicPartition};

const PARTITIONS: i32 = 6;

/// Failure guards, not performance claims: how long the failure may take to show (the stall
/// bound is 5 s; a panic is seen at the next control tick), and the exit after it (3 s of
/// lingering plus the shutdown).
const DETECT_LIMIT: Duration = Duration::from_secs(30);
const EXIT_LIMIT: Duration = Duration::from_secs(60);

fn scrape(admin: &str) -> Option<String> {
    ureq::get(&format!("http://{admin}/metrics"))
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Waits until at least `n` WATCHDOG=1 arrived (the shards are healthy).
fn wait_pings(notify: &NotifySocket, n: usize) {
    notify.wait_for(DETECT_LIMIT, |m| {
        m.iter()
            .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
            .count()
            >= n
    });
}

/// The failure's STATUS was sent and no WATCHDOG=1 followed it.
fn assert_no_ping_after(notify: &NotifySocket, status: &str, log: &str) {
    let messages = notify.messages();
    let at = messages
        .iter()
        .position(|m| m.contains(status))
        .unwrap_or_else(|| panic!("no {status:?} in {messages:?}\n{log}"));
    assert!(
        !messages[at..]
            .iter()
            .any(|m| m.lines().any(|l| l == "WATCHDOG=1")),
        "watchdog pinged after {status:?}: {messages:?}"
    );
}

#[test]
fn a_panicked_shard_fails_its_partitions_stops_the_watchdog_and_exits_for_recovery() {
    let k = harness::shared();
    let topic = harness::unique_topic("shard-panic");
    k.create_topic(&topic, PARTITIONS, &[]);
    for p in 0..PARTITIONS {
        k.produce(&topic, p, 200, &ProduceOpts::default());
    }
    let on_shard = |s: u16| -> Vec<i32> {
        (0..PARTITIONS)
            .filter(|p| shard_for(&TopicPartition::new(topic.clone(), *p), 2) == ShardId(s))
            .collect()
    };
    let (doomed, surviving) = (on_shard(0), on_shard(1));
    assert!(
        !doomed.is_empty() && !surviving.is_empty(),
        "both shards need partitions: {doomed:?} {surviving:?}"
    );

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &data_dir, "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("shards = 1", "shards = 2")).unwrap();
    let notify = NotifySocket::bind(work.path());
    let trigger = work.path().join("panic-now");
    let log = work.path().join("serve.log");
    let mut serve = Serve::start_with_env(
        &config,
        log.clone(),
        &[
            ("NOTIFY_SOCKET", notify.path.as_os_str()),
            // 1 s: pings every 0.5 s while healthy.
            ("WATCHDOG_USEC", "1000000".as_ref()),
            ("KMIRROR_TEST_PANIC_SHARD_WHEN_FILE", trigger.as_os_str()),
        ],
    );
    wait_admin(&mut serve, &admin);
    create_mirror(&admin, work.path(), "m", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    let pairs = k.mirror_pairs(&topic, PARTITIONS, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);
    // Healthy: the watchdog is pinged and the gauge says so.
    wait_pings(&notify, 2);
    let before = scrape(&admin).expect("/metrics answers");
    assert_eq!(
        metric(&before, "kmirror_shard_healthy{shard=\"0\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&before, "kmirror_shard_failures_total{shard=\"0\"}"),
        Some(0.0)
    );

    std::fs::write(&trigger, b"").unwrap();
    let start = Instant::now();
    let after = loop {
        if let Some(text) = scrape(&admin) {
            if metric(&text, "kmirror_shard_healthy{shard=\"0\"}") == Some(0.0) {
                break text;
            }
        }
        assert!(
            start.elapsed() < DETECT_LIMIT,
            "shard 0 never reported unhealthy:\n{}",
            serve.own_log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        metric(&after, "kmirror_shard_failures_total{shard=\"0\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&after, "kmirror_shard_healthy{shard=\"1\"}"),
        Some(1.0)
    );
    // The failure is in describe while the process lingers before exiting.
    let rows = describe_rows(&admin, "m");
    for row in &rows {
        let p = row["partition"].as_i64().unwrap() as i32;
        if doomed.contains(&p) {
            assert_eq!(row["state"], "FAILED", "{row}");
            let why = row["errorMessage"].as_str().unwrap_or_default();
            assert!(
                why.contains("shard 0 panicked") && why.contains("on purpose"),
                "{row}"
            );
        } else {
            assert_eq!(row["state"], "MIRRORING", "{row}");
        }
    }

    let status = serve.wait_exit(EXIT_LIMIT);
    let text = serve.own_log_text();
    assert!(!status.success(), "exited with {status}:\n{text}");
    assert!(text.contains("shard failed"), "{text}");
    assert!(
        !data_dir.join(".kafka_cleanshutdown").exists(),
        "clean-shutdown marker left after a shard died:\n{text}"
    );
    assert_no_ping_after(&notify, "STATUS=shard 0 panicked", &text);
    drop(serve);

    // The restart recovers (no marker) and mirrors every partition on, the failed ones too,
    // including what the source got while kmirror was down.
    for p in 0..PARTITIONS {
        k.produce(&topic, p, 50, &ProduceOpts::default());
    }
    let mut serve = Serve::start(&config, log);
    wait_admin(&mut serve, &admin);
    wait_all_mirrored(&mut serve, &pairs);
    let text = plain(&serve.own_log_text());
    let opened = text
        .lines()
        .find(|l| l.contains("log dir opened"))
        .unwrap_or_else(|| panic!("no log dir line:\n{text}"));
    assert!(opened.contains("clean_shutdown=false"), "{opened}");
    let start = Instant::now();
    while !describe_rows(&admin, "m")
        .iter()
        .all(|r| r["state"] == "MIRRORING")
    {
        assert!(
            start.elapsed() < DETECT_LIMIT,
            "{:?}",
            describe_rows(&admin, "m")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    serve.sigterm_and_wait();
    assert!(data_dir.join(".kafka_cleanshutdown").exists());
}

// Goal: a shard that stops turning (blocked, not dead) is caught by its heartbeat. Method: the
// stall hook parks shard 0's thread for good; kmirror (no mirror needed) must then send a
// "stalled" STATUS, never WATCHDOG=1 after it, and exit non-zero without waiting for the stuck
// thread forever.
#[test]
fn a_stalled_shard_stops_the_watchdog_and_the_process_exits() {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_admin_config(&config, &admin, &work.path().join("data"), "");
    let notify = NotifySocket::bind(work.path());
    let trigger = work.path().join("stall-now");
    let mut serve = Serve::start_with_env(
        &config,
        work.path().join("serve.log"),
        &[
            ("NOTIFY_SOCKET", notify.path.as_os_str()),
            ("WATCHDOG_USEC", "1000000".as_ref()),
            ("KMIRROR_TEST_STALL_SHARD_WHEN_FILE", trigger.as_os_str()),
        ],
    );
    wait_admin(&mut serve, &admin);
    wait_pings(&notify, 2);
    std::fs::write(&trigger, b"").unwrap();
    let status = serve.wait_exit(EXIT_LIMIT);
    let text = serve.own_log_text();
    assert!(!status.success(), "exited with {status}:\n{text}");
    assert_no_ping_after(&notify, "STATUS=shard 0 stalled", &text);
}
