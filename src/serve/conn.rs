//! One client connection, as a task on the endpoint's runtime: read a frame, have a handler
//! thread answer it, write the response, repeat.
//!
//! The task owns the socket (plain TCP or TLS over it) and awaits; it never blocks its
//! runtime thread. Handlers are synchronous (they may park on the control plane or a long
//! poll), so each frame is answered by `answer` on the runtime's bounded blocking pool while
//! the task waits for it: requests on one connection are answered in order, as Kafka clients
//! require, and an idle connection is only a parked task, its socket and an empty buffer.
//!
//! A response is a frame head plus parts; byte parts are written from memory and, on a
//! plaintext connection, file parts go with `sendfile` when the socket is writable, so record
//! data moves from the page cache to the socket inside the kernel. Through TLS the file bytes
//! are read in chunks and encrypted in user space (that is what TLS costs, see
//! benches/RESULTS.md). Anything the dispatcher cannot understand closes this connection with
//! a log line; it never affects others.

use std::io::ErrorKind;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::limits::{SERVE_REQUEST_BYTES_MAX, SERVE_TLS_FILE_CHUNK_BYTES, SERVE_WRITE_TIMEOUT_MS};
use crate::serve::admission::{bump, Admission, BytesPermit, Slot, CONN_STATS};
use crate::serve::dispatch::{frame_head, Dispatcher, Outcome, Part, Response};
use crate::serve::sasl::ConnAuth;
use crate::serve::session::Session;
use crate::serve::ServeError;

/// What every connection of the endpoint shares.
pub struct Endpoint {
    pub dispatcher: Arc<Dispatcher>,
    pub admission: Arc<Admission>,
    /// Turns true when the endpoint stops; connections end at their next wait.
    pub stop: watch::Receiver<bool>,
}

/// The bytes of one connection after any TLS handshake.
pub enum Wire {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// Serves `wire` until the client leaves, sends something we cannot parse, misses a deadline
/// of the endpoint's limits, or the endpoint stops. `_slot` is released when this returns or
/// unwinds.
pub async fn serve(mut wire: Wire, session: Arc<Session>, endpoint: Arc<Endpoint>, _slot: Slot) {
    let peer = session.peer;
    // Borrowed, not moved into the arms: a stream bound by value in an arm would drop (and
    // the socket close) before the log line below, and a client could see its connection
    // closed before the reason is in the log.
    let served = match &mut wire {
        Wire::Plain(s) => serve_frames(s, Sink::Plain, &session, &endpoint).await,
        Wire::Tls(s) => serve_frames(&mut **s, Sink::Tls, &session, &endpoint).await,
    };
    match served {
        Ok(()) => tracing::debug!(?peer, "Kafka client disconnected"),
        Err(e) => tracing::warn!(?peer, error = %e, "Kafka client connection closed"),
    }
    // The socket closes here, after the log line.
    drop(wire);
}

/// How a response's file parts leave: `sendfile` on the raw socket, or read and written
/// through TLS.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sink {
    Plain,
    Tls,
}

/// The socket a connection reads frames from and writes responses to.
trait FrameIo: AsyncRead + AsyncWrite + Unpin + Send {
    /// The TCP socket under it, for `sendfile` (plaintext only).
    fn tcp(&self) -> &TcpStream;
}

impl FrameIo for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl FrameIo for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

async fn serve_frames<S: FrameIo>(
    stream: &mut S,
    sink: Sink,
    session: &Arc<Session>,
    endpoint: &Arc<Endpoint>,
) -> Result<(), ServeError> {
    stream.tcp().set_nodelay(true)?;
    let mut buf = BytesMut::new();
    let mut stop = endpoint.stop.clone();
    // SASL listeners: the gate serves only the SASL exchange until the client authenticated,
    // then replaces the session (serve::sasl::gate). Requests of one connection are answered
    // one at a time, so the gate and the session travel to the handler thread and back.
    let mut auth = Some(ConnAuth::new(endpoint.dispatcher.sasl()));
    let mut session = Arc::clone(session);
    loop {
        let read = tokio::select! {
            r = read_frame(stream, &mut buf, &endpoint.admission) => r,
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let Some((frame, permit)) = read? else {
            return Ok(());
        };
        let received = Instant::now();
        let (head, parts) = {
            let d = Arc::clone(&endpoint.dispatcher);
            let mut gate = auth.take().expect("the gate is back after every request");
            let mut s = Arc::clone(&session);
            // The permit travels with the frame: its bytes count until the handler is done.
            let (answered, gate, s) = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let answered = answer(&d, &mut gate, received, frame, &mut s, sink);
                (answered, gate, s)
            })
            .await
            .map_err(|e| ServeError::Io(std::io::Error::other(e)))?;
            auth = Some(gate);
            session = s;
            let answered = answered?;
            match answered {
                Some(reply) => reply,
                None => continue,
            }
        };
        let deadline = Duration::from_millis(SERVE_WRITE_TIMEOUT_MS);
        tokio::time::timeout(deadline, write_response(stream, sink, head, &parts))
            .await
            .map_err(|_| closed(format!("response not written within {deadline:?}")))??;
    }
}

/// Answers one request frame: THE place every frame of every connection is dispatched (runs
/// on a handler thread). `None` when the request wants no reply; the frame head and parts to
/// write otherwise. Through TLS, file parts are read into memory here, off the I/O threads.
/// `received`: when the frame's last byte was read (SASL session expiry is judged by it).
fn answer(
    dispatcher: &Dispatcher,
    auth: &mut ConnAuth,
    received: Instant,
    frame: Bytes,
    session: &mut Arc<Session>,
    sink: Sink,
) -> Result<Option<(Bytes, Vec<Part>)>, ServeError> {
    // A panicking handler is a bug of ours: it closes this connection only (the slot and the
    // request bytes are released by their guards either way).
    let dispatched = std::panic::catch_unwind(AssertUnwindSafe(|| {
        auth.dispatch(received, dispatcher, frame, session)
    }))
    .unwrap_or_else(|_| {
        bump(&CONN_STATS.handler_panics);
        Err(ServeError::Io(std::io::Error::other(
            "request handler panicked",
        )))
    });
    let (
        api,
        version,
        Response {
            correlation_id,
            outcome,
        },
    ) = dispatched?;
    match outcome {
        Outcome::Reply(parts) => {
            let body_len = parts.iter().map(Part::len).sum();
            let head = frame_head(api, version, correlation_id, body_len)?;
            let parts = match sink {
                Sink::Plain => parts,
                Sink::Tls => read_file_parts(parts)?,
            };
            Ok(Some((head, parts)))
        }
        Outcome::NoReply => Ok(None),
        Outcome::Close(why) => Err(ServeError::Io(std::io::Error::other(why))),
    }
}

/// File parts as bytes, for a connection that cannot `sendfile` (TLS).
fn read_file_parts(parts: Vec<Part>) -> Result<Vec<Part>, ServeError> {
    use std::os::unix::fs::FileExt;
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let Part::File {
            file,
            position,
            length,
        } = part
        else {
            out.push(part);
            continue;
        };
        let mut at = position;
        let end = position + length;
        while at < end {
            let n = ((end - at) as usize).min(SERVE_TLS_FILE_CHUNK_BYTES);
            let mut chunk = vec![0u8; n];
            file.read_exact_at(&mut chunk, at).map_err(|e| {
                ServeError::Io(std::io::Error::new(
                    e.kind(),
                    format!("segment file ended before {end} (read at {at}): {e}"),
                ))
            })?;
            out.push(Part::Bytes(Bytes::from(chunk)));
            at += n as u64;
        }
    }
    Ok(out)
}

fn closed(why: String) -> ServeError {
    ServeError::Io(std::io::Error::new(ErrorKind::TimedOut, why))
}

/// The next whole frame body with the request bytes it holds, or `None` when the client
/// closed between frames. Closes (an error) a connection idle for `connections.max.idle.ms`,
/// or whose frame, once begun, is not complete within `request.receive.timeout.ms`. The
/// frame's bytes are taken from the request budget before they are allocated.
async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    admission: &Arc<Admission>,
) -> Result<Option<(Bytes, Option<BytesPermit>)>, ServeError> {
    let limits = admission.limits;
    let idle_deadline = Instant::now() + Duration::from_millis(limits.connections_max_idle_ms);
    let receive = Duration::from_millis(limits.request_receive_timeout_ms);
    let mut begun: Option<Instant> = (!buf.is_empty()).then(Instant::now);
    let mut permit: Option<BytesPermit> = None;
    loop {
        if buf.len() >= 4 {
            let len = i32::from_be_bytes(buf[..4].try_into().expect("4 bytes"));
            if len < 0 || len as usize > SERVE_REQUEST_BYTES_MAX {
                return Err(ServeError::FrameLength {
                    len: len as i64,
                    max: SERVE_REQUEST_BYTES_MAX,
                });
            }
            let need = 4 + len as usize;
            if buf.len() >= need {
                let mut frame = buf.split_to(need);
                let _ = frame.split_to(4);
                return Ok(Some((frame.freeze(), permit)));
            }
            if permit.is_none() {
                let deadline = begun.unwrap_or_else(Instant::now) + receive;
                permit = Some(
                    admission
                        .request_bytes_async(need, deadline)
                        .await
                        .ok_or_else(|| {
                            closed(format!(
                                "no room for a request of {need} bytes in queued.max.request.bytes ({}) before the receive timeout",
                                limits.queued_max_request_bytes
                            ))
                        })?,
                );
                buf.reserve(need - buf.len());
            }
        }
        // Read the length prefix, then exactly the frame it announces, straight into `buf`:
        // nothing past the frame whose bytes were granted, and no per-connection scratch
        // buffer, so an idle connection holds no read buffer (as Kafka reads size, then
        // payload).
        let want = if buf.len() >= 4 {
            let len = i32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
            (4 + len - buf.len()).min(READ_CHUNK_BYTES)
        } else {
            4 - buf.len()
        };
        let deadline = match begun {
            None => idle_deadline,
            Some(at) => at + receive,
        };
        let start = buf.len();
        buf.resize(start + want, 0);
        let read = tokio::time::timeout_at(deadline.into(), stream.read(&mut buf[start..])).await;
        let read = match read {
            Ok(r) => r,
            Err(_) => {
                buf.truncate(start);
                return Err(match begun {
                    None => {
                        bump(&CONN_STATS.closed_idle);
                        closed(format!(
                            "idle for connections.max.idle.ms ({} ms)",
                            limits.connections_max_idle_ms
                        ))
                    }
                    Some(_) => {
                        bump(&CONN_STATS.closed_receive_timeout);
                        closed(format!(
                            "request frame incomplete after request.receive.timeout.ms ({} ms): \
                             {} bytes received",
                            limits.request_receive_timeout_ms,
                            buf.len()
                        ))
                    }
                });
            }
        };
        buf.truncate(start + *read.as_ref().unwrap_or(&0));
        match read {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => return Err(ServeError::Truncated { len: buf.len() }),
            Ok(_) => {
                begun.get_or_insert_with(Instant::now);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Most bytes one read asks for (a frame arrives in such steps, zeroed just before).
const READ_CHUNK_BYTES: usize = 64 * 1024;

async fn write_response<S: FrameIo>(
    stream: &mut S,
    sink: Sink,
    head: Bytes,
    parts: &[Part],
) -> Result<(), ServeError> {
    // Consecutive byte parts go out in one write; a file part is flushed around.
    let mut pending = BytesMut::from(&head[..]);
    for part in parts {
        match part {
            Part::Bytes(b) if sink == Sink::Tls && !pending.is_empty() => {
                // Through TLS every part is bytes: no need to gather them first.
                stream.write_all(&pending).await?;
                pending.clear();
                stream.write_all(b).await?;
            }
            Part::Bytes(b) => pending.extend_from_slice(b),
            Part::File {
                file,
                position,
                length,
            } => {
                stream.write_all(&pending).await?;
                pending.clear();
                send_file(stream.tcp(), file, *position, *length).await?;
            }
        }
    }
    stream.write_all(&pending).await?;
    stream.flush().await?;
    Ok(())
}

/// Sends `length` bytes of `file` from `position` with `sendfile` whenever the socket can
/// take more. The range was checked against a published view; if the file became shorter
/// since (a truncation raced us), the frame cannot be completed and the connection is closed
/// so the client retries cleanly.
async fn send_file(
    stream: &TcpStream,
    file: &std::fs::File,
    position: u64,
    length: u64,
) -> Result<(), ServeError> {
    let mut offset = position as libc::off_t;
    let end = position + length;
    while (offset as u64) < end {
        let left = (end - offset as u64) as usize;
        stream.writable().await?;
        let sent = stream.try_io(tokio::io::Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile(stream, file, Some(&mut offset), left)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(0) => {
                return Err(ServeError::Io(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("segment file ended at {offset}, before {end}"),
                )))
            }
            Ok(_) => {}
            // Not writable after all (readiness is a hint), or a signal: wait again.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) => return Err(ServeError::Io(e)),
        }
    }
    Ok(())
}
