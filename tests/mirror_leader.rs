//! Goal: a source broker restart while `kmirror serve` mirrors does not stall or break the
//! mirror: the shard loses its connection, the control thread looks the leaders up again (the
//! restarted broker leads at a new leader epoch, so the old epoch would be fenced), the
//! partitions continue from their log ends, and our logs end byte-equal to the broker's — no
//! gap, no duplicate. Method: a dedicated real Kafka 4.1.1 KRaft broker (the restart would
//! disturb the shared one); produce, mirror, restart the broker twice (graceful stop, then
//! SIGKILL) with data produced while it is down-and-back, and compare `.log` bytes.
//!
//! Then truncation on the source: the broker is killed, the tail of partition 0's log file is
//! cut at a batch boundary (what an unclean leader election or a lost disk write leaves: the
//! source no longer holds offsets we mirrored), and the broker restarted. Kafka answers our
//! next fetch (Fetch v12+, LastFetchedEpoch) with a DivergingEpoch below our log end; kmirror
//! must stop partition 0 with that reason, keep our copy exactly as it was (never rewrite,
//! never skip), and keep mirroring partition 1.

mod harness;
mod mirror_support;

use std::path::Path;
use std::time::Duration;

use harness::serve::{log_bytes, log_files, wait_all_mirrored, Serve};
use harness::{Kafka, ProduceOpts};
use mirror_support::{assert_valid, write_config};

#[test]
fn broker_restarts_do_not_stop_mirroring() {
    let mut k = Kafka::start_dedicated();
    let topic = "leader-moves";
    k.create_topic(topic, 2, &[]);
    for p in 0..2 {
        k.produce(topic, p, 300, &ProduceOpts::default());
    }
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[topic]);
    let pairs = k.mirror_pairs(topic, 2, &data_dir);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_all_mirrored(&mut serve, &pairs);

    let epoch_before = leader_epochs(&k, topic);
    k.restart();
    for p in 0..2 {
        let opts = ProduceOpts {
            seed: 7 + p as u64,
            ..Default::default()
        };
        k.produce(topic, p, 200, &opts);
    }
    wait_all_mirrored(&mut serve, &pairs);

    k.kill();
    k.restart();
    for p in 0..2 {
        let opts = ProduceOpts {
            seed: 17 + p as u64,
            ..Default::default()
        };
        k.produce(topic, p, 200, &opts);
    }
    wait_all_mirrored(&mut serve, &pairs);
    let epoch_after = leader_epochs(&k, topic);
    // The restarts really moved leadership on (what fences a fetcher that keeps its old epoch).
    assert!(
        epoch_after.iter().zip(&epoch_before).all(|(a, b)| a > b),
        "leader epochs did not change: {epoch_before:?} -> {epoch_after:?}"
    );

    // Truncation on the source.
    let ours0 = pairs[0].1.clone();
    let held = log_bytes(&ours0);
    k.kill();
    let cut_to = cut_last_batches(&k.partition_dir(topic, 0), 5);
    k.restart();
    println!("source partition 0 cut to {cut_to} records");
    let report = serve.wait_partition_stopped(&format!("{topic}-0"), Duration::from_secs(120));
    println!("{report}");
    assert!(
        report.contains("diverged") && report.contains("truncated"),
        "the report names the divergence: {report}"
    );
    k.produce(topic, 1, 100, &ProduceOpts::default());
    wait_all_mirrored(&mut serve, &pairs[1..]);
    assert_eq!(log_bytes(&ours0), held, "our copy of partition 0 changed");

    serve.assert_running();
    let log = serve.sigterm_and_wait();
    for line in log
        .lines()
        .filter(|l| l.contains("leader") || l.contains("source error"))
    {
        println!("{line}");
    }
    assert!(
        log.contains("looking up the source leader"),
        "the shards asked the control thread for the leaders again:\n{log}"
    );
    assert_eq!(
        log.matches("partition stopped").count(),
        1,
        "only the truncated partition stopped:\n{log}"
    );
    assert_valid(&pairs.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>());
    k.stop();
}

/// The current leader epoch of each partition, from the broker's metadata.
fn leader_epochs(k: &Kafka, topic: &str) -> Vec<i32> {
    let mut c = kmirror::fetch::blocking::BlockingClient::connect(&k.bootstrap(), "test").unwrap();
    let md = c.metadata(Some(&[topic])).unwrap();
    (0..2)
        .map(|p| md.partition(topic, p).unwrap().leader_epoch.0)
        .collect()
}

/// Cuts the last `n` batches off the partition's active segment (the broker is down); returns
/// the log end offset left.
fn cut_last_batches(dir: &Path, n: usize) -> i64 {
    let file = log_files(dir).pop().expect("a segment");
    let bytes = std::fs::read(&file).unwrap();
    // (position, base offset) of every batch: base offset (8 bytes), length (4), the rest.
    let mut batches = Vec::new();
    let mut pos = 0;
    while pos + 12 <= bytes.len() {
        let base = i64::from_be_bytes(bytes[pos..pos + 8].try_into().unwrap());
        let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
        batches.push((pos, base));
        pos += 12 + len;
    }
    assert!(
        batches.len() > n,
        "only {} batches in {}",
        batches.len(),
        file.display()
    );
    let (at, base) = batches[batches.len() - n];
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(at as u64).unwrap();
    f.sync_all().unwrap();
    base
}
