//! Goal: bad bytes from the source fail only the partition they belong to, and a broken
//! connection loses nothing. Method: a real Kafka 4.1.1 broker behind a fault-injecting TCP
//! proxy (`harness::proxy`, which re-advertises the broker at its own address so every
//! connection of `kmirror serve` goes through it).
//!
//! * Corrupt batch: every Fetch response's records for partition 1 get one byte flipped inside
//!   the CRC-covered range. kmirror retries a few times (a flipped bit in transit heals on
//!   refetch), then stops partition 1 with a reason naming the CRC mismatch; partitions 0 and 2
//!   keep mirroring to byte-equality and the process stays up. Nothing corrupt is written.
//! * Truncated frame: the first Fetch response carrying records for partition 1 is cut in half
//!   and the connection closed. A frame cut short cannot be told apart from a dead connection,
//!   so kmirror drops the connection, reconnects and fetches again from its log ends (fetch
//!   offsets only advance when a whole response was validated): every partition ends
//!   byte-equal to the broker, no gap, nothing stopped.
//! * The same cut with several requests in flight: one shard (all partitions on one
//!   connection) and `fetch.sessions_per_connection = 3`, so the cut response has others queued
//!   behind it and every group must forget its request and refetch.

mod harness;
mod mirror_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use harness::proxy::{Fault, FaultProxy};
use harness::serve::{log_bytes, wait_all_mirrored, Serve};
use harness::ProduceOpts;
use mirror_support::{assert_valid, write_config};

fn start(fault: Fault, prefix: &str) -> (String, FaultProxy) {
    let k = harness::shared();
    let topic = harness::unique_topic(prefix);
    k.create_topic(&topic, 3, &[]);
    for p in 0..3 {
        for round in 0..3 {
            let opts = ProduceOpts {
                seed: (p * 10 + round) as u64,
                ..Default::default()
            };
            k.produce(&topic, p, 100, &opts);
        }
    }
    let upstream = k.bootstrap().parse().unwrap();
    (topic, FaultProxy::start(upstream, fault))
}

#[test]
fn corrupt_batch_fails_only_its_partition() {
    let k = harness::shared();
    let (topic, proxy) = start(Fault::CorruptBatch { partition: 1 }, "fault-crc");
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &proxy.bootstrap(), &[&topic]);
    let pair = |p: i32| {
        (
            k.partition_dir(&topic, p),
            data_dir.join(format!("{topic}-{p}")),
        )
    };
    let healthy = [pair(0), pair(2)];
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_all_mirrored(&mut serve, &healthy);

    let report = serve.wait_partition_stopped(&format!("{topic}-1"), Duration::from_secs(120));
    println!("{report}");
    assert!(report.contains("CRC mismatch"), "{report}");
    assert!(proxy.applied.load(Ordering::Relaxed) > 1, "retried first");

    // The others keep going; partition 1 holds nothing the broker does not (no corrupt bytes).
    for p in [0, 2] {
        k.produce(&topic, p, 100, &ProduceOpts::default());
    }
    wait_all_mirrored(&mut serve, &healthy);
    let (theirs1, ours1) = pair(1);
    let held = log_bytes(&ours1);
    assert!(
        log_bytes(&theirs1).starts_with(&held),
        "partition 1 holds bytes the broker does not"
    );
    serve.assert_running();
    let text = serve.sigterm_and_wait();
    assert_eq!(
        text.matches("partition stopped").count(),
        1,
        "only partition 1 stopped:\n{text}"
    );
    assert_valid(&[healthy[0].1.clone(), healthy[1].1.clone()]);
}

#[test]
fn truncated_frame_reconnects_and_loses_nothing() {
    truncated_frame(None);
}

#[test]
fn truncated_frame_with_requests_in_flight_loses_nothing() {
    truncated_frame(Some(3));
}

/// `sessions`: `Some(n)` runs one shard with `n` fetch groups on its connection.
fn truncated_frame(sessions: Option<u8>) {
    let k = harness::shared();
    let (topic, proxy) = start(Fault::TruncateFrameOnce { partition: 1 }, "fault-cut");
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &proxy.bootstrap(), &[&topic]);
    if let Some(n) = sessions {
        let text = std::fs::read_to_string(&config).unwrap();
        assert!(
            text.contains("shards = 2")
                && text.trim_end().ends_with("partition_max_bytes = 262144")
        );
        let text =
            text.replace("shards = 2", "shards = 1") + &format!("sessions_per_connection = {n}\n");
        std::fs::write(&config, text).unwrap();
    }
    let pairs = k.mirror_pairs(&topic, 3, &data_dir);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_all_mirrored(&mut serve, &pairs);
    assert_eq!(
        proxy.applied.load(Ordering::Relaxed),
        1,
        "one frame was cut"
    );
    for p in 0..3 {
        k.produce(&topic, p, 100, &ProduceOpts::default());
    }
    wait_all_mirrored(&mut serve, &pairs);
    let text = serve.sigterm_and_wait();
    if sessions.is_some() {
        let max = proxy.max_in_flight.load(Ordering::Relaxed);
        assert!(
            max >= 2,
            "requests were in flight together (most seen: {max})"
        );
    }
    assert!(
        text.contains("connection closed by the source; reconnecting"),
        "the cut frame dropped the connection:\n{text}"
    );
    assert!(!text.contains("partition stopped"), "{text}");
    assert_valid(&pairs.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>());
}
