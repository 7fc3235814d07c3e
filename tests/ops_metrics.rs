//! Goal: an operator scraping `/metrics` of a running `kmirror serve` sees the truth. Method: a
//! real Kafka 4.1.1 broker and its Java producer; the `kmirror` binary mirroring in both modes:
//! with `[admin]` (mirror created and started through the CLI, `/metrics` on the admin port) and
//! static `[source]` with `[metrics] listen`. After the mirror caught up (our `.log` bytes equal
//! the broker's), the scrape must say: bytes mirrored = the bytes of our `.log` files, batches
//! mirrored = the batches Kafka's DumpLogSegments lists in them, lag 0, log end = records
//! produced, state MIRRORING, shard counters moving (uring submissions and completions, fetch
//! round trips, arena slots); Prometheus' own `promtool check metrics` must report no problem
//! with the exposition. After SIGTERM the latency interval log under the data dir must hold the
//! appends the scrape counted.

mod harness;
mod mirror_support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::serve::{log_bytes, wait_mirrored, Serve};
use harness::ProduceOpts;

/// Failure guard for the endpoints to come up and counters to be published, not a performance
/// claim.
const UP_LIMIT: Duration = Duration::from_secs(60);

fn free_loopback_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn scrape(addr: &str) -> Option<String> {
    let mut resp = ureq::get(&format!("http://{addr}/metrics")).call().ok()?;
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        ct.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    resp.body_mut().read_to_string().ok()
}

/// `name{labels}` → value, for every sample line.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse::<f64>().unwrap())
        })
        .collect()
}

fn value(s: &HashMap<String, f64>, key: &str, text: &str) -> f64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in\n{text}"))
}

/// Sum of every sample of `name` (any labels).
fn total(s: &HashMap<String, f64>, name: &str) -> f64 {
    s.iter()
        .filter(|(k, _)| k.starts_with(&format!("{name}{{")) || k.as_str() == name)
        .map(|(_, v)| v)
        .sum()
}

/// `promtool check metrics` reads the exposition on stdin; silence and exit 0 mean no problem.
fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect(
            "promtool (Debian package prometheus, installed by tests/setup.sh) must be installed",
        );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool check metrics found problems:\n{report}\n--- exposition ---\n{text}"
    );
}

/// Scrapes until `ready` holds for the samples (counters are published asynchronously).
fn scrape_until(
    serve: &mut Serve,
    addr: &str,
    ready: impl Fn(&HashMap<String, f64>) -> bool,
) -> (String, HashMap<String, f64>) {
    let start = Instant::now();
    loop {
        serve.assert_running();
        if let Some(text) = scrape(addr) {
            let s = samples(&text);
            if ready(&s) {
                return (text, s);
            }
            assert!(
                start.elapsed() < UP_LIMIT,
                "metrics never became ready:\n{text}\n{}",
                serve.log_text()
            );
        }
        assert!(start.elapsed() < UP_LIMIT, "{}", serve.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What every live scrape must show for a partition that caught up with the source.
fn assert_partition_truth(
    text: &str,
    s: &HashMap<String, f64>,
    mirror: &str,
    topic: &str,
    ours: &Path,
    records: u64,
) {
    let l = format!(r#"mirror="{mirror}",topic="{topic}",partition="0""#);
    let on_disk = log_bytes(ours).len() as f64;
    assert!(on_disk > 0.0);
    assert_eq!(
        value(
            s,
            &format!("kmirror_partition_mirrored_bytes_total{{{l}}}"),
            text
        ),
        on_disk,
        "bytes mirrored differ from the bytes of our .log files"
    );
    let dump = dump_log_segments(&segment_files(ours), DumpFlags::DEEP_SANITY);
    let batches = dump
        .batches
        .iter()
        .filter(|b| b.file.extension().is_some_and(|e| e == "log"))
        .count() as f64;
    assert_eq!(
        value(
            s,
            &format!("kmirror_partition_mirrored_batches_total{{{l}}}"),
            text
        ),
        batches
    );
    assert_eq!(
        value(s, &format!("kmirror_partition_log_end_offset{{{l}}}"), text),
        records as f64
    );
    assert_eq!(
        value(s, &format!("kmirror_partition_lag_offsets{{{l}}}"), text),
        0.0
    );
    assert_eq!(
        value(s, &format!("kmirror_partition_lag_seconds{{{l}}}"), text),
        0.0
    );
    assert_eq!(
        value(
            s,
            &format!(r#"kmirror_partition_state{{{l},state="MIRRORING"}}"#),
            text
        ),
        1.0
    );
    assert_eq!(
        value(
            s,
            &format!(r#"kmirror_partition_state{{{l},state="FAILED"}}"#),
            text
        ),
        0.0
    );
    assert!(total(s, "kmirror_shard_written_bytes_total") >= on_disk);
    assert!(total(s, "kmirror_shard_uring_submissions_total") > 0.0);
    assert!(total(s, "kmirror_shard_uring_completions_total") > 0.0);
    assert!(total(s, "kmirror_shard_arena_slots") > 0.0);
    assert!(total(s, "kmirror_shard_fetch_round_trip_seconds_count") > 0.0);
    assert!(total(s, "kmirror_shard_append_seconds_count") > 0.0);
    assert!(value(s, "process_resident_memory_bytes", text) > 0.0);
    assert!(value(s, "process_open_fds", text) > 0.0);
}

fn fetched_and_appended(s: &HashMap<String, f64>, on_disk: f64) -> bool {
    total(s, "kmirror_partition_mirrored_bytes_total") >= on_disk
        && total(s, "kmirror_shard_append_seconds_count") > 0.0
        && total(s, "kmirror_shard_fetch_round_trip_seconds_count") > 0.0
}

#[test]
fn admin_port_serves_true_metrics() {
    let k = harness::shared();
    let topic = harness::unique_topic("ops-metrics");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 400, &ProduceOpts::default());

    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let config = work.path().join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    std::fs::write(
        &config,
        format!(
            "[admin]\nlisten = \"{admin}\"\n[storage]\ndata_dir = \"{}\"\n[runtime]\nshards = 1\n\
             arena_slot_bytes = 4194304\narena_slots = 4\n[fetch]\nmax_wait_ms = 100\n\
             max_bytes = 2097152\npartition_max_bytes = 262144\n",
            data_dir.display()
        ),
    )
    .unwrap();
    let props = work.path().join("source.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    let ours = data_dir.join(format!("{topic}-0"));
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .arg("mirrors")
            .args(args)
            .args(["--admin", &admin])
            .output()
            .unwrap()
    };
    // Before any mirror: the endpoint answers and the exposition is already valid.
    let (text, _) = scrape_until(&mut serve, &admin, |s| s.contains_key("process_open_fds"));
    promtool_check(&text);

    let created = cli(&[
        "create",
        "--mirror",
        "m",
        "--mirror-config",
        props.to_str().unwrap(),
    ]);
    assert!(created.status.success(), "{created:?}");
    let started = cli(&["start", "--mirror", "m", "--topics", &topic]);
    assert!(started.status.success(), "{started:?}");
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let on_disk = log_bytes(&ours).len() as f64;
    let (text, s) = scrape_until(&mut serve, &admin, |s| fetched_and_appended(s, on_disk));
    assert_partition_truth(&text, &s, "m", &topic, &ours, 400);
    promtool_check(&text);

    // Values move: more records, more bytes, and still equal to the disk.
    k.produce(&topic, 0, 100, &ProduceOpts::default());
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let on_disk2 = log_bytes(&ours).len() as f64;
    assert!(on_disk2 > on_disk);
    let (text, s) = scrape_until(&mut serve, &admin, |s| fetched_and_appended(s, on_disk2));
    assert_partition_truth(&text, &s, "m", &topic, &ours, 500);
    let appends = total(&s, "kmirror_shard_appends_total");

    let log = serve.sigterm_and_wait();
    assert!(log.contains("stopped cleanly"), "{log}");
    // Every append the shard timed is in the interval log it wrote under the data dir, as our
    // reader and HdrHistogram's own Java HistogramLogProcessor both read it.
    let latency_dir = data_dir.join("latency");
    let logged = kmirror::ops::latency::read_dir_totals(&latency_dir).unwrap();
    assert_eq!(
        logged.get("append").copied(),
        Some(appends as u64),
        "{logged:?}"
    );
    let mut java_total = 0;
    for file in std::fs::read_dir(&latency_dir).unwrap() {
        let file = file.unwrap().path();
        for latency in ["append", "fetch_round_trip"] {
            let java = java_log_processor_count(&file, &format!("{latency}.shard0"), work.path());
            let ours = kmirror::ops::latency::read_file(&file)
                .ok()
                .and_then(|m| m.get(latency).map(|h| h.len()))
                .unwrap_or(0);
            assert_eq!(java, ours, "{latency} in {}", file.display());
            if latency == "append" {
                java_total += java;
            }
        }
    }
    assert_eq!(java_total, appends as u64);
    // The CLI prints the table and draws the plot from the same file.
    let newest = std::fs::read_dir(&latency_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max()
        .unwrap();
    let svg = work.path().join("latency.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("latency")
        .arg(&newest)
        .arg("--plot")
        .arg(&svg)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.lines().any(|l| l.starts_with("append ")), "{table}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"));
}

/// Total count of `tag`'s histograms in `file` as HdrHistogram's Java HistogramLogProcessor
/// (org.hdrhistogram:HdrHistogram 2.2.2, in tests/kafka/pom.xml) reports it.
fn java_log_processor_count(file: &Path, tag: &str, work: &Path) -> u64 {
    let jar = harness::kafka_libs("4.1.1").join("HdrHistogram-2.2.2.jar");
    assert!(
        jar.exists(),
        "{} missing: run tests/kafka/fetch-jars.sh",
        jar.display()
    );
    let out_base = work.join(format!("hlp-{tag}"));
    let out = Command::new("java")
        .arg("-cp")
        .arg(&jar)
        .arg("org.HdrHistogram.HistogramLogProcessor")
        .arg("-i")
        .arg(file)
        .args(["-tag", tag, "-o"])
        .arg(&out_base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hgrm = std::fs::read_to_string(format!("{}.hgrm", out_base.display())).unwrap();
    // "#[Max     =        3.578, Total count    =            3]"
    hgrm.lines()
        .find_map(|l| {
            let r = l.split("Total count").nth(1)?;
            r.trim_start_matches([' ', '='])
                .trim_end_matches(']')
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no total count in\n{hgrm}"))
}

#[test]
fn static_mode_serves_metrics_on_its_own_port() {
    let k = harness::shared();
    let topic = harness::unique_topic("ops-metrics-static");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 300, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir) = mirror_support::write_config(work.path(), &k.bootstrap(), &[&topic]);
    let listen = format!("127.0.0.1:{}", free_loopback_port());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[metrics]\nlisten = \"{listen}\"\n"));
    std::fs::write(&config, text).unwrap();
    let ours = data_dir.join(format!("{topic}-0"));
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let on_disk = log_bytes(&ours).len() as f64;
    let (text, s) = scrape_until(&mut serve, &listen, |s| fetched_and_appended(s, on_disk));
    assert_partition_truth(&text, &s, "static", &topic, &ours, 300);
    promtool_check(&text);
    let log = serve.sigterm_and_wait();
    assert!(log.contains("stopped cleanly"), "{log}");
    // The static mode now closes its log dir like the control plane does.
    assert!(data_dir.join(".kafka_cleanshutdown").exists(), "{log}");
}
