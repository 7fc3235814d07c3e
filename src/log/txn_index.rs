//! The `.txnindex` of one segment: one 34-byte entry per aborted transaction whose ABORT marker
//! lies in the segment (kafka-formats.md §3.5). READ_COMMITTED fetches use it to tell consumers
//! which producer ranges to drop.
//!
//! The file is created on the first append, never preallocated, so a segment without aborts has
//! no `.txnindex` at all, as with Kafka. Entries are few (one per abort), so they are also kept in
//! memory; the file is only ever appended to or cut.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::ids::{Offset, ProducerId};
use crate::limits::{SEGMENT_BYTES_MAX, TXN_INDEX_ENTRY_BYTES};
use crate::log::io::LogIo;
use crate::log::lazy_file::{Hold, LazyFile};
use crate::log::LogError;

const VERSION: i16 = 0;
const ENTRY: usize = TXN_INDEX_ENTRY_BYTES as usize;

/// One aborted transaction: producer, first offset of its data (possibly in an earlier segment),
/// offset of its ABORT marker, and the partition's last stable offset right after the abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: ProducerId,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub last_stable_offset: Offset,
}

impl AbortedTxn {
    pub fn encode(&self) -> [u8; ENTRY] {
        let mut out = [0u8; ENTRY];
        out[0..2].copy_from_slice(&VERSION.to_be_bytes());
        out[2..10].copy_from_slice(&self.producer_id.0.to_be_bytes());
        out[10..18].copy_from_slice(&self.first_offset.0.to_be_bytes());
        out[18..26].copy_from_slice(&self.last_offset.0.to_be_bytes());
        out[26..34].copy_from_slice(&self.last_stable_offset.0.to_be_bytes());
        out
    }

    /// Decode one entry; `Err` carries the reason (only version 0 exists).
    pub fn decode(bytes: &[u8; ENTRY]) -> Result<AbortedTxn, String> {
        let be64 = |at: usize| i64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let version = i16::from_be_bytes([bytes[0], bytes[1]]);
        if version != VERSION {
            return Err(format!("unexpected aborted transaction version {version}"));
        }
        Ok(AbortedTxn {
            producer_id: ProducerId(be64(2)),
            first_offset: Offset(be64(10)),
            last_offset: Offset(be64(18)),
            last_stable_offset: Offset(be64(26)),
        })
    }
}

/// The `.txnindex` of the segment starting at `base`.
#[derive(Debug)]
pub struct TxnIndex {
    path: PathBuf,
    base: Offset,
    /// Present once the file exists (after the first append, or when found on disk); its
    /// descriptor is opened by writes (`lazy_file`).
    file: Option<LazyFile>,
    entries: Vec<AbortedTxn>,
}

impl TxnIndex {
    /// Open the index at `path` for the segment starting at `base`, reading the entries if the
    /// file exists. A length that is not a whole number of entries or an unknown entry version is
    /// corrupt; `sanity_check` applies Kafka's load-time check separately.
    pub fn open(path: &Path, base: Offset) -> Result<TxnIndex, LogError> {
        let mut idx = TxnIndex {
            path: path.to_owned(),
            base,
            file: None,
            entries: Vec::new(),
        };
        let len = match fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(idx),
            Err(e) => return Err(LogError::io(path, e)),
        };
        if len > SEGMENT_BYTES_MAX {
            return Err(LogError::corrupt(
                path,
                format!("{len} bytes is larger than any segment"),
            ));
        }
        if len % ENTRY as u64 != 0 {
            return Err(LogError::corrupt(
                path,
                format!("length {len} is not a multiple of the {ENTRY}-byte entry size"),
            ));
        }
        let bytes = fs::read(path).map_err(|e| LogError::io(path, e))?;
        for (i, chunk) in bytes.chunks_exact(ENTRY).enumerate() {
            let txn = AbortedTxn::decode(chunk.try_into().expect("exact chunk"))
                .map_err(|why| LogError::corrupt(path, format!("entry {i}: {why}")))?;
            idx.entries.push(txn);
        }
        idx.file = Some(LazyFile::existing(path, Hold::Budgeted));
        Ok(idx)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn base_offset(&self) -> Offset {
        self.base
    }

    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the file exists on disk (it is created lazily).
    pub fn file_exists(&self) -> bool {
        self.file.is_some()
    }

    /// Append one entry, creating the file if needed. Marker offsets must strictly increase, as
    /// Kafka requires; a violation is refused with an error and leaves the index unchanged.
    pub fn append(&mut self, io: &mut impl LogIo, txn: &AbortedTxn) -> Result<(), LogError> {
        if let Some(last) = self.entries.last() {
            if txn.last_offset <= last.last_offset {
                return Err(LogError::corrupt(
                    &self.path,
                    format!(
                        "aborted txn marker offset {} does not follow the last indexed marker {}",
                        txn.last_offset, last.last_offset
                    ),
                ));
            }
        }
        if self.file.is_none() {
            let f = LazyFile::create(&self.path, Hold::Budgeted)
                .map_err(|e| LogError::io(&self.path, e))?;
            self.file = Some(f);
        }
        let file = self.file.as_mut().expect("created above");
        let pos = (self.entries.len() * ENTRY) as u64;
        file.write_all_at(io, pos, &txn.encode())
            .map_err(|e| LogError::io(&self.path, e))?;
        self.entries.push(*txn);
        Ok(())
    }

    /// Make the appended entries durable.
    pub fn flush(&mut self, io: &mut impl LogIo) -> Result<(), LogError> {
        match &mut self.file {
            Some(f) => f.sync(io).map_err(|e| LogError::io(&self.path, e)),
            None => Ok(()),
        }
    }

    /// A sync for the caller to perform later (`LazyFile::sync_ticket`), with the path.
    pub fn sync_ticket(
        &self,
    ) -> Result<Option<(PathBuf, crate::log::lazy_file::SyncTicket)>, LogError> {
        match &self.file {
            Some(f) => f
                .sync_ticket()
                .map(|t| t.map(|t| (self.path.clone(), t)))
                .map_err(|e| LogError::io(&self.path, e)),
            None => Ok(None),
        }
    }

    /// A ticket's sync succeeded (`LazyFile::synced_through`).
    pub fn synced_through(&mut self, covers: u64) {
        if let Some(f) = &mut self.file {
            f.synced_through(covers);
        }
    }

    /// Kafka's `collectAbortedTxns`: the entries with marker ≥ `fetch_offset` and first offset
    /// < `upper_bound`, in order. The flag is true when an entry with LSO ≥ `upper_bound` was
    /// seen: no later segment can hold a relevant abort, so the caller stops searching.
    pub fn collect_aborted(
        &self,
        fetch_offset: Offset,
        upper_bound: Offset,
    ) -> (Vec<AbortedTxn>, bool) {
        let mut found = Vec::new();
        for txn in &self.entries {
            if txn.last_offset >= fetch_offset && txn.first_offset < upper_bound {
                found.push(*txn);
            }
            if txn.last_stable_offset >= upper_bound {
                return (found, true);
            }
        }
        (found, false)
    }

    /// Drop the entries whose marker is at or after `offset` (the log was truncated there).
    pub fn truncate_to(&mut self, offset: Offset) -> Result<(), LogError> {
        let keep = self
            .entries
            .iter()
            .take_while(|t| t.last_offset < offset)
            .count();
        if keep == self.entries.len() {
            return Ok(());
        }
        if let Some(f) = &mut self.file {
            f.set_len((keep * ENTRY) as u64)
                .map_err(|e| LogError::io(&self.path, e))?;
        }
        self.entries.truncate(keep);
        Ok(())
    }

    /// Empty the index, keeping the file if it exists (Kafka's `reset`, used before a segment is
    /// recovered and its aborts re-indexed).
    pub fn reset(&mut self) -> Result<(), LogError> {
        if let Some(f) = &mut self.file {
            f.set_len(0).map_err(|e| LogError::io(&self.path, e))?;
        }
        self.entries.clear();
        Ok(())
    }

    /// Closes the held descriptor, if any (the segment is no longer active).
    pub fn release(&mut self) {
        if let Some(f) = &mut self.file {
            f.release();
        }
    }

    /// Whether a descriptor is held (tests of the fd budget).
    pub fn is_held(&self) -> bool {
        self.file.as_ref().is_some_and(LazyFile::is_held)
    }

    /// Kafka's load-time check: every marker offset must be ≥ the segment's base offset.
    pub fn sanity_check(&self) -> Result<(), LogError> {
        match self.entries.iter().find(|t| t.last_offset < self.base) {
            Some(t) => Err(LogError::corrupt(
                &self.path,
                format!(
                    "last offset of aborted transaction {t:?} is less than the segment base {}",
                    self.base
                ),
            )),
            None => Ok(()),
        }
    }

    /// Delete the file if it exists; returns whether it did.
    pub fn delete(&mut self) -> Result<bool, LogError> {
        self.file = None;
        self.entries.clear();
        match fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(LogError::io(&self.path, e)),
        }
    }

    /// Rename the file (if it exists) to `to` and remember the new path either way, so that a
    /// later first append creates it under the new name (segment `.swap`/`.deleted` renames).
    pub fn rename(&mut self, to: &Path) -> Result<(), LogError> {
        if self.file.is_some() {
            fs::rename(&self.path, to).map_err(|e| LogError::io(&self.path, e))?;
            self.file = Some(LazyFile::existing(to, Hold::Budgeted));
        }
        self.path = to.to_owned();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::io::StdIo;
    use proptest::prelude::*;

    fn txn(pid: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: ProducerId(pid),
            first_offset: Offset(first),
            last_offset: Offset(last),
            last_stable_offset: Offset(lso),
        }
    }

    #[test]
    fn entry_layout() {
        let bytes = txn(0x0102, 3, 4, 5).encode();
        let mut want = vec![0u8, 0];
        for v in [0x0102i64, 3, 4, 5] {
            want.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(bytes.to_vec(), want);
        let mut bad = bytes;
        bad[1] = 1;
        assert!(AbortedTxn::decode(&bad).is_err());
    }

    #[test]
    fn lazily_created_appended_truncated_reopened() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("00000000000000000100.txnindex");
        let mut idx = TxnIndex::open(&p, Offset(100)).unwrap();
        assert!(!p.exists(), "no file before the first abort");
        assert!(idx.truncate_to(Offset(0)).is_ok());
        let mut io = StdIo;
        idx.append(&mut io, &txn(1, 90, 110, 111)).unwrap();
        idx.append(&mut io, &txn(2, 105, 120, 121)).unwrap();
        idx.append(&mut io, &txn(1, 125, 130, 131)).unwrap();
        assert!(idx.append(&mut io, &txn(3, 125, 130, 131)).is_err());
        idx.flush(&mut io).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().len(), 3 * 34);
        let again = TxnIndex::open(&p, Offset(100)).unwrap();
        assert_eq!(again.entries(), idx.entries());
        again.sanity_check().unwrap();

        idx.truncate_to(Offset(120)).unwrap();
        assert_eq!(idx.entries(), &[txn(1, 90, 110, 111)]);
        assert_eq!(fs::metadata(&p).unwrap().len(), 34);
        // After a truncation, appends continue right after the kept entries.
        idx.append(&mut io, &txn(4, 112, 115, 116)).unwrap();
        assert_eq!(TxnIndex::open(&p, Offset(100)).unwrap().entries().len(), 2);

        let to = d.path().join("00000000000000000100.txnindex.deleted");
        idx.rename(&to).unwrap();
        assert!(!p.exists() && to.exists());
        assert!(idx.delete().unwrap());
        assert!(!to.exists());
    }

    #[test]
    fn collect_follows_kafka() {
        let d = tempfile::tempdir().unwrap();
        let mut idx = TxnIndex::open(&d.path().join("x.txnindex"), Offset(0)).unwrap();
        let mut io = StdIo;
        idx.append(&mut io, &txn(1, 0, 10, 5)).unwrap();
        idx.append(&mut io, &txn(2, 5, 20, 21)).unwrap();
        idx.append(&mut io, &txn(3, 22, 30, 31)).unwrap();
        // Entry 1 ends before the fetch offset; entry 2 is relevant and its LSO passes the bound.
        let (found, done) = idx.collect_aborted(Offset(15), Offset(21));
        assert_eq!(found, vec![txn(2, 5, 20, 21)]);
        assert!(done);
        let (found, done) = idx.collect_aborted(Offset(0), Offset(100));
        assert_eq!(found.len(), 3);
        assert!(!done);
        // First offset must be below the bound.
        let (found, _) = idx.collect_aborted(Offset(25), Offset(22));
        assert!(found.is_empty());
    }

    #[test]
    fn corrupt_files_and_sanity() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.txnindex");
        fs::write(&p, [0u8; 33]).unwrap();
        assert!(matches!(
            TxnIndex::open(&p, Offset(0)),
            Err(LogError::Corrupt { .. })
        ));
        let mut bad = txn(1, 1, 2, 3).encode();
        bad[0] = 9;
        fs::write(&p, bad).unwrap();
        assert!(matches!(
            TxnIndex::open(&p, Offset(0)),
            Err(LogError::Corrupt { .. })
        ));
        fs::write(&p, txn(1, 1, 2, 3).encode()).unwrap();
        let idx = TxnIndex::open(&p, Offset(5)).unwrap();
        assert!(matches!(idx.sanity_check(), Err(LogError::Corrupt { .. })));
    }

    proptest! {
        #[test]
        fn entries_round_trip(pid in any::<i64>(), first in any::<i64>(), last in any::<i64>(), lso in any::<i64>()) {
            let t = txn(pid, first, last, lso);
            prop_assert_eq!(AbortedTxn::decode(&t.encode()).unwrap(), t);
        }
    }
}
