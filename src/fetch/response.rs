//! Validation of the `records` of one partition in a Fetch response, in place.
//!
//! What the broker sends is checked batch by batch before any byte reaches the log: the CRC,
//! offsets that only go up and never overlap what we already hold, and leader epochs that never
//! go back. The result is one contiguous byte range of the response (zero copy) that the log can
//! append as is.
//!
//! Two things a broker legitimately sends are dropped (kafka-formats.md §6.3): a partial batch at
//! the end (the broker cuts at the byte limit), and batches that end before the fetch offset
//! (reads are batch-granular, so the first batch can start before the offset asked for).

use std::ops::Range;

use crate::ids::{LeaderEpoch, Offset, TimestampMs};
use crate::wire::batch::{BatchError, Batches};

/// Why a partition's records were rejected. Everything up to the rejected batch was valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    #[error("malformed or corrupt batch: {0}")]
    Batch(#[from] BatchError),
    #[error(
        "batch at offset {base_offset} overlaps offsets below {expected_from} we already hold"
    )]
    Overlap {
        base_offset: Offset,
        expected_from: Offset,
    },
    #[error("batch at offset {base_offset} has leader epoch {epoch}, below the epoch {previous} before it")]
    EpochRegression {
        base_offset: Offset,
        epoch: LeaderEpoch,
        previous: LeaderEpoch,
    },
}

impl RecordsError {
    /// Whether the fetcher refetches after a backoff: only bytes that may have been damaged in
    /// transit (CRC, framing). A header whose offsets overflow, or offsets and epochs that
    /// contradict our log, come back the same.
    pub fn may_heal_on_refetch(&self) -> bool {
        matches!(self, RecordsError::Batch(e) if e.may_heal_on_refetch())
    }

    /// Whether the partition, once stopped for this, may be started again automatically (a
    /// control-plane retry). A batch whose offsets cannot be represented is a hostile or broken
    /// source: like divergence, it needs an operator.
    pub fn retryable(&self) -> bool {
        !matches!(self, RecordsError::Batch(BatchError::OffsetOverflow { .. }))
    }
}

/// Where the batches we may append stand, before the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The offset we asked for.
    pub fetch_offset: Offset,
    /// The next offset our log can take: a batch starting below it would overlap local data.
    /// Normally equal to `fetch_offset`; lower right after the source's log start moved past us.
    pub log_end: Offset,
    /// Epoch of the last batch we hold (`NONE` when unknown).
    pub last_epoch: LeaderEpoch,
}

/// The validated part of a partition's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidRange {
    /// Byte range within the records blob: whole batches, back to back.
    pub bytes: Range<usize>,
    pub first_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: TimestampMs,
    /// Epoch of the last batch that carries one (`NONE` if none does, e.g. legacy data).
    pub last_epoch: LeaderEpoch,
    pub batches: u32,
}

/// What a records blob holds: a valid range (possibly empty), and why validation stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub valid: Option<ValidRange>,
    pub error: Option<RecordsError>,
    /// Bytes of a partial batch at the end (dropped).
    pub trailing_bytes: usize,
    /// Whole batches skipped because they end before the fetch offset.
    pub skipped_batches: u32,
}

/// Check every batch in `records` against `pos`. Never panics on any input.
pub fn check_records(records: &[u8], pos: Position) -> Checked {
    let mut checked = Checked {
        valid: None,
        error: None,
        trailing_bytes: 0,
        skipped_batches: 0,
    };
    let mut expected_from = pos.log_end;
    let mut epoch = pos.last_epoch;
    let mut batches = Batches::new(records);
    for item in batches.by_ref() {
        let (at, batch) = match item {
            Ok(found) => found,
            Err(e) => {
                checked.error = Some(e.into());
                break;
            }
        };
        if checked.valid.is_none() && batch.last_offset() < pos.fetch_offset {
            checked.skipped_batches += 1;
            continue;
        }
        if let Err(e) = batch.validate() {
            checked.error = Some(e.into());
            break;
        }
        if batch.base_offset() < expected_from {
            checked.error = Some(RecordsError::Overlap {
                base_offset: batch.base_offset(),
                expected_from,
            });
            break;
        }
        let batch_epoch = batch.partition_leader_epoch();
        if batch_epoch.is_known() {
            if epoch.is_known() && batch_epoch < epoch {
                checked.error = Some(RecordsError::EpochRegression {
                    base_offset: batch.base_offset(),
                    epoch: batch_epoch,
                    previous: epoch,
                });
                break;
            }
            epoch = batch_epoch;
        }
        expected_from = batch.next_offset();
        let end = at + batch.size();
        match &mut checked.valid {
            None => {
                checked.valid = Some(ValidRange {
                    bytes: at..end,
                    first_offset: batch.base_offset(),
                    last_offset: batch.last_offset(),
                    max_timestamp: batch.max_timestamp(),
                    last_epoch: batch_epoch,
                    batches: 1,
                })
            }
            Some(v) => {
                v.bytes.end = end;
                v.last_offset = batch.last_offset();
                v.max_timestamp = v.max_timestamp.max(batch.max_timestamp());
                if batch_epoch.is_known() {
                    v.last_epoch = batch_epoch;
                }
                v.batches += 1;
            }
        }
    }
    if checked.error.is_none() {
        checked.trailing_bytes = batches.trailing_bytes();
    }
    checked
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal uncompressed v2 batch with `count` offsets, built by hand (not by our log code)
    /// so the test does not agree with itself: fields at the offsets of kafka-formats.md §1.1.
    fn batch(base: i64, count: i32, epoch: i32, max_ts: i64) -> Vec<u8> {
        let mut records = Vec::new();
        for delta in 0..count {
            // length, attributes, timestampDelta, offsetDelta, key -1, value len 1 'x', headers 0
            let body = [0u8, 0, (delta as u8) << 1, 1, 2, b'x', 0];
            records.push(body.len() as u8 * 2);
            records.extend_from_slice(&body);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&base.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes()); // length, patched below
        b.extend_from_slice(&epoch.to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes()); // crc, patched below
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(count - 1).to_be_bytes());
        b.extend_from_slice(&max_ts.to_be_bytes());
        b.extend_from_slice(&max_ts.to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(&records);
        let len = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn pos(fetch: i64, log_end: i64, epoch: i32) -> Position {
        Position {
            fetch_offset: Offset(fetch),
            log_end: Offset(log_end),
            last_epoch: LeaderEpoch(epoch),
        }
    }

    #[test]
    fn contiguous_batches_form_one_range() {
        let blob = [batch(10, 3, 1, 5), batch(13, 2, 2, 9), batch(15, 1, 2, 7)].concat();
        let c = check_records(&blob, pos(10, 10, 1));
        let v = c.valid.unwrap();
        assert_eq!(v.bytes, 0..blob.len());
        assert_eq!((v.first_offset, v.last_offset), (Offset(10), Offset(15)));
        assert_eq!(
            (v.max_timestamp, v.last_epoch, v.batches),
            (TimestampMs(9), LeaderEpoch(2), 3)
        );
        assert_eq!((c.error, c.trailing_bytes), (None, 0));
    }

    // Goal: the broker's batch-granular read and byte cut are tolerated: a batch ending before
    // the fetch offset is skipped, a partial batch at the end is dropped.
    #[test]
    fn skips_batches_below_fetch_offset_and_drops_partial_tail() {
        let first = batch(0, 5, 0, 1);
        let second = batch(5, 5, 0, 1);
        let third = batch(10, 5, 0, 1);
        let blob = [&first[..], &second[..], &third[..third.len() - 3]].concat();
        let c = check_records(&blob, pos(5, 5, 0));
        let v = c.valid.unwrap();
        assert_eq!(v.bytes, first.len()..first.len() + second.len());
        assert_eq!((v.first_offset, v.last_offset), (Offset(5), Offset(9)));
        assert_eq!((c.skipped_batches, c.trailing_bytes), (1, third.len() - 3));
        assert_eq!(c.error, None);
    }

    // Goal: a batch that contains the fetch offset but starts below our log end would overlap
    // data we hold (the source's batch boundaries changed): rejected. With an empty local log
    // (log_end below it), the same batch is accepted, as Kafka does after a mid-batch log start.
    #[test]
    fn straddling_batch_only_after_log_start_moved() {
        let blob = batch(0, 10, 0, 1);
        let c = check_records(&blob, pos(4, 4, 0));
        assert!(c.valid.is_none());
        assert_eq!(
            c.error,
            Some(RecordsError::Overlap {
                base_offset: Offset(0),
                expected_from: Offset(4)
            })
        );
        let c = check_records(&blob, pos(4, 0, -1));
        assert_eq!(c.valid.unwrap().first_offset, Offset(0));
    }

    #[test]
    fn flipped_byte_keeps_valid_prefix_and_reports_crc() {
        let a = batch(0, 2, 0, 1);
        let b = batch(2, 2, 0, 1);
        let mut blob = [a.clone(), b].concat();
        let last = blob.len() - 1;
        blob[last] ^= 0x40;
        let c = check_records(&blob, pos(0, 0, -1));
        assert_eq!(c.valid.unwrap().bytes, 0..a.len());
        assert!(matches!(
            c.error,
            Some(RecordsError::Batch(BatchError::CrcMismatch {
                base_offset: 2,
                ..
            }))
        ));
    }

    #[test]
    fn epoch_going_back_is_rejected() {
        let blob = [batch(0, 1, 3, 1), batch(1, 1, 2, 1)].concat();
        let c = check_records(&blob, pos(0, 0, -1));
        assert_eq!(c.valid.unwrap().batches, 1);
        assert!(matches!(
            c.error,
            Some(RecordsError::EpochRegression { .. })
        ));
        let c = check_records(&batch(0, 1, 1, 1), pos(0, 0, 2));
        assert!(matches!(
            c.error,
            Some(RecordsError::EpochRegression { .. })
        ));
    }

    #[test]
    fn offsets_going_back_are_rejected() {
        let blob = [batch(5, 2, 0, 1), batch(6, 2, 0, 1)].concat();
        let c = check_records(&blob, pos(5, 5, 0));
        assert!(matches!(c.error, Some(RecordsError::Overlap { .. })));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let c = check_records(&[0xff; 40], pos(0, 0, -1));
        assert!(c.valid.is_none() && c.error.is_some());
        let c = check_records(&[], pos(0, 0, -1));
        assert_eq!((c.valid, c.error, c.trailing_bytes), (None, None, 0));
    }

    // Structure-aware properties (valid-CRC batches with hostile headers, checked against an
    // oracle) are in tests/hostile_source.rs; the fuzz target `batch_validation` covers the rest.
    #[test]
    fn offset_overflow_stops_without_refetch() {
        let mut blob = batch(5, 1, 0, 1);
        blob[..8].copy_from_slice(&(crate::limits::OFFSET_MAX - 1).to_be_bytes());
        blob[23..27].copy_from_slice(&3i32.to_be_bytes());
        let crc = crc32c::crc32c(&blob[21..]);
        blob[17..21].copy_from_slice(&crc.to_be_bytes());
        let c = check_records(&[batch(0, 5, 0, 1), blob].concat(), pos(0, 0, -1));
        assert_eq!(c.valid.unwrap().last_offset, Offset(4));
        let e = c.error.unwrap();
        assert!(matches!(
            e,
            RecordsError::Batch(BatchError::OffsetOverflow { .. })
        ));
        assert!(!e.may_heal_on_refetch() && !e.retryable());
    }
}
