//! Per-partition producer state: for each producer id its epoch, last sequence, last offset and
//! open transaction, plus the partition's ongoing transactions. It yields the `.txnindex` entries
//! for ABORT markers, the first unstable offset, the transactions failover must abort, and the
//! `<offset>.snapshot` files a broker adopting the directory loads (kafka-formats.md §3.6).
//!
//! The state is that of a *follower*: batches are fed in offset order exactly as the source wrote
//! them and never refused (the source already validated them), with Kafka's state transitions
//! (`ProducerAppendInfo`/`ProducerStateEntry` in 4.1):
//! * a data batch records (lastSequence, lastOffset, offsetDelta, maxTimestamp); a different
//!   producer epoch replaces the previous batch metadata; a transactional batch with no open
//!   transaction opens one at its base offset;
//! * a COMMIT/ABORT marker adopts the marker's epoch (KIP-890 markers carry the bumped epoch) and
//!   coordinator epoch, and closes the open transaction. Kafka 4.1 produces a completed
//!   transaction (and so a `.txnindex` entry for ABORT) only when one was open.
//!
//! The LSO stored with an abort is computed per batch, as Kafka's log recovery does: the first
//! offset of the earliest *other* ongoing transaction, else marker + 1. (A live Kafka leader or
//! follower computes it after a whole append, which can differ when one append holds the marker
//! and later transactional data; the value only bounds how far a READ_COMMITTED reader scans.)
//!
//! Producer ids are never expired. Kafka drops idle producers after `producer.id.expiration.ms`,
//! but the mirror has no clock of its own that matches the source's, and dropping state the source
//! still holds would lose open transactions (and so the LSO) after failover. Keeping every
//! producer costs 46 bytes per producer in each snapshot; a broker adopting the directory
//! expires them by its own rules after loading.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::ids::{Offset, ProducerId, TimestampMs};
use crate::limits::{
    PRODUCER_RECENT_BATCHES, PRODUCER_SNAPSHOT_BYTES_MAX, PRODUCER_SNAPSHOT_ENTRY_BYTES,
};
use crate::log::checkpoint::write_atomically_with;
use crate::log::txn_index::AbortedTxn;
use crate::log::LogError;
use crate::wire::batch::{Batch, ControlType};

pub const SNAPSHOT_SUFFIX: &str = ".snapshot";
const SNAPSHOT_VERSION: i16 = 1;
/// version (2) + crc (4) + entry count (4).
const SNAPSHOT_HEADER_BYTES: usize = 10;
const CRC_AT: usize = 2;
const CRC_COVERED_FROM: usize = 6;

/// What the partition knows about one producer (one snapshot entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerEntry {
    pub producer_id: ProducerId,
    pub epoch: i16,
    /// Last sequence of the producer's last data batch, -1 if none since its epoch began.
    pub last_sequence: i32,
    /// Last offset of that batch, -1 if none.
    pub last_offset: Offset,
    /// lastOffset − baseOffset of that batch (0 if none).
    pub offset_delta: i32,
    /// Max timestamp of the last batch or marker.
    pub timestamp: TimestampMs,
    /// Coordinator epoch of the last marker, -1 if none.
    pub coordinator_epoch: i32,
    /// First offset of the open transaction.
    pub current_txn_first_offset: Option<Offset>,
}

impl ProducerEntry {
    fn empty(producer_id: ProducerId) -> ProducerEntry {
        ProducerEntry {
            producer_id,
            epoch: -1,
            last_sequence: -1,
            last_offset: Offset(-1),
            offset_delta: 0,
            timestamp: TimestampMs::NONE,
            coordinator_epoch: -1,
            current_txn_first_offset: None,
        }
    }

    /// Kafka clears the batch metadata whenever the epoch changes.
    fn set_epoch(&mut self, epoch: i16) {
        if self.epoch != epoch {
            self.epoch = epoch;
            self.last_sequence = -1;
            self.last_offset = Offset(-1);
            self.offset_delta = 0;
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.producer_id.0.to_be_bytes());
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.last_sequence.to_be_bytes());
        out.extend_from_slice(&self.last_offset.0.to_be_bytes());
        out.extend_from_slice(&self.offset_delta.to_be_bytes());
        out.extend_from_slice(&self.timestamp.0.to_be_bytes());
        out.extend_from_slice(&self.coordinator_epoch.to_be_bytes());
        out.extend_from_slice(
            &self
                .current_txn_first_offset
                .map_or(-1, |o| o.0)
                .to_be_bytes(),
        );
    }

    fn decode(b: &[u8]) -> ProducerEntry {
        let i64_at = |at: usize| i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let i32_at = |at: usize| i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let txn_first = i64_at(38);
        ProducerEntry {
            producer_id: ProducerId(i64_at(0)),
            epoch: i16::from_be_bytes([b[8], b[9]]),
            last_sequence: i32_at(10),
            last_offset: Offset(i64_at(14)),
            offset_delta: i32_at(22),
            timestamp: TimestampMs(i64_at(26)),
            coordinator_epoch: i32_at(34),
            current_txn_first_offset: (txn_first >= 0).then_some(Offset(txn_first)),
        }
    }
}

/// Sequence range and offsets of one recent data batch of a producer: what a leader needs to
/// answer a retried produce with the offsets it first got (Kafka keeps the same five).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecentBatch {
    pub first_sequence: i32,
    pub last_sequence: i32,
    pub first_offset: Offset,
    pub last_offset: Offset,
}

/// Producer state of one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStateManager {
    producers: BTreeMap<ProducerId, ProducerEntry>,
    /// The last few data batches per producer in its current epoch, newest last. Not part of
    /// the snapshot format (it keeps only the last batch), so after a reload it starts empty
    /// and the entry's last batch stands in for it.
    recent: BTreeMap<ProducerId, VecDeque<RecentBatch>>,
    /// Open transactions by first offset.
    ongoing: BTreeMap<Offset, ProducerId>,
    /// The state covers offsets below this (the next offset to be fed).
    map_end_offset: Offset,
}

impl ProducerStateManager {
    pub fn new() -> Self {
        Self::default()
    }

    /// Offset up to which batches have been applied (exclusive).
    pub fn map_end_offset(&self) -> Offset {
        self.map_end_offset
    }

    /// Start the state over at `offset` with no producers (a truncation below every snapshot,
    /// or a log that starts fresh at the source's log start).
    pub fn reset(&mut self, offset: Offset) {
        self.producers.clear();
        self.recent.clear();
        self.ongoing.clear();
        self.map_end_offset = offset;
    }

    /// Apply one appended batch (in offset order). Batches without a producer id, including
    /// all legacy ones, carry no producer state and are skipped. Returns the `.txnindex` entry
    /// when the batch is an ABORT marker that completes an open transaction.
    pub fn on_batch(&mut self, batch: &Batch<'_>) -> Option<AbortedTxn> {
        self.map_end_offset = self.map_end_offset.max(batch.next_offset());
        let pid = batch.producer_id();
        if pid.0 < 0 {
            return None;
        }
        if batch.is_control() {
            let aborted = match batch.control_type() {
                Some(ControlType::Abort) => true,
                Some(ControlType::Commit) => false,
                // Only COMMIT/ABORT markers exist in data partitions; others are KRaft's.
                _ => return None,
            };
            return self.on_end_txn_marker(batch, pid, aborted);
        }
        let entry = self
            .producers
            .entry(pid)
            .or_insert_with(|| ProducerEntry::empty(pid));
        if entry.epoch != batch.producer_epoch() {
            self.recent.remove(&pid);
        }
        entry.set_epoch(batch.producer_epoch());
        entry.last_sequence = batch.last_sequence();
        entry.last_offset = batch.last_offset();
        let recent = self
            .recent
            .entry(pid)
            .or_insert_with(|| VecDeque::with_capacity(PRODUCER_RECENT_BATCHES));
        if recent.len() == PRODUCER_RECENT_BATCHES {
            recent.pop_front();
        }
        recent.push_back(RecentBatch {
            first_sequence: batch.base_sequence(),
            last_sequence: batch.last_sequence(),
            first_offset: batch.base_offset(),
            last_offset: batch.last_offset(),
        });
        entry.offset_delta = batch.last_offset_delta();
        entry.timestamp = batch.max_timestamp();
        if batch.is_transactional() && entry.current_txn_first_offset.is_none() {
            entry.current_txn_first_offset = Some(batch.base_offset());
            self.ongoing.insert(batch.base_offset(), pid);
        }
        None
    }

    fn on_end_txn_marker(
        &mut self,
        batch: &Batch<'_>,
        pid: ProducerId,
        aborted: bool,
    ) -> Option<AbortedTxn> {
        let marker_offset = batch.base_offset();
        let entry = self
            .producers
            .entry(pid)
            .or_insert_with(|| ProducerEntry::empty(pid));
        entry.set_epoch(batch.producer_epoch());
        if let Some(epoch) = batch.coordinator_epoch() {
            entry.coordinator_epoch = epoch;
        }
        // A control batch holds one CREATE_TIME record at delta 0, so its max timestamp is
        // the record's timestamp, which is what Kafka stores.
        entry.timestamp = batch.max_timestamp();
        let first = entry.current_txn_first_offset.take()?;
        self.ongoing.remove(&first);
        if !aborted {
            return None;
        }
        let last_stable_offset = self
            .ongoing
            .keys()
            .next()
            .copied()
            .unwrap_or(marker_offset.next());
        Some(AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: marker_offset,
            last_stable_offset,
        })
    }

    /// The first offset of the earliest open transaction.
    pub fn first_unstable_offset(&self) -> Option<Offset> {
        self.ongoing.keys().next().copied()
    }

    /// Open transactions as (producer id, producer epoch, first offset), earliest first. On
    /// failover these are the transactions that need ABORT markers.
    pub fn ongoing_transactions(&self) -> Vec<(ProducerId, i16, Offset)> {
        self.ongoing
            .iter()
            .map(|(first, pid)| {
                let epoch = self.producers.get(pid).map_or(-1, |e| e.epoch);
                (*pid, epoch, *first)
            })
            .collect()
    }

    pub fn producers(&self) -> impl Iterator<Item = &ProducerEntry> {
        self.producers.values()
    }

    pub fn producer(&self, pid: ProducerId) -> Option<&ProducerEntry> {
        self.producers.get(&pid)
    }

    /// The producer's recent data batches in its current epoch, oldest first (empty after a
    /// reload from a snapshot until it appends again).
    pub fn recent_batches(&self, pid: ProducerId) -> impl Iterator<Item = &RecentBatch> {
        self.recent.get(&pid).into_iter().flatten()
    }

    /// The largest producer id this partition has seen (none when it has no producer state).
    pub fn max_producer_id(&self) -> Option<ProducerId> {
        self.producers.keys().next_back().copied()
    }

    /// Kafka's snapshot bytes for the current state.
    pub fn snapshot_bytes(&self) -> Vec<u8> {
        let count = i32::try_from(self.producers.len()).expect("fewer than 2^31 producers");
        let mut out = Vec::with_capacity(
            SNAPSHOT_HEADER_BYTES + self.producers.len() * PRODUCER_SNAPSHOT_ENTRY_BYTES,
        );
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&count.to_be_bytes());
        for entry in self.producers.values() {
            entry.encode_into(&mut out);
        }
        let crc = crate::wire::batch::crc32c(&out[CRC_COVERED_FROM..]);
        out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Write `<dir>/<20-digit next_offset>.snapshot` atomically. `next_offset` must be the
    /// offset the state covers up to (normally `map_end_offset`, the log end).
    pub fn take_snapshot(&self, dir: &Path, next_offset: Offset) -> Result<PathBuf, LogError> {
        self.take_snapshot_with(&mut crate::log::io::StdIo, dir, next_offset)
    }

    /// `take_snapshot` with the file's write and sync through `io` (the log's I/O engine).
    pub fn take_snapshot_with(
        &self,
        io: &mut impl crate::log::io::LogIo,
        dir: &Path,
        next_offset: Offset,
    ) -> Result<PathBuf, LogError> {
        let path = snapshot_path(dir, next_offset);
        write_atomically_with(io, &path, &self.snapshot_bytes())?;
        Ok(path)
    }

    /// Replace the state with the one in the snapshot file at `path`, taken at `offset`.
    pub fn load_snapshot(&mut self, path: &Path, offset: Offset) -> Result<(), LogError> {
        let entries = read_snapshot(path)?;
        self.reset(offset);
        for e in entries {
            if let Some(first) = e.current_txn_first_offset {
                self.ongoing.insert(first, e.producer_id);
            }
            self.producers.insert(e.producer_id, e);
        }
        Ok(())
    }

    /// Load the newest snapshot at or below `max_offset` and return its offset; `None` (state
    /// reset to empty at offset 0) when there is none. A corrupt snapshot is an error naming the
    /// file: the caller deletes it and rebuilds from an older snapshot or the log.
    pub fn load_latest_snapshot(
        &mut self,
        dir: &Path,
        max_offset: Offset,
    ) -> Result<Option<Offset>, LogError> {
        let Some(offset) = list_snapshots(dir)?
            .into_iter()
            .rev()
            .find(|o| *o <= max_offset)
        else {
            self.reset(Offset::ZERO);
            return Ok(None);
        };
        self.load_snapshot(&snapshot_path(dir, offset), offset)?;
        Ok(Some(offset))
    }
}

/// `<dir>/<offset padded to 20 digits>.snapshot`.
pub fn snapshot_path(dir: &Path, offset: Offset) -> PathBuf {
    dir.join(format!("{:020}{SNAPSHOT_SUFFIX}", offset.0))
}

/// Parse a snapshot file: version 1, CRC-32C over bytes 6.., a count that matches the length.
pub fn read_snapshot(path: &Path) -> Result<Vec<ProducerEntry>, LogError> {
    let len = fs::metadata(path).map_err(|e| LogError::io(path, e))?.len();
    if len > PRODUCER_SNAPSHOT_BYTES_MAX {
        return Err(LogError::corrupt(
            path,
            format!("{len} bytes exceeds the snapshot limit"),
        ));
    }
    let b = fs::read(path).map_err(|e| LogError::io(path, e))?;
    if b.len() < SNAPSHOT_HEADER_BYTES {
        return Err(LogError::corrupt(
            path,
            format!("{} bytes is shorter than the header", b.len()),
        ));
    }
    let version = i16::from_be_bytes([b[0], b[1]]);
    if version != SNAPSHOT_VERSION {
        return Err(LogError::corrupt(
            path,
            format!("unknown snapshot version {version}"),
        ));
    }
    let stored = u32::from_be_bytes(b[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    let computed = crate::wire::batch::crc32c(&b[CRC_COVERED_FROM..]);
    if stored != computed {
        return Err(LogError::corrupt(
            path,
            format!("CRC mismatch (stored {stored:#010x}, computed {computed:#010x})"),
        ));
    }
    let count = i32::from_be_bytes(b[6..10].try_into().expect("4 bytes"));
    let body = &b[SNAPSHOT_HEADER_BYTES..];
    if count < 0 || body.len() != count as usize * PRODUCER_SNAPSHOT_ENTRY_BYTES {
        return Err(LogError::corrupt(
            path,
            format!(
                "entry count {count} does not match {} entry bytes",
                body.len()
            ),
        ));
    }
    Ok(body
        .chunks_exact(PRODUCER_SNAPSHOT_ENTRY_BYTES)
        .map(ProducerEntry::decode)
        .collect())
}

/// Offsets of the `<offset>.snapshot` files in `dir`, ascending. Other files are ignored, as
/// are names whose prefix is not a number (Kafka ignores them too).
pub fn list_snapshots(dir: &Path) -> Result<Vec<Offset>, LogError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LogError::io(dir, e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| LogError::io(dir, e))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SNAPSHOT_SUFFIX) else {
            continue;
        };
        if let Ok(offset) = stem.parse::<i64>() {
            out.push(Offset(offset));
        }
    }
    out.sort();
    Ok(out)
}

fn delete_snapshots_where(dir: &Path, doomed: impl Fn(Offset) -> bool) -> Result<usize, LogError> {
    let mut deleted = 0;
    for offset in list_snapshots(dir)? {
        if doomed(offset) {
            let p = snapshot_path(dir, offset);
            match fs::remove_file(&p) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(LogError::io(p, e)),
            }
        }
    }
    Ok(deleted)
}

/// Delete snapshots with offset > `offset` (after a truncation to `offset`: they describe
/// offsets that are gone). Returns how many were deleted.
pub fn delete_snapshots_above(dir: &Path, offset: Offset) -> Result<usize, LogError> {
    delete_snapshots_where(dir, |o| o > offset)
}

/// Delete snapshots with offset < `offset` (their segments were deleted by retention).
pub fn delete_snapshots_below(dir: &Path, offset: Offset) -> Result<usize, LogError> {
    delete_snapshots_where(dir, |o| o < offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::LeaderEpoch;
    use crate::wire::batch_builder::{control_batch, BatchBuilder, EndTxnMarker};
    use proptest::prelude::*;

    fn data(offset: i64, n: usize, pid: i64, epoch: i16, seq: i32, txn: bool) -> Vec<u8> {
        let mut b = BatchBuilder::new(Offset(offset))
            .leader_epoch(LeaderEpoch(0))
            .producer(ProducerId(pid), epoch, seq)
            .transactional(txn);
        for i in 0..n {
            b = b.value(TimestampMs(1000 + offset + i as i64), b"v");
        }
        b.build()
    }

    fn marker(offset: i64, pid: i64, epoch: i16, m: EndTxnMarker, coord: i32) -> Vec<u8> {
        control_batch(
            Offset(offset),
            LeaderEpoch(0),
            ProducerId(pid),
            epoch,
            m,
            coord,
            TimestampMs(5000 + offset),
        )
    }

    fn feed(psm: &mut ProducerStateManager, bytes: &[u8]) -> Option<AbortedTxn> {
        psm.on_batch(&Batch::parse_valid(bytes).unwrap().unwrap())
    }

    #[test]
    fn transactions_open_close_and_lso() {
        let mut psm = ProducerStateManager::new();
        assert_eq!(
            feed(
                &mut psm,
                &BatchBuilder::new(Offset(0))
                    .value(TimestampMs(1), b"x")
                    .build()
            ),
            None
        );
        assert_eq!(psm.producers().count(), 0, "pid -1 batches carry no state");
        assert_eq!(feed(&mut psm, &data(1, 2, 7, 0, 0, true)), None); // pid 7 txn at 1
        assert_eq!(feed(&mut psm, &data(3, 1, 8, 0, 0, true)), None); // pid 8 txn at 3
        assert_eq!(feed(&mut psm, &data(4, 1, 7, 0, 2, true)), None); // pid 7 continues
        assert_eq!(psm.first_unstable_offset(), Some(Offset(1)));
        assert_eq!(
            psm.ongoing_transactions(),
            vec![(ProducerId(7), 0, Offset(1)), (ProducerId(8), 0, Offset(3))]
        );
        // Abort of pid 7: pid 8's txn is still open, so the LSO is its first offset.
        let a = feed(&mut psm, &marker(5, 7, 0, EndTxnMarker::Abort, 3)).unwrap();
        assert_eq!(
            a,
            AbortedTxn {
                producer_id: ProducerId(7),
                first_offset: Offset(1),
                last_offset: Offset(5),
                last_stable_offset: Offset(3)
            }
        );
        // Commit of pid 8 with a bumped epoch (KIP-890): no txnindex entry.
        assert_eq!(
            feed(&mut psm, &marker(6, 8, 1, EndTxnMarker::Commit, 3)),
            None
        );
        assert_eq!(psm.first_unstable_offset(), None);
        let p8 = *psm.producer(ProducerId(8)).unwrap();
        assert_eq!(
            (
                p8.epoch,
                p8.last_sequence,
                p8.last_offset,
                p8.coordinator_epoch
            ),
            (1, -1, Offset(-1), 3)
        );
        // Abort with nothing else open: LSO = marker + 1.
        feed(&mut psm, &data(7, 3, 9, 2, 10, true));
        let a = feed(&mut psm, &marker(10, 9, 2, EndTxnMarker::Abort, 4)).unwrap();
        assert_eq!(
            (a.first_offset, a.last_offset, a.last_stable_offset),
            (Offset(7), Offset(10), Offset(11))
        );
        let p9 = *psm.producer(ProducerId(9)).unwrap();
        assert_eq!(
            (p9.last_sequence, p9.last_offset, p9.offset_delta),
            (12, Offset(9), 2)
        );
        assert_eq!(p9.current_txn_first_offset, None);
        // A marker with no open txn (4.1 semantics): nothing to index.
        assert_eq!(
            feed(&mut psm, &marker(11, 9, 2, EndTxnMarker::Abort, 4)),
            None
        );
        assert_eq!(psm.map_end_offset(), Offset(12));
    }

    #[test]
    fn snapshot_layout_and_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let mut psm = ProducerStateManager::new();
        feed(&mut psm, &data(0, 2, 5, 1, 0, false));
        feed(&mut psm, &data(2, 1, 6, 0, 0, true));
        let p = psm.take_snapshot(d.path(), Offset(3)).unwrap();
        assert_eq!(p.file_name().unwrap(), "00000000000000000003.snapshot");
        let bytes = fs::read(&p).unwrap();
        assert_eq!(bytes.len(), 10 + 2 * 46);
        assert_eq!(&bytes[0..2], &[0, 1]);
        assert_eq!(&bytes[6..10], &2i32.to_be_bytes());
        // First entry (pid 5), field by field.
        let e = &bytes[10..56];
        assert_eq!(&e[0..8], &5i64.to_be_bytes());
        assert_eq!(&e[8..10], &1i16.to_be_bytes());
        assert_eq!(&e[10..14], &1i32.to_be_bytes()); // last sequence
        assert_eq!(&e[14..22], &1i64.to_be_bytes()); // last offset
        assert_eq!(&e[22..26], &1i32.to_be_bytes()); // offset delta
        assert_eq!(&e[26..34], &1001i64.to_be_bytes()); // max timestamp
        assert_eq!(&e[34..38], &(-1i32).to_be_bytes());
        assert_eq!(&e[38..46], &(-1i64).to_be_bytes());
        assert_eq!(
            &bytes[56 + 38..56 + 46],
            &2i64.to_be_bytes(),
            "pid 6 txn open at 2"
        );

        let mut loaded = ProducerStateManager::new();
        assert_eq!(
            loaded.load_latest_snapshot(d.path(), Offset(100)).unwrap(),
            Some(Offset(3))
        );
        assert_eq!(
            loaded.producers().copied().collect::<Vec<_>>(),
            psm.producers().copied().collect::<Vec<_>>()
        );
        assert_eq!(loaded.ongoing_transactions(), psm.ongoing_transactions());
        assert_eq!(loaded.map_end_offset(), Offset(3));
        assert_eq!(
            loaded.load_latest_snapshot(d.path(), Offset(2)).unwrap(),
            None
        );
    }

    #[test]
    fn corrupt_snapshots_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let mut psm = ProducerStateManager::new();
        feed(&mut psm, &data(0, 1, 5, 1, 0, false));
        let p = psm.take_snapshot(d.path(), Offset(1)).unwrap();
        let good = fs::read(&p).unwrap();
        let mut flipped = good.clone();
        flipped[20] ^= 0x40;
        let mut bad_version = good.clone();
        bad_version[1] = 2;
        for bad in [
            flipped,
            bad_version,
            good[..good.len() - 1].to_vec(),
            good[..5].to_vec(),
        ] {
            fs::write(&p, &bad).unwrap();
            let r = ProducerStateManager::new().load_latest_snapshot(d.path(), Offset(10));
            assert!(
                matches!(r, Err(LogError::Corrupt { ref path, .. }) if *path == p),
                "{r:?}"
            );
        }
    }

    #[test]
    fn listing_and_deleting() {
        let d = tempfile::tempdir().unwrap();
        let psm = ProducerStateManager::new();
        for o in [0, 10, 20, 30] {
            psm.take_snapshot(d.path(), Offset(o)).unwrap();
        }
        fs::write(d.path().join("00000000000000000000.log"), b"").unwrap();
        fs::write(d.path().join("junk.snapshot"), b"").unwrap();
        let offs = |d: &Path| {
            list_snapshots(d)
                .unwrap()
                .into_iter()
                .map(|o| o.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(offs(d.path()), vec![0, 10, 20, 30]);
        assert_eq!(delete_snapshots_above(d.path(), Offset(20)).unwrap(), 1);
        assert_eq!(delete_snapshots_below(d.path(), Offset(10)).unwrap(), 1);
        assert_eq!(offs(d.path()), vec![10, 20]);
        let mut loaded = ProducerStateManager::new();
        assert_eq!(
            loaded.load_latest_snapshot(d.path(), Offset(15)).unwrap(),
            Some(Offset(10))
        );
    }

    proptest! {
        /// Any sequence of transactional/idempotent batches and markers: the snapshot reloads to
        /// the same state, and an open transaction's first offset is the first unstable offset.
        #[test]
        fn snapshot_round_trips_any_state(ops in proptest::collection::vec((0i64..4, 0u8..4, 1usize..4), 1..40)) {
            let d = tempfile::tempdir().unwrap();
            let mut psm = ProducerStateManager::new();
            let mut offset = 0i64;
            for (pid, kind, n) in ops {
                let bytes = match kind {
                    0 => data(offset, n, pid, 0, offset as i32, false),
                    1 => data(offset, n, pid, 0, offset as i32, true),
                    2 => marker(offset, pid, 0, EndTxnMarker::Commit, 1),
                    _ => marker(offset, pid, 1, EndTxnMarker::Abort, 1),
                };
                if let Some(a) = feed(&mut psm, &bytes) {
                    prop_assert!(a.first_offset < a.last_offset);
                    prop_assert!(a.last_stable_offset <= a.last_offset.next());
                }
                offset = psm.map_end_offset().0;
            }
            prop_assert_eq!(psm.first_unstable_offset(), psm.ongoing_transactions().first().map(|t| t.2));
            psm.take_snapshot(d.path(), psm.map_end_offset()).unwrap();
            let mut loaded = ProducerStateManager::new();
            loaded.load_latest_snapshot(d.path(), Offset(i64::MAX)).unwrap();
            prop_assert_eq!(loaded.producers().copied().collect::<Vec<_>>(), psm.producers().copied().collect::<Vec<_>>());
            prop_assert_eq!(loaded.ongoing_transactions(), psm.ongoing_transactions());
        }
    }
}
