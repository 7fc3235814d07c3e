//! A small multi-node KRaft cluster (4.1.1, from the same Maven jars as `broker.rs`): one
//! controller-only node (id 1) and brokers 2, 3, ... on their own ports and directories, for
//! tests that need replication (unclean leader elections, ISR changes). The controller stays
//! up while brokers are stopped, killed and restarted, so metadata keeps moving.
//!
//! Timeouts are short so a dead broker is fenced within seconds (`broker.session.timeout.ms`
//! 3 s, heartbeats every 500 ms) and a follower that stops fetching leaves the ISR quickly
//! (`replica.lag.time.max.ms` 3 s).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::broker::{KafkaVersion, BROKER_LOG4J};
use super::jars;
use super::process::{run_bounded, tail, Jvm};

/// How long a node may take to start on a loaded 2-core machine (a failure guard).
const START_LIMIT: Duration = Duration::from_secs(180);
const STOP_LIMIT: Duration = Duration::from_secs(60);
const CONTROLLER_ID: i32 = 1;

/// One node of the cluster.
struct Node {
    // Declared first so it is dropped (the JVM killed) before the directory is removed.
    jvm: Option<Jvm>,
    id: i32,
    dir: PathBuf,
    /// The PLAINTEXT port (brokers) or the CONTROLLER port (the controller).
    port: u16,
}

impl Node {
    fn config_path(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("node.log")
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
}

/// A running cluster; dropped: every JVM killed, the directories removed.
pub struct KraftCluster {
    controller: Node,
    brokers: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl KraftCluster {
    /// A controller and `brokers` brokers (ids 2..), each formatted and started; `extra` goes
    /// into every broker's `server.properties` (later keys win).
    pub fn start(brokers: usize, extra: &[(&str, &str)]) -> KraftCluster {
        let tmp = tempfile::Builder::new()
            .prefix("kmirror-cluster-")
            .tempdir()
            .expect("tempdir");
        let node = |id: i32, name: &str| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).expect("node dir");
            Node {
                jvm: None,
                id,
                dir,
                port: super::ports::reserved_port(),
            }
        };
        let controller = node(CONTROLLER_ID, "controller");
        let brokers: Vec<Node> = (0..brokers)
            .map(|i| node(2 + i as i32, &format!("broker-{}", 2 + i)))
            .collect();
        let voters = format!("{CONTROLLER_ID}@127.0.0.1:{}", controller.port);
        let common = |set: &mut Vec<(String, String)>, n: &Node| {
            set.push(("node.id".into(), n.id.to_string()));
            set.push(("controller.quorum.voters".into(), voters.clone()));
            set.push(("controller.listener.names".into(), "CONTROLLER".into()));
            set.push(("log.dirs".into(), n.data_dir().display().to_string()));
            set.push(("broker.session.timeout.ms".into(), "3000".into()));
            set.push(("broker.heartbeat.interval.ms".into(), "500".into()));
        };
        let mut props = Vec::new();
        common(&mut props, &controller);
        props.push(("process.roles".into(), "controller".into()));
        props.push((
            "listeners".into(),
            format!("CONTROLLER://127.0.0.1:{}", controller.port),
        ));
        props.push((
            "listener.security.protocol.map".into(),
            "CONTROLLER:PLAINTEXT".into(),
        ));
        write_props(&controller, &props);
        for b in &brokers {
            let mut props = Vec::new();
            common(&mut props, b);
            for (k, v) in [
                ("process.roles", "broker".to_string()),
                ("listeners", format!("PLAINTEXT://127.0.0.1:{}", b.port)),
                (
                    "advertised.listeners",
                    format!("PLAINTEXT://127.0.0.1:{}", b.port),
                ),
                (
                    "listener.security.protocol.map",
                    "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".into(),
                ),
                ("inter.broker.listener.name", "PLAINTEXT".into()),
                ("replica.lag.time.max.ms", "3000".into()),
                ("num.partitions", "1".into()),
                ("auto.create.topics.enable", "false".into()),
                ("offsets.topic.replication.factor", "1".into()),
                ("offsets.topic.num.partitions", "1".into()),
                ("transaction.state.log.replication.factor", "1".into()),
                ("transaction.state.log.min.isr", "1".into()),
                ("transaction.state.log.num.partitions", "1".into()),
                (
                    "share.coordinator.state.topic.replication.factor",
                    "1".into(),
                ),
                ("share.coordinator.state.topic.min.isr", "1".into()),
                ("group.initial.rebalance.delay.ms", "0".into()),
            ] {
                props.push((k.into(), v));
            }
            for (k, v) in extra {
                props.push(((*k).into(), (*v).into()));
            }
            write_props(b, &props);
        }
        let cluster_id = loop {
            let id = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(uuid::Uuid::new_v4().as_bytes());
            if !id.starts_with('-') {
                break id;
            }
        };
        // Formatting is a JVM start each: run them side by side.
        let configs: Vec<PathBuf> = std::iter::once(&controller)
            .chain(&brokers)
            .map(Node::config_path)
            .collect();
        std::thread::scope(|s| {
            for c in &configs {
                let id = cluster_id.clone();
                s.spawn(move || format(&id, c));
            }
        });
        let mut cluster = KraftCluster {
            controller,
            brokers,
            _dir: tmp,
        };
        launch(&mut cluster.controller, None);
        for i in 0..cluster.brokers.len() {
            launch(&mut cluster.brokers[i], Some("Kafka Server started"));
        }
        cluster
    }

    fn broker(&self, id: i32) -> &Node {
        self.brokers
            .iter()
            .find(|b| b.id == id)
            .unwrap_or_else(|| panic!("no broker {id}"))
    }

    fn broker_mut(&mut self, id: i32) -> &mut Node {
        self.brokers
            .iter_mut()
            .find(|b| b.id == id)
            .unwrap_or_else(|| panic!("no broker {id}"))
    }

    /// `host:port` of one broker.
    pub fn bootstrap_of(&self, id: i32) -> String {
        format!("127.0.0.1:{}", self.broker(id).port)
    }

    /// Every broker, comma-separated (those down too: clients skip them).
    pub fn bootstrap(&self) -> String {
        self.brokers
            .iter()
            .map(|b| format!("127.0.0.1:{}", b.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The partition directory of `topic`-`partition` on broker `id`.
    pub fn partition_dir(&self, id: i32, topic: &str, partition: i32) -> PathBuf {
        self.broker(id)
            .data_dir()
            .join(format!("{topic}-{partition}"))
    }

    /// SIGTERM (controlled shutdown: the controller moves leadership away and drops the
    /// broker from every ISR) and waits for the exit.
    pub fn stop(&mut self, id: i32) {
        let node = self.broker_mut(id);
        let Some(mut jvm) = node.jvm.take() else {
            return;
        };
        jvm.signal("TERM");
        assert!(
            jvm.wait_for(STOP_LIMIT).is_some(),
            "broker {id} did not stop within {STOP_LIMIT:?}; log tail:\n{}",
            tail(&node.log_file(), 40)
        );
    }

    /// kill -9: the broker's files stay as they were, its leadership dies with it.
    pub fn kill(&mut self, id: i32) {
        if let Some(jvm) = self.broker_mut(id).jvm.take() {
            jvm.kill();
        }
    }

    /// Starts a stopped or killed broker again on its port and directory.
    pub fn start_broker(&mut self, id: i32) {
        launch(self.broker_mut(id), Some("Kafka Server started"));
    }

    /// The partition's leader as broker `via` reports it (`-1`/`none`: no leader).
    pub fn leader(&self, via: i32, topic: &str, partition: i32) -> Option<i32> {
        let text = super::kafka_topics(&self.bootstrap_of(via), &["--describe", "--topic", topic]);
        text.lines()
            .find(|l| l.contains(&format!("Partition: {partition}")) && l.contains("Leader:"))
            .and_then(|l| l.split("Leader:").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|id| *id >= 0)
    }

    /// The in-sync replicas of the partition as broker `via` reports them.
    pub fn isr(&self, via: i32, topic: &str, partition: i32) -> Vec<i32> {
        let text = super::kafka_topics(&self.bootstrap_of(via), &["--describe", "--topic", topic]);
        text.lines()
            .find(|l| l.contains(&format!("Partition: {partition}")) && l.contains("Isr:"))
            .and_then(|l| l.split("Isr:").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Waits (bounded) until `check` holds, polling every 300 ms; panics with `what`.
    pub fn wait_until(&self, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?}; controller log tail:\n{}",
                tail(&self.controller.log_file(), 30)
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// `kafka-leader-election.sh --election-type <kind>` for one partition, via broker `via`;
    /// returns its output and whether it succeeded (an election not needed is a failure there).
    pub fn elect(&self, via: i32, kind: &str, topic: &str, partition: i32) -> (bool, String) {
        let mut cmd = Command::new(jars::java());
        cmd.args(jars::tool_jvm_flags())
            .arg("-cp")
            .arg(jars::classpath(KafkaVersion::DEFAULT.name()))
            .arg("org.apache.kafka.tools.LeaderElectionCommand")
            .args(["--bootstrap-server", &self.bootstrap_of(via)])
            .args(["--election-type", kind, "--topic", topic])
            .args(["--partition", &partition.to_string()]);
        let out = run_bounded(&mut cmd, Duration::from_secs(120));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

fn write_props(node: &Node, props: &[(String, String)]) {
    let mut seen: Vec<(String, String)> = Vec::new();
    for (k, v) in props {
        seen.retain(|(key, _)| key != k);
        seen.push((k.clone(), v.clone()));
    }
    let text: String = seen.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(node.config_path(), text).expect("write server.properties");
    std::fs::write(node.dir.join("log4j.properties"), BROKER_LOG4J).expect("write log4j");
}

fn format(cluster_id: &str, config: &Path) {
    let mut cmd = Command::new(jars::java());
    cmd.args(jars::tool_jvm_flags())
        .arg("-cp")
        .arg(jars::classpath(KafkaVersion::DEFAULT.name()))
        .arg("kafka.tools.StorageTool")
        .args(["format", "-t", cluster_id, "-c"])
        .arg(config);
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "StorageTool format {} failed:\n{}{}",
        config.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the node's JVM and waits until its port accepts connections (and, for a broker,
/// its log says it started).
fn launch(node: &mut Node, marker: Option<&str>) {
    let mut cmd = Command::new(jars::java());
    cmd.args([
        "-Xmx384m",
        "-Xms64m",
        "-XX:+UseSerialGC",
        "-Djava.awt.headless=true",
    ])
    .arg(format!(
        "-Dlog4j.configuration=file:{}",
        node.dir.join("log4j.properties").display()
    ))
    .arg(jars::quiet_logging_flags().pop().expect("log4j2 flag"))
    .arg("-cp")
    .arg(jars::classpath(KafkaVersion::DEFAULT.name()))
    .arg("kafka.Kafka")
    .arg(node.config_path())
    .current_dir(&node.dir);
    let log = node.log_file();
    let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize;
    node.jvm = Some(Jvm::spawn(&cmd, &log, None));
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let text = std::fs::read(&log).unwrap_or_default();
        let fresh = String::from_utf8_lossy(&text[from.min(text.len())..]);
        let logged = marker.is_none_or(|m| fresh.contains(m));
        if logged && TcpStream::connect(("127.0.0.1", node.port)).is_ok() {
            return;
        }
        if let Some(status) = node.jvm.as_mut().and_then(|j| j.try_wait()) {
            panic!(
                "node {} exited with {status}; log tail:\n{}",
                node.id,
                tail(&log, 60)
            );
        }
        assert!(
            Instant::now() < deadline,
            "node {} not ready within {START_LIMIT:?}; log tail:\n{}",
            node.id,
            tail(&log, 60)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
