//! Goal: `kmirror serve` mirrors a real Kafka topic byte-for-byte. Method: a real KRaft broker
//! (Kafka 4.1.1, from the harness); the real Java producer writes batches with several codecs
//! into two partitions; `kmirror serve` (the binary, 2 pinned shards) fetches them over its
//! io_uring data path; we wait until our `.log` bytes equal the broker's, produce more while it
//! runs and wait again, stop it with SIGTERM (clean-shutdown marker and checkpoints must follow),
//! produce while it is down and restart it (it must resume at its log ends), then check our
//! directory with Kafka's own DumpLogSegments (deep iteration + index sanity) and compare its
//! batch list with the broker's.

mod harness;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::files::copy_partition_trimmed;
use harness::{Codec, ProduceOpts};

/// Upper bound on waiting for the mirror to catch up: a failure guard, not a performance claim.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(120);

fn log_bytes(dir: &Path) -> Vec<u8> {
    let mut logs: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect(),
        Err(_) => return Vec::new(),
    };
    logs.sort();
    logs.iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}

struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn start(config: &Path, log: PathBuf) -> Serve {
        let out = std::fs::File::create(&log).unwrap();
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

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "kmirror serve exited early ({status}):\n{}",
                self.log_text()
            );
        }
    }

    fn sigterm_and_wait(mut self) -> String {
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

fn wait_mirrored(serve: &mut Serve, broker_dir: &Path, our_dir: &Path) {
    let start = Instant::now();
    loop {
        serve.assert_running();
        let theirs = log_bytes(broker_dir);
        let ours = log_bytes(our_dir);
        if !theirs.is_empty() && theirs == ours {
            return;
        }
        if start.elapsed() > CATCH_UP_LIMIT {
            panic!(
                "not mirrored: broker has {} log bytes, we have {}\n{}",
                theirs.len(),
                ours.len(),
                serve.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn serve_mirrors_topic_byte_for_byte() {
    let k = harness::shared();
    let topic = harness::unique_topic("mirror-basic");
    k.create_topic(&topic, 2, &[]);
    let round1 = [
        (0, Codec::Gzip),
        (0, Codec::None),
        (1, Codec::Zstd),
        (1, Codec::Lz4),
    ];
    for (i, (p, codec)) in round1.iter().enumerate() {
        let opts = ProduceOpts {
            codec: *codec,
            seed: i as u64,
            headers: 1,
            ..Default::default()
        };
        k.produce(&topic, *p, 500, &opts);
    }

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[source]
bootstrap_servers = ["{bootstrap}"]
[topics]
names = ["{topic}"]
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
            bootstrap = k.bootstrap(),
            data = data_dir.display()
        ),
    )
    .unwrap();
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    for p in 0..2 {
        wait_mirrored(
            &mut serve,
            &k.partition_dir(&topic, p),
            &data_dir.join(format!("{topic}-{p}")),
        );
    }

    // More data while it runs, with another codec: the fetch loop keeps going.
    for p in 0..2 {
        let opts = ProduceOpts {
            codec: Codec::Snappy,
            seed: 10 + p as u64,
            ..Default::default()
        };
        k.produce(&topic, p, 300, &opts);
    }
    for p in 0..2 {
        wait_mirrored(
            &mut serve,
            &k.partition_dir(&topic, p),
            &data_dir.join(format!("{topic}-{p}")),
        );
    }
    let text = serve.sigterm_and_wait();
    assert!(
        text.contains("stopped cleanly"),
        "no clean stop in:\n{text}"
    );
    assert!(text.contains("shard started"), "{text}");

    for p in 0..2 {
        let ours = data_dir.join(format!("{topic}-{p}"));
        let theirs = k.partition_dir(&topic, p);
        assert_eq!(
            log_bytes(&ours),
            log_bytes(&theirs),
            "partition {p} bytes after stop"
        );
        let dump = dump_log_segments(&segment_files(&ours), DumpFlags::DEEP_SANITY);
        dump.assert_clean();
        let scratch = tempfile::tempdir().unwrap();
        let broker_files = copy_partition_trimmed(&theirs, &scratch.path().join("b"));
        let broker_dump = dump_log_segments(
            &broker_files
                .into_iter()
                .filter(|f| f.extension().is_some_and(|e| e == "log"))
                .collect::<Vec<_>>(),
            DumpFlags::DEEP_SANITY,
        );
        let key = |d: &harness::DumpOutput| -> Vec<(i64, i64, u64, u32, String)> {
            d.batches
                .iter()
                .filter(|b| b.file.extension().is_some_and(|e| e == "log"))
                .map(|b| {
                    (
                        b.base_offset,
                        b.last_offset,
                        b.position,
                        b.crc,
                        b.codec.clone(),
                    )
                })
                .collect()
        };
        assert!(!key(&dump).is_empty());
        assert_eq!(
            key(&dump),
            key(&broker_dump),
            "partition {p}: batch list differs"
        );
    }
}
