//! Shard threads: pinning to distinct cores, mailbox wakeups, events back, clean stop.

use std::time::Duration;

use kmirror::ids::ShardId;
use kmirror::runtime::{Completion, Runtime, RuntimeConfig, ShardCx, ShardHandler};

/// Echoes each message back as an event with the shard id; reports start and stop.
struct Echo;

#[derive(Debug, PartialEq, Eq)]
enum Ev {
    Started(ShardId),
    Echo(ShardId, u64),
    Timer(ShardId),
}

impl ShardHandler for Echo {
    type Msg = u64;
    type Event = Ev;
    fn start(&mut self, cx: &mut ShardCx<'_, Ev>) {
        let s = cx.shard;
        cx.emit(Ev::Started(s)).unwrap();
    }
    fn on_message(&mut self, cx: &mut ShardCx<'_, Ev>, msg: u64) {
        if msg == u64::MAX - 1 {
            cx.ring.timeout(1, Duration::from_millis(1)).unwrap();
            return;
        }
        let s = cx.shard;
        cx.emit(Ev::Echo(s, msg)).unwrap();
    }
    fn on_completion(&mut self, cx: &mut ShardCx<'_, Ev>, c: Completion) {
        assert_eq!(c.tag, 1);
        let s = cx.shard;
        cx.emit(Ev::Timer(s)).unwrap();
    }
    fn stop(&mut self, _cx: &mut ShardCx<'_, Ev>) {}
}

fn allowed_cpus() -> usize {
    core_affinity::get_core_ids().unwrap().len()
}

fn config(shards: usize) -> RuntimeConfig {
    RuntimeConfig {
        shards,
        cores: None,
        arena_slot_bytes: 64 * 1024,
        arena_slots: 4,
        log_writes: Default::default(),
    }
}

fn cpus_allowed_list(tid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

// Goal: each shard thread is pinned to exactly one CPU and no two shards share one. Method: read
// the kernel's view of each shard thread's affinity from /proc/self/task/<tid>/status.
#[test]
fn shards_pinned_to_distinct_cores() {
    let n = allowed_cpus();
    assert!(n >= 2, "this test needs 2 CPUs in the allowed set");
    let rt = Runtime::start(&config(n), |_| Echo).unwrap();
    let mut seen = Vec::new();
    for info in rt.infos() {
        let list = cpus_allowed_list(info.tid);
        assert_eq!(
            list,
            info.core.to_string(),
            "shard {:?} affinity",
            info.shard
        );
        assert!(!seen.contains(&info.core));
        seen.push(info.core);
        assert_ne!(info.tid, 0);
    }
    assert_eq!(seen.len(), n);
    rt.stop();
}

// Goal: a message wakes a shard sleeping in io_uring_enter and its event reaches the control
// thread; a ring TIMEOUT submitted from a handler completes back into the handler.
#[test]
fn mailbox_wakes_shard_and_events_return() {
    let mut rt = Runtime::start(&config(2), |_| Echo).unwrap();
    let mut started = Vec::new();
    while started.len() < 2 {
        match rt.next_event(Duration::from_secs(30)) {
            Some((_, Ev::Started(s))) => started.push(s),
            other => panic!("expected start events, got {other:?}"),
        }
    }
    // Give the shards time to block in io_uring_enter; the wake must still be seen.
    std::thread::sleep(Duration::from_millis(50));
    for round in 0..100u64 {
        let shard = ShardId((round % 2) as u16);
        rt.send(shard, round).unwrap();
        let got = rt.next_event(Duration::from_secs(30));
        assert_eq!(got, Some((shard, Ev::Echo(shard, round))));
    }
    rt.send(ShardId(1), u64::MAX - 1).unwrap();
    assert_eq!(
        rt.next_event(Duration::from_secs(30)),
        Some((ShardId(1), Ev::Timer(ShardId(1))))
    );
    rt.stop();
}

// Goal: asking for more shards than allowed CPUs, or a CPU outside the set, is a clear error.
#[test]
fn rejects_bad_core_selection() {
    let n = allowed_cpus();
    let err = Runtime::start(&config(n + 1), |_| Echo).err().unwrap();
    assert!(err.to_string().contains("distinct CPUs"), "{err}");
    let mut bad = config(1);
    bad.cores = Some(vec![100_000]);
    let err = Runtime::start(&bad, |_| Echo).err().unwrap();
    assert!(err.to_string().contains("allowed set"), "{err}");
}

/// Counts the handlers dropped, to see that the shards ran their stop and ended.
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ShardHandler for Counted {
    type Msg = u64;
    type Event = Ev;
    fn start(&mut self, _cx: &mut ShardCx<'_, Ev>) {}
    fn on_message(&mut self, _cx: &mut ShardCx<'_, Ev>, _msg: u64) {}
    fn on_completion(&mut self, _cx: &mut ShardCx<'_, Ev>, _c: Completion) {}
    fn stop(&mut self, _cx: &mut ShardCx<'_, Ev>) {}
}

// Goal: `spawn` starts every shard without waiting and `ready` then reports them all, in shard
// order; a `Starting` dropped before `ready` (the caller's own start-up failed meanwhile) stops
// and joins every shard. Method: a handler whose drop is counted; the drop of `Starting` joins
// the threads, so the count is exact right after it.
#[test]
fn spawned_shards_report_ready_in_order_or_stop_when_dropped() {
    let rt = Runtime::spawn(&config(2), |_| Echo)
        .unwrap()
        .ready()
        .unwrap();
    let shards: Vec<ShardId> = rt.infos().iter().map(|i| i.shard).collect();
    assert_eq!(shards, vec![ShardId(0), ShardId(1)]);
    assert_ne!(rt.infos()[0].tid, rt.infos()[1].tid);
    rt.stop();

    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&dropped);
    let starting =
        Runtime::spawn(&config(2), move |_| Counted(std::sync::Arc::clone(&count))).unwrap();
    drop(starting);
    assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 2);
}

// Goal: a shard that cannot set up (here an arena slot below the minimum) is reported by
// `ready`, not lost because `spawn` did not wait for it.
#[test]
fn a_shard_that_cannot_start_is_reported_by_ready() {
    let mut bad = config(2);
    bad.arena_slot_bytes = 1;
    let starting = Runtime::spawn(&bad, |_| Echo).expect("spawn does not wait for the shards");
    let err = starting.ready().err().expect("the arena is refused");
    assert!(err.to_string().contains("arena slot size"), "{err}");
}
