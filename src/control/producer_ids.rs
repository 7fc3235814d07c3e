//! Producer ids for producers writing to kmirror after failover (InitProducerId).
//!
//! Ids must never collide with producer ids in the mirrored data, and never repeat across
//! restarts (a producer may hold an id it has not written with yet). So ids start above both a
//! floor far beyond what a Kafka cluster hands out (Kafka allocates blocks of 1,000 upwards
//! from 0) and the largest id any local partition holds, and they are handed out from blocks
//! whose end is made durable before the first id of the block is used, as Kafka's controller
//! does with its producer-id blocks. A restart continues after the last persisted block end,
//! so an id is lost at most, never reused.
//!
//! The block end lives in `<data_dir>/kmirror-producer-ids` (two text lines: format version,
//! block end), written atomically (temporary file, fsync, rename, directory fsync).

use std::path::{Path, PathBuf};

use crate::ids::ProducerId;
use crate::limits::{PRODUCER_ID_BLOCK_SIZE, PRODUCER_ID_FLOOR};
use crate::log::checkpoint::{read_small_file, write_atomically};
use crate::log::LogError;

pub const FILE_NAME: &str = "kmirror-producer-ids";
const VERSION: &str = "0";

#[derive(Debug)]
pub struct ProducerIdAllocator {
    path: PathBuf,
    next: i64,
    /// Ids below this (and at or above `next`) may be handed out without another write.
    block_end: i64,
}

impl ProducerIdAllocator {
    /// Opens the allocator of `data_dir`. `max_seen` is the largest producer id in any local
    /// partition (`PartitionLog::max_producer_id` over the log dir).
    pub fn open(data_dir: &Path, max_seen: Option<ProducerId>) -> Result<Self, LogError> {
        let path = data_dir.join(FILE_NAME);
        let stored = match read_small_file(&path)? {
            None => 0,
            Some(bytes) => parse(&path, &bytes)?,
        };
        let next = stored
            .max(PRODUCER_ID_FLOOR)
            .max(max_seen.map_or(0, |p| p.0.saturating_add(1)));
        Ok(ProducerIdAllocator {
            path,
            next,
            block_end: next,
        })
    }

    /// The next unused producer id; persists a new block first when the current one is used up.
    pub fn allocate(&mut self) -> Result<ProducerId, LogError> {
        if self.next >= self.block_end {
            let end = self
                .next
                .checked_add(PRODUCER_ID_BLOCK_SIZE)
                .ok_or_else(|| LogError::corrupt(&self.path, "producer ids exhausted"))?;
            write_atomically(&self.path, format!("{VERSION}\n{end}\n").as_bytes())?;
            self.block_end = end;
        }
        let id = ProducerId(self.next);
        self.next += 1;
        Ok(id)
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<i64, LogError> {
    let text = std::str::from_utf8(bytes).map_err(|_| LogError::corrupt(path, "not UTF-8"))?;
    let mut lines = text.lines();
    match (lines.next(), lines.next(), lines.next()) {
        (Some(VERSION), Some(end), None) => end
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|e| *e >= 0)
            .ok_or_else(|| LogError::corrupt(path, format!("bad block end {end:?}"))),
        (Some(v), _, _) if v != VERSION => {
            Err(LogError::corrupt(path, format!("unknown version {v:?}")))
        }
        _ => Err(LogError::corrupt(
            path,
            "expected two lines: version, block end",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_start_above_the_floor_and_every_mirrored_id() {
        let d = tempfile::tempdir().unwrap();
        let mut a = ProducerIdAllocator::open(d.path(), None).unwrap();
        assert_eq!(a.allocate().unwrap(), ProducerId(PRODUCER_ID_FLOOR));
        assert_eq!(a.allocate().unwrap(), ProducerId(PRODUCER_ID_FLOOR + 1));

        let d = tempfile::tempdir().unwrap();
        let seen = ProducerId(PRODUCER_ID_FLOOR + 5_000);
        let mut a = ProducerIdAllocator::open(d.path(), Some(seen)).unwrap();
        assert_eq!(a.allocate().unwrap(), ProducerId(seen.0 + 1));
    }

    #[test]
    fn a_restart_never_hands_out_an_id_again() {
        let d = tempfile::tempdir().unwrap();
        let mut a = ProducerIdAllocator::open(d.path(), None).unwrap();
        let before: Vec<i64> = (0..3).map(|_| a.allocate().unwrap().0).collect();
        drop(a); // crash: ids of the block that were never used are skipped, not reused
        let mut b = ProducerIdAllocator::open(d.path(), None).unwrap();
        let after = b.allocate().unwrap().0;
        assert_eq!(after, PRODUCER_ID_FLOOR + PRODUCER_ID_BLOCK_SIZE);
        assert!(before.iter().all(|id| *id < after));
        // Crossing a block boundary persists the next block before handing out its first id.
        for _ in 1..PRODUCER_ID_BLOCK_SIZE {
            b.allocate().unwrap();
        }
        let crossing = b.allocate().unwrap().0;
        let c = ProducerIdAllocator::open(d.path(), None).unwrap();
        assert!(c.next > crossing, "{} <= {crossing}", c.next);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        for bad in ["", "0\n", "0\n-5\n", "7\n100\n", "0\nabc\n", "0\n1\n2\n"] {
            std::fs::write(d.path().join(FILE_NAME), bad).unwrap();
            let err = ProducerIdAllocator::open(d.path(), None).unwrap_err();
            assert!(err.to_string().contains(FILE_NAME), "{bad:?}: {err}");
        }
    }
}
