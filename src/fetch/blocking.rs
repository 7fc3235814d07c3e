//! A blocking driver for the sans-IO source client, over `std::net::TcpStream` with timeouts.
//!
//! For the control thread (bootstrap, metadata, ListOffsets) and for tests. It owns only the
//! socket and buffers; framing, correlation, version choice and all fetch logic are the same
//! code the io_uring shards drive.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
use kafka_protocol::protocol::Request;

use crate::fetch::conn::{ConnError, Connection};
use crate::fetch::fetcher::{FetchConfig, FetchEvent, Fetcher, FetcherError, Poll};
use crate::fetch::metadata::{self, ClusterMetadata, MetadataError};
use crate::fetch::security::{LinkStatus, SecureLink, SecurityError, SourceSecurity};
use crate::fetch::versions::{self, Negotiation, Versions, VersionsError};
use crate::limits::{BLOCKING_CONNECT_TIMEOUT_MS, BLOCKING_IO_TIMEOUT_MS};
use crate::wire::api;
use crate::wire::frame::{self, FrameError};

#[derive(Debug, thiserror::Error)]
pub enum BlockingError {
    #[error("cannot resolve {0}")]
    Resolve(String),
    #[error("i/o with {addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{addr} closed the connection")]
    Closed { addr: SocketAddr },
    #[error(transparent)]
    Conn(#[from] ConnError),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Versions(#[from] VersionsError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Fetcher(#[from] FetcherError),
    #[error("ApiVersions negotiation did not settle")]
    NegotiationLoop,
    #[error("{addr}: {source}")]
    Security {
        addr: SocketAddr,
        source: SecurityError,
    },
}

impl BlockingError {
    /// The source refused our credentials or certificates (retrying cannot help).
    pub fn is_authentication(&self) -> bool {
        matches!(self, BlockingError::Security { source, .. } if source.is_authentication())
    }
}

/// The host part of `host:port` (IPv6 brackets removed), as the TLS server name.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A TCP stream with an input buffer that yields whole frames; on TLS connections the bytes
/// pass through the link.
#[derive(Debug)]
struct Socket {
    addr: SocketAddr,
    stream: TcpStream,
    inbuf: BytesMut,
    tls: Option<SecureLink>,
}

impl Socket {
    fn connect_secure(
        addr: &str,
        security: &SourceSecurity,
        client_id: &str,
    ) -> Result<Socket, BlockingError> {
        Socket::connect(addr)?.secure(addr, security, client_id)
    }

    /// Runs the TLS handshake and SASL authentication `security` asks for on a connected
    /// socket (nothing for PLAINTEXT).
    fn secure(
        self,
        addr: &str,
        security: &SourceSecurity,
        client_id: &str,
    ) -> Result<Socket, BlockingError> {
        let mut socket = self;
        if security.is_plaintext() {
            return Ok(socket);
        }
        let sock = socket.addr;
        let sec = |source| BlockingError::Security { addr: sock, source };
        let mut link = SecureLink::new(security, host_of(addr), client_id).map_err(sec)?;
        let mut status = link.start().map_err(sec)?;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            if let Some(out) = link.take_outgoing() {
                socket
                    .stream
                    .write_all(&out)
                    .map_err(|source| BlockingError::Io { addr: sock, source })?;
            }
            if status == LinkStatus::Ready {
                break;
            }
            let n = read_some(&mut socket.stream, &mut buf)
                .map_err(|source| BlockingError::Io { addr: sock, source })?;
            if n == 0 {
                return Err(BlockingError::Closed { addr: sock });
            }
            status = link.receive(&buf[..n]).map_err(sec)?;
        }
        if link.uses_tls() {
            socket.tls = Some(link);
        }
        Ok(socket)
    }

    fn connect(addr: &str) -> Result<Socket, BlockingError> {
        Socket::connect_within(
            addr,
            Duration::from_millis(BLOCKING_CONNECT_TIMEOUT_MS),
            Duration::from_millis(BLOCKING_IO_TIMEOUT_MS),
        )
    }

    fn connect_within(
        addr: &str,
        connect: Duration,
        io: Duration,
    ) -> Result<Socket, BlockingError> {
        let sock = addr
            .to_socket_addrs()
            .map_err(|_| BlockingError::Resolve(addr.to_owned()))?
            .next()
            .ok_or_else(|| BlockingError::Resolve(addr.to_owned()))?;
        let timeout = Some(io);
        let io = |source| BlockingError::Io { addr: sock, source };
        let stream = TcpStream::connect_timeout(&sock, connect).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(timeout).map_err(io)?;
        stream.set_write_timeout(timeout).map_err(io)?;
        Ok(Socket {
            addr: sock,
            stream,
            inbuf: BytesMut::with_capacity(64 * 1024),
            tls: None,
        })
    }

    fn write_all(&mut self, out: &mut BytesMut) -> Result<(), BlockingError> {
        let addr = self.addr;
        let io = |source| BlockingError::Io { addr, source };
        match &mut self.tls {
            Some(link) => {
                link.seal(out)
                    .map_err(|source| BlockingError::Security { addr, source })?;
                if let Some(sealed) = link.take_outgoing() {
                    self.stream.write_all(&sealed).map_err(io)?;
                }
            }
            None => self.stream.write_all(out).map_err(io)?,
        }
        out.clear();
        Ok(())
    }

    /// TLS: decrypt until one whole frame is there.
    fn read_tls_frame(&mut self) -> Result<Bytes, BlockingError> {
        let addr = self.addr;
        let sec = |source| BlockingError::Security { addr, source };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let link = self.tls.as_mut().expect("called on TLS sockets");
            if let Some(frame) = link.next_frame()? {
                return Ok(frame);
            }
            let n = read_some(&mut self.stream, &mut buf)
                .map_err(|source| BlockingError::Io { addr, source })?;
            if n == 0 {
                return Err(BlockingError::Closed { addr });
            }
            link.receive(&buf[..n]).map_err(sec)?;
            if let Some(out) = link.take_outgoing() {
                self.stream
                    .write_all(&out)
                    .map_err(|source| BlockingError::Io { addr, source })?;
            }
        }
    }

    /// Read until one whole response frame is buffered and return its body.
    fn read_frame(&mut self) -> Result<Bytes, BlockingError> {
        if self.tls.is_some() {
            return self.read_tls_frame();
        }
        let addr = self.addr;
        loop {
            if let Some(frame) = frame::split_frame(&mut self.inbuf)? {
                return Ok(frame);
            }
            let need = match frame::body_len(&self.inbuf)? {
                Some(len) => frame::LENGTH_PREFIX_BYTES + len,
                None => frame::LENGTH_PREFIX_BYTES,
            };
            let have = self.inbuf.len();
            // Grow to the announced frame size (already bounded by FRAME_BYTES_MAX).
            self.inbuf.resize(need.max(have + 4096), 0);
            let n = read_some(&mut self.stream, &mut self.inbuf[have..]).map_err(|source| {
                self.inbuf.truncate(have);
                BlockingError::Io { addr, source }
            })?;
            self.inbuf.truncate(have + n);
            if n == 0 {
                return Err(BlockingError::Closed { addr });
            }
        }
    }
}

/// `read` that retries when a signal interrupted it (EINTR): a signal delivered to the process
/// (a child exiting, a handler) is no fault of the source.
fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// One blocking connection to a source broker, with negotiated versions.
#[derive(Debug)]
pub struct BlockingClient {
    socket: Socket,
    pub conn: Connection,
    pub versions: Versions,
    out: BytesMut,
}

impl BlockingClient {
    /// Connect over PLAINTEXT and negotiate API versions.
    pub fn connect(addr: &str, client_id: &str) -> Result<BlockingClient, BlockingError> {
        Self::connect_secure(addr, client_id, &SourceSecurity::default())
    }

    /// Connect, secure the connection (TLS handshake, SASL authentication) as `security`
    /// says, and negotiate API versions.
    pub fn connect_secure(
        addr: &str,
        client_id: &str,
        security: &SourceSecurity,
    ) -> Result<BlockingClient, BlockingError> {
        BlockingClient::with_socket(
            Socket::connect_secure(addr, security, client_id)?,
            client_id,
        )
    }

    /// `connect` with the connect and per-read/write timeouts bounded by `timeout` (for calls
    /// that must give up quickly on a dead source, such as the last group sync at failover).
    pub fn connect_within(
        addr: &str,
        client_id: &str,
        timeout: Duration,
    ) -> Result<BlockingClient, BlockingError> {
        let timeout = timeout.max(Duration::from_millis(1));
        BlockingClient::with_socket(Socket::connect_within(addr, timeout, timeout)?, client_id)
    }

    /// `connect_secure` with the connect and per-read/write timeouts bounded by `timeout`.
    pub fn connect_secure_within(
        addr: &str,
        client_id: &str,
        security: &SourceSecurity,
        timeout: Duration,
    ) -> Result<BlockingClient, BlockingError> {
        let timeout = timeout.max(Duration::from_millis(1));
        let socket = Socket::connect_within(addr, timeout, timeout)?;
        BlockingClient::with_socket(socket.secure(addr, security, client_id)?, client_id)
    }

    fn with_socket(socket: Socket, client_id: &str) -> Result<BlockingClient, BlockingError> {
        let placeholder = Versions {
            api_versions: 0,
            metadata: api::METADATA.min,
            fetch: api::FETCH.min,
            list_offsets: api::LIST_OFFSETS.min,
            offset_for_leader_epoch: api::OFFSET_FOR_LEADER_EPOCH.min,
        };
        let mut client = BlockingClient {
            socket,
            conn: Connection::new(client_id),
            versions: placeholder,
            out: BytesMut::with_capacity(64 * 1024),
        };
        client.versions = client.negotiate()?;
        Ok(client)
    }

    pub fn addr(&self) -> SocketAddr {
        self.socket.addr
    }

    fn negotiate(&mut self) -> Result<Versions, BlockingError> {
        let mut version = api::API_VERSIONS.max;
        // Each retry strictly lowers the version, so this ends within max+1 rounds.
        for _ in 0..=api::API_VERSIONS.max {
            self.conn.encode(
                &mut self.out,
                version,
                &versions::api_versions_request(version),
            )?;
            self.flush()?;
            let frame = self.read_frame()?;
            let (_, body) = self.conn.accept::<ApiVersionsRequest>(frame)?;
            let resp = versions::decode_api_versions(body, version)?;
            match versions::negotiate(&resp, version)? {
                Negotiation::Done(v) => return Ok(v),
                Negotiation::RetryWith(lower) if lower < version => version = lower,
                Negotiation::RetryWith(_) => break,
            }
        }
        Err(BlockingError::NegotiationLoop)
    }

    /// Write every byte in the outgoing buffer.
    pub fn flush(&mut self) -> Result<(), BlockingError> {
        self.socket.write_all(&mut self.out)
    }

    /// The buffer requests are framed into; `flush` sends it.
    pub fn out_buf(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// Read one whole response frame and return its body.
    pub fn read_frame(&mut self) -> Result<Bytes, BlockingError> {
        self.socket.read_frame()
    }

    /// Wait out a throttle the broker asked for.
    fn honour_throttle(&self) {
        let now = Instant::now();
        if let Some(until) = self.conn.throttled_until(now) {
            std::thread::sleep(until - now);
        }
    }

    /// Send one request and wait for its response.
    pub fn request<R: Request>(
        &mut self,
        version: i16,
        body: &R,
    ) -> Result<R::Response, BlockingError> {
        self.honour_throttle();
        self.conn.encode(&mut self.out, version, body)?;
        self.flush()?;
        let frame = self.read_frame()?;
        Ok(self.conn.decode::<R>(frame)?)
    }

    /// ListOffsets for partitions this broker leads.
    pub fn list_offsets(
        &mut self,
        tps: &[crate::ids::TopicPartition],
        query: crate::fetch::list_offsets::OffsetQuery,
    ) -> Result<
        Vec<(
            crate::ids::TopicPartition,
            crate::fetch::list_offsets::Listed,
        )>,
        BlockingError,
    > {
        use crate::fetch::list_offsets;
        let req = list_offsets::request(tps, query);
        let resp = self.request::<kafka_protocol::messages::ListOffsetsRequest>(
            self.versions.list_offsets,
            &req,
        )?;
        Ok(list_offsets::answers(tps, &resp))
    }

    /// Metadata for the named topics, or all topics.
    pub fn metadata(&mut self, topics: Option<&[&str]>) -> Result<ClusterMetadata, BlockingError> {
        let req = metadata::metadata_request(topics);
        let resp = self.request::<MetadataRequest>(self.versions.metadata, &req)?;
        Ok(metadata::parse_metadata(&resp)?)
    }
}

/// What one step of a blocking fetch loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A request went out and its response was handled (see the events).
    Exchanged,
    /// The fetcher asked to wait (throttle or backoff); the driver slept until then.
    Waited,
    /// Nothing to fetch.
    Idle,
}

/// Drives a sans-IO `Fetcher` over its own blocking socket: the same code path as the shards,
/// with std I/O. For tools and tests.
#[derive(Debug)]
pub struct BlockingFetcher {
    socket: Socket,
    pub fetcher: Fetcher,
    out: BytesMut,
}

impl BlockingFetcher {
    /// Connect to a broker whose versions are already known (from a `BlockingClient`).
    pub fn connect(
        addr: &str,
        versions: Versions,
        config: FetchConfig,
        client_id: &str,
    ) -> Result<BlockingFetcher, BlockingError> {
        Ok(BlockingFetcher {
            socket: Socket::connect(addr)?,
            fetcher: Fetcher::new(config, versions, client_id)?,
            out: BytesMut::with_capacity(64 * 1024),
        })
    }

    /// One request/response exchange, or one wait. Events are appended to `events`.
    pub fn step(&mut self, events: &mut Vec<FetchEvent>) -> Result<Step, BlockingError> {
        let now = Instant::now();
        match self.fetcher.poll_request(&mut self.out, now)? {
            Poll::Sent(_) => {
                let frame = self
                    .socket
                    .write_all(&mut self.out)
                    .and_then(|()| self.socket.read_frame());
                match frame {
                    Ok(frame) => {
                        self.fetcher
                            .handle_response(frame, Instant::now(), events)?;
                        Ok(Step::Exchanged)
                    }
                    Err(e) => {
                        self.fetcher.connection_lost(Instant::now());
                        Err(e)
                    }
                }
            }
            Poll::NotBefore(t) => {
                std::thread::sleep(t.saturating_duration_since(now));
                Ok(Step::Waited)
            }
            Poll::AwaitingResponse => Err(ConnError::UnexpectedResponse.into()),
            Poll::Idle => Ok(Step::Idle),
        }
    }
}
