//! Helpers shared by the test binaries that run `kmirror serve` against a real broker
//! (`mod mirror_support;`): writing a config, starting/killing the binary, waiting until our
//! partition's `.log` bytes equal the broker's, and checking our directory with Kafka's own
//! DumpLogSegments and with `kmirror log verify`.
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::dump::{dump_log_segments, segment_files, DumpFlags, DumpOutput};
use crate::harness::Kafka;

use crate::harness::serve::{log_bytes, wait_all_mirrored, Serve};

/// Writes a `kmirror serve` config for `topics` from `bootstrap` into `work`; returns its path
/// and the data dir.
pub fn write_config(work: &Path, bootstrap: &str, topics: &[&str]) -> (PathBuf, PathBuf) {
    write_config_with(
        work,
        bootstrap,
        topics,
        r#"[runtime]
shards = 2
arena_slot_bytes = 4194304
arena_slots = 4
[fetch]
max_wait_ms = 100
max_bytes = 2097152
partition_max_bytes = 262144
"#,
    )
}

/// Writes a `kmirror serve` config for `topics` from `bootstrap` into `work`, its `[source]`,
/// `[topics]` and `[storage]` sections followed by `sections` (the test's `[runtime]`,
/// `[fetch]` and so on); returns its path and the data dir.
pub fn write_config_with(
    work: &Path,
    bootstrap: &str,
    topics: &[&str],
    sections: &str,
) -> (PathBuf, PathBuf) {
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
{sections}"#,
            names = names.join(", "),
            data = data_dir.display()
        ),
    )
    .unwrap();
    (config, data_dir)
}

/// Kafka's DumpLogSegments (deep iteration with the index sanity check, then index verification
/// against the log) and `kmirror log verify` find nothing wrong in our partition directory.
/// All directories go to one DumpLogSegments run per mode (a JVM start per partition would
/// dominate the runtime with 100 partitions). Returns the deep iteration's output, for tests
/// that check what the batches are.
pub fn assert_valid(dirs: &[PathBuf]) -> DumpOutput {
    let mut files = Vec::new();
    for ours in dirs {
        let f = segment_files(ours);
        assert!(!f.is_empty(), "no segment files in {}", ours.display());
        files.extend(f);
    }
    let deep = dump_log_segments(&files, DumpFlags::DEEP_SANITY);
    deep.assert_clean();
    dump_log_segments(&files, DumpFlags::VERIFY_INDEX_ONLY).assert_clean();
    for ours in dirs {
        verify(ours);
    }
    deep
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
/// the broker's, stops `kmirror serve` cleanly, compares again and validates our directories;
/// returns DumpLogSegments' deep iteration over them.
pub fn mirror_and_check(k: &Kafka, topics: &[(&str, i32)]) -> DumpOutput {
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
    wait_all_mirrored(&mut serve, &pairs);
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
    assert_valid(&ours)
}
