//! Builds uncompressed v2 record batches and transaction-marker control batches.
//!
//! kmirror never re-encodes fetched data; this exists for the few batches it must create itself
//! (the ABORT markers the failover path appends for transactions the source left open) and for
//! tests, tools and benchmarks that need valid batches without a broker. Control batches are
//! built exactly as Kafka's `MemoryRecords.withEndTransactionMarker` lays them out
//! (kafka-formats.md §2), so Kafka's own tools and consumers accept them.
//!
//! Layout: kafka-formats.md §1.1 (header), §1.3 (records), §2 (control batches).

use crate::ids::{LeaderEpoch, Offset, ProducerId, TimestampMs};
use crate::limits::{LOG_OVERHEAD, RECORD_BATCH_V2_HEADER_BYTES};
use crate::wire::batch::crc32c;

const MAGIC_V2: i8 = 2;
const ATTR_LOG_APPEND_TIME: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
/// Byte position of the CRC field and of the first CRC-covered byte (attributes).
const CRC_AT: usize = 17;
const CRC_COVERED_FROM: usize = 21;
/// Version of the control record key and of the end-transaction-marker value.
const CONTROL_RECORD_VERSION: i16 = 0;
const END_TXN_MARKER_VERSION: i16 = 0;

/// Which end-transaction marker a control batch carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndTxnMarker {
    Abort,
    Commit,
}

impl EndTxnMarker {
    /// The control record type Kafka stores in the record key.
    pub fn control_type(self) -> i16 {
        match self {
            EndTxnMarker::Abort => 0,
            EndTxnMarker::Commit => 1,
        }
    }
}

/// Append a zigzag varint (records use protobuf `sint` encoding).
pub fn put_varint(out: &mut Vec<u8>, value: i64) {
    let mut raw = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = (raw & 0x7f) as u8;
        raw >>= 7;
        if raw == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_bytes_field(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
        None => put_varint(out, -1),
    }
}

/// One record header: key and optional value.
pub type RecordHeader<'a> = (&'a str, Option<&'a [u8]>);

/// Builder for one uncompressed v2 batch. Offsets inside the batch are consecutive from
/// `base_offset`; timestamps are absolute and turned into deltas from the first record's.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    base_offset: Offset,
    leader_epoch: LeaderEpoch,
    producer_id: ProducerId,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    log_append_time: bool,
    records: Vec<u8>,
    count: i32,
    base_timestamp: Option<i64>,
    max_timestamp: i64,
}

impl BatchBuilder {
    /// A non-transactional, non-idempotent batch (producer id -1) with no leader epoch.
    pub fn new(base_offset: Offset) -> Self {
        BatchBuilder {
            base_offset,
            leader_epoch: LeaderEpoch::NONE,
            producer_id: ProducerId::NONE,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
            log_append_time: false,
            records: Vec::new(),
            count: 0,
            base_timestamp: None,
            max_timestamp: TimestampMs::NONE.0,
        }
    }

    pub fn leader_epoch(mut self, epoch: LeaderEpoch) -> Self {
        self.leader_epoch = epoch;
        self
    }

    /// Idempotent producer fields; `base_sequence` is the sequence of the first record.
    pub fn producer(mut self, id: ProducerId, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn transactional(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }

    pub fn log_append_time(mut self, log_append_time: bool) -> Self {
        self.log_append_time = log_append_time;
        self
    }

    /// Add a record with the given timestamp, key, value and headers.
    pub fn record(
        mut self,
        timestamp: TimestampMs,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[RecordHeader<'_>],
    ) -> Self {
        let base_ts = *self.base_timestamp.get_or_insert(timestamp.0);
        self.max_timestamp = self.max_timestamp.max(timestamp.0);
        let mut body =
            Vec::with_capacity(16 + key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len));
        body.push(0); // record attributes: unused
        put_varint(&mut body, timestamp.0 - base_ts);
        put_varint(&mut body, self.count as i64);
        put_bytes_field(&mut body, key);
        put_bytes_field(&mut body, value);
        put_varint(&mut body, headers.len() as i64);
        for (hkey, hvalue) in headers {
            put_bytes_field(&mut body, Some(hkey.as_bytes()));
            put_bytes_field(&mut body, *hvalue);
        }
        put_varint(&mut self.records, body.len() as i64);
        self.records.extend_from_slice(&body);
        self.count += 1;
        self
    }

    /// A record with only a value, at `timestamp`.
    pub fn value(self, timestamp: TimestampMs, value: &[u8]) -> Self {
        self.record(timestamp, None, Some(value), &[])
    }

    /// The finished batch, log overhead included, with a correct CRC-32C.
    ///
    /// Panics on a batch without records: Kafka never writes one from a producer, and
    /// every caller in kmirror adds at least one record.
    pub fn build(self) -> Vec<u8> {
        assert!(self.count > 0, "a built batch needs at least one record");
        let mut attributes = 0i16;
        if self.transactional {
            attributes |= ATTR_TRANSACTIONAL;
        }
        if self.log_append_time {
            attributes |= ATTR_LOG_APPEND_TIME;
        }
        encode(Header {
            base_offset: self.base_offset,
            leader_epoch: self.leader_epoch,
            attributes,
            last_offset_delta: self.count - 1,
            base_timestamp: self.base_timestamp.unwrap_or(TimestampMs::NONE.0),
            max_timestamp: self.max_timestamp,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            count: self.count,
            records: &self.records,
        })
    }
}

/// A COMMIT or ABORT marker batch: transactional + control attributes, base sequence -1, one
/// record at offset delta 0 whose key is (version 0, type) and value (version 0,
/// coordinator epoch). With transaction protocol v2 the marker's producer epoch is the bumped
/// one (data epoch + 1); the caller passes whichever epoch the coordinator would use.
pub fn control_batch(
    offset: Offset,
    leader_epoch: LeaderEpoch,
    producer_id: ProducerId,
    producer_epoch: i16,
    marker: EndTxnMarker,
    coordinator_epoch: i32,
    timestamp: TimestampMs,
) -> Vec<u8> {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&CONTROL_RECORD_VERSION.to_be_bytes());
    key.extend_from_slice(&marker.control_type().to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&END_TXN_MARKER_VERSION.to_be_bytes());
    value.extend_from_slice(&coordinator_epoch.to_be_bytes());
    let mut body = Vec::with_capacity(20);
    body.push(0);
    put_varint(&mut body, 0); // timestamp delta
    put_varint(&mut body, 0); // offset delta
    put_bytes_field(&mut body, Some(&key));
    put_bytes_field(&mut body, Some(&value));
    put_varint(&mut body, 0); // no headers
    let mut records = Vec::with_capacity(body.len() + 1);
    put_varint(&mut records, body.len() as i64);
    records.extend_from_slice(&body);
    encode(Header {
        base_offset: offset,
        leader_epoch,
        attributes: ATTR_TRANSACTIONAL | ATTR_CONTROL,
        last_offset_delta: 0,
        base_timestamp: timestamp.0,
        max_timestamp: timestamp.0,
        producer_id,
        producer_epoch,
        base_sequence: -1,
        count: 1,
        records: &records,
    })
}

struct Header<'a> {
    base_offset: Offset,
    leader_epoch: LeaderEpoch,
    attributes: i16,
    last_offset_delta: i32,
    base_timestamp: i64,
    max_timestamp: i64,
    producer_id: ProducerId,
    producer_epoch: i16,
    base_sequence: i32,
    count: i32,
    records: &'a [u8],
}

fn encode(h: Header<'_>) -> Vec<u8> {
    let total = RECORD_BATCH_V2_HEADER_BYTES + h.records.len();
    let batch_length =
        i32::try_from(total - LOG_OVERHEAD).expect("a built batch is far below 2 GiB");
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&h.base_offset.0.to_be_bytes());
    out.extend_from_slice(&batch_length.to_be_bytes());
    out.extend_from_slice(&h.leader_epoch.0.to_be_bytes());
    out.push(MAGIC_V2 as u8);
    out.extend_from_slice(&[0; 4]); // CRC, filled in below
    out.extend_from_slice(&h.attributes.to_be_bytes());
    out.extend_from_slice(&h.last_offset_delta.to_be_bytes());
    out.extend_from_slice(&h.base_timestamp.to_be_bytes());
    out.extend_from_slice(&h.max_timestamp.to_be_bytes());
    out.extend_from_slice(&h.producer_id.0.to_be_bytes());
    out.extend_from_slice(&h.producer_epoch.to_be_bytes());
    out.extend_from_slice(&h.base_sequence.to_be_bytes());
    out.extend_from_slice(&h.count.to_be_bytes());
    debug_assert_eq!(out.len(), RECORD_BATCH_V2_HEADER_BYTES);
    out.extend_from_slice(h.records);
    let crc = crc32c(&out[CRC_COVERED_FROM..]);
    out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Recomputes the CRC-32C of a whole v2 batch after its CRC-covered header fields were edited
/// in place: for tests and fuzz seeds that need batches whose CRC is right and whose header
/// says something hostile (a lastOffsetDelta past `OFFSET_MAX`, a record count that does not
/// fit). The mirror path never rewrites a batch.
pub fn reseal_crc(batch: &mut [u8]) {
    assert!(
        batch.len() >= RECORD_BATCH_V2_HEADER_BYTES && batch[16] == MAGIC_V2 as u8,
        "reseal needs a whole v2 batch"
    );
    let crc = crc32c(&batch[CRC_COVERED_FROM..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// One uncompressed legacy message (magic 0 or 1) at absolute `offset`, with its CRC-32
/// (kafka-formats.md §1.5). Sources on old message formats still serve these, so the log and
/// its tools must handle them; tests need them without an old broker.
pub fn legacy_message(
    magic: i8,
    offset: Offset,
    timestamp: TimestampMs,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Vec<u8> {
    assert!(magic == 0 || magic == 1, "legacy magic is 0 or 1");
    let mut body = vec![magic as u8, 0u8]; // magic, attributes (no compression)
    if magic == 1 {
        body.extend_from_slice(&timestamp.0.to_be_bytes());
    }
    for field in [key, value] {
        match field {
            Some(bytes) => {
                let len = i32::try_from(bytes.len()).expect("a test message is far below 2 GiB");
                body.extend_from_slice(&len.to_be_bytes());
                body.extend_from_slice(bytes);
            }
            None => body.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    let crc = crc32fast::hash(&body);
    let size = i32::try_from(4 + body.len()).expect("a test message is far below 2 GiB");
    let mut out = Vec::with_capacity(LOG_OVERHEAD + 4 + body.len());
    out.extend_from_slice(&offset.0.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::batch::{Batch, Batches, Codec, ControlType};
    use proptest::prelude::*;

    #[test]
    fn data_batch_header_fields() {
        let bytes = BatchBuilder::new(Offset(100))
            .leader_epoch(LeaderEpoch(7))
            .producer(ProducerId(42), 3, 10)
            .transactional(true)
            .value(TimestampMs(1_000), b"a")
            .record(
                TimestampMs(1_500),
                Some(b"k"),
                Some(b"b"),
                &[("h", Some(b"v")), ("n", None)],
            )
            .value(TimestampMs(1_200), b"c")
            .build();
        let b = Batch::parse_valid(&bytes).unwrap().unwrap();
        assert_eq!(b.size(), bytes.len());
        assert_eq!(b.base_offset(), Offset(100));
        assert_eq!(b.last_offset(), Offset(102));
        assert_eq!(b.partition_leader_epoch(), LeaderEpoch(7));
        assert_eq!(b.producer_id(), ProducerId(42));
        assert_eq!(b.producer_epoch(), 3);
        assert_eq!(b.base_sequence(), 10);
        assert_eq!(b.last_sequence(), 12);
        assert_eq!(b.records_count(), 3);
        assert_eq!(b.base_timestamp(), TimestampMs(1_000));
        assert_eq!(b.max_timestamp(), TimestampMs(1_500));
        assert!(b.is_transactional() && !b.is_control());
        assert_eq!(b.codec(), Codec::None);
        assert_eq!(b.control_type(), None);
    }

    #[test]
    fn control_batch_reads_back() {
        for (marker, ty) in [
            (EndTxnMarker::Abort, ControlType::Abort),
            (EndTxnMarker::Commit, ControlType::Commit),
        ] {
            let bytes = control_batch(
                Offset(55),
                LeaderEpoch(2),
                ProducerId(9),
                4,
                marker,
                17,
                TimestampMs(123),
            );
            let b = Batch::parse_valid(&bytes).unwrap().unwrap();
            assert!(b.is_control() && b.is_transactional());
            assert_eq!(b.control_type(), Some(ty));
            assert_eq!(b.coordinator_epoch(), Some(17));
            assert_eq!(b.base_offset(), Offset(55));
            assert_eq!(b.last_offset(), Offset(55));
            assert_eq!(b.base_sequence(), -1);
            assert_eq!(b.producer_epoch(), 4);
            assert_eq!(b.max_timestamp(), TimestampMs(123));
            // 61 header bytes + 1 length varint + 16 record bytes (attributes, two deltas, key and
            // value with their 1-byte lengths, header count).
            assert_eq!(bytes.len(), 78);
        }
    }

    #[test]
    fn varint_matches_protobuf_zigzag() {
        // Worked out from the zigzag definition: 0→0, -1→1, 1→2, -64→127, 64→128 (0x80 0x01).
        let cases: [(i64, &[u8]); 6] = [
            (0, &[0]),
            (-1, &[1]),
            (1, &[2]),
            (-64, &[0x7f]),
            (64, &[0x80, 0x01]),
            (300, &[0xd8, 0x04]),
        ];
        for (v, want) in cases {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out, want, "{v}");
        }
    }

    #[test]
    fn corrupted_byte_fails_crc() {
        let mut bytes = BatchBuilder::new(Offset(0))
            .value(TimestampMs(5), b"xyz")
            .build();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(Batch::parse_valid(&bytes).is_err());
    }

    proptest! {
        #[test]
        fn built_batches_parse_and_validate(
            base in 0i64..1_000_000_000_000,
            epoch in -1i32..1000,
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20),
            ts in 0i64..2_000_000_000_000,
        ) {
            let mut bld = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(epoch));
            for (i, v) in values.iter().enumerate() {
                bld = bld.value(TimestampMs(ts + i as i64), v);
            }
            let bytes = bld.build();
            let mut it = Batches::new(&bytes);
            let (_, b) = it.next().unwrap().unwrap();
            b.validate().unwrap();
            prop_assert_eq!(it.trailing_bytes(), 0);
            prop_assert_eq!(b.records_count() as usize, values.len());
            prop_assert_eq!(b.last_offset(), Offset(base + values.len() as i64 - 1));
            prop_assert_eq!(b.max_timestamp(), TimestampMs(ts + values.len() as i64 - 1));
        }
    }

    #[test]
    fn legacy_messages_validate_with_crc32() {
        use crate::wire::batch::{Batch, Peek};
        for magic in [0, 1] {
            let bytes = legacy_message(magic, Offset(42), TimestampMs(77), None, Some(b"x"));
            let Ok(Peek::Complete(b)) = Batch::peek(&bytes) else {
                panic!("not a batch")
            };
            b.validate().expect("valid");
            assert_eq!(b.magic(), magic);
            assert_eq!(b.last_offset(), Offset(42));
            let ts = if magic == 1 {
                TimestampMs(77)
            } else {
                TimestampMs::NONE
            };
            assert_eq!(b.max_timestamp(), ts);
        }
    }
}
