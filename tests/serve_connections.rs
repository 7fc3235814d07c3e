//! Goal: the event-driven endpoint holds 10,000 client connections with bounded memory while
//! a stock consumer still reads everything: each held connection (one answered ApiVersions,
//! then idle) costs kmirror less than `PER_CONNECTION_BYTES_MAX` of resident memory, and the
//! Java consumer reads the whole mirrored topic while they are held (the thread-per-connection
//! endpoint cost about 500 KB per such connection, and at 1,024 of them a fresh client got
//! nothing).
//!
//! Method: one `kmirror serve` (static mode, `max_connections` above the count) mirrors a topic
//! of the shared broker; its RLIMIT_NOFILE is raised with `prlimit --pid`. The Java consumer
//! reads the topic once (so the heap has seen a full read), kmirror's VmRSS is taken, a Python
//! process (tests/python/hold_connections.py) opens the connections, each answered once, and
//! holds them; the consumer reads again, VmRSS is taken again, and the connections gauge must
//! show them all held. Closing them must bring the gauge back down.

mod harness;
mod mirror_support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::mirrors_cli::free_loopback_port;
use harness::serve::{scrape_metrics, wait_mirrored, Serve};
use harness::{Isolation, ProduceOpts};
use mirror_support::write_config;

const CONNECTIONS: usize = 10_000;
const RECORDS: usize = 20_000;
/// What one held connection may cost kmirror in resident memory.
const PER_CONNECTION_BYTES_MAX: u64 = 20 * 1024;
/// The box's hard RLIMIT_NOFILE.
const NOFILE: &str = "20000";
/// Failure guard for opening, and for closing, all connections on a loaded machine.
const CONNECT_LIMIT: Duration = Duration::from_secs(300);

fn vm_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

fn gauge(metrics: &str, name: &str) -> f64 {
    scrape_metrics(metrics)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn ten_thousand_held_connections_cost_little_and_a_consumer_still_reads_everything() {
    let k = harness::shared();
    let topic = harness::unique_topic("serve-conns");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, RECORDS, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = write_config(work.path(), &k.bootstrap(), &[&topic]);
    let metrics = format!("127.0.0.1:{}", free_loopback_port());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[metrics]\nlisten = \"{metrics}\"\n[kafka]\nlisten = \"127.0.0.1:0\"\n\
         max_connections = {}\n",
        CONNECTIONS + 100
    ));
    std::fs::write(&config, text).unwrap();
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let kafka = serve.kafka_listener();
    let pid = serve.pid();
    let raised = Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={NOFILE}:{NOFILE}"),
        ])
        .status()
        .expect("prlimit (util-linux)");
    assert!(raised.success(), "prlimit --pid {pid} failed");
    wait_mirrored(
        &mut serve,
        &k.partition_dir(&topic, 0),
        &data_dir.join(format!("{topic}-0")),
    );

    let started = Instant::now();
    let first = harness::consume_to_end(&kafka, &topic, 0, Isolation::ReadUncommitted);
    let first_took = started.elapsed();
    assert_eq!(first.len(), RECORDS);
    let before = vm_rss_bytes(pid);
    let open_before = gauge(&metrics, "kmirror_endpoint_connections");

    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/hold_connections.py");
    let mut holder = Command::new("prlimit")
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg(harness::python())
        .arg(&script)
        .args([&kafka, &CONNECTIONS.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the connection holder");
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let held = lines
        .next()
        .expect("the holder exited before holding its connections (see its stderr)")
        .unwrap();
    assert_eq!(held, format!("{{\"held\": {CONNECTIONS}}}"));
    let open = gauge(&metrics, "kmirror_endpoint_connections");
    assert!(
        open >= (open_before as usize + CONNECTIONS) as f64,
        "kmirror holds {open} connections, want {CONNECTIONS} more than {open_before}"
    );

    let started = Instant::now();
    let second = harness::consume_to_end(&kafka, &topic, 0, Isolation::ReadUncommitted);
    let second_took = started.elapsed();
    assert_eq!(
        second, first,
        "the consumer read other records while the connections were held"
    );
    let after = vm_rss_bytes(pid);
    let per_connection = after.saturating_sub(before) / CONNECTIONS as u64;
    eprintln!(
        "kmirror VmRSS {before} B before, {after} B with {CONNECTIONS} connections held: \
         {per_connection} B per connection; {RECORDS} records read in {first_took:?} before, \
         {second_took:?} while held"
    );
    assert!(
        per_connection < PER_CONNECTION_BYTES_MAX,
        "{per_connection} B of RSS per held connection (limit {PER_CONNECTION_BYTES_MAX})"
    );

    drop(holder.stdin.take());
    let start = Instant::now();
    let _ = holder.wait();
    loop {
        let open = gauge(&metrics, "kmirror_endpoint_connections");
        if open <= open_before {
            break;
        }
        assert!(
            start.elapsed() < CONNECT_LIMIT,
            "{open} connections still held after the holder closed them"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = std::io::stderr().flush();
}
