//! Committed group offsets: the in-memory table the coordinator answers OffsetFetch from, and
//! its durable home, `__consumer_offsets-0` under the data dir, a keyed compacted log whose
//! records use Kafka's own `__consumer_offsets` schemas (offset-commit key version 1, value
//! version 3), so Kafka's `DumpLogSegments --offsets-decoder` reads it.
//!
//! Offsets committed inside a transaction (TxnOffsetCommit) are *pending* until the
//! transaction ends. They live in the same log under kmirror's own key type
//! (`PENDING_KEY_VERSION`, far above the key versions Kafka uses, so `decode_key` and Kafka's
//! tools pass them by): key = version, producer id, group, topic, partition; value = the
//! offset-commit value v3. Commit writes each as an ordinary offset-commit record and then a
//! tombstone for the pending key; abort writes only the tombstones. Both steps can be repeated,
//! which is what the transaction coordinator does after a crash. (Kafka instead writes them as
//! transactional records and lets a COMMIT/ABORT marker decide; our keyed log has no producer
//! state to attach markers to, and keeping the decision in `__transaction_state-0` needs none.)
//!
//! Appends stay on the page cache (Kafka's own `__consumer_offsets` relies on replication, not
//! fsync): a commit survives `kill -9` of kmirror, and a power cut may lose the last commits,
//! which a consumer then re-reads (at-least-once). Closing the log fsyncs it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs, TopicPartition};
use crate::limits::COMMITTED_OFFSETS_MAX;
use crate::log::config::FlushPolicy;
use crate::log::keyed_log::{KeyedLog, KeyedLogError};

/// The topic of the offsets log (Kafka's name, so its tools recognise the records).
pub const TOPIC: &str = "__consumer_offsets";

/// One committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: Offset,
    pub leader_epoch: LeaderEpoch,
    pub metadata: String,
    pub commit_timestamp: TimestampMs,
}

/// Which group and partition an offset belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OffsetKey {
    pub group: String,
    pub tp: TopicPartition,
}

#[derive(Debug, thiserror::Error)]
pub enum OffsetStoreError {
    #[error(transparent)]
    Log(#[from] KeyedLogError),
    #[error("__consumer_offsets record: {0}")]
    Codec(#[from] CodecError),
    #[error("more than {COMMITTED_OFFSETS_MAX} committed offsets")]
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("record is truncated")]
    Truncated,
    #[error("string is not UTF-8")]
    Utf8,
    #[error("{0} trailing bytes")]
    Trailing(usize),
    #[error("value version {0} is not an offset commit")]
    ValueVersion(i16),
}

/// What the coordinator needs from durable storage. `put` returns once the commit is as
/// durable as the store promises; the coordinator only then answers the commit.
pub trait OffsetStore {
    /// Every offset the store holds, at start.
    fn load(&self) -> Result<Vec<(OffsetKey, CommittedOffset)>, OffsetStoreError>;
    fn put(&mut self, key: &OffsetKey, value: &CommittedOffset) -> Result<(), OffsetStoreError>;
    fn delete(&mut self, key: &OffsetKey) -> Result<(), OffsetStoreError>;
    /// Every pending transactional offset the store holds, at start.
    fn load_pending(&self) -> Result<Vec<PendingOffset>, OffsetStoreError>;
    fn put_pending(&mut self, pending: &PendingOffset) -> Result<(), OffsetStoreError>;
    fn delete_pending(
        &mut self,
        producer: ProducerId,
        key: &OffsetKey,
    ) -> Result<(), OffsetStoreError>;
}

/// An offset committed inside producer `producer`'s open transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOffset {
    pub producer: ProducerId,
    pub key: OffsetKey,
    pub value: CommittedOffset,
}

/// A store that keeps nothing: for tests and tools that need no durability.
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub map: BTreeMap<OffsetKey, CommittedOffset>,
    pub pending: BTreeMap<(ProducerId, OffsetKey), CommittedOffset>,
    /// When set, every put fails (to test the coordinator's error path).
    pub fail: bool,
}

impl OffsetStore for MemoryStore {
    fn load(&self) -> Result<Vec<(OffsetKey, CommittedOffset)>, OffsetStoreError> {
        Ok(self
            .map
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn put(&mut self, key: &OffsetKey, value: &CommittedOffset) -> Result<(), OffsetStoreError> {
        if self.fail {
            return Err(OffsetStoreError::Full);
        }
        self.map.insert(key.clone(), value.clone());
        Ok(())
    }
    fn delete(&mut self, key: &OffsetKey) -> Result<(), OffsetStoreError> {
        self.map.remove(key);
        Ok(())
    }
    fn load_pending(&self) -> Result<Vec<PendingOffset>, OffsetStoreError> {
        Ok(self
            .pending
            .iter()
            .map(|((producer, key), value)| PendingOffset {
                producer: *producer,
                key: key.clone(),
                value: value.clone(),
            })
            .collect())
    }
    fn put_pending(&mut self, p: &PendingOffset) -> Result<(), OffsetStoreError> {
        if self.fail {
            return Err(OffsetStoreError::Full);
        }
        self.pending
            .insert((p.producer, p.key.clone()), p.value.clone());
        Ok(())
    }
    fn delete_pending(
        &mut self,
        producer: ProducerId,
        key: &OffsetKey,
    ) -> Result<(), OffsetStoreError> {
        self.pending.remove(&(producer, key.clone()));
        Ok(())
    }
}

/// `__consumer_offsets-0`: the durable offsets store.
#[derive(Debug)]
pub struct OffsetsLog {
    log: KeyedLog,
}

impl OffsetsLog {
    /// Opens (or creates) `<data_dir>/__consumer_offsets-0`, replays and compacts it.
    pub fn open(data_dir: &Path) -> Result<OffsetsLog, OffsetStoreError> {
        Ok(OffsetsLog {
            log: KeyedLog::open(data_dir, TOPIC, FlushPolicy::PageCache)?,
        })
    }

    pub fn dir(&self) -> &Path {
        self.log.dir()
    }

    /// Closes the log cleanly (fsync, checkpoints).
    pub fn close(self) -> Result<(), OffsetStoreError> {
        Ok(self.log.close()?)
    }
}

impl OffsetStore for OffsetsLog {
    fn load(&self) -> Result<Vec<(OffsetKey, CommittedOffset)>, OffsetStoreError> {
        let mut out = Vec::with_capacity(self.log.live().len());
        for (k, v) in self.log.live() {
            // Group-metadata keys (version 2) and other records Kafka may keep here are not
            // offsets; they stay in the log untouched.
            let Some(key) = decode_key(k)? else {
                continue;
            };
            out.push((key, decode_value(v)?));
        }
        Ok(out)
    }

    fn put(&mut self, key: &OffsetKey, value: &CommittedOffset) -> Result<(), OffsetStoreError> {
        if self.log.live().len() >= COMMITTED_OFFSETS_MAX {
            return Err(OffsetStoreError::Full);
        }
        Ok(self.log.put(encode_key(key), encode_value(value))?)
    }

    fn delete(&mut self, key: &OffsetKey) -> Result<(), OffsetStoreError> {
        Ok(self.log.delete(&encode_key(key))?)
    }

    fn load_pending(&self) -> Result<Vec<PendingOffset>, OffsetStoreError> {
        let mut out = Vec::new();
        for (k, v) in self.log.live() {
            if let Some((producer, key)) = decode_pending_key(k)? {
                out.push(PendingOffset {
                    producer,
                    key,
                    value: decode_value(v)?,
                });
            }
        }
        Ok(out)
    }

    fn put_pending(&mut self, p: &PendingOffset) -> Result<(), OffsetStoreError> {
        if self.log.live().len() >= COMMITTED_OFFSETS_MAX {
            return Err(OffsetStoreError::Full);
        }
        Ok(self.log.put(
            encode_pending_key(p.producer, &p.key),
            encode_value(&p.value),
        )?)
    }

    fn delete_pending(
        &mut self,
        producer: ProducerId,
        key: &OffsetKey,
    ) -> Result<(), OffsetStoreError> {
        Ok(self.log.delete(&encode_pending_key(producer, key))?)
    }
}

// ---- Kafka's __consumer_offsets schemas (big-endian, int16-length strings) ----

const KEY_VERSION_OFFSET: i16 = 1;
const VALUE_VERSION: i16 = 3;
/// kmirror's own key type for pending transactional offsets (Kafka's key versions are small).
pub const PENDING_KEY_VERSION: i16 = 0x7f00;

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Our own bounds keep every string far below i16::MAX.
    let len = i16::try_from(s.len()).unwrap_or(i16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

pub fn encode_key(key: &OffsetKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + key.group.len() + key.tp.topic.len());
    out.extend_from_slice(&KEY_VERSION_OFFSET.to_be_bytes());
    put_str(&mut out, &key.group);
    put_str(&mut out, &key.tp.topic);
    out.extend_from_slice(&key.tp.partition.to_be_bytes());
    out
}

pub fn encode_value(v: &CommittedOffset) -> Vec<u8> {
    let mut out = Vec::with_capacity(26 + v.metadata.len());
    out.extend_from_slice(&VALUE_VERSION.to_be_bytes());
    out.extend_from_slice(&v.offset.0.to_be_bytes());
    out.extend_from_slice(&v.leader_epoch.0.to_be_bytes());
    put_str(&mut out, &v.metadata);
    out.extend_from_slice(&v.commit_timestamp.0.to_be_bytes());
    out
}

/// A pending transactional offset's key: version, producer id, group, topic, partition.
pub fn encode_pending_key(producer: ProducerId, key: &OffsetKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + key.group.len() + key.tp.topic.len());
    out.extend_from_slice(&PENDING_KEY_VERSION.to_be_bytes());
    out.extend_from_slice(&producer.0.to_be_bytes());
    put_str(&mut out, &key.group);
    put_str(&mut out, &key.tp.topic);
    out.extend_from_slice(&key.tp.partition.to_be_bytes());
    out
}

/// A pending-offset key, or `None` for every other key type.
pub fn decode_pending_key(bytes: &[u8]) -> Result<Option<(ProducerId, OffsetKey)>, CodecError> {
    let mut r = Reader(bytes);
    if r.i16()? != PENDING_KEY_VERSION {
        return Ok(None);
    }
    let producer = ProducerId(r.i64()?);
    let group = r.string()?;
    let topic = r.string()?;
    let partition = r.i32()?;
    r.end()?;
    Ok(Some((
        producer,
        OffsetKey {
            group,
            tp: TopicPartition::new(topic, partition),
        },
    )))
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        if self.0.len() < N {
            return Err(CodecError::Truncated);
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        Ok(head.try_into().expect("split at N"))
    }
    fn i16(&mut self) -> Result<i16, CodecError> {
        Ok(i16::from_be_bytes(self.take()?))
    }
    fn i32(&mut self) -> Result<i32, CodecError> {
        Ok(i32::from_be_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_be_bytes(self.take()?))
    }
    fn string(&mut self) -> Result<String, CodecError> {
        let len = self.i16()?;
        // A null string (-1) reads as empty: Kafka writes metadata as "" when none.
        let len = usize::try_from(len).unwrap_or(0);
        if self.0.len() < len {
            return Err(CodecError::Truncated);
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(s.to_vec()).map_err(|_| CodecError::Utf8)
    }
    fn end(&self) -> Result<(), CodecError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Trailing(self.0.len()))
        }
    }
}

/// An offset-commit key (versions 0 and 1 share a layout), or `None` for other key types.
pub fn decode_key(bytes: &[u8]) -> Result<Option<OffsetKey>, CodecError> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    if !(0..=1).contains(&version) {
        return Ok(None);
    }
    let group = r.string()?;
    let topic = r.string()?;
    let partition = r.i32()?;
    r.end()?;
    Ok(Some(OffsetKey {
        group,
        tp: TopicPartition::new(topic, partition),
    }))
}

/// An offset-commit value: version 3 as we write it; versions 0, 1 and 2 as older Kafkas did.
pub fn decode_value(bytes: &[u8]) -> Result<CommittedOffset, CodecError> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    let offset = Offset(r.i64()?);
    let (leader_epoch, metadata, commit_timestamp) = match version {
        0 | 2 => (LeaderEpoch::NONE, r.string()?, r.i64()?),
        1 => {
            let (m, t) = (r.string()?, r.i64()?);
            let _expire = r.i64()?;
            (LeaderEpoch::NONE, m, t)
        }
        3 => (LeaderEpoch(r.i32()?), r.string()?, r.i64()?),
        v => return Err(CodecError::ValueVersion(v)),
    };
    r.end()?;
    Ok(CommittedOffset {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp: TimestampMs(commit_timestamp),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(g: &str, p: i32) -> OffsetKey {
        OffsetKey {
            group: g.into(),
            tp: TopicPartition::new("orders", p),
        }
    }

    fn value(o: i64) -> CommittedOffset {
        CommittedOffset {
            offset: Offset(o),
            leader_epoch: LeaderEpoch(4),
            metadata: "m".into(),
            commit_timestamp: TimestampMs(1_700_000_000_000),
        }
    }

    #[test]
    fn kafka_layout_of_key_and_value() {
        // Offset-commit key v1: version, group, topic, partition (Kafka's OffsetCommitKey).
        let k = encode_key(&key("g", 2));
        assert_eq!(
            k,
            [0, 1, 0, 1, b'g', 0, 6, b'o', b'r', b'd', b'e', b'r', b's', 0, 0, 0, 2]
        );
        assert_eq!(decode_key(&k).unwrap(), Some(key("g", 2)));
        // Value v3: version, offset, leader epoch, metadata, commit timestamp.
        let v = encode_value(&value(7));
        assert_eq!(&v[..2], &[0, 3]);
        assert_eq!(&v[2..10], &7i64.to_be_bytes());
        assert_eq!(&v[10..14], &4i32.to_be_bytes());
        assert_eq!(&v[14..17], &[0, 1, b'm']);
        assert_eq!(decode_value(&v).unwrap(), value(7));
        // A group-metadata key (version 2) is not an offset.
        assert_eq!(decode_key(&[0, 2, 0, 1, b'g']).unwrap(), None);
        // A pending key is neither read as an offset nor confused with one.
        let pk = encode_pending_key(ProducerId(1 << 40), &key("g", 2));
        assert_eq!(&pk[..2], &PENDING_KEY_VERSION.to_be_bytes());
        assert_eq!(&pk[2..10], &(1i64 << 40).to_be_bytes());
        assert_eq!(decode_key(&pk).unwrap(), None);
        assert_eq!(decode_pending_key(&k).unwrap(), None);
        assert_eq!(
            decode_pending_key(&pk).unwrap(),
            Some((ProducerId(1 << 40), key("g", 2)))
        );
        for cut in 2..pk.len() {
            assert!(decode_pending_key(&pk[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn hostile_bytes_are_typed_errors() {
        let k = encode_key(&key("g", 2));
        for cut in 0..k.len() {
            assert!(decode_key(&k[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = k.clone();
        long.push(0);
        assert_eq!(decode_key(&long), Err(CodecError::Trailing(1)));
        let v = encode_value(&value(1));
        for cut in 0..v.len() {
            assert!(decode_value(&v[..cut]).is_err());
        }
        assert_eq!(
            decode_value(&[0, 9, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(CodecError::ValueVersion(9))
        );
    }

    #[test]
    fn offsets_survive_kill_9_and_tombstones_delete() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = OffsetsLog::open(dir.path()).unwrap();
        for o in 0..50 {
            log.put(&key("a", 0), &value(o)).unwrap();
        }
        log.put(&key("a", 1), &value(3)).unwrap();
        log.put(&key("b", 0), &value(9)).unwrap();
        log.delete(&key("b", 0)).unwrap();
        // kill -9: no close, no flush; the page cache keeps what was written.
        std::mem::forget(log);
        let log = OffsetsLog::open(dir.path()).unwrap();
        let mut got = log.load().unwrap();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, vec![(key("a", 0), value(49)), (key("a", 1), value(3))]);
        log.close().unwrap();
    }

    #[test]
    fn pending_offsets_survive_kill_9_apart_from_committed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = OffsetsLog::open(dir.path()).unwrap();
        log.put(&key("a", 0), &value(5)).unwrap();
        let p = |pid: i64, o: i64| PendingOffset {
            producer: ProducerId(pid),
            key: key("a", 0),
            value: value(o),
        };
        log.put_pending(&p(7, 9)).unwrap();
        log.put_pending(&p(8, 11)).unwrap();
        log.delete_pending(ProducerId(8), &key("a", 0)).unwrap();
        std::mem::forget(log);
        let log = OffsetsLog::open(dir.path()).unwrap();
        assert_eq!(log.load().unwrap(), vec![(key("a", 0), value(5))]);
        assert_eq!(log.load_pending().unwrap(), vec![p(7, 9)]);
        log.close().unwrap();
    }
}
