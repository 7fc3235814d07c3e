//! `__mirror_state`: every control-plane decision, as keyed records in a compacted partition log
//! in Kafka's format (`<data dir>/__mirror_state-0`), written with the same `PartitionLog` the
//! data path uses.
//!
//! - Each `put`/`delete` appends one uncompressed batch with one record and fdatasyncs it before
//!   returning (flush policy `EveryAppend`), so a transition the control thread acted on
//!   survives `kill -9`. A torn tail batch is cut off by the log's recovery on open: the write
//!   that was in flight is lost, and nothing before it.
//! - On open the log is replayed: the last value per key wins, a null value (tombstone)
//!   deletes the key. Records of unknown types are kept (a newer kmirror wrote them) but not
//!   interpreted.
//! - Then it is compacted: the live records are written into a fresh directory, synced, and
//!   swapped in by rename (`__mirror_state-0` → `.old`, `.compacting` → `-0`, remove `.old`).
//!   A crash between the renames leaves `.old` and no `-0`; the next open restores `.old`,
//!   which still holds everything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::control::records::{RecordCodecError, StateKey, StateValue};
use crate::ids::{Offset, TimestampMs, TopicPartition};
use crate::limits::{MIRROR_STATE_READ_BYTES, MIRROR_STATE_SEGMENT_BYTES};
use crate::log::checkpoint::sync_dir;
use crate::log::config::{FlushPolicy, LogConfig};
use crate::log::io::StdIo;
use crate::log::partition_log::PartitionLog;
use crate::log::recovery::LoadOptions;
use crate::log::LogError;
use crate::wire::batch::Batches;
use crate::wire::batch_builder::BatchBuilder;
use crate::wire::records::{self, RecordError};

pub const TOPIC: &str = "__mirror_state";
const DIR: &str = "__mirror_state-0";
const COMPACTING_DIR: &str = "__mirror_state-0.compacting";
const OLD_DIR: &str = "__mirror_state-0.old";

#[derive(Debug, thiserror::Error)]
pub enum StateLogError {
    #[error("__mirror_state: {0}")]
    Log(#[from] LogError),
    #[error("__mirror_state: {0}")]
    Batch(#[from] crate::wire::batch::BatchError),
    #[error("__mirror_state: {0}")]
    Record(#[from] RecordError),
    #[error("__mirror_state record at offset {offset}: {source}")]
    Codec {
        offset: Offset,
        source: RecordCodecError,
    },
    #[error("__mirror_state record at offset {0} has no key")]
    NoKey(Offset),
    #[error("__mirror_state: {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StateLogError + '_ {
    move |source| StateLogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn log_config() -> LogConfig {
    LogConfig {
        segment_bytes: MIRROR_STATE_SEGMENT_BYTES,
        // Compaction, not retention, bounds this log.
        retention_ms: None,
        retention_bytes: None,
        flush: FlushPolicy::EveryAppend,
        ..LogConfig::default()
    }
}

fn tp() -> TopicPartition {
    TopicPartition::new(TOPIC, 0)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The open state log and its live records.
#[derive(Debug)]
pub struct StateLog {
    log: PartitionLog,
    io: StdIo,
    /// Raw live records, by encoded key (unknown types included).
    live: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl StateLog {
    /// Opens (or creates) `__mirror_state-0` under `data_dir`, replays it and compacts it.
    pub fn open(data_dir: &Path) -> Result<StateLog, StateLogError> {
        let dir = data_dir.join(DIR);
        let old = data_dir.join(OLD_DIR);
        let compacting = data_dir.join(COMPACTING_DIR);
        if !dir.exists() && old.exists() {
            // A compaction stopped between its two renames; the old log is complete.
            std::fs::rename(&old, &dir).map_err(io_err(&old))?;
            sync_dir(data_dir)?;
        }
        for leftover in [&old, &compacting] {
            if leftover.exists() {
                std::fs::remove_dir_all(leftover).map_err(io_err(leftover))?;
            }
        }
        let mut io = StdIo;
        let live = if dir.exists() {
            let log = PartitionLog::open(
                &dir,
                tp(),
                None,
                log_config(),
                LoadOptions::unclean(),
                &mut io,
            )?;
            let live = replay(&log)?;
            log.close(&mut io)?;
            live
        } else {
            BTreeMap::new()
        };
        // Compact: the live records into a fresh log, then swap it in.
        let mut fresh = PartitionLog::create(&compacting, tp(), None, log_config())?;
        let mut next = Offset::ZERO;
        for (key, value) in &live {
            let batch = BatchBuilder::new(next)
                .record(TimestampMs(now_ms()), Some(key), Some(value), &[])
                .build();
            fresh.append(&mut io, &batch)?;
            next = next.next();
        }
        fresh.close(&mut io)?;
        if dir.exists() {
            std::fs::rename(&dir, &old).map_err(io_err(&dir))?;
        }
        std::fs::rename(&compacting, &dir).map_err(io_err(&compacting))?;
        sync_dir(data_dir)?;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
        }
        let log = PartitionLog::open(
            &dir,
            tp(),
            None,
            log_config(),
            LoadOptions::unclean(),
            &mut io,
        )?;
        Ok(StateLog { log, io, live })
    }

    /// Every live record whose type this version knows, decoded.
    pub fn records(&self) -> Result<Vec<(StateKey, StateValue)>, StateLogError> {
        let mut out = Vec::with_capacity(self.live.len());
        for (k, v) in &self.live {
            let key = match StateKey::decode(k) {
                Ok(key) => key,
                Err(RecordCodecError::UnknownType(kind)) => {
                    tracing::warn!(
                        kind,
                        "__mirror_state holds a record type this version does not know; keeping it"
                    );
                    continue;
                }
                Err(source) => {
                    return Err(StateLogError::Codec {
                        offset: Offset(-1),
                        source,
                    })
                }
            };
            let value = StateValue::decode(&key, v).map_err(|source| StateLogError::Codec {
                offset: Offset(-1),
                source,
            })?;
            out.push((key, value));
        }
        Ok(out)
    }

    /// Durably records `value` under `key` (returns after fdatasync).
    pub fn put(&mut self, key: &StateKey, value: &StateValue) -> Result<(), StateLogError> {
        let (k, v) = (key.encode(), value.encode());
        if self.live.get(&k) == Some(&v) {
            return Ok(());
        }
        self.append(&k, Some(&v))?;
        self.live.insert(k, v);
        Ok(())
    }

    /// Durably deletes `key` (a tombstone).
    pub fn delete(&mut self, key: &StateKey) -> Result<(), StateLogError> {
        let k = key.encode();
        if !self.live.contains_key(&k) {
            return Ok(());
        }
        self.append(&k, None)?;
        self.live.remove(&k);
        Ok(())
    }

    fn append(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), StateLogError> {
        let batch = BatchBuilder::new(self.log.log_end_offset())
            .record(TimestampMs(now_ms()), Some(key), value, &[])
            .build();
        // FlushPolicy::EveryAppend: the append fdatasyncs before it returns.
        self.log.append(&mut self.io, &batch)?;
        Ok(())
    }

    pub fn log_end_offset(&self) -> Offset {
        self.log.log_end_offset()
    }

    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// Closes the log cleanly (flush, final index entries, producer snapshot).
    pub fn close(mut self) -> Result<(), StateLogError> {
        self.log.close(&mut self.io)?;
        Ok(())
    }
}

fn replay(log: &PartitionLog) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StateLogError> {
    let mut live = BTreeMap::new();
    let mut from = log.log_start_offset();
    let end = log.log_end_offset();
    while from < end {
        let bytes = log.read_bytes(from, MIRROR_STATE_READ_BYTES)?;
        if bytes.is_empty() {
            break;
        }
        let mut advanced = false;
        for item in Batches::new(&bytes) {
            let (_, batch) = item?;
            batch.validate()?;
            for r in records::records(&batch)? {
                let key = r.key.ok_or(StateLogError::NoKey(r.offset))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::MirrorName;
    use crate::control::records::last_mirror_epoch;
    use crate::ids::MirrorEpoch;

    fn m() -> MirrorName {
        MirrorName::new("east").unwrap()
    }

    fn epoch_key() -> StateKey {
        StateKey::MirrorEpoch(m())
    }

    fn lme_key(p: i32) -> StateKey {
        StateKey::LastMirrorEpoch(m(), TopicPartition::new("t", p))
    }

    fn live(s: &StateLog) -> Vec<(StateKey, StateValue)> {
        s.records().unwrap()
    }

    #[test]
    fn last_value_wins_and_tombstones_delete_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StateLog::open(dir.path()).unwrap();
        for e in 1..=5 {
            s.put(&epoch_key(), &StateValue::MirrorEpoch(MirrorEpoch(e)))
                .unwrap();
        }
        s.put(&lme_key(0), &last_mirror_epoch(MirrorEpoch(5), Offset(10)))
            .unwrap();
        s.put(&lme_key(1), &last_mirror_epoch(MirrorEpoch(5), Offset(11)))
            .unwrap();
        s.delete(&lme_key(0)).unwrap();
        let before = live(&s);
        assert_eq!(before.len(), 2);
        assert_eq!(s.log_end_offset(), Offset(8));
        s.close().unwrap();

        let s = StateLog::open(dir.path()).unwrap();
        assert_eq!(live(&s), before);
        assert!(live(&s).contains(&(epoch_key(), StateValue::MirrorEpoch(MirrorEpoch(5)))));
        // Compacted at start-up: one record per live key.
        assert_eq!(s.log_end_offset(), Offset(2));
        assert!(!dir.path().join(OLD_DIR).exists());
        assert!(!dir.path().join(COMPACTING_DIR).exists());
    }

    #[test]
    fn kill_9_loses_nothing_that_was_put() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StateLog::open(dir.path()).unwrap();
        for p in 0..20 {
            s.put(
                &lme_key(p),
                &last_mirror_epoch(MirrorEpoch(1), Offset(p as i64)),
            )
            .unwrap();
        }
        let expected = live(&s);
        // kill -9: no close, no clean-shutdown marker, no final flush.
        std::mem::forget(s);
        let s = StateLog::open(dir.path()).unwrap();
        assert_eq!(live(&s), expected);
    }

    #[test]
    fn torn_tail_loses_only_the_write_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StateLog::open(dir.path()).unwrap();
        s.put(&lme_key(0), &last_mirror_epoch(MirrorEpoch(1), Offset(1)))
            .unwrap();
        let expected = live(&s);
        s.put(&lme_key(1), &last_mirror_epoch(MirrorEpoch(1), Offset(2)))
            .unwrap();
        let seg = s.dir().join("00000000000000000000.log");
        std::mem::forget(s);
        // The last batch was only partly written when the process died.
        let len = std::fs::metadata(&seg).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(len - 7).unwrap();
        drop(f);
        let mut s = StateLog::open(dir.path()).unwrap();
        assert_eq!(live(&s), expected);
        // The log takes writes again after the cut.
        s.put(&lme_key(2), &last_mirror_epoch(MirrorEpoch(2), Offset(3)))
            .unwrap();
        assert_eq!(live(&s).len(), 2);
    }

    #[test]
    fn crash_between_compaction_renames_restores_the_old_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StateLog::open(dir.path()).unwrap();
        s.put(&epoch_key(), &StateValue::MirrorEpoch(MirrorEpoch(9)))
            .unwrap();
        s.close().unwrap();
        // As if the first rename happened and the process died before the second.
        std::fs::rename(dir.path().join(DIR), dir.path().join(OLD_DIR)).unwrap();
        std::fs::create_dir(dir.path().join(COMPACTING_DIR)).unwrap();
        let s = StateLog::open(dir.path()).unwrap();
        assert_eq!(
            live(&s),
            [(epoch_key(), StateValue::MirrorEpoch(MirrorEpoch(9)))]
        );
    }

    #[test]
    fn unknown_record_types_survive_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = StateLog::open(dir.path()).unwrap();
        s.append(&[0x7f, 0x00, b'{', b'}'], Some(b"{}")).unwrap();
        s.live.insert(vec![0x7f, 0x00, b'{', b'}'], b"{}".to_vec());
        s.close().unwrap();
        let s = StateLog::open(dir.path()).unwrap();
        assert!(live(&s).is_empty());
        assert_eq!(s.live.len(), 1);
        assert_eq!(s.log_end_offset(), Offset(1));
    }
}
