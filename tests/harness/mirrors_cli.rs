//! The `kmirror mirrors` CLI against a running `kmirror serve` with an `[admin]` section.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::serve::Serve;

/// Failure guard for the admin API to come up, not a performance claim.
const ADMIN_UP_LIMIT: Duration = Duration::from_secs(60);

pub struct CliOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn cli(admin: &str, args: &[&str]) -> CliOut {
    cli_with(admin, &[], args)
}

/// `cli` with `extra` options after `--admin` (e.g. `--admin-token-file F`).
pub fn cli_with(admin: &str, extra: &[&str], args: &[&str]) -> CliOut {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .arg("mirrors")
        .args(args)
        .args(["--admin", admin])
        .args(extra)
        .env_remove("KMIRROR_ADMIN_TOKEN_FILE")
        .output()
        .unwrap();
    CliOut {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the CLI and fails the test if it fails; returns its stdout.
pub fn cli_ok(admin: &str, args: &[&str]) -> String {
    let o = cli(admin, args);
    assert!(o.ok, "{args:?} failed: {}", o.stderr);
    o.stdout
}

pub fn wait_admin(serve: &mut Serve, admin: &str) {
    let start = Instant::now();
    loop {
        serve.assert_running();
        if cli(admin, &["list"]).ok {
            return;
        }
        assert!(
            start.elapsed() < ADMIN_UP_LIMIT,
            "admin API never answered:\n{}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `mirrors create --mirror NAME` from `bootstrap`, its properties file (with `extra`
/// property lines) written under `dir`.
pub fn create_mirror(admin: &str, dir: &Path, mirror: &str, bootstrap: &str, extra: &str) {
    let props = dir.join(format!("{mirror}.properties"));
    std::fs::write(&props, format!("bootstrap.servers={bootstrap}\n{extra}")).unwrap();
    let props = props.to_str().unwrap();
    cli_ok(
        admin,
        &["create", "--mirror", mirror, "--mirror-config", props],
    );
}

/// `describe --json` rows of one mirror.
pub fn describe_rows(admin: &str, mirror: &str) -> Vec<serde_json::Value> {
    let json = cli_ok(admin, &["describe", "--mirror", mirror, "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&json).unwrap();
    rows.as_array().unwrap().clone()
}

pub fn free_loopback_port() -> u16 {
    super::ports::reserved_port()
}

/// A `kmirror serve` config with an `[admin]` section (`admin_extra` lines go into it).
pub fn write_admin_config(path: &Path, admin: &str, data_dir: &Path, admin_extra: &str) {
    write_serving_config(path, admin, None, data_dir, admin_extra);
}

/// As `write_admin_config`, plus a `[kafka]` listener on `kafka` ("127.0.0.1:0" lets the OS
/// pick the port; `Serve::kafka_listener` reads it back).
pub fn write_serving_config(
    path: &Path,
    admin: &str,
    kafka: Option<&str>,
    data_dir: &Path,
    admin_extra: &str,
) {
    let kafka = kafka
        .map(|k| format!("[kafka]\nlisten = \"{k}\"\n"))
        .unwrap_or_default();
    std::fs::write(
        path,
        format!(
            r#"
[admin]
listen = "{admin}"
{admin_extra}
{kafka}
[storage]
data_dir = "{data}"
[runtime]
shards = 1
arena_slot_bytes = 4194304
arena_slots = 4
[fetch]
max_wait_ms = 100
max_bytes = 2097152
partition_max_bytes = 262144
"#,
            data = data_dir.display()
        ),
    )
    .unwrap();
}

/// `kmirror serve` with `[admin]` on a free port and a `[kafka]` listener on an OS-chosen one,
/// data under `work/data`; returns it, the admin address and the listener's `host:port`.
pub fn serve_admin_with_listener(work: &Path) -> (Serve, String, String) {
    let config = work.join("kmirror.toml");
    let admin = format!("127.0.0.1:{}", free_loopback_port());
    write_serving_config(&config, &admin, Some("127.0.0.1:0"), &work.join("data"), "");
    let mut serve = Serve::start(&config, work.join("serve.log"));
    wait_admin(&mut serve, &admin);
    let kmirror = serve.kafka_listener();
    (serve, admin, kmirror)
}

/// `serve_admin_with_listener`, plus mirror "m" of `source` started for `topics` (name and
/// partition count), waiting until every partition equals the broker's byte for byte.
pub fn serve_mirroring(
    work: &Path,
    source: &super::Kafka,
    topics: &[(&str, i32)],
) -> (Serve, String, String) {
    let (mut serve, admin, kmirror) = serve_admin_with_listener(work);
    create_mirror(&admin, work, "m", &source.bootstrap(), "");
    let names: Vec<&str> = topics.iter().map(|(t, _)| *t).collect();
    cli_ok(
        &admin,
        &["start", "--mirror", "m", "--topics", &names.join(",")],
    );
    let data_dir = work.join("data");
    let pairs: Vec<_> = topics
        .iter()
        .flat_map(|(t, n)| source.mirror_pairs(t, *n, &data_dir))
        .collect();
    super::serve::wait_all_mirrored(&mut serve, &pairs);
    (serve, admin, kmirror)
}

/// `kmirror audit report --mirror NAME --json` (the integrity audit, `control::audit`).
pub fn audit_report(admin: &str, mirror: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kmirror"))
        .args([
            "audit", "report", "--mirror", mirror, "--json", "--admin", admin,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "audit report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A `kmirror serve` control plane in its own temp dir with one mirror `m` of `bootstrap`
/// created (`mirror_props` added to its properties), `[kafka]` on an OS-chosen port when
/// `kafka` is set.
pub struct ControlPlane {
    pub work: tempfile::TempDir,
    pub data_dir: std::path::PathBuf,
    pub config: std::path::PathBuf,
    pub admin: String,
    pub serve: Serve,
}

impl ControlPlane {
    pub fn start(bootstrap: &str, kafka: bool, mirror_props: &str) -> ControlPlane {
        ControlPlane::start_with_env(bootstrap, kafka, mirror_props, &[])
    }

    /// `start` with extra environment variables for `kmirror serve` (test hooks).
    pub fn start_with_env(
        bootstrap: &str,
        kafka: bool,
        mirror_props: &str,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> ControlPlane {
        let work = tempfile::tempdir().unwrap();
        let data_dir = work.path().join("data");
        let admin = format!("127.0.0.1:{}", free_loopback_port());
        let config = work.path().join("kmirror.toml");
        let listener = kafka.then_some("127.0.0.1:0");
        write_serving_config(&config, &admin, listener, &data_dir, "");
        let mut serve = Serve::start_with_env(&config, work.path().join("serve.log"), env);
        wait_admin(&mut serve, &admin);
        create_mirror(&admin, work.path(), "m", bootstrap, mirror_props);
        ControlPlane {
            work,
            data_dir,
            config,
            admin,
            serve,
        }
    }
}
