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

/// Encodes the answer to `req` (decoded at `version`) into `frame` and reports, per requested
/// partition in request order, what it got. Sessions are refused: a full fetch is answered with
/// session id 0, an incremental one with FETCH_SESSION_ID_NOT_FOUND.
pub fn build(
    catalog: &Catalog,
    correlation_id: i32,
    version: i16,
    req: &FetchRequest,
    frame: &mut ResponseFrame,
    served: &mut Vec<Served>,
) -> Result<(), SynthError> {
    served.clear();
    frame.reset(catalog.template.body_after_offset().len());
    let header_version = if version >= FLEXIBLE_FROM { 1 } else { 0 };
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut frame.scratch, header_version)
        .map_err(|e| SynthError::Encode {
            what: "response header",
            reason: e.to_string(),
        })?;

    frame.scratch.put_i32(0); // throttle_time_ms
    if version >= 7 {
        if req.session_id != 0 {
            frame
                .scratch
                .put_i16(ResponseError::FetchSessionIdNotFound.code());
            frame.scratch.put_i32(0);
            put_array_len(&mut frame.scratch, version, 0);
            put_no_tags(&mut frame.scratch, version);
            return frame.finish();
        }
        frame.scratch.put_i16(0);
        frame.scratch.put_i32(0); // session id 0: no session was created
    }

    let rpb = catalog.records_per_batch();
    let now = Instant::now();
    let batch_size = catalog.template.size();
    let max_bytes = req.max_bytes.max(0) as usize;
    let mut total = 0usize;

    put_array_len(&mut frame.scratch, version, req.topics.len());
    for topic in &req.topics {
        let topic_index = if version >= TOPIC_IDS_FROM {
            catalog.topic_index_by_id(&topic.topic_id)
        } else {
            catalog.topic_index(topic.topic.as_str())
        };
        if version >= TOPIC_IDS_FROM {
            frame.scratch.extend_from_slice(topic.topic_id.as_bytes());
        } else {
            put_string(&mut frame.scratch, version, topic.topic.as_str());
        }
        put_array_len(&mut frame.scratch, version, topic.partitions.len());
        for p in &topic.partitions {
            let fetch_offset = Offset(p.fetch_offset);
            let global = topic_index
                .filter(|_| p.partition >= 0 && (p.partition as u32) < catalog.spec.partitions)
                .map(|t| t * catalog.spec.partitions as usize + p.partition as usize);
            let leo = match global {
                Some(g) => catalog.partition_end(g, now),
                None => catalog.log_end_offset(),
            };
            let error = match topic_index {
                None if version >= TOPIC_IDS_FROM => Some(ResponseError::UnknownTopicId),
                None => Some(ResponseError::UnknownTopicOrPartition),
                Some(_) if p.partition < 0 || p.partition as u32 >= catalog.spec.partitions => {
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
            frame.scratch.put_i32(p.partition);
            frame.scratch.put_i16(error.map(|e| e.code()).unwrap_or(0));
            frame.scratch.put_i64(hw);
            frame.scratch.put_i64(lso);
            if version >= 5 {
                frame.scratch.put_i64(log_start);
            }
            put_null_array(&mut frame.scratch, version); // aborted_transactions
            if version >= 11 {
                frame.scratch.put_i32(-1); // preferred_read_replica
            }

            // Whole batches from the one holding fetch_offset, within both byte limits; the
            // first batch of the response goes out even when larger (KIP-74).
            let mut next = fetch_offset;
            let mut n_batches = 0usize;
            if error.is_none() {
                let partition_max = p.partition_max_bytes.max(0) as usize;
                let mut at = catalog.batch_start(fetch_offset);
                let mut in_partition = 0usize;
                while at < leo {
                    let fits = in_partition + batch_size <= partition_max
                        && total + batch_size <= max_bytes;
                    if !(fits || total == 0) {
                        break;
                    }
                    n_batches += 1;
                    in_partition += batch_size;
                    total += batch_size;
                    at = Offset(at.0 + rpb);
                }
                if n_batches > 0 {
                    next = at;
                }
            }
            put_records_len(&mut frame.scratch, version, n_batches * batch_size);
            let first = catalog.batch_start(fetch_offset).0;
            for i in 0..n_batches {
                let base = first + i as i64 * rpb;
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
                topic: topic_index.unwrap_or(usize::MAX),
                partition: p.partition,
                error_code: error.map(|e| e.code()).unwrap_or(0),
                next_offset: next,
            });
        }
        put_no_tags(&mut frame.scratch, version); // topic
    }
    put_no_tags(&mut frame.scratch, version); // response
    frame.finish()
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
            assert_eq!(r.responses[1].partitions[0].error_code, 3);
            assert_eq!(
                r.responses[2].partitions[0].error_code, 1,
                "offset past the end"
            );
            assert_eq!(served[0].next_offset, Offset(10));
        }
    }

    #[test]
    fn incremental_session_fetch_is_refused() {
        let c = catalog();
        let req = request(&c, 12, &[(0, 0, 0, 1000)])
            .with_session_id(5)
            .with_session_epoch(1);
        let mut frame = ResponseFrame::default();
        build(&c, 77, 12, &req, &mut frame, &mut Vec::new()).unwrap();
        let r = decode(&frame, &c, 12);
        assert_eq!(r.error_code, ResponseError::FetchSessionIdNotFound.code());
        assert!(r.responses.is_empty());
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
