//! The exact offset map of one failed-back partition: which original offset each record copied
//! from kmirror got, as ranges (one per copied batch, merged when they continue each other).
//! Sans-IO; persisted by `store` after every acknowledged batch.
//!
//! Offsets below the failover point need no map: kmirror's log there is the original's, byte
//! for byte. Control batches on kmirror (the ABORT markers of the promotion, transaction
//! markers) are not copied, so their offsets have no original offset: a position there means
//! "the next record after it", which is the next mapped range's start.

use serde::{Deserialize, Serialize};

use crate::ids::Offset;

/// `count` consecutive kmirror offsets from `kmirror` are the original's offsets from `original`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedRange {
    pub kmirror: i64,
    pub original: i64,
    pub count: i64,
}

impl MappedRange {
    fn kmirror_end(&self) -> i64 {
        self.kmirror + self.count
    }
    fn original_end(&self) -> i64 {
        self.original + self.count
    }
}

/// A partition's map: the failover point, where the copy started on the original, the ranges
/// copied so far and how far kmirror's log was read (`next_kmirror`, a batch boundary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetMap {
    /// kmirror's recorded last mirrored end at failover: the first offset written on kmirror.
    pub failover_point: i64,
    /// The original's log end when the failback was created: where the first copied record
    /// lands (the divergent tail lies between the failover point and here).
    pub copy_base: i64,
    pub ranges: Vec<MappedRange>,
    /// The next kmirror offset to copy (every batch below it is copied or was a control batch).
    pub next_kmirror: i64,
    /// The next original offset when it is past the last range's end (a replayed transaction
    /// marker took the offsets between); absent in maps written before transactions replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_end: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("batch at kmirror offset {got} does not continue the copy at {expected}")]
    NotContiguous { expected: i64, got: i64 },
    #[error("the original placed kmirror offset {kmirror} at {got}, expected {expected}: another producer wrote to the original partition")]
    Misplaced {
        kmirror: i64,
        expected: i64,
        got: i64,
    },
}

impl OffsetMap {
    pub fn new(failover_point: Offset, copy_base: Offset) -> OffsetMap {
        OffsetMap {
            failover_point: failover_point.0,
            copy_base: copy_base.0,
            ranges: Vec::new(),
            next_kmirror: failover_point.0,
            original_end: None,
        }
    }

    /// The original offset the next copied record must get.
    pub fn next_original(&self) -> Offset {
        let ranges_end = self
            .ranges
            .last()
            .map_or(self.copy_base, MappedRange::original_end);
        Offset(self.original_end.map_or(ranges_end, |e| e.max(ranges_end)))
    }

    pub fn next_kmirror(&self) -> Offset {
        Offset(self.next_kmirror)
    }

    /// Records copied so far.
    pub fn copied_records(&self) -> i64 {
        self.ranges.iter().map(|r| r.count).sum()
    }

    /// A control batch `[base, next)` was read and not copied.
    pub fn skip(&mut self, base: Offset, next: Offset) -> Result<(), MapError> {
        self.check_at(base)?;
        assert!(next > base, "a batch covers at least one offset");
        self.next_kmirror = next.0;
        Ok(())
    }

    /// A data batch `[base, base + count)` was acknowledged by the original at `original`.
    pub fn copied(&mut self, base: Offset, count: i64, original: Offset) -> Result<(), MapError> {
        self.check_at(base)?;
        assert!(count > 0, "a data batch holds at least one offset");
        let expected = self.next_original();
        if original != expected {
            return Err(MapError::Misplaced {
                kmirror: base.0,
                expected: expected.0,
                got: original.0,
            });
        }
        match self.ranges.last_mut() {
            Some(last) if last.kmirror_end() == base.0 && last.original_end() == original.0 => {
                last.count += count
            }
            _ => self.ranges.push(MappedRange {
                kmirror: base.0,
                original: original.0,
                count,
            }),
        }
        self.next_kmirror = base.0 + count;
        self.original_end = None;
        Ok(())
    }

    /// kmirror's transaction marker `[base, next)` was replayed (EndTxn) and the original's
    /// marker took the original offset `at` (which must be the next one: we are its only writer).
    pub fn marker(&mut self, base: Offset, next: Offset, at: Offset) -> Result<(), MapError> {
        self.check_at(base)?;
        assert!(next > base, "a batch covers at least one offset");
        let expected = self.next_original();
        if at != expected {
            return Err(MapError::Misplaced {
                kmirror: base.0,
                expected: expected.0,
                got: at.0,
            });
        }
        self.next_kmirror = next.0;
        self.original_end = Some(at.0 + 1);
        Ok(())
    }

    fn check_at(&self, base: Offset) -> Result<(), MapError> {
        if base.0 != self.next_kmirror {
            return Err(MapError::NotContiguous {
                expected: self.next_kmirror,
                got: base.0,
            });
        }
        Ok(())
    }

    /// A consumer position on kmirror (the next offset it would read) as a position on the
    /// original: unchanged below the failover point (the same log there); otherwise the
    /// original offset of the first copied record at or after it. `None` when the position is
    /// past what was copied (the copy is behind it).
    pub fn translate(&self, position: Offset) -> Option<Offset> {
        let g = position.0;
        if g < self.failover_point {
            return Some(position);
        }
        if g > self.next_kmirror {
            return None;
        }
        for r in &self.ranges {
            if g < r.kmirror {
                return Some(Offset(r.original));
            }
            if g < r.kmirror_end() {
                return Some(Offset(r.original + (g - r.kmirror)));
            }
        }
        Some(self.next_original())
    }
}

/// What a session learns from the original's log end before producing again (the original
/// can hold at most one batch more than the map: one is in flight per partition, and its
/// record is persisted before the next is sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// The map and the original agree.
    InStep,
    /// The original holds exactly kmirror's next data batch past the map: it was acknowledged
    /// (or appended) and its record was lost; record it at the map's next offset, do not send.
    AppendedUnrecorded,
    /// The original ends below the map: it lost acknowledged records.
    Lost,
    /// The original holds other offsets past the map: another producer wrote to it.
    Foreign,
}

/// Compares the original's log `end` with the map's `expected` next offset, given the original
/// offsets kmirror's next item takes (a data batch: its record offsets; a transaction marker
/// we replay: 1; `None` when there is none).
pub fn reconcile(expected: Offset, end: Offset, next_batch: Option<i64>) -> Reconciled {
    if end == expected {
        Reconciled::InStep
    } else if end < expected {
        Reconciled::Lost
    } else if next_batch == Some(end.0 - expected.0) {
        Reconciled::AppendedUnrecorded
    } else {
        Reconciled::Foreign
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> OffsetMap {
        // Failover at 100; the original held 7 more (the divergent tail); the promotion wrote
        // one ABORT marker at 100; then two client batches of 5 and 3, another marker, 4 more.
        let mut m = OffsetMap::new(Offset(100), Offset(107));
        m.skip(Offset(100), Offset(101)).unwrap();
        m.copied(Offset(101), 5, Offset(107)).unwrap();
        m.copied(Offset(106), 3, Offset(112)).unwrap();
        m.skip(Offset(109), Offset(110)).unwrap();
        m.copied(Offset(110), 4, Offset(115)).unwrap();
        m
    }

    #[test]
    fn ranges_merge_and_positions_translate_exactly() {
        let m = map();
        assert_eq!(
            m.ranges,
            [
                MappedRange {
                    kmirror: 101,
                    original: 107,
                    count: 8
                },
                MappedRange {
                    kmirror: 110,
                    original: 115,
                    count: 4
                }
            ]
        );
        assert_eq!(m.next_original(), Offset(119));
        assert_eq!(m.copied_records(), 12);
        // Below the failover point: the same log.
        assert_eq!(m.translate(Offset(42)), Some(Offset(42)));
        // At the failover point and on the marker: the first copied record.
        assert_eq!(m.translate(Offset(100)), Some(Offset(107)));
        assert_eq!(m.translate(Offset(101)), Some(Offset(107)));
        assert_eq!(m.translate(Offset(104)), Some(Offset(110)));
        // The second marker: the record after it.
        assert_eq!(m.translate(Offset(109)), Some(Offset(115)));
        assert_eq!(m.translate(Offset(113)), Some(Offset(118)));
        // Everything read: the original's next offset.
        assert_eq!(m.translate(Offset(114)), Some(Offset(119)));
        // Not copied yet.
        assert_eq!(m.translate(Offset(115)), None);
    }

    #[test]
    fn gaps_and_misplaced_acks_are_refused() {
        let mut m = map();
        assert_eq!(
            m.copied(Offset(120), 1, Offset(119)),
            Err(MapError::NotContiguous {
                expected: 114,
                got: 120
            })
        );
        assert!(matches!(
            m.copied(Offset(114), 1, Offset(125)),
            Err(MapError::Misplaced { .. })
        ));
        // Nothing changed by the refusals.
        assert_eq!(m.next_kmirror(), Offset(114));
        assert_eq!(m.next_original(), Offset(119));
    }

    #[test]
    fn replayed_markers_take_an_original_offset_and_positions_on_them_move_to_the_next_record() {
        // Failover at 0, no tail. A transaction's 3 records at 0..3, its COMMIT marker at 3;
        // on the original the records land at 0..3 and its own marker at 3, then a plain batch
        // of 2 at kmirror 4 lands at 4; a second marker at kmirror 6 lands at 6.
        let mut m = OffsetMap::new(Offset(0), Offset(0));
        m.copied(Offset(0), 3, Offset(0)).unwrap();
        m.marker(Offset(3), Offset(4), Offset(3)).unwrap();
        assert_eq!(m.next_original(), Offset(4));
        // The next record is expected after the original's marker, not at the range's end.
        assert!(matches!(
            m.copied(Offset(4), 2, Offset(3)),
            Err(MapError::Misplaced { .. })
        ));
        m.copied(Offset(4), 2, Offset(4)).unwrap();
        // The two ranges do not merge: the original's marker lies between them.
        assert_eq!(m.ranges.len(), 2);
        assert_eq!(
            m.translate(Offset(3)),
            Some(Offset(4)),
            "on the marker: next record"
        );
        assert_eq!(m.translate(Offset(5)), Some(Offset(5)));
        m.marker(Offset(6), Offset(7), Offset(6)).unwrap();
        // A group committed at the last marker (it read everything before it) moves past the
        // original's marker too: the next data offset.
        assert_eq!(m.translate(Offset(6)), Some(Offset(7)));
        assert_eq!(m.translate(Offset(7)), Some(Offset(7)));
        // A marker that landed elsewhere means another writer: refused, nothing changed.
        let before = m.clone();
        assert!(m.marker(Offset(7), Offset(8), Offset(9)).is_err());
        assert_eq!(m, before);
        // An old file without `original_end` reads as before.
        let old: OffsetMap = serde_json::from_str(
            r#"{"failover_point":5,"copy_base":7,"ranges":[{"kmirror":5,"original":7,"count":2}],"next_kmirror":7}"#,
        )
        .unwrap();
        assert_eq!(old.next_original(), Offset(9));
    }

    #[test]
    fn the_log_end_after_a_crash_tells_what_the_original_holds() {
        let (o, next) = (Offset(200), Some(7));
        assert_eq!(reconcile(o, Offset(200), next), Reconciled::InStep);
        assert_eq!(
            reconcile(o, Offset(207), next),
            Reconciled::AppendedUnrecorded
        );
        assert_eq!(reconcile(o, Offset(199), next), Reconciled::Lost);
        // More or fewer than the next batch, or nothing left on kmirror: not ours.
        assert_eq!(reconcile(o, Offset(208), next), Reconciled::Foreign);
        assert_eq!(reconcile(o, Offset(203), next), Reconciled::Foreign);
        assert_eq!(reconcile(o, Offset(201), None), Reconciled::Foreign);
    }
}
