//! A zero-copy view of one record batch as it sits in a byte buffer, in any of Kafka's formats:
//! magic 2 record batches and the legacy magic 0/1 message sets.
//!
//! kmirror never decompresses or re-encodes a batch. It only needs the header fields (offsets,
//! epoch, producer, attributes, timestamps) and to prove the bytes intact (CRC-32C for v2,
//! CRC-32 for legacy). Everything from the wire is untrusted: every length is checked before use
//! and a malformed header is a typed error, never a panic.
//!
//! Layouts: ../shared/reference/kafka-formats.md §1 (v2 header, attributes) and §1.5 (legacy).

use crate::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs};
use crate::limits::{BATCH_BYTES_MAX, LOG_OVERHEAD, OFFSET_MAX, RECORD_BATCH_V2_HEADER_BYTES};

/// Why a batch was rejected. Each variant names what was wrong so operators can act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("batch at offset {base_offset}: declared size {size} is below the minimum {min}")]
    TooSmall {
        base_offset: i64,
        size: i64,
        min: usize,
    },
    #[error("batch at offset {base_offset}: declared size {size} exceeds the limit {max}")]
    TooLarge {
        base_offset: i64,
        size: i64,
        max: usize,
    },
    #[error("batch at offset {base_offset}: unknown magic {magic}")]
    UnknownMagic { base_offset: i64, magic: i8 },
    #[error("batch at offset {base_offset}: CRC mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    CrcMismatch {
        base_offset: i64,
        stored: u32,
        computed: u32,
    },
    #[error("batch at offset {base_offset}: negative lastOffsetDelta {delta}")]
    NegativeLastOffsetDelta { base_offset: i64, delta: i32 },
    #[error("batch at offset {base_offset}: negative base offset")]
    NegativeOffset { base_offset: i64 },
    #[error("batch at offset {base_offset}: record count {count} inconsistent with lastOffsetDelta {delta}")]
    BadRecordCount {
        base_offset: i64,
        count: i32,
        delta: i32,
    },
    #[error("batch at offset {base_offset}: control batch is not transactional or holds {count} records")]
    BadControlBatch { base_offset: i64, count: i32 },
    /// The batch's offsets cannot all be represented: base offset + lastOffsetDelta (or the
    /// offset after it) passes `OFFSET_MAX`. No real log gets there; only a hostile or corrupt
    /// header does, and accepting it would wrap the log end.
    #[error("batch at offset {base_offset}: lastOffsetDelta {delta} takes its offsets past {max}")]
    OffsetOverflow {
        base_offset: i64,
        delta: i32,
        max: i64,
    },
}

impl BatchError {
    /// Whether refetching the same offsets may give a good batch: a CRC or framing fault can be
    /// a bit flipped in transit; offsets that overflow are a contradiction in the header itself,
    /// and the source will send the same header again.
    pub fn may_heal_on_refetch(&self) -> bool {
        !matches!(self, BatchError::OffsetOverflow { .. })
    }
}

/// Compression codec from the low three attribute bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
    /// Codec ids 5..7 are not assigned by Kafka; kept so that `dump` can show them.
    Unknown(u8),
}

impl Codec {
    pub fn from_attributes(attributes: i16) -> Codec {
        match attributes & 0x07 {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            other => Codec::Unknown(other as u8),
        }
    }

    /// The name Kafka's tools print (`compresscodec: LZ4`).
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "NONE",
            Codec::Gzip => "GZIP",
            Codec::Snappy => "SNAPPY",
            Codec::Lz4 => "LZ4",
            Codec::Zstd => "ZSTD",
            Codec::Unknown(_) => "UNKNOWN",
        }
    }
}

/// Type of a control record (the key of the single record in a control batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlType {
    Abort,
    Commit,
    Other(i16),
}

const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
const ATTR_DELETE_HORIZON: i16 = 0x40;

// Byte offsets of the v2 header fields, each derived from the previous field and its size.
const OFF_BASE_OFFSET: usize = 0;
const OFF_LENGTH: usize = OFF_BASE_OFFSET + 8;
const OFF_LEADER_EPOCH: usize = OFF_LENGTH + 4;
const OFF_MAGIC: usize = OFF_LEADER_EPOCH + 4;
const OFF_CRC: usize = OFF_MAGIC + 1;
const OFF_ATTRIBUTES: usize = OFF_CRC + 4;
const OFF_LAST_OFFSET_DELTA: usize = OFF_ATTRIBUTES + 2;
const OFF_BASE_TIMESTAMP: usize = OFF_LAST_OFFSET_DELTA + 4;
const OFF_MAX_TIMESTAMP: usize = OFF_BASE_TIMESTAMP + 8;
const OFF_PRODUCER_ID: usize = OFF_MAX_TIMESTAMP + 8;
const OFF_PRODUCER_EPOCH: usize = OFF_PRODUCER_ID + 8;
const OFF_BASE_SEQUENCE: usize = OFF_PRODUCER_EPOCH + 2;
const OFF_RECORDS_COUNT: usize = OFF_BASE_SEQUENCE + 4;
const _: () = assert!(OFF_RECORDS_COUNT + 4 == RECORD_BATCH_V2_HEADER_BYTES);

// Legacy (magic 0/1) message layout after the 12-byte log overhead.
const LEGACY_OFF_CRC: usize = LOG_OVERHEAD;
const LEGACY_OFF_MAGIC: usize = LEGACY_OFF_CRC + 4;
const LEGACY_OFF_ATTRIBUTES: usize = LEGACY_OFF_MAGIC + 1;
const LEGACY_OFF_TIMESTAMP: usize = LEGACY_OFF_ATTRIBUTES + 1;
/// crc + magic + attributes + key length + value length.
const LEGACY_V0_BODY_MIN: usize = 4 + 1 + 1 + 4 + 4;
/// v1 adds an 8-byte timestamp.
const LEGACY_V1_BODY_MIN: usize = LEGACY_V0_BODY_MIN + 8;

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

pub use crate::wire::crc32c::crc32c;

/// Moves a complete v2 batch's timestamps so that its maxTimestamp becomes `max_timestamp`
/// (baseTimestamp moves by the same amount, so the records' deltas stay right) and recomputes
/// its CRC, which covers both fields. For bench sources that stamp batches with the time they
/// were made available; the mirror path never rewrites a batch.
pub fn restamp_v2_timestamps(batch: &mut [u8], max_timestamp: TimestampMs) {
    assert!(
        batch.len() >= RECORD_BATCH_V2_HEADER_BYTES && batch[OFF_MAGIC] == 2,
        "restamp needs a whole v2 batch"
    );
    let shift = max_timestamp.0 - be_i64(batch, OFF_MAX_TIMESTAMP);
    let base = be_i64(batch, OFF_BASE_TIMESTAMP) + shift;
    batch[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8].copy_from_slice(&base.to_be_bytes());
    batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&max_timestamp.0.to_be_bytes());
    let crc = crc32c(&batch[OFF_ATTRIBUTES..]);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// One complete batch in a buffer: the header fields, and the bytes (`LOG_OVERHEAD` included).
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    bytes: &'a [u8],
}

/// The outcome of looking at the front of a buffer.
#[derive(Debug)]
pub enum Peek<'a> {
    /// A whole batch is present (its CRC not yet checked).
    Complete(Batch<'a>),
    /// The buffer ends inside a batch (normal at the end of a fetch response or a torn log tail).
    /// `needed` is the batch size when the header was readable.
    Incomplete { needed: Option<usize> },
}

impl<'a> Batch<'a> {
    /// Look at the batch at the start of `buf`: checks the declared size and the magic byte,
    /// nothing else. A buffer too short to hold the whole batch is `Incomplete`.
    pub fn peek(buf: &'a [u8]) -> Result<Peek<'a>, BatchError> {
        if buf.len() < LOG_OVERHEAD + 5 {
            return Ok(Peek::Incomplete { needed: None });
        }
        let base_offset = be_i64(buf, OFF_BASE_OFFSET);
        let length = be_i32(buf, OFF_LENGTH) as i64;
        let magic = buf[OFF_MAGIC] as i8;
        let body_min = match magic {
            2 => RECORD_BATCH_V2_HEADER_BYTES - LOG_OVERHEAD,
            1 => LEGACY_V1_BODY_MIN,
            0 => LEGACY_V0_BODY_MIN,
            _ => {
                // A magic byte is only meaningful once the length is plausible; report the
                // length problem first since a zeroed tail has length 0 and magic 0.
                if length < (LEGACY_V0_BODY_MIN as i64) {
                    return Err(BatchError::TooSmall {
                        base_offset,
                        size: length + LOG_OVERHEAD as i64,
                        min: LEGACY_V0_BODY_MIN + LOG_OVERHEAD,
                    });
                }
                return Err(BatchError::UnknownMagic { base_offset, magic });
            }
        };
        if length < body_min as i64 {
            return Err(BatchError::TooSmall {
                base_offset,
                size: length + LOG_OVERHEAD as i64,
                min: body_min + LOG_OVERHEAD,
            });
        }
        let total = length as usize + LOG_OVERHEAD;
        if total > BATCH_BYTES_MAX {
            return Err(BatchError::TooLarge {
                base_offset,
                size: total as i64,
                max: BATCH_BYTES_MAX,
            });
        }
        // Every accessor below computes base + lastOffsetDelta (+ 1) freely: a batch exists only
        // when those fit, so a hostile header is refused here, once.
        let delta = if magic != 2 {
            0
        } else if buf.len() >= OFF_LAST_OFFSET_DELTA + 4 {
            be_i32(buf, OFF_LAST_OFFSET_DELTA)
        } else {
            // total ≥ the v2 header, which holds the delta: the buffer is short.
            return Ok(Peek::Incomplete {
                needed: Some(total),
            });
        };
        if base_offset
            .checked_add(delta as i64)
            .is_none_or(|last| last > OFFSET_MAX)
        {
            return Err(BatchError::OffsetOverflow {
                base_offset,
                delta,
                max: OFFSET_MAX,
            });
        }
        if buf.len() < total {
            return Ok(Peek::Incomplete {
                needed: Some(total),
            });
        }
        Ok(Peek::Complete(Batch {
            bytes: &buf[..total],
        }))
    }

    /// Peek and fully validate (CRC and offset sanity) the batch at the start of `buf`.
    pub fn parse_valid(buf: &'a [u8]) -> Result<Option<Batch<'a>>, BatchError> {
        match Batch::peek(buf)? {
            Peek::Complete(batch) => {
                batch.validate()?;
                Ok(Some(batch))
            }
            Peek::Incomplete { .. } => Ok(None),
        }
    }

    /// All bytes of the batch, log overhead included: what gets written to the segment.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    pub fn magic(&self) -> i8 {
        self.bytes[OFF_MAGIC] as i8
    }

    pub fn is_legacy(&self) -> bool {
        self.magic() < 2
    }

    /// The offset field of the log entry: the first offset for v2, the (last) offset for legacy
    /// entries (a compressed legacy wrapper carries the offset of its last inner message).
    fn entry_offset(&self) -> i64 {
        be_i64(self.bytes, OFF_BASE_OFFSET)
    }

    /// First offset of the batch. For legacy entries the first offset is not stored in the
    /// wrapper, so this is the same as `last_offset` (Kafka treats it the same way).
    pub fn base_offset(&self) -> Offset {
        Offset(self.entry_offset())
    }

    pub fn last_offset_delta(&self) -> i32 {
        if self.is_legacy() {
            0
        } else {
            be_i32(self.bytes, OFF_LAST_OFFSET_DELTA)
        }
    }

    pub fn last_offset(&self) -> Offset {
        Offset(self.entry_offset() + self.last_offset_delta() as i64)
    }

    /// Next offset after this batch.
    pub fn next_offset(&self) -> Offset {
        self.last_offset().next()
    }

    pub fn partition_leader_epoch(&self) -> LeaderEpoch {
        if self.is_legacy() {
            LeaderEpoch::NONE
        } else {
            LeaderEpoch(be_i32(self.bytes, OFF_LEADER_EPOCH))
        }
    }

    pub fn stored_crc(&self) -> u32 {
        if self.is_legacy() {
            be_u32(self.bytes, LEGACY_OFF_CRC)
        } else {
            be_u32(self.bytes, OFF_CRC)
        }
    }

    /// The CRC computed over the bytes the format covers.
    pub fn computed_crc(&self) -> u32 {
        if self.is_legacy() {
            crc32fast::hash(&self.bytes[LEGACY_OFF_MAGIC..])
        } else {
            crc32c(&self.bytes[OFF_ATTRIBUTES..])
        }
    }

    pub fn attributes(&self) -> i16 {
        if self.is_legacy() {
            self.bytes[LEGACY_OFF_ATTRIBUTES] as i16
        } else {
            be_i16(self.bytes, OFF_ATTRIBUTES)
        }
    }

    pub fn codec(&self) -> Codec {
        Codec::from_attributes(self.attributes())
    }

    /// LOG_APPEND_TIME when set (only meaningful for v1 and v2).
    pub fn is_log_append_time(&self) -> bool {
        self.magic() > 0 && self.attributes() & ATTR_TIMESTAMP_TYPE != 0
    }

    pub fn is_transactional(&self) -> bool {
        !self.is_legacy() && self.attributes() & ATTR_TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        !self.is_legacy() && self.attributes() & ATTR_CONTROL != 0
    }

    pub fn has_delete_horizon(&self) -> bool {
        !self.is_legacy() && self.attributes() & ATTR_DELETE_HORIZON != 0
    }

    pub fn base_timestamp(&self) -> TimestampMs {
        match self.magic() {
            2 => TimestampMs(be_i64(self.bytes, OFF_BASE_TIMESTAMP)),
            1 => TimestampMs(be_i64(self.bytes, LEGACY_OFF_TIMESTAMP)),
            _ => TimestampMs::NONE,
        }
    }

    /// The largest record timestamp in the batch (for a legacy compressed wrapper, its
    /// timestamp, which Kafka sets to the max of its inner messages).
    pub fn max_timestamp(&self) -> TimestampMs {
        match self.magic() {
            2 => TimestampMs(be_i64(self.bytes, OFF_MAX_TIMESTAMP)),
            1 => TimestampMs(be_i64(self.bytes, LEGACY_OFF_TIMESTAMP)),
            _ => TimestampMs::NONE,
        }
    }

    pub fn producer_id(&self) -> ProducerId {
        if self.is_legacy() {
            ProducerId::NONE
        } else {
            ProducerId(be_i64(self.bytes, OFF_PRODUCER_ID))
        }
    }

    pub fn producer_epoch(&self) -> i16 {
        if self.is_legacy() {
            -1
        } else {
            be_i16(self.bytes, OFF_PRODUCER_EPOCH)
        }
    }

    pub fn base_sequence(&self) -> i32 {
        if self.is_legacy() {
            -1
        } else {
            be_i32(self.bytes, OFF_BASE_SEQUENCE)
        }
    }

    /// lastSequence = baseSequence + lastOffsetDelta, wrapping past i32::MAX to 0 as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        let base = self.base_sequence();
        if base < 0 {
            return -1;
        }
        let delta = self.last_offset_delta();
        let sum = base as i64 + delta as i64;
        if sum > i32::MAX as i64 {
            (sum - i32::MAX as i64 - 1) as i32
        } else {
            sum as i32
        }
    }

    /// Number of records (v2); legacy entries report 1 (a wrapper's inner count is compressed).
    pub fn records_count(&self) -> i32 {
        if self.is_legacy() {
            1
        } else {
            be_i32(self.bytes, OFF_RECORDS_COUNT)
        }
    }

    /// For a control batch, the type in its single record's key. `None` when the batch is not a
    /// control batch or the record cannot be read (control batches are never compressed).
    pub fn control_type(&self) -> Option<ControlType> {
        if !self.is_control() || self.codec() != Codec::None {
            return None;
        }
        let record = &self.bytes[RECORD_BATCH_V2_HEADER_BYTES..];
        let (_len, mut at) = read_varint(record, 0)?;
        at += 1; // record attributes
        let (_ts, n) = read_varint(record, at)?;
        at = n;
        let (_od, n) = read_varint(record, at)?;
        at = n;
        let (key_len, n) = read_varint(record, at)?;
        at = n;
        if key_len < 4 || record.len() < at + 4 {
            return None;
        }
        let ty = be_i16(record, at + 2);
        Some(match ty {
            0 => ControlType::Abort,
            1 => ControlType::Commit,
            other => ControlType::Other(other),
        })
    }

    /// For a COMMIT/ABORT control batch, the coordinator epoch in the record value.
    pub fn coordinator_epoch(&self) -> Option<i32> {
        self.control_type()?;
        let record = &self.bytes[RECORD_BATCH_V2_HEADER_BYTES..];
        let (_len, mut at) = read_varint(record, 0)?;
        at += 1;
        let (_, n) = read_varint(record, at)?;
        let (_, n) = read_varint(record, n)?;
        let (key_len, n) = read_varint(record, n)?;
        at = n + key_len.max(0) as usize;
        let (value_len, n) = read_varint(record, at)?;
        if value_len < 6 || record.len() < n + 6 {
            return None;
        }
        Some(be_i32(record, n + 2))
    }

    /// Check the CRC and the offset fields. Does not look inside compressed records.
    pub fn validate(&self) -> Result<(), BatchError> {
        let base_offset = self.entry_offset();
        if base_offset < 0 {
            return Err(BatchError::NegativeOffset { base_offset });
        }
        let stored = self.stored_crc();
        let computed = self.computed_crc();
        if stored != computed {
            return Err(BatchError::CrcMismatch {
                base_offset,
                stored,
                computed,
            });
        }
        if self.is_legacy() {
            return Ok(());
        }
        let delta = self.last_offset_delta();
        if delta < 0 {
            return Err(BatchError::NegativeLastOffsetDelta { base_offset, delta });
        }
        let count = self.records_count();
        // Compaction may leave fewer records than offsets (even zero), never more.
        if count < 0 || count as i64 > delta as i64 + 1 {
            return Err(BatchError::BadRecordCount {
                base_offset,
                count,
                delta,
            });
        }
        if self.is_control() && (!self.is_transactional() || count != 1) {
            return Err(BatchError::BadControlBatch { base_offset, count });
        }
        Ok(())
    }
}

/// Read a zigzag varint (as used inside v2 records) at `at`; returns (value, next position).
fn read_varint(buf: &[u8], mut at: usize) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *buf.get(at)?;
        at += 1;
        raw |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
    Some((((raw >> 1) as i64) ^ -((raw & 1) as i64), at))
}

/// Walks the batches of a records blob (a fetch response's `records`, or a `.log` file region).
///
/// Yields each complete batch; stops silently at a trailing partial batch (the broker cuts
/// responses at the byte limit) and reports it through `trailing_bytes`. A malformed header is
/// yielded as an error and ends the iteration, since nothing after it can be framed.
#[derive(Debug)]
pub struct Batches<'a> {
    buf: &'a [u8],
    pos: usize,
    failed: bool,
}

impl<'a> Batches<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Batches {
            buf,
            pos: 0,
            failed: false,
        }
    }

    /// Byte position of the next batch within the buffer.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left after the last complete batch (non-zero means a partial trailing batch).
    pub fn trailing_bytes(&self) -> usize {
        self.buf.len() - self.pos
    }
}

/// Whole record batches that every one passed `Batch::validate` (framing, offsets, CRC) when
/// they were received, so the log they are appended to in the same process need not compute
/// their CRCs a second time (the bytes are an immutable `Bytes`; nothing can change them in
/// between). Made only by the code that validated them; debug builds check the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedBatches(bytes::Bytes);

impl ValidatedBatches {
    /// `bytes` must be whole batches each of which passed `Batch::validate`.
    pub(crate) fn already_validated(bytes: bytes::Bytes) -> ValidatedBatches {
        debug_assert!(
            Batches::new(&bytes).all(|b| b.is_ok_and(|(_, b)| b.validate().is_ok())),
            "batches claimed validated fail validation"
        );
        ValidatedBatches(bytes)
    }
}

impl std::ops::Deref for ValidatedBatches {
    type Target = bytes::Bytes;

    fn deref(&self) -> &bytes::Bytes {
        &self.0
    }
}

impl<'a> Iterator for Batches<'a> {
    type Item = Result<(usize, Batch<'a>), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        match Batch::peek(&self.buf[self.pos..]) {
            Ok(Peek::Complete(batch)) => {
                let at = self.pos;
                self.pos += batch.size();
                Some(Ok((at, batch)))
            }
            Ok(Peek::Incomplete { .. }) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The batch view must never panic on hostile bytes, must frame exactly what it was given,
    //! and must notice any change to the bytes its CRC covers. Built batches come from
    //! `batch_builder`, whose output Kafka's DumpLogSegments accepts (tests/log_formats_kafka.rs).

    use super::*;
    use crate::wire::batch_builder::{control_batch, legacy_message, BatchBuilder, EndTxnMarker};
    use proptest::prelude::*;

    fn data_batch(base: i64, values: &[Vec<u8>]) -> Vec<u8> {
        let mut b = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(3));
        for (i, v) in values.iter().enumerate() {
            b = b.value(TimestampMs(1_700_000_000_000 + i as i64), v);
        }
        b.build()
    }

    #[test]
    fn crc32c_matches_the_reference_crate() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for len in [0, 1, 7, 64, 1000, 10_000] {
            assert_eq!(
                crc32c(&data[..len]),
                crc32c::crc32c(&data[..len]),
                "len {len}"
            );
        }
    }

    #[test]
    fn control_marker_reports_type_and_coordinator_epoch() {
        let bytes = control_batch(
            Offset(42),
            LeaderEpoch(5),
            ProducerId(7),
            2,
            EndTxnMarker::Abort,
            9,
            TimestampMs(1),
        );
        let batch = Batch::parse_valid(&bytes).unwrap().unwrap();
        assert!(batch.is_control() && batch.is_transactional());
        assert_eq!(batch.control_type(), Some(ControlType::Abort));
        assert_eq!(batch.coordinator_epoch(), Some(9));
        assert_eq!(batch.base_offset(), Offset(42));
        assert_eq!(batch.producer_id(), ProducerId(7));
    }

    #[test]
    fn legacy_entries_use_crc32_and_report_no_epoch() {
        for magic in [0i8, 1] {
            let bytes = legacy_message(magic, Offset(10), TimestampMs(5), Some(b"k"), Some(b"v"));
            let batch = Batch::parse_valid(&bytes).unwrap().unwrap();
            assert!(batch.is_legacy());
            assert_eq!(batch.last_offset(), Offset(10));
            assert_eq!(batch.partition_leader_epoch(), LeaderEpoch::NONE);
            let mut bad = bytes.clone();
            *bad.last_mut().unwrap() ^= 1;
            assert!(matches!(
                Batch::parse_valid(&bad),
                Err(BatchError::CrcMismatch {
                    base_offset: 10,
                    ..
                })
            ));
        }
    }

    #[test]
    fn zeroed_tail_is_too_small_not_unknown_magic() {
        let zeros = [0u8; 64];
        assert!(matches!(
            Batch::peek(&zeros),
            Err(BatchError::TooSmall { .. })
        ));
    }

    // Goal: offsets up to OFFSET_MAX are accepted, one past it (or a base so large that the
    // delta would wrap) is refused at framing with the offsets named, before any accessor adds.
    #[test]
    fn offsets_past_offset_max_are_refused_at_peek() {
        let edge = data_batch(OFFSET_MAX, &[b"v".to_vec()]);
        let batch = Batch::parse_valid(&edge).unwrap().unwrap();
        assert_eq!(batch.next_offset(), Offset(i64::MAX));
        let two = data_batch(OFFSET_MAX, &[b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(
            Batch::peek(&two).unwrap_err(),
            BatchError::OffsetOverflow {
                base_offset: OFFSET_MAX,
                delta: 1,
                max: OFFSET_MAX
            }
        );
        let mut wrap = data_batch(0, &[b"v".to_vec()]);
        wrap[..8].copy_from_slice(&i64::MAX.to_be_bytes());
        assert!(matches!(
            Batch::peek(&wrap),
            Err(BatchError::OffsetOverflow { .. })
        ));
        assert!(!Batch::peek(&wrap).unwrap_err().may_heal_on_refetch());
        let legacy = legacy_message(1, Offset(i64::MAX), TimestampMs(5), None, Some(b"v"));
        assert!(matches!(
            Batch::peek(&legacy),
            Err(BatchError::OffsetOverflow { delta: 0, .. })
        ));
    }

    // Hostile headers with valid CRCs are generated with their structure in
    // tests/hostile_source.rs (random bytes almost never pass the CRC) and fuzzed in fuzz/.
    proptest! {

        #[test]
        fn every_prefix_is_incomplete_and_the_whole_is_complete(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..6),
            base in 0i64..1_000_000,
        ) {
            let bytes = data_batch(base, &values);
            for cut in 0..bytes.len() {
                let incomplete = matches!(Batch::peek(&bytes[..cut]), Ok(Peek::Incomplete { .. }));
                prop_assert!(incomplete, "prefix of {} bytes was not incomplete", cut);
            }
            let batch = Batch::parse_valid(&bytes).unwrap().unwrap();
            prop_assert_eq!(batch.size(), bytes.len());
            prop_assert_eq!(batch.base_offset(), Offset(base));
            prop_assert_eq!(batch.last_offset(), Offset(base + values.len() as i64 - 1));
            prop_assert_eq!(batch.partition_leader_epoch(), LeaderEpoch(3));
        }

        #[test]
        fn any_flip_in_the_crc_range_is_detected(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 1..4),
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut bytes = data_batch(0, &values);
            // The CRC covers attributes through the end; offset, length, epoch and magic are
            // outside it by Kafka's design (so a follower may restamp them).
            let pos = OFF_ATTRIBUTES + at.index(bytes.len() - OFF_ATTRIBUTES);
            bytes[pos] ^= 1 << bit;
            let result = Batch::parse_valid(&bytes);
            prop_assert!(result.is_err(), "flip at {} not detected", pos);
        }

        #[test]
        fn batches_frame_a_concatenation_exactly(
            sizes in proptest::collection::vec(1usize..5, 1..8),
            trailing in 0usize..60,
        ) {
            let mut buf = Vec::new();
            let mut next = 0i64;
            let mut expected = Vec::new();
            for n in &sizes {
                let values: Vec<Vec<u8>> = (0..*n).map(|i| vec![i as u8; 3]).collect();
                let b = data_batch(next, &values);
                expected.push((buf.len(), next));
                buf.extend_from_slice(&b);
                next += *n as i64;
            }
            let whole = buf.len();
            let extra = data_batch(next, &[vec![9u8; 80]]);
            buf.extend_from_slice(&extra[..trailing.min(extra.len() - 1)]);
            let mut it = Batches::new(&buf);
            let got: Vec<(usize, i64)> =
                it.by_ref().map(|r| r.map(|(at, b)| (at, b.base_offset().0)).unwrap()).collect();
            prop_assert_eq!(got, expected);
            prop_assert_eq!(it.position(), whole);
            prop_assert_eq!(it.trailing_bytes(), buf.len() - whole);
        }
    }
}
