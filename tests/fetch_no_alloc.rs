//! Goal: a fetch round trip in steady state — framing the next Fetch request, decoding the
//! response, validating its batches, and appending them to the partition log — calls the
//! allocator a small, constant number of times, the same for a response of 1 batch as for one
//! of 64: records stay slices of the response frame and nothing is allocated per batch.
//! Method: the `allocation-counter` global allocator (counts per thread) around each round
//! after warm-up; the response frames are built (by the `kafka-protocol` crate, playing the
//! broker, with real v2 batches) outside the measured part, as a socket read would fill them.
//! The pinned figure is what the `kafka-protocol` decoder needs per response (the `Vec`s of
//! topics and partitions it decodes into); see `STEADY_ALLOCATIONS_MAX`.
//!
//! Not counted: the in-memory offset/time index vectors grow by doubling as index entries are
//! added (one per `index.interval.bytes` of data, amortised, bounded per segment, never per
//! fetch); the log here uses a large index interval so that growth does not blur the count.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchResponse, ResponseHeader};
use kafka_protocol::protocol::{Encodable, HeaderVersion};
use kmirror::fetch::fetcher::{FetchConfig, FetchEvent, Fetcher, PartitionStart, Poll};
use kmirror::fetch::versions::Versions;
use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::wire::batch_builder::BatchBuilder;
use uuid::Uuid;

const FETCH_VERSION: i16 = 16;
const TOPIC_ID: Uuid = Uuid::from_u128(0xfeed);
/// Allocations per steady-state round trip, whatever the number of batches.
const STEADY_ALLOCATIONS_MAX: u64 = 2;

/// Owns a response frame the way an arena slot does (`Bytes::from_owner`), so slicing it
/// never allocates.
struct Frame(Vec<u8>);

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

struct Rig {
    fetcher: Fetcher,
    log: PartitionLog,
    out: BytesMut,
    events: Vec<FetchEvent>,
    next_offset: i64,
    session_id: i32,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Rig {
        let versions = Versions {
            api_versions: 3,
            metadata: 12,
            fetch: FETCH_VERSION,
            list_offsets: 7,
            offset_for_leader_epoch: 4,
        };
        let mut fetcher = Fetcher::new(FetchConfig::default(), versions, "alloc").unwrap();
        let tp = TopicPartition::new("t", 0);
        fetcher
            .add_partition(PartitionStart {
                tp: tp.clone(),
                topic_id: TOPIC_ID,
                log_end: Offset(0),
                last_epoch: LeaderEpoch::NONE,
                leader_epoch: LeaderEpoch(0),
            })
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            index_interval_bytes: 1 << 30,
            ..LogConfig::default()
        };
        let log =
            PartitionLog::create(&dir.path().join("t-0"), tp, Some(TOPIC_ID), config).unwrap();
        Rig {
            fetcher,
            log,
            out: BytesMut::with_capacity(64 * 1024),
            events: Vec::with_capacity(64),
            next_offset: 0,
            session_id: 0,
            _dir: dir,
        }
    }

    /// The broker's answer: `batches` batches of 3 records continuing the log.
    fn response(&mut self, correlation_id: i32, batches: usize) -> Bytes {
        let mut records = Vec::new();
        for _ in 0..batches {
            let mut b = BatchBuilder::new(Offset(self.next_offset)).leader_epoch(LeaderEpoch(0));
            for r in 0..3 {
                b = b.value(TimestampMs(1_700_000_000_000 + r), b"steady state value");
            }
            records.extend_from_slice(&b.build());
            self.next_offset += 3;
        }
        let mut p = PartitionData::default();
        p.partition_index = 0;
        p.high_watermark = self.next_offset;
        p.last_stable_offset = self.next_offset;
        p.log_start_offset = 0;
        p.records = Some(Bytes::from(records));
        let mut t = FetchableTopicResponse::default();
        t.topic_id = TOPIC_ID;
        t.partitions.push(p);
        let mut resp = FetchResponse::default();
        resp.session_id = if self.session_id == 0 {
            7
        } else {
            self.session_id
        };
        self.session_id = resp.session_id;
        resp.responses.push(t);
        let mut out = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut out, FetchResponse::header_version(FETCH_VERSION))
            .unwrap();
        resp.encode(&mut out, FETCH_VERSION).unwrap();
        Bytes::from_owner(Frame(out.to_vec()))
    }

    /// One round trip; returns the allocations it made (response building excluded).
    fn round(&mut self, batches: usize) -> u64 {
        let now = Instant::now();
        let send = allocation_counter::measure(|| {
            self.out.clear();
            let sent = self.fetcher.poll_request(&mut self.out, now).unwrap();
            assert!(matches!(sent, Poll::Sent(_)), "{sent:?}");
        });
        // The correlation id sits after the length prefix, api key and version.
        let correlation_id = i32::from_be_bytes(self.out[8..12].try_into().unwrap());
        let frame = self.response(correlation_id, batches);
        let first = self.log.log_end_offset();
        let receive = allocation_counter::measure(|| {
            self.fetcher
                .handle_response(frame, now, &mut self.events)
                .unwrap();
            for ev in self.events.drain(..) {
                let FetchEvent::Records(r) = ev else {
                    panic!("unexpected event {ev:?}")
                };
                self.log.append(&mut StdIo, &r.records).unwrap();
            }
        });
        assert_eq!(
            self.log.log_end_offset().0 - first.0,
            3 * batches as i64,
            "every batch appended"
        );
        send.count_total + receive.count_total
    }
}

#[test]
fn fetch_round_trip_allocations_do_not_grow_with_batches() {
    let mut rig = Rig::new();
    // Warm-up: the session opens, vectors reach their working capacity, the producer and
    // epoch state see their first batch.
    for _ in 0..3 {
        rig.round(64);
    }
    let one: Vec<u64> = (0..20).map(|_| rig.round(1)).collect();
    let many: Vec<u64> = (0..20).map(|_| rig.round(64)).collect();
    println!("allocations per round: 1 batch {one:?}, 64 batches {many:?}");
    let max_one = *one.iter().max().unwrap();
    let max_many = *many.iter().max().unwrap();
    assert_eq!(
        max_one, max_many,
        "allocations depend on the number of batches"
    );
    assert!(
        max_many <= STEADY_ALLOCATIONS_MAX,
        "{max_many} allocations per round trip (pinned at most {STEADY_ALLOCATIONS_MAX})"
    );
}
