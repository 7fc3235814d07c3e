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
    /// The whole call's deadline passed (connect, handshake and every read and write count).
    #[error("{addr} did not answer within the call's deadline")]
    Deadline { addr: SocketAddr },
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

    /// The source did not answer in time: the call's deadline passed, or a connect, read or
    /// write timed out (a black-holed or frozen broker, not a refusal).
    pub fn is_timeout(&self) -> bool {
        match self {
            BlockingError::Deadline { .. } => true,
            BlockingError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
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
    /// When the whole call must be over: each read and write may take only what is left.
    deadline: Option<Instant>,
    /// The per-read/write timeout when there is time left.
    io_timeout: Duration,
}

impl Socket {
    /// Sets the socket's read and write timeouts to what is left of the deadline (at most the
    /// per-operation timeout); fails once it passed.
    fn arm(&self) -> Result<(), BlockingError> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BlockingError::Deadline { addr: self.addr });
        }
        let t = Some(left.min(self.io_timeout));
        let io = |source| BlockingError::Io {
            addr: self.addr,
            source,
        };
        self.stream.set_read_timeout(t).map_err(io)?;
        self.stream.set_write_timeout(t).map_err(io)?;
        Ok(())
    }

    /// An i/o error of this socket; a timeout once the deadline passed is the deadline's.
    fn io_error(&self, source: std::io::Error) -> BlockingError {
        let past = self.deadline.is_some_and(|d| Instant::now() >= d);
        let timeout = matches!(
            source.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        );
        if past && timeout {
            BlockingError::Deadline { addr: self.addr }
        } else {
            BlockingError::Io {
                addr: self.addr,
                source,
            }
        }
    }

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
                socket.arm()?;
                socket
                    .stream
                    .write_all(&out)
                    .map_err(|e| socket.io_error(e))?;
            }
            if status == LinkStatus::Ready {
                break;
            }
            socket.arm()?;
            let n = read_some(&mut socket.stream, &mut buf).map_err(|e| socket.io_error(e))?;
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
        Socket::connect_by(addr, connect, io, None)
    }

    /// Connects within `connect` (cut to what is left of `deadline`), reads and writes within
    /// `io` each, and nothing after `deadline`.
    fn connect_by(
        addr: &str,
        connect: Duration,
        io: Duration,
        deadline: Option<Instant>,
    ) -> Result<Socket, BlockingError> {
        let sock = addr
            .to_socket_addrs()
            .map_err(|_| BlockingError::Resolve(addr.to_owned()))?
            .next()
            .ok_or_else(|| BlockingError::Resolve(addr.to_owned()))?;
        let io_timeout = io;
        let timeout = Some(io);
        let connect = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(BlockingError::Deadline { addr: sock });
                }
                connect.min(left)
            }
            None => connect,
        };
        let io = |source| BlockingError::Io { addr: sock, source };
        let stream = TcpStream::connect_timeout(&sock, connect).map_err(|e| {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                BlockingError::Deadline { addr: sock }
            } else {
                io(e)
            }
        })?;
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(timeout).map_err(io)?;
        stream.set_write_timeout(timeout).map_err(io)?;
        let socket = Socket {
            addr: sock,
            stream,
            inbuf: BytesMut::with_capacity(64 * 1024),
            tls: None,
            deadline,
            io_timeout,
        };
        socket.arm()?;
        Ok(socket)
    }

    fn write_all(&mut self, out: &mut BytesMut) -> Result<(), BlockingError> {
        let addr = self.addr;
        self.arm()?;
        match &mut self.tls {
            Some(link) => {
                link.seal(out)
                    .map_err(|source| BlockingError::Security { addr, source })?;
                if let Some(sealed) = link.take_outgoing() {
                    if let Err(e) = self.stream.write_all(&sealed) {
                        return Err(self.io_error(e));
                    }
                }
            }
            None => {
                if let Err(e) = self.stream.write_all(out) {
                    return Err(self.io_error(e));
                }
            }
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
            self.arm()?;
            let n = match read_some(&mut self.stream, &mut buf) {
                Ok(n) => n,
                Err(e) => return Err(self.io_error(e)),
            };
            if n == 0 {
                return Err(BlockingError::Closed { addr });
            }
            let link = self.tls.as_mut().expect("called on TLS sockets");
            link.receive(&buf[..n]).map_err(sec)?;
            if let Some(out) = link.take_outgoing() {
                self.arm()?;
                if let Err(e) = self.stream.write_all(&out) {
                    return Err(self.io_error(e));
                }
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
            self.arm()?;
            self.inbuf.resize(need.max(have + 4096), 0);
            let n = match read_some(&mut self.stream, &mut self.inbuf[have..]) {
                Ok(n) => n,
                Err(e) => {
                    self.inbuf.truncate(have);
                    return Err(self.io_error(e));
                }
            };
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

    /// Connect, secure and negotiate as `connect_secure`, all of it and every later request
    /// on this client over by `deadline`: the connect takes at most
    /// `BLOCKING_CONNECT_TIMEOUT_MS` and each read or write at most `io_timeout`, both cut to
    /// what is left (the control plane's source workers call the source only like this, with
    /// the request timeout as `io_timeout`).
    pub fn connect_by(
        addr: &str,
        client_id: &str,
        security: &SourceSecurity,
        io_timeout: Duration,
        deadline: Instant,
    ) -> Result<BlockingClient, BlockingError> {
        let socket = Socket::connect_by(
            addr,
            Duration::from_millis(BLOCKING_CONNECT_TIMEOUT_MS),
            io_timeout.max(Duration::from_millis(1)),
            Some(deadline),
        )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that accepts and never answers (a black-holed broker): the whole call ends
    /// at its deadline, not at the per-read timeout, and says so.
    #[test]
    fn a_call_to_a_silent_broker_ends_at_its_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // Accepted by the kernel's backlog; nothing is ever read or written.
        let started = Instant::now();
        let deadline = started + Duration::from_millis(300);
        let err = BlockingClient::connect_by(
            &addr,
            "test",
            &SourceSecurity::default(),
            Duration::from_secs(30),
            deadline,
        )
        .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert!(matches!(err, BlockingError::Deadline { .. }), "{err}");
        // Liveness bound: far below the 30 s per-read timeout it would otherwise wait.
        assert!(started.elapsed() < Duration::from_secs(10));
        drop(listener);
    }
}
