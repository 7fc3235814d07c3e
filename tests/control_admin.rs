//! The control plane through the `kmirror mirrors` CLI binary, the HTTP admin API and the
//! controller, against a real Kafka 4.1.1 source broker: topic resolution by regex, the
//! lifecycle, `__mirror_state` surviving a restart in each state, and errors that name the
//! problem with a non-zero exit.
//!
//! The data plane here only records which partitions it was told to fetch: this test is about
//! the control plane's decisions and their persistence, not about moving records.

mod harness;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};

use kmirror::control::admin::{self, ControlThread};
use kmirror::control::controller::{Controller, DataPlane, Progress};
use kmirror::control::mirror_def::{MirrorDefinition, StartFrom};
use kmirror::control::source_catalog::BlockingSourceCatalog;
use kmirror::control::state::RetryPolicy;
use kmirror::control::state_log::StateLog;
use kmirror::ids::{LeaderEpoch, Offset, TopicPartition};
use kmirror::log::partition_log::Promotion;
use uuid::Uuid;

/// The partitions it was told to fetch; fetchers of the topic named in `.1` fail to start
/// (a retryable fault, so the partition goes FAILED and retries).
#[derive(Clone, Default)]
struct RecordingPlane(
    Arc<Mutex<BTreeSet<TopicPartition>>>,
    Arc<Mutex<Option<String>>>,
);

impl DataPlane for RecordingPlane {
    fn add(
        &mut self,
        _: &MirrorDefinition,
        tp: &TopicPartition,
        _: Uuid,
        _: StartFrom,
    ) -> Result<(), kmirror::control::controller::Fault> {
        if self.1.lock().unwrap().as_deref() == Some(tp.topic.as_str()) {
            return Err(kmirror::control::controller::Fault {
                message: "test fetcher refused".into(),
                retryable: true,
                timed_out: false,
            });
        }
        self.0.lock().unwrap().insert(tp.clone());
        Ok(())
    }
    fn prepare_logs(&mut self, _: &[(TopicPartition, Uuid)]) -> Result<usize, String> {
        // No logs here: LogDir::create_missing is tested in log_dir and control_shards.
        Ok(0)
    }
    fn remove(&mut self, tp: &TopicPartition) -> Result<Offset, String> {
        self.0.lock().unwrap().remove(tp);
        Ok(Offset(0))
    }
    fn configure(&mut self, _: &str, _: &kmirror::log::config::LogConfig) -> Result<(), String> {
        // No logs here: configs reaching the logs are tested in control_topic_configs.
        Ok(())
    }
    fn promote(&mut self, _: &TopicPartition) -> Result<Promotion, String> {
        // No logs here: the promotion itself is tested in control_shards and log_leader.
        Ok(Promotion {
            leader_epoch: LeaderEpoch(0),
            aborted: Vec::new(),
            log_end: Offset(0),
        })
    }
    fn checkpoint_promotions(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn writable(&mut self, _: &TopicPartition) -> Result<(), String> {
        Ok(())
    }
    fn progress(&self, _: &TopicPartition) -> Progress {
        Progress::default()
    }
}

fn start_control(dir: &std::path::Path, plane: &RecordingPlane) -> ControlThread {
    plane.0.lock().unwrap().clear();
    let store = StateLog::open(dir).unwrap();
    let mut c = Controller::open(
        store,
        RetryPolicy::default(),
        BlockingSourceCatalog,
        plane.clone(),
    )
    .unwrap();
    // Tests cannot wait 30 s for the source sync.
    c.set_sync_interval_ms(500);
    admin::spawn("127.0.0.1:0".parse().unwrap(), Arc::new(Mutex::new(c))).unwrap()
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn cli(admin: &ControlThread, args: &[&str]) -> Out {
    let addr = admin.addr.to_string();
    let mut all = args.to_vec();
    all.extend(["--admin", &addr]);
    mirrors(&all)
}

/// `kmirror mirrors ARGS` as given (the caller names the admin address, in any spelling).
fn mirrors(args: &[&str]) -> Out {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("mirrors")
        .args(args)
        .output()
        .unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ok(admin: &ControlThread, args: &[&str]) -> String {
    let o = cli(admin, args);
    assert!(o.ok, "{args:?} failed: {}", o.stderr);
    o.stdout
}

fn states(admin: &ControlThread, mirror: &str) -> Vec<(String, i32, String)> {
    let json = ok(admin, &["describe", "--mirror", mirror, "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["topic"].as_str().unwrap().to_owned(),
                r["partition"].as_i64().unwrap() as i32,
                r["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn lifecycle_through_the_cli_survives_restarts() {
    let k = harness::shared();
    let prefix = harness::unique_topic("ctl");
    let orders = format!("{prefix}-orders");
    let other = format!("{prefix}-other");
    k.create_topic(&orders, 2, &[]);
    k.create_topic(&other, 1, &[]);
    let data = tempfile::tempdir().unwrap();
    let props = data.path().join("source.properties");
    std::fs::write(
        &props,
        format!("bootstrap.servers={}\nclient.id=ctl-test\n", k.bootstrap()),
    )
    .unwrap();
    let state_dir = data.path().join("data");
    std::fs::create_dir(&state_dir).unwrap();
    let plane = RecordingPlane::default();

    let ctl = start_control(&state_dir, &plane);
    let created = ok(
        &ctl,
        &[
            "create",
            "--mirror",
            "east",
            "--mirror-config",
            props.to_str().unwrap(),
        ],
    );
    assert!(
        created.starts_with("Created mirror east (source cluster "),
        "{created}"
    );
    let list = ok(&ctl, &["list"]);
    assert!(list.starts_with("MIRROR"), "{list}");
    assert!(list.contains(&k.bootstrap()), "{list}");

    // The regex is matched against the real source's topics.
    ok(
        &ctl,
        &[
            "start",
            "--mirror",
            "east",
            "--topics",
            &format!("{prefix}-ord.*"),
        ],
    );
    let expect = |state: &str| {
        vec![
            (orders.clone(), 0, state.to_owned()),
            (orders.clone(), 1, state.to_owned()),
        ]
    };
    assert_eq!(states(&ctl, "east"), expect("MIRRORING"));
    assert_eq!(plane.0.lock().unwrap().len(), 2);

    // Restart while MIRRORING: same state, fetchers handed out again.
    ctl.stop();
    let ctl = start_control(&state_dir, &plane);
    assert_eq!(states(&ctl, "east"), expect("MIRRORING"));
    assert_eq!(plane.0.lock().unwrap().len(), 2);

    ok(&ctl, &["pause", "--mirror", "east", "--topics", &orders]);
    assert_eq!(states(&ctl, "east"), expect("PAUSED"));
    ctl.stop();
    let ctl = start_control(&state_dir, &plane);
    assert_eq!(states(&ctl, "east"), expect("PAUSED"));
    assert!(
        plane.0.lock().unwrap().is_empty(),
        "paused partitions get no fetcher"
    );

    ok(&ctl, &["resume", "--mirror", "east", "--topics", &orders]);
    assert_eq!(states(&ctl, "east"), expect("MIRRORING"));

    // Errors name the problem and exit non-zero.
    let e = cli(&ctl, &["delete", "--mirror", "east"]);
    assert!(!e.ok);
    assert!(
        e.stderr
            .contains("still has partitions that are not STOPPED"),
        "{}",
        e.stderr
    );
    let e = cli(&ctl, &["pause", "--mirror", "west", "--topics", ".*"]);
    assert!(
        !e.ok && e.stderr.contains("unknown mirror \"west\""),
        "{}",
        e.stderr
    );
    let e = cli(&ctl, &["start", "--mirror", "east", "--topics", "a(b"]);
    assert!(
        !e.ok && e.stderr.contains("bad regex \"a(b\""),
        "{}",
        e.stderr
    );
    let bad = data.path().join("bad.properties");
    std::fs::write(&bad, "bootstrap.servers=127.0.0.1:1\n").unwrap();
    let e = cli(
        &ctl,
        &[
            "create",
            "--mirror",
            "dead",
            "--mirror-config",
            bad.to_str().unwrap(),
        ],
    );
    assert!(
        !e.ok && e.stderr.contains("source of mirror dead is unreachable"),
        "{}",
        e.stderr
    );
    std::fs::write(&bad, "bootstrap.servers=a:1\nsecurity.protocol=KERBEROS\n").unwrap();
    let e = cli(
        &ctl,
        &[
            "create",
            "--mirror",
            "x",
            "--mirror-config",
            bad.to_str().unwrap(),
        ],
    );
    assert!(
        !e.ok && e.stderr.contains("unknown security.protocol \"KERBEROS\""),
        "{}",
        e.stderr
    );

    ok(&ctl, &["stop", "--mirror", "east", "--topics", ".*"]);
    assert_eq!(states(&ctl, "east"), expect("STOPPED"));
    ctl.stop();
    let ctl = start_control(&state_dir, &plane);
    assert_eq!(states(&ctl, "east"), expect("STOPPED"));
    let table = ok(&ctl, &["describe", "--mirror", "east"]);
    assert!(
        table.lines().next().unwrap().starts_with("MIRROR  TOPIC"),
        "{table}"
    );
    assert!(table.contains("STOPPED"), "{table}");

    ok(&ctl, &["delete", "--mirror", "east"]);
    ctl.stop();
    let ctl = start_control(&state_dir, &plane);
    assert_eq!(ok(&ctl, &["list", "--json"]).trim(), "[]");
    ctl.stop();
}

#[test]
fn source_sync_picks_up_new_matching_topics() {
    let k = harness::shared();
    let prefix = harness::unique_topic("sync");
    let data = tempfile::tempdir().unwrap();
    let props = data.path().join("source.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    let plane = RecordingPlane::default();
    let ctl = start_control(data.path(), &plane);
    ok(
        &ctl,
        &[
            "create",
            "--mirror",
            "auto",
            "--mirror-config",
            props.to_str().unwrap(),
        ],
    );
    let started = ok(
        &ctl,
        &[
            "start",
            "--mirror",
            "auto",
            "--topics",
            &format!("{prefix}-.*"),
        ],
    );
    assert!(
        started.starts_with("No matching topics found yet"),
        "{started}"
    );

    let topic = format!("{prefix}-late");
    k.create_topic(&topic, 2, &[]);
    let expected = vec![
        (topic.clone(), 0, "MIRRORING".to_owned()),
        (topic.clone(), 1, "MIRRORING".to_owned()),
    ];
    let mut seen = Vec::new();
    for _ in 0..240 {
        seen = states(&ctl, "auto");
        if seen == expected {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert_eq!(
        seen, expected,
        "the new topic was not picked up by the source sync"
    );
    assert_eq!(plane.0.lock().unwrap().len(), 2);

    // Partitions added on the source are followed by the next sync round.
    harness::kafka_topics(
        &k.bootstrap(),
        &["--alter", "--topic", &topic, "--partitions", "3"],
    );
    let mut expected = expected;
    expected.push((topic.clone(), 2, "MIRRORING".to_owned()));
    for _ in 0..240 {
        seen = states(&ctl, "auto");
        if seen == expected {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert_eq!(
        seen, expected,
        "the added partition was not picked up by the source sync"
    );
    assert_eq!(plane.0.lock().unwrap().len(), 3);
    ctl.stop();
}

/// The whitespace-separated cells of each line of a table (no cell holds a space here).
fn cells(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// `kafka-cluster-mirrors.sh` spellings (KIP-1279 §5) work as kmirror's own: action flags,
/// `--bootstrap-server`, `--mirror-name`; `describe` prints the KIP's columns in its order
/// (kmirror's extra ones after them) and its JSON keys; `--failed` shows RETRY as `n/max`.
#[test]
fn the_kip_tools_spellings_and_columns() {
    let k = harness::shared();
    let prefix = harness::unique_topic("kip");
    let good = format!("{prefix}-good");
    let bad = format!("{prefix}-bad");
    k.create_topic(&good, 1, &[]);
    k.create_topic(&bad, 1, &[]);
    let data = tempfile::tempdir().unwrap();
    let props = data.path().join("source.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    let plane = RecordingPlane::default();
    *plane.1.lock().unwrap() = Some(bad.clone());
    let ctl = start_control(data.path(), &plane);
    let addr = ctl.addr.to_string();
    let kip = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--bootstrap-server", &addr]);
        let o = mirrors(&all);
        assert!(o.ok, "{all:?} failed: {}", o.stderr);
        o.stdout
    };

    let props = props.to_str().unwrap();
    let created = kip(&["--create", "--mirror", "m", "--mirror-config", props]);
    assert!(created.starts_with("Created mirror m "), "{created}");
    kip(&[
        "--start",
        "--mirror-name",
        "m",
        "--topics",
        &format!("{prefix}-.*"),
    ]);
    let list = cells(&kip(&["--list"]));
    assert_eq!(
        list[0],
        [
            "MIRROR",
            "TOPICS",
            "SOURCE-CLUSTER-ID",
            "SOURCE-BOOTSTRAP-SERVER"
        ]
    );
    assert_eq!(list[1][0], "m");
    assert_eq!(list[1][1], "2");

    let table = cells(&kip(&["--describe", "--mirror", "m"]));
    assert_eq!(
        table[0],
        [
            "MIRROR",
            "TOPIC",
            "PARTITION",
            "SOURCE-OFFSET",
            "DESTINATION-OFFSET",
            "LAG",
            "STATE",
            "LAG-SECONDS",
            "VERIFIED-OFFSET",
            "ERROR",
        ],
        "the KIP's seven columns first, in its order"
    );
    let good_row = table
        .iter()
        .find(|r| r.get(1) == Some(&good))
        .unwrap_or_else(|| panic!("no row for {good}: {table:?}"));
    assert_eq!(
        good_row[..3],
        ["m".to_owned(), good.clone(), "0".to_owned()]
    );
    assert_eq!(good_row[6], "MIRRORING", "{good_row:?}");

    // JSON: the KIP's keys, the same rows whichever spelling asked.
    // The source offsets (and lag from them) are measured in the background between the two
    // calls (describe starts a ListOffsets for a FAILED partition and never waits for it), so
    // they are left out of the comparison.
    let without_measured = |text: String| -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        for row in v.as_array_mut().unwrap() {
            let row = row.as_object_mut().unwrap();
            // The integrity audit's mark moves in the background too.
            for key in [
                "sourceOffset",
                "sourceOffsetAgeMs",
                "lag",
                "lagSeconds",
                "verifiedOffset",
                "verifiedTimestampMs",
                "verifiedLagSeconds",
            ] {
                row.remove(key);
            }
        }
        v
    };
    let json_text = kip(&["--describe", "--mirror", "m", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json_text).unwrap();
    let ours = without_measured(ok(&ctl, &["describe", "--mirror", "m", "--json"]));
    assert_eq!(without_measured(json_text), ours);
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        for key in [
            "mirror",
            "topic",
            "partition",
            "sourceOffset",
            "destinationOffset",
            "lag",
            "state",
            "retryAttempt",
            "errorMessage",
        ] {
            assert!(row.get(key).is_some(), "no {key} in {row}");
        }
    }
    let failed_json = rows.iter().find(|r| r["topic"] == bad.as_str()).unwrap();
    assert_eq!(failed_json["state"], "FAILED", "{failed_json}");
    let attempt = failed_json["retryAttempt"].as_i64().unwrap();

    let failed = cells(&kip(&["--describe", "--mirror-name", "m", "--failed"]));
    assert_eq!(
        failed[0],
        ["MIRROR", "TOPIC", "PARTITION", "RETRY", "ERROR"]
    );
    assert_eq!(failed.len(), 2, "only the FAILED partition: {failed:?}");
    assert_eq!(failed[1][1], bad);
    let (n, max) = failed[1][3].split_once('/').expect("RETRY is n/max");
    assert!(
        n.parse::<i64>().unwrap() >= attempt,
        "retry {n} went back from {attempt}"
    );
    assert_eq!(
        max,
        kmirror::limits::MIRROR_RETRY_MAX_ATTEMPTS_DEFAULT.to_string(),
        "the retry limit (mirror.failed.retry.max.attempts)"
    );
    assert!(failed[1][4..].join(" ").contains("test fetcher refused"));

    // One action per call, as the KIP tool; a Kafka listener given as the admin address is
    // named as the likely mistake.
    let two = mirrors(&["--start", "--stop", "--mirror", "m", "--topics", ".*"]);
    assert!(
        !two.ok
            && two
                .stderr
                .contains("one action per call, got --start and --stop"),
        "{}",
        two.stderr
    );
    let kafka = mirrors(&["--list", "--bootstrap-server", &k.bootstrap()]);
    assert!(
        !kafka.ok && kafka.stderr.contains("not of a Kafka listener"),
        "{}",
        kafka.stderr
    );

    kip(&["--stop", "--mirror", "m", "--topics", ".*"]);
    kip(&["--delete", "--mirror-name", "m"]);
    assert_eq!(kip(&["--list", "--json"]).trim(), "[]");
    ctl.stop();
}
