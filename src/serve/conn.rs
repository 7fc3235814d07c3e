//! One client connection: read a frame, dispatch it, write the response, repeat.
//!
//! A response is a frame head plus parts; byte parts are written from memory and file parts
//! go with `sendfile`, so record data moves from the page cache to the socket inside the
//! kernel. Requests on one connection are answered in order, as Kafka clients require.
//! Anything the dispatcher cannot understand closes this connection with a log line; it never
//! affects others.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::limits::{SERVE_READ_POLL_MS, SERVE_REQUEST_BYTES_MAX, SERVE_WRITE_TIMEOUT_MS};
use crate::serve::dispatch::{frame_head, Dispatcher, Outcome, Part};
use crate::serve::ServeError;

/// Serves `stream` until the client leaves, sends something we cannot parse, or `stop` is set.
pub fn serve(mut stream: TcpStream, peer: SocketAddr, dispatcher: &Dispatcher, stop: &AtomicBool) {
    // The socket closes when `stream` drops, after the log line.
    match serve_inner(&mut stream, peer, dispatcher, stop) {
        Ok(()) => tracing::debug!(%peer, "Kafka client disconnected"),
        Err(e) => tracing::warn!(%peer, error = %e, "Kafka client connection closed"),
    }
}

fn serve_inner(
    stream: &mut TcpStream,
    peer: SocketAddr,
    dispatcher: &Dispatcher,
    stop: &AtomicBool,
) -> Result<(), ServeError> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_millis(SERVE_READ_POLL_MS)))?;
    stream.set_write_timeout(Some(Duration::from_millis(SERVE_WRITE_TIMEOUT_MS)))?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        let Some(frame) = read_frame(stream, &mut buf, stop)? else {
            return Ok(());
        };
        let (api, version, response) = dispatcher.dispatch_from(frame, Some(peer))?;
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

/// The next whole frame body, or `None` when the client closed between frames (or we stop).
fn read_frame(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    stop: &AtomicBool,
) -> Result<Option<Bytes>, ServeError> {
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
                return Ok(Some(frame.freeze()));
            }
            buf.reserve(need - buf.len());
        } else {
            buf.reserve(4);
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let mut chunk = [0u8; 64 * 1024];
        match stream.read(&mut chunk) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(0) => {
                return Err(ServeError::Truncated { len: buf.len() });
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
}

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
