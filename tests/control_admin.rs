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

#[derive(Clone, Default)]
struct RecordingPlane(Arc<Mutex<BTreeSet<TopicPartition>>>);

impl DataPlane for RecordingPlane {
    fn add(
        &mut self,
        _: &MirrorDefinition,
        tp: &TopicPartition,
        _: Uuid,
        _: StartFrom,
    ) -> Result<(), kmirror::control::controller::Fault> {
        self.0.lock().unwrap().insert(tp.clone());
        Ok(())
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
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("mirrors")
        .args(args)
        .args(["--admin", &addr])
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
