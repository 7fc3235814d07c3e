//! Goal: with RLIMIT_MEMLOCK below the arena size and no CAP_IPC_LOCK, `Runtime::start` fails
//! with a message that says how to fix it, and the premise holds (the kernel itself refuses to
//! register the arena in that state, so the check is not crying wolf).
//!
//! Method: this binary re-executes itself as a child under `prlimit --memlock` and
//! `setpriv --bounding-set -ipc_lock` (we run as root, whose CAP_IPC_LOCK would bypass the limit);
//! the child reports what it saw on stdout and the parent asserts on it.

use std::process::Command;

use kmirror::runtime::{Arena, Completion, Ring, Runtime, RuntimeConfig, ShardCx, ShardHandler};

const CHILD_ENV: &str = "KMIRROR_MEMLOCK_CHILD";
const LIMIT_BYTES: u64 = 64 * 1024;

struct Idle;
impl ShardHandler for Idle {
    type Msg = ();
    type Event = ();
    fn start(&mut self, _: &mut ShardCx<'_, ()>) {}
    fn on_message(&mut self, _: &mut ShardCx<'_, ()>, _: ()) {}
    fn on_completion(&mut self, _: &mut ShardCx<'_, ()>, _: Completion) {}
    fn stop(&mut self, _: &mut ShardCx<'_, ()>) {}
}

fn child() {
    let facts = kmirror::runtime::memlock::MemlockFacts::read().unwrap();
    println!("facts: {facts:?}");
    let config = RuntimeConfig {
        shards: 1,
        cores: None,
        arena_slot_bytes: 64 * 1024,
        arena_slots: 16,
        log_writes: Default::default(),
    };
    match Runtime::start(&config, |_| Idle) {
        Ok(rt) => {
            println!("start: ok");
            rt.stop();
        }
        Err(e) => println!("start error: {e}"),
    }
    let mut ring = Ring::new().unwrap();
    let arena = Arena::new(64 * 1024, 16).unwrap();
    match ring.register_arena(&arena) {
        Ok(()) => println!("register: ok"),
        Err(e) => println!("register errno: {:?}", e.raw_os_error()),
    }
}

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("prlimit")
        .arg(format!("--memlock={LIMIT_BYTES}:{LIMIT_BYTES}"))
        .args([
            "setpriv",
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
        ])
        .arg(&exe)
        .env(CHILD_ENV, "1")
        .output()
        .expect("prlimit and setpriv (util-linux) are required");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("soft_limit: Some({LIMIT_BYTES})"))
            && stdout.contains("has_cap_ipc_lock: false"),
        "child did not run with the lowered limit and without the capability: {stdout}"
    );
    assert!(stdout.contains("start error:"), "start must fail: {stdout}");
    for needle in [
        "LimitMEMLOCK=",
        "ulimit -l",
        "CAP_IPC_LOCK",
        "1048576",
        "65536",
    ] {
        assert!(stdout.contains(needle), "message lacks {needle}: {stdout}");
    }
    assert!(
        stdout.contains(&format!("register errno: Some({})", libc::ENOMEM)),
        "the kernel should refuse registration under this limit: {stdout}"
    );
    println!("runtime_memlock: ok");
}
