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
//! `<label>` names the action (`cut-<mirror>-<ms>` for a consistent cut, `unclean-<ms>` for an
//! unclean-election recovery). The `.log` file is a valid Kafka segment (`kafka-dump-log.sh
//! --files ... --deep-iteration` reads it; it has no index, which the tool does not need).
//! `take` only copies: the caller truncates the log afterwards, so a crash in between leaves
//! the data in both places, never in neither. `report.json` is written last, so its presence
//! says the take is complete; `covering` finds a complete take a repeated action can reuse.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids::{Offset, TopicPartition};
use crate::limits::{QUARANTINE_READ_BYTES, QUARANTINE_REPORT_BYTES_MAX};
use crate::log::checkpoint::{sync_dir, write_atomically_with};
use crate::log::io::{LogIo, StdIo};
use crate::log::partition_log::PartitionLog;
use crate::log::LogError;
use crate::wire::batch::{Batch, Batches};

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
        self.take_with(&mut StdIo, label, log, from, reason)
    }

    /// `take` with the segment's writes, its sync and the report's write issued through `io`
    /// (crash and disk-fault tests stop the "disk" between any two of them).
    pub fn take_with(
        &self,
        io: &mut impl LogIo,
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
        // A report left by an earlier take is removed first: a take that a crash interrupts
        // must never look complete with the new segment's bytes under the old report.
        let report_path = dir.join(REPORT_FILE);
        match fs::remove_file(&report_path) {
            Ok(()) => sync_dir(&dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(&report_path, e)),
        }
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| LogError::io(&path, e))?;
        let mut batches = Vec::new();
        let mut bytes: u64 = 0;
        let mut records: i64 = 0;
        each_batch(log, from, |b| {
            io.write_all_at(&file, bytes, b.bytes())
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
            Ok(())
        })?;
        io.sync_data(&file).map_err(|e| LogError::io(&path, e))?;
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
        // The report is written last: its presence says the segment beside it is complete.
        write_atomically_with(io, &report_path, &json)?;
        sync_dir(&dir)?;
        Ok(Some(report))
    }

    /// Every complete take (one with its report) of `tp` under a label starting with
    /// `prefix`, as (label, report), oldest label first. Takes a crash interrupted (a segment
    /// without its report) are not listed.
    pub fn reports(
        &self,
        prefix: &str,
        tp: &TopicPartition,
    ) -> Result<Vec<(String, QuarantineReport)>, LogError> {
        let mut out = Vec::new();
        for label in self.labels(prefix)? {
            let path = self
                .root
                .join(&label)
                .join(tp.to_string())
                .join(REPORT_FILE);
            if let Some(report) = read_report(&path)? {
                out.push((label, report));
            }
        }
        Ok(out)
    }

    /// Every partition with a complete take under a label starting with `prefix`.
    pub fn partitions(&self, prefix: &str) -> Result<Vec<TopicPartition>, LogError> {
        let mut out = Vec::new();
        for label in self.labels(prefix)? {
            let dir = self.root.join(&label);
            for entry in fs::read_dir(&dir).map_err(|e| LogError::io(&dir, e))? {
                let entry = entry.map_err(|e| LogError::io(&dir, e))?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let Some((topic, partition)) = name.rsplit_once('-') else {
                    continue;
                };
                let Ok(partition) = partition.parse::<i32>() else {
                    continue;
                };
                if entry.path().join(REPORT_FILE).exists() {
                    out.push(TopicPartition::new(topic.to_owned(), partition));
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// A complete take of `tp` under `prefix` that already holds `log`'s batches from `from`
    /// to its end, byte for byte (same base offsets and CRCs, the take may hold more after
    /// them): what a crash after the take, or in the middle of the truncation that follows
    /// it, leaves. Repeating the action then reuses it instead of quarantining the same
    /// records twice, or overwriting a complete take with a shorter one.
    pub fn covering(
        &self,
        prefix: &str,
        log: &PartitionLog,
        from: Offset,
    ) -> Result<Option<(String, QuarantineReport)>, LogError> {
        let tp = log.topic_partition().clone();
        let held = batch_ids(log, from)?;
        if held.is_empty() {
            return Ok(None);
        }
        for (label, report) in self.reports(prefix, &tp)?.into_iter().rev() {
            let taken: Vec<(i64, u32)> = report
                .batches
                .iter()
                .map(|b| (b.base_offset, b.crc))
                .collect();
            if report.first_offset == from.0 && taken.starts_with(&held) {
                return Ok(Some((label, report)));
            }
        }
        Ok(None)
    }

    /// Removes the segments of takes of `tp` under `prefix` that a crash interrupted (no
    /// report): their batches are all still in the log, which is truncated only after a
    /// take completed.
    pub fn remove_incomplete(&self, prefix: &str, tp: &TopicPartition) -> Result<(), LogError> {
        for label in self.labels(prefix)? {
            let dir = self.root.join(&label).join(tp.to_string());
            if dir.is_dir() && !dir.join(REPORT_FILE).exists() {
                fs::remove_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
                let parent = self.root.join(&label);
                // The label's directory goes too once no partition is left in it.
                if fs::read_dir(&parent).is_ok_and(|mut d| d.next().is_none()) {
                    let _ = fs::remove_dir(&parent);
                }
                sync_dir(&self.root)?;
            }
        }
        Ok(())
    }

    fn labels(&self, prefix: &str) -> Result<Vec<String>, LogError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(LogError::io(&self.root, e)),
        };
        let mut labels = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io(&self.root, e))?;
            if let Some(name) = entry.file_name().to_str() {
                if name.starts_with(prefix) && entry.path().is_dir() {
                    labels.push(name.to_owned());
                }
            }
        }
        labels.sort();
        Ok(labels)
    }
}

/// The report beside each take's segment.
pub const REPORT_FILE: &str = "report.json";

fn read_report(path: &Path) -> Result<Option<QuarantineReport>, LogError> {
    let bytes = match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io(path, e)),
        Ok(m) if m.len() > QUARANTINE_REPORT_BYTES_MAX => {
            return Err(LogError::corrupt(
                path,
                format!("{} bytes exceeds {QUARANTINE_REPORT_BYTES_MAX}", m.len()),
            ))
        }
        Ok(_) => fs::read(path).map_err(|e| LogError::io(path, e))?,
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| LogError::corrupt(path, e.to_string()))
}

/// (base offset, CRC) of each batch of `log` from `from` to its end.
fn batch_ids(log: &PartitionLog, from: Offset) -> Result<Vec<(i64, u32)>, LogError> {
    let mut out = Vec::new();
    each_batch(log, from, |b| {
        out.push((b.base_offset().0, b.stored_crc()));
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with each batch of `log` from the one holding `from` to the log end, read in
/// chunks of `QUARANTINE_READ_BYTES` (plus one batch).
fn each_batch(
    log: &PartitionLog,
    from: Offset,
    mut f: impl FnMut(&Batch<'_>) -> Result<(), LogError>,
) -> Result<(), LogError> {
    let end = log.log_end_offset();
    let mut at = from;
    while at < end {
        let buf = log.read_bytes(at, QUARANTINE_READ_BYTES)?;
        if buf.is_empty() {
            break;
        }
        let mut next = at;
        for item in Batches::new(&buf) {
            let (_, b) = item.map_err(|e| LogError::corrupt(log.dir(), e.to_string()))?;
            f(&b)?;
            next = b.next_offset();
        }
        // A read returns at least one whole batch below the end; no progress is a bug.
        assert!(next > at, "quarantine read made no progress at {at}");
        at = next;
    }
    Ok(())
}
