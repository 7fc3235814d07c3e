//! What the synthetic source serves, shared by the source and the raw-copy client.

use kafka_protocol::records::Compression;
use uuid::Uuid;

use super::SynthError;
use crate::limits::{BATCH_BYTES_MAX, SYNTH_PARTITIONS_MAX, TOPIC_NAME_BYTES_MAX};

/// The codecs the synthetic source can build batches with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SynthCodec {
    None,
    Lz4,
    Zstd,
}

impl SynthCodec {
    pub fn compression(self) -> Compression {
        match self {
            SynthCodec::None => Compression::None,
            SynthCodec::Lz4 => Compression::Lz4,
            SynthCodec::Zstd => Compression::Zstd,
        }
    }
}

/// Command-line form of [`SynthSpec`]; the source binary and the raw-copy client take the same
/// flags so they agree on the data layout.
#[derive(Debug, Clone, clap::Args)]
pub struct SynthArgs {
    /// Topic name; repeat for several topics (each gets `--partitions` partitions).
    #[arg(long = "topic", default_value = "synth")]
    pub topics: Vec<String>,
    /// Partitions per topic.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    #[arg(long, value_enum, default_value = "lz4")]
    pub codec: SynthCodec,
    /// Target size of one compressed batch in bytes (the template is the largest batch not
    /// above it), unless `--records-per-batch` fixes the record count.
    #[arg(long, default_value_t = 16 * 1024)]
    pub batch_bytes: usize,
    /// Fixed number of records per batch (overrides the `--batch-bytes` search).
    #[arg(long)]
    pub records_per_batch: Option<u32>,
    /// Size of each record value in bytes.
    #[arg(long, default_value_t = 200)]
    pub value_bytes: usize,
    /// Bytes per partition (rounded up to whole batches); absent means endless.
    #[arg(long)]
    pub partition_bytes: Option<u64>,
    /// partitionLeaderEpoch stamped in every batch and advertised in Metadata.
    #[arg(long, default_value_t = 0)]
    pub leader_epoch: i32,
    /// Make data appear at this rate (MB/s, 10^6 bytes, over all partitions, round-robin),
    /// starting at the first Fetch; each batch is stamped with the wall-clock time it appeared
    /// as its maxTimestamp, so a mirror's end-to-end latency is measurable. Absent: all data is
    /// there from the start, with fixed 2026-01-01 timestamps.
    #[arg(long = "rate-mb-s")]
    pub rate_mb_s: Option<f64>,
}

impl SynthArgs {
    pub fn to_spec(&self) -> SynthSpec {
        SynthSpec {
            topics: self.topics.clone(),
            partitions: self.partitions,
            codec: self.codec,
            batch_bytes: self.batch_bytes,
            records_per_batch: self.records_per_batch,
            value_bytes: self.value_bytes,
            partition_bytes: self.partition_bytes,
            leader_epoch: self.leader_epoch,
            rate_bytes_per_s: self.rate_mb_s.map(|r| (r * 1e6).round().max(0.0) as u64),
        }
    }
}

/// The data the synthetic source serves: `partitions` partitions of each topic, every batch a
/// copy of one compressed template stamped with its own baseOffset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthSpec {
    pub topics: Vec<String>,
    pub partitions: u32,
    pub codec: SynthCodec,
    pub batch_bytes: usize,
    pub records_per_batch: Option<u32>,
    pub value_bytes: usize,
    pub partition_bytes: Option<u64>,
    pub leader_epoch: i32,
    /// Rate-limited source: bytes per second that appear over all partitions.
    pub rate_bytes_per_s: Option<u64>,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            topics: vec!["synth".to_string()],
            partitions: 1,
            codec: SynthCodec::Lz4,
            batch_bytes: 16 * 1024,
            records_per_batch: None,
            value_bytes: 200,
            partition_bytes: None,
            leader_epoch: 0,
            rate_bytes_per_s: None,
        }
    }
}

impl SynthSpec {
    pub fn check(&self) -> Result<(), SynthError> {
        let bad = |m: String| Err(SynthError::BadSpec(m));
        if self.topics.is_empty() {
            return bad("at least one topic is needed".into());
        }
        for t in &self.topics {
            if t.is_empty() || t.len() > TOPIC_NAME_BYTES_MAX {
                return bad(format!(
                    "topic name {t:?} must be 1..={TOPIC_NAME_BYTES_MAX} bytes"
                ));
            }
        }
        let mut sorted = self.topics.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != self.topics.len() {
            return bad("topic names must be distinct".into());
        }
        let total = self.topics.len() as u64 * self.partitions as u64;
        if self.partitions == 0 || total > SYNTH_PARTITIONS_MAX as u64 {
            return bad(format!(
                "{total} partitions in all; allowed 1..={SYNTH_PARTITIONS_MAX}"
            ));
        }
        if self.batch_bytes < 256 || self.batch_bytes > BATCH_BYTES_MAX {
            return bad(format!(
                "batch bytes {} must be 256..={BATCH_BYTES_MAX}",
                self.batch_bytes
            ));
        }
        if self.records_per_batch == Some(0) {
            return bad("records per batch must be at least 1".into());
        }
        if self.rate_bytes_per_s == Some(0) {
            return bad("rate must be above 0".into());
        }
        if self.leader_epoch < 0 {
            return bad("leader epoch must be >= 0".into());
        }
        Ok(())
    }

    /// Topic id derived from the name, so that independently started processes agree on it.
    pub fn topic_id(name: &str) -> Uuid {
        let hi = fnv1a64(name.as_bytes(), 0xcbf2_9ce4_8422_2325);
        let lo = fnv1a64(name.as_bytes(), 0x8422_2325_cbf2_9ce4);
        // The all-zero uuid means "no id" in Kafka; the hash cannot realistically hit it, but
        // setting one bit makes it impossible.
        Uuid::from_u64_pair(hi | 1, lo)
    }

    pub fn total_partitions(&self) -> usize {
        self.topics.len() * self.partitions as usize
    }
}

fn fnv1a64(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
