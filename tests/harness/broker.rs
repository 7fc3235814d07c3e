//! Starting, stopping and addressing one Kafka broker (KRaft, or ZooKeeper for old releases).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::jars;
use super::process::{run_bounded, tail, Jvm};

/// Failure guard for the broker's log cleaner to finish a pass (it backs off 15 s between
/// checks); not a performance claim.
const CLEANER_LIMIT: Duration = Duration::from_secs(180);

/// How long a broker may take to start. Generous: the machine's two cores are shared and a cold
/// JVM on a busy box can take tens of seconds.
const START_LIMIT: Duration = Duration::from_secs(180);
/// How long a graceful shutdown (SIGTERM) may take before the harness kills the JVM.
const STOP_LIMIT: Duration = Duration::from_secs(60);
/// The session settings of the interim run that [`Kafka::restart`] makes after a kill: short
/// enough that the controller soon expires the killed incarnation's registration.
const QUICK_SESSION_AFTER_KILL: &[(&str, &str)] = &[
    ("broker.session.timeout.ms", "3000"),
    ("broker.heartbeat.interval.ms", "500"),
];
/// Attempts with fresh ports when another process took a port between our probe and the bind.
const PORT_ATTEMPTS: usize = 3;

/// A Kafka release the harness can run, and how it keeps metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaVersion {
    name: &'static str,
    metadata: Metadata,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metadata {
    Kraft,
    ZooKeeper,
}

impl KafkaVersion {
    /// The release the project targets (tests/kafka/pom.xml).
    pub const DEFAULT: KafkaVersion = KafkaVersion {
        name: "4.1.1",
        metadata: Metadata::Kraft,
    };
    /// The newest release (KRaft), as a source and for its Java clients
    /// (tests/kafka/newer/4.4.0/pom.xml).
    pub const V4_4_0: KafkaVersion = KafkaVersion {
        name: "4.4.0",
        metadata: Metadata::Kraft,
    };
    /// The last 3.x release (KRaft).
    pub const V3_9_1: KafkaVersion = KafkaVersion {
        name: "3.9.1",
        metadata: Metadata::Kraft,
    };

    /// The last release before KRaft was usable (2.8's KRaft was an early-access preview): the
    /// middle of the ZooKeeper-to-KRaft path, run with ZooKeeper.
    pub const V2_8_2: KafkaVersion = KafkaVersion {
        name: "2.8.2",
        metadata: Metadata::ZooKeeper,
    };

    /// The oldest release the harness runs: ZooKeeper-based. On Java 17 it needs a newer
    /// ZooKeeper client than it shipped with (see tests/kafka/legacy/2.1.1/pom.xml).
    pub const V2_1_1: KafkaVersion = KafkaVersion {
        name: "2.1.1",
        metadata: Metadata::ZooKeeper,
    };

    /// Every release the harness can start, newest first.
    pub const ALL: &'static [KafkaVersion] = &[
        KafkaVersion::V4_4_0,
        KafkaVersion::DEFAULT,
        KafkaVersion::V3_9_1,
        KafkaVersion::V2_8_2,
        KafkaVersion::V2_1_1,
    ];

    pub fn name(self) -> &'static str {
        self.name
    }

    /// Looks a release up by its version string ("4.1.1", "3.9.1", ...).
    pub fn parse(name: &str) -> KafkaVersion {
        *Self::ALL
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "the harness cannot run Kafka {name}; known: {:?}",
                    Self::ALL
                )
            })
    }

    /// The topic config that sets the segment size. Kafka 4 refuses `segment.bytes` below 1 MiB
    /// and offers `internal.segment.bytes` for tests that need small segments.
    pub fn segment_bytes_config(self) -> &'static str {
        if self
            .name
            .starts_with(|c: char| c.is_ascii_digit() && c >= '4')
        {
            "internal.segment.bytes"
        } else {
            "segment.bytes"
        }
    }

    /// Whether the broker keeps its metadata in ZooKeeper (releases before KRaft).
    pub fn uses_zookeeper(self) -> bool {
        self.metadata == Metadata::ZooKeeper
    }

    /// The log line a broker of this release prints once it serves clients with current metadata.
    fn started_marker(self) -> &'static str {
        match self.metadata {
            Metadata::Kraft => "Kafka Server started",
            Metadata::ZooKeeper => "] started (kafka.server.KafkaServer)",
        }
    }
}

/// One running (or stopped) broker with its own directory under the system temp dir.
pub struct Kafka {
    // Declared first so it is dropped (the JVM killed) before the directory is removed.
    jvm: Option<Jvm>,
    zookeeper: Option<Jvm>,
    pub version: KafkaVersion,
    dir: PathBuf,
    _owned_dir: Option<tempfile::TempDir>,
    port: u16,
    controller_port: u16,
    zookeeper_port: u16,
    /// The SASL_SSL listener of a broker from [`Kafka::start_sasl_ssl`].
    secure_port: u16,
    /// Extra `kafka-storage format` arguments (SCRAM users).
    format_args: Vec<String>,
    /// SIGSTOP'ed by [`Kafka::freeze`].
    frozen: bool,
    /// SIGKILL'ed by [`Kafka::kill`] since it last ran: its registration is still live in the
    /// metadata log, see [`Kafka::restart`].
    killed: bool,
}

/// What a SASL_SSL broker needs: its key store, and the users to create at format time.
pub struct SaslSslSetup<'a> {
    /// PKCS12 key store with the broker's certificate and key.
    pub keystore: &'a Path,
    pub keystore_password: &'a str,
    /// (mechanism, user, password) created with `kafka-storage format --add-scram`.
    pub scram_users: &'a [(&'a str, &'a str, &'a str)],
    /// (user, password) accepted by the PLAIN mechanism.
    pub plain_users: &'a [(&'a str, &'a str)],
    /// Extra `server.properties` lines (later ones win).
    pub extra: &'a [(&'a str, &'a str)],
}

impl Kafka {
    /// A 4.1.1 KRaft broker owned by the caller (stopped and deleted on drop).
    pub fn start_dedicated() -> Kafka {
        Kafka::start_version(KafkaVersion::DEFAULT.name())
    }

    /// A broker of an older (or the default) release, owned by the caller.
    pub fn start_version(version: &str) -> Kafka {
        Kafka::start_with(KafkaVersion::parse(version), &[])
    }

    /// A caller-owned broker with extra `server.properties` lines (later ones win).
    pub fn start_with(version: KafkaVersion, extra: &[(&str, &str)]) -> Kafka {
        Kafka::start_in(version, false, extra, None)
    }

    /// A caller-owned 4.1.1 KRaft broker with a SASL_SSL listener (SCRAM-SHA-256/512 and PLAIN)
    /// next to its PLAINTEXT one (which the test tools keep using). No authorizer: any
    /// authenticated user may do anything.
    pub fn start_sasl_ssl(setup: &SaslSslSetup<'_>) -> Kafka {
        Kafka::start_in(KafkaVersion::DEFAULT, false, setup.extra, Some(setup))
    }

    /// `host:port` of the SASL_SSL listener.
    pub fn secure_bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.secure_port)
    }

    /// The broker behind [`super::shared`]: its directory is removed by the JVM watchdog once the
    /// test process is gone, because statics are never dropped.
    pub(super) fn start_shared(version: KafkaVersion) -> Kafka {
        Kafka::start_in(version, true, &[], None)
    }

    fn start_in(
        version: KafkaVersion,
        shared: bool,
        extra: &[(&str, &str)],
        secure: Option<&SaslSslSetup<'_>>,
    ) -> Kafka {
        // Owned until the broker runs, so a failed start still removes the directory.
        let tmp = tempfile::Builder::new()
            .prefix("kmirror-kafka-")
            .tempdir()
            .expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut last_log = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut k = Kafka {
                jvm: None,
                zookeeper: None,
                version,
                dir: dir.clone(),
                _owned_dir: None,
                port: free_port(),
                controller_port: free_port(),
                zookeeper_port: free_port(),
                secure_port: free_port(),
                format_args: Vec::new(),
                frozen: false,
                killed: false,
            };
            let secure_props = secure.map(|s| k.sasl_ssl_props(s)).unwrap_or_default();
            let mut all: Vec<(&str, &str)> = secure_props
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            all.extend_from_slice(extra);
            k.write_config(&all);
            if version.metadata == Metadata::Kraft {
                k.format_storage();
            }
            match k.launch(shared) {
                Ok(()) => {
                    if shared {
                        let _ = tmp.keep();
                    } else {
                        k._owned_dir = Some(tmp);
                    }
                    return k;
                }
                Err(log) if log.contains("Address already in use") => {
                    last_log = log;
                    k.jvm.take();
                    k.zookeeper.take();
                    let _ = std::fs::remove_dir_all(k.data_dir());
                    // The shared broker's watchdog removed the whole directory with the JVM.
                    std::fs::create_dir_all(&dir).expect("recreate broker dir");
                }
                Err(log) => {
                    panic!(
                        "Kafka {} failed to start in {}:\n{log}",
                        version.name,
                        dir.display()
                    )
                }
            }
        }
        panic!(
            "Kafka {} could not bind free ports after {PORT_ATTEMPTS} tries:\n{last_log}",
            version.name
        )
    }

    /// `host:port` for clients.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's `log.dirs` folder.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The broker's own directory for one partition (`<log.dirs>/<topic>-<partition>`).
    pub fn partition_dir(&self, topic: &str, partition: i32) -> PathBuf {
        self.data_dir().join(format!("{topic}-{partition}"))
    }

    /// (broker dir, kmirror's dir under `data_dir`) of partitions `0..partitions` of `topic`,
    /// for `serve::wait_all_mirrored`.
    pub fn mirror_pairs(
        &self,
        topic: &str,
        partitions: i32,
        data_dir: &Path,
    ) -> Vec<(PathBuf, PathBuf)> {
        (0..partitions)
            .map(|p| {
                (
                    self.partition_dir(topic, p),
                    data_dir.join(format!("{topic}-{p}")),
                )
            })
            .collect()
    }

    /// Waits until the log cleaner has cleaned `topic-partition` through `offset` (its
    /// checkpoint, the first dirty offset, reached it), so every record up to there that can
    /// supersede another has done so: a later pass cannot remove anything more below it.
    pub fn wait_compacted(&self, topic: &str, partition: i32, offset: i64) {
        let start = Instant::now();
        loop {
            let cleaned = self.cleaner_checkpoint(topic, partition);
            if cleaned.is_some_and(|c| c >= offset) {
                return;
            }
            assert!(
                start.elapsed() < CLEANER_LIMIT,
                "the log cleaner did not clean {topic}-{partition} through {offset} (checkpoint \
                 {cleaned:?})"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The cleaner's checkpoint (first dirty offset) of a partition, from the log dir's
    /// `cleaner-offset-checkpoint` ("version", "count", then "topic partition offset" lines).
    fn cleaner_checkpoint(&self, topic: &str, partition: i32) -> Option<i64> {
        let text =
            std::fs::read_to_string(self.data_dir().join("cleaner-offset-checkpoint")).ok()?;
        text.lines().skip(2).find_map(|l| {
            let mut f = l.split_whitespace();
            let (t, p, o) = (f.next()?, f.next()?, f.next()?);
            (t == topic && p.parse::<i32>().ok()? == partition)
                .then(|| o.parse::<i64>().ok())
                .flatten()
        })
    }

    /// The broker's log (stdout, stderr and log4j), appended across restarts.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("broker.log")
    }

    /// The broker JVM's process id while it runs.
    pub fn jvm_pid(&self) -> Option<u32> {
        self.jvm.as_ref().map(|j| j.pid)
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.jvm {
            Some(j) => j.try_wait().is_none(),
            None => false,
        }
    }

    /// Graceful shutdown (SIGTERM): the broker flushes, writes its checkpoints and clean-shutdown
    /// marker, and trims its active segment's preallocated index files.
    pub fn stop(&mut self) {
        // A frozen JVM would never see the SIGTERM.
        if self.frozen {
            self.thaw();
        }
        let Some(mut jvm) = self.jvm.take() else {
            return;
        };
        jvm.signal("TERM");
        if jvm.wait_for(STOP_LIMIT).is_none() {
            panic!(
                "Kafka did not stop within {STOP_LIMIT:?} of SIGTERM; log tail:\n{}",
                tail(&self.log_file(), 40)
            );
        }
        drop(jvm);
    }

    /// Freezes the broker JVM (SIGSTOP), as a hung host or a frozen data centre: its sockets
    /// stay open and accept connections (the kernel's backlog), and nothing answers. The
    /// process watchdog's SIGKILL still ends a stopped JVM when the test process exits.
    pub fn freeze(&mut self) {
        if let Some(jvm) = &self.jvm {
            jvm.signal("STOP");
            self.frozen = true;
        }
    }

    /// Lets a frozen broker run again (SIGCONT).
    pub fn thaw(&mut self) {
        if let Some(jvm) = &self.jvm {
            jvm.signal("CONT");
        }
        self.frozen = false;
    }

    /// Hard crash (SIGKILL): no flush, no checkpoints, as after a power cut of the process.
    pub fn kill(&mut self) {
        if let Some(jvm) = self.jvm.take() {
            jvm.kill();
            self.killed = true;
        }
    }

    /// Starts the broker again on the same directory and ports after [`stop`](Self::stop) or
    /// [`kill`](Self::kill).
    ///
    /// After a kill, a KRaft node's controller finds the killed incarnation still registered
    /// and unfenced, and refuses the new one (DUPLICATE_BROKER_REGISTRATION) until that
    /// session expires: `broker.session.timeout.ms`, which the harness keeps at 30 s (see
    /// `write_config`), so a plain relaunch idles for half a minute. Instead the node first runs
    /// with a short session (its controller expires the old registration within seconds),
    /// then is stopped gracefully (which fences it, so the next registration is taken at once)
    /// and launched with its own configuration. The test still sees what a crash leaves: the
    /// first launch recovers the unflushed logs.
    pub fn restart(&mut self) {
        self.stop();
        if std::mem::take(&mut self.killed) && self.version.metadata == Metadata::Kraft {
            if let Err(log) = self.launch_with(false, QUICK_SESSION_AFTER_KILL) {
                panic!(
                    "Kafka {} failed to restart after a kill:\n{log}",
                    self.version.name
                );
            }
            self.stop();
        }
        if let Err(log) = self.launch(false) {
            panic!("Kafka {} failed to restart:\n{log}", self.version.name);
        }
    }

    /// Listener, TLS and SASL settings of a SASL_SSL broker; records its SCRAM users for the
    /// format step.
    fn sasl_ssl_props(&mut self, s: &SaslSslSetup<'_>) -> Vec<(String, String)> {
        self.format_args = s
            .scram_users
            .iter()
            .flat_map(|(mech, user, pw)| {
                [
                    "--add-scram".to_string(),
                    format!("{mech}=[name={user},password={pw}]"),
                ]
            })
            .collect();
        let plain_users: String = s
            .plain_users
            .iter()
            .map(|(u, p)| format!(" user_{u}=\"{p}\""))
            .collect();
        let scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
        let v = |x: &str| x.to_string();
        vec![
            (
                v("listeners"),
                format!(
                    "PLAINTEXT://127.0.0.1:{},SASL_SSL://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                    self.port, self.secure_port, self.controller_port
                ),
            ),
            (
                v("advertised.listeners"),
                format!(
                    "PLAINTEXT://127.0.0.1:{},SASL_SSL://127.0.0.1:{}",
                    self.port, self.secure_port
                ),
            ),
            (
                v("listener.security.protocol.map"),
                v("PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"),
            ),
            (
                v("sasl.enabled.mechanisms"),
                v("SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"),
            ),
            (
                v("listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config"),
                v(scram),
            ),
            (
                v("listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"),
                v(scram),
            ),
            (
                v("listener.name.sasl_ssl.plain.sasl.jaas.config"),
                format!(
                    "org.apache.kafka.common.security.plain.PlainLoginModule required{plain_users};"
                ),
            ),
            (v("ssl.keystore.location"), s.keystore.display().to_string()),
            (v("ssl.keystore.type"), v("PKCS12")),
            (v("ssl.keystore.password"), v(s.keystore_password)),
            (v("ssl.key.password"), v(s.keystore_password)),
        ]
    }

    fn config_path(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    fn write_config(&self, extra: &[(&str, &str)]) {
        let data = self.data_dir();
        let mut props: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| {
            // Later lines win, as in a properties file, without leaving the earlier one.
            props.retain(|(key, _)| key != k);
            props.push((k.to_string(), v))
        };
        match self.version.metadata {
            Metadata::Kraft => {
                set("process.roles", "broker,controller".into());
                set("node.id", "1".into());
                set(
                    "controller.quorum.voters",
                    format!("1@127.0.0.1:{}", self.controller_port),
                );
                set(
                    "listeners",
                    format!(
                        "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                        self.port, self.controller_port
                    ),
                );
                set("controller.listener.names", "CONTROLLER".into());
                set(
                    "listener.security.protocol.map",
                    "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT".into(),
                );
                set("inter.broker.listener.name", "PLAINTEXT".into());
                // A starved JVM on a loaded test machine misses heartbeats to its own
                // controller; the default 9 s would fence it and take its partitions offline.
                set("broker.session.timeout.ms", "30000".into());
            }
            Metadata::ZooKeeper => {
                set("broker.id", "0".into());
                set(
                    "zookeeper.connect",
                    format!("127.0.0.1:{}", self.zookeeper_port),
                );
                set("listeners", format!("PLAINTEXT://127.0.0.1:{}", self.port));
                // Kafka 2.1's 6 s session would expire under load and re-elect the controller.
                set("zookeeper.session.timeout.ms", "30000".into());
                set("zookeeper.connection.timeout.ms", "30000".into());
            }
        }
        set(
            "advertised.listeners",
            format!("PLAINTEXT://127.0.0.1:{}", self.port),
        );
        set("log.dirs", data.display().to_string());
        set("num.partitions", "1".into());
        set("auto.create.topics.enable", "false".into());
        set("offsets.topic.replication.factor", "1".into());
        // One partition each: creating 50 internal partitions costs seconds at every start.
        set("offsets.topic.num.partitions", "1".into());
        set("transaction.state.log.replication.factor", "1".into());
        set("transaction.state.log.min.isr", "1".into());
        set("transaction.state.log.num.partitions", "1".into());
        set("group.initial.rebalance.delay.ms", "0".into());
        if self.version.name.starts_with('4') {
            set(
                "share.coordinator.state.topic.replication.factor",
                "1".into(),
            );
            set("share.coordinator.state.topic.min.isr", "1".into());
        }
        for (k, v) in extra {
            set(k, v.to_string());
        }
        let text: String = props.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        std::fs::write(self.config_path(), text).expect("write server.properties");
        std::fs::write(self.dir.join("log4j.properties"), BROKER_LOG4J).expect("write log4j");
    }

    /// `kafka-storage format`: a KRaft broker refuses to start on an unformatted directory.
    fn format_storage(&self) {
        let _ = std::fs::remove_dir_all(self.data_dir());
        // StorageTool's argument parser reads an id starting with '-' as an option, so draw
        // again in that case (Kafka's own Uuid.randomUuid does the same).
        let cluster_id = loop {
            let id = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(uuid::Uuid::new_v4().as_bytes());
            if !id.starts_with('-') {
                break id;
            }
        };
        let mut cmd = Command::new(jars::java());
        cmd.args(jars::tool_jvm_flags())
            .arg("-cp")
            .arg(jars::classpath(self.version.name))
            .arg("kafka.tools.StorageTool")
            .args(["format", "-t", &cluster_id, "-c"])
            .arg(self.config_path())
            .args(&self.format_args);
        let out = run_bounded(&mut cmd, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "StorageTool format failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `overrides` go after the properties file as `--override key=value` (they win).
    fn broker_command(&self, overrides: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(jars::java());
        cmd.args([
            "-Xmx512m",
            "-Xms128m",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
        ])
        .arg(format!(
            "-Dlog4j.configuration=file:{}",
            self.dir.join("log4j.properties").display()
        ))
        .arg(jars::quiet_logging_flags().pop().expect("log4j2 flag"))
        .arg("-cp")
        .arg(jars::classpath(self.version.name))
        .arg("kafka.Kafka")
        .arg(self.config_path())
        .current_dir(&self.dir);
        for (k, v) in overrides {
            cmd.arg("--override").arg(format!("{k}={v}"));
        }
        cmd
    }

    /// Starts the JVM(s) and waits until the broker serves clients. `Err` carries the log tail.
    fn launch(&mut self, remove_dir_after: bool) -> Result<(), String> {
        self.launch_with(remove_dir_after, &[])
    }

    /// As [`launch`](Self::launch), with `--override` properties for this run only.
    fn launch_with(
        &mut self,
        remove_dir_after: bool,
        overrides: &[(&str, &str)],
    ) -> Result<(), String> {
        if self.version.metadata == Metadata::ZooKeeper && self.zookeeper.is_none() {
            self.launch_zookeeper()?;
        }
        let log = self.log_file();
        let log_start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let remove_after = remove_dir_after.then_some(self.dir.as_path());
        self.jvm = Some(Jvm::spawn(
            &self.broker_command(overrides),
            &log,
            remove_after,
        ));
        self.wait_started(&log, log_start)
    }

    fn launch_zookeeper(&mut self) -> Result<(), String> {
        let conf = self.dir.join("zookeeper.properties");
        let text = format!(
            "dataDir={}\nclientPortAddress=127.0.0.1\nclientPort={}\nmaxClientCnxns=0\nadmin.enableServer=false\n",
            self.dir.join("zookeeper").display(),
            self.zookeeper_port
        );
        std::fs::write(&conf, text).expect("write zookeeper.properties");
        let mut cmd = Command::new(jars::java());
        cmd.args(["-Xmx128m", "-XX:+UseSerialGC"])
            .arg(format!(
                "-Dlog4j.configuration=file:{}",
                self.dir.join("log4j.properties").display()
            ))
            .arg("-cp")
            .arg(jars::classpath(self.version.name))
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&conf)
            .current_dir(&self.dir);
        let log = self.dir.join("zookeeper.log");
        let mut zk = Jvm::spawn(&cmd, &log, None);
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if TcpStream::connect(("127.0.0.1", self.zookeeper_port)).is_ok() {
                self.zookeeper = Some(zk);
                return Ok(());
            }
            if let Some(status) = zk.try_wait() {
                return Err(format!(
                    "ZooKeeper exited with {status}; log tail:\n{}",
                    tail(&log, 40)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "ZooKeeper not ready in {START_LIMIT:?}:\n{}",
                    tail(&log, 40)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_started(&mut self, log: &Path, log_start: u64) -> Result<(), String> {
        let deadline = Instant::now() + START_LIMIT;
        let marker = self.version.started_marker();
        loop {
            let text = std::fs::read(log).unwrap_or_default();
            let fresh = String::from_utf8_lossy(&text[(log_start as usize).min(text.len())..]);
            if fresh.contains(marker) && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            let exited = self.jvm.as_mut().and_then(|j| j.try_wait());
            if let Some(status) = exited {
                return Err(format!(
                    "broker exited with {status}; log tail:\n{}",
                    tail(log, 60)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "broker not ready within {START_LIMIT:?}; log tail:\n{}",
                    tail(log, 60)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Broker logging: everything at INFO to stdout, which the watchdog appends to `broker.log`.
pub(super) const BROKER_LOG4J: &str = "log4j.rootLogger=INFO, stdout\n\
    log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n\
    log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n\
    log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n";

/// A port that was free a moment ago. Another process may take it before the broker binds it;
/// the caller retries with new ports when the broker log says so.
fn free_port() -> u16 {
    super::ports::reserved_port()
}
