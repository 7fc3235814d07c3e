//! Copies of a live broker's partition directory that Kafka's tools accept.
//!
//! A running broker preallocates the active segment's `.index` and `.timeindex` (10 MiB of
//! zeros) and trims them only when the segment rolls or the broker stops. DumpLogSegments'
//! sanity check reads that zero tail as entries and rejects the time index ("last timestamp is
//! 0"), so a dump of a live broker's files goes through a trimmed copy.

use std::path::{Path, PathBuf};

use super::dump::segment_files;

/// `.index` entry: relative offset + position.
pub const OFFSET_ENTRY: usize = 8;
/// `.timeindex` entry: timestamp + relative offset.
pub const TIME_ENTRY: usize = 12;

/// The index file's bytes without the trailing all-zero entries of preallocation.
pub fn index_bytes_trimmed(path: &Path) -> Vec<u8> {
    let entry = match path.extension().and_then(|e| e.to_str()) {
        Some("index") => OFFSET_ENTRY,
        Some("timeindex") => TIME_ENTRY,
        _ => panic!("{} is not an offset or time index", path.display()),
    };
    let mut bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    bytes.truncate(bytes.len() / entry * entry);
    // No real entry is all zeros: offset-index positions and time-index timestamps are > 0.
    while bytes.len() >= entry && bytes[bytes.len() - entry..].iter().all(|b| *b == 0) {
        bytes.truncate(bytes.len() - entry);
    }
    bytes
}

/// Copies every file of partition directory `src` into `dst` (created), trimming index tails.
pub fn copy_partition_trimmed(src: &Path, dst: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dst).unwrap_or_else(|e| panic!("create {}: {e}", dst.display()));
    for entry in std::fs::read_dir(src).unwrap_or_else(|e| panic!("read {}: {e}", src.display())) {
        let path = entry.expect("dir entry").path();
        let to = dst.join(path.file_name().expect("file name"));
        match path.extension().and_then(|e| e.to_str()) {
            Some("index" | "timeindex") => std::fs::write(&to, index_bytes_trimmed(&path)),
            _ => std::fs::copy(&path, &to).map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", path.display(), to.display()));
    }
    segment_files(dst)
}
