//! `kmirror serve` mirrors the synthetic bench source, as benches/mirror_matrix.sh and
//! benches/latency.sh rely on: the real binary (io_uring shards) negotiates versions with the
//! source (so the source must offer OffsetForLeaderEpoch), and its `.log` files end up holding
//! exactly the batches the source generated. With a rate-limited source the batches that reach
//! the disk carry the wall-clock time they appeared at the source as maxTimestamp (CRC still
//! valid), which is what makes kmirror's end-to-end latency meaningful in the benchmark.

mod harness;
mod mirror_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use harness::serve::{
    add_fetch_settings, add_metrics_listener, fetch_requests, log_bytes, scrape_metrics, Serve,
    CATCH_UP_LIMIT,
};
use kmirror::bench::records::Catalog;
use kmirror::bench::server::SynthServer;
use kmirror::bench::sessions::SynthSessions;
use kmirror::bench::{SynthCodec, SynthSpec};
use kmirror::ids::Offset;
use kmirror::wire::batch::Batches;
use mirror_support::write_config;

/// Starts a synthetic source for `spec` on a free port; returns its address and catalog.
fn source(spec: SynthSpec) -> (String, std::sync::Arc<Catalog>) {
    let server = SynthServer::bind("127.0.0.1:0", spec).unwrap();
    let catalog = server.catalog().clone();
    let addr = server.spawn().unwrap();
    (addr.to_string(), catalog)
}

/// Every batch the source generates for one partition, stamped at its offsets: what each
/// mirrored `.log` must hold byte for byte once the copy is complete.
fn expected_log(catalog: &Catalog) -> Vec<u8> {
    let batches = catalog.batches_per_partition.unwrap();
    let rpb = catalog.records_per_batch();
    (0..batches as i64)
        .flat_map(|i| catalog.template.stamped(Offset(i * rpb)))
        .collect()
}

/// The mirrored partition directories `synth-0 .. synth-{n-1}` under `data`.
fn partition_dirs(data: &Path, n: u32) -> Vec<PathBuf> {
    (0..n).map(|p| data.join(format!("synth-{p}"))).collect()
}

/// Responses of at most 64 KiB (32 batches) and 8 KiB per partition, so a round reaches only
/// some partitions and each partition takes several.
fn small_fetches(config: &Path) {
    let text = std::fs::read_to_string(config).unwrap();
    let text = text
        .replace("partition_max_bytes = 262144", "partition_max_bytes = 8192")
        .replace("\nmax_bytes = 2097152", "\nmax_bytes = 65536");
    std::fs::write(config, text).unwrap();
}

/// Asserts every partition directory holds exactly `want`.
fn assert_identical(dirs: &[PathBuf], want: &[u8], what: &str) {
    for d in dirs {
        assert!(
            log_bytes(d) == want,
            "{} differs from the source ({what})",
            d.display()
        );
    }
}

/// Waits until every partition dir holds `want` bytes of `.log`.
fn wait_bytes(serve: &mut Serve, dirs: &[PathBuf], want: usize) {
    let start = Instant::now();
    loop {
        serve.assert_running();
        let have: Vec<usize> = dirs.iter().map(|d| log_bytes(d).len()).collect();
        if have.iter().all(|&n| n >= want) {
            return;
        }
        assert!(
            start.elapsed() < CATCH_UP_LIMIT,
            "mirrored {have:?} of {want} bytes per partition\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn serve_mirrors_the_synthetic_source_byte_for_byte() {
    let spec = SynthSpec {
        partitions: 3,
        codec: SynthCodec::Zstd,
        batch_bytes: 4096,
        partition_bytes: Some(4096 * 25),
        ..SynthSpec::default()
    };
    let (addr, catalog) = source(spec);
    let work = tempfile::tempdir().unwrap();
    let (config, data) = write_config(work.path(), &addr, &["synth"]);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let want = expected_log(&catalog);
    let dirs = partition_dirs(&data, 3);
    wait_bytes(&mut serve, &dirs, want.len());
    serve.sigterm_and_wait();
    assert_identical(&dirs, &want, "zstd, 3 partitions");
}

#[test]
fn rate_limited_source_batches_reach_the_mirror_stamped_with_their_appear_time() {
    // 3 partitions x 15 batches at 60 batches/s: the data appears over ~0.75 s.
    let mut spec = SynthSpec {
        partitions: 3,
        codec: SynthCodec::Lz4,
        batch_bytes: 2048,
        ..SynthSpec::default()
    };
    let size = Catalog::new(spec.clone()).unwrap().template.size() as u64;
    spec.partition_bytes = Some(size * 15);
    spec.rate_bytes_per_s = Some(size * 60);
    let (addr, catalog) = source(spec);
    let work = tempfile::tempdir().unwrap();
    let (config, data) = write_config(work.path(), &addr, &["synth"]);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let dirs = partition_dirs(&data, 3);
    wait_bytes(&mut serve, &dirs, (size * 15) as usize);
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    serve.sigterm_and_wait();

    let (_, clock_ms) = *catalog.clock().expect("the first fetch started the clock");
    let rpb = catalog.records_per_batch();
    for (p, d) in dirs.iter().enumerate() {
        let bytes = log_bytes(d);
        let mut n = 0u64;
        let mut last = i64::MIN;
        for item in Batches::new(&bytes) {
            let (_, b) = item.unwrap();
            b.validate()
                .expect("restamped batch keeps a valid CRC on disk");
            assert_eq!(b.base_offset(), Offset(n as i64 * rpb));
            let ts = b.max_timestamp();
            assert_eq!(
                Some(ts),
                catalog.appear_time_ms(p, n),
                "partition {p} batch {n}"
            );
            assert!(ts.0 > last, "timestamps grow along the partition");
            assert!(
                ts.0 > clock_ms as i64 && ts.0 <= now_ms,
                "appear time {} outside [{clock_ms}, {now_ms}]",
                ts.0
            );
            assert_eq!(b.base_timestamp().0, ts.0 - (rpb - 1));
            last = ts.0;
            n += 1;
        }
        assert_eq!(n, 15, "partition {p}");
    }
    // Round-robin at 60 batches/s: the last of 45 batches appeared ~0.75 s after the clock.
    let last = catalog.appear_time_ms(2, 14).unwrap().0 - clock_ms as i64;
    assert!((740..=760).contains(&last), "{last} ms");
}

/// Which side refuses fetch sessions in `mirror_many_partitions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sessions {
    Used,
    RefusedBySource,
    DisabledInKmirror,
}

/// Mirrors 64 partitions of the synthetic source with small fetches (many rounds, so most
/// requests find most partitions without news), checks every `.log` against the source's
/// batches, and returns kmirror's (full, incremental) fetch request counts and the source's
/// session counters.
fn mirror_many_partitions(sessions: Sessions) -> ((u64, u64), SynthSessions) {
    const PARTITIONS: u32 = 64;
    let spec = SynthSpec {
        partitions: PARTITIONS,
        codec: SynthCodec::Lz4,
        batch_bytes: 2048,
        partition_bytes: Some(2048 * 12),
        ..SynthSpec::default()
    };
    let mut server = SynthServer::bind("127.0.0.1:0", spec).unwrap();
    if sessions == Sessions::RefusedBySource {
        server = server.without_fetch_sessions();
    }
    let catalog = server.catalog().clone();
    let source_sessions = server.sessions();
    let addr = server.spawn().unwrap().to_string();
    let work = tempfile::tempdir().unwrap();
    let (config, data) = write_config(work.path(), &addr, &["synth"]);
    let metrics = add_metrics_listener(&config);
    if sessions == Sessions::DisabledInKmirror {
        add_fetch_settings(&config, "source_load.sessions = false");
    }
    small_fetches(&config);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let want = expected_log(&catalog);
    let dirs = partition_dirs(&data, PARTITIONS);
    wait_bytes(&mut serve, &dirs, want.len());
    let counts = fetch_requests(&scrape_metrics(&metrics));
    serve.sigterm_and_wait();
    assert_identical(&dirs, &want, &format!("{sessions:?}"));
    (counts, source_sessions)
}

// Goal: against a source granting fetch sessions (KIP-227, the synthetic source keeps them as
// a broker does), kmirror opens one per fetch group and then sends incremental requests, and
// the mirror is still byte-identical. The counts come from both ends: kmirror's
// `kmirror_shard_fetch_requests_total{kind}` and the source's own session cache.
#[test]
fn many_partitions_mirror_identically_over_incremental_fetch_sessions() {
    let ((full, incremental), source) = mirror_many_partitions(Sessions::Used);
    let stats = source.stats();
    assert!(stats.counts.created >= 1, "no session created: {stats:?}");
    assert!(
        incremental > full,
        "kmirror sent {full} full and {incremental} incremental fetches"
    );
    assert!(
        stats.counts.incremental_fetches >= incremental.saturating_sub(2),
        "the source saw {} incremental fetches, kmirror counted {incremental}",
        stats.counts.incremental_fetches
    );
}

// Goal: a source that refuses sessions (session id 0 to every full fetch) and
// `fetch.source_load.sessions = false` both leave kmirror on full fetches that still mirror
// every byte; no incremental request is ever sent.
#[test]
fn without_sessions_every_fetch_is_full_and_the_mirror_identical() {
    for mode in [Sessions::RefusedBySource, Sessions::DisabledInKmirror] {
        let ((full, incremental), source) = mirror_many_partitions(mode);
        assert!(full > 0, "{mode:?}");
        assert_eq!(incremental, 0, "{mode:?}");
        assert_eq!(source.stats().counts.created, 0, "{mode:?}");
    }
}

// Goal: `[fetch.source_load] max_rate_bytes_per_sec` caps what a mirror fetches: at every
// moment the mirrored bytes stay within the cap times the time since kmirror started, plus
// one burst and one response (the response that overdraws the budget is written before the
// next request waits), and the mirror still completes byte for byte. An upper bound the cap
// guarantees, not a speed claim.
#[test]
fn max_rate_caps_the_mirror_and_it_still_completes() {
    const PARTITIONS: u32 = 8;
    const CAP: u64 = 256 * 1024;
    let spec = SynthSpec {
        partitions: PARTITIONS,
        codec: SynthCodec::Lz4,
        batch_bytes: 2048,
        partition_bytes: Some(2048 * 48),
        ..SynthSpec::default()
    };
    let (addr, catalog) = source(spec);
    let work = tempfile::tempdir().unwrap();
    let (config, data) = write_config(work.path(), &addr, &["synth"]);
    add_fetch_settings(
        &config,
        &format!("source_load.max_rate_bytes_per_sec = {CAP}"),
    );
    small_fetches(&config);
    let started = Instant::now();
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let want = expected_log(&catalog);
    let dirs = partition_dirs(&data, PARTITIONS);
    let total = want.len() * PARTITIONS as usize;
    let slack = (CAP / 10) as f64 + 65536.0; // one burst (100 ms) and one response
    let mut samples = 0;
    loop {
        serve.assert_running();
        // Time first, bytes after: the bytes may only be more recent than the time.
        let elapsed = started.elapsed().as_secs_f64();
        let have: usize = dirs.iter().map(|d| log_bytes(d).len()).sum();
        let bound = CAP as f64 * elapsed + slack;
        assert!(
            (have as f64) <= bound,
            "{have} bytes mirrored {elapsed:.2} s after start, above the cap's {bound:.0}"
        );
        samples += 1;
        if have >= total {
            break;
        }
        assert!(
            started.elapsed() < CATCH_UP_LIMIT,
            "mirrored {have} of {total} bytes\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    serve.sigterm_and_wait();
    assert!(
        samples > 10,
        "the copy must take a while under the cap to test it"
    );
    assert_identical(&dirs, &want, "under the rate cap");
}
