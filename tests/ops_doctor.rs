//! Goal: `kmirror doctor` tells an operator what is wrong with the host and how to fix it, and
//! exits non-zero exactly when something failed. Method: the real binary against real
//! conditions: a config whose source is the harness's Kafka 4.1.1 broker (must pass, naming the
//! source as answering ApiVersions); a source port nobody listens on (must fail with a fix); the
//! same good config run under `prlimit --memlock` with CAP_IPC_LOCK dropped (`setpriv`, as in
//! runtime_memlock.rs; we are root) so the arenas cannot be locked (must fail on memlock with
//! the LimitMEMLOCK fix); and the `[admin]` mode, where the sources are the mirrors a running
//! `kmirror serve` lists (a mirror created through the CLI must be checked by name).

mod harness;
mod mirror_support;

use std::path::Path;
use std::process::{Command, Output};

use harness::serve::Serve;

fn doctor(config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("doctor")
        .arg(config)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
    // Dropped here: nothing listens on it any more.
}

#[test]
fn good_config_passes_and_names_the_source() {
    let k = harness::shared();
    let work = tempfile::tempdir().unwrap();
    let (config, _) = mirror_support::write_config(work.path(), &k.bootstrap(), &["t"]);
    let out = doctor(&config);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "PASS source [source] {}: answers ApiVersions",
            k.bootstrap()
        )),
        "{t}"
    );
    assert!(t.contains("PASS memlock"), "{t}");
    assert!(t.lines().any(|l| l.contains(" io_uring: ")), "{t}");
    assert!(t.lines().any(|l| l.starts_with("0 failed")), "{t}");
}

#[test]
fn unreachable_source_fails_with_a_fix() {
    let work = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", closed_port());
    let (config, _) = mirror_support::write_config(work.path(), &addr, &["t"]);
    let out = doctor(&config);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let at = t
        .find(&format!("FAIL source [source] {addr}"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(
        t[at..]
            .lines()
            .nth(1)
            .unwrap()
            .trim_start()
            .starts_with("fix: "),
        "{t}"
    );
}

#[test]
fn memlock_below_the_arenas_fails_with_the_fix() {
    let k = harness::shared();
    let work = tempfile::tempdir().unwrap();
    let (config, _) = mirror_support::write_config(work.path(), &k.bootstrap(), &["t"]);
    let limit = 64 * 1024;
    let out = Command::new("prlimit")
        .arg(format!("--memlock={limit}:{limit}"))
        .args([
            "setpriv",
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
        ])
        .arg(env!("CARGO_BIN_EXE_kmirror"))
        .arg("doctor")
        .arg(&config)
        .output()
        .expect("prlimit and setpriv (util-linux) are required");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    // write_config: 2 shards × 4 slots × 4 MiB.
    let needed = 2 * 4 * 4194304;
    assert!(t.contains("FAIL memlock"), "{t}");
    assert!(t.contains(&format!("LimitMEMLOCK={needed}")), "{t}");
    // The rest of the host is fine: memlock is the only failure.
    assert!(t.lines().any(|l| l.starts_with("1 failed")), "{t}");
}

#[test]
fn admin_mode_checks_the_running_servers_mirrors() {
    let k = harness::shared();
    let work = tempfile::tempdir().unwrap();
    let admin = format!("127.0.0.1:{}", closed_port());
    let config = work.path().join("kmirror.toml");
    std::fs::write(
        &config,
        format!(
            "[admin]\nlisten = \"{admin}\"\n[storage]\ndata_dir = \"{}\"\n[runtime]\nshards = 1\n\
             arena_slot_bytes = 4194304\narena_slots = 2\n[fetch]\nmax_bytes = 2097152\n\
             partition_max_bytes = 262144\n",
            work.path().join("data").display()
        ),
    )
    .unwrap();
    // Not running yet: the sources cannot be listed, which is a warning, not a failure.
    let out = doctor(&config);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("WARN mirrors: admin API"), "{t}");

    let mut serve = Serve::start(&config, work.path().join("serve.log"));
    let props = work.path().join("source.properties");
    std::fs::write(&props, format!("bootstrap.servers={}\n", k.bootstrap())).unwrap();
    let start = std::time::Instant::now();
    loop {
        serve.assert_running();
        let created = Command::new(env!("CARGO_BIN_EXE_kmirror"))
            .args(["mirrors", "create", "--mirror", "docm", "--mirror-config"])
            .arg(&props)
            .args(["--admin", &admin])
            .output()
            .unwrap();
        if created.status.success() {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{}",
            text(&created)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = doctor(&config);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "PASS source of mirror docm: {} answers over PLAINTEXT: cluster ",
            k.bootstrap()
        )),
        "{t}"
    );
    serve.sigterm_and_wait();
}
