//! "Verified through offset N (source timestamp T)" per partition, durable across restarts.
//!
//! N is exclusive, like a log end offset: every batch below N was re-read from the local
//! segments (CRC, offsets, index) and found identical (offsets, leader epoch, CRC) to the
//! source's batch at the same offsets. T is the newest source timestamp among those batches.
//!
//! Stored in `<data_dir>/kmirror-audit-verified`: a version line, then one line per partition
//! `<partition> <N> <T or -1> <topic>` (topic last: Kafka topic names hold no spaces),
//! rewritten atomically through the `LogIo` seam (`checkpoint::write_atomically_with`: temp
//! file, fdatasync, rename, directory fsync) after an audit round moved something.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ids::{Offset, TimestampMs, TopicPartition};
use crate::log::checkpoint::{read_small_file, write_atomically_with};
use crate::log::io::StdIo;
use crate::log::LogError;

pub const FILE_NAME: &str = "kmirror-audit-verified";
const VERSION: &str = "0";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub next: Offset,
    pub source_timestamp: Option<TimestampMs>,
}

#[derive(Debug)]
pub struct VerifiedStore {
    path: PathBuf,
    map: BTreeMap<TopicPartition, Verified>,
    dirty: bool,
}

impl VerifiedStore {
    pub fn open(data_dir: &Path) -> Result<VerifiedStore, LogError> {
        let path = data_dir.join(FILE_NAME);
        let map = match read_small_file(&path)? {
            None => BTreeMap::new(),
            Some(bytes) => parse(&path, &bytes)?,
        };
        Ok(VerifiedStore {
            path,
            map,
            dirty: false,
        })
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Verified> {
        self.map.get(tp).copied()
    }

    /// Moves `tp`'s mark; it never goes back (a lower `next` is ignored).
    pub fn advance(&mut self, tp: &TopicPartition, v: Verified) {
        let cur = self.map.get(tp).copied();
        if cur.is_some_and(|c| c.next >= v.next) {
            return;
        }
        let ts = match (cur.and_then(|c| c.source_timestamp), v.source_timestamp) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.map.insert(
            tp.clone(),
            Verified {
                next: v.next,
                source_timestamp: ts,
            },
        );
        self.dirty = true;
    }

    /// The log of `tp` was truncated to `end` (an unclean-election recovery): the mark comes
    /// down to it, and its source timestamp is forgotten (the batches that set it may be gone)
    /// until the next round finds it again.
    pub fn truncate(&mut self, tp: &TopicPartition, end: Offset) {
        if let Some(v) = self.map.get_mut(tp) {
            if v.next > end {
                *v = Verified {
                    next: end,
                    source_timestamp: None,
                };
                self.dirty = true;
            }
        }
    }

    /// Forgets partitions no mirror holds any more.
    pub fn retain(&mut self, keep: impl Fn(&TopicPartition) -> bool) {
        let before = self.map.len();
        self.map.retain(|tp, _| keep(tp));
        self.dirty |= self.map.len() != before;
    }

    /// Writes the file when something changed since the last write. A failed write keeps
    /// the marks in memory and is tried again after the next round.
    pub fn save(&mut self) -> Result<(), LogError> {
        if !self.dirty {
            return Ok(());
        }
        write_atomically_with(&mut StdIo, &self.path, self.render().as_bytes())?;
        self.dirty = false;
        Ok(())
    }

    fn render(&self) -> String {
        let mut out = format!("{VERSION}\n");
        for (tp, v) in &self.map {
            out.push_str(&format!(
                "{} {} {} {}\n",
                tp.partition,
                v.next.0,
                v.source_timestamp.map_or(-1, |t| t.0),
                tp.topic
            ));
        }
        out
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<BTreeMap<TopicPartition, Verified>, LogError> {
    let corrupt = |why: String| LogError::corrupt(path, why);
    let text = std::str::from_utf8(bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut lines = text.lines();
    if lines.next() != Some(VERSION) {
        return Err(corrupt(format!("expected version {VERSION}")));
    }
    let mut map = BTreeMap::new();
    for (i, line) in lines.enumerate() {
        let mut f = line.splitn(4, ' ');
        let (Some(p), Some(n), Some(t), Some(topic)) = (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(corrupt(format!("line {}: {line:?}", i + 2)));
        };
        let bad = |_| corrupt(format!("line {}: {line:?}", i + 2));
        let partition: i32 = p.parse().map_err(bad)?;
        let next: i64 = n.parse().map_err(bad)?;
        let ts: i64 = t.parse().map_err(bad)?;
        if next < 0 || partition < 0 || topic.is_empty() {
            return Err(corrupt(format!("line {}: {line:?}", i + 2)));
        }
        map.insert(
            TopicPartition::new(topic, partition),
            Verified {
                next: Offset(next),
                source_timestamp: (ts >= 0).then_some(TimestampMs(ts)),
            },
        );
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_a_reopen_and_never_go_back() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("orders", 3);
        let mut s = VerifiedStore::open(dir.path()).unwrap();
        assert_eq!(s.get(&tp), None);
        s.advance(
            &tp,
            Verified {
                next: Offset(10),
                source_timestamp: Some(TimestampMs(5)),
            },
        );
        s.advance(
            &tp,
            Verified {
                next: Offset(4),
                source_timestamp: Some(TimestampMs(9)),
            },
        );
        s.save().unwrap();
        let s = VerifiedStore::open(dir.path()).unwrap();
        assert_eq!(
            s.get(&tp),
            Some(Verified {
                next: Offset(10),
                source_timestamp: Some(TimestampMs(5))
            })
        );
        std::fs::write(dir.path().join(FILE_NAME), "0\nx 1 2 t\n").unwrap();
        assert!(VerifiedStore::open(dir.path()).is_err());
    }
    // Goal: only a truncation of the log brings a mark down, durably, and never up.
    #[test]
    fn a_truncated_log_brings_its_mark_down() {
        let dir = tempfile::tempdir().unwrap();
        let tp = TopicPartition::new("orders", 0);
        let mut s = VerifiedStore::open(dir.path()).unwrap();
        let v = |n| Verified {
            next: Offset(n),
            source_timestamp: Some(TimestampMs(7)),
        };
        s.advance(&tp, v(300));
        s.truncate(&tp, Offset(400));
        assert_eq!(s.get(&tp), Some(v(300)));
        s.truncate(&tp, Offset(200));
        s.save().unwrap();
        let s = VerifiedStore::open(dir.path()).unwrap();
        let after = Verified {
            next: Offset(200),
            source_timestamp: None,
        };
        assert_eq!(s.get(&tp), Some(after));
    }
}
