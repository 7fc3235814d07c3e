//! The synthetic source's network side: one thread per connection, answering ApiVersions,
//! Metadata, ListOffsets, OffsetForLeaderEpoch and Fetch from the shared [`Catalog`]. It is a
//! bench tool, not the product, so plain blocking sockets are enough; what matters is that Fetch
//! responses go out with vectored writes straight from the template.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable, Message};
use kafka_protocol::ResponseError;

use super::fetch_response::{self, Planned, ResponseFrame};
use super::records::{Catalog, BASE_TIMESTAMP_MS};
use super::sessions::{self, SynthSessions};
use super::{SynthError, SynthSpec};
use crate::limits::{SYNTH_MAX_WAIT_MS_MAX, SYNTH_REQUEST_BYTES_MAX};

/// The node id the source advertises for itself (leader of every partition).
pub const NODE_ID: i32 = 0;
/// Cluster id in Metadata responses.
pub const CLUSTER_ID: &str = "kmirror-synthetic-source";

/// Highest ApiVersions version we answer; newer requests get UNSUPPORTED_VERSION in v0 layout.
const API_VERSIONS_MAX: i16 = 4;

/// A bound listener and the data it serves.
#[derive(Debug)]
pub struct SynthServer {
    listener: TcpListener,
    catalog: Arc<Catalog>,
    advertised: SocketAddr,
    sessions: SynthSessions,
    link: Option<Link>,
}

/// A long-distance link between the source and its client, emulated by the source: every Fetch
/// answer leaves a round trip after its request came in, at most at the link's rate.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    pub rtt: Duration,
    pub bytes_per_s: u64,
}

impl SynthServer {
    /// Builds the catalog (template compression happens here) and binds `addr`.
    pub fn bind(addr: impl ToSocketAddrs, spec: SynthSpec) -> Result<SynthServer, SynthError> {
        let catalog = Arc::new(Catalog::new(spec)?);
        let listener = TcpListener::bind(addr)?;
        let advertised = listener.local_addr()?;
        Ok(SynthServer {
            listener,
            catalog,
            advertised,
            sessions: SynthSessions::granted(),
            link: None,
        })
    }

    /// Answers Fetch requests as if across `link` (loopback has no delay tc can add here).
    pub fn over_link(mut self, link: Link) -> SynthServer {
        self.link = Some(link);
        self
    }

    /// Refuse fetch sessions (session id 0 to full fetches, FETCH_SESSION_ID_NOT_FOUND to
    /// incremental ones), as a broker with a full session cache does.
    pub fn without_fetch_sessions(mut self) -> SynthServer {
        self.sessions = SynthSessions::refusing();
        self
    }

    /// A handle on the source's fetch sessions, for their counters (tests, benchmarks).
    pub fn sessions(&self) -> SynthSessions {
        self.sessions.clone()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.advertised
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// Accepts connections forever, one thread each.
    pub fn run(self) -> Result<(), SynthError> {
        for stream in self.listener.incoming() {
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    continue;
                }
            };
            let catalog = Arc::clone(&self.catalog);
            let advertised = self.advertised;
            let sessions = self.sessions.clone();
            let link = self.link;
            thread::Builder::new()
                .name("synth-conn".into())
                .spawn(move || {
                    let peer = stream.peer_addr().ok();
                    let mut conn = Connection::new(stream, catalog, advertised, sessions);
                    conn.link = link;
                    if let Err(e) = conn.serve() {
                        tracing::info!("connection {peer:?} closed: {e}");
                    }
                })?;
        }
        Ok(())
    }

    /// Runs the accept loop on a background thread (tests, `kmirror bench`).
    pub fn spawn(self) -> Result<SocketAddr, SynthError> {
        let addr = self.local_addr();
        thread::Builder::new()
            .name("synth-accept".into())
            .spawn(move || {
                if let Err(e) = self.run() {
                    tracing::error!("synthetic source stopped: {e}");
                }
            })?;
        Ok(addr)
    }
}

struct Connection {
    stream: TcpStream,
    catalog: Arc<Catalog>,
    advertised: SocketAddr,
    sessions: SynthSessions,
    frame: ResponseFrame,
    served: Vec<fetch_response::Served>,
    planned: Vec<Planned>,
    out: Vec<u8>,
    link: Option<Link>,
}

/// Reads one length-prefixed frame; `None` on a clean close between frames.
pub fn read_frame(stream: &mut impl Read, max: usize) -> Result<Option<Vec<u8>>, SynthError> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = i32::from_be_bytes(len);
    if len < 0 {
        return Err(SynthError::NegativeFrame(len));
    }
    let len = len as usize;
    if len > max {
        return Err(SynthError::FrameTooLarge { size: len, max });
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(Some(body))
}

fn decode_err(what: &'static str) -> impl Fn(anyhow::Error) -> SynthError {
    move |e| SynthError::Decode {
        what,
        reason: e.to_string(),
    }
}

fn encode_err(what: &'static str) -> impl Fn(anyhow::Error) -> SynthError {
    move |e| SynthError::Encode {
        what,
        reason: e.to_string(),
    }
}

impl Connection {
    fn new(
        stream: TcpStream,
        catalog: Arc<Catalog>,
        advertised: SocketAddr,
        sessions: SynthSessions,
    ) -> Connection {
        Connection {
            stream,
            catalog,
            advertised,
            sessions,
            frame: ResponseFrame::default(),
            served: Vec::new(),
            planned: Vec::new(),
            out: Vec::new(),
            link: None,
        }
    }

    fn serve(mut self) -> Result<(), SynthError> {
        self.stream.set_nodelay(true)?;
        while let Some(body) = read_frame(&mut self.stream, SYNTH_REQUEST_BYTES_MAX)? {
            let mut body = Bytes::from(body);
            let header = decode_request_header_from_buffer(&mut body)
                .map_err(decode_err("request header"))?;
            let version = header.request_api_version;
            let key =
                ApiKey::try_from(header.request_api_key).map_err(|_| SynthError::Unsupported {
                    api_key: header.request_api_key,
                    api_version: version,
                })?;
            match key {
                ApiKey::ApiVersions => self.api_versions(&header, &mut body)?,
                ApiKey::Metadata => self.metadata(&header, &mut body)?,
                ApiKey::ListOffsets => self.list_offsets(&header, &mut body)?,
                ApiKey::Fetch => self.fetch(&header, &mut body)?,
                ApiKey::OffsetForLeaderEpoch => self.offset_for_leader_epoch(&header, &mut body)?,
                // Kafka closes the connection on a request it does not know; so do we.
                _ => {
                    return Err(SynthError::Unsupported {
                        api_key: header.request_api_key,
                        api_version: version,
                    })
                }
            }
        }
        Ok(())
    }

    fn check_version<M: Message>(header: &RequestHeader) -> Result<(), SynthError> {
        let v = header.request_api_version;
        if v < M::VERSIONS.min || v > M::VERSIONS.max {
            return Err(SynthError::Unsupported {
                api_key: header.request_api_key,
                api_version: v,
            });
        }
        Ok(())
    }

    /// Encodes header + body with the versions the request implies and writes the frame.
    fn send<R: Encodable>(
        &mut self,
        header: &RequestHeader,
        header_version: i16,
        body_version: i16,
        response: &R,
        what: &'static str,
    ) -> Result<(), SynthError> {
        self.out.clear();
        self.out.put_i32(0);
        ResponseHeader::default()
            .with_correlation_id(header.correlation_id)
            .encode(&mut self.out, header_version)
            .map_err(encode_err("response header"))?;
        response
            .encode(&mut self.out, body_version)
            .map_err(encode_err(what))?;
        let len = (self.out.len() - 4) as i32;
        self.out[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    fn api_versions(&mut self, header: &RequestHeader, body: &mut Bytes) -> Result<(), SynthError> {
        let v = header.request_api_version;
        let keys = vec![
            api_version::<ApiVersionsRequest>(ApiKey::ApiVersions, Some(API_VERSIONS_MAX)),
            api_version::<MetadataRequest>(ApiKey::Metadata, None),
            api_version::<ListOffsetsRequest>(ApiKey::ListOffsets, None),
            api_version::<FetchRequest>(ApiKey::Fetch, None),
            api_version::<OffsetForLeaderEpochRequest>(ApiKey::OffsetForLeaderEpoch, None),
        ];
        let mut response = ApiVersionsResponse::default().with_api_keys(keys);
        // ApiVersions always answers with response header v0, and a version we do not know gets
        // UNSUPPORTED_VERSION in the v0 layout so the client can retry lower.
        if !(0..=API_VERSIONS_MAX).contains(&v) {
            response.error_code = ResponseError::UnsupportedVersion.code();
            return self.send(header, 0, 0, &response, "ApiVersions response");
        }
        ApiVersionsRequest::decode(body, v).map_err(decode_err("ApiVersions request"))?;
        self.send(header, 0, v, &response, "ApiVersions response")
    }

    fn metadata(&mut self, header: &RequestHeader, body: &mut Bytes) -> Result<(), SynthError> {
        Self::check_version::<MetadataRequest>(header)?;
        let v = header.request_api_version;
        let req = MetadataRequest::decode(body, v).map_err(decode_err("Metadata request"))?;
        let spec = &self.catalog.spec;
        let wanted: Vec<(Option<usize>, Option<TopicName>)> = match &req.topics {
            // null (v1+) or empty (v0) means every topic
            None => spec
                .topics
                .iter()
                .enumerate()
                .map(|(i, _)| (Some(i), None))
                .collect(),
            Some(t) if t.is_empty() && v == 0 => spec
                .topics
                .iter()
                .enumerate()
                .map(|(i, _)| (Some(i), None))
                .collect(),
            Some(t) => t
                .iter()
                .map(|t| match &t.name {
                    Some(n) => (self.catalog.topic_index(n.as_str()), Some(n.clone())),
                    None => (self.catalog.topic_index_by_id(&t.topic_id), None),
                })
                .collect(),
        };
        let mut topics = Vec::new();
        for (index, asked_name) in wanted {
            let mut t = MetadataResponseTopic::default();
            match index {
                None => {
                    t.error_code = ResponseError::UnknownTopicOrPartition.code();
                    t.name = asked_name;
                }
                Some(i) => {
                    let name = &spec.topics[i];
                    t.name = Some(TopicName(StrBytes::from_string(name.clone())));
                    if v >= 10 {
                        t.topic_id = SynthSpec::topic_id(name);
                    }
                    t.partitions = (0..spec.partitions as i32)
                        .map(|p| {
                            let mut mp = MetadataResponsePartition::default()
                                .with_partition_index(p)
                                .with_leader_id(BrokerId(NODE_ID))
                                .with_replica_nodes(vec![BrokerId(NODE_ID)])
                                .with_isr_nodes(vec![BrokerId(NODE_ID)]);
                            if v >= 7 {
                                mp.leader_epoch = spec.leader_epoch;
                            }
                            mp
                        })
                        .collect();
                }
            }
            topics.push(t);
        }
        let mut response = MetadataResponse::default()
            .with_brokers(vec![MetadataResponseBroker::default()
                .with_node_id(BrokerId(NODE_ID))
                .with_host(StrBytes::from_string(self.advertised.ip().to_string()))
                .with_port(self.advertised.port() as i32)])
            .with_topics(topics);
        if v >= 1 {
            response.controller_id = BrokerId(NODE_ID);
        }
        if v >= 2 {
            response.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
        }
        let hv = ApiKey::Metadata.response_header_version(v);
        self.send(header, hv, v, &response, "Metadata response")
    }

    fn list_offsets(&mut self, header: &RequestHeader, body: &mut Bytes) -> Result<(), SynthError> {
        Self::check_version::<ListOffsetsRequest>(header)?;
        let v = header.request_api_version;
        let req = ListOffsetsRequest::decode(body, v).map_err(decode_err("ListOffsets request"))?;
        let c = &self.catalog;
        let rpb = c.records_per_batch();
        let topics = req
            .topics
            .iter()
            .map(|t| {
                let t_index = c.topic_index(t.name.as_str());
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut r = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index);
                        let Some(t_index) = t_index.filter(|_| {
                            p.partition_index >= 0 && (p.partition_index as u32) < c.spec.partitions
                        }) else {
                            r.error_code = ResponseError::UnknownTopicOrPartition.code();
                            return r;
                        };
                        let global =
                            t_index * c.spec.partitions as usize + p.partition_index as usize;
                        let end = c.partition_end(global, Instant::now()).0;
                        let (ts, off) = match p.timestamp {
                            -2 | -4 => (-1, 0),                           // earliest, earliest-local
                            -1 | -5 => (-1, end),                         // latest, latest-tiered
                            -3 => (BASE_TIMESTAMP_MS + rpb - 1, rpb - 1), // max timestamp
                            t if t <= BASE_TIMESTAMP_MS => (BASE_TIMESTAMP_MS, 0),
                            // Every batch repeats timestamps BASE..BASE+rpb, so the first
                            // record at or after t is in the first batch, if anywhere.
                            t if t < BASE_TIMESTAMP_MS + rpb => (t, t - BASE_TIMESTAMP_MS),
                            _ => (-1, -1),
                        };
                        r.timestamp = ts;
                        r.offset = off;
                        if v >= 4 {
                            r.leader_epoch = c.spec.leader_epoch;
                        }
                        r
                    })
                    .collect();
                ListOffsetsTopicResponse::default()
                    .with_name(t.name.clone())
                    .with_partitions(partitions)
            })
            .collect();
        let response = ListOffsetsResponse::default().with_topics(topics);
        let hv = ApiKey::ListOffsets.response_header_version(v);
        self.send(header, hv, v, &response, "ListOffsets response")
    }

    /// Every batch carries the one configured epoch from offset 0, so the answer follows
    /// Kafka's epoch-cache lookup over a single entry (E, 0): E itself ends at the log end, a
    /// later epoch is unknown, an earlier one ends where E starts.
    fn offset_for_leader_epoch(
        &mut self,
        header: &RequestHeader,
        body: &mut Bytes,
    ) -> Result<(), SynthError> {
        Self::check_version::<OffsetForLeaderEpochRequest>(header)?;
        let v = header.request_api_version;
        let req = OffsetForLeaderEpochRequest::decode(body, v)
            .map_err(decode_err("OffsetForLeaderEpoch request"))?;
        let c = &self.catalog;
        let epoch = c.spec.leader_epoch;
        let now = Instant::now();
        let topics = req
            .topics
            .iter()
            .map(|t| {
                let t_index = c.topic_index(t.topic.as_str());
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let mut r = EpochEndOffset::default()
                            .with_partition(p.partition)
                            .with_leader_epoch(-1)
                            .with_end_offset(-1);
                        let Some(t_index) = t_index.filter(|_| {
                            p.partition >= 0 && (p.partition as u32) < c.spec.partitions
                        }) else {
                            r.error_code = ResponseError::UnknownTopicOrPartition.code();
                            return r;
                        };
                        if p.current_leader_epoch >= 0 && p.current_leader_epoch < epoch {
                            r.error_code = ResponseError::FencedLeaderEpoch.code();
                            return r;
                        }
                        if p.current_leader_epoch > epoch {
                            r.error_code = ResponseError::UnknownLeaderEpoch.code();
                            return r;
                        }
                        let global = t_index * c.spec.partitions as usize + p.partition as usize;
                        let (e, end) = match p.leader_epoch {
                            x if x == epoch => (epoch, c.partition_end(global, now).0),
                            x if x < 0 || x > epoch => (-1, -1),
                            x => (x, 0),
                        };
                        r.leader_epoch = e;
                        r.end_offset = end;
                        r
                    })
                    .collect();
                OffsetForLeaderTopicResult::default()
                    .with_topic(t.topic.clone())
                    .with_partitions(partitions)
            })
            .collect();
        let response = OffsetForLeaderEpochResponse::default().with_topics(topics);
        let hv = ApiKey::OffsetForLeaderEpoch.response_header_version(v);
        self.send(header, hv, v, &response, "OffsetForLeaderEpoch response")
    }

    fn fetch(&mut self, header: &RequestHeader, body: &mut Bytes) -> Result<(), SynthError> {
        Self::check_version::<FetchRequest>(header)?;
        let v = header.request_api_version;
        let req = FetchRequest::decode(body, v).map_err(decode_err("Fetch request"))?;
        self.catalog.start_clock();
        let wait =
            Duration::from_millis((req.max_wait_ms.max(0) as u64).min(SYNTH_MAX_WAIT_MS_MAX));
        let deadline = Instant::now() + wait;
        // The session is applied once (its epoch moves on); reading may repeat while waiting.
        let context = self.sessions.begin(v, &req);
        let wanted = sessions::wanted(&context);
        loop {
            let now = Instant::now();
            let have = fetch_response::plan(
                &self.catalog,
                v,
                wanted,
                req.max_bytes,
                now,
                &mut self.planned,
            );
            if wanted.is_empty() || have >= req.min_bytes.max(0) as usize || now >= deadline {
                break;
            }
            // A rate-limited source answers as soon as a batch appears, as a broker's purgatory
            // would; otherwise the data never grows, and waiting only keeps a caught-up
            // consumer from spinning.
            match self.catalog.next_batch_at(now) {
                Some(next) => thread::sleep(next.min(deadline).saturating_duration_since(now)),
                None => {
                    thread::sleep(deadline - now);
                    break;
                }
            }
        }
        match self.sessions.finish(v, &context, &self.planned) {
            Ok((session_id, keep)) => fetch_response::encode(
                &self.catalog,
                header.correlation_id,
                v,
                session_id,
                wanted,
                &self.planned,
                keep.as_deref(),
                &mut self.frame,
                &mut self.served,
            )?,
            Err(code) => fetch_response::encode_error(
                &self.catalog,
                header.correlation_id,
                v,
                code,
                &mut self.frame,
            )?,
        }
        let body = self.catalog.template.body_after_offset();
        match self.link {
            None => self.frame.write_to(&mut self.stream, body)?,
            Some(link) => {
                thread::sleep(link.rtt);
                let mut paced = Paced::new(&mut self.stream, link.bytes_per_s);
                self.frame.write_to(&mut paced, body)?;
            }
        }
        for p in &self.planned {
            p.report_served(&self.catalog);
        }
        Ok(())
    }
}

fn api_version<M: Message>(key: ApiKey, cap: Option<i16>) -> ApiVersion {
    let max = cap.map_or(M::VERSIONS.max, |c| c.min(M::VERSIONS.max));
    ApiVersion::default()
        .with_api_key(key as i16)
        .with_min_version(M::VERSIONS.min)
        .with_max_version(max)
}

/// A writer that holds its rate to `bytes_per_s`, in chunks of `PACED_CHUNK_BYTES`.
struct Paced<'w, W: Write> {
    inner: &'w mut W,
    bytes_per_s: u64,
    started: Instant,
    sent: u64,
}

const PACED_CHUNK_BYTES: usize = 64 * 1024;

impl<'w, W: Write> Paced<'w, W> {
    fn new(inner: &'w mut W, bytes_per_s: u64) -> Paced<'w, W> {
        Paced {
            inner,
            bytes_per_s: bytes_per_s.max(1),
            started: Instant::now(),
            sent: 0,
        }
    }
}

impl<W: Write> Write for Paced<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let due = Duration::from_secs_f64(self.sent as f64 / self.bytes_per_s as f64);
        if let Some(wait) = due.checked_sub(self.started.elapsed()) {
            thread::sleep(wait);
        }
        let n = self.inner.write(&buf[..buf.len().min(PACED_CHUNK_BYTES)])?;
        self.sent += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
