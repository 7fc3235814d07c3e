//! A Fetch response body read part by part as its bytes arrive.
//!
//! `kafka-protocol` decodes a whole body at once, so a shard receiving an 8 MiB response could
//! validate and write its records only after the last byte came in, by which time the first
//! partitions' bytes had left the core's cache and the copy out of them ran at memory speed
//! (benches/RESULTS.md, session 20). This scanner hands out each partition's entry as soon as
//! the prefix received so far holds all of it, so its CRC check and its page-cache copy read
//! bytes the socket copy has just written.
//!
//! The body's own fields (throttle, error, session, the topics and partitions arrays, tagged
//! fields) are read here; each partition entry is decoded by `kafka-protocol`'s `PartitionData`
//! (records stay zero-copy slices of the body). A part that does not decode from a prefix may
//! only be cut short, so the scanner waits for more bytes; with the whole body the same failure
//! is the error it always was. A part decoded from a prefix is the part the whole body holds:
//! decoding reads nothing past what it consumes.

use bytes::{Buf, Bytes};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::{Decodable, StrBytes};
use uuid::Uuid;

use super::api;
use super::frame::FrameError;

/// One part of a Fetch response body, in wire order.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// The fields before the topics: always the first part.
    Head {
        throttle_time_ms: i32,
        error_code: i16,
        session_id: i32,
    },
    /// A topic's name (below v13) or id (v13 on); the partitions that follow belong to it.
    Topic { name: TopicName, id: Uuid },
    /// One partition's entry, whole.
    Partition(PartitionData),
    /// Every byte of the body was read: always the last part.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    /// Between topics: `left` topics still to come.
    Topics {
        left: u32,
    },
    /// Inside a topic: `parts` of its partitions still to come, then `topics` more topics.
    Partitions {
        topics: u32,
        parts: u32,
    },
    /// The response's tagged fields were read.
    Done,
}

/// Reads one Fetch response body part by part; `next` is called with ever longer prefixes of
/// the same body.
#[derive(Debug, Clone)]
pub struct FetchParts {
    version: i16,
    /// Bytes of the body read so far (the next part starts here).
    at: usize,
    state: State,
}

impl FetchParts {
    /// A scanner for a body of Fetch `version` (one `api::FETCH` accepts).
    pub fn new(version: i16) -> FetchParts {
        FetchParts {
            version,
            at: 0,
            state: State::Head,
        }
    }

    /// Bytes of the body read so far.
    pub fn consumed(&self) -> usize {
        self.at
    }

    fn flexible(&self) -> bool {
        self.version >= 12
    }

    /// The next part of `body`, which holds the body's first bytes (all of it when `whole`).
    /// `None`: the next part is not whole in `body` yet. Errors only with `whole`, or for a
    /// count larger than `whole_len` allows (the body's length, known from its frame), which
    /// no later byte can heal.
    pub fn next(
        &mut self,
        body: &Bytes,
        whole_len: usize,
        whole: bool,
    ) -> Result<Option<Part>, FrameError> {
        loop {
            if self.at > body.len() {
                return Err(self.error(format!(
                    "read {} bytes of a {} byte prefix",
                    self.at,
                    body.len()
                )));
            }
            let mut buf = body.slice(self.at..);
            let before = buf.len();
            let step = self.step(&mut buf, whole_len, whole);
            match step {
                Ok(Step::Part(part, next)) => {
                    self.at += before - buf.len();
                    self.state = next;
                    return Ok(Some(part));
                }
                Ok(Step::Skip(next)) => {
                    self.at += before - buf.len();
                    self.state = next;
                }
                Ok(Step::End) if whole && self.at < body.len() => {
                    return Err(FrameError::LeftoverBytes {
                        api: api::FETCH.key as i16,
                        version: self.version,
                        left: body.len() - self.at,
                    })
                }
                Ok(Step::End) if whole => return Ok(Some(Part::End)),
                Ok(Step::End) => return Ok(None),
                Err(Fatal(why)) => return Err(self.error(why)),
                Err(Short(why)) if whole => return Err(self.error(why.to_string())),
                Err(Short(_)) => return Ok(None),
            }
        }
    }

    fn error(&self, reason: String) -> FrameError {
        FrameError::Body {
            api: api::FETCH.key as i16,
            version: self.version,
            reason,
        }
    }

    fn step(&self, buf: &mut Bytes, whole_len: usize, whole: bool) -> Result<Step, StepError> {
        // A count is bounded by the bytes the whole body has left: each element takes one.
        let left_in_whole = whole_len.saturating_sub(self.at);
        match self.state {
            State::Head => {
                let throttle_time_ms = i32_of(buf)?;
                let (error_code, session_id) = if self.version >= 7 {
                    (i16_of(buf)?, i32_of(buf)?)
                } else {
                    (0, 0)
                };
                let topics = self.count(buf, left_in_whole, "topics")?;
                Ok(Step::Part(
                    Part::Head {
                        throttle_time_ms,
                        error_code,
                        session_id,
                    },
                    State::Topics { left: topics },
                ))
            }
            State::Topics { left: 0 } => {
                self.skip_tagged_fields(buf)?;
                Ok(Step::Skip(State::Done))
            }
            State::Topics { left } => {
                let name = if self.version <= 12 {
                    let len = if self.flexible() {
                        (varint_of(buf)? as usize).checked_sub(1)
                    } else {
                        usize::try_from(i16_of(buf)?).ok()
                    };
                    let len = len.ok_or_else(|| Fatal("null topic name".to_string()))?;
                    let raw = bytes_of(buf, len)?;
                    TopicName(
                        StrBytes::from_utf8(raw)
                            .map_err(|e| Fatal(format!("topic name is not UTF-8: {e}")))?,
                    )
                } else {
                    TopicName::default()
                };
                let id = if self.version >= 13 {
                    let raw = bytes_of(buf, 16)?;
                    Uuid::from_slice(&raw).expect("16 bytes")
                } else {
                    Uuid::nil()
                };
                let parts = self.count(buf, left_in_whole, "partitions")?;
                Ok(Step::Part(
                    Part::Topic { name, id },
                    State::Partitions {
                        topics: left - 1,
                        parts,
                    },
                ))
            }
            State::Partitions { topics, parts: 0 } => {
                self.skip_tagged_fields(buf)?;
                Ok(Step::Skip(State::Topics { left: topics }))
            }
            State::Partitions { topics, parts } => {
                // On a prefix, decode only an entry that is all there: a decode cut short fails
                // with an `anyhow::Error`, which captures a backtrace under RUST_BACKTRACE=1
                // (~10 % of a shard's time in session 23's profile, one per entry and read
                // step), and the retries would format its message each time.
                if !whole {
                    self.partition_entry_whole(buf)?;
                }
                let pd = PartitionData::decode(buf, self.version)?;
                Ok(Step::Part(
                    Part::Partition(pd),
                    State::Partitions {
                        topics,
                        parts: parts - 1,
                    },
                ))
            }
            State::Done => Ok(Step::End),
        }
    }

    /// An array's element count (not null: Kafka never sends these arrays null).
    fn count(&self, buf: &mut Bytes, left_in_whole: usize, what: &str) -> Result<u32, StepError> {
        let n = self.length(buf)?;
        if n < 0 {
            return Err(Fatal(format!("null or negative {what} count {n}")));
        }
        if n as usize > left_in_whole {
            return Err(Fatal(format!(
                "{n} {what} declared with {left_in_whole} bytes left in the body"
            )));
        }
        Ok(n as u32)
    }

    /// An array's or bytes' length as written: compact (length + 1, 0 for null) when flexible,
    /// else an int32 (-1 for null).
    fn length(&self, buf: &mut Bytes) -> Result<i64, StepError> {
        Ok(if self.flexible() {
            i64::from(varint_of(buf)?) - 1
        } else {
            i64::from(i32_of(buf)?)
        })
    }

    /// Reads past one partition entry on a copy of `buf`: `Short` when the entry runs past its
    /// end, so that `PartitionData::decode` is tried only on a whole entry. A malformed entry
    /// is left to the decode, whose error is the one the whole body gives. Fields by version as
    /// in Kafka's FetchResponse.json.
    fn partition_entry_whole(&self, buf: &Bytes) -> Result<(), StepError> {
        let v = self.version;
        let mut buf = buf.clone();
        let walked = (|| -> Result<(), StepError> {
            // partition_index, error_code, high_watermark; last_stable_offset (v4+),
            // log_start_offset (v5+).
            let fixed = 4 + 2 + 8 + if v >= 4 { 8 } else { 0 } + if v >= 5 { 8 } else { 0 };
            bytes_of(&mut buf, fixed)?;
            // aborted_transactions (v4+, nullable): producer_id and first_offset each.
            if v >= 4 {
                for _ in 0..self.length(&mut buf)?.max(0) {
                    bytes_of(&mut buf, 16)?;
                    self.skip_tagged_fields(&mut buf)?;
                }
            }
            // preferred_read_replica (v11+).
            if v >= 11 {
                bytes_of(&mut buf, 4)?;
            }
            let records = self.length(&mut buf)?;
            bytes_of(&mut buf, records.max(0) as usize)?;
            self.skip_tagged_fields(&mut buf)
        })();
        match walked {
            Err(Fatal(_)) => Ok(()),
            other => other,
        }
    }

    /// Tagged fields we do not use (a topic's; the response's, whose tag 0 at v16 on is
    /// `NodeEndpoints`, a hint for clients that we do not need): each is skipped by its size.
    fn skip_tagged_fields(&self, buf: &mut Bytes) -> Result<(), StepError> {
        if !self.flexible() {
            return Ok(());
        }
        for _ in 0..varint_of(buf)? {
            let _tag = varint_of(buf)?;
            let size = varint_of(buf)? as usize;
            bytes_of(buf, size)?;
        }
        Ok(())
    }
}

// Returned once per part and moved straight out: boxing the part would allocate per partition.
#[allow(clippy::large_enum_variant)]
enum Step {
    Part(Part, State),
    /// Bytes read that make no part (tagged fields).
    Skip(State),
    End,
}

/// `Short`: too few bytes for the part (an error only once the body is whole). `Fatal`: no
/// later byte can make the part valid.
enum StepError {
    Short(Shortfall),
    Fatal(String),
}
use StepError::{Fatal, Short};

/// Why a part is not whole yet, kept as data: a prefix is short many times per response, and
/// only a whole body's shortfall becomes a message.
enum Shortfall {
    Bytes { needed: usize, left: usize },
    Decode(String),
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shortfall::Bytes { needed, left } => write!(f, "{needed} bytes needed, {left} left"),
            Shortfall::Decode(why) => f.write_str(why),
        }
    }
}

impl From<anyhow::Error> for StepError {
    fn from(e: anyhow::Error) -> StepError {
        Short(Shortfall::Decode(format!("{e:#}")))
    }
}

fn need(buf: &Bytes, n: usize) -> Result<(), StepError> {
    if buf.len() < n {
        return Err(Short(Shortfall::Bytes {
            needed: n,
            left: buf.len(),
        }));
    }
    Ok(())
}

fn i16_of(buf: &mut Bytes) -> Result<i16, StepError> {
    need(buf, 2)?;
    Ok(buf.get_i16())
}

fn i32_of(buf: &mut Bytes) -> Result<i32, StepError> {
    need(buf, 4)?;
    Ok(buf.get_i32())
}

fn bytes_of(buf: &mut Bytes, n: usize) -> Result<Bytes, StepError> {
    need(buf, n)?;
    Ok(buf.split_to(n))
}

/// An unsigned varint of at most 5 bytes (a `u32`), as Kafka writes lengths and counts.
fn varint_of(buf: &mut Bytes) -> Result<u32, StepError> {
    let mut value: u32 = 0;
    for i in 0..5 {
        need(buf, 1)?;
        let b = buf.get_u8();
        if i == 4 && b > 0x0f {
            return Err(Fatal("unsigned varint longer than 32 bits".to_string()));
        }
        value |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Fatal("unsigned varint longer than 5 bytes".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, EpochEndOffset, FetchableTopicResponse, NodeEndpoint,
    };
    use kafka_protocol::messages::{BrokerId, FetchResponse};
    use kafka_protocol::protocol::Encodable;
    use proptest::prelude::*;

    fn response(version: i16, seed: u64) -> FetchResponse {
        let mut r = FetchResponse::default()
            .with_throttle_time_ms(seed as i32 % 7)
            .with_error_code(if version >= 7 { (seed % 3) as i16 } else { 0 })
            .with_session_id(if version >= 7 { (seed % 11) as i32 } else { 0 });
        for t in 0..(seed % 3) {
            let mut topic = FetchableTopicResponse::default();
            if version <= 12 {
                topic.topic = TopicName(StrBytes::from_string(format!("topic-{t}")));
            } else {
                topic.topic_id = Uuid::from_u128(u128::from(t) + 1);
            }
            for p in 0..((seed >> 2) % 4) {
                let mut pd = PartitionData::default()
                    .with_partition_index(p as i32)
                    .with_high_watermark((seed + p) as i64)
                    .with_last_stable_offset(p as i64)
                    .with_records(Some(Bytes::from(vec![
                        p as u8;
                        ((seed >> 4) % 300) as usize
                    ])));
                if version >= 5 {
                    pd.log_start_offset = 3;
                }
                if (seed + p) % 2 == 0 {
                    pd.aborted_transactions = Some(vec![AbortedTransaction::default()
                        .with_producer_id(kafka_protocol::messages::ProducerId(9))
                        .with_first_offset(1)]);
                }
                if version >= 12 && (seed + p) % 3 == 0 {
                    pd.diverging_epoch = EpochEndOffset::default().with_epoch(4).with_end_offset(8);
                }
                topic.partitions.push(pd);
            }
            if version >= 12 && t == 1 {
                topic
                    .unknown_tagged_fields
                    .insert(7, Bytes::from_static(b"topic tag"));
            }
            r.responses.push(topic);
        }
        if version >= 16 && seed % 2 == 1 {
            r.node_endpoints = vec![NodeEndpoint::default()
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("h"))
                .with_port(9092)];
        }
        if version >= 12 && seed % 5 == 0 {
            r.unknown_tagged_fields
                .insert(9, Bytes::from_static(b"response tag"));
        }
        r
    }

    fn encode(r: &FetchResponse, version: i16) -> Bytes {
        let mut out = BytesMut::new();
        r.encode(&mut out, version).expect("encodes");
        out.freeze()
    }

    /// The parts `kafka-protocol`'s whole decode gives, in wire order.
    fn expected(r: &FetchResponse) -> Vec<Part> {
        let mut parts = vec![Part::Head {
            throttle_time_ms: r.throttle_time_ms,
            error_code: r.error_code,
            session_id: r.session_id,
        }];
        for t in &r.responses {
            parts.push(Part::Topic {
                name: t.topic.clone(),
                id: t.topic_id,
            });
            parts.extend(t.partitions.iter().cloned().map(Part::Partition));
        }
        parts.push(Part::End);
        parts
    }

    /// Feeds `body` in prefixes ending at each of `cuts` (then whole) and collects the parts.
    fn scan(version: i16, body: &Bytes, cuts: &[usize]) -> Result<Vec<Part>, FrameError> {
        let mut s = FetchParts::new(version);
        let mut parts = Vec::new();
        for &cut in cuts.iter().filter(|c| **c < body.len()) {
            let prefix = body.slice(..cut);
            while let Some(p) = s.next(&prefix, body.len(), false)? {
                assert!(!matches!(p, Part::End), "End only with the whole body");
                parts.push(p);
            }
        }
        while let Some(p) = s.next(body, body.len(), true)? {
            let end = matches!(p, Part::End);
            parts.push(p);
            if end {
                assert_eq!(s.consumed(), body.len());
                return Ok(parts);
            }
        }
        unreachable!("a whole body ends in End or an error")
    }

    // Goal: the allocation-free pre-check says an entry fits exactly when the prefix holds all
    // of it, for every version and every entry shape `response` makes (aborted transactions,
    // diverging epochs, tagged fields), so early reading is neither skipped nor delayed.
    // Method: each partition entry encoded on its own, every prefix length checked.
    proptest! {
        #[test]
        fn an_entry_fits_exactly_when_the_prefix_holds_all_of_it(
            version in api::FETCH.min..=api::FETCH.max,
            seed in any::<u64>(),
        ) {
            for topic in response(version, seed).responses {
                for mut pd in topic.partitions {
                    if version >= 12 && seed % 4 == 0 {
                        pd.unknown_tagged_fields.insert(11, Bytes::from_static(b"entry tag"));
                    }
                    let mut entry = BytesMut::new();
                    pd.encode(&mut entry, version).expect("encodes");
                    let parts = FetchParts::new(version);
                    let entry = entry.freeze();
                    for k in 0..=entry.len() {
                        let short = matches!(
                            parts.partition_entry_whole(&entry.slice(..k)),
                            Err(Short(_))
                        );
                        prop_assert_eq!(
                            short,
                            k < entry.len(),
                            "version {} prefix {} of {}", version, k, entry.len()
                        );
                    }
                }
            }
        }
    }

    // Goal: for every Fetch version we send, the parts read from any sequence of prefixes are
    // exactly what kafka-protocol decodes from the whole body, whatever the split points.
    proptest! {
        #[test]
        fn parts_match_whole_decode_for_any_split(
            version in api::FETCH.min..=api::FETCH.max,
            seed in any::<u64>(),
            mut cuts in proptest::collection::vec(0usize..4000, 0..12),
        ) {
            let r = response(version, seed);
            let body = encode(&r, version);
            let decoded = FetchResponse::decode(&mut body.clone(), version).expect("decodes");
            cuts.sort_unstable();
            let parts = scan(version, &body, &cuts).expect("a valid body scans");
            prop_assert_eq!(parts, expected(&decoded));
        }
    }

    // Goal: byte by byte, the scanner never hands out a part before all of its bytes arrived,
    // and gives the same parts as the whole body at once.
    #[test]
    fn byte_by_byte_equals_whole() {
        for version in api::FETCH.min..=api::FETCH.max {
            for seed in [5u64, 0x1f7, 0x3ff_f0e] {
                let body = encode(&response(version, seed), version);
                let cuts: Vec<usize> = (0..body.len()).collect();
                assert_eq!(
                    scan(version, &body, &cuts).unwrap(),
                    scan(version, &body, &[]).unwrap(),
                    "v{version} seed {seed}"
                );
            }
        }
    }

    // Goal: a cut-off or overlong body is the error the whole decode gave; a count that the
    // whole body cannot hold fails at once, even from a prefix.
    #[test]
    fn malformed_bodies_fail_with_the_whole_and_lying_counts_at_once() {
        let version = 12;
        let body = encode(&response(version, 0x1f7), version);
        let cut = body.slice(..body.len() - 1);
        assert!(scan(version, &cut, &[]).is_err());
        let mut long = BytesMut::from(&body[..]);
        long.extend_from_slice(b"x");
        assert!(matches!(
            scan(version, &long.freeze(), &[]),
            Err(FrameError::LeftoverBytes { left: 1, .. })
        ));
        // throttle, error, session, then a topics count of 2^20 - 1 in a 20-byte body.
        let lying = Bytes::from_static(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x3f, 0]);
        let mut s = FetchParts::new(version);
        assert!(matches!(
            s.next(&lying, 20, false),
            Err(FrameError::Body { .. })
        ));
    }
}
