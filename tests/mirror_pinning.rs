//! Goal: the data-plane threads of a running `kmirror serve` are each pinned to one core, no two
//! on the same core. Method: start the binary with 2 shards against a real Kafka 4.1.1 broker,
//! wait until it has mirrored a topic (so the shards run), then read every thread's name and
//! `Cpus_allowed_list` from /proc/<pid>/task.

mod harness;
mod mirror_support;

use harness::serve::{wait_all_mirrored, Serve};
use harness::ProduceOpts;
use mirror_support::write_config;

#[test]
fn serve_shard_threads_are_pinned_to_distinct_cores() {
    let k = harness::shared();
    let topic = harness::unique_topic("pinning");
    k.create_topic(&topic, 2, &[]);
    for p in 0..2 {
        k.produce(&topic, p, 100, &ProduceOpts::default());
    }
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[&topic]);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let pairs = k.mirror_pairs(&topic, 2, &data_dir);
    wait_all_mirrored(&mut serve, &pairs);

    let pid = serve.child.id();
    let mut cores = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim().starts_with("kmirror-shard") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        let core: usize = allowed
            .parse()
            .unwrap_or_else(|_| panic!("{} allowed on {allowed}, not one core", comm.trim()));
        cores.push(core);
    }
    assert_eq!(cores.len(), 2, "two shard threads (config shards = 2)");
    cores.sort();
    cores.dedup();
    assert_eq!(cores.len(), 2, "shards share a core: {cores:?}");
    serve.sigterm_and_wait();
}
