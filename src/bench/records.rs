//! The in-memory data of the synthetic source: one really compressed, CRC-valid record batch
//! (the template) that every served batch copies, stamped with its own baseOffset.
//!
//! baseOffset sits outside the CRC (kafka-formats.md §1.4), so re-stamping it per offset keeps
//! the batch valid without recomputing anything; the body after it is shared by every response.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType, NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
};

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::progress::ServeProgress;
use super::{SynthError, SynthSpec};
use crate::ids::{LeaderEpoch, Offset, TimestampMs};
use crate::limits::BATCH_BYTES_MAX;
use crate::wire::batch::{restamp_v2_timestamps, Batch, Peek};

/// Timestamp of the first record in every batch (2026-01-01T00:00:00Z); record i adds i ms.
pub const BASE_TIMESTAMP_MS: i64 = 1_767_225_600_000;

/// Few words, so the values compress the way text-like payloads do (about 3-5x), rather than
/// not at all (random bytes) or absurdly well (zeros).
const WORDS: [&str; 32] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "order", "payment", "customer",
    "shipment", "invoice", "account",
];

/// The key of the record at `index` within a batch.
pub fn record_key(index: u32) -> String {
    format!("key-{index:07}")
}

/// The value of the record at `index` within a batch: `len` bytes of words and numbers from a
/// generator seeded by the index, so any reader can recompute what it should have received.
pub fn record_value(index: u32, len: usize) -> String {
    let mut state = (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    let mut out = String::with_capacity(len + 16);
    out.push_str(&format!("v{index} "));
    while out.len() < len {
        // xorshift64*: cheap, deterministic, good enough to vary the text.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        out.push_str(WORDS[(r % WORDS.len() as u64) as usize]);
        out.push(if r & 0x100 != 0 { ' ' } else { '=' });
        if r & 0x3000 == 0 {
            out.push_str(&format!("{} ", (r >> 20) % 100_000));
        }
    }
    out.truncate(len);
    out
}

/// One compressed batch holding `records_per_batch` records at relative offsets 0..n.
#[derive(Debug, Clone)]
pub struct BatchTemplate {
    /// The whole batch, LOG_OVERHEAD included, baseOffset 0.
    bytes: Bytes,
    records_per_batch: u32,
}

impl BatchTemplate {
    /// Encodes `records` records with the spec's codec and leader epoch and checks the result
    /// with kmirror's own batch validator.
    pub fn build(spec: &SynthSpec, records: u32) -> Result<BatchTemplate, SynthError> {
        let recs: Vec<Record> = (0..records)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: spec.leader_epoch,
                producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                // The encoder splits batches where offset - sequence changes; a constant
                // difference of 1 keeps one batch and yields baseSequence -1 (no producer).
                sequence: i as i32 - 1,
                timestamp: BASE_TIMESTAMP_MS + i as i64,
                key: Some(Bytes::from(record_key(i))),
                value: Some(Bytes::from(record_value(i, spec.value_bytes))),
                headers: IndexMap::new(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: spec.codec.compression(),
        };
        RecordBatchEncoder::encode(&mut buf, &recs, &options)
            .map_err(|e| SynthError::Template(e.to_string()))?;
        let bytes = buf.freeze();
        let batch = match Batch::peek(&bytes).map_err(|e| SynthError::Template(e.to_string()))? {
            Peek::Complete(b) => b,
            Peek::Incomplete { .. } => {
                return Err(SynthError::Template(
                    "encoder produced a partial batch".into(),
                ))
            }
        };
        batch
            .validate()
            .map_err(|e| SynthError::Template(e.to_string()))?;
        if batch.size() != bytes.len() || batch.records_count() != records as i32 {
            return Err(SynthError::Template(format!(
                "encoder produced {} bytes / {} records, expected one batch of {records}",
                bytes.len(),
                batch.records_count()
            )));
        }
        assert_eq!(
            batch.partition_leader_epoch(),
            LeaderEpoch(spec.leader_epoch)
        );
        Ok(BatchTemplate {
            bytes,
            records_per_batch: records,
        })
    }

    /// Builds the template the spec asks for: a fixed record count, or the largest count whose
    /// compressed batch fits `batch_bytes`.
    pub fn for_spec(spec: &SynthSpec) -> Result<BatchTemplate, SynthError> {
        spec.check()?;
        if let Some(n) = spec.records_per_batch {
            let t = BatchTemplate::build(spec, n)?;
            if t.size() > BATCH_BYTES_MAX {
                return Err(SynthError::BadSpec(format!(
                    "{n} records make a {} byte batch, above {BATCH_BYTES_MAX}",
                    t.size()
                )));
            }
            return Ok(t);
        }
        // Grow geometrically until the batch is too big, then bisect on the record count.
        let mut lo = BatchTemplate::build(spec, 1)?;
        if lo.size() > spec.batch_bytes {
            return Err(SynthError::BadSpec(format!(
                "one record already makes a {} byte batch; raise --batch-bytes",
                lo.size()
            )));
        }
        let mut hi_count = 2u32;
        loop {
            let t = BatchTemplate::build(spec, hi_count)?;
            if t.size() > spec.batch_bytes {
                break;
            }
            lo = t;
            hi_count = hi_count.checked_mul(2).ok_or_else(|| {
                SynthError::BadSpec("batch size target needs too many records".into())
            })?;
        }
        while hi_count - lo.records_per_batch > 1 {
            let mid = lo.records_per_batch + (hi_count - lo.records_per_batch) / 2;
            let t = BatchTemplate::build(spec, mid)?;
            if t.size() > spec.batch_bytes {
                hi_count = mid;
            } else {
                lo = t;
            }
        }
        Ok(lo)
    }

    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    pub fn records_per_batch(&self) -> u32 {
        self.records_per_batch
    }

    /// The whole template batch (baseOffset 0).
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The template after its 8-byte baseOffset: identical in every served batch.
    pub fn body_after_offset(&self) -> &[u8] {
        &self.bytes[8..]
    }

    /// Appends the batch stamped with `base_offset` and moved in time so that its maxTimestamp
    /// is `max_timestamp` (CRC recomputed): what a rate-limited source serves.
    pub fn stamp_into(&self, out: &mut Vec<u8>, base_offset: Offset, max_timestamp: TimestampMs) {
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        let batch = &mut out[at..];
        batch[..8].copy_from_slice(&base_offset.0.to_be_bytes());
        restamp_v2_timestamps(batch, max_timestamp);
    }

    /// A standalone copy of the batch stamped with `base_offset` (for tests and benches; the
    /// server never copies the body).
    pub fn stamped(&self, base_offset: Offset) -> Vec<u8> {
        let mut v = self.bytes.to_vec();
        v[..8].copy_from_slice(&base_offset.0.to_be_bytes());
        v
    }
}

/// Everything the source knows about its data, shared read-only by all connections.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub spec: SynthSpec,
    pub template: BatchTemplate,
    /// Batches per partition; `None` for an endless partition.
    pub batches_per_partition: Option<u64>,
    /// When a rate-limited source's data started to appear (its first Fetch): the monotonic
    /// instant and the wall clock in ms at that instant.
    clock: OnceLock<(Instant, f64)>,
    /// What has been served so far (benchmarks time a mirror by it).
    pub progress: std::sync::Arc<ServeProgress>,
}

impl Catalog {
    pub fn new(spec: SynthSpec) -> Result<Catalog, SynthError> {
        let template = BatchTemplate::for_spec(&spec)?;
        let batches_per_partition = spec
            .partition_bytes
            .map(|b| b.div_ceil(template.size() as u64).max(1));
        Ok(Catalog {
            progress: std::sync::Arc::new(ServeProgress::new(spec.total_partitions())),
            spec,
            template,
            batches_per_partition,
            clock: OnceLock::new(),
        })
    }

    /// Starts a rate-limited source's clock (idempotent; the first Fetch calls it).
    pub fn start_clock(&self) {
        self.clock.get_or_init(|| {
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64() * 1e3);
            (Instant::now(), wall)
        });
    }

    /// The started clock: monotonic start and wall-clock ms at it.
    pub fn clock(&self) -> Option<&(Instant, f64)> {
        self.clock.get()
    }

    pub fn is_rate_limited(&self) -> bool {
        self.spec.rate_bytes_per_s.is_some()
    }

    /// Seconds between two consecutive batches of a rate-limited source (over all partitions).
    fn batch_interval_s(&self) -> Option<f64> {
        self.spec
            .rate_bytes_per_s
            .map(|r| self.template.size() as f64 / r as f64)
    }

    /// Batches a rate-limited source has made available over all partitions by `now`.
    fn appeared(&self, now: Instant) -> u64 {
        match (self.batch_interval_s(), self.clock.get()) {
            (Some(dt), Some((start, _))) => {
                (now.saturating_duration_since(*start).as_secs_f64() / dt) as u64
            }
            _ => 0,
        }
    }

    /// Log end of partition `global` (topic index × partitions + partition) at `now`. Without a
    /// rate it is [`Catalog::log_end_offset`]; with one, batch j overall appears (j + 1) batch
    /// intervals after the clock started and goes to partition j mod P, up to the finite size.
    pub fn partition_end(&self, global: usize, now: Instant) -> Offset {
        if !self.is_rate_limited() {
            return self.log_end_offset();
        }
        let n = self.appeared(now);
        let g = global as u64;
        let total = self.spec.total_partitions() as u64;
        let mut count = if n > g { (n - g - 1) / total + 1 } else { 0 };
        if let Some(max) = self.batches_per_partition {
            count = count.min(max);
        }
        Offset(count as i64 * self.records_per_batch())
    }

    /// When the next batch of a rate-limited source appears (`None` without a rate or before
    /// the clock started).
    pub fn next_batch_at(&self, now: Instant) -> Option<Instant> {
        let dt = self.batch_interval_s()?;
        let (start, _) = self.clock.get()?;
        let next = self.appeared(now) + 1;
        Some(*start + Duration::from_secs_f64(next as f64 * dt))
    }

    /// Wall-clock ms at which batch `index` of partition `global` appeared (its maxTimestamp);
    /// `None` without a rate.
    pub fn appear_time_ms(&self, global: usize, index: u64) -> Option<TimestampMs> {
        let dt = self.batch_interval_s()?;
        let (_, wall) = self.clock.get()?;
        let j = index * self.spec.total_partitions() as u64 + global as u64;
        Some(TimestampMs((wall + (j + 1) as f64 * dt * 1e3) as i64))
    }

    pub fn records_per_batch(&self) -> i64 {
        self.template.records_per_batch() as i64
    }

    /// The log end offset (and high watermark) of every partition. An endless partition
    /// reports a huge, batch-aligned end so that no client ever catches up.
    pub fn log_end_offset(&self) -> Offset {
        let rpb = self.records_per_batch();
        match self.batches_per_partition {
            Some(n) => Offset(n as i64 * rpb),
            None => Offset((1i64 << 62) / rpb * rpb),
        }
    }

    /// Index of the topic named `name`.
    pub fn topic_index(&self, name: &str) -> Option<usize> {
        self.spec.topics.iter().position(|t| t == name)
    }

    pub fn topic_index_by_id(&self, id: &uuid::Uuid) -> Option<usize> {
        self.spec
            .topics
            .iter()
            .position(|t| SynthSpec::topic_id(t) == *id)
    }

    /// Offset of the batch that contains `offset`.
    pub fn batch_start(&self, offset: Offset) -> Offset {
        let rpb = self.records_per_batch();
        Offset(offset.0 / rpb * rpb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::SynthCodec;
    use crate::wire::batch::Codec;

    fn spec(codec: SynthCodec, batch_bytes: usize) -> SynthSpec {
        SynthSpec {
            codec,
            batch_bytes,
            ..SynthSpec::default()
        }
    }

    #[test]
    fn template_is_a_valid_compressed_batch_near_the_target_size() {
        for (codec, want) in [
            (SynthCodec::Lz4, Codec::Lz4),
            (SynthCodec::Zstd, Codec::Zstd),
        ] {
            let s = spec(codec, 16 * 1024);
            let t = BatchTemplate::for_spec(&s).unwrap();
            let b = match Batch::peek(t.bytes()).unwrap() {
                Peek::Complete(b) => b,
                Peek::Incomplete { .. } => panic!("template is partial"),
            };
            b.validate().unwrap();
            assert_eq!(b.codec(), want);
            assert!(t.size() <= s.batch_bytes);
            // The bisection stops at the largest fitting count, so one more record must not fit.
            let next = BatchTemplate::build(&s, t.records_per_batch() + 1).unwrap();
            assert!(
                next.size() > s.batch_bytes,
                "{} <= {}",
                next.size(),
                s.batch_bytes
            );
            // Really compressed: the raw values alone are much larger than the batch.
            let raw = t.records_per_batch() as usize * s.value_bytes;
            assert!(
                raw > 2 * t.size(),
                "{codec:?}: {raw} raw bytes in {} byte batch",
                t.size()
            );
            assert_eq!(b.last_offset_delta() as u32 + 1, t.records_per_batch());
            assert_eq!(b.base_sequence(), -1);
        }
    }

    #[test]
    fn restamped_batch_keeps_its_crc() {
        let t = BatchTemplate::for_spec(&spec(SynthCodec::Zstd, 4096)).unwrap();
        let v = t.stamped(Offset(123_456_789));
        let b = Batch::parse_valid(&v).unwrap().expect("complete");
        assert_eq!(b.base_offset(), Offset(123_456_789));
    }

    #[test]
    fn values_are_deterministic_and_sized() {
        assert_eq!(record_value(7, 100), record_value(7, 100));
        assert_ne!(record_value(7, 100), record_value(8, 100));
        assert_eq!(record_value(3, 57).len(), 57);
    }

    #[test]
    fn endless_and_finite_log_end() {
        let c = Catalog::new(SynthSpec {
            records_per_batch: Some(10),
            partition_bytes: Some(1),
            ..SynthSpec::default()
        })
        .unwrap();
        assert_eq!(c.log_end_offset(), Offset(10));
        let c = Catalog::new(SynthSpec {
            records_per_batch: Some(10),
            ..SynthSpec::default()
        })
        .unwrap();
        assert_eq!(c.log_end_offset().0 % 10, 0);
        assert!(c.log_end_offset().0 > 1 << 61);
    }
}
