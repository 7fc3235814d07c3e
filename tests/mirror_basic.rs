//! Goal: `kmirror serve` mirrors a real Kafka topic byte-for-byte. Method: a real KRaft broker
//! (Kafka 4.1.1, from the harness); the real Java producer writes batches with several codecs
//! into two partitions; `kmirror serve` (the binary, 2 pinned shards) fetches them over its
//! io_uring data path; we wait until our `.log` bytes equal the broker's, produce more while it
//! runs and wait again, stop it with SIGTERM (clean-shutdown marker and checkpoints must follow),
//! produce while it is down and restart it (it must resume at its log ends), then check our
//! directory with Kafka's own DumpLogSegments (deep iteration + index sanity) and compare its
//! batch list with the broker's.

mod harness;
mod mirror_support;

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::files::copy_partition_trimmed;
use harness::serve::{log_bytes, wait_mirrored, Serve};
use harness::{Codec, ProduceOpts};
use mirror_support::write_config;

#[test]
fn serve_mirrors_topic_byte_for_byte() {
    let k = harness::shared();
    let topic = harness::unique_topic("mirror-basic");
    k.create_topic(&topic, 2, &[]);
    let round1 = [
        (0, Codec::Gzip),
        (0, Codec::None),
        (1, Codec::Zstd),
        (1, Codec::Lz4),
    ];
    for (i, (p, codec)) in round1.iter().enumerate() {
        let opts = ProduceOpts {
            codec: *codec,
            seed: i as u64,
            headers: 1,
            ..Default::default()
        };
        k.produce(&topic, *p, 500, &opts);
    }

    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[&topic]);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    for p in 0..2 {
        wait_mirrored(
            &mut serve,
            &k.partition_dir(&topic, p),
            &data_dir.join(format!("{topic}-{p}")),
        );
    }

    // More data while it runs, with another codec: the fetch loop keeps going.
    for p in 0..2 {
        let opts = ProduceOpts {
            codec: Codec::Snappy,
            seed: 10 + p as u64,
            ..Default::default()
        };
        k.produce(&topic, p, 300, &opts);
    }
    for p in 0..2 {
        wait_mirrored(
            &mut serve,
            &k.partition_dir(&topic, p),
            &data_dir.join(format!("{topic}-{p}")),
        );
    }
    let text = serve.sigterm_and_wait();
    assert!(
        text.contains("stopped cleanly"),
        "no clean stop in:\n{text}"
    );
    assert!(text.contains("shard started"), "{text}");

    for p in 0..2 {
        let ours = data_dir.join(format!("{topic}-{p}"));
        let theirs = k.partition_dir(&topic, p);
        assert_eq!(
            log_bytes(&ours),
            log_bytes(&theirs),
            "partition {p} bytes after stop"
        );
        let dump = dump_log_segments(&segment_files(&ours), DumpFlags::DEEP_SANITY);
        dump.assert_clean();
        let scratch = tempfile::tempdir().unwrap();
        let broker_files = copy_partition_trimmed(&theirs, &scratch.path().join("b"));
        let broker_dump = dump_log_segments(
            &broker_files
                .into_iter()
                .filter(|f| f.extension().is_some_and(|e| e == "log"))
                .collect::<Vec<_>>(),
            DumpFlags::DEEP_SANITY,
        );
        let key = |d: &harness::DumpOutput| -> Vec<(i64, i64, u64, u32, String)> {
            d.batches
                .iter()
                .filter(|b| b.file.extension().is_some_and(|e| e == "log"))
                .map(|b| {
                    (
                        b.base_offset,
                        b.last_offset,
                        b.position,
                        b.crc,
                        b.codec.clone(),
                    )
                })
                .collect()
        };
        assert!(!key(&dump).is_empty());
        assert_eq!(
            key(&dump),
            key(&broker_dump),
            "partition {p}: batch list differs"
        );
    }
}
