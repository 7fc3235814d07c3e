//! The highest leader epoch each mirrored partition's source leader was seen at.
//!
//! A source leader can move (a broker restart, a reassignment) without writing a record, so
//! the last epoch in the mirrored data can be below the source's current leader epoch. At
//! failover kmirror must lead at an epoch above both (KIP-1279: a consumer that read from the
//! source, or committed there, must never see kmirror's epoch go back), so the epoch the
//! fetcher was handed from the source's Metadata is kept here, and kept across restarts: a
//! failover usually happens because the source is gone, so a restarted kmirror cannot ask it.
//!
//! Stored in `<data_dir>/kmirror-source-epochs`: a version line, then one line per partition
//! `<partition> <epoch> <topic>` (topic last: Kafka topic names hold no spaces), rewritten
//! atomically (temporary file, fsync, rename, directory fsync) only when an epoch rises, which
//! happens once per source leader change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ids::{LeaderEpoch, TopicPartition};
use crate::log::checkpoint::{read_small_file, write_atomically};
use crate::log::LogError;

pub const FILE_NAME: &str = "kmirror-source-epochs";
const VERSION: &str = "0";

#[derive(Debug)]
pub struct SourceEpochs {
    path: PathBuf,
    seen: BTreeMap<TopicPartition, LeaderEpoch>,
    /// The last write failed: the file is behind `seen`.
    unsaved: bool,
    /// Writes of the file so far (tests count them).
    writes: u64,
}

impl SourceEpochs {
    pub fn open(data_dir: &Path) -> Result<SourceEpochs, LogError> {
        let path = data_dir.join(FILE_NAME);
        let seen = match read_small_file(&path)? {
            None => BTreeMap::new(),
            Some(bytes) => parse(&path, &bytes)?,
        };
        Ok(SourceEpochs {
            path,
            seen,
            unsaved: false,
            writes: 0,
        })
    }

    /// The highest source leader epoch seen for `tp`.
    pub fn get(&self, tp: &TopicPartition) -> Option<LeaderEpoch> {
        self.seen.get(tp).copied()
    }

    /// Records that the source led `tp` at `epoch`; persisted before returning when it is
    /// higher than what was known. An unknown epoch (`NONE`, old brokers) changes nothing.
    /// When the write fails the epoch is still kept in memory (a higher epoch is always safe)
    /// and the next call writes the file again.
    pub fn raise(&mut self, tp: &TopicPartition, epoch: LeaderEpoch) -> Result<(), LogError> {
        self.raise_all(std::iter::once((tp, epoch)))
    }

    /// [`raise`](Self::raise) for many partitions with one write of the file. The file holds
    /// every partition, so writing it once per partition made a start of N new partitions
    /// N fsyncs of an O(N) file on the control thread (10,000 partitions: minutes).
    pub fn raise_all<'a>(
        &mut self,
        seen: impl IntoIterator<Item = (&'a TopicPartition, LeaderEpoch)>,
    ) -> Result<(), LogError> {
        for (tp, epoch) in seen {
            if epoch.is_known() && self.get(tp).is_none_or(|e| e < epoch) {
                self.seen.insert(tp.clone(), epoch);
                self.unsaved = true;
            }
        }
        if !self.unsaved {
            return Ok(());
        }
        self.writes += 1;
        write_atomically(&self.path, self.render().as_bytes())?;
        self.unsaved = false;
        Ok(())
    }

    /// How many times the file was written since it was opened.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    fn render(&self) -> String {
        let mut out = format!("{VERSION}\n");
        for (tp, e) in &self.seen {
            out.push_str(&format!("{} {} {}\n", tp.partition, e.0, tp.topic));
        }
        out
    }
}

/// The epoch a partition is promoted to at failover: one above both the latest epoch in its
/// log and the highest epoch its source leader was seen at.
pub fn promoted_epoch(
    latest_local: Option<LeaderEpoch>,
    source: Option<LeaderEpoch>,
) -> LeaderEpoch {
    let highest = latest_local.max(source).map_or(-1, |e| e.0.max(-1));
    LeaderEpoch(highest + 1)
}

fn parse(path: &Path, bytes: &[u8]) -> Result<BTreeMap<TopicPartition, LeaderEpoch>, LogError> {
    let text = std::str::from_utf8(bytes).map_err(|_| LogError::corrupt(path, "not UTF-8"))?;
    let mut lines = text.lines();
    match lines.next() {
        Some(VERSION) => {}
        Some(v) => return Err(LogError::corrupt(path, format!("unknown version {v:?}"))),
        None => return Err(LogError::corrupt(path, "empty")),
    }
    let mut seen = BTreeMap::new();
    for line in lines {
        let mut fields = line.splitn(3, ' ');
        let parsed = match (fields.next(), fields.next(), fields.next()) {
            (Some(p), Some(e), Some(topic)) if !topic.is_empty() => {
                match (p.parse::<i32>(), e.parse::<i32>()) {
                    (Ok(p), Ok(e)) if p >= 0 && e >= 0 => Some((topic, p, e)),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some((topic, partition, epoch)) = parsed else {
            return Err(LogError::corrupt(path, format!("bad line {line:?}")));
        };
        seen.insert(
            TopicPartition::new(topic.to_string(), partition),
            LeaderEpoch(epoch),
        );
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(t: &str, p: i32) -> TopicPartition {
        TopicPartition::new(t.to_string(), p)
    }

    #[test]
    fn promoted_epoch_is_above_the_log_and_the_source() {
        // The source leader moved twice after its last record: the log says 0, the source 2.
        assert_eq!(
            promoted_epoch(Some(LeaderEpoch(0)), Some(LeaderEpoch(2))),
            LeaderEpoch(3)
        );
        assert_eq!(
            promoted_epoch(Some(LeaderEpoch(5)), Some(LeaderEpoch(2))),
            LeaderEpoch(6)
        );
        assert_eq!(promoted_epoch(Some(LeaderEpoch(4)), None), LeaderEpoch(5));
        assert_eq!(promoted_epoch(None, Some(LeaderEpoch(7))), LeaderEpoch(8));
        assert_eq!(promoted_epoch(None, None), LeaderEpoch(0));
    }

    #[test]
    fn epochs_only_rise_and_survive_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let mut s = SourceEpochs::open(d.path()).unwrap();
        assert_eq!(s.get(&tp("a", 0)), None);
        s.raise(&tp("a", 0), LeaderEpoch(3)).unwrap();
        s.raise(&tp("a", 0), LeaderEpoch(1)).unwrap();
        s.raise(&tp("a", 0), LeaderEpoch::NONE).unwrap();
        s.raise(&tp("b.c-d_e", 12), LeaderEpoch(0)).unwrap();
        drop(s);
        let s = SourceEpochs::open(d.path()).unwrap();
        assert_eq!(s.get(&tp("a", 0)), Some(LeaderEpoch(3)));
        assert_eq!(s.get(&tp("b.c-d_e", 12)), Some(LeaderEpoch(0)));
        assert_eq!(s.get(&tp("a", 1)), None);
    }

    #[test]
    fn raising_many_partitions_writes_the_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = SourceEpochs::open(dir.path()).unwrap();
        let tps: Vec<TopicPartition> = (0..2_000).map(|p| tp("t", p)).collect();
        e.raise_all(tps.iter().map(|t| (t, LeaderEpoch(3))))
            .unwrap();
        assert_eq!(e.writes(), 1);
        // Nothing higher: no write; one partition higher: one write.
        e.raise_all(tps.iter().map(|t| (t, LeaderEpoch(2))))
            .unwrap();
        assert_eq!(e.writes(), 1);
        e.raise_all([(&tps[7], LeaderEpoch(4)), (&tps[8], LeaderEpoch(1))])
            .unwrap();
        assert_eq!(e.writes(), 2);
        let back = SourceEpochs::open(dir.path()).unwrap();
        assert_eq!(back.get(&tps[0]), Some(LeaderEpoch(3)));
        assert_eq!(back.get(&tps[1_999]), Some(LeaderEpoch(3)));
        assert_eq!(back.get(&tps[7]), Some(LeaderEpoch(4)));
        assert_eq!(back.get(&tps[8]), Some(LeaderEpoch(3)));
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        for bad in [
            "",
            "9\n",
            "0\n1 2\n",
            "0\nx 2 t\n",
            "0\n1 -3 t\n",
            "0\n1 2 \n",
        ] {
            std::fs::write(d.path().join(FILE_NAME), bad).unwrap();
            let err = SourceEpochs::open(d.path()).unwrap_err();
            assert!(err.to_string().contains(FILE_NAME), "{bad:?}: {err}");
        }
    }
}
