//! A keyed, compacted partition log in Kafka's format (`<data dir>/<topic>-0`): the store under
//! `__mirror_state` and the committed group offsets. It is written with the same
//! `PartitionLog` the data path uses.
//!
//! - Each `put`/`delete` appends one uncompressed batch with one record. With
//!   `FlushPolicy::EveryAppend` it is fdatasynced before returning; with `PageCache` it is on
//!   the page cache, which survives `kill -9` (not a power cut). A torn tail batch is cut off by
//!   the log's recovery on open: the write that was in flight is lost, and nothing before it.
//! - On open the log is replayed: the last value per key wins, a null value (tombstone)
//!   deletes the key.
//! - Then it is compacted: the live records are written into a fresh directory, synced, and
//!   swapped in by rename (`<dir>` → `<dir>.old`, `<dir>.compacting` → `<dir>`, remove `.old`).
//!   A crash between the renames leaves `.old` and no `<dir>`; the next open restores `.old`,
//!   which still holds everything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ids::{Offset, TimestampMs, TopicPartition};
use crate::limits::{
    KEYED_LOG_READ_BYTES, KEYED_LOG_RECORDS_PER_BATCH_MAX, KEYED_LOG_SEGMENT_BYTES,
};
use crate::log::checkpoint::sync_dir;
use crate::log::config::{FlushPolicy, LogConfig};
use crate::log::io::{LogIo, StdIo};
use crate::log::partition_log::PartitionLog;
use crate::log::recovery::LoadOptions;
use crate::log::LogError;
use crate::wire::batch::{BatchError, Batches};
use crate::wire::batch_builder::BatchBuilder;
use crate::wire::records::{self, RecordError};

#[derive(Debug, thiserror::Error)]
pub enum KeyedLogError {
    #[error("{topic}: {source}")]
    Log { topic: String, source: LogError },
    #[error("{topic}: {source}")]
    Batch { topic: String, source: BatchError },
    #[error("{topic}: {source}")]
    Record { topic: String, source: RecordError },
    #[error("{topic} record at offset {offset} has no key")]
    NoKey { topic: String, offset: Offset },
    #[error("{topic}: {path}: {source}")]
    Io {
        topic: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The open keyed log and its live records (raw key bytes → raw value bytes).
///
/// Disk errors: a `put`/`delete` whose write or fsync fails returns the error and is never
/// applied: the live map is not changed and the record is cut back out of the log (see
/// `PartitionLog::append`), so no later open replays it. A full disk leaves the log usable
/// for the next command; any other disk error takes it offline and every later command fails
/// until the process restarts. `I` is the I/O engine (`StdIo`; tests pass a failing disk).
#[derive(Debug)]
pub struct KeyedLog<I: LogIo = StdIo> {
    topic: String,
    log: PartitionLog,
    io: I,
    live: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl KeyedLog {
    /// Opens (or creates) `<data_dir>/<topic>-0`, replays it and compacts it.
    pub fn open(
        data_dir: &Path,
        topic: &str,
        flush: FlushPolicy,
    ) -> Result<KeyedLog, KeyedLogError> {
        KeyedLog::open_with(data_dir, topic, flush, StdIo)
    }
}

impl<I: LogIo> KeyedLog<I> {
    /// `open`, with the log's later writes and syncs (every command) issued through `io`;
    /// replay and compaction at open use plain I/O.
    pub fn open_with(
        data_dir: &Path,
        topic: &str,
        flush: FlushPolicy,
        command_io: I,
    ) -> Result<KeyedLog<I>, KeyedLogError> {
        let tp = TopicPartition::new(topic, 0);
        let name = tp.dir_name();
        let dir = data_dir.join(&name);
        let old = data_dir.join(format!("{name}.old"));
        let compacting = data_dir.join(format!("{name}.compacting"));
        let config = LogConfig {
            segment_bytes: KEYED_LOG_SEGMENT_BYTES,
            // Compaction, not retention, bounds this log.
            retention_ms: None,
            retention_bytes: None,
            flush,
            ..LogConfig::default()
        };
        let e_log = |source| KeyedLogError::Log {
            topic: topic.to_owned(),
            source,
        };
        let e_io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| KeyedLogError::Io {
                topic: topic.to_owned(),
                path,
                source,
            }
        };
        if !dir.exists() && old.exists() {
            // A compaction stopped between its two renames; the old log is complete.
            std::fs::rename(&old, &dir).map_err(e_io(&old))?;
            sync_dir(data_dir).map_err(e_log)?;
        }
        for leftover in [&old, &compacting] {
            if leftover.exists() {
                std::fs::remove_dir_all(leftover).map_err(e_io(leftover))?;
            }
        }
        let mut io = StdIo;
        let open = |io: &mut StdIo| {
            PartitionLog::open(
                &dir,
                tp.clone(),
                None,
                config.clone(),
                LoadOptions::unclean(),
                io,
            )
        };
        let live = if dir.exists() {
            let log = open(&mut io).map_err(e_log)?;
            let live = replay(topic, &log)?;
            log.close(&mut io).map_err(e_log)?;
            live
        } else {
            BTreeMap::new()
        };
        // Compact: the live records into a fresh log, then swap it in. The fresh log is always
        // fsynced by its close, whatever the flush policy.
        let mut fresh =
            PartitionLog::create(&compacting, tp.clone(), None, config.clone()).map_err(e_log)?;
        // Control state holds secrets (mirror definitions with source passwords): the log's
        // directory is 0700 and its files 0600 before a record is written, whatever the umask.
        let restrict = |dir: &Path| restrict_files(topic, dir);
        restrict(&compacting)?;
        let mut next = Offset::ZERO;
        for (key, value) in &live {
            let batch = BatchBuilder::new(next)
                .record(TimestampMs(now_ms()), Some(key), Some(value), &[])
                .build();
            fresh.append(&mut io, &batch).map_err(e_log)?;
            next = next.next();
        }
        fresh.close(&mut io).map_err(e_log)?;
        if dir.exists() {
            std::fs::rename(&dir, &old).map_err(e_io(&dir))?;
        }
        std::fs::rename(&compacting, &dir).map_err(e_io(&compacting))?;
        sync_dir(data_dir).map_err(e_log)?;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(e_io(&old))?;
        }
        let log = open(&mut io).map_err(e_log)?;
        // The close above wrote a producer-state snapshot with the umask's mode: again 0600.
        // Files the log makes later (a rolled segment, the snapshot of the next close) are
        // restricted when they appear (`restrict_after_roll`, `close`).
        restrict(&dir)?;
        Ok(KeyedLog {
            topic: topic.to_owned(),
            log,
            io: command_io,
            live,
        })
    }

    /// The I/O engine commands are written through.
    pub fn io(&self) -> &I {
        &self.io
    }

    /// Every live record: raw key → raw value, in key order.
    pub fn live(&self) -> &BTreeMap<Vec<u8>, Vec<u8>> {
        &self.live
    }

    /// Records `value` under `key` (durability as the flush policy says).
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), KeyedLogError> {
        if self.live.get(&key) == Some(&value) {
            return Ok(());
        }
        self.append(&key, Some(&value))?;
        self.live.insert(key, value);
        Ok(())
    }

    /// Sets every `(key, value)` (`None` deletes) with one append: the records go in batches of
    /// at most `KEYED_LOG_RECORDS_PER_BATCH_MAX`, written together and synced once (per the
    /// flush policy), so a command over thousands of keys costs one write, not one per key.
    /// All or nothing: a failed append changes no key. Later entries for a key win.
    pub fn put_many(
        &mut self,
        entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<(), KeyedLogError> {
        let entries: Vec<(Vec<u8>, Option<Vec<u8>>)> = entries
            .into_iter()
            .filter(|(k, v)| match v {
                Some(v) => self.live.get(k) != Some(v),
                None => self.live.contains_key(k),
            })
            .collect();
        if entries.is_empty() {
            return Ok(());
        }
        let mut records = Vec::new();
        let mut base = self.log.log_end_offset();
        let now = TimestampMs(now_ms());
        for chunk in entries.chunks(KEYED_LOG_RECORDS_PER_BATCH_MAX) {
            let mut b = BatchBuilder::new(base);
            for (k, v) in chunk {
                b = b.record(now, Some(k), v.as_deref(), &[]);
            }
            records.extend_from_slice(&b.build());
            base = Offset(base.0 + chunk.len() as i64);
        }
        let segments = self.log.segments().len();
        self.log
            .append(&mut self.io, &records)
            .map_err(|source| KeyedLogError::Log {
                topic: self.topic.clone(),
                source,
            })?;
        self.restrict_after_roll(segments)?;
        for (k, v) in entries {
            match v {
                Some(v) => self.live.insert(k, v),
                None => self.live.remove(&k),
            };
        }
        Ok(())
    }

    /// Deletes `key` with a tombstone.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), KeyedLogError> {
        if !self.live.contains_key(key) {
            return Ok(());
        }
        self.append(key, None)?;
        self.live.remove(key);
        Ok(())
    }

    fn append(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), KeyedLogError> {
        let batch = BatchBuilder::new(self.log.log_end_offset())
            .record(TimestampMs(now_ms()), Some(key), value, &[])
            .build();
        let segments = self.log.segments().len();
        self.log
            .append(&mut self.io, &batch)
            .map_err(|source| KeyedLogError::Log {
                topic: self.topic.clone(),
                source,
            })?;
        self.restrict_after_roll(segments)
    }

    pub fn log_end_offset(&self) -> Offset {
        self.log.log_end_offset()
    }

    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// Closes the log cleanly (flush, final index entries, producer snapshot).
    pub fn close(mut self) -> Result<(), KeyedLogError> {
        let dir = self.log.dir().to_path_buf();
        self.log
            .close(&mut self.io)
            .map_err(|source| KeyedLogError::Log {
                topic: self.topic.clone(),
                source,
            })?;
        // The close wrote a producer-state snapshot with the umask's mode.
        restrict_files(&self.topic, &dir)
    }

    /// After an append: a roll made a new segment and its indexes with the umask's mode, so
    /// the directory's files are made 0600 again (only then: a readdir per append would cost
    /// the group-offset store, which appends per commit).
    fn restrict_after_roll(&self, segments_before: usize) -> Result<(), KeyedLogError> {
        if self.log.segments().len() == segments_before {
            return Ok(());
        }
        restrict_files(&self.topic, self.log.dir())
    }

    /// Test hook: appends raw bytes without touching the live map.
    #[cfg(test)]
    pub(crate) fn append_raw(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), KeyedLogError> {
        self.append(key, value)
    }

    /// Test hook: the live map, writable.
    #[cfg(test)]
    pub(crate) fn live_mut(&mut self) -> &mut BTreeMap<Vec<u8>, Vec<u8>> {
        &mut self.live
    }
}

fn replay(topic: &str, log: &PartitionLog) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, KeyedLogError> {
    let mut live = BTreeMap::new();
    let mut from = log.log_start_offset();
    let end = log.log_end_offset();
    let t = || topic.to_owned();
    while from < end {
        let bytes = log
            .read_bytes(from, KEYED_LOG_READ_BYTES)
            .map_err(|source| KeyedLogError::Log { topic: t(), source })?;
        if bytes.is_empty() {
            break;
        }
        let mut advanced = false;
        for item in Batches::new(&bytes) {
            let (_, batch) = item.map_err(|source| KeyedLogError::Batch { topic: t(), source })?;
            batch
                .validate()
                .map_err(|source| KeyedLogError::Batch { topic: t(), source })?;
            let recs = records::records(&batch)
                .map_err(|source| KeyedLogError::Record { topic: t(), source })?;
            for r in recs {
                let key = r.key.ok_or(KeyedLogError::NoKey {
                    topic: t(),
                    offset: r.offset,
                })?;
                match r.value {
                    Some(v) => live.insert(key.to_vec(), v.to_vec()),
                    None => live.remove(key),
                };
            }
            from = batch.next_offset();
            advanced = true;
        }
        if !advanced {
            break;
        }
    }
    Ok(live)
}

/// Makes the keyed log's directory 0700 and its files 0600 (control state, credentials and
/// ACLs hold secrets or say who may do what).
fn restrict_files(topic: &str, dir: &Path) -> Result<(), KeyedLogError> {
    crate::serve::credentials::secret_file::restrict_dir(dir).map_err(|e| KeyedLogError::Io {
        topic: topic.to_owned(),
        path: dir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })
}
