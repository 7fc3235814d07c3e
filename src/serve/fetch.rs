//! Fetch for consumers: READ_UNCOMMITTED up to the high watermark, READ_COMMITTED up to the
//! last stable offset with the aborted transactions from the segments' `.txnindex` files.
//!
//! Record bytes are never read into memory: the response is encoded by the `kafka-protocol`
//! crate with a placeholder for each partition's records, and the records themselves go out
//! as `sendfile` ranges of the segment (see `splice_records`).
//!
//! Fetch sessions (KIP-227): `serve::fetch_sessions` turns the request into the partitions to
//! read (the request's own for a full fetch, the session's for an incremental one) and, once
//! read, opens the session of a full fetch or trims an incremental response to the partitions
//! that changed. The session cache's mutex is taken twice per request for map work only, never
//! across the long-poll wait or the reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, ProducerId as WireProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::ids::{LeaderEpoch, Offset};
use crate::limits::{SERVE_FETCH_POLL_MS, SERVE_FETCH_RESPONSE_BYTES_MAX, SERVE_FETCH_WAIT_MS_MAX};
use crate::log::read_view::{PartitionReadView, ReadCatalog};
use crate::serve::authz::acl::{Operation, ResourceType};
use crate::serve::dispatch::{encode_body, ApiHandler, Outcome, Part, Request};
use crate::serve::fetch_park;
use crate::serve::fetch_sessions::{
    self, Context, FetchSessions, TopicKey, Wanted, WantedPartition,
};
use crate::serve::metadata::{
    topic_by_id, topics, Topics, TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
};
use crate::serve::segment_reader::{aborted_txns, OpenSegment};
use crate::serve::ServeError;

pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const UNKNOWN_LEADER_EPOCH: i16 = 75;

/// First Fetch version with compact (flexible) encoding.
const FIRST_FLEXIBLE: i16 = 12;
/// First Fetch version that names topics by id.
const FIRST_TOPIC_ID: i16 = 13;
/// First Fetch version with a response-wide max_bytes (KIP-74): from it a first batch the
/// limits cut short is answered with no records instead of the cut bytes.
const FIRST_SOFT_MAX_BYTES: i16 = 3;

pub struct FetchApi {
    pub catalog: Arc<ReadCatalog>,
    /// Shared by every connection: a client's session may be named on any of them.
    pub sessions: Arc<FetchSessions>,
}

/// A stretch of one segment file to send as a partition's records.
#[derive(Debug, Clone)]
struct Read {
    file: Arc<std::fs::File>,
    position: u64,
    length: u64,
}

/// One answer per requested partition, in request order.
struct Plan {
    response: FetchResponse,
    /// For each partition with records, in encoding order: its topic and partition index in
    /// `response` and the range to send.
    reads: Vec<(usize, usize, Read)>,
    bytes: u64,
    has_error: bool,
    /// What each partition got, in `wanted` order (= encoding order), for the session.
    outcomes: Vec<fetch_sessions::Outcome>,
}

impl ApiHandler for FetchApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: FetchRequest = req.decode()?;
        let context = self.sessions.begin(req.version, &request);
        let wanted = match &context {
            Context::Error(code) => return session_error(req, *code),
            Context::Sessionless(w) | Context::Full(w) => w,
            Context::Incremental { wanted, .. } => wanted,
        };
        let wait =
            Duration::from_millis((request.max_wait_ms.max(0) as u64).min(SERVE_FETCH_WAIT_MS_MAX));
        let deadline = Instant::now() + wait;
        let min_bytes = request.min_bytes.max(0) as u64;
        let mut parked: Option<fetch_park::Parked> = None;
        let mut plan = loop {
            let plan = self.plan(req.version, &request, wanted, &|topic: &str| {
                req.authorized(Operation::Read, ResourceType::Topic, topic)
            })?;
            // Long poll: wait for `min_bytes` as Kafka's purgatory does, by re-reading the
            // published views (appends publish a new one) until enough data or the deadline;
            // only with a park slot (`fetch_park`), else answered now.
            if plan.bytes >= min_bytes || plan.has_error || Instant::now() >= deadline {
                break plan;
            }
            if parked.is_none() {
                match fetch_park::try_park() {
                    Some(slot) => parked = Some(slot),
                    None => break plan,
                }
            }
            std::thread::sleep(Duration::from_millis(SERVE_FETCH_POLL_MS));
        };
        drop(parked);
        match &context {
            Context::Full(wanted) => {
                plan.response.session_id =
                    self.sessions
                        .finish_full(req.version, wanted, &plan.outcomes);
            }
            Context::Incremental { id, epoch, .. } => {
                match self
                    .sessions
                    .finish_incremental(*id, *epoch, &plan.outcomes)
                {
                    Ok(keep) => {
                        plan = keep_partitions(plan, &keep);
                        plan.response.session_id = *id;
                    }
                    Err(code) => return session_error(req, code),
                }
            }
            Context::Sessionless(_) | Context::Error(_) => {}
        }
        splice_records(req.version, plan)
    }
}

/// A response with only a session error: no partitions, no session.
fn session_error(req: &Request, code: i16) -> Result<Outcome, ServeError> {
    let mut resp = FetchResponse::default();
    resp.error_code = code;
    Outcome::encode(req, &resp)
}

/// `plan` with only the partitions whose `keep` (in encoding order) is set; topics left with
/// none are dropped. Partitions with records are always kept, so every read survives.
fn keep_partitions(mut plan: Plan, keep: &[bool]) -> Plan {
    let mut flat = 0;
    let mut moved = HashMap::new();
    let mut topics = Vec::new();
    for (ti, mut topic) in std::mem::take(&mut plan.response.responses)
        .into_iter()
        .enumerate()
    {
        let mut parts = Vec::new();
        for (pi, p) in topic.partitions.into_iter().enumerate() {
            if keep.get(flat).copied().unwrap_or(true) {
                moved.insert((ti, pi), (topics.len(), parts.len()));
                parts.push(p);
            }
            flat += 1;
        }
        if !parts.is_empty() {
            topic.partitions = parts;
            topics.push(topic);
        }
    }
    plan.response.responses = topics;
    plan.reads = std::mem::take(&mut plan.reads)
        .into_iter()
        .filter_map(|(t, p, read)| moved.get(&(t, p)).map(|&(t, p)| (t, p, read)))
        .collect();
    plan
}

impl FetchApi {
    /// Reads `wanted` (consecutive partitions of one topic share a response topic), with the
    /// request's byte limits and isolation.
    fn plan(
        &self,
        version: i16,
        request: &FetchRequest,
        wanted: &[Wanted],
        may_read: &dyn Fn(&str) -> bool,
    ) -> Result<Plan, ServeError> {
        let topics = topics(&self.catalog);
        let committed = request.isolation_level == 1;
        let mut budget = (request.max_bytes.max(0) as u64).min(SERVE_FETCH_RESPONSE_BYTES_MAX);
        let mut plan = Plan {
            response: FetchResponse::default(),
            reads: Vec::new(),
            bytes: 0,
            has_error: false,
            outcomes: Vec::with_capacity(wanted.len()),
        };
        for group in wanted.chunk_by(|a, b| a.topic == b.topic) {
            let ti = plan.response.responses.len();
            let mut out = FetchableTopicResponse::default();
            let name = match &group[0].topic {
                TopicKey::Id(id) => {
                    out.topic_id = *id;
                    topic_by_id(&topics, *id).map(str::to_string)
                }
                TopicKey::Name(n) => {
                    out.topic = topic_name(n);
                    Some(n.clone())
                }
            };
            // READ on the topic, per partition as Kafka answers (an unknown topic id stays
            // UNKNOWN_TOPIC_ID: there is no name to authorize).
            let denied = name.as_deref().is_some_and(|n| !may_read(n));
            for (pi, w) in group.iter().enumerate() {
                let p = &w.partition;
                let mut pd = PartitionData::default();
                pd.partition_index = p.partition;
                pd.records = Some(Bytes::new());
                // Null for read_uncommitted, as Kafka sends it.
                pd.aborted_transactions = None;
                if denied {
                    pd.error_code = TOPIC_AUTHORIZATION_FAILED;
                    pd.high_watermark = -1;
                    pd.last_stable_offset = -1;
                    pd.log_start_offset = -1;
                    plan.has_error = true;
                    plan.outcomes.push(outcome(&pd, false, true));
                    out.partitions.push(pd);
                    continue;
                }
                let view = name.as_deref().and_then(|n| find(&topics, n, p.partition));
                let Some(view) = view else {
                    pd.error_code = if version >= FIRST_TOPIC_ID {
                        UNKNOWN_TOPIC_ID
                    } else {
                        UNKNOWN_TOPIC_OR_PARTITION
                    };
                    plan.has_error = true;
                    plan.outcomes.push(outcome(&pd, false, true));
                    out.partitions.push(pd);
                    continue;
                };
                pd.high_watermark = view.high_watermark.0;
                pd.last_stable_offset = view.last_stable_offset.0;
                pd.log_start_offset = view.log_start.0;
                let min_one = plan.reads.is_empty();
                let (records, error) =
                    match read_partition(&view, p, committed, version, budget, min_one)? {
                        Answer::Error(code) => {
                            pd.error_code = code;
                            plan.has_error = true;
                            (false, true)
                        }
                        Answer::Diverging(epoch, end) => {
                            pd.diverging_epoch.epoch = epoch.0;
                            pd.diverging_epoch.end_offset = end.0;
                            plan.has_error = true;
                            (false, true)
                        }
                        Answer::Data { read, aborted } => {
                            if committed {
                                pd.aborted_transactions = Some(aborted);
                            }
                            match read {
                                Some(read) => {
                                    budget = budget.saturating_sub(read.length);
                                    plan.bytes += read.length;
                                    plan.reads.push((ti, pi, read));
                                    (true, false)
                                }
                                None => (false, false),
                            }
                        }
                    };
                plan.outcomes.push(outcome(&pd, records, error));
                out.partitions.push(pd);
            }
            plan.response.responses.push(out);
        }
        Ok(plan)
    }
}

fn outcome(pd: &PartitionData, records: bool, error: bool) -> fetch_sessions::Outcome {
    fetch_sessions::Outcome {
        high_watermark: Offset(pd.high_watermark),
        log_start: Offset(pd.log_start_offset),
        last_stable: Offset(pd.last_stable_offset),
        records,
        error,
    }
}

fn find(topics: &Topics, name: &str, partition: i32) -> Option<Arc<PartitionReadView>> {
    let (_, parts) = topics.get(name)?;
    parts
        .iter()
        .find(|(p, _)| *p == partition)
        .map(|(_, h)| h.view())
}

enum Answer {
    Error(i16),
    Diverging(LeaderEpoch, Offset),
    Data {
        read: Option<Read>,
        aborted: Vec<AbortedTransaction>,
    },
}

fn read_partition(
    view: &PartitionReadView,
    p: &WantedPartition,
    committed: bool,
    version: i16,
    budget: u64,
    min_one: bool,
) -> Result<Answer, ServeError> {
    let ours = view.leader_epoch().0;
    if p.current_leader_epoch >= 0 && p.current_leader_epoch < ours {
        return Ok(Answer::Error(FENCED_LEADER_EPOCH));
    }
    if p.current_leader_epoch > ours {
        return Ok(Answer::Error(UNKNOWN_LEADER_EPOCH));
    }
    let fetch_offset = Offset(p.fetch_offset);
    if fetch_offset < view.log_start || fetch_offset > view.high_watermark {
        return Ok(Answer::Error(OFFSET_OUT_OF_RANGE));
    }
    if version >= FIRST_FLEXIBLE && p.last_fetched_epoch >= 0 {
        // Kafka checks consumers too: a client whose last epoch ended earlier here than it
        // thinks has diverged (KIP-320) and must truncate, not read on.
        let requested = LeaderEpoch(p.last_fetched_epoch);
        let (epoch, end) = view.end_offset_for(requested);
        if epoch < requested || end < fetch_offset {
            return Ok(Answer::Diverging(epoch, end));
        }
    }
    let upper = if committed {
        view.last_stable_offset
    } else {
        view.high_watermark
    };
    let mut aborted = Vec::new();
    if fetch_offset >= upper {
        return Ok(Answer::Data {
            read: None,
            aborted,
        });
    }
    let first = view.segment_for(fetch_offset);
    let mut read = None;
    for seg in &view.segments[first..] {
        if seg.base() >= upper {
            break;
        }
        let open = OpenSegment::open(seg)?;
        let Some(h) = open.translate(fetch_offset)? else {
            continue;
        };
        let start = h.position.0 as u64;
        let end = if upper >= seg.next_offset {
            seg.size
        } else {
            open.position_of(upper)?
        };
        if end <= start {
            break;
        }
        let avail = end - start;
        let mut want = avail.min(p.partition_max_bytes.max(0) as u64).min(budget);
        if min_one && want < h.size as u64 {
            // KIP-74: the first batch of a response is sent whole even past the limits, so a
            // batch larger than max bytes cannot stall the consumer.
            want = (h.size as u64).min(avail);
        } else if want < h.size as u64 && version >= FIRST_SOFT_MAX_BYTES {
            // The limits cut this partition's first batch short: send no records, as Kafka
            // does from Fetch v3, and the client asks again (then first in its response).
            // The cut batch alone would make the Java consumer fail ("no complete records
            // were found"); it is only an answer before v3, where it means the record is
            // too large for the client's limits.
            want = 0;
        }
        if want > 0 {
            read = Some(Read {
                file: Arc::clone(&open.log),
                position: start,
                length: want,
            });
        }
        break;
    }
    if committed {
        // Kafka's collectAbortedTxns: markers at or after the fetch offset for transactions
        // that began below the upper bound, until an entry shows nothing later can matter.
        'segments: for seg in &view.segments[first..] {
            for txn in aborted_txns(seg)? {
                if txn.last_offset >= fetch_offset && txn.first_offset < upper {
                    let mut a = AbortedTransaction::default();
                    a.producer_id = WireProducerId(txn.producer_id.0);
                    a.first_offset = txn.first_offset.0;
                    aborted.push(a);
                }
                if txn.last_stable_offset >= upper {
                    break 'segments;
                }
            }
        }
    }
    Ok(Answer::Data { read, aborted })
}

/// Encodes `plan.response` around file ranges: the response is encoded twice, once with
/// null and once with empty records for the partitions that carry data. The two encodings
/// differ only in those records' length fields (1 byte in flexible versions, 4 before), so
/// comparing them locates each one; the real length then goes there, followed by the file
/// range. This keeps the crate's encoding for everything else and never copies records.
fn splice_records(version: i16, mut plan: Plan) -> Result<Outcome, ServeError> {
    let api = ApiKey::Fetch;
    let set = |resp: &mut FetchResponse, records: Option<Bytes>, reads: &[(usize, usize, Read)]| {
        for (t, p, _) in reads {
            resp.responses[*t].partitions[*p].records = records.clone();
        }
    };
    set(&mut plan.response, None, &plan.reads);
    let with_null = encode_body(api, version, &plan.response)?;
    set(&mut plan.response, Some(Bytes::new()), &plan.reads);
    let with_empty = encode_body(api, version, &plan.response)?;
    let marker = if version >= FIRST_FLEXIBLE { 1 } else { 4 };
    let mismatch = |why: &str| ServeError::Encode {
        api: api as i16,
        version,
        reason: format!("placing records: {why}"),
    };
    if with_null.len() != with_empty.len() {
        return Err(mismatch("encodings differ in length"));
    }
    let mut markers = Vec::with_capacity(plan.reads.len());
    let mut i = 0;
    while i < with_null.len() {
        if with_null[i] != with_empty[i] {
            markers.push(i);
            i += marker;
        } else {
            i += 1;
        }
    }
    if markers.len() != plan.reads.len() {
        return Err(mismatch(
            "placeholder count differs from partitions with data",
        ));
    }
    let mut parts = Vec::with_capacity(2 * markers.len() + 1);
    let mut prev = 0;
    for (at, (_, _, read)) in markers.iter().zip(&plan.reads) {
        let mut head = BytesMut::with_capacity(at - prev + 5);
        head.extend_from_slice(&with_empty[prev..*at]);
        if version >= FIRST_FLEXIBLE {
            put_unsigned_varint(&mut head, read.length + 1);
        } else {
            head.put_i32(read.length as i32);
        }
        parts.push(Part::Bytes(head.freeze()));
        parts.push(Part::File {
            file: Arc::clone(&read.file),
            position: read.position,
            length: read.length,
        });
        prev = at + marker;
    }
    parts.push(Part::Bytes(with_empty.slice(prev..)));
    Ok(Outcome::Reply(parts))
}

fn put_unsigned_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// The topic name type the crate uses (kept here for the tests).
pub fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ProducerId, TimestampMs, TopicPartition};
    use crate::log::config::LogConfig;
    use crate::log::io::StdIo;
    use crate::log::partition_log::PartitionLog;
    use crate::serve::catalog_apis;
    use crate::serve::dispatch::Dispatcher;
    use crate::serve::fetch_sessions::{FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH};
    use crate::wire::batch_builder::{control_batch, BatchBuilder, EndTxnMarker};
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::{Decodable, Encodable};
    use std::os::unix::fs::FileExt;

    fn batch(base: i64, n: usize, epoch: i32) -> Vec<u8> {
        let mut b = BatchBuilder::new(Offset(base)).leader_epoch(LeaderEpoch(epoch));
        for i in 0..n {
            b = b.value(
                TimestampMs(1_000 + base + i as i64),
                format!("v{base}-{i}").as_bytes(),
            );
        }
        b.build()
    }

    /// A log: plain batch, an aborted transaction of producer 7 around another batch, then a
    /// batch of a later epoch. Offsets 0..=12, log end 13.
    fn setup() -> (tempfile::TempDir, Dispatcher, uuid::Uuid, Vec<u8>) {
        let (dir, d, id, all, log) = setup_with_log();
        // Readers need only the published view and the files, not the log itself.
        drop(log);
        (dir, d, id, all)
    }

    fn setup_with_log() -> (
        tempfile::TempDir,
        Dispatcher,
        uuid::Uuid,
        Vec<u8>,
        PartitionLog,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let id = uuid::Uuid::new_v4();
        let tp = TopicPartition::new("t", 0);
        let mut log = PartitionLog::create(
            &dir.path().join("t-0"),
            tp.clone(),
            Some(id),
            LogConfig::default(),
        )
        .unwrap();
        let catalog = ReadCatalog::new();
        catalog.insert(tp, log.attach_read_view());
        let txn = BatchBuilder::new(Offset(5))
            .leader_epoch(LeaderEpoch(0))
            .producer(ProducerId(7), 0, 0)
            .transactional(true)
            .value(TimestampMs(2_000), b"in-txn")
            .value(TimestampMs(2_001), b"in-txn")
            .build();
        let abort = control_batch(
            Offset(10),
            LeaderEpoch(0),
            ProducerId(7),
            0,
            EndTxnMarker::Abort,
            0,
            TimestampMs(2_002),
        );
        for bytes in [batch(0, 5, 0), txn, batch(7, 3, 0), abort, batch(11, 2, 1)] {
            log.append(&mut StdIo, &bytes).unwrap();
        }
        let seg = log.segments()[0].log_path().to_path_buf();
        let all = std::fs::read(seg).unwrap();
        let d = catalog_apis::dispatcher(
            catalog,
            crate::serve::advertised::Advertised::single("127.0.0.1", 9092),
            crate::serve::writes::writer_slot(),
            FetchSessions::new(),
        );
        (dir, d, id, all, log)
    }

    fn fetch(d: &Dispatcher, version: i16, req: &FetchRequest) -> FetchResponse {
        let mut frame = BytesMut::new();
        let mut h = RequestHeader::default();
        h.request_api_key = ApiKey::Fetch as i16;
        h.request_api_version = version;
        h.correlation_id = 42;
        h.encode(&mut frame, ApiKey::Fetch.request_header_version(version))
            .unwrap();
        req.encode(&mut frame, version).unwrap();
        let (_, _, resp) = d.dispatch(frame.freeze()).unwrap();
        assert_eq!(resp.correlation_id, 42);
        let Outcome::Reply(parts) = resp.outcome else {
            panic!("no reply")
        };
        let mut body = Vec::new();
        for p in parts {
            match p {
                Part::Bytes(b) => body.extend_from_slice(&b),
                Part::File {
                    file,
                    position,
                    length,
                } => {
                    let mut buf = vec![0u8; length as usize];
                    file.read_exact_at(&mut buf, position).unwrap();
                    body.extend_from_slice(&buf);
                }
            }
        }
        let mut body = Bytes::from(body);
        let r = FetchResponse::decode(&mut body, version).unwrap();
        assert!(body.is_empty(), "v{version}: bytes left after the response");
        r
    }

    fn request(version: i16, id: uuid::Uuid, offset: i64, isolation: i8) -> FetchRequest {
        let mut p = FetchPartition::default();
        p.partition = 0;
        p.fetch_offset = offset;
        p.partition_max_bytes = 1 << 20;
        let mut t = FetchTopic::default();
        if version >= FIRST_TOPIC_ID {
            t.topic_id = id;
        } else {
            t.topic = topic_name("t");
        }
        t.partitions = vec![p];
        let mut r = FetchRequest::default();
        r.max_wait_ms = 0;
        r.isolation_level = isolation;
        r.topics = vec![t];
        if version >= 7 {
            r.session_epoch = -1;
        }
        r
    }

    // Goal: the records spliced in as file ranges make a response the crate decodes in every
    // served version (non-flexible, flexible, topic ids), carrying exactly the log's bytes,
    // with watermarks; read_committed adds producer 7's aborted transaction from the txnindex.
    #[test]
    fn spliced_fetch_responses_decode_in_every_version() {
        let (_dir, d, id, all) = setup();
        for version in [4, 7, 11, 12, 13, 16, 17] {
            for isolation in [0, 1] {
                let r = fetch(&d, version, &request(version, id, 0, isolation));
                assert_eq!(r.error_code, 0);
                assert_eq!(r.session_id, 0);
                let p = &r.responses[0].partitions[0];
                assert_eq!(p.error_code, 0, "v{version}");
                assert_eq!(p.high_watermark, 13);
                assert_eq!(p.last_stable_offset, 13);
                assert_eq!(p.records.as_deref(), Some(&all[..]), "v{version} records");
                let aborted: Vec<(i64, i64)> = p
                    .aborted_transactions
                    .iter()
                    .flatten()
                    .map(|a| (a.producer_id.0, a.first_offset))
                    .collect();
                if isolation == 1 {
                    assert_eq!(aborted, vec![(7, 5)], "v{version}");
                } else {
                    assert!(p.aborted_transactions.is_none());
                }
            }
        }
    }

    // Goal: a partition whose first batch the response's limits cut short is answered with no
    // records (Kafka's rule from Fetch v3), never with the cut bytes, which stock consumers
    // cannot use (the Java consumer fails: "no complete records were found"), while the first
    // partition with data still gets its first batch whole past the limits (KIP-74). Method:
    // one request names partition 0 twice (sessionless); max_bytes lets the first read take
    // the whole log and leaves half a batch for the second, then a partition_max_bytes of half
    // a batch on the first (whole anyway) and the second (nothing).
    #[test]
    fn a_first_batch_the_limits_cut_short_is_sent_whole_first_and_otherwise_not_at_all() {
        let (_dir, d, id, all) = setup();
        let first = batch(0, 5, 0).len();
        for version in [4, 7, 12, 13, 17] {
            let mut r = request(version, id, 0, 0);
            let again = r.topics[0].partitions[0].clone();
            r.topics[0].partitions.push(again);
            r.max_bytes = i32::try_from(all.len() + first / 2).unwrap();
            let resp = fetch(&d, version, &r);
            let parts = &resp.responses[0].partitions;
            assert_eq!(parts.len(), 2, "v{version}");
            assert_eq!(parts[0].records.as_deref(), Some(&all[..]), "v{version}");
            assert_eq!(parts[1].error_code, 0);
            assert_eq!(parts[1].high_watermark, 13);
            assert_eq!(
                parts[1].records.as_deref(),
                Some(&[][..]),
                "v{version}: a cut first batch is sent as no records"
            );

            let mut r = request(version, id, 0, 0);
            r.topics[0].partitions[0].partition_max_bytes = i32::try_from(first / 2).unwrap();
            let again = r.topics[0].partitions[0].clone();
            r.topics[0].partitions.push(again);
            let resp = fetch(&d, version, &r);
            let parts = &resp.responses[0].partitions;
            assert_eq!(
                parts[0].records.as_deref(),
                Some(&all[..first]),
                "v{version}: the response's first batch goes out whole"
            );
            assert_eq!(parts[1].records.as_deref(), Some(&[][..]), "v{version}");
        }
    }

    // Goal: parked long polls never hold more than SERVE_FETCH_PARKED_MAX handler threads:
    // with that many fetches waiting at the log end, one more is answered at once (empty,
    // no error) while every one of them still waits; and their slots come back when they end.
    #[test]
    fn long_polls_past_the_park_bound_are_answered_at_once() {
        use crate::limits::SERVE_FETCH_PARKED_MAX;
        let (_dir, d, id, _) = setup();
        let d = Arc::new(d);
        let mut waiting = request(12, id, 13, 0);
        waiting.max_wait_ms = 5_000;
        waiting.min_bytes = 1;
        let parked: Vec<_> = (0..SERVE_FETCH_PARKED_MAX)
            .map(|_| {
                let (d, r) = (Arc::clone(&d), waiting.clone());
                std::thread::spawn(move || fetch(&d, 12, &r))
            })
            .collect();
        let start = Instant::now();
        while fetch_park::parked() < SERVE_FETCH_PARKED_MAX {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "only {} fetches parked",
                fetch_park::parked()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let extra = fetch(&d, 12, &waiting);
        assert!(
            parked.iter().all(|h| !h.is_finished()),
            "the extra fetch was answered only after a parked one"
        );
        let p = &extra.responses[0].partitions[0];
        assert_eq!((p.error_code, p.records.as_deref()), (0, Some(&[][..])));
        for h in parked {
            let r = h.join().unwrap();
            assert_eq!(r.responses[0].partitions[0].error_code, 0);
        }
        assert!(fetch_park::try_park().is_some(), "slots given back");
    }

    // Goal: fetch errors clients rely on: past the end → OFFSET_OUT_OF_RANGE, at the end →
    // empty records, a session id → FETCH_SESSION_ID_NOT_FOUND, an old leader epoch →
    // FENCED_LEADER_EPOCH, an unknown topic id → UNKNOWN_TOPIC_ID, and a client that fetched
    // epoch 0 up to offset 12 learns that epoch 0 ended at 11 here (diverging epoch, no data).
    #[test]
    fn fetch_errors() {
        let (_dir, d, id, _) = setup();
        let p0 = |r: &FetchResponse| r.responses[0].partitions[0].clone();
        assert_eq!(
            p0(&fetch(&d, 12, &request(12, id, 14, 0))).error_code,
            OFFSET_OUT_OF_RANGE
        );
        let at_end = p0(&fetch(&d, 12, &request(12, id, 13, 0)));
        assert_eq!(
            (at_end.error_code, at_end.records.as_deref()),
            (0, Some(&[][..]))
        );
        let mut with_session = request(12, id, 0, 0);
        with_session.session_id = 99;
        with_session.session_epoch = 1;
        assert_eq!(
            fetch(&d, 12, &with_session).error_code,
            FETCH_SESSION_ID_NOT_FOUND
        );
        let mut fenced = request(12, id, 0, 0);
        fenced.topics[0].partitions[0].current_leader_epoch = 0;
        assert_eq!(p0(&fetch(&d, 12, &fenced)).error_code, FENCED_LEADER_EPOCH);
        let r = fetch(&d, 13, &request(13, uuid::Uuid::new_v4(), 0, 0));
        assert_eq!(p0(&r).error_code, UNKNOWN_TOPIC_ID);
        let mut diverged = request(12, id, 12, 0);
        diverged.topics[0].partitions[0].last_fetched_epoch = 0;
        let p = p0(&fetch(&d, 12, &diverged));
        assert_eq!(
            (p.diverging_epoch.epoch, p.diverging_epoch.end_offset),
            (0, 11)
        );
        assert!(p.records.as_deref().unwrap_or_default().is_empty());
    }

    fn session_request(
        id: uuid::Uuid,
        session: i32,
        epoch: i32,
        parts: &[(i32, i64)],
    ) -> FetchRequest {
        let mut r = request(12, id, 0, 0);
        r.session_id = session;
        r.session_epoch = epoch;
        r.topics[0].partitions = parts
            .iter()
            .map(|&(p, offset)| {
                let mut fp = FetchPartition::default();
                fp.partition = p;
                fp.fetch_offset = offset;
                fp.partition_max_bytes = 1 << 20;
                fp
            })
            .collect();
        if parts.is_empty() {
            r.topics.clear();
        }
        r
    }

    fn partitions(r: &FetchResponse) -> Vec<(i32, i64, usize)> {
        r.responses
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| {
                let len = p.records.as_ref().map_or(0, |b| b.len());
                (p.partition_index, p.high_watermark, len)
            })
            .collect()
    }

    // Goal: Fetch through the dispatcher follows KIP-227: a full fetch with epoch 0 opens a
    // session (non-zero id) and answers every partition; an incremental fetch with nothing new
    // answers no partition; after an append, the partition comes back with its records and
    // new high watermark; a replayed epoch gets INVALID_FETCH_SESSION_EPOCH; epoch -1 closes
    // the session (answered in full, id 0), after which the id is unknown.
    #[test]
    fn fetch_sessions_through_the_handler() {
        let (_dir, d, id, all, mut log) = setup_with_log();
        let full = fetch(&d, 12, &session_request(id, 0, 0, &[(0, 0)]));
        assert_eq!(full.error_code, 0);
        let session = full.session_id;
        assert_ne!(session, 0, "a full fetch with epoch 0 opens a session");
        assert_eq!(partitions(&full), vec![(0, 13, all.len())]);

        let idle = fetch(&d, 12, &session_request(id, session, 1, &[(0, 13)]));
        assert_eq!((idle.error_code, idle.session_id), (0, session));
        assert_eq!(partitions(&idle), vec![], "nothing changed: no partition");
        let idle = fetch(&d, 12, &session_request(id, session, 2, &[]));
        assert_eq!(partitions(&idle), vec![]);

        let more = batch(13, 4, 1);
        log.append(&mut StdIo, &more).unwrap();
        let new = fetch(&d, 12, &session_request(id, session, 3, &[]));
        assert_eq!((new.error_code, new.session_id), (0, session));
        assert_eq!(
            partitions(&new),
            vec![(0, 17, more.len())],
            "the cached fetch offset 13 reads the new batch"
        );
        assert_eq!(
            new.responses[0].partitions[0].records.as_deref(),
            Some(&more[..])
        );

        let replay = fetch(&d, 12, &session_request(id, session, 3, &[]));
        assert_eq!(replay.error_code, INVALID_FETCH_SESSION_EPOCH);
        assert_eq!(partitions(&replay), vec![]);

        let closing = fetch(&d, 12, &session_request(id, session, -1, &[(0, 13)]));
        assert_eq!((closing.error_code, closing.session_id), (0, 0));
        assert_eq!(partitions(&closing), vec![(0, 17, more.len())]);
        let gone = fetch(&d, 12, &session_request(id, session, 4, &[]));
        assert_eq!(gone.error_code, FETCH_SESSION_ID_NOT_FOUND);
    }
}
