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

use std::path::Path;

use crate::control::records::{RecordCodecError, StateKey, StateValue};
use crate::ids::Offset;
use crate::log::config::FlushPolicy;
use crate::log::keyed_log::{KeyedLog, KeyedLogError};

pub const TOPIC: &str = "__mirror_state";

#[derive(Debug, thiserror::Error)]
pub enum StateLogError {
    #[error(transparent)]
    Keyed(#[from] KeyedLogError),
    #[error("__mirror_state record at offset {offset}: {source}")]
    Codec {
        offset: Offset,
        source: RecordCodecError,
    },
}

/// The open state log and its live records.
#[derive(Debug)]
pub struct StateLog {
    log: KeyedLog,
    writes: u64,
}

impl StateLog {
    /// Opens (or creates) `__mirror_state-0` under `data_dir`, replays it and compacts it.
    /// Every put is fdatasynced: a transition the control thread acted on survives a power cut.
    pub fn open(data_dir: &Path) -> Result<StateLog, StateLogError> {
        Ok(StateLog {
            log: KeyedLog::open(data_dir, TOPIC, FlushPolicy::EveryAppend)?,
            writes: 0,
        })
    }

    /// Every live record whose type this version knows, decoded.
    pub fn records(&self) -> Result<Vec<(StateKey, StateValue)>, StateLogError> {
        let live = self.log.live();
        let mut out = Vec::with_capacity(live.len());
        for (k, v) in live {
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
        let before = self.log.log_end_offset();
        self.log.put(key.encode(), value.encode())?;
        self.count_write(before);
        Ok(())
    }

    /// Writes every record with one append and one sync (`KeyedLog::put_many`): all or none.
    pub fn put_many(&mut self, records: &[(StateKey, StateValue)]) -> Result<(), StateLogError> {
        let before = self.log.log_end_offset();
        self.log.put_many(
            records
                .iter()
                .map(|(k, v)| (k.encode(), Some(v.encode())))
                .collect(),
        )?;
        self.count_write(before);
        Ok(())
    }

    fn count_write(&mut self, before: Offset) {
        if self.log.log_end_offset() != before {
            self.writes += 1;
        }
    }

    /// Appends (each one write and one sync) since the log was opened, compaction excluded.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Durably deletes `key` (a tombstone).
    pub fn delete(&mut self, key: &StateKey) -> Result<(), StateLogError> {
        Ok(self.log.delete(&key.encode())?)
    }

    pub fn log_end_offset(&self) -> Offset {
        self.log.log_end_offset()
    }

    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// Closes the log cleanly (flush, final index entries, producer snapshot).
    pub fn close(self) -> Result<(), StateLogError> {
        Ok(self.log.close()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::mirror_def::MirrorName;
    use crate::control::records::last_mirror_epoch;
    use crate::ids::{MirrorEpoch, TopicPartition};

    const DIR: &str = "__mirror_state-0";
    const OLD_DIR: &str = "__mirror_state-0.old";
    const COMPACTING_DIR: &str = "__mirror_state-0.compacting";

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
        s.log
            .append_raw(&[0x7f, 0x00, b'{', b'}'], Some(b"{}"))
            .unwrap();
        s.log
            .live_mut()
            .insert(vec![0x7f, 0x00, b'{', b'}'], b"{}".to_vec());
        s.close().unwrap();
        let s = StateLog::open(dir.path()).unwrap();
        assert!(live(&s).is_empty());
        assert_eq!(s.log.live().len(), 1);
        assert_eq!(s.log_end_offset(), Offset(1));
    }
}
