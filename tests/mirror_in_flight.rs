//! Goal: `kmirror serve` keeps several fetch requests in flight on one source connection (its
//! partitions split into fetch groups, each with its own session) and still mirrors every
//! partition byte-for-byte, in order. Method: a real Kafka 4.1.1 broker behind the pass-through
//! proxy of `harness::proxy`, which counts the requests outstanding on each connection; one
//! shard, so all 12 partitions share one connection; `sessions_per_connection = 4`.
//!
//! A second test: `connections_per_source = 3` splits the partitions between three connections
//! to the broker, each with one request in flight, and still mirrors every partition
//! byte-for-byte.
//!
//! A third: with the defaults (one fetch group per connection) a connection behind splits its
//! partitions into a second group, so two requests are in flight while it catches up, and
//! merges them back once caught up: from then on one request at a time, the long poll of the
//! one group (checked over an idle window and a trickle of new records), and the mirror is
//! byte-for-byte.
//!
//! Then idle: with nothing new on the source, the groups must not spin on empty answers
//! (requests queued behind another one ask for `max_wait_ms = 0`, so a careless client would
//! resend them back to back). The bound below is an upper bound on the number of Fetches, not
//! a timing claim: when every group is idle only one request at a time may wait at the source,
//! and it waits `max_wait_ms` each time, so a window of `w` ms allows about `w / max_wait_ms`
//! of them (plus a few answered at once when the window opens).

mod harness;
mod mirror_support;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use harness::proxy::{Fault, FaultProxy};
use harness::serve::{wait_all_mirrored, Serve};
use harness::ProduceOpts;
use mirror_support::assert_valid;

#[test]
fn several_requests_in_flight_per_connection() {
    let k = harness::shared();
    let topic = harness::unique_topic("in-flight");
    let partitions = 12;
    k.create_topic(&topic, partitions, &[]);
    for p in 0..partitions {
        let opts = ProduceOpts {
            seed: p as u64,
            ..Default::default()
        };
        k.produce(&topic, p, 200, &opts);
    }
    let proxy = FaultProxy::start(k.bootstrap().parse().unwrap(), Fault::None);
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(
        work.path(),
        &proxy.bootstrap(),
        &topic,
        4,
        "sessions_per_connection = 4\n",
    );
    let pairs = k.mirror_pairs(&topic, partitions, &data_dir);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_all_mirrored(&mut serve, &pairs);
    // More while it runs: the groups' long polls are answered and fetching goes on.
    for p in 0..partitions {
        k.produce(&topic, p, 100, &ProduceOpts::default());
    }
    wait_all_mirrored(&mut serve, &pairs);
    let max = proxy.max_in_flight.load(Ordering::Relaxed);

    // Idle: let the last answers settle, then count Fetches over a window.
    std::thread::sleep(Duration::from_millis(1_000));
    let before = proxy.fetches.load(Ordering::Relaxed);
    let window = Instant::now();
    std::thread::sleep(Duration::from_millis(3_000));
    let idle_fetches = proxy.fetches.load(Ordering::Relaxed) - before;
    let window_ms = window.elapsed().as_millis() as usize;
    // 200 ms long polls, one at a time: window/200 of them; 4 groups, so allow each group a
    // poll per long poll plus slack. A spinning client sends thousands.
    let allowed = 4 * (window_ms / 200 + 4);
    println!("Fetch requests in {window_ms} ms of idle: {idle_fetches} (allowed {allowed})");
    assert!(
        idle_fetches <= allowed,
        "{idle_fetches} Fetch requests in {window_ms} ms with nothing to fetch: the groups spin"
    );
    assert!(idle_fetches > 0, "fetching stopped altogether while idle");
    println!("most requests outstanding on one connection: {max}");
    assert!(
        (2..=4).contains(&max),
        "expected 2..=4 requests in flight on the shard's connection, saw {max}"
    );
    let text = serve.sigterm_and_wait();
    assert!(!text.contains("partition stopped"), "{text}");
    assert!(
        !text.contains("reconnecting"),
        "no connection was dropped:\n{text}"
    );
    assert_valid(&pairs.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>());
}

#[test]
fn several_connections_per_source() {
    let k = harness::shared();
    let topic = harness::unique_topic("conns");
    let partitions = 6;
    k.create_topic(&topic, partitions, &[]);
    for p in 0..partitions {
        let opts = ProduceOpts {
            seed: 100 + p as u64,
            ..Default::default()
        };
        k.produce(&topic, p, 200, &opts);
    }
    let proxy = FaultProxy::start(k.bootstrap().parse().unwrap(), Fault::None);
    let work = tempfile::tempdir().unwrap();
    // One group per connection for good (no catch-up split), so each has one request in flight.
    let (config, data_dir) = write_config(
        work.path(),
        &proxy.bootstrap(),
        &topic,
        6,
        "connections_per_source = 3\ncatch_up_pipelining = false\n",
    );
    let pairs = k.mirror_pairs(&topic, partitions, &data_dir);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_all_mirrored(&mut serve, &pairs);
    for p in 0..partitions {
        k.produce(&topic, p, 100, &ProduceOpts::default());
    }
    wait_all_mirrored(&mut serve, &pairs);
    let connections = proxy.fetch_connections.load(Ordering::Relaxed);
    let max = proxy.max_in_flight.load(Ordering::Relaxed);
    println!("connections that fetched: {connections}, most requests on one: {max}");
    assert_eq!(
        connections, 3,
        "one shard, one broker, connections_per_source = 3: three fetching connections"
    );
    assert_eq!(
        max, 1,
        "one fetch group per connection: one request in flight each"
    );
    let text = serve.sigterm_and_wait();
    assert!(!text.contains("partition stopped"), "{text}");
    assert!(
        !text.contains("reconnecting"),
        "no connection was dropped:\n{text}"
    );
    assert_valid(&pairs.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>());
}

#[test]
fn a_connection_behind_pipelines_then_merges_back_into_one_long_poll() {
    let k = harness::shared();
    let topic = harness::unique_topic("catch-up");
    let partitions = 8;
    k.create_topic(&topic, partitions, &[]);
    for p in 0..partitions {
        let opts = ProduceOpts {
            seed: 200 + p as u64,
            value_bytes: 1000,
            ..Default::default()
        };
        k.produce(&topic, p, 400, &opts);
    }
    let proxy = FaultProxy::start(k.bootstrap().parse().unwrap(), Fault::None);
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &proxy.bootstrap(), &topic, 4, "");
    let metrics = harness::serve::add_metrics_listener(&config);
    let pairs = k.mirror_pairs(&topic, partitions, &data_dir);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_all_mirrored(&mut serve, &pairs);
    let catching_up = proxy.max_in_flight.load(Ordering::Relaxed);
    let (splits, merges) = group_changes(&harness::serve::scrape_metrics(&metrics));
    println!(
        "while behind: most requests in flight {catching_up}; splits {splits}, merges {merges}"
    );
    assert_eq!(
        catching_up, 2,
        "a connection behind keeps two requests in flight, one per group"
    );
    assert!(splits >= 1, "the connection split to catch up");

    // Caught up: the first empty answer merges the groups. From the next request on, one
    // request at a time, through an idle window and a trickle of new records.
    serve.wait_for("the groups merged", Duration::from_secs(30), || {
        let (s, m) = group_changes(&harness::serve::scrape_metrics(&metrics));
        s >= 1 && m == s
    });
    std::thread::sleep(Duration::from_millis(500));
    proxy.max_in_flight.store(0, Ordering::Relaxed);
    let before = proxy.fetches.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(1_500));
    for p in 0..partitions {
        k.produce(&topic, p, 3, &ProduceOpts::default());
    }
    wait_all_mirrored(&mut serve, &pairs);
    std::thread::sleep(Duration::from_millis(1_000));
    let caught_up = proxy.max_in_flight.load(Ordering::Relaxed);
    let fetches = proxy.fetches.load(Ordering::Relaxed) - before;
    let (splits_after, merges_after) = group_changes(&harness::serve::scrape_metrics(&metrics));
    println!("caught up: most requests in flight {caught_up} over {fetches} fetches");
    assert!(fetches > 0, "fetching stopped once caught up");
    assert_eq!(
        caught_up, 1,
        "caught up, the connection's partitions are one group again: one long poll at a time"
    );
    assert_eq!(
        (splits_after, merges_after),
        (splits, splits),
        "a trickle of records neither splits nor leaves the connection split"
    );
    let text = serve.sigterm_and_wait();
    assert!(!text.contains("partition stopped"), "{text}");
    assert!(
        !text.contains("reconnecting"),
        "no connection was dropped:\n{text}"
    );
    assert_valid(&pairs.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>());
}

/// A one-shard `kmirror serve` config for `topic` from `bootstrap`, with `arena_slots` slots
/// and `fetch_extra` appended to its `[fetch]` section; returns its path and the data dir.
fn write_config(
    work: &Path,
    bootstrap: &str,
    topic: &str,
    arena_slots: u32,
    fetch_extra: &str,
) -> (PathBuf, PathBuf) {
    mirror_support::write_config_with(
        work,
        bootstrap,
        &[topic],
        &format!(
            r#"[runtime]
shards = 1
arena_slot_bytes = 4194304
arena_slots = {arena_slots}
[fetch]
max_wait_ms = 200
max_bytes = 2097152
partition_max_bytes = 16384
{fetch_extra}"#
        ),
    )
}

/// `kmirror_shard_catch_up_group_changes_total` of a scrape, summed over shards: (splits,
/// merges).
fn group_changes(scrape: &str) -> (u64, u64) {
    let [splits, merges] = harness::serve::counter_by_label(
        scrape,
        "kmirror_shard_catch_up_group_changes_total",
        "change",
        ["split", "merge"],
    );
    (splits, merges)
}
