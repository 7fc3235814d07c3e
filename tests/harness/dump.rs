//! Kafka's own `DumpLogSegments` (kafka-dump-log.sh) on segment files, and a reader of its report.
//!
//! The verdict on a partition directory comes from Kafka's code: the parser only splits the text
//! into batches, index entries and the error lines the tool prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::broker::KafkaVersion;
use super::jars;
use super::process::run_bounded;

const DUMP_LIMIT: Duration = Duration::from_secs(300);

/// Which checks DumpLogSegments runs.
///
/// `--index-sanity-check` only checks an index's shape (sorted, sized) and then *skips*
/// comparing its entries with the log, so a full check needs a run without it as well: plain
/// `--deep-iteration` on `.index`/`.timeindex` files compares every entry against the `.log`
/// next to it and prints "Mismatches in ..." when they disagree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpFlags {
    pub deep_iteration: bool,
    pub index_sanity_check: bool,
    pub verify_index_only: bool,
    pub print_data_log: bool,
}

impl DumpFlags {
    /// Decompress and check every record; index files get the shape check.
    pub const DEEP_SANITY: DumpFlags = DumpFlags {
        deep_iteration: true,
        index_sanity_check: true,
        verify_index_only: false,
        print_data_log: false,
    };
    /// Decompress every record; index entries are compared with the log.
    pub const DEEP: DumpFlags = DumpFlags {
        deep_iteration: true,
        index_sanity_check: false,
        verify_index_only: false,
        print_data_log: false,
    };
    /// Compare index entries with the log, printing only problems.
    pub const VERIFY_INDEX_ONLY: DumpFlags = DumpFlags {
        deep_iteration: false,
        index_sanity_check: false,
        verify_index_only: true,
        print_data_log: false,
    };

    fn args(self) -> Vec<&'static str> {
        let mut a = Vec::new();
        if self.deep_iteration {
            a.push("--deep-iteration");
        }
        if self.index_sanity_check {
            a.push("--index-sanity-check");
        }
        if self.verify_index_only {
            a.push("--verify-index-only");
        }
        if self.print_data_log {
            a.push("--print-data-log");
        }
        a
    }
}

/// The `key: value` pairs of one line of the report.
pub type Fields = BTreeMap<String, String>;

/// One batch line ("baseOffset: ... isvalid: ...") of a `.log` dump.
#[derive(Debug, Clone)]
pub struct DumpBatch {
    pub file: PathBuf,
    pub base_offset: i64,
    pub last_offset: i64,
    pub position: u64,
    pub size: u64,
    pub crc: u32,
    pub is_valid: bool,
    /// Lower-case codec name ("none", "gzip", ...); Kafka 2.x prints it upper-case.
    pub codec: String,
    pub is_transactional: bool,
    pub is_control: bool,
    pub producer_id: i64,
    pub fields: Fields,
}

/// An `.index` entry ("offset: O position: P") or `.timeindex` entry ("timestamp: T offset: O").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexEntry {
    Offset { offset: i64, position: u64 },
    Time { timestamp: i64, offset: i64 },
}

/// Everything one DumpLogSegments run reported.
#[derive(Debug)]
pub struct DumpOutput {
    pub output: Output,
    pub stdout: String,
    pub stderr: String,
    pub batches: Vec<DumpBatch>,
    /// Record lines ("| offset: ..."), each with the file it came from.
    pub records: Vec<(PathBuf, Fields)>,
    pub index_entries: Vec<(PathBuf, IndexEntry)>,
    /// Lines saying something is wrong, and a note when the tool failed.
    pub errors: Vec<String>,
    /// "Non-consecutive offsets" reports: expected after compaction or aborted-transaction
    /// cleanup, so they are reported, not failed on.
    pub notes: Vec<String>,
}

impl DumpOutput {
    /// Panics with the report unless DumpLogSegments found nothing wrong.
    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(
            self.errors.is_empty(),
            "DumpLogSegments found problems:\n{}\n--- stdout (tail) ---\n{}\n--- stderr ---\n{}",
            self.errors.join("\n"),
            tail_text(&self.stdout, 40),
            self.stderr
        );
    }

    /// Whether any error line mentions `needle`.
    pub fn has_error(&self, needle: &str) -> bool {
        self.errors.iter().any(|e| e.contains(needle))
    }
}

/// Runs Kafka 4.1.1's DumpLogSegments on `files` (several files go in one JVM).
pub fn dump_log_segments(files: &[PathBuf], flags: DumpFlags) -> DumpOutput {
    dump_log_segments_with(KafkaVersion::DEFAULT, files, flags)
}

/// Runs the DumpLogSegments of Kafka `version`.
pub fn dump_log_segments_with(
    version: KafkaVersion,
    files: &[PathBuf],
    flags: DumpFlags,
) -> DumpOutput {
    assert!(
        !files.is_empty(),
        "dump_log_segments needs at least one file"
    );
    let list: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut cmd = Command::new(jars::java());
    cmd.args(jars::tool_jvm_flags())
        .arg("-cp")
        .arg(jars::classpath(version.name()))
        .arg("kafka.tools.DumpLogSegments")
        .arg("--files")
        .arg(list.join(","))
        .args(flags.args());
    parse(run_bounded(&mut cmd, DUMP_LIMIT))
}

/// Every segment file (`.log`, `.index`, `.timeindex`, `.txnindex`, `.snapshot`) in a partition
/// directory, sorted, for a whole-directory dump.
pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            matches!(ext, "log" | "index" | "timeindex" | "txnindex" | "snapshot")
        })
        .collect();
    files.sort();
    files
}

/// Substrings by which DumpLogSegments (2.x to 4.x) reports a problem.
const ERROR_MARKERS: &[&str] = &[
    "isvalid: false",
    "Mismatches in",
    "Found timestamp mismatch",
    "Found out of order timestamp",
    "indexed offsets are not found",
    "invalid bytes at the end",
    "Error at offset",
    "Failed to decode",
    "Exception",
    "orrupt",
];

fn parse(output: Output) -> DumpOutput {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let mut d = DumpOutput {
        output,
        stdout: String::new(),
        stderr: String::new(),
        batches: Vec::new(),
        records: Vec::new(),
        index_entries: Vec::new(),
        errors: Vec::new(),
        notes: Vec::new(),
    };
    let mut file = PathBuf::new();
    for line in stdout.lines() {
        if let Some(f) = line.strip_prefix("Dumping ") {
            file = PathBuf::from(f.trim());
            continue;
        }
        if ERROR_MARKERS.iter().any(|m| line.contains(m)) {
            d.errors.push(line.to_string());
        }
        if line.contains("Non-consecutive offsets") {
            d.notes.push(line.to_string());
        }
        if let Some(rest) = line.strip_prefix("| ") {
            d.records.push((file.clone(), fields(rest)));
        } else if line.starts_with("baseOffset: ") {
            d.batches.push(batch(&file, fields(line)));
        } else if line.starts_with("offset: ")
            && line.contains(" position: ")
            && !line.contains("baseOffset")
        {
            let f = fields(line);
            let entry = IndexEntry::Offset {
                offset: num(&f, "offset"),
                position: num(&f, "position"),
            };
            d.index_entries.push((file.clone(), entry));
        } else if line.starts_with("timestamp: ") {
            let f = fields(line);
            let entry = IndexEntry::Time {
                timestamp: num(&f, "timestamp"),
                offset: num(&f, "offset"),
            };
            d.index_entries.push((file.clone(), entry));
        }
    }
    for line in stderr.lines() {
        if ERROR_MARKERS.iter().any(|m| line.contains(m)) || line.starts_with("Error") {
            d.errors.push(line.to_string());
        }
    }
    if !d.output.status.success() {
        d.errors
            .push(format!("DumpLogSegments exited with {}", d.output.status));
    }
    d.stdout = stdout;
    d.stderr = stderr;
    d
}

fn batch(file: &Path, f: Fields) -> DumpBatch {
    DumpBatch {
        file: file.to_path_buf(),
        base_offset: num(&f, "baseOffset"),
        last_offset: num(&f, "lastOffset"),
        position: num(&f, "position"),
        size: num(&f, "size"),
        crc: num(&f, "crc"),
        is_valid: f.get("isvalid").map(String::as_str) == Some("true"),
        codec: f
            .get("compresscodec")
            .map(|c| c.to_lowercase())
            .unwrap_or_default(),
        is_transactional: f.get("isTransactional").map(String::as_str) == Some("true"),
        is_control: f.get("isControl").map(String::as_str) == Some("true"),
        producer_id: f
            .get("producerId")
            .map(|_| num(&f, "producerId"))
            .unwrap_or(-1),
        fields: f,
    }
}

/// Splits "a: 1 b: x y c: 3" into {a: "1", b: "x y", c: "3"}: a token ending in ':' starts a
/// key, everything up to the next key is its value.
fn fields(line: &str) -> Fields {
    let mut out = Fields::new();
    let mut key: Option<String> = None;
    let mut value: Vec<&str> = Vec::new();
    for tok in line.split_whitespace() {
        if let Some(k) = tok.strip_suffix(':') {
            if let Some(prev) = key.take() {
                out.insert(prev, value.join(" "));
            }
            value.clear();
            key = Some(k.to_string());
        } else {
            value.push(tok);
        }
    }
    if let Some(prev) = key {
        out.insert(prev, value.join(" "));
    }
    out
}

fn num<T: std::str::FromStr>(f: &Fields, key: &str) -> T {
    let v = f
        .get(key)
        .unwrap_or_else(|| panic!("DumpLogSegments line lacks {key}: {f:?}"));
    v.parse()
        .unwrap_or_else(|_| panic!("DumpLogSegments {key}: {v:?} is not a number"))
}

fn tail_text(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
