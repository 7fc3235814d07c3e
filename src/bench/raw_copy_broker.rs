//! The raw-copy limit against a real Kafka broker: the same Fetch requests a mirror sends
//! (READ_UNCOMMITTED, replica id -1, the same byte budgets, KIP-227 incremental fetch sessions)
//! with every response written to a file as it came. Against the synthetic source the raw copy
//! knows where each partition's next fetch starts from the source's own planner; a real broker
//! has no such plan, so this client reads what it must and nothing more: the response's
//! structure (to find each partition's records) and each batch's 61-byte header (its last
//! offset). No CRC, no index, no log. Its MB/s is what the broker can serve with those
//! requests, the denominator of kmirror's outage catch-up (`benches/outage_catchup.sh`).
//!
//! Fetch v12 addresses topics by name, so no Metadata call is needed; every broker from 2.7 to
//! 4.x takes it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::raw_copy::run_connections;
use super::SynthError;
use crate::limits::{FETCH_RESPONSE_BYTES_MAX, FRAME_BYTES_MAX};
use crate::wire::batch::Batches;
use crate::wire::frame::{decode_response, encode_request, LENGTH_PREFIX_BYTES};

/// The Fetch version this client speaks: topic names (v13 moved to topic ids), sessions (v7+).
pub const BROKER_FETCH_VERSION: i16 = 12;
/// Kafka's FETCH_SESSION_ID_NOT_FOUND and INVALID_FETCH_SESSION_EPOCH: the broker evicted or
/// lost the session; the next request opens a new one with a full fetch.
const SESSION_LOST: [i16; 2] = [70, 71];

/// What to copy from which broker.
#[derive(Debug, Clone)]
pub struct BrokerCopyConfig {
    /// The broker leading every partition copied (a single-broker source).
    pub bootstrap: String,
    pub topic: String,
    pub partitions: u32,
    pub max_bytes: i32,
    pub partition_max_bytes: i32,
    pub max_wait_ms: i32,
    /// Connections, each copying an equal share of the partitions on its own thread.
    pub connections: usize,
    /// KIP-227 incremental fetch sessions, as kmirror uses against every source that has them.
    pub sessions: bool,
    /// Directory for one output file per connection; `None` discards the bytes.
    pub out_dir: Option<PathBuf>,
    /// Stop after this long (checked between responses).
    pub duration: Duration,
}

impl BrokerCopyConfig {
    pub fn new(bootstrap: impl Into<String>, topic: impl Into<String>, partitions: u32) -> Self {
        BrokerCopyConfig {
            bootstrap: bootstrap.into(),
            topic: topic.into(),
            partitions,
            max_bytes: FETCH_RESPONSE_BYTES_MAX as i32,
            partition_max_bytes: 1024 * 1024,
            max_wait_ms: 500,
            connections: 1,
            sessions: true,
            out_dir: None,
            duration: Duration::from_secs(600),
        }
    }
}

/// What one run moved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BrokerCopyReport {
    /// Whole record batches received: the bytes a mirror's `.log` files would hold.
    pub record_bytes: u64,
    /// Response bytes received and written, framing included.
    pub response_bytes: u64,
    pub responses: u64,
    pub elapsed: Duration,
    /// User + system CPU of the whole process during the copy; `None` without /proc.
    pub cpu_seconds: Option<f64>,
}

impl BrokerCopyReport {
    pub fn mb_per_s(&self) -> f64 {
        self.record_bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn cpu_seconds_per_gb(&self) -> Option<f64> {
        let gb = self.record_bytes as f64 / 1e9;
        self.cpu_seconds.filter(|_| gb > 0.0).map(|c| c / gb)
    }
}

/// Copies every partition from offset 0 until each has reached the high watermark the broker
/// reported for it, and sums the connections' figures.
pub fn run(config: &BrokerCopyConfig) -> Result<BrokerCopyReport, SynthError> {
    if config.connections == 0 || config.partitions == 0 {
        return Err(SynthError::BadSpec(
            "at least one connection and one partition are needed".into(),
        ));
    }
    let partitions: Vec<i32> = (0..config.partitions as i32).collect();
    let (reports, elapsed, cpu_seconds) =
        run_connections(config.connections, &partitions, |i, mine| {
            copy_connection(config, i, mine)
        });
    let mut total = BrokerCopyReport {
        elapsed,
        cpu_seconds,
        ..BrokerCopyReport::default()
    };
    for r in reports {
        let r = r?;
        total.record_bytes += r.record_bytes;
        total.response_bytes += r.response_bytes;
        total.responses += r.responses;
    }
    Ok(total)
}

/// One partition's position as this client tracks it.
#[derive(Debug, Clone, Copy)]
struct Progress {
    partition: i32,
    next: i64,
    high_watermark: Option<i64>,
    /// Its fetch offset moved since the last request told the session.
    changed: bool,
}

impl Progress {
    fn done(&self) -> bool {
        self.high_watermark.is_some_and(|h| self.next >= h)
    }
}

/// The client side of a KIP-227 session: id 0 and epoch 0 open one with a full fetch; every
/// later request names only the partitions whose fetch offset moved, with the next epoch.
#[derive(Debug, Clone, Copy, Default)]
struct SessionState {
    id: i32,
    epoch: i32,
}

fn build_request(
    config: &BrokerCopyConfig,
    session: Option<SessionState>,
    parts: &mut [Progress],
) -> FetchRequest {
    // Incremental: only the partitions whose offset moved. Full (opening a session, or without
    // sessions): every partition not done yet.
    let incremental = session.is_some_and(|s| s.epoch > 0);
    let mut topic = FetchTopic::default();
    topic.topic = TopicName(StrBytes::from_string(config.topic.clone()));
    for p in parts.iter_mut() {
        let include = if incremental { p.changed } else { !p.done() };
        p.changed = false;
        if include {
            topic.partitions.push(
                FetchPartition::default()
                    .with_partition(p.partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(p.next)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(config.partition_max_bytes),
            );
        }
    }
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(-1);
    req.isolation_level = 0;
    req.max_wait_ms = config.max_wait_ms;
    req.min_bytes = 1;
    req.max_bytes = config.max_bytes;
    let (id, epoch) = match session {
        Some(s) => (s.id, s.epoch),
        None => (0, -1), // FINAL_EPOCH without a session id: sessionless full fetches
    };
    req.session_id = id;
    req.session_epoch = epoch;
    if !topic.partitions.is_empty() || !incremental {
        req.topics.push(topic);
    }
    req
}

fn copy_connection(
    config: &BrokerCopyConfig,
    index: usize,
    partitions: Vec<i32>,
) -> Result<BrokerCopyReport, SynthError> {
    let mut report = BrokerCopyReport::default();
    if partitions.is_empty() {
        return Ok(report);
    }
    let mut stream = TcpStream::connect(&config.bootstrap)?;
    stream.set_nodelay(true)?;
    let mut out: Option<File> = match &config.out_dir {
        Some(dir) => Some(File::create(
            dir.join(format!("raw-copy-broker-{index}.bin")),
        )?),
        None => None,
    };
    let by_partition: HashMap<i32, usize> = partitions
        .iter()
        .enumerate()
        .map(|(k, &p)| (p, k))
        .collect();
    let mut parts: Vec<Progress> = partitions
        .iter()
        .map(|&partition| Progress {
            partition,
            next: 0,
            high_watermark: None,
            changed: true,
        })
        .collect();
    let client_id = StrBytes::from_static_str("kmirror-raw-copy");
    let mut session = config.sessions.then(SessionState::default);
    let mut request = BytesMut::new();
    let start = Instant::now();
    let mut correlation = 0i32;
    while start.elapsed() < config.duration && !parts.iter().all(Progress::done) {
        let req = build_request(config, session, &mut parts);
        request.clear();
        encode_request(
            &mut request,
            BROKER_FETCH_VERSION,
            correlation,
            &client_id,
            &req,
        )
        .map_err(|e| SynthError::Encode {
            what: "fetch request",
            reason: e.to_string(),
        })?;
        stream.write_all(&request)?;

        let frame = read_frame(&mut stream)?;
        if let Some(f) = out.as_mut() {
            f.write_all(&(frame.len() as i32).to_be_bytes())?;
            f.write_all(&frame)?;
        }
        report.response_bytes += (LENGTH_PREFIX_BYTES + frame.len()) as u64;
        report.responses += 1;
        let resp = decode_response::<FetchRequest>(frame, BROKER_FETCH_VERSION, correlation)
            .map_err(|e| SynthError::Decode {
                what: "fetch response",
                reason: e.to_string(),
            })?;
        correlation = correlation.wrapping_add(1).max(0);
        if SESSION_LOST.contains(&resp.error_code) {
            // A new session with a full fetch of everything not done.
            session = config.sessions.then(SessionState::default);
            continue;
        }
        if resp.error_code != 0 {
            return Err(broker_error("fetch", resp.error_code));
        }
        if let Some(s) = session.as_mut() {
            s.id = resp.session_id;
            s.epoch = s.epoch.wrapping_add(1).max(1);
        }
        for topic in resp.responses {
            for p in topic.partitions {
                let Some(&k) = by_partition.get(&p.partition_index) else {
                    continue;
                };
                if p.error_code != 0 {
                    return Err(broker_error("partition", p.error_code));
                }
                let progress = &mut parts[k];
                progress.high_watermark = Some(p.high_watermark);
                let Some(records) = p.records else { continue };
                // Whole batches only: a response may end inside one, which the next fetch
                // gets again from its start.
                for item in Batches::new(&records) {
                    let Ok((_, batch)) = item else { break };
                    report.record_bytes += batch.size() as u64;
                    let next = batch.next_offset().0;
                    if next > progress.next {
                        progress.next = next;
                        progress.changed = true;
                    }
                }
            }
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// One response frame body (length prefix stripped).
fn read_frame(stream: &mut TcpStream) -> Result<Bytes, SynthError> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    stream.read_exact(&mut prefix)?;
    let len = i32::from_be_bytes(prefix);
    if len < 0 || len as usize > FRAME_BYTES_MAX {
        return Err(SynthError::Decode {
            what: "response frame",
            reason: format!("length {len} outside 0..={FRAME_BYTES_MAX}"),
        });
    }
    let mut body = BytesMut::zeroed(len as usize);
    stream.read_exact(&mut body)?;
    Ok(body.freeze())
}

fn broker_error(level: &'static str, code: i16) -> SynthError {
    SynthError::Decode {
        what: "fetch response",
        reason: format!("{level} error code {code} from the broker"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(partition: i32, next: i64, hw: Option<i64>, changed: bool) -> Progress {
        Progress {
            partition,
            next,
            high_watermark: hw,
            changed,
        }
    }

    fn listed(req: &FetchRequest) -> Vec<(i32, i64)> {
        req.topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .map(|p| (p.partition, p.fetch_offset))
            .collect()
    }

    #[test]
    fn an_incremental_request_lists_only_moved_partitions_and_a_full_one_all_not_done() {
        let config = BrokerCopyConfig::new("x:1", "t", 3);
        let mut parts = vec![
            progress(0, 10, Some(10), false),
            progress(1, 5, Some(9), true),
            progress(2, 0, None, false),
        ];
        let full = build_request(&config, Some(SessionState { id: 0, epoch: 0 }), &mut parts);
        assert_eq!(listed(&full), vec![(1, 5), (2, 0)]);
        assert_eq!((full.session_id, full.session_epoch), (0, 0));
        assert!(parts.iter().all(|p| !p.changed));

        parts[2].next = 4;
        parts[2].changed = true;
        let inc = build_request(&config, Some(SessionState { id: 7, epoch: 3 }), &mut parts);
        assert_eq!(listed(&inc), vec![(2, 4)]);
        assert_eq!((inc.session_id, inc.session_epoch), (7, 3));

        // Nothing moved: an incremental request with no topics at all.
        let idle = build_request(&config, Some(SessionState { id: 7, epoch: 4 }), &mut parts);
        assert!(idle.topics.is_empty());

        let sessionless = build_request(&config, None, &mut parts);
        assert_eq!(listed(&sessionless), vec![(1, 5), (2, 4)]);
        assert_eq!((sessionless.session_id, sessionless.session_epoch), (0, -1));
        assert_eq!(sessionless.replica_id, BrokerId(-1));
    }
}
