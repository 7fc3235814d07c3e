//! Goal: SIGTERM stops `kmirror serve` cleanly and the next start skips recovery, with 1,000
//! partitions. Method: a real Kafka 4.1.1 broker with a 1,000-partition topic, 3 records
//! produced into each partition by Kafka's Java producer; the `kmirror` binary (static mode,
//! 2 shards) mirrors it until every partition's `.log` bytes equal the broker's; SIGTERM; the
//! clean-shutdown marker must exist and the recovery-point checkpoint list all 1,000 partitions. The restart's
//! "log dir opened" line must say clean_shutdown=true and recovered=0 for 1,000 partitions, and
//! mirroring resumes without refetching. As a control that the line means what it says, a
//! SIGKILLed run must restart with clean_shutdown=false and every partition recovered. No time
//! is asserted: the test prints the restart times (`restart:` lines), which
//! benches/restart_1000.sh collects.

mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness::serve::{log_bytes, plain, wait_all_mirrored, Serve};
use harness::ProduceOpts;

const PARTITIONS: i32 = 1000;
/// Failure guard for a restart on a loaded 2-core machine, not a performance claim.
const LIMIT: Duration = Duration::from_secs(300);

fn write_config(work: &Path, source: &str, topic: &str) -> (PathBuf, PathBuf) {
    let data = work.join("data");
    let config = work.join("kmirror.toml");
    std::fs::write(
        &config,
        format!(
            "[source]\nbootstrap_servers = [\"{source}\"]\n[topics]\nnames = [\"{topic}\"]\n\
             [storage]\ndata_dir = \"{}\"\n[runtime]\nshards = 2\narena_slot_bytes = 4194304\n\
             arena_slots = 4\n[fetch]\nmax_wait_ms = 100\nmax_bytes = 2097152\n\
             partition_max_bytes = 65536\n",
            data.display()
        ),
    )
    .unwrap();
    (config, data)
}

/// The last "log dir opened" line of the serve log.
fn opened_line(text: &str) -> String {
    plain(text)
        .lines()
        .rev()
        .find(|l| l.contains("log dir opened"))
        .unwrap_or_else(|| panic!("no 'log dir opened' line:\n{text}"))
        .to_owned()
}

/// Waits for the `count`-th "mirroring" line of the serve log; returns the time since `since`.
fn wait_mirroring(serve: &mut Serve, count: usize, since: Instant) -> Duration {
    loop {
        if plain(&serve.log_text())
            .matches(" mirroring partitions=")
            .count()
            >= count
        {
            return since.elapsed();
        }
        serve.assert_running();
        assert!(since.elapsed() < LIMIT, "{}", serve.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn checkpoint_entries(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    // Version line, count line, then one line per partition.
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"));
    let n: usize = lines.next().unwrap().parse().unwrap();
    assert_eq!(lines.count(), n);
    n
}

#[test]
fn clean_stop_of_1000_partitions_skips_recovery_and_a_kill_does_not() {
    let k = harness::shared();
    let topic = harness::unique_topic("ops-shutdown");
    k.create_topic(&topic, PARTITIONS, &[]);
    let opts = ProduceOpts {
        spread: PARTITIONS as u32,
        ..ProduceOpts::default()
    };
    k.produce(&topic, 0, 3 * PARTITIONS as usize, &opts);
    let work = tempfile::tempdir().unwrap();
    let (config, data) = write_config(work.path(), &k.bootstrap(), &topic);
    let pairs = k.mirror_pairs(&topic, PARTITIONS, &data);
    let log = work.path().join("serve.log");

    let mut serve = Serve::start(&config, log.clone());
    wait_all_mirrored(&mut serve, &pairs);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    assert!(data.join(".kafka_cleanshutdown").exists(), "{text}");
    // Every partition's recovery point is checkpointed (log starts are listed only when above
    // the first segment's base, as Kafka does; here none is).
    assert_eq!(
        checkpoint_entries(&data.join("recovery-point-offset-checkpoint")),
        PARTITIONS as usize
    );
    let before: Vec<usize> = pairs.iter().map(|(_, o)| log_bytes(o).len()).collect();

    let started = Instant::now();
    let mut serve = Serve::start(&config, log.clone());
    let clean_restart = wait_mirroring(&mut serve, 2, started);
    let clean_line = opened_line(&serve.log_text());
    for want in [
        format!("partitions={PARTITIONS}"),
        "clean_shutdown=true".into(),
        "recovered=0".into(),
    ] {
        assert!(
            clean_line.contains(&want),
            "{want} missing in: {clean_line}"
        );
    }
    // Resumed at the log ends: a refetch would have appended (or been refused and logged).
    std::thread::sleep(Duration::from_secs(2));
    serve.assert_running();
    let after: Vec<usize> = pairs.iter().map(|(_, o)| log_bytes(o).len()).collect();
    assert_eq!(before, after, "a partition changed after a clean restart");
    serve.kill9();

    // Control: after SIGKILL there is no marker, so every partition is revalidated.
    let started = Instant::now();
    let mut serve = Serve::start(&config, log.clone());
    let killed_restart = wait_mirroring(&mut serve, 3, started);
    let killed_line = opened_line(&serve.log_text());
    for want in [
        "clean_shutdown=false".to_string(),
        format!("recovered={PARTITIONS}"),
    ] {
        assert!(
            killed_line.contains(&want),
            "{want} missing in: {killed_line}"
        );
    }
    serve.sigterm_and_wait();
    let open_ms = |line: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix("elapsed_ms="))
            .unwrap_or("?")
            .to_owned()
    };
    // Measurements for benches/restart_1000.sh (never asserted).
    for (after, took, line) in [
        ("SIGTERM", clean_restart, &clean_line),
        ("SIGKILL", killed_restart, &killed_line),
    ] {
        println!(
            "restart: partitions={PARTITIONS} after={after} exec_to_mirroring_ms={} \
             log_dir_open_ms={}",
            took.as_millis(),
            open_ms(line)
        );
    }
}
