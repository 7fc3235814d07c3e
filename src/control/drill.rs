//! Failover drills (issue 16 item 2): a writable clone of mirrored partitions, made while
//! mirroring continues, for clients to rehearse a failover against. The mirror itself is never
//! touched: its logs stay byte-identical to the source throughout.
//!
//! Design: a drill named D of topic T is the topic `drill.D.T` (same partition count) in the
//! same data dir, served writable on the existing `[kafka]` listener like a failed-over
//! partition (it is led by the leader store). It is built from one published read view of the
//! mirrored partition, so from a consistent point of a log a shard keeps appending to:
//! - sealed segments: their `.log` hard-linked (never copied when the filesystem can link; a
//!   copy only on EXDEV and the like), their indexes copied (small, and recovery may rebuild
//!   an index in place, which must never reach the mirror's file through a link);
//! - the active segment: its `.log` copied up to the published size (whole batches); its
//!   indexes are rebuilt by the clone's recovery;
//! - `leader-epoch-checkpoint` and producer snapshots copied; `partition.metadata` written
//!   with the clone topic's own id (clients address topics by id from Fetch v13).
//!
//! The clone is then opened (recovering only its private active segment) and promoted: its
//! leader epoch raised and the source's open transactions aborted, in the clone only.
//!
//! Why hard links are safe: kmirror never rewrites a sealed `.log` in place (appends go to the
//! active segment, retention unlinks whole files, recovery only cuts segments past the
//! recovery point and the clone's recovery point is its active segment's base). Nothing a
//! client writes to the clone reaches a shared file: its appends go to its private active
//! copy or new segments.
//!
//! Group offsets: at the start every consumer group's committed offset of a drilled partition
//! (the offsets the group-offset sync copied from the source) is written for the clone's
//! partition under the same group id, clamped to the clone, so a consumer of the rehearsal
//! (same `group.id`, subscribed to `drill.D.T`) resumes where the group was. Groups with a
//! member on kmirror at that moment are left alone (their own commits win). `drill stop`
//! deletes every offset committed on the clone's partitions.
//!
//! Restarts: each drill is recorded in `<data_dir>/kmirror-drills/<name>.json` before each
//! step acts (`DrillPhase`): a restart serves a running drill's clones again (they are ordinary
//! promoted partitions on disk), deletes the clones of one that was starting, and finishes the
//! stop of one that was stopping.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::{Offset, TopicPartition};
use crate::log::partition_log::PartitionLog;
use crate::log::producer_state::snapshot_path;
use crate::log::read_view::PartitionReadView;
use crate::log::recovery::LoadOptions;
use crate::log::LogError;

/// Prefix of a drill's topics: `drill.<name>.<topic>`.
pub const TOPIC_PREFIX: &str = "drill.";

/// The clone topic of `topic` in drill `name`.
pub fn clone_topic(name: &str, topic: &str) -> String {
    format!("{TOPIC_PREFIX}{name}.{topic}")
}

/// Drill names: what Kafka allows in topic names, without dots (they separate the parts).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("drill name {name:?} must be 1..=64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "drill name {name:?} may hold only A-Z a-z 0-9 _ - (it becomes part of topic names)"
        ));
    }
    Ok(())
}

/// What cloning one partition cost on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneCost {
    /// Bytes written for the clone (active segment tails, indexes, checkpoints, snapshots).
    pub copied_bytes: u64,
    /// Bytes shared with the mirror through hard links.
    pub linked_bytes: u64,
    /// Segments whose `.log` had to be copied because the filesystem would not link it.
    pub link_fallbacks: u32,
}

fn copy(from: &Path, to: &Path, cost: &mut CloneCost) -> Result<(), LogError> {
    match fs::copy(from, to) {
        Ok(n) => {
            cost.copied_bytes += n;
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LogError::io(from, e)),
    }
}

/// Copies the first `len` bytes of `from`.
fn copy_prefix(from: &Path, to: &Path, len: u64, cost: &mut CloneCost) -> Result<(), LogError> {
    use std::io::{Read, Write};
    let src = fs::File::open(from).map_err(|e| LogError::io(from, e))?;
    let mut dst = fs::File::create(to).map_err(|e| LogError::io(to, e))?;
    let n = std::io::copy(&mut src.take(len), &mut dst).map_err(|e| LogError::io(to, e))?;
    if n != len {
        return Err(LogError::corrupt(
            from,
            format!("holds {n} bytes, the published view {len}"),
        ));
    }
    dst.flush().map_err(|e| LogError::io(to, e))?;
    dst.sync_all().map_err(|e| LogError::io(to, e))?;
    cost.copied_bytes += len;
    Ok(())
}

fn link_or_copy(from: &Path, to: &Path, cost: &mut CloneCost) -> Result<(), LogError> {
    let len = fs::metadata(from).map_err(|e| LogError::io(from, e))?.len();
    match fs::hard_link(from, to) {
        Ok(()) => {
            cost.linked_bytes += len;
            Ok(())
        }
        Err(_) => {
            cost.link_fallbacks += 1;
            copy(from, to, cost)
        }
    }
}

/// Builds the clone directory `<root>/<clone tp>/` from `view` (see the module comment) and
/// opens it. The log returned is not promoted yet.
pub fn clone_partition(
    root: &Path,
    view: &PartitionReadView,
    clone_tp: &TopicPartition,
    clone_topic_id: Uuid,
) -> Result<(PartitionLog, CloneCost), LogError> {
    let dir: PathBuf = root.join(clone_tp.dir_name());
    if dir.exists() {
        return Err(LogError::corrupt(
            &dir,
            "a drill directory of that name exists",
        ));
    }
    fs::create_dir_all(&dir).map_err(|e| LogError::io(&dir, e))?;
    let mut cost = CloneCost::default();
    let built = (|| {
        let (active, sealed) = view
            .segments
            .split_last()
            .expect("a published view has a segment");
        for (i, seg) in sealed.iter().enumerate() {
            let f = &seg.files;
            link_or_copy(&f.log, &dir.join(file_name(&f.log)), &mut cost)?;
            // The clone opens with its recovery point at its active segment, so a sealed
            // segment must be durable. The mirror writes the producer snapshot at the next
            // segment's base only once the roll's flush made this one durable; without it
            // that flush may still be running on the shard, so this sync waits for it.
            let next_base = view.segments[i + 1].base();
            if !snapshot_path(&view.dir, next_base).exists() {
                fs::File::open(&f.log)
                    .and_then(|l| l.sync_data())
                    .map_err(|e| LogError::io(&*f.log, e))?;
            }
            for idx in [&f.offset_index, &f.time_index, &f.txn_index] {
                copy(idx, &dir.join(file_name(idx)), &mut cost)?;
            }
        }
        let f = &active.files;
        copy_prefix(&f.log, &dir.join(file_name(&f.log)), active.size, &mut cost)?;
        copy(
            &view.dir.join("leader-epoch-checkpoint"),
            &dir.join("leader-epoch-checkpoint"),
            &mut cost,
        )?;
        for entry in fs::read_dir(&view.dir).map_err(|e| LogError::io(&*view.dir, e))? {
            let entry = entry.map_err(|e| LogError::io(&*view.dir, e))?;
            let name = entry.file_name();
            if name.to_string_lossy().ends_with(".snapshot") {
                copy(&entry.path(), &dir.join(&name), &mut cost)?;
            }
        }
        crate::log::partition_meta::write(&dir, clone_topic_id)?;
        crate::log::checkpoint::sync_dir(&dir)?;
        let load = LoadOptions {
            clean_shutdown: false,
            recovery_point: active.base(),
            log_start_offset: Some(view.log_start),
        };
        let mut log = PartitionLog::open(
            &dir,
            clone_tp.clone(),
            Some(clone_topic_id),
            (*view.config).clone(),
            load,
            &mut crate::log::io::StdIo,
        )?;
        // The snapshots the mirror had not written yet (its last roll's flush was running).
        log.snapshot_segment_bases(&mut crate::log::io::StdIo)?;
        Ok(log)
    })();
    match built {
        Ok(log) => Ok((log, cost)),
        Err(e) => {
            let _ = fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

fn file_name(p: &Path) -> &std::ffi::OsStr {
    p.file_name().expect("segment files have names")
}

/// One partition of a drill in progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillPartition {
    pub topic: String,
    pub partition: i32,
    pub clone_topic: String,
    /// The mirrored end the clone was taken at (its end before promotion); -1 while the
    /// drill is starting and this partition is not cloned yet.
    pub cloned_end: i64,
    pub cost: CloneCost,
    /// Consumer-group offsets of the mirrored partition copied for the clone at the start.
    #[serde(default)]
    pub group_offsets: u32,
}

/// A drill in progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillSummary {
    pub name: String,
    pub mirror: String,
    pub started_at_ms: i64,
    pub partitions: Vec<DrillPartition>,
    /// Bytes the drill's directories use now beyond what they share with the mirror
    /// (its copies plus what clients wrote to it).
    pub disk_bytes: u64,
    pub linked_bytes: u64,
    /// Groups whose offsets were not copied because they had members on kmirror at the start
    /// (their own commits win, as in the group-offset sync).
    #[serde(default)]
    pub groups_left_alone: Vec<String>,
}

/// Where drills are recorded (`control::json_records`, one file per drill), so a drill and its
/// clones outlive a restart of kmirror.
pub const RECORDS_DIR: &str = "kmirror-drills";

/// How far a drill got, as recorded before each step acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrillPhase {
    /// Recorded before the first clone: a restart finding it deletes what was cloned.
    Starting,
    /// Every clone made and served: a restart serves them again.
    Running,
    /// Recorded before the clones are deleted: a restart finishes deleting them.
    Stopping,
}

/// A drill's durable record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrillRecord {
    pub phase: DrillPhase,
    /// While starting: the partitions to be cloned (`cloned_end` -1).
    pub summary: DrillSummary,
}

/// Bytes of the files in `dir` whose only link is there (not shared with the mirror).
pub fn unshared_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file() && m.nlink() == 1)
        .map(|m| m.len())
        .sum()
}

/// The clone's offset end as of the view.
pub fn view_end(view: &PartitionReadView) -> Offset {
    view.segments
        .last()
        .map_or(view.log_start, |s| s.next_offset)
}
