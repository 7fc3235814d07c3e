//! The Java clients, through `tests/java/KafkaTool.java`: create topics, produce with any codec,
//! idempotence or transactions, consume, list offsets, delete records, alter configs.
//!
//! Every function takes a bootstrap address, so the same calls work against a Kafka broker and
//! against kmirror's own Kafka-protocol endpoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;

use super::broker::{Kafka, KafkaVersion};
use super::jars;
use super::process::run_bounded;

/// A tool run that takes longer than this has hung (a produce of a few thousand records takes
/// seconds).
const TOOL_LIMIT: Duration = Duration::from_secs(180);

/// Compression codec of produced batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    pub const ALL: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ];

    /// The name Kafka uses (`compression.type`, and DumpLogSegments' `compresscodec:`).
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

/// How one transaction of a transactional produce ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnEnd {
    Commit,
    Abort,
    /// Left open: the producer process halts without ending it (only valid last).
    Open,
}

impl TxnEnd {
    fn name(self) -> &'static str {
        match self {
            TxnEnd::Commit => "commit",
            TxnEnd::Abort => "abort",
            TxnEnd::Open => "open",
        }
    }
}

/// How to produce. Record `i` has key `key-<seed>-<i>` and a value of `value_bytes` letters
/// drawn from a generator seeded with `seed`, so runs are reproducible.
#[derive(Debug, Clone)]
pub struct ProduceOpts {
    pub codec: Codec,
    pub idempotent: bool,
    /// One transaction per entry, records split evenly among them. Empty: not transactional.
    pub transactions: Vec<TxnEnd>,
    pub transactional_id: Option<String>,
    pub transaction_timeout_ms: Option<u32>,
    /// Producer `batch.size` in bytes.
    pub batch_size: u32,
    /// Producer `linger.ms`.
    pub linger_ms: u32,
    pub seed: u64,
    pub value_bytes: usize,
    /// Headers per record (`h0`, `h1`, ...).
    pub headers: u32,
    /// When non-zero, record `i` goes to partition `i % spread` instead of the given partition.
    pub spread: u32,
}

impl Default for ProduceOpts {
    fn default() -> Self {
        ProduceOpts {
            codec: Codec::None,
            idempotent: false,
            transactions: Vec::new(),
            transactional_id: None,
            transaction_timeout_ms: None,
            batch_size: 16384,
            linger_ms: 5,
            seed: 1,
            value_bytes: 100,
            headers: 0,
            spread: 0,
        }
    }
}

/// What a produce reported: the offset of every record, in send order.
#[derive(Debug, Clone, Deserialize)]
pub struct Produced {
    pub count: usize,
    pub first_offset: i64,
    pub last_offset: i64,
    pub offsets: Vec<i64>,
}

/// Consumer `isolation.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadUncommitted,
    ReadCommitted,
}

/// One consumed record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedRecord {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
}

#[derive(Deserialize)]
struct RawRecord {
    offset: i64,
    timestamp: i64,
    key: Option<String>,
    value: Option<String>,
    headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Offsets {
    pub log_start_offset: i64,
    pub log_end_offset: i64,
}

/// Runs `KafkaTool <args>`; panics with its stderr if it fails.
pub fn run_tool(args: &[String]) -> Output {
    run_tool_with(KafkaVersion::DEFAULT, args)
}

/// As [`run_tool`], on the Java clients of release `clients`.
pub fn run_tool_with(clients: KafkaVersion, args: &[String]) -> Output {
    let out = run_in_session(clients, args)
        .unwrap_or_else(|| run_bounded(&mut tool_command_with(clients, args), TOOL_LIMIT));
    assert!(
        out.status.success(),
        "KafkaTool {} on Kafka {} clients failed ({}):\n{}",
        args.join(" "),
        clients.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `KafkaTool <args>` and returns whatever happened, for tests that expect failures.
pub fn run_tool_unchecked(args: &[String]) -> Output {
    run_in_session(KafkaVersion::DEFAULT, args)
        .unwrap_or_else(|| run_bounded(&mut tool_command(args), TOOL_LIMIT))
}

/// One KafkaTool JVM (`KafkaTool session`) running, one after another, the commands of the
/// thread that opened it (`with_tool_session`).
struct ToolSession {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    answers: std::sync::mpsc::Receiver<String>,
}

impl ToolSession {
    fn start() -> ToolSession {
        let mut cmd = java_tool(KafkaVersion::DEFAULT, &["session".to_owned()]);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            // The clients' own log lines (warnings only); a command's stderr is in its answer.
            .stderr(std::process::Stdio::inherit());
        let mut child = cmd.spawn().expect("start KafkaTool session");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped");
        let (tx, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ToolSession {
            child,
            stdin,
            answers,
        }
    }

    /// Runs one command; its exit status, stdout and stderr as a run of its own would give.
    fn run(&mut self, args: &[String]) -> Output {
        use std::io::Write;
        use std::os::unix::process::ExitStatusExt;
        let b64 = base64::engine::general_purpose::STANDARD;
        let line: Vec<String> = args.iter().map(|a| b64.encode(a)).collect();
        let stdin = self.stdin.as_mut().expect("open until drop");
        writeln!(stdin, "{}", line.join(" ")).expect("write to KafkaTool session");
        stdin.flush().expect("write to KafkaTool session");
        let answer = match self.answers.recv_timeout(TOOL_LIMIT) {
            Ok(a) => a,
            Err(e) => {
                let _ = self.child.kill();
                panic!(
                    "KafkaTool session: no answer to {} within {TOOL_LIMIT:?} ({e})",
                    args.join(" ")
                );
            }
        };
        let mut parts = answer.splitn(3, ' ');
        let (Some(status), Some(out), Some(err)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("KafkaTool session answered {answer:?}");
        };
        let decode = |t: &str| {
            b64.decode(t)
                .unwrap_or_else(|e| panic!("KafkaTool session answered {answer:?}: {e}"))
        };
        let code: i32 = status
            .parse()
            .unwrap_or_else(|e| panic!("KafkaTool session answered {answer:?}: {e}"));
        Output {
            // A wait status: the exit code in the second byte.
            status: std::process::ExitStatus::from_raw(code << 8),
            stdout: decode(out),
            stderr: decode(err),
        }
    }
}

impl Drop for ToolSession {
    fn drop(&mut self) {
        // End of stdin ends the session; a command still running is killed.
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

thread_local! {
    /// The KafkaTool session of this thread, while `with_tool_session` runs.
    static SESSION: std::cell::RefCell<Option<ToolSession>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with every KafkaTool command it runs on this thread on the default clients
/// (`produce`, `consume`, `try_consume`, `offsets`, ...) sent to one JVM instead of a JVM
/// each: the same commands, arguments and client configs, and the same exit status, stdout
/// and stderr (`KafkaTool session`). Saves a JVM start per call; for tests that make many
/// short client checks. Commands that halt the JVM or read stdin do not belong in it.
pub fn with_tool_session<T>(f: impl FnOnce() -> T) -> T {
    let nested = SESSION.with(|s| s.borrow().is_some());
    if nested {
        return f();
    }
    SESSION.with(|s| *s.borrow_mut() = Some(ToolSession::start()));
    struct End;
    impl Drop for End {
        fn drop(&mut self) {
            let session = SESSION.with(|s| s.borrow_mut().take());
            drop(session);
        }
    }
    let _end = End;
    f()
}

/// `args` run in this thread's session (with the thread's client config, as
/// `tool_command_with` adds it), or `None` outside one or for other clients than the default.
fn run_in_session(clients: KafkaVersion, args: &[String]) -> Option<Output> {
    if clients != KafkaVersion::DEFAULT {
        return None;
    }
    SESSION.with(|s| {
        let mut s = s.borrow_mut();
        let session = s.as_mut()?;
        let mut full = args.to_vec();
        CLIENT_CONFIG.with(|c| {
            if let Some(path) = &*c.borrow() {
                full.push("--command-config".to_owned());
                full.push(path.display().to_string());
            }
        });
        Some(session.run(&full))
    })
}

/// The command that runs `KafkaTool <args>`, for tests that talk to it while it runs.
pub fn tool_command(args: &[String]) -> Command {
    tool_command_with(KafkaVersion::DEFAULT, args)
}

/// The command that runs `KafkaTool <args>` on the Java clients of release `clients`
/// (compiled against them and run with their jars), e.g. to check that a newer client works.
pub fn tool_command_with(clients: KafkaVersion, args: &[String]) -> Command {
    let mut cmd = java_tool(clients, args);
    CLIENT_CONFIG.with(|c| {
        if let Some(path) = &*c.borrow() {
            cmd.arg("--command-config").arg(path);
        }
    });
    cmd
}

/// `java ... KafkaTool <args>` on the Java clients of release `clients`, nothing else added.
fn java_tool(clients: KafkaVersion, args: &[String]) -> Command {
    let libs = jars::classpath(clients.name());
    let mut cmd = Command::new(jars::java());
    cmd.args(jars::tool_jvm_flags())
        .arg("-cp")
        .arg(format!("{}:{libs}", compiled_tool(clients).display()))
        .arg("KafkaTool")
        .args(args);
    cmd
}

thread_local! {
    /// The client properties file every KafkaTool run of this thread is given.
    static CLIENT_CONFIG: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with every KafkaTool client it starts (on this thread) configured from the
/// properties file `config` (`--command-config`: security.protocol, SASL settings), so the
/// ordinary helpers (`produce`, `consume`, ...) work against an authenticating listener.
pub fn with_client_config<T>(config: &Path, f: impl FnOnce() -> T) -> T {
    let before = CLIENT_CONFIG.with(|c| c.replace(Some(config.to_path_buf())));
    struct Restore(Option<PathBuf>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            CLIENT_CONFIG.with(|c| *c.borrow_mut() = before);
        }
    }
    let _restore = Restore(before);
    f()
}

/// Compiles KafkaTool.java once per source version and client release into the cache (a JVM
/// compiling the source on every launch would add seconds to each call).
fn compiled_tool(clients: KafkaVersion) -> PathBuf {
    static DIRS: Mutex<Vec<(KafkaVersion, PathBuf)>> = Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, dir)) = dirs.iter().find(|(v, _)| *v == clients) {
        return dir.clone();
    }
    let dir = compile_tool(clients);
    dirs.push((clients, dir.clone()));
    dir
}

fn compile_tool(clients: KafkaVersion) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/KafkaTool.java");
    let text = std::fs::read(&src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    let key = crc32fast::hash(&text);
    let dir = jars::cache_root()
        .join("kafkatool")
        .join(format!("{}-{key:08x}", clients.name()));
    if dir.join("KafkaTool.class").exists() {
        return dir;
    }
    let tmp = jars::cache_root()
        .join("kafkatool")
        .join(format!(".build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("create tool build dir");
    let mut cmd = Command::new(jars::javac());
    cmd.args(["-nowarn", "-d"])
        .arg(&tmp)
        .arg("-cp")
        .arg(jars::classpath(clients.name()))
        .arg(&src);
    let out = run_bounded(&mut cmd, TOOL_LIMIT);
    assert!(
        out.status.success(),
        "javac KafkaTool.java against Kafka {} clients:\n{}",
        clients.name(),
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test process may have finished the same build first; either copy is good.
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    assert!(
        dir.join("KafkaTool.class").exists(),
        "compiled tool missing in {}",
        dir.display()
    );
    dir
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn parse_json<T: for<'de> Deserialize<'de>>(line: &str) -> T {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("KafkaTool printed {line:?}: {e}"))
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

pub fn create_topic(bootstrap: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut args = vec![
        s("create-topic"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
    ];
    args.extend([s("--partitions"), s(partitions)]);
    for (k, v) in configs {
        args.extend([s("--config"), format!("{k}={v}")]);
    }
    run_tool(&args);
}

pub fn produce(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    n: usize,
    o: &ProduceOpts,
) -> Produced {
    produce_with(KafkaVersion::DEFAULT, bootstrap, topic, partition, n, o)
}

/// As [`produce`], with the Java producer of release `clients`.
pub fn produce_with(
    clients: KafkaVersion,
    bootstrap: &str,
    topic: &str,
    partition: i32,
    n: usize,
    o: &ProduceOpts,
) -> Produced {
    let mut args = vec![
        s("produce"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
    ];
    args.extend([s("--partition"), s(partition), s("--count"), s(n)]);
    args.extend([s("--codec"), s(o.codec.name()), s("--seed"), s(o.seed)]);
    args.extend([
        s("--batch-size"),
        s(o.batch_size),
        s("--linger-ms"),
        s(o.linger_ms),
    ]);
    args.extend([
        s("--value-bytes"),
        s(o.value_bytes),
        s("--headers"),
        s(o.headers),
    ]);
    if o.spread > 0 {
        args.extend([s("--spread"), s(o.spread)]);
    }
    if o.idempotent {
        args.push(s("--idempotent"));
    }
    if !o.transactions.is_empty() {
        let ends: Vec<&str> = o.transactions.iter().map(|t| t.name()).collect();
        args.extend([s("--txns"), ends.join(",")]);
    }
    if let Some(id) = &o.transactional_id {
        args.extend([s("--txn-id"), s(id)]);
    }
    if let Some(ms) = o.transaction_timeout_ms {
        args.extend([s("--txn-timeout-ms"), s(ms)]);
    }
    let out = run_tool_with(clients, &args);
    let lines = stdout_lines(&out);
    let produced: Produced = parse_json(lines.last().expect("produce printed nothing"));
    assert_eq!(
        produced.count, n,
        "producer acknowledged {} of {n} records",
        produced.count
    );
    produced
}

pub fn consume(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    from: i64,
    max: usize,
    isolation: Isolation,
) -> Vec<ConsumedRecord> {
    let range = (from, max, false);
    consume_with(
        KafkaVersion::DEFAULT,
        bootstrap,
        topic,
        partition,
        range,
        isolation,
    )
}

/// Every record from offset 0 up to the partition's end offset (its last stable offset under
/// read_committed), read by the Java consumer; it stops there instead of waiting for more.
pub fn consume_to_end(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    isolation: Isolation,
) -> Vec<ConsumedRecord> {
    consume_to_end_with(
        KafkaVersion::DEFAULT,
        bootstrap,
        topic,
        partition,
        isolation,
    )
}

/// As [`consume_to_end`], with the Java consumer of release `clients`.
pub fn consume_to_end_with(
    clients: KafkaVersion,
    bootstrap: &str,
    topic: &str,
    partition: i32,
    isolation: Isolation,
) -> Vec<ConsumedRecord> {
    let range = (0, usize::MAX, true);
    consume_with(clients, bootstrap, topic, partition, range, isolation)
}

/// As [`consume_to_end`], with more consumer settings read from the properties file
/// `client_properties` (security.protocol, ssl.*).
pub fn consume_to_end_configured(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    client_properties: &std::path::Path,
) -> Vec<ConsumedRecord> {
    let range = (0, usize::MAX, true);
    let extra = [
        s("--client-properties"),
        client_properties.display().to_string(),
    ];
    consume_args(
        KafkaVersion::DEFAULT,
        bootstrap,
        topic,
        partition,
        range,
        Isolation::ReadUncommitted,
        &extra,
    )
}

/// `range` is (first offset, most records, whether to stop at the end offset).
fn consume_with(
    clients: KafkaVersion,
    bootstrap: &str,
    topic: &str,
    partition: i32,
    range: (i64, usize, bool),
    isolation: Isolation,
) -> Vec<ConsumedRecord> {
    consume_args(clients, bootstrap, topic, partition, range, isolation, &[])
}

fn consume_args(
    clients: KafkaVersion,
    bootstrap: &str,
    topic: &str,
    partition: i32,
    (from, max, until_end): (i64, usize, bool),
    isolation: Isolation,
    extra: &[String],
) -> Vec<ConsumedRecord> {
    let iso = match isolation {
        Isolation::ReadCommitted => "read_committed",
        Isolation::ReadUncommitted => "read_uncommitted",
    };
    let mut args = vec![
        s("consume"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
    ];
    args.extend([
        s("--partition"),
        s(partition),
        s("--from"),
        s(from),
        s("--max"),
        s(max.min(i32::MAX as usize)),
    ]);
    args.extend([s("--isolation"), s(iso)]);
    if until_end {
        // Reaching the end is the stop condition; the timeout only guards against a hang.
        args.extend([s("--until-end"), s(true), s("--timeout-ms"), s(120_000)]);
    } else {
        args.extend([s("--timeout-ms"), s(30_000)]);
    }
    args.extend_from_slice(extra);
    let out = run_tool_with(clients, &args);
    let b64 = base64::engine::general_purpose::STANDARD;
    let decode = |t: &str| {
        b64.decode(t)
            .unwrap_or_else(|e| panic!("base64 {t:?}: {e}"))
    };
    stdout_lines(&out)
        .iter()
        .map(|l| {
            let r: RawRecord = parse_json(l);
            ConsumedRecord {
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key.as_deref().map(decode),
                value: r.value.as_deref().map(decode),
                headers: r
                    .headers
                    .into_iter()
                    .map(|(k, v)| (k, decode(&v)))
                    .collect(),
            }
        })
        .collect()
}

pub fn offsets(bootstrap: &str, topic: &str, partition: i32) -> Offsets {
    let mut args = vec![
        s("offsets"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
    ];
    args.extend([s("--partition"), s(partition)]);
    parse_json(
        stdout_lines(&run_tool(&args))
            .last()
            .expect("offsets printed nothing"),
    )
}

/// One answer of `offsets_for_times`: the query (a timestamp, or `None` for max timestamp),
/// the offset and the timestamp the broker returned.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TimeOffset {
    pub query: serde_json::Value,
    pub offset: i64,
    pub timestamp: i64,
}

/// Admin `listOffsets` for each timestamp, then for the max timestamp.
pub fn offsets_for_times(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    timestamps: &[i64],
) -> Vec<TimeOffset> {
    let list: Vec<String> = timestamps.iter().map(|t| t.to_string()).collect();
    let args = vec![
        s("offsets-for-times"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
        s("--partition"),
        s(partition),
        s("--timestamps"),
        list.join(","),
    ];
    stdout_lines(&run_tool(&args))
        .iter()
        .map(|l| parse_json(l))
        .collect()
}

/// Admin `describeConfigs` of a topic: (key, value) for each of `keys`.
pub fn describe_topic_configs(
    bootstrap: &str,
    topic: &str,
    keys: &[&str],
) -> Vec<(String, Option<String>)> {
    describe_topic_config_sources(bootstrap, topic, keys)
        .into_iter()
        .map(|(key, value, _)| (key, value))
        .collect()
}

/// Admin `describeConfigs` of a topic: (key, value, config source such as
/// `DYNAMIC_TOPIC_CONFIG`) for each of `keys`.
pub fn describe_topic_config_sources(
    bootstrap: &str,
    topic: &str,
    keys: &[&str],
) -> Vec<(String, Option<String>, Option<String>)> {
    let args = vec![
        s("describe-configs"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
        s("--keys"),
        keys.join(","),
    ];
    #[derive(Deserialize)]
    struct Entry {
        key: String,
        value: Option<String>,
        source: Option<String>,
    }
    stdout_lines(&run_tool(&args))
        .iter()
        .map(|l| {
            let e: Entry = parse_json(l);
            (e.key, e.value, e.source)
        })
        .collect()
}

/// Deletes records before `before`; returns the new low watermark.
pub fn delete_records(bootstrap: &str, topic: &str, partition: i32, before: i64) -> i64 {
    let mut args = vec![
        s("delete-records"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
    ];
    args.extend([s("--partition"), s(partition), s("--before"), s(before)]);
    #[derive(Deserialize)]
    struct R {
        low_watermark: i64,
    }
    let r: R = parse_json(stdout_lines(&run_tool(&args)).last().expect("no output"));
    r.low_watermark
}

pub fn alter_config(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) {
    let mut args = vec![
        s("alter-config"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
    ];
    for (k, v) in configs {
        args.extend([s("--set"), format!("{k}={v}")]);
    }
    run_tool(&args);
}

/// Reads up to `max` records of `topic`-0 from offset 0 with the Java consumer (assigned, no
/// group), under this thread's client config if any: how many it got, or the tool's stderr when
/// it failed (a refused login, or Kafka's TopicAuthorizationException).
pub fn try_consume(bootstrap: &str, topic: &str, max: usize) -> Result<usize, String> {
    let out = run_tool_unchecked(&[
        s("consume"),
        s("--bootstrap"),
        s(bootstrap),
        s("--topic"),
        s(topic),
        s("--partition"),
        s("0"),
        s("--from"),
        s("0"),
        s("--max"),
        s(max),
        s("--isolation"),
        s("read_uncommitted"),
        s("--timeout-ms"),
        s("60000"),
    ]);
    if out.status.success() {
        Ok(stdout_lines(&out)
            .iter()
            .filter(|l| l.starts_with('{'))
            .count())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Kafka's own `kafka-configs` (ConfigCommand) against `bootstrap`, e.g. to change a SCRAM
/// user's password or set a client quota.
pub fn kafka_configs(bootstrap: &str, args: &[&str]) -> String {
    kafka_admin_tool(
        "kafka.admin.ConfigCommand",
        "kafka-configs",
        bootstrap,
        args,
    )
}

/// `kafka-configs.sh --alter --add-config '<mechanism>=[password=…]' --entity-type users`
/// against `bootstrap`, logged in with `command_config`; checks Kafka's tool says it is done.
pub fn add_scram_user(
    bootstrap: &str,
    command_config: &Path,
    mechanism: &str,
    user: &str,
    password: &str,
) {
    let out = kafka_configs(
        bootstrap,
        &[
            "--command-config",
            command_config.to_str().unwrap(),
            "--alter",
            "--add-config",
            &format!("{mechanism}=[password={password}]"),
            "--entity-type",
            "users",
            "--entity-name",
            user,
        ],
    );
    assert!(
        out.contains(&format!("Completed updating config for user {user}.")),
        "{out}"
    );
}

/// `kafka-acls.sh --add` against `bootstrap`, logged in with `command_config`: ALLOW for each
/// of `principals` on `resource` (e.g. `["--operation", "Read", "--topic", T]`).
pub fn kafka_acls_allow(
    bootstrap: &str,
    command_config: &Path,
    principals: &[&str],
    resource: &[&str],
) {
    let mut args = vec![
        "--command-config",
        command_config.to_str().unwrap(),
        "--add",
    ];
    for p in principals {
        args.extend(["--allow-principal", p]);
    }
    args.extend(resource);
    kafka_acls(bootstrap, &args);
}

/// Kafka's own `kafka-acls.sh` (AclCommand, e.g. `--add --allow-principal User:a --operation
/// Read --topic T`, `--list`) against `bootstrap`; fails the test if it fails.
pub fn kafka_acls(bootstrap: &str, args: &[&str]) -> String {
    kafka_admin_tool(
        "org.apache.kafka.tools.AclCommand",
        "kafka-acls",
        bootstrap,
        args,
    )
}

/// The ACL lines `kafka-acls.sh --list` printed (one per ACL, Kafka's `(principal=..., ...)`),
/// sorted.
pub fn acl_lines(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("(principal="))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// `kafka-topics.sh` (e.g. `--alter --topic T --partitions N`) against `bootstrap`.
pub fn kafka_topics(bootstrap: &str, args: &[&str]) -> String {
    kafka_admin_tool(
        "org.apache.kafka.tools.TopicCommand",
        "kafka-topics",
        bootstrap,
        args,
    )
}

/// Kafka's own console consumer (`kafka-console-consumer.sh`) against `bootstrap` with `args`
/// (e.g. `--topic T --from-beginning --max-messages N`); fails the test if it fails and
/// returns the lines it printed on stdout (one per record).
pub fn console_consumer(bootstrap: &str, args: &[&str]) -> Vec<String> {
    let mut cmd = std::process::Command::new(super::jars::java());
    cmd.args(super::jars::tool_jvm_flags())
        .arg("-cp")
        .arg(super::jars::classpath(super::KafkaVersion::DEFAULT.name()))
        .arg("org.apache.kafka.tools.consumer.ConsoleConsumer")
        .args(["--bootstrap-server", bootstrap])
        .args(args);
    let out = super::process::run_bounded(&mut cmd, TOOL_LIMIT);
    assert!(
        out.status.success(),
        "kafka-console-consumer {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Runs one of Kafka's admin command-line tools (its main class) and fails the test if it
/// fails; returns what it printed.
fn kafka_admin_tool(main: &str, name: &str, bootstrap: &str, args: &[&str]) -> String {
    let mut all = vec!["--bootstrap-server", bootstrap];
    all.extend_from_slice(args);
    kafka_tool_main(main, name, &all)
}

/// The cluster id `bootstrap` tells, as Kafka's own `kafka-cluster.sh cluster-id` prints it.
pub fn kafka_cluster_id(bootstrap: &str) -> String {
    let text = kafka_tool_main(
        "org.apache.kafka.tools.ClusterTool",
        "kafka-cluster",
        &["cluster-id", "--bootstrap-server", bootstrap],
    );
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Cluster ID: "))
        .unwrap_or_else(|| panic!("kafka-cluster cluster-id printed no id:\n{text}"))
        .trim()
        .to_owned()
}

/// One of Kafka's own command-line tools (`main`, the class its script runs) with `args`.
fn kafka_tool_main(main: &str, name: &str, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(super::jars::java());
    cmd.args(super::jars::tool_jvm_flags())
        .arg("-cp")
        .arg(super::jars::classpath(super::KafkaVersion::DEFAULT.name()))
        .arg(main)
        .args(args);
    let out = super::process::run_bounded(&mut cmd, std::time::Duration::from_secs(120));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} {args:?} failed:\n{text}");
    text
}

/// The same operations as methods on a broker.
impl Kafka {
    /// Creates the topic and waits until the broker has made every partition's directory
    /// (it does so when it applies the metadata change, after the Admin call returns).
    pub fn create_topic(&self, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
        create_topic(&self.bootstrap(), topic, partitions, configs);
        let deadline = std::time::Instant::now() + TOOL_LIMIT;
        for p in 0..partitions {
            while !self.partition_dir(topic, p).is_dir() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "broker made no directory for {topic}-{p} within {TOOL_LIMIT:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn produce(&self, topic: &str, partition: i32, n: usize, opts: &ProduceOpts) -> Produced {
        produce(&self.bootstrap(), topic, partition, n, opts)
    }

    pub fn consume(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        max: usize,
        isolation: Isolation,
    ) -> Vec<ConsumedRecord> {
        consume(&self.bootstrap(), topic, partition, from, max, isolation)
    }

    pub fn offsets(&self, topic: &str, partition: i32) -> Offsets {
        offsets(&self.bootstrap(), topic, partition)
    }

    /// Waits until the partition's log end offset (high watermark) reaches `end`. Commit and
    /// abort markers reach a partition after the producer's call returns (the transaction
    /// coordinator writes them), so tests that read the files wait for them here.
    pub fn wait_for_log_end(&self, topic: &str, partition: i32, end: i64) {
        let deadline = std::time::Instant::now() + TOOL_LIMIT;
        loop {
            let got = self.offsets(topic, partition).log_end_offset;
            if got == end {
                return;
            }
            assert!(
                got < end,
                "{topic}-{partition}: log end {got} is past the expected {end}"
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{topic}-{partition}: log end stuck at {got}, expected {end}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn delete_records(&self, topic: &str, partition: i32, before: i64) -> i64 {
        delete_records(&self.bootstrap(), topic, partition, before)
    }

    pub fn alter_config(&self, topic: &str, configs: &[(&str, &str)]) {
        alter_config(&self.bootstrap(), topic, configs)
    }

    /// Deletes the topic and waits until the broker no longer lists it.
    pub fn delete_topic(&self, topic: &str) {
        run_tool(&[
            s("delete-topic"),
            s("--bootstrap"),
            self.bootstrap(),
            s("--topic"),
            s(topic),
        ]);
    }

    /// Deletes the one-partition `topic` and creates it again (a new topic id) holding `n`
    /// records of other data than the default produce's.
    pub fn recreate_topic(&self, topic: &str, n: usize) {
        self.delete_topic(topic);
        self.create_topic(topic, 1, &[]);
        let new_data = ProduceOpts {
            seed: 99,
            ..Default::default()
        };
        self.produce(topic, 0, n, &new_data);
    }
}
