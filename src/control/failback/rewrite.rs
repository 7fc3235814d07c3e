//! A kmirror batch made ready for the original's Produce without opening it: the header fields
//! a producer owns are set (base offset 0, partition leader epoch -1 for the broker to stamp,
//! the failback's producer id, epoch and base sequence) and the CRC-32C recomputed. Records,
//! compression, timestamps, headers and attributes stay as they are (a transactional batch
//! stays transactional: it is produced in the replayed transaction, `txn_replay`).

use crate::ids::ProducerId;
use crate::wire::batch::{crc32c, Batch};

const OFF_BASE_OFFSET: usize = 0;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
/// The v2 header up to and including the records count.
const V2_HEADER_BYTES: usize = 61;

/// Why a kmirror batch is not copied as data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error("batch at offset {0} is in a legacy message format (magic {1}); failback copies v2 batches only")]
    Legacy(i64, i8),
}

/// The producer a rewritten batch is stamped with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub producer_id: ProducerId,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

/// `batch` (a validated data batch read from kmirror's log) as the bytes to produce.
pub fn for_produce(batch: &Batch<'_>, stamp: Stamp) -> Result<Vec<u8>, RewriteError> {
    let base = batch.base_offset().0;
    if batch.magic() != 2 {
        return Err(RewriteError::Legacy(base, batch.magic()));
    }
    assert!(
        !batch.is_control(),
        "control batches are skipped, not copied"
    );
    let mut out = batch.bytes().to_vec();
    assert!(out.len() >= V2_HEADER_BYTES, "a v2 batch holds its header");
    out[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&0i64.to_be_bytes());
    out[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&(-1i32).to_be_bytes());
    out[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&stamp.producer_id.0.to_be_bytes());
    out[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2]
        .copy_from_slice(&stamp.producer_epoch.to_be_bytes());
    out[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4]
        .copy_from_slice(&stamp.base_sequence.to_be_bytes());
    let crc = crc32c(&out[OFF_ATTRIBUTES..]);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// The next base sequence after a batch of `records` records (Kafka wraps at i32::MAX).
pub fn next_sequence(base: i32, records: i32) -> i32 {
    let next = i64::from(base) + i64::from(records);
    (next % (i64::from(i32::MAX) + 1)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LeaderEpoch, Offset, TimestampMs};
    use crate::wire::batch::Peek;
    use crate::wire::batch_builder::BatchBuilder;
    use crate::wire::records::records;

    #[test]
    fn header_is_restamped_records_kept_and_crc_valid() {
        let original = BatchBuilder::new(Offset(500))
            .leader_epoch(LeaderEpoch(9))
            .producer(ProducerId(1 << 40), 3, 17)
            .record(
                TimestampMs(1_000),
                Some(b"k1".as_slice()),
                Some(b"v1".as_slice()),
                &[("h", Some(b"x".as_slice()))],
            )
            .record(
                TimestampMs(1_005),
                Some(b"k2".as_slice()),
                Some(b"v2".as_slice()),
                &[],
            )
            .build();
        let Peek::Complete(b) = Batch::peek(&original).unwrap() else {
            panic!("whole batch")
        };
        let stamp = Stamp {
            producer_id: ProducerId(77),
            producer_epoch: 0,
            base_sequence: 40,
        };
        let out = for_produce(&b, stamp).unwrap();
        let Peek::Complete(r) = Batch::peek(&out).unwrap() else {
            panic!("whole batch")
        };
        r.validate().expect("the recomputed CRC is right");
        assert_eq!(r.base_offset(), Offset(0));
        assert_eq!(r.partition_leader_epoch(), LeaderEpoch(-1));
        assert_eq!(r.producer_id(), ProducerId(77));
        assert_eq!(r.base_sequence(), 40);
        assert_eq!(r.last_offset_delta(), 1);
        assert_eq!(r.max_timestamp(), TimestampMs(1_005));
        // Everything after the producer fields is the same bytes.
        assert_eq!(out[V2_HEADER_BYTES..], original[V2_HEADER_BYTES..]);
        let recs = records(&r).unwrap();
        assert_eq!(recs.len(), 2);
    }

    #[test]
    fn transactional_batches_stay_transactional() {
        let txn = BatchBuilder::new(Offset(3))
            .producer(ProducerId(5), 0, 0)
            .transactional(true)
            .value(TimestampMs(1), b"v")
            .build();
        let Peek::Complete(b) = Batch::peek(&txn).unwrap() else {
            panic!("whole batch")
        };
        let stamp = Stamp {
            producer_id: ProducerId(1),
            producer_epoch: 2,
            base_sequence: 9,
        };
        let out = for_produce(&b, stamp).unwrap();
        let Peek::Complete(r) = Batch::peek(&out).unwrap() else {
            panic!("whole batch")
        };
        r.validate().expect("the recomputed CRC is right");
        assert!(r.is_transactional() && !r.is_control());
        assert_eq!((r.producer_id(), r.producer_epoch()), (ProducerId(1), 2));
        assert_eq!(r.base_sequence(), 9);
    }

    #[test]
    fn sequences_wrap_like_kafkas() {
        assert_eq!(next_sequence(5, 3), 8);
        assert_eq!(next_sequence(i32::MAX, 1), 0);
        assert_eq!(next_sequence(i32::MAX - 1, 3), 1);
    }
}
