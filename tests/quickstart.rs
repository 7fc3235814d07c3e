//! Goal: the README's main command, `bash quickstart.sh`, keeps working end to end: a real
//! KRaft broker, real producers (lz4, zstd, a committed and an aborted transaction), `kmirror
//! serve` with a mirror made by `kmirror mirrors`, Kafka's DumpLogSegments on kmirror's files, a
//! byte-for-byte `cmp` with the broker's segments, the Java consumer reading kmirror, and a
//! failover with an open source transaction followed by an idempotent produce to kmirror. Method: run the script itself with this build's binary and fewer records,
//! and check its exit status and the summary lines it prints. Every check is the script's own
//! (it exits non-zero on any failed step), so this test keeps the script from rotting.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The script bounds every wait itself (broker start 180 s, catch-up 120 s); this only catches
/// a hang of the script as a whole.
const SCRIPT_LIMIT: Duration = Duration::from_secs(600);

#[test]
fn quickstart_mirrors_byte_for_byte() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out_dir = tempfile::tempdir().unwrap();
    let out_path = out_dir.path().join("stdout");
    let err_path = out_dir.path().join("stderr");
    let mut child = Command::new("bash")
        .arg(format!("{root}/quickstart.sh"))
        .env("KMIRROR_QUICKSTART_BIN", env!("CARGO_BIN_EXE_kmirror"))
        .env("KMIRROR_QUICKSTART_RECORDS", "2000")
        // The script stops its broker and kmirror if this test process dies first.
        .env(
            "KMIRROR_QUICKSTART_WATCH_PID",
            std::process::id().to_string(),
        )
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn bash quickstart.sh");
    let deadline = Instant::now() + SCRIPT_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            // SIGTERM, not SIGKILL: the script's trap then stops the broker and kmirror.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
            panic!(
                "quickstart.sh did not finish within {SCRIPT_LIMIT:?}:\n{}\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        status.success(),
        "quickstart.sh failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for line in [
        "[3/8] produced 2000 records",
        "[4/8] kmirror serve",
        "isvalid: true, 0 invalid",
        "segment files mirrored byte-for-byte: OK",
        "[6/8] Java consumer on kmirror",
        "read_committed hides the aborted transaction; produce refused while mirroring",
        "[7/8] failover: open source transaction aborted, group billing resumed on kmirror",
        "with no gap or duplicate, topics writable",
        "[8/8] kmirror stopped cleanly",
        "quickstart: OK",
    ] {
        assert!(
            stdout.contains(line),
            "quickstart.sh output lacks {line:?}:\n{stdout}\n--- stderr\n{stderr}"
        );
    }
}
