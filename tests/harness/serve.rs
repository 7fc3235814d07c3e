//! Running the `kmirror serve` binary in a test and waiting until its partition logs equal the
//! broker's byte for byte.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound on waiting for the mirror to make progress (one more partition equal to the
/// broker's): a failure guard, not a performance claim (a 100-partition topic on a loaded
/// 2-core machine set it; larger topics get it anew after each partition that finishes).
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(180);

/// The serve log without the ANSI colour codes tracing puts around field names.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Every `.log` segment of a partition directory, in offset order, concatenated.
pub fn log_bytes(dir: &Path) -> Vec<u8> {
    log_files(dir)
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap_or_default())
        .collect()
}

/// The `.log` segment files of a partition directory, in offset order.
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect(),
        Err(_) => return Vec::new(),
    };
    logs.sort();
    logs
}

/// A running `kmirror serve`; killed when dropped.
pub struct Serve {
    /// kmirror itself, or the wrapper that runs it (see `Launch::wrapper`).
    pub child: Child,
    pub log: PathBuf,
    /// Length of `log` when this process started: earlier runs appended what precedes it.
    log_start: usize,
    wrapped: bool,
}

/// How to start `kmirror serve` beyond its config file.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    /// A command that runs kmirror as its only child and exits with its status (e.g.
    /// `strace -f -o FILE`); kmirror's command line is appended to it.
    pub wrapper: Vec<OsString>,
    /// Extra environment (e.g. NOTIFY_SOCKET).
    pub env: Vec<(String, OsString)>,
}

impl Launch {
    /// kmirror run under `umask 000` (a shell stays its parent and exits with its status), with
    /// `env`: files it means to keep private must be so by its own doing.
    pub fn umask_000(env: Vec<(String, OsString)>) -> Launch {
        Launch {
            wrapper: ["sh", "-c", "umask 000; \"$@\"; exit $?", "sh"]
                .iter()
                .map(Into::into)
                .collect(),
            env,
        }
    }
}

/// What `kmirror serve` logs once its Kafka listener accepts connections.
const LISTENER_LINE: &str = "Kafka listener serving on ";

/// Failure guard for a start-up (log dir recovery, control thread, listener) on a loaded
/// machine; not a performance claim.
pub const START_LIMIT: Duration = Duration::from_secs(120);

/// Adds a `[kafka]` listener on an OS-chosen loopback port to a config file.
pub fn add_kafka_listener(config: &Path) {
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str("[kafka]\nlisten = \"127.0.0.1:0\"\n");
    std::fs::write(config, text).unwrap();
}

impl Serve {
    /// Starts the binary; its stderr is appended to `log` (so restarts keep earlier output).
    pub fn start(config: &Path, log: PathBuf) -> Serve {
        Serve::start_with(config, log, &Launch::default())
    }

    /// `start` with extra environment variables (test hooks, `NOTIFY_SOCKET`).
    pub fn start_with_env(config: &Path, log: PathBuf, env: &[(&str, &std::ffi::OsStr)]) -> Serve {
        let launch = Launch {
            wrapper: Vec::new(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_os_string()))
                .collect(),
        };
        Serve::start_with(config, log, &launch)
    }

    /// `start` with the binary run by `wrapper` (e.g. `["prlimit", "--as=..."]`), if not empty.
    pub fn start_under(wrapper: &[&str], config: &Path, log: PathBuf) -> Serve {
        let launch = Launch {
            wrapper: wrapper.iter().map(OsString::from).collect(),
            env: Vec::new(),
        };
        Serve::start_with(config, log, &launch)
    }

    /// `start`, under `launch`'s wrapper and with its environment.
    pub fn start_with(config: &Path, log: PathBuf, launch: &Launch) -> Serve {
        Serve::spawn(config, log, launch, false)
    }

    /// `start` for a `kmirror serve` kept in a static that the binary's tests share: it is
    /// never dropped, so it is killed when the test process exits, whichever way (a shell
    /// watches a pipe from this process and kills kmirror at its end of file, as the broker
    /// JVMs' watchdog does). Without this it would keep running after the tests.
    pub fn start_until_exit(config: &Path, log: PathBuf) -> Serve {
        Serve::spawn(config, log, &Launch::default(), true)
    }

    fn spawn(config: &Path, log: PathBuf, launch: &Launch, until_exit: bool) -> Serve {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let log_start = out.metadata().unwrap().len() as usize;
        let bin = OsString::from(env!("CARGO_BIN_EXE_kmirror"));
        // The watcher keeps the pipe (fd 3), kmirror replaces the shell (`exec`: the child's
        // pid is kmirror's, `$$` in the watcher too).
        const UNTIL_EXIT: &str = "exec 3<&0; ( cat <&3 >/dev/null 2>&1; kill -KILL $$ 2>/dev/null ) & exec \"$@\" </dev/null 3<&-";
        let (program, wrapper_args) = match launch.wrapper.split_first() {
            _ if until_exit => (
                OsString::from("sh"),
                ["-c", UNTIL_EXIT, "kmirror-watchdog"]
                    .into_iter()
                    .map(OsString::from)
                    .chain([bin])
                    .collect(),
            ),
            Some((program, args)) => (program.clone(), [args, &[bin]].concat()),
            None => (bin, Vec::new()),
        };
        let child = Command::new(&program)
            .args(wrapper_args)
            .stdin(if until_exit {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .args(["serve", "--config"])
            .arg(config)
            .env("KMIRROR_LOG", "info")
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run {program:?} (tests/setup.sh installs strace): {e}")
            });
        Serve {
            child,
            log,
            log_start,
            wrapped: !launch.wrapper.is_empty(),
        }
    }

    /// The pid of kmirror itself (the wrapper's child when started under one), waiting for
    /// the wrapper to have started it.
    pub fn pid(&mut self) -> u32 {
        let id = self.child.id();
        if !self.wrapped {
            return id;
        }
        let start = Instant::now();
        loop {
            self.assert_running();
            let children =
                std::fs::read_to_string(format!("/proc/{id}/task/{id}/children")).unwrap();
            if let Some(pid) = children.split_whitespace().next() {
                return pid.parse().unwrap();
            }
            assert!(
                start.elapsed() < START_LIMIT,
                "the wrapper started no child"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What this process (not an earlier run appending to the same file) logged.
    pub fn own_log_text(&self) -> String {
        self.log_text()
            .get(self.log_start..)
            .unwrap_or_default()
            .to_owned()
    }

    /// Waits up to `limit` for the process to exit on its own.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "kmirror serve did not exit:\n{}",
                self.own_log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The Kafka listener's `host:port` from this process's start-up line, waiting for it.
    pub fn kafka_listener(&mut self) -> String {
        self.listener_line("")
    }

    /// The `host:port` of the Kafka listener named `name` (`[[kafka.listeners]]`).
    pub fn kafka_listener_named(&mut self, name: &str) -> String {
        self.listener_line(&format!(" name={name} "))
    }

    /// The address of the first start-up listener line that contains `naming`.
    fn listener_line(&mut self, naming: &str) -> String {
        let start = Instant::now();
        loop {
            self.assert_running();
            let text = self.log_text();
            let ours = text.get(self.log_start..).unwrap_or_default();
            let line = ours
                .lines()
                .filter_map(|l| {
                    l.find(LISTENER_LINE)
                        .map(|at| &l[at + LISTENER_LINE.len()..])
                })
                .find(|rest| format!("{rest} ").contains(naming));
            if let Some(rest) = line {
                return rest.chars().take_while(|c| !c.is_whitespace()).collect();
            }
            assert!(
                start.elapsed() < START_LIMIT,
                "no Kafka listener line{naming} in:\n{ours}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `limit` for the "partition stopped" log line naming `partition` (a
    /// topic-partition, or a topic) and returns it.
    pub fn wait_partition_stopped(&mut self, partition: &str, limit: Duration) -> String {
        let line = self.poll(
            &format!("{partition} reported stopped"),
            (limit, Duration::from_millis(250)),
            |serve| {
                serve
                    .log_text()
                    .lines()
                    .find(|l| l.contains("partition stopped") && l.contains(partition))
                    .map(str::to_string)
            },
            Option::is_some,
        );
        line.expect("poll returns only an answer `done` accepted")
    }

    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "kmirror serve exited early ({status}):\n{}",
                self.log_text()
            );
        }
    }

    /// Calls `probe` (given this `Serve`, to read its log) every `every` until `done` holds for
    /// its answer, and returns that answer.
    /// Fails, with the last answer and the log, when kmirror exits or `limit` passes (a failure
    /// guard, not a performance claim).
    pub fn poll<T: std::fmt::Debug>(
        &mut self,
        what: &str,
        (limit, every): (Duration, Duration),
        mut probe: impl FnMut(&Serve) -> T,
        done: impl Fn(&T) -> bool,
    ) -> T {
        let start = Instant::now();
        loop {
            self.assert_running();
            let last = probe(self);
            if done(&last) {
                return last;
            }
            assert!(
                start.elapsed() < limit,
                "{what}: not within {limit:?}; last answer {last:?}\n{}",
                self.log_text()
            );
            std::thread::sleep(every);
        }
    }

    /// Waits until `done` (checked every 300 ms); fails with the log after `limit` (a failure
    /// guard, not a performance claim).
    pub fn wait_for(&self, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(
                start.elapsed() < limit,
                "gave up waiting for {what}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// SIGKILL: no shutdown code runs, as after a crash or power loss of the process.
    pub fn kill9(mut self) {
        self.kill_all();
    }

    /// SIGKILL to kmirror and its wrapper (a tracer that dies leaves its tracee running).
    fn kill_all(&mut self) {
        if self.wrapped && self.child.try_wait().ok().flatten().is_none() {
            let pid = self.child.id();
            if let Ok(children) =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            {
                for c in children.split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", c]).status();
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM to kmirror, then waits for it (and its wrapper) to exit successfully.
    pub fn sigterm_and_wait(mut self) -> String {
        let pid = self.pid().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let status = self.child.wait().unwrap();
        let text = self.log_text();
        assert!(
            status.success(),
            "kmirror serve failed on SIGTERM ({status}):\n{text}"
        );
        text
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Waits until the broker's partition dir and ours hold the same non-empty `.log` bytes.
pub fn wait_mirrored(serve: &mut Serve, broker_dir: &Path, our_dir: &Path) {
    wait_all_mirrored(serve, &[(broker_dir.to_path_buf(), our_dir.to_path_buf())]);
}

/// Waits until every `(broker dir, our dir)` pair holds the same non-empty `.log` bytes.
pub fn wait_all_mirrored(serve: &mut Serve, pairs: &[(PathBuf, PathBuf)]) {
    let mut progress = Instant::now();
    let mut pending: Vec<&(PathBuf, PathBuf)> = pairs.iter().collect();
    while !pending.is_empty() {
        serve.assert_running();
        let before = pending.len();
        pending.retain(|(theirs, ours)| {
            let t = log_bytes(theirs);
            t.is_empty() || t != log_bytes(ours)
        });
        if pending.is_empty() {
            return;
        }
        if pending.len() < before {
            progress = Instant::now();
        }
        if progress.elapsed() > CATCH_UP_LIMIT {
            let (theirs, ours) = pending[0];
            panic!(
                "{} partitions not mirrored; first: broker {} has {} log bytes, ours {} has {}\n{}",
                pending.len(),
                theirs.display(),
                log_bytes(theirs).len(),
                ours.display(),
                log_bytes(ours).len(),
                serve.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The text of `GET /metrics` on `addr` (the admin port, or a static mode's `[metrics]`).
pub fn scrape_metrics(addr: &str) -> String {
    let mut resp = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap_or_else(|e| panic!("scraping {addr}: {e}"));
    resp.body_mut().read_to_string().unwrap()
}

/// One `(api key, version)` row of the endpoint's request counters in a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointRequests {
    pub served: u64,
    /// `error` label → count (`decode`, `unsupported`, `other`).
    pub errors: std::collections::BTreeMap<String, u64>,
}

/// `kmirror_endpoint_requests_total` and `kmirror_endpoint_request_errors_total` of a scrape,
/// by `(api key, version)`.
pub fn endpoint_requests(scrape: &str) -> std::collections::BTreeMap<(i16, i16), EndpointRequests> {
    let mut out: std::collections::BTreeMap<(i16, i16), EndpointRequests> = Default::default();
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        if name != "kmirror_endpoint_requests_total"
            && name != "kmirror_endpoint_request_errors_total"
        {
            continue;
        }
        let label = |key: &str| -> String {
            let start = labels
                .find(&format!("{key}=\""))
                .unwrap_or_else(|| panic!("no {key} in {line}"))
                + key.len()
                + 2;
            labels[start..].split('"').next().unwrap().to_string()
        };
        let at = (
            label("api_key").parse().unwrap(),
            label("version").parse().unwrap(),
        );
        let n: u64 = value.parse().unwrap();
        let row = out.entry(at).or_default();
        if name == "kmirror_endpoint_requests_total" {
            row.served += n;
        } else {
            *row.errors.entry(label("error")).or_default() += n;
        }
    }
    out
}

/// Adds `[metrics] listen` on a reserved loopback port to a static-mode config; returns the
/// address to scrape.
pub fn add_metrics_listener(config: &Path) -> String {
    let listen = format!("127.0.0.1:{}", super::ports::reserved_port());
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str(&format!("[metrics]\nlisten = \"{listen}\"\n"));
    std::fs::write(config, text).unwrap();
    listen
}

/// Appends `lines` to the config's `[fetch]` section (the harness configs end it with their
/// last key, so the lines go right after `[fetch]`'s header).
pub fn add_fetch_settings(config: &Path, lines: &str) {
    let text = std::fs::read_to_string(config).unwrap();
    assert!(text.contains("[fetch]\n"), "no [fetch] section in {text}");
    let text = text.replacen("[fetch]\n", &format!("[fetch]\n{lines}\n"), 1);
    std::fs::write(config, text).unwrap();
}

/// The series of counter `name` in a scrape, summed over shards by the value of `label`, which
/// must be one of `values`: in the order of `values`.
pub fn counter_by_label<const N: usize>(
    scrape: &str,
    name: &str,
    label: &str,
    values: [&str; N],
) -> [u64; N] {
    let mut sums = [0; N];
    let prefix = format!("{name}{{");
    for line in scrape.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if !series.starts_with(&prefix) {
            continue;
        }
        let n: u64 = value.parse().unwrap();
        let Some(at) = values
            .iter()
            .position(|v| series.contains(&format!("{label}=\"{v}\"")))
        else {
            panic!("{name} series without a known {label}: {line}");
        };
        sums[at] += n;
    }
    sums
}

/// Fetch requests kmirror's shards sent, summed over shards: (full, incremental), from
/// `kmirror_shard_fetch_requests_total` in a scrape.
pub fn fetch_requests(scrape: &str) -> (u64, u64) {
    let [full, incremental] = counter_by_label(
        scrape,
        "kmirror_shard_fetch_requests_total",
        "kind",
        ["full", "incremental"],
    );
    (full, incremental)
}
