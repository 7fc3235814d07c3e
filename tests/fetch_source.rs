//! The source client against a real Kafka 4.1 broker (KRaft, from the harness).
//!
//! Every expected value comes from Kafka itself: its segment files on disk, its metadata files,
//! its admin tools. The client under test is the sans-IO fetcher driven by the blocking driver,
//! which shares all protocol logic with the io_uring data path.

mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use harness::{Codec, ProduceOpts, TxnEnd};
use kafka_protocol::messages::{DeleteTopicsRequest, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::{Decodable, StrBytes};
use kmirror::fetch::blocking::{BlockingClient, BlockingFetcher, Step};
use kmirror::fetch::fetcher::{
    DivergenceCause, FetchConfig, FetchEvent, Fetcher, PartitionStart, PartitionState, Poll, Slot,
};
use kmirror::fetch::response::RecordsError;
use kmirror::fetch::versions::Versions;
use kmirror::ids::{LeaderEpoch, Offset, TopicPartition};
use kmirror::wire::batch::{BatchError, Batches};
use uuid::Uuid;

fn client() -> BlockingClient {
    BlockingClient::connect(&harness::shared().bootstrap(), "kmirror-test").expect("connect")
}

/// Small fetches so that every topic takes many rounds (and sessions get incremental).
fn small_config() -> FetchConfig {
    FetchConfig {
        max_wait_ms: 100,
        min_bytes: 1,
        max_bytes: 64 * 1024,
        partition_max_bytes: 16 * 1024,
        sessions: true,
        sessions_per_connection: 1,
        connections_per_source: 1,
        max_rate_bytes_per_sec: 0,
        catch_up_pipelining: true,
    }
}

/// The broker's `.log` files of one partition, in offset order, concatenated.
fn segment_bytes(dir: &Path) -> Vec<u8> {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// The topic id Kafka wrote into `partition.metadata` (URL-safe base64 of the 16 bytes).
fn topic_id_on_disk(dir: &Path) -> Uuid {
    use base64::Engine as _;
    let text = std::fs::read_to_string(dir.join("partition.metadata")).unwrap();
    let b64 = text
        .lines()
        .find_map(|l| l.strip_prefix("topic_id: "))
        .expect("topic_id line");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(b64.trim())
        .unwrap();
    Uuid::from_slice(&raw).unwrap()
}

struct Fetched {
    bytes: Vec<Vec<u8>>,
    events: Vec<FetchEvent>,
    sessions: Vec<Option<(i32, i32)>>,
}

/// Fetch until every slot's fetch offset reaches `targets[slot]`, collecting records and events.
/// Fails loudly if that takes more than `rounds` exchanges.
fn fetch_until(f: &mut BlockingFetcher, slots: &[Slot], targets: &[i64], rounds: usize) -> Fetched {
    let mut out = Fetched {
        bytes: vec![Vec::new(); slots.len()],
        events: Vec::new(),
        sessions: Vec::new(),
    };
    let mut events = Vec::new();
    for _ in 0..rounds {
        // Done when every partition reached its target or stopped for good.
        let done = slots
            .iter()
            .zip(targets)
            .all(|(s, t)| match f.fetcher.state(*s) {
                Some(PartitionState::Diverged | PartitionState::Failed) => true,
                Some(PartitionState::Fetching) => f.fetcher.fetch_offset(*s).unwrap().0 >= *t,
                _ => false,
            });
        if done {
            return out;
        }
        events.clear();
        let step = f.step(&mut events).expect("fetch step");
        assert_ne!(
            step,
            Step::Idle,
            "fetcher idle before reaching targets: {:?}",
            out.events
        );
        for e in &events {
            if let FetchEvent::Records(r) = e {
                let i = slots.iter().position(|s| *s == r.slot).unwrap();
                out.bytes[i].extend_from_slice(&r.records);
            }
        }
        out.events.extend(events.iter().cloned());
        out.sessions.push(f.fetcher.session());
    }
    panic!(
        "targets {targets:?} not reached in {rounds} rounds; events {:?}",
        out.events
    );
}

fn start(
    topic: &str,
    partition: i32,
    topic_id: Uuid,
    log_end: i64,
    last_epoch: i32,
) -> PartitionStart {
    PartitionStart {
        tp: TopicPartition::new(topic, partition),
        topic_id,
        log_end: Offset(log_end),
        last_epoch: LeaderEpoch(last_epoch),
        leader_epoch: LeaderEpoch::NONE,
    }
}

fn fetcher_for(versions: Versions, config: FetchConfig) -> BlockingFetcher {
    BlockingFetcher::connect(
        &harness::shared().bootstrap(),
        versions,
        config,
        "kmirror-test",
    )
    .expect("connect fetcher")
}

// Goal: ApiVersions against Kafka 4.1 picks our newest versions, and Metadata reports the
// partitions, leader, leader epoch, cluster id and topic id, the id matching what the broker
// wrote in partition.metadata.
#[test]
fn api_versions_and_metadata_with_topic_ids() {
    let kafka = harness::shared();
    let topic = harness::unique_topic("meta");
    kafka.create_topic(&topic, 3, &[]);
    let mut c = client();
    assert_eq!(c.versions.fetch, kmirror::wire::api::FETCH.max);
    assert!(c.versions.fetch_uses_topic_ids() && c.versions.metadata_has_leader_epoch());
    let meta = c.metadata(Some(&[topic.as_str()])).unwrap();
    assert!(meta.cluster_id.is_some());
    let t = meta.topic(&topic).unwrap();
    assert_eq!(t.error, 0);
    assert_eq!(t.partitions.len(), 3);
    assert_eq!(
        t.topic_id,
        topic_id_on_disk(&kafka.partition_dir(&topic, 0))
    );
    for p in &t.partitions {
        let leader = p.leader.expect("leader");
        assert!(meta.broker(leader).is_some());
        assert!(p.leader_epoch.is_known());
    }
    let missing = c.metadata(Some(&["no-such-topic-kmirror"])).unwrap();
    assert!(kmirror::fetch::metadata::is_unknown_topic(
        missing.topic("no-such-topic-kmirror").unwrap().error
    ));
}

/// Produce to a fresh one-partition topic, fetch it all, and compare with the segment files.
fn fetch_equals_segments(topic: &str, configs: &[(&str, &str)], produce: impl Fn(&str)) {
    let kafka = harness::shared();
    kafka.create_topic(topic, 1, configs);
    produce(topic);
    let end = kafka.offsets(topic, 0).log_end_offset;
    let mut c = client();
    let meta = c.metadata(Some(&[topic])).unwrap();
    let id = meta.topic(topic).unwrap().topic_id;
    let mut f = fetcher_for(c.versions, small_config());
    let slot = f.fetcher.add_partition(start(topic, 0, id, 0, -1)).unwrap();
    let got = fetch_until(&mut f, &[slot], &[end], 2000);
    let on_disk = segment_bytes(&kafka.partition_dir(topic, 0));
    assert!(!on_disk.is_empty());
    assert_eq!(
        got.bytes[0].len(),
        on_disk.len(),
        "{topic}: fetched vs segment length"
    );
    assert!(
        got.bytes[0] == on_disk,
        "{topic}: fetched bytes differ from the segment files"
    );
    let batches = Batches::new(&on_disk).count();
    assert!(
        batches > 1,
        "{topic}: expected several batches, got {batches}"
    );
    assert!(
        !got.events
            .iter()
            .any(|e| matches!(e, FetchEvent::BadRecords { .. })),
        "{:?}",
        got.events
    );
}

// Goal: for every codec, the batches we fetch are byte-for-byte the broker's segment files
// (offsets, epochs, CRCs, compression untouched), across many small fetches.
#[test]
fn fetched_batches_equal_segment_files_for_all_codecs() {
    for codec in Codec::ALL {
        let topic = harness::unique_topic(&format!("codec-{}", codec.name()));
        fetch_equals_segments(&topic, &[], |t| {
            let opts = ProduceOpts {
                codec,
                batch_size: 4096,
                ..ProduceOpts::default()
            };
            harness::shared().produce(t, 0, 1500, &opts);
        });
    }
}

// Goal: with READ_UNCOMMITTED the mirror gets committed and aborted data and the COMMIT/ABORT
// control batches, exactly as stored.
#[test]
fn transactional_commit_and_abort_fetched_as_stored() {
    let topic = harness::unique_topic("txn");
    fetch_equals_segments(&topic, &[], |t| {
        let opts = ProduceOpts {
            transactions: vec![TxnEnd::Commit, TxnEnd::Abort, TxnEnd::Commit],
            transactional_id: Some(format!("{t}-tx")),
            ..ProduceOpts::default()
        };
        harness::shared().produce(t, 0, 600, &opts);
    });
    let on_disk = segment_bytes(&harness::shared().partition_dir(&topic, 0));
    let controls = Batches::new(&on_disk)
        .filter(|b| b.as_ref().unwrap().1.is_control())
        .count();
    assert_eq!(controls, 3, "one marker per transaction");
}

// Goal: a compacted topic (offset gaps, batches rewritten by the cleaner) is fetched exactly as
// stored. The same keys are produced twice so the cleaner has something to remove; we wait for
// it to have run (offsets missing from the log) before fetching.
#[test]
fn compacted_topic_fetched_as_stored() {
    let kafka = harness::shared();
    let topic = harness::unique_topic("compact");
    // Segments roll by time (segment.ms): Kafka 4 refuses a segment.bytes below 1 MiB.
    let configs = [
        ("cleanup.policy", "compact"),
        ("min.cleanable.dirty.ratio", "0.01"),
        ("segment.ms", "100"),
    ];
    kafka.create_topic(&topic, 1, &configs);
    let opts = ProduceOpts {
        batch_size: 2048,
        ..ProduceOpts::default()
    };
    kafka.produce(&topic, 0, 400, &opts);
    std::thread::sleep(Duration::from_millis(200));
    kafka.produce(&topic, 0, 400, &opts);
    // Roll the active segment once more so the duplicates are in cleanable segments.
    std::thread::sleep(Duration::from_millis(200));
    kafka.produce(
        &topic,
        0,
        1,
        &ProduceOpts {
            seed: 99,
            ..ProduceOpts::default()
        },
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let dir = kafka.partition_dir(&topic, 0);
    loop {
        let bytes = segment_bytes(&dir);
        // The cleaner drops whole batches whose keys were superseded (leaving offset gaps
        // between batches) and rewrites partly superseded ones with fewer records.
        let held: i64 = Batches::new(&bytes)
            .map(|b| b.unwrap().1.records_count() as i64)
            .sum();
        if held < 801 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the log cleaner did not compact {topic} in time"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // A later cleaner pass would rewrite segments between our fetch and the comparison; the
    // last record (offset 800) has a key of its own and supersedes nothing.
    kafka.wait_compacted(&topic, 0, 800);
    let end = kafka.offsets(&topic, 0).log_end_offset;
    let mut c = client();
    let id = c
        .metadata(Some(&[topic.as_str()]))
        .unwrap()
        .topic(&topic)
        .unwrap()
        .topic_id;
    let mut f = fetcher_for(c.versions, small_config());
    let slot = f
        .fetcher
        .add_partition(start(&topic, 0, id, 0, -1))
        .unwrap();
    let got = fetch_until(&mut f, &[slot], &[end], 2000);
    assert!(
        got.bytes[0] == segment_bytes(&dir),
        "compacted log fetched differently"
    );
}

// Goal: a fetch session is established and used incrementally over many rounds (same id,
// epochs 1, 2, 3, ... with no session errors), while three partitions are fetched to the end.
#[test]
fn fetch_session_goes_incremental() {
    let kafka = harness::shared();
    let topic = harness::unique_topic("session");
    kafka.create_topic(&topic, 3, &[]);
    for p in 0..3 {
        kafka.produce(
            &topic,
            p,
            500,
            &ProduceOpts {
                batch_size: 2048,
                ..ProduceOpts::default()
            },
        );
    }
    let mut c = client();
    let id = c
        .metadata(Some(&[topic.as_str()]))
        .unwrap()
        .topic(&topic)
        .unwrap()
        .topic_id;
    // Tiny fetches: many rounds within one session.
    let config = FetchConfig {
        partition_max_bytes: 4096,
        ..small_config()
    };
    let mut f = fetcher_for(c.versions, config);
    let slots: Vec<Slot> = (0..3)
        .map(|p| {
            f.fetcher
                .add_partition(start(&topic, p, id, 0, -1))
                .unwrap()
        })
        .collect();
    let got = fetch_until(&mut f, &slots, &[500, 500, 500], 2000);
    let sessions: Vec<(i32, i32)> = got.sessions.iter().flatten().copied().collect();
    assert!(
        sessions.len() >= 5,
        "expected several rounds in a session: {:?}",
        got.sessions
    );
    let session_id = sessions[0].0;
    assert_ne!(session_id, 0);
    assert!(
        sessions.iter().all(|s| s.0 == session_id),
        "session changed: {sessions:?}"
    );
    assert!(
        sessions.windows(2).all(|w| w[1].1 >= w[0].1),
        "epochs: {sessions:?}"
    );
    assert!(
        sessions.last().unwrap().1 > sessions[0].1 + 3,
        "epochs: {sessions:?}"
    );
    assert!(!got
        .events
        .iter()
        .any(|e| matches!(e, FetchEvent::RequestFailed { .. })));
    for (p, bytes) in got.bytes.iter().enumerate() {
        assert!(*bytes == segment_bytes(&kafka.partition_dir(&topic, p as i32)));
    }
    // Removing a partition forgets it in the session; the others go on in the same session.
    f.fetcher.remove_partition(slots[2]).unwrap();
    kafka.produce(&topic, 0, 10, &ProduceOpts::default());
    let more = fetch_until(&mut f, &slots[..2], &[510, 500], 100);
    assert!(more.sessions.iter().flatten().all(|s| s.0 == session_id));
}

// Goal: after kafka-delete-records moves the source's log start past our fetch offset, the
// fetcher gets OFFSET_OUT_OF_RANGE, asks ListOffsets(earliest), reports the new log start and
// fetches on from there (accepting the batch that contains it).
#[test]
fn delete_records_moves_log_start() {
    let kafka = harness::shared();
    let topic = harness::unique_topic("delrec");
    kafka.create_topic(&topic, 1, &[]);
    kafka.produce(
        &topic,
        0,
        300,
        &ProduceOpts {
            batch_size: 4096,
            ..ProduceOpts::default()
        },
    );
    let low = kafka.delete_records(&topic, 0, 150);
    assert_eq!(low, 150);
    let mut c = client();
    let id = c
        .metadata(Some(&[topic.as_str()]))
        .unwrap()
        .topic(&topic)
        .unwrap()
        .topic_id;
    let mut f = fetcher_for(c.versions, small_config());
    let slot = f
        .fetcher
        .add_partition(start(&topic, 0, id, 0, -1))
        .unwrap();
    let got = fetch_until(&mut f, &[slot], &[300], 500);
    let moved: Vec<_> = got
        .events
        .iter()
        .filter_map(|e| match e {
            FetchEvent::LogStartMoved { from, to, .. } => Some((*from, *to)),
            _ => None,
        })
        .collect();
    // Kafka keeps the batch that contains the new log start; the mirrored log restarts at its
    // base, and from there holds exactly what the broker's segments hold.
    let on_disk = segment_bytes(&kafka.partition_dir(&topic, 0));
    let (at, containing) = Batches::new(&on_disk)
        .map(|b| b.unwrap())
        .find(|(_, b)| b.base_offset() <= Offset(150) && Offset(150) <= b.last_offset())
        .expect("a batch holds offset 150");
    assert_eq!(moved, vec![(Offset(0), containing.base_offset())]);
    let first_records = got
        .events
        .iter()
        .position(|e| matches!(e, FetchEvent::Records(_)));
    let first_moved = got
        .events
        .iter()
        .position(|e| matches!(e, FetchEvent::LogStartMoved { .. }));
    assert!(
        first_moved < first_records,
        "the restart is reported before its records"
    );
    assert!(
        got.bytes[0] == on_disk[at..],
        "bytes from the new log start differ"
    );
}

fn delete_topic(c: &mut BlockingClient, topic: &str) {
    let mut req = DeleteTopicsRequest::default();
    req.topic_names = vec![TopicName(StrBytes::from_string(topic.to_owned()))];
    req.timeout_ms = 30_000;
    let resp = c.request::<DeleteTopicsRequest>(4, &req).unwrap();
    assert_eq!(resp.responses[0].error_code, 0, "delete {topic}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !kmirror::fetch::metadata::is_unknown_topic(
        c.metadata(Some(&[topic]))
            .unwrap()
            .topic(topic)
            .map_or(3, |t| t.error),
    ) {
        assert!(Instant::now() < deadline, "{topic} still exists");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Epoch of the last batch in the partition's segment files.
fn last_epoch_on_disk(dir: &Path) -> i32 {
    let bytes = segment_bytes(dir);
    Batches::new(&bytes)
        .last()
        .unwrap()
        .unwrap()
        .1
        .partition_leader_epoch()
        .0
}

// Goal: a source topic deleted and recreated under the same name with fewer records must be
// reported as divergence, never fetched on silently. Three ways to notice, one per protocol
// generation:
// * by topic id (Fetch v13+): the id in metadata changed (and the old id is unknown);
// * by name with LastFetchedEpoch (Fetch v12): the leader returns a DivergingEpoch;
// * by name on an older protocol (Fetch v10, OffsetForLeaderEpoch v2): the epoch check fails.
// The data we hold belongs to a topic that no longer exists; continuing at our offset would
// splice two different topics into one log, so every path stops the partition.
#[test]
fn recreated_topic_is_divergence() {
    let kafka = harness::shared();
    let topic = harness::unique_topic("recreate");
    kafka.create_topic(&topic, 1, &[]);
    kafka.produce(&topic, 0, 200, &ProduceOpts::default());
    let mut c = client();
    let old_id = c
        .metadata(Some(&[topic.as_str()]))
        .unwrap()
        .topic(&topic)
        .unwrap()
        .topic_id;
    let mut f = fetcher_for(c.versions, small_config());
    let slot = f
        .fetcher
        .add_partition(start(&topic, 0, old_id, 0, -1))
        .unwrap();
    fetch_until(&mut f, &[slot], &[200], 500);
    let last_epoch = last_epoch_on_disk(&kafka.partition_dir(&topic, 0));

    delete_topic(&mut c, &topic);
    kafka.create_topic(&topic, 1, &[]);
    kafka.produce(&topic, 0, 50, &ProduceOpts::default());
    let meta = c.metadata(Some(&[topic.as_str()])).unwrap();
    let new_id = meta.topic(&topic).unwrap().topic_id;
    assert_ne!(new_id, old_id);

    // By topic id: the old id is unknown to the broker, metadata shows the new one.
    let mut events = Vec::new();
    let mut refresh = false;
    for _ in 0..50 {
        events.clear();
        f.step(&mut events).unwrap();
        if events
            .iter()
            .any(|e| matches!(e, FetchEvent::RefreshMetadata { .. }))
        {
            refresh = true;
            break;
        }
    }
    assert!(
        refresh,
        "no metadata refresh asked for after the topic id vanished"
    );
    let epoch = meta.partition(&topic, 0).unwrap().leader_epoch;
    events.clear();
    f.fetcher
        .update_leader(slot, new_id, epoch, &mut events)
        .unwrap();
    assert!(
        matches!(
            events[..],
            [FetchEvent::Diverged(d)] if d.cause == DivergenceCause::TopicIdChanged { old: old_id, new: new_id }
        ),
        "{events:?}"
    );
    assert_eq!(f.fetcher.state(slot), Some(PartitionState::Diverged));

    // By name with LastFetchedEpoch: DivergingEpoch from the leader.
    let by_name = Versions {
        fetch: 12,
        ..c.versions
    };
    let mut f = fetcher_for(by_name, small_config());
    let slot = f
        .fetcher
        .add_partition(start(&topic, 0, Uuid::nil(), 200, last_epoch))
        .unwrap();
    let got = fetch_until(&mut f, &[slot], &[i64::MAX], 20);
    let d = got.events.iter().find_map(|e| match e {
        FetchEvent::Diverged(d) => Some(*d),
        _ => None,
    });
    let d = d.unwrap_or_else(|| panic!("no divergence: {:?}", got.events));
    let DivergenceCause::EpochEnd { end_offset, .. } = d.cause else {
        panic!("{d:?}")
    };
    assert_eq!(end_offset, Offset(50), "the new topic's log ends at 50");

    // Old protocol: OffsetForLeaderEpoch v2 before the first fetch.
    let old = Versions {
        fetch: 10,
        offset_for_leader_epoch: 2,
        ..c.versions
    };
    let mut f = fetcher_for(old, small_config());
    let slot = f
        .fetcher
        .add_partition(start(&topic, 0, Uuid::nil(), 200, last_epoch))
        .unwrap();
    assert_eq!(
        f.fetcher.state(slot),
        Some(PartitionState::AwaitingEpochCheck)
    );
    let got = fetch_until(&mut f, &[slot], &[i64::MAX], 20);
    assert!(
        got.events
            .iter()
            .any(|e| matches!(e, FetchEvent::Diverged(_))),
        "{:?}",
        got.events
    );
}

/// Frame the fetcher's next request into `out`, waiting out any backoff it asks for.
fn next_request(fetcher: &mut Fetcher, out: &mut BytesMut) -> kmirror::fetch::conn::InFlight {
    out.clear();
    for _ in 0..100 {
        match fetcher.poll_request(out, Instant::now()).unwrap() {
            Poll::Sent(sent) => return sent,
            Poll::NotBefore(t) => std::thread::sleep(t.saturating_duration_since(Instant::now())),
            other => panic!("fetcher has nothing to send: {other:?}"),
        }
    }
    panic!("fetcher kept waiting");
}

// Goal: a flipped byte inside one partition's records in a real response frame fails only that
// partition with a typed CRC error; the other partition's records are delivered. A frame cut
// short fails the request as a whole (the structure is unreadable), and the next request is a
// full fetch that succeeds.
#[test]
fn corrupt_response_fails_only_that_partition() {
    let kafka = harness::shared();
    let topic = harness::unique_topic("corrupt");
    kafka.create_topic(&topic, 2, &[]);
    for p in 0..2 {
        kafka.produce(&topic, p, 50, &ProduceOpts::default());
    }
    let mut c = client();
    let id = c
        .metadata(Some(&[topic.as_str()]))
        .unwrap()
        .topic(&topic)
        .unwrap()
        .topic_id;
    let versions = c.versions;
    let mut fetcher = Fetcher::new(FetchConfig::default(), versions, "kmirror-test").unwrap();
    let s0 = fetcher.add_partition(start(&topic, 0, id, 0, -1)).unwrap();
    let s1 = fetcher.add_partition(start(&topic, 1, id, 0, -1)).unwrap();

    // Record one real response frame.
    let mut out = BytesMut::new();
    let sent = next_request(&mut fetcher, &mut out);
    c.out_buf().extend_from_slice(&out);
    c.flush().unwrap();
    let frame = c.read_frame().unwrap();

    // Find partition 0's records inside the frame and flip a byte in its first batch's
    // CRC-covered part.
    let mut body = frame.slice(4..);
    if sent.api_version >= 12 {
        body = body.slice(1..); // response header v1: empty tagged fields
    }
    let resp = FetchResponse::decode(&mut body.clone(), sent.api_version).unwrap();
    let records = resp.responses[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == 0)
        .and_then(|p| p.records.clone())
        .unwrap();
    let at = records.as_ptr() as usize - frame.as_ptr() as usize + 40;
    let mut corrupt = BytesMut::from(frame.as_ref());
    corrupt[at] ^= 0x01;
    let mut events = Vec::new();
    fetcher
        .handle_response(corrupt.freeze(), Instant::now(), &mut events)
        .unwrap();
    assert!(
        events.iter().any(|e| matches!(
            e,
            FetchEvent::BadRecords { slot, error: RecordsError::Batch(BatchError::CrcMismatch { base_offset: 0, .. }), retrying: true }
                if *slot == s0
        )),
        "{events:?}"
    );
    let p1: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            FetchEvent::Records(r) => Some(r.slot),
            _ => None,
        })
        .collect();
    assert_eq!(p1, vec![s1], "only partition 1 delivers records");
    assert_eq!(fetcher.fetch_offset(s0), Some(Offset(0)));

    // A truncated frame: the request fails as a whole and is retried as a full fetch.
    next_request(&mut fetcher, &mut out);
    c.out_buf().extend_from_slice(&out);
    c.flush().unwrap();
    let frame = c.read_frame().unwrap();
    events.clear();
    fetcher
        .handle_response(frame.slice(..frame.len() - 5), Instant::now(), &mut events)
        .unwrap();
    assert!(
        matches!(events[..], [FetchEvent::RequestFailed { .. }]),
        "{events:?}"
    );
    next_request(&mut fetcher, &mut out);
    let mut req_frame = kmirror::wire::frame::split_frame(&mut out.clone())
        .unwrap()
        .unwrap();
    let header =
        kafka_protocol::protocol::decode_request_header_from_buffer(&mut req_frame).unwrap();
    let req = FetchRequest::decode(&mut req_frame, header.request_api_version).unwrap();
    assert_eq!(req.session_epoch, 0, "a full fetch after the failure");
    c.out_buf().extend_from_slice(&out);
    c.flush().unwrap();
    let frame: Bytes = c.read_frame().unwrap();
    events.clear();
    fetcher
        .handle_response(frame, Instant::now(), &mut events)
        .unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, FetchEvent::Records(r) if r.slot == s0)),
        "{events:?}"
    );
}

// Goal: the benchmarks' raw copy from a real broker (`bench::raw_copy_broker`, the denominator
// of the outage catch-up) copies exactly what the broker holds: its whole-batch count equals
// the bytes of the broker's segment files, with KIP-227 incremental sessions (many small
// rounds, two connections) and with sessionless full fetches, and its output file holds every
// response byte it received.
#[test]
fn broker_raw_copy_reads_every_segment_byte_with_and_without_sessions() {
    use kmirror::bench::raw_copy_broker::{self, BrokerCopyConfig};
    let kafka = harness::shared();
    let topic = harness::unique_topic("raw-copy-broker");
    kafka.create_topic(&topic, 3, &[]);
    let opts = ProduceOpts {
        codec: Codec::Lz4,
        batch_size: 4096,
        ..ProduceOpts::default()
    };
    for p in 0..3 {
        kafka.produce(&topic, p, 600 * (p as usize + 1), &opts);
    }
    let on_disk: u64 = (0..3)
        .map(|p| segment_bytes(&kafka.partition_dir(&topic, p)).len() as u64)
        .sum();
    assert!(on_disk > 0);
    for sessions in [true, false] {
        let out = tempfile::tempdir().unwrap();
        let mut config = BrokerCopyConfig::new(kafka.bootstrap(), topic.clone(), 3);
        config.max_bytes = 48 * 1024;
        config.partition_max_bytes = 16 * 1024;
        config.max_wait_ms = 100;
        config.connections = 2;
        config.sessions = sessions;
        config.out_dir = Some(out.path().to_path_buf());
        config.duration = Duration::from_secs(120);
        let report = raw_copy_broker::run(&config).expect("raw copy from the broker");
        assert_eq!(report.record_bytes, on_disk, "sessions={sessions}");
        assert!(
            report.responses > 6,
            "sessions={sessions}: {} responses",
            report.responses
        );
        let written: u64 = std::fs::read_dir(out.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(written, report.response_bytes, "sessions={sessions}");
    }
}
