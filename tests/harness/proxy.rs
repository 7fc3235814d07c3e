//! A fault-injecting TCP proxy between a Kafka client (kmirror) and one real broker, on std
//! threads. It forwards every byte unchanged except:
//! * Metadata responses: every broker is re-advertised at the proxy's own address, so the
//!   client's connections to the leader also go through the proxy;
//! * Fetch responses, per the chosen [`Fault`], for one partition index;
//! * while [`FaultProxy::sever`]ed, nothing at all: the broker looks unreachable (connections
//!   closed at their next frame, new ones closed on accept);
//!
//! * after [`FaultProxy::freeze`], nothing at all: a black hole (a partitioned network, a frozen
//!   data centre). Every socket stays open, nothing more is read or forwarded in either
//!   direction, and new connections are accepted and never answered.
//!
//! It frames both directions (4-byte length + body), remembers each request's api key and
//! version by correlation id, and decodes only the responses it changes with the
//! `kafka-protocol` crate (the broker's answer, not ours, is the input).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, FetchResponse, MetadataResponse, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};

/// What the proxy does to Fetch responses carrying records for partition `partition`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Flips one byte inside the first batch's CRC-covered bytes in every such response: the
    /// batch fails its CRC-32C every time it is fetched.
    CorruptBatch { partition: i32 },
    /// The first such response is cut in half and both connections are closed: the client sees
    /// a truncated frame and then EOF. Later responses pass unchanged.
    TruncateFrameOnce { partition: i32 },
    /// Forward everything (Metadata still re-advertised): for watching the traffic.
    None,
}

pub struct FaultProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Black-hole mode (`freeze`).
    frozen: Arc<AtomicBool>,
    /// While set, the source looks unreachable: connections are closed at their next frame and
    /// new ones as soon as they are accepted (`sever`).
    severed: Arc<AtomicBool>,
    /// Fetch responses the fault was applied to.
    pub applied: Arc<AtomicUsize>,
    /// Most requests seen outstanding on one connection at once (sent, not yet answered).
    pub max_in_flight: Arc<AtomicUsize>,
    /// Fetch requests forwarded, on all connections.
    pub fetches: Arc<AtomicUsize>,
    /// Connections that carried at least one Fetch request.
    pub fetch_connections: Arc<AtomicUsize>,
}

/// (api key, version) of each request on one connection, oldest first: Kafka answers a
/// connection's requests in order (correlation ids need not be unique across a client's
/// fetch sessions, so order is what matches them).
type Pending = Arc<Mutex<VecDeque<(i16, i16)>>>;

impl FaultProxy {
    pub fn start(upstream: SocketAddr, fault: Fault) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let applied = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let max2 = Arc::clone(&max_in_flight);
        let fetches = Arc::new(AtomicUsize::new(0));
        let fetches2 = Arc::clone(&fetches);
        let fetch_connections = Arc::new(AtomicUsize::new(0));
        let fetch_connections2 = Arc::clone(&fetch_connections);
        let (stop2, applied2) = (Arc::clone(&stop), Arc::clone(&applied));
        let truncated = Arc::new(AtomicBool::new(false));
        let frozen = Arc::new(AtomicBool::new(false));
        let frozen2 = Arc::clone(&frozen);
        let severed = Arc::new(AtomicBool::new(false));
        let severed2 = Arc::clone(&severed);
        std::thread::spawn(move || {
            // Connections accepted while frozen: held open, never read.
            let mut held = Vec::new();
            for client in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if frozen2.load(Ordering::Relaxed) {
                    held.push(client);
                    continue;
                }
                if severed2.load(Ordering::Relaxed) {
                    // Dropped: the client sees EOF before any answer.
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let pending: Pending = Arc::default();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let p2 = Arc::clone(&pending);
                let counters = (
                    Arc::clone(&max2),
                    Arc::clone(&fetches2),
                    Arc::clone(&fetch_connections2),
                );
                let hole = Hole {
                    frozen: Arc::clone(&frozen2),
                    severed: Arc::clone(&severed2),
                    stop: Arc::clone(&stop2),
                };
                let hole2 = hole.clone();
                std::thread::spawn(move || requests(c2, s2, p2, counters, hole2));
                let applied = Arc::clone(&applied2);
                let truncated = Arc::clone(&truncated);
                std::thread::spawn(move || {
                    responses(
                        server, client, pending, addr, fault, applied, truncated, hole,
                    )
                });
            }
        });
        FaultProxy {
            addr,
            stop,
            frozen,
            severed,
            applied,
            max_in_flight,
            fetches,
            fetch_connections,
        }
    }

    /// `host:port` for the client's bootstrap list.
    pub fn bootstrap(&self) -> String {
        self.addr.to_string()
    }

    /// Turns the proxy into a black hole, for good: what is in flight is never delivered,
    /// nothing more is read, every socket stays open and new connections are accepted but
    /// never answered.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }

    /// `true`: the broker becomes unreachable through the proxy (every connection closed, new
    /// ones closed on accept); `false`: reachable again.
    pub fn sever(&self, yes: bool) {
        self.severed.store(yes, Ordering::Relaxed);
    }
}

/// A forwarding thread's view of black-hole mode.
#[derive(Clone)]
struct Hole {
    frozen: Arc<AtomicBool>,
    severed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Hole {
    /// Severed: the forwarding thread stops and closes both sockets (`close` shuts down every
    /// clone), so the client sees EOF.
    fn severed(&self) -> bool {
        self.severed.load(Ordering::Relaxed)
    }

    /// When frozen: holds both sockets open, forwarding nothing, until the proxy is dropped.
    /// Returns whether the thread must end (it was frozen).
    fn swallow(&self) -> bool {
        if !self.frozen.load(Ordering::Relaxed) {
            return false;
        }
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        true
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let len = i32::from_be_bytes(len);
    let mut body = vec![0u8; usize::try_from(len).ok()?];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

fn write_frame(s: &mut TcpStream, body: &[u8]) -> bool {
    let len = (body.len() as i32).to_be_bytes();
    s.write_all(&len).is_ok() && s.write_all(body).is_ok()
}

fn close(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

/// Client → broker: note (api key, version) of each request in order, count outstanding
/// requests and Fetches (`counters`: max in flight, fetches), forward unchanged.
fn requests(
    mut client: TcpStream,
    mut server: TcpStream,
    pending: Pending,
    counters: (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>),
    hole: Hole,
) {
    let (max, fetches, fetch_connections) = counters;
    let mut fetched = false;
    while let Some(body) = read_frame(&mut client) {
        if hole.severed() {
            break;
        }
        if hole.swallow() {
            return;
        }
        if body.len() >= 8 {
            let key = i16::from_be_bytes([body[0], body[1]]);
            let version = i16::from_be_bytes([body[2], body[3]]);
            if key == ApiKey::Fetch as i16 {
                fetches.fetch_add(1, Ordering::Relaxed);
                if !std::mem::replace(&mut fetched, true) {
                    fetch_connections.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut p = pending.lock().unwrap();
            p.push_back((key, version));
            max.fetch_max(p.len(), Ordering::Relaxed);
        }
        if !write_frame(&mut server, &body) {
            break;
        }
    }
    close(&client, &server);
}

/// Broker → client: rewrite Metadata, apply the fault to Fetch, forward the rest.
#[allow(clippy::too_many_arguments)]
fn responses(
    mut server: TcpStream,
    mut client: TcpStream,
    pending: Pending,
    me: SocketAddr,
    fault: Fault,
    applied: Arc<AtomicUsize>,
    truncated: Arc<AtomicBool>,
    hole: Hole,
) {
    while let Some(mut body) = read_frame(&mut server) {
        if hole.severed() {
            break;
        }
        if hole.swallow() {
            return;
        }
        let request = pending.lock().unwrap().pop_front();
        match request {
            Some((key, version)) if key == ApiKey::Metadata as i16 => {
                body = readvertise(&body, version, me);
            }
            Some((key, version)) if key == ApiKey::Fetch as i16 => {
                if let Some(at) = records_of(&body, version, fault_partition(fault)) {
                    match fault {
                        Fault::None => {}
                        Fault::CorruptBatch { .. } => {
                            // Offset 61 is the first record's first byte in a v2 batch: inside
                            // the CRC-32C range (which starts at 21).
                            let (start, len) = at;
                            if len > 62 {
                                body[start + 61] ^= 0x5a;
                                applied.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Fault::TruncateFrameOnce { .. } => {
                            if !truncated.swap(true, Ordering::Relaxed) {
                                applied.fetch_add(1, Ordering::Relaxed);
                                let len = (body.len() as i32).to_be_bytes();
                                let _ = client.write_all(&len);
                                let _ = client.write_all(&body[..body.len() / 2]);
                                let _ = client.flush();
                                close(&client, &server);
                                return;
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        if !write_frame(&mut client, &body) {
            break;
        }
    }
    close(&client, &server);
}

fn fault_partition(f: Fault) -> i32 {
    match f {
        Fault::CorruptBatch { partition } | Fault::TruncateFrameOnce { partition } => partition,
        Fault::None => -1,
    }
}

fn header_len(body: &Bytes, header_version: i16) -> usize {
    let mut b = body.clone();
    ResponseHeader::decode(&mut b, header_version).unwrap();
    body.len() - b.len()
}

/// (position in `body`, length) of the non-empty records of `partition` in a Fetch response.
fn records_of(body: &[u8], version: i16, partition: i32) -> Option<(usize, usize)> {
    let frame = Bytes::copy_from_slice(body);
    let hlen = header_len(&frame, FetchResponse::header_version(version));
    let mut rest = frame.slice(hlen..);
    let resp = FetchResponse::decode(&mut rest, version).ok()?;
    for t in &resp.responses {
        for p in &t.partitions {
            if p.partition_index != partition {
                continue;
            }
            let records = p.records.as_ref().filter(|r| !r.is_empty())?;
            let at = records.as_ptr() as usize - frame.as_ptr() as usize;
            return Some((at, records.len()));
        }
    }
    None
}

/// The Metadata response with every broker at the proxy's address.
fn readvertise(body: &[u8], version: i16, me: SocketAddr) -> Vec<u8> {
    let frame = Bytes::copy_from_slice(body);
    let hv = MetadataResponse::header_version(version);
    let mut b = frame.clone();
    let header = ResponseHeader::decode(&mut b, hv).unwrap();
    let mut resp = MetadataResponse::decode(&mut b, version).unwrap();
    for broker in resp.brokers.iter_mut() {
        broker.host = StrBytes::from_string(me.ip().to_string());
        broker.port = i32::from(me.port());
    }
    let mut out = BytesMut::new();
    header.encode(&mut out, hv).unwrap();
    resp.encode(&mut out, version).unwrap();
    out.to_vec()
}
