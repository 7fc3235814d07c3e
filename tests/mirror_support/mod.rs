//! Helpers shared by the test binaries that run `kmirror serve` against a real broker
//! (`mod mirror_support;`): writing a config, starting/killing the binary, waiting until our
//! partition's `.log` bytes equal the broker's, and checking our directory with Kafka's own
//! DumpLogSegments and with `kmirror log verify`.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::dump::{dump_log_segments, segment_files, DumpFlags};
use crate::harness::Kafka;

/// Upper bound on waiting for the mirror to catch up: a failure guard, not a performance claim.
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

/// Writes a `kmirror serve` config for `topics` from `bootstrap` into `work`; returns its path
/// and the data dir.
pub fn write_config(work: &Path, bootstrap: &str, topics: &[&str]) -> (PathBuf, PathBuf) {
    let data_dir = work.join("data");
    let config = work.join("kmirror.toml");
    let names: Vec<String> = topics.iter().map(|t| format!("\"{t}\"")).collect();
    std::fs::write(
        &config,
        format!(
            r#"
[source]
bootstrap_servers = ["{bootstrap}"]
[topics]
names = [{names}]
[storage]
data_dir = "{data}"
[runtime]
shards = 2
arena_slot_bytes = 4194304
arena_slots = 4
[fetch]
max_wait_ms = 100
max_bytes = 2097152
partition_max_bytes = 262144
"#,
            names = names.join(", "),
            data = data_dir.display()
        ),
    )
    .unwrap();
    (config, data_dir)
}

/// A running `kmirror serve`; killed when dropped.
pub struct Serve {
    pub child: Child,
    pub log: PathBuf,
}

impl Serve {
    /// Starts the binary; its stderr is appended to `log` (so restarts keep earlier output).
    pub fn start(config: &Path, log: PathBuf) -> Serve {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .args(["serve", "--config"])
            .arg(config)
            .env("KMIRROR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap();
        Serve { child, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
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

/// Waits until every `(broker dir, our dir)` pair holds the same non-empty `.log` bytes.
pub fn wait_mirrored(serve: &mut Serve, pairs: &[(PathBuf, PathBuf)]) {
    let start = Instant::now();
    let mut pending: Vec<&(PathBuf, PathBuf)> = pairs.iter().collect();
    while !pending.is_empty() {
        serve.assert_running();
        pending.retain(|(theirs, ours)| {
            let t = log_bytes(theirs);
            t.is_empty() || t != log_bytes(ours)
        });
        if pending.is_empty() {
            return;
        }
        if start.elapsed() > CATCH_UP_LIMIT {
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
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Kafka's DumpLogSegments (deep iteration with the index sanity check, then index verification
/// against the log) and `kmirror log verify` find nothing wrong in our partition directory.
/// All directories go to one DumpLogSegments run per mode (a JVM start per partition would
/// dominate the runtime with 100 partitions).
pub fn assert_valid(dirs: &[PathBuf]) {
    let mut files = Vec::new();
    for ours in dirs {
        let f = segment_files(ours);
        assert!(!f.is_empty(), "no segment files in {}", ours.display());
        files.extend(f);
    }
    dump_log_segments(&files, DumpFlags::DEEP_SANITY).assert_clean();
    dump_log_segments(&files, DumpFlags::VERIFY_INDEX_ONLY).assert_clean();
    for ours in dirs {
        verify(ours);
    }
}

/// `kmirror log verify` accepts the directory.
pub fn verify(ours: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["log", "verify"])
        .arg(ours)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kmirror log verify {}: {}{}",
        ours.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Mirrors `topics` (partition counts given) from `k` until every partition's `.log` bytes equal
/// the broker's, stops `kmirror serve` cleanly, compares again and validates our directories.
pub fn mirror_and_check(k: &Kafka, topics: &[(&str, i32)]) {
    let work = tempfile::tempdir().unwrap();
    let names: Vec<&str> = topics.iter().map(|(t, _)| *t).collect();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &names);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let mut pairs = Vec::new();
    for (topic, partitions) in topics {
        for p in 0..*partitions {
            pairs.push((
                k.partition_dir(topic, p),
                data_dir.join(format!("{topic}-{p}")),
            ));
        }
    }
    wait_mirrored(&mut serve, &pairs);
    serve.sigterm_and_wait();
    for (theirs, ours) in &pairs {
        assert_eq!(
            log_bytes(ours),
            log_bytes(theirs),
            "{} differs from the broker after stop",
            ours.display()
        );
    }
    let ours: Vec<PathBuf> = pairs.into_iter().map(|(_, o)| o).collect();
    assert_valid(&ours);
}
