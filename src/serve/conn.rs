//! One client connection: read a frame, dispatch it, write the response, repeat.
//!
//! A response is a frame head plus parts; byte parts are written from memory and file parts
//! go with `sendfile`, so record data moves from the page cache to the socket inside the
//! kernel. Requests on one connection are answered in order, as Kafka clients require.
//! Anything the dispatcher cannot understand closes this connection with a log line; it never
//! affects others.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::limits::{SERVE_REQUEST_BYTES_MAX, SERVE_WRITE_TIMEOUT_MS};
use crate::serve::admission::{bump, read_poll, Admission, BytesPermit, CONN_STATS};
use crate::serve::dispatch::{frame_head, Dispatcher, Outcome, Part};
use crate::serve::sasl::ConnAuth;
use crate::serve::ServeError;

/// Serves `stream` until the client leaves, sends something we cannot parse, misses a
/// deadline of `admission`'s limits, or `stop` is set.
pub fn serve(
    mut stream: TcpStream,
    peer: SocketAddr,
    dispatcher: &Dispatcher,
    admission: &Arc<Admission>,
    stop: &AtomicBool,
) {
    // The socket closes when `stream` drops, after the log line.
    match serve_inner(&mut stream, peer, dispatcher, admission, stop) {
        Ok(()) => tracing::debug!(%peer, "Kafka client disconnected"),
        Err(e) => tracing::warn!(%peer, error = %e, "Kafka client connection closed"),
    }
}

fn serve_inner(
    stream: &mut TcpStream,
    peer: SocketAddr,
    dispatcher: &Dispatcher,
    admission: &Arc<Admission>,
    stop: &AtomicBool,
) -> Result<(), ServeError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(read_poll(&admission.limits)))?;
    stream.set_write_timeout(Some(Duration::from_millis(SERVE_WRITE_TIMEOUT_MS)))?;
    let mut buf = BytesMut::new();
    // SASL listeners: the gate serves only the SASL exchange until the client authenticated,
    // then replaces `session` (serve::sasl::gate).
    let mut auth = ConnAuth::new(dispatcher.sasl());
    let mut session = auth.first_session(Some(peer));
    loop {
        let Some((frame, _permit)) = read_frame(stream, &mut buf, admission, stop)? else {
            return Ok(());
        };
        // A panicking handler is a bug of ours: it closes this connection only (the slot and
        // the request bytes are released by their guards either way).
        let dispatched = std::panic::catch_unwind(AssertUnwindSafe(|| {
            auth.dispatch(dispatcher, frame, &mut session)
        }))
        .unwrap_or_else(|_| {
            bump(&CONN_STATS.handler_panics);
            Err(ServeError::Io(std::io::Error::other(
                "request handler panicked",
            )))
        });
        let (api, version, response) = dispatched?;
        match response.outcome {
            Outcome::Reply(parts) => {
                let body_len = parts.iter().map(Part::len).sum();
                let head = frame_head(api, version, response.correlation_id, body_len)?;
                write_response(stream, head, &parts)?;
            }
            Outcome::NoReply => {}
            Outcome::Close(why) => {
                return Err(ServeError::Io(std::io::Error::other(why)));
            }
        }
    }
}

fn closed(why: String) -> ServeError {
    ServeError::Io(std::io::Error::new(ErrorKind::TimedOut, why))
}

/// The next whole frame body with the request bytes it holds, or `None` when the client
/// closed between frames (or we stop). Closes (an error) a connection idle for
/// `connections.max.idle.ms`, or whose frame, once begun, is not complete within
/// `request.receive.timeout.ms`. The frame's bytes are taken from the request budget before
/// they are allocated.
fn read_frame(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    admission: &Arc<Admission>,
    stop: &AtomicBool,
) -> Result<Option<(Bytes, Option<BytesPermit>)>, ServeError> {
    let limits = admission.limits;
    let idle_since = Instant::now();
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
                let deadline = begun.unwrap_or_else(Instant::now)
                    + Duration::from_millis(limits.request_receive_timeout_ms);
                permit = Some(admission.request_bytes(need, deadline).ok_or_else(|| {
                    closed(format!(
                        "no room for a request of {need} bytes in queued.max.request.bytes ({}) before the receive timeout",
                        limits.queued_max_request_bytes
                    ))
                })?);
                buf.reserve(need - buf.len());
            }
        } else {
            buf.reserve(4);
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match begun {
            None if idle_since.elapsed()
                >= Duration::from_millis(limits.connections_max_idle_ms) =>
            {
                bump(&CONN_STATS.closed_idle);
                return Err(closed(format!(
                    "idle for connections.max.idle.ms ({} ms)",
                    limits.connections_max_idle_ms
                )));
            }
            Some(at)
                if at.elapsed() >= Duration::from_millis(limits.request_receive_timeout_ms) =>
            {
                bump(&CONN_STATS.closed_receive_timeout);
                return Err(closed(format!(
                    "request frame incomplete after request.receive.timeout.ms ({} ms): {} bytes \
                     received",
                    limits.request_receive_timeout_ms,
                    buf.len()
                )));
            }
            _ => {}
        }
        // Read the length prefix, then exactly the frame it announces, straight into `buf`:
        // nothing past the frame whose bytes were granted, and no per-connection scratch
        // buffer, so an idle connection holds only its thread (as Kafka reads size, then
        // payload).
        let want = if buf.len() >= 4 {
            let len = i32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
            (4 + len - buf.len()).min(READ_CHUNK_BYTES)
        } else {
            4 - buf.len()
        };
        let start = buf.len();
        buf.resize(start + want, 0);
        let read = stream.read(&mut buf[start..]);
        buf.truncate(start + *read.as_ref().unwrap_or(&0));
        match read {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => {
                return Err(ServeError::Truncated { len: buf.len() });
            }
            Ok(_) => {
                begun.get_or_insert_with(Instant::now);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Most bytes one read asks for (a frame arrives in such steps, zeroed just before).
const READ_CHUNK_BYTES: usize = 64 * 1024;

fn write_response(stream: &mut TcpStream, head: Bytes, parts: &[Part]) -> Result<(), ServeError> {
    // Consecutive byte parts go out in one write; a file part is flushed around.
    let mut pending = BytesMut::from(&head[..]);
    for part in parts {
        match part {
            Part::Bytes(b) => pending.extend_from_slice(b),
            Part::File {
                file,
                position,
                length,
            } => {
                stream.write_all(&pending)?;
                pending.clear();
                send_file(stream, file, *position, *length)?;
            }
        }
    }
    stream.write_all(&pending)?;
    Ok(())
}

/// Sends `length` bytes of `file` from `position` with `sendfile`. The range was checked
/// against a published view; if the file became shorter since (a truncation raced us), the
/// frame cannot be completed and the connection is closed so the client retries cleanly.
fn send_file(
    stream: &TcpStream,
    file: &std::fs::File,
    position: u64,
    length: u64,
) -> Result<(), ServeError> {
    let mut offset = position as libc::off_t;
    let end = position + length;
    while (offset as u64) < end {
        let left = (end - offset as u64) as usize;
        match nix::sys::sendfile::sendfile(stream, file, Some(&mut offset), left) {
            Ok(0) => {
                return Err(ServeError::Io(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("segment file ended at {offset}, before {end}"),
                )))
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(ServeError::Io(e.into())),
        }
    }
    Ok(())
}
