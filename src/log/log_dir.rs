//! One log directory root (an entry of Kafka's `log.dirs`) holding many partition directories,
//! with the root-level checkpoints and the clean-shutdown marker (kafka-formats.md §3, §3.7).
//!
//! Opening removes `.kafka_cleanshutdown` (after loading every partition, so a crash during the
//! open still finds it and loses nothing); only `close`, after every partition has written its
//! final index entries and producer snapshot and fsynced, writes it back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use uuid::Uuid;

use crate::ids::{Offset, TopicPartition};
use crate::log::checkpoint::{sync_dir, OffsetCheckpointFile};
use crate::log::config::LogConfig;
use crate::log::io::LogIo;
use crate::log::partition_log::PartitionLog;
use crate::log::read_view::ReadCatalog;
use crate::log::recovery::LoadOptions;
use crate::log::{clean_shutdown, LogError};

#[derive(Debug)]
pub struct LogDir {
    root: PathBuf,
    default_config: LogConfig,
    logs: BTreeMap<TopicPartition, PartitionLog>,
    /// Where partitions are announced to the Kafka endpoint, once attached.
    catalog: Option<Arc<ReadCatalog>>,
}

/// `<topic>-<partition>` → the partition, for live partition directories. Kafka's deleted,
/// future and stray directories (`…-delete`, `…-future`, `…-stray`) do not parse.
pub fn parse_partition_dir(name: &str) -> Option<TopicPartition> {
    let (topic, partition) = name.rsplit_once('-')?;
    if topic.is_empty() || partition.is_empty() || !partition.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(TopicPartition::new(topic, partition.parse().ok()?))
}

impl LogDir {
    /// Opens (creating if needed) the root and every partition directory in it, all with
    /// `default_config`.
    pub fn open(
        root: &Path,
        default_config: LogConfig,
        io: &mut impl LogIo,
    ) -> Result<LogDir, LogError> {
        let default = default_config.clone();
        Self::open_with(root, default_config, |_| default.clone(), io)
    }

    /// `open`, with each existing partition opened under `config_for(partition)` (its topic's
    /// settings); `default_config` is used for partitions created later without one.
    pub fn open_with(
        root: &Path,
        default_config: LogConfig,
        config_for: impl Fn(&TopicPartition) -> LogConfig,
        io: &mut impl LogIo,
    ) -> Result<LogDir, LogError> {
        let opened_at = std::time::Instant::now();
        default_config.validate()?;
        std::fs::create_dir_all(root).map_err(|e| LogError::io(root, e))?;
        let clean = clean_shutdown::exists(root)?;
        let recovery_points =
            OffsetCheckpointFile::read(&root.join(OffsetCheckpointFile::RECOVERY_POINT))?;
        let log_starts =
            OffsetCheckpointFile::read(&root.join(OffsetCheckpointFile::LOG_START_OFFSET))?;
        let mut logs = BTreeMap::new();
        let entries = std::fs::read_dir(root).map_err(|e| LogError::io(root, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| LogError::io(root, e))?;
            let file_type = entry
                .file_type()
                .map_err(|e| LogError::io(entry.path(), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(tp) = parse_partition_dir(&name).filter(|_| file_type.is_dir()) else {
                continue;
            };
            let load = LoadOptions {
                clean_shutdown: clean,
                recovery_point: recovery_points.get(&tp).copied().unwrap_or(Offset::ZERO),
                log_start_offset: log_starts.get(&tp).copied(),
            };
            let log =
                PartitionLog::open(&entry.path(), tp.clone(), None, config_for(&tp), load, io)?;
            logs.insert(tp, log);
        }
        let recovered = logs.values().filter(|l| l.recovered_at_open()).count();
        // Operators (and tests/ops_shutdown.rs) read this line to see whether the last stop was
        // clean and recovery was skipped.
        tracing::info!(
            dir = %root.display(),
            partitions = logs.len(),
            clean_shutdown = clean,
            recovered,
            elapsed_ms = opened_at.elapsed().as_millis() as u64,
            "log dir opened"
        );
        let dir = LogDir {
            root: root.to_path_buf(),
            default_config,
            logs,
            catalog: None,
        };
        // From here on the directory is live: a crash must trigger recovery.
        dir.write_checkpoints()?;
        clean_shutdown::remove(root)?;
        Ok(dir)
    }

    /// Announces every partition (present and created later) to `catalog`: each log
    /// publishes its read views there until the partition is deleted.
    pub fn attach_catalog(&mut self, catalog: Arc<ReadCatalog>) {
        for (tp, log) in &mut self.logs {
            catalog.insert(tp.clone(), log.attach_read_view());
        }
        self.catalog = Some(catalog);
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<&PartitionLog> {
        self.logs.get(tp)
    }

    pub fn get_mut(&mut self, tp: &TopicPartition) -> Option<&mut PartitionLog> {
        self.logs.get_mut(tp)
    }

    pub fn partitions(&self) -> impl Iterator<Item = (&TopicPartition, &PartitionLog)> {
        self.logs.iter()
    }

    /// Creates a partition directory, or returns the existing log (whose topic id must match).
    pub fn get_or_create(
        &mut self,
        tp: &TopicPartition,
        topic_id: Option<Uuid>,
        config: Option<LogConfig>,
    ) -> Result<&mut PartitionLog, LogError> {
        if !self.logs.contains_key(tp) {
            let config = config.unwrap_or_else(|| self.default_config.clone());
            let dir = self.root.join(tp.dir_name());
            let mut log = PartitionLog::create(&dir, tp.clone(), topic_id, config)?;
            if let Some(catalog) = &self.catalog {
                catalog.insert(tp.clone(), log.attach_read_view());
            }
            self.logs.insert(tp.clone(), log);
        }
        let log = self.logs.get_mut(tp).expect("present");
        if let (Some(have), Some(want)) = (log.topic_id(), topic_id) {
            if have != want {
                return Err(LogError::corrupt(
                    log.dir().join("partition.metadata"),
                    format!("topic id {have} differs from the expected {want}"),
                ));
            }
        }
        Ok(log)
    }

    /// Lends a partition's log to its owner (a shard) until `restore` gives it back; while out,
    /// it is not part of `flush`, `write_checkpoints` or `close`.
    pub fn take(&mut self, tp: &TopicPartition) -> Option<PartitionLog> {
        self.logs.remove(tp)
    }

    /// Gives back a log lent by `take`.
    pub fn restore(&mut self, log: PartitionLog) {
        let tp = log.topic_partition().clone();
        let previous = self.logs.insert(tp, log);
        assert!(
            previous.is_none(),
            "a partition log restored while another is present"
        );
    }

    /// Deletes a partition and its directory.
    pub fn delete_partition(&mut self, tp: &TopicPartition) -> Result<bool, LogError> {
        let Some(log) = self.logs.remove(tp) else {
            return Ok(false);
        };
        if let Some(catalog) = &self.catalog {
            catalog.remove(tp);
        }
        log.delete()?;
        sync_dir(&self.root)?;
        self.write_checkpoints()?;
        Ok(true)
    }

    /// Writes `recovery-point-offset-checkpoint`, `log-start-offset-checkpoint` (only for
    /// partitions whose start lies above their first segment, as Kafka does) and
    /// `replication-offset-checkpoint` (high watermark = log end for a mirror).
    pub fn write_checkpoints(&self) -> Result<(), LogError> {
        self.write_checkpoints_with(&mut crate::log::io::StdIo)
    }

    /// `write_checkpoints` with the files' writes and syncs through `io` (a failing disk in
    /// tests); a failure leaves each checkpoint as it was (atomic replace).
    pub fn write_checkpoints_with(&self, io: &mut impl LogIo) -> Result<(), LogError> {
        let mut recovery = BTreeMap::new();
        let mut starts = BTreeMap::new();
        let mut hws = BTreeMap::new();
        for (tp, log) in &self.logs {
            recovery.insert(tp.clone(), log.recovery_point());
            hws.insert(tp.clone(), log.high_watermark());
            let first_base = log.segments()[0].base_offset();
            if log.log_start_offset() > first_base {
                starts.insert(tp.clone(), log.log_start_offset());
            }
        }
        OffsetCheckpointFile::write_with(
            io,
            &self.root.join(OffsetCheckpointFile::RECOVERY_POINT),
            &recovery,
        )?;
        OffsetCheckpointFile::write_with(
            io,
            &self.root.join(OffsetCheckpointFile::LOG_START_OFFSET),
            &starts,
        )?;
        OffsetCheckpointFile::write_with(
            io,
            &self.root.join(OffsetCheckpointFile::REPLICATION_OFFSET),
            &hws,
        )
    }

    /// Flushes every partition (moving recovery points to the log ends) and checkpoints.
    ///
    /// A log that cannot be flushed (offline after a disk error) does not stop the others:
    /// every log is flushed, the checkpoints written (the failed log's recovery point stays
    /// where its last good flush left it), and then the first error is returned.
    pub fn flush(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        let mut first_error = None;
        for log in self.logs.values_mut() {
            if let Err(e) = log.flush(io) {
                first_error.get_or_insert(e);
            }
        }
        self.write_checkpoints_with(io)?;
        first_error.map_or(Ok(()), Err)
    }

    /// Closes every partition (final index entries, snapshots, fsync), writes the checkpoints
    /// and then the clean-shutdown marker. If any step fails the marker is not written, so the
    /// next open recovers.
    pub fn close(mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        self.flush(io)?;
        let root = self.root.clone();
        let logs = std::mem::take(&mut self.logs);
        for (_, log) in logs {
            log.close(io)?;
        }
        clean_shutdown::write(&root, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a log lent out with `take` is absent until `restore`, and then checkpoints and
    // closes with the rest (the clean-shutdown marker follows).
    #[test]
    fn take_and_restore() {
        let root = tempfile::tempdir().unwrap();
        let mut io = crate::log::io::StdIo;
        let mut dir = LogDir::open(root.path(), LogConfig::default(), &mut io).unwrap();
        let tp = TopicPartition::new("t", 0);
        dir.get_or_create(&tp, None, None).unwrap();
        let log = dir.take(&tp).unwrap();
        assert!(dir.get(&tp).is_none());
        dir.restore(log);
        assert!(dir.get(&tp).is_some());
        dir.close(&mut io).unwrap();
        assert!(clean_shutdown::exists(root.path()).unwrap());
    }

    #[test]
    fn partition_dir_names() {
        assert_eq!(
            parse_partition_dir("orders-3"),
            Some(TopicPartition::new("orders", 3))
        );
        assert_eq!(
            parse_partition_dir("my-topic.v2-10"),
            Some(TopicPartition::new("my-topic.v2", 10))
        );
        assert_eq!(
            parse_partition_dir("orders-3.0123456789abcdef0123456789abcdef-delete"),
            None
        );
        assert_eq!(
            parse_partition_dir("orders-3.0123456789abcdef0123456789abcdef-future"),
            None
        );
        assert_eq!(
            parse_partition_dir("recovery-point-offset-checkpoint"),
            None
        );
        assert_eq!(parse_partition_dir("-3"), None);
    }
}
