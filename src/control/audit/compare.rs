//! Compares local batches with the source's for the same offsets: base and last offset,
//! partition leader epoch and CRC (the CRC covers attributes, timestamps, producer fields and
//! every record byte, so payloads need not be compared).

use serde::{Deserialize, Serialize};

use crate::control::audit::scrub::BatchId;
use crate::ids::{Offset, TimestampMs};

/// A local batch that differs from the source's at the same offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mismatch {
    pub local: BatchId,
    /// The source's batch at (or overlapping) those offsets.
    pub source: BatchId,
    pub why: String,
}

/// How far a comparison got.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Compared {
    /// The offset after the last local batch that matched its source batch.
    pub verified_next: Option<Offset>,
    /// Newest source timestamp among the matched batches.
    pub source_timestamp: Option<TimestampMs>,
    pub matched: usize,
    pub mismatch: Option<Mismatch>,
}

/// Walks `local` in order against `source` (both sorted by offset, as logs and Fetch answers
/// are). Source batches below a local batch are offsets the local log skipped (the source's
/// retention passed kmirror while it was behind: an offset gap, kept on purpose); they are
/// passed over. The walk stops at the end of the source's answer.
pub fn compare(local: &[BatchId], source: &[BatchId]) -> Compared {
    let mut out = Compared::default();
    let mut j = 0;
    for l in local {
        while j < source.len() && source[j].last_offset < l.base_offset {
            j += 1;
        }
        let Some(s) = source.get(j) else {
            break;
        };
        let mut why = Vec::new();
        if s.base_offset != l.base_offset || s.last_offset != l.last_offset {
            why.push(format!(
                "offsets {}..={} at the source, {}..={} here",
                s.base_offset, s.last_offset, l.base_offset, l.last_offset
            ));
        }
        if s.leader_epoch != l.leader_epoch {
            why.push(format!(
                "leader epoch {} at the source, {} here",
                s.leader_epoch, l.leader_epoch
            ));
        }
        if s.crc != l.crc {
            why.push(format!(
                "CRC {:#010x} at the source, {:#010x} here",
                s.crc, l.crc
            ));
        }
        if !why.is_empty() && s.leader_epoch > l.leader_epoch {
            // What the fetcher's divergence rules (DivergingEpoch, OffsetForLeaderEpoch) also
            // stop on: the source truncated and rewrote these offsets under a newer leader.
            why.push(
                "the source rewrote these offsets at a newer leader epoch (unclean leader \
                 election or truncation on the source)"
                    .into(),
            );
        }
        if !why.is_empty() {
            out.mismatch = Some(Mismatch {
                local: *l,
                source: *s,
                why: why.join("; "),
            });
            break;
        }
        out.matched += 1;
        out.verified_next = Some(Offset(l.last_offset + 1));
        let ts = TimestampMs(s.max_timestamp_ms);
        out.source_timestamp = Some(out.source_timestamp.map_or(ts, |t| t.max(ts)));
        j += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(base: i64, last: i64, epoch: i32, crc: u32) -> BatchId {
        BatchId {
            base_offset: base,
            last_offset: last,
            leader_epoch: epoch,
            crc,
            max_timestamp_ms: 1000 + last,
        }
    }

    #[test]
    fn equal_batches_verify_through_the_last_one() {
        let l = [b(0, 4, 1, 7), b(5, 9, 1, 8)];
        let c = compare(&l, &l);
        assert_eq!(c.verified_next, Some(Offset(10)));
        assert_eq!(c.source_timestamp, Some(TimestampMs(1009)));
        assert_eq!((c.matched, c.mismatch), (2, None));
    }

    #[test]
    fn a_shorter_source_answer_verifies_a_prefix() {
        let c = compare(&[b(0, 4, 1, 7), b(5, 9, 1, 8)], &[b(0, 4, 1, 7)]);
        assert_eq!(c.verified_next, Some(Offset(5)));
        assert!(c.mismatch.is_none());
    }

    #[test]
    fn a_local_offset_gap_passes_over_the_source_batches_in_it() {
        let c = compare(
            &[b(0, 4, 1, 7), b(20, 24, 1, 9)],
            &[b(0, 4, 1, 7), b(5, 19, 1, 1), b(20, 24, 1, 9)],
        );
        assert_eq!(c.verified_next, Some(Offset(25)));
        assert!(c.mismatch.is_none());
    }

    #[test]
    fn crc_epoch_and_boundaries_each_make_a_mismatch_naming_both_sides() {
        let c = compare(
            &[b(0, 4, 1, 7), b(5, 9, 1, 8)],
            &[b(0, 4, 1, 7), b(5, 9, 1, 3)],
        );
        let m = c.mismatch.unwrap();
        assert_eq!(c.verified_next, Some(Offset(5)));
        assert_eq!((m.local.crc, m.source.crc), (8, 3));
        assert!(
            m.why
                .contains("CRC 0x00000003 at the source, 0x00000008 here"),
            "{}",
            m.why
        );
        let m = compare(&[b(0, 4, 2, 7)], &[b(0, 4, 1, 7)])
            .mismatch
            .unwrap();
        assert!(
            m.why.contains("leader epoch 1 at the source, 2 here"),
            "{}",
            m.why
        );
        let m = compare(&[b(0, 4, 1, 7)], &[b(0, 6, 1, 7)])
            .mismatch
            .unwrap();
        assert!(
            m.why.contains("offsets 0..=6 at the source, 0..=4 here"),
            "{}",
            m.why
        );
        assert_eq!(
            compare(&[b(0, 4, 1, 7)], &[b(0, 6, 1, 7)]).verified_next,
            None
        );
    }
}
