//! Goal: the source sync copies each mirrored topic's own configs (issue 4, item 5) and keeps
//! them, and a source topic deleted while mirrored fails its partitions for good.
//!
//! Method: a real Kafka 4.1.1 KRaft broker as the source, `kmirror serve` (the binary) with an
//! `[admin]` section, a one-second `sync_interval_ms` and a `[kafka]` listener on a fixed port,
//! driven by the `kmirror mirrors` CLI. Configs are read back from kmirror's own Kafka listener
//! with the Java Admin client (`describeConfigs`, through KafkaTool), which reports each
//! entry's value and `ConfigEntry.source`. The source's configs are set with Admin at topic
//! creation and with Kafka's own `kafka-configs --alter`.
//!
//! 1. A topic created with retention.ms, cleanup.policy=compact and compression.type overrides
//!    and a leader replication throttle is mirrored: kmirror shows the three overrides as
//!    DYNAMIC_TOPIC_CONFIG with the source's values, and no throttle (the source shows it
//!    as DYNAMIC_TOPIC_CONFIG, so the mirror's filter dropped it); untouched settings stay
//!    DEFAULT_CONFIG.
//! 2. `kafka-configs --alter` changes retention.ms and max.message.bytes on the source; kmirror
//!    shows the new values after a sync round.
//! 3. Another mirrored topic is deleted on the source while kmirror runs: its partition becomes
//!    FAILED, not retryable (retryAttempt -1), with the reason "source topic is deleted".
//! 4. kmirror is stopped, the first topic is deleted on the source too, and kmirror restarted:
//!    the configs it shows can only come from `__mirror_state` (the source has no such topic
//!    any more), and they are the latest copied values.

mod harness;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use harness::mirrors_cli::{
    cli_ok, create_mirror, describe_rows, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{wait_mirrored, Serve};
use harness::ProduceOpts;

/// Failure guard for a sync round to land (the interval is 1 s), not a performance claim.
const SYNC_LIMIT: Duration = Duration::from_secs(90);

const DYNAMIC: &str = "DYNAMIC_TOPIC_CONFIG";
const DEFAULT: &str = "DEFAULT_CONFIG";
const THROTTLE: &str = "leader.replication.throttled.replicas";

/// `kmirror serve` with `[admin]` (one-second sync and retention rounds) and a `[kafka]`
/// listener on fixed ports, so a restart keeps them, and mirror "m" created from `bootstrap`.
struct Rig {
    work: tempfile::TempDir,
    data_dir: PathBuf,
    config: PathBuf,
    admin: String,
    kafka: String,
    serve: Serve,
}

impl Rig {
    fn start(bootstrap: &str) -> Rig {
        let work = tempfile::tempdir().unwrap();
        let data_dir = work.path().join("data");
        let config = work.path().join("kmirror.toml");
        let admin = format!("127.0.0.1:{}", free_loopback_port());
        let kafka = format!("127.0.0.1:{}", free_loopback_port());
        let fast = "sync_interval_ms = 1000\nretention_check_interval_ms = 1000";
        write_serving_config(&config, &admin, Some(&kafka), &data_dir, fast);
        let mut serve = Serve::start(&config, work.path().join("serve1.log"));
        wait_admin(&mut serve, &admin);
        create_mirror(&admin, work.path(), "m", bootstrap, "");
        Rig {
            work,
            data_dir,
            config,
            admin,
            kafka,
            serve,
        }
    }
}

type Entry = (String, Option<String>, Option<String>);

fn configs(bootstrap: &str, topic: &str, keys: &[&str]) -> Vec<Entry> {
    harness::describe_topic_config_sources(bootstrap, topic, keys)
}

fn entry(key: &str, value: Option<&str>, source: Option<&str>) -> Entry {
    (
        key.to_owned(),
        value.map(str::to_owned),
        source.map(str::to_owned),
    )
}

/// (state, retryAttempt, errorMessage) of `topic`-0 in `describe --json`.
fn partition(admin: &str, topic: &str) -> (String, i64, Option<String>) {
    let rows = describe_rows(admin, "m");
    let r = rows
        .iter()
        .find(|r| r["topic"] == topic && r["partition"] == 0)
        .unwrap_or_else(|| panic!("{topic}-0 not in describe: {rows:?}"));
    (
        r["state"].as_str().unwrap().to_owned(),
        r["retryAttempt"].as_i64().unwrap_or(0),
        r["errorMessage"].as_str().map(str::to_owned),
    )
}

#[test]
fn source_topic_configs_are_copied_followed_and_replayed() {
    let k = harness::shared();
    let topic = harness::unique_topic("cfg-sync");
    let doomed = harness::unique_topic("cfg-gone");
    k.create_topic(
        &topic,
        1,
        &[
            ("retention.ms", "3600000"),
            ("cleanup.policy", "compact"),
            ("compression.type", "producer"),
            (THROTTLE, "*"),
        ],
    );
    k.create_topic(&doomed, 1, &[]);
    k.produce(&topic, 0, 200, &ProduceOpts::default());
    k.produce(&doomed, 0, 50, &ProduceOpts::default());

    let Rig {
        work,
        data_dir,
        config,
        admin,
        kafka,
        mut serve,
    } = Rig::start(&k.bootstrap());
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &doomed]);
    wait_mirrored(
        &mut serve,
        &k.partition_dir(&topic, 0),
        &data_dir.join(format!("{topic}-0")),
    );

    // 1. Copied at start, before the data arrived; the throttle is not.
    let keys = [
        "retention.ms",
        "cleanup.policy",
        "compression.type",
        THROTTLE,
        "segment.bytes",
    ];
    let source = configs(&k.bootstrap(), &topic, &keys);
    assert_eq!(
        source[3],
        entry(THROTTLE, Some("*"), Some(DYNAMIC)),
        "{source:?}"
    );
    let ours = configs(&kafka, &topic, &keys);
    assert_eq!(
        ours,
        [
            entry("retention.ms", Some("3600000"), Some(DYNAMIC)),
            entry("cleanup.policy", Some("compact"), Some(DYNAMIC)),
            entry("compression.type", Some("producer"), Some(DYNAMIC)),
            entry(THROTTLE, None, None),
            entry("segment.bytes", Some("1073741824"), Some(DEFAULT)),
        ],
        "{}",
        serve.log_text()
    );

    // 2. A change on the source arrives with a sync round.
    harness::kafka_configs(
        &k.bootstrap(),
        &[
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            &topic,
            "--add-config",
            "retention.ms=7200000,max.message.bytes=2000000",
        ],
    );
    let want = [
        entry("retention.ms", Some("7200000"), Some(DYNAMIC)),
        entry("max.message.bytes", Some("2000000"), Some(DYNAMIC)),
    ];
    let start = Instant::now();
    loop {
        serve.assert_running();
        let ours = configs(&kafka, &topic, &["retention.ms", "max.message.bytes"]);
        if ours == want {
            break;
        }
        assert!(
            start.elapsed() < SYNC_LIMIT,
            "source config change not copied: {ours:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // 3. A source topic deleted while mirrored: FAILED for good, with the reason.
    k.delete_topic(&doomed);
    let start = Instant::now();
    let failed = loop {
        serve.assert_running();
        let p = partition(&admin, &doomed);
        if p.0 == "FAILED" {
            break p;
        }
        assert!(
            start.elapsed() < SYNC_LIMIT,
            "deleted topic's partition not FAILED: {p:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(
        failed,
        ("FAILED".into(), -1, Some("source topic is deleted".into())),
        "{}",
        serve.log_text()
    );
    assert_eq!(partition(&admin, &topic).0, "MIRRORING");
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");

    // 4. Restart without the topic on the source: only __mirror_state can supply the configs.
    k.delete_topic(&topic);
    let mut serve = Serve::start(&config, work.path().join("serve2.log"));
    wait_admin(&mut serve, &admin);
    let ours = configs(
        &kafka,
        &topic,
        &[
            "retention.ms",
            "max.message.bytes",
            "cleanup.policy",
            THROTTLE,
        ],
    );
    assert_eq!(
        ours,
        [
            entry("retention.ms", Some("7200000"), Some(DYNAMIC)),
            entry("max.message.bytes", Some("2000000"), Some(DYNAMIC)),
            entry("cleanup.policy", Some("compact"), Some(DYNAMIC)),
            entry(THROTTLE, None, None),
        ],
        "{}",
        serve.log_text()
    );
    let gone = partition(&admin, &doomed);
    assert_eq!((gone.0.as_str(), gone.1), ("FAILED", -1), "{gone:?}");
    serve.sigterm_and_wait();
}

// Goal: the copied retention is enforced on kmirror's own logs, and a compact-only topic is
// never deleted by time. Method: two topics mirrored; `kafka-configs --alter` sets retention.ms
// to 1 s on the first after it is mirrored; the second was created with cleanup.policy=compact
// and retention.ms=1000. With retention passes every second, kmirror's log start of the first
// (ListOffsets earliest on kmirror's listener, Java client) reaches its log end and its first
// segment file is gone, while the compact-only topic still starts at 0.
#[test]
fn copied_retention_deletes_old_segments_but_not_of_compact_topics() {
    let k = harness::shared();
    let expiring = harness::unique_topic("cfg-ret");
    let compacted = harness::unique_topic("cfg-cmp");
    k.create_topic(&expiring, 1, &[]);
    k.create_topic(
        &compacted,
        1,
        &[("cleanup.policy", "compact"), ("retention.ms", "1000")],
    );
    k.produce(&expiring, 0, 100, &ProduceOpts::default());
    k.produce(&compacted, 0, 100, &ProduceOpts::default());

    // `_work` keeps the temporary directory until the end of the test.
    let Rig {
        work: _work,
        data_dir,
        admin,
        kafka,
        mut serve,
        ..
    } = Rig::start(&k.bootstrap());
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &expiring]);
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &compacted]);
    let ours = data_dir.join(format!("{expiring}-0"));
    wait_mirrored(&mut serve, &k.partition_dir(&expiring, 0), &ours);
    wait_mirrored(
        &mut serve,
        &k.partition_dir(&compacted, 0),
        &data_dir.join(format!("{compacted}-0")),
    );
    assert_eq!(harness::offsets(&kafka, &expiring, 0).log_start_offset, 0);

    harness::kafka_configs(
        &k.bootstrap(),
        &[
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            &expiring,
            "--add-config",
            "retention.ms=1000",
        ],
    );
    let start = Instant::now();
    loop {
        serve.assert_running();
        let o = harness::offsets(&kafka, &expiring, 0);
        if o.log_start_offset == 100 {
            break;
        }
        assert!(
            start.elapsed() < SYNC_LIMIT,
            "retention never deleted the old segment: {o:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        !ours.join("00000000000000000000.log").exists(),
        "the expired segment file is still there"
    );
    let c = harness::offsets(&kafka, &compacted, 0);
    assert_eq!(
        c.log_start_offset, 0,
        "a compact-only topic lost data to time retention"
    );

    // After failover the copied retention keeps applying to what clients write to kmirror: as
    // in Kafka, an expired active segment is rolled and deleted too.
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", &expiring]);
    let end = harness::offsets(&kafka, &expiring, 0).log_end_offset;
    let written = harness::produce(&kafka, &expiring, 0, 50, &ProduceOpts::default());
    assert_eq!(written.offsets.first(), Some(&end));
    let start = Instant::now();
    loop {
        serve.assert_running();
        let o = harness::offsets(&kafka, &expiring, 0);
        if o.log_start_offset > *written.offsets.last().unwrap() {
            break;
        }
        assert!(
            start.elapsed() < SYNC_LIMIT,
            "retention never deleted what was written after failover: {o:?}\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    serve.sigterm_and_wait();
}
