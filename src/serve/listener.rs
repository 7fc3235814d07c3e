//! The endpoint: named listeners (Kafka's `listeners`, each with its security protocol), one
//! tokio runtime of `SERVE_IO_THREADS` threads that accepts on all of them and runs every
//! connection as a task (`conn`), and a bounded pool of handler threads (the runtime's
//! blocking pool) that answers requests. Admission (`max.connections`, per IP, the request
//! bytes budget) is shared by all listeners, as Kafka's broker-wide settings are. TLS
//! listeners complete their handshake within `request.receive.timeout.ms`; the client
//! certificate's subject becomes the session's principal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::limits::{
    SERVE_DISPATCH_THREADS_MAX, SERVE_DISPATCH_THREAD_KEEP_ALIVE_MS, SERVE_IO_THREADS,
    SERVE_STOP_WAIT_MS,
};
use crate::log::read_view::ReadCatalog;
use crate::serve::admission::{Admission, ConnLimits, Refusal, Slot};
use crate::serve::advertised::Advertised;
use crate::serve::catalog_apis;
use crate::serve::conn::{self, Endpoint, Wire};
use crate::serve::dispatch::Dispatcher;
use crate::serve::fetch_sessions::FetchSessions;
use crate::serve::request_stats::RequestStats;
use crate::serve::session::{KafkaPrincipal, SecurityProtocol, Session};
use crate::serve::tls::{self, TlsSettings, TLS_STATS};
use crate::serve::writes::WriterSlot;

/// One listener: its name, where it listens, what it tells clients, and its protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Kafka's listener name (`PLAINTEXT`, `SSL`, `INTERNAL`, ...), carried by every session.
    pub name: Arc<str>,
    pub listen: SocketAddr,
    /// `host:port` announced in Metadata and FindCoordinator; the bound address when `None`.
    pub advertised: Option<String>,
    pub protocol: SecurityProtocol,
    /// Required exactly when `protocol` uses TLS.
    pub tls: Option<TlsSettings>,
}

impl ListenerConfig {
    /// The `[kafka] listen/advertised` form: one PLAINTEXT listener named `PLAINTEXT`.
    pub fn plaintext(listen: SocketAddr, advertised: Option<String>) -> ListenerConfig {
        ListenerConfig {
            name: Arc::from("PLAINTEXT"),
            listen,
            advertised,
            protocol: SecurityProtocol::Plaintext,
            tls: None,
        }
    }
}

/// What a connection task needs to know about its listener.
struct ListenerCtx {
    name: Arc<str>,
    protocol: SecurityProtocol,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// The running endpoint; dropping it (or `stop`) stops accepting and ends open connections at
/// their next wait.
#[derive(Debug)]
pub struct KafkaListener {
    addrs: Vec<(Arc<str>, SocketAddr)>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl KafkaListener {
    /// Binds every listener of `listeners` (in order; a bind or TLS file error fails the whole
    /// start) and serves the partitions of `catalog` with the APIs of
    /// `catalog_apis::dispatcher` (Fetch keeping its sessions in `sessions`), plus whatever
    /// `extend` registers (the group coordinator); `extend` is told each listener's advertised
    /// address, known only once bound. Every request is counted in `stats`.
    pub fn start(
        listeners: &[ListenerConfig],
        limits: ConnLimits,
        catalog: Arc<ReadCatalog>,
        writer: WriterSlot,
        sessions: Arc<FetchSessions>,
        stats: Arc<RequestStats>,
        extend: impl FnOnce(&mut Dispatcher, &Arc<Advertised>),
    ) -> std::io::Result<KafkaListener> {
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        let mut bound = Vec::with_capacity(listeners.len());
        let mut addresses = Vec::with_capacity(listeners.len());
        for l in listeners {
            let acceptor = match (&l.tls, l.protocol.uses_tls()) {
                (Some(t), true) => {
                    let config = tls::server_config(t)
                        .map_err(|e| invalid(format!("listener {}: {e}", l.name)))?;
                    Some(tokio_rustls::TlsAcceptor::from(config))
                }
                (None, false) => None,
                _ => {
                    return Err(invalid(format!(
                        "listener {}: TLS settings are required exactly for SSL and SASL_SSL",
                        l.name
                    )))
                }
            };
            let socket = std::net::TcpListener::bind(l.listen).map_err(|e| {
                std::io::Error::new(e.kind(), format!("listener {} ({}): {e}", l.name, l.listen))
            })?;
            socket.set_nonblocking(true)?;
            let addr = socket.local_addr()?;
            let (host, port) = match &l.advertised {
                Some(a) => {
                    let (h, p) = a.rsplit_once(':').unwrap_or((a, "9092"));
                    (h.to_string(), p.parse().unwrap_or(addr.port() as i32))
                }
                None => (addr.ip().to_string(), addr.port() as i32),
            };
            addresses.push((Arc::clone(&l.name), host, port));
            let ctx = ListenerCtx {
                name: Arc::clone(&l.name),
                protocol: l.protocol,
                tls: acceptor,
            };
            bound.push((socket, addr, ctx));
        }
        let advertised =
            Advertised::new(addresses).ok_or_else(|| invalid("no Kafka listener".into()))?;
        let mut dispatcher =
            catalog_apis::dispatcher(catalog, Arc::clone(&advertised), writer, sessions);
        extend(&mut dispatcher, &advertised);
        dispatcher.count_into(stats);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(SERVE_IO_THREADS)
            .max_blocking_threads(SERVE_DISPATCH_THREADS_MAX)
            .thread_keep_alive(Duration::from_millis(SERVE_DISPATCH_THREAD_KEEP_ALIVE_MS))
            .thread_name("kafka-endpoint")
            .enable_all()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let endpoint = Arc::new(Endpoint {
            dispatcher: Arc::new(dispatcher),
            admission: Admission::new(limits),
            stop: stopped.clone(),
        });
        let mut addrs = Vec::with_capacity(bound.len());
        {
            let _in_runtime = runtime.enter();
            for (socket, addr, ctx) in bound {
                let socket = tokio::net::TcpListener::from_std(socket)?;
                tracing::info!(
                    "Kafka listener serving on {addr} name={} protocol={}",
                    ctx.name,
                    ctx.protocol.name()
                );
                addrs.push((Arc::clone(&ctx.name), addr));
                runtime.spawn(accept_loop(
                    socket,
                    Arc::new(ctx),
                    Arc::clone(&endpoint),
                    stopped.clone(),
                ));
            }
        }
        let mut until_stopped = stopped;
        let thread = std::thread::Builder::new()
            .name("kafka-endpoint".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = until_stopped.wait_for(|s| *s).await;
                });
                // Handlers still running are let go after the wait (their connections are
                // closed; the handler's own work is not interrupted).
                runtime.shutdown_timeout(Duration::from_millis(SERVE_STOP_WAIT_MS));
            })?;
        Ok(KafkaListener {
            addrs,
            stop,
            thread: Some(thread),
        })
    }

    /// The first listener's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addrs[0].1
    }

    /// The bound address of the listener named `name`.
    pub fn addr_of(&self, name: &str) -> Option<SocketAddr> {
        self.addrs
            .iter()
            .find(|(n, _)| &**n == name)
            .map(|(_, a)| *a)
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.stop.send(true);
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

async fn accept_loop(
    socket: tokio::net::TcpListener,
    ctx: Arc<ListenerCtx>,
    endpoint: Arc<Endpoint>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = socket.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        match accepted {
            Ok((stream, peer)) => admit(stream, peer, &ctx, &endpoint),
            Err(e) => {
                // Out of file descriptors or the like: back off rather than spin.
                tracing::warn!(listener = %ctx.name, error = %e, "Kafka listener: accept failed");
                tokio::time::sleep(Duration::from_millis(ACCEPT_BACKOFF_MS)).await;
            }
        }
    }
}

/// How long accepting pauses after a failed accept (EMFILE and the like).
const ACCEPT_BACKOFF_MS: u64 = 50;

/// Over a limit the connection is closed at once, as Kafka does (counted in /metrics); the
/// client sees its connection closed and retries with backoff.
fn admit(stream: TcpStream, peer: SocketAddr, ctx: &Arc<ListenerCtx>, endpoint: &Arc<Endpoint>) {
    let slot = match endpoint.admission.admit(peer.ip()) {
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
    // The task owns the slot: it is released when the task ends, also by a panic.
    tokio::spawn(connection(
        stream,
        peer,
        Arc::clone(ctx),
        Arc::clone(endpoint),
        slot,
    ));
}

/// A connection from accept to close: the TLS handshake on TLS listeners, then its frames.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Arc<ListenerCtx>,
    endpoint: Arc<Endpoint>,
    slot: Slot,
) {
    let mut session = Session {
        peer: Some(peer),
        listener: Arc::clone(&ctx.name),
        protocol: ctx.protocol,
        principal: KafkaPrincipal::anonymous(),
        // On SASL listeners nothing but the handshake is served until the client
        // authenticates.
        authenticated: !ctx.protocol.needs_sasl(),
    };
    let wire = match &ctx.tls {
        None => Wire::Plain(stream),
        Some(acceptor) => {
            let limit = Duration::from_millis(endpoint.admission.limits.request_receive_timeout_ms);
            let began = Instant::now();
            let handshake = tokio::time::timeout(limit, acceptor.accept(stream)).await;
            let tls = match handshake {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    TLS_STATS.handshake_failed(&ctx.name);
                    tracing::warn!(%peer, listener = %ctx.name, error = %e, "Kafka client refused: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    TLS_STATS.handshake_failed(&ctx.name);
                    tracing::warn!(%peer, listener = %ctx.name, after = ?began.elapsed(), "Kafka client refused: TLS handshake not complete within request.receive.timeout.ms");
                    return;
                }
            };
            match tls::principal_of(tls.get_ref().1.peer_certificates()) {
                Ok(p) => session.principal = p,
                Err(e) => {
                    TLS_STATS.handshake_failed(&ctx.name);
                    tracing::warn!(%peer, listener = %ctx.name, error = %e, "Kafka client refused");
                    return;
                }
            }
            TLS_STATS.authenticated(&ctx.name, &session.principal);
            Wire::Tls(Box::new(tls))
        }
    };
    conn::serve(wire, Arc::new(session), endpoint, slot).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::dispatch::{ApiHandler, Outcome, Request};
    use crate::serve::ServeError;
    use kafka_protocol::messages::{ApiKey, RequestHeader};
    use kafka_protocol::protocol::Encodable;
    use std::io::{Read, Write};
    use std::net::TcpStream;

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
        let config = ListenerConfig::plaintext("127.0.0.1:0".parse().unwrap(), None);
        let limits = ConnLimits {
            max_connections: 1,
            max_connections_per_ip: 1,
            ..ConnLimits::default()
        };
        let listener = KafkaListener::start(
            &[config],
            limits,
            ReadCatalog::new(),
            crate::serve::writes::writer_slot(),
            FetchSessions::new(),
            crate::serve::request_stats::RequestStats::new(),
            |d, _| d.register(ApiKey::Heartbeat, 0, 4, Arc::new(Panics)),
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
        // The client sees its connection close while the server may still be unwinding the
        // panicked task, whose slot is released only when that task ends: a connection made
        // in between is refused (closed) like any over the limit. So try a few times; a slot
        // that leaked refuses every one.
        let freed = (0..50).any(|_| {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(&frame(ApiKey::ApiVersions, 0)).is_ok() && answered(&mut c) || {
                std::thread::sleep(Duration::from_millis(100));
                false
            }
        });
        assert!(freed, "the slot of the panicked connections was not freed");
        listener.stop();
    }
}
