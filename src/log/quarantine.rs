//! The quarantine: where batches cut out of a partition log go instead of being deleted
//! (a consistent cut at failover, issue 16 item 4; the unclean-election recovery of issue 14
//! takes the same path). kmirror never silently deletes mirrored history: whatever an
//! operator action removes is kept here, byte for byte, in Kafka's segment format.
//!
//! Layout, under the data dir:
//!
//! ```text
//! kmirror-quarantine/<label>/<topic>-<partition>/
//!     <20-digit first offset>.log    the batches exactly as the log held them
//!     report.json                    what was cut: offsets, epochs, timestamps, CRCs, why
//! ```
//!
//! `<label>` names the action (e.g. `cut-<mirror>-<ms>`). The `.log` file is a valid Kafka
//! segment (`kafka-dump-log.sh --files ... --deep-iteration` reads it; it has no index, which
//! the tool does not need). `take` only copies: the caller truncates the log afterwards, so a
//! crash in between leaves the data in both places, never in neither.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids::Offset;
use crate::limits::QUARANTINE_READ_BYTES;
use crate::log::checkpoint::{sync_dir, write_atomically};
use crate::log::partition_log::PartitionLog;
use crate::log::LogError;
use crate::wire::batch::Batches;

/// Directory under the data dir.
pub const DIR_NAME: &str = "kmirror-quarantine";

/// One batch moved to the quarantine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub partition_leader_epoch: i32,
    pub max_timestamp: i64,
    pub records: i32,
    pub bytes: usize,
    pub crc: u32,
}

/// What one `take` put in the quarantine (also written as its `report.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuarantineReport {
    pub reason: String,
    pub topic: String,
    pub partition: i32,
    /// First offset taken and the log end at the time (exclusive).
    pub first_offset: i64,
    pub end_offset: i64,
    pub batch_count: usize,
    pub record_count: i64,
    pub bytes: u64,
    /// The segment file holding the batches.
    pub segment_file: PathBuf,
    pub batches: Vec<QuarantinedBatch>,
}

/// The quarantine of one data dir.
#[derive(Debug, Clone)]
pub struct Quarantine {
    root: PathBuf,
}

impl Quarantine {
    pub fn new(data_dir: &Path) -> Quarantine {
        Quarantine {
            root: data_dir.join(DIR_NAME),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Copies every batch of `log` from `from` (a batch boundary) to its end into
    /// `<label>/<topic>-<partition>/`, fsynced, with its report. `None` when there is nothing
    /// at or after `from`. The log is not changed.
    pub fn take(
        &self,
        label: &str,
        log: &PartitionLog,
        from: Offset,
        reason: &str,
    ) -> Result<Option<QuarantineReport>, LogError> {
        let end = log.log_end_offset();
        if from >= end {
            return Ok(None);
        }
        let tp = log.topic_partition();
        let dir = self.root.join(label).join(tp.to_string());
        fs::create_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
        let path = dir.join(format!("{:020}.log", from.0));
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| LogError::io(&path, e))?;
        let mut batches = Vec::new();
        let mut bytes: u64 = 0;
        let mut records: i64 = 0;
        let mut at = from;
        while at < end {
            let buf = log.read_bytes(at, QUARANTINE_READ_BYTES)?;
            if buf.is_empty() {
                break;
            }
            let mut next = at;
            for item in Batches::new(&buf) {
                let (_, b) = item.map_err(|e| LogError::corrupt(&path, e.to_string()))?;
                file.write_all(b.bytes())
                    .map_err(|e| LogError::io(&path, e))?;
                bytes += b.size() as u64;
                records += i64::from(b.records_count());
                batches.push(QuarantinedBatch {
                    base_offset: b.base_offset().0,
                    last_offset: b.last_offset().0,
                    partition_leader_epoch: b.partition_leader_epoch().0,
                    max_timestamp: b.max_timestamp().0,
                    records: b.records_count(),
                    bytes: b.size(),
                    crc: b.stored_crc(),
                });
                next = b.next_offset();
            }
            // A read returns at least one whole batch below the end; no progress is a bug.
            assert!(next > at, "quarantine read made no progress at {at}");
            at = next;
        }
        file.sync_all().map_err(|e| LogError::io(&path, e))?;
        let report = QuarantineReport {
            reason: reason.to_owned(),
            topic: tp.topic.clone(),
            partition: tp.partition,
            first_offset: from.0,
            end_offset: end.0,
            batch_count: batches.len(),
            record_count: records,
            bytes,
            segment_file: path,
            batches,
        };
        let json = serde_json::to_vec_pretty(&report)
            .map_err(|e| LogError::corrupt(&dir, e.to_string()))?;
        write_atomically(&dir.join("report.json"), &json)?;
        sync_dir(&dir)?;
        Ok(Some(report))
    }
}
