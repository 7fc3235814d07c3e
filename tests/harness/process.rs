//! Child processes that cannot outlive the test process, and bounded runs of short-lived tools.
//!
//! A broker JVM is started under a small `sh` watchdog whose stdin is a pipe from the test
//! process. Only the test process holds the pipe's write end (Rust opens pipes close-on-exec), so
//! the watchdog sees end-of-file exactly when the test process closes it: on `Drop`, or when the
//! process exits for any reason, panics and SIGKILL included. It then SIGKILLs the JVM. The
//! parent-death signal (`PR_SET_PDEATHSIG`) would not do: it fires when the *thread* that spawned
//! the child ends, and cargo runs each test on its own short-lived thread.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const WATCHDOG: &str = r#"
exec 3<&0
"$@" </dev/null 3<&- >>"$KMIRROR_JVM_LOG" 2>&1 &
jvm=$!
echo "$jvm"
( cat <&3 >/dev/null; kill -KILL "$jvm" 2>/dev/null ) >/dev/null 2>&1 &
wait "$jvm"
status=$?
if [ -n "$KMIRROR_REMOVE_AFTER" ]; then rm -rf "$KMIRROR_REMOVE_AFTER"; fi
exit "$status"
"#;

/// A JVM running under the watchdog. Dropping it kills the JVM and waits for it.
pub struct Jvm {
    watchdog: Child,
    /// Closing this tells the watchdog to kill the JVM.
    lifeline: Option<ChildStdin>,
    pub pid: u32,
    pub log: PathBuf,
}

impl Jvm {
    /// Starts `cmd` (a `java` command line) with stdout and stderr appended to `log`.
    /// `remove_after`: a directory the watchdog deletes once the JVM is gone (used by the shared
    /// broker, whose Rust owner is a static that is never dropped).
    pub fn spawn(cmd: &Command, log: &Path, remove_after: Option<&Path>) -> Jvm {
        let mut sh = Command::new("sh");
        sh.arg("-c").arg(WATCHDOG).arg("kmirror-jvm-watchdog");
        sh.arg(cmd.get_program());
        sh.args(cmd.get_args());
        if let Some(dir) = cmd.get_current_dir() {
            sh.current_dir(dir);
        }
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => sh.env(k, v),
                None => sh.env_remove(k),
            };
        }
        sh.env("KMIRROR_JVM_LOG", log);
        sh.env(
            "KMIRROR_REMOVE_AFTER",
            remove_after.map(|p| p.as_os_str()).unwrap_or_default(),
        );
        // The shell reports the JVM's death by SIGKILL ("Killed"): noise, not news.
        sh.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut watchdog = sh
            .spawn()
            .unwrap_or_else(|e| panic!("spawn sh for {cmd:?}: {e}"));
        let mut line = String::new();
        let stdout = watchdog.stdout.take().expect("watchdog stdout is piped");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read JVM pid from watchdog");
        let pid = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("watchdog printed {line:?}"));
        let lifeline = watchdog.stdin.take();
        Jvm {
            watchdog,
            lifeline,
            pid,
            log: log.to_path_buf(),
        }
    }

    /// The JVM's exit status if it has ended.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.watchdog.try_wait().expect("try_wait on watchdog")
    }

    /// Sends `signal` (e.g. "TERM", "KILL", "STOP", "CONT") to the JVM.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .stderr(Stdio::null())
            .status()
            .expect("run kill");
        // A JVM that already exited is fine: the caller waits for the watchdog next.
        let _ = status;
    }

    /// Waits up to `limit` for the JVM to exit; `None` if it is still running.
    pub fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the JVM (SIGKILL) and waits for it.
    pub fn kill(mut self) -> ExitStatus {
        self.kill_in_place()
    }

    fn kill_in_place(&mut self) -> ExitStatus {
        if let Some(mut l) = self.lifeline.take() {
            let _ = l.flush();
        }
        match self.wait_for(Duration::from_secs(30)) {
            Some(s) => s,
            None => {
                self.signal("KILL");
                self.watchdog.wait().expect("wait for watchdog")
            }
        }
    }
}

impl Drop for Jvm {
    fn drop(&mut self) {
        if self.lifeline.is_some() {
            self.kill_in_place();
        }
    }
}

/// Runs `cmd` to completion with a time limit, capturing its output through files (pipes could
/// fill up while we poll). Panics loudly if the limit passes: a hung tool is a failed test.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let dir = tempfile::tempdir().expect("tempdir for tool output");
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let out = File::create(&out_path).expect("create stdout file");
    let err = File::create(&err_path).expect("create stderr file");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} did not finish within {limit:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).expect("read stdout"),
        stderr: std::fs::read(&err_path).expect("read stderr"),
    }
}

/// The last `n` lines of a file, for failure messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| format!("<{}: {e}>", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
