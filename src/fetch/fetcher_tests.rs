//! Unit tests of the sans-IO fetcher: we play the broker with the crate's broker-side codecs
//! (decode the request bytes the fetcher produced, encode a response). These check our state
//! machine against the protocol's rules (kafka-formats.md §6); the real-broker proof is in
//! tests/fetch_source.rs.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    EpochEndOffset, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset as OfleEnd, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{
    decode_request_header_from_buffer, Decodable, Encodable, HeaderVersion, StrBytes,
};
use kafka_protocol::ResponseError;
use uuid::Uuid;

use super::fetcher::*;
use super::response::RecordsError;
use super::versions::Versions;
use crate::ids::{LeaderEpoch, Offset, TopicPartition};
use crate::wire::frame;

fn versions(fetch: i16) -> Versions {
    Versions {
        api_versions: 3,
        metadata: 12,
        fetch,
        list_offsets: 7,
        offset_for_leader_epoch: if fetch >= 12 { 4 } else { 2 },
    }
}

struct Broker {
    f: Fetcher,
    out: BytesMut,
    now: Instant,
    events: Vec<FetchEvent>,
}

const TOPIC_ID: Uuid = Uuid::from_u128(0x1234);

impl Broker {
    fn new(fetch_version: i16) -> Broker {
        let f = Fetcher::new(FetchConfig::default(), versions(fetch_version), "test").unwrap();
        Broker {
            f,
            out: BytesMut::new(),
            now: Instant::now(),
            events: Vec::new(),
        }
    }

    fn add(&mut self, partition: i32, log_end: i64, last_epoch: i32) -> Slot {
        self.f
            .add_partition(PartitionStart {
                tp: TopicPartition::new("t", partition),
                topic_id: TOPIC_ID,
                log_end: Offset(log_end),
                last_epoch: LeaderEpoch(last_epoch),
                leader_epoch: LeaderEpoch(5),
            })
            .unwrap()
    }

    /// Ask the fetcher for its next request; decode it as the broker would.
    fn request<R: Decodable>(&mut self, key: ApiKey) -> (RequestHeader, R) {
        match self.f.poll_request(&mut self.out, self.now).unwrap() {
            Poll::Sent(_) => {}
            other => panic!("expected a request, got {other:?}"),
        }
        let mut body = frame::split_frame(&mut self.out).unwrap().unwrap();
        let header = decode_request_header_from_buffer(&mut body).unwrap();
        assert_eq!(header.request_api_key, key as i16);
        let req = R::decode(&mut body, header.request_api_version).unwrap();
        assert!(body.is_empty());
        (header, req)
    }

    fn fetch_request(&mut self) -> (RequestHeader, FetchRequest) {
        self.request(ApiKey::Fetch)
    }

    fn respond<R: Encodable + HeaderVersion>(&mut self, header: &RequestHeader, resp: &R) {
        let frame = encode_response(header, resp);
        self.events.clear();
        self.f
            .handle_response(frame, self.now, &mut self.events)
            .unwrap();
    }
}

fn encode_response<R: Encodable + HeaderVersion>(header: &RequestHeader, resp: &R) -> Bytes {
    let mut out = BytesMut::new();
    let v = header.request_api_version;
    ResponseHeader::default()
        .with_correlation_id(header.correlation_id)
        .encode(&mut out, R::header_version(v))
        .unwrap();
    resp.encode(&mut out, v).unwrap();
    out.freeze()
}

/// A v2 batch with `count` offsets and a valid CRC-32C, fields placed per kafka-formats.md §1.1.
fn batch(base: i64, count: i32, epoch: i32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&base.to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&epoch.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&(count - 1).to_be_bytes());
    b.extend_from_slice(&7i64.to_be_bytes());
    b.extend_from_slice(&9i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // zero records: allowed (compaction keeps such)
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn partition(index: i32, hw: i64, records: Option<Vec<u8>>) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_high_watermark(hw)
        .with_last_stable_offset(hw)
        .with_log_start_offset(0)
        .with_aborted_transactions(None)
        .with_records(records.map(Bytes::from))
}

fn fetch_response(session_id: i32, parts: Vec<PartitionData>, by_id: bool) -> FetchResponse {
    let mut topic = FetchableTopicResponse::default().with_partitions(parts);
    if by_id {
        topic.topic_id = TOPIC_ID;
    } else {
        topic.topic = TopicName(StrBytes::from_static_str("t"));
    }
    FetchResponse::default()
        .with_session_id(session_id)
        .with_responses(vec![topic])
}

fn sent_partitions(req: &FetchRequest) -> Vec<(i32, i64)> {
    req.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.partition, p.fetch_offset)))
        .collect()
}

// Goal: the request is a consumer's (replica -1, READ_UNCOMMITTED), sized from config, uses
// topic ids at v13+, and carries current and last fetched epochs.
#[test]
fn first_request_is_a_full_consumer_fetch_asking_for_a_session() {
    let mut b = Broker::new(16);
    b.add(0, 10, 3);
    b.add(1, 20, -1);
    let (h, req) = b.fetch_request();
    assert_eq!(h.request_api_version, 16);
    assert_eq!((req.session_id, req.session_epoch), (0, 0));
    assert_eq!(req.replica_id.0, -1);
    assert_eq!(req.isolation_level, 0);
    let cfg = FetchConfig::default();
    assert_eq!(
        (req.max_wait_ms, req.min_bytes, req.max_bytes),
        (
            cfg.max_wait_ms as i32,
            cfg.min_bytes as i32,
            cfg.max_bytes as i32
        )
    );
    assert_eq!(req.topics.len(), 1);
    assert_eq!(req.topics[0].topic_id, TOPIC_ID);
    let p0 = &req.topics[0].partitions[0];
    assert_eq!(
        (
            p0.fetch_offset,
            p0.current_leader_epoch,
            p0.last_fetched_epoch
        ),
        (10, 5, 3)
    );
    assert_eq!(p0.partition_max_bytes, cfg.partition_max_bytes as i32);
    assert_eq!(sent_partitions(&req), vec![(0, 10), (1, 20)]);
}

// Goal: KIP-227 from the client side. After the broker grants session 77, requests are
// incremental with epochs 1, 2, ...; only partitions whose fetch offset moved are sent; a
// partition absent from an incremental response keeps its last high watermark.
#[test]
fn incremental_session_sends_only_changes_and_keeps_watermarks() {
    let mut b = Broker::new(12);
    let s0 = b.add(0, 0, -1);
    let s1 = b.add(1, 0, -1);
    let (h, _) = b.fetch_request();
    let records = [batch(0, 2, 0), batch(2, 3, 0)].concat();
    b.respond(
        &h,
        &fetch_response(
            77,
            vec![
                partition(0, 5, Some(records.clone())),
                partition(1, 0, None),
            ],
            false,
        ),
    );
    let FetchEvent::Records(r) = &b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(
        (r.slot, r.first_offset, r.last_offset, r.batches),
        (s0, Offset(0), Offset(4), 2)
    );
    assert_eq!(r.records.as_ref(), &records[..]);
    assert_eq!(b.f.session(), Some((77, 1)));

    let (h, req) = b.fetch_request();
    assert_eq!((req.session_id, req.session_epoch), (77, 1));
    assert_eq!(
        sent_partitions(&req),
        vec![(0, 5)],
        "only the partition that moved"
    );
    // The broker reports nothing new: no partition in the response.
    b.respond(&h, &FetchResponse::default().with_session_id(77));
    assert!(b.events.is_empty());
    assert_eq!(b.f.watermarks(s0).unwrap().0, Offset(5));
    assert_eq!(b.f.watermarks(s1).unwrap().0, Offset(0));

    let (_, req) = b.fetch_request();
    assert_eq!((req.session_id, req.session_epoch), (77, 2));
    assert!(req.topics.is_empty() && req.forgotten_topics_data.is_empty());
    let counts = b.f.fetch_requests();
    assert_eq!((counts.full, counts.incremental), (1, 2));
}

#[test]
fn session_errors_fall_back_to_full_fetch() {
    for (code, expect_id) in [
        (ResponseError::FetchSessionIdNotFound, 0),
        (ResponseError::InvalidFetchSessionEpoch, 77),
        (ResponseError::FetchSessionTopicIdError, 0),
    ] {
        let mut b = Broker::new(13);
        b.add(0, 0, -1);
        b.add(1, 0, -1);
        let (h, _) = b.fetch_request();
        b.respond(&h, &fetch_response(77, vec![], true));
        let (h, req) = b.fetch_request();
        assert_eq!(req.session_epoch, 1);
        b.respond(&h, &FetchResponse::default().with_error_code(code.code()));
        assert!(matches!(b.events[0], FetchEvent::RequestFailed { .. }));
        let (_, req) = b.fetch_request();
        assert_eq!(
            (req.session_id, req.session_epoch),
            (expect_id, 0),
            "{code:?}"
        );
        assert_eq!(
            sent_partitions(&req).len(),
            2,
            "a full fetch lists every partition"
        );
    }
}

#[test]
fn removed_partition_is_forgotten_in_the_session() {
    let mut b = Broker::new(12);
    b.add(0, 0, -1);
    let s1 = b.add(1, 0, -1);
    let (h, _) = b.fetch_request();
    b.respond(&h, &fetch_response(9, vec![], false));
    b.f.remove_partition(s1).unwrap();
    let (_, req) = b.fetch_request();
    assert!(req.topics.is_empty());
    assert_eq!(req.forgotten_topics_data.len(), 1);
    assert_eq!(req.forgotten_topics_data[0].topic.0.as_str(), "t");
    assert_eq!(req.forgotten_topics_data[0].partitions, vec![1]);
    assert_eq!(b.f.partitions(), 1);
}

// Goal: a partition handed over from one fetcher of a broker to another (the shard's catch-up
// split and merge of its fetch groups) keeps its whole fetch state: the fetcher it joins asks
// for it from the same offset with the same epochs and knows its watermarks, and the fetcher
// it left forgets it in its session with its next request. A fetcher with a request in flight
// hands nothing over (that request's answer would name a partition no longer there).
#[test]
fn a_handed_over_partition_keeps_its_position_epochs_and_watermarks() {
    let mut a = Broker::new(12);
    a.add(0, 0, -1);
    let s1 = a.add(1, 10, 3);
    let (h, _) = a.fetch_request();
    a.respond(
        &h,
        &fetch_response(9, vec![partition(1, 30, Some(batch(10, 5, 4)))], false),
    );
    assert_eq!(a.f.fetch_offset(s1), Some(Offset(15)));
    let (h, _) = a.fetch_request();
    assert!(matches!(
        a.f.hand_over(s1),
        Err(FetcherError::RequestInFlight)
    ));
    a.respond(&h, &fetch_response(9, vec![], false));
    let handover = a.f.hand_over(s1).unwrap();
    assert_eq!(handover.topic_partition(), &TopicPartition::new("t", 1));
    assert_eq!((a.f.partitions(), a.f.live_partitions()), (2, 1));
    assert_eq!(a.f.fetch_offset(s1), None, "gone from the fetcher it left");

    let mut b = Broker::new(12);
    let t1 = b.f.take_over(handover).unwrap();
    assert_eq!(b.f.fetch_offset(t1), Some(Offset(15)));
    assert_eq!(
        b.f.watermarks(t1),
        Some((Offset(30), Offset(30), Offset(0)))
    );
    let (_, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(1, 15)]);
    let p = &req.topics[0].partitions[0];
    assert_eq!((p.current_leader_epoch, p.last_fetched_epoch), (5, 4));

    let (_, req) = a.fetch_request();
    assert!(req.topics.is_empty(), "{req:?}");
    assert_eq!(req.forgotten_topics_data[0].partitions, vec![1]);
    assert_eq!((a.f.partitions(), a.f.live_partitions()), (1, 1));
}

// Goal: pause then resume before the next request. The partition removed from a session is
// still waiting to be forgotten; adding it again must replace it, not fail as a duplicate.
#[test]
fn removed_partition_in_session_can_be_added_again() {
    let mut b = Broker::new(12);
    b.add(0, 0, -1);
    let s1 = b.add(1, 0, -1);
    let (h, _) = b.fetch_request();
    b.respond(&h, &fetch_response(9, vec![], false));
    b.f.remove_partition(s1).unwrap();
    let again = b.add(1, 40, -1);
    assert_eq!(b.f.partitions(), 2);
    assert_eq!(b.f.fetch_offset(again), Some(Offset(40)));
}

// Goal: a pause of every partition, then a resume. The request that forgets the last partitions
// empties the session, which Kafka then closes and answers without (session id 0). The next
// request, once partitions are added again, opens a new session with a full fetch instead of
// naming the closed one (which the broker would refuse with FETCH_SESSION_ID_NOT_FOUND).
#[test]
fn a_session_the_broker_closed_when_it_emptied_is_opened_again() {
    let mut b = Broker::new(12);
    let s0 = b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    b.respond(&h, &fetch_response(9, vec![], false));
    assert_eq!(b.f.session(), Some((9, 1)));
    b.f.remove_partition(s0).unwrap();
    let (h, req) = b.fetch_request();
    assert_eq!((req.session_id, req.session_epoch), (9, 1));
    assert_eq!(req.forgotten_topics_data[0].partitions, vec![0]);
    b.respond(&h, &fetch_response(0, vec![], false));
    assert!(b.events.is_empty(), "{:?}", b.events);
    assert_eq!(b.f.partitions(), 0);
    b.add(0, 7, -1);
    let (_, req) = b.fetch_request();
    assert_eq!(
        (req.session_id, req.session_epoch),
        (0, 0),
        "a full request asking for a new session"
    );
    assert_eq!(sent_partitions(&req), vec![(0, 7)]);
    assert!(req.forgotten_topics_data.is_empty());
}

#[test]
fn sessionless_source_sends_full_fetches() {
    let mut b = Broker::new(6);
    b.add(0, 3, -1);
    let (h, req) = b.fetch_request();
    assert_eq!(h.request_api_version, 6);
    assert_eq!(sent_partitions(&req), vec![(0, 3)]);
    b.respond(&h, &fetch_response(0, vec![partition(0, 3, None)], false));
    let (_, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(0, 3)]);
}

// Goal: OFFSET_OUT_OF_RANGE below the source's log start is followed: a ListOffsets(earliest)
// goes out, the log start is reported, and fetching resumes there, accepting a first batch that
// begins below it (mid-batch log start).
#[test]
fn out_of_range_below_log_start_moves_to_log_start() {
    let mut b = Broker::new(12);
    let s = b.add(0, 10, 0);
    let (h, _) = b.fetch_request();
    let oor = partition(0, 100, None).with_error_code(ResponseError::OffsetOutOfRange.code());
    b.respond(&h, &fetch_response(0, vec![oor], false));
    assert_eq!(b.f.state(s), Some(PartitionState::AwaitingLogStart));
    let (h, req) = b.request::<ListOffsetsRequest>(ApiKey::ListOffsets);
    assert_eq!(req.replica_id.0, -1);
    assert_eq!(req.topics[0].partitions[0].timestamp, -2);
    let lo = ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
        .with_name(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(vec![ListOffsetsPartitionResponse::default()
            .with_partition_index(0)
            .with_offset(50)])]);
    b.respond(&h, &lo);
    assert!(
        b.events.is_empty(),
        "reported with the first records: {:?}",
        b.events
    );
    let (h, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(0, 50)]);
    b.respond(
        &h,
        &fetch_response(0, vec![partition(0, 100, Some(batch(48, 5, 0)))], false),
    );
    // The source's log start is 50, inside the batch 48..=52: the log restarts at 48.
    let moved = FetchEvent::LogStartMoved {
        slot: s,
        from: Offset(10),
        to: Offset(48),
    };
    assert_eq!(b.events[0], moved);
    let FetchEvent::Records(r) = &b.events[1] else {
        panic!("{:?}", b.events)
    };
    assert_eq!((r.first_offset, r.last_offset), (Offset(48), Offset(52)));
}

#[test]
fn out_of_range_above_source_end_is_divergence() {
    let mut b = Broker::new(12);
    let s = b.add(0, 10, 0);
    let (h, _) = b.fetch_request();
    let oor = partition(0, 4, None).with_error_code(ResponseError::OffsetOutOfRange.code());
    b.respond(&h, &fetch_response(0, vec![oor], false));
    let (h, _) = b.request::<ListOffsetsRequest>(ApiKey::ListOffsets);
    let lo = ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
        .with_name(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(vec![ListOffsetsPartitionResponse::default().with_offset(0)])]);
    b.respond(&h, &lo);
    let FetchEvent::Diverged(d) = b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(
        d.cause,
        DivergenceCause::BeyondSourceEnd {
            source_log_start: Offset(0)
        }
    );
    assert_eq!(b.f.state(s), Some(PartitionState::Diverged));
}

#[test]
fn diverging_epoch_stops_the_partition() {
    let mut b = Broker::new(12);
    let s = b.add(0, 10, 4);
    let (h, _) = b.fetch_request();
    let mut pd = partition(0, 8, None);
    pd.diverging_epoch = EpochEndOffset::default().with_epoch(3).with_end_offset(8);
    b.respond(&h, &fetch_response(0, vec![pd], false));
    let FetchEvent::Diverged(d) = b.events[0] else {
        panic!("{:?}", b.events)
    };
    assert_eq!(
        d.cause,
        DivergenceCause::EpochEnd {
            epoch: LeaderEpoch(3),
            end_offset: Offset(8)
        }
    );
    assert_eq!(
        (d.fetch_offset, d.last_fetched_epoch),
        (Offset(10), LeaderEpoch(4))
    );
    assert_eq!(b.f.state(s), Some(PartitionState::Diverged));
    assert_eq!(b.f.poll_request(&mut b.out, b.now).unwrap(), Poll::Idle);
}

#[test]
fn leader_errors_ask_for_metadata_and_resume_after_update() {
    let mut b = Broker::new(12);
    let s = b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    let err = partition(0, 0, None).with_error_code(ResponseError::NotLeaderOrFollower.code());
    b.respond(&h, &fetch_response(0, vec![err], false));
    assert!(matches!(b.events[0], FetchEvent::RefreshMetadata { slot, .. } if slot == s));
    assert_eq!(b.f.poll_request(&mut b.out, b.now).unwrap(), Poll::Idle);
    b.f.update_leader(s, TOPIC_ID, LeaderEpoch(6), &mut b.events)
        .unwrap();
    let (_, req) = b.fetch_request();
    assert_eq!(req.topics[0].partitions[0].current_leader_epoch, 6);
}

#[test]
fn changed_topic_id_is_divergence() {
    let mut b = Broker::new(13);
    let s = b.add(0, 0, -1);
    b.events.clear();
    b.f.update_leader(s, Uuid::from_u128(99), LeaderEpoch(0), &mut b.events)
        .unwrap();
    assert!(matches!(
        b.events[0],
        FetchEvent::Diverged(Divergence {
            cause: DivergenceCause::TopicIdChanged { .. },
            ..
        })
    ));
}

// Goal: a source without Fetch v12 (Kafka < 2.7) cannot report divergence in Fetch, so a
// resumed partition is checked with OffsetForLeaderEpoch v2 first, and the same rule applies.
#[test]
fn old_source_checks_epochs_before_fetching() {
    for (answer, diverges) in [((4, 30), false), ((3, 8), true)] {
        let mut b = Broker::new(10);
        let s = b.add(0, 10, 4);
        let (h, req) = b.request::<OffsetForLeaderEpochRequest>(ApiKey::OffsetForLeaderEpoch);
        assert_eq!(h.request_api_version, 2);
        let p = &req.topics[0].partitions[0];
        assert_eq!((p.leader_epoch, p.current_leader_epoch), (4, 5));
        let resp = OffsetForLeaderEpochResponse::default().with_topics(vec![
            OffsetForLeaderTopicResult::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![OfleEnd::default()
                    .with_partition(0)
                    .with_leader_epoch(answer.0)
                    .with_end_offset(answer.1)]),
        ]);
        b.respond(&h, &resp);
        if diverges {
            assert!(matches!(b.events[0], FetchEvent::Diverged(_)));
        } else {
            assert!(b.events.is_empty());
            assert_eq!(b.f.state(s), Some(PartitionState::Fetching));
            let (_, req) = b.fetch_request();
            assert_eq!(sent_partitions(&req), vec![(0, 10)]);
        }
    }
}

#[test]
fn throttle_holds_the_next_request() {
    let mut b = Broker::new(12);
    b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    b.respond(
        &h,
        &fetch_response(0, vec![], false).with_throttle_time_ms(250),
    );
    assert_eq!(
        b.f.poll_request(&mut b.out, b.now).unwrap(),
        Poll::NotBefore(b.now + Duration::from_millis(250))
    );
    b.now += Duration::from_millis(250);
    b.fetch_request();
}

// Goal: with `max_rate_bytes_per_sec`, the records a response brought are paid for at that
// rate before the next request goes out (one burst ahead at most), and the wait is a
// `NotBefore` the driver sleeps on, like a throttle; every request is still counted by kind.
#[test]
fn rate_cap_holds_the_next_request_until_the_bytes_are_paid_for() {
    let config = FetchConfig {
        max_rate_bytes_per_sec: 1_000,
        ..FetchConfig::default()
    };
    let mut b = Broker::new(12);
    b.f = Fetcher::new(config, versions(12), "rate-cap-test-client").unwrap();
    b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    let records = [batch(0, 5, 0), batch(5, 5, 0)].concat();
    let len = records.len() as u64;
    b.respond(
        &h,
        &fetch_response(0, vec![partition(0, 10, Some(records))], false),
    );
    let burst = Duration::from_millis(crate::limits::FETCH_MAX_RATE_BURST_MS);
    let paid = Duration::from_nanos(len * 1_000_000_000 / 1_000);
    let expect = (b.now + paid).checked_sub(burst).filter(|t| *t > b.now);
    match b.f.poll_request(&mut b.out, b.now).unwrap() {
        Poll::NotBefore(t) => assert_eq!(Some(t), expect),
        other => assert!(expect.is_none(), "expected a wait, got {other:?}"),
    }
    b.now += paid;
    let (_, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(0, 10)]);
    assert_eq!(
        b.f.fetch_requests().full,
        2,
        "no session (sessionless response)"
    );
}

// Goal: a flipped byte inside one partition's records fails only that partition (typed error,
// backoff, retry), delivers the valid prefix as a slice of the frame, and leaves other
// partitions untouched.
#[test]
fn corrupt_records_fail_only_their_partition() {
    let mut b = Broker::new(12);
    let s0 = b.add(0, 0, -1);
    let s1 = b.add(1, 0, -1);
    let (h, _) = b.fetch_request();
    let good = batch(0, 2, 0);
    let mut bad = [batch(0, 1, 0), batch(1, 1, 0)].concat();
    let last = bad.len() - 1;
    bad[last - 2] ^= 1;
    let resp = fetch_response(
        0,
        vec![partition(0, 2, Some(bad)), partition(1, 2, Some(good))],
        false,
    );
    let frame = encode_response(&h, &resp);
    let frame_range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
    b.events.clear();
    b.f.handle_response(frame, b.now, &mut b.events).unwrap();
    let kinds: Vec<_> = b.events.iter().map(std::mem::discriminant).collect();
    assert_eq!(kinds.len(), 3, "{:?}", b.events);
    let FetchEvent::Records(prefix) = &b.events[0] else {
        panic!()
    };
    assert_eq!((prefix.slot, prefix.last_offset), (s0, Offset(0)));
    assert!(
        frame_range.contains(&(prefix.records.as_ptr() as usize)),
        "zero copy"
    );
    assert!(
        matches!(b.events[1], FetchEvent::BadRecords { slot, retrying: true, .. } if slot == s0)
    );
    let FetchEvent::Records(other) = &b.events[2] else {
        panic!()
    };
    assert_eq!((other.slot, other.last_offset), (s1, Offset(1)));
    // Partition 0 backs off; partition 1 goes on.
    let (_, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(1, 2)]);
}

#[test]
fn undecodable_response_fails_the_request_not_the_connection() {
    let mut b = Broker::new(12);
    b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    let frame = encode_response(&h, &fetch_response(0, vec![partition(0, 0, None)], false));
    let cut = frame.slice(..frame.len() - 3);
    b.events.clear();
    b.f.handle_response(cut, b.now, &mut b.events).unwrap();
    assert!(matches!(b.events[0], FetchEvent::RequestFailed { .. }));
    assert!(matches!(
        b.f.poll_request(&mut b.out, b.now).unwrap(),
        Poll::NotBefore(_)
    ));
    b.now += Duration::from_secs(1);
    let (_, req) = b.fetch_request();
    assert_eq!((req.session_id, req.session_epoch), (0, 0));
}

#[test]
fn bad_config_is_rejected() {
    let cfg = FetchConfig {
        partition_max_bytes: 0,
        ..FetchConfig::default()
    };
    assert!(matches!(
        Fetcher::new(cfg, versions(12), "t"),
        Err(FetcherError::Config(_))
    ));
}

// Goal: when the batch holding the source's new log start also holds offsets we already have,
// the log restart is still reported at that batch's base (the local log restarts fully, as a
// Kafka follower's does after UnexpectedAppendOffset) instead of failing as an overlap.
#[test]
fn log_start_inside_a_batch_overlapping_local_data() {
    let mut b = Broker::new(12);
    let s = b.add(0, 40, 0);
    let (h, _) = b.fetch_request();
    let oor = partition(0, 100, None).with_error_code(ResponseError::OffsetOutOfRange.code());
    b.respond(&h, &fetch_response(0, vec![oor], false));
    let (h, _) = b.request::<ListOffsetsRequest>(ApiKey::ListOffsets);
    let lo = ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
        .with_name(TopicName(StrBytes::from_static_str("t")))
        .with_partitions(vec![ListOffsetsPartitionResponse::default().with_offset(50)])]);
    b.respond(&h, &lo);
    let (h, _) = b.fetch_request();
    b.respond(
        &h,
        &fetch_response(0, vec![partition(0, 100, Some(batch(35, 21, 0)))], false),
    );
    // Our log ends at 40 and is kept (never emptied because the source lost offsets): a first
    // batch 35..=55 would overlap it, so it is refused and the partition stops, with no gap
    // reported and nothing handed out.
    assert!(
        !b.events
            .iter()
            .any(|e| matches!(e, FetchEvent::LogStartMoved { .. } | FetchEvent::Records(_))),
        "{:?}",
        b.events
    );
    assert!(matches!(
        b.events.last().unwrap(),
        FetchEvent::BadRecords {
            error: RecordsError::Overlap { .. },
            retrying: false,
            ..
        }
    ));
    assert_eq!(b.f.state(s), Some(PartitionState::Failed));
}

// Goal: when a partition without a topic id joins, the fetcher drops to Fetch v12 and opens a
// new session (0, 0) rather than continuing or closing the v13 session with a v12 request.
#[test]
fn version_change_opens_a_new_session() {
    let mut b = Broker::new(13);
    b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    b.respond(&h, &fetch_response(77, vec![], true));
    assert_eq!(b.f.session(), Some((77, 1)));
    b.f.add_partition(PartitionStart {
        tp: TopicPartition::new("u", 0),
        topic_id: Uuid::nil(),
        log_end: Offset(0),
        last_epoch: LeaderEpoch::NONE,
        leader_epoch: LeaderEpoch::NONE,
    })
    .unwrap();
    let (h, req) = b.fetch_request();
    assert_eq!(h.request_api_version, 12);
    assert_eq!((req.session_id, req.session_epoch), (0, 0));
    assert_eq!(sent_partitions(&req).len(), 2);
}

// Goal: the same corrupt bytes on every refetch stop the partition (with a typed error and
// `retrying: false`) after `FETCH_BAD_RECORDS_RETRIES` retries instead of retrying forever,
// while another partition keeps fetching.
#[test]
fn persistent_corruption_stops_the_partition_after_bounded_retries() {
    use crate::limits::FETCH_BAD_RECORDS_RETRIES;
    let mut b = Broker::new(12);
    let s0 = b.add(0, 0, -1);
    let s1 = b.add(1, 0, -1);
    for attempt in 1..=FETCH_BAD_RECORDS_RETRIES + 1 {
        let next1 = i64::from(attempt - 1);
        b.now += Duration::from_secs(60); // past any backoff
        let (h, _) = b.fetch_request();
        let mut bad = batch(0, 1, 0);
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        let resp = fetch_response(
            0,
            vec![
                partition(0, 1, Some(bad)),
                partition(1, next1 + 1, Some(batch(next1, 1, 0))),
            ],
            false,
        );
        b.events.clear();
        b.f.handle_response(encode_response(&h, &resp), b.now, &mut b.events)
            .unwrap();
        let retrying = b.events.iter().find_map(|e| match e {
            FetchEvent::BadRecords { slot, retrying, .. } if *slot == s0 => Some(*retrying),
            _ => None,
        });
        assert_eq!(
            retrying,
            Some(attempt <= FETCH_BAD_RECORDS_RETRIES),
            "attempt {attempt}: {:?}",
            b.events
        );
        assert!(b
            .events
            .iter()
            .any(|e| matches!(e, FetchEvent::Records(r) if r.slot == s1)));
    }
    assert_eq!(b.f.state(s0), Some(PartitionState::Failed));
    assert_eq!(b.f.state(s1), Some(PartitionState::Fetching));
}

// Goal: after an append the disk refused (ENOSPC, rolled back), `rewind` makes the fetcher ask
// for the same offsets again, not before a backoff that grows with each failure in a row, and
// a successful append ends the streak.
#[test]
fn rewind_after_a_full_disk_refetches_with_a_growing_backoff() {
    let mut b = Broker::new(12);
    let s = b.add(0, 10, 0);
    let (h, _) = b.fetch_request();
    b.respond(
        &h,
        &fetch_response(0, vec![partition(0, 20, Some(batch(10, 5, 0)))], false),
    );
    assert_eq!(b.f.fetch_offset(s), Some(Offset(15)));
    let mut waits = Vec::new();
    for _ in 0..3 {
        b.f.rewind(s, Offset(10), LeaderEpoch(0), b.now).unwrap();
        assert_eq!(b.f.fetch_offset(s), Some(Offset(10)));
        let mut out = BytesMut::new();
        let Poll::NotBefore(t) = b.f.poll_request(&mut out, b.now).unwrap() else {
            panic!("a rewound partition must wait before it is fetched again")
        };
        waits.push(t - b.now);
        b.now = t;
        let (h, req) = b.fetch_request();
        assert_eq!(sent_partitions(&req), vec![(0, 10)]);
        b.respond(
            &h,
            &fetch_response(0, vec![partition(0, 20, Some(batch(10, 5, 0)))], false),
        );
    }
    assert!(waits.windows(2).all(|w| w[1] > w[0]), "{waits:?}");
    b.f.appended(s);
    b.f.rewind(s, Offset(10), LeaderEpoch(0), b.now).unwrap();
    let mut out = BytesMut::new();
    let Poll::NotBefore(t) = b.f.poll_request(&mut out, b.now).unwrap() else {
        panic!("expected a backoff")
    };
    assert_eq!(t - b.now, waits[0], "a successful append resets the streak");
}

// Goal: the shard sends its next fetch before the previous response's writes complete, so a
// rewind (a full disk rolled an append back) can come while a request asking for the offsets
// after the rolled-back records is in flight; that request's answer for the partition is
// dropped (appending it would leave a gap), and the partition is fetched again from the rewound
// offset.
#[test]
fn a_rewind_while_a_request_is_in_flight_drops_its_answer_for_the_partition() {
    let mut b = Broker::new(12);
    let s = b.add(0, 10, 0);
    let other = b.add(1, 0, 0);
    let (h, _) = b.fetch_request();
    b.respond(
        &h,
        &fetch_response(0, vec![partition(0, 20, Some(batch(10, 5, 0)))], false),
    );
    assert_eq!(b.f.fetch_offset(s), Some(Offset(15)));
    // The next request goes out (asking for 15) before the append of 10..15 completes...
    let (h, req) = b.fetch_request();
    assert!(sent_partitions(&req).contains(&(0, 15)));
    // ...which then fails on a full disk and is rolled back.
    b.f.rewind(s, Offset(10), LeaderEpoch(0), b.now).unwrap();
    b.respond(
        &h,
        &fetch_response(
            0,
            vec![
                partition(0, 20, Some(batch(15, 5, 0))),
                partition(1, 3, Some(batch(0, 3, 0))),
            ],
            false,
        ),
    );
    assert!(
        !b.events
            .iter()
            .any(|e| matches!(e, FetchEvent::Records(r) if r.slot == s)),
        "records past the rolled-back ones must not be appended: {:?}",
        b.events
    );
    assert!(b
        .events
        .iter()
        .any(|e| matches!(e, FetchEvent::Records(r) if r.slot == other)));
    assert_eq!(b.f.fetch_offset(s), Some(Offset(10)));
    // After its backoff the partition is asked for from 10 again, and that answer counts.
    b.now += std::time::Duration::from_secs(60);
    let (h, req) = b.fetch_request();
    assert!(
        sent_partitions(&req).contains(&(0, 10)),
        "{:?}",
        sent_partitions(&req)
    );
    b.respond(
        &h,
        &fetch_response(0, vec![partition(0, 20, Some(batch(10, 5, 0)))], false),
    );
    assert!(b.events.iter().any(
        |e| matches!(e, FetchEvent::Records(r) if r.slot == s && r.first_offset == Offset(10))
    ));
}

// Goal: inside a session an incremental request carries only partitions whose state changed,
// whatever the fetcher holds: a partition in backoff is forgotten and sent again (from its
// fetch offset) once the backoff ends, with no other event than time passing; a paused one is
// forgotten and sent again on resume; while every changed partition waits, the fetcher names
// the earliest backoff.
#[test]
fn incremental_requests_carry_only_changed_partitions() {
    let mut b = Broker::new(12);
    let slots: Vec<Slot> = (0..64).map(|i| b.add(i, 0, -1)).collect();
    let (h, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req).len(), 64);
    let mut bad = batch(0, 1, 0);
    let last = bad.len() - 1;
    bad[last - 2] ^= 1;
    b.respond(
        &h,
        &fetch_response(
            9,
            vec![
                partition(3, 2, Some(batch(0, 2, 0))),
                partition(7, 1, Some(bad)),
            ],
            false,
        ),
    );
    assert!(b.events.iter().any(
        |e| matches!(e, FetchEvent::BadRecords { slot, retrying: true, .. } if *slot == slots[7])
    ));
    b.f.pause(slots[20]).unwrap();
    let (h, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(3, 2)]);
    let forgotten: Vec<i32> = req
        .forgotten_topics_data
        .iter()
        .flat_map(|t| t.partitions.iter().copied())
        .collect();
    assert_eq!(forgotten, vec![7, 20]);
    b.respond(&h, &FetchResponse::default().with_session_id(9));
    let (h, req) = b.fetch_request();
    assert!(req.topics.is_empty() && req.forgotten_topics_data.is_empty());
    b.respond(&h, &FetchResponse::default().with_session_id(9));
    b.f.resume(slots[20]).unwrap();
    let (h, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(20, 0)]);
    b.respond(&h, &FetchResponse::default().with_session_id(9));
    // Only the backed-off partition is left to change: nothing to send until its backoff ends.
    b.f.pause(slots[3]).unwrap();
    let (h, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![]);
    b.respond(&h, &FetchResponse::default().with_session_id(9));
    b.f.resume(slots[3]).unwrap();
    let (h, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(3, 2)]);
    b.respond(&h, &FetchResponse::default().with_session_id(9));
    b.now += Duration::from_secs(60); // past any backoff
    let (_, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(7, 0)]);
    assert_eq!(b.f.fetch_requests().full, 1);
}

// Goal: without a session, a fetcher whose every partition backs off reports when the first
// backoff ends rather than idling.
#[test]
fn all_partitions_backing_off_report_the_earliest_end() {
    let mut b = Broker::new(6); // before sessions: full fetches
    let s0 = b.add(0, 0, -1);
    let (h, _) = b.fetch_request();
    let mut resp = fetch_response(0, vec![partition(0, 0, None)], false);
    resp.responses[0].partitions[0].error_code = ResponseError::CorruptMessage.code();
    b.respond(&h, &resp);
    assert!(matches!(b.events[0], FetchEvent::PartitionError { slot, .. } if slot == s0));
    let Poll::NotBefore(t) = b.f.poll_request(&mut b.out, b.now).unwrap() else {
        panic!("expected a backoff")
    };
    assert!(t > b.now);
    b.now = t;
    let (_, req) = b.fetch_request();
    assert_eq!(sent_partitions(&req), vec![(0, 0)]);
}
