//! Goal: `kmirror serve` mirrors every kind of partition a real Kafka 4.1.1 broker writes
//! byte-for-byte, at the source's offsets, into files Kafka's own DumpLogSegments accepts.
//! Method: one shared KRaft broker; the real Java producer writes each codec, idempotent and
//! transactional (commit and abort) batches, a compacted topic that the broker's cleaner has
//! really compacted (offset gaps), and a topic of 100 partitions; `kmirror serve` (the binary)
//! mirrors them; for every partition our concatenated `.log` bytes must equal the broker's (so
//! every batch's base offset, last offset, CRC and bytes agree, in order), then DumpLogSegments
//! (`--deep-iteration --index-sanity-check`, then `--verify-index-only`) and `kmirror log verify`
//! must find nothing wrong.

mod harness;
mod mirror_support;

use std::time::{Duration, Instant};

use harness::{Codec, KafkaVersion, ProduceOpts, TxnEnd};
use mirror_support::mirror_and_check;

#[test]
fn codecs_idempotent_and_transactional_partitions() {
    let k = harness::shared();
    let topic = harness::unique_topic("matrix-kinds");
    k.create_topic(&topic, 7, &[]);
    for (p, codec) in Codec::ALL.iter().enumerate() {
        let opts = ProduceOpts {
            codec: *codec,
            seed: p as u64,
            headers: 1,
            ..Default::default()
        };
        k.produce(&topic, p as i32, 400, &opts);
    }
    let idem = ProduceOpts {
        codec: Codec::Lz4,
        idempotent: true,
        seed: 5,
        ..Default::default()
    };
    k.produce(&topic, 5, 400, &idem);
    let txn = ProduceOpts {
        codec: Codec::Zstd,
        transactions: vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit, TxnEnd::Abort],
        seed: 6,
        ..Default::default()
    };
    let produced = k.produce(&topic, 6, 400, &txn);
    // The last abort marker follows the last record; wait until the broker has written it.
    k.wait_for_log_end(&topic, 6, produced.last_offset + 2);
    mirror_and_check(k, &[(&topic, 7)]);
}

/// Whether the broker's log of this partition has an offset gap between consecutive batches.
/// Reads the batch headers (base offset at byte 0, length at 8, last offset delta at 23) straight
/// from the segment files: the cleaner swaps and deletes files under us, so a vanished or short
/// file only means "look again".
fn broker_has_gap(theirs: &std::path::Path) -> bool {
    let mut batches: Vec<(i64, i64)> = Vec::new();
    for p in harness::serve::log_files(theirs) {
        let bytes = std::fs::read(&p).unwrap_or_default();
        let mut at = 0usize;
        while at + 27 <= bytes.len() {
            let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
            let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            let delta = i32::from_be_bytes(bytes[at + 23..at + 27].try_into().unwrap());
            if len <= 0 {
                break;
            }
            batches.push((base, base + i64::from(delta)));
            at += 12 + len as usize;
        }
    }
    batches.sort();
    batches.dedup();
    batches.windows(2).any(|w| w[1].0 > w[0].1 + 1)
}

#[test]
fn compacted_topic_with_offset_gaps() {
    let k = harness::shared();
    let topic = harness::unique_topic("matrix-compacted");
    let seg = KafkaVersion::DEFAULT.segment_bytes_config();
    k.create_topic(
        &topic,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.01"),
            ("min.compaction.lag.ms", "0"),
            ("delete.retention.ms", "100"),
            (seg, "16384"),
        ],
    );
    // The same seed gives the same keys: the third round supersedes the second, so the cleaner
    // removes offsets 100..399 between the kept first and third rounds.
    let kept = ProduceOpts {
        codec: Codec::Gzip,
        seed: 8,
        ..Default::default()
    };
    k.produce(&topic, 0, 100, &kept);
    let opts = ProduceOpts {
        codec: Codec::Snappy,
        seed: 7,
        ..Default::default()
    };
    k.produce(&topic, 0, 300, &opts);
    k.produce(&topic, 0, 300, &opts);
    let theirs = k.partition_dir(&topic, 0);
    let start = Instant::now();
    let mut round = 0u64;
    // Appends roll the segment (segment.ms) so the cleaner may clean everything before it.
    while !broker_has_gap(&theirs) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the broker's cleaner left no offset gap in {}",
            theirs.display()
        );
        std::thread::sleep(Duration::from_secs(2));
        round += 1;
        let tail = ProduceOpts {
            seed: 1000 + round,
            ..Default::default()
        };
        k.produce(&topic, 0, 1, &tail);
    }
    // A gap may come from a first pass that saw only part of the third round; the next pass
    // would rewrite the broker's segments while kmirror copies them. Past the third round
    // there are only tail records with keys of their own, which supersede nothing.
    k.wait_compacted(&topic, 0, 700);
    mirror_and_check(k, &[(&topic, 1)]);
}

#[test]
fn topic_of_100_partitions() {
    let k = harness::shared();
    let topic = harness::unique_topic("matrix-100");
    k.create_topic(&topic, 100, &[]);
    let opts = ProduceOpts {
        codec: Codec::Lz4,
        spread: 100,
        seed: 9,
        ..Default::default()
    };
    k.produce(&topic, 0, 3000, &opts);
    mirror_and_check(k, &[(&topic, 100)]);
}
