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

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{
    decode_request_header_from_buffer, Decodable, Encodable, HeaderVersion, StrBytes,
};
use kmirror::fetch::fetcher::{FetchConfig, PartitionStart};
use kmirror::fetch::versions::Versions;
use kmirror::ids::TimestampMs;
use kmirror::ids::{LeaderEpoch, Offset, TopicPartition};
use kmirror::limits::OFFSET_MAX;
use kmirror::log::config::LogConfig;
use kmirror::log::partition_log::PartitionLog;
use kmirror::runtime::mirror_shard::{
    MirrorEvent, MirrorMsg, MirrorShard, ReturnedLogs, SourceSpec,
};
use kmirror::runtime::{Runtime, RuntimeConfig};
use kmirror::wire::api;
use kmirror::wire::batch_builder::{reseal_crc, BatchBuilder};

const WAIT: Duration = Duration::from_secs(60);

fn start_shard(addr: String, dir: &std::path::Path) -> Runtime<MirrorShard> {
    start_shard_with(addr, dir, 1).0
}

/// A one-shard runtime fetching partitions `0..partitions` of topic `t` from `addr`, each into
/// a fresh log; returns it with the list the shard hands stopped partitions' logs back to.
fn start_shard_with(
    addr: String,
    dir: &std::path::Path,
    partitions: i32,
) -> (Runtime<MirrorShard>, ReturnedLogs) {
    let config = RuntimeConfig {
        shards: 1,
        cores: None,
        arena_slot_bytes: 1024 * 1024,
        arena_slots: 2,
        log_writes: Default::default(),
    };
    let returned: ReturnedLogs = Arc::new(Mutex::new(Vec::new()));
    let shard_returned = Arc::clone(&returned);
    let mut rt = Runtime::start(&config, move |_| {
        MirrorShard::new(Arc::clone(&shard_returned))
    })
    .unwrap();
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
            connections_per_source: 1,
            max_rate_bytes_per_sec: 0,
            catch_up_pipelining: true,
        },
        client_id: "test".to_string(),
        request_timeout_ms: 300,
        security: Default::default(),
    };
    for partition in 0..partitions {
        let tp = TopicPartition::new("t", partition);
        let log = PartitionLog::create(
            &dir.join(tp.dir_name()),
            tp.clone(),
            None,
            LogConfig::default(),
        )
        .unwrap();
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
                source: source.clone(),
                start,
                log: Box::new(log),
            },
        )
        .unwrap();
    }
    (rt, returned)
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

/// Reads one request frame from the fake broker's side and decodes it as a Fetch.
fn read_fetch(conn: &mut std::net::TcpStream) -> (RequestHeader, FetchRequest) {
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    conn.read_exact(&mut body).unwrap();
    let mut body = Bytes::from(body);
    let header = decode_request_header_from_buffer(&mut body).unwrap();
    assert_eq!(header.request_api_key, ApiKey::Fetch as i16);
    let req = FetchRequest::decode(&mut body, header.request_api_version).unwrap();
    (header, req)
}

fn answer(conn: &mut std::net::TcpStream, header: &RequestHeader, resp: &FetchResponse) {
    let v = header.request_api_version;
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(header.correlation_id)
        .encode(&mut out, FetchResponse::header_version(v))
        .unwrap();
    resp.encode(&mut out, v).unwrap();
    conn.write_all(&(out.len() as i32).to_be_bytes()).unwrap();
    conn.write_all(&out).unwrap();
}

// Goal (issue 11 item 7): a source batch whose offsets would pass i64::MAX stops only its own
// partition, with the reason and not retryable (as divergence), after the valid batches before
// it were appended; the log end is not wrapped, and the other partition on the connection keeps
// being fetched. Method: a TCP listener plays a Fetch v12 broker and answers the first fetch
// with two records and then the hostile batch for t-0, and one record for t-1.
#[test]
fn offsets_past_i64_max_stop_only_their_partition() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (mut rt, returned) = start_shard_with(addr, dir.path(), 2);
    let (mut conn, _) = listener.accept().unwrap();
    // The shard may fetch t-0 alone before t-1 joins: answer such fetches with nothing.
    let header = loop {
        let (header, req) = read_fetch(&mut conn);
        let fetched: Vec<i32> = req
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.partition))
            .collect();
        if fetched == vec![0, 1] {
            break header;
        }
        answer(&mut conn, &header, &FetchResponse::default());
    };
    let good = |base: i64, n: usize| {
        let mut b = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(1));
        for i in 0..n {
            b = b.value(TimestampMs(1_700_000_000_000 + i as i64), b"v");
        }
        b.build()
    };
    let mut hostile = good(OFFSET_MAX - 1, 1);
    hostile[23..27].copy_from_slice(&5i32.to_be_bytes()); // lastOffsetDelta: 5 past the base
    reseal_crc(&mut hostile);
    let part = |index: i32, records: Vec<u8>| {
        PartitionData::default()
            .with_partition_index(index)
            .with_high_watermark(i64::MAX)
            .with_last_stable_offset(i64::MAX)
            .with_log_start_offset(0)
            .with_records(Some(Bytes::from(records)))
    };
    let resp = FetchResponse::default()
        .with_session_id(0)
        .with_responses(vec![FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![
                part(0, [good(0, 2), hostile].concat()),
                part(1, good(0, 1)),
            ])]);
    answer(&mut conn, &header, &resp);
    let deadline = std::time::Instant::now() + WAIT;
    let (why, retryable) = loop {
        assert!(std::time::Instant::now() < deadline, "no PartitionStopped");
        match rt.next_event(Duration::from_millis(200)) {
            Some((
                _,
                MirrorEvent::PartitionStopped {
                    tp, why, retryable, ..
                },
            )) => {
                assert_eq!(tp, TopicPartition::new("t", 0));
                break (why, retryable);
            }
            _ => continue,
        }
    };
    assert!(!retryable, "hostile offsets must not be retried: {why}");
    assert!(
        why.contains("lastOffsetDelta 5") && why.contains(&OFFSET_MAX.to_string()),
        "{why}"
    );
    let logs = returned.lock().unwrap();
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].topic_partition(), &TopicPartition::new("t", 0));
    assert_eq!(
        logs[0].log_end_offset(),
        Offset(2),
        "the valid prefix is kept, nothing else"
    );
    drop(logs);
    // t-1 goes on from offset 1; t-0 is no longer fetched.
    let (_, next) = read_fetch(&mut conn);
    let now: Vec<(i32, i64)> = next
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.partition, p.fetch_offset)))
        .collect();
    assert!(
        now.contains(&(1, 1)) && !now.iter().any(|(p, _)| *p == 0),
        "{now:?}"
    );
    rt.stop();
}

/// A tmpfs of `bytes` mounted on a fresh directory, unmounted when dropped: a real file system
/// that runs out of space. Needs root (CAP_SYS_ADMIN), as the CI machine's tests/setup.sh runs.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: usize) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs to mount a small tmpfs (run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system holding `path` until a write fails with ENOSPC.
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
}

// Goal (issue 11 item 6): a full disk pauses the partition's appends instead of failing or
// losing it: the append is rolled back, the shard says why, asks the source for the same
// offset again after a backoff, and once space returns the records are appended and mirroring
// goes on. Method: the partition's log lives on a 1 MiB tmpfs filled up before the first
// records arrive; a TCP listener plays the Fetch v12 broker.
#[test]
fn a_full_disk_pauses_appends_and_mirroring_resumes_when_space_returns() {
    let disk = SmallDisk::mount(1024 * 1024);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (mut rt, returned) = start_shard_with(addr, disk.path(), 1);
    let filler = disk.path().join("filler");
    fill(&filler);
    let (mut conn, _) = listener.accept().unwrap();
    let mut b = BatchBuilder::new(Offset(0));
    for i in 0..8 {
        b = b.value(TimestampMs(1_700_000_000_000 + i), &[b'x'; 4000]);
    }
    let batch = b.build();
    // Partition t-0's answer: `records`, with the source's log ending at `end`.
    let records_response = |records: Vec<u8>, end: i64| {
        FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![PartitionData::default()
                .with_partition_index(0)
                .with_high_watermark(end)
                .with_last_stable_offset(end)
                .with_log_start_offset(0)
                .with_records(Some(Bytes::from(records)))])])
    };
    let resp = records_response(batch.clone(), 8);
    let offsets = |req: &FetchRequest| -> Vec<i64> {
        req.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.fetch_offset))
            .collect()
    };
    let (header, req) = read_fetch(&mut conn);
    assert_eq!(offsets(&req), vec![0]);
    answer(&mut conn, &header, &resp);
    let what = wait_notice(&mut rt, "disk full");
    assert!(
        what.contains("t-0") && what.contains("retried with backoff"),
        "{what}"
    );
    // The shard sends its next fetch (for offset 8) once the writes are submitted, before
    // their failure comes back. Its answer, the records after 8, must be dropped: appended,
    // they would leave a gap where the rolled-back 0..8 belong.
    let (mut header, mut req) = read_fetch(&mut conn);
    if offsets(&req) == vec![8] {
        let mut later = BatchBuilder::new(Offset(8));
        for i in 0..8 {
            later = later.value(TimestampMs(1_700_000_000_100 + i), &[b'y'; 40]);
        }
        answer(&mut conn, &header, &records_response(later.build(), 16));
        (header, req) = read_fetch(&mut conn);
    }
    // The same offset is asked for again (the append was rolled back, nothing skipped).
    assert_eq!(offsets(&req), vec![0]);
    std::fs::remove_file(&filler).unwrap();
    answer(&mut conn, &header, &resp);
    // Appended: the next fetch asks for offset 8, and the segment holds exactly the batch.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (header, req) = read_fetch(&mut conn);
        if offsets(&req) == vec![8] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never resumed: {:?}",
            offsets(&req)
        );
        answer(&mut conn, &header, &resp);
    }
    // The fetch for 8 goes out once the append's writes are submitted; they complete right
    // after, on the shard's next turn.
    let path = disk.path().join("t-0/00000000000000000000.log");
    let deadline = std::time::Instant::now() + WAIT;
    while std::fs::read(&path).unwrap() != batch {
        assert!(
            std::time::Instant::now() < deadline,
            "the segment never held exactly the batch"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        returned.lock().unwrap().is_empty(),
        "the partition must not stop"
    );
    rt.stop();
}
