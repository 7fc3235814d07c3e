//! Goal: kmirror runs under systemd as shipped in systemd/. Method: systemd's own tools on our
//! files (`systemd-analyze verify` of kmirror.service with ExecStart pointing at the built
//! binary, and a broken copy as a control that verify does report problems; `systemd-analyze
//! security --offline` exposure ≤ 2.0; `systemd-sysusers`/`systemd-tmpfiles` dry runs of the
//! snippets), the example config loads with our config parser, and the real `kmirror serve`
//! binary talks the sd_notify protocol to a unix datagram socket we listen on as NOTIFY_SOCKET:
//! READY=1 only once the admin API answers, WATCHDOG=1 repeatedly when WATCHDOG_USEC is set,
//! STOPPING=1 after SIGTERM, then a clean exit.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

fn free_loopback_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
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
