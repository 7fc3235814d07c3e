//! Consumer groups driven by stock Java clients: a group member that consumes and commits
//! (`KafkaTool group-consume` / `group-member`) and Kafka's own `kafka-consumer-groups.sh`
//! (`ConsumerGroupCommand --describe`).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::jars;
use super::process::run_bounded;
use super::tool::{run_tool, tool_command};

/// One record a group member consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
}

/// Consumes `max` records of `topic` as a member of `group`, commits exactly those, leaves.
pub fn group_consume(bootstrap: &str, topic: &str, group: &str, max: usize) -> Vec<Consumed> {
    group_consume_with(bootstrap, topic, group, max, None)
}

/// `group_consume`, committing with leader epoch `commit_epoch` when given instead of the
/// last record's (a client that commits the leader's current epoch).
pub fn group_consume_with(
    bootstrap: &str,
    topic: &str,
    group: &str,
    max: usize,
    commit_epoch: Option<i32>,
) -> Vec<Consumed> {
    let mut args = group_tool_args("group-consume", bootstrap, topic, group);
    args.extend(["--max".to_string(), max.to_string()]);
    if let Some(e) = commit_epoch {
        args.extend(["--commit-epoch".to_string(), e.to_string()]);
    }
    let out = run_tool(&args);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// `group-consume` with `group.protocol=protocol` (`classic` or KIP-848's `consumer`), giving up
/// after `timeout_ms`; returns whatever happened, for tests that expect the client to fail.
pub fn group_consume_protocol(
    bootstrap: &str,
    topic: &str,
    group: &str,
    max: usize,
    protocol: &str,
    timeout_ms: u64,
) -> std::process::Output {
    let mut args = group_tool_args("group-consume", bootstrap, topic, group);
    for (flag, value) in [
        ("--max", max.to_string()),
        ("--group-protocol", protocol.to_string()),
        ("--timeout-ms", timeout_ms.to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    super::tool::run_tool_unchecked(&args)
}

/// What a `group-member` run printed: each assignment it got, and every record it read.
#[derive(Debug, Default, Clone)]
pub struct MemberRun {
    pub assignments: Vec<Vec<i32>>,
    pub records: Vec<Consumed>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MemberLine {
    Assigned { assigned: Vec<i32> },
    Record { record: Consumed },
}

/// Failure guard for one rebalance step (a JVM start, the coordinator's initial delay, a
/// join round) on a loaded machine; not a performance claim.
const REBALANCE_LIMIT: Duration = Duration::from_secs(120);

/// A running `group-member`: a member of the group until `leave`. Its lines are read on a
/// thread, so the test can wait for each assignment as it happens instead of guessing times.
pub struct Member {
    child: Child,
    lines: Receiver<MemberLine>,
    stderr: Arc<Mutex<String>>,
    pub seen: MemberRun,
}

/// Joins `group` (subscribed to `topic`) as a new member with the Java consumer.
pub fn join_member(bootstrap: &str, topic: &str, group: &str) -> Member {
    let args = group_tool_args("group-member", bootstrap, topic, group);
    let mut child = tool_command(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn group-member");
    let (tx, lines) = channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { return };
            let line = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let stderr = Arc::new(Mutex::new(String::new()));
    let (sink, mut err) = (Arc::clone(&stderr), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        sink.lock().unwrap().push_str(&text);
    });
    Member {
        child,
        lines,
        stderr,
        seen: MemberRun::default(),
    }
}

impl Member {
    fn take(&mut self, line: MemberLine) -> Option<Vec<i32>> {
        match line {
            MemberLine::Assigned { assigned } => {
                self.seen.assignments.push(assigned.clone());
                Some(assigned)
            }
            MemberLine::Record { record } => {
                self.seen.records.push(record);
                None
            }
        }
    }

    /// Waits for the next assignment that satisfies `wanted` (`what` names it in a failure).
    pub fn wait_assigned(&mut self, what: &str, wanted: impl Fn(&[i32]) -> bool) -> Vec<i32> {
        let deadline = Instant::now() + REBALANCE_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(parts) = self.take(line) {
                        if wanted(&parts) {
                            return parts;
                        }
                    }
                }
                Err(_) => panic!(
                    "{what}: not seen within {REBALANCE_LIMIT:?}; so far {:?}; stderr:\n{}",
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits until the records read so far satisfy `done` (`what` names it in a failure).
    pub fn wait_records(&mut self, what: &str, done: impl Fn(&[Consumed]) -> bool) {
        let deadline = Instant::now() + REBALANCE_LIMIT;
        while !done(&self.seen.records) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.take(line);
                }
                Err(_) => panic!(
                    "{what}: not seen within {REBALANCE_LIMIT:?}; so far {:?}; stderr:\n{}",
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Closes the member's stdin, so it leaves the group and exits; returns all it printed.
    pub fn leave(mut self) -> MemberRun {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + REBALANCE_LIMIT;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("group-member did not leave within {REBALANCE_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // The reader thread ends at EOF, which closes the channel.
        while let Ok(line) = self.lines.recv_timeout(REBALANCE_LIMIT) {
            self.take(line);
        }
        assert!(
            status.success(),
            "group-member failed ({status}):\n{}",
            self.stderr.lock().unwrap()
        );
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One row of `kafka-consumer-groups.sh --describe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeRow {
    pub topic: String,
    pub partition: i32,
    /// `None` when the tool prints "-" (nothing committed).
    pub current_offset: Option<i64>,
    pub log_end_offset: Option<i64>,
}

/// The offset `group` has committed for `partition` (of its one topic) on `bootstrap`, if any.
pub fn committed_offset(bootstrap: &str, group: &str, partition: i32) -> Option<i64> {
    describe_group(bootstrap, group)
        .into_iter()
        .find(|r| r.partition == partition)
        .and_then(|r| r.current_offset)
}

/// Runs Kafka's `ConsumerGroupCommand --describe --group G` against `bootstrap` and parses its
/// table; panics with its output when it fails.
pub fn describe_group(bootstrap: &str, group: &str) -> Vec<DescribeRow> {
    let mut cmd = Command::new(jars::java());
    cmd.args(jars::tool_jvm_flags())
        .arg("-cp")
        .arg(jars::classpath(super::KafkaVersion::DEFAULT.name()))
        .arg("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand")
        .args([
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--group",
            group,
        ])
        .args(["--timeout", "30000"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ConsumerGroupCommand --describe {group} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let opt = |s: &str| (s != "-").then(|| s.parse::<i64>().expect("offset column"));
    let mut rows: Vec<DescribeRow> = stdout
        .lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<&str>>)
        .filter(|cols| cols.len() >= 6 && cols[0] == group)
        .map(|cols| DescribeRow {
            topic: cols[1].to_owned(),
            partition: cols[2].parse().expect("partition column"),
            current_offset: opt(cols[3]),
            log_end_offset: opt(cols[4]),
        })
        .collect();
    rows.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    rows
}

/// One transaction of a `txn-transform` run, per input partition it consumed from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TxnRound {
    /// "commit" or "abort".
    pub txn: String,
    pub partition: i32,
    /// The offset sent with sendOffsetsToTransaction (the next one to read).
    pub next: i64,
    /// Offsets of the transformed records in the output topic's partition 0.
    pub produced: Vec<i64>,
}

/// A consume-transform-produce loop with the Java clients: a read_committed member of `group`
/// reads `topic`; per outcome in `txns` one transaction writes the next `per_txn` records
/// (values reversed) to `out` partition 0, sends the consumed offsets with
/// `sendOffsetsToTransaction`, then commits or aborts.
pub fn txn_transform(
    bootstrap: &str,
    topic: &str,
    group: &str,
    out: &str,
    txns: &[&str],
    per_txn: usize,
) -> Vec<TxnRound> {
    let args = transform_args(bootstrap, topic, group, out, txns, per_txn);
    let out = run_tool(&args);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The `KafkaTool txn-transform` arguments both runners share.
fn transform_args(
    bootstrap: &str,
    topic: &str,
    group: &str,
    out: &str,
    txns: &[&str],
    per_txn: usize,
) -> Vec<String> {
    let mut args = group_tool_args("txn-transform", bootstrap, topic, group);
    args.extend([
        "--out".to_string(),
        out.to_string(),
        "--txns".to_string(),
        txns.join(","),
        "--per-txn".to_string(),
        per_txn.to_string(),
    ]);
    args
}

/// `KafkaTool <command> --bootstrap B --topic T --group G`, the start every group command
/// shares.
fn group_tool_args(command: &str, bootstrap: &str, topic: &str, group: &str) -> Vec<String> {
    [
        command,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A `txn-transform` run whose last transaction is held open (outcome `hold`) until `resume`.
/// The JVM is killed if the test ends without resuming it.
pub struct HeldTransform {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    printed: Vec<String>,
    resume_file: std::path::PathBuf,
}

impl HeldTransform {
    /// Starts the loop with `txns` (the last one "hold") and returns once the held
    /// transaction's records and offsets have been sent.
    pub fn start(
        bootstrap: &str,
        topic: &str,
        group: &str,
        out: &str,
        txns: &[&str],
        per_txn: usize,
        resume_file: &std::path::Path,
    ) -> HeldTransform {
        use std::io::BufRead;
        assert_eq!(txns.last(), Some(&"hold"));
        let mut args = transform_args(bootstrap, topic, group, out, txns, per_txn);
        args.push("--resume-file".to_owned());
        args.push(resume_file.to_str().expect("utf-8 path").to_owned());
        let mut child = tool_command(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start KafkaTool");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut held = HeldTransform {
            child,
            lines: std::io::BufReader::new(stdout).lines(),
            printed: Vec::new(),
            resume_file: resume_file.to_owned(),
        };
        // Bounded by the tool itself: it fails (closing stdout) when it cannot consume.
        loop {
            match held.lines.next() {
                Some(Ok(l)) if l.contains("\"held\"") => return held,
                Some(Ok(l)) => held.printed.push(l),
                other => panic!("txn-transform ended before holding: {other:?}"),
            }
        }
    }

    /// Lets the held transaction commit and returns every transaction the run made.
    pub fn resume(mut self) -> Vec<TxnRound> {
        std::fs::write(&self.resume_file, b"").unwrap();
        for l in self.lines.by_ref() {
            self.printed.push(l.expect("tool stdout"));
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "txn-transform failed ({status})");
        self.printed
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }
}

impl Drop for HeldTransform {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
