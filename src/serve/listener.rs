//! The accept loop: one thread accepting clients, one thread per connection (bounded by
//! `SERVE_CONNECTIONS_MAX`). Blocking sockets keep `sendfile` simple; connection threads are
//! not pinned, so they compete with shards only for spare CPU.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::limits::{SERVE_CONNECTIONS_MAX, SERVE_READ_POLL_MS};
use crate::log::read_view::ReadCatalog;
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
        let thread = std::thread::Builder::new()
            .name("kafka-accept".into())
            .spawn(move || accept_loop(listener, dispatcher, thread_stop))?;
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

fn accept_loop(listener: TcpListener, dispatcher: Arc<Dispatcher>, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => spawn_connection(stream, peer, &dispatcher, &stop, &open),
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

fn spawn_connection(
    stream: TcpStream,
    peer: SocketAddr,
    dispatcher: &Arc<Dispatcher>,
    stop: &Arc<AtomicBool>,
    open: &Arc<AtomicUsize>,
) {
    if open.fetch_add(1, Ordering::AcqRel) >= SERVE_CONNECTIONS_MAX {
        open.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%peer, max = SERVE_CONNECTIONS_MAX, "Kafka client refused: too many connections");
        return;
    }
    let (dispatcher, stop, open2) = (Arc::clone(dispatcher), Arc::clone(stop), Arc::clone(open));
    let spawned = std::thread::Builder::new()
        .name("kafka-conn".into())
        .spawn(move || {
            conn::serve(stream, peer, &dispatcher, &stop);
            open2.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        open.fetch_sub(1, Ordering::AcqRel);
        tracing::warn!(%peer, error = %e, "Kafka client refused: cannot start its thread");
    }
}
