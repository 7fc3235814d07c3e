//! Goal: when the source log no longer matches what we hold (here: the topic was deleted and
//! recreated under the same name with fewer records), `kmirror serve` stops that partition with
//! the reason and never rewrites or extends our copy; the process stays up. Method: a real Kafka
//! 4.1.1 broker; mirror a topic, delete and recreate it, produce into the new one, then watch
//! the serve log for the partition-stopped report and check our `.log` bytes are unchanged.

mod harness;
mod mirror_support;

use std::time::Duration;

use harness::serve::{log_bytes, wait_mirrored, Serve};
use harness::ProduceOpts;
use mirror_support::{assert_valid, write_config};

#[test]
fn recreated_topic_is_reported_never_rewritten() {
    let k = harness::shared();
    let topic = harness::unique_topic("diverge");
    let other = harness::unique_topic("diverge-other");
    k.create_topic(&topic, 1, &[]);
    k.create_topic(&other, 1, &[]);
    k.produce(&topic, 0, 300, &ProduceOpts::default());
    k.produce(&other, 0, 100, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[&topic, &other]);
    let ours = data_dir.join(format!("{topic}-0"));
    let ours_other = data_dir.join(format!("{other}-0"));
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let held = log_bytes(&ours);

    k.recreate_topic(&topic, 50);

    let report = serve.wait_partition_stopped(&topic, Duration::from_secs(90));
    println!("{report}");
    assert!(
        report.contains("deleted and recreated") && report.contains("topic id"),
        "the report names the cause: {report}"
    );
    // Still up, and our copy is exactly what we held: nothing rewritten, nothing appended.
    // The other topic keeps mirroring.
    k.produce(&other, 0, 100, &ProduceOpts::default());
    wait_mirrored(&mut serve, &k.partition_dir(&other, 0), &ours_other);
    serve.assert_running();
    assert_eq!(log_bytes(&ours), held, "our log changed after divergence");
    serve.sigterm_and_wait();
    assert_valid(&[ours, ours_other]);
}
