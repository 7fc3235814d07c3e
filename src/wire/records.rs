//! Reads the records inside an uncompressed v2 batch (kafka-formats.md §1.3).
//!
//! The data path never looks inside batches; this is for the few logs kmirror writes and reads
//! itself (`__mirror_state`), whose batches it builds uncompressed with `batch_builder`.

use crate::ids::Offset;
use crate::limits::RECORD_BATCH_V2_HEADER_BYTES;
use crate::wire::batch::{Batch, Codec};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error(
        "batch at offset {0}: records are compressed ({1}); only uncompressed batches are read"
    )]
    Compressed(Offset, &'static str),
    #[error("batch at offset {0}: not a v2 batch")]
    NotV2(Offset),
    #[error("batch at offset {base}: record {index} is malformed: {reason}")]
    Malformed {
        base: Offset,
        index: i32,
        reason: &'static str,
    },
}

/// One record: its absolute offset, key and value (`None` = null, e.g. a tombstone's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: Offset,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Reads a zigzag varint (at most 10 bytes); returns the value and the bytes it used.
pub fn read_varint(buf: &[u8]) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    for (i, byte) in buf.iter().take(10).enumerate() {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let value = ((raw >> 1) as i64) ^ -((raw & 1) as i64);
            return Some((value, i + 1));
        }
    }
    None
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn varint(&mut self) -> Option<i64> {
        let (v, n) = read_varint(self.buf.get(self.pos..)?)?;
        self.pos += n;
        Some(v)
    }

    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(len)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn bytes_field(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len < 0 {
            return Some(None);
        }
        Some(Some(self.take(usize::try_from(len).ok()?)?))
    }
}

/// The records of an uncompressed v2 batch, in order. The batch's CRC should already have been
/// checked (`Batch::validate`); this checks that every record is framed correctly.
pub fn records<'a>(batch: &Batch<'a>) -> Result<Vec<Record<'a>>, RecordError> {
    let base = batch.base_offset();
    if batch.is_legacy() {
        return Err(RecordError::NotV2(base));
    }
    let codec = batch.codec();
    if codec != Codec::None {
        return Err(RecordError::Compressed(base, codec.name()));
    }
    let count = batch.records_count().max(0);
    let mut cur = Cursor {
        buf: batch.bytes(),
        pos: RECORD_BATCH_V2_HEADER_BYTES,
    };
    // Each record is at least 7 bytes; this bounds the allocation by the batch size.
    let mut out = Vec::with_capacity((count as usize).min(batch.size() / 7));
    for index in 0..count {
        let bad = |reason| RecordError::Malformed {
            base,
            index,
            reason,
        };
        let len = cur.varint().ok_or(bad("truncated length"))?;
        let len = usize::try_from(len).map_err(|_| bad("negative length"))?;
        let body = cur.take(len).ok_or(bad("length past the batch end"))?;
        let mut rec = Cursor { buf: body, pos: 1 }; // skip the unused attributes byte
        if body.is_empty() {
            return Err(bad("empty record"));
        }
        rec.varint().ok_or(bad("bad timestamp delta"))?;
        let delta = rec.varint().ok_or(bad("bad offset delta"))?;
        let key = rec.bytes_field().ok_or(bad("bad key"))?;
        let value = rec.bytes_field().ok_or(bad("bad value"))?;
        let headers = rec.varint().ok_or(bad("bad header count"))?;
        for _ in 0..headers.max(0) {
            rec.bytes_field().ok_or(bad("bad header key"))?;
            rec.bytes_field().ok_or(bad("bad header value"))?;
        }
        if rec.pos != body.len() {
            return Err(bad("length does not match its fields"));
        }
        let offset = base
            .checked_add(delta)
            .ok_or(bad("offset delta out of range"))?;
        out.push(Record { offset, key, value });
    }
    if cur.pos != batch.size() {
        return Err(RecordError::Malformed {
            base,
            index: count,
            reason: "bytes after the last record",
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TimestampMs;
    use crate::wire::batch::Peek;
    use crate::wire::batch_builder::{put_varint, BatchBuilder};
    use proptest::prelude::*;

    fn batch_of(bytes: &[u8]) -> Batch<'_> {
        match Batch::peek(bytes).unwrap() {
            Peek::Complete(b) => b,
            Peek::Incomplete { .. } => panic!("incomplete"),
        }
    }

    #[test]
    fn reads_keys_values_and_tombstones() {
        let bytes = BatchBuilder::new(Offset(40))
            .record(
                TimestampMs(5),
                Some(b"k1"),
                Some(b"v1"),
                &[("h", Some(b"x"))],
            )
            .record(TimestampMs(6), Some(b"k2"), None, &[])
            .build();
        let batch = batch_of(&bytes);
        batch.validate().unwrap();
        let recs = records(&batch).unwrap();
        assert_eq!(
            recs,
            [
                Record {
                    offset: Offset(40),
                    key: Some(b"k1"),
                    value: Some(b"v1")
                },
                Record {
                    offset: Offset(41),
                    key: Some(b"k2"),
                    value: None
                }
            ]
        );
    }

    #[test]
    fn malformed_record_is_an_error_not_a_panic() {
        let mut bytes = BatchBuilder::new(Offset(0))
            .record(TimestampMs(1), Some(b"key"), Some(b"value"), &[])
            .build();
        // Claim a longer key than the record holds.
        let key_len_at = RECORD_BATCH_V2_HEADER_BYTES + 4;
        bytes[key_len_at] = 100;
        assert!(matches!(
            records(&batch_of(&bytes)),
            Err(RecordError::Malformed { .. })
        ));
    }

    proptest! {
        #[test]
        fn varint_round_trips(v in any::<i64>()) {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            prop_assert_eq!(read_varint(&buf), Some((v, buf.len())));
        }

        #[test]
        fn built_records_read_back(entries in proptest::collection::vec(
            (proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
             proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200))), 1..20)) {
            let mut b = BatchBuilder::new(Offset(7));
            for (k, v) in &entries {
                b = b.record(TimestampMs(1), k.as_deref(), v.as_deref(), &[]);
            }
            let bytes = b.build();
            let recs = records(&batch_of(&bytes)).unwrap();
            prop_assert_eq!(recs.len(), entries.len());
            for (i, (r, (k, v))) in recs.iter().zip(&entries).enumerate() {
                prop_assert_eq!(r.offset, Offset(7 + i as i64));
                prop_assert_eq!(r.key, k.as_deref());
                prop_assert_eq!(r.value, v.as_deref());
            }
        }
    }
}
