//! Kafka's text checkpoint framing, shared by `leader-epoch-checkpoint` and the log-dir root
//! offset checkpoints: line 1 the version, line 2 the entry count, then one entry per line.
//!
//! Format: kafka-formats.md §3.7. Writes are atomic (tmp file, fsync, rename, fsync of the
//! directory) because a broker that finds a torn checkpoint refuses to load the log dir.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::ids::{Offset, TopicPartition};
use crate::limits::CHECKPOINT_BYTES_MAX;
use crate::log::io::{LogIo, StdIo};
use crate::log::LogError;

/// The sibling `<name>.tmp` that a checkpoint is written to before it is renamed into place.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Make a directory's entries (a rename, a create, an unlink) durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    let d = File::open(dir).map_err(|e| LogError::io(dir, e))?;
    d.sync_all().map_err(|e| LogError::io(dir, e))
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Replace `path` with `contents` atomically: write `<name>.tmp`, fsync it, rename it over
/// `path`, fsync the directory. A crash leaves either the old or the new file, never a mix.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), LogError> {
    write_atomically_with(&mut StdIo, path, contents)
}

/// `write_atomically` with the tmp file's write and sync issued through `io`, so a log's own
/// I/O engine (and a test's failing disk) performs them. A failed write or sync leaves `path`
/// as it was: the tmp file is never renamed into place.
pub fn write_atomically_with(
    io: &mut impl LogIo,
    path: &Path,
    contents: &[u8],
) -> Result<(), LogError> {
    let tmp = tmp_path(path);
    {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| LogError::io(&tmp, e))?;
        io.write_all_at(&f, 0, contents)
            .map_err(|e| LogError::io(&tmp, e))?;
        // fdatasync covers the new file's size too (metadata needed to read the data back).
        io.sync_data(&f).map_err(|e| LogError::io(&tmp, e))?;
    }
    fs::rename(&tmp, path).map_err(|e| LogError::io(path, e))?;
    sync_dir(parent_dir(path))
}

/// Read a whole small file, `None` if it does not exist. Bounded so that a wrong path pointing
/// at a huge file cannot exhaust memory.
pub fn read_small_file(path: &Path) -> Result<Option<Vec<u8>>, LogError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io(path, e)),
    };
    if meta.len() > CHECKPOINT_BYTES_MAX {
        return Err(LogError::corrupt(
            path,
            format!(
                "{} bytes exceeds the limit of {CHECKPOINT_BYTES_MAX}",
                meta.len()
            ),
        ));
    }
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LogError::io(path, e)),
    }
}

/// Write a checkpoint with the given version and entry lines (each without its newline).
pub fn write_lines(path: &Path, version: i32, entries: &[String]) -> Result<(), LogError> {
    write_lines_with(&mut StdIo, path, version, entries)
}

/// `write_lines` through `io` (see `write_atomically_with`).
pub fn write_lines_with(
    io: &mut impl LogIo,
    path: &Path,
    version: i32,
    entries: &[String],
) -> Result<(), LogError> {
    let mut out = String::with_capacity(16 + entries.iter().map(|e| e.len() + 1).sum::<usize>());
    out.push_str(&format!("{version}\n{}\n", entries.len()));
    for e in entries {
        assert!(
            !e.contains('\n'),
            "checkpoint entry must be a single line: {e:?}"
        );
        out.push_str(e);
        out.push('\n');
    }
    write_atomically_with(io, path, out.as_bytes())
}

/// Read a checkpoint's entry lines; `None` if the file does not exist. A version other than
/// `expected_version`, a bad count line or a count that disagrees with the entries is corrupt,
/// as in Kafka (which refuses to go on with such a file).
pub fn read_lines(path: &Path, expected_version: i32) -> Result<Option<Vec<String>>, LogError> {
    let Some(bytes) = read_small_file(path)? else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes).map_err(|_| LogError::corrupt(path, "not UTF-8"))?;
    let mut lines = text.lines();
    let version_line = lines
        .next()
        .ok_or_else(|| LogError::corrupt(path, "empty file"))?;
    let version: i32 = version_line
        .trim()
        .parse()
        .map_err(|_| LogError::corrupt(path, format!("bad version line {version_line:?}")))?;
    if version != expected_version {
        return Err(LogError::corrupt(
            path,
            format!("unrecognised version {version}, expected {expected_version}"),
        ));
    }
    let count_line = lines
        .next()
        .ok_or_else(|| LogError::corrupt(path, "missing count line"))?;
    let count: usize = count_line
        .trim()
        .parse()
        .map_err(|_| LogError::corrupt(path, format!("bad count line {count_line:?}")))?;
    let entries: Vec<String> = lines.map(str::to_owned).collect();
    if entries.len() != count {
        return Err(LogError::corrupt(
            path,
            format!("expected {count} entries but found {}", entries.len()),
        ));
    }
    Ok(Some(entries))
}

/// Kafka splits checkpoint entries on any run of whitespace.
pub fn split_fields(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// The log-dir root checkpoints that map partitions to offsets: `recovery-point-offset-checkpoint`,
/// `log-start-offset-checkpoint`, `replication-offset-checkpoint`, `cleaner-offset-checkpoint`.
pub struct OffsetCheckpointFile;

impl OffsetCheckpointFile {
    pub const VERSION: i32 = 0;
    pub const RECOVERY_POINT: &'static str = "recovery-point-offset-checkpoint";
    pub const LOG_START_OFFSET: &'static str = "log-start-offset-checkpoint";
    pub const REPLICATION_OFFSET: &'static str = "replication-offset-checkpoint";

    /// All entries; a missing file is an empty map (Kafka treats it the same way).
    pub fn read(path: &Path) -> Result<BTreeMap<TopicPartition, Offset>, LogError> {
        let mut out = BTreeMap::new();
        let Some(lines) = read_lines(path, Self::VERSION)? else {
            return Ok(out);
        };
        for line in lines {
            let fields = split_fields(&line);
            let bad = || LogError::corrupt(path, format!("malformed entry {line:?}"));
            let [topic, partition, offset] = fields[..] else {
                return Err(bad());
            };
            let partition: i32 = partition.parse().map_err(|_| bad())?;
            let offset: i64 = offset.parse().map_err(|_| bad())?;
            out.insert(TopicPartition::new(topic, partition), Offset(offset));
        }
        Ok(out)
    }

    pub fn write(path: &Path, entries: &BTreeMap<TopicPartition, Offset>) -> Result<(), LogError> {
        Self::write_with(&mut StdIo, path, entries)
    }

    /// `write` through `io` (see `write_atomically_with`).
    pub fn write_with(
        io: &mut impl LogIo,
        path: &Path,
        entries: &BTreeMap<TopicPartition, Offset>,
    ) -> Result<(), LogError> {
        let mut lines = Vec::with_capacity(entries.len());
        for (tp, off) in entries {
            // Kafka's topic names are [a-zA-Z0-9._-]+; one with whitespace would make the
            // file unreadable, so refuse it rather than write a checkpoint nobody can load.
            if tp.topic.is_empty() || tp.topic.contains(char::is_whitespace) {
                return Err(LogError::corrupt(
                    path,
                    format!("unwritable topic name {:?}", tp.topic),
                ));
            }
            lines.push(format!("{} {} {}", tp.topic, tp.partition, off.0));
        }
        write_lines_with(io, path, Self::VERSION, &lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn writes_kafka_framing_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("leader-epoch-checkpoint");
        write_lines(&p, 0, &["0 0".into(), "3 1500".into()]).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "0\n2\n0 0\n3 1500\n");
        assert!(!tmp_path(&p).exists(), "tmp file must be renamed away");
        assert_eq!(read_lines(&p, 0).unwrap().unwrap(), vec!["0 0", "3 1500"]);
    }

    #[test]
    fn missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_lines(&dir.path().join("nope"), 0).unwrap().is_none());
        assert!(OffsetCheckpointFile::read(&dir.path().join("nope"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn rejects_wrong_version_and_count() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("cp");
        for bad in [
            "1\n0\n",
            "0\n2\na 0 1\n",
            "0\n0\nx 0 1\n",
            "",
            "0\n",
            "zero\n0\n",
            "0\n-1\n",
        ] {
            fs::write(&p, bad).unwrap();
            match read_lines(&p, 0) {
                Err(LogError::Corrupt { path, .. }) => assert_eq!(path, p),
                other => panic!("{bad:?}: expected Corrupt, got {other:?}"),
            }
        }
    }

    #[test]
    fn offset_checkpoint_rejects_malformed_entries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("recovery-point-offset-checkpoint");
        for bad in [
            "0\n1\ntopic 0\n",
            "0\n1\ntopic x 5\n",
            "0\n1\ntopic 0 5 6\n",
        ] {
            fs::write(&p, bad).unwrap();
            assert!(
                matches!(
                    OffsetCheckpointFile::read(&p),
                    Err(LogError::Corrupt { .. })
                ),
                "{bad:?}"
            );
        }
        // Kafka splits on any whitespace run.
        fs::write(&p, "0\n1\ntopic\t3   42\n").unwrap();
        let m = OffsetCheckpointFile::read(&p).unwrap();
        assert_eq!(m[&TopicPartition::new("topic", 3)], Offset(42));
    }

    proptest! {
        #[test]
        fn offset_checkpoint_round_trips(
            entries in proptest::collection::btree_map(
                ("[a-zA-Z0-9._-]{1,40}", 0i32..10_000),
                0i64..i64::MAX,
                0..50,
            )
        ) {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("replication-offset-checkpoint");
            let map: BTreeMap<TopicPartition, Offset> = entries
                .into_iter()
                .map(|((t, p), o)| (TopicPartition::new(t, p), Offset(o)))
                .collect();
            OffsetCheckpointFile::write(&p, &map).unwrap();
            prop_assert_eq!(OffsetCheckpointFile::read(&p).unwrap(), map);
        }
    }
}
