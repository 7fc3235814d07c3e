//! Goal: kmirror runs under systemd as shipped in systemd/. Method: systemd's own tools on our
//! files (`systemd-analyze verify` of kmirror.service with ExecStart pointing at the built
//! binary, and a broken copy as a control that verify does report problems; `systemd-analyze
//! security --offline` exposure ≤ 2.0; `systemd-sysusers`/`systemd-tmpfiles` dry runs of the
//! snippets), the example config loads with our config parser, and the real `kmirror serve`
//! binary talks the sd_notify protocol to a unix datagram socket we listen on as NOTIFY_SOCKET:
//! READY=1 only once the admin API answers, WATCHDOG=1 repeatedly when WATCHDOG_USEC is set,
//! STOPPING=1 after SIGTERM, then a clean exit.
//!
//! The unit's SystemCallFilter allows every syscall kmirror makes: `kmirror serve` runs under
//! `strace -f -c` through mirror (a real Kafka source) → serve (the Java consumer, a group
//! member) → failover (`mirrors stop`, a Java producer writing to kmirror) → SIGTERM → a
//! clean restart → SIGTERM, and every syscall strace counted is checked against the unit's
//! filter as systemd builds it from `systemd-analyze syscall-filter`'s groups. The same run
//! measures the gaps between WATCHDOG=1 pings and the files kmirror holds open per segment;
//! with them the unit's WatchdogSec, LimitNOFILE and LimitMEMLOCK are checked against the
//! sizing point in tuning/README.md.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::groups::group_consume;
use harness::mirrors_cli::{
    cli_ok, create_mirror, free_loopback_port, wait_admin, write_serving_config,
};
use harness::serve::{wait_all_mirrored, Launch, Serve};
use harness::{Isolation, ProduceOpts};

/// Failure guard for the notifications to arrive, not a performance claim.
const NOTIFY_LIMIT: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// kmirror.service with ExecStart naming the binary under test (verify checks it exists).
fn unit_copy(dir: &Path, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("systemd/kmirror.service")).unwrap();
    let text = text.replace("/usr/bin/kmirror", env!("CARGO_BIN_EXE_kmirror"));
    let path = dir.join("kmirror.service");
    std::fs::write(
        &path,
        text.replace("[Service]\n", &format!("[Service]\n{extra}")),
    )
    .unwrap();
    path
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (tests/setup.sh installs systemd)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn unit_verifies_clean_and_broken_copy_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_copy(dir.path(), "");
    let (ok, text) = run(Command::new("systemd-analyze").arg("verify").arg(&unit));
    assert!(ok && text.trim().is_empty(), "verify:\n{text}");

    let broken = tempfile::tempdir().unwrap();
    let unit = unit_copy(broken.path(), "LimitMEMLOK=1G\n");
    let (_, text) = run(Command::new("systemd-analyze").arg("verify").arg(&unit));
    assert!(
        text.contains("LimitMEMLOK"),
        "verify missed a bad key:\n{text}"
    );
}

#[test]
fn unit_security_exposure_is_at_most_2() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_copy(dir.path(), "");
    let (_, text) = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit));
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level for kmirror.service"))
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    let score: f64 = line
        .split(": ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable: {line}"));
    assert!(score <= 2.0, "exposure {score} > 2.0:\n{text}");
}

#[test]
fn sysusers_and_tmpfiles_snippets_create_user_and_dirs() {
    use std::os::unix::fs::MetadataExt;
    // Applied to a scratch root: sysusers writes the user into <root>/etc/passwd, and tmpfiles
    // resolves the owner inside the same root.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("etc")).unwrap();
    let (ok, text) = run(Command::new("systemd-sysusers")
        .arg(format!("--root={}", root.path().display()))
        .arg(repo().join("systemd/kmirror.sysusers.conf")));
    assert!(ok, "sysusers:\n{text}");
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    let uid: u32 = passwd
        .lines()
        .find(|l| l.starts_with("kmirror:"))
        .and_then(|l| l.split(':').nth(2))
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no kmirror user in {passwd}"));
    let (ok, text) = run(Command::new("systemd-tmpfiles")
        .arg("--create")
        .arg("--root")
        .arg(root.path())
        .arg(repo().join("systemd/kmirror.tmpfiles.conf")));
    assert!(ok, "tmpfiles:\n{text}");
    for d in ["var/lib/kmirror", "var/lib/kmirror/data"] {
        let m = std::fs::metadata(root.path().join(d)).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.uid(), uid, "{d} not owned by kmirror");
        assert_eq!(m.mode() & 0o777, 0o750, "{d}");
    }
}

#[test]
fn example_config_loads() {
    let c =
        kmirror::config::ServeConfig::load(&repo().join("systemd/kmirror.toml.example")).unwrap();
    assert!(c.admin.is_some());
    assert_eq!(
        c.storage.data_dir,
        PathBuf::from("/var/lib/kmirror/data"),
        "the example must use the unit's StateDirectory"
    );
}

#[test]
fn serve_notifies_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let config = dir.path().join("kmirror.toml");
    std::fs::write(
        &config,
        format!(
            "[admin]\nlisten = \"{admin}\"\n[storage]\ndata_dir = \"{}\"\n[runtime]\nshards = 1\n\
             arena_slot_bytes = 4194304\narena_slots = 2\n[fetch]\nmax_bytes = 2097152\n\
             partition_max_bytes = 262144\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &sock_path)
        // 1 s: pings every 0.5 s.
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(dir.path().join("serve.log")).unwrap_or_default();
    let mut buf = [0u8; 4096];
    let mut recv = |until: &mut dyn FnMut(&str) -> bool| -> Vec<String> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            assert!(
                start.elapsed() < NOTIFY_LIMIT,
                "notifications so far: {seen:?}\n{}",
                log_text()
            );
            if let Ok(n) = sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = until(&msg);
                seen.push(msg);
                if done {
                    return seen;
                }
            }
        }
    };
    let before_ready = recv(&mut |m| m.lines().any(|l| l == "READY=1"));
    assert!(
        !before_ready.iter().any(|m| m.contains("WATCHDOG=1")),
        "watchdog before READY: {before_ready:?}"
    );
    // READY means serving: the admin API answers right away.
    let listed = ureq::get(&format!("http://{admin}/mirrors")).call();
    assert!(listed.is_ok(), "admin API not up at READY: {listed:?}");
    let mut pings = 0;
    recv(&mut |m| {
        if m.lines().any(|l| l == "WATCHDOG=1") {
            pings += 1;
        }
        pings >= 3
    });
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    recv(&mut |m| m.lines().any(|l| l == "STOPPING=1"));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}\n{}", log_text());
    assert!(log_text().contains("stopped cleanly"), "{}", log_text());
}

/// The values of `key=` in the [Service] section of the shipped unit, in file order.
fn unit_values(key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("systemd/kmirror.service")).unwrap();
    let mut in_service = false;
    let mut values = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service {
            if let Some(v) = line.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
                values.push(v.trim().to_string());
            }
        }
    }
    values
}

/// The one value of `key=` in the unit.
fn unit_value(key: &str) -> String {
    let values = unit_values(key);
    assert_eq!(values.len(), 1, "{key}= in the unit: {values:?}");
    values[0].clone()
}

/// systemd's syscall groups (`@name` → members, which may be groups), as this host's
/// `systemd-analyze syscall-filter` lists them.
fn syscall_groups() -> BTreeMap<String, Vec<String>> {
    let (ok, text) = run(Command::new("systemd-analyze").arg("syscall-filter"));
    assert!(ok, "systemd-analyze syscall-filter:\n{text}");
    let mut groups = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('@') {
            current = Some(format!("@{}", name.trim()));
            groups.insert(current.clone().unwrap(), Vec::new());
        } else if let Some(member) = line.strip_prefix("    ") {
            let member = member.trim();
            // "    # description" lines belong to the group header.
            if !member.starts_with('#') && !member.is_empty() {
                let group = current.as_ref().expect("a member before any group");
                groups.get_mut(group).unwrap().push(member.to_string());
            }
        } else {
            // A blank line or a top-level comment (the ungrouped syscalls) ends a group.
            current = None;
        }
    }
    assert!(
        groups.contains_key("@system-service") && groups.len() > 10,
        "no groups parsed from:\n{text}"
    );
    groups
}

/// Adds `item` (a syscall or `@group`, expanded recursively) to `out`.
fn expand(item: &str, groups: &BTreeMap<String, Vec<String>>, out: &mut BTreeSet<String>) {
    if item.starts_with('@') {
        let members = groups
            .get(item)
            .unwrap_or_else(|| panic!("systemd knows no syscall group {item}"));
        for m in members {
            expand(m, groups, out);
        }
    } else {
        out.insert(item.to_string());
    }
}

/// A seccomp filter as systemd builds it from `SystemCallFilter=` lines (systemd.exec(5)):
/// the first non-empty line decides the mode (a list of allowed syscalls, or with `~` of
/// refused ones); each later line adds its syscalls to the set or, with the other prefix,
/// removes them; an empty value resets everything before it. (In allow mode systemd also
/// allows @default; it is part of @system-service, and leaving it out could only refuse more.)
#[derive(Debug)]
struct SyscallFilter {
    allow_list: Option<bool>,
    set: BTreeSet<String>,
}

impl SyscallFilter {
    fn build(lines: &[String], groups: &BTreeMap<String, Vec<String>>) -> SyscallFilter {
        let mut f = SyscallFilter {
            allow_list: None,
            set: BTreeSet::new(),
        };
        for line in lines {
            if line.is_empty() {
                f.allow_list = None;
                f.set.clear();
                continue;
            }
            let (deny, names) = match line.strip_prefix('~') {
                Some(rest) => (true, rest),
                None => (false, line.as_str()),
            };
            let allow_list = *f.allow_list.get_or_insert(!deny);
            let mut listed = BTreeSet::new();
            for name in names.split_whitespace() {
                expand(name, groups, &mut listed);
            }
            // In allow mode an allow line adds and a deny line removes; in deny mode the
            // reverse.
            if allow_list != deny {
                f.set.extend(listed);
            } else {
                f.set.retain(|s| !listed.contains(s));
            }
        }
        f
    }

    fn allows(&self, syscall: &str) -> bool {
        match self.allow_list {
            None => true,
            Some(true) => self.set.contains(syscall),
            Some(false) => !self.set.contains(syscall),
        }
    }
}

/// Syscall names from an `strace -c` summary table.
fn strace_summary_syscalls(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let names: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('%') && !l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .filter(|name| *name != "total")
        .map(str::to_string)
        .collect();
    assert!(names.contains("execve"), "not an strace summary:\n{text}");
    names
}

/// The syscalls of `recorded` that `filter` refuses.
fn refused(filter: &SyscallFilter, recorded: &BTreeSet<String>) -> Vec<String> {
    recorded
        .iter()
        .filter(|s| !filter.allows(s))
        .cloned()
        .collect()
}

/// The evaluator itself, on the filter shipped before sched_setaffinity was allowed: it must
/// refuse that call (a shard pins itself with it and fails without) and allow io_uring.
#[test]
fn syscall_filter_evaluation_follows_systemd() {
    let groups = syscall_groups();
    let old = [
        "@system-service io_uring_setup io_uring_enter io_uring_register".to_string(),
        "~@privileged @resources".to_string(),
    ];
    let f = SyscallFilter::build(&old, &groups);
    assert!(!f.allows("sched_setaffinity"));
    assert!(!f.allows("setuid"), "@privileged");
    assert!(f.allows("io_uring_enter") && f.allows("read") && f.allows("sched_getaffinity"));
    assert!(!f.allows("kexec_load"), "not in @system-service");
    // A later allow line puts one call of a removed group back, and an empty value resets.
    let mut more = old.to_vec();
    more.push("sched_setaffinity".to_string());
    let f = SyscallFilter::build(&more, &groups);
    assert!(f.allows("sched_setaffinity") && !f.allows("setpriority"));
    more.push(String::new());
    assert!(SyscallFilter::build(&more, &groups).allows("kexec_load"));
    // Deny mode.
    let f = SyscallFilter::build(&["~@mount".to_string()], &groups);
    assert!(!f.allows("mount") && f.allows("kexec_load"));
}

/// What the run around kmirror observed.
#[derive(Debug, Default)]
struct Observed {
    /// Largest time between two WATCHDOG=1 pings (and from READY=1 to the first).
    largest_ping_gap: Duration,
    pings: usize,
    /// Largest number of files one segment of a partition held open.
    files_per_segment: usize,
    /// Open fds outside the partition directories (sockets, rings, keyed logs, ...).
    other_fds: usize,
}

/// The watchdog interval the run asks for: short, so its pings show how long the control
/// thread can go without one. kmirror pings at half of it.
const RUN_WATCHDOG: Duration = Duration::from_secs(2);

/// Failure guard for the notifications of one run, not a performance claim.
const RUN_NOTIFY_LIMIT: Duration = Duration::from_secs(300);

/// Receives sd_notify datagrams on a thread, with their arrival times.
struct NotifyListener {
    path: PathBuf,
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl NotifyListener {
    fn bind(path: PathBuf) -> NotifyListener {
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sink, halt) = (Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    sink.lock().unwrap().push((Instant::now(), msg));
                }
            }
        });
        NotifyListener { path, seen, stop }
    }

    fn wait_for(&self, line: &str) {
        let start = Instant::now();
        while !self.has(line) {
            assert!(
                start.elapsed() < RUN_NOTIFY_LIMIT,
                "no {line} in {:?}",
                self.seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn has(&self, line: &str) -> bool {
        let seen = self.seen.lock().unwrap();
        seen.iter().any(|(_, m)| m.lines().any(|l| l == line))
    }

    /// (largest gap, pings) between READY=1 and STOPPING=1.
    fn ping_gaps(&self) -> (Duration, usize) {
        let seen = self.seen.lock().unwrap();
        let at = |line: &str| {
            seen.iter()
                .find(|(_, m)| m.lines().any(|l| l == line))
                .map(|(t, _)| *t)
                .unwrap_or_else(|| panic!("no {line} in {seen:?}"))
        };
        let (ready, stopping) = (at("READY=1"), at("STOPPING=1"));
        let mut last = ready;
        let (mut largest, mut pings) = (Duration::ZERO, 0);
        for (t, m) in seen.iter() {
            if *t > ready && *t <= stopping && m.lines().any(|l| l == "WATCHDOG=1") {
                largest = largest.max(*t - last);
                last = *t;
                pings += 1;
            }
        }
        (largest.max(stopping - last), pings)
    }
}

impl Drop for NotifyListener {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Starts `kmirror serve` under `strace -f -qq -c -o summary` with a watchdog.
fn traced_serve(config: &Path, log: PathBuf, summary: &Path, notify: &NotifyListener) -> Serve {
    let launch = Launch {
        wrapper: ["strace", "-f", "-qq", "-c", "-o"]
            .iter()
            .map(OsString::from)
            .chain([summary.as_os_str().to_owned(), OsString::from("--")])
            .collect(),
        env: vec![
            ("NOTIFY_SOCKET".into(), notify.path.clone().into()),
            (
                "WATCHDOG_USEC".into(),
                RUN_WATCHDOG.as_micros().to_string().into(),
            ),
        ],
    };
    Serve::start_with(config, log, &launch)
}

/// Files kmirror holds open: (most per segment of any partition, fds outside them).
fn open_files(pid: u32, data_dir: &Path) -> (usize, usize) {
    let mut per_dir: BTreeMap<PathBuf, usize> = BTreeMap::new();
    let mut other = 0;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let Ok(target) = std::fs::read_link(fd.unwrap().path()) else {
            continue;
        };
        match target.parent() {
            Some(dir) if dir.parent() == Some(data_dir) && !dir.ends_with("latency") => {
                *per_dir.entry(dir.to_path_buf()).or_default() += 1;
            }
            _ => other += 1,
        }
    }
    let per_segment = per_dir
        .iter()
        .map(|(dir, n)| n.div_ceil(harness::serve::log_files(dir).len().max(1)))
        .max()
        .unwrap_or(0);
    (per_segment, other)
}

/// mirror → serve → failover → shutdown, then a clean restart and shutdown, all under strace.
/// Returns the syscalls of both runs and what was observed.
fn traced_run() -> (BTreeSet<String>, Observed) {
    let k = harness::shared();
    let topic = harness::unique_topic("sys");
    k.create_topic(&topic, 2, &[]);
    let opts = ProduceOpts {
        spread: 2,
        ..ProduceOpts::default()
    };
    k.produce(&topic, 0, 20, &opts);
    let work = tempfile::tempdir().unwrap();
    let data_dir = work.path().join("data");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    let config = work.path().join("kmirror.toml");
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &data_dir, "");
    let mut observed = Observed::default();
    let mut syscalls = BTreeSet::new();
    // Run `n` under strace, serving once READY=1 was sent and the admin API answers.
    let start = |n: u32| {
        let notify = NotifyListener::bind(work.path().join(format!("notify{n}.sock")));
        let summary = work.path().join(format!("strace{n}.txt"));
        let mut serve = traced_serve(&config, work.path().join("serve.log"), &summary, &notify);
        notify.wait_for("READY=1");
        wait_admin(&mut serve, &admin);
        (serve, notify, summary)
    };

    let (mut serve, notify, summary) = start(1);
    let kmirror = serve.kafka_listener();
    create_mirror(&admin, work.path(), "m", &k.bootstrap(), "");
    cli_ok(&admin, &["start", "--mirror", "m", "--topics", &topic]);
    wait_all_mirrored(&mut serve, &k.mirror_pairs(&topic, 2, &data_dir));
    // Serve: the Java consumer reads a partition, a group member reads and commits, /metrics.
    let read = harness::consume(&kmirror, &topic, 0, 0, 10, Isolation::ReadCommitted);
    assert_eq!(read.len(), 10);
    assert_eq!(group_consume(&kmirror, &topic, "g", 5).len(), 5);
    let metrics = ureq::get(&format!("http://{admin}/metrics")).call();
    assert!(metrics.is_ok(), "{metrics:?}");
    // Failover, then a produce to kmirror.
    cli_ok(&admin, &["stop", "--mirror", "m", "--topics", &topic]);
    harness::produce(&kmirror, &topic, 0, 5, &ProduceOpts::default());
    let pid = serve.pid();
    (observed.files_per_segment, observed.other_fds) = open_files(pid, &data_dir);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    (observed.largest_ping_gap, observed.pings) = notify.ping_gaps();
    syscalls.extend(strace_summary_syscalls(&summary));

    // A restart opens everything written above (logs, keyed logs, leader store).
    let (serve, _notify, summary) = start(2);
    let text = serve.sigterm_and_wait();
    assert!(text.contains("stopped cleanly"), "{text}");
    syscalls.extend(strace_summary_syscalls(&summary));
    (syscalls, observed)
}

/// The sizing point tuning/README.md ("What the shipped unit is sized for") states; the unit's
/// limits must cover it.
const SIZED_PARTITIONS: usize = 16_384;
const SIZED_SOCKETS: usize = 65_536;
const SIZED_SHARDS: usize = 8;
const SIZED_ARENA_SLOTS: usize = 8;
const SIZED_ARENA_SLOT_BYTES: usize = 64 << 20;
const SIZED_FETCH_MAX_BYTES: usize = 63 << 20;

/// A systemd size (`4G`, `512M`, `1048576`, `infinity`) in bytes (1024-based, as systemd).
fn systemd_bytes(v: &str) -> u64 {
    if v == "infinity" {
        return u64::MAX;
    }
    let (digits, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("size {v:?}"));
    n << match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => panic!("unit {other:?} in {v:?}"),
    }
}

/// A systemd time span in whole seconds (`30s`, `1min`, `30`).
fn systemd_seconds(v: &str) -> u64 {
    if let Some(m) = v.strip_suffix("min") {
        return m.parse::<u64>().unwrap() * 60;
    }
    v.trim_end_matches('s')
        .parse()
        .unwrap_or_else(|_| panic!("time {v:?}"))
}

#[test]
fn unit_allows_every_syscall_and_its_limits_cover_the_sizing_point() {
    let groups = syscall_groups();
    let filter = SyscallFilter::build(&unit_values("SystemCallFilter"), &groups);
    let (syscalls, observed) = traced_run();
    let missing = refused(&filter, &syscalls);
    assert!(
        missing.is_empty(),
        "the unit's SystemCallFilter refuses syscalls kmirror made: {missing:?} \
         (all recorded: {syscalls:?})"
    );
    eprintln!(
        "{} syscalls recorded, all allowed; observed {observed:?}",
        syscalls.len()
    );

    // WatchdogSec: pings come every WatchdogSec/2 plus however long the control thread went
    // without a turn; in the run (short interval, under strace) that stall was at most
    // largest_gap - RUN_WATCHDOG/2, and it must fit in the other half of the unit's interval.
    let watchdog = Duration::from_secs(systemd_seconds(&unit_value("WatchdogSec")));
    assert!(observed.pings >= 2, "{observed:?}");
    let stall = observed.largest_ping_gap.saturating_sub(RUN_WATCHDOG / 2);
    assert!(
        stall < watchdog / 2,
        "the control thread went {stall:?} without a ping; WatchdogSec={watchdog:?} leaves \
         only {:?}",
        watchdog / 2
    );

    // LimitNOFILE (log/lazy_file): a partition holds at most its active segment's files (the
    // .log once written; .index, .timeindex, .txnindex only within INDEX_FILES_HELD_MAX for the
    // whole process), sealed segments none; so the need is one per partition plus the index
    // budget, whatever the segment count.
    assert!(observed.files_per_segment <= 4, "{observed:?}");
    let nofile_needed = SIZED_PARTITIONS
        + kmirror::limits::INDEX_FILES_HELD_MAX
        + SIZED_SOCKETS
        + observed.other_fds;
    let nofile = systemd_bytes(&unit_value("LimitNOFILE"));
    assert!(
        nofile >= nofile_needed as u64,
        "LimitNOFILE={nofile} < {nofile_needed} = {SIZED_PARTITIONS} partitions x 1 (.log) + \
         {} index files + {SIZED_SOCKETS} sockets + {} other",
        kmirror::limits::INDEX_FILES_HELD_MAX,
        observed.other_fds
    );

    // LimitMEMLOCK: what `kmirror serve` checks at start (Runtime::start) for a config at the
    // sizing point, which must itself be valid.
    let sized = format!(
        "[admin]\nlisten = \"127.0.0.1:9190\"\n[storage]\ndata_dir = \"/var/lib/kmirror/data\"\n\
         [runtime]\nshards = {SIZED_SHARDS}\narena_slots = {SIZED_ARENA_SLOTS}\n\
         arena_slot_bytes = {SIZED_ARENA_SLOT_BYTES}\n[fetch]\nmax_bytes = {SIZED_FETCH_MAX_BYTES}\n"
    );
    let rt = kmirror::config::ServeConfig::parse(&sized)
        .unwrap_or_else(|e| panic!("sizing point config: {e}\n{sized}"))
        .runtime_config();
    let memlock_needed = (rt.shards * rt.arena_slots * rt.arena_slot_bytes) as u64;
    let memlock = systemd_bytes(&unit_value("LimitMEMLOCK"));
    assert!(
        memlock >= memlock_needed,
        "LimitMEMLOCK={memlock} < {memlock_needed} = {} shards x {} slots x {} bytes",
        rt.shards,
        rt.arena_slots,
        rt.arena_slot_bytes
    );
}
