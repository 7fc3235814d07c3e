//! Running the `kmirror serve` binary in a test and waiting until its partition logs equal the
//! broker's byte for byte.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound on waiting for the mirror to make progress (one more partition equal to the
/// broker's): a failure guard, not a performance claim (a 100-partition topic on a loaded
/// 2-core machine set it; larger topics get it anew after each partition that finishes).
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(180);

/// Every `.log` segment of a partition directory, in offset order, concatenated.
pub fn log_bytes(dir: &Path) -> Vec<u8> {
    log_files(dir)
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap_or_default())
        .collect()
}

/// The `.log` segment files of a partition directory, in offset order.
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect(),
        Err(_) => return Vec::new(),
    };
    logs.sort();
    logs
}

/// The serve log without the ANSI colour codes tracing puts around field names.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A running `kmirror serve`; killed when dropped.
pub struct Serve {
    pub child: Child,
    pub log: PathBuf,
    /// Length of `log` when this process started: earlier runs appended what precedes it.
    log_start: usize,
}

/// What `kmirror serve` logs once its Kafka listener accepts connections.
const LISTENER_LINE: &str = "Kafka listener serving on ";

/// Failure guard for a start-up (log dir recovery, control thread, listener) on a loaded
/// machine; not a performance claim.
pub const START_LIMIT: Duration = Duration::from_secs(120);

/// Adds a `[kafka]` listener on an OS-chosen loopback port to a config file.
pub fn add_kafka_listener(config: &Path) {
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str("[kafka]\nlisten = \"127.0.0.1:0\"\n");
    std::fs::write(config, text).unwrap();
}

impl Serve {
    /// Starts the binary; its stderr is appended to `log` (so restarts keep earlier output).
    pub fn start(config: &Path, log: PathBuf) -> Serve {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let log_start = out.metadata().unwrap().len() as usize;
        let child = Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .args(["serve", "--config"])
            .arg(config)
            .env("KMIRROR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Serve {
            child,
            log,
            log_start,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The Kafka listener's `host:port` from this process's start-up line, waiting for it.
    pub fn kafka_listener(&mut self) -> String {
        let start = Instant::now();
        loop {
            self.assert_running();
            let text = self.log_text();
            let ours = text.get(self.log_start..).unwrap_or_default();
            if let Some(at) = ours.find(LISTENER_LINE) {
                return ours[at + LISTENER_LINE.len()..]
                    .chars()
                    .take_while(|c| !c.is_whitespace())
                    .collect();
            }
            assert!(
                start.elapsed() < START_LIMIT,
                "no Kafka listener line in:\n{ours}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `limit` for the "partition stopped" log line naming `partition` (a
    /// topic-partition, or a topic) and returns it.
    pub fn wait_partition_stopped(&mut self, partition: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            self.assert_running();
            let text = self.log_text();
            if let Some(line) = text
                .lines()
                .find(|l| l.contains("partition stopped") && l.contains(partition))
            {
                return line.to_string();
            }
            assert!(
                start.elapsed() < limit,
                "{partition} never reported stopped:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "kmirror serve exited early ({status}):\n{}",
                self.log_text()
            );
        }
    }

    /// SIGKILL: no shutdown code runs, as after a crash or power loss of the process.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm_and_wait(mut self) -> String {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let status = self.child.wait().unwrap();
        let text = self.log_text();
        assert!(
            status.success(),
            "kmirror serve failed on SIGTERM ({status}):\n{text}"
        );
        text
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text of `GET http://<addr>/metrics` (admin port or `[metrics] listen`), or `None` when
/// it does not answer.
pub fn metrics_text(addr: &str) -> Option<String> {
    let mut resp = ureq::get(&format!("http://{addr}/metrics")).call().ok()?;
    resp.body_mut().read_to_string().ok()
}

/// Waits until the broker's partition dir and ours hold the same non-empty `.log` bytes.
pub fn wait_mirrored(serve: &mut Serve, broker_dir: &Path, our_dir: &Path) {
    wait_all_mirrored(serve, &[(broker_dir.to_path_buf(), our_dir.to_path_buf())]);
}

/// Waits until every `(broker dir, our dir)` pair holds the same non-empty `.log` bytes.
pub fn wait_all_mirrored(serve: &mut Serve, pairs: &[(PathBuf, PathBuf)]) {
    let mut progress = Instant::now();
    let mut pending: Vec<&(PathBuf, PathBuf)> = pairs.iter().collect();
    while !pending.is_empty() {
        serve.assert_running();
        let before = pending.len();
        pending.retain(|(theirs, ours)| {
            let t = log_bytes(theirs);
            t.is_empty() || t != log_bytes(ours)
        });
        if pending.is_empty() {
            return;
        }
        if pending.len() < before {
            progress = Instant::now();
        }
        if progress.elapsed() > CATCH_UP_LIMIT {
            let (theirs, ours) = pending[0];
            panic!(
                "{} partitions not mirrored; first: broker {} has {} log bytes, ours {} has {}\n{}",
                pending.len(),
                theirs.display(),
                log_bytes(theirs).len(),
                ours.display(),
                log_bytes(ours).len(),
                serve.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
