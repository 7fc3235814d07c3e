//! The durable state of a mirror's failback: `<data_dir>/kmirror-failback/<mirror>.json`,
//! rewritten atomically (tmp file, fdatasync, rename, directory fsync) after every batch the
//! original acknowledged, so a kill -9 loses at most the record of the batch in flight, which
//! the next session reconciles against the original's log end (see `copier`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::control::failback::offset_map::OffsetMap;
use crate::control::failback::txn_replay::TxnReplay;
use crate::limits::FAILBACK_FILE_BYTES_MAX;
use crate::log::checkpoint::write_atomically;

/// The directory under the data dir.
pub const DIR: &str = "kmirror-failback";

/// Where a failback stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Phase {
    /// Planned and reported; nothing produced yet.
    Created,
    /// The copier runs (and is restarted with kmirror).
    Copying,
    /// Cut over: copy caught up, groups translated; nothing runs.
    Stopped,
}

/// What the original holds past the failover point that kmirror never received. It stays
/// where it is; the copy lands after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DivergentTail {
    /// The failover point and the original's log end when the failback was created.
    pub from_offset: i64,
    pub to_offset: i64,
    /// `to - from`: offsets, control records included.
    pub offsets: i64,
    /// Data records found by the scan.
    pub records: i64,
    pub first_offset: Option<i64>,
    pub last_offset: Option<i64>,
    pub first_timestamp_ms: Option<i64>,
    pub last_timestamp_ms: Option<i64>,
    /// False when the scan stopped at `FAILBACK_TAIL_SCAN_BYTES_MAX` (counts are then lower
    /// bounds; `offsets` is still exact).
    pub scan_complete: bool,
}

/// The producer the copy writes with (reused across restarts, so a batch whose record was lost
/// is deduplicated by the original's producer state when it is sent again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStamp {
    pub producer_id: i64,
    pub producer_epoch: i16,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionFailback {
    pub topic: String,
    pub partition: i32,
    pub tail: DivergentTail,
    pub map: OffsetMap,
    /// The base sequence of the next batch under `producer`.
    pub next_sequence: i32,
    /// Why this partition is not copied (an error the original gave that retrying cannot fix,
    /// a replayed transaction the original aborted by itself). The other partitions go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The original's transactional producers replaying kmirror's transactions here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub txns: Vec<TxnReplay>,
    /// Bytes of the batches the original acknowledged (as produced).
    #[serde(default)]
    pub copied_bytes: i64,
}

/// One group's committed offset moved to the original at cut-over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupTranslation {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub kmirror_offset: i64,
    pub original_offset: Option<i64>,
    /// "committed", or why not.
    pub outcome: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailbackFile {
    pub mirror: String,
    pub created_at_ms: i64,
    pub phase: Phase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<ProducerStamp>,
    pub partitions: Vec<PartitionFailback>,
    #[serde(default)]
    pub groups: Vec<GroupTranslation>,
}

#[derive(Debug, thiserror::Error)]
#[error("failback state {path}: {reason}")]
pub struct StoreError {
    pub path: PathBuf,
    pub reason: String,
}

/// The failback files of one data dir.
#[derive(Debug, Clone)]
pub struct FailbackStore {
    dir: PathBuf,
}

impl FailbackStore {
    pub fn new(data_dir: &Path) -> FailbackStore {
        FailbackStore {
            dir: data_dir.join(DIR),
        }
    }

    fn path(&self, mirror: &str) -> PathBuf {
        // Mirror names are 1-249 of [A-Za-z0-9._-], never "." or "..": a safe file name.
        self.dir.join(format!("{mirror}.json"))
    }

    pub fn save(&self, file: &FailbackFile) -> Result<(), StoreError> {
        let path = self.path(&file.mirror);
        let err = |reason: String| StoreError {
            path: path.clone(),
            reason,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| err(e.to_string()))?;
        let json = serde_json::to_vec_pretty(file).map_err(|e| err(e.to_string()))?;
        write_atomically(&path, &json).map_err(|e| err(e.to_string()))
    }

    pub fn load(&self, mirror: &str) -> Result<Option<FailbackFile>, StoreError> {
        let path = self.path(mirror);
        Self::read(&path)
    }

    fn read(path: &Path) -> Result<Option<FailbackFile>, StoreError> {
        let err = |reason: String| StoreError {
            path: path.to_path_buf(),
            reason,
        };
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(e.to_string())),
            Ok(m) if m.len() > FAILBACK_FILE_BYTES_MAX => {
                return Err(err(format!("larger than {FAILBACK_FILE_BYTES_MAX} bytes")))
            }
            Ok(_) => {}
        }
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| err(e.to_string()))
    }

    /// Every stored failback (for the restart of those that were copying).
    pub fn all(&self) -> Vec<Result<FailbackFile, StoreError>> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            match Self::read(&p) {
                Ok(Some(f)) => out.push(Ok(f)),
                Ok(None) => {}
                Err(e) => out.push(Err(e)),
            }
        }
        out
    }

    pub fn remove(&self, mirror: &str) -> Result<(), StoreError> {
        let path = self.path(mirror);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError {
                path,
                reason: e.to_string(),
            }),
        }
    }
}
