//! Hostile source answers, generated with their structure: record batches whose CRC is right
//! (so validation reaches the header checks) but whose offsets, counts and epochs are
//! adversarial, inside Fetch responses whose own headers are adversarial too (watermarks,
//! error codes, diverging epochs, aborted-transaction lists, record lengths). Each property
//! compares the verdict of kmirror's validator with an oracle written here from the rules
//! (kafka-formats.md §1.1, §6.3), in 128-bit arithmetic so it cannot share an overflow with the
//! code under test. Random bytes would almost never get past the CRC.
//!
//! `write_seed_corpus` (ignored; run it by name) writes examples of these generators into
//! `fuzz/corpus/`, which `tests/fuzz_corpus.rs` replays on every run.

use std::path::Path;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, EpochEndOffset, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{FetchResponse, ProducerId as WireProducerId, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kmirror::fetch::fetcher::FetchEvent;
use kmirror::fetch::response::{check_records, Position, RecordsError};
use kmirror::fuzz_entry::{self, TOPIC, TOPIC_ID};
use kmirror::ids::{LeaderEpoch, Offset, TimestampMs, TopicPartition};
use kmirror::limits::OFFSET_MAX;
use kmirror::log::config::LogConfig;
use kmirror::log::io::StdIo;
use kmirror::log::partition_log::PartitionLog;
use kmirror::log::recovery::LoadOptions;
use kmirror::wire::batch::BatchError;
use kmirror::wire::batch_builder::{reseal_crc, BatchBuilder};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

// Header positions of a v2 batch (kafka-formats.md §1.1), written out here on purpose.
const AT_ATTRIBUTES: usize = 21;
const AT_LAST_OFFSET_DELTA: usize = 23;
const AT_RECORDS_COUNT: usize = 57;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// Where a batch's base offset comes from.
#[derive(Debug, Clone)]
enum Base {
    /// Right after the previous batch (or at the fetch offset for the first).
    Follow,
    /// A few offsets after it (compaction leaves such gaps).
    Gap(i64),
    /// Anywhere, with weight on the edges of the offset range.
    Absolute(i64),
}

#[derive(Debug, Clone)]
struct BatchSpec {
    base: Base,
    records: u8,
    /// Overrides lastOffsetDelta (otherwise records − 1).
    delta: Option<i32>,
    /// Overrides recordsCount (otherwise records).
    count: Option<i32>,
    epoch: i32,
    /// Attributes: control and transactional bits set as given.
    control: bool,
    transactional: bool,
    /// Flip one CRC-covered byte after sealing.
    bad_crc: bool,
}

fn edge_offset() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 0i64..1_000,
        3 => (OFFSET_MAX - 8)..=i64::MAX,
        1 => Just(i64::MIN),
        1 => -4i64..0,
        1 => any::<i64>(),
    ]
}

fn edge_i32() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(i32::MAX),
        Just(i32::MIN),
        Just(-1),
        0i32..8,
        (i32::MAX - 4)..=i32::MAX,
        any::<i32>(),
    ]
}

fn batch_spec() -> impl Strategy<Value = BatchSpec> {
    (
        prop_oneof![5 => Just(Base::Follow), 2 => (1i64..5).prop_map(Base::Gap), 3 => edge_offset().prop_map(Base::Absolute)],
        1u8..4,
        prop_oneof![6 => Just(None), 2 => edge_i32().prop_map(Some)],
        prop_oneof![6 => Just(None), 2 => edge_i32().prop_map(Some)],
        prop_oneof![4 => 3i32..6, 1 => 0i32..3, 1 => edge_i32()],
        prop_oneof![9 => Just(false), 1 => Just(true)],
        prop_oneof![3 => Just(false), 1 => Just(true)],
        prop_oneof![9 => Just(false), 1 => Just(true)],
    )
        .prop_map(
            |(base, records, delta, count, epoch, control, transactional, bad_crc)| BatchSpec {
                base,
                records,
                delta,
                count,
                epoch,
                control,
                transactional,
                bad_crc,
            },
        )
}

/// The header values a spec produces, in wide arithmetic.
#[derive(Debug, Clone, Copy)]
struct Header {
    base: i64,
    delta: i32,
    count: i32,
}

/// Builds the batches: valid CRC unless `bad_crc`, the header as the spec says. Bases follow
/// the previous batch's last offset as the oracle computes it (saturated into i64).
fn build(specs: &[BatchSpec], start: i64) -> (Vec<u8>, Vec<Header>) {
    let mut blob = Vec::new();
    let mut headers = Vec::new();
    let mut next = i128::from(start);
    for s in specs {
        let wide = match s.base {
            Base::Follow => next,
            Base::Gap(g) => next + i128::from(g),
            Base::Absolute(b) => i128::from(b),
        };
        let base = wide.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        let mut b = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(s.epoch));
        for i in 0..s.records {
            b = b.value(TimestampMs(1_700_000_000_000 + i64::from(i)), &[i; 5]);
        }
        let mut bytes = b.build();
        let delta = s.delta.unwrap_or(i32::from(s.records) - 1);
        let count = s.count.unwrap_or(i32::from(s.records));
        bytes[AT_LAST_OFFSET_DELTA..AT_LAST_OFFSET_DELTA + 4].copy_from_slice(&delta.to_be_bytes());
        bytes[AT_RECORDS_COUNT..AT_RECORDS_COUNT + 4].copy_from_slice(&count.to_be_bytes());
        let mut attributes = 0i16;
        if s.control {
            attributes |= ATTR_CONTROL;
        }
        if s.transactional {
            attributes |= ATTR_TRANSACTIONAL;
        }
        bytes[AT_ATTRIBUTES..AT_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
        reseal_crc(&mut bytes);
        if s.bad_crc {
            *bytes.last_mut().expect("non-empty") ^= 0x01;
        }
        next = i128::from(base) + i128::from(delta) + 1;
        blob.extend_from_slice(&bytes);
        headers.push(Header { base, delta, count });
    }
    (blob, headers)
}

/// The oracle's verdict on a records blob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Overflow,
    NegativeOffset,
    Crc,
    NegativeDelta,
    BadCount,
    BadControl,
    Overlap,
    EpochRegression,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    /// (first offset, last offset, batches) of the accepted range.
    valid: Option<(i64, i64, u32)>,
    error: Option<Kind>,
}

impl Kind {
    /// What kmirror's fetcher must do: refetch (a fault that may heal) or stop.
    fn refetched(&self) -> bool {
        matches!(
            self,
            Kind::NegativeOffset
                | Kind::Crc
                | Kind::NegativeDelta
                | Kind::BadCount
                | Kind::BadControl
        )
    }
}

fn oracle(specs: &[BatchSpec], headers: &[Header], pos: Position) -> Verdict {
    let mut expected_from = i128::from(pos.log_end.0);
    let mut epoch = pos.last_epoch.0;
    let mut valid: Option<(i64, i64, u32)> = None;
    let mut error = None;
    for (s, h) in specs.iter().zip(headers) {
        let last = i128::from(h.base) + i128::from(h.delta);
        if last > i128::from(OFFSET_MAX) || last < i128::from(i64::MIN) {
            error = Some(Kind::Overflow);
            break;
        }
        if valid.is_none() && last < i128::from(pos.fetch_offset.0) {
            continue;
        }
        let found = if h.base < 0 {
            Some(Kind::NegativeOffset)
        } else if s.bad_crc {
            Some(Kind::Crc)
        } else if h.delta < 0 {
            Some(Kind::NegativeDelta)
        } else if h.count < 0 || i64::from(h.count) > i64::from(h.delta) + 1 {
            Some(Kind::BadCount)
        } else if s.control && (!s.transactional || h.count != 1) {
            Some(Kind::BadControl)
        } else if i128::from(h.base) < expected_from {
            Some(Kind::Overlap)
        } else if s.epoch >= 0 && epoch >= 0 && s.epoch < epoch {
            Some(Kind::EpochRegression)
        } else {
            None
        };
        if found.is_some() {
            error = found;
            break;
        }
        if s.epoch >= 0 {
            epoch = s.epoch;
        }
        expected_from = last + 1;
        valid = Some(match valid {
            None => (h.base, last as i64, 1),
            Some((first, _, n)) => (first, last as i64, n + 1),
        });
    }
    Verdict { valid, error }
}

fn kind_of(e: &RecordsError) -> Kind {
    match e {
        RecordsError::Batch(BatchError::OffsetOverflow { .. }) => Kind::Overflow,
        RecordsError::Batch(BatchError::NegativeOffset { .. }) => Kind::NegativeOffset,
        RecordsError::Batch(BatchError::CrcMismatch { .. }) => Kind::Crc,
        RecordsError::Batch(BatchError::NegativeLastOffsetDelta { .. }) => Kind::NegativeDelta,
        RecordsError::Batch(BatchError::BadRecordCount { .. }) => Kind::BadCount,
        RecordsError::Batch(BatchError::BadControlBatch { .. }) => Kind::BadControl,
        RecordsError::Overlap { .. } => Kind::Overlap,
        RecordsError::EpochRegression { .. } => Kind::EpochRegression,
        other => panic!("a built batch cannot fail with {other:?}"),
    }
}

fn position() -> impl Strategy<Value = Position> {
    (
        prop_oneof![4 => 0i64..8, 2 => (OFFSET_MAX - 6)..=OFFSET_MAX, 1 => any::<i64>().prop_map(|o| o & i64::MAX)],
        0i64..3,
        prop_oneof![3 => 3i32..5, 1 => Just(-1), 1 => edge_i32()],
    )
        .prop_map(|(fetch, back, epoch)| Position {
            fetch_offset: Offset(fetch),
            log_end: Offset(fetch.saturating_sub(back)),
            last_epoch: LeaderEpoch(epoch),
        })
}

fn specs() -> impl Strategy<Value = Vec<BatchSpec>> {
    proptest::collection::vec(batch_spec(), 1..6)
}

/// A partition of a generated response: adversarial header fields around generated batches.
#[derive(Debug, Clone)]
struct PartSpec {
    error_code: i16,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    diverging: Option<(i32, i64)>,
    aborted: Option<Vec<(i64, i64)>>,
    preferred_read_replica: i32,
    batches: Vec<BatchSpec>,
}

fn part_spec() -> impl Strategy<Value = PartSpec> {
    (
        prop_oneof![8 => Just(0i16), 1 => Just(1i16), 1 => Just(6i16), 1 => Just(3i16), 1 => any::<i16>()],
        (edge_offset(), edge_offset(), edge_offset()),
        prop_oneof![6 => Just(None), 1 => (edge_i32(), edge_offset()).prop_map(Some)],
        proptest::option::of(proptest::collection::vec((any::<i64>(), edge_offset()), 0..4)),
        prop_oneof![Just(-1), edge_i32()],
        specs(),
    )
        .prop_map(
            |(error_code, (hw, lso, start), diverging, aborted, replica, batches)| PartSpec {
                error_code,
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: start,
                diverging,
                aborted,
                preferred_read_replica: replica,
                batches,
            },
        )
}

#[derive(Debug, Clone)]
struct ResponseSpec {
    version: i16,
    top_error: i16,
    session_id: i32,
    throttle_ms: i32,
    log_end: i64,
    parts: [PartSpec; 2],
}

fn response_spec() -> impl Strategy<Value = ResponseSpec> {
    (
        4i16..=17,
        prop_oneof![9 => Just(0i16), 1 => any::<i16>()],
        edge_i32(),
        edge_i32(),
        prop_oneof![3 => 0i64..8, 1 => (OFFSET_MAX - 6)..=OFFSET_MAX],
        part_spec(),
        part_spec(),
    )
        .prop_map(
            |(version, top_error, session_id, throttle_ms, log_end, p0, p1)| ResponseSpec {
                version,
                top_error,
                session_id,
                throttle_ms,
                log_end,
                parts: [p0, p1],
            },
        )
}

/// Partition `i`'s position as the harness holds it.
fn harness_position(spec: &ResponseSpec, i: usize) -> Position {
    let end = if i == 0 { spec.log_end } else { 0 };
    Position {
        fetch_offset: Offset(end),
        log_end: Offset(end),
        last_epoch: fuzz_entry::harness_last_epoch(spec.version),
    }
}

/// One partition's records blob and the headers its batches carry.
type Built = (Vec<u8>, Vec<Header>);

/// The encoded response body, and each partition's records blob with its headers.
fn encode(spec: &ResponseSpec) -> (Vec<u8>, Vec<Built>) {
    let mut built = Vec::new();
    let mut parts = Vec::new();
    for (i, p) in spec.parts.iter().enumerate() {
        let (blob, headers) = build(&p.batches, harness_position(spec, i).fetch_offset.0);
        let mut pd = PartitionData::default()
            .with_partition_index(i as i32)
            .with_error_code(p.error_code)
            .with_high_watermark(p.high_watermark)
            .with_last_stable_offset(p.last_stable_offset)
            .with_aborted_transactions(p.aborted.as_ref().map(|list| {
                list.iter()
                    .map(|(pid, first)| {
                        AbortedTransaction::default()
                            .with_producer_id(WireProducerId(*pid))
                            .with_first_offset(*first)
                    })
                    .collect()
            }))
            .with_records(Some(Bytes::from(blob.clone())));
        // Fields a version does not carry are left at their defaults (the encoder refuses them).
        if spec.version >= 5 {
            pd = pd.with_log_start_offset(p.log_start_offset);
        }
        if spec.version >= 11 {
            pd = pd.with_preferred_read_replica(kafka_protocol::messages::BrokerId(
                p.preferred_read_replica,
            ));
        }
        if let Some((epoch, end)) = p.diverging.filter(|_| spec.version >= 12) {
            pd = pd.with_diverging_epoch(
                EpochEndOffset::default()
                    .with_epoch(epoch)
                    .with_end_offset(end),
            );
        }
        parts.push(pd);
        built.push((blob, headers));
    }
    let mut topic = FetchableTopicResponse::default().with_partitions(parts);
    if spec.version >= 13 {
        topic.topic_id = TOPIC_ID;
    } else {
        topic.topic = TopicName(StrBytes::from_static_str(TOPIC));
    }
    let mut resp = FetchResponse::default()
        .with_throttle_time_ms(spec.throttle_ms)
        .with_responses(vec![topic]);
    if spec.version >= 7 {
        resp = resp
            .with_error_code(spec.top_error)
            .with_session_id(spec.session_id);
    }
    let mut out = BytesMut::new();
    resp.encode(&mut out, spec.version).expect("encodes");
    (out.to_vec(), built)
}

/// What the fetcher must report for partition `i` of a response that decoded.
fn check_partition_events(
    spec: &ResponseSpec,
    i: usize,
    built: &Built,
    events: &[FetchEvent],
    slot: kmirror::fetch::fetcher::Slot,
) -> Result<(), TestCaseError> {
    let p = &spec.parts[i];
    let mine: Vec<&FetchEvent> = events
        .iter()
        .filter(|e| event_slot(e) == Some(slot))
        .collect();
    let records = mine.iter().find_map(|e| match e {
        FetchEvent::Records(r) => Some(r),
        _ => None,
    });
    let diverging = spec.version >= 12
        && p.diverging
            .is_some_and(|(epoch, end)| epoch >= 0 || end >= 0);
    if p.error_code != 0 || diverging {
        prop_assert!(
            records.is_none(),
            "records handed out despite error or divergence: {:?}",
            mine
        );
        if p.error_code == 0 {
            prop_assert!(mine.iter().any(|e| matches!(e, FetchEvent::Diverged(_))));
        }
        return Ok(());
    }
    let verdict = oracle(&p.batches, &built.1, harness_position(spec, i));
    match verdict.valid {
        Some((first, last, n)) => {
            let r = records.ok_or_else(|| {
                TestCaseError::fail(format!("oracle {verdict:?}, events {mine:?}"))
            })?;
            prop_assert_eq!(
                (r.first_offset.0, r.last_offset.0, r.batches),
                (first, last, n)
            );
        }
        None => prop_assert!(records.is_none(), "oracle {:?}, events {:?}", verdict, mine),
    }
    let bad = mine.iter().find_map(|e| match e {
        FetchEvent::BadRecords {
            error, retrying, ..
        } => Some((kind_of(error), *retrying)),
        _ => None,
    });
    match verdict.error {
        Some(kind) => prop_assert_eq!(bad, Some((kind.clone(), kind.refetched()))),
        None => prop_assert_eq!(bad, None),
    }
    Ok(())
}

fn event_slot(e: &FetchEvent) -> Option<kmirror::fetch::fetcher::Slot> {
    match e {
        FetchEvent::Records(r) => Some(r.slot),
        FetchEvent::Watermarks { slot, .. }
        | FetchEvent::RefreshMetadata { slot, .. }
        | FetchEvent::LogStartMoved { slot, .. }
        | FetchEvent::BadRecords { slot, .. }
        | FetchEvent::PartitionError { slot, .. } => Some(*slot),
        FetchEvent::Diverged(d) => Some(d.slot),
        FetchEvent::RequestFailed { .. } => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    // Goal: the validator accepts exactly the prefix the rules allow and names the first
    // violation, for batches whose CRC holds and whose headers are hostile; nothing panics.
    #[test]
    fn validator_verdict_matches_the_oracle(specs in specs(), pos in position()) {
        let (blob, headers) = build(&specs, pos.fetch_offset.0);
        let checked = check_records(&blob, pos);
        let verdict = oracle(&specs, &headers, pos);
        let got = Verdict {
            valid: checked.valid.as_ref().map(|v| (v.first_offset.0, v.last_offset.0, v.batches)),
            error: checked.error.as_ref().map(kind_of),
        };
        prop_assert_eq!(got, verdict);
        // The fuzz target's invariants hold on the same input.
        let mut input = Vec::new();
        input.extend_from_slice(&pos.fetch_offset.0.to_be_bytes());
        input.extend_from_slice(&pos.log_end.0.to_be_bytes());
        input.extend_from_slice(&pos.last_epoch.0.to_be_bytes());
        input.extend_from_slice(&blob);
        fuzz_entry::batch_validation(&input);
    }

    // Goal: a whole Fetch response with adversarial headers gets, per partition, the verdict
    // the oracle gives its batches (records handed out, refetch or stop), or the error or
    // divergence its header says; a top-level error fails the request.
    #[test]
    fn fetch_response_verdict_matches_the_oracle(spec in response_spec()) {
        let (body, built) = encode(&spec);
        let (events, slots) = fuzz_entry::fetch_response_events(spec.version, Offset(spec.log_end), &body)
            .expect("a well-formed response does not poison the connection");
        if spec.top_error != 0 && spec.version >= 7 {
            prop_assert!(events.len() == 1 && matches!(events[0], FetchEvent::RequestFailed { .. }), "{:?}", events);
            return Ok(());
        }
        for i in 0..2 {
            check_partition_events(&spec, i, &built[i], &events, slots[i])?;
        }
    }

    // Goal: a response whose records length (or any other 4 bytes) is replaced by a hostile
    // value is refused as a whole or read consistently: never records outside a batch.
    #[test]
    fn hostile_lengths_in_a_response_fail_the_request(
        spec in response_spec(),
        value in prop_oneof![Just(i32::MIN), Just(-2i32), Just(-1), Just(i32::MAX), Just(0x7fff_fff0), Just(0)],
        at in any::<prop::sample::Index>(),
        target_records in any::<bool>(),
    ) {
        let (mut body, built) = encode(&spec);
        let blob = &built[0].0;
        let records_at = (spec.version < 12 && target_records && !blob.is_empty())
            .then(|| body.windows(blob.len()).position(|w| w == blob.as_slice()))
            .flatten()
            .filter(|p| *p >= 4);
        let patch = records_at.map_or_else(|| at.index(body.len().saturating_sub(3).max(1)), |p| p - 4);
        if body.len() >= patch + 4 {
            body[patch..patch + 4].copy_from_slice(&value.to_be_bytes());
        }
        let events = fuzz_entry::fetch_response_events(spec.version, Offset(spec.log_end), &body);
        let impossible = value < -1 || value as i64 > (body.len() - records_at.unwrap_or(0)) as i64;
        if records_at.is_some() && impossible {
            // A records length below -1 or past the end of the body: the response cannot be
            // decoded, so the request fails as a whole (retried with a full fetch) and the
            // connection stays usable.
            let (events, _) = events.expect("an undecodable body does not poison the connection");
            prop_assert!(
                events.len() == 1 && matches!(events[0], FetchEvent::RequestFailed { .. }),
                "{:?}", events
            );
        }
    }

    // Goal: whatever the validator accepts can be appended: the log end is exactly one past the
    // last accepted offset (never wrapped, also at OFFSET_MAX), before and after a reopen.
    #[test]
    fn accepted_ranges_append_without_wrapping(specs in specs(), pos in position()) {
        let (blob, _) = build(&specs, pos.fetch_offset.0);
        let pos = Position { log_end: Offset::ZERO, ..pos };
        let checked = check_records(&blob, pos);
        let Some(v) = checked.valid else { return Ok(()); };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        let tp = TopicPartition::new("t", 0);
        let mut log = PartitionLog::create(&dir, tp.clone(), None, LogConfig::default()).unwrap();
        log.append(&mut StdIo, &blob[v.bytes.clone()]).unwrap();
        prop_assert_eq!(log.log_end_offset(), v.last_offset.next());
        log.close(&mut StdIo).unwrap();
        let clean = LoadOptions { clean_shutdown: true, ..LoadOptions::unclean() };
        for load in [clean, LoadOptions::unclean()] {
            let log = PartitionLog::open(&dir, tp.clone(), None, LogConfig::default(), load, &mut StdIo).unwrap();
            prop_assert_eq!(log.log_end_offset(), v.last_offset.next());
            log.close(&mut StdIo).unwrap();
        }
    }
}

/// Writes generated inputs for each fuzz target into `fuzz/corpus/<target>/` (fixed seed, so
/// rerunning rewrites the same files). Run: `cargo test --test hostile_source -- --ignored`.
#[test]
#[ignore = "writes the checked-in seed corpus; run by hand"]
fn write_seed_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let dir = root.join("batch_validation");
    std::fs::create_dir_all(&dir).unwrap();
    let strategy = (specs(), position());
    for i in 0..16 {
        let (specs, pos) = strategy.new_tree(&mut runner).unwrap().current();
        let (blob, _) = build(&specs, pos.fetch_offset.0);
        let mut input = Vec::new();
        input.extend_from_slice(&pos.fetch_offset.0.to_be_bytes());
        input.extend_from_slice(&pos.log_end.0.to_be_bytes());
        input.extend_from_slice(&pos.last_epoch.0.to_be_bytes());
        input.extend_from_slice(&blob);
        std::fs::write(dir.join(format!("gen-{i:02}")), input).unwrap();
    }
    let dir = root.join("fetch_response");
    std::fs::create_dir_all(&dir).unwrap();
    let strategy = response_spec();
    for i in 0..16 {
        let spec = strategy.new_tree(&mut runner).unwrap().current();
        let (body, _) = encode(&spec);
        let mut input = vec![(spec.version - 4) as u8];
        input.extend_from_slice(&spec.log_end.to_be_bytes());
        input.extend_from_slice(&body);
        std::fs::write(dir.join(format!("gen-{i:02}")), input).unwrap();
    }
}
