//! Fetch responses of the synthetic source, assembled as a list of pieces: small encoded fields
//! in a scratch buffer, interleaved with references to the shared batch template. The server
//! sends the pieces with vectored writes, so batch bodies are never copied per response.
//!
//! The fields are written here rather than by kafka-protocol's `FetchResponse` encoder because
//! that encoder needs each partition's records as one contiguous buffer. The tests decode every
//! supported version with kafka-protocol's decoder to prove the layout.

use std::io::{self, IoSlice, Write};
use std::time::Instant;

use bytes::BufMut;
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::ResponseHeader;
use kafka_protocol::protocol::Encodable;
use kafka_protocol::ResponseError;

use super::records::Catalog;
use super::SynthError;
use crate::ids::Offset;
use crate::limits::IOV_PER_WRITE_MAX;
use crate::serve::fetch_sessions::{requested, Outcome, TopicKey, Wanted};

/// First Fetch version with flexible (compact, tagged) encoding.
const FLEXIBLE_FROM: i16 = 12;
/// First Fetch version that names topics by id instead of by name.
const TOPIC_IDS_FROM: i16 = 13;

#[derive(Debug, Clone, Copy)]
enum Piece {
    /// `scratch[start..end]`
    Scratch(usize, usize),
    /// The template after its baseOffset.
    Body,
}

/// One encoded response frame (length prefix included) as scratch bytes plus template bodies.
#[derive(Debug, Default)]
pub struct ResponseFrame {
    scratch: Vec<u8>,
    pieces: Vec<Piece>,
    run_start: usize,
    bodies: usize,
    body_len: usize,
    /// Whole batches copied into `scratch` (a rate-limited source's time-stamped batches).
    stamped: usize,
}

impl ResponseFrame {
    fn reset(&mut self, body_len: usize) {
        self.scratch.clear();
        self.pieces.clear();
        self.run_start = 0;
        self.bodies = 0;
        self.stamped = 0;
        self.body_len = body_len;
        self.scratch.put_i32(0); // length prefix, patched by `finish`
    }

    fn push_body(&mut self) {
        let end = self.scratch.len();
        if end > self.run_start {
            self.pieces.push(Piece::Scratch(self.run_start, end));
        }
        self.pieces.push(Piece::Body);
        self.run_start = end;
        self.bodies += 1;
    }

    fn finish(&mut self) -> Result<(), SynthError> {
        let end = self.scratch.len();
        if end > self.run_start {
            self.pieces.push(Piece::Scratch(self.run_start, end));
        }
        self.run_start = end;
        let body = self.len() - 4;
        let body = i32::try_from(body).map_err(|_| SynthError::Encode {
            what: "fetch response",
            reason: format!("{body} bytes do not fit a frame"),
        })?;
        self.scratch[..4].copy_from_slice(&body.to_be_bytes());
        Ok(())
    }

    /// Total frame size, length prefix included.
    pub fn len(&self) -> usize {
        self.scratch.len() + self.bodies * self.body_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of record batches in the frame.
    pub fn batch_count(&self) -> usize {
        self.bodies + self.stamped
    }

    fn slices<'a>(&'a self, body: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.pieces.iter().map(move |p| match *p {
            Piece::Scratch(s, e) => &self.scratch[s..e],
            Piece::Body => body,
        })
    }

    /// Writes the frame with vectored writes; `body` is the template after its baseOffset.
    pub fn write_to(&self, w: &mut impl Write, body: &[u8]) -> io::Result<()> {
        assert_eq!(
            body.len(),
            self.body_len,
            "frame built for another template"
        );
        let all: Vec<&[u8]> = self.slices(body).collect();
        for group in all.chunks(IOV_PER_WRITE_MAX) {
            let mut iov: Vec<IoSlice<'_>> = group.iter().map(|s| IoSlice::new(s)).collect();
            let mut rest = &mut iov[..];
            while !rest.is_empty() {
                let n = w.write_vectored(rest)?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut rest, n);
            }
        }
        Ok(())
    }

    /// The frame as one contiguous buffer (tests and benches).
    pub fn to_vec(&self, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for s in self.slices(body) {
            v.extend_from_slice(s);
        }
        v
    }
}

fn put_uvarint(buf: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        buf.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Array length: int32 before flexible versions, uvarint(n + 1) from them on.
fn put_array_len(buf: &mut Vec<u8>, version: i16, n: usize) {
    if version >= FLEXIBLE_FROM {
        put_uvarint(buf, n as u32 + 1);
    } else {
        buf.put_i32(n as i32);
    }
}

fn put_null_array(buf: &mut Vec<u8>, version: i16) {
    if version >= FLEXIBLE_FROM {
        put_uvarint(buf, 0);
    } else {
        buf.put_i32(-1);
    }
}

fn put_string(buf: &mut Vec<u8>, version: i16, s: &str) {
    if version >= FLEXIBLE_FROM {
        put_uvarint(buf, s.len() as u32 + 1);
    } else {
        buf.put_i16(s.len() as i16);
    }
    buf.extend_from_slice(s.as_bytes());
}

fn put_records_len(buf: &mut Vec<u8>, version: i16, n: usize) {
    if version >= FLEXIBLE_FROM {
        put_uvarint(buf, n as u32 + 1);
    } else {
        buf.put_i32(n as i32);
    }
}

fn put_no_tags(buf: &mut Vec<u8>, version: i16) {
    if version >= FLEXIBLE_FROM {
        put_uvarint(buf, 0);
    }
}

/// What one partition of the request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub topic: usize,
    pub partition: i32,
    pub error_code: i16,
    /// Where the next fetch of this partition starts.
    pub next_offset: Offset,
}

/// What reading one partition gives, decided before anything is encoded, so a fetch session
/// can drop partitions with no news from the response (`encode`'s `keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Index of the topic in the catalog, `None` when unknown.
    topic: Option<usize>,
    partition: i32,
    error: Option<ResponseError>,
    high_watermark: i64,
    last_stable: i64,
    log_start: i64,
    /// Base offset of the first batch served (when `batches > 0`).
    first_base: i64,
    batches: usize,
    next_offset: Offset,
}

impl Planned {
    /// What a fetch session compares to decide whether the client must hear of the partition.
    pub fn outcome(&self) -> Outcome {
        Outcome {
            high_watermark: Offset(self.high_watermark),
            log_start: Offset(self.log_start),
            last_stable: Offset(self.last_stable),
            records: self.batches > 0,
            error: self.error.is_some(),
        }
    }

    /// Tells the catalog's progress what this partition was served (after the response that
    /// carried it was written).
    pub fn report_served(&self, catalog: &Catalog) {
        let (Some(topic), None) = (self.topic, self.error) else {
            return;
        };
        let Ok(partition) = usize::try_from(self.partition) else {
            return;
        };
        let global = topic * catalog.spec.partitions as usize + partition;
        let end = catalog
            .batches_per_partition
            .map(|n| n as i64 * catalog.records_per_batch());
        catalog
            .progress
            .served(global, self.batches, self.next_offset.0, end);
    }
}

/// Reads `wanted` (topics named as the request's `version` names them) at `now`: per
/// partition its error, watermarks and the whole batches from the one holding the fetch
/// offset, within the partition's limit and `max_bytes` over all; the first batch of the
/// response goes out even when larger (KIP-74). Returns the record bytes planned.
pub fn plan(
    catalog: &Catalog,
    version: i16,
    wanted: &[Wanted],
    max_bytes: i32,
    now: Instant,
    out: &mut Vec<Planned>,
) -> usize {
    out.clear();
    let rpb = catalog.records_per_batch();
    let batch_size = catalog.template.size();
    let max_bytes = max_bytes.max(0) as usize;
    let partitions = catalog.spec.partitions;
    let mut total = 0usize;
    let mut last_topic: Option<(&TopicKey, Option<usize>)> = None;
    for w in wanted {
        let topic_index = match last_topic {
            Some((k, i)) if *k == w.topic => i,
            _ => {
                let i = match &w.topic {
                    TopicKey::Id(id) => catalog.topic_index_by_id(id),
                    TopicKey::Name(n) => catalog.topic_index(n),
                };
                last_topic = Some((&w.topic, i));
                i
            }
        };
        let p = &w.partition;
        let fetch_offset = Offset(p.fetch_offset);
        let global = topic_index
            .filter(|_| p.partition >= 0 && (p.partition as u32) < partitions)
            .map(|t| t * partitions as usize + p.partition as usize);
        let leo = match global {
            Some(g) => catalog.partition_end(g, now),
            None => catalog.log_end_offset(),
        };
        let error = match topic_index {
            None if version >= TOPIC_IDS_FROM => Some(ResponseError::UnknownTopicId),
            None => Some(ResponseError::UnknownTopicOrPartition),
            Some(_) if p.partition < 0 || p.partition as u32 >= partitions => {
                Some(ResponseError::UnknownTopicOrPartition)
            }
            Some(_)
                if p.current_leader_epoch >= 0
                    && p.current_leader_epoch < catalog.spec.leader_epoch =>
            {
                Some(ResponseError::FencedLeaderEpoch)
            }
            Some(_) if p.current_leader_epoch > catalog.spec.leader_epoch => {
                Some(ResponseError::UnknownLeaderEpoch)
            }
            Some(_) if fetch_offset.0 < 0 || fetch_offset > leo => {
                Some(ResponseError::OffsetOutOfRange)
            }
            Some(_) => None,
        };
        let (hw, lso, log_start) = match (error, topic_index) {
            (Some(ResponseError::UnknownTopicId), _)
            | (Some(ResponseError::UnknownTopicOrPartition), _)
            | (_, None) => (-1, -1, -1),
            _ => (leo.0, leo.0, 0),
        };
        let first_base = catalog.batch_start(fetch_offset);
        let mut next = fetch_offset;
        let mut batches = 0usize;
        if error.is_none() {
            let partition_max = p.partition_max_bytes.max(0) as usize;
            let mut at = first_base;
            let mut in_partition = 0usize;
            while at < leo {
                let fits =
                    in_partition + batch_size <= partition_max && total + batch_size <= max_bytes;
                if !(fits || total == 0) {
                    break;
                }
                batches += 1;
                in_partition += batch_size;
                total += batch_size;
                at = Offset(at.0 + rpb);
            }
            if batches > 0 {
                next = at;
            }
        }
        out.push(Planned {
            topic: topic_index,
            partition: p.partition,
            error,
            high_watermark: hw,
            last_stable: lso,
            log_start,
            first_base: first_base.0,
            batches,
            next_offset: next,
        });
    }
    total
}

fn put_header(
    frame: &mut ResponseFrame,
    correlation_id: i32,
    version: i16,
) -> Result<(), SynthError> {
    let header_version = if version >= FLEXIBLE_FROM { 1 } else { 0 };
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut frame.scratch, header_version)
        .map_err(|e| SynthError::Encode {
            what: "response header",
            reason: e.to_string(),
        })?;
    frame.scratch.put_i32(0); // throttle_time_ms
    Ok(())
}

/// A response carrying only a top-level error (a fetch session error), session id 0.
pub fn encode_error(
    catalog: &Catalog,
    correlation_id: i32,
    version: i16,
    code: i16,
    frame: &mut ResponseFrame,
) -> Result<(), SynthError> {
    frame.reset(catalog.template.body_after_offset().len());
    put_header(frame, correlation_id, version)?;
    if version >= 7 {
        frame.scratch.put_i16(code);
        frame.scratch.put_i32(0);
    }
    put_array_len(&mut frame.scratch, version, 0);
    put_no_tags(&mut frame.scratch, version);
    frame.finish()
}

/// Encodes the answer: the `planned` partitions of `wanted` (same order) for which `keep` is
/// true (all without `keep`), a topic entry per run of one topic, and `session_id` (Fetch
/// v7+). `served` says, per encoded partition, what it got.
#[allow(clippy::too_many_arguments)]
pub fn encode(
    catalog: &Catalog,
    correlation_id: i32,
    version: i16,
    session_id: i32,
    wanted: &[Wanted],
    planned: &[Planned],
    keep: Option<&[bool]>,
    frame: &mut ResponseFrame,
    served: &mut Vec<Served>,
) -> Result<(), SynthError> {
    assert_eq!(wanted.len(), planned.len(), "a plan per wanted partition");
    served.clear();
    frame.reset(catalog.template.body_after_offset().len());
    put_header(frame, correlation_id, version)?;
    if version >= 7 {
        frame.scratch.put_i16(0);
        frame.scratch.put_i32(session_id);
    }
    let kept = |i: usize| keep.is_none_or(|k| k[i]);
    // Runs of consecutive kept partitions of one topic, as (first, end) over `wanted`.
    let mut runs: Vec<(usize, usize, usize)> = Vec::new(); // (first, end, kept count)
    for i in (0..wanted.len()).filter(|i| kept(*i)) {
        match runs.last_mut() {
            Some((first, end, n)) if wanted[*first].topic == wanted[i].topic => {
                *end = i + 1;
                *n += 1;
            }
            _ => runs.push((i, i + 1, 1)),
        }
    }
    let rpb = catalog.records_per_batch();
    let batch_size = catalog.template.size();
    put_array_len(&mut frame.scratch, version, runs.len());
    for (first, end, n) in runs {
        match &wanted[first].topic {
            TopicKey::Id(id) => frame.scratch.extend_from_slice(id.as_bytes()),
            TopicKey::Name(name) => put_string(&mut frame.scratch, version, name),
        }
        put_array_len(&mut frame.scratch, version, n);
        for i in (first..end).filter(|i| kept(*i)) {
            let pl = &planned[i];
            frame.scratch.put_i32(pl.partition);
            frame
                .scratch
                .put_i16(pl.error.map(|e| e.code()).unwrap_or(0));
            frame.scratch.put_i64(pl.high_watermark);
            frame.scratch.put_i64(pl.last_stable);
            if version >= 5 {
                frame.scratch.put_i64(pl.log_start);
            }
            put_null_array(&mut frame.scratch, version); // aborted_transactions
            if version >= 11 {
                frame.scratch.put_i32(-1); // preferred_read_replica
            }
            put_records_len(&mut frame.scratch, version, pl.batches * batch_size);
            let global = pl
                .topic
                .filter(|_| pl.error.is_none())
                .map(|t| t * catalog.spec.partitions as usize + pl.partition as usize);
            for b in 0..pl.batches {
                let base = pl.first_base + b as i64 * rpb;
                match global.and_then(|g| catalog.appear_time_ms(g, (base / rpb) as u64)) {
                    Some(ts) => {
                        catalog
                            .template
                            .stamp_into(&mut frame.scratch, Offset(base), ts);
                        frame.stamped += 1;
                    }
                    None => {
                        frame.scratch.put_i64(base);
                        frame.push_body();
                    }
                }
            }
            put_no_tags(&mut frame.scratch, version); // partition
            served.push(Served {
                topic: pl.topic.unwrap_or(usize::MAX),
                partition: pl.partition,
                error_code: pl.error.map(|e| e.code()).unwrap_or(0),
                next_offset: pl.next_offset,
            });
        }
        put_no_tags(&mut frame.scratch, version); // topic
    }
    put_no_tags(&mut frame.scratch, version); // response
    frame.finish()
}

/// Encodes the sessionless answer to `req` (decoded at `version`) into `frame` and reports,
/// per requested partition in request order, what it got. Session fields are ignored: the
/// answer carries session id 0 (the server keeps sessions itself, see `server`).
pub fn build(
    catalog: &Catalog,
    correlation_id: i32,
    version: i16,
    req: &FetchRequest,
    frame: &mut ResponseFrame,
    served: &mut Vec<Served>,
) -> Result<(), SynthError> {
    let wanted = requested(version, req);
    let mut planned = Vec::with_capacity(wanted.len());
    plan(
        catalog,
        version,
        &wanted,
        req.max_bytes,
        Instant::now(),
        &mut planned,
    );
    encode(
        catalog,
        correlation_id,
        version,
        0,
        &wanted,
        &planned,
        None,
        frame,
        served,
    )
}

/// Bytes of record batches a built response carries (for min_bytes).
pub fn records_bytes(catalog: &Catalog, frame: &ResponseFrame) -> usize {
    frame.batch_count() * catalog.template.size()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{SynthCodec, SynthSpec};
    use crate::ids::TimestampMs;
    use crate::wire::batch::Batches;
    use bytes::Bytes;
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::fetch_response::FetchResponse;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Decodable, StrBytes};

    fn catalog() -> Catalog {
        Catalog::new(SynthSpec {
            topics: vec!["a".into(), "b".into()],
            partitions: 3,
            codec: SynthCodec::Lz4,
            records_per_batch: Some(10),
            ..SynthSpec::default()
        })
        .unwrap()
    }

    fn request(c: &Catalog, version: i16, parts: &[(usize, i32, i64, i32)]) -> FetchRequest {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for &(t, p, off, pmax) in parts {
            let name = &c.spec.topics[t];
            let mut ft = FetchTopic::default();
            if version >= TOPIC_IDS_FROM {
                ft.topic_id = SynthSpec::topic_id(name);
            } else {
                ft.topic = TopicName(StrBytes::from_string(name.clone()));
            }
            ft.partitions.push(
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(off)
                    .with_partition_max_bytes(pmax),
            );
            topics.push(ft);
        }
        FetchRequest::default()
            .with_max_bytes(i32::MAX)
            .with_topics(topics)
    }

    fn decode(frame: &ResponseFrame, c: &Catalog, version: i16) -> FetchResponse {
        let mut bytes = Bytes::from(frame.to_vec(c.template.body_after_offset()));
        let len = i32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len + 4, bytes.len());
        let _ = bytes.split_to(4);
        let header_version = if version >= FLEXIBLE_FROM { 1 } else { 0 };
        let h = ResponseHeader::decode(&mut bytes, header_version).unwrap();
        assert_eq!(h.correlation_id, 77);
        let r = FetchResponse::decode(&mut bytes, version).unwrap();
        assert!(
            bytes.is_empty(),
            "{} bytes left after the response",
            bytes.len()
        );
        r
    }

    #[test]
    fn every_version_decodes_with_kafka_protocol_and_holds_valid_batches() {
        let mut c = catalog();
        c.batches_per_partition = Some(100);
        let bs = c.template.size() as i32;
        for version in 4..=18 {
            let req = request(&c, version, &[(0, 1, 25, 3 * bs), (1, 2, 0, bs / 2)]);
            let mut frame = ResponseFrame::default();
            let mut served = Vec::new();
            build(&c, 77, version, &req, &mut frame, &mut served).unwrap();
            let r = decode(&frame, &c, version);
            assert_eq!(r.responses.len(), 2, "v{version}");
            if version >= 7 {
                assert_eq!(r.session_id, 0);
            }
            let p = &r.responses[0].partitions[0];
            assert_eq!(p.error_code, 0);
            assert_eq!(p.high_watermark, 1000);
            let recs = p.records.as_ref().unwrap();
            let offs: Vec<i64> = Batches::new(recs)
                .map(|b| {
                    let (_, b) = b.unwrap();
                    b.validate().unwrap();
                    b.base_offset().0
                })
                .collect();
            // Batch-granular: starts at the batch holding offset 25.
            assert_eq!(offs, vec![20, 30, 40], "v{version}");
            // The second partition's limit is below one batch and the response is not empty.
            let p2 = &r.responses[1].partitions[0];
            assert_eq!(p2.records.as_ref().map(|b| b.len()), Some(0));
            assert_eq!(served[0].next_offset, Offset(50));
            assert_eq!(served[1].next_offset, Offset(0));
        }
    }

    #[test]
    fn first_batch_is_returned_even_above_the_limits_and_errors_are_typed() {
        let mut c = catalog();
        c.batches_per_partition = Some(5);
        for version in [4i16, 11, 12, 13, 17] {
            let mut req = request(
                &c,
                version,
                &[(1, 0, 0, 1), (0, 7, 0, 1000), (0, 0, 51, 1000)],
            );
            req.max_bytes = 1;
            let mut frame = ResponseFrame::default();
            let mut served = Vec::new();
            build(&c, 77, version, &req, &mut frame, &mut served).unwrap();
            let r = decode(&frame, &c, version);
            assert_eq!(
                r.responses[0].partitions[0].records.as_ref().unwrap().len(),
                c.template.size()
            );
            // Consecutive partitions of one topic share its entry, as a broker answers.
            assert_eq!(r.responses.len(), 2);
            assert_eq!(r.responses[1].partitions[0].error_code, 3);
            assert_eq!(
                r.responses[1].partitions[1].error_code, 1,
                "offset past the end"
            );
            assert_eq!(served[0].next_offset, Offset(10));
        }
    }

    #[test]
    fn vectored_write_matches_the_contiguous_frame() {
        let mut c = catalog();
        c.batches_per_partition = Some(3000);
        let req = request(&c, 17, &[(0, 0, 0, i32::MAX), (1, 1, 0, i32::MAX)]);
        let mut frame = ResponseFrame::default();
        build(&c, 77, 17, &req, &mut frame, &mut Vec::new()).unwrap();
        // More pieces than one writev takes, to cover the chunking.
        assert!(frame.pieces.len() > IOV_PER_WRITE_MAX);
        let mut out = Vec::new();
        frame
            .write_to(&mut out, c.template.body_after_offset())
            .unwrap();
        assert_eq!(out, frame.to_vec(c.template.body_after_offset()));
        assert_eq!(out.len(), frame.len());
    }

    #[test]
    fn rate_limited_source_serves_only_appeared_batches_stamped_with_their_appear_time() {
        let mut spec = catalog().spec;
        spec.partitions = 2;
        // One template-sized batch per ms over the 4 partitions (2 topics x 2).
        let probe = Catalog::new(spec.clone()).unwrap();
        spec.rate_bytes_per_s = Some(probe.template.size() as u64 * 1000);
        spec.partition_bytes = Some(probe.template.size() as u64 * 1000);
        let c = Catalog::new(spec).unwrap();
        let req = request(&c, 17, &[(0, 0, 0, i32::MAX), (1, 1, 0, i32::MAX)]);
        let mut frame = ResponseFrame::default();
        let mut served = Vec::new();
        // Before the first fetch starts the clock nothing has appeared.
        build(&c, 77, 17, &req, &mut frame, &mut served).unwrap();
        assert_eq!(frame.batch_count(), 0);
        c.start_clock();
        let wall_start = c.clock().unwrap().1 as i64;
        std::thread::sleep(std::time::Duration::from_millis(40));
        build(&c, 77, 17, &req, &mut frame, &mut served).unwrap();
        let wall_end = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let r = decode(&frame, &c, 17);
        let rpb = c.records_per_batch();
        let mut total = 0;
        for (k, (g, t)) in [(0usize, &r.responses[0]), (3, &r.responses[1])]
            .into_iter()
            .enumerate()
        {
            let part = &t.partitions[0];
            assert_eq!(part.high_watermark, served[k].next_offset.0);
            let mut last_ts = i64::MIN;
            let mut n = 0u64;
            for b in Batches::new(part.records.as_ref().unwrap()) {
                let (_, b) = b.unwrap();
                b.validate().expect("CRC recomputed after restamping");
                assert_eq!(b.base_offset().0, n as i64 * rpb);
                let ts = b.max_timestamp().0;
                assert_eq!(Some(b.max_timestamp()), c.appear_time_ms(g, n));
                assert_eq!(b.base_timestamp().0, ts - (rpb - 1), "record deltas kept");
                assert!(
                    ts > last_ts && ts >= wall_start - 1 && ts <= wall_end,
                    "{ts}"
                );
                last_ts = ts;
                n += 1;
            }
            // Partition g gets every 4th batch overall: at least the 40 ms slept have appeared.
            assert!(n >= 40 / 4 - 1, "partition {g}: {n} batches");
            total += n;
        }
        assert!(total < 1000, "bounded by time, not by the data size");
    }

    #[test]
    fn rate_limited_partition_ends_follow_the_round_robin() {
        let mut spec = catalog().spec;
        spec.partitions = 3;
        spec.topics.truncate(1);
        let probe = Catalog::new(spec.clone()).unwrap();
        spec.rate_bytes_per_s = Some(probe.template.size() as u64 * 1000);
        spec.partition_bytes = Some(probe.template.size() as u64 * 3);
        let c = Catalog::new(spec).unwrap();
        let rpb = c.records_per_batch();
        assert!(c.next_batch_at(Instant::now()).is_none(), "no clock yet");
        c.start_clock();
        let (start, wall) = *c.clock().unwrap();
        let at = |ms: f64| start + std::time::Duration::from_secs_f64(ms / 1e3);
        // 10 batches after 10.5 ms: j = 0..9 round-robin over 3 partitions.
        let ends: Vec<i64> = (0..3)
            .map(|g| c.partition_end(g, at(10.5)).0 / rpb)
            .collect();
        assert_eq!(
            ends,
            vec![3, 3, 3],
            "capped at the finite size of 3 batches"
        );
        let ends: Vec<i64> = (0..3)
            .map(|g| c.partition_end(g, at(4.5)).0 / rpb)
            .collect();
        assert_eq!(ends, vec![2, 1, 1]);
        assert_eq!(c.next_batch_at(at(4.5)), Some(at(5.0)));
        // Batch 1 of partition 2 is batch 5 overall: it appears after 6 intervals.
        assert_eq!(
            c.appear_time_ms(2, 1),
            Some(TimestampMs((wall + 6.0) as i64))
        );
    }
}
