//! The accept loop: one thread accepting clients, one thread per connection (bounded by
//! `max.connections` and `max.connections.per.ip`, see `admission`). Blocking sockets keep `sendfile` simple; connection threads are
//! not pinned, so they compete with shards only for spare CPU.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::limits::SERVE_READ_POLL_MS;
use crate::log::read_view::ReadCatalog;
use crate::serve::admission::{Admission, ConnLimits, Refusal};
use crate::serve::catalog_apis;
use crate::serve::conn;
use crate::serve::dispatch::Dispatcher;
use crate::serve::fetch_sessions::FetchSessions;
use crate::serve::request_stats::RequestStats;
use crate::serve::writes::WriterSlot;

/// Where to listen and what to tell clients.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    pub listen: SocketAddr,
    /// `host:port` announced in Metadata; the bound address when `None`.
    pub advertised: Option<String>,
    /// Connection limits and timeouts.
    pub limits: ConnLimits,
}

/// A running listener; dropping it (or `stop`) stops accepting. Open connections end when
/// their client leaves or at their next read poll.
#[derive(Debug)]
pub struct KafkaListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl KafkaListener {
    /// Binds and starts serving the partitions of `catalog` with the APIs of
    /// `catalog_apis::dispatcher` (Fetch keeping its sessions in `sessions`), plus whatever `extend` registers (the group coordinator);
    /// `extend` is told the advertised host and port, known only once bound. Every request is
    /// counted in `stats`.
    pub fn start(
        config: &ListenerConfig,
        catalog: Arc<ReadCatalog>,
        writer: WriterSlot,
        sessions: Arc<FetchSessions>,
        stats: Arc<RequestStats>,
        extend: impl FnOnce(&mut Dispatcher, &str, i32),
    ) -> std::io::Result<KafkaListener> {
        let listener = TcpListener::bind(config.listen)?;
        let addr = listener.local_addr()?;
        let (host, port) = match &config.advertised {
            Some(a) => {
                let (h, p) = a.rsplit_once(':').unwrap_or((a, "9092"));
                (h.to_string(), p.parse().unwrap_or(addr.port()))
            }
            None => (addr.ip().to_string(), addr.port()),
        };
        let mut dispatcher =
            catalog_apis::dispatcher(catalog, host.clone(), port as i32, writer, sessions);
        extend(&mut dispatcher, &host, port as i32);
        dispatcher.count_into(stats);
        let dispatcher = Arc::new(dispatcher);
        // Non-blocking accept polled with the stop flag: a blocked accept cannot be woken.
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let admission = Admission::new(config.limits);
        let thread = std::thread::Builder::new()
            .name("kafka-accept".into())
            .spawn(move || accept_loop(listener, dispatcher, admission, thread_stop))?;
        tracing::info!("Kafka listener serving on {addr}");
        Ok(KafkaListener {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for KafkaListener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(
    listener: TcpListener,
    dispatcher: Arc<Dispatcher>,
    admission: Arc<Admission>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => spawn_connection(stream, peer, &dispatcher, &admission, &stop),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(SERVE_READ_POLL_MS / 10));
            }
            Err(e) => {
                tracing::warn!(error = %e, "Kafka listener: accept failed");
                std::thread::sleep(Duration::from_millis(SERVE_READ_POLL_MS / 10));
            }
        }
    }
}

/// Over a limit the connection is closed at once, as Kafka does (counted in /metrics); the
/// client sees its connection closed and retries with backoff.
fn spawn_connection(
    stream: TcpStream,
    peer: SocketAddr,
    dispatcher: &Arc<Dispatcher>,
    admission: &Arc<Admission>,
    stop: &Arc<AtomicBool>,
) {
    let slot = match admission.admit(peer.ip()) {
        Ok(slot) => slot,
        Err(Refusal::MaxConnections(max)) => {
            tracing::info!(%peer, max, "Kafka client refused: max.connections reached");
            return;
        }
        Err(Refusal::PerIp(max)) => {
            tracing::info!(%peer, max, "Kafka client refused: max.connections.per.ip reached");
            return;
        }
    };
    let (dispatcher, stop, admission) = (
        Arc::clone(dispatcher),
        Arc::clone(stop),
        Arc::clone(admission),
    );
    let spawned = std::thread::Builder::new()
        .name("kafka-conn".into())
        .spawn(move || {
            // Dropped when the thread ends, also by a panic: the slot cannot leak.
            let _slot = slot;
            conn::serve(stream, peer, &dispatcher, &admission, &stop);
        });
    if let Err(e) = spawned {
        // The closure (and the slot in it) was dropped with the error.
        tracing::warn!(%peer, error = %e, "Kafka client refused: cannot start its thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::dispatch::{ApiHandler, Outcome, Request};
    use crate::serve::ServeError;
    use kafka_protocol::messages::{ApiKey, RequestHeader};
    use kafka_protocol::protocol::Encodable;
    use std::io::{Read, Write};

    struct Panics;
    impl ApiHandler for Panics {
        fn handle(&self, _: &Request) -> Result<Outcome, ServeError> {
            panic!("test handler bug");
        }
    }

    /// A request with only a v1 header (Heartbeat's body is not decoded by `Panics`; ApiVersions
    /// v0 has an empty body) as a length-prefixed frame.
    fn frame(api: ApiKey, version: i16) -> Vec<u8> {
        let mut h = bytes::BytesMut::new();
        let mut header = RequestHeader::default();
        header.request_api_key = api as i16;
        header.request_api_version = version;
        header.correlation_id = 7;
        header.encode(&mut h, 1).unwrap();
        let mut out = (h.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&h);
        out
    }

    /// Reads until the peer closes or a whole response frame arrived; true if it answered.
    fn answered(stream: &mut TcpStream) -> bool {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).is_ok()
    }

    /// Goal: a handler that panics closes only its connection and leaks no connection slot.
    /// Method: a listener with max.connections = 1 and a panicking Heartbeat handler; after the
    /// panic, a new connection is still let in and answered.
    #[test]
    fn a_panicking_handler_leaks_no_connection_slot() {
        let config = ListenerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertised: None,
            limits: ConnLimits {
                max_connections: 1,
                max_connections_per_ip: 1,
                ..ConnLimits::default()
            },
        };
        let listener = KafkaListener::start(
            &config,
            ReadCatalog::new(),
            crate::serve::writes::writer_slot(),
            FetchSessions::new(),
            crate::serve::request_stats::RequestStats::new(),
            |d, _, _| d.register(ApiKey::Heartbeat, 0, 4, Arc::new(Panics)),
        )
        .unwrap();
        let addr = listener.local_addr();
        for _ in 0..3 {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&frame(ApiKey::Heartbeat, 0)).unwrap();
            assert!(
                !answered(&mut c),
                "a panicking handler's connection must close"
            );
        }
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(&frame(ApiKey::ApiVersions, 0)).unwrap();
        assert!(
            answered(&mut c),
            "the slot of the panicked connections was not freed"
        );
        listener.stop();
    }
}
