//! One log directory root (an entry of Kafka's `log.dirs`) holding many partition directories,
//! with the root-level checkpoints and the clean-shutdown marker (kafka-formats.md §3, §3.7).
//!
//! Opening removes `.kafka_cleanshutdown` (after loading every partition, so a crash during the
//! open still finds it and loses nothing); only `close`, after every partition has written its
//! final index entries and producer snapshot and fsynced, writes it back, and only when every
//! log lent out (`take`) came back: a log that died with its owner (a panicked shard) was never
//! closed, so the next start must recover.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use uuid::Uuid;

use crate::ids::{Offset, TopicPartition};
use crate::limits::RECOVERY_THREADS_MAX;
use crate::log::checkpoint::{sync_dir, OffsetCheckpointFile};
use crate::log::checkpoint_cell::CheckpointCell;
use crate::log::config::LogConfig;
use crate::log::io::LogIo;
use crate::log::on_threads::{first_error, on_threads, AfterError};
use crate::log::partition_log::PartitionLog;
use crate::log::read_view::ReadCatalog;
use crate::log::recovery::{LoadOptions, SyncAfter};
use crate::log::{clean_shutdown, LogError};

#[derive(Debug)]
pub struct LogDir {
    root: PathBuf,
    default_config: LogConfig,
    logs: BTreeMap<TopicPartition, PartitionLog>,
    /// Partitions lent out by `take` and not restored yet.
    lent: BTreeSet<TopicPartition>,
    /// Every partition's checkpoint lines, present or lent out (its owner keeps them current).
    cells: BTreeMap<TopicPartition, Arc<CheckpointCell>>,
    /// Where partitions are announced to the Kafka endpoint, once attached.
    catalog: Option<Arc<ReadCatalog>>,
    /// Whether the open made recovery's writes durable with its one syncfs.
    synced_at_open: bool,
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
    pub fn open<I: LogIo + Clone + Send>(
        root: &Path,
        default_config: LogConfig,
        io: &mut I,
    ) -> Result<LogDir, LogError> {
        let default = default_config.clone();
        Self::open_with(root, default_config, |_| default.clone(), io)
    }

    /// `open`, with each existing partition opened under `config_for(partition)` (its topic's
    /// settings); `default_config` is used for partitions created later without one.
    pub fn open_with<I: LogIo + Clone + Send>(
        root: &Path,
        default_config: LogConfig,
        config_for: impl Fn(&TopicPartition) -> LogConfig + Sync,
        io: &mut I,
    ) -> Result<LogDir, LogError> {
        Self::open_reporting(root, default_config, config_for, io, &AtomicU64::new(0))
    }

    /// `open_with`, counting opened partitions in `opened` as it goes (for start-up progress
    /// reports). Partitions are opened, and recovered, on up to `recovery_threads(n)` threads.
    pub fn open_reporting<I: LogIo + Clone + Send>(
        root: &Path,
        default_config: LogConfig,
        config_for: impl Fn(&TopicPartition) -> LogConfig + Sync,
        io: &mut I,
        opened: &AtomicU64,
    ) -> Result<LogDir, LogError> {
        Self::open_inner(root, default_config, config_for, io, opened, None)
    }

    /// `open` on exactly `threads` threads (tests compare thread counts; the others choose
    /// `recovery_threads`).
    pub fn open_on_threads<I: LogIo + Clone + Send>(
        root: &Path,
        default_config: LogConfig,
        io: &mut I,
        threads: usize,
    ) -> Result<LogDir, LogError> {
        let default = default_config.clone();
        let opened = AtomicU64::new(0);
        Self::open_inner(
            root,
            default_config,
            |_| default.clone(),
            io,
            &opened,
            Some(threads),
        )
    }

    fn open_inner<I: LogIo + Clone + Send>(
        root: &Path,
        default_config: LogConfig,
        config_for: impl Fn(&TopicPartition) -> LogConfig + Sync,
        io: &mut I,
        opened: &AtomicU64,
        threads: Option<usize>,
    ) -> Result<LogDir, LogError> {
        let opened_at = std::time::Instant::now();
        default_config.validate()?;
        std::fs::create_dir_all(root).map_err(|e| LogError::io(root, e))?;
        let clean = clean_shutdown::exists(root)?;
        let recovery_points =
            OffsetCheckpointFile::read(&root.join(OffsetCheckpointFile::RECOVERY_POINT))?;
        let log_starts =
            OffsetCheckpointFile::read(&root.join(OffsetCheckpointFile::LOG_START_OFFSET))?;
        let mut work = Vec::new();
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
            work.push((tp, entry.path(), load));
        }
        let threads = threads.unwrap_or_else(|| recovery_threads(work.len()));
        // Opened before recovery writes anything, so its syncfs reports their writeback errors.
        let root_fd = std::fs::File::open(root).map_err(|e| LogError::io(root, e))?;
        let mut logs = open_all(work, threads, io, |tp, path, load, io| {
            let log = PartitionLog::open_syncing(
                path,
                tp.clone(),
                None,
                config_for(tp),
                *load,
                io,
                SyncAfter::Caller,
            );
            opened.fetch_add(1, Ordering::Relaxed);
            log
        })?;
        // What recovery wrote (re-read batches' pages, rebuilt indexes, a `.txnindex` cut and
        // rebuilt) is made durable by one syncfs (what `create_missing` does for new
        // partitions) before any recovery point moves. It runs whenever any partition was
        // recovered, also when every one of them waits for its first flush to move its
        // recovery point (changed epochs): a later roll moves the recovery point over segments
        // this open rewrote without syncing them again.
        let synced_at_open = logs.values().any(PartitionLog::recovered_at_open);
        if synced_at_open {
            rustix::fs::syncfs(&root_fd).map_err(|e| LogError::io(root, e.into()))?;
            logs.values_mut().for_each(PartitionLog::synced_after_open);
        }
        let recovered = logs.values().filter(|l| l.recovered_at_open()).count();
        let (bytes, batches) = logs.values().fold((0, 0), |(b, n), l| {
            let r = l.revalidated_at_open();
            (b + r.bytes, n + r.batches)
        });
        // Operators (and tests/ops_shutdown.rs) read this line to see whether the last stop was
        // clean and recovery was skipped, and how much an unclean one had to re-read.
        tracing::info!(
            dir = %root.display(),
            partitions = logs.len(),
            clean_shutdown = clean,
            recovered,
            revalidated_bytes = bytes,
            revalidated_batches = batches,
            threads,
            elapsed_ms = opened_at.elapsed().as_millis() as u64,
            "log dir opened"
        );
        let cells = logs
            .iter()
            .map(|(tp, l)| (tp.clone(), l.checkpoint_cell()))
            .collect();
        let dir = LogDir {
            root: root.to_path_buf(),
            default_config,
            logs,
            lent: BTreeSet::new(),
            cells,
            catalog: None,
            synced_at_open,
        };
        // From here on the directory is live: a crash must trigger recovery.
        dir.write_checkpoints()?;
        clean_shutdown::remove(root)?;
        Ok(dir)
    }

    /// Announces every partition (present and created later) to `catalog`: each log
    /// publishes its read views there until the partition is deleted.
    pub fn attach_catalog(&mut self, catalog: Arc<ReadCatalog>) {
        catalog.insert_many(
            self.logs
                .iter_mut()
                .map(|(tp, log)| (tp.clone(), log.attach_read_view())),
        );
        self.catalog = Some(catalog);
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether opening recovered some partition and so ran the syncfs that makes recovery's
    /// writes durable.
    pub fn synced_at_open(&self) -> bool {
        self.synced_at_open
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
            self.cells.insert(tp.clone(), log.checkpoint_cell());
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

    /// Creates the partitions of `wanted` that have no log yet, on `recovery_threads` threads
    /// (each partition on its own, as `open` does), and makes them durable together: two
    /// `syncfs` calls for the whole batch instead of three fsyncs per partition. Returns how
    /// many were created. Why: 16,384 partitions' fsyncs, one after another, were most of a
    /// first start (profile in benches/RESULTS.md).
    ///
    /// Why batching is safe: no partition created here is appended to, checkpointed or handed
    /// out before this returns, so its files need to be durable only then, not one by one.
    /// `syncfs` on the log dir's filesystem writes back and waits for every file's data and
    /// metadata and the filesystem's directory blocks (sync_filesystem: inode writeback, the
    /// filesystem's own sync, then the block device's buffers), and reports a writeback error
    /// of the filesystem since the fd was opened (Linux 5.8+). Order kept: (1) directories,
    /// empty segment files and each `partition.metadata`'s contents in its tmp file; syncfs;
    /// (2) each tmp renamed into place; syncfs. A crash before the first syncfs returns leaves
    /// any subset of the (empty) directories and files, the states an interrupted create could
    /// always leave: `open` ignores a stray tmp, writes a missing `partition.metadata` from
    /// the resolved topic id and creates a missing first segment. A crash after it leaves
    /// `partition.metadata` absent or whole, never torn (its contents were durable before the
    /// rename), exactly as `partition_meta::write` guarantees.
    pub fn create_missing(
        &mut self,
        wanted: &[(TopicPartition, Option<Uuid>)],
    ) -> Result<usize, LogError> {
        self.create_missing_configured(wanted, &HashMap::new())
    }

    /// `create_missing`, each new partition with its topic's config from `topic_configs`
    /// (the default config for a topic not there).
    pub fn create_missing_configured(
        &mut self,
        wanted: &[(TopicPartition, Option<Uuid>)],
        topic_configs: &HashMap<String, LogConfig>,
    ) -> Result<usize, LogError> {
        let ids: BTreeMap<&TopicPartition, Option<Uuid>> = wanted
            .iter()
            .filter(|(tp, _)| !self.logs.contains_key(tp) && !self.lent.contains(tp))
            .map(|(tp, id)| (tp, *id))
            .collect();
        let work: Vec<_> = ids
            .keys()
            .map(|tp| {
                let path = self.root.join(tp.dir_name());
                ((*tp).clone(), path, LoadOptions::unclean())
            })
            .collect();
        let threads = recovery_threads(work.len());
        let config = &self.default_config;
        // Opened before anything is written: syncfs reports the writeback errors recorded
        // after its descriptor was opened (errseq), so a descriptor opened later could miss a
        // failed writeback of the files staged below.
        let root = if work.is_empty() {
            None
        } else {
            Some(std::fs::File::open(&self.root).map_err(|e| LogError::io(&self.root, e))?)
        };
        let began = std::time::Instant::now();
        let created = open_all(
            work,
            threads,
            &mut crate::log::io::StdIo,
            |tp, path, _, _| {
                let config = topic_configs.get(&tp.topic).unwrap_or(config).clone();
                PartitionLog::create_with(path, tp.clone(), ids[tp], config, false)
            },
        )?;
        if let (false, Some(root)) = (created.is_empty(), &root) {
            let files = began.elapsed();
            self.syncfs(root)?;
            let synced = began.elapsed();
            for (tp, log) in &created {
                if ids[tp].is_some() {
                    crate::log::partition_meta::publish_staged(log.dir())?;
                }
            }
            self.syncfs(root)?;
            // syncfs writes back every dirty page of the filesystem, other processes' too (a
            // broker sharing the disk): how long it took says how much of a start was that.
            tracing::info!(
                partitions = created.len(),
                threads,
                files_ms = files.as_millis() as u64,
                first_syncfs_ms = (synced - files).as_millis() as u64,
                total_ms = began.elapsed().as_millis() as u64,
                "partition directories created and made durable"
            );
        }
        let n = created.len();
        let mut views = Vec::with_capacity(n);
        for (tp, mut log) in created {
            self.cells.insert(tp.clone(), log.checkpoint_cell());
            if self.catalog.is_some() {
                views.push((tp.clone(), log.attach_read_view()));
            }
            self.logs.insert(tp, log);
        }
        if let Some(catalog) = &self.catalog {
            catalog.insert_many(views);
        }
        Ok(n)
    }

    /// `syncfs(2)` of the filesystem holding the root, through `root`, a descriptor of it
    /// opened before the writes it must report on (see `create_missing`).
    fn syncfs(&self, root: &std::fs::File) -> Result<(), LogError> {
        rustix::fs::syncfs(root).map_err(|e| LogError::io(&self.root, e.into()))
    }

    /// Lends a partition's log to its owner (a shard) until `restore` gives it back; while out,
    /// it is not part of `flush`, `write_checkpoints` or `close`.
    /// `close` writes the clean-shutdown marker only once every lent log is back.
    pub fn take(&mut self, tp: &TopicPartition) -> Option<PartitionLog> {
        let log = self.logs.remove(tp)?;
        self.lent.insert(tp.clone());
        Some(log)
    }

    /// Removes a partition this dir will never own again: its own owner (the state log, a
    /// coordinator) reopens the directory itself and closes it.
    pub fn hand_off(&mut self, tp: &TopicPartition) {
        drop(self.logs.remove(tp));
        self.cells.remove(tp);
    }

    /// Partitions lent by `take` that are still out.
    pub fn lent(&self) -> impl Iterator<Item = &TopicPartition> {
        self.lent.iter()
    }

    /// Gives back a log lent by `take`.
    pub fn restore(&mut self, log: PartitionLog) {
        let tp = log.topic_partition().clone();
        self.lent.remove(&tp);
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
        self.cells.remove(tp);
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
        // From the cells: partitions lent to shards or the leader store are checkpointed at
        // what their owner last published (a recovery point only moves after its fsync).
        for (tp, cell) in &self.cells {
            let e = cell.read();
            recovery.insert(tp.clone(), e.recovery_point);
            hws.insert(tp.clone(), e.high_watermark);
            if let Some(start) = e.log_start_above_first_segment {
                starts.insert(tp.clone(), start);
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

    /// Flushes the partitions held here that have data above their recovery point (a
    /// checkpoint round: the lent ones are flushed by their owners). Returns the failures.
    pub fn flush_unflushed(&mut self, io: &mut impl LogIo) -> Vec<String> {
        self.logs
            .values_mut()
            .filter(|log| log.has_unflushed())
            .filter_map(|log| {
                log.flush(io)
                    .err()
                    .map(|e| format!("{}: flush failed: {e}", log.topic_partition()))
            })
            .collect()
    }

    /// Flushes every partition (moving recovery points to the log ends) and checkpoints.
    ///
    /// A log that cannot be flushed (offline after a disk error) does not stop the others:
    /// every log is flushed, the checkpoints written (the failed log's recovery point stays
    /// where its last good flush left it), and then the first error is returned.
    pub fn flush<I: LogIo + Clone + Send>(&mut self, io: &mut I) -> Result<(), LogError> {
        // On threads: thousands of logs' fsyncs one after another took seconds at shutdown.
        let logs: Vec<&mut PartitionLog> = self.logs.values_mut().collect();
        let threads = recovery_threads(logs.len());
        let flushed = on_threads(logs, threads, io, AfterError::Continue, |log, io| {
            log.flush(io)
        });
        self.write_checkpoints_with(io)?;
        first_error(flushed).map(drop)
    }

    /// Closes every partition (final index entries, snapshots, fsync), writes the checkpoints
    /// and then the clean-shutdown marker. If any step fails, or a lent log never came back
    /// (its owner died with it), the marker is not written, so the next open recovers.
    pub fn close<I: LogIo + Clone + Send>(mut self, io: &mut I) -> Result<(), LogError> {
        self.flush(io)?;
        let root = self.root.clone();
        // On threads: each close writes a producer snapshot, a new file; creating 5,000 of them
        // one by one took 7-14 s on this project's test box (ext4's inode allocation).
        let logs: Vec<PartitionLog> = std::mem::take(&mut self.logs).into_values().collect();
        let threads = recovery_threads(logs.len());
        first_error(on_threads(
            logs,
            threads,
            io,
            AfterError::Stop,
            |log, io| log.close(io),
        ))?;
        if let Some(first) = self.lent.first() {
            tracing::error!(
                dir = %root.display(),
                missing = self.lent.len(),
                first = %first,
                "partition logs were never handed back; no clean-shutdown marker, the next start recovers"
            );
            return Ok(());
        }
        clean_shutdown::write(&root, None)
    }
}

/// Threads that open (and recover) partitions at start: twice the CPUs (opening is as much
/// waiting on the disk as computing CRCs), never more than there are partitions, at most
/// `RECOVERY_THREADS_MAX`.
pub fn recovery_threads(partitions: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 2).min(RECOVERY_THREADS_MAX).min(partitions).max(1)
}

/// Opens every `(partition, dir, load options)` with `open` on `threads` threads
/// (`on_threads`: the result does not depend on the thread count; after a failure no further
/// partition is opened).
fn open_all<I: LogIo + Clone + Send>(
    work: Vec<(TopicPartition, PathBuf, LoadOptions)>,
    threads: usize,
    io: &mut I,
    open: impl Fn(&TopicPartition, &Path, &LoadOptions, &mut I) -> Result<PartitionLog, LogError> + Sync,
) -> Result<BTreeMap<TopicPartition, PartitionLog>, LogError> {
    let opened = on_threads(
        work,
        threads,
        io,
        AfterError::Stop,
        |(tp, path, load), io| open(&tp, &path, &load, io).map(|log| (tp, log)),
    );
    Ok(first_error(opened)?.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a batch over several topics gives each new partition its topic's config (a
    // mirror start of topics with copied configs), the default to the others.
    #[test]
    fn batched_create_gives_each_topic_its_config() {
        let root = tempfile::tempdir().unwrap();
        let mut io = crate::log::io::StdIo;
        let mut dir = LogDir::open(root.path(), LogConfig::default(), &mut io).unwrap();
        let small = LogConfig {
            segment_bytes: 1 << 20,
            ..LogConfig::default()
        };
        let configs = HashMap::from([("copied".to_owned(), small.clone())]);
        let wanted: Vec<_> = (0..6)
            .map(|p| {
                let topic = if p % 2 == 0 { "copied" } else { "plain" };
                (TopicPartition::new(topic, p), None)
            })
            .collect();
        assert_eq!(dir.create_missing_configured(&wanted, &configs).unwrap(), 6);
        for (tp, _) in &wanted {
            let want = if tp.topic == "copied" {
                small.segment_bytes
            } else {
                LogConfig::default().segment_bytes
            };
            assert_eq!(dir.get(tp).unwrap().config().segment_bytes, want, "{tp}");
        }
        assert_ne!(small.segment_bytes, LogConfig::default().segment_bytes);
    }

    // Goal: partitions created in one batch (durability made once for all, see
    // `create_missing`) come out as one created alone does: `partition.metadata` in place with
    // the topic id and no tmp file left, a first segment, and the same on a reopen.
    #[test]
    fn batched_create_publishes_partition_metadata() {
        let root = tempfile::tempdir().unwrap();
        let mut io = crate::log::io::StdIo;
        let mut dir = LogDir::open(root.path(), LogConfig::default(), &mut io).unwrap();
        let id = Uuid::from_u128(0xfeed);
        let wanted: Vec<_> = (0..40)
            .map(|p| (TopicPartition::new("t", p), (p % 2 == 0).then_some(id)))
            .collect();
        assert_eq!(dir.create_missing(&wanted).unwrap(), 40);
        assert_eq!(dir.create_missing(&wanted).unwrap(), 0, "already there");
        for (tp, want) in &wanted {
            let pdir = root.path().join(tp.dir_name());
            assert_eq!(crate::log::partition_meta::read(&pdir).unwrap(), *want);
            let names: Vec<String> = std::fs::read_dir(&pdir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
            assert!(names.iter().any(|n| n.ends_with(".log")), "{names:?}");
            assert_eq!(dir.get(tp).unwrap().topic_id(), *want);
        }
        dir.close(&mut io).unwrap();
        let dir = LogDir::open(root.path(), LogConfig::default(), &mut io).unwrap();
        for (tp, want) in &wanted {
            assert_eq!(dir.get(tp).unwrap().topic_id(), *want);
        }
    }

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

    // Goal: a log lent out and never restored (its owner died with it) keeps the clean-shutdown
    // marker away, so the next open recovers; a log handed off for good does not.
    #[test]
    fn no_clean_marker_while_a_lent_log_is_out() {
        let root = tempfile::tempdir().unwrap();
        let mut io = crate::log::io::StdIo;
        let mut dir = LogDir::open(root.path(), LogConfig::default(), &mut io).unwrap();
        let (a, b) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
        dir.get_or_create(&a, None, None).unwrap();
        dir.get_or_create(&b, None, None).unwrap();
        dir.hand_off(&b);
        let lost = dir.take(&a).unwrap();
        drop(lost);
        assert_eq!(dir.lent().cloned().collect::<Vec<_>>(), vec![a.clone()]);
        dir.close(&mut io).unwrap();
        assert!(!clean_shutdown::exists(root.path()).unwrap());
        let dir = LogDir::open(root.path(), LogConfig::default(), &mut io).unwrap();
        assert!(dir
            .get(&a)
            .is_some_and(|l| l.recovered_at_open() || l.log_end_offset().0 == 0));
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
