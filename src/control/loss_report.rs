//! The loss report of a failover (issue 16 item 3): per partition, what the source held that
//! kmirror did not when `mirrors stop` failed it over, and how sure kmirror is of it.
//!
//! What kmirror can know, and so what each figure means:
//!
//! | basis       | when                                   | `records`                     | `seconds_at_most` |
//! |-------------|----------------------------------------|-------------------------------|-------------------|
//! | `source`    | the source answered a ListOffsets asked at the stop | exact: source high watermark at that moment minus the mirrored end | the listing's time minus the newest mirrored record's timestamp |
//! | `last_seen` | the source did not answer (dead, black-holed) | at least: the last high watermark this process saw (fetch response, or `describe`'s listing of an idle partition) minus the mirrored end; the source may have acknowledged more after `seen_at_ms` | now minus the newest mirrored record's timestamp (whatever was lost was written after it and before now) |
//! | `unknown`   | no high watermark was ever seen by this process | unknown | as `last_seen` |
//!
//! `records` counts offsets (a compacted source's gaps and transaction markers included), as
//! lag does. `bytes_estimate` is `records` times the mirrored log's bytes per offset (the
//! bytes of records never fetched cannot be known without fetching them). `verified_through`
//! is the integrity audit's "verified through offset" (issue 16 item 1) when it runs; unknown
//! otherwise.
//!
//! Reports are kept in `<data_dir>/kmirror-loss-reports/<mirror>.json` (a JSON array, the
//! newest `LOSS_REPORTS_KEPT`, rewritten atomically with fsync), read back by
//! `kmirror mirrors loss-report`. A file beside `__mirror_state` rather than a record type in
//! it: a report is history for the operator, not state the controller replays.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ids::TopicPartition;
use crate::limits::{LOSS_REPORTS_KEPT, LOSS_REPORT_FILE_BYTES_MAX};
use crate::log::checkpoint::write_atomically;

/// Directory under the data dir holding one file per mirror.
pub const DIR_NAME: &str = "kmirror-loss-reports";

/// Where the report's source high watermark comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// Listed by the source at the stop: the count is exact.
    Source,
    /// The source did not answer: the last one this process saw; the count is a lower bound.
    LastSeen,
    /// No high watermark known at all.
    Unknown,
}

/// One partition's loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionLoss {
    pub topic: String,
    pub partition: i32,
    pub basis: Basis,
    /// The source's high watermark the count is based on.
    pub source_high_watermark: Option<i64>,
    /// When (wall-clock ms) kmirror learned that high watermark.
    pub seen_at_ms: Option<i64>,
    /// The mirrored end: the first offset kmirror does not hold.
    pub local_end: Option<i64>,
    /// Offsets the source held past `local_end`: exact for `source`, at least for `last_seen`.
    pub records: Option<i64>,
    pub records_exact: bool,
    /// `records` times the mirrored log's bytes per offset.
    pub bytes_estimate: Option<i64>,
    /// An upper bound of the time span of the lost records (0 when nothing is lost exactly).
    pub seconds_at_most: Option<f64>,
    /// Max timestamp of the newest batch kmirror stored, when this process stored one.
    pub newest_mirrored_timestamp_ms: Option<i64>,
    /// The integrity audit's mark (describe's `verifiedOffset`: every offset below it was
    /// checked against the source), when the audit runs (unknown otherwise).
    #[serde(default)]
    pub verified_through: Option<i64>,
}

/// The report of one `stop`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossReport {
    pub mirror: String,
    pub at_ms: i64,
    /// Whether the source answered the stop's ListOffsets, and why not.
    pub source_answered: bool,
    pub source_error: Option<String>,
    /// `--max-loss-seconds` of the stop, and whether `--force` let it through.
    pub max_loss_seconds: Option<f64>,
    pub forced: bool,
    pub partitions: Vec<PartitionLoss>,
}

impl LossReport {
    /// Offsets lost over all partitions (known ones; a partition with `records` unknown adds 0).
    pub fn total_records(&self) -> i64 {
        self.partitions
            .iter()
            .filter_map(|p| p.records)
            .fold(0i64, i64::saturating_add)
    }

    /// Whether every count is exact.
    pub fn exact(&self) -> bool {
        self.partitions.iter().all(|p| p.records_exact)
    }

    /// The partitions that may lose more than `max_seconds`: something (possibly) lost and the
    /// time span above the limit or unknown. Empty when the failover is within the limit.
    pub fn over_limit(&self, max_seconds: f64) -> Vec<String> {
        self.partitions
            .iter()
            .filter(|p| p.records != Some(0) || !p.records_exact)
            .filter(|p| p.seconds_at_most.is_none_or(|s| s > max_seconds))
            .filter(|p| !(p.records == Some(0) && p.basis == Basis::Source))
            .map(|p| {
                format!(
                    "{}-{}: {} offsets ({}), up to {} s",
                    p.topic,
                    p.partition,
                    p.records.map_or("unknown".to_owned(), |r| r.to_string()),
                    if p.records_exact { "exact" } else { "at least" },
                    p.seconds_at_most
                        .map_or("unknown".to_owned(), |s| format!("{s:.1}"))
                )
            })
            .collect()
    }
}

/// What the controller knows of one partition at the stop.
#[derive(Debug, Clone, Default)]
pub struct LossInput {
    /// The source's answer to the stop's ListOffsets, when it answered for this partition.
    pub listed: Option<i64>,
    /// The newest high watermark this process saw, and when.
    pub seen: Option<(i64, i64)>,
    pub local_end: Option<i64>,
    pub newest_timestamp_ms: Option<i64>,
    /// Bytes per offset of the mirrored log (for the estimate), when it holds any.
    pub bytes_per_offset: Option<f64>,
}

/// One partition's loss from what the controller knows; `listed_at_ms` is when the source
/// answered the stop's ListOffsets, `now_ms` the time of the report.
pub fn partition_loss(
    tp: &TopicPartition,
    input: &LossInput,
    listed_at_ms: i64,
    now_ms: i64,
) -> PartitionLoss {
    let (basis, hw, at) = match (input.listed, input.seen) {
        (Some(hw), _) => (Basis::Source, Some(hw), Some(listed_at_ms)),
        (None, Some((hw, at))) => (Basis::LastSeen, Some(hw), Some(at)),
        (None, None) => (Basis::Unknown, None, None),
    };
    let records = match (hw, input.local_end) {
        (Some(hw), Some(end)) => Some(hw.saturating_sub(end).max(0)),
        // Nothing mirrored: everything up to the high watermark (from offset 0 at most).
        (Some(hw), None) => Some(hw.max(0)),
        _ => None,
    };
    let seconds_at_most = if basis == Basis::Source && records == Some(0) {
        Some(0.0)
    } else {
        // Lost records were written after the newest mirrored one and no later than the
        // listing (exact basis) or now (the source may have taken more until it died).
        let until = if basis == Basis::Source {
            listed_at_ms
        } else {
            now_ms
        };
        input
            .newest_timestamp_ms
            .map(|ts| (until.saturating_sub(ts)).max(0) as f64 / 1000.0)
    };
    let bytes_estimate = match (records, input.bytes_per_offset) {
        (Some(r), Some(b)) => Some((r as f64 * b).round() as i64),
        _ => None,
    };
    PartitionLoss {
        topic: tp.topic.clone(),
        partition: tp.partition,
        basis,
        source_high_watermark: hw,
        seen_at_ms: at,
        local_end: input.local_end,
        records,
        records_exact: basis == Basis::Source,
        bytes_estimate,
        seconds_at_most,
        newest_mirrored_timestamp_ms: input.newest_timestamp_ms,
        verified_through: None,
    }
}

/// Bytes per offset of a partition directory's segments (`.log` files over the offsets from
/// the first segment's base to `end`); `None` when it holds nothing or cannot be read.
pub fn bytes_per_offset(partition_dir: &Path, end: i64) -> Option<f64> {
    let mut bytes: u64 = 0;
    let mut first: Option<i64> = None;
    for entry in std::fs::read_dir(partition_dir).ok()? {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let name = name.to_str()?;
        let Some(base) = name.strip_suffix(".log") else {
            continue;
        };
        let Ok(base) = base.parse::<i64>() else {
            continue;
        };
        bytes = bytes.saturating_add(entry.metadata().ok()?.len());
        first = Some(first.map_or(base, |f: i64| f.min(base)));
    }
    let offsets = end.saturating_sub(first?);
    (offsets > 0 && bytes > 0).then(|| bytes as f64 / offsets as f64)
}

#[derive(Debug, thiserror::Error)]
pub enum LossStoreError {
    #[error("loss reports {path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

/// The loss reports of the mirrors of one data dir.
#[derive(Debug, Clone)]
pub struct LossReports {
    dir: PathBuf,
}

impl LossReports {
    pub fn new(data_dir: &Path) -> LossReports {
        LossReports {
            dir: data_dir.join(DIR_NAME),
        }
    }

    fn path(&self, mirror: &str) -> PathBuf {
        // Mirror names are file-name safe (MirrorName: `A-Za-z0-9._-`, never `.` or `..`).
        self.dir.join(format!("{mirror}.json"))
    }

    /// Every stored report of `mirror`, oldest first (none stored: empty).
    pub fn load(&self, mirror: &str) -> Result<Vec<LossReport>, LossStoreError> {
        let path = self.path(mirror);
        let err = |reason: String| LossStoreError::Io {
            path: path.clone(),
            reason,
        };
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(err(e.to_string())),
            Ok(m) if m.len() > LOSS_REPORT_FILE_BYTES_MAX => {
                return Err(err(format!(
                    "larger than {LOSS_REPORT_FILE_BYTES_MAX} bytes"
                )))
            }
            Ok(_) => {}
        }
        let bytes = std::fs::read(&path).map_err(|e| err(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| err(e.to_string()))
    }

    /// Appends `report` durably (the newest `LOSS_REPORTS_KEPT` are kept).
    pub fn append(&self, report: &LossReport) -> Result<(), LossStoreError> {
        let mut all = self.load(&report.mirror)?;
        all.push(report.clone());
        let drop = all.len().saturating_sub(LOSS_REPORTS_KEPT);
        all.drain(..drop);
        let path = self.path(&report.mirror);
        let err = |reason: String| LossStoreError::Io {
            path: path.clone(),
            reason,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| err(e.to_string()))?;
        let json = serde_json::to_vec_pretty(&all).map_err(|e| err(e.to_string()))?;
        write_atomically(&path, &json).map_err(|e| err(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    #[test]
    fn listed_by_the_source_is_exact() {
        let input = LossInput {
            listed: Some(120),
            seen: Some((100, 1_000)),
            local_end: Some(100),
            newest_timestamp_ms: Some(4_000),
            bytes_per_offset: Some(10.0),
        };
        let l = partition_loss(&tp(), &input, 9_000, 9_500);
        assert_eq!(l.basis, Basis::Source);
        assert_eq!((l.records, l.records_exact), (Some(20), true));
        assert_eq!(l.bytes_estimate, Some(200));
        assert_eq!(l.seconds_at_most, Some(5.0));
        assert_eq!(l.seen_at_ms, Some(9_000));
    }

    #[test]
    fn last_seen_is_a_lower_bound_and_seconds_run_to_now() {
        let input = LossInput {
            listed: None,
            seen: Some((130, 2_000)),
            local_end: Some(100),
            newest_timestamp_ms: Some(1_000),
            bytes_per_offset: None,
        };
        let l = partition_loss(&tp(), &input, 0, 11_000);
        assert_eq!(l.basis, Basis::LastSeen);
        assert_eq!((l.records, l.records_exact), (Some(30), false));
        assert_eq!(l.seconds_at_most, Some(10.0));
        let report = LossReport {
            mirror: "m".into(),
            at_ms: 11_000,
            source_answered: false,
            source_error: Some("refused".into()),
            max_loss_seconds: Some(60.0),
            forced: false,
            partitions: vec![l],
        };
        assert!(report.over_limit(60.0).is_empty(), "10 s is within 60 s");
        assert_eq!(report.over_limit(5.0).len(), 1);
    }

    #[test]
    fn caught_up_by_the_source_loses_nothing_and_a_mirror_ahead_is_zero() {
        let input = LossInput {
            listed: Some(100),
            local_end: Some(105),
            ..LossInput::default()
        };
        let l = partition_loss(&tp(), &input, 5, 5);
        assert_eq!((l.records, l.seconds_at_most), (Some(0), Some(0.0)));
        let report = LossReport {
            mirror: "m".into(),
            at_ms: 5,
            source_answered: true,
            source_error: None,
            max_loss_seconds: Some(0.0),
            forced: false,
            partitions: vec![l],
        };
        assert!(report.over_limit(0.0).is_empty());
    }

    #[test]
    fn unknown_time_span_is_over_any_limit_when_something_may_be_lost() {
        let input = LossInput {
            seen: Some((10, 1)),
            local_end: Some(4),
            ..LossInput::default()
        };
        let l = partition_loss(&tp(), &input, 5, 5);
        assert_eq!(l.seconds_at_most, None);
        let report = LossReport {
            mirror: "m".into(),
            at_ms: 5,
            source_answered: false,
            source_error: None,
            max_loss_seconds: None,
            forced: false,
            partitions: vec![l],
        };
        assert_eq!(report.over_limit(1e9).len(), 1);
    }

    #[test]
    fn reports_are_appended_durably_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = LossReports::new(dir.path());
        assert!(store.load("m").unwrap().is_empty());
        for i in 0..(LOSS_REPORTS_KEPT + 2) {
            let r = LossReport {
                mirror: "m".into(),
                at_ms: i as i64,
                source_answered: true,
                source_error: None,
                max_loss_seconds: None,
                forced: false,
                partitions: Vec::new(),
            };
            store.append(&r).unwrap();
        }
        let all = store.load("m").unwrap();
        assert_eq!(all.len(), LOSS_REPORTS_KEPT);
        assert_eq!(all.last().unwrap().at_ms, (LOSS_REPORTS_KEPT + 1) as i64);
    }

    #[test]
    fn bytes_per_offset_of_a_partition_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("00000000000000000010.log"), vec![0u8; 100]).unwrap();
        std::fs::write(dir.path().join("00000000000000000020.log"), vec![0u8; 100]).unwrap();
        std::fs::write(
            dir.path().join("00000000000000000010.index"),
            vec![0u8; 999],
        )
        .unwrap();
        assert_eq!(bytes_per_offset(dir.path(), 30), Some(10.0));
        assert_eq!(bytes_per_offset(dir.path(), 10), None);
    }
}
