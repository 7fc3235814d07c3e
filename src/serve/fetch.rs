//! Fetch for consumers: READ_UNCOMMITTED up to the high watermark, READ_COMMITTED up to the
//! last stable offset with the aborted transactions from the segments' `.txnindex` files.
//!
//! Record bytes are never read into memory: the response is encoded by the `kafka-protocol`
//! crate with a placeholder for each partition's records, and the records themselves go out
//! as `sendfile` ranges of the segment (see `splice_records`).
//!
//! Fetch sessions (KIP-227): kmirror creates none, like a broker whose session cache has no
//! slots. A full fetch asking for a session gets session id 0, which tells the client to keep
//! sending full fetches; a request naming a session id gets FETCH_SESSION_ID_NOT_FOUND, which
//! clients answer with a new full fetch.

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
use crate::serve::dispatch::{encode_body, ApiHandler, Outcome, Part, Request};
use crate::serve::metadata::{
    topic_by_id, topics, Topics, UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION,
};
use crate::serve::segment_reader::{aborted_txns, OpenSegment};
use crate::serve::ServeError;

pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const UNKNOWN_LEADER_EPOCH: i16 = 75;

/// First Fetch version with compact (flexible) encoding.
const FIRST_FLEXIBLE: i16 = 12;
/// First Fetch version that names topics by id.
const FIRST_TOPIC_ID: i16 = 13;

pub struct FetchApi {
    pub catalog: Arc<ReadCatalog>,
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
}

impl ApiHandler for FetchApi {
    fn handle(&self, req: &Request) -> Result<Outcome, ServeError> {
        let request: FetchRequest = req.decode()?;
        if request.session_id != 0 {
            let mut resp = FetchResponse::default();
            resp.error_code = FETCH_SESSION_ID_NOT_FOUND;
            return Outcome::encode(req, &resp);
        }
        let wait =
            Duration::from_millis((request.max_wait_ms.max(0) as u64).min(SERVE_FETCH_WAIT_MS_MAX));
        let deadline = Instant::now() + wait;
        let min_bytes = request.min_bytes.max(0) as u64;
        loop {
            let plan = self.plan(req.version, &request)?;
            // Long poll: wait for `min_bytes` as Kafka's purgatory does, by re-reading the
            // published views (appends publish a new one) until enough data or the deadline.
            if plan.bytes >= min_bytes || plan.has_error || Instant::now() >= deadline {
                return splice_records(req.version, plan);
            }
            std::thread::sleep(Duration::from_millis(SERVE_FETCH_POLL_MS));
        }
    }
}

impl FetchApi {
    fn plan(&self, version: i16, request: &FetchRequest) -> Result<Plan, ServeError> {
        let topics = topics(&self.catalog);
        let committed = request.isolation_level == 1;
        let mut budget = (request.max_bytes.max(0) as u64).min(SERVE_FETCH_RESPONSE_BYTES_MAX);
        let mut plan = Plan {
            response: FetchResponse::default(),
            reads: Vec::new(),
            bytes: 0,
            has_error: false,
        };
        for (ti, topic) in request.topics.iter().enumerate() {
            let name = if version >= FIRST_TOPIC_ID {
                topic_by_id(&topics, topic.topic_id).map(str::to_string)
            } else {
                Some(topic.topic.0.to_string())
            };
            let mut out = FetchableTopicResponse::default();
            if version >= FIRST_TOPIC_ID {
                out.topic_id = topic.topic_id;
            } else {
                out.topic = topic.topic.clone();
            }
            for (pi, p) in topic.partitions.iter().enumerate() {
                let mut pd = PartitionData::default();
                pd.partition_index = p.partition;
                pd.records = Some(Bytes::new());
                // Null for read_uncommitted, as Kafka sends it.
                pd.aborted_transactions = None;
                let view = name.as_deref().and_then(|n| find(&topics, n, p.partition));
                let Some(view) = view else {
                    pd.error_code = if version >= FIRST_TOPIC_ID {
                        UNKNOWN_TOPIC_ID
                    } else {
                        UNKNOWN_TOPIC_OR_PARTITION
                    };
                    plan.has_error = true;
                    out.partitions.push(pd);
                    continue;
                };
                pd.high_watermark = view.high_watermark.0;
                pd.last_stable_offset = view.last_stable_offset.0;
                pd.log_start_offset = view.log_start.0;
                let min_one = plan.reads.is_empty();
                match read_partition(&view, p, committed, version, budget, min_one)? {
                    Answer::Error(code) => {
                        pd.error_code = code;
                        plan.has_error = true;
                    }
                    Answer::Diverging(epoch, end) => {
                        pd.diverging_epoch.epoch = epoch.0;
                        pd.diverging_epoch.end_offset = end.0;
                        plan.has_error = true;
                    }
                    Answer::Data { read, aborted } => {
                        if committed {
                            pd.aborted_transactions = Some(aborted);
                        }
                        if let Some(read) = read {
                            budget = budget.saturating_sub(read.length);
                            plan.bytes += read.length;
                            plan.reads.push((ti, pi, read));
                        }
                    }
                }
                out.partitions.push(pd);
            }
            plan.response.responses.push(out);
        }
        Ok(plan)
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
    p: &kafka_protocol::messages::fetch_request::FetchPartition,
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
            "127.0.0.1".into(),
            9092,
            crate::serve::writes::writer_slot(),
        );
        // Readers need only the published view and the files, not the log itself.
        drop(log);
        (dir, d, id, all)
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
}
