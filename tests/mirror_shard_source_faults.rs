//! The shard data path against misbehaving sources (no Kafka needed: the faults are the point).
//! Goal: a source that accepts the connection but never answers is dropped after
//! `max_wait_ms + request_timeout_ms` (a ring TIMEOUT, not a blocked thread), and the shard
//! reconnects; a source that answers with an oversized frame length is dropped too. Method: a
//! std TCP listener plays the broker; a one-shard runtime runs `MirrorShard`; we watch its
//! events and the listener's accepted connections.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kmirror::fetch::fetcher::{FetchConfig, PartitionStart};
use kmirror::fetch::versions::Versions;
use kmirror::ids::{LeaderEpoch, Offset, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::partition_log::PartitionLog;
use kmirror::runtime::mirror_shard::{MirrorEvent, MirrorMsg, MirrorShard, SourceSpec};
use kmirror::runtime::{Runtime, RuntimeConfig};
use kmirror::wire::api;

const WAIT: Duration = Duration::from_secs(60);

fn start_shard(addr: String, dir: &std::path::Path) -> Runtime<MirrorShard> {
    let config = RuntimeConfig {
        shards: 1,
        cores: None,
        arena_slot_bytes: 1024 * 1024,
        arena_slots: 2,
    };
    let returned = Arc::new(Mutex::new(Vec::new()));
    let mut rt = Runtime::start(&config, move |_| MirrorShard::new(Arc::clone(&returned))).unwrap();
    let tp = TopicPartition::new("t", 0);
    let log =
        PartitionLog::create(&dir.join("t-0"), tp.clone(), None, LogConfig::default()).unwrap();
    let source = SourceSpec {
        broker_id: 1,
        addr,
        versions: Versions {
            api_versions: 3,
            metadata: api::METADATA.max,
            fetch: 12,
            list_offsets: api::LIST_OFFSETS.max,
            offset_for_leader_epoch: api::OFFSET_FOR_LEADER_EPOCH.max,
        },
        fetch: FetchConfig {
            max_wait_ms: 100,
            min_bytes: 1,
            max_bytes: 512 * 1024,
            partition_max_bytes: 256 * 1024,
            sessions: true,
            sessions_per_connection: 1,
        },
        client_id: "test".to_string(),
        request_timeout_ms: 300,
        security: Default::default(),
    };
    let start = PartitionStart {
        tp,
        topic_id: uuid::Uuid::nil(),
        log_end: Offset::ZERO,
        last_epoch: LeaderEpoch::NONE,
        leader_epoch: LeaderEpoch::NONE,
    };
    rt.send(
        kmirror::ids::ShardId(0),
        MirrorMsg::AddPartition {
            source,
            start,
            log: Box::new(log),
        },
    )
    .unwrap();
    rt
}

fn wait_notice(rt: &mut Runtime<MirrorShard>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        match rt.next_event(Duration::from_millis(200)) {
            Some((_, MirrorEvent::Notice { what })) if what.contains(needle) => return what,
            Some((_, e)) => seen.push(format!("{e:?}")),
            None => {}
        }
    }
    panic!("no notice containing {needle:?}; saw {seen:?}");
}

#[test]
fn silent_source_times_out_and_is_reconnected() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut rt = start_shard(addr, dir.path());
    let (mut first, _) = listener.accept().unwrap();
    // The shard sends a Fetch request; read its length prefix to be sure it went out.
    let mut len = [0u8; 4];
    first.read_exact(&mut len).unwrap();
    assert!(i32::from_be_bytes(len) > 0);
    let what = wait_notice(&mut rt, "no response within 400 ms");
    assert!(what.contains("reconnecting"), "{what}");
    let (_second, _) = listener.accept().unwrap();
    rt.stop();
}

#[test]
fn oversized_frame_drops_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut rt = start_shard(addr, dir.path());
    let (mut conn, _) = listener.accept().unwrap();
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).unwrap();
    // Announce a 2 MiB response: larger than the 1 MiB slot, within the frame limit.
    conn.write_all(&(2 * 1024 * 1024i32).to_be_bytes()).unwrap();
    conn.write_all(&[0u8; 64]).unwrap();
    let what = wait_notice(&mut rt, "exceeds the 1048576 B arena slot");
    assert!(what.contains("reconnecting"), "{what}");
    rt.stop();
}
