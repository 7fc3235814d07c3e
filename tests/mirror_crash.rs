//! Goal: after `kill -9` at arbitrary moments, `kmirror serve` resumes every partition at its
//! log end with no gap and no duplicate. Method: a real Kafka 4.1.1 broker; a producer thread
//! keeps writing into two partitions; we SIGKILL `kmirror serve` five times at seeded random
//! moments (the seed is printed; set KMIRROR_CRASH_SEED to replay) and restart it each time;
//! after the producer stops and the mirror catches up, our `.log` bytes equal the broker's and
//! DumpLogSegments and `kmirror log verify` accept our directories.

mod harness;
mod mirror_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use harness::serve::{log_bytes, wait_all_mirrored, Serve};
use harness::{Codec, ProduceOpts};
use mirror_support::{assert_valid, write_config};

const KILLS: usize = 5;
const PARTITIONS: i32 = 2;

/// A small xorshift generator: enough to spread kill moments reproducibly from a seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn kill_9_five_times_while_producing_keeps_every_offset_once() {
    let seed: u64 = std::env::var("KMIRROR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("KMIRROR_CRASH_SEED={seed}");
    let mut rng = seed;

    let k = harness::shared();
    let topic = harness::unique_topic("crash");
    k.create_topic(&topic, PARTITIONS, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let stop = stop.clone();
        let topic = topic.clone();
        std::thread::spawn(move || {
            let k = harness::shared();
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let opts = ProduceOpts {
                    codec: Codec::ALL[(round % 5) as usize],
                    spread: PARTITIONS as u32,
                    seed: round,
                    ..Default::default()
                };
                k.produce(&topic, 0, 400, &opts);
                round += 1;
            }
            round
        })
    };

    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[&topic]);
    let log = work.path().join("serve.log");
    for kill in 0..KILLS {
        let mut serve = Serve::start(&config, log.clone());
        let delay = Duration::from_millis(300 + next(&mut rng) % 2700);
        std::thread::sleep(delay);
        serve.assert_running();
        println!("kill -9 #{kill} after {delay:?}");
        serve.kill9();
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = producer.join().unwrap();
    assert!(rounds > 0);

    let mut serve = Serve::start(&config, log.clone());
    let pairs = k.mirror_pairs(&topic, PARTITIONS, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);
    serve.sigterm_and_wait();
    for (theirs, ours) in &pairs {
        assert_eq!(
            log_bytes(ours),
            log_bytes(theirs),
            "{} differs from the broker (seed {seed})",
            ours.display()
        );
    }
    let ours: Vec<_> = pairs.into_iter().map(|(_, o)| o).collect();
    assert_valid(&ours);
}
