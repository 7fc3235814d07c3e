//! Goal: an operator scraping `/metrics` of a running `kmirror serve` sees the truth. Method: a
//! real Kafka 4.1.1 broker and its Java producer; the `kmirror` binary mirroring in both modes:
//! with `[admin]` (mirror created and started through the CLI, `/metrics` on the admin port) and
//! static `[source]` with `[metrics] listen`. After the mirror caught up (our `.log` bytes equal
//! the broker's), the scrape must say: bytes mirrored = the bytes of our `.log` files, batches
//! mirrored = the batches Kafka's DumpLogSegments lists in them, lag 0, log end = records
//! produced, state MIRRORING, shard counters moving (uring submissions and completions, fetch
//! round trips, arena slots); Prometheus' own `promtool check metrics` must report no problem
//! with the exposition. After SIGTERM the latency interval log under the data dir must hold the
//! appends the scrape counted. The data dir's free and total bytes equal what `df` says, and
//! `kmirror_source_reachable` follows the source: 1 while it answers, 0 while a proxy in
//! between cuts it off, 1 again after.
//!
//! The operator files under `ops/`: `promtool check rules` and `promtool test rules` pass on
//! the alert rules, the Grafana dashboard is importable JSON, and every metric named by a rule
//! or by a query of the dashboard is one the live scrape of the admin-mode kmirror offers.

mod harness;
mod mirror_support;
mod ops_files;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use harness::dump::{dump_log_segments, segment_files, DumpFlags};
use harness::proxy::{Fault, FaultProxy};
use harness::serve::{log_bytes, wait_mirrored, Serve};
use harness::ProduceOpts;

/// Failure guard for the endpoints to come up and counters to be published, not a performance
/// claim.
const UP_LIMIT: Duration = Duration::from_secs(60);

fn free_loopback_port() -> u16 {
    harness::ports::reserved_port()
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

/// Runs `promtool args` in `dir` with `stdin`; its exit status and what it printed.
fn promtool(args: &[&str], dir: &Path, stdin: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
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
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), report)
}

/// `promtool check metrics` reads the exposition on stdin; silence and exit 0 mean no problem.
fn promtool_check(text: &str) {
    let (ok, report) = promtool(&["check", "metrics"], Path::new("."), text);
    assert!(
        ok && report.trim().is_empty(),
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
    // The default runtime.log_writes writes on the shard thread while writes stay fast.
    assert!(total(s, "kmirror_shard_log_writes_inline_total") > 0.0);
    assert!(s
        .keys()
        .any(|k| k.starts_with("kmirror_shard_log_writes_inline_slow_total{")));
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
    assert_eq!(
        value(&s, r#"kmirror_source_reachable{mirror="m"}"#, &text),
        1.0
    );
    assert_data_dir_space(&text, &s, &data_dir);
    let exposition = text.clone();
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
    // Last, as it needs the shard health metrics of the watchdog too: every metric the alert
    // rules and the dashboard query is in the live scrape.
    assert_ops_files_query_exported(&exposition);
}

/// The data dir gauges against `df -B1` (coreutils), asked right after the scrape.
fn assert_data_dir_space(text: &str, s: &HashMap<String, f64>, data_dir: &Path) {
    let out = Command::new("df")
        .args(["-B1", "--output=size,avail"])
        .arg(data_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let df = String::from_utf8(out.stdout).unwrap();
    let row: Vec<f64> = df
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("df printed {df}"))
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let (size, avail) = (row[0], row[1]);
    let capacity = value(s, "kmirror_data_dir_capacity_bytes", text);
    let free = value(s, "kmirror_data_dir_free_bytes", text);
    assert_eq!(capacity, size, "capacity differs from df's size");
    // Other processes write to the same disk between the scrape and df: 1% of it is room.
    assert!(
        free > 0.0 && free <= capacity && (free - avail).abs() <= size / 100.0,
        "free {free} vs df's avail {avail} of {size}"
    );
}

/// Every metric named by an alert rule or a dashboard query is offered by `exposition`.
fn assert_ops_files_query_exported(exposition: &str) {
    let exported = ops_files::exported_names(exposition);
    let rules = std::fs::read_to_string(ops_files::ops_dir().join(ops_files::ALERT_RULES)).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ops_files::ops_dir().join(ops_files::DASHBOARD)).unwrap(),
    )
    .expect("the dashboard is valid JSON");
    let mut missing = Vec::new();
    let mut checked = std::collections::BTreeSet::new();
    let queries = ops_files::rule_exprs(&rules)
        .into_iter()
        .map(|q| ("alert rule", q))
        .chain(
            ops_files::dashboard_exprs(&dashboard)
                .into_iter()
                .map(|q| ("dashboard", q)),
        );
    for (file, q) in queries {
        let names = ops_files::metric_names(&q);
        assert!(!names.is_empty(), "{file} query names no metric: {q}");
        for n in names {
            if ops_files::PROMETHEUS_SERIES.contains(&n.as_str()) {
                continue;
            }
            if !exported.contains(&n) {
                missing.push(format!("{n} ({file}: {q})"));
            }
            checked.insert(n);
        }
    }
    assert!(checked.len() >= 15, "too few metrics found: {checked:?}");
    assert!(
        missing.is_empty(),
        "queried but not exported by kmirror:\n{}\n--- exposition ---\n{exposition}",
        missing.join("\n")
    );
}

/// `promtool check rules` accepts the alert rules and `promtool test rules` passes their unit
/// tests; the rule count promtool reports is the count of `expr:` lines the name check reads.
#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let dir = ops_files::ops_dir();
    let (ok, report) = promtool(&["check", "rules", ops_files::ALERT_RULES], &dir, "");
    assert!(ok, "promtool check rules:\n{report}");
    let rules = std::fs::read_to_string(dir.join(ops_files::ALERT_RULES)).unwrap();
    let exprs = ops_files::rule_exprs(&rules);
    assert!(
        report.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "promtool counts other rules than the {} expr lines:\n{report}",
        exprs.len()
    );
    let prom_dir = dir.join("prometheus");
    let test_file = Path::new(ops_files::ALERT_TESTS).file_name().unwrap();
    let (ok, report) = promtool(
        &["test", "rules", test_file.to_str().unwrap()],
        &prom_dir,
        "",
    );
    assert!(
        ok && report.contains("SUCCESS"),
        "promtool test rules:\n{report}"
    );
    // Every alert of the rules has a unit test.
    let tests = std::fs::read_to_string(dir.join(ops_files::ALERT_TESTS)).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
    {
        let alert = alert.trim();
        assert!(
            tests.contains(&format!("alertname: {alert}\n")),
            "no promtool unit test for {alert}"
        );
    }
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

/// A static-mode config mirroring `topic` from `bootstrap` with `[metrics] listen` on a free
/// port: (config, data dir, metrics address).
fn static_config(work: &Path, bootstrap: &str, topic: &str) -> (PathBuf, PathBuf, String) {
    let (config, data_dir) = mirror_support::write_config(work, bootstrap, &[topic]);
    let listen = format!("127.0.0.1:{}", free_loopback_port());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("[metrics]\nlisten = \"{listen}\"\n"));
    std::fs::write(&config, text).unwrap();
    (config, data_dir, listen)
}

#[test]
fn static_mode_serves_metrics_on_its_own_port() {
    let k = harness::shared();
    let topic = harness::unique_topic("ops-metrics-static");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 300, &ProduceOpts::default());
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir, listen) = static_config(work.path(), &k.bootstrap(), &topic);
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

#[test]
fn source_reachable_follows_the_source_connection() {
    let k = harness::shared();
    let topic = harness::unique_topic("ops-metrics-reach");
    k.create_topic(&topic, 1, &[]);
    k.produce(&topic, 0, 50, &ProduceOpts::default());
    let proxy = FaultProxy::start(k.bootstrap().parse().unwrap(), Fault::None);
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir, listen) = static_config(work.path(), &proxy.bootstrap(), &topic);
    let ours = data_dir.join(format!("{topic}-0"));
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let key = r#"kmirror_source_reachable{mirror="static"}"#;
    let reachable = |want: f64| move |s: &HashMap<String, f64>| s.get(key) == Some(&want);
    scrape_until(&mut serve, &listen, reachable(1.0));
    // Cut off: the connections close and reconnecting gets no answer.
    proxy.sever(true);
    let (text, s) = scrape_until(&mut serve, &listen, reachable(0.0));
    assert!(
        total(&s, "kmirror_partition_fetch_errors_total") > 0.0,
        "the lost connection counts as a fetch error:\n{text}"
    );
    // Back: it answers again and mirroring goes on.
    proxy.sever(false);
    scrape_until(&mut serve, &listen, reachable(1.0));
    k.produce(&topic, 0, 50, &ProduceOpts::default());
    wait_mirrored(&mut serve, &k.partition_dir(&topic, 0), &ours);
    let log = serve.sigterm_and_wait();
    assert!(log.contains("stopped cleanly"), "{log}");
}

/// The dashboard imports as it is: a uid, unique panel ids, panels inside the 24-column grid
/// without overlapping, and every query panel on the `datasource` variable it declares, with
/// distinct refIds.
#[test]
fn dashboard_is_importable_grafana_json() {
    let path = ops_files::ops_dir().join(ops_files::DASHBOARD);
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "no uid");
    assert!(d["schemaVersion"].as_u64().is_some(), "no schemaVersion");
    let vars = d["templating"]["list"].as_array().expect("templating list");
    assert!(
        vars.iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
        "no datasource variable"
    );
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = std::collections::BTreeSet::new();
    let mut boxes: Vec<(u64, u64, u64, u64, &str)> = Vec::new();
    for p in panels {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "id twice: {title}"
        );
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().expect("gridPos"));
        assert!(x + w <= 24 && w > 0 && h > 0, "{title} outside the grid");
        for &(x2, y2, w2, h2, other) in &boxes {
            let apart = x + w <= x2 || x2 + w2 <= x || y + h <= y2 || y2 + h2 <= y;
            assert!(apart, "{title} overlaps {other}");
        }
        boxes.push((x, y, w, h, title));
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        let refs: std::collections::BTreeSet<&str> = targets
            .iter()
            .map(|t| t["refId"].as_str().expect("refId"))
            .collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds repeat");
    }
}

/// Fetch requests of every shard by kind, from a scrape's samples: (full, incremental).
fn fetch_kinds(s: &HashMap<String, f64>) -> (f64, f64) {
    let sum = |kind: &str| -> f64 {
        s.iter()
            .filter(|(k, _)| {
                k.starts_with("kmirror_shard_fetch_requests_total{")
                    && k.contains(&format!("kind=\"{kind}\""))
            })
            .map(|(_, v)| v)
            .sum()
    };
    (sum("full"), sum("incremental"))
}

// Goal: against a real Kafka 4.1.1 broker kmirror's fetches go incremental once the broker
// granted a fetch session (KIP-227: only partitions whose position moved are listed, so the
// idle ones cost nothing per request), and a mirror of many partitions, most of them empty,
// stays byte-identical to the broker's logs. Observed through
// `kmirror_shard_fetch_requests_total{kind}`, whose full and incremental counts must add up to
// the shard's fetch count.
#[test]
fn fetches_to_a_real_broker_go_incremental_and_the_mirror_stays_identical() {
    const PARTITIONS: i32 = 32;
    let k = harness::shared();
    let topic = harness::unique_topic("ops-metrics-sessions");
    k.create_topic(&topic, PARTITIONS, &[]);
    for p in [0, 9, 17, 31] {
        let opts = ProduceOpts {
            seed: p as u64,
            ..ProduceOpts::default()
        };
        k.produce(&topic, p, 200, &opts);
    }
    let work = tempfile::tempdir().unwrap();
    let (config, data_dir, listen) = static_config(work.path(), &k.bootstrap(), &topic);
    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let pairs: Vec<(PathBuf, PathBuf)> = (0..PARTITIONS)
        .map(|p| {
            (
                k.partition_dir(&topic, p),
                data_dir.join(format!("{topic}-{p}")),
            )
        })
        .collect();
    // (It waits for non-empty logs only; the empty partitions are compared after the stop.)
    let with_data: Vec<(PathBuf, PathBuf)> =
        [0, 9, 17, 31].iter().map(|&p| pairs[p].clone()).collect();
    harness::serve::wait_all_mirrored(&mut serve, &with_data);
    // Caught up, the fetchers long-poll (max_wait_ms 100) inside their sessions.
    let (text, s) = scrape_until(&mut serve, &listen, |s| fetch_kinds(s).1 >= 10.0);
    let (full, incremental) = fetch_kinds(&s);
    assert!(
        full >= 1.0 && incremental > full,
        "full {full}, incremental {incremental}:\n{text}"
    );
    assert_eq!(
        harness::serve::fetch_requests(&text),
        (full as u64, incremental as u64),
        "the harness parser agrees"
    );
    serve.sigterm_and_wait();
    for (theirs, ours) in &pairs {
        assert!(
            log_bytes(ours) == log_bytes(theirs),
            "{} differs from the broker",
            ours.display()
        );
    }
}
