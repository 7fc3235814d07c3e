//! Goal: a source broker restart while `kmirror serve` mirrors does not stall or break the
//! mirror: the shard loses its connection, the control thread looks the leaders up again (the
//! restarted broker leads at a new leader epoch, so the old epoch would be fenced), the
//! partitions continue from their log ends, and our logs end byte-equal to the broker's — no
//! gap, no duplicate. Method: a dedicated real Kafka 4.1.1 KRaft broker (the restart would
//! disturb the shared one); produce, mirror, restart the broker twice (graceful stop, then
//! SIGKILL) with data produced while it is down-and-back, and compare `.log` bytes.

mod harness;
mod mirror_support;

use harness::serve::{wait_all_mirrored, Serve};
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
    let pairs: Vec<_> = (0..2)
        .map(|p| {
            (
                k.partition_dir(topic, p),
                data_dir.join(format!("{topic}-{p}")),
            )
        })
        .collect();
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
    assert!(
        !log.contains("partition stopped"),
        "no partition stopped:\n{log}"
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
